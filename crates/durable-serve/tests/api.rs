//! The JSON API on a real SQLite file and on the real PostgreSQL server (a scratch schema):
//! every endpoint, paging through 1,000 runs, every action, bad input answered with 4xx JSON
//! errors, the token, `/metrics` counts, the event stream, and the OpenAPI document.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use durable::store::Store;
use durable::{Engine, RunId, RunStatus, StartOptions, StepError, WorkflowCtx, WorkflowError};
use durable_serve::{ServeConfig, router};
use serde_json::{Value, json};
use tower::ServiceExt;

const TOKEN: &str = "t0ken";

/// A store to test on, a worker that executes the test workflows, and the router (its engine
/// a client one with the workflows registered, so a retry with a new input can start them).
struct Env {
    worker: Engine,
    server: Engine,
    router: Router,
    /// While false, the `job` workflow's step fails.
    fixed: Arc<AtomicBool>,
}

fn register(engine: &Engine, fixed: &Arc<AtomicBool>) {
    let fixed = fixed.clone();
    engine.register("job", 1, move |ctx: WorkflowCtx, fail: bool| {
        let fixed = fixed.clone();
        async move {
            let n: u32 = ctx
                .step("work", move |_| {
                    let fixed = fixed.clone();
                    async move {
                        if fail && !fixed.load(Ordering::SeqCst) { Err(StepError::fatal("it broke")) } else { Ok(7) }
                    }
                })
                .await?;
            Ok::<_, WorkflowError>(n)
        }
    });
    engine.register("waiter", 1, |ctx: WorkflowCtx, token: String| async move {
        ctx.step("book", |_| async { Ok(1u32) }).compensate(|_| async { Ok(()) }).await?;
        let got: Value = ctx.wait_for_signal(&token).await?;
        Ok::<_, WorkflowError>(got)
    });
    engine.register("bulk", 1, |_: WorkflowCtx, n: u32| async move { Ok::<_, WorkflowError>(n) });
}

impl Env {
    fn new(store: Arc<dyn Store>) -> Env {
        let fixed = Arc::new(AtomicBool::new(false));
        let worker = Engine::builder().shared_store(store.clone()).build().unwrap();
        register(&worker, &fixed);
        let server = Engine::builder().shared_store(store).client_only().build().unwrap();
        register(&server, &fixed);
        let config =
            ServeConfig { token: Some(TOKEN.into()), poll: Duration::from_millis(100), ..ServeConfig::default() };
        let router = router(server.clone(), config);
        Env { worker, server, router, fixed }
    }

    async fn call(&self, method: &str, uri: &str, body: Option<Value>, token: bool) -> (StatusCode, Value) {
        let mut req = Request::builder().method(method).uri(uri);
        if token {
            req = req.header("authorization", format!("Bearer {TOKEN}"));
        }
        let body = body.map_or_else(Body::empty, |b| Body::from(b.to_string()));
        let response = self.router.clone().oneshot(req.body(body).unwrap()).await.unwrap();
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), 16 << 20).await.unwrap();
        let value =
            serde_json::from_slice(&bytes).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()));
        (status, value)
    }

    async fn get(&self, uri: &str) -> Value {
        let (status, body) = self.call("GET", uri, None, false).await;
        assert_eq!(status, StatusCode::OK, "GET {uri}: {body}");
        body
    }

    async fn post(&self, uri: &str, body: Value) -> Value {
        let (status, out) = self.call("POST", uri, Some(body), true).await;
        assert_eq!(status, StatusCode::OK, "POST {uri}: {out}");
        out
    }

    async fn settle(&self, id: &str) -> RunStatus {
        let outcome = tokio::time::timeout(Duration::from_secs(60), self.worker.wait_for_run(&RunId::from(id))).await;
        outcome.expect("the run settles in time").unwrap().status()
    }

    async fn suspended(&self, id: &str) {
        let id = RunId::from(id);
        tokio::time::timeout(Duration::from_secs(60), self.worker.wait_until_suspended_or_terminal(&id))
            .await
            .expect("the run suspends in time")
            .unwrap();
    }

    async fn shutdown(self) {
        self.worker.shutdown().await;
        self.server.shutdown().await;
    }
}

/// An error answer: its status and code, and a message.
fn assert_error(got: &(StatusCode, Value), status: StatusCode, code: &str) {
    assert_eq!(got.0, status, "{}", got.1);
    assert_eq!(got.1["error"]["code"], code, "{}", got.1);
    assert!(!got.1["error"]["message"].as_str().unwrap_or_default().is_empty(), "{}", got.1);
}

/// Every endpoint and action on `store`.
async fn every_endpoint(store: Arc<dyn Store>) {
    let env = Env::new(store);
    let w = &env.worker;
    // Known runs: 7 completed, 2 failed, 1 cancelled (issue 18, acceptance 2).
    for i in 0..7 {
        w.start("job", &false, StartOptions::id(format!("ok-{i}"))).await.unwrap();
    }
    for i in 0..2 {
        w.start("job", &true, StartOptions::id(format!("bad-{i}"))).await.unwrap();
    }
    w.start("waiter", &"never".to_string(), StartOptions::id("gone")).await.unwrap();
    for i in 0..7 {
        assert_eq!(env.settle(&format!("ok-{i}")).await, RunStatus::Completed);
    }
    for i in 0..2 {
        assert_eq!(env.settle(&format!("bad-{i}")).await, RunStatus::Failed);
    }
    env.suspended("gone").await;
    let cancelled = env.post("/api/runs/gone/cancel", json!({})).await;
    assert_eq!(cancelled["run"]["status"], "cancelled");

    // /metrics and /api/workflows count exactly those.
    let (status, text) = env.call("GET", "/metrics", None, false).await;
    assert_eq!(status, StatusCode::OK);
    let text = text.as_str().unwrap().to_string();
    for (wf, st, n) in
        [("job", "completed", 7), ("job", "failed", 2), ("job", "pending", 0), ("waiter", "cancelled", 1)]
    {
        let line = format!("durable_runs{{workflow=\"{wf}\",status=\"{st}\"}} {n}\n");
        assert!(text.contains(&line), "{line} in {text}");
    }
    assert_eq!(text.lines().filter(|l| l.starts_with("durable_runs{")).count(), 16, "{text}");
    let workflows = env.get("/api/workflows").await;
    assert_eq!(
        workflows,
        json!([{"workflow": "job", "counts": {"completed": 7, "failed": 2}}, {"workflow": "waiter", "counts": {"cancelled": 1}}])
    );

    // Lists and filters.
    let all = env.get("/api/runs").await;
    assert_eq!(all["runs"].as_array().unwrap().len(), 10);
    assert_eq!(all["next_cursor"], Value::Null);
    let failed = env.get("/api/runs?status=failed,cancelled").await;
    let mut ids: Vec<&str> = failed["runs"].as_array().unwrap().iter().map(|r| r["id"].as_str().unwrap()).collect();
    ids.sort();
    assert_eq!(ids, ["bad-0", "bad-1", "gone"]);
    assert_eq!(env.get("/api/runs?workflow=waiter").await["runs"][0]["id"], "gone");
    assert_eq!(env.get("/api/runs?namespace=elsewhere").await["runs"], json!([]));
    assert_eq!(env.get("/api/runs?created_before=1").await["runs"], json!([]));
    assert_eq!(env.get("/api/runs?limit=3").await["runs"].as_array().unwrap().len(), 3);

    // A run, its timeline and history.
    let bad = env.get("/api/runs/bad-0").await;
    assert_eq!(bad["run"]["status"], "failed");
    assert_eq!(bad["timeline"][0]["name"], "work");
    assert_eq!(bad["timeline"][0]["status"], "failed");
    assert!(bad["timeline"][0]["duration_ms"].is_u64(), "{bad}");
    assert_eq!(bad["children"], json!([]));
    let history = env.get("/api/runs/bad-0/history").await;
    assert_eq!(history.as_array().unwrap().len(), 1);
    assert!(history[0].get("duration_ms").is_none());
    for path in ["/api/schedules", "/api/queues", "/api/workers", "/api/openapi.json", "/healthz", "/"] {
        let (status, _) = env.call("GET", path, None, false).await;
        assert_eq!(status, StatusCode::OK, "{path}");
    }
    assert_eq!(env.get("/healthz").await, json!({"ok": true}));
    assert!(env.get("/api/queues").await["admission"].is_array());

    // Retry: back to pending, then completed by the worker once the step works.
    env.fixed.store(true, Ordering::SeqCst);
    let retried = env.post("/api/runs/bad-0/retry", json!({})).await;
    assert_eq!(retried["run"]["id"], "bad-0");
    assert!(["pending", "running", "completed"].contains(&retried["run"]["status"].as_str().unwrap()), "{retried}");
    assert_eq!(env.settle("bad-0").await, RunStatus::Completed);
    // Retry with a new input: a new run.
    let new = env.post("/api/runs/bad-1/retry", json!({"input": false})).await;
    let new_id = new["run"]["id"].as_str().unwrap().to_string();
    assert_ne!(new_id, "bad-1");
    assert_eq!(new["run"]["input"], false);
    assert_eq!(env.settle(&new_id).await, RunStatus::Completed);
    assert_eq!(env.get("/api/runs/bad-1").await["run"]["status"], "failed");
    // `"input": null` is an input, not a plain retry: `job` takes a bool, so it is refused
    // naming the input, and bad-1 stays as it was.
    let (status, out) = env.call("POST", "/api/runs/bad-1/retry", Some(json!({"input": null})), true).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{out}");
    assert_eq!(env.get("/api/runs/bad-1").await["run"]["status"], "failed");
    // A completed run is not retried.
    assert_error(
        &env.call("POST", "/api/runs/ok-0/retry", Some(json!({})), true).await,
        StatusCode::CONFLICT,
        "conflict",
    );

    // Signal: delivered to the waiting run, which completes with it; then buffered.
    w.start("waiter", &"go:1".to_string(), StartOptions::id("sig")).await.unwrap();
    env.suspended("sig").await;
    let delivered = env.post("/api/signals", json!({"token": "go:1", "payload": {"ok": true}})).await;
    assert_eq!(delivered["delivery"]["status"], "delivered");
    assert_eq!(delivered["delivery"]["run_id"], "sig");
    assert_eq!(env.settle("sig").await, RunStatus::Completed);
    assert_eq!(env.get("/api/runs/sig").await["run"]["output"], json!({"ok": true}));
    let buffered = env.post("/api/signals", json!({"token": "nobody", "payload": 1})).await;
    assert_eq!(buffered["delivery"]["status"], "buffered");

    // Cancel with compensation: the undo runs, then it ends cancelled.
    w.start("waiter", &"never".to_string(), StartOptions::id("undo")).await.unwrap();
    env.suspended("undo").await;
    env.post("/api/runs/undo/cancel", json!({"compensate": true})).await;
    assert_eq!(env.settle("undo").await, RunStatus::Cancelled);
    let undone = env.get("/api/runs/undo").await;
    assert!(undone["timeline"].as_array().unwrap().iter().any(|c| c["name"] == "undo:book"), "{undone}");
    // A finished run is answered as it is.
    assert_eq!(env.post("/api/runs/ok-1/cancel", json!({})).await["run"]["status"], "completed");

    // Delete: an active run only with force.
    w.start("waiter", &"never".to_string(), StartOptions::id("a/b:c")).await.unwrap();
    env.suspended("a/b:c").await;
    assert_eq!(env.get("/api/runs/a%2Fb%3Ac").await["run"]["id"], "a/b:c");
    assert_error(&env.call("DELETE", "/api/runs/a%2Fb%3Ac", None, true).await, StatusCode::CONFLICT, "conflict");
    assert_eq!(env.call("DELETE", "/api/runs/a%2Fb%3Ac?force=true", None, true).await.1, json!({"deleted": 1}));
    assert_eq!(env.call("DELETE", "/api/runs/ok-2", None, true).await.1, json!({"deleted": 1}));
    assert_error(&env.call("GET", "/api/runs/ok-2", None, false).await, StatusCode::NOT_FOUND, "not_found");

    // Bad input: 4xx JSON errors, nothing changed.
    let bad_calls: &[(&str, &str, Option<Value>, StatusCode, &str)] = &[
        ("GET", "/api/runs?status=done", None, StatusCode::BAD_REQUEST, "bad_request"),
        ("GET", "/api/runs?limit=0", None, StatusCode::BAD_REQUEST, "bad_request"),
        ("GET", "/api/runs?limit=501", None, StatusCode::BAD_REQUEST, "bad_request"),
        ("GET", "/api/runs?limit=ten", None, StatusCode::BAD_REQUEST, "bad_request"),
        ("GET", "/api/runs?created_after=-1", None, StatusCode::BAD_REQUEST, "bad_request"),
        ("GET", "/api/runs?cursor=garbage", None, StatusCode::BAD_REQUEST, "bad_request"),
        // Values no run can have (PostgreSQL refused the NUL with a 500 once).
        ("GET", "/api/runs?workflow=%00", None, StatusCode::BAD_REQUEST, "bad_request"),
        ("GET", "/api/runs?tag=a%00b", None, StatusCode::BAD_REQUEST, "bad_request"),
        ("GET", "/api/runs?namespace=%00", None, StatusCode::BAD_REQUEST, "bad_request"),
        ("GET", "/api/runs?cursor=1:%00", None, StatusCode::BAD_REQUEST, "bad_request"),
        ("GET", "/api/events?workflow=%00", None, StatusCode::BAD_REQUEST, "bad_request"),
        ("GET", "/api/runs?colour=red", None, StatusCode::BAD_REQUEST, "bad_request"),
        ("GET", "/api/runs?limit=1&limit=2", None, StatusCode::BAD_REQUEST, "bad_request"),
        ("GET", "/api/runs/nope", None, StatusCode::NOT_FOUND, "not_found"),
        ("GET", "/api/runs/nope/history", None, StatusCode::NOT_FOUND, "not_found"),
        ("GET", "/api/runs/a%0Ab", None, StatusCode::BAD_REQUEST, "bad_request"),
        ("GET", "/api/nothing", None, StatusCode::NOT_FOUND, "not_found"),
        ("GET", "/api/events?status=done", None, StatusCode::BAD_REQUEST, "bad_request"),
        ("GET", "/api/events?runs=ok-3", None, StatusCode::BAD_REQUEST, "bad_request"),
        ("GET", "/api/events?runs=%5B%22a%0Ab%22%5D", None, StatusCode::BAD_REQUEST, "bad_request"),
        ("GET", "/api/events?run=nope", None, StatusCode::NOT_FOUND, "not_found"),
        ("GET", "/api/events?run=ok-3&status=failed", None, StatusCode::BAD_REQUEST, "bad_request"),
        ("POST", "/api/runs/nope/retry", Some(json!({})), StatusCode::NOT_FOUND, "not_found"),
        ("POST", "/api/runs/ok-3/cancel", Some(json!({"compensate": "yes"})), StatusCode::BAD_REQUEST, "bad_request"),
        ("POST", "/api/runs/ok-3/cancel", Some(json!([1])), StatusCode::BAD_REQUEST, "bad_request"),
        ("POST", "/api/runs/ok-3/retry", Some(json!({"inputs": 1})), StatusCode::BAD_REQUEST, "bad_request"),
        // An array is not an object, though serde would read a struct from its fields.
        ("POST", "/api/runs/ok-3/retry", Some(json!([])), StatusCode::BAD_REQUEST, "bad_request"),
        ("POST", "/api/signals", Some(json!(["x", 1])), StatusCode::BAD_REQUEST, "bad_request"),
        ("POST", "/api/signals", Some(json!({"token": "x"})), StatusCode::BAD_REQUEST, "bad_request"),
        ("POST", "/api/signals", Some(json!({"token": " ", "payload": 1})), StatusCode::BAD_REQUEST, "bad_request"),
        ("DELETE", "/api/runs/nope", None, StatusCode::NOT_FOUND, "not_found"),
        ("DELETE", "/api/runs/ok-3?force=maybe", None, StatusCode::BAD_REQUEST, "bad_request"),
        ("PUT", "/api/runs", None, StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed"),
    ];
    for (method, uri, body, status, code) in bad_calls {
        let got = env.call(method, uri, body.clone(), true).await;
        assert_error(&got, *status, code);
    }
    let (status, body) =
        env.call("POST", "/api/signals", Some(json!({"token": "x", "payload": "y".repeat(2 << 20)})), true).await;
    assert_error(&(status, body), StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large");
    let long = "x".repeat(600);
    assert_error(
        &env.call("GET", &format!("/api/runs/{long}"), None, false).await,
        StatusCode::BAD_REQUEST,
        "bad_request",
    );
    // Not garbled JSON: an unparsable body.
    let req = Request::post("/api/signals")
        .header("authorization", format!("Bearer {TOKEN}"))
        .body(Body::from("{nope"))
        .unwrap();
    assert_eq!(env.router.clone().oneshot(req).await.unwrap().status(), StatusCode::BAD_REQUEST);

    // Without the token (or with a wrong one), actions are refused and change nothing.
    for (method, uri) in [("POST", "/api/runs/ok-3/cancel"), ("DELETE", "/api/runs/ok-3"), ("POST", "/api/signals")] {
        assert_error(&env.call(method, uri, Some(json!({})), false).await, StatusCode::UNAUTHORIZED, "unauthorized");
        let req = Request::builder()
            .method(method)
            .uri(uri)
            .header("authorization", "Bearer wrong")
            .body(Body::empty())
            .unwrap();
        assert_eq!(env.router.clone().oneshot(req).await.unwrap().status(), StatusCode::UNAUTHORIZED);
    }
    assert_eq!(env.get("/api/runs/ok-3").await["run"]["status"], "completed");

    // Paging through 1,000 runs (plus the others): every run once, no gaps.
    let bulk = (0..1_000u32).map(|i| ("bulk", i, StartOptions::id(format!("bulk-{i:04}"))));
    env.server.start_many(bulk).await.unwrap();
    let mut seen = HashSet::new();
    let mut pages = 0;
    let mut uri = "/api/runs?workflow=bulk&limit=37".to_string();
    loop {
        let page = env.get(&uri).await;
        pages += 1;
        for run in page["runs"].as_array().unwrap() {
            assert!(seen.insert(run["id"].as_str().unwrap().to_string()), "{} twice", run["id"]);
        }
        match page["next_cursor"].as_str() {
            Some(cursor) => {
                let cursor: String = cursor.bytes().map(|b| format!("%{b:02X}")).collect();
                uri = format!("/api/runs?workflow=bulk&limit=37&cursor={cursor}");
            }
            None => break,
        }
    }
    assert_eq!(seen.len(), 1_000);
    assert_eq!(pages, 1_000usize.div_ceil(37));
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_endpoint_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let store = durable::SqliteStore::open(dir.path().join("api.db")).unwrap();
    every_endpoint(Arc::new(store)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_endpoint_on_postgres() {
    use durable_store_postgres::test_support::{ScratchSchema, url_or_skip};
    let Some(url) = url_or_skip("every_endpoint_on_postgres") else { return };
    let schema = ScratchSchema::new(&url, "serve_api").await.unwrap();
    every_endpoint(Arc::new(schema.connect().await.unwrap())).await;
}

/// Reads with `protect_reads` need the token; the page, its assets, the health check and the
/// OpenAPI document do not; the event stream takes it as `access_token` too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protected_reads_need_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let store = durable::SqliteStore::open(dir.path().join("p.db")).unwrap();
    let engine = Engine::builder().store(store).client_only().build().unwrap();
    let config = ServeConfig { token: Some(TOKEN.into()), protect_reads: true, ..ServeConfig::default() };
    let app = router(engine.clone(), config);
    let status = |uri: &str, auth: Option<&str>| {
        let app = app.clone();
        let mut req = Request::get(uri);
        if let Some(t) = auth {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        let req = req.body(Body::empty()).unwrap();
        async move { app.oneshot(req).await.unwrap().status() }
    };
    for uri in ["/api/runs", "/api/workflows", "/metrics", "/api/events"] {
        assert_eq!(status(uri, None).await, StatusCode::UNAUTHORIZED, "{uri}");
        assert_eq!(status(uri, Some("nope")).await, StatusCode::UNAUTHORIZED, "{uri}");
    }
    assert_eq!(status("/api/runs", Some(TOKEN)).await, StatusCode::OK);
    // The scheme is case-insensitive.
    for scheme in ["bearer", "BEARER"] {
        let req = Request::get("/api/runs").header("authorization", format!("{scheme} {TOKEN}"));
        assert_eq!(app.clone().oneshot(req.body(Body::empty()).unwrap()).await.unwrap().status(), StatusCode::OK);
    }
    assert_eq!(status(&format!("/api/events?access_token={TOKEN}"), None).await, StatusCode::OK);
    for uri in ["/", "/healthz", "/api/openapi.json"] {
        assert_eq!(status(uri, None).await, StatusCode::OK, "{uri}");
    }
    engine.shutdown().await;
}

/// A token read from a secret file ends in a newline: whitespace around the configured token is
/// no part of it, so the token without it is accepted (and nothing else is).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whitespace_around_the_configured_token_is_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let store = durable::SqliteStore::open(dir.path().join("t.db")).unwrap();
    let engine = Engine::builder().store(store).client_only().build().unwrap();
    let config = ServeConfig { token: Some(format!(" {TOKEN}\n")), protect_reads: true, ..ServeConfig::default() };
    let app = router(engine.clone(), config);
    for (given, expected) in [(TOKEN, StatusCode::OK), ("nope", StatusCode::UNAUTHORIZED)] {
        let req = Request::get("/api/runs").header("authorization", format!("Bearer {given}"));
        assert_eq!(app.clone().oneshot(req.body(Body::empty()).unwrap()).await.unwrap().status(), expected, "{given}");
    }
    engine.shutdown().await;
}

/// Without a token (`--dev`), an action a browser sends from another origin's page is refused
/// and changes nothing, and so is any request addressed to a host that is not loopback; the
/// server's own page, and clients outside a browser, act as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dev_server_refuses_actions_from_pages_of_other_origins() {
    let dir = tempfile::tempdir().unwrap();
    let store = durable::SqliteStore::open(dir.path().join("d.db")).unwrap();
    let engine = Engine::builder().store(store).client_only().build().unwrap();
    let app = router(engine.clone(), ServeConfig::default());
    let send = |headers: &[(&str, &str)], token: &str| {
        let mut req = Request::post("/api/signals").header("host", "127.0.0.1:8080");
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        let body = Body::from(json!({ "token": token, "payload": 1 }).to_string());
        let app = app.clone();
        async move { app.oneshot(req.body(body).unwrap()).await.unwrap().status() }
    };
    let refused: [&[(&str, &str)]; 4] = [
        &[("sec-fetch-site", "cross-site")],
        &[("sec-fetch-site", "same-site"), ("origin", "http://127.0.0.1:3000")],
        &[("origin", "http://evil.example")],
        &[("origin", "null")],
    ];
    for headers in refused {
        assert_eq!(send(headers, "refused").await, StatusCode::FORBIDDEN, "{headers:?}");
    }
    let allowed: [&[(&str, &str)]; 3] = [
        &[],
        &[("sec-fetch-site", "same-origin"), ("origin", "http://127.0.0.1:8080")],
        &[("origin", "http://127.0.0.1:8080")],
    ];
    for headers in allowed {
        assert_eq!(send(headers, "allowed").await, StatusCode::OK, "{headers:?}");
    }
    let buffered = engine.buffered(&durable::BufferedQuery::signals()).await.unwrap();
    let tokens: Vec<(&str, u64)> = buffered.iter().map(|k| (k.key.as_str(), k.count)).collect();
    assert_eq!(tokens, [("allowed", 3)], "only the allowed signals were sent");
    // A page whose own name was made to resolve to 127.0.0.1 (DNS rebinding) is the server's
    // origin to the browser, but names its own host: refused, reads too.
    for (host, expected) in [
        ("evil.example:8080", StatusCode::FORBIDDEN),
        ("127.0.0.1.nip.io:8080", StatusCode::FORBIDDEN),
        ("localhost:8080", StatusCode::OK),
        ("LOCALHOST", StatusCode::OK),
        ("[::1]:8080", StatusCode::OK),
        ("127.0.0.2:8080", StatusCode::OK),
    ] {
        let req = Request::get("/api/runs").header("host", host).body(Body::empty()).unwrap();
        assert_eq!(app.clone().oneshot(req).await.unwrap().status(), expected, "{host}");
    }
    engine.shutdown().await;
}

/// The OpenAPI document lists every route the router serves, and nothing else.
#[test]
fn the_openapi_document_matches_the_routes() {
    let doc = durable_serve::openapi_document();
    assert_eq!(doc["openapi"], "3.1.0");
    let mut documented = HashSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            documented.insert((method.to_uppercase(), path.clone()));
        }
    }
    let served: HashSet<(String, String)> =
        durable_serve::ROUTES.iter().map(|(m, p)| (m.to_string(), p.to_string())).collect();
    assert_eq!(documented, served);
}

/// Opens `GET /api/events?<query>` on a real TCP connection and reads past the response's
/// headers: the view was read before they were sent.
async fn open_events(
    addr: std::net::SocketAddr,
    query: &str,
) -> tokio::io::Lines<tokio::io::BufReader<tokio::net::TcpStream>> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET /api/events?{query} HTTP/1.1\r\nhost: x\r\naccept: text/event-stream\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut lines = BufReader::new(stream).lines();
    loop {
        let line = lines.next_line().await.unwrap().unwrap();
        if line.is_empty() {
            return lines;
        }
    }
}

/// The next event of a stream [`open_events`] opened: its kind and data.
async fn next_event(lines: &mut tokio::io::Lines<tokio::io::BufReader<tokio::net::TcpStream>>) -> (String, Value) {
    tokio::time::timeout(Duration::from_secs(30), async {
        let mut kind = String::new();
        loop {
            let line = lines.next_line().await.unwrap().unwrap();
            if let Some(k) = line.strip_prefix("event: ") {
                kind = k.to_string();
            }
            if let Some(data) = line.strip_prefix("data: ") {
                return (kind.clone(), serde_json::from_str::<Value>(data).unwrap());
            }
        }
    })
    .await
    .expect("an event arrives")
}

/// A run that changes status produces a `run` event on a connected stream (a real TCP
/// connection), at once through the engine's subscription, whether the stream follows the run
/// itself or names it in `runs` beside a filter it does not match (a dashboard page of runs
/// older than the filter's newest 500); a run deleted, a `deleted` event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_event_stream_sends_a_run_that_changes() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(durable::SqliteStore::open(dir.path().join("e.db")).unwrap());
    let env = Env::new(store);
    env.worker.start("waiter", &"go:e".to_string(), StartOptions::id("ev")).await.unwrap();
    env.suspended("ev").await;
    // Polling slower than the test may take: the change must arrive through the subscription
    // of the server's engine (its own cancel).
    let config = ServeConfig { token: Some(TOKEN.into()), poll: Duration::from_secs(3600), ..ServeConfig::default() };
    let app = router(env.server.clone(), config);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(durable_serve::serve(listener, app, std::future::pending()));

    let mut run_view = open_events(addr, "run=ev").await;
    let mut named_view = open_events(addr, "workflow=other&runs=%5B%22ev%22%5D").await;
    env.post("/api/runs/ev/cancel", json!({})).await;
    for lines in [&mut run_view, &mut named_view] {
        let event = next_event(lines).await;
        assert_eq!(event.0, "run");
        assert_eq!(event.1["id"], "ev");
        assert_eq!(event.1["status"], "cancelled");
    }
    // Deleted: a `deleted` event names it, at once (the engine's `RunDeleted`).
    let (status, _) = env.call("DELETE", "/api/runs/ev", None, true).await;
    assert_eq!(status, StatusCode::OK);
    for lines in [&mut run_view, &mut named_view] {
        assert_eq!(next_event(lines).await, ("deleted".to_string(), json!({ "id": "ev" })));
    }
    server.abort();
    env.shutdown().await;
}

/// While a remote step runs, the run's detail lists its task; once done, the step's timeline
/// entry carries the log lines its handler wrote, with their attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_steps_timeline_entry_carries_its_handlers_logs() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(durable::SqliteStore::open(dir.path().join("logs.db")).unwrap());
    let env = Env::new(store.clone());
    env.worker.register("resize", 1, |ctx: WorkflowCtx, width: u32| async move {
        let done: u32 = ctx.remote_step("resize", &width).await?;
        Ok::<_, WorkflowError>(done)
    });
    // The handler logs, says it started, and finishes when the test lets it.
    let (started_tx, started) = tokio::sync::oneshot::channel::<()>();
    let (go, go_rx) = tokio::sync::oneshot::channel::<()>();
    let hooks = Arc::new(std::sync::Mutex::new(Some((started_tx, go_rx))));
    let worker = durable::Worker::builder()
        .store(store)
        .handle("resize", move |ctx: durable::TaskContext, width: u32| {
            let hooks = hooks.lock().unwrap().take();
            async move {
                ctx.log("info", "resized", Some(json!({ "width": width })));
                if let Some((started_tx, go_rx)) = hooks {
                    started_tx.send(()).ok();
                    go_rx.await.ok();
                }
                Ok::<_, StepError>(width / 2)
            }
        })
        .build();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(async move {
        worker
            .run(async {
                stopped.await.ok();
            })
            .await
    });
    env.worker.start("resize", &640u32, StartOptions::id("img-1")).await.unwrap();

    // While the handler runs, the run's detail lists its task as claimed.
    started.await.unwrap();
    let detail = env.get("/api/runs/img-1").await;
    let tasks = detail["tasks"].as_array().unwrap_or_else(|| panic!("no tasks: {detail}"));
    assert_eq!(tasks.len(), 1, "{detail}");
    assert_eq!(tasks[0]["state"], "claimed", "{detail}");
    go.send(()).ok();
    assert_eq!(env.settle("img-1").await, RunStatus::Completed);

    let detail = env.get("/api/runs/img-1").await;
    let step = detail["timeline"].as_array().unwrap().iter().find(|c| c["name"] == "resize").cloned();
    let step = step.unwrap_or_else(|| panic!("no resize checkpoint: {detail}"));
    let logs = step["logs"].as_array().unwrap_or_else(|| panic!("no logs on the remote step: {step}"));
    assert_eq!(logs.len(), 1, "{step}");
    assert_eq!(logs[0]["message"], "resized");
    assert_eq!(logs[0]["level"], "info");
    assert_eq!(logs[0]["attempt"], 1);
    assert_eq!(logs[0]["data"]["width"], 640);
    assert_eq!(detail["tasks"], json!([]), "a settled run has no pending tasks: {detail}");
    stop.send(()).ok();
    running.await.unwrap();
    env.shutdown().await;
}
