//! A transport inside one process: an unbounded channel.

use std::sync::Arc;

use async_trait::async_trait;
use durable_core::QueuedRun;
use tokio::sync::{Mutex, Semaphore, mpsc, watch};

use crate::{Consumer, Handled, RunHandler, Transport, TransportError};

/// Runs sent through a channel to consumers in the same process. Items are not persisted:
/// after a crash the engine's pollers find the runs in the store. Clones share the channel.
#[derive(Debug, Clone)]
pub struct InProcessTransport {
    tx: mpsc::UnboundedSender<QueuedRun>,
    rx: Arc<Mutex<mpsc::UnboundedReceiver<QueuedRun>>>,
}

impl InProcessTransport {
    /// A new, empty channel.
    pub fn new() -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        InProcessTransport { tx, rx: Arc::new(Mutex::new(rx)) }
    }
}

impl Default for InProcessTransport {
    fn default() -> Self {
        Self::new()
    }
}

#[async_trait]
impl Transport for InProcessTransport {
    async fn dispatch_runs(&self, _namespace: Option<&str>, batch: Vec<QueuedRun>) -> Result<(), TransportError> {
        for item in batch {
            self.tx.send(item).map_err(|_| TransportError::Closed)?;
        }
        Ok(())
    }

    fn consume_runs(&self, _namespace: Option<String>, concurrency: usize, handler: Arc<dyn RunHandler>) -> Consumer {
        let (stop, mut stopped) = watch::channel(false);
        let rx = self.rx.clone();
        let tx = self.tx.clone();
        let slots = Arc::new(Semaphore::new(concurrency.max(1)));
        let task = tokio::spawn(async move {
            loop {
                // Biased, stop first: a stopped consumer takes nothing more, and the order in
                // which ready branches are taken does not depend on chance.
                let permit = tokio::select! {
                    biased;
                    _ = stopped.wait_for(|s| *s) => break,
                    p = slots.clone().acquire_owned() => p.expect("never closed"),
                };
                let item = tokio::select! {
                    biased;
                    _ = stopped.wait_for(|s| *s) => break,
                    item = async { rx.lock().await.recv().await } => match item { Some(i) => i, None => break },
                };
                let (handler, tx) = (handler.clone(), tx.clone());
                tokio::spawn(async move {
                    if handler.handle(item.clone()).await == Handled::HandBack {
                        let _ = tx.send(item);
                    }
                    drop(permit);
                });
            }
        });
        Consumer::new(stop, task)
    }
}
