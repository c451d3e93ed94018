//! # durable-transport-nats
//!
//! The run queue of the durable execution engine on NATS JetStream ([`NatsTransport`], a
//! [`Transport`](durable_transport::Transport)), and a control plane on core NATS
//! ([`NatsControlPlane`], a [`ControlPlane`](durable_transport::ControlPlane)): many engine
//! instances on many machines share one NATS server (or cluster) for the runs to execute and
//! for the small messages between them (events, cancels, nudges).
//!
//! A queued item is only a nudge — the run's durable state is in the store — so this crate
//! never holds anything the engine could not rebuild: a lost item is found by the engine's
//! pollers, a duplicate is dropped by the run's lease. What it does not do: store runs, order
//! them by anything finer than two priority lanes, or keep messages for a control-plane
//! subscriber that was away.
//!
//! ```no_run
//! use std::time::Duration;
//! use durable_transport::ControlPlane;
//! use durable_transport_nats::{NatsControlPlane, NatsTransport};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // Every instance of the deployment uses the same prefix.
//! let transport = NatsTransport::connect("nats://127.0.0.1:4222", "orders")
//!     .await?
//!     .redeliver_after(Duration::from_secs(60)) // JetStream's ack wait
//!     .claim_batch(32);
//! // The control plane can share the transport's connection.
//! let control = NatsControlPlane::from_client(transport.client().clone(), "orders").await?;
//! control.subscribe(std::sync::Arc::new(|message| println!("{message:?}"))).await?;
//! // Hand both to the engine builder; the engine calls `dispatch_runs` and `consume_runs`.
//! # Ok(())
//! # }
//! ```
//!
//! ## On the server
//!
//! For a prefix `p` (any NATS subject without wildcards or spaces, e.g. `orders` or
//! `prod.orders`; each deployment, and each test, its own):
//!
//! - **Stream** `P_RUNS` (the prefix upper-cased, characters other than ASCII letters and digits
//!   as `_`), created on connect if missing (idempotent: many instances may start at once),
//!   capturing `p.runs.>` and `p.prio.>`, with **work-queue retention**: an item leaves the
//!   stream when a consumer acks it. Duplicate window: [`StreamOptions::dedupe_window`]
//!   (2 minutes by default); an item nobody consumes expires after [`StreamOptions::max_age`]
//!   (24 hours by default). [`NatsTransport::delete`] deletes it. Two prefixes that differ only
//!   in case or punctuation (`prod.orders`, `PROD_orders`) map to one stream name: connecting
//!   with the second is refused, naming the subjects the stream carries.
//! - **Subjects**: an item is published to `p.runs.<ns>` (or `p.prio.<ns>`, below), where `<ns>`
//!   is `n` followed by the namespace's UTF-8 bytes in hex (`orders` → `n6f7264657273`), or `_`
//!   when it was sent with no namespace. Its `Nats-Msg-Id` header is the item's dedupe key, so
//!   JetStream drops an item sent twice within the duplicate window. The payload is JSON:
//!   `{"run_id", "reason", "namespace", "priority", "dedupe_key"}`; the consumer's
//!   [`QueuedRun::id`](durable_transport::QueuedRun::id) is the message's stream sequence.
//! - **Consumers**: durable pull consumers with explicit acks, shared by every instance consuming
//!   the same namespace filter: `runs-all` (filter `p.runs.>`) for an engine of every namespace,
//!   `runs-<ns>` (filter `p.runs.<ns>`) for one namespace, and the same with `prio-` for the
//!   priority lane. Ack wait = [`NatsTransport::redeliver_after`] (60 s by default): an item
//!   whose handler did not answer by then (it hangs, or its process died) is delivered again,
//!   to any instance. A handled item is acked (and so deleted); an item handed back (a
//!   draining engine) is NAKed with no delay, so another instance gets it at once. The server
//!   deletes a consumer an hour after its last fetch.
//!   On a work-queue stream JetStream refuses consumers with overlapping filters: an engine
//!   consuming every namespace cannot run beside one consuming a single namespace on the same
//!   prefix (the second one logs an error saying so, and what to change).
//! - **Doorbell**: after a batch is stored, the sender publishes an empty core-NATS message on
//!   `p.bell.<ns>`; idle consumers listening there fetch at once. Consumers also look every
//!   [`NatsTransport::poll_interval`] (1 s by default) for what no bell announced (items
//!   redelivered after the ack wait, bells lost while reconnecting). Every fetch asks for
//!   what is waiting now (no long-polling pull requests are left on the server), at most
//!   `min(free slots, claim_batch)` items.
//! - **Control plane**: core NATS subject `p.control`, one [`ControlMessage::encode`]d
//!   message per publish; nothing is stored.
//!
//! ## Priority
//!
//! JetStream has no per-message priority, so this crate approximates it with two lanes: items
//! with a priority above 0 go to the priority lane (`p.prio.<ns>`), and every fetch takes from
//! the priority lane first, then fills what is left from the normal lane. Within a lane,
//! items come out in stream order (oldest first); priorities above 0 are not told apart from
//! each other, and priorities below 0 count as 0. A consumer takes no more items than it has free
//! slots (its `concurrency`), so items do not pile up in an instance behind ones fetched
//! later; the engine hands what it gets to its execution slots in arrival order.
//!
//! ## Failures
//!
//! The client reconnects on its own. A consumer whose fetch fails (the server is down, the
//! stream or consumer was deleted) retries with a backoff of up to 5 s, recreating the
//! stream and its consumer if they are gone, and reports with `tracing::warn!` at most once a
//! minute, with the number of failures since the last report; it resumes by itself. Nothing
//! is lost meanwhile: unacked items are redelivered by JetStream. A dispatch while the client
//! is disconnected fails at once ([`TransportError::Unavailable`](durable_transport::TransportError)),
//! and the engine falls back to its pollers.
//!
//! ## Tasks
//!
//! [`NatsTransport::consume_runs`](durable_transport::Transport::consume_runs) spawns one task
//! for the consumer's loop and one per item in hand;
//! a [`NatsControlPlane`] spawns one listener task when it is made (it hands messages to every
//! subscribed sink), aborted when the last clone of the plane is dropped. The client
//! (async-nats) runs its own connection task.
//!
//! ## Tests
//!
//! The tests need a NATS server with JetStream: `DURABLE_NATS_URL=nats://127.0.0.1:4222 cargo
//! test -p durable-transport-nats`. Without the variable each prints one line saying it was
//! skipped, and passes (module `test_support`, feature `test-support`).
//!
//! [`ControlMessage::encode`]: durable_transport::ControlMessage::encode
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod control;
mod names;
mod report;
#[cfg(any(test, feature = "test-support"))]
pub mod test_support;
mod transport;

pub use control::NatsControlPlane;
pub use transport::{NatsTransport, StreamOptions};
