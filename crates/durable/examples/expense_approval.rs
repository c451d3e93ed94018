//! An expense approval: waits up to 3 days for a manager's decision (a signal), reminds the
//! manager after day 1 with a step, and escalates to a director on timeout.
//!
//! Three days pass in a moment: the engine runs on a `VirtualClock` that this program moves
//! forward, exactly as a test would. With the system clock the same code waits real days.
//!
//! ```text
//! cargo run --release --example expense_approval
//! ```

use std::time::Duration;

use durable::{
    BufferedPurge, BufferedQuery, Engine, EngineEvent, SqliteStore, StartOptions, VirtualClock, WorkflowCtx,
    WorkflowError,
};
use serde::{Deserialize, Serialize};

const DAY: Duration = Duration::from_secs(86_400);

#[derive(Debug, Serialize, Deserialize)]
struct Expense {
    id: String,
    employee: String,
    amount_cents: u64,
}

#[derive(Debug, Serialize, Deserialize)]
enum Decision {
    Approve,
    Reject { reason: String },
}

async fn expense_approval(ctx: WorkflowCtx, expense: Expense) -> Result<String, WorkflowError> {
    let token = format!("expense:{}", expense.id);
    let who = expense.employee.clone();
    ctx.step("ask_manager", move |_| {
        let who = who.clone();
        async move {
            println!("  [step] emailed the manager about {who}'s expense");
            Ok(())
        }
    })
    .await?;

    let mut decision: Option<Decision> = ctx.wait_for_signal_timeout(&token, DAY).await?;
    if decision.is_none() {
        ctx.step("remind_manager", |_| async {
            println!("  [step] a day passed: reminded the manager");
            Ok(())
        })
        .await?;
        decision = ctx.wait_for_signal_timeout(&token, 2 * DAY).await?;
    }
    let amount = expense.amount_cents;
    let outcome = match decision {
        Some(Decision::Approve) => {
            ctx.step("pay", move |s| async move {
                println!("  [step] paid {}.{:02} (idempotency key {})", amount / 100, amount % 100, s.step_id());
                Ok(())
            })
            .await?;
            "approved and paid".to_string()
        }
        Some(Decision::Reject { reason }) => format!("rejected: {reason}"),
        None => {
            ctx.step("escalate", |_| async {
                println!("  [step] no answer in 3 days: escalated to the director");
                Ok(())
            })
            .await?;
            "escalated".to_string()
        }
    };
    Ok(outcome)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::temp_dir().join(format!("durable-expense-{}.db", durable::uuid::Uuid::now_v7().simple()));
    let clock = VirtualClock::starting_2026();
    let engine = Engine::builder().store(SqliteStore::open(&path)?).clock(clock.clone()).build()?;
    engine.register("expense_approval", 1, expense_approval);

    let quick = Expense { id: "exp-1".into(), employee: "ada".into(), amount_cents: 12_900 };
    let slow = Expense { id: "exp-2".into(), employee: "bob".into(), amount_cents: 99_00 };
    println!("day 0: two expenses submitted");
    let a = engine.start("expense_approval", &quick, StartOptions::id("exp-1")).await?;
    let b = engine.start("expense_approval", &slow, StartOptions::id("exp-2")).await?;
    for id in [&a.id, &b.id] {
        engine.wait_until_suspended_or_terminal(id).await?;
    }

    println!("day 1: a day passes");
    let mut events = engine.subscribe();
    clock.advance(DAY);
    let mut reminded = 0;
    while reminded < 2 {
        if let EngineEvent::StepCompleted { name, .. } = events.recv().await? {
            reminded += usize::from(name == "remind_manager");
        }
    }
    for id in [&a.id, &b.id] {
        engine.wait_until_suspended_or_terminal(id).await?;
    }

    println!("day 2: the manager approves exp-1 (a signal to token \"expense:exp-1\")");
    clock.advance(DAY);
    engine.signal("expense:exp-1", &Decision::Approve).await?;
    println!("  exp-1: {}", engine.wait_for_run(&a.id).await?.output::<String>()?);

    println!("day 3: nobody answers exp-2");
    clock.advance(DAY);
    println!("  exp-2: {}", engine.wait_for_run(&b.id).await?.output::<String>()?);

    // A late answer for a run that already settled finds no wait: it is buffered for the next
    // wait on the token, which will never come. An operator lists and purges such leftovers
    // (`durable signals list`, `durable signals purge <token>`).
    println!("day 4: the manager answers exp-2 too late");
    engine.signal("expense:exp-2", &Decision::Approve).await?;
    for key in engine.buffered(&BufferedQuery::signals().prefix("expense:")).await? {
        println!("  buffered: {} {} on {:?}, nobody waits for it", key.count, key.kind, key.key);
        let purged = engine.purge_buffered(&BufferedPurge::signals(&key.key)).await?;
        println!("  purged {purged}");
    }

    engine.shutdown().await;
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    Ok(())
}
