//! Turning the store flags into a store, and the engine operator commands use.

use std::sync::Arc;

use durable::store::Store;
use durable::transport::ControlPlane;
use durable::{
    Durability, Engine, PostgresError, PostgresOptions, PostgresStore, SqliteError, SqliteOptions, SqliteStore,
};

use crate::cli::StoreArgs;
use crate::error::{Error, Result};

/// What a command may do to the database as it opens it: create it, migrate it, or neither.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    /// Operator commands: only an existing durable database of this build's schema version is
    /// opened; a missing or empty file (or a PostgreSQL schema without durable's tables) is
    /// refused and nothing is created, and so is one an older durable wrote (looking must not
    /// upgrade a fleet's database: `durable migrate` does).
    Existing,
    /// `durable migrate`: an existing durable database, migrated to this build's version.
    Migrate,
    /// The demo (a worker): a missing file (or schema) is created and initialised.
    CreateIfMissing,
}

impl StoreArgs {
    /// Where the runs are, for messages: the file, or the PostgreSQL URL without its password
    /// (and without its parameters, which may hold one) and the schema.
    pub(crate) fn describe(&self) -> String {
        match &self.url {
            None => self.db.display().to_string(),
            Some(url) => format!("{} (schema {:?})", redact(url), self.schema),
        }
    }

    /// Opens the store the flags name.
    pub(crate) async fn open(&self, access: Access) -> Result<Arc<dyn Store>> {
        Ok(self.open_with_events(access).await?.store)
    }

    /// Opens the store the flags name, with its control plane when it has one (PostgreSQL:
    /// an engine on it hears the events of the other engines on the schema at once).
    pub(crate) async fn open_with_events(&self, access: Access) -> Result<Opened> {
        if let Some(url) = &self.url {
            let store = PostgresStore::connect_with(url, self.postgres_options(access)).await?;
            let plane: Option<Arc<dyn ControlPlane>> = match access {
                Access::Existing => Some(Arc::new(store.control_plane().await?)),
                Access::Migrate | Access::CreateIfMissing => None,
            };
            return Ok(Opened { store: Arc::new(store), plane });
        }
        let store = SqliteStore::open_with(&self.db, Self::sqlite_options(access)).map_err(sqlite_open_error)?;
        Ok(Opened { store: Arc::new(store), plane: None })
    }

    /// The options `access` opens the PostgreSQL schema with.
    fn postgres_options(&self, access: Access) -> PostgresOptions {
        let options = PostgresOptions::new().schema(&self.schema).application_name("durable-cli");
        match access {
            // One short-lived command (or `durable serve`): two connections are plenty, the
            // writer's one batch at a time and a reader.
            Access::Existing => options.create_if_missing(false).migrate(false).pool_size(2).write_connections(1),
            Access::Migrate => options.create_if_missing(false).pool_size(2).write_connections(1),
            Access::CreateIfMissing => options.pool_size(8),
        }
    }

    /// The options `access` opens the SQLite file with.
    fn sqlite_options(access: Access) -> SqliteOptions {
        match access {
            // One short-lived command: one reader is plenty.
            Access::Existing => SqliteOptions::new().create_if_missing(false).migrate(false).readers(1),
            Access::Migrate => SqliteOptions::new().create_if_missing(false).readers(1),
            // The demo shows throughput, and a crash (kill -9) still loses nothing with
            // `Normal`; only a power loss could lose the last commits of a demo.
            Access::CreateIfMissing => SqliteOptions::new().durability(Durability::Normal),
        }
    }
}

/// `durable migrate`: brings the database to this build's schema version, saying from which.
pub(crate) async fn migrate(args: &StoreArgs, out: &mut dyn std::io::Write) -> Result<()> {
    // A look that migrates nothing first: it says whether there is anything to do, and from
    // which version.
    let older = match &args.url {
        Some(url) => match PostgresStore::connect_with(url, args.postgres_options(Access::Existing)).await {
            Ok(_) => None,
            Err(PostgresError::SchemaTooOld { found, supported, .. }) => Some((found, supported)),
            Err(e) => return Err(e.into()),
        },
        None => match SqliteStore::open_with(&args.db, StoreArgs::sqlite_options(Access::Existing)) {
            Ok(_) => None,
            Err(SqliteError::SchemaTooOld { found, supported, .. }) => Some((found, supported)),
            Err(e) => return Err(sqlite_open_error(e)),
        },
    };
    match older {
        None => writeln!(out, "{} is at this build's durable schema version: nothing to migrate", args.describe())?,
        Some((found, supported)) => {
            args.open(Access::Migrate).await?;
            writeln!(
                out,
                "migrated {} from durable schema version {found} to {supported}; builds older than this one now \
                 refuse it",
                args.describe()
            )?;
        }
    }
    Ok(())
}

/// A store, and its control plane when it has one.
pub(crate) struct Opened {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) plane: Option<Arc<dyn ControlPlane>>,
}

impl From<Arc<dyn Store>> for Opened {
    fn from(store: Arc<dyn Store>) -> Self {
        Opened { store, plane: None }
    }
}

/// An error opening the SQLite file is about the path as given (exit 2: a missing directory, a
/// parent that is a file, no permission, not a durable database, a newer or an older schema), unless
/// trying again may pass: another writer held the lock too long, or the store's threads
/// stopped (exit 1). Errors later, while a command works, keep their own classification.
fn sqlite_open_error(e: SqliteError) -> Error {
    match e {
        SqliteError::Busy { .. } | SqliteError::Stopped { .. } => Error::failed(e.to_string()),
        e => Error::bad(e.to_string()),
    }
}

/// `postgres://user:secret@host/db?password=x` → `postgres://user@host/db`; a URL in libpq's
/// `key=value` form is not shown at all (it may hold `password=`).
fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "PostgreSQL".into();
    };
    let rest = rest.split('?').next().unwrap_or_default();
    let (authority, path) = rest.split_once('/').map_or((rest, ""), |(a, p)| (a, p));
    let authority = match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split(':').next().unwrap_or_default();
            format!("{user}@{host}")
        }
        None => authority.to_string(),
    };
    if path.is_empty() { format!("{scheme}://{authority}") } else { format!("{scheme}://{authority}/{path}") }
}

/// Runs `f` with a client engine on `store`: it executes nothing itself.
///
/// Why an engine and not the store alone: `retry`, `cancel` and `signal` are engine logic
/// (history truncation and retried children, recursive cancels that notify parents, payload
/// checks and limits) that must not be written twice. A client engine
/// ([`EngineBuilder::client_only`](durable::EngineBuilder::client_only)) runs no pollers and
/// never claims a run: the runs an operation wakes are left to the workers that have their
/// workflows registered.
///
/// With a control plane (`durable serve` on PostgreSQL), the engine hears the events of the
/// engines that execute the runs, at once.
pub(crate) async fn with_operator_engine<T, F, Fut>(store: impl Into<Opened>, f: F) -> Result<T>
where
    F: FnOnce(Engine) -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let Opened { store, plane } = store.into();
    let mut builder = Engine::builder().shared_store(store).client_only();
    if let Some(plane) = plane {
        builder = builder.control_plane(plane);
    }
    let engine = builder.build()?;
    let result = f(engine.clone()).await;
    engine.shutdown().await;
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_shown_without_passwords() {
        assert_eq!(redact("postgres://u:s3cret@db:5433/app?password=x"), "postgres://u@db:5433/app");
        assert_eq!(redact("postgresql://db/app"), "postgresql://db/app");
        assert_eq!(redact("postgres://u@db"), "postgres://u@db");
        assert_eq!(redact("host=db password=s3cret"), "PostgreSQL");
    }
}
