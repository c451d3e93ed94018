//! Bad configuration fails on connect with one clear line naming the server (never the
//! password): a malformed URL, a refused connection, a missing database, a schema from a newer
//! build, a schema holding someone else's tables. And concurrent engines migrating one fresh
//! schema do not race; an older schema is migrated forward with its runs.

mod common;

use std::sync::Arc;

use common::{ScratchSchema, new_run, url_or_skip, with_database};
use durable_core::{
    Checkpoint, CheckpointStatus, Claim, ClaimOutcome, Commit, ParentLink, Payload, RunFilter, RunId, RunPatch,
    RunQuery, RunStatus, StepKind, Store, TurnEnd,
};
use durable_store_postgres::deadpool_postgres::tokio_postgres::Client;
use durable_store_postgres::{Error, PostgresOptions, PostgresStore, SCHEMA_VERSION};

#[track_caller]
fn assert_one_line(e: &Error) -> String {
    let msg = e.to_string();
    assert!(!msg.contains('\n'), "the error is one line: {msg:?}");
    assert!(!msg.contains("s3cret"), "the error never shows the password: {msg}");
    msg
}

#[tokio::test]
async fn malformed_url_is_a_clear_error() {
    for url in ["postgres://u:s3cret@db.example:notaport/app", "postgres://u:s3cret@h/d?sslmode=sometimes", ""] {
        let e = PostgresStore::connect(url).await.expect_err(url);
        let msg = assert_one_line(&e);
        assert!(matches!(e, Error::InvalidUrl { .. }), "{url:?}: {e:?}");
        assert!(msg.starts_with("invalid PostgreSQL URL"), "{msg}");
        assert!(!e.is_retryable());
    }
    // Another scheme, or neither form: said so, not "unexpected EOF".
    for (url, says) in [("mysql://u:s3cret@h/d", "the scheme is mysql://"), ("notaurl", "neither a postgres:// URL")] {
        let e = PostgresStore::connect(url).await.expect_err(url);
        let msg = assert_one_line(&e);
        assert!(matches!(e, Error::InvalidUrl { .. }) && msg.contains(says), "{url:?}: {msg}");
    }
}

/// `url` with `params` (`k=v&k=v`) added to its query.
fn with_params(url: &str, params: &str) -> String {
    format!("{url}{}{params}", if url.contains('?') { '&' } else { '?' })
}

/// The server's certificate file when it has TLS on (Debian's PostgreSQL has, with its
/// `ssl-cert-snakeoil` certificate for `localhost`); `None`, and a line saying so, when not.
async fn server_tls(admin: &Client, test: &str) -> Option<String> {
    let on: String = admin.query_one("SHOW ssl", &[]).await.expect("show ssl").get(0);
    if on != "on" {
        println!("{test}: skipped, the server has TLS off (ssl = {on}); turn it on to run this test");
        return None;
    }
    Some(admin.query_one("SHOW ssl_cert_file", &[]).await.expect("show ssl_cert_file").get(0))
}

/// How many of the store's connections (by application name) the server has, and how many of
/// them are encrypted.
async fn encrypted(admin: &Client, application_name: &str) -> (i64, i64) {
    let row = admin
        .query_one(
            "SELECT count(*), count(*) FILTER (WHERE s.ssl) FROM pg_stat_activity a \
             JOIN pg_stat_ssl s USING (pid) WHERE a.application_name = $1",
            &[&application_name],
        )
        .await
        .expect("read pg_stat_ssl");
    (row.get(0), row.get(1))
}

/// `sslmode=require` encrypts every connection of the store, its pool's and its `LISTEN`
/// connection alike; a URL without `sslmode` stays plain, as before.
#[tokio::test]
async fn sslmode_require_encrypts_every_connection_of_the_store() {
    let Some(url) = url_or_skip("sslmode_require_encrypts_every_connection_of_the_store") else { return };
    let admin = common::ScratchSchema::new(&url, "tls").await.expect("scratch");
    let client = admin.client().await.expect("admin client");
    if server_tls(&client, "sslmode_require_encrypts_every_connection_of_the_store").await.is_none() {
        return;
    }
    let app = admin.application_name();
    let options = admin.options().notify_channel("durable_tls_test");
    let store = PostgresStore::connect_with(&with_params(&url, "sslmode=require"), options).await.unwrap();
    store.create_run(new_run("tls-run")).await.expect("a write over TLS");
    assert_eq!(store.get_run(&RunId::new("tls-run")).await.unwrap().unwrap().id.as_str(), "tls-run");
    store.queue_wakeups().await.expect("a LISTEN connection over TLS");
    let (all, tls) = encrypted(&client, &app).await;
    assert!(all >= 2, "the pool's and the listener's connections: {all}");
    assert_eq!(tls, all, "every connection is encrypted");
    drop(store);

    // Without sslmode: plain, as before.
    let plain = admin.connect().await.unwrap();
    plain.get_run(&RunId::new("tls-run")).await.unwrap().expect("the same data");
    let (all, tls) = encrypted(&client, &app).await;
    assert!(all >= 1 && tls < all, "the plain store's connection is not encrypted: {tls} of {all}");
}

/// The store's connections run with JIT off (a statement the planner guesses costly, as on a
/// table without statistics, was compiled for 100-350 ms before it read its few rows), unless
/// the URL's `options` set `jit`.
#[tokio::test]
async fn the_stores_connections_run_without_jit_unless_the_url_says() {
    let Some(url) = url_or_skip("the_stores_connections_run_without_jit_unless_the_url_says") else { return };
    let scratch = common::ScratchSchema::new(&url, "jit").await.expect("scratch");
    let jit = |store: PostgresStore| async move {
        let client = store.pool().get().await.unwrap();
        let row = client.query_one("SELECT current_setting('jit'), current_setting('statement_timeout')", &[]);
        let row = row.await.unwrap();
        (row.get::<_, String>(0), row.get::<_, String>(1))
    };
    let store = PostgresStore::connect_with(&url, scratch.options()).await.unwrap();
    assert_eq!(jit(store).await, ("off".to_string(), "30s".to_string()), "JIT off, the statement timeout kept");
    let store = PostgresStore::connect_with(&with_params(&url, "options=-c%20jit%3Don"), scratch.options()).await;
    assert_eq!(jit(store.unwrap()).await.0, "on", "the URL's own setting stands");
}

/// `verify-ca` and `verify-full` check the server's certificate against the CA file
/// `sslrootcert` names (or the system's CAs), `verify-full` its host name too. A refusal is
/// one clear line naming what to fix, and not retryable.
#[tokio::test]
async fn verify_ca_and_verify_full_check_the_servers_certificate() {
    let test = "verify_ca_and_verify_full_check_the_servers_certificate";
    let Some(url) = url_or_skip(test) else { return };
    let admin = common::ScratchSchema::new(&url, "tlsverify").await.expect("scratch");
    let client = admin.client().await.expect("admin client");
    let Some(cert) = server_tls(&client, test).await else { return };
    let root = format!("sslrootcert={cert}");

    // The public CAs of the system's bundle did not sign a self-signed certificate.
    let bundle = "/etc/ssl/certs/ca-certificates.crt";
    if std::path::Path::new(bundle).exists() {
        let untrusted = with_params(&url, &format!("sslmode=verify-ca&sslrootcert={bundle}"));
        let e = PostgresStore::connect_with(&untrusted, admin.options()).await.expect_err("an untrusted certificate");
        let msg = assert_one_line(&e);
        assert!(msg.contains("certificate") && msg.contains("sslrootcert"), "{msg}");
        assert!(!e.is_retryable(), "retrying does not make a certificate trusted: {e:?}");
    }

    // Signed by the CA given (the certificate itself), but for `localhost`, not 127.0.0.1:
    // verify-ca takes it, verify-full does not.
    let ca = with_params(&url, &format!("sslmode=verify-ca&{root}"));
    let store = PostgresStore::connect_with(&ca, admin.options()).await.expect("verify-ca with the server's CA");
    store.create_run(new_run("verified")).await.expect("a write over verified TLS");
    drop(store);
    // Debian makes its certificate for the machine's name: `localhost` here, checked.
    let for_localhost = {
        use rustls::pki_types::{CertificateDer, pem::PemObject};
        let der = CertificateDer::from_pem_file(&cert).expect("the server's certificate");
        der.windows(9).any(|w| w == b"localhost")
    };
    let host_url = url.replacen("127.0.0.1", "localhost", 1);
    if host_url != url && for_localhost {
        let e =
            PostgresStore::connect_with(&with_params(&url, &format!("sslmode=verify-full&{root}")), admin.options())
                .await
                .expect_err("the certificate is not for 127.0.0.1");
        let msg = assert_one_line(&e);
        assert!(msg.contains("certificate") && msg.contains("127.0.0.1"), "{msg}");
        assert!(!e.is_retryable());
        let full = with_params(&host_url, &format!("sslmode=verify-full&{root}"));
        let store = PostgresStore::connect_with(&full, admin.options())
            .await
            .expect("verify-full with the server's CA, by the certificate's host name");
        store.get_run(&RunId::new("verified")).await.unwrap().expect("the same data");
    }

    // A CA file that is not there.
    let e = PostgresStore::connect_with(
        &with_params(&url, "sslmode=verify-ca&sslrootcert=/nonexistent/ca.pem"),
        admin.options(),
    )
    .await
    .expect_err("no such file");
    let msg = assert_one_line(&e);
    assert!(matches!(e, Error::InvalidUrl { .. }) && msg.contains("/nonexistent/ca.pem"), "{msg}");
}

#[tokio::test]
async fn invalid_options_are_refused_before_connecting() {
    let e = PostgresStore::connect_with("postgres://u@127.0.0.1:1/d", PostgresOptions::new().schema("")).await;
    let e = e.expect_err("an empty schema name is refused");
    assert!(matches!(e, Error::InvalidOptions { .. }), "{e:?}");
    assert_one_line(&e);
}

#[tokio::test]
async fn refused_connection_is_a_clear_retryable_error() {
    // Port 1 on loopback: nothing listens there.
    let e = PostgresStore::connect("postgres://postgres:s3cret@127.0.0.1:1/test").await.expect_err("refused");
    let msg = assert_one_line(&e);
    assert!(matches!(e, Error::Connect { .. }), "{e:?}");
    assert!(msg.contains("postgres@127.0.0.1:1/test") && msg.contains("refused"), "{msg}");
    assert!(e.is_retryable(), "the server may come up later");
}

#[test]
fn connecting_outside_a_tokio_runtime_is_a_clear_error() {
    // A minimal executor that is not tokio.
    use std::sync::Arc as StdArc;
    use std::task::{Context, Poll, Wake, Waker};
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: StdArc<Self>) {
            self.0.unpark()
        }
    }
    let waker = Waker::from(StdArc::new(Unpark(std::thread::current())));
    let mut fut = std::pin::pin!(PostgresStore::connect("postgres://postgres@127.0.0.1:1/test"));
    let e = loop {
        if let Poll::Ready(r) = fut.as_mut().poll(&mut Context::from_waker(&waker)) {
            break r.expect_err("no runtime");
        }
        std::thread::park();
    };
    assert!(matches!(e, Error::NoRuntime), "{e:?}");
    assert_one_line(&e);
}

#[tokio::test]
async fn missing_database_is_a_clear_error() {
    let Some(url) = url_or_skip("missing_database_is_a_clear_error") else { return };
    let db = format!("durable_no_such_db_{}", std::process::id());
    let e = PostgresStore::connect(&with_database(&url, &db)).await.expect_err("no such database");
    let msg = assert_one_line(&e);
    assert!(matches!(&e, Error::DatabaseNotFound { database, .. } if *database == db), "{e:?}");
    assert!(msg.contains(&db) && msg.contains("does not exist"), "{msg}");
    assert!(!e.is_retryable());
}

#[tokio::test]
async fn newer_schema_is_refused_naming_both_versions() {
    let Some(url) = url_or_skip("newer_schema_is_refused_naming_both_versions") else { return };
    let scratch = ScratchSchema::new(&url, "newer").await.unwrap();
    drop(scratch.connect().await.unwrap());
    let admin = scratch.client().await.unwrap();
    admin
        .execute(
            &format!(
                "INSERT INTO \"{}\".schema_version (version, description) VALUES (99, 'from the future')",
                scratch.name()
            ),
            &[],
        )
        .await
        .unwrap();
    let e = PostgresStore::connect_with(&url, scratch.options()).await.expect_err("schema 99 is refused");
    let msg = assert_one_line(&e);
    match &e {
        Error::SchemaTooNew { found, supported, schema, .. } => {
            assert_eq!((*found, *supported), (99, SCHEMA_VERSION));
            assert_eq!(schema, &scratch.name());
        }
        other => panic!("expected SchemaTooNew, got {other:?}"),
    }
    assert!(msg.contains("version 99") && msg.contains(&format!("version {SCHEMA_VERSION}")), "{msg}");
    // Nothing was changed: the version row is still there, once.
    let n: i64 = admin
        .query_one(&format!("SELECT count(*) FROM \"{}\".schema_version WHERE version = 99", scratch.name()), &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 1);
}

/// Told not to migrate (`migrate(false)`, as the command line's operator commands connect), an
/// older schema is refused naming both versions and `durable migrate`, and left as it is; a
/// store allowed to migrates it.
#[tokio::test]
async fn an_older_schema_is_refused_without_migrate_and_left_as_it_is() {
    let Some(url) = url_or_skip("an_older_schema_is_refused_without_migrate_and_left_as_it_is") else { return };
    let scratch = ScratchSchema::new(&url, "older").await.unwrap();
    drop(scratch.connect().await.unwrap());
    let admin = scratch.client().await.unwrap();
    let version = async || -> i32 {
        let q = format!("SELECT max(version) FROM \"{}\".schema_version", scratch.name());
        admin.query_one(&q, &[]).await.unwrap().get(0)
    };
    // The last migration's scripts replace what they define: running it again is harmless.
    let q = format!("DELETE FROM \"{}\".schema_version WHERE version = {SCHEMA_VERSION}", scratch.name());
    admin.execute(&q, &[]).await.unwrap();
    let e = PostgresStore::connect_with(&url, scratch.options().migrate(false)).await.expect_err("older");
    let msg = assert_one_line(&e);
    assert!(
        matches!(&e, Error::SchemaTooOld { found, supported, .. } if (*found, *supported) == (SCHEMA_VERSION - 1, SCHEMA_VERSION)),
        "{e:?}"
    );
    assert!(msg.contains("durable migrate") && !e.is_retryable(), "{msg}");
    assert_eq!(version().await, SCHEMA_VERSION as i32 - 1, "left as it was");
    drop(PostgresStore::connect_with(&url, scratch.options()).await.expect("migrated"));
    assert_eq!(version().await, SCHEMA_VERSION as i32);
    // At this build's version, `migrate(false)` connects.
    drop(PostgresStore::connect_with(&url, scratch.options().migrate(false)).await.expect("up to date"));
}

#[tokio::test]
async fn schema_with_foreign_tables_is_refused() {
    let Some(url) = url_or_skip("schema_with_foreign_tables_is_refused") else { return };
    let scratch = ScratchSchema::new(&url, "foreign").await.unwrap();
    let admin = scratch.client().await.unwrap();
    admin
        .batch_execute(&format!("CREATE SCHEMA \"{0}\"; CREATE TABLE \"{0}\".orders (id int)", scratch.name()))
        .await
        .unwrap();
    let e = PostgresStore::connect_with(&url, scratch.options()).await.expect_err("foreign schema is refused");
    let msg = assert_one_line(&e);
    assert!(matches!(e, Error::ForeignSchema { .. }), "{e:?}");
    assert!(msg.contains("orders"), "{msg}");
    // Opened without creating (as the operator commands open it): the same answer, not "no
    // durable schema, let a worker create it" (a worker would refuse it too).
    let e = PostgresStore::connect_with(&url, scratch.options().create_if_missing(false))
        .await
        .expect_err("foreign schema is refused");
    assert!(matches!(e, Error::ForeignSchema { .. }), "{e:?}");
    // A schema that does not exist at all is not found.
    let missing = scratch.options().schema(format!("{}_none", scratch.name())).create_if_missing(false);
    let e = PostgresStore::connect_with(&url, missing).await.expect_err("no schema");
    assert!(matches!(e, Error::SchemaNotFound { .. }), "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_engines_migrate_a_fresh_schema_once() {
    let Some(url) = url_or_skip("concurrent_engines_migrate_a_fresh_schema_once") else { return };
    let scratch = Arc::new(ScratchSchema::new(&url, "race").await.unwrap());
    let mut tasks = Vec::new();
    for _ in 0..6 {
        let scratch = scratch.clone();
        tasks.push(tokio::spawn(async move { PostgresStore::connect_with(scratch.url(), scratch.options()).await }));
    }
    for t in tasks {
        t.await.unwrap().expect("every engine connects");
    }
    let admin = scratch.client().await.unwrap();
    let rows = admin
        .query(&format!("SELECT version FROM \"{}\".schema_version ORDER BY version", scratch.name()), &[])
        .await
        .unwrap();
    let versions: Vec<i32> = rows.iter().map(|r| r.get(0)).collect();
    assert_eq!(versions, (1..=SCHEMA_VERSION as i32).collect::<Vec<_>>());
}

/// The schema's versions, its indexes (name and definition, the schema's name taken out) and the
/// runs table's storage options and columns.
type Shape = (Vec<i32>, Vec<(String, String)>, Option<Vec<String>>, Vec<String>);

async fn shape(admin: &Client, schema: &str) -> Shape {
    let rows =
        admin.query(&format!("SELECT version FROM \"{schema}\".schema_version ORDER BY version"), &[]).await.unwrap();
    let versions = rows.iter().map(|r| r.get(0)).collect();
    let rows = admin
        .query(
            "SELECT indexname::text, replace(indexdef, $1, 'S') FROM pg_indexes WHERE schemaname = $1 ORDER BY 1",
            &[&schema],
        )
        .await
        .unwrap();
    let indexes = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    let options = admin
        .query_one(&format!("SELECT reloptions FROM pg_class WHERE oid = '\"{schema}\".runs'::regclass"), &[])
        .await
        .unwrap()
        .get(0);
    let rows = admin
        .query(
            "SELECT format('%s %s %s %s', column_name, data_type, is_nullable, column_default)
               FROM information_schema.columns WHERE table_schema = $1 AND table_name = 'runs'
              ORDER BY ordinal_position",
            &[&schema],
        )
        .await
        .unwrap();
    let columns = rows.iter().map(|r| r.get(0)).collect();
    (versions, indexes, options, columns)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_4_schema_is_migrated_to_the_listing_indexes_with_its_runs() {
    let Some(url) = url_or_skip("a_version_4_schema_is_migrated_to_the_listing_indexes_with_its_runs") else { return };
    let old = ScratchSchema::new(&url, "v4").await.unwrap();
    let fresh = ScratchSchema::new(&url, "v5").await.unwrap();
    let admin = old.client().await.unwrap();
    let store = old.connect().await.unwrap();
    store.create_run(new_run("old-parent")).await.unwrap();
    let mut child = new_run("old-child");
    child.parent = Some(ParentLink { run_id: RunId::from("old-parent"), seq: 0 });
    child.workflow = "child".into();
    store.create_run(child).await.unwrap();
    let mut tagged = new_run("old-vip");
    tagged.tags = vec!["vip".into()];
    store.create_run(tagged).await.unwrap();
    store.create_run(new_run("old-dead")).await.unwrap();
    let bury = RunPatch { status: Some(RunStatus::Dead), now: common::T0, ..RunPatch::default() };
    assert!(store.update_run_if(&RunId::from("old-dead"), &[RunStatus::Pending], bury).await.unwrap());
    drop(store);
    common::undo_version_15(&admin, old.name()).await;
    common::undo_version_14(&admin, old.name()).await;
    common::undo_version_13(&admin, old.name()).await;
    common::undo_version_12(&admin, old.name()).await;
    common::undo_version_11(&admin, old.name()).await;
    common::undo_version_9(&admin, old.name()).await;
    common::undo_version_8(&admin, old.name()).await;
    common::undo_version_7(&admin, old.name()).await;
    common::undo_version_6(&admin, old.name()).await;
    common::undo_version_5(&admin, old.name()).await;
    assert_eq!(shape(&admin, old.name()).await.0, (1..=4).collect::<Vec<_>>());

    // Connecting migrates it; the runs are listed through the new indexes.
    let store = old.connect().await.unwrap();
    let list = |filter: RunFilter| {
        let store = &store;
        async move { store.list_runs(&filter).await.unwrap().runs.into_iter().map(|r| r.id.to_string()).collect::<Vec<_>>() }
    };
    assert_eq!(
        list(RunFilter { parent: Some(RunId::from("old-parent")), ..RunFilter::default() }).await,
        ["old-child"]
    );
    assert_eq!(list(RunFilter { statuses: vec![RunStatus::Dead], ..RunFilter::default() }).await, ["old-dead"]);
    assert_eq!(list(RunFilter { tag: Some("vip".into()), ..RunFilter::default() }).await, ["old-vip"]);
    assert_eq!(list(RunFilter { workflow: Some("child".into()), ..RunFilter::default() }).await, ["old-child"]);
    let mut active = list(RunFilter { statuses: vec![RunStatus::Pending], ..RunFilter::default() }).await;
    active.sort();
    assert_eq!(active, ["old-child", "old-parent", "old-vip"]);
    // Runs created before delayed starts existed are pending work (no `wake_at`).
    let q = RunQuery { namespace: None, workflows: None, now: common::T0, limit: 10, leave_queued_since: None };
    let mut pending: Vec<String> = store.pending_runs(&q).await.unwrap().into_iter().map(|r| r.to_string()).collect();
    pending.sort();
    assert_eq!(pending, ["old-child", "old-parent", "old-vip"]);

    // And the schema is the one a new store gets.
    drop(fresh.connect().await.unwrap());
    let (migrated, new) = (shape(&admin, old.name()).await, shape(&admin, fresh.name()).await);
    assert_eq!(migrated.0, (1..=SCHEMA_VERSION as i32).collect::<Vec<_>>());
    assert_eq!(migrated, new);
    assert_eq!(new.2, Some(vec!["fillfactor=90".to_string()]));
}

/// A claim of `id` by `owner` at `now`, which must acquire the run: its run and history.
async fn acquire(
    store: &PostgresStore,
    id: &str,
    owner: &str,
    now: u64,
    from_seq: u32,
) -> (durable_core::Run, Vec<u32>) {
    let claim = Claim { run_id: RunId::from(id), owner: owner.into(), lease_until: now + 60_000, now };
    match store.claim_run_from(claim, from_seq).await.unwrap() {
        ClaimOutcome::Acquired { run, history, .. } => (run, history.iter().map(|cp| cp.seq).collect()),
        other => panic!("expected {owner}'s claim of run {id} to acquire it, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_13_schema_gets_the_claim_count_with_its_runs() {
    let Some(url) = url_or_skip("a_version_13_schema_gets_the_claim_count_with_its_runs") else { return };
    let old = ScratchSchema::new(&url, "v13").await.unwrap();
    let fresh = ScratchSchema::new(&url, "v14").await.unwrap();
    let admin = old.client().await.unwrap();
    // Runs as a version 13 schema holds them: one suspended with a history (claimed twice), one
    // pending.
    let store = old.connect().await.unwrap();
    store.create_run(new_run("parked")).await.unwrap();
    store.create_run(new_run("new")).await.unwrap();
    let (run, _) = acquire(&store, "parked", "a", common::T0, 0).await;
    let mut c = Commit::new(RunId::from("parked"), "a", common::T0 + 1);
    for seq in 0..3 {
        let mut cp = Checkpoint::new(
            RunId::from("parked"),
            seq,
            "step",
            StepKind::Step,
            CheckpointStatus::Completed,
            common::T0,
        );
        cp.output = Some(Payload::from_trusted(seq.to_string()));
        c.checkpoints.push(cp);
    }
    c.end = Some(TurnEnd::Suspend { wake_at: Some(common::T0 + 5), seen_wake_gen: run.wake_gen });
    store.commit(c).await.unwrap();
    drop(store);
    common::undo_version_15(&admin, old.name()).await;
    common::undo_version_14(&admin, old.name()).await;
    let before = shape(&admin, old.name()).await;
    assert_eq!(before.0, (1..=13).collect::<Vec<_>>());
    assert!(!before.3.iter().any(|c| c.starts_with("claims ")), "version 13 has no claim count: {:?}", before.3);

    // Connecting migrates it: the runs count from 0, and each claim that acquires one counts.
    let store = old.connect().await.unwrap();
    let parked = store.get_run(&RunId::from("parked")).await.unwrap().expect("the suspended run survived");
    assert_eq!((parked.status, parked.claims), (RunStatus::Suspended, 0));
    assert_eq!(store.get_run(&RunId::from("new")).await.unwrap().map(|r| r.claims), Some(0));
    let (run, history) = acquire(&store, "parked", "b", common::T0 + 10, 0).await;
    assert_eq!((run.claims, history), (1, vec![0, 1, 2]), "the first claim after the migration");
    assert!(store.release_lease(&RunId::from("parked"), "b").await.unwrap());
    let (run, history) = acquire(&store, "parked", "c", common::T0 + 11, 2).await;
    assert_eq!((run.claims, history), (2, vec![2]), "claim_run_from reads from the seq asked for");
    assert_eq!(store.get_run(&RunId::from("parked")).await.unwrap(), Some(run));
    assert_eq!(acquire(&store, "new", "b", common::T0 + 12, 0).await.0.claims, 1);

    // And the schema is the one a new store gets.
    drop(fresh.connect().await.unwrap());
    let (migrated, new) = (shape(&admin, old.name()).await, shape(&admin, fresh.name()).await);
    assert_eq!(migrated.0, (1..=SCHEMA_VERSION as i32).collect::<Vec<_>>());
    assert_eq!(migrated, new);
    assert!(new.3.contains(&"claims bigint NO 0".to_string()), "{:?}", new.3);
}

/// Version 22 deletes the child results an older build buffered for parents no wait of which
/// can take them (gone, completed or cancelled): a run given such a parent's id took them.
/// Those of active or failed parents, and tokens that only look like a child's, are kept.
#[tokio::test]
async fn version_22_deletes_the_child_results_no_parent_can_take() {
    let Some(url) = url_or_skip("version_22_deletes_the_child_results_no_parent_can_take") else { return };
    let scratch = ScratchSchema::new(&url, "v21").await.unwrap();
    let store = scratch.connect().await.unwrap();
    for id in ["p", "p:1", "done", "cancelled", "failed"] {
        store.create_run(new_run(id)).await.unwrap();
    }
    drop(store);
    let admin = scratch.client().await.unwrap();
    let s = format!("\"{}\"", scratch.name());
    admin
        .batch_execute(&format!(
            "UPDATE {s}.runs SET status = 'completed' WHERE id = 'done';
             UPDATE {s}.runs SET status = 'cancelled' WHERE id = 'cancelled';
             UPDATE {s}.runs SET status = 'failed' WHERE id = 'failed';
             INSERT INTO {s}.buffered_signals (token, payload, created_at) VALUES
                 ('child:done:0', '1', 1), ('child:cancelled:3', '1', 1), ('child:gone:0', '1', 1),
                 ('child:p:0', '1', 1), ('child:p:1:0', '1', 1), ('child:failed:2', '1', 1),
                 ('child:p:1:x', '1', 1), ('child::4', '1', 1), ('approve', '1', 1);
             DELETE FROM {s}.schema_version WHERE version >= 22;"
        ))
        .await
        .unwrap();
    drop(scratch.connect().await.unwrap());
    let kept: Vec<String> = admin
        .query(&format!("SELECT token FROM {s}.buffered_signals ORDER BY token COLLATE \"C\""), &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(kept, ["approve", "child::4", "child:failed:2", "child:p:0", "child:p:1:0", "child:p:1:x"]);
    let version: i32 =
        admin.query_one(&format!("SELECT max(version) FROM {s}.schema_version"), &[]).await.unwrap().get(0);
    assert_eq!(version, SCHEMA_VERSION as i32);
}
