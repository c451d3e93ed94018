//! Network faults surface as `StoreError::Unavailable { retryable: true }`, and the pool
//! reconnects so later calls succeed: the store's connections terminated by the server
//! (`pg_terminate_backend`, only this test's own, found by application name) mid-call and under
//! load, and the server going away and coming back (played by a TCP proxy in front of it, so the
//! real server, shared with other tests, keeps running).

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::{ScratchSchema, T0, hold_token_lock, new_run, parked_on_a_lock, url_or_skip};
use durable_core::{
    Checkpoint, CheckpointStatus, Claim, ClaimOutcome, Commit, Delivery, Payload, RunId, RunStatus, StepKind, Store,
    StoreError, StoreErrorKind, StoreResult, TurnEnd,
};
use durable_store_postgres::deadpool_postgres::tokio_postgres::{self, NoTls, config::Host};
use durable_store_postgres::deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use durable_store_postgres::{PostgresOptions, PostgresStore};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::task::{JoinHandle, JoinSet};

#[track_caller]
fn assert_retryable(e: &StoreError) {
    assert_eq!(e.kind(), StoreErrorKind::Unavailable, "{e}");
    assert!(e.is_retryable(), "{e}");
}

/// Calls `f` until it succeeds (at most `tries` times); every failure must be retryable.
async fn eventually<T, F, Fut>(tries: usize, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = StoreResult<T>>,
{
    let mut last = None;
    for _ in 0..tries {
        match f().await {
            Ok(v) => return v,
            Err(e) => {
                assert_retryable(&e);
                last = Some(e);
            }
        }
    }
    panic!("still failing after {tries} tries: {last:?}");
}

fn payload(text: &str) -> Payload {
    Payload::from_trusted(format!("{text:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_whose_connection_is_terminated_is_retryable_and_the_pool_reconnects() {
    let Some(url) = url_or_skip("a_call_whose_connection_is_terminated_is_retryable_and_the_pool_reconnects") else {
        return;
    };
    let scratch = ScratchSchema::new(&url, "kill").await.unwrap();
    let store = scratch.connect().await.unwrap();
    store.create_run(new_run("r")).await.unwrap();

    // Park a write inside its transaction: another connection holds the token's advisory lock.
    let admin = scratch.client().await.unwrap();
    hold_token_lock(&scratch, &admin, "tok").await;
    let parked = {
        let store = store.clone();
        tokio::spawn(async move { store.send_signal("tok", payload("lost?"), T0).await })
    };
    let waiting = parked_on_a_lock(&scratch, &admin).await;
    assert!(waiting, "the signal's transaction waits for the advisory lock");

    assert!(scratch.terminate_backends().await.unwrap() >= 1, "the store's connections are terminated");
    let e = parked.await.unwrap().expect_err("the call in flight fails");
    assert_retryable(&e);
    admin.batch_execute("ROLLBACK").await.unwrap();

    // The pool replaces the dead connections: later calls succeed, and nothing was half-written.
    assert_eq!(eventually(5, || store.send_signal("tok", payload("again"), T0)).await, Delivery::Buffered);
    let r = RunId::from("r");
    let run = eventually(5, || store.get_run(&r)).await.expect("the run is still there");
    assert_eq!(run.status, RunStatus::Pending);
    let waiter = new_run("w");
    store.create_run(waiter).await.unwrap();
}

/// One run's life: create, claim, three step commits, a settle carrying a last checkpoint.
async fn life(store: &PostgresStore, id: &str, ops: &AtomicU64, progress: &Notify) -> StoreResult<()> {
    let tick = || {
        ops.fetch_add(1, Ordering::SeqCst);
        progress.notify_one();
    };
    store.create_run(new_run(id)).await?;
    tick();
    let run_id = RunId::from(id);
    match store
        .claim_run(Claim { run_id: run_id.clone(), owner: "me".into(), lease_until: T0 + 60_000, now: T0 })
        .await?
    {
        ClaimOutcome::Acquired { .. } => {}
        other => panic!("claim of {id}: {other:?}"),
    }
    tick();
    for seq in 0..4u32 {
        let mut c = Commit::new(run_id.clone(), "me", T0 + u64::from(seq));
        let mut cp = Checkpoint::new(run_id.clone(), seq, "step", StepKind::Step, CheckpointStatus::Completed, T0);
        cp.output = Some(payload(&format!("{id}:{seq}")));
        c.checkpoints.push(cp);
        if seq == 3 {
            c.end = Some(TurnEnd::Settle { status: RunStatus::Completed, output: Some(payload("done")), error: None });
        }
        store.commit(c).await?;
        tick();
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminations_under_load_only_ever_fail_retryably_and_commits_stay_atomic() {
    let Some(url) = url_or_skip("terminations_under_load_only_ever_fail_retryably_and_commits_stay_atomic") else {
        return;
    };
    let scratch = ScratchSchema::new(&url, "storm").await.unwrap();
    let store = scratch.connect().await.unwrap();
    let ops = Arc::new(AtomicU64::new(0));
    let live = Arc::new(AtomicU64::new(8));
    let progress = Arc::new(Notify::new());
    let mut workers = JoinSet::new();
    for w in 0..8 {
        let (store, ops, live, progress) = (store.clone(), ops.clone(), live.clone(), progress.clone());
        workers.spawn(async move {
            let mut errors = Vec::new();
            for i in 0..12 {
                if let Err(e) = life(&store, &format!("w{w}-{i}"), &ops, &progress).await {
                    errors.push(e);
                }
            }
            live.fetch_sub(1, Ordering::SeqCst);
            progress.notify_one();
            errors
        });
    }
    // Terminate the store's connections five times while the workers run (every 40 calls).
    let mut kills = 0;
    for round in 1..=5u64 {
        while ops.load(Ordering::SeqCst) < round * 40 && live.load(Ordering::SeqCst) > 0 {
            progress.notified().await;
        }
        kills += scratch.terminate_backends().await.unwrap();
    }
    let mut errors = Vec::new();
    while let Some(found) = workers.join_next().await {
        errors.extend(found.unwrap());
    }
    for e in &errors {
        assert_retryable(e);
    }
    eprintln!("{kills} connections terminated, {} calls failed (all retryable)", errors.len());

    // Atomic commits: a run is completed exactly when its last checkpoint (same commit) exists.
    let admin = scratch.client().await.unwrap();
    let rows = admin
        .query(
            &format!(
                "SELECT r.id, r.status, EXISTS (SELECT 1 FROM \"{0}\".checkpoints c WHERE c.run_id = r.id AND c.seq = 3) \
                 FROM \"{0}\".runs r",
                scratch.name()
            ),
            &[],
        )
        .await
        .unwrap();
    for row in &rows {
        let (id, status, last): (String, String, bool) = (row.get(0), row.get(1), row.get(2));
        assert_eq!(status == "completed", last, "run {id}: status {status}, last checkpoint written: {last}");
    }
    // And the store works on.
    eventually(5, || store.create_run(new_run("after"))).await;
}

/// A TCP proxy in front of the server: stopping it drops every connection and refuses new ones,
/// as a server restart does.
struct Proxy {
    listen: SocketAddr,
    upstream: SocketAddr,
    task: Option<JoinHandle<()>>,
}

impl Proxy {
    async fn start(listen: SocketAddr, upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind(listen).await.expect("bind the proxy");
        let listen = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let mut connections = JoinSet::new();
            while let Ok((mut inbound, _)) = listener.accept().await {
                connections.spawn(async move {
                    if let Ok(mut outbound) = TcpStream::connect(upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        });
        Proxy { listen, upstream, task: Some(task) }
    }

    /// Closes the port and every connection through it.
    async fn stop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
    }

    async fn restart(&mut self) {
        self.stop().await;
        *self = Proxy::start(self.listen, self.upstream).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_going_away_is_retryable_and_the_store_recovers_when_it_is_back() {
    let Some(url) = url_or_skip("a_server_going_away_is_retryable_and_the_store_recovers_when_it_is_back") else {
        return;
    };
    let upstream_cfg: tokio_postgres::Config = url.parse().unwrap();
    let upstream = match (upstream_cfg.get_hosts().first(), upstream_cfg.get_ports().first()) {
        (Some(Host::Tcp(host)), port) => {
            tokio::net::lookup_host((host.as_str(), port.copied().unwrap_or(5432))).await.unwrap().next().unwrap()
        }
        _ => {
            eprintln!("skipped: the proxy test needs a TCP server address in DURABLE_PG_URL");
            return;
        }
    };
    let scratch = ScratchSchema::new(&url, "restart").await.unwrap();
    let mut proxy = Proxy::start("127.0.0.1:0".parse().unwrap(), upstream).await;

    // The store reaches the server through the proxy, with a pool built by hand (from_pool).
    let mut cfg = tokio_postgres::Config::new();
    cfg.host("127.0.0.1").port(proxy.listen.port()).application_name(scratch.application_name());
    if let Some(user) = upstream_cfg.get_user() {
        cfg.user(user);
    }
    if let Some(password) = upstream_cfg.get_password() {
        cfg.password(password);
    }
    if let Some(db) = upstream_cfg.get_dbname() {
        cfg.dbname(db);
    }
    let manager = Manager::from_config(cfg, NoTls, ManagerConfig { recycling_method: RecyclingMethod::Fast });
    let pool = Pool::builder(manager)
        .max_size(4)
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(Duration::from_secs(5)))
        .create_timeout(Some(Duration::from_secs(5)))
        .build()
        .unwrap();
    let store = PostgresStore::from_pool(pool, PostgresOptions::new().schema(scratch.name())).await.unwrap();
    assert!(store.target().contains('@'), "{}", store.target());
    store.create_run(new_run("r")).await.unwrap();

    proxy.stop().await;
    for _ in 0..3 {
        assert_retryable(&store.get_run(&RunId::from("r")).await.expect_err("the server is away"));
        assert_retryable(&store.create_run(new_run("x")).await.expect_err("the server is away"));
    }

    proxy.restart().await;
    let r = RunId::from("r");
    let run = eventually(5, || store.get_run(&r)).await;
    assert!(run.is_some(), "the data is still there");
    assert!(eventually(5, || store.create_run(new_run("y"))).await.created());
    assert_eq!(store.get_run(&RunId::from("x")).await.unwrap(), None, "the refused create wrote nothing");
    proxy.stop().await;
}
