//! A worker process for the PostgreSQL fleet tests, built the way users build theirs: it embeds
//! the workflow code, connects to the shared database, consumes the store-backed run queue
//! (woken by `LISTEN/NOTIFY`), and runs `Engine::run_worker` until SIGTERM.
//!
//! ```text
//! usage:
//!   fleet_pg_worker <url> <schema> work <index>   execute `pgfleet` and `ping` runs; print
//!                                                 `committed <run> <seq>` per step, `turn <run>
//!                                                 <unix_us>` per turn (with PRINT_TURNS=1, else
//!                                                 `recovered <run>` per turn that took over an
//!                                                 expired lease),
//!                                                 `aborted <run>` per turn a store error cut off,
//!                                                 `settled <run> <status>` per run it settled
//!   fleet_pg_worker <url> <schema> start <n>      (a client) start n `pgfleet` runs, send each its
//!                                                 `go:<run>` signal, wait for all of them
//! ```
//!
//! Every step of `pgfleet` first writes one row into `<schema>.ledger` (its step id and the
//! worker's index): the side effect whose duplicates the tests count.
//!
//! Settings from the environment (milliseconds): QUEUE_POLL_MS (the queue's safety-net poll,
//! default 50), POLL_MS (the engine's pollers, default 100), ORPHAN_POLL_MS (default 250),
//! LEASE_MS (default 2000), DRAIN_MS (default 5000). APP_NAME: the connections'
//! application_name (default `durable-fleet`).

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use durable::{
    Backoff, Engine, EngineConfig, EngineEvent, PostgresOptions, PostgresStore, QueueTransport, RunStatus,
    StartOptions, WorkflowCtx, WorkflowError,
};
use durable_tests::{out, print_events};
use tokio::task::JoinSet;

const STEPS: u32 = 10;

fn env_ms(name: &str, default: u64) -> Duration {
    Duration::from_millis(std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default))
}

fn config() -> EngineConfig {
    let mut config = EngineConfig::default();
    config.lease_ttl = env_ms("LEASE_MS", 2_000);
    config.poll_interval = env_ms("POLL_MS", 100);
    config.orphan_poll_interval = env_ms("ORPHAN_POLL_MS", 250);
    config.wait_poll_interval = Duration::from_millis(100);
    config.recheck_interval = Duration::from_millis(200);
    config.store_retry_backoff = Duration::from_millis(50);
    config.drain_timeout = env_ms("DRAIN_MS", 5_000);
    config
}

fn unix_us() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros()).unwrap_or(0)
}

/// Where steps record their side effect.
#[derive(Clone)]
struct Ledger {
    store: PostgresStore,
    insert: Arc<String>,
    worker: i32,
}

impl Ledger {
    async fn record(&self, step_id: &str) -> Result<(), durable::StepError> {
        let client = self.store.pool().get().await?;
        client.execute(self.insert.as_str(), &[&step_id, &self.worker]).await?;
        Ok(())
    }
}

async fn pgfleet(ctx: WorkflowCtx, ledger: Ledger) -> Result<u32, WorkflowError> {
    let mut sum = 0;
    for i in 0..STEPS {
        let ledger = ledger.clone();
        sum += ctx
            .step(format!("s{i}"), move |s| {
                let ledger = ledger.clone();
                async move {
                    ledger.record(&s.step_id()).await?;
                    Ok(i)
                }
            })
            // A connection killed under the insert is retried (the tests terminate them).
            .retry(20, Backoff::Fixed(Duration::from_millis(50)))
            .await?;
        if i == 3 {
            ctx.sleep(Duration::from_millis(20)).await;
        }
        if i == 6 {
            let go: u32 = ctx.wait_for_signal(&format!("go:{}", ctx.run_id())).await?;
            sum += go;
        }
    }
    Ok(sum)
}

/// Calls `f` again while it fails with a retryable store error (a terminated connection), as a
/// client of a database that may drop connections does.
async fn retrying<T, F, Fut>(mut f: F) -> Result<T, durable::Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, durable::Error>>,
{
    let mut tries = 0;
    loop {
        match f().await {
            Err(durable::Error::Store(e)) if e.is_retryable() && tries < 50 => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            other => return other,
        }
    }
}

async fn connect(url: &str, schema: &str) -> Result<PostgresStore, durable::PostgresError> {
    let app = std::env::var("APP_NAME").unwrap_or_else(|_| "durable-fleet".into());
    let options = PostgresOptions::new().schema(schema).pool_size(8).application_name(app).notify_channel("durable");
    PostgresStore::connect_with(url, options).await
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    match run().await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // One line, like a user's worker would print it.
            eprintln!("fleet_pg_worker: {}", e.to_string().replace('\n', " "));
            std::process::ExitCode::from(2)
        }
    }
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (url, schema, mode) = match (args.first(), args.get(1), args.get(2)) {
        (Some(u), Some(s), Some(m)) => (u.clone(), s.clone(), m.clone()),
        _ => return Err("usage: fleet_pg_worker <url> <schema> work <index> | start <n>".into()),
    };
    let store = connect(&url, &schema).await?;
    let transport = QueueTransport::new(Arc::new(store.clone()))
        .poll_interval(env_ms("QUEUE_POLL_MS", 50))
        .with_wakeups(store.queue_wakeups().await?);
    let builder = Engine::builder().store(store.clone()).transport(transport).config(config());
    match mode.as_str() {
        "start" => {
            let n: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(100);
            let engine = builder.client_only().build()?;
            // The client only needs the workflow's name and input type.
            engine.register("pgfleet", 1, |_: WorkflowCtx, _: ()| async { Ok::<u32, WorkflowError>(0) });
            let ids: Vec<String> = (0..n).map(|i| format!("pgfleet-{i}")).collect();
            let mut tasks = JoinSet::new();
            for chunk in ids.chunks(50) {
                let (engine, chunk) = (engine.clone(), chunk.to_vec());
                tasks.spawn(async move {
                    for id in chunk {
                        // Starting is idempotent on the id: a start whose connection was cut
                        // off is simply sent again.
                        retrying(|| engine.start("pgfleet", &(), StartOptions::id(id.clone()))).await?;
                        // Usually buffered: the run waits for it after its seventh step. (A
                        // signal sent again after a lost answer may be delivered twice: the
                        // second copy stays buffered, unread.)
                        let token = format!("go:{id}");
                        retrying(|| engine.signal(&token, &1u32)).await?;
                    }
                    Ok::<_, durable::Error>(())
                });
            }
            while let Some(r) = tasks.join_next().await {
                r??;
            }
            out(format_args!("started {n}"));
            for id in ids {
                let run_id = durable::RunId::new(id.clone());
                let outcome = retrying(|| engine.wait_for_run(&run_id)).await?;
                if outcome.status() != RunStatus::Completed {
                    out(format_args!("not completed {id} {}", outcome.status()));
                }
            }
            engine.shutdown().await;
            out(format_args!("all done"));
        }
        "work" => {
            let index: i32 = args.get(3).and_then(|s| s.parse().ok()).ok_or("work needs a worker index")?;
            let engine = builder.build()?;
            let print_turns = std::env::var("PRINT_TURNS").is_ok_and(|v| v == "1");
            tokio::spawn(print_events(engine.subscribe(), move |event| match event {
                EngineEvent::StepCompleted { run_id, seq, .. } => out(format_args!("committed {run_id} {seq}")),
                EngineEvent::TurnStarted { run_id, recovered } if print_turns => {
                    out(format_args!("turn {run_id} {} recovered={recovered}", unix_us()))
                }
                EngineEvent::TurnStarted { run_id, recovered: true } => out(format_args!("recovered {run_id}")),
                EngineEvent::TurnAborted { run_id, error } => {
                    out(format_args!("aborted {run_id} {}", error.to_string().replace('\n', " ")))
                }
                EngineEvent::RunSettled { run_id, status } => out(format_args!("settled {run_id} {status}")),
                _ => {}
            }));
            let ledger = Ledger {
                store: store.clone(),
                insert: Arc::new(format!("INSERT INTO \"{schema}\".ledger (step_id, worker) VALUES ($1, $2)")),
                worker: index,
            };
            engine.register("pgfleet", 1, move |ctx: WorkflowCtx, _: ()| pgfleet(ctx, ledger.clone()));
            engine.register("ping", 1, |ctx: WorkflowCtx, n: u32| async move {
                Ok::<_, WorkflowError>(ctx.step("pong", move |_| async move { Ok(n) }).await?)
            });
            out(format_args!("ready {}", engine.owner()));
            let in_time = engine.run_worker(durable::shutdown_signal()).await;
            out(format_args!("drained in_time={in_time}"));
        }
        other => return Err(format!("unknown mode {other:?}").into()),
    }
    Ok(())
}
