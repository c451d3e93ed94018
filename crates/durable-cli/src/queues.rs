//! `durable queues`: every admission gate in the store — step queues and workflow concurrency
//! keys — with its limits and load ([`Engine::admission_stats`](durable::Engine::admission_stats)).

use std::io::Write;

use durable::Engine;
use durable::admission::GateStats;
use serde_json::{Value, json};

use crate::admission::{GateName, limits_json, limits_text, shown_key};
use crate::cli::{GateKind, QueuesArgs, StoreArgs};
use crate::error::{Error, Result};
use crate::format::{Table, ago, duration_ms, now_ms};
use crate::store::{Access, with_operator_engine};

/// `durable queues`.
pub(crate) async fn queues(store: &StoreArgs, args: &QueuesArgs, out: &mut dyn Write) -> Result<()> {
    let where_ = store.describe();
    let store = store.open(Access::Existing).await?;
    with_operator_engine(store, |engine| async move { write_queues(&engine, &where_, args, out).await }).await
}

/// Writes the gates of `engine`'s store (at `where_`, for messages) as `args` asks.
pub(crate) async fn write_queues(engine: &Engine, where_: &str, args: &QueuesArgs, out: &mut dyn Write) -> Result<()> {
    if !engine.store().capabilities().admission {
        // The store's own error would do, but this one says what to do about it.
        return Err(Error::bad(format!(
            "the store of {where_} does not support flow control: it keeps no admission records, so \
             there are no step queues or concurrency keys to show"
        )));
    }
    let now = now_ms();
    let gates: Vec<(GateName, GateStats)> = engine
        .admission_stats()
        .await?
        .into_iter()
        .map(|g| (GateName::parse(&g.gate), g))
        .filter(|(name, _)| args.kind.is_none_or(|k| name.kind == Some(k)))
        .filter(|(name, _)| args.namespace.as_ref().is_none_or(|ns| &name.namespace == ns))
        .collect();
    if args.json {
        for (name, g) in &gates {
            let line = serde_json::to_string(&gate_json(name, g, now))
                .map_err(|e| Error::failed(format!("encoding gate {}: {e}", g.gate)))?;
            writeln!(out, "{line}")?;
        }
        return Ok(());
    }
    if gates.is_empty() {
        let what = match args.kind {
            Some(GateKind::Queue) => "no step queues",
            Some(GateKind::Key) => "no concurrency keys",
            None => "no step queues or concurrency keys",
        };
        if let Some(ns) = &args.namespace {
            writeln!(out, "{what} in namespace {ns} (`durable queues` without --namespace lists every namespace)")?;
        } else if args.kind.is_some() {
            writeln!(out, "{what} yet (`durable queues` without --kind lists both kinds)")?;
        } else {
            writeln!(out, "no step queues or concurrency keys yet; they appear when first used:")?;
            writeln!(
                out,
                "  a step queue (`engine.register_queue(name, ..)`) when a step sent through it \
                 (`ctx.step(..).queue(name)`) first asks for a slot"
            )?;
            writeln!(
                out,
                "  a concurrency key when a run of a workflow with `WorkflowOptions::concurrency` or \
                 `singleton` is started with it"
            )?;
        }
        return Ok(());
    }
    let mut table = Table::new(&[
        "KIND",
        "NAMESPACE",
        "NAME",
        "KEY",
        "LIMITS",
        "HELD",
        "WAITING",
        "RATE WINDOW",
        "OLDEST WAIT",
        "WAITING BY FAIRNESS KEY",
    ]);
    for (name, g) in &gates {
        table.row(vec![
            name.kind_str().into(),
            name.namespace.clone(),
            name.name.clone(),
            name.key.as_deref().map_or_else(|| "-".into(), shown_key),
            limits_text(&g.limits),
            // A gate without a concurrency limit keeps no slots: only its rate counts.
            g.limits.concurrency.map_or_else(|| "-".into(), |c| format!("{}/{c}", g.held)),
            g.waiting.to_string(),
            window_text(g, now),
            g.oldest_waiting_since.map_or_else(|| "-".into(), |since| duration_ms(now.saturating_sub(since))),
            by_key_text(g),
        ]);
    }
    table.write(out, "")?;
    Ok(())
}

/// The current rate window: `7/10, ends in 400 ms`, or `-` without a rate limit.
fn window_text(g: &GateStats, now: u64) -> String {
    let Some(rate) = g.limits.rate else { return "-".into() };
    let end = g.window_start.saturating_add(rate.period_ms);
    if end <= now {
        // No admission since the window ended: the next one starts at the next request.
        return format!("0/{}", rate.limit);
    }
    format!("{}/{}, ends {}", g.window_count, rate.limit, ago(end, now))
}

/// `acme 3, globex 1` (`(none)` for requests without a fairness key), or `-`.
fn by_key_text(g: &GateStats) -> String {
    if g.waiting_by_key.is_empty() || (!g.limits.fairness && g.waiting_by_key.iter().all(|(k, _)| k.is_empty())) {
        return "-".into();
    }
    g.waiting_by_key
        .iter()
        .map(|(k, n)| format!("{} {n}", if k.is_empty() { "(none)" } else { k.as_str() }))
        .collect::<Vec<_>>()
        .join(", ")
}

/// One gate as `--json` prints it.
fn gate_json(name: &GateName, g: &GateStats, now: u64) -> Value {
    let window_end = g.limits.rate.map(|r| g.window_start.saturating_add(r.period_ms));
    let by_key: serde_json::Map<String, Value> = g.waiting_by_key.iter().map(|(k, n)| (k.clone(), json!(n))).collect();
    json!({
        "gate": g.gate,
        "kind": name.kind.map(|k| k.as_str()),
        "namespace": name.namespace,
        "name": name.name,
        "key": name.key,
        "limits": limits_json(&g.limits),
        "held": g.held,
        "waiting": g.waiting,
        "waiting_by_fairness_key": by_key,
        // The rate window only means something with a rate limit.
        "window_count": window_end.map(|_| g.window_count),
        "window_start": window_end.map(|_| g.window_start),
        "window_end": window_end,
        "oldest_waiting_since": g.oldest_waiting_since,
        "oldest_wait_ms": g.oldest_waiting_since.map(|since| now.saturating_sub(since)),
    })
}
