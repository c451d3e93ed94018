//! Settings of a [`SqliteStore`](crate::SqliteStore).

use std::time::Duration;

/// How hard a commit waits for the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Durability {
    /// `PRAGMA synchronous = FULL`: every commit (every group of commits, see the crate docs)
    /// is fsynced before it is acknowledged. A power loss or an OS crash loses nothing that was
    /// acknowledged. The default.
    #[default]
    Full,
    /// `PRAGMA synchronous = NORMAL`: the write-ahead log is fsynced only at checkpoints. A
    /// process crash (`kill -9`) still loses nothing; a power loss or an OS crash may lose the
    /// last acknowledged commits (never corrupts the file). Faster on slow disks.
    Normal,
}

impl Durability {
    pub(crate) fn synchronous(self) -> &'static str {
        match self {
            Durability::Full => "FULL",
            Durability::Normal => "NORMAL",
        }
    }
}

/// Settings for [`SqliteStore::open_with`](crate::SqliteStore::open_with).
///
/// ```
/// use std::time::Duration;
/// use durable_store_sqlite::{Durability, SqliteOptions};
///
/// let opts = SqliteOptions::new().durability(Durability::Normal).busy_timeout(Duration::from_secs(10));
/// assert_eq!(opts.get_durability(), Durability::Normal);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqliteOptions {
    pub(crate) durability: Durability,
    pub(crate) busy_timeout: Duration,
    pub(crate) readers: usize,
    pub(crate) max_group: usize,
    pub(crate) create_if_missing: bool,
    pub(crate) migrate: bool,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        SqliteOptions {
            durability: Durability::Full,
            busy_timeout: Duration::from_secs(5),
            readers: 2,
            max_group: 512,
            create_if_missing: true,
            migrate: true,
        }
    }
}

impl SqliteOptions {
    /// The defaults: [`Durability::Full`], a 5 s busy timeout, 2 reader threads, groups of at
    /// most 512 writes, and a missing or empty file is created and initialised.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the durability (default [`Durability::Full`]).
    pub fn durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// Sets how long a write waits for another connection (another process, or another
    /// `SqliteStore` on the same file) to release the database's write lock before it fails
    /// with a retryable [`StoreError::Unavailable`](durable_core::StoreError::Unavailable).
    /// Default 5 s. While it waits, it tries again every 100–300 µs (not with SQLite's own
    /// backoff of up to 100 ms between tries), so processes sharing a file each get the lock
    /// soon after it is released and share the work fairly. Closing the store waits for other
    /// connections at most this long, and at most one second, to checkpoint the WAL (see
    /// [`SqliteStore`](crate::SqliteStore)).
    pub fn busy_timeout(mut self, timeout: Duration) -> Self {
        self.busy_timeout = timeout;
        self
    }

    /// Sets the number of reader threads, each with its own connection (default 2, at least 1).
    pub fn readers(mut self, readers: usize) -> Self {
        self.readers = readers.max(1);
        self
    }

    /// Sets the largest number of writes folded into one transaction (default 512, at least 1;
    /// 1 turns group commit off).
    pub fn max_group(mut self, max_group: usize) -> Self {
        self.max_group = max_group.max(1);
        self
    }

    /// Whether opening may create the database (default `true`).
    ///
    /// With `true`, a missing file is created and a missing, empty or table-less file gets the
    /// latest schema. With `false`, [`SqliteStore::open_with`](crate::SqliteStore::open_with)
    /// only opens an existing durable database: a missing file, an empty file or an SQLite
    /// database without a durable schema is refused with
    /// [`Error::NotADatabase`](crate::Error::NotADatabase) ("`<path>` is not a durable database:
    /// …") and nothing is created or written. Tools that inspect or operate on an existing
    /// database (the `durable` command line's `runs` and `signal` commands) open it this way, so
    /// a mistyped path is an error instead of a new, empty database.
    ///
    /// An existing durable database with an older schema is still migrated forward, unless
    /// [`SqliteOptions::migrate`]`(false)`.
    ///
    /// ```
    /// use durable_store_sqlite::{Error, SqliteOptions, SqliteStore};
    ///
    /// let dir = tempfile::tempdir().unwrap();
    /// let path = dir.path().join("typo.db");
    /// let err = SqliteStore::open_with(&path, SqliteOptions::new().create_if_missing(false)).unwrap_err();
    /// assert!(matches!(err, Error::NotADatabase { .. }));
    /// assert!(err.to_string().contains("is not a durable database"));
    /// assert!(!path.exists(), "nothing was created");
    /// ```
    pub fn create_if_missing(mut self, create: bool) -> Self {
        self.create_if_missing = create;
        self
    }

    /// Whether opening may create and initialise the database.
    pub fn get_create_if_missing(&self) -> bool {
        self.create_if_missing
    }

    /// Whether opening may migrate a file written by an older durable to this build's schema
    /// version (default `true`). Once migrated, builds older than this one refuse the file
    /// ([`Error::SchemaTooNew`](crate::Error::SchemaTooNew)): there is no way back. With
    /// `false`, an older file is refused with [`Error::SchemaTooOld`](crate::Error::SchemaTooOld)
    /// and left as it is: for tools that only look (the command line's operator commands).
    pub fn migrate(mut self, migrate: bool) -> Self {
        self.migrate = migrate;
        self
    }

    /// Whether opening may migrate an older file.
    pub fn get_migrate(&self) -> bool {
        self.migrate
    }

    /// The durability.
    pub fn get_durability(&self) -> Durability {
        self.durability
    }

    /// The busy timeout.
    pub fn get_busy_timeout(&self) -> Duration {
        self.busy_timeout
    }

    /// The number of reader threads.
    pub fn get_readers(&self) -> usize {
        self.readers
    }

    /// The largest group of writes per transaction.
    pub fn get_max_group(&self) -> usize {
        self.max_group
    }
}
