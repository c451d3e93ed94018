//! The `api` workload: `durable serve`'s JSON API over a store holding many runs.
//!
//! Seeds `runs` runs (`Store::create_runs`, 1,000 a call) of four workflows, created 10 ms
//! apart, then settles most of them through the store (`update_run_if`, by way of `running` where
//! the lifecycle asks for it, [`SETTLE_IN_FLIGHT`] runs at a time) so the statuses are a realistic mix: per 200 runs 170 completed, 12 failed,
//! 8 suspended, 8 left pending, 1 cancelled and 1 dead. Then serves
//! [`durable_serve::router`] on a real TCP listener (127.0.0.1:0) and times, over one
//! HTTP/1.1 keep-alive connection (hyper's client), `requests` requests of each kind, the kinds
//! taken in turn:
//!
//! | kind | request |
//! |---|---|
//! | `first_page` | `GET /api/runs?limit=50` |
//! | `rare_status` | `GET /api/runs?limit=50&status=dead` (0.5 % of the runs) |
//! | `workflow` | `GET /api/runs?limit=50&workflow=reports` (a quarter of the runs) |
//! | `page_10` | `GET /api/runs?limit=50&cursor=…` (the cursor of page 9) |
//! | `run` | `GET /api/runs/{id}` (a different run each time) |
//! | `metrics` | `GET /metrics` (`Store::run_counts`, a count over every run, on each scrape) |
//!
//! Each kind is asked [`WARMUP`] times first, untimed, and its answers checked (status 200, a
//! full page of the filter's runs). The workload's latencies are the first page's; every
//! kind's p50/p95/p99 are in its `requests` field.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use durable::store::{NewRun, RunPatch};
use durable::{Engine, Payload, RunId, RunStatus, StepError};
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};

use crate::{Measured, percentile};

/// Runs created per `create_runs` call.
const CREATE_BATCH: usize = 1_000;
/// `update_run_if` calls in flight while settling.
const SETTLE_IN_FLIGHT: usize = 256;
/// Untimed requests of each kind before the measurement.
const WARMUP: usize = 5;
/// The page size asked for.
const LIMIT: usize = 50;
/// The workflows, taken in turn.
const WORKFLOWS: [&str; 4] = ["checkout", "emails", "reports", "sync"];
/// The rare status the filtered page asks for.
const RARE: RunStatus = RunStatus::Dead;

/// The status run `i` is settled to (`Pending`: left as created).
fn status_of(i: usize) -> RunStatus {
    match i % 200 {
        0..170 => RunStatus::Completed,
        170..182 => RunStatus::Failed,
        182..190 => RunStatus::Suspended,
        190..198 => RunStatus::Pending,
        198 => RunStatus::Cancelled,
        _ => RunStatus::Dead,
    }
}

fn run_id(i: usize) -> RunId {
    RunId::from(format!("api-{i:07}"))
}

/// Creates and settles the runs; returns the seconds each part took.
async fn seed(engine: &Engine, runs: usize) -> Result<(f64, f64), String> {
    let store = engine.store();
    let now = engine.clock().now();
    let began = Instant::now();
    for first in (0..runs).step_by(CREATE_BATCH) {
        let batch = (first..(first + CREATE_BATCH).min(runs))
            .map(|i| NewRun {
                id: run_id(i),
                workflow: WORKFLOWS[i % WORKFLOWS.len()].to_string(),
                version: 1,
                namespace: "default".into(),
                input: Payload::from_trusted(format!(r#"{{"order":{i},"items":[1,2,3],"note":"a bench run"}}"#)),
                tags: Vec::new(),
                priority: 0,
                parent: None,
                // Oldest first, 10 ms apart, the newest now.
                created_at: now.saturating_sub(((runs - i) * 10) as u64),
                start_at: None,
                admission: None,
                trace_context: None,
            })
            .collect();
        store.create_runs(batch).await.map_err(|e| format!("seeding runs: {e}"))?;
    }
    let created = began.elapsed().as_secs_f64();
    let began = Instant::now();
    let slots = Arc::new(tokio::sync::Semaphore::new(SETTLE_IN_FLIGHT));
    let mut tasks = tokio::task::JoinSet::new();
    for i in (0..runs).filter(|i| status_of(*i) != RunStatus::Pending) {
        let permit = slots.clone().acquire_owned().await.map_err(|e| e.to_string())?;
        let store = store.clone();
        tasks.spawn(async move {
            let status = status_of(i);
            let mut patch = RunPatch { status: Some(status), now, ..RunPatch::default() };
            match status {
                RunStatus::Completed => patch.output = Some(Some(Payload::from_trusted(r#"{"ok":true}"#))),
                RunStatus::Failed | RunStatus::Dead => {
                    patch.error = Some(Some(StepError::fatal("card declined").with_code("declined")))
                }
                _ => {}
            }
            // `pending` becomes `completed` or `suspended` by way of `running`, as when executed.
            let mut from = RunStatus::Pending;
            let mut applied = Ok(true);
            if !from.can_become(status) {
                let running = RunPatch { status: Some(RunStatus::Running), now, ..RunPatch::default() };
                applied = store.update_run_if(&run_id(i), &[from], running).await;
                from = RunStatus::Running;
            }
            if let Ok(true) = applied {
                applied = store.update_run_if(&run_id(i), &[from], patch).await;
            }
            drop(permit);
            match applied {
                Ok(true) => Ok(()),
                Ok(false) => Err(format!("settling run {}: it was not {from}", run_id(i))),
                Err(e) => Err(format!("settling run {}: {e}", run_id(i))),
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.map_err(|e| e.to_string())??;
    }
    Ok((created, began.elapsed().as_secs_f64()))
}

/// One keep-alive HTTP/1.1 connection to the server.
struct Client {
    sender: hyper::client::conn::http1::SendRequest<Empty<Bytes>>,
}

impl Client {
    async fn connect(addr: std::net::SocketAddr) -> Result<Self, String> {
        let stream = tokio::net::TcpStream::connect(addr).await.map_err(|e| format!("connecting to {addr}: {e}"))?;
        stream.set_nodelay(true).map_err(|e| e.to_string())?;
        let (sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(|e| e.to_string())?;
        tokio::spawn(connection);
        Ok(Client { sender })
    }

    /// `GET path`: the body of a 200 answer.
    async fn get(&mut self, path: &str) -> Result<Bytes, String> {
        let request = hyper::Request::get(path)
            .header(hyper::header::HOST, "127.0.0.1")
            .body(Empty::new())
            .map_err(|e| format!("GET {path}: {e}"))?;
        self.sender.ready().await.map_err(|e| format!("GET {path}: the connection closed: {e}"))?;
        let response = self.sender.send_request(request).await.map_err(|e| format!("GET {path}: {e}"))?;
        let status = response.status();
        let body = response.into_body().collect().await.map_err(|e| format!("GET {path}: {e}"))?.to_bytes();
        if status != hyper::StatusCode::OK {
            return Err(format!("GET {path}: {status}: {}", String::from_utf8_lossy(&body)));
        }
        Ok(body)
    }

    /// `GET path` of a page of runs: the page, checked to hold `len` runs that all match `check`.
    async fn page(&mut self, path: &str, len: usize, check: impl Fn(&Value) -> bool) -> Result<Value, String> {
        let page: Value = serde_json::from_slice(&self.get(path).await?).map_err(|e| format!("GET {path}: {e}"))?;
        let runs = page["runs"].as_array().map_or(&[][..], Vec::as_slice);
        if runs.len() != len || !runs.iter().all(check) {
            return Err(format!("GET {path}: not a page of {len} of the runs asked for: {page}"));
        }
        Ok(page)
    }
}

/// Percent-encodes a query parameter value (all but RFC 3986's unreserved characters).
fn encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The request kinds and their paths; `run` stands for `/api/runs/{id}` with a new id each time.
fn kinds(page_10: &str) -> Vec<(&'static str, String)> {
    vec![
        ("first_page", format!("/api/runs?limit={LIMIT}")),
        ("rare_status", format!("/api/runs?limit={LIMIT}&status={}", RARE.as_str())),
        ("workflow", format!("/api/runs?limit={LIMIT}&workflow=reports")),
        ("page_10", page_10.to_string()),
        ("run", String::new()),
        ("metrics", "/metrics".to_string()),
    ]
}

/// The `api` workload (see the module docs): `runs` runs seeded, `requests` timed requests of
/// each kind.
pub(crate) async fn api(engine: &Engine, runs: usize, requests: usize) -> Result<Measured, String> {
    if runs < 10 * LIMIT {
        return Err(format!("the api workload needs at least {} runs (ten pages)", 10 * LIMIT));
    }
    let (create_s, settle_s) = seed(engine, runs).await?;
    eprintln!("durable-bench: api: {runs} runs created in {create_s:.1} s, settled in {settle_s:.1} s");

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let router = durable_serve::router(engine.clone(), durable_serve::ServeConfig::default());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(durable_serve::serve(listener, router, async move {
        let _ = stopped.await;
    }));
    let mut client = Client::connect(addr).await?;

    // The cursor of page 10, checking the pages on the way.
    let mut path = format!("/api/runs?limit={LIMIT}");
    for _ in 0..9 {
        let page = client.page(&path, LIMIT, |_| true).await?;
        let cursor = page["next_cursor"].as_str().ok_or_else(|| format!("GET {path}: no next_cursor"))?;
        path = format!("/api/runs?limit={LIMIT}&cursor={}", encode(cursor));
    }
    let kinds = kinds(&path);
    // Every run's answer names it; the filtered pages hold only the runs asked for.
    let rare = RARE.as_str();
    let rare_runs = (0..runs).filter(|i| status_of(*i) == RARE).count().min(LIMIT);
    for _ in 0..WARMUP {
        client.page(&kinds[0].1, LIMIT, |_| true).await?;
        client.page(&kinds[1].1, rare_runs, |r| r["status"] == rare).await?;
        client.page(&kinds[2].1, LIMIT, |r| r["workflow"] == "reports").await?;
        client.page(&kinds[3].1, LIMIT, |_| true).await?;
        let body = client.get(&format!("/api/runs/{}", run_id(runs / 2))).await?;
        let run: Value = serde_json::from_slice(&body).map_err(|e| e.to_string())?;
        if run["run"]["id"] != run_id(runs / 2).as_str() {
            return Err(format!("GET /api/runs/{}: another run: {run}", run_id(runs / 2)));
        }
        let text = client.get("/metrics").await?;
        let expected = format!("durable_runs{{workflow=\"reports\",status=\"{rare}\"}}");
        if !String::from_utf8_lossy(&text).contains(&expected) {
            return Err(format!("GET /metrics: no {expected} sample"));
        }
    }

    let mut latencies: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let began = Instant::now();
    for n in 0..requests {
        for (kind, path) in &kinds {
            let path = if *kind == "run" {
                // Spread over the store: a different run, old or new, each time.
                format!("/api/runs/{}", run_id(n * 7_919 % runs))
            } else {
                path.clone()
            };
            let t0 = Instant::now();
            client.get(&path).await?;
            latencies.entry(kind).or_default().push(t0.elapsed().as_secs_f64() * 1e3);
        }
    }
    let wall = began.elapsed();
    let _ = stop.send(());
    drop(client);
    let _ = tokio::time::timeout(Duration::from_secs(5), server).await;

    let mut summary = serde_json::Map::new();
    for (kind, lat) in &mut latencies {
        lat.sort_by(f64::total_cmp);
        summary.insert(
            kind.to_string(),
            json!({
                "n": lat.len(),
                "p50_ms": percentile(lat, 0.50),
                "p95_ms": percentile(lat, 0.95),
                "p99_ms": percentile(lat, 0.99),
            }),
        );
    }
    let extra = json!({ "create_s": create_s, "settle_s": settle_s, "requests": summary });
    let latencies = latencies.remove("first_page").unwrap_or_default();
    Ok(Measured { runs, steps_per_run: 0, wall, latencies, turns: None, extra: Some(extra) })
}
