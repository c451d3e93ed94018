//! # durable-transport-redis
//!
//! A Redis transport for `durable`: the run queue between engine instances on Redis Streams
//! ([`RedisTransport`], a [`Transport`](durable_transport::Transport)), and the control plane
//! on Redis pub/sub ([`RedisControlPlane`], a [`ControlPlane`](durable_transport::ControlPlane)).
//! Every engine connected to the same server with the same *prefix* shares them; another
//! prefix on the same server is another deployment, isolated from this one.
//!
//! As with every transport, a queued item is only a nudge: the run's state in the store decides
//! what a consumer does with it, so an item delivered twice never runs work twice, and one lost
//! with the server (Redis without persistence, restarted) only waits for the engine's pollers.
//!
//! ```no_run
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! use async_trait::async_trait;
//! use durable_transport::{ControlPlane, Handled, QueuedRun, RunHandler, Transport};
//! use durable_transport_redis::{RedisControlPlane, RedisTransport};
//!
//! /// Stands in for the engine, which is the handler in a real deployment.
//! struct Print;
//!
//! #[async_trait]
//! impl RunHandler for Print {
//!     async fn handle(&self, item: QueuedRun) -> Handled {
//!         println!("{} {}", item.reason, item.run_id);
//!         Handled::Done
//!     }
//! }
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let url = "redis://127.0.0.1:6379";
//! let transport = RedisTransport::connect(url, "shop")
//!     .await?
//!     .redeliver_after(Duration::from_secs(120)); // longer than the longest turn
//! // Usually handed to the engine: `Engine::builder().transport(transport.clone())`.
//! let consumer = transport.consume_runs(Some("billing".into()), 64, Arc::new(Print));
//! // ... on shutdown:
//! consumer.stop().await;
//!
//! let control = RedisControlPlane::connect(url, "shop").await?;
//! control.subscribe(Arc::new(|message| println!("{message:?}"))).await?;
//! # Ok(())
//! # }
//! ```
//!
//! ## The run queue
//!
//! Keys, all under the prefix:
//!
//! | key | type | holds |
//! | --- | --- | --- |
//! | `<prefix>:runs:<namespace>` | stream | the items of a namespace, fields `run_id`, `reason`, `namespace`, `priority`, `dedupe_key` |
//! | `<prefix>:urgent:<namespace>` | stream | the same, for items of priority above 0 |
//! | `<prefix>:runs`, `<prefix>:urgent` | stream | items sent without a namespace |
//! | `<prefix>:namespaces` | set | the key of every stream above |
//! | `<prefix>:new-streams` | stream | one entry, replaced when a stream is created (wakes consumers of every namespace) |
//! | `<prefix>:dedupe:<dedupe key>` | string | a sent dedupe key, expiring after the dedupe window |
//!
//! - **Sending** ([`dispatch_runs`](durable_transport::Transport::dispatch_runs)): one Lua
//!   script per batch, so a batch is one round trip and atomic. An item whose dedupe key was
//!   sent within the [dedupe window](RedisTransport::dedupe_window) (`SET … NX PX`) is dropped;
//!   the others are added (`XADD`) to their namespace's stream. The first item of a stream
//!   creates it with its consumer group `durable` (reading from the start, so nothing sent
//!   before a consumer came is missed) and registers it in `<prefix>:namespaces`.
//! - **Consuming** ([`consume_runs`](durable_transport::Transport::consume_runs)): each
//!   consumer is a member of the group under a name of its own. It takes at most as many items
//!   as it has free slots (and at most [`claim_batch`](RedisTransport::claim_batch)) in one
//!   script call. At a look, every quarter of
//!   [`redeliver_after`](RedisTransport::redeliver_after) (between every 50 ms and every 2 s),
//!   it first takes back its own pending items that it does not have in hand
//!   (`XPENDING … <consumer>` and `XCLAIM`: a claim whose reply was lost on the way, an
//!   acknowledgement that failed), then items left unacknowledged by anyone for longer than
//!   `redeliver_after` (`XPENDING … IDLE` and `XCLAIM`; never one whose handler still runs at
//!   this consumer); then it reads new ones (`XREADGROUP … >`). A
//!   consumer of one namespace reads that namespace's streams; a consumer of every namespace
//!   (`None`) reads every stream in `<prefix>:namespaces`. When nothing is waiting it blocks
//!   on its own connection (`XREAD BLOCK`, which wakes it at the next entry without taking
//!   it), so acknowledgements never queue behind a blocked read. Every 5 minutes it also
//!   removes from the group the consumers that hold nothing and have taken nothing for an
//!   hour (those of stopped engines; an idle live one joins again with its next item).
//! - **Settling**: each item runs on a task of its own holding one of the consumer's
//!   `concurrency` slots. [`Handled::Done`](durable_transport::Handled::Done) acknowledges and
//!   deletes the entry (`XACK` + `XDEL`, one round trip: the stream holds only what is
//!   waiting or in hand); [`Handled::HandBack`](durable_transport::Handled::HandBack)
//!   acknowledges, deletes and adds the same item again at the end of its stream, atomically,
//!   for any consumer to take at once (unless another consumer has reclaimed it meanwhile).
//! - **Redelivery**: an item a consumer took and never settled (the process died, its
//!   connection is gone for good, its handler hangs) goes to another consumer once it has been
//!   idle for `redeliver_after`. A live consumer takes back at its next look what it holds but
//!   does not run: an item whose claim's reply was lost, or whose acknowledgement failed (its
//!   handler runs again; the run's lease in the store decides what that does). An item whose
//!   handler panicked waits `redeliver_after`, here or at another consumer. An item whose
//!   handler simply runs longer than `redeliver_after` may be handed to a second consumer too:
//!   harmless (the run's lease in the store decides) but wasted, so keep `redeliver_after` well
//!   above a turn's usual length.
//! - **Priority**: Redis Streams have none. Items of priority above 0 go to the *urgent*
//!   stream of their namespace, which consumers read before the normal one (and a consumer of
//!   every namespace reads every urgent stream before any normal one). Within a stream, items
//!   are delivered in the order they were sent, whatever their priority: two lanes, not an
//!   ordering by priority.
//! - **Namespaces**: items are sent to the namespace the batch names (`None`: the senders did
//!   not know it, and only consumers of every namespace read them).
//! - **Failures**: a consumer whose connection fails keeps trying, backing off up to 4 s,
//!   reports with `tracing::warn!` at most once a minute (with the number of failures since
//!   the last report) and resumes by itself when the server is back. What a claim took when
//!   its reply was lost it takes back at its next look (above); what a process that died had
//!   taken goes to the other consumers after `redeliver_after`.
//!
//! ## The control plane
//!
//! [`RedisControlPlane::publish`](durable_transport::ControlPlane::publish) is a `PUBLISH` on
//! channel `<prefix>:control` of the message's JSON; each
//! [`subscribe`](durable_transport::ControlPlane::subscribe) holds a pub/sub connection of its
//! own, hands every message that decodes to its sink (anything else on the channel is
//! dropped), pings the server every 30 s to notice a connection that died silently, and
//! resubscribes on a new connection when it drops (reporting at most once a minute).
//!
//! ## Tasks, connections, limits
//!
//! - A [`RedisTransport`] (and its clones) shares one multiplexed connection, which reconnects
//!   by itself. Each consumer spawns one task for its loop, one task per item in hand, and
//!   opens one more connection for its blocking reads. Each control-plane subscription spawns
//!   one task with one connection; it ends when the last clone of the plane is dropped.
//! - Standalone Redis (or a primary) 6.2 or later, tested with 7.0. Not Redis Cluster: the
//!   scripts touch keys that cluster would spread over several slots. TLS (`rediss://`) is not
//!   compiled in.
//! - [`RedisTransport::destroy`] deletes every key under the prefix (test clean-up, or
//!   removing a deployment).
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod control;
mod keys;
mod outage;
mod scripts;
mod transport;

pub use control::RedisControlPlane;
pub use transport::RedisTransport;
#[cfg(feature = "test-support")]
pub mod test_support;
