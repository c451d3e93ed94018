//! The JSON endpoints: the reads (`/api/runs`, a run, its history, workflows, schedules,
//! queues, workers) and the actions (retry, cancel, delete, signal). The actions go through
//! [`ops`](crate::ops), as the command line's do.

use std::collections::HashMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use durable::store::{StoreErrorKind, TaskFilter};
use durable::task::{Task, TaskLog, TaskState};
use durable::{Cancel, Checkpoint, CheckpointStatus, Delivery, Engine, RunFilter, RunId, RunStatus};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::error::ApiError;
use crate::extract::{JsonBody, Params, RunPath, parse_run_id};
use crate::ops;
use crate::{AppState, Result};

/// The largest page of `GET /api/runs`.
pub(crate) const MAX_LIMIT: usize = 500;
/// The page size of `GET /api/runs` without `limit`.
pub(crate) const DEFAULT_LIMIT: usize = 50;

/// The filter parameters of `GET /api/runs` (and `GET /api/events`).
pub(crate) const FILTER_PARAMS: &[&str] =
    &["status", "workflow", "namespace", "tag", "parent", "created_after", "created_before"];

/// `status=a,b`: every name must be a run status.
pub(crate) fn parse_statuses(params: &Params) -> Result<Vec<RunStatus>> {
    let Some(list) = params.get("status") else { return Ok(Vec::new()) };
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse().map_err(|_| {
                let known: Vec<&str> = RunStatus::ALL.iter().map(|s| s.as_str()).collect();
                ApiError::bad_request(format!("unknown status {s:?} in status={list:?}; known: {}", known.join(", ")))
            })
        })
        .collect()
}

/// The run filter the parameters describe (without paging).
pub(crate) fn parse_filter(params: &Params) -> Result<RunFilter> {
    Ok(RunFilter {
        statuses: parse_statuses(params)?,
        workflow: params.get("workflow").map(str::to_string),
        namespace: params.get("namespace").map(str::to_string),
        tag: params.get("tag").map(str::to_string),
        parent: params.get("parent").map(parse_run_id).transpose()?,
        created_after: params.number("created_after")?,
        created_before: params.number("created_before")?,
        ..RunFilter::default()
    })
}

/// `GET /api/runs`.
pub(crate) async fn list_runs(State(state): State<Arc<AppState>>, params: Params) -> Result<Json<Value>> {
    let mut known = FILTER_PARAMS.to_vec();
    known.extend(["limit", "cursor"]);
    params.only(&known)?;
    let mut filter = parse_filter(&params)?;
    filter.limit = match params.number::<usize>("limit")? {
        None => DEFAULT_LIMIT,
        Some(n @ 1..=MAX_LIMIT) => n,
        Some(n) => return Err(ApiError::bad_request(format!("limit={n} is out of range; pass 1..={MAX_LIMIT}"))),
    };
    filter.cursor = params.get("cursor").map(str::to_string);
    let page = match state.engine.list_runs(&filter).await {
        Err(durable::Error::Store(e)) if e.kind() == StoreErrorKind::NotFound && filter.cursor.is_some() => {
            return Err(ApiError::bad_request(format!(
                "cursor {:?} is not valid: pass the next_cursor of a previous page",
                filter.cursor.unwrap_or_default()
            )));
        }
        other => other?,
    };
    Ok(Json(json!({ "runs": page.runs, "next_cursor": page.next_cursor })))
}

/// A checkpoint of the timeline: its fields, `duration_ms` once it settled, and for a remote
/// step the `logs` its handler wrote (every attempt's, oldest first).
fn timeline_entry(cp: &Checkpoint, logs: &HashMap<u32, &[TaskLog]>) -> Value {
    let settled = matches!(cp.status, CheckpointStatus::Completed | CheckpointStatus::Failed);
    let mut v = serde_json::to_value(cp).unwrap_or(Value::Null);
    if let Value::Object(map) = &mut v {
        let duration = settled.then(|| cp.updated_at.saturating_sub(cp.started_at));
        map.insert("duration_ms".into(), json!(duration));
        if let Some(lines) = logs.get(&cp.seq) {
            map.insert("logs".into(), json!(lines));
        }
    }
    v
}

/// The run's remote-step tasks (every attempt's record; none on a store without remote steps).
async fn run_tasks(engine: &Engine, id: &RunId) -> Result<Vec<Task>> {
    if !engine.store().capabilities().tasks {
        return Ok(Vec::new());
    }
    let filter = TaskFilter { run_id: Some(id.clone()), limit: 1_000, ..TaskFilter::default() };
    Ok(engine.store().list_tasks(&filter).await?)
}

/// `GET /api/runs/{id}`.
pub(crate) async fn get_run(
    State(state): State<Arc<AppState>>,
    RunPath(id): RunPath,
    params: Params,
) -> Result<Json<Value>> {
    params.only(&[])?;
    let engine = &state.engine;
    let run = ops::require(engine, &id).await?;
    let history = engine.history(&id).await?;
    let children = engine.children(&id).await?;
    let waiters = engine.store().waiters(&id).await?;
    let tasks = run_tasks(engine, &id).await?;
    let admission = if engine.store().capabilities().admission {
        let (holds, waits) = engine.run_admission(&id).await?;
        json!({ "holds": holds, "waits": waits })
    } else {
        Value::Null
    };
    let logs: HashMap<u32, &[TaskLog]> =
        tasks.iter().filter(|t| !t.logs.is_empty()).map(|t| (t.task.seq, t.logs.as_slice())).collect();
    let timeline: Vec<Value> = history.iter().map(|cp| timeline_entry(cp, &logs)).collect();
    // The tasks still to finish, while the run is active.
    let pending: Vec<&Task> = if run.status.is_terminal() {
        Vec::new()
    } else {
        tasks.iter().filter(|t| t.state != TaskState::Finished).collect()
    };
    Ok(Json(json!({
        "run": run, "timeline": timeline, "children": children, "waiters": waiters, "tasks": pending,
        "admission": admission,
    })))
}

/// `GET /api/runs/{id}/history`.
pub(crate) async fn history(
    State(state): State<Arc<AppState>>,
    RunPath(id): RunPath,
    params: Params,
) -> Result<Json<Vec<Checkpoint>>> {
    params.only(&[])?;
    ops::require(&state.engine, &id).await?;
    Ok(Json(state.engine.history(&id).await?))
}

/// `GET /api/workflows`: per workflow, its runs by status.
pub(crate) async fn workflows(State(state): State<Arc<AppState>>, params: Params) -> Result<Json<Value>> {
    params.only(&[])?;
    let counts = state.engine.store().run_counts().await?;
    let mut out: Vec<(String, serde_json::Map<String, Value>)> = Vec::new();
    for c in counts {
        if out.last().is_none_or(|(w, _)| *w != c.workflow) {
            out.push((c.workflow.clone(), serde_json::Map::new()));
        }
        if let Some((_, map)) = out.last_mut() {
            map.insert(c.status.as_str().into(), json!(c.count));
        }
    }
    let list: Vec<Value> = out.into_iter().map(|(w, counts)| json!({ "workflow": w, "counts": counts })).collect();
    Ok(Json(Value::Array(list)))
}

/// `GET /api/schedules`.
pub(crate) async fn schedules(State(state): State<Arc<AppState>>, params: Params) -> Result<Json<Value>> {
    params.only(&[])?;
    Ok(Json(json!({ "schedules": state.engine.list_schedules().await? })))
}

/// `GET /api/queues`: admission gates (step queues, concurrency keys) and task queues.
pub(crate) async fn queues(State(state): State<Arc<AppState>>, params: Params) -> Result<Json<Value>> {
    params.only(&[])?;
    let store = state.engine.store();
    let admission =
        if store.capabilities().admission { json!(state.engine.admission_stats().await?) } else { Value::Null };
    let tasks = if store.capabilities().tasks { json!(store.queue_stats().await?) } else { Value::Null };
    Ok(Json(json!({ "admission": admission, "tasks": tasks })))
}

/// `GET /api/workers`: remote-step queues with their live workers, and the live workers.
pub(crate) async fn workers(State(state): State<Arc<AppState>>, params: Params) -> Result<Json<Value>> {
    params.only(&[])?;
    if !state.engine.store().capabilities().tasks {
        return Ok(Json(json!({ "queues": [], "workers": [] })));
    }
    let health = state.engine.worker_health().await?;
    let queues: Vec<Value> = health
        .queues
        .iter()
        .map(|q| {
            json!({
                "namespace": q.namespace, "queue": q.queue, "depth": q.depth, "claimed": q.claimed,
                "oldest_age_ms": q.oldest_age.map(|d| d.as_millis() as u64), "workers": q.workers,
            })
        })
        .collect();
    Ok(Json(json!({ "queues": queues, "workers": health.workers })))
}

/// The body of `POST /api/runs/{id}/retry`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RetryBody {
    /// A new input: a new run of the same workflow is started with it. Present means present:
    /// `"input": null` is the input `null` (a workflow of `()` takes it), not a plain retry.
    #[serde(default, deserialize_with = "present")]
    input: Option<Value>,
}

/// A field that is there, whatever its value (`null` too: `Option<Value>` would read it as absent).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(d).map(Some)
}

/// `POST /api/runs/{id}/retry`: the run back to `pending`, or with `input` a new run.
pub(crate) async fn retry(
    State(state): State<Arc<AppState>>,
    RunPath(id): RunPath,
    params: Params,
    JsonBody(body): JsonBody<RetryBody>,
) -> Result<Json<Value>> {
    params.only(&[])?;
    let run = match body.input {
        Some(input) => ops::retry_with_input(&state.engine, &id, &input).await?,
        None => {
            ops::retry(&state.engine, &id).await?;
            ops::require(&state.engine, &id).await?
        }
    };
    Ok(Json(json!({ "run": run })))
}

/// The body of `POST /api/runs/{id}/cancel`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CancelBody {
    /// Run the undos of its completed steps first.
    #[serde(default)]
    compensate: bool,
}

/// `POST /api/runs/{id}/cancel`. A finished run is answered as it is.
pub(crate) async fn cancel(
    State(state): State<Arc<AppState>>,
    RunPath(id): RunPath,
    params: Params,
    JsonBody(body): JsonBody<CancelBody>,
) -> Result<Json<Value>> {
    params.only(&[])?;
    let how = if body.compensate { Cancel::Compensate } else { Cancel::Abandon };
    ops::cancel(&state.engine, &id, how).await?;
    let run = ops::require(&state.engine, &id).await?;
    Ok(Json(json!({ "run": run })))
}

/// `DELETE /api/runs/{id}[?force=true]`.
pub(crate) async fn delete(
    State(state): State<Arc<AppState>>,
    RunPath(id): RunPath,
    params: Params,
) -> Result<Json<Value>> {
    params.only(&["force"])?;
    let deleted = ops::delete(&state.engine, &id, params.flag("force")?).await?;
    Ok(Json(json!({ "deleted": deleted })))
}

/// The body of `POST /api/signals`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SignalBody {
    /// The token a run waits on.
    token: String,
    /// The payload it receives.
    payload: Value,
}

/// `POST /api/signals`.
pub(crate) async fn signal(
    State(state): State<Arc<AppState>>,
    params: Params,
    JsonBody(body): JsonBody<SignalBody>,
) -> Result<Json<Value>> {
    params.only(&[])?;
    let delivery = match ops::signal(&state.engine, &body.token, &body.payload).await? {
        Delivery::Delivered { run_id, seq } => json!({ "status": "delivered", "run_id": run_id, "seq": seq }),
        Delivery::Buffered => json!({ "status": "buffered" }),
    };
    Ok(Json(json!({ "delivery": delivery })))
}
