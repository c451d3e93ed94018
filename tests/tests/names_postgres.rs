//! Names PostgreSQL cannot index are refused before they reach it. A signal token, tag or event
//! name over `protocol::MAX_NAME_BYTES` (an index entry must fit in a third of a page) used to
//! make every commit of its turn fail, and the run stayed `running` forever with no error. Now
//! a new wait on such a token fails its run with `invalid_name`, the engine refuses to send to
//! or start with one, and a name at the limit works end to end; a step name, which no index
//! holds, may be longer. The names are random hex: PostgreSQL compresses a repetitive index
//! entry below the limit. Each test runs on a scratch schema of its own.
//!
//! ```text
//! DURABLE_PG_URL=postgres://postgres@127.0.0.1:5432/test cargo test -p durable-tests --test names_postgres
//! ```

use std::sync::Arc;
use std::time::Duration;

use durable::{
    EngineEvent, Error, RunStatus, StartOptions, VirtualClock, WorkflowCtx, WorkflowError, WorkflowOptions, codes,
};
use durable_conformance::{TestEngine, test_config};
use durable_core::Store;
use durable_core::protocol::{MAX_GATE_BYTES, MAX_NAME_BYTES};
use durable_store_postgres::test_support::{ScratchSchema, url_or_skip};
use serde_json::json;

/// A hang guard for the waits below (the bug left the run `running` forever), not a timing
/// assertion.
const WAIT: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_over_the_limit_are_refused_and_names_at_it_work_on_postgres() {
    let Some(url) = url_or_skip("names_over_the_limit_are_refused_and_names_at_it_work_on_postgres") else { return };
    let scratch = ScratchSchema::new(&url, "names").await.expect("scratch schema");
    let store: Arc<dyn Store> = Arc::new(scratch.connect().await.expect("connect"));
    let t = TestEngine::with_parts(store, VirtualClock::starting_2026(), test_config());
    t.register("wait_on", 1, |ctx: WorkflowCtx, token: String| async move {
        ctx.step("asked", |_| async { Ok(()) }).await?;
        let v: u32 = ctx.wait_for_signal(&token).await?;
        Ok::<_, WorkflowError>(v)
    });
    t.register("step_named", 1, |ctx: WorkflowCtx, name: String| async move {
        let v: u32 = ctx.step(name, |_| async { Ok(7) }).await?;
        Ok::<_, WorkflowError>(v)
    });
    let long = random_hex(10_000);
    let at_limit = random_hex(MAX_NAME_BYTES);

    // A new wait on a token over the limit fails its run at once, naming the seq and the
    // limit; the step recorded before it stays.
    let run = t.start("wait_on", &long, StartOptions::id("long-wait")).await.unwrap().id;
    if tokio::time::timeout(WAIT, t.assert_status(&run, RunStatus::Failed)).await.is_err() {
        panic!("the run did not fail: {:?}", t.get_run(&run).await);
    }
    let e = t.get_run(&run).await.unwrap().unwrap().error.unwrap();
    assert_eq!(e.code(), Some(codes::INVALID_NAME), "{e:?}");
    assert!(e.message.contains("seq 1"), "{}", e.message);
    assert!(e.message.contains("10000 bytes long") && e.message.contains("1024"), "{}", e.message);
    assert!(e.message.len() < 1_000, "the message does not repeat the whole name: {}", e.message.len());
    assert_eq!(t.checkpoints(&run).await.len(), 1, "only the step before it");

    // The engine refuses to send to, publish under or start with such names; nothing is written.
    assert!(matches!(t.signal(&long, &1).await, Err(Error::InvalidName { .. })));
    assert!(matches!(t.publish_event(&long, &1).await, Err(Error::InvalidName { .. })));
    let tagged = StartOptions::id("long-tag").tag(long.clone());
    assert!(matches!(t.start("wait_on", "x", tagged).await, Err(Error::InvalidName { .. })));
    assert!(t.get_run(&"long-tag".into()).await.unwrap().is_none());
    assert_eq!(t.buffered(&durable::BufferedQuery::all()).await.unwrap(), []);

    // At the limit: the wait registers, a signal reaches it, a step of that name runs, and a
    // buffered signal on such a token is kept and listed.
    let run = t.start("wait_on", &at_limit, StartOptions::id("at-limit")).await.unwrap().id;
    t.wait_until_suspended_or_terminal(&run).await.unwrap();
    assert!(matches!(t.signal(&at_limit, &5u32).await.unwrap(), durable::Delivery::Delivered { .. }));
    t.assert_output(&run, 5u32).await;
    let run = t.start("step_named", &long, StartOptions::id("long-step")).await.unwrap().id;
    t.assert_output(&run, 7u32).await;
    assert_eq!(t.checkpoints(&run).await[0].name, long, "a step name is not limited");
    assert_eq!(t.signal(&at_limit, &6u32).await.unwrap(), durable::Delivery::Buffered);
    let listed = t.buffered(&durable::BufferedQuery::signals()).await.unwrap();
    assert_eq!(listed.iter().map(|k| (k.key.len(), k.count)).collect::<Vec<_>>(), [(MAX_NAME_BYTES, 1)]);
    t.shutdown().await;
}

/// A concurrency key's gate joins three names (`key:<namespace>:<workflow>:<key>`), each within
/// the limit, and a debounce key comes from an event's payload: either could pass PostgreSQL's
/// index entry limit. A start whose gate is over `MAX_GATE_BYTES` is refused with `BadKey`, and
/// a publish whose debounce key is over `MAX_NAME_BYTES` with `InvalidName`; nothing is written,
/// and both at their limits work end to end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_gates_and_trigger_keys_are_refused_and_at_the_limit_work_on_postgres() {
    let Some(url) = url_or_skip("long_gates_and_trigger_keys_are_refused_and_at_the_limit_work_on_postgres") else {
        return;
    };
    let scratch = ScratchSchema::new(&url, "gates").await.expect("scratch schema");
    let store: Arc<dyn Store> = Arc::new(scratch.connect().await.expect("connect"));
    let t = TestEngine::with_parts(store, VirtualClock::starting_2026(), test_config());
    let (workflow, namespace) = (random_hex(1_000), random_hex(1_000));
    // `key:` + namespace + `:` + workflow + `:` + key: 2,006 bytes before the key.
    let (key_at_limit, key_over) = (random_hex(MAX_GATE_BYTES - 2_006), random_hex(MAX_GATE_BYTES - 2_005));
    let keyed = WorkflowOptions::default().concurrency(|k: &String| k.clone(), 1);
    t.register_with(&workflow, 1, keyed, |ctx: WorkflowCtx, key: String| async move {
        let len = key.len();
        let n: usize = ctx.step("len", move |_| async move { Ok(len) }).await?;
        Ok::<_, WorkflowError>(n)
    });
    let start = |id: &str| StartOptions::id(id).namespace(namespace.clone());
    let refused = t.start(&workflow, &key_over, start("over")).await;
    let Err(Error::BadKey { reason, .. }) = refused else { panic!("not refused: {refused:?}") };
    assert!(reason.contains("2049 bytes, over the limit of 2048 bytes"), "{reason}");
    assert!(t.get_run(&"over".into()).await.unwrap().is_none(), "nothing written");
    let run = t.start(&workflow, &key_at_limit, start("at-limit")).await.unwrap().id;
    if tokio::time::timeout(WAIT, t.assert_output(&run, key_at_limit.len())).await.is_err() {
        panic!("the run at the limit did not finish: {:?}", t.get_run(&run).await);
    }

    let debounced =
        WorkflowOptions::default().on_event("cart.changed", json!({})).debounce(Duration::from_secs(1)).key_by("cart");
    t.register_with("settle", 1, debounced, |_ctx: WorkflowCtx, last: serde_json::Value| async move {
        Ok::<_, WorkflowError>(last)
    });
    let refused = t.publish_event("cart.changed", &json!({ "cart": random_hex(MAX_NAME_BYTES + 1) })).await;
    let Err(Error::InvalidName { what, reason }) = refused else { panic!("not refused: {refused:?}") };
    assert!(what.contains("\"cart\"") && what.contains("settle"), "{what}");
    assert!(reason.contains("1025 bytes long"), "{reason}");
    let mut rx = t.subscribe();
    let cart = random_hex(MAX_NAME_BYTES);
    t.publish_event("cart.changed", &json!({ "cart": cart })).await.unwrap();
    t.advance(Duration::from_secs(1));
    let run = loop {
        match tokio::time::timeout(WAIT, rx.recv()).await.expect("a run is created").expect("events") {
            EngineEvent::RunCreated { run_id, .. } => break run_id,
            _ => continue,
        }
    };
    let out = tokio::time::timeout(WAIT, t.wait_for_run(&run)).await.expect("the run finishes").unwrap();
    assert_eq!(out.output::<serde_json::Value>().unwrap(), json!({ "cart": cart }), "only the event at the limit");
    t.shutdown().await;
}

/// `len` random hex characters (uuid v4s), which PostgreSQL cannot compress.
fn random_hex(len: usize) -> String {
    let mut s = String::with_capacity(len + 32);
    while s.len() < len {
        s.push_str(&durable::uuid::Uuid::new_v4().simple().to_string());
    }
    s.truncate(len);
    s
}
