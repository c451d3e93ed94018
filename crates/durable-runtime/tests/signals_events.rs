//! Acceptance (events, queries, updates, external tasks) — on memory and SQLite.

mod support;

use std::time::Duration;

use durable_conformance::{Counter, TestEngine};
use durable_core::{Delivery, RunStatus, StepError};
use durable_runtime::{StartOptions, TaskError, UpdateOutcome, WorkflowCtx, WorkflowError};
use serde_json::json;
use support::StoreFixture;

on_every_store!(
    events_reach_only_matching_waits,
    a_buffered_event_is_claimed_by_exactly_one_later_wait,
    an_event_wait_can_time_out,
    get_state_sees_the_latest_value_during_and_after_the_run,
    updates_are_validated_before_they_touch_a_run,
    external_tasks_complete_and_fail,
);

fn register_event_waiter(t: &TestEngine) {
    t.register("wait_event", 1, |ctx: WorkflowCtx, matcher: serde_json::Value| async move {
        let got: serde_json::Value = ctx.wait_for_event("order.paid", matcher).await?;
        Ok::<_, WorkflowError>(got)
    });
}

async fn events_reach_only_matching_waits(s: StoreFixture) {
    let t = s.engine();
    register_event_waiter(&t);
    let forty_two = t.start("wait_event", &json!({"order_id": 42}), StartOptions::id("o42")).await.unwrap();
    let seven = t.start("wait_event", &json!({"order_id": 7}), StartOptions::id("o7")).await.unwrap();
    let any = t.start("wait_event", &json!({}), StartOptions::id("any")).await.unwrap();
    for id in [&forty_two.id, &seven.id, &any.id] {
        t.assert_settled_status(id, RunStatus::Suspended).await;
    }
    let payload = json!({"order_id": 42, "amount": 10});
    let mut delivered: Vec<String> = t
        .publish_event("order.paid", &payload)
        .await
        .unwrap()
        .into_iter()
        .map(|d| match d {
            Delivery::Delivered { run_id, .. } => run_id.to_string(),
            Delivery::Buffered => panic!("delivered to someone"),
        })
        .collect();
    delivered.sort();
    assert_eq!(delivered, ["any", "o42"]);
    t.assert_output(&forty_two.id, payload.clone()).await;
    t.assert_output(&any.id, payload).await;
    assert_eq!(t.get_run(&seven.id).await.unwrap().unwrap().status, RunStatus::Suspended);
    assert_eq!(t.store().waiters(&seven.id).await.unwrap().len(), 1);
}

async fn a_buffered_event_is_claimed_by_exactly_one_later_wait(s: StoreFixture) {
    let t = s.engine();
    register_event_waiter(&t);
    let delivered = t.publish_event("order.paid", &json!({"order_id": 5})).await.unwrap();
    assert!(delivered.is_empty(), "nobody waits yet: buffered");
    let other = t.start("wait_event", &json!({"order_id": 6}), StartOptions::id("o6")).await.unwrap();
    let first = t.start("wait_event", &json!({"order_id": 5}), StartOptions::id("o5-a")).await.unwrap();
    t.assert_output(&first.id, json!({"order_id": 5})).await;
    let second = t.start("wait_event", &json!({"order_id": 5}), StartOptions::id("o5-b")).await.unwrap();
    t.assert_settled_status(&second.id, RunStatus::Suspended).await;
    t.assert_settled_status(&other.id, RunStatus::Suspended).await;
}

async fn an_event_wait_can_time_out(s: StoreFixture) {
    let t = s.engine();
    t.register("event_timeout", 1, |ctx: WorkflowCtx, _: ()| async move {
        let got: Option<u32> = ctx.wait_for_event_timeout("never", json!({}), Duration::from_secs(60)).await?;
        Ok::<_, WorkflowError>(got)
    });
    let run = t.start("event_timeout", &(), StartOptions::id("et")).await.unwrap();
    t.assert_settled_status(&run.id, RunStatus::Suspended).await;
    t.advance(Duration::from_secs(60));
    t.assert_output(&run.id, None::<u32>).await;
    assert!(t.store().waiters(&run.id).await.unwrap().is_empty());
}

async fn get_state_sees_the_latest_value_during_and_after_the_run(s: StoreFixture) {
    let t = s.engine();
    t.register("progress", 1, |ctx: WorkflowCtx, _: ()| async move {
        ctx.set_state("progress", &25u32).await;
        ctx.set_state("progress", &50u32).await;
        let _: () = ctx.wait_for_signal("go").await?;
        ctx.set_state("progress", &100u32).await;
        Ok::<_, WorkflowError>(())
    });
    let run = t.start("progress", &(), StartOptions::id("progress")).await.unwrap();
    assert_eq!(t.get_state::<u32>(&run.id, "missing").await.unwrap(), None);
    t.assert_settled_status(&run.id, RunStatus::Suspended).await;
    assert_eq!(t.get_state::<u32>(&run.id, "progress").await.unwrap(), Some(50));
    t.signal("go", &()).await.unwrap();
    t.assert_status(&run.id, RunStatus::Completed).await;
    assert_eq!(t.get_state::<u32>(&run.id, "progress").await.unwrap(), Some(100));
    // Asked as the wrong type: the error names the state, not the run's output.
    let wrong = t.get_state::<String>(&run.id, "progress").await.unwrap_err();
    assert!(matches!(&wrong, durable_runtime::Error::State { key, .. } if key == "progress"), "{wrong:?}");
    assert!(wrong.to_string().contains(r#"query state "progress" of run progress"#), "{wrong}");
    // No such run: not the same answer as a key never set.
    let unknown = t.get_state::<u32>(&"nope".into(), "progress").await.unwrap_err();
    assert!(matches!(&unknown, durable_runtime::Error::RunNotFound(id) if id.as_str() == "nope"), "{unknown:?}");
}

async fn updates_are_validated_before_they_touch_a_run(s: StoreFixture) {
    let t = s.engine();
    t.register("cart", 1, |ctx: WorkflowCtx, _: ()| async move {
        let qty: u32 = ctx.on_update("set_quantity").await?;
        Ok::<_, WorkflowError>(qty)
    });
    t.register_update_validator("cart", "set_quantity", |qty: &u32| {
        if *qty == 0 || *qty > 10 { Err(format!("quantity {qty} is not between 1 and 10")) } else { Ok(()) }
    });
    let run = t.start("cart", &(), StartOptions::id("cart")).await.unwrap();
    t.assert_settled_status(&run.id, RunStatus::Suspended).await;
    let before = (t.get_run(&run.id).await.unwrap().unwrap(), t.checkpoints(&run.id).await);

    let rejected = t.update(&run.id, "set_quantity", &99u32).await.unwrap();
    assert!(
        matches!(&rejected, UpdateOutcome::Rejected { reason } if reason.contains("between 1 and 10")),
        "{rejected:?}"
    );
    let wrong_type = t.update(&run.id, "set_quantity", "three").await.unwrap();
    assert!(matches!(wrong_type, UpdateOutcome::Rejected { .. }));
    let unknown = t.update(&"nope".into(), "set_quantity", &1u32).await.unwrap_err();
    assert!(matches!(&unknown, durable_runtime::Error::RunNotFound(id) if id.as_str() == "nope"), "{unknown}");
    let after = (t.get_run(&run.id).await.unwrap().unwrap(), t.checkpoints(&run.id).await);
    assert_eq!(before, after, "a rejected update touched the run");

    assert_eq!(t.update(&run.id, "set_quantity", &3u32).await.unwrap(), UpdateOutcome::Accepted { delivered: true });
    t.assert_output(&run.id, 3u32).await;

    // Without a validator a value of the wrong type reaches the run: the workflow's error
    // names the update as the workflow named it.
    t.register("free_cart", 1, |ctx: WorkflowCtx, _: ()| async move {
        let qty: Result<u32, _> = ctx.on_update("qty").await;
        Ok::<_, WorkflowError>(qty.map_err(|e| e.to_string()))
    });
    let free = t.start("free_cart", &(), StartOptions::id("free-cart")).await.unwrap();
    t.assert_settled_status(&free.id, RunStatus::Suspended).await;
    t.update(&free.id, "qty", &"many").await.unwrap();
    let out = t.wait_for_run(&free.id).await.unwrap().output::<Result<u32, String>>().unwrap();
    let message = out.expect_err("a string is not a u32");
    assert!(message.contains(r#"delivered to "qty" (seq 0)"#) && !message.contains("update:"), "{message}");

    // One rule for every message addressed to a run by id: unknown is RunNotFound, finished is
    // RunFinished, and nothing is written.
    use durable_runtime::Error;
    let finished = t.update(&run.id, "set_quantity", &3u32).await.unwrap_err();
    assert!(matches!(finished, Error::RunFinished { status: RunStatus::Completed, .. }), "{finished}");
    for result in
        [t.complete_task(&"nope".into(), "review", &1u32).await, t.fail_task(&"nope".into(), "review", "no").await]
    {
        assert!(matches!(result, Err(Error::RunNotFound(_))), "{result:?}");
    }
    for result in [t.complete_task(&run.id, "review", &1u32).await, t.fail_task(&run.id, "review", "no").await] {
        assert!(matches!(result, Err(Error::RunFinished { .. })), "{result:?}");
    }
}

async fn external_tasks_complete_and_fail(s: StoreFixture) {
    let t = s.engine();
    let dispatched = Counter::new();
    let d = dispatched.clone();
    t.register("review", 1, move |ctx: WorkflowCtx, _: ()| {
        let d = d.clone();
        async move {
            let verdict = ctx
                .task::<String, _, _>("review", move |_| {
                    d.bump();
                    async { Ok::<(), StepError>(()) }
                })
                .await;
            Ok::<_, WorkflowError>(match verdict {
                Ok(v) => format!("ok: {v}"),
                Err(TaskError::Failed { message, .. }) => format!("failed: {message}"),
                Err(e) => return Err(e.into()),
            })
        }
    });
    let ok = t.start("review", &(), StartOptions::id("rev-ok")).await.unwrap();
    let bad = t.start("review", &(), StartOptions::id("rev-bad")).await.unwrap();
    t.assert_settled_status(&ok.id, RunStatus::Suspended).await;
    t.assert_settled_status(&bad.id, RunStatus::Suspended).await;
    t.complete_task(&ok.id, "review", "lgtm").await.unwrap();
    t.fail_task(&bad.id, "review", "reviewer left").await.unwrap();
    t.assert_output(&ok.id, "ok: lgtm".to_string()).await;
    t.assert_output(&bad.id, "failed: reviewer left".to_string()).await;
    assert_eq!(dispatched.get(), 2, "each task was handed out once");
}
