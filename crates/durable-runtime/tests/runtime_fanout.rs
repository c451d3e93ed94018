//! Acceptance: `join!` takes seqs in creation order and replays identically.

mod support;

use std::time::Duration;

use durable_conformance::{Counter, TestEngine};
use durable_core::RunStatus;
use durable_runtime::{StartOptions, WorkflowCtx, WorkflowError};
use tokio::sync::watch;

fn register(t: &TestEngine, runs: &Counter) {
    let runs = runs.clone();
    t.register("join3", 1, move |ctx: WorkflowCtx, _: ()| {
        let runs = runs.clone();
        async move {
            // c finishes first, then b, then a: completion order is the reverse of creation order.
            let (c_done, c_rx) = watch::channel(false);
            let (b_done, b_rx) = watch::channel(false);
            let r = runs.clone();
            let a = ctx.step("a", move |_| {
                r.bump();
                let mut rx = b_rx.clone();
                async move {
                    let _ = rx.wait_for(|d| *d).await;
                    Ok("a".to_string())
                }
            });
            let r = runs.clone();
            let b = ctx.step("b", move |_| {
                r.bump();
                let (mut rx, done) = (c_rx.clone(), b_done.clone());
                async move {
                    let _ = rx.wait_for(|d| *d).await;
                    done.send_replace(true);
                    Ok("b".to_string())
                }
            });
            let r = runs.clone();
            let c = ctx.step("c", move |_| {
                r.bump();
                let done = c_done.clone();
                async move {
                    done.send_replace(true);
                    Ok("c".to_string())
                }
            });
            let (a, b, c) = tokio::join!(a, b, c);
            ctx.sleep(Duration::from_secs(60)).await;
            Ok::<_, WorkflowError>(format!("{}{}{}", a?, b?, c?))
        }
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn join_records_seqs_in_creation_order_and_replays_after_a_resume() {
    let runs = Counter::new();
    let t = TestEngine::new();
    register(&t, &runs);
    let run = t.start("join3", &(), StartOptions::id("join")).await.unwrap();
    t.assert_settled_status(&run.id, RunStatus::Suspended).await;
    let history = t.checkpoints(&run.id).await;
    let seqs: Vec<(u32, &str)> = history.iter().map(|c| (c.seq, c.name.as_str())).collect();
    assert_eq!(seqs, [(0, "a"), (1, "b"), (2, "c"), (3, "sleep")]);
    // c committed first: completion order really was reversed.
    assert!(history[2].updated_at <= history[0].updated_at);

    let t = t.restart().await;
    register(&t, &runs);
    t.advance(Duration::from_secs(60));
    t.assert_output(&run.id, "abc".to_string()).await;
    assert_eq!(runs.get(), 3, "replay re-executed a completed step");
}
