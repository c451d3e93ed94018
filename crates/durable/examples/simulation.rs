//! Seeded simulation of your own workflow: a money transfer (debit, wait for the bank's
//! confirmation signal, a cooling-off sleep, credit) runs on one or two engines sharing a
//! store while the store fails 5% of its calls, acknowledgements get lost, engines crash in
//! the middle of store calls and restart — all chosen from a seed. Every seed must hold the
//! invariants of durable execution and end exactly as the fault-free run; a seed that does not
//! is printed with the way to reproduce it (`Simulation::seeded(seed)`).
//!
//! ```text
//! cargo run --example simulation            # 500 seeds
//! cargo run --example simulation -- 5000    # more
//! ```
//!
//! Put the same loop in a `#[test]` of your crate (feature `testing`) to run it in CI.

use std::time::{Duration, Instant};

use durable::testing::sim::Simulation;
use durable::{Engine, StepError, WorkflowCtx, WorkflowError};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Transfer {
    from: String,
    to: String,
    cents: u64,
}

async fn transfer(ctx: WorkflowCtx, t: Transfer) -> Result<String, WorkflowError> {
    let cents = t.cents;
    let debit: String = ctx
        .step("debit", move |step| async move {
            // The step id is the idempotency key a real bank API would take.
            Ok::<_, StepError>(format!("debit-{cents}-{}", step.step_id()))
        })
        .await?;
    let confirmed: bool = ctx.wait_for_signal(&format!("confirm-{}", t.from)).await?;
    if !confirmed {
        return Ok(format!("{debit} reversed"));
    }
    ctx.sleep(Duration::from_secs(3600)).await; // cooling-off period, durably
    let credit: String = ctx
        .step("credit", move |_| {
            let to = t.to.clone();
            async move { Ok(format!("credit-{to}-{cents}")) }
        })
        .await?;
    Ok(format!("{debit} {credit}"))
}

fn register(engine: &Engine) {
    engine.register("transfer", 1, transfer);
}

fn main() {
    let seeds: u64 = std::env::args().nth(1).and_then(|n| n.parse().ok()).unwrap_or(500);
    let started = Instant::now();
    let (mut crashes, mut faults) = (0, 0);
    for seed in 0..seeds {
        let report = Simulation::seeded(seed)
            .register(register)
            .start("transfer", "t1", &Transfer { from: "ada".into(), to: "bob".into(), cents: 1_250 })
            .start("transfer", "t2", &Transfer { from: "cy".into(), to: "dee".into(), cents: 99 })
            .signal("confirm-ada", &true, Duration::from_secs(20))
            .signal("confirm-cy", &false, Duration::from_secs(40))
            .run()
            .unwrap_or_else(|failure| {
                eprintln!("{failure}");
                std::process::exit(1)
            });
        crashes += report.crashes;
        faults += report.store_faults;
        if seed == 0 {
            println!("seed 0 ended: t1 = {:?}, t2 = {:?}", report.runs["t1"].output, report.runs["t2"].output);
        }
    }
    println!(
        "{seeds} seeds held every invariant in {:.1} s ({crashes} engine crashes, {faults} store faults)",
        started.elapsed().as_secs_f64()
    );
}
