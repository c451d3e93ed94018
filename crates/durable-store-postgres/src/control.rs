//! The control plane over `LISTEN/NOTIFY` ([`PostgresControlPlane`]).

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use durable_core::{ControlError, ControlMessage, ControlPlane, ControlSink, ControlSinks};
use tokio_postgres::types::Type;

use crate::PostgresStore;
use crate::error::{self, Result};
use crate::listener::{Heard, OnHeard};

/// The largest message sent, in bytes of its JSON: PostgreSQL refuses a `NOTIFY` payload of
/// 8000 bytes or more; the margin keeps clear of that limit.
pub const MAX_CONTROL_MESSAGE: usize = 7900;

/// PostgreSQL keeps identifiers (channel names included) to 63 bytes.
const MAX_CHANNEL: usize = 63;

/// The suffix of the control channel.
const SUFFIX: &str = ":control";

/// The control channel of the store on `schema`: `<schema>:control`, or, for a schema name too
/// long for that to fit in 63 bytes, its first bytes, `~` and a hash of the whole name.
pub(crate) fn control_channel(schema: &str) -> String {
    let whole = format!("{schema}{SUFFIX}");
    if whole.len() <= MAX_CHANNEL {
        return whole;
    }
    // FNV-1a: stable across processes, machines and Rust versions (every engine on the schema
    // must compute the same name).
    let hash = schema.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
    let mut keep = MAX_CHANNEL - SUFFIX.len() - 17;
    while !schema.is_char_boundary(keep) {
        keep -= 1;
    }
    format!("{}~{hash:016x}{SUFFIX}", &schema[..keep])
}

/// A [`ControlPlane`] on PostgreSQL's `LISTEN/NOTIFY`, shared by every engine and worker whose
/// store is on the same schema: engine events, cancels and "work was queued" nudges reach
/// the other processes within milliseconds. Get it with [`PostgresStore::control_plane`];
/// clones share it; give one to the engine (`Engine::builder().control_plane(..)`) and to
/// workers (`WorkerBuilder::control_plane`).
///
/// - The channel is the schema's own, `<schema>:control` (see
///   [`PostgresControlPlane::channel`]); it needs no
///   [`notify_channel`](crate::PostgresOptions::notify_channel).
/// - [`publish_all`](ControlPlane::publish_all) sends a batch with one statement on a pooled
///   connection (`SELECT pg_notify(…) FROM unnest(…)`): one round trip. PostgreSQL delivers
///   the notifications when it commits, in order, to every listener on the schema (this
///   process's included). Identical messages in one batch are delivered once.
/// - A message whose JSON is over [`MAX_CONTROL_MESSAGE`] bytes is not sent (logged at debug
///   level): `NOTIFY` refuses payloads of 8000 bytes and more. Only an engine event carrying a
///   long error or a long list of runs gets there.
/// - Subscribers hear messages through one dedicated connection per store (not from the pool),
///   opened by the first [`PostgresStore::control_plane`] call and kept as long as the store or
///   a plane lives. When it drops, it reconnects (50 ms, doubling up to 5 s) and warns at most
///   once a minute; messages sent meanwhile are lost, as the contract allows.
#[derive(Clone)]
pub struct PostgresControlPlane {
    store: PostgresStore,
    channel: Arc<str>,
    sinks: Arc<ControlSinks>,
    sql: Arc<str>,
}

impl fmt::Debug for PostgresControlPlane {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresControlPlane")
            .field("target", &self.store.target())
            .field("channel", &self.channel)
            .field("subscribers", &self.sinks.len())
            .finish()
    }
}

impl PostgresControlPlane {
    /// The channel messages travel on.
    pub fn channel(&self) -> &str {
        &self.channel
    }
}

#[async_trait]
impl ControlPlane for PostgresControlPlane {
    async fn publish(&self, message: ControlMessage) -> std::result::Result<(), ControlError> {
        self.publish_all(vec![message]).await
    }

    async fn publish_all(&self, messages: Vec<ControlMessage>) -> std::result::Result<(), ControlError> {
        let payloads: Vec<String> = messages
            .iter()
            .filter_map(|m| {
                let payload = m.encode();
                if payload.len() > MAX_CONTROL_MESSAGE {
                    tracing::debug!(
                        bytes = payload.len(),
                        origin = m.origin(),
                        "control message not sent: over NOTIFY's payload limit ({MAX_CONTROL_MESSAGE} bytes)"
                    );
                    return None;
                }
                Some(payload)
            })
            .collect();
        if payloads.is_empty() {
            return Ok(());
        }
        let target = self.store.target();
        let unavailable = |e: error::Error| ControlError(e.to_string());
        let client = self.store.pool().get().await.map_err(|e| unavailable(error::pool_error(target, e)))?;
        client
            .query_typed(&self.sql, &[(&&*self.channel, Type::TEXT), (&payloads, Type::TEXT_ARRAY)])
            .await
            .map_err(|e| unavailable(error::query_error(target, "publishing on the control channel", e)))?;
        Ok(())
    }

    async fn subscribe(&self, sink: ControlSink) -> std::result::Result<(), ControlError> {
        self.sinks.add(sink);
        Ok(())
    }
}

impl PostgresStore {
    /// The control plane of this store's schema (see [`PostgresControlPlane`]): engines and
    /// workers on the schema, in any process, hear each other's events, cancels and nudges.
    ///
    /// The first call opens the dedicated connection that `LISTEN`s on the schema's control
    /// channel; later calls return clones of the same plane. Subscribing is then immediate
    /// (no round trip): a plane returned here hears every message published after this call
    /// returned.
    ///
    /// # Errors
    /// [`Error::InvalidOptions`](crate::Error::InvalidOptions) if the store was built with
    /// [`PostgresStore::from_pool`] (no URL to connect with); connection errors as for
    /// [`PostgresStore::connect_with`].
    pub async fn control_plane(&self) -> Result<PostgresControlPlane> {
        let channel = control_channel(&self.inner.options.schema);
        let target = self.target().to_string();
        let sinks = self
            .listener(&self.inner.control_listener, channel.clone(), "control_plane", || {
                let sinks = Arc::new(ControlSinks::new());
                (sinks.clone(), deliver(sinks, target))
            })
            .await?;
        Ok(PostgresControlPlane {
            store: self.clone(),
            channel: channel.into(),
            sinks,
            sql: "SELECT pg_notify($1, payload) FROM unnest($2::text[]) AS payload".into(),
        })
    }
}

/// The listener's callback: decodes each notification and hands it to every sink; reports a
/// lost connection at most once a minute.
fn deliver(sinks: Arc<ControlSinks>, target: String) -> OnHeard {
    let reported: Mutex<Option<Instant>> = Mutex::new(None);
    Arc::new(move |heard| match heard {
        Heard::Notification(payload) => match ControlMessage::decode(payload) {
            Some(message) => sinks.deliver(&message),
            None => tracing::debug!(payload, "control message dropped: it does not decode (a newer sender?)"),
        },
        Heard::Lost => {
            let mut last = reported.lock().unwrap_or_else(PoisonError::into_inner);
            if last.is_none_or(|t| t.elapsed() >= Duration::from_secs(60)) {
                *last = Some(Instant::now());
                tracing::warn!(
                    %target,
                    "the control plane's LISTEN connection dropped; reconnecting (messages sent meanwhile are lost)"
                );
            }
        }
        Heard::Reconnected => tracing::debug!(%target, "the control plane listens again"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_channel_is_the_schemas_and_always_fits() {
        assert_eq!(control_channel("durable"), "durable:control");
        let long = "s".repeat(55);
        assert_eq!(control_channel(&long), format!("{long}:control"), "55 bytes + 8 fit");
        for schema in ["x".repeat(56), "y".repeat(63), "é".repeat(31), format!("{}é", "z".repeat(62))] {
            let channel = control_channel(&schema);
            assert!(channel.len() <= 63, "{channel:?}");
            assert!(channel.ends_with(":control"));
            assert_eq!(channel, control_channel(&schema), "stable");
        }
        assert_ne!(control_channel(&format!("{}a", "x".repeat(60))), control_channel(&format!("{}b", "x".repeat(60))));
    }
}
