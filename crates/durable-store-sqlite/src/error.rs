//! The crate's error type, and its mapping to [`StoreError`].

use std::error::Error as StdError;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use durable_core::StoreError;
use rusqlite::ErrorCode;

/// The result type of this crate's own functions (opening a store).
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What can go wrong opening or using a [`SqliteStore`](crate::SqliteStore).
///
/// Every message names the database file. Store calls return these wrapped in
/// [`StoreError::Backend`] (downcast the source to get this type back), except a database that
/// stayed locked past the busy timeout, which is [`StoreError::Unavailable`] with
/// `retryable: true`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The file exists but is not a database this crate wrote (a text file, another program's
    /// SQLite database, a corrupt header). Nothing was written to it.
    #[error("{} is not a durable database: {reason}", path.display())]
    NotADatabase {
        /// The file.
        path: PathBuf,
        /// Why it is not one.
        reason: String,
    },
    /// The path names no database file: it is empty, or `:memory:` (SQLite's temporary
    /// databases, which a durable store cannot be). Nothing was opened.
    #[error("{path:?} is not a database file path: {reason}")]
    InvalidPath {
        /// The path given.
        path: PathBuf,
        /// Why it is refused.
        reason: &'static str,
    },
    /// The file was written by an older durable, and the store was told not to migrate it
    /// ([`SqliteOptions::migrate`](crate::SqliteOptions::migrate)). Nothing was written to it.
    #[error(
        "{} has durable schema version {found}, older than version {supported} of this build, which was told \
         not to migrate it: look at it with a durable of the version its workers run; to upgrade it (builds \
         older than this one then refuse it, so upgrade every process that opens it), run `durable migrate` or \
         start an upgraded worker",
        path.display()
    )]
    SchemaTooOld {
        /// The file.
        path: PathBuf,
        /// The schema version found in the file.
        found: u32,
        /// This build's schema version.
        supported: u32,
    },
    /// The file was written by a newer version of this crate, with a schema this build does
    /// not know. Nothing was written to it.
    #[error(
        "{} has durable schema version {found}, newer than version {supported} that this build of \
         durable-store-sqlite knows: upgrade durable to open it",
        path.display()
    )]
    SchemaTooNew {
        /// The file.
        path: PathBuf,
        /// The schema version found in the file.
        found: u32,
        /// The newest schema version this build knows.
        supported: u32,
    },
    /// Another connection (maybe another process) held the database's write lock for longer
    /// than the busy timeout. Nothing was written; trying again later can succeed.
    #[error(
        "{}: the database stayed locked by another connection for longer than the busy timeout \
         ({timeout:?}); nothing was written, try again (or raise SqliteOptions::busy_timeout)",
        path.display()
    )]
    Busy {
        /// The file.
        path: PathBuf,
        /// The busy timeout in force.
        timeout: Duration,
    },
    /// SQLite failed: the file or its directory is read-only, the disk is full, the file is
    /// corrupt, an I/O error, … The message says which; the write that failed left nothing
    /// behind (its transaction was rolled back).
    #[error("{}: {message}", path.display())]
    Sqlite {
        /// The file.
        path: PathBuf,
        /// What failed, in words.
        message: String,
        /// The SQLite error.
        #[source]
        source: Box<dyn StdError + Send + Sync>,
    },
    /// A value read from the file does not decode (a status name this build does not know, a
    /// negative time, malformed JSON): the file was changed by something other than this crate.
    #[error("{}: stored data is invalid: {message}", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is invalid (names the run and seq).
        message: String,
    },
    /// A file-system call failed before SQLite was involved (reading the file header).
    #[error("{}: {message}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What was being done.
        message: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The store's writer or reader threads are gone (the store is shutting down, or a thread
    /// panicked).
    #[error("{}: the store's {which} thread stopped", path.display())]
    Stopped {
        /// The file.
        path: PathBuf,
        /// `writer` or `reader`.
        which: &'static str,
    },
}

impl Error {
    /// The database file the error is about.
    pub fn path(&self) -> &Path {
        match self {
            Error::NotADatabase { path, .. }
            | Error::InvalidPath { path, .. }
            | Error::SchemaTooNew { path, .. }
            | Error::SchemaTooOld { path, .. }
            | Error::Busy { path, .. }
            | Error::Sqlite { path, .. }
            | Error::Corrupt { path, .. }
            | Error::Io { path, .. }
            | Error::Stopped { path, .. } => path,
        }
    }

    /// Whether trying the same thing again later can succeed (only [`Error::Busy`]).
    pub fn is_retryable(&self) -> bool {
        matches!(self, Error::Busy { .. })
    }

    /// Classifies a SQLite error met while doing `doing` (e.g. "opening the database").
    pub(crate) fn sqlite(path: &Path, busy_timeout: Duration, doing: &str, e: rusqlite::Error) -> Error {
        let path = path.to_path_buf();
        let Some(code) = e.sqlite_error_code() else {
            return Error::Sqlite { path, message: format!("{doing}: {e}"), source: Box::new(e) };
        };
        let what = match code {
            ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked => {
                return Error::Busy { path, timeout: busy_timeout };
            }
            ErrorCode::NotADatabase => {
                return Error::NotADatabase { path, reason: format!("SQLite refused it while {doing} ({e})") };
            }
            ErrorCode::ReadOnly => {
                "the database is read-only (check the permissions of the file, of its -wal and -shm \
                 files and of its directory)"
            }
            ErrorCode::CannotOpen => "cannot open the database file (check that its directory exists and is writable)",
            ErrorCode::PermissionDenied => "permission denied",
            ErrorCode::DiskFull => "the disk is full (the failed write was rolled back)",
            ErrorCode::DatabaseCorrupt => "the database file is corrupt",
            ErrorCode::SystemIoFailure => "I/O error",
            ErrorCode::FileLockingProtocolFailed => "file locking failed (is the file on a network file system?)",
            ErrorCode::NoLargeFileSupport => "the file is too large for this system",
            ErrorCode::TooBig => "a value is larger than SQLite's limit",
            ErrorCode::OutOfMemory => "out of memory",
            _ => "SQLite error",
        };
        Error::Sqlite { path, message: format!("{what}, while {doing}: {e}"), source: Box::new(e) }
    }

    /// The [`StoreError`] a store call returns for this error.
    pub(crate) fn into_store_error(self) -> StoreError {
        match self {
            e @ Error::Busy { .. } => StoreError::Unavailable { message: e.to_string(), retryable: true },
            e @ Error::Stopped { .. } => StoreError::Unavailable { message: e.to_string(), retryable: false },
            e => StoreError::Backend(Box::new(e)),
        }
    }
}

impl From<Error> for StoreError {
    fn from(e: Error) -> Self {
        e.into_store_error()
    }
}

/// A failure that several requests share (a group commit that failed): rebuilt per request,
/// because [`StoreError`] cannot be cloned.
#[derive(Clone)]
pub(crate) struct SharedFailure {
    busy: Option<Duration>,
    /// The transaction was rolled back for another write's failure: trying again can succeed.
    retryable: bool,
    path: PathBuf,
    message: String,
}

impl SharedFailure {
    pub(crate) fn new(err: &Error) -> Self {
        SharedFailure {
            busy: match err {
                Error::Busy { timeout, .. } => Some(*timeout),
                _ => None,
            },
            retryable: false,
            path: err.path().to_path_buf(),
            message: err.to_string(),
        }
    }

    /// The transaction was rolled back because the `op` write grouped with the others failed
    /// after it changed rows: a retryable `Unavailable` for the others.
    pub(crate) fn rolled_back(path: &Path, op: &str) -> Self {
        SharedFailure {
            busy: None,
            retryable: true,
            path: path.to_path_buf(),
            message: format!(
                "the {op} write grouped with this one failed after it changed rows, so the transaction of both \
                 was rolled back: nothing of this write was written; try again"
            ),
        }
    }

    pub(crate) fn to_store_error(&self) -> StoreError {
        if self.retryable {
            return StoreError::Unavailable {
                message: format!("{}: {}", self.path.display(), self.message),
                retryable: true,
            };
        }
        match self.busy {
            Some(timeout) => Error::Busy { path: self.path.clone(), timeout }.into_store_error(),
            None => StoreError::Backend(Box::new(Error::Sqlite {
                path: self.path.clone(),
                message: format!("the write transaction failed, nothing of it was kept: {}", self.message),
                source: Box::new(Message(self.message.clone())),
            })),
        }
    }
}

/// A plain message as an error source.
#[derive(Debug)]
struct Message(String);

impl fmt::Display for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl StdError for Message {}
