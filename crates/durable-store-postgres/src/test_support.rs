//! Test support (feature `test-support`): the PostgreSQL server named by `DURABLE_PG_URL`, or one
//! line saying the test was skipped; a scratch schema per test, dropped when the test ends.
//!
//! Every test of the workspace that needs a server goes through this module, so they all skip,
//! name and clean up the same way:
//!
//! - [`url_or_skip`]: the server's URL from [`ENV`], or `None` after printing one line to stderr:
//!   `skipped <test>: DURABLE_PG_URL is not set; to run it: DURABLE_PG_URL=postgres://postgres@127.0.0.1:5432/test cargo test -p <package>`.
//!   The test then returns and passes, so `cargo test` passes on a machine without PostgreSQL.
//!   [`skip_reason`] is the same text, for a conformance `StoreFactory::unavailable`.
//! - [`ScratchSchema`]: a schema name of the test's own (`durable_test_<tag>_<pid>_<n>_<random>`),
//!   with [`PostgresOptions`] and connections on it. The first [`PostgresStore`] connected to it
//!   creates it (the store creates and migrates its schema on connect); it is dropped with
//!   everything in it by [`ScratchSchema::drop_now`], or when the guard is dropped — also when
//!   the test panics.
//!
//! For tests only: the helpers return the driver's errors for the test to `expect`.
//!
//! ```
//! use durable_core::{RunId, Store};
//! use durable_store_postgres::test_support::{ScratchSchema, url_or_skip};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! // In a #[tokio::test] named `reads_nothing_on_an_empty_schema`:
//! let Some(url) = url_or_skip("reads_nothing_on_an_empty_schema") else { return };
//! let schema = ScratchSchema::new(&url, "empty").await.expect("a scratch schema");
//! let store = schema.connect().await.expect("connect");
//! assert!(store.get_run(&RunId::from("nope")).await.unwrap().is_none());
//! drop(store);
//! // Dropped here (with its tables), also when an assertion above panics.
//! drop(schema);
//! # }
//! ```

use std::hash::{BuildHasher, Hasher};
use std::io::Write;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio_postgres::{Client, NoTls};

use crate::{PostgresOptions, PostgresStore};

/// The environment variable naming the server: a `postgres://` URL.
pub const ENV: &str = "DURABLE_PG_URL";

/// The server the skip line suggests: PostgreSQL on this machine, user `postgres`, database
/// `test`.
pub const EXAMPLE_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// The URL in [`ENV`], unless it is unset or blank.
pub fn url() -> Option<String> {
    std::env::var(ENV).ok().filter(|url| !url.trim().is_empty())
}

/// Why a PostgreSQL test does not run, and how to run it:
/// `DURABLE_PG_URL is not set; to run it: DURABLE_PG_URL=postgres://postgres@127.0.0.1:5432/test cargo test -p <package>`
/// (the package is the one `cargo test` is running, when cargo says so).
pub fn skip_reason() -> String {
    let package = std::env::var("CARGO_PKG_NAME").map(|p| format!(" -p {p}")).unwrap_or_default();
    format!("{ENV} is not set; to run it: {ENV}={EXAMPLE_URL} cargo test{package}")
}

/// The server's URL, or `None` after printing the one line that says `test` was skipped and how
/// to run it (`skipped <test>: <skip_reason>`). It goes straight to stderr, past the test
/// harness's capture, so a plain `cargo test` shows it. Call it first, with the test's name, and
/// return when it says `None`.
pub fn url_or_skip(test: &str) -> Option<String> {
    let url = url();
    if url.is_none() {
        let _ = writeln!(std::io::stderr().lock(), "skipped {test}: {}", skip_reason());
    }
    url
}

/// `url` (a `postgres://` URL) with its database replaced by `database`; query options are kept.
///
/// ```
/// use durable_store_postgres::test_support::with_database;
/// assert_eq!(with_database("postgres://u@h:5432/test?sslmode=disable", "other"), "postgres://u@h:5432/other?sslmode=disable");
/// assert_eq!(with_database("postgres://u@h", "other"), "postgres://u@h/other");
/// ```
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

/// A plain client on `url` (no TLS), its connection driven by a task spawned on the current tokio
/// runtime: for poking at the database behind a store's back.
pub async fn client(url: &str) -> Result<Client, tokio_postgres::Error> {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await?;
    tokio::spawn(connection);
    Ok(client)
}

/// `DROP SCHEMA IF EXISTS … CASCADE` on a connection of its own, closed before it returns.
async fn drop_schema(url: &str, schema: &str) -> Result<(), tokio_postgres::Error> {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await?;
    let driver = tokio::spawn(connection);
    let result = client.batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE")).await;
    drop(client);
    let _ = driver.await;
    result
}

/// The longest schema name: PostgreSQL cuts identifiers at 63 bytes, and the application name
/// (`durable-<schema>`, cut at 63 bytes too) must stay whole for
/// [`ScratchSchema::terminate_backends`] to find the test's connections.
const MAX_NAME: usize = 63 - "durable-".len();

/// A schema of one test's own on the server, dropped with everything in it when this guard is
/// dropped (also when the test panics), or earlier by [`ScratchSchema::drop_now`].
///
/// Its name, `durable_test_<tag>_<pid>_<n>_<random>`, is unique among the tests of this process
/// (`n` counts) and of other processes and machines sharing the server (`pid` and 32 random bits
/// chosen per process). [`ScratchSchema::new`] drops a leftover of the same name; the schema
/// itself is created by the first store connected to it.
///
/// Its connections carry an application name of their own
/// ([`ScratchSchema::application_name`]), so a test can terminate its connections and nobody
/// else's.
#[derive(Debug)]
pub struct ScratchSchema {
    url: String,
    name: String,
    dropped: AtomicBool,
}

impl ScratchSchema {
    /// A fresh scratch schema on the server at `url`; `tag` (lowercase ASCII letters, digits and
    /// `_`, a few characters) says which test it belongs to.
    ///
    /// # Panics
    ///
    /// If `tag` has other characters or makes the name longer than PostgreSQL keeps whole.
    pub async fn new(url: &str, tag: &str) -> Result<ScratchSchema, tokio_postgres::Error> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        static SALT: OnceLock<u32> = OnceLock::new();
        assert!(
            tag.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'),
            "scratch schema tag {tag:?}: lowercase ASCII letters, digits and _ only"
        );
        // Random per process: the std hasher's keys are.
        let salt = *SALT.get_or_init(|| std::collections::hash_map::RandomState::new().build_hasher().finish() as u32);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let name = format!("durable_test_{tag}_{}_{n}_{salt:08x}", std::process::id());
        assert!(name.len() <= MAX_NAME, "scratch schema name {name:?} is too long: use a shorter tag");
        drop_schema(url, &name).await?;
        Ok(ScratchSchema { url: url.to_string(), name, dropped: AtomicBool::new(false) })
    }

    /// The server's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The schema's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The application name of this test's store connections: `durable-<schema>`.
    pub fn application_name(&self) -> String {
        format!("durable-{}", self.name)
    }

    /// Store options on this schema: its application name, a pool of 4; everything else at its
    /// default. Refine them (`.notify_channel(…)`, …) before connecting.
    pub fn options(&self) -> PostgresOptions {
        PostgresOptions::new().schema(&self.name).application_name(self.application_name()).pool_size(4)
    }

    /// A [`PostgresStore`] on this schema with [`ScratchSchema::options`] (the first one creates
    /// the schema). Call it again for a second handle on the same data.
    pub async fn connect(&self) -> crate::Result<PostgresStore> {
        PostgresStore::connect_with(&self.url, self.options()).await
    }

    /// A plain client on the server (see [`client`]).
    pub async fn client(&self) -> Result<Client, tokio_postgres::Error> {
        client(&self.url).await
    }

    /// Whether the schema exists on the server (a store created it and it was not dropped yet).
    pub async fn exists(&self) -> Result<bool, tokio_postgres::Error> {
        let client = self.client().await?;
        let row = client.query_one("SELECT count(*) FROM pg_namespace WHERE nspname = $1", &[&self.name]).await?;
        Ok(row.get::<_, i64>(0) > 0)
    }

    /// Terminates every connection with this schema's application name (the test's stores and
    /// listeners, in this process or in processes it started with that name); returns how many.
    pub async fn terminate_backends(&self) -> Result<i64, tokio_postgres::Error> {
        let client = self.client().await?;
        let row = client
            .query_one(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1",
                &[&self.application_name()],
            )
            .await?;
        Ok(row.get(0))
    }

    /// Drops the schema now, with everything in it (then dropping the guard does nothing). For
    /// async teardown code, which cannot wait on [`Drop`]'s blocking cleanup.
    pub async fn drop_now(&self) -> Result<(), tokio_postgres::Error> {
        if self.dropped.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        drop_schema(&self.url, &self.name).await
    }
}

impl Drop for ScratchSchema {
    fn drop(&mut self) {
        if self.dropped.swap(true, Ordering::SeqCst) {
            return;
        }
        // Maybe inside the test's runtime, maybe outside any: drop the schema from a thread with
        // a runtime of its own, and wait for it. A failure leaves the schema behind, nothing more.
        let (url, name) = (self.url.clone(), self.name.clone());
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
            runtime.block_on(drop_schema(&url, &name)).ok()
        })
        .join();
    }
}
