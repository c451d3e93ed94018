//! The workflows, queues and settings of the flow-control tests, shared by the worker process
//! (`src/bin/flow_worker.rs`) and the tests that start runs as clients.

use std::fs::File;
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use durable::{Engine, EngineConfig, QueueOptions, WorkflowCtx, WorkflowError, WorkflowOptions};
use serde_json::Value;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn unix_us() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_micros()).unwrap_or(0)
}

/// Appends one line with one `write` (the file is in append mode, so it lands whole).
fn append(ledger: &File, line: String) {
    let mut f = ledger;
    f.write_all(line.as_bytes()).expect("append to the ledger");
}

/// The engines' settings: short leases so a killed holder's slot comes back in seconds.
pub fn config() -> EngineConfig {
    let mut config = EngineConfig::default();
    // Short by default, so a killed holder's slot comes back in seconds; the scenarios without
    // kills set a long one (LEASE_MS), so a worker starved of CPU never loses a run mid-step
    // (its step would run again elsewhere: at least once, not the limit being broken).
    config.lease_ttl = Duration::from_millis(env_u64("LEASE_MS", 2_000));
    config.poll_interval = Duration::from_millis(50);
    config.orphan_poll_interval = Duration::from_millis(250);
    config.wait_poll_interval = Duration::from_millis(25);
    config.recheck_interval = Duration::from_millis(200);
    config.admission_recheck = Duration::from_secs(1);
    config
}

/// Registers the three workflows and the two queues on `engine`; steps write to `ledger`.
pub fn register(engine: &Engine, ledger: Option<Arc<File>>) {
    engine.register_queue("api", QueueOptions::default().rate(10, Duration::from_secs(1))).expect("queue api");
    engine.register_queue("solo", QueueOptions::default().concurrency(1)).expect("queue solo");
    let work = Duration::from_millis(env_u64("WORK_MS", 5));
    let hog = std::env::var("HOG").is_ok_and(|v| v == "1");
    let pid = std::process::id();
    let l = ledger.clone();
    engine.register_with(
        "keyed",
        1,
        WorkflowOptions::default().concurrency(|job: &Value| job["key"].as_str().unwrap_or("").to_string(), 2),
        move |ctx: WorkflowCtx, job: Value| {
            let l = l.clone();
            async move {
                let key = job["key"].as_str().unwrap_or("").to_string();
                let run = ctx.run_id().clone();
                ctx.step("work", move |sc| {
                    let (l, key, run) = (l.clone(), key.clone(), run.clone());
                    let attempt = sc.attempt();
                    async move {
                        if let Some(l) = &l {
                            append(l, format!("start {key} {run} {} {} {attempt}\n", unix_us(), std::process::id()));
                        }
                        tokio::time::sleep(work).await;
                        if let Some(l) = &l {
                            append(l, format!("end {key} {run} {}\n", unix_us()));
                        }
                        Ok(())
                    }
                })
                .await?;
                Ok::<_, WorkflowError>(())
            }
        },
    );
    let l = ledger.clone();
    engine.register("rated", 1, move |ctx: WorkflowCtx, _n: u32| {
        let l = l.clone();
        async move {
            for i in 0..4 {
                let l = l.clone();
                ctx.step(format!("call-{i}"), move |sc| {
                    let l = l.clone();
                    async move {
                        if let Some(l) = &l {
                            let at = sc.admitted_at().expect("a queued step knows its admission");
                            append(l, format!("call {} {} {at}\n", sc.run_id(), sc.seq()));
                        }
                        Ok(())
                    }
                })
                .queue("api")
                .await?;
            }
            Ok::<_, WorkflowError>(())
        }
    });
    let l = ledger;
    engine.register("hog", 1, move |ctx: WorkflowCtx, n: u32| {
        let l = l.clone();
        async move {
            ctx.step("hold", move |sc| {
                let l = l.clone();
                async move {
                    if let Some(l) = &l {
                        append(l, format!("hold {} {pid}\n", sc.run_id()));
                    }
                    if hog {
                        std::future::pending::<()>().await;
                    }
                    Ok(())
                }
            })
            .queue("solo")
            .await?;
            Ok::<_, WorkflowError>(n)
        }
    });
}
