//! `/metrics` on a real SQLite file: the engine's counters and histograms from the recorder
//! the server was given, followed by the store gauges; and `install_recorder` installing the
//! process's global recorder once.

use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use durable::metrics_names as names;
use durable::{Engine, PrometheusRecorder, RunStatus, StartOptions, WorkflowCtx, WorkflowError};
use durable_serve::{ServeConfig, router};
use tower::ServiceExt;

/// Three runs of `job` complete on an engine recording into the server's recorder (a local
/// one: the test's current-thread runtime runs every task of the engine on this thread).
#[test]
fn metrics_renders_the_engine_counters_and_the_store_gauges_once_each() {
    let recorder = PrometheusRecorder::new();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let text = metrics::with_local_recorder(&recorder, || {
        rt.block_on(async {
            let dir = tempfile::tempdir().unwrap();
            let store = durable::SqliteStore::open(dir.path().join("m.db")).unwrap();
            let engine = Engine::builder().store(store).build().unwrap();
            engine.register("job", 1, |ctx: WorkflowCtx, n: u32| async move {
                let n: u32 = ctx.step("work", move |_| async move { Ok(n + 1) }).await?;
                Ok::<_, WorkflowError>(n)
            });
            for i in 0..3u32 {
                let id = engine.start("job", &i, StartOptions::id(format!("job-{i}"))).await.unwrap().id;
                let outcome = tokio::time::timeout(Duration::from_secs(60), engine.wait_for_run(&id)).await;
                assert_eq!(outcome.expect("settles in time").unwrap().status(), RunStatus::Completed);
            }
            let config = ServeConfig { metrics: Some(recorder.clone()), ..ServeConfig::default() };
            let app = router(engine.clone(), config);
            let response = app.oneshot(Request::get("/metrics").body(Body::empty()).unwrap()).await.unwrap();
            assert_eq!(response.status(), StatusCode::OK);
            let bytes = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
            engine.shutdown().await;
            String::from_utf8(bytes.to_vec()).unwrap()
        })
    });
    // The engine's metrics, described, and the store's gauges after them.
    let settled = format!("{}{{workflow=\"job\",outcome=\"completed\"}} 3\n", names::RUNS_SETTLED);
    assert!(text.contains(&settled), "{settled} in {text}");
    assert!(text.contains(&format!("# HELP {} ", names::RUNS_SETTLED)), "{text}");
    let steps = format!("{}_count{{workflow=\"job\",kind=\"step\",outcome=\"completed\"}} 3\n", names::STEP_DURATION);
    assert!(text.contains(&steps), "{steps} in {text}");
    let inf = format!(
        "{}_bucket{{workflow=\"job\",kind=\"step\",outcome=\"completed\",le=\"+Inf\"}} 3\n",
        names::STEP_DURATION
    );
    assert!(text.contains(&inf), "{inf} in {text}");
    let gauge = "durable_runs{workflow=\"job\",status=\"completed\"} 3\n";
    assert!(text.find(gauge) > text.find(&settled), "{gauge} after the engine's metrics in {text}");
    // Every family is typed once.
    let mut types: Vec<&str> = text.lines().filter(|l| l.starts_with("# TYPE ")).collect();
    let n = types.len();
    types.sort();
    types.dedup();
    assert_eq!(types.len(), n, "{text}");
}

/// The first `install_recorder` becomes the global recorder: what any thread records shows in
/// its render. A second one is not installed and renders nothing of it.
#[test]
fn install_recorder_installs_the_global_recorder_once() {
    let first = durable_serve::install_recorder();
    let second = durable_serve::install_recorder();
    std::thread::spawn(|| metrics::counter!("durable_test_hits_total", "from" => "a thread").increment(2))
        .join()
        .unwrap();
    // (The other test records into a local recorder; only this family is asserted.)
    let hits = "# TYPE durable_test_hits_total counter\ndurable_test_hits_total{from=\"a thread\"} 2\n";
    assert!(first.render().contains(hits), "{}", first.render());
    assert!(!second.render().contains("durable_test_hits_total"), "{}", second.render());
}
