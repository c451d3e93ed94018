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

use durable::{Error, RunStatus, StartOptions, VirtualClock, WorkflowCtx, WorkflowError, codes};
use durable_conformance::{TestEngine, test_config};
use durable_core::Store;
use durable_core::protocol::MAX_NAME_BYTES;
use durable_store_postgres::test_support::{ScratchSchema, url_or_skip};

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

/// `len` random hex characters (uuid v4s), which PostgreSQL cannot compress.
fn random_hex(len: usize) -> String {
    let mut s = String::with_capacity(len + 32);
    while s.len() < len {
        s.push_str(&durable::uuid::Uuid::new_v4().simple().to_string());
    }
    s.truncate(len);
    s
}
