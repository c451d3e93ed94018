//! A quick throughput number for `PostgresStore` (reported, never asserted).
//!
//! Concurrent runs, each: create, claim, `commits - 1` step commits and a last commit that also
//! settles the run, all at once; then one run committing alone, for the latency of one commit.
//! The same workload runs with batching (the default) and without (`max_batch(1)`), each on a
//! scratch schema dropped afterwards.
//!
//! ```text
//! DURABLE_PG_URL=postgres://postgres@127.0.0.1:5432/test \
//!     cargo run --release -p durable-store-postgres --example throughput -- [runs=1000] [commits=5]
//! ```

use std::time::{Duration, Instant};

use durable_core::{
    Checkpoint, CheckpointStatus, Claim, ClaimOutcome, Commit, NewRun, Payload, RunId, RunStatus, StepKind, Store,
    TurnEnd,
};
use durable_store_postgres::deadpool_postgres::tokio_postgres::{self, NoTls};
use durable_store_postgres::{PostgresOptions, PostgresStore};

const T0: u64 = 1_700_000_000_000;

async fn drop_schema(url: &str, schema: &str) {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.expect("connect");
    tokio::spawn(connection);
    client.batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE")).await.expect("drop schema");
}

fn checkpoint(run_id: &RunId, seq: u32) -> Checkpoint {
    let mut cp = Checkpoint::new(run_id.clone(), seq, "step", StepKind::Step, CheckpointStatus::Completed, T0);
    cp.output = Some(Payload::from_trusted(format!("{{\"seq\":{seq},\"note\":\"a small step result\"}}")));
    cp
}

/// One run's life; returns how many commits it made.
async fn life(store: PostgresStore, id: String, commits: u32) -> u32 {
    let run_id = RunId::from(id.as_str());
    let new = NewRun {
        trace_context: None,
        admission: None,
        id: run_id.clone(),
        workflow: "bench".into(),
        version: 1,
        namespace: "default".into(),
        input: Payload::from_trusted("{\"n\":1}"),
        tags: vec![],
        priority: 0,
        parent: None,
        created_at: T0,
        start_at: None,
    };
    store.create_run(new).await.expect("create");
    let claim = Claim { run_id: run_id.clone(), owner: "bench".into(), lease_until: T0 + 60_000, now: T0 };
    assert!(matches!(store.claim_run(claim).await.expect("claim"), ClaimOutcome::Acquired { .. }));
    for seq in 0..commits {
        let mut c = Commit::new(run_id.clone(), "bench", T0 + u64::from(seq));
        c.checkpoints.push(checkpoint(&run_id, seq));
        if seq + 1 == commits {
            c.end = Some(TurnEnd::Settle {
                status: RunStatus::Completed,
                output: Some(Payload::from_trusted("1")),
                error: None,
            });
        }
        store.commit(c).await.expect("commit");
    }
    commits
}

async fn measure(url: &str, label: &str, options: PostgresOptions, runs: usize, commits: u32) {
    let schema = format!("durable_bench_{}_{label}", std::process::id());
    drop_schema(url, &schema).await;
    let store = PostgresStore::connect_with(url, options.schema(&schema)).await.expect("connect");

    let before = store.stats();
    let started = Instant::now();
    let tasks: Vec<_> = (0..runs).map(|i| tokio::spawn(life(store.clone(), format!("run-{i}"), commits))).collect();
    let mut total_commits = 0u64;
    for t in tasks {
        total_commits += u64::from(t.await.expect("task"));
    }
    let elapsed = started.elapsed();
    let after = store.stats();
    let (writes, batches) = (after.writes - before.writes, after.batches - before.batches);
    println!(
        "{label:>10}: {runs} concurrent runs x {commits} commits: {:.2} s, {:.0} commits/s, {:.0} writes/s; \
         {writes} writes in {batches} transactions ({:.1} writes per round trip)",
        elapsed.as_secs_f64(),
        total_commits as f64 / elapsed.as_secs_f64(),
        writes as f64 / elapsed.as_secs_f64(),
        writes as f64 / batches.max(1) as f64,
    );

    // One run alone: the latency of one commit, and its round trips.
    let solo = RunId::from("solo");
    life(store.clone(), "solo".into(), 1).await;
    let before = store.stats();
    let n = 200u32;
    let started = Instant::now();
    for seq in 1..=n {
        let mut c = Commit::new(solo.clone(), "bench", T0);
        c.checkpoints.push(checkpoint(&solo, seq));
        // The run settled in `life`; the lease was released, so take it again first.
        if seq == 1 {
            let claim = Claim { run_id: solo.clone(), owner: "bench".into(), lease_until: T0 + 60_000, now: T0 };
            let _ = store.claim_run(claim).await;
        }
        let _ = store.commit(c).await;
    }
    let per_commit = started.elapsed() / n;
    let after = store.stats();
    println!(
        "{label:>10}: sequential commits: {:.0} µs each, {:.2} round trips per commit",
        per_commit.as_secs_f64() * 1e6,
        (after.round_trips() - before.round_trips()) as f64 / f64::from(n + 1),
    );
    drop(store);
    drop_schema(url, &schema).await;
    tokio::time::sleep(Duration::from_millis(10)).await;
}

#[tokio::main]
async fn main() {
    let Ok(url) = std::env::var("DURABLE_PG_URL") else {
        eprintln!(
            "DURABLE_PG_URL is not set; run: DURABLE_PG_URL=postgres://postgres@127.0.0.1:5432/test cargo run --release -p durable-store-postgres --example throughput"
        );
        return;
    };
    let mut args = std::env::args().skip(1);
    let runs: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1000);
    let commits: u32 = args.next().and_then(|a| a.parse().ok()).unwrap_or(5);
    measure(&url, "batched", PostgresOptions::new(), runs, commits).await;
    measure(&url, "unbatched", PostgresOptions::new().max_batch(1), runs, commits).await;
}
