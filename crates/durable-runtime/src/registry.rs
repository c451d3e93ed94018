//! Registered workflows: name → version → type-erased handler.

use std::collections::BTreeMap;
use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;

use durable_core::Payload;
use parking_lot::RwLock;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::clock::BoxFuture;
use crate::error::{BodyResult, WorkflowError};
use crate::turn::WorkflowCtx;

/// The body of a workflow with its input and output types erased.
pub(crate) trait ErasedWorkflow: Send + Sync {
    /// Whether `input` decodes into the workflow's input type.
    fn check_input(&self, input: &Payload) -> Result<(), serde_json::Error>;
    /// Starts the body (not yet polled).
    fn call(&self, ctx: WorkflowCtx, input: &Payload) -> Result<BoxFuture<'static, BodyResult>, serde_json::Error>;
}

struct Handler<F, I, O> {
    f: F,
    _types: PhantomData<fn(I) -> O>,
}

impl<F, Fut, I, O> ErasedWorkflow for Handler<F, I, O>
where
    F: Fn(WorkflowCtx, I) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<O, WorkflowError>> + Send + 'static,
    I: DeserializeOwned + Send + 'static,
    O: Serialize + Send + 'static,
{
    fn check_input(&self, input: &Payload) -> Result<(), serde_json::Error> {
        input.decode::<I>().map(drop)
    }

    fn call(&self, ctx: WorkflowCtx, input: &Payload) -> Result<BoxFuture<'static, BodyResult>, serde_json::Error> {
        let input: I = input.decode()?;
        let fut = (self.f)(ctx, input);
        Ok(Box::pin(async move {
            let out = fut.await?;
            Payload::encode(&out).map_err(|e| {
                WorkflowError::new(format!("the workflow's output does not serialize: {e}"))
                    .with_code(durable_core::codes::BAD_PAYLOAD)
            })
        }))
    }
}

/// The registered versions of one workflow.
type Versions = BTreeMap<u32, Arc<dyn ErasedWorkflow>>;

/// Workflows by name, then version.
#[derive(Default)]
pub(crate) struct Registry {
    by_name: RwLock<BTreeMap<String, Versions>>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.keys()).finish()
    }
}

impl Registry {
    pub(crate) fn register<F, Fut, I, O>(&self, name: &str, version: u32, f: F)
    where
        F: Fn(WorkflowCtx, I) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<O, WorkflowError>> + Send + 'static,
        I: DeserializeOwned + Send + 'static,
        O: Serialize + Send + 'static,
    {
        let handler: Arc<dyn ErasedWorkflow> = Arc::new(Handler { f, _types: PhantomData });
        let replaced = self.by_name.write().entry(name.to_string()).or_default().insert(version, handler);
        if replaced.is_some() {
            tracing::warn!(
                workflow = name,
                version,
                "workflow {name:?} version {version} was registered already: the new body replaces the old one, and \
                 every run of that version replays on it, those started before included; register a changed body as \
                 a new version"
            );
        }
    }

    /// The newest version of `name`.
    pub(crate) fn latest(&self, name: &str) -> Option<(u32, Arc<dyn ErasedWorkflow>)> {
        self.by_name.read().get(name).and_then(|v| v.iter().next_back()).map(|(v, h)| (*v, h.clone()))
    }

    pub(crate) fn get(&self, name: &str, version: u32) -> Option<Arc<dyn ErasedWorkflow>> {
        self.by_name.read().get(name).and_then(|v| v.get(&version)).cloned()
    }

    /// Every registered workflow name.
    pub(crate) fn names(&self) -> Vec<String> {
        self.by_name.read().keys().cloned().collect()
    }

    /// Every registered `(name, version)`.
    pub(crate) fn keys(&self) -> Vec<(String, u32)> {
        self.by_name.read().iter().flat_map(|(n, vs)| vs.keys().map(move |v| (n.clone(), *v))).collect()
    }
}
