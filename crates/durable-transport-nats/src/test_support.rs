//! Test support (feature `test-support`): the NATS server named by `DURABLE_NATS_URL`, or one
//! line saying the test was skipped; a prefix of each test's own.
//!
//! - [`url_or_skip`]: the server's URL from [`ENV`], or `None` after printing one line to stderr:
//!   `skipped <test>: DURABLE_NATS_URL is not set; to run it: DURABLE_NATS_URL=nats://127.0.0.1:4222 cargo test -p <package>`.
//!   The test then returns and passes. [`skip_reason`] is the same text, for a conformance
//!   factory's `unavailable`.
//! - [`unique_prefix`]: `t_<tag>_<pid>_<nanos>_<n>`, unique among the tests of this process and
//!   of others sharing the server. Delete the stream at the end
//!   ([`NatsTransport::delete`](crate::NatsTransport::delete)).
//!
//! ```
//! use durable_transport_nats::NatsTransport;
//! use durable_transport_nats::test_support::{unique_prefix, url_or_skip};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! // In a #[tokio::test] named `starts_empty`:
//! let Some(url) = url_or_skip("starts_empty") else { return };
//! let transport = NatsTransport::connect(&url, &unique_prefix("empty")).await.expect("connect");
//! assert_eq!(transport.queued().await.expect("stream info"), 0);
//! transport.delete().await.expect("delete the stream");
//! # }
//! ```

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// The environment variable naming the server: a `nats://` URL.
pub const ENV: &str = "DURABLE_NATS_URL";

/// The server the skip line suggests: NATS with JetStream on this machine.
pub const EXAMPLE_URL: &str = "nats://127.0.0.1:4222";

/// The URL in [`ENV`], unless it is unset or blank.
pub fn url() -> Option<String> {
    std::env::var(ENV).ok().filter(|url| !url.trim().is_empty())
}

/// Why a NATS test does not run, and how to run it:
/// `DURABLE_NATS_URL is not set; to run it: DURABLE_NATS_URL=nats://127.0.0.1:4222 cargo test -p <package>`.
pub fn skip_reason() -> String {
    let package = std::env::var("CARGO_PKG_NAME").map(|p| format!(" -p {p}")).unwrap_or_default();
    format!("{ENV} is not set; to run it: {ENV}={EXAMPLE_URL} cargo test{package}")
}

/// The server's URL, or `None` after printing the one line that says `test` was skipped and how
/// to run it (straight to stderr, past the test harness's capture).
pub fn url_or_skip(test: &str) -> Option<String> {
    let url = url();
    if url.is_none() {
        let _ = writeln!(std::io::stderr().lock(), "skipped {test}: {}", skip_reason());
    }
    url
}

/// A prefix of the caller's own: `t_<tag>_<pid>_<nanos>_<n>` (`tag`: a few ASCII letters,
/// digits or `_`).
///
/// # Panics
///
/// If `tag` has other characters.
pub fn unique_prefix(tag: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    assert!(
        tag.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'),
        "prefix tag {tag:?}: ASCII letters, digits and _ only"
    );
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("t_{tag}_{}_{nanos}_{n}", std::process::id())
}
