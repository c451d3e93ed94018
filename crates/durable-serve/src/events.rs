//! `GET /api/events`: a server-sent event stream of the runs of one view that appear or
//! change (`run`, data: the run), or are deleted (`deleted`, data: `{"id": ...}`). A view is one
//! run (`run`), or the newest 500 runs of a filter together with the runs `runs` names (a
//! page the client shows, however old).
//!
//! Each connection polls its view every [`ServeConfig::poll`](crate::ServeConfig::poll), and
//! at once when its engine's subscription reports an event (the other engines' events arrive
//! there through the store's control plane, when the server's engine has one). A run is sent
//! when its status or `updated_at` differs from what the connection sent or saw last. The view
//! is read once before the response starts: what changes after the client got the response
//! headers is sent.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use durable::{Engine, EngineEvent, Millis, Run, RunFilter, RunId, RunStatus};
use futures_util::Stream;
use tokio::sync::broadcast;
use tokio::time::{Instant, Interval, MissedTickBehavior};

use crate::api::{FILTER_PARAMS, MAX_LIMIT, parse_filter};
use crate::error::ApiError;
use crate::extract::{Params, parse_run_id};
use crate::{AppState, Result};

/// Comment lines sent while nothing changes, so proxies keep the connection open.
const HEARTBEAT: Duration = Duration::from_secs(15);

/// What one connection watches.
#[derive(Debug)]
enum View {
    /// One run.
    Run(RunId),
    /// The newest runs matching a filter (at most [`MAX_LIMIT`]), and the runs named by the
    /// `runs` parameter wherever they are (a page of older runs, which the filter's newest
    /// would miss).
    Filter(RunFilter, Vec<RunId>),
}

/// `runs=["a","b"]`: a JSON array of at most [`MAX_LIMIT`] run ids (ids may hold commas).
fn parse_runs(params: &Params) -> Result<Vec<RunId>> {
    let Some(text) = params.get("runs") else { return Ok(Vec::new()) };
    let ids: Vec<String> = serde_json::from_str(text)
        .map_err(|e| ApiError::bad_request(format!("runs must be a JSON array of run ids: {e}")))?;
    if ids.len() > MAX_LIMIT {
        return Err(ApiError::bad_request(format!("runs names {} runs; at most {MAX_LIMIT}", ids.len())));
    }
    ids.iter().map(|id| parse_run_id(id)).collect()
}

/// One connection's state.
struct Watch {
    engine: Engine,
    view: View,
    /// What was sent or seen last, per run in the view.
    seen: HashMap<RunId, (RunStatus, Millis)>,
    /// Runs to send.
    queue: VecDeque<Event>,
    events: Option<broadcast::Receiver<EngineEvent>>,
    poll: Interval,
}

/// `GET /api/events`.
pub(crate) async fn events(
    State(state): State<Arc<AppState>>,
    params: Params,
) -> Result<Sse<impl Stream<Item = std::result::Result<Event, Infallible>>>> {
    let mut known = FILTER_PARAMS.to_vec();
    known.extend(["run", "runs", "access_token"]);
    params.only(&known)?;
    let view = match params.get("run") {
        Some(id) => {
            if let Some(other) = FILTER_PARAMS.iter().chain(&["runs"]).find(|p| params.get(p).is_some()) {
                return Err(ApiError::bad_request(format!(
                    "run and {other} cannot go together: a view is one run, or a filter (with the runs a page shows)"
                )));
            }
            View::Run(parse_run_id(id)?)
        }
        None => View::Filter(RunFilter { limit: MAX_LIMIT, ..parse_filter(&params)? }, parse_runs(&params)?),
    };
    let events = Some(state.engine.subscribe());
    let mut poll = tokio::time::interval_at(Instant::now() + state.config.poll, state.config.poll);
    poll.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut watch =
        Watch { engine: state.engine.clone(), view, seen: HashMap::new(), queue: VecDeque::new(), events, poll };
    watch.refresh().await?;
    if let View::Run(id) = &watch.view
        && watch.seen.is_empty()
    {
        return Err(durable::Error::RunNotFound(id.clone()).into());
    }
    watch.queue.clear();
    let stream = futures_util::stream::unfold(watch, |mut watch| async move {
        let event = watch.next().await;
        Some((Ok(event), watch))
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(HEARTBEAT).text("heartbeat")))
}

impl Watch {
    /// The next event to send: a changed run, or an `error` when the store could not be read.
    async fn next(&mut self) -> Event {
        loop {
            if let Some(event) = self.queue.pop_front() {
                return event;
            }
            let refresh = tokio::select! {
                _ = self.poll.tick() => true,
                got = recv(&mut self.events) => match got {
                    Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {
                        // Several events at once: one read of the view for all of them.
                        if let Some(rx) = &mut self.events {
                            while rx.try_recv().is_ok() {}
                        }
                        true
                    }
                    Err(broadcast::error::RecvError::Closed) => {
                        self.events = None;
                        false
                    }
                },
            };
            if refresh && let Err(e) = self.refresh().await {
                let body = serde_json::json!({ "error": { "code": e.code, "message": e.message } });
                return Event::default().event("error").data(body.to_string());
            }
        }
    }

    /// Reads the view and queues the runs that appeared or changed.
    async fn refresh(&mut self) -> std::result::Result<(), ApiError> {
        let runs: Vec<Run> = match &self.view {
            View::Run(id) => self.engine.get_run(id).await?.into_iter().collect(),
            View::Filter(filter, named) => {
                let mut runs = self.engine.list_runs(filter).await?.runs;
                if !named.is_empty() {
                    let listed: std::collections::HashSet<&RunId> = runs.iter().map(|r| &r.id).collect();
                    let rest: Vec<RunId> = named.iter().filter(|id| !listed.contains(id)).cloned().collect();
                    if !rest.is_empty() {
                        runs.extend(self.engine.store().get_runs(&rest).await?);
                    }
                }
                runs
            }
        };
        // Runs that left the view (their status changed, or newer runs pushed them off the
        // page): read once more, and sent if they changed, so a client sees what took them away;
        // one that no longer exists is sent as `deleted`.
        let gone: HashMap<RunId, (RunStatus, Millis)> = self
            .seen
            .iter()
            .filter(|(id, _)| !runs.iter().any(|r| &r.id == *id))
            .map(|(id, last)| (id.clone(), *last))
            .collect();
        if !gone.is_empty() {
            let ids: Vec<RunId> = gone.keys().cloned().collect();
            for id in &ids {
                self.seen.remove(id);
            }
            let found = self.engine.store().get_runs(&ids).await?;
            let present: std::collections::HashSet<&RunId> = found.iter().map(|r| &r.id).collect();
            for id in ids.iter().filter(|id| !present.contains(id)) {
                let data = serde_json::json!({ "id": id });
                self.queue.push_back(Event::default().event("deleted").data(data.to_string()));
            }
            for run in found {
                if gone.get(&run.id) != Some(&(run.status, run.updated_at)) {
                    self.send(&run);
                }
            }
        }
        for run in runs {
            let now = (run.status, run.updated_at);
            if self.seen.insert(run.id.clone(), now) != Some(now) {
                self.send(&run);
            }
        }
        Ok(())
    }

    /// Queues a `run` event.
    fn send(&mut self, run: &Run) {
        if let Ok(event) = Event::default().event("run").json_data(run) {
            self.queue.push_back(event);
        }
    }
}

/// The next engine event, or never when there is no subscription.
async fn recv(
    events: &mut Option<broadcast::Receiver<EngineEvent>>,
) -> std::result::Result<EngineEvent, broadcast::error::RecvError> {
    match events {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}
