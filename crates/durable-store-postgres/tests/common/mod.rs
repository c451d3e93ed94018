//! Shared by the integration tests: the workspace's PostgreSQL test support (the server from
//! `DURABLE_PG_URL` or a one-line skip, a scratch schema per test), lock probes, a run builder.
#![allow(dead_code, unreachable_pub, unused_imports)]

use durable_core::{NewRun, Payload, RunId};
use durable_store_postgres::deadpool_postgres::tokio_postgres;
pub use durable_store_postgres::test_support::{ScratchSchema, url_or_skip, with_database};

/// Waits until one of this test's store connections waits on a lock (true), for at most 60 s
/// (false: a hang guard, not a timing assertion). Nothing announces a lock wait, so it looks at
/// `pg_stat_activity` every 5 ms.
pub async fn parked_on_a_lock(scratch: &ScratchSchema, admin: &tokio_postgres::Client) -> bool {
    parked_on_locks(scratch, admin, 1).await
}

/// [`parked_on_a_lock`] for `n` connections at once.
pub async fn parked_on_locks(scratch: &ScratchSchema, admin: &tokio_postgres::Client, n: i64) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while std::time::Instant::now() < deadline {
        let row = admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'",
                &[&scratch.application_name()],
            )
            .await
            .expect("read pg_stat_activity");
        if row.get::<_, i64>(0) >= n {
            return true;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    false
}

/// Takes the transaction-scoped advisory lock of signal token `token` on `admin`, in a
/// transaction left open (end it with `COMMIT` or `ROLLBACK`): writes touching the token wait
/// for it.
pub async fn hold_token_lock(scratch: &ScratchSchema, admin: &tokio_postgres::Client, token: &str) {
    let key: i64 = admin
        .query_one(&format!("SELECT \"{}\".lock_key('signal', $1)", scratch.name()), &[&token])
        .await
        .expect("lock key")
        .get(0);
    admin.batch_execute("BEGIN").await.expect("begin");
    admin.execute("SELECT pg_advisory_xact_lock($1)", &[&key]).await.expect("advisory lock");
}

pub const T0: u64 = 1_700_000_000_000;

pub fn new_run(id: &str) -> NewRun {
    NewRun {
        trace_context: None,
        admission: None,
        id: RunId::from(id),
        workflow: "wf".into(),
        version: 1,
        namespace: "default".into(),
        input: Payload::from_trusted(format!("{{\"run\":{id:?}}}")),
        tags: Vec::new(),
        priority: 0,
        parent: None,
        created_at: T0,
        start_at: None,
    }
}

/// Takes a schema of this build back to version 14: the version rows of 15 and on (the
/// functions they created or replaced keep their text: migrating forward replaces them again).
pub async fn undo_version_15(admin: &tokio_postgres::Client, schema: &str) {
    let s = format!("\"{schema}\"");
    admin
        .batch_execute(&format!("DELETE FROM {s}.schema_version WHERE version >= 15"))
        .await
        .expect("undo schema version 15");
}

/// Takes schema version 7 back out of `schema` (its tables and new functions, the indexes as
/// versions 5 and 6 made them, its version row), leaving the schema as version 6 left it but for
/// the functions version 7 replaced, which re-running it writes anyway: for the tests of
/// migrating older schemas forward.
/// Takes a schema of this build back to version 13: the claim count column and the version row
/// (`claim_run` keeps its version 14 text: migrating forward replaces it again).
pub async fn undo_version_14(admin: &tokio_postgres::Client, schema: &str) {
    let s = format!("\"{schema}\"");
    admin
        .batch_execute(&format!(
            "ALTER TABLE {s}.runs DROP COLUMN claims;
             DELETE FROM {s}.schema_version WHERE version >= 14"
        ))
        .await
        .expect("undo schema version 14");
}

/// Takes a schema of this build back to version 12: the version row (the functions version 13
/// replaced keep their version 13 text: migrating forward replaces them again).
pub async fn undo_version_13(admin: &tokio_postgres::Client, schema: &str) {
    let s = format!("\"{schema}\"");
    admin
        .batch_execute(&format!("DELETE FROM {s}.schema_version WHERE version >= 13"))
        .await
        .expect("undo schema version 13");
}

/// Takes a schema of this build back to version 11: the three-argument `apply`, `lock_batch`
/// and the version row.
pub async fn undo_version_12(admin: &tokio_postgres::Client, schema: &str) {
    let s = format!("\"{schema}\"");
    admin
        .batch_execute(&format!(
            "DROP FUNCTION {s}.apply(jsonb, text, jsonb), {s}.lock_batch(jsonb);
             DELETE FROM {s}.schema_version WHERE version >= 12"
        ))
        .await
        .expect("undo schema version 12");
}

/// Takes a schema of this build back to version 10: the workflow-and-status index and the
/// version row.
pub async fn undo_version_11(admin: &tokio_postgres::Client, schema: &str) {
    let s = format!("\"{schema}\"");
    admin
        .batch_execute(&format!(
            "DROP INDEX {s}.runs_workflow_status_created;
             DELETE FROM {s}.schema_version WHERE version >= 11"
        ))
        .await
        .expect("undo schema version 11");
}

/// Takes a schema of this build back to version 8: the trace context columns and the version
/// row (the functions version 9 replaced keep their version 9 text: migrating forward replaces
/// them again).
pub async fn undo_version_9(admin: &tokio_postgres::Client, schema: &str) {
    let s = format!("\"{schema}\"");
    admin
        .batch_execute(&format!(
            "ALTER TABLE {s}.runs DROP COLUMN trace_context;
             ALTER TABLE {s}.tasks DROP COLUMN trace_context;
             DELETE FROM {s}.schema_version WHERE version >= 9"
        ))
        .await
        .expect("undo schema version 9");
}

/// Takes a schema of this build back to version 7 (the functions version 8 replaced keep their
/// version 8 text: migrating forward replaces them again).
pub async fn undo_version_8(admin: &tokio_postgres::Client, schema: &str) {
    let s = format!("\"{schema}\"");
    admin
        .batch_execute(&format!(
            "DROP FUNCTION {s}.admission_capacity(jsonb, bigint, bigint), {s}.admission_roll({s}.admission_gates, bigint),
                 {s}.admission_admitted({s}.admission_gates, bigint), {s}.admission_save({s}.admission_gates),
                 {s}.admission_live(text, bigint), {s}.admission_head(text),
                 {s}.admission_ahead(text, bigint, bigint, bigint), {s}.admission_key_round(text, text),
                 {s}.admission_gates_of(text), {s}.admission_lock(text[]), {s}.admission_hand_off(text, bigint),
                 {s}.admission_release(text, text, bigint), {s}.admission_release_run(text, bigint),
                 {s}.admission_wake(jsonb, bigint), {s}.admission_runs(jsonb), {s}.admission_acquire(jsonb),
                 {s}.acquire_slot(jsonb), {s}.release_slot(jsonb), {s}.create_admitted(jsonb, jsonb),
                 {s}.create_runs(jsonb), {s}.complete_task_admitted(jsonb);
             DROP TABLE {s}.admission_gates, {s}.admission_slots, {s}.admission_waiters;
             DELETE FROM {s}.schema_version WHERE version >= 8"
        ))
        .await
        .expect("undo schema version 8");
}

pub async fn undo_version_7(admin: &tokio_postgres::Client, schema: &str) {
    let s = format!("\"{schema}\"");
    admin
        .batch_execute(&format!(
            "DROP TABLE {s}.tasks, {s}.workers;
             DROP FUNCTION {s}.wake_run(text, bigint), {s}.notify_tasks(text), {s}.finish_tasks_of(text),
                 {s}.dispatch_tasks(jsonb), {s}.complete_task(jsonb), {s}.heartbeat_task(jsonb),
                 {s}.release_tasks(jsonb, text);
             DROP INDEX {s}.runs_due, {s}.runs_active_created;
             CREATE INDEX runs_due ON {s}.runs (wake_at, id)
                 WHERE status IN ('suspended', 'pending') AND wake_at IS NOT NULL;
             CREATE INDEX runs_active_created ON {s}.runs (created_at DESC, id DESC)
                 WHERE status IN ('pending', 'running', 'suspended');
             DELETE FROM {s}.schema_version WHERE version >= 7"
        ))
        .await
        .expect("undo schema version 7");
}

/// Takes schema version 6 back out of `schema` (its tables and functions, the poller indexes as
/// version 1 made them, its version row), leaving the schema as version 5 left it but for the
/// functions version 6 replaced (`create_run`, `apply`), which re-running it writes anyway: for
/// the tests of migrating older schemas forward.
pub async fn undo_version_6(admin: &tokio_postgres::Client, schema: &str) {
    let s = format!("\"{schema}\"");
    admin
        .batch_execute(&format!(
            "DROP FUNCTION {s}.publish(jsonb), {s}.flush_buffer(jsonb), {s}.gather(jsonb, text, bigint),
                 {s}.buffer_run({s}.trigger_buffers, text, bigint), {s}.delete_schedule(jsonb),
                 {s}.save_schedule(jsonb), {s}.saturating_add(bigint, numeric), {s}.create_started(jsonb, boolean);
             DROP TABLE {s}.event_dedupe, {s}.trigger_buffer_payloads, {s}.trigger_buffers, {s}.schedules;
             DROP INDEX {s}.runs_pending, {s}.runs_due;
             CREATE INDEX runs_pending ON {s}.runs (priority DESC, created_at, id) WHERE status = 'pending';
             CREATE INDEX runs_due ON {s}.runs (wake_at, id) WHERE status = 'suspended';
             DELETE FROM {s}.schema_version WHERE version >= 6"
        ))
        .await
        .expect("undo schema version 6");
}

/// Takes schema version 5 back out of `schema` (its indexes, the fill factor, its version row),
/// leaving the schema as version 4 left it: for the tests of migrating older schemas forward.
pub async fn undo_version_5(admin: &tokio_postgres::Client, schema: &str) {
    let s = format!("\"{schema}\"");
    admin
        .batch_execute(&format!(
            "DROP INDEX {s}.runs_settled_created, {s}.runs_active_created, {s}.runs_workflow_created,
                 {s}.runs_namespace_created, {s}.runs_parent_created, {s}.runs_orphaned;
             CREATE INDEX runs_parent ON {s}.runs (parent_id) WHERE parent_id IS NOT NULL;
             CREATE INDEX runs_running ON {s}.runs (updated_at, id) WHERE status = 'running';
             ALTER TABLE {s}.runs RESET (fillfactor);
             DELETE FROM {s}.schema_version WHERE version >= 5"
        ))
        .await
        .expect("undo schema version 5");
}
