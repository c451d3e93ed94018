//! Shared by the integration tests: the server from `DURABLE_PG_URL`, a scratch schema per test,
//! and the one-line skip when no server is configured.
#![allow(dead_code, unreachable_pub)]

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use durable_core::{NewRun, Payload, RunId};
use durable_store_postgres::deadpool_postgres::tokio_postgres::{self, NoTls};
use durable_store_postgres::{PostgresOptions, PostgresStore};

/// The environment variable naming the server.
pub const ENV: &str = "DURABLE_PG_URL";

/// The server's URL, or `None` after printing the test's one skip line.
pub fn url_or_skip(test: &str) -> Option<String> {
    match std::env::var(ENV).ok().filter(|u| !u.trim().is_empty()) {
        Some(url) => Some(url),
        None => {
            // Straight to stderr (not the captured test output), so a plain `cargo test` shows it.
            let _ = writeln!(
                std::io::stderr().lock(),
                "skipped {test}: {ENV} is not set; to run the PostgreSQL tests: \
                 {ENV}=postgres://postgres@127.0.0.1:5432/test cargo test"
            );
            None
        }
    }
}

/// `url` (a `postgres://` URL) with its database replaced.
pub fn with_database(url: &str, database: &str) -> String {
    let (base, query) = url.split_once('?').map_or((url, None), |(b, q)| (b, Some(q)));
    let authority_start = base.find("://").map_or(0, |i| i + 3);
    let base = match base[authority_start..].find('/') {
        Some(slash) => &base[..authority_start + slash],
        None => base,
    };
    match query {
        Some(q) => format!("{base}/{database}?{q}"),
        None => format!("{base}/{database}"),
    }
}

/// A schema of its own for one test, dropped with everything in it when the guard is dropped
/// (also when the test fails).
#[derive(Debug)]
pub struct Scratch {
    pub url: String,
    pub schema: String,
    dropped: AtomicBool,
}

impl Scratch {
    pub async fn new(url: &str, tag: &str) -> Scratch {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let schema = format!("durable_test_{}_{tag}_{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        drop_schema(url, &schema).await.expect("drop a leftover scratch schema");
        Scratch { url: url.to_string(), schema, dropped: AtomicBool::new(false) }
    }

    /// Options on this schema, with an application name of its own (so a test can terminate its
    /// own connections and nobody else's).
    pub fn options(&self) -> PostgresOptions {
        PostgresOptions::new().schema(&self.schema).application_name(self.app_name()).pool_size(4)
    }

    pub fn app_name(&self) -> String {
        format!("durable-{}", self.schema)
    }

    pub async fn connect(&self) -> PostgresStore {
        PostgresStore::connect_with(&self.url, self.options()).await.expect("connect to the scratch schema")
    }

    /// A plain client, for poking at the database behind the store's back.
    pub async fn client(&self) -> tokio_postgres::Client {
        client(&self.url).await
    }

    /// Waits until one of this test's store connections waits on a lock (true), for at most
    /// 60 s (false: a hang guard, not a timing assertion). Nothing announces a lock wait, so
    /// it looks at `pg_stat_activity` every 5 ms.
    pub async fn parked_on_a_lock(&self, admin: &tokio_postgres::Client) -> bool {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while std::time::Instant::now() < deadline {
            let row = admin
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'",
                    &[&self.app_name()],
                )
                .await
                .expect("read pg_stat_activity");
            if row.get::<_, i64>(0) > 0 {
                return true;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        false
    }

    /// Takes the transaction-scoped advisory lock of signal token `token` on `admin`, in a
    /// transaction left open (end it with `COMMIT` or `ROLLBACK`): writes touching the token
    /// wait for it.
    pub async fn hold_token_lock(&self, admin: &tokio_postgres::Client, token: &str) {
        let key: i64 = admin
            .query_one(&format!("SELECT \"{}\".lock_key('signal', $1)", self.schema), &[&token])
            .await
            .expect("lock key")
            .get(0);
        admin.batch_execute("BEGIN").await.expect("begin");
        admin.execute("SELECT pg_advisory_xact_lock($1)", &[&key]).await.expect("advisory lock");
    }

    /// Terminates every connection of this test's stores; returns how many.
    pub async fn terminate_backends(&self) -> i64 {
        let admin = self.client().await;
        let row = admin
            .query_one(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1",
                &[&self.app_name()],
            )
            .await
            .expect("terminate backends");
        row.get(0)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if self.dropped.swap(true, Ordering::SeqCst) {
            return;
        }
        // Maybe inside the test's runtime: drop the schema from a thread with a runtime of its own.
        let (url, schema) = (self.url.clone(), self.schema.clone());
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
            runtime.block_on(drop_schema(&url, &schema)).ok()
        })
        .join();
    }
}

pub async fn client(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.expect("connect a plain client");
    tokio::spawn(connection);
    client
}

pub async fn drop_schema(url: &str, schema: &str) -> Result<(), tokio_postgres::Error> {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await?;
    let driver = tokio::spawn(connection);
    let result = client.batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE")).await;
    drop(client);
    let _ = driver.await;
    result
}

pub const T0: u64 = 1_700_000_000_000;

pub fn new_run(id: &str) -> NewRun {
    NewRun {
        id: RunId::from(id),
        workflow: "wf".into(),
        version: 1,
        namespace: "default".into(),
        input: Payload::from_trusted(format!("{{\"run\":{id:?}}}")),
        tags: Vec::new(),
        priority: 0,
        parent: None,
        created_at: T0,
    }
}
