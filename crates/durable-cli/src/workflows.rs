//! The demo's example workflows.

use std::time::Duration;

use durable::{Backoff, Engine, RunId, StepError, WorkflowCtx, WorkflowError};
use serde::{Deserialize, Serialize};

/// The version every demo workflow is registered with.
const VERSION: u32 = 1;

/// How long a demo sleep lasts.
pub(crate) const SLEEP: Duration = Duration::from_secs(1);

/// How long an approval waits for its signal before escalating.
pub(crate) const APPROVAL_TIMEOUT: Duration = Duration::from_secs(30);

/// The input of every top-level demo run.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub(crate) struct DemoInput {
    /// The run's index (`demo-<kind>-<n>`).
    pub(crate) n: u64,
}

/// The payload the demo signals approvals with.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Approval {
    pub(crate) approved: bool,
    pub(crate) by: String,
}

/// The kinds of demo runs, in the order the demo cycles through them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    Order,
    Sleep,
    Approval,
    Saga,
    FanOut,
}

impl Kind {
    pub(crate) const ALL: [Kind; 5] = [Kind::Order, Kind::Sleep, Kind::Approval, Kind::Saga, Kind::FanOut];

    /// The kind of the `i`-th demo run.
    pub(crate) fn of(i: u32) -> Kind {
        Kind::ALL[i as usize % Kind::ALL.len()]
    }

    /// The name in run ids.
    pub(crate) fn slug(self) -> &'static str {
        match self {
            Kind::Order => "order",
            Kind::Sleep => "sleep",
            Kind::Approval => "approval",
            Kind::Saga => "saga",
            Kind::FanOut => "fanout",
        }
    }

    /// The registered workflow.
    pub(crate) fn workflow(self) -> &'static str {
        match self {
            Kind::Order => "demo_order",
            Kind::Sleep => "demo_sleep",
            Kind::Approval => "demo_approval",
            Kind::Saga => "demo_saga",
            Kind::FanOut => "demo_fanout",
        }
    }
}

/// The deterministic id of the `i`-th demo run: `demo-<kind>-<i>`.
pub(crate) fn demo_run_id(i: u32) -> RunId {
    RunId::new(format!("demo-{}-{i}", Kind::of(i).slug()))
}

/// Whether `workflow` is one of the demo's (top-level) workflows.
pub(crate) fn is_demo_workflow(workflow: &str) -> bool {
    Kind::ALL.iter().any(|k| k.workflow() == workflow)
}

/// The signal token an approval run waits on.
pub(crate) fn approval_token(run_id: &RunId) -> String {
    format!("approve:{run_id}")
}

/// Registers the demo's workflows on `engine`, version 1 each: `demo_order`, `demo_sleep`,
/// `demo_approval`, `demo_saga`, `demo_fanout` and its child `demo_fanout_item`.
///
/// `durable demo` is a worker for exactly these; an engine of your own with them registered
/// executes (or resumes, or completes after `durable runs retry`) demo runs the same way.
pub fn register_demo_workflows(engine: &Engine) {
    engine.register("demo_order", VERSION, order);
    engine.register("demo_sleep", VERSION, sleep);
    engine.register("demo_approval", VERSION, approval);
    engine.register("demo_saga", VERSION, saga);
    engine.register("demo_fanout", VERSION, fan_out);
    engine.register("demo_fanout_item", VERSION, fan_out_item);
}

/// An order: reserve, charge (the payment gateway times out twice; the step is retried with
/// exponential backoff), ship, email a receipt.
async fn order(ctx: WorkflowCtx, input: DemoInput) -> Result<String, WorkflowError> {
    let n = input.n;
    let items: u64 = ctx.step("reserve_stock", move |_| async move { Ok(1 + n % 3) }).await?;
    let payment: String = ctx
        .step("charge_card", |s| async move {
            if s.attempt() < 3 {
                return Err(StepError::retryable(format!("payment gateway timed out (attempt {})", s.attempt())));
            }
            Ok(format!("paid with idempotency key {}", s.step_id()))
        })
        .retry(3, Backoff::exponential(Duration::from_millis(20), Duration::from_millis(200)))
        .await?;
    let tracking: String = ctx.step("ship", move |_| async move { Ok(format!("TRACK-{n:05}")) }).await?;
    ctx.step("email_receipt", |_| async { Ok(()) }).await?;
    Ok(format!("order {n}: {items} item(s), {payment}, shipped {tracking}"))
}

/// A reminder: a durable sleep between two steps. The run suspends and releases its lease
/// while it sleeps; a restart does not reset the timer.
async fn sleep(ctx: WorkflowCtx, input: DemoInput) -> Result<String, WorkflowError> {
    let n = input.n;
    ctx.step("schedule_reminder", |_| async { Ok(()) }).await?;
    ctx.sleep(SLEEP).await;
    let sent: String = ctx.step("send_reminder", move |_| async move { Ok(format!("reminder {n} sent")) }).await?;
    Ok(sent)
}

/// An approval: asks, then waits (durably, up to 30 s) for a signal on `approve:<run id>`;
/// fulfils when approved, escalates when nobody answered in time.
async fn approval(ctx: WorkflowCtx, input: DemoInput) -> Result<String, WorkflowError> {
    let n = input.n;
    let token = approval_token(ctx.run_id());
    ctx.step("request_approval", |_| async { Ok(()) }).await?;
    let answer: Option<Approval> = ctx.wait_for_signal_timeout(&token, APPROVAL_TIMEOUT).await?;
    Ok(match answer {
        Some(a) if a.approved => {
            ctx.step("fulfil", move |_| async move { Ok(()) }).await?;
            format!("request {n} approved by {}", a.by)
        }
        Some(a) => format!("request {n} rejected by {}", a.by),
        None => {
            ctx.step("escalate", |_| async { Ok(()) }).await?;
            format!("request {n} escalated: no answer in {} s", APPROVAL_TIMEOUT.as_secs())
        }
    })
}

/// A trip booking saga: three bookings, each with an undo; confirming the trip fails on every
/// attempt, so the run fails and the undos run newest first.
async fn saga(ctx: WorkflowCtx, input: DemoInput) -> Result<String, WorkflowError> {
    let n = input.n;
    for what in ["flight", "hotel", "car"] {
        ctx.step(format!("book_{what}"), move |_| async move { Ok(format!("{what}-{n}")) })
            .compensate(|_booking: String| async { Ok(()) })
            .await?;
    }
    ctx.step("confirm_trip", |s| async move {
        Err::<(), _>(StepError::retryable(format!("the supplier rejected the itinerary (attempt {})", s.attempt())))
    })
    .retry(2, Backoff::Fixed(Duration::from_millis(20)))
    .await?;
    Ok(format!("trip {n} booked"))
}

/// A fan-out: splits the work into three child runs, waits for all of them, merges.
async fn fan_out(ctx: WorkflowCtx, input: DemoInput) -> Result<u64, WorkflowError> {
    let n = input.n;
    let parts: Vec<u64> = ctx.step("split", move |_| async move { Ok(vec![3 * n, 3 * n + 1, 3 * n + 2]) }).await?;
    let children: Vec<_> = parts.iter().map(|part| ctx.child::<_, u64>("demo_fanout_item", part)).collect();
    let mut total = 0;
    for result in ctx.all(children).await {
        total += result?;
    }
    let merged: u64 = ctx.step("merge", move |_| async move { Ok(total) }).await?;
    Ok(merged)
}

/// One part of a fan-out.
async fn fan_out_item(ctx: WorkflowCtx, part: u64) -> Result<u64, WorkflowError> {
    Ok(ctx.step("process", move |_| async move { Ok(part * part) }).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ids_cycle_through_the_kinds() {
        let ids: Vec<String> = (0..6).map(|i| demo_run_id(i).to_string()).collect();
        assert_eq!(
            ids,
            ["demo-order-0", "demo-sleep-1", "demo-approval-2", "demo-saga-3", "demo-fanout-4", "demo-order-5"]
        );
    }
}
