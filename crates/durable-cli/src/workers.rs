//! `durable workers`: the health of remote steps, per queue and per live worker
//! ([`Engine::worker_health`](durable::Engine::worker_health)).

use std::io::Write;

use serde_json::json;

use crate::cli::{StoreArgs, WorkersArgs};
use crate::error::{Error, Result};
use crate::format::{Table, ago, duration_ms, now_ms};
use crate::store::{Access, with_operator_engine};

/// `durable workers`.
pub(crate) async fn workers(store: &StoreArgs, args: &WorkersArgs, out: &mut dyn Write) -> Result<()> {
    let store = store.open(Access::Existing).await?;
    with_operator_engine(store, |engine| async move {
        let health = engine.worker_health().await?;
        let ttl = engine.config().worker_ttl;
        if args.json {
            let queues: Vec<serde_json::Value> = health
                .queues
                .iter()
                .map(|q| {
                    json!({
                        "namespace": q.namespace,
                        "queue": q.queue,
                        "depth": q.depth,
                        "claimed": q.claimed,
                        "oldest_age_ms": q.oldest_age.map(|d| d.as_millis() as u64),
                        "workers": q.workers,
                    })
                })
                .collect();
            let doc = json!({ "queues": queues, "workers": health.workers });
            let text = serde_json::to_string_pretty(&doc)
                .map_err(|e| Error::failed(format!("encoding the worker health: {e}")))?;
            writeln!(out, "{text}")?;
            return Ok(());
        }
        let now = now_ms();
        let live = format!("heartbeat within {}", duration_ms(ttl.as_millis() as u64));
        if health.queues.is_empty() && health.workers.is_empty() {
            writeln!(out, "no remote steps waiting and no live workers ({live})")?;
            return Ok(());
        }
        writeln!(out, "queues ({})", health.queues.len())?;
        if !health.queues.is_empty() {
            let mut table = Table::new(&["NAMESPACE", "QUEUE", "DEPTH", "CLAIMED", "OLDEST", "LIVE WORKERS"]);
            for q in &health.queues {
                let workers = if q.workers.is_empty() {
                    // Tasks nobody can take: say so, it is why their runs wait.
                    if q.depth > 0 { "none (its runs wait)".to_string() } else { "none".to_string() }
                } else {
                    q.workers.join(", ")
                };
                table.row(vec![
                    q.namespace.clone(),
                    q.queue.clone(),
                    q.depth.to_string(),
                    q.claimed.to_string(),
                    q.oldest_age.map_or_else(|| "-".into(), |d| duration_ms(d.as_millis() as u64)),
                    workers,
                ]);
            }
            table.write(out, "  ")?;
        }
        writeln!(out, "\nlive workers ({}, {live})", health.workers.len())?;
        if !health.workers.is_empty() {
            let mut table = Table::new(&["ID", "QUEUES", "CAPABILITIES", "CONCURRENCY", "LAST HEARTBEAT"]);
            for w in &health.workers {
                table.row(vec![
                    w.id.clone(),
                    w.queues.join(", "),
                    if w.capabilities.is_empty() { "-".into() } else { w.capabilities.join(", ") },
                    w.concurrency.to_string(),
                    ago(w.heartbeat_at, now),
                ]);
            }
            table.write(out, "  ")?;
        }
        Ok(())
    })
    .await
}
