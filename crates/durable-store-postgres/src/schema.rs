//! Connection settings and versioned migrations.

use tokio_postgres::Client;
use tokio_postgres::config::Host;

use crate::error::{Error, Result, query_error};
use crate::options::{PostgresOptions, quote_ident};

/// The schema version this build writes and reads. A schema with an older version is migrated
/// forward on connect (unless `migrate(false)`: [`Error::SchemaTooOld`]); one with a newer
/// version is refused ([`Error::SchemaTooNew`]).
pub const SCHEMA_VERSION: u32 = 24;

/// One step of the schema's history, applied in the same transaction as the row recording it.
struct Migration {
    version: u32,
    description: &'static str,
    /// A template: `__SCHEMA__` and `__LOCK_SEED__` are filled in by [`render`].
    sql: &'static str,
}

/// The whole history of the schema. Never edit an entry once released: add one (server-side
/// functions too: a changed function is a new migration with `CREATE OR REPLACE FUNCTION`).
const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        description: "runs, checkpoints, waiters, buffered signals and events, query state; server-side write functions",
        sql: include_str!("sql/v1.sql"),
    },
    Migration {
        version: 2,
        description: "run_queue: runs to execute (starts and wakes) for the store-backed transport",
        sql: include_str!("sql/v2.sql"),
    },
    Migration {
        version: 3,
        description: "commit skips the statements a commit's empty parts would run",
        sql: include_str!("sql/v3.sql"),
    },
    Migration {
        version: 4,
        description: "commit resets recovery_attempts when it records progress (checkpoints or a turn end)",
        sql: include_str!("sql/v4.sql"),
    },
    Migration {
        version: 5,
        description: "an index for every list_runs filter; the orphan scan by lease expiry, so step commits are HOT updates",
        sql: include_str!("sql/v5.sql"),
    },
    Migration {
        version: 6,
        description: "schedules, trigger buffers and publish dedupe ids; delayed starts (create_run stores start_at as wake_at, \
                      the pending and due scans split by it)",
        sql: include_str!("sql/v6.sql"),
    },
    Migration {
        version: 7,
        description: "remote steps: tasks (dispatched by commits, claimed, heartbeated, completed) and workers; \
                      the blocked run status is parked like suspended",
        sql: include_str!("sql/v7.sql"),
    },
    Migration {
        version: 8,
        description: "flow control: admission gates, slots and waiters; keyed starts, slot releases in commits, settles, \
                      cancels and deletes handing slots on; claims skip runs waiting for their key",
        sql: include_str!("sql/v8.sql"),
    },
    Migration {
        version: 9,
        description: "trace contexts: runs and tasks keep the W3C traceparent their spans join",
        sql: include_str!("sql/v9.sql"),
    },
    Migration {
        version: 10,
        description: "merging a run's queued wakes keeps a due-timer claim named in a dedupe key",
        sql: include_str!("sql/v10.sql"),
    },
    Migration {
        version: 11,
        description: "runs by workflow and status in the listing order, for list_runs filters and run_counts",
        sql: include_str!("sql/v11.sql"),
    },
    Migration {
        version: 12,
        description: "one lock order per batch: apply(ops, channel, locks) takes every advisory key of the batch, \
                      ascending, then the rows of the runs it delivers to, in id order (lock_batch)",
        sql: include_str!("sql/v12.sql"),
    },
    Migration {
        version: 13,
        description: "an enqueue drops the items the run's waiting item already covers (no lock, no write), \
                      and a merge that changes nothing writes nothing",
        sql: include_str!("sql/v13.sql"),
    },
    Migration {
        version: 14,
        description: "runs count the claims that acquired them (claims), so an engine can tell nobody else ran a run; \
                      claim_run reads the history from a seq on",
        sql: include_str!("sql/v14.sql"),
    },
    Migration {
        version: 15,
        description: "a step's commit in two statements (step_commit, no advisory key), and the SQL-language \
                      functions PL/pgSQL called, which were planned again at every call, in PL/pgSQL",
        sql: include_str!("sql/v15.sql"),
    },
    Migration {
        version: 16,
        description: "a worker's result claims the run it wakes in the same write of the run row \
                      (complete_task with a claim), and writes its checkpoint once",
        sql: include_str!("sql/v16.sql"),
    },
    Migration {
        version: 17,
        description: "every run the engine creates (children, successors, event and schedule starts, flushed \
                      buffers) takes its concurrency key; a successor takes over its predecessor's slot",
        sql: include_str!("sql/v17.sql"),
    },
    Migration {
        version: 18,
        description: "the admission gate rows a commit or a batch locks are locked in gate order up front: a commit's \
                      keyed children with the gates it releases (commit_ordered), a batch's gates with its keys \
                      (lock_batch); admission_acquire counts a queue only as far as its decision needs",
        sql: include_str!("sql/v18.sql"),
    },
    Migration {
        version: 19,
        description: "a run's settle with nothing but checkpoints, when it has no waiter, no admission slot or \
                      request and no unfinished task, in three statements (settle_commit)",
        sql: include_str!("sql/v19.sql"),
    },
    Migration {
        version: 20,
        description: "eager dispatch: a task dispatched to a worker beside its engine is written claimed by it, \
                      and wakes no other worker",
        sql: include_str!("sql/v20.sql"),
    },
    Migration {
        version: 21,
        description: "a claim that takes a run out of blocked drops its blocked error (a row trigger on the \
                      transition to running)",
        sql: include_str!("sql/v21.sql"),
    },
    Migration {
        version: 22,
        description: "a child's result for a parent that is gone, completed or cancelled is dropped, and \
                      deleting a run deletes its children's buffered results (a run given its id later took them)",
        sql: include_str!("sql/v22.sql"),
    },
    Migration {
        version: 23,
        description: "a signal sent with a claim claims the run it wakes in the same transaction (an engine \
                      signalling a run whose suspended turn it keeps in memory)",
        sql: include_str!("sql/v23.sql"),
    },
    Migration {
        version: 24,
        description: "a batch's delivery targets are found and locked by one index probe each (a batch of \
                      signals read every signal waiter, and scanned the runs, on a schema without statistics)",
        sql: include_str!("sql/v24.sql"),
    },
];

/// 64-bit FNV-1a: a stable hash (across builds and platforms) for advisory lock keys.
fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
}

/// The advisory lock every migration of `schema` holds, so concurrent engines never race.
fn migration_lock_key(schema: &str) -> i64 {
    fnv1a64(format!("durable-store-postgres:migrate:{schema}").as_bytes()) as i64
}

/// The seed of the signal-token and event-name lock keys of `schema`: two schemas in one
/// database never contend for each other's locks.
fn lock_seed(schema: &str) -> i64 {
    fnv1a64(format!("durable-store-postgres:tokens:{schema}").as_bytes()) as i64
}

/// A migration's SQL for `schema`.
fn render(sql: &str, schema: &str) -> String {
    sql.replace("__SCHEMA__", &quote_ident(schema)).replace("__LOCK_SEED__", &format!("({})", lock_seed(schema)))
}

/// The driver configuration for `url` with the store's settings applied.
pub(crate) fn config(url: &str, opts: &PostgresOptions) -> Result<tokio_postgres::Config> {
    let mut cfg: tokio_postgres::Config = url.parse().map_err(|e: tokio_postgres::Error| Error::InvalidUrl {
        reason: crate::error::describe(&e).trim_start_matches("invalid configuration: ").to_string(),
    })?;
    if cfg.get_hosts().is_empty() {
        return Err(Error::InvalidUrl { reason: "no host".into() });
    }
    match (&opts.application_name, cfg.get_application_name()) {
        (Some(name), _) => {
            cfg.application_name(name);
        }
        (None, None) => {
            cfg.application_name("durable");
        }
        (None, Some(_)) => {}
    }
    if cfg.get_connect_timeout().is_none() {
        cfg.connect_timeout(opts.connect_timeout);
    }
    if let Some(timeout) = opts.statement_timeout {
        let ms = timeout.as_millis().clamp(1, i32::MAX as u128);
        let options = match cfg.get_options() {
            Some(existing) if !existing.trim().is_empty() => format!("{existing} -c statement_timeout={ms}"),
            _ => format!("-c statement_timeout={ms}"),
        };
        cfg.options(&options);
    }
    // JIT compiles a statement the planner guesses costly (`jit_above_cost`) before running it:
    // 100-350 ms, for statements that read a few rows by index (a guess that high comes of
    // tables without statistics, a new schema or autovacuum off). Off, unless the URL's
    // `options` say otherwise.
    let existing = cfg.get_options().unwrap_or_default().trim().to_string();
    if !existing.contains("jit") {
        cfg.options(format!("{existing} -c jit=off").trim_start());
    }
    Ok(cfg)
}

/// `user@host:port/database` for messages (never the password).
pub(crate) fn target(cfg: &tokio_postgres::Config) -> String {
    let host = match cfg.get_hosts().first() {
        Some(Host::Tcp(h)) => h.clone(),
        Some(Host::Unix(path)) => path.display().to_string(),
        None => "(no host)".into(),
    };
    let more = if cfg.get_hosts().len() > 1 { ",…" } else { "" };
    let port = cfg.get_ports().first().copied().unwrap_or(5432);
    let user = cfg.get_user().unwrap_or("(default user)");
    let db = cfg.get_dbname().or(cfg.get_user()).unwrap_or("(default database)");
    format!("{user}@{host}:{port}{more}/{db}")
}

/// `user@host:port/database` as the server reports it (for a pool this crate did not build).
pub(crate) async fn server_target(client: &Client) -> String {
    let sql = "SELECT current_user::text, COALESCE(host(inet_server_addr()), 'local socket'), \
               COALESCE(inet_server_port(), 5432), current_database()::text";
    match client.query_one(sql, &[]).await {
        Ok(row) => {
            let get = |i| row.try_get::<_, String>(i).unwrap_or_default();
            let port: i32 = row.try_get(2).unwrap_or(5432);
            format!("{}@{}:{port}/{}", get(0), get(1), get(3))
        }
        Err(_) => "(server of the given pool)".into(),
    }
}

/// The schema version recorded in `schema`, `None` when it has no durable schema table.
async fn read_version(client: &Client, target: &str, schema: &str) -> Result<Option<u32>> {
    let table = format!("{}.schema_version", quote_ident(schema));
    let exists = client
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&table])
        .await
        .map_err(|e| query_error(target, "reading the schema version", e))?;
    if !exists.get::<_, bool>(0) {
        return Ok(None);
    }
    let row = client
        .query_one(&format!("SELECT COALESCE(max(version), 0) FROM {table}"), &[])
        .await
        .map_err(|e| query_error(target, "reading the schema version", e))?;
    let v: i32 = row.get(0);
    Ok(Some(u32::try_from(v).unwrap_or(0)))
}

/// Brings `schema` to [`SCHEMA_VERSION`], creating it if needed (and `create` allows), in one
/// transaction holding the schema's migration advisory lock (concurrent engines wait for each
/// other; a failed migration leaves everything as it was).
pub(crate) async fn migrate(client: &Client, target: &str, schema: &str, create: bool, upgrade: bool) -> Result<()> {
    // A quick look first, so connecting to an up-to-date schema takes no lock.
    match read_version(client, target, schema).await? {
        Some(v) if v == SCHEMA_VERSION => return Ok(()),
        Some(found) => check_version(target, schema, found, upgrade)?,
        None if !create => {
            // Say which: another program's schema (a worker would refuse it too), or none.
            return Err(match foreign_tables(client, target, schema).await? {
                Some(tables) => Error::ForeignSchema { target: target.into(), schema: schema.into(), tables },
                None => Error::SchemaNotFound { target: target.into(), schema: schema.into() },
            });
        }
        _ => {}
    }
    // The server's notices while the scripts run (`DROP … IF EXISTS` of what is not there yet)
    // are no news: only warnings get through.
    client
        .batch_execute("BEGIN; SET LOCAL client_min_messages = warning")
        .await
        .map_err(|e| query_error(target, "starting the schema migration", e))?;
    match migrate_locked(client, target, schema, upgrade).await {
        Ok(from) => {
            client
                .batch_execute("COMMIT")
                .await
                .map_err(|e| query_error(target, "committing the schema migration", e))?;
            if from < SCHEMA_VERSION {
                match from {
                    0 => tracing::info!(schema, version = SCHEMA_VERSION, %target, "created the durable schema"),
                    _ => {
                        tracing::info!(schema, from, to = SCHEMA_VERSION, %target, "migrated the durable schema; builds older than this one now refuse it")
                    }
                }
            }
            Ok(())
        }
        Err(e) => {
            let _ = client.batch_execute("ROLLBACK").await;
            Err(e)
        }
    }
}

/// The first tables (and views) of a schema without a durable schema version, if it has any:
/// another program's, which durable never initialises.
async fn foreign_tables(client: &Client, target: &str, schema: &str) -> Result<Option<String>> {
    let rows = client
        .query(
            "SELECT c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = $1 AND c.relkind IN ('r', 'p', 'v', 'm', 'f') ORDER BY 1 LIMIT 6",
            &[&schema],
        )
        .await
        .map_err(|e| query_error(target, "listing the schema's tables", e))?;
    let tables: Vec<String> = rows.iter().map(|r| r.get::<_, String>(0)).collect();
    Ok((!tables.is_empty()).then(|| tables.join(", ")))
}

/// Refuses a schema of version `found` this build cannot use: a newer build's
/// ([`Error::SchemaTooNew`]), or an older build's without `upgrade` ([`Error::SchemaTooOld`]).
fn check_version(target: &str, schema: &str, found: u32, upgrade: bool) -> Result<()> {
    let (target, schema, supported) = (target.to_string(), schema.to_string(), SCHEMA_VERSION);
    match found {
        v if v > SCHEMA_VERSION => Err(Error::SchemaTooNew { target, schema, found, supported }),
        v if v < SCHEMA_VERSION && !upgrade => Err(Error::SchemaTooOld { target, schema, found, supported }),
        _ => Ok(()),
    }
}

/// Migrates under the lock; the version the schema had (0: none). Without `upgrade`, a schema
/// an older build made meanwhile is refused (the transaction is rolled back).
async fn migrate_locked(client: &Client, target: &str, schema: &str, upgrade: bool) -> Result<u32> {
    let q = quote_ident(schema);
    client
        .execute("SELECT pg_advisory_xact_lock($1)", &[&migration_lock_key(schema)])
        .await
        .map_err(|e| query_error(target, "taking the migration lock", e))?;
    // Everything is read again under the lock: another engine may have migrated meanwhile.
    let schema_exists = client
        .query_one("SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)", &[&schema])
        .await
        .map_err(|e| query_error(target, "looking for the schema", e))?
        .get::<_, bool>(0);
    if !schema_exists {
        client
            .batch_execute(&format!("CREATE SCHEMA {q}"))
            .await
            .map_err(|e| query_error(target, &format!("creating schema {schema:?}"), e))?;
    }
    let from = match read_version(client, target, schema).await? {
        // An older build may have made the schema since the first look (a refusal rolls back).
        Some(found) => {
            check_version(target, schema, found, upgrade)?;
            found
        }
        None => {
            // No durable schema here: only an empty schema may be initialised, never one holding
            // another program's tables.
            if let Some(tables) = foreign_tables(client, target, schema).await? {
                return Err(Error::ForeignSchema { target: target.into(), schema: schema.into(), tables });
            }
            client
                .batch_execute(&format!(
                    "CREATE TABLE {q}.schema_version (
                        version     integer PRIMARY KEY,
                        description text NOT NULL,
                        applied_at  timestamptz NOT NULL DEFAULT now()
                    )"
                ))
                .await
                .map_err(|e| query_error(target, "creating the schema version table", e))?;
            0
        }
    };
    for m in MIGRATIONS.iter().filter(|m| m.version > from) {
        let doing = format!("migrating schema {schema:?} to version {}", m.version);
        client.batch_execute(&render(m.sql, schema)).await.map_err(|e| query_error(target, &doing, e))?;
        client
            .execute(
                &format!("INSERT INTO {q}.schema_version (version, description) VALUES ($1, $2)"),
                &[&(m.version as i32), &m.description],
            )
            .await
            .map_err(|e| query_error(target, &doing, e))?;
    }
    Ok(from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_are_ordered_and_end_at_the_schema_version() {
        for (i, m) in MIGRATIONS.iter().enumerate() {
            assert_eq!(m.version as usize, i + 1, "migration versions are 1, 2, … without gaps");
        }
        assert_eq!(MIGRATIONS.last().map(|m| m.version), Some(SCHEMA_VERSION));
    }

    #[test]
    fn rendering_fills_every_placeholder() {
        let sql = render(MIGRATIONS[0].sql, "My \"Schema\"");
        assert!(!sql.contains("__SCHEMA__") && !sql.contains("__LOCK_SEED__"));
        assert!(sql.contains("\"My \"\"Schema\"\"\".runs"));
    }

    #[test]
    fn lock_keys_are_stable_and_per_schema() {
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_ne!(lock_seed("a"), lock_seed("b"));
        assert_ne!(migration_lock_key("a"), lock_seed("a"));
    }

    #[test]
    fn config_applies_the_options() {
        let opts = PostgresOptions::new().statement_timeout(Some(std::time::Duration::from_secs(2)));
        let cfg = config("postgres://u:secret@db.example:6543/app?options=-c%20search_path%3Dx", &opts).unwrap();
        assert_eq!(cfg.get_application_name(), Some("durable"));
        assert_eq!(cfg.get_options(), Some("-c search_path=x -c statement_timeout=2000 -c jit=off"));
        assert_eq!(target(&cfg), "u@db.example:6543/app");
        let cfg = config("postgres://u@h/d?application_name=mine", &PostgresOptions::new()).unwrap();
        assert_eq!(cfg.get_application_name(), Some("mine"));
        assert_eq!(cfg.get_options(), Some("-c statement_timeout=30000 -c jit=off"));
        let cfg = config("postgres://u@h/d?options=-c%20jit%3Don", &PostgresOptions::new().statement_timeout(None));
        assert_eq!(cfg.unwrap().get_options(), Some("-c jit=on"), "the URL's own jit stands");
        let err = config("postgres://u:secret@h:notaport/d", &opts).unwrap_err().to_string();
        assert!(err.starts_with("invalid PostgreSQL URL") && !err.contains("secret"), "{err}");
        assert!(config("postgres:///d", &opts).unwrap_err().to_string().contains("no host"));
    }
}
