//! Settings of a [`PostgresStore`](crate::PostgresStore).

use std::time::Duration;

use crate::error::{Error, Result};

/// The longest identifier PostgreSQL keeps (NAMEDATALEN - 1).
const MAX_IDENTIFIER: usize = 63;

/// Settings for [`PostgresStore::connect_with`](crate::PostgresStore::connect_with) and
/// [`PostgresStore::from_pool`](crate::PostgresStore::from_pool).
///
/// ```
/// use std::time::Duration;
/// use durable_store_postgres::PostgresOptions;
///
/// let opts = PostgresOptions::new()
///     .schema("billing_durable")
///     .pool_size(32)
///     .statement_timeout(Some(Duration::from_secs(10)));
/// assert_eq!(opts.get_schema(), "billing_durable");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostgresOptions {
    pub(crate) schema: String,
    pub(crate) pool_size: usize,
    pub(crate) statement_timeout: Option<Duration>,
    pub(crate) connect_timeout: Duration,
    pub(crate) acquire_timeout: Duration,
    pub(crate) application_name: Option<String>,
    pub(crate) max_batch: usize,
    pub(crate) write_connections: usize,
    pub(crate) notify_channel: Option<String>,
    pub(crate) create_if_missing: bool,
    pub(crate) migrate: bool,
}

impl Default for PostgresOptions {
    fn default() -> Self {
        PostgresOptions {
            schema: "durable".into(),
            pool_size: 16,
            statement_timeout: Some(Duration::from_secs(30)),
            connect_timeout: Duration::from_secs(10),
            acquire_timeout: Duration::from_secs(30),
            application_name: None,
            max_batch: 256,
            write_connections: 1,
            notify_channel: None,
            create_if_missing: true,
            migrate: true,
        }
    }
}

impl PostgresOptions {
    /// The defaults: schema `durable`, 16 pooled connections, a 30 s statement timeout, a 10 s
    /// connect timeout, a 30 s wait for a pooled connection, application name `durable` (unless
    /// the URL sets one), batches of at most 256 writes, one batch at a time, no NOTIFY.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the schema every table and function lives in (default `durable`). It is created if
    /// missing. Give each deployment (and each test) its own schema to isolate it; engines that
    /// should share runs must use the same one.
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = schema.into();
        self
    }

    /// Sets the largest number of connections the store opens (default 16, at least 2). Each of
    /// the two writers — everything else, and the run queue — holds one per batch in flight
    /// (up to [`PostgresOptions::write_connections`] each); reads and queue claims use the
    /// others, and wait for one when all are taken. Ignored by
    /// [`PostgresStore::from_pool`](crate::PostgresStore::from_pool), whose pool is already sized.
    pub fn pool_size(mut self, size: usize) -> Self {
        self.pool_size = size.max(2);
        self
    }

    /// Sets `statement_timeout` on the store's connections (default 30 s; `None` keeps the
    /// server's). A call that runs longer, waiting for locks included, fails with a retryable
    /// [`StoreError::Unavailable`](durable_core::StoreError::Unavailable). Ignored by
    /// [`PostgresStore::from_pool`](crate::PostgresStore::from_pool).
    pub fn statement_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.statement_timeout = timeout;
        self
    }

    /// Sets how long opening one connection may take (default 10 s), unless the URL sets
    /// `connect_timeout`. Ignored by [`PostgresStore::from_pool`](crate::PostgresStore::from_pool).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Sets how long a call waits for a free pooled connection before it fails with a retryable
    /// [`StoreError::Unavailable`](durable_core::StoreError::Unavailable) (default 30 s).
    /// Ignored by [`PostgresStore::from_pool`](crate::PostgresStore::from_pool).
    pub fn acquire_timeout(mut self, timeout: Duration) -> Self {
        self.acquire_timeout = timeout;
        self
    }

    /// Sets `application_name` on the store's connections (default: the URL's, else `durable`),
    /// so `pg_stat_activity` shows which connections are the engine's. Ignored by
    /// [`PostgresStore::from_pool`](crate::PostgresStore::from_pool).
    pub fn application_name(mut self, name: impl Into<String>) -> Self {
        self.application_name = Some(name.into());
        self
    }

    /// Sets the largest number of writes folded into one transaction (default 256, at least 1;
    /// 1 turns batching off). A bulk create (`create_runs`) is never split: its writes go in
    /// one transaction however many they are, with others only while the limit allows.
    pub fn max_batch(mut self, max_batch: usize) -> Self {
        self.max_batch = max_batch.max(1);
        self
    }

    /// Sets how many write batches may be in flight at once, each on its own pooled
    /// connection (default 1, at least 1). More lets the server work on several batches in
    /// parallel, and one batch fill while another waits for its commit to be flushed. Measured
    /// with `cargo xtask bench` against a server on the same 2-core machine, 2 against 1: one
    /// busy process gains (signals +50%, fan-out +15%, `chain` +20%), but three processes
    /// sharing the server lose 20% on `chain` (six batches in flight for two cores). Try 2 for
    /// a process that writes much, on a server with cores to spare. Batches in flight together are separate transactions; each takes its locks
    /// in one global order before its first operation (every advisory key of its signal
    /// tokens, event names and waits, ascending, then the rows of the runs it wakes, in id
    /// order), so batches touching the same runs and tokens (children waking their parents in
    /// a fan-out) wait for each other instead of deadlocking. Writes of one caller are awaited
    /// one by one either way, so a run's writes never overtake each other.
    pub fn write_connections(mut self, n: usize) -> Self {
        self.write_connections = n.max(1);
        self
    }

    /// Makes every write that creates a run, hands a run back to `pending` or wakes a run
    /// (a delivered signal or event, a `wake` patch) `NOTIFY` the run's id on `channel`, when
    /// its transaction commits. [`PostgresStore::listen`](crate::PostgresStore::listen) receives
    /// them. Every write that queues runs for the store-backed transport (the run queue)
    /// `NOTIFY`s `<channel>:queue` with their namespace;
    /// [`PostgresStore::queue_wakeups`](crate::PostgresStore::queue_wakeups) receives those.
    /// Every commit that dispatches remote-step tasks, and every release of claimed tasks,
    /// `NOTIFY`s `<channel>:tasks` with the queue's name;
    /// [`PostgresStore::task_wakeups`](crate::PostgresStore::task_wakeups) receives those.
    /// At most 57 bytes (PostgreSQL's 63, less `:queue`). Default: no NOTIFY.
    pub fn notify_channel(mut self, channel: impl Into<String>) -> Self {
        self.notify_channel = Some(channel.into());
        self
    }

    /// Whether connecting may create the schema when it does not exist or holds no durable
    /// tables (default `true`). With `false`, connecting to a schema without durable's tables
    /// fails with [`Error::SchemaNotFound`](crate::Error::SchemaNotFound) and changes nothing:
    /// for tools that inspect runs and must not initialise a database by mistake (an older
    /// durable schema is still migrated forward, unless [`PostgresOptions::migrate`] says no).
    pub fn create_if_missing(mut self, create: bool) -> Self {
        self.create_if_missing = create;
        self
    }

    /// Whether connecting may migrate a schema written by an older durable to this build's
    /// version (default `true`). Once migrated, builds older than this one refuse the schema
    /// ([`Error::SchemaTooNew`](crate::Error::SchemaTooNew)): there is no way back. With
    /// `false`, an older schema is refused with
    /// [`Error::SchemaTooOld`](crate::Error::SchemaTooOld) and left as it is: for tools that
    /// only look (the command line's operator commands), so that looking never upgrades a
    /// fleet's database behind its workers' backs.
    pub fn migrate(mut self, migrate: bool) -> Self {
        self.migrate = migrate;
        self
    }

    /// The schema.
    pub fn get_schema(&self) -> &str {
        &self.schema
    }

    /// The pool size.
    pub fn get_pool_size(&self) -> usize {
        self.pool_size
    }

    /// The statement timeout.
    pub fn get_statement_timeout(&self) -> Option<Duration> {
        self.statement_timeout
    }

    /// The connect timeout.
    pub fn get_connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// The wait for a pooled connection.
    pub fn get_acquire_timeout(&self) -> Duration {
        self.acquire_timeout
    }

    /// The application name set on connections, if set here.
    pub fn get_application_name(&self) -> Option<&str> {
        self.application_name.as_deref()
    }

    /// The largest batch of writes per transaction.
    pub fn get_max_batch(&self) -> usize {
        self.max_batch
    }

    /// How many write batches may be in flight at once.
    pub fn get_write_connections(&self) -> usize {
        self.write_connections
    }

    /// The NOTIFY channel, if any.
    pub fn get_notify_channel(&self) -> Option<&str> {
        self.notify_channel.as_deref()
    }

    /// Whether connecting may create the schema.
    pub fn get_create_if_missing(&self) -> bool {
        self.create_if_missing
    }

    /// Whether connecting may migrate an older schema.
    pub fn get_migrate(&self) -> bool {
        self.migrate
    }

    /// Checks the values that PostgreSQL would refuse later, with a clearer message.
    pub(crate) fn validate(&self) -> Result<()> {
        let bad = |reason: String| Err(Error::InvalidOptions { reason });
        if self.schema.is_empty() {
            return bad("the schema name is empty".into());
        }
        if self.schema.len() > MAX_IDENTIFIER {
            return bad(format!(
                "the schema name {:?} is {} bytes long; PostgreSQL keeps at most {MAX_IDENTIFIER}",
                self.schema,
                self.schema.len()
            ));
        }
        if self.schema.contains('\0') {
            return bad("the schema name contains a NUL character".into());
        }
        // `<channel>:queue` must fit in an identifier too.
        let max_channel = MAX_IDENTIFIER - ":queue".len();
        if let Some(channel) = &self.notify_channel
            && (channel.is_empty() || channel.len() > max_channel || channel.contains('\0'))
        {
            return bad(format!(
                "the notify channel {channel:?} must be 1 to {max_channel} bytes without NUL characters"
            ));
        }
        Ok(())
    }
}

/// `name` as a quoted SQL identifier.
pub(crate) fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_and_quoting() {
        assert!(PostgresOptions::new().validate().is_ok());
        assert!(PostgresOptions::new().schema("").validate().is_err());
        assert!(PostgresOptions::new().schema("x".repeat(64)).validate().is_err());
        assert!(PostgresOptions::new().notify_channel("").validate().is_err());
        assert!(PostgresOptions::new().notify_channel("c".repeat(57)).validate().is_ok());
        assert!(PostgresOptions::new().notify_channel("c".repeat(58)).validate().is_err());
        assert!(PostgresOptions::new().get_create_if_missing());
        assert_eq!(quote_ident("a\"b"), "\"a\"\"b\"");
        assert_eq!(PostgresOptions::new().pool_size(0).get_pool_size(), 2);
        assert_eq!(PostgresOptions::new().max_batch(0).get_max_batch(), 1);
    }
}
