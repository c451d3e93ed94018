//! The crate's error type, and how driver and pool errors map to [`StoreError`].

use std::error::Error as StdError;
use std::fmt;

use deadpool_postgres::PoolError;
use durable_core::StoreError;

/// The result type of this crate's own functions (connecting a store).
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What can go wrong connecting or using a [`PostgresStore`](crate::PostgresStore).
///
/// Every message is one line and names the server (`user@host:port/database`, never the
/// password). Store calls return these wrapped in [`StoreError::Backend`] (downcast the source
/// to get this type back), except failures that trying again can cure — a dropped connection, a
/// server restarting or refusing connections, a deadlock, a statement timeout, no pooled
/// connection free in time — which are [`StoreError::Unavailable`] with `retryable: true`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The connection URL does not parse. The message does not repeat the URL (it may hold a
    /// password).
    #[error("invalid PostgreSQL URL: {reason} (expected postgres://user[:password]@host[:port]/database[?options])")]
    InvalidUrl {
        /// What is wrong with it.
        reason: String,
    },
    /// A [`PostgresOptions`](crate::PostgresOptions) value is out of range.
    #[error("invalid PostgresOptions: {reason}")]
    InvalidOptions {
        /// What is wrong.
        reason: String,
    },
    /// The server could not be reached: refused, unreachable, timed out, or it closed the
    /// connection while starting up or shutting down.
    #[error("cannot connect to PostgreSQL at {target}: {reason}")]
    Connect {
        /// `user@host:port/database`.
        target: String,
        /// What happened, with a hint.
        reason: String,
        /// The driver's error.
        #[source]
        source: Option<Box<dyn StdError + Send + Sync>>,
    },
    /// The server answered, but the database named in the URL does not exist.
    #[error(
        "database {database:?} does not exist on PostgreSQL at {target}: create it (CREATE DATABASE) or fix the URL"
    )]
    DatabaseNotFound {
        /// `user@host:port/database`.
        target: String,
        /// The database.
        database: String,
    },
    /// The server refused the user or the password.
    #[error("PostgreSQL at {target} refused the login: {reason}")]
    AuthFailed {
        /// `user@host:port/database`.
        target: String,
        /// The server's message.
        reason: String,
    },
    /// The schema was written by a newer version of this crate. Nothing was changed.
    #[error(
        "schema {schema:?} on PostgreSQL at {target} has durable schema version {found}, newer than version \
         {supported} that this build of durable-store-postgres knows: upgrade durable to use it"
    )]
    SchemaTooNew {
        /// `user@host:port/database`.
        target: String,
        /// The schema.
        schema: String,
        /// The version recorded in the schema.
        found: u32,
        /// The newest version this build knows.
        supported: u32,
    },
    /// The schema was written by an older durable, and the store was told not to migrate it
    /// ([`PostgresOptions::migrate`](crate::PostgresOptions::migrate)). Nothing was changed.
    #[error(
        "schema {schema:?} on PostgreSQL at {target} has durable schema version {found}, older than version \
         {supported} of this build, which was told not to migrate it: look at it with a durable of the version \
         its workers run; to upgrade it (builds older than this one then refuse it, so upgrade every worker \
         too), run `durable migrate` or start an upgraded worker"
    )]
    SchemaTooOld {
        /// `user@host:port/database`.
        target: String,
        /// The schema.
        schema: String,
        /// The version recorded in the schema.
        found: u32,
        /// This build's version.
        supported: u32,
    },
    /// The schema does not exist or holds no durable tables, and the store was told not to
    /// create it ([`PostgresOptions::create_if_missing`](crate::PostgresOptions::create_if_missing)).
    /// Nothing was changed.
    #[error(
        "no durable schema {schema:?} on PostgreSQL at {target}: check the schema name, or let a worker create it \
         (it is created on first connect)"
    )]
    SchemaNotFound {
        /// `user@host:port/database`.
        target: String,
        /// The schema.
        schema: String,
    },
    /// The schema holds tables this crate did not create, and no durable schema version.
    /// Nothing was changed.
    #[error(
        "schema {schema:?} on PostgreSQL at {target} holds tables durable did not create ({tables}) and no durable \
         schema version: give durable a schema of its own (PostgresOptions::schema)"
    )]
    ForeignSchema {
        /// `user@host:port/database`.
        target: String,
        /// The schema.
        schema: String,
        /// Some of the tables found.
        tables: String,
    },
    /// The TLS handshake the URL's `sslmode` asks for failed: the server's certificate was
    /// refused (`verify-ca`, `verify-full`) or the two sides could not agree. Not retryable:
    /// the URL (its `sslmode`, `sslrootcert` or host name) or the server's certificate must
    /// change.
    #[error("PostgreSQL at {target}: connecting: {reason}")]
    Tls {
        /// `user@host:port/database`.
        target: String,
        /// What the handshake refused, and what to set.
        reason: String,
        /// The driver's error.
        #[source]
        source: Option<Box<dyn StdError + Send + Sync>>,
    },
    /// A statement failed on the server (or the connection failed mid-call). The transaction it
    /// was part of was rolled back.
    #[error("PostgreSQL at {target}: {message}")]
    Postgres {
        /// `user@host:port/database`.
        target: String,
        /// What was being done and what the server said (with its SQLSTATE).
        message: String,
        /// Whether trying again later can succeed (connection lost, deadlock, timeout, …).
        retryable: bool,
        /// The driver's or the pool's error.
        #[source]
        source: Option<Box<dyn StdError + Send + Sync>>,
    },
    /// A value read from the database does not decode (a status this build does not know, a
    /// negative time, malformed JSON): the schema was changed by something other than this crate.
    #[error("PostgreSQL at {target}: stored data is invalid: {message}")]
    Corrupt {
        /// `user@host:port/database`.
        target: String,
        /// What is invalid (names the run and seq).
        message: String,
    },
    /// The store was connected outside a tokio runtime: it needs one (the driver, the pool and
    /// the store's writer are tokio tasks).
    #[error(
        "PostgresStore must be connected from inside a tokio runtime (the driver and the store's writer are tokio tasks)"
    )]
    NoRuntime,
    /// The store's writer task is gone: the tokio runtime it was spawned on shut down.
    #[error(
        "PostgreSQL at {target}: the store's writer task stopped (the tokio runtime that connected the store shut \
         down); connect the store again"
    )]
    WriterStopped {
        /// `user@host:port/database`.
        target: String,
    },
}

impl Error {
    /// Whether trying the same thing again later can succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Connect { .. } => true,
            Error::Postgres { retryable, .. } => *retryable,
            _ => false,
        }
    }

    /// The [`StoreError`] a store call returns for this error.
    pub(crate) fn into_store_error(self) -> StoreError {
        if self.is_retryable() {
            return StoreError::Unavailable { message: self.to_string(), retryable: true };
        }
        match self {
            e @ Error::WriterStopped { .. } => StoreError::Unavailable { message: e.to_string(), retryable: false },
            e => StoreError::Backend(Box::new(e)),
        }
    }
}

impl From<Error> for StoreError {
    fn from(e: Error) -> Self {
        e.into_store_error()
    }
}

/// SQLSTATEs after which the same call may succeed: connection exceptions (class 08), the server
/// shutting down or starting up (57P01–57P03), a cancelled statement (57014: statement timeout),
/// insufficient resources (class 53: too many connections), a lock timeout (55P03), and the
/// transaction conflicts (40001 serialization failure, 40P01 deadlock).
pub(crate) fn retryable_sqlstate(code: &str) -> bool {
    code.starts_with("08")
        || code.starts_with("53")
        || matches!(code, "57P01" | "57P02" | "57P03" | "57014" | "55P03" | "40001" | "40P01")
}

/// Whether a driver error means "the connection is gone or the server is unavailable".
pub(crate) fn is_transient(e: &tokio_postgres::Error) -> bool {
    if let Some(db) = e.as_db_error() {
        return retryable_sqlstate(db.code().code());
    }
    // No server error: the connection closed, an I/O error, a connect timeout.
    e.is_closed() || source_chain(e).any(|s| s.is::<std::io::Error>()) || e.to_string().contains("timed out")
}

/// Whether a driver error is a deadlock or a serialization failure: the transaction was rolled
/// back and running it again is safe.
pub(crate) fn is_conflict(e: &tokio_postgres::Error) -> bool {
    e.as_db_error().is_some_and(|db| matches!(db.code().code(), "40001" | "40P01"))
}

fn source_chain<'a>(e: &'a (dyn StdError + 'static)) -> impl Iterator<Item = &'a (dyn StdError + 'static)> {
    std::iter::successors(Some(e), |e: &&'a (dyn StdError + 'static)| -> Option<&'a (dyn StdError + 'static)> {
        (*e).source()
    })
}

/// A driver error in one line: the server's message with its SQLSTATE, or the driver's.
pub(crate) fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => {
            let mut s = format!("{} (SQLSTATE {})", db.message(), db.code().code());
            if let Some(detail) = db.detail() {
                s.push_str(&format!("; {detail}"));
            }
            if let Some(hint) = db.hint() {
                s.push_str(&format!("; hint: {hint}"));
            }
            if let Some(where_) = db.where_() {
                s.push_str(&format!("; at {}", where_.replace('\n', " / ")));
            }
            s
        }
        None => {
            // The driver's own message, plus its innermost cause (the I/O error) when it adds one.
            let top = e.to_string();
            match source_chain(e).skip(1).last().map(ToString::to_string) {
                Some(cause) if !top.contains(&cause) => format!("{top}: {cause}"),
                _ => top,
            }
        }
    }
}

/// Turns a failed call (`doing`: what was being done) into an [`Error::Postgres`].
pub(crate) fn query_error(target: &str, doing: &str, e: tokio_postgres::Error) -> Error {
    Error::Postgres {
        target: target.to_string(),
        message: format!("{doing}: {}", describe(&e)),
        retryable: is_transient(&e),
        source: Some(Box::new(e)),
    }
}

/// Turns a failure to get a pooled connection into an [`Error`].
pub(crate) fn pool_error(target: &str, e: PoolError) -> Error {
    match e {
        PoolError::Backend(e) => connect_error(target, e),
        PoolError::Timeout(kind) => Error::Postgres {
            target: target.to_string(),
            message: format!(
                "no pooled connection became available in time ({kind:?} timeout): the pool is exhausted or the \
                 server is slow to accept connections (raise PostgresOptions::pool_size or acquire_timeout)"
            ),
            retryable: true,
            source: None,
        },
        PoolError::Closed => Error::Postgres {
            target: target.to_string(),
            message: "the connection pool was closed".into(),
            retryable: false,
            source: None,
        },
        other => Error::Postgres {
            target: target.to_string(),
            message: format!("the connection pool failed: {other}"),
            retryable: false,
            source: Some(Box::new(Message(other.to_string()))),
        },
    }
}

/// Classifies an error met while opening a connection.
pub(crate) fn connect_error(target: &str, e: tokio_postgres::Error) -> Error {
    let target_s = target.to_string();
    if let Some(db) = e.as_db_error() {
        match db.code().code() {
            "3D000" => {
                let database = target.rsplit_once('/').map_or_else(String::new, |(_, d)| d.to_string());
                return Error::DatabaseNotFound { target: target_s, database };
            }
            "28P01" | "28000" => {
                return Error::AuthFailed { target: target_s, reason: describe(&e) };
            }
            code if retryable_sqlstate(code) => {
                return Error::Connect {
                    target: target_s,
                    reason: format!("the server refused the connection: {}", describe(&e)),
                    source: Some(Box::new(e)),
                };
            }
            _ => {
                return Error::Postgres {
                    target: target_s,
                    message: format!("connecting: {}", describe(&e)),
                    retryable: false,
                    source: Some(Box::new(e)),
                };
            }
        }
    }
    let io_error = source_chain(&e).find_map(|s| s.downcast_ref::<std::io::Error>());
    // The TLS handshake refused the server's certificate (`sslmode=verify-*`): retrying will
    // not make it trusted.
    // Another TLS failure (a protocol version or an alert) is no passing one either.
    if let Some(tls) = io_error.and_then(|io| io.get_ref()).and_then(|inner| inner.downcast_ref::<rustls::Error>()) {
        let reason = match tls {
            rustls::Error::InvalidCertificate(_) | rustls::Error::NoCertificatesPresented => format!(
                "TLS: {tls}; with sslmode=verify-ca or verify-full, name the PEM file of the CA \
                 that signed the server's certificate with sslrootcert=<path> (verify-full: or the system's CAs), \
                 and for verify-full connect by a host name the certificate is for"
            ),
            _ => format!("the TLS handshake failed: {tls}"),
        };
        return Error::Tls { target: target_s, reason, source: Some(Box::new(e)) };
    }
    let io_kind = io_error.map(std::io::Error::kind);
    let reason = match io_kind {
        Some(std::io::ErrorKind::ConnectionRefused) => {
            "connection refused: is PostgreSQL running and listening on that host and port?".to_string()
        }
        Some(std::io::ErrorKind::TimedOut) => {
            "timed out: is the host reachable and the port right? (PostgresOptions::connect_timeout)".to_string()
        }
        _ if e.to_string().contains("timed out") => {
            "timed out: is the host reachable and the port right? (PostgresOptions::connect_timeout)".to_string()
        }
        // A pool given to `from_pool` whose connector has no TLS, for a configuration asking for it.
        _ if describe(&e).contains("no TLS implementation configured") => {
            "the configuration asks for TLS (sslmode), and the pool's connector has none: build the pool \
             with a TLS connector, or let PostgresStore::connect make one from the URL's sslmode"
                .to_string()
        }
        _ => describe(&e),
    };
    if e.is_closed() || io_kind.is_some() || reason.starts_with("timed out") {
        return Error::Connect { target: target_s, reason, source: Some(Box::new(e)) };
    }
    // Not a network failure: a configuration problem (no host in the URL, a bad option).
    Error::Postgres {
        target: target_s,
        message: format!("connecting: {reason}"),
        retryable: false,
        source: Some(Box::new(e)),
    }
}

/// A plain message as an error source.
#[derive(Debug)]
pub(crate) struct Message(pub(crate) String);

impl fmt::Display for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl StdError for Message {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retryable_classes() {
        for code in ["08006", "08001", "57P01", "57P03", "53300", "40P01", "40001", "57014"] {
            assert!(retryable_sqlstate(code), "{code}");
        }
        for code in ["23505", "42P01", "3D000", "28P01", "P0001"] {
            assert!(!retryable_sqlstate(code), "{code}");
        }
    }

    #[test]
    fn retryable_errors_become_unavailable() {
        let e = Error::Postgres { target: "t".into(), message: "gone".into(), retryable: true, source: None };
        assert!(matches!(e.into_store_error(), StoreError::Unavailable { retryable: true, .. }));
        let e = Error::Corrupt { target: "t".into(), message: "bad".into() };
        assert!(matches!(e.into_store_error(), StoreError::Backend(_)));
        let e = Error::WriterStopped { target: "t".into() };
        assert!(matches!(e.into_store_error(), StoreError::Unavailable { retryable: false, .. }));
    }
}
