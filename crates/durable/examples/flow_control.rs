//! Flow control: a per-customer CRM sync that runs at most once at a time per customer (a
//! singleton workflow, with a bounded line of waiting syncs), and whose API calls go through a
//! step queue limited to 10 calls per second — limits kept in the store, so they hold across
//! every process that shares it.
//!
//! It starts 3 syncs for each of 3 customers (and a fourth for one of them, refused with
//! `queue_full`), prints when each sync starts and ends, what the queue holds once a second,
//! and the API calls counted per wall-clock second; it checks that no second saw more than 10
//! and that no customer ever had two syncs at once. It takes 2 to 3 seconds. The README's
//! "Flow control" shows the code between `// readme:begin` and `// readme:end` (a test in
//! `tests/` keeps them equal).
//!
//! ```text
//! cargo run --example flow_control
//! ```
//!
//! While it runs, `durable queues --db <the printed path>` shows the queue and the keys, and
//! `durable runs show sync-acme-3 --db …` where a waiting sync stands in its customer's line.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use durable::{
    Engine, EngineEvent, QueueOptions, RunId, SqliteStore, StartOptions, StepError, WorkflowCtx, WorkflowError,
    WorkflowOptions, protocol,
};
use serde::{Deserialize, Serialize};

/// One sync of a customer's records.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct SyncJob {
    customer: String,
    n: u32,
}

// readme:begin
/// A sync pushes three pages of a customer's records to the CRM. Each push is a step sent
/// through the queue `crm-api`: it runs only when the queue admits it; until then its run is
/// parked durably (it holds no worker) and wakes when the next rate window opens.
async fn sync_customer(ctx: WorkflowCtx, job: SyncJob) -> Result<u32, WorkflowError> {
    let mut pushed = 0;
    for page in 0..3 {
        let customer = job.customer.clone();
        pushed +=
            ctx.step(format!("push-page-{page}"), move |_| crm_push(customer.clone(), page)).queue("crm-api").await?;
    }
    Ok(pushed)
}

fn register(engine: &Engine) -> durable::Result<()> {
    // One sync per customer at a time: more wait `pending` in line for the customer's key,
    // at most 2 of them; a start beyond that fails with `Error::QueueFull` (`queue_full`).
    let one_per_customer =
        WorkflowOptions::default().singleton(|job: &SyncJob| job.customer.clone()).max_queue_depth(2);
    engine.register_with("customer_sync", 1, one_per_customer, sync_customer);
    // The CRM allows 10 calls per second: across every engine sharing the store.
    engine.register_queue("crm-api", QueueOptions::default().rate(10, Duration::from_secs(1)))
}
// readme:end

/// When each API call was made (epoch milliseconds).
static CALLS: Mutex<Vec<u64>> = Mutex::new(Vec::new());

/// The CRM's API: 50 ms a call.
async fn crm_push(customer: String, page: u32) -> Result<u32, StepError> {
    let _ = (customer, page);
    CALLS.lock().expect("not poisoned").push(epoch_ms());
    tokio::time::sleep(Duration::from_millis(50)).await;
    Ok(100)
}

fn epoch_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// `17:51:40` (UTC) of an epoch second.
fn clock(second: u64) -> String {
    let s = second % 86_400;
    format!("{:02}:{:02}:{:02}", s / 3600, s % 3600 / 60, s % 60)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("durable.db");
    let engine = Engine::builder().store(SqliteStore::open(&db)?).build()?;
    if !engine.store().capabilities().admission {
        return Err(
            "this store keeps no admission records (Capabilities::admission): it cannot run flow control".into()
        );
    }
    register(&engine)?;
    println!("database: {} (while it runs: durable queues --db <it>)", db.display());
    let mut events = engine.subscribe();

    let started = Instant::now();
    let mut ids = Vec::new();
    for n in 1..=3 {
        for customer in ["acme", "globex", "initech"] {
            let job = SyncJob { customer: customer.into(), n };
            let run = engine.start("customer_sync", &job, StartOptions::id(format!("sync-{customer}-{n}"))).await?;
            ids.push(run.id);
        }
    }
    // A fourth sync of acme: one runs and two wait already, the most `max_queue_depth` allows.
    let job = SyncJob { customer: "acme".into(), n: 4 };
    match engine.start("customer_sync", &job, StartOptions::id("sync-acme-4")).await {
        Err(e) if e.code() == Some("queue_full") => println!("sync-acme-4 refused: {e}"),
        other => return Err(format!("sync-acme-4 should be refused with queue_full, got {other:?}").into()),
    }

    let at = |t: Instant| format!("+{:.2}s", t.duration_since(started).as_secs_f64());
    let customer_of = |id: &RunId| id.as_str().split('-').nth(1).unwrap_or_default().to_string();
    let mut running: HashMap<String, RunId> = HashMap::new();
    let mut begun: Vec<RunId> = Vec::new();
    let mut settled = 0;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.tick().await;
    while settled < ids.len() {
        if started.elapsed() > Duration::from_secs(60) {
            return Err("the syncs did not finish within 60 s".into());
        }
        tokio::select! {
            event = events.recv() => match event? {
                // A sync's first turn is its start (a waiting sync has none until admitted).
                EngineEvent::TurnStarted { run_id, .. } if !begun.contains(&run_id) => {
                    if let Some(other) = running.insert(customer_of(&run_id), run_id.clone()) {
                        // Its end may just not be reported yet: the store says.
                        let other_run = engine.get_run(&other).await?.ok_or("run vanished")?;
                        if !other_run.status.is_terminal() {
                            return Err(format!("{run_id} started while {other} of the same customer ran").into());
                        }
                    }
                    println!("{}  {run_id} starts", at(Instant::now()));
                    begun.push(run_id);
                }
                EngineEvent::RunSettled { run_id, status } => {
                    let customer = customer_of(&run_id);
                    if running.get(&customer) == Some(&run_id) {
                        running.remove(&customer);
                    }
                    let pushed: u32 = engine.wait_for_run(&run_id).await?.output()?;
                    println!("{}  {run_id} ends {status}: {pushed} records pushed", at(Instant::now()));
                    settled += 1;
                }
                _ => {}
            },
            _ = tick.tick() => {
                // What `durable queues` shows, once a second.
                for g in engine.admission_stats().await? {
                    if g.gate == protocol::queue_gate("default", "crm-api") {
                        println!("{}  crm-api: {} calls this second, {} steps waiting", at(Instant::now()), g.window_count, g.waiting);
                    }
                }
            }
        }
    }

    // The calls per wall-clock second: the rate windows are aligned to the period, so every
    // engine counts the same seconds.
    let mut per_second: BTreeMap<u64, u32> = BTreeMap::new();
    for ms in CALLS.lock().expect("not poisoned").iter() {
        *per_second.entry(ms / 1000).or_default() += 1;
    }
    let seconds: Vec<String> = per_second.iter().map(|(s, n)| format!("{} {n}", clock(*s))).collect();
    println!("API calls per second (UTC): {}", seconds.join(", "));
    let most = per_second.values().copied().max().unwrap_or(0);
    let total: u32 = per_second.values().sum();
    engine.shutdown().await;
    if most > 10 {
        return Err(format!("{most} calls in one second: the queue admits 10").into());
    }
    println!(
        "{} syncs, {total} API calls in {:.1} s: at most {most} calls in a second, one sync per customer at a time",
        ids.len(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
