//! `GET /metrics`: Prometheus text — what was recorded through the `metrics` facade (the
//! engine's counters and histograms, when the server's recorder is the global one), and gauges
//! read from the store at scrape time.
//!
//! The store gauges:
//!
//! | name | labels | what |
//! |---|---|---|
//! | `durable_runs` | `workflow`, `status` | runs by workflow and status (every status of a workflow with runs, zeros included) |
//! | `durable_task_queue_depth` | `namespace`, `queue` | remote-step tasks waiting for a worker |
//! | `durable_task_queue_claimed` | `namespace`, `queue` | remote-step tasks held by workers |
//! | `durable_task_queue_oldest_age_seconds` | `namespace`, `queue` | age of the oldest unfinished task |
//! | `durable_gate_held` | `gate` | admission slots held |
//! | `durable_gate_waiting` | `gate` | requests waiting at the gate |
//! | `durable_gate_oldest_wait_seconds` | `gate` | how long the oldest waiter has waited |

use std::fmt::Write;
use std::sync::Arc;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use durable::PrometheusRecorder;
use durable::RunStatus;

use crate::extract::Params;
use crate::{AppState, Result};

/// Builds a [`PrometheusRecorder`] and installs it as the `metrics` facade's global recorder,
/// so what the engines of this process record is rendered at `/metrics`. Returns it for
/// [`ServeConfig::metrics`](crate::ServeConfig::metrics). When a global recorder is
/// installed already, the returned one renders only what is recorded to it directly (the
/// store gauges of `/metrics` are there either way).
pub fn install_recorder() -> PrometheusRecorder {
    let recorder = PrometheusRecorder::new();
    if recorder.install().is_err() {
        tracing::debug!("a global metrics recorder is installed already; /metrics renders the store gauges only");
    }
    recorder
}

/// `GET /metrics`.
pub(crate) async fn metrics(State(state): State<Arc<AppState>>, params: Params) -> Result<Response> {
    params.only(&[])?;
    let mut text = state.metrics.render();
    let gauges = store_gauges(&state).await?;
    for family in gauges {
        // A family the facade renders already (another exporter of the same name) is left out.
        if text.contains(&format!("# TYPE {} ", family.name)) {
            continue;
        }
        family.write(&mut text);
    }
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response())
}

/// One gauge family: a name, a help text and its samples.
struct Family {
    name: &'static str,
    help: &'static str,
    samples: Vec<(Vec<(&'static str, String)>, f64)>,
}

impl Family {
    fn new(name: &'static str, help: &'static str) -> Self {
        Family { name, help, samples: Vec::new() }
    }

    fn write(&self, out: &mut String) {
        let _ = writeln!(out, "# HELP {} {}", self.name, self.help);
        let _ = writeln!(out, "# TYPE {} gauge", self.name);
        for (labels, value) in &self.samples {
            let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{}\"", escape(v))).collect();
            let _ = writeln!(out, "{}{{{}}} {value}", self.name, labels.join(","));
        }
    }
}

/// A label value in the text format: `\`, `"` and newlines escaped.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// The gauges read from the store now.
async fn store_gauges(state: &AppState) -> Result<Vec<Family>> {
    let engine = &state.engine;
    let store = engine.store();
    let now = engine.clock().now();
    let mut runs = Family::new("durable_runs", "Runs by workflow and status, read from the store.");
    let counts = store.run_counts().await?;
    let mut workflows: Vec<&str> = counts.iter().map(|c| c.workflow.as_str()).collect();
    workflows.dedup();
    for workflow in workflows {
        for status in RunStatus::ALL {
            let n = counts.iter().find(|c| c.workflow == workflow && c.status == status).map_or(0, |c| c.count);
            runs.samples
                .push((vec![("workflow", workflow.to_string()), ("status", status.as_str().to_string())], n as f64));
        }
    }
    let mut families = vec![runs];
    if store.capabilities().tasks {
        let mut depth = Family::new("durable_task_queue_depth", "Remote-step tasks waiting for a worker, per queue.");
        let mut claimed = Family::new("durable_task_queue_claimed", "Remote-step tasks held by workers, per queue.");
        let mut oldest = Family::new(
            "durable_task_queue_oldest_age_seconds",
            "Age of the oldest unfinished remote-step task, per queue.",
        );
        for q in store.queue_stats().await? {
            let labels = vec![("namespace", q.namespace.clone()), ("queue", q.queue.clone())];
            depth.samples.push((labels.clone(), q.queued as f64));
            claimed.samples.push((labels.clone(), q.claimed as f64));
            if let Some(at) = q.oldest_at {
                oldest.samples.push((labels, now.saturating_sub(at) as f64 / 1000.0));
            }
        }
        families.extend([depth, claimed, oldest]);
    }
    if store.capabilities().admission {
        let mut held =
            Family::new("durable_gate_held", "Admission slots held, per gate (step queue or concurrency key).");
        let mut waiting = Family::new("durable_gate_waiting", "Requests waiting at an admission gate.");
        let mut oldest =
            Family::new("durable_gate_oldest_wait_seconds", "How long the oldest waiter of a gate has waited.");
        for g in engine.admission_stats().await? {
            let labels = vec![("gate", g.gate.clone())];
            held.samples.push((labels.clone(), f64::from(g.held)));
            waiting.samples.push((labels.clone(), f64::from(g.waiting)));
            if let Some(since) = g.oldest_waiting_since {
                oldest.samples.push((labels, now.saturating_sub(since) as f64 / 1000.0));
            }
        }
        families.extend([held, waiting, oldest]);
    }
    Ok(families)
}
