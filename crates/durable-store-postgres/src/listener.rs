//! The `LISTEN` side of the store's channels: a task holding a dedicated connection that
//! listens on one channel, hands every notification to a callback and reconnects when the
//! connection drops. Behind [`PostgresStore::queue_wakeups`], [`PostgresStore::task_wakeups`]
//! and [`PostgresStore::control_plane`].

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::PostgresStore;
use crate::error::{self, Error, Result};
use crate::options::quote_ident;

/// What a listener tells its callback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Heard<'a> {
    /// A notification on the channel, with its payload.
    Notification(&'a str),
    /// The connection dropped; the listener reconnects. Notifications sent meanwhile are lost.
    Lost,
    /// The listener listens again after [`Heard::Lost`].
    Reconnected,
}

/// The callback of a listener. Called on the listener's task: it must return quickly.
pub(crate) type OnHeard = Arc<dyn Fn(Heard<'_>) + Send + Sync>;

/// A callback that nudges `notify` on every notification and after every reconnection (a
/// permit is stored when nobody waits: a nudge is never lost, nudges fold).
pub(crate) fn nudge(notify: Arc<Notify>) -> OnHeard {
    Arc::new(move |heard| {
        if heard != Heard::Lost {
            notify.notify_one();
        }
    })
}

/// A running listener and what its starter hands out (`value`: a `Notify`, a plane's
/// subscribers). Dropped (task aborted, connection closed) with the store.
pub(crate) struct Listener<T> {
    pub(crate) value: T,
    task: JoinHandle<()>,
}

impl<T> std::fmt::Debug for Listener<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener").finish_non_exhaustive()
    }
}

impl<T> Drop for Listener<T> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What the listener needs to (re)connect.
struct ListenTarget {
    dial: crate::tls::Dial,
    target: String,
    channel: String,
}

impl ListenTarget {
    /// Opens a connection, starts a task handing its notifications to `on_heard`, and
    /// subscribes. Returns the client (the connection lives as long as it) and the task, which
    /// ends when the connection does.
    async fn connect(&self, on_heard: &OnHeard) -> Result<(tokio_postgres::Client, JoinHandle<()>)> {
        let forward = on_heard.clone();
        let (client, driver) = self
            .dial
            .connect_listening(move |payload| {
                forward(Heard::Notification(payload));
                true
            })
            .await
            .map_err(|e| error::connect_error(&self.target, e))?;
        let subscribed = client.batch_execute(&format!("LISTEN {}", quote_ident(&self.channel))).await;
        if let Err(e) = subscribed {
            driver.abort();
            let doing = format!("subscribing to the notify channel {:?}", self.channel);
            return Err(error::query_error(&self.target, &doing, e));
        }
        Ok((client, driver))
    }
}

/// Keeps listening: waits for the connection to end, then reconnects with a backoff (50 ms
/// doubling to 5 s), telling the callback when the connection was lost and when it listens
/// again.
async fn supervise(
    target: ListenTarget,
    on_heard: OnHeard,
    mut client: tokio_postgres::Client,
    mut driver: JoinHandle<()>,
) {
    loop {
        let _ = (&mut driver).await;
        // The connection is gone (terminated, server restarted, network).
        drop(client);
        on_heard(Heard::Lost);
        let mut backoff = Duration::from_millis(50);
        loop {
            tokio::time::sleep(backoff).await;
            match target.connect(&on_heard).await {
                Ok((c, d)) => {
                    client = c;
                    driver = d;
                    break;
                }
                Err(_) => backoff = (backoff * 2).min(Duration::from_secs(5)),
            }
        }
        on_heard(Heard::Reconnected);
    }
}

impl PostgresStore {
    /// The value of the listener in `slot` on `channel`, started on first use with what `start`
    /// makes: the value to hand out and the callback (`what` names the caller in errors).
    pub(crate) async fn listener<T: Clone>(
        &self,
        slot: &tokio::sync::Mutex<Option<Listener<T>>>,
        channel: String,
        what: &str,
        start: impl FnOnce() -> (T, OnHeard),
    ) -> Result<T> {
        let Some(dial) = self.inner.config.clone() else {
            return Err(Error::InvalidOptions {
                reason: format!(
                    "{what} needs a store connected with a URL (PostgresStore::connect_with), not from_pool"
                ),
            });
        };
        let mut listener = slot.lock().await;
        if let Some(l) = listener.as_ref() {
            return Ok(l.value.clone());
        }
        let target = ListenTarget { dial, target: self.target().to_string(), channel };
        let (value, on_heard) = start();
        let (client, driver) = target.connect(&on_heard).await?;
        let task = tokio::spawn(supervise(target, on_heard, client, driver));
        *listener = Some(Listener { value: value.clone(), task });
        Ok(value)
    }
}
