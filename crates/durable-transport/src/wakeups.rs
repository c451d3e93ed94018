//! Nudges from outside the process: "items may be waiting in the queue, look now".

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use tokio::sync::Notify;

/// A future that resolves once, boxed (the return type of [`Wakeups::next`]).
pub type WakeupFuture<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

/// A source of nudges for a [`QueueTransport`](crate::QueueTransport) consumer: something
/// outside this process (a database's `LISTEN/NOTIFY`, a broker's subscription, a file
/// watcher) saying that items may have been queued, so the consumer looks at once instead of at
/// its next poll. Attach one with
/// [`QueueTransport::with_wakeups`](crate::QueueTransport::with_wakeups).
///
/// A nudge is a hint: it carries nothing, a spurious one costs one empty claim, and a missed
/// one only delays the items until the next poll (polling stays on as the safety net).
///
/// # Contract
/// - [`Wakeups::next`] resolves when a nudge arrives. A nudge given while nobody waits is kept
///   for the next call (at most one is kept), so one that arrives while the consumer is busy
///   claiming is not lost — the semantics of [`Notify::notify_one`].
/// - Several nudges may be folded into one; one consumer per source (with several, each nudge
///   wakes one of them; the others still poll).
/// - Dropping the future returned by `next` before it resolves must not lose a nudge.
///
/// [`Notify`] implements it (trigger it with [`Notify::notify_one`]), and so does any
/// `Arc<T>` of an implementation: a store hands out an `Arc<Notify>` that its listener
/// triggers, without either crate depending on the other.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use durable_store_memory::MemoryStore;
/// use durable_transport::QueueTransport;
/// use tokio::sync::Notify;
///
/// let nudges = Arc::new(Notify::new());
/// let transport = QueueTransport::new(Arc::new(MemoryStore::new()))
///     .poll_interval(Duration::from_secs(2)) // the safety net only
///     .with_wakeups(nudges.clone());
/// // Wherever you learn that another process queued runs:
/// nudges.notify_one();
/// # let _ = transport;
/// ```
pub trait Wakeups: Send + Sync + fmt::Debug + 'static {
    /// Resolves when a nudge arrives (or at once, if one arrived since the last call).
    fn next(&self) -> WakeupFuture<'_>;
}

impl Wakeups for Notify {
    fn next(&self) -> WakeupFuture<'_> {
        Box::pin(self.notified())
    }
}

impl<T: Wakeups + ?Sized> Wakeups for Arc<T> {
    fn next(&self) -> WakeupFuture<'_> {
        (**self).next()
    }
}

impl<T: Wakeups + ?Sized> Wakeups for Box<T> {
    fn next(&self) -> WakeupFuture<'_> {
        (**self).next()
    }
}
