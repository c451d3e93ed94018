use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use durable_runtime::{Engine, RunStatus, StartOptions, VirtualClock, WorkflowCtx, WorkflowError};
use durable_store_memory::MemoryStore;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steps_and_sleep() {
    let clock = VirtualClock::new(1_000_000);
    let engine = Engine::builder().store(MemoryStore::new()).clock(clock.clone()).build().unwrap();
    let count = Arc::new(AtomicU32::new(0));
    let c = count.clone();
    engine.register("wf", 1, move |ctx: WorkflowCtx, n: u32| {
        let c = c.clone();
        async move {
            let a: u32 = ctx
                .step("a", |_| {
                    let c = c.clone();
                    async move {
                        c.fetch_add(1, Ordering::SeqCst);
                        Ok(n + 1)
                    }
                })
                .await?;
            ctx.sleep(Duration::from_secs(3600)).await;
            let b: u32 = ctx
                .step("b", |_| {
                    let c = c.clone();
                    async move {
                        c.fetch_add(1, Ordering::SeqCst);
                        Ok(a * 2)
                    }
                })
                .await?;
            Ok::<_, WorkflowError>(b)
        }
    });
    let run = engine.start("wf", &1u32, StartOptions::id("r1")).await.unwrap();
    let o = engine.wait_until_suspended_or_terminal(&run.id).await.unwrap();
    assert_eq!(o.status(), RunStatus::Suspended);
    clock.advance(Duration::from_secs(3600));
    let o = engine.wait_for_run(&run.id).await.unwrap();
    assert_eq!(o.output::<u32>().unwrap(), 4);
    assert_eq!(count.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_until_suspended_or_terminal_returns_on_either_and_the_old_names_still_work() {
    let clock = VirtualClock::new(1_000_000);
    let engine = Engine::builder().store(MemoryStore::new()).clock(clock.clone()).build().unwrap();
    engine.register("nap", 1, |ctx: WorkflowCtx, ()| async move {
        ctx.sleep(Duration::from_secs(60)).await;
        Ok::<_, WorkflowError>(7u32)
    });
    let run = engine.start("nap", &(), StartOptions::id("nap")).await.unwrap();
    // Suspended on its timer: both names return, and a run that stays suspended is not terminal.
    let o = engine.wait_until_suspended_or_terminal_timeout(&run.id, Duration::from_secs(60)).await.unwrap();
    assert_eq!(o.status(), RunStatus::Suspended);
    #[allow(deprecated)]
    let old = engine.wait_for_settled(&run.id).await.unwrap();
    assert_eq!(old.status(), RunStatus::Suspended);
    let err = engine.wait_for_run_timeout(&run.id, Duration::from_millis(50)).await.unwrap_err();
    assert!(matches!(err, durable_runtime::Error::Timeout { status: RunStatus::Suspended, .. }), "{err}");
    // Terminal: it returns the completed run.
    clock.advance(Duration::from_secs(60));
    let o = engine.wait_for_run(&run.id).await.unwrap();
    assert_eq!(o.output::<u32>().unwrap(), 7);
    #[allow(deprecated)]
    let old = engine.wait_for_settled_timeout(&run.id, Duration::from_secs(60)).await.unwrap();
    assert_eq!(old.status(), RunStatus::Completed);
    assert_eq!(engine.wait_until_suspended_or_terminal(&run.id).await.unwrap().status(), RunStatus::Completed);
}
