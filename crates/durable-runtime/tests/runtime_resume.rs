//! Acceptance: a run survives its engine being torn down and resumes on another one.

mod support;

use durable_conformance::{Counter, TestEngine};
use durable_core::RunStatus;
use durable_runtime::{StartOptions, WorkflowCtx, WorkflowError};

#[derive(Clone, Default)]
struct Counters([Counter; 4]);

fn register(t: &TestEngine, counters: &Counters, gate_open: bool) {
    let counters = counters.clone();
    t.register("four_steps", 1, move |ctx: WorkflowCtx, base: u64| {
        let c = counters.clone();
        async move {
            let mut total = base;
            for (i, counter) in c.0.iter().enumerate() {
                let counter = counter.clone();
                let add = (i as u64 + 1) * 10;
                total = ctx
                    .step(format!("step{}", i + 1), move |_| {
                        counter.bump();
                        async move { Ok(total + add) }
                    })
                    .await?;
                if i == 1 {
                    // Engine A stops here, right after step 2's commit.
                    support::gate(gate_open).await;
                }
            }
            Ok::<_, WorkflowError>(total)
        }
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resumes_on_a_new_engine_without_repeating_steps() {
    let counters = Counters::default();
    let a = TestEngine::new();
    register(&a, &counters, false);
    let mut events = a.subscribe();
    let run = a.start("four_steps", &1u64, StartOptions::id("order:1")).await.unwrap();
    support::step_committed(&mut events, &run.id, 1).await;
    assert_eq!(a.get_run(&run.id).await.unwrap().unwrap().status, RunStatus::Running);

    let b = a.restart().await;
    register(&b, &counters, true);
    b.assert_output(&run.id, 101u64).await;
    for (i, c) in counters.0.iter().enumerate() {
        assert_eq!(c.get(), 1, "step{} executed {} times", i + 1, c.get());
    }
    b.assert_step_names(&run.id, &["step1", "step2", "step3", "step4"]).await;
}
