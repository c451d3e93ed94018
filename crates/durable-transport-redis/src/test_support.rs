//! Test support (feature `test-support`): the Redis server named by `DURABLE_REDIS_URL`, or one
//! line saying the test was skipped; a key prefix per test, its keys deleted when the test ends;
//! a TCP proxy that plays the server going away and coming back.
//!
//! - [`url_or_skip`]: the server's URL from [`ENV`], or `None` after printing one line to
//!   stderr: `skipped <test>: DURABLE_REDIS_URL is not set; run DURABLE_REDIS_URL=redis://127.0.0.1:6379 cargo test -p <package> to run it`.
//!   The test then returns and passes, so `cargo test` passes on a machine without Redis.
//! - [`ScratchPrefix`]: a prefix of the test's own (`t<pid>_<nanos>_<n>`); every key under it
//!   is deleted when the guard is dropped, also when the test panics.
//! - [`Proxy`]: a TCP proxy in front of the server; [`Proxy::stop`] closes every connection
//!   through it and refuses new ones until [`Proxy::restart`].
//!
//! ```
//! use durable_transport_redis::RedisTransport;
//! use durable_transport_redis::test_support::{ScratchPrefix, url_or_skip};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! // In a #[tokio::test] named `sends_nothing`:
//! let Some(url) = url_or_skip("sends_nothing") else { return };
//! let scratch = ScratchPrefix::new(&url);
//! let transport = RedisTransport::connect(&url, scratch.prefix()).await.expect("connect");
//! assert_eq!(transport.queued().await.unwrap(), 0);
//! // Every key under the prefix is deleted here, also when an assertion above panics.
//! drop(scratch);
//! # }
//! ```

use std::io::Write;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

use crate::keys::Keys;

/// The environment variable naming the server: a `redis://` URL.
pub const ENV: &str = "DURABLE_REDIS_URL";

/// The server the skip line suggests: Redis on this machine, on its default port.
pub const EXAMPLE_URL: &str = "redis://127.0.0.1:6379";

/// The URL in [`ENV`], unless it is unset or blank.
pub fn url() -> Option<String> {
    std::env::var(ENV).ok().filter(|url| !url.trim().is_empty())
}

/// Why a Redis test does not run, and how to run it:
/// `DURABLE_REDIS_URL is not set; run DURABLE_REDIS_URL=redis://127.0.0.1:6379 cargo test -p <package> to run it`
/// (the package is the one `cargo test` is running, when cargo says so).
pub fn skip_reason() -> String {
    let package = std::env::var("CARGO_PKG_NAME").map(|p| format!(" -p {p}")).unwrap_or_default();
    format!("{ENV} is not set; run {ENV}={EXAMPLE_URL} cargo test{package} to run it")
}

/// The server's URL, or `None` after printing the one line that says `test` was skipped and
/// how to run it (`skipped <test>: <skip_reason>`), straight to stderr, past the test
/// harness's capture. Call it first, with the test's name, and return when it says `None`.
pub fn url_or_skip(test: &str) -> Option<String> {
    let url = url();
    if url.is_none() {
        let _ = writeln!(std::io::stderr().lock(), "skipped {test}: {}", skip_reason());
    }
    url
}

/// A key prefix of one test's own; every key under it is deleted when the guard is dropped
/// (also when the test panics), or earlier by [`ScratchPrefix::delete_now`].
///
/// `t<pid>_<nanos>_<n>`: unique among the tests of this process (`n` counts) and of other
/// processes sharing the server (`pid`, and the time it was made).
#[derive(Debug)]
pub struct ScratchPrefix {
    url: String,
    prefix: String,
}

impl ScratchPrefix {
    /// A fresh prefix on the server at `url`.
    pub fn new(url: &str) -> ScratchPrefix {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        ScratchPrefix { url: url.to_owned(), prefix: format!("t{}_{nanos}_{n}", std::process::id()) }
    }

    /// The server's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// How many keys exist under the prefix now.
    pub async fn key_count(&self) -> redis::RedisResult<usize> {
        let client = redis::Client::open(self.url.as_str())?;
        let mut conn = client.get_multiplexed_async_connection().await?;
        Ok(crate::transport::scan_keys(&mut conn, &Keys::new(self.prefix.clone()).pattern()).await?.len())
    }

    /// Deletes every key under the prefix now (dropping the guard deletes what was created
    /// since).
    pub async fn delete_now(&self) -> redis::RedisResult<()> {
        let client = redis::Client::open(self.url.as_str())?;
        let conn = redis::aio::ConnectionManager::new(client).await?;
        crate::transport::delete_prefix(&conn, &Keys::new(self.prefix.clone())).await
    }
}

impl Drop for ScratchPrefix {
    fn drop(&mut self) {
        // Maybe inside the test's runtime, maybe outside any: delete on a thread with a runtime
        // of its own, and wait for it. A failure leaves the keys behind, nothing more.
        let (url, prefix) = (self.url.clone(), self.prefix.clone());
        let _ = std::thread::spawn(move || -> redis::RedisResult<()> {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            runtime.block_on(async {
                let conn = redis::aio::ConnectionManager::new(redis::Client::open(url.as_str())?).await?;
                crate::transport::delete_prefix(&conn, &Keys::new(prefix)).await
            })
        })
        .join();
    }
}

/// A TCP proxy on a port of this machine in front of the server: connect through
/// [`Proxy::url`], then [`Proxy::stop`] plays the server going away (every connection closed,
/// new ones refused) and [`Proxy::restart`] its return on the same port.
#[derive(Debug)]
pub struct Proxy {
    url: String,
    listen: SocketAddr,
    upstream: SocketAddr,
    task: Option<JoinHandle<()>>,
}

impl Proxy {
    /// A proxy in front of the server at `url` (a `redis://host:port…` URL whose host resolves
    /// on this machine).
    ///
    /// # Panics
    ///
    /// If the URL has no `host:port` that resolves, or no local port is free.
    pub async fn start(url: &str) -> Proxy {
        let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
        let authority = rest.split(['/', '?']).next().unwrap_or(rest);
        let in_url = authority.rsplit_once('@').map_or(authority, |(_, hp)| hp);
        let host_port = if in_url.contains(':') { in_url.to_owned() } else { format!("{in_url}:6379") };
        let upstream = tokio::net::lookup_host(&host_port)
            .await
            .ok()
            .and_then(|mut addrs| addrs.next())
            .unwrap_or_else(|| panic!("the server address {host_port:?} does not resolve"));
        let (listen, task) = Self::serve("127.0.0.1:0".parse().expect("an address"), upstream).await;
        Proxy { url: url.replacen(in_url, &listen.to_string(), 1), listen, upstream, task: Some(task) }
    }

    async fn serve(listen: SocketAddr, upstream: SocketAddr) -> (SocketAddr, JoinHandle<()>) {
        let listener = TcpListener::bind(listen).await.expect("bind the proxy");
        let listen = listener.local_addr().expect("the proxy's address");
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
        (listen, task)
    }

    /// The server's URL through the proxy.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Closes the port and every connection through it.
    pub async fn stop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
    }

    /// Opens the port again (after [`Proxy::stop`]).
    pub async fn restart(&mut self) {
        self.stop().await;
        let (_, task) = Self::serve(self.listen, self.upstream).await;
        self.task = Some(task);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}
