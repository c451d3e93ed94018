//! The run queue on JetStream: one work-queue stream per deployment, two lanes (priority and
//! normal), a durable pull consumer per lane and namespace filter, and a core-NATS doorbell
//! that wakes idle consumers when items are sent.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_nats::Client;
use async_nats::connection::State;
use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy, PullConsumer, pull};
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::stream::{Config as StreamConfig, RetentionPolicy, StorageType};
use async_nats::jetstream::{self, AckKind, ErrorCode};
use async_trait::async_trait;
use durable_core::{QueueReason, QueuedRun, RunId};
use durable_transport::{Consumer, Handled, RunHandler, Transport, TransportError};
use futures_util::{FutureExt, StreamExt};
use serde::{Deserialize, Serialize};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

use crate::names::{self, Lane};
use crate::report::{Backoff, Reporter};

/// How long a JetStream request (a fetch, a stream or consumer lookup) may take before the
/// consumer counts it as failed.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// How long the server keeps a durable consumer that nobody fetched from (every instance of its
/// namespace stopped): long enough for a deploy, short enough that a consumer of every
/// namespace left behind does not block namespaced consumers for good (see
/// [`NatsTransport::consume_runs`]).
const FORGET_CONSUMERS_AFTER: Duration = Duration::from_secs(3600);

/// The stream's settings, used when it is created (an existing stream is used as it is).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StreamOptions {
    /// How long JetStream remembers a dedupe key (`Nats-Msg-Id`): an item sent again under the
    /// same key within this window is dropped. Default 2 minutes (JetStream's).
    pub dedupe_window: Duration,
    /// Copies of the stream in a JetStream cluster. Default 1.
    pub replicas: usize,
    /// Keep the stream in memory instead of on disk (faster, lost when the server restarts —
    /// the engine's pollers find the runs again). Default `false`.
    pub memory: bool,
    /// How long an item nobody consumes stays in the stream (e.g. one sent with no namespace
    /// while every engine consumes a single namespace, or while no engine runs at all). The
    /// engine's pollers find what such an item stood for. Default 24 hours; zero keeps items
    /// for good.
    pub max_age: Duration,
}

impl Default for StreamOptions {
    fn default() -> Self {
        StreamOptions {
            dedupe_window: Duration::from_secs(120),
            replicas: 1,
            memory: false,
            max_age: Duration::from_secs(24 * 3600),
        }
    }
}

impl StreamOptions {
    /// The defaults: a 2-minute dedupe window, one replica, on disk, items kept 24 hours.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets [`StreamOptions::dedupe_window`].
    pub fn dedupe_window(mut self, window: Duration) -> Self {
        self.dedupe_window = window;
        self
    }

    /// Sets [`StreamOptions::replicas`] (at least 1).
    pub fn replicas(mut self, replicas: usize) -> Self {
        self.replicas = replicas.max(1);
        self
    }

    /// Sets [`StreamOptions::memory`].
    pub fn memory(mut self, memory: bool) -> Self {
        self.memory = memory;
        self
    }

    /// Sets [`StreamOptions::max_age`].
    pub fn max_age(mut self, max_age: Duration) -> Self {
        self.max_age = max_age;
        self
    }
}

/// The run queue on NATS JetStream. Clones share the connection.
///
/// See the [crate documentation](crate) for the stream, subjects and consumers it uses.
#[derive(Clone)]
pub struct NatsTransport {
    shared: Arc<Shared>,
    redeliver_after: Duration,
    claim_batch: usize,
    poll_interval: Duration,
}

/// What every clone shares: the connection and the names.
struct Shared {
    client: Client,
    js: jetstream::Context,
    prefix: String,
    stream: String,
    options: StreamOptions,
}

impl fmt::Debug for NatsTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsTransport")
            .field("prefix", &self.shared.prefix)
            .field("stream", &self.shared.stream)
            .field("options", &self.shared.options)
            .field("redeliver_after", &self.redeliver_after)
            .field("claim_batch", &self.claim_batch)
            .field("poll_interval", &self.poll_interval)
            .finish()
    }
}

fn unavailable(what: &str, e: impl fmt::Display) -> TransportError {
    TransportError::Unavailable(format!("{what}: {e}"))
}

/// A queue item as it travels (JSON). [`QueuedRun::id`] is not sent: it is the message's
/// stream sequence.
#[derive(Debug, Serialize, Deserialize)]
struct WireItem {
    run_id: RunId,
    reason: QueueReason,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    namespace: Option<String>,
    #[serde(default)]
    priority: i32,
    dedupe_key: String,
}

/// A dedupe key as a header value: NATS headers cannot hold line breaks.
fn header_safe(key: &str) -> std::borrow::Cow<'_, str> {
    if key.contains(['\r', '\n']) { key.escape_debug().to_string().into() } else { key.into() }
}

impl NatsTransport {
    /// Connects to the NATS server(s) at `url` (e.g. `nats://127.0.0.1:4222`; several separated
    /// by commas) and makes sure the stream of `prefix` exists, with the default
    /// [`StreamOptions`].
    pub async fn connect(url: &str, prefix: &str) -> Result<Self, TransportError> {
        Self::connect_with(url, prefix, StreamOptions::default()).await
    }

    /// [`NatsTransport::connect`] with stream options (used when this call creates the stream).
    pub async fn connect_with(url: &str, prefix: &str, options: StreamOptions) -> Result<Self, TransportError> {
        names::check_prefix(prefix).map_err(TransportError::Unavailable)?;
        let client = async_nats::ConnectOptions::new()
            .name(format!("durable-transport-nats {prefix}"))
            .connect(url)
            .await
            .map_err(|e| unavailable(&format!("could not connect to NATS at {url}"), e))?;
        Self::from_client_with(client, prefix, options).await
    }

    /// A transport on a connection you made (your own TLS, credentials, reconnect settings):
    /// makes sure the stream of `prefix` exists, with the default [`StreamOptions`].
    pub async fn from_client(client: Client, prefix: &str) -> Result<Self, TransportError> {
        Self::from_client_with(client, prefix, StreamOptions::default()).await
    }

    /// [`NatsTransport::from_client`] with stream options.
    pub async fn from_client_with(
        client: Client,
        prefix: &str,
        options: StreamOptions,
    ) -> Result<Self, TransportError> {
        names::check_prefix(prefix).map_err(TransportError::Unavailable)?;
        let js = jetstream::new(client.clone());
        let shared = Shared { client, js, prefix: prefix.to_string(), stream: names::stream_name(prefix), options };
        shared.ensure_stream().await?;
        Ok(NatsTransport {
            shared: Arc::new(shared),
            redeliver_after: Duration::from_secs(60),
            claim_batch: 32,
            poll_interval: Duration::from_secs(1),
        })
    }

    /// How long a delivered item may stay unanswered (its handler still running, or its
    /// consumer dead) before JetStream delivers it again: the consumers' ack wait. Default
    /// 60 s. Every instance of a deployment should use the same value: the consumer is shared,
    /// and the last instance to start sets it.
    pub fn redeliver_after(mut self, after: Duration) -> Self {
        self.redeliver_after = after;
        self
    }

    /// The most items one fetch takes (at least 1; default 32). A consumer fetches again at
    /// once after a full fetch while it has free slots, so this bounds how much of a burst one
    /// instance grabs before the others get a look, not its throughput.
    pub fn claim_batch(mut self, batch: usize) -> Self {
        self.claim_batch = batch.max(1);
        self
    }

    /// How often an idle consumer looks for items nobody rang the doorbell for: items
    /// redelivered after [`redeliver_after`](NatsTransport::redeliver_after), or sent while its
    /// doorbell subscription was reconnecting. Default 1 s.
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval.max(Duration::from_millis(10));
        self
    }

    /// The connection (to share it with a [`NatsControlPlane`](crate::NatsControlPlane)).
    pub fn client(&self) -> &Client {
        &self.shared.client
    }

    /// The deployment's prefix.
    pub fn prefix(&self) -> &str {
        &self.shared.prefix
    }

    /// The stream's name: `<PREFIX>_RUNS`.
    pub fn stream_name(&self) -> &str {
        &self.shared.stream
    }

    /// Items in the stream: waiting, or delivered and not answered yet (for monitoring).
    pub async fn queued(&self) -> Result<u64, TransportError> {
        let mut stream =
            self.shared.js.get_stream(&self.shared.stream).await.map_err(|e| unavailable("stream info", e))?;
        let info = stream.info().await.map_err(|e| unavailable("stream info", e))?;
        Ok(info.state.messages)
    }

    /// Deletes the stream with its items and consumers (a deployment's teardown; tests). A
    /// missing stream is not an error. Stop the consumers first: a running consumer creates
    /// the stream again.
    pub async fn delete(&self) -> Result<(), TransportError> {
        match self.shared.js.delete_stream(&self.shared.stream).await {
            Ok(_) => Ok(()),
            Err(e) => match e.kind() {
                jetstream::context::DeleteStreamErrorKind::JetStream(js) if js.code() == 404 => Ok(()),
                _ => Err(unavailable("could not delete the stream", e)),
            },
        }
    }

    /// Publishes every item, then awaits every publish ack.
    async fn publish_batch(&self, namespace: Option<&str>, batch: &[QueuedRun]) -> Result<(), PublishFailure> {
        let prefix = &self.shared.prefix;
        let mut acks = Vec::with_capacity(batch.len());
        let mut bells = BTreeSet::new();
        for item in batch {
            let ns = namespace.or(item.namespace.as_deref());
            names::check_namespace(ns).map_err(|e| PublishFailure::Other(TransportError::Unavailable(e)))?;
            let wire = WireItem {
                run_id: item.run_id.clone(),
                reason: item.reason,
                namespace: ns.map(str::to_string),
                priority: item.priority,
                dedupe_key: item.dedupe_key.clone(),
            };
            let payload = serde_json::to_vec(&wire).map_err(|e| PublishFailure::Other(unavailable("encode", e)))?;
            let mut message = PublishMessage::build().payload(payload.into());
            if !item.dedupe_key.is_empty() {
                message = message.message_id(header_safe(&item.dedupe_key));
            }
            let subject = names::item_subject(prefix, Lane::of(item.priority), ns);
            let ack = self.shared.js.send_publish(subject, message).await.map_err(PublishFailure::from_publish)?;
            acks.push(ack);
            bells.insert(names::bell_subject(prefix, ns));
        }
        // Every publish is in flight: their acks come back concurrently.
        for ack in acks {
            ack.await.map_err(PublishFailure::from_publish)?;
        }
        for bell in bells {
            // A lost bell only delays the items until the consumers' next poll.
            let _ = self.shared.client.publish(bell, Vec::new().into()).await;
        }
        Ok(())
    }
}

/// Why a batch was not sent.
enum PublishFailure {
    /// The stream does not exist (deleted behind our back): create it and send again.
    NoStream,
    Other(TransportError),
}

impl PublishFailure {
    fn from_publish(e: jetstream::context::PublishError) -> Self {
        match e.kind() {
            jetstream::context::PublishErrorKind::StreamNotFound => PublishFailure::NoStream,
            _ => PublishFailure::Other(unavailable("publish to JetStream", e)),
        }
    }
}

impl Shared {
    /// Gets the stream, or creates it: idempotent across many instances starting at once.
    async fn ensure_stream(&self) -> Result<(), TransportError> {
        let config = StreamConfig {
            name: self.stream.clone(),
            subjects: names::stream_subjects(&self.prefix),
            retention: RetentionPolicy::WorkQueue,
            storage: if self.options.memory { StorageType::Memory } else { StorageType::File },
            num_replicas: self.options.replicas,
            duplicate_window: self.options.dedupe_window,
            max_age: self.options.max_age,
            description: Some(format!("durable run queue of prefix {:?}", self.prefix)),
            ..Default::default()
        };
        let mut last = None;
        let mut backoff = Duration::from_millis(50);
        for _ in 0..5 {
            let e = match self.js.get_or_create_stream(config.clone()).await {
                Ok(stream) => {
                    let found = &stream.cached_info().config;
                    if found.retention != RetentionPolicy::WorkQueue {
                        return Err(TransportError::Unavailable(format!(
                            "stream {} exists but is not a work queue ({:?} retention): delete it or use another prefix",
                            self.stream, found.retention
                        )));
                    }
                    // Another prefix maps to this stream name (the name keeps only letters and
                    // digits, upper-cased): its stream would not capture this prefix's items.
                    if !config.subjects.iter().all(|s| found.subjects.contains(s)) {
                        return Err(TransportError::Unavailable(format!(
                            "stream {} exists for other subjects ({}), not those of prefix {:?} ({}): another \
                             prefix maps to the same stream name; use a prefix that differs in more than case \
                             and punctuation",
                            self.stream,
                            found.subjects.join(", "),
                            self.prefix,
                            config.subjects.join(", ")
                        )));
                    }
                    return Ok(());
                }
                Err(e) => e,
            };
            let code = match e.kind() {
                jetstream::context::CreateStreamErrorKind::JetStream(js) => Some((js.code(), js.error_code())),
                _ => None,
            };
            match code {
                // Another instance created it between our lookup and our create (with other
                // options): look it up again.
                Some((_, ErrorCode::STREAM_NAME_EXIST)) => {}
                // The server failed creating its store (seen on a standalone 2.9 server creating
                // a stream while the last other one is being deleted): try again shortly.
                Some((500, _)) => {
                    tracing::debug!(stream = %self.stream, error = %e, "creating the stream failed on the server; trying again");
                    tokio::time::sleep(backoff).await;
                    backoff *= 2;
                }
                _ => return Err(unavailable(&format!("could not create stream {}", self.stream), e)),
            }
            last = Some(e);
        }
        Err(unavailable(
            &format!("could not create stream {}", self.stream),
            last.map_or_else(String::new, |e| e.to_string()),
        ))
    }
}

#[async_trait]
impl Transport for NatsTransport {
    async fn dispatch_runs(&self, namespace: Option<&str>, batch: Vec<QueuedRun>) -> Result<(), TransportError> {
        if batch.is_empty() {
            return Ok(());
        }
        if self.shared.client.connection_state() == State::Disconnected {
            return Err(TransportError::Unavailable("not connected to NATS (reconnecting)".into()));
        }
        match self.publish_batch(namespace, &batch).await {
            Ok(()) => Ok(()),
            Err(PublishFailure::NoStream) => {
                // Sending again is safe: what got through is deduplicated by its key.
                self.shared.ensure_stream().await?;
                match self.publish_batch(namespace, &batch).await {
                    Ok(()) => Ok(()),
                    Err(PublishFailure::NoStream) => {
                        Err(TransportError::Unavailable(format!("stream {} not found", self.shared.stream)))
                    }
                    Err(PublishFailure::Other(e)) => Err(e),
                }
            }
            Err(PublishFailure::Other(e)) => Err(e),
        }
    }

    /// Starts a consumer (see the trait). Every instance consuming the same `namespace` shares
    /// one durable consumer per lane (`runs-all`/`prio-all` for `None`, `runs-<ns>`/`prio-<ns>`
    /// otherwise); JetStream gives each item to one of them.
    ///
    /// On a work-queue stream JetStream refuses consumers whose subjects overlap: an instance
    /// consuming every namespace (`None`) cannot run beside one consuming a single namespace on
    /// the same prefix. The consumer that comes second logs an error saying so (once a minute)
    /// and keeps trying; run every engine of a prefix with a namespace or none without, or give
    /// each pool its own prefix.
    fn consume_runs(&self, namespace: Option<String>, concurrency: usize, handler: Arc<dyn RunHandler>) -> Consumer {
        let (stop, stopped) = watch::channel(false);
        let looper = Looper {
            transport: self.clone(),
            namespace,
            slots: Arc::new(Semaphore::new(concurrency.max(1))),
            handler,
            lanes: [None, None],
        };
        Consumer::new(stop, tokio::spawn(looper.run(stopped)))
    }
}

/// Why a consumer's look failed.
#[derive(Debug)]
enum LookError {
    /// JetStream refuses the consumer: its subjects overlap another consumer's.
    Overlap { consumer: String, error: String },
    /// The connection, the server or a request failed.
    Failed(String),
}

impl fmt::Display for LookError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LookError::Overlap { error, .. } | LookError::Failed(error) => f.write_str(error),
        }
    }
}

/// One consumer: fetches when items may be waiting and a slot is free, hands each item to the
/// handler on a task of its own.
struct Looper {
    transport: NatsTransport,
    namespace: Option<String>,
    slots: Arc<Semaphore>,
    handler: Arc<dyn RunHandler>,
    /// The lanes' JetStream consumers, priority first (looked up again after a failure).
    lanes: [Option<PullConsumer>; 2],
}

const LANES: [Lane; 2] = [Lane::Priority, Lane::Normal];

impl Looper {
    async fn run(mut self, mut stopped: watch::Receiver<bool>) {
        let shared = self.transport.shared.clone();
        let ns = self.namespace.as_deref();
        let bell_subject = names::bell_filter(&shared.prefix, ns);
        let mut bell = None;
        let mut reporter = Reporter::default();
        let mut backoff = Backoff::new();
        // Items may be waiting: look (at start, after a full fetch, a bell, a poll).
        let mut look = true;
        loop {
            if *stopped.borrow() {
                break;
            }
            if look {
                let result = async {
                    if bell.is_none() {
                        // Subscribed before the look, so no bell rung after it is missed.
                        let sub = shared.client.subscribe(bell_subject.clone()).await;
                        bell = Some(sub.map_err(|e| LookError::Failed(format!("doorbell subscription: {e}")))?);
                    }
                    let permits = tokio::select! {
                        biased;
                        _ = stopped.wait_for(|s| *s) => return Ok(false),
                        p = self.slots.clone().acquire_owned() => p.expect("the semaphore is never closed"),
                    };
                    self.look(permits).await
                }
                .await;
                match result {
                    Ok(full) => {
                        look = full;
                        backoff.reset();
                        if reporter.succeeded() {
                            tracing::info!(stream = %shared.stream, "the NATS run queue consumer is fetching again");
                        }
                    }
                    Err(e) => {
                        self.lanes = [None, None];
                        look = true;
                        report(&mut reporter, &shared.stream, &e);
                        tokio::select! {
                            biased;
                            _ = stopped.wait_for(|s| *s) => break,
                            () = tokio::time::sleep(backoff.next_wait()) => {}
                        }
                    }
                }
                continue;
            }
            let Some(sub) = bell.as_mut() else {
                look = true;
                continue;
            };
            tokio::select! {
                biased;
                _ = stopped.wait_for(|s| *s) => break,
                rung = sub.next() => {
                    if rung.is_none() {
                        bell = None; // the connection was closed: subscribe again (or fail)
                    } else {
                        // Bells rung while this consumer was busy: one look answers them all.
                        while let Some(Some(_)) = sub.next().now_or_never() {}
                    }
                }
                () = tokio::time::sleep(self.transport.poll_interval) => {}
            }
            look = true;
        }
    }

    /// Fetches the priority lane, then the normal one, up to `min(free slots, claim_batch)`
    /// items in all; `Ok(true)` if it got all it asked for (more may be waiting).
    async fn look(&mut self, first: OwnedSemaphorePermit) -> Result<bool, LookError> {
        // One permit per item this look may take: the free slots, at most `claim_batch`.
        let mut permits = vec![first];
        while permits.len() < self.transport.claim_batch {
            match self.slots.clone().try_acquire_owned() {
                Ok(permit) => permits.push(permit),
                Err(_) => break,
            }
        }
        if self.transport.shared.client.connection_state() == State::Disconnected {
            return Err(LookError::Failed("not connected to NATS (reconnecting)".into()));
        }
        // The priority lane first; what it leaves goes to the normal lane.
        for (i, lane) in LANES.into_iter().enumerate() {
            if permits.is_empty() {
                break;
            }
            let consumer = self.consumer(i, lane).await?;
            self.fetch(&consumer, &mut permits).await?;
        }
        // Unused permits go back with `permits`.
        Ok(permits.is_empty())
    }

    /// The lane's JetStream consumer, created (or updated) if not known yet.
    async fn consumer(&mut self, i: usize, lane: Lane) -> Result<PullConsumer, LookError> {
        if let Some(c) = &self.lanes[i] {
            return Ok(c.clone());
        }
        let shared = &self.transport.shared;
        let ns = self.namespace.as_deref();
        names::check_namespace(ns).map_err(LookError::Failed)?;
        let name = names::consumer_name(lane, ns);
        let config = pull::Config {
            durable_name: Some(name.clone()),
            description: Some(format!("durable run queue consumer ({} lane)", lane.word())),
            filter_subject: names::consumer_filter(&shared.prefix, lane, ns),
            deliver_policy: DeliverPolicy::All,
            ack_policy: AckPolicy::Explicit,
            ack_wait: self.transport.redeliver_after,
            max_deliver: -1,
            // The instances' concurrency bounds what is in hand, not the server.
            max_ack_pending: -1,
            inactive_threshold: FORGET_CONSUMERS_AFTER,
            ..Default::default()
        };
        let mut created = None;
        for _ in 0..2 {
            let attempt = tokio::time::timeout(
                REQUEST_TIMEOUT,
                shared.js.create_consumer_on_stream(config.clone(), &shared.stream),
            )
            .await
            .map_err(|_| LookError::Failed(format!("creating consumer {name} timed out")))?;
            match attempt {
                Ok(c) => {
                    created = Some(c);
                    break;
                }
                Err(e) => {
                    let code = match e.kind() {
                        jetstream::stream::ConsumerErrorKind::JetStream(js) => Some(js.error_code()),
                        _ => None,
                    };
                    match code {
                        Some(
                            ErrorCode::CONSUMER_WQ_CONSUMER_NOT_UNIQUE | ErrorCode::CONSUMER_WQ_MULTIPLE_UNFILTERED,
                        ) => {
                            return Err(LookError::Overlap { consumer: name, error: e.to_string() });
                        }
                        // The stream is gone (deleted, or the server lost it): create it again.
                        Some(ErrorCode::STREAM_NOT_FOUND) => {
                            shared.ensure_stream().await.map_err(|e| LookError::Failed(e.to_string()))?;
                        }
                        _ => return Err(LookError::Failed(format!("could not create consumer {name}: {e}"))),
                    }
                }
            }
        }
        let consumer = created.ok_or_else(|| LookError::Failed(format!("could not create consumer {name}")))?;
        self.lanes[i] = Some(consumer.clone());
        Ok(consumer)
    }

    /// Takes what is waiting in one lane, at most one item per permit, and hands each on with
    /// one of the permits.
    async fn fetch(&self, consumer: &PullConsumer, permits: &mut Vec<OwnedSemaphorePermit>) -> Result<(), LookError> {
        let failed = |e: &dyn fmt::Display| LookError::Failed(format!("fetch from JetStream: {e}"));
        let taken = tokio::time::timeout(REQUEST_TIMEOUT, async {
            let mut batch = consumer.fetch().max_messages(permits.len()).messages().await.map_err(|e| failed(&e))?;
            while let Some(message) = batch.next().await {
                let message = message.map_err(|e| failed(&e))?;
                match permits.pop() {
                    Some(permit) => self.hand(message, permit),
                    // Never: the server sends at most what was asked for. Put it back.
                    None => {
                        let _ = message.ack_with(AckKind::Nak(None)).await;
                    }
                }
            }
            Ok(())
        })
        .await;
        match taken {
            Ok(result) => result,
            // What the server sends after this is redelivered once `redeliver_after` passes.
            Err(_) => Err(LookError::Failed("fetch from JetStream timed out".into())),
        }
    }

    /// Hands one message to the handler on a task of its own, holding `permit` (one slot):
    /// acked when done, handed back (NAK, no delay) otherwise.
    fn hand(&self, message: jetstream::Message, permit: OwnedSemaphorePermit) {
        let Some(item) = decode(&message, self.namespace.as_deref()) else {
            tracing::warn!(subject = %message.subject, "dropping a run queue message that does not decode");
            tokio::spawn(async move {
                let _ = message.ack_with(AckKind::Term).await;
                drop(permit);
            });
            return;
        };
        let handler = self.handler.clone();
        let client = self.transport.shared.client.clone();
        let bell = names::bell_subject(&self.transport.shared.prefix, item.namespace.as_deref());
        tokio::spawn(async move {
            let outcome = handler.handle(item).await;
            let settled = match outcome {
                Handled::Done => message.ack().await,
                Handled::HandBack => {
                    // Confirmed before the bell, so whoever the bell wakes finds it back.
                    let nak = message.double_ack_with(AckKind::Nak(None)).await;
                    let _ = client.publish(bell, Vec::new().into()).await;
                    nak
                }
            };
            if let Err(e) = settled {
                tracing::debug!(error = %e, "could not answer a run queue message; JetStream delivers it again later");
            }
            drop(permit);
        });
    }
}

/// Reports a failed look, at most once a minute.
fn report(reporter: &mut Reporter, stream: &str, e: &LookError) {
    let Some(failures) = reporter.failed() else { return };
    match e {
        LookError::Overlap { consumer, error } => tracing::error!(
            stream,
            consumer = %consumer,
            failures,
            "JetStream refuses run queue consumer {consumer} on stream {stream}: {error}. A work-queue stream allows \
             no two consumers with overlapping subjects, so an engine consuming every namespace cannot run beside \
             one consuming a single namespace on the same prefix. Give every engine of this prefix a namespace (or \
             none of them), or give each pool its own prefix; a consumer left behind by engines that stopped is \
             deleted by the server an hour after its last fetch (or now: `nats consumer rm {stream} <name>`). \
             Still trying ({failures} failures since the last report)."
        ),
        LookError::Failed(error) => tracing::warn!(
            stream,
            failures,
            error = %error,
            "the NATS run queue consumer is failing ({failures} failures since the last report); retrying, \
             items wait in JetStream"
        ),
    }
}

/// The queue item a message carries (`None` if it is not one).
fn decode(message: &jetstream::Message, namespace: Option<&str>) -> Option<QueuedRun> {
    let wire: WireItem = serde_json::from_slice(&message.payload).ok()?;
    let info = message.info().ok()?;
    Some(QueuedRun {
        id: info.stream_sequence,
        run_id: wire.run_id,
        reason: wire.reason,
        namespace: wire.namespace.or_else(|| namespace.map(str::to_string)),
        priority: wire.priority,
        dedupe_key: wire.dedupe_key,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_travel_as_json_without_their_queue_id() {
        let wire = WireItem {
            run_id: RunId::from("r1"),
            reason: QueueReason::Wake,
            namespace: Some("ns".into()),
            priority: 3,
            dedupe_key: "wake:r1:7".into(),
        };
        let text = serde_json::to_string(&wire).unwrap();
        assert_eq!(text, r#"{"run_id":"r1","reason":"wake","namespace":"ns","priority":3,"dedupe_key":"wake:r1:7"}"#);
        let back: WireItem = serde_json::from_str(r#"{"run_id":"r2","reason":"start","dedupe_key":"k"}"#).unwrap();
        assert_eq!((back.namespace, back.priority), (None, 0));
    }

    /// A handler for consumers that must never get anything.
    struct Nothing;

    #[async_trait]
    impl RunHandler for Nothing {
        async fn handle(&self, _: QueuedRun) -> Handled {
            Handled::Done
        }
    }

    #[tokio::test]
    async fn a_namespaced_consumer_beside_one_of_every_namespace_is_refused_as_an_overlap() {
        let test = "a_namespaced_consumer_beside_one_of_every_namespace_is_refused_as_an_overlap";
        let Some(url) = crate::test_support::url_or_skip(test) else { return };
        let prefix = crate::test_support::unique_prefix("overlap");
        let transport = NatsTransport::connect(&url, &prefix).await.expect("connect");
        let looper = |namespace: Option<&str>| Looper {
            transport: transport.clone(),
            namespace: namespace.map(str::to_string),
            slots: Arc::new(Semaphore::new(1)),
            handler: Arc::new(Nothing),
            lanes: [None, None],
        };
        let mut all = looper(None);
        all.consumer(1, Lane::Normal).await.expect("the consumer of every namespace");
        let mut one = looper(Some("a"));
        match one.consumer(1, Lane::Normal).await {
            Err(LookError::Overlap { consumer, .. }) => assert_eq!(consumer, "runs-n61"),
            other => panic!("expected an overlap, got {other:?}"),
        }
        // Two lanes never overlap each other; two instances of one namespace share a consumer.
        all.consumer(0, Lane::Priority).await.expect("the priority lane beside the normal one");
        looper(None).consumer(1, Lane::Normal).await.expect("a second instance of every namespace");
        transport.delete().await.expect("delete");
    }

    #[test]
    fn dedupe_keys_never_carry_line_breaks_into_a_header() {
        assert_eq!(header_safe("start:r:1"), "start:r:1");
        assert_eq!(header_safe("a\r\nb"), "a\\r\\nb");
    }
}
