//! `durable signals list | purge`: the signals and events buffered because no run waited for
//! them yet ([`Engine::buffered`](durable::Engine::buffered),
//! [`Engine::purge_buffered`](durable::Engine::purge_buffered)).

use std::io::Write;

use durable::{BufferedKind, BufferedPurge, BufferedQuery};
use serde_json::json;

use crate::cli::{BufferKindArg, SignalsListArgs, SignalsPurgeArgs, StoreArgs};
use crate::error::Result;
use crate::format::{Table, ago, duration_ms, now_ms, plural};
use crate::store::{Access, with_operator_engine};

impl BufferKindArg {
    fn kind(self) -> BufferedKind {
        match self {
            BufferKindArg::Signal => BufferedKind::Signal,
            BufferKindArg::Event => BufferedKind::Event,
        }
    }
}

/// The time `older_than` before now, on the operator's clock (the senders' clocks stamped the
/// deliveries).
fn before(older_than: Option<std::time::Duration>) -> Option<u64> {
    older_than.map(|d| now_ms().saturating_sub(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)))
}

/// `durable signals list`.
pub(crate) async fn list(store: &StoreArgs, args: &SignalsListArgs, out: &mut dyn Write) -> Result<()> {
    let query = BufferedQuery {
        kind: args.kind.map(BufferKindArg::kind),
        prefix: args.prefix.clone(),
        oldest_before: before(args.older_than),
        // One more than shown, to tell whether there are more.
        limit: args.limit as usize + 1,
    };
    let store = store.open(Access::Existing).await?;
    with_operator_engine(store, |engine| async move {
        let mut keys = engine.buffered(&query).await?;
        let more = keys.len() > args.limit as usize;
        keys.truncate(args.limit as usize);
        if args.json {
            for k in &keys {
                let line = json!({
                    "kind": k.kind.as_str(),
                    "key": k.key,
                    "count": k.count,
                    "oldest_at": k.oldest_at,
                    "newest_at": k.newest_at,
                });
                writeln!(out, "{line}")?;
            }
            return Ok(());
        }
        if keys.is_empty() {
            let filtered = args.kind.is_some() || args.prefix.is_some() || args.older_than.is_some();
            writeln!(out, "nothing buffered{}", if filtered { " that matches" } else { "" })?;
            return Ok(());
        }
        let now = now_ms();
        let mut table = Table::new(&["KIND", "KEY", "COUNT", "OLDEST", "NEWEST"]);
        for k in &keys {
            table.row(vec![
                k.kind.to_string(),
                k.key.clone(),
                k.count.to_string(),
                ago(k.oldest_at, now),
                ago(k.newest_at, now),
            ]);
        }
        table.write(out, "")?;
        if more {
            let n = keys.len();
            writeln!(out, "(the first {n} key{}: narrow with --prefix or --kind, or raise --limit)", plural(n as u64))?;
        }
        Ok(())
    })
    .await
}

/// `durable signals purge`.
pub(crate) async fn purge(store: &StoreArgs, args: &SignalsPurgeArgs, out: &mut dyn Write) -> Result<()> {
    let kind = args.kind.kind();
    let purge = BufferedPurge { kind, key: args.key.clone(), buffered_before: before(args.older_than) };
    let store = store.open(Access::Existing).await?;
    with_operator_engine(store, |engine| async move {
        let deleted = engine.purge_buffered(&purge).await?;
        let what = match kind {
            BufferedKind::Signal => format!("token {:?}", args.key),
            BufferedKind::Event => format!("name {:?}", args.key),
        };
        let age =
            args.older_than.map_or(String::new(), |d| format!(" (older than {})", duration_ms(d.as_millis() as u64)));
        match deleted {
            0 => writeln!(out, "no buffered {kind} of {what}{age}: nothing purged")?,
            n => writeln!(out, "purged {n} buffered {kind}{} of {what}{age}", plural(n))?,
        }
        Ok(())
    })
    .await
}
