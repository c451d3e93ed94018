//! A quick local measurement of step commits per second: N runs commit M steps each,
//! concurrently, with `Durability::Full` and `Durability::Normal`.
//!
//! ```text
//! cargo run --release -p durable-store-sqlite --example commit_throughput -- [runs] [steps]
//! ```
//!
//! It prints numbers; nothing asserts them (`cargo xtask bench` is the place for tracked
//! benchmarks).

use std::sync::Arc;
use std::time::Instant;

use durable_core::{
    Checkpoint, CheckpointStatus, Claim, ClaimOutcome, Commit, NewRun, Payload, RunId, RunStatus, StepKind, Store,
    TurnEnd,
};
use durable_store_sqlite::{Durability, SqliteOptions, SqliteStore};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let runs: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(1_000);
    let steps: u32 = args.next().map(|a| a.parse()).transpose()?.unwrap_or(5);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    for durability in [Durability::Full, Durability::Normal] {
        let path = std::env::temp_dir().join(format!("durable-throughput-{}-{durability:?}.db", std::process::id()));
        let store = Arc::new(SqliteStore::open_with(&path, SqliteOptions::new().durability(durability))?);
        rt.block_on(async {
            for i in 0..runs {
                let id = RunId::from(format!("run-{i}"));
                store
                    .create_run(NewRun {
                        trace_context: None,
                        admission: None,
                        id: id.clone(),
                        workflow: "bench".into(),
                        version: 1,
                        namespace: "default".into(),
                        input: Payload::encode(&i)?,
                        tags: vec![],
                        priority: 0,
                        parent: None,
                        created_at: 1,
                        start_at: None,
                    })
                    .await?;
                let claim = Claim { run_id: id, owner: "bench".into(), lease_until: u64::MAX, now: 2 };
                assert!(matches!(store.claim_run(claim).await?, ClaimOutcome::Acquired { .. }));
            }
            Ok::<_, Box<dyn std::error::Error>>(())
        })?;
        let before = store.stats();
        let started = Instant::now();
        rt.block_on(async {
            let tasks: Vec<_> = (0..runs)
                .map(|i| {
                    let store = store.clone();
                    tokio::spawn(async move {
                        let id = RunId::from(format!("run-{i}"));
                        for seq in 0..steps {
                            let mut c = Commit::new(id.clone(), "bench", 10 + u64::from(seq));
                            let mut cp = Checkpoint::new(
                                id.clone(),
                                seq,
                                "step",
                                StepKind::Step,
                                CheckpointStatus::Completed,
                                10 + u64::from(seq),
                            );
                            cp.output = Some(Payload::encode(&format!("output of step {seq} of run {i}")).unwrap());
                            cp.attempts = 1;
                            c.checkpoints.push(cp);
                            if seq + 1 == steps {
                                c.end = Some(TurnEnd::Settle {
                                    status: RunStatus::Completed,
                                    output: Some(Payload::null()),
                                    error: None,
                                });
                            }
                            store.commit(c).await.unwrap();
                        }
                    })
                })
                .collect();
            for t in tasks {
                t.await.unwrap();
            }
        });
        let elapsed = started.elapsed();
        let after = store.stats();
        let commits = (after.writes - before.writes) as f64;
        let transactions = after.transactions - before.transactions;
        println!(
            "{durability:?}: {runs} runs x {steps} commits = {commits} commits in {:.3} s: {:.0} commits/s, \
             {transactions} transactions ({:.1} commits per transaction)",
            elapsed.as_secs_f64(),
            commits / elapsed.as_secs_f64(),
            commits / transactions as f64,
        );
        drop(store);
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
        }
    }
    Ok(())
}
