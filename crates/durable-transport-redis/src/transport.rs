//! The run queue on Redis Streams.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::fmt;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use durable_core::{QueueReason, QueuedRun, RunId};
use durable_transport::{Consumer, Handled, RunHandler, Transport, TransportError};
use futures_util::FutureExt;
use parking_lot::Mutex;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

use crate::keys::{GROUP, Keys};
use crate::outage::Outage;
use crate::scripts::{CLAIM, DISPATCH, HAND_BACK};

/// How long a command may take before it counts as failed (a blocking read: on top of its
/// block time).
pub(crate) const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);

/// A connection that reconnects by itself (on the next command after a failure), answering
/// within `response_timeout`. A reconnection tries twice, then the commands waiting for it
/// fail: the callers back off and retry on their own schedule, and a send fails fast while
/// the server is away.
pub(crate) fn manager_config(response_timeout: Duration) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_response_timeout(Some(response_timeout))
        .set_connection_timeout(Some(RESPONSE_TIMEOUT))
        .set_number_of_retries(1)
        .set_max_delay(Duration::from_millis(500))
}

/// How often a consumer looks for dead consumers in the group (often in this crate's own
/// tests, which watch one go).
const PRUNE_EVERY: Duration = if cfg!(test) { Duration::from_millis(50) } else { Duration::from_secs(300) };
/// A consumer that holds nothing and has taken nothing for this long is forgotten: it is dead,
/// or idle (then its next read adds it back; forgetting a consumer that holds nothing loses
/// nothing).
const PRUNE_IDLE: Duration = if cfg!(test) { Duration::from_millis(200) } else { Duration::from_secs(3600) };

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

pub(crate) fn unavailable(e: redis::RedisError) -> TransportError {
    TransportError::Unavailable(format!("redis: {e}"))
}

/// The run queue on Redis Streams: every engine connected to the same server with the same
/// prefix shares it. See the [crate docs](crate) for the keys it uses and how items are
/// delivered, redelivered and deduplicated.
///
/// Cheap to clone: clones share one multiplexed connection (each consumer also opens one of
/// its own for its blocking reads).
#[derive(Clone)]
pub struct RedisTransport {
    client: redis::Client,
    conn: ConnectionManager,
    keys: Keys,
    redeliver_after: Duration,
    claim_batch: usize,
    dedupe_window: Duration,
}

impl fmt::Debug for RedisTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisTransport")
            .field("prefix", &self.keys.prefix())
            .field("redeliver_after", &self.redeliver_after)
            .field("claim_batch", &self.claim_batch)
            .field("dedupe_window", &self.dedupe_window)
            .finish_non_exhaustive()
    }
}

impl RedisTransport {
    /// Connects to the server at `url` (`redis://host:port/db`, `rediss://` is not compiled
    /// in) and uses the keys under `prefix` (`<prefix>:runs:<namespace>`, …): engines that
    /// share a prefix share a queue, different prefixes on one server are isolated.
    ///
    /// Fails when the URL does not parse or the server cannot be reached now; once connected,
    /// lost connections are re-established on their own.
    pub async fn connect(url: &str, prefix: impl Into<String>) -> Result<Self, TransportError> {
        let prefix = prefix.into();
        crate::keys::check_prefix(&prefix).map_err(TransportError::Unavailable)?;
        let failed = |e| TransportError::Unavailable(crate::keys::connect_error(url, e));
        let client = redis::Client::open(url).map_err(failed)?;
        let conn = ConnectionManager::new_with_config(client.clone(), manager_config(RESPONSE_TIMEOUT))
            .await
            .map_err(failed)?;
        Ok(RedisTransport {
            client,
            conn,
            keys: Keys::new(prefix),
            redeliver_after: Duration::from_secs(60),
            claim_batch: 32,
            dedupe_window: Duration::from_secs(120),
        })
    }

    /// How long an item may stay taken and unacknowledged before another consumer takes it
    /// (the consumer that had it died, or its handler hangs). Default 60 s; at least 1 ms.
    /// An item whose handler takes longer than this may be handed to a second consumer while
    /// the first still works on it — harmless, the run's lease in the store decides, but
    /// wasted work: keep it well above a turn's usual length.
    pub fn redeliver_after(mut self, after: Duration) -> Self {
        self.redeliver_after = after.max(Duration::from_millis(1));
        self
    }

    /// The most items a consumer takes in one read (at least 1; default 32). A consumer
    /// reads again at once after a full batch while it has free slots, so this bounds how
    /// much of a burst one consumer grabs before the others get a look, not its throughput.
    pub fn claim_batch(mut self, batch: usize) -> Self {
        self.claim_batch = batch.max(1);
        self
    }

    /// For how long a dedupe key, once sent, drops further sends of the same key (default
    /// 2 min). `Duration::ZERO` turns deduplication off.
    pub fn dedupe_window(mut self, window: Duration) -> Self {
        self.dedupe_window = window;
        self
    }

    /// The prefix of every key this transport uses.
    pub fn prefix(&self) -> &str {
        self.keys.prefix()
    }

    /// Items in the queue, taken or not, over every namespace (for monitoring and tests).
    pub async fn queued(&self) -> Result<u64, TransportError> {
        let mut conn = self.conn.clone();
        let streams: Vec<String> =
            redis::cmd("SMEMBERS").arg(self.keys.namespaces()).query_async(&mut conn).await.map_err(unavailable)?;
        if streams.is_empty() {
            return Ok(0);
        }
        let mut pipe = redis::pipe();
        for stream in &streams {
            pipe.cmd("XLEN").arg(stream);
        }
        let lengths: Vec<u64> = pipe.query_async(&mut conn).await.map_err(unavailable)?;
        Ok(lengths.iter().sum())
    }

    /// Deletes every key under the prefix: the streams with their items and consumer groups,
    /// the dedupe markers, the namespace registry. Consumers still running read nothing more
    /// until new items are sent (which recreates what they need).
    pub async fn destroy(&self) -> Result<(), TransportError> {
        delete_prefix(&self.conn, &self.keys).await.map_err(unavailable)
    }
}

/// Every key matching `pattern`, read a SCAN page at a time.
pub(crate) async fn scan_keys(
    conn: &mut impl redis::aio::ConnectionLike,
    pattern: &str,
) -> redis::RedisResult<Vec<String>> {
    let (mut cursor, mut keys) = (0u64, Vec::new());
    loop {
        let (next, found): (u64, Vec<String>) =
            redis::cmd("SCAN").arg(cursor).arg("MATCH").arg(pattern).arg("COUNT").arg(1000).query_async(conn).await?;
        keys.extend(found);
        if next == 0 {
            return Ok(keys);
        }
        cursor = next;
    }
}

/// Deletes every key matching the prefix's pattern, a thousand at a time.
pub(crate) async fn delete_prefix(conn: &ConnectionManager, keys: &Keys) -> redis::RedisResult<()> {
    let mut conn = conn.clone();
    for chunk in scan_keys(&mut conn, &keys.pattern()).await?.chunks(1000) {
        redis::cmd("DEL").arg(chunk).exec_async(&mut conn).await?;
    }
    Ok(())
}

/// An item's stream fields: name, value, name, value…
fn encode(item: &QueuedRun, namespace: Option<&str>) -> Vec<String> {
    let mut fields = Vec::with_capacity(10);
    fields.extend(["run_id".to_owned(), item.run_id.as_str().to_owned()]);
    fields.extend(["reason".to_owned(), item.reason.as_str().to_owned()]);
    if let Some(ns) = item.namespace.as_deref().or(namespace) {
        fields.extend(["namespace".to_owned(), ns.to_owned()]);
    }
    fields.extend(["priority".to_owned(), item.priority.to_string()]);
    fields.extend(["dedupe_key".to_owned(), item.dedupe_key.clone()]);
    fields
}

/// The item an entry holds; `None` for an entry this version cannot read.
fn decode(entry_id: &str, fields: &[String]) -> Option<QueuedRun> {
    let field = |name: &str| fields.chunks_exact(2).find(|kv| kv[0] == name).map(|kv| kv[1].as_str());
    let reason = match field("reason")? {
        "start" => QueueReason::Start,
        "wake" => QueueReason::Wake,
        _ => return None,
    };
    Some(QueuedRun {
        id: numeric_id(entry_id)?,
        run_id: RunId::from(field("run_id")?),
        reason,
        namespace: field("namespace").map(str::to_owned),
        priority: field("priority").map_or(Some(0), |p| p.parse().ok())?,
        dedupe_key: field("dedupe_key").unwrap_or_default().to_owned(),
    })
}

/// `QueuedRun::id` for an entry id `<ms>-<seq>`: `ms << 20 | seq` (unique within a stream:
/// no stream gets a million entries in one millisecond).
fn numeric_id(entry_id: &str) -> Option<u64> {
    let (ms, seq) = entry_id.split_once('-')?;
    let (ms, seq): (u64, u64) = (ms.parse().ok()?, seq.parse().ok()?);
    Some(ms << 20 | (seq & 0xF_FFFF))
}

#[async_trait]
impl Transport for RedisTransport {
    async fn dispatch_runs(&self, namespace: Option<&str>, batch: Vec<QueuedRun>) -> Result<(), TransportError> {
        if batch.is_empty() {
            return Ok(());
        }
        let window_ms = millis(self.dedupe_window);
        let mut call = DISPATCH.prepare_invoke();
        call.key(self.keys.stream(namespace, false))
            .key(self.keys.stream(namespace, true))
            .key(self.keys.namespaces())
            .key(self.keys.new_streams());
        call.arg(GROUP).arg(window_ms.max(1));
        for item in &batch {
            let dedupe = window_ms > 0 && !item.dedupe_key.is_empty();
            if dedupe {
                call.key(self.keys.dedupe(&item.dedupe_key));
            }
            let fields = encode(item, namespace);
            call.arg(if dedupe { "1" } else { "0" }).arg(if item.priority > 0 { "1" } else { "0" }).arg(fields.len());
            for field in fields {
                call.arg(field);
            }
        }
        let mut conn = self.conn.clone();
        let _added: u64 = call.invoke_async(&mut conn).await.map_err(unavailable)?;
        Ok(())
    }

    fn consume_runs(&self, namespace: Option<String>, concurrency: usize, handler: Arc<dyn RunHandler>) -> Consumer {
        let (stop, stopped) = watch::channel(false);
        let reader = Reader {
            transport: self.clone(),
            name: consumer_name(),
            namespace,
            handler,
            slots: Arc::new(Semaphore::new(concurrency.max(1))),
            in_hand: Arc::new(Mutex::new(HashMap::new())),
            settle_failures: Arc::new(Mutex::new(Outage::new("run consumer (acknowledging items)"))),
        };
        Consumer::new(stop, tokio::spawn(reader.run(stopped)))
    }
}

/// A consumer name unique in the group: process, start time, and a counter.
fn consumer_name() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("c-{}-{nanos:x}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

/// What a claim found: entries `(stream, id, fields)`, and, when it found fewer than it
/// asked for, the `(stream, delivered up to)` pairs to wait on.
type Claimed = (Vec<(String, String, Vec<String>)>, Vec<String>);

/// The entries a consumer has in hand: `(stream, entry id)` → `None` while its handler runs,
/// or when its handler panicked (the entry stays pending, left alone here for
/// `redeliver_after`).
type InHand = HashMap<(String, String), Option<Instant>>;

/// One consumer's loop and what its handler tasks share.
struct Reader {
    transport: RedisTransport,
    name: String,
    namespace: Option<String>,
    handler: Arc<dyn RunHandler>,
    slots: Arc<Semaphore>,
    /// `(stream, entry id)` of the entries whose handler runs now (or is about to): a reclaim
    /// leaves those to the other consumers when they idled too long, never starting one a
    /// second time here, and takes back the consumer's other pending entries.
    in_hand: Arc<Mutex<InHand>>,
    settle_failures: Arc<Mutex<Outage>>,
}

impl Reader {
    /// How often idle entries are looked for, and the longest a blocking read waits.
    fn tick(&self) -> Duration {
        (self.transport.redeliver_after / 4).clamp(Duration::from_millis(50), Duration::from_secs(2))
    }

    async fn run(self, mut stopped: watch::Receiver<bool>) {
        let tick = self.tick();
        let mut failures = Outage::new("run consumer");
        // The blocking reads get a connection of their own, so acks never queue behind them.
        let mut blocking: Option<ConnectionManager> = None;
        let mut last_reclaim: Option<Instant> = None;
        let mut last_prune = Instant::now();
        loop {
            // A free slot first (or stop), then as many more as are free, up to a batch.
            let first = tokio::select! {
                biased;
                _ = stopped.wait_for(|s| *s) => break,
                permit = self.slots.clone().acquire_owned() => permit.expect("the semaphore is never closed"),
            };
            let mut permits = vec![first];
            while permits.len() < self.transport.claim_batch {
                match self.slots.clone().try_acquire_owned() {
                    Ok(permit) => permits.push(permit),
                    Err(_) => break,
                }
            }
            let want = permits.len();
            let reclaim = last_reclaim.is_none_or(|t| t.elapsed() >= tick);
            let prune = last_prune.elapsed() >= PRUNE_EVERY;
            // Not raced against stop: what a claim takes is handled, never left to idle out.
            let (entries, wake) = match self.claim(want, reclaim, prune).await {
                Ok(claimed) => {
                    failures.ok();
                    claimed
                }
                Err(e) => {
                    drop(permits);
                    let wait = failures.failed(&e);
                    tokio::select! {
                        biased;
                        _ = stopped.wait_for(|s| *s) => break,
                        () = tokio::time::sleep(wait) => continue,
                    }
                }
            };
            if reclaim {
                last_reclaim = Some(Instant::now());
            }
            if prune {
                last_prune = Instant::now();
            }
            let found = entries.len();
            for (stream, id, fields) in entries {
                // At most `want` entries come back: one permit each.
                let Some(permit) = permits.pop() else { break };
                match self.in_hand.lock().entry((stream.clone(), id.clone())) {
                    // In hand here already (the reclaim excludes these: a safety net).
                    Entry::Occupied(_) => {
                        permits.push(permit);
                        continue;
                    }
                    Entry::Vacant(slot) => slot.insert(None),
                };
                self.start(stream, id, fields, permit);
            }
            drop(permits);
            if found >= want {
                continue; // more may be waiting
            }
            // Everything new is taken: wait until something new arrives (without taking
            // it, so a claim still decides who gets what), the next reclaim is due, or stop.
            let conn = match &blocking {
                Some(conn) => conn.clone(),
                None => {
                    let config = manager_config(tick + RESPONSE_TIMEOUT);
                    match ConnectionManager::new_lazy_with_config(self.transport.client.clone(), config) {
                        Ok(conn) => blocking.insert(conn).clone(),
                        Err(e) => {
                            let wait = failures.failed(&e);
                            tokio::select! {
                                biased;
                                _ = stopped.wait_for(|s| *s) => break,
                                () = tokio::time::sleep(wait) => continue,
                            }
                        }
                    }
                }
            };
            let waited = tokio::select! {
                biased;
                _ = stopped.wait_for(|s| *s) => break,
                r = wait_for_new(conn, &wake, tick) => r,
            };
            if let Err(e) = waited {
                let wait = failures.failed(&e);
                tokio::select! {
                    biased;
                    _ = stopped.wait_for(|s| *s) => break,
                    () = tokio::time::sleep(wait) => {}
                }
            }
        }
    }

    /// Takes up to `count` entries (reclaiming idle ones first when `reclaim`; forgetting dead
    /// consumers when `prune`).
    async fn claim(&self, count: usize, reclaim: bool, prune: bool) -> redis::RedisResult<Claimed> {
        let keys = &self.transport.keys;
        let mut call = CLAIM.prepare_invoke();
        let mode = match &self.namespace {
            Some(ns) => {
                call.key(keys.stream(Some(ns), true)).key(keys.stream(Some(ns), false));
                "one"
            }
            None => {
                call.key(keys.namespaces()).key(keys.new_streams());
                "all"
            }
        };
        let min_idle = if reclaim { millis(self.transport.redeliver_after).max(1) } else { 0 };
        let prune = if prune { millis(PRUNE_IDLE) } else { 0 };
        call.arg(GROUP).arg(&self.name).arg(count).arg(min_idle).arg(mode).arg(keys.urgent_prefix()).arg(prune);
        if reclaim {
            // Every entry in hand: a reclaim takes back this consumer's own pending entries
            // that it does not have in hand (a claim whose reply was lost), and must leave
            // those that run here alone (one that idled past `redeliver_after` goes to the
            // other consumers, never back to this one). The loop claims one batch at a time,
            // so nothing is taken between this snapshot and the script.
            // An entry whose handler panicked is left alone for `redeliver_after` (a handler
            // that panics at once is not run again and again), then taken back like the rest.
            let after = self.transport.redeliver_after;
            let mut in_hand = self.in_hand.lock();
            in_hand.retain(|_, panicked| panicked.is_none_or(|at| at.elapsed() < after));
            for (stream, id) in in_hand.keys() {
                call.arg(stream).arg(id);
            }
        }
        let mut conn = self.transport.conn.clone();
        call.invoke_async(&mut conn).await
    }

    /// Hands one entry to the handler on a task of its own, holding `permit`, and settles it
    /// as the handler says.
    fn start(&self, stream: String, id: String, fields: Vec<String>, permit: OwnedSemaphorePermit) {
        let handler = self.handler.clone();
        let mut conn = self.transport.conn.clone();
        let failures = self.settle_failures.clone();
        let consumer = self.name.clone();
        // Released when the task ends, however it ends (a handler that panics included: its
        // entry stays pending and is redelivered after `redeliver_after`).
        let held =
            Held { in_hand: self.in_hand.clone(), key: (stream.clone(), id.clone()), panicked: false, _permit: permit };
        tokio::spawn(async move {
            let (stream, id) = (&stream, &id);
            let outcome = match decode(id, &fields) {
                // The call inside the block too: a handler may panic before its future runs.
                Some(item) => match AssertUnwindSafe(async { handler.handle(item).await }).catch_unwind().await {
                    Ok(outcome) => outcome,
                    Err(_) => {
                        // Reported by the panic hook; the entry stays pending.
                        held.panicked();
                        return;
                    }
                },
                None => {
                    tracing::warn!(stream, id, ?fields, "dropping a run-queue entry this version cannot read");
                    Handled::Done
                }
            };
            let settled = match outcome {
                Handled::Done => {
                    let mut pipe = redis::pipe();
                    pipe.cmd("XACK").arg(stream).arg(GROUP).arg(id).ignore();
                    pipe.cmd("XDEL").arg(stream).arg(id).ignore();
                    pipe.exec_async(&mut conn).await
                }
                Handled::HandBack => {
                    let mut call = HAND_BACK.prepare_invoke();
                    call.key(stream).arg(GROUP).arg(&consumer).arg(id).arg(&fields);
                    call.invoke_async::<u8>(&mut conn).await.map(drop)
                }
            };
            match settled {
                Ok(()) => failures.lock().ok(),
                // Still pending: this consumer takes it back at its next look (a reclaim) and
                // runs it again; the run's state in the store decides what that does.
                Err(e) => drop(failures.lock().failed(&e)),
            }
            drop(held);
        });
    }
}

/// An entry in hand: its slot, and its place in the consumer's in-hand set, both given up
/// when dropped (the place marked with the time instead, when its handler panicked).
struct Held {
    in_hand: Arc<Mutex<InHand>>,
    key: (String, String),
    panicked: bool,
    _permit: OwnedSemaphorePermit,
}

impl Held {
    /// Gives up the slot, marking the entry as one whose handler panicked.
    fn panicked(mut self) {
        self.panicked = true;
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut in_hand = self.in_hand.lock();
        if self.panicked {
            in_hand.insert(self.key.clone(), Some(Instant::now()));
        } else {
            in_hand.remove(&self.key);
        }
    }
}

/// Blocks (at most `block`) until an entry newer than the given ids arrives in one of the
/// streams, without taking it.
async fn wait_for_new(mut conn: ConnectionManager, wake: &[String], block: Duration) -> redis::RedisResult<()> {
    if wake.is_empty() {
        return Ok(());
    }
    let block_ms = millis(block).max(1);
    let mut cmd = redis::cmd("XREAD");
    cmd.arg("COUNT").arg(1).arg("BLOCK").arg(block_ms).arg("STREAMS");
    for key in wake.iter().step_by(2) {
        cmd.arg(key);
    }
    for id in wake.iter().skip(1).step_by(2) {
        cmd.arg(id);
    }
    cmd.query_async::<redis::Value>(&mut conn).await.map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(priority: i32, namespace: Option<&str>) -> QueuedRun {
        QueuedRun {
            id: 0,
            run_id: RunId::from("r-1"),
            reason: QueueReason::Wake,
            namespace: namespace.map(str::to_owned),
            priority,
            dedupe_key: "wake:r-1:3".into(),
        }
    }

    #[test]
    fn an_item_round_trips_through_its_fields() {
        for (item, sent_as) in [(item(0, None), Some("ns")), (item(-3, Some("a")), None), (item(5, None), None)] {
            let fields = encode(&item, sent_as);
            let back = decode("1700000000000-7", &fields).unwrap();
            let expected = QueuedRun {
                id: 1_700_000_000_000 << 20 | 7,
                namespace: item.namespace.clone().or(sent_as.map(str::to_owned)),
                ..item
            };
            assert_eq!(back, expected);
        }
    }

    #[test]
    fn entries_this_version_cannot_read_are_refused() {
        let fields = |pairs: &[&str]| pairs.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(decode("1-0", &fields(&["run_id", "r", "reason", "teleport"])).is_none());
        assert!(decode("1-0", &fields(&["reason", "start"])).is_none());
        assert!(decode("1-0", &fields(&["run_id", "r", "reason", "start", "priority", "high"])).is_none());
        assert!(decode("garbage", &fields(&["run_id", "r", "reason", "start"])).is_none());
        let minimal = decode("1-2", &fields(&["run_id", "r", "reason", "start"])).unwrap();
        assert_eq!(
            (minimal.id, minimal.priority, minimal.namespace, minimal.dedupe_key),
            (1 << 20 | 2, 0, None, String::new())
        );
    }

    #[cfg(feature = "test-support")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_group_forgets_consumers_that_are_gone() {
        use crate::test_support::{ScratchPrefix, url_or_skip};

        struct Done;
        #[async_trait]
        impl RunHandler for Done {
            async fn handle(&self, _: QueuedRun) -> Handled {
                Handled::Done
            }
        }

        let Some(url) = url_or_skip("the_group_forgets_consumers_that_are_gone") else { return };
        let scratch = ScratchPrefix::new(&url);
        let transport = RedisTransport::connect(&url, scratch.prefix()).await.unwrap();
        let consumers = || async {
            let mut conn = transport.conn.clone();
            let stream = transport.keys.stream(Some("ns"), false);
            let listed: Vec<Vec<redis::Value>> =
                redis::cmd("XINFO").arg("CONSUMERS").arg(&stream).arg(GROUP).query_async(&mut conn).await.unwrap();
            listed.len()
        };
        transport.dispatch_runs(Some("ns"), vec![item(0, None)]).await.unwrap();
        let gone = transport.consume_runs(Some("ns".into()), 1, Arc::new(Done));
        tokio::time::timeout(Duration::from_secs(60), async {
            while transport.queued().await.unwrap() > 0 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("the item is handled");
        gone.stop().await;
        assert_eq!(consumers().await, 1);
        // A consumer of the same stream (it joins the group with its first item) forgets the
        // one that is gone, which holds nothing, once it has been idle for PRUNE_IDLE; only
        // the live one prunes, and never itself: one consumer left means the gone one went.
        let live = transport.consume_runs(Some("ns".into()), 1, Arc::new(Done));
        transport
            .dispatch_runs(Some("ns"), vec![QueuedRun { dedupe_key: "other".into(), ..item(0, None) }])
            .await
            .unwrap();
        tokio::time::timeout(Duration::from_secs(60), async {
            while transport.queued().await.unwrap() > 0 || consumers().await != 1 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("the consumer that is gone is forgotten");
        live.stop().await;
        transport.destroy().await.unwrap();
    }
}
