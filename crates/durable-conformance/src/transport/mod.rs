//! The transport conformance suite: every rule of the [`Transport`] contract as one case, run
//! on any transport — the in-process channel, the store-backed queue, a broker.
//!
//! Packaged like the store suite: a [`TransportFactory`] gives each case a fresh, empty queue
//! (its own stream, key prefix or schema) with as many handles on it as the case asks for
//! (each as another process would open it); [`TRANSPORT_CASES`] lists the cases, each a
//! `pub async fn` in [`cases`]; [`run_transport_case`] and [`run_transport_all`] run them;
//! [`transport_conformance_tests!`](crate::transport_conformance_tests) emits one `#[test]`
//! per case.
//!
//! What the cases check: every item sent is delivered at least once, also to a consumer that
//! starts later; an item is in one consumer's hands at a time; the items of a consumer that
//! died (it never answers) go to another once the redelivery time passes; an item handed back
//! (a draining engine) is delivered again at once; an item sent twice under one dedupe key is
//! delivered once; a batch of 500 arrives whole; a consumer never runs more handlers at once
//! than its concurrency; a consumer of one namespace sees none of another's items. The cases
//! assert no durations beyond generous deadlines for things that must happen.
//!
//! ```
//! use std::sync::Arc;
//! use async_trait::async_trait;
//! use durable_conformance::transport::{TransportFactory, TransportSettings, TransportUnderTest};
//! use durable_transport::{InProcessTransport, Transport};
//!
//! struct InProcess;
//! struct Channel(InProcessTransport);
//!
//! #[async_trait]
//! impl TransportUnderTest for Channel {
//!     async fn handle(&self) -> Result<Arc<dyn Transport>, String> {
//!         Ok(Arc::new(self.0.clone())) // clones share the channel
//!     }
//! }
//!
//! #[async_trait]
//! impl TransportFactory for InProcess {
//!     async fn create(&self, settings: &TransportSettings) -> Result<Box<dyn TransportUnderTest>, String> {
//!         Ok(Box::new(Channel(InProcessTransport::new().redeliver_after(settings.redeliver_after))))
//!     }
//! }
//!
//! // In a test file: one `#[test]` per case.
//! durable_conformance::transport_conformance_tests!(InProcess);
//! ```

pub mod cases;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use durable_core::RunId;
use durable_transport::Transport;

use crate::suite::{catch_unwind, panic_message};

/// What a case asks of the queue it is given.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TransportSettings {
    /// How long a delivered item may go unanswered before it is delivered again (a store
    /// queue's claim TTL, JetStream's ack wait, the idle time before a Redis `XAUTOCLAIM`).
    pub redeliver_after: Duration,
}

impl TransportSettings {
    /// Settings redelivering after `redeliver_after`.
    pub fn new(redeliver_after: Duration) -> Self {
        TransportSettings { redeliver_after }
    }
}

/// Builds the queues the transport suite runs on: one fresh, empty queue per case.
#[async_trait]
pub trait TransportFactory: Send + Sync + 'static {
    /// Why this factory cannot build queues here (a broker's URL is not set), or `None`. Every
    /// case is then skipped with that reason, without [`create`](TransportFactory::create)
    /// being called.
    fn unavailable(&self) -> Option<String> {
        None
    }

    /// A fresh, empty queue for one case, isolated from every other (a stream, key prefix or
    /// schema of its own).
    async fn create(&self, settings: &TransportSettings) -> Result<Box<dyn TransportUnderTest>, String>;
}

/// One queue under test.
#[async_trait]
pub trait TransportUnderTest: Send + Sync {
    /// A handle on the queue, as one more engine instance (another process) would open it.
    /// Handles share the queue's items; each may consume.
    async fn handle(&self) -> Result<Arc<dyn Transport>, String>;

    /// Makes the runs that items will name exist, where the transport needs that (a
    /// store-backed queue drops items of runs its store does not hold): `(run, namespace)`
    /// pairs. The default does nothing.
    async fn prepare_runs(&self, runs: &[(RunId, String)]) -> Result<(), String> {
        let _ = runs;
        Ok(())
    }

    /// Removes what the case created (a stream, keys, a schema). Called after every case,
    /// passed or failed. The default does nothing.
    async fn destroy(&self) -> Result<(), String> {
        Ok(())
    }
}

/// The signature of a case.
pub type TransportCaseFn = for<'a> fn(&'a dyn TransportUnderTest) -> crate::CaseFuture<'a>;

/// One case of the transport suite.
#[derive(Clone, Copy)]
pub struct TransportCase {
    /// Its name (also its `#[test]`'s and its function's in [`cases`]).
    pub name: &'static str,
    /// The settings its queue is created with.
    pub redeliver_after: Duration,
    /// The case.
    pub run: TransportCaseFn,
}

impl fmt::Debug for TransportCase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TransportCase")
            .field("name", &self.name)
            .field("redeliver_after", &self.redeliver_after)
            .finish()
    }
}

crate::__transport_cases!(__transport_case_table {});

/// The transport case named `name`, if there is one.
pub fn find_transport_case(name: &str) -> Option<&'static TransportCase> {
    TRANSPORT_CASES.iter().find(|c| c.name == name)
}

/// How one transport case went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TransportOutcome {
    /// Every assertion held.
    Passed,
    /// Not run: the factory is unavailable here (its reason).
    Skipped(String),
    /// An assertion failed or the queue failed.
    Failed(String),
}

/// Runs one case on a fresh queue from `factory`, destroys the queue and reports how it went.
/// Needs a tokio runtime with the time driver (consumers spawn tasks).
pub async fn run_transport_case(factory: &dyn TransportFactory, case: &TransportCase) -> TransportOutcome {
    if let Some(reason) = factory.unavailable() {
        return TransportOutcome::Skipped(reason);
    }
    let queue = match factory.create(&TransportSettings::new(case.redeliver_after)).await {
        Ok(queue) => queue,
        Err(e) => return TransportOutcome::Failed(format!("the factory could not create a queue: {e}")),
    };
    let outcome = match catch_unwind((case.run)(&*queue)).await {
        Ok(Ok(())) => TransportOutcome::Passed,
        Ok(Err(e)) => TransportOutcome::Failed(e.to_string()),
        Err(panic) => TransportOutcome::Failed(panic_message(&*panic)),
    };
    match (queue.destroy().await, outcome) {
        (Err(e), TransportOutcome::Passed) => TransportOutcome::Failed(format!("destroying the queue failed: {e}")),
        (_, outcome) => outcome,
    }
}

/// Runs every case of [`TRANSPORT_CASES`], each on a fresh queue, and reports them all as
/// `(name, outcome)` in order (it does not stop at the first failure).
pub async fn run_transport_all(factory: &dyn TransportFactory) -> Vec<(&'static str, TransportOutcome)> {
    let mut out = Vec::new();
    for case in TRANSPORT_CASES {
        out.push((case.name, run_transport_case(factory, case).await));
    }
    out
}
