//! The command line's error: a one-line message and the exit code it maps to.

use durable::store::StoreError;
use durable::{Error as EngineError, PostgresError, SqliteError};

/// The result type of the command line's functions.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a command did not succeed. Every message is one line that names the run, token or file
/// concerned; [`Error::exit_code`] tells the shell what kind of failure it was.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The input was wrong: an unknown run id or schedule key, malformed JSON, a run in a state the command
    /// does not apply to, a `--db` or `--url` that cannot be opened as given (a missing
    /// directory, a file that is not a durable database, …). Exit code 2 (like a usage error):
    /// running the same command again will not help.
    #[error("{0}")]
    BadInput(String),
    /// Something failed while doing the work: the store is busy or unreachable, an I/O error.
    /// Exit code 1: trying again later may help.
    #[error("{0}")]
    Failed(String),
    /// Writing the output failed (e.g. the reader of a pipe went away). Exit code 1; the
    /// binary exits quietly with 0 when the pipe was closed (`durable runs list | head`).
    #[error("could not write the output: {0}")]
    Output(#[from] std::io::Error),
    /// The command was interrupted (Ctrl-C or SIGTERM) and stopped in an orderly way. Exit code
    /// 130.
    #[error("interrupted")]
    Interrupted,
}

impl Error {
    /// The process exit code: 2 for bad input, 1 for failures, 130 when interrupted.
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::BadInput(_) => 2,
            Error::Failed(_) | Error::Output(_) => 1,
            Error::Interrupted => 130,
        }
    }

    /// The message on one line (newlines in wrapped errors become spaces).
    pub fn one_line(&self) -> String {
        // Line by line: the spaces within a line (in a quoted id, say) stay as they are.
        self.to_string().lines().map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join(" ")
    }

    /// `name` as a message shows it: quoted when it has whitespace (which would otherwise read
    /// as part of the words around it: `run  c1 not found` for the id `" c1"`) or is empty.
    pub(crate) fn shown(name: &str) -> String {
        if name.is_empty() || name.chars().any(char::is_whitespace) { format!("{name:?}") } else { name.to_string() }
    }

    pub(crate) fn bad(message: impl Into<String>) -> Self {
        Error::BadInput(message.into())
    }

    pub(crate) fn failed(message: impl Into<String>) -> Self {
        Error::Failed(message.into())
    }
}

/// Whether an error of the SQLite store is about the file given (bad input) rather than a
/// failure while using it.
fn sqlite_is_bad_input(e: &SqliteError) -> bool {
    matches!(
        e,
        SqliteError::NotADatabase { .. }
            | SqliteError::InvalidPath { .. }
            | SqliteError::SchemaTooNew { .. }
            | SqliteError::SchemaTooOld { .. }
    )
}

impl From<SqliteError> for Error {
    fn from(e: SqliteError) -> Self {
        if sqlite_is_bad_input(&e) { Error::BadInput(e.to_string()) } else { Error::Failed(e.to_string()) }
    }
}

/// Whether an error of the PostgreSQL store is about the configuration given (the URL, the
/// database, the schema: bad input) rather than a failure while using it (a refused or lost
/// connection, a busy server: trying again may help).
fn postgres_is_bad_input(e: &PostgresError) -> bool {
    matches!(
        e,
        PostgresError::InvalidUrl { .. }
            | PostgresError::InvalidOptions { .. }
            | PostgresError::DatabaseNotFound { .. }
            | PostgresError::AuthFailed { .. }
            | PostgresError::SchemaTooNew { .. }
            | PostgresError::SchemaTooOld { .. }
            | PostgresError::SchemaNotFound { .. }
            | PostgresError::ForeignSchema { .. }
            | PostgresError::Tls { .. }
    )
}

impl From<PostgresError> for Error {
    fn from(e: PostgresError) -> Self {
        if postgres_is_bad_input(&e) { Error::BadInput(e.to_string()) } else { Error::Failed(e.to_string()) }
    }
}

impl From<StoreError> for Error {
    fn from(e: StoreError) -> Self {
        let bad = match &e {
            StoreError::NotFound { .. } => true,
            StoreError::Backend(source) => {
                source.downcast_ref::<SqliteError>().is_some_and(sqlite_is_bad_input)
                    || source.downcast_ref::<PostgresError>().is_some_and(postgres_is_bad_input)
            }
            _ => false,
        };
        if bad { Error::BadInput(e.to_string()) } else { Error::Failed(e.to_string()) }
    }
}

impl From<EngineError> for Error {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::Store(s) => s.into(),
            e @ (EngineError::UnknownWorkflow { .. }
            | EngineError::InvalidInput { .. }
            | EngineError::Serialize { .. }
            | EngineError::PayloadTooLarge { .. }
            | EngineError::InvalidName { .. }
            | EngineError::InvalidId(_)
            | EngineError::IdTaken { .. }
            | EngineError::RunNotFound(_)
            | EngineError::NotRetryable { .. }
            | EngineError::Compensated { .. }
            | EngineError::ScheduleNotFound { .. }
            | EngineError::BadSchedule { .. }
            | EngineError::StartTooLate { .. }) => Error::BadInput(e.to_string()),
            e => Error::Failed(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use durable::RunId;

    #[test]
    fn bad_input_exits_2_and_failures_1() {
        assert_eq!(Error::from(EngineError::RunNotFound(RunId::from("x"))).exit_code(), 2);
        assert_eq!(Error::from(EngineError::ScheduleNotFound { key: "x".into() }).exit_code(), 2);
        let not_db = SqliteError::NotADatabase { path: "f.db".into(), reason: "it is empty".into() };
        assert_eq!(Error::from(StoreError::Backend(Box::new(not_db))).exit_code(), 2);
        assert_eq!(Error::from(StoreError::unavailable("busy")).exit_code(), 1);
        let missing = PostgresError::DatabaseNotFound { target: "u@h:5432/d".into(), database: "d".into() };
        assert_eq!(Error::from(missing).exit_code(), 2);
        let refused = PostgresError::Connect { target: "u@h:5432/d".into(), reason: "refused".into(), source: None };
        assert_eq!(Error::from(refused).exit_code(), 1);
        assert_eq!(Error::Interrupted.exit_code(), 130);
    }

    #[test]
    fn messages_are_one_line() {
        assert_eq!(Error::bad("a\n  b c\n").one_line(), "a b c");
        // The spaces within a line stay: a quoted id keeps its own.
        assert_eq!(Error::bad(format!("run {} not found", Error::shown("a  b"))).one_line(), "run \"a  b\" not found");
    }
}
