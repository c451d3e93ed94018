//! # durable-serve
//!
//! `durable serve`: a JSON API, Prometheus metrics and a web dashboard over any durable store
//! (SQLite or PostgreSQL), in one process, assets embedded.
//!
//! ```text
//! GET    /api/runs?status=a,b&workflow=&namespace=&tag=&parent=&created_after=&created_before=&limit=&cursor=
//! GET    /api/runs/{id}              the run, its timeline, children, waiters, tasks, admission
//! GET    /api/runs/{id}/history      its checkpoints as stored
//! GET    /api/workflows              workflows and their runs by status
//! GET    /api/schedules | /api/queues | /api/workers
//! GET    /api/events?status=&workflow=&runs=&run=   server-sent events: `run` when a run appears or changes
//! GET    /api/openapi.json           the OpenAPI 3.1 document of all of it
//! GET    /metrics                    Prometheus text
//! GET    /healthz                    {"ok": true}
//! POST   /api/runs/{id}/retry        {} or {"input": ...}             (token)
//! POST   /api/runs/{id}/cancel       {"compensate": bool}             (token)
//! POST   /api/signals                {"token": "...", "payload": ...} (token)
//! DELETE /api/runs/{id}[?force=true]                                  (token)
//! GET    /                           the dashboard
//! ```
//!
//! Errors are `{"error": {"code": "<snake_case>", "message": "…"}}` with a 4xx or 5xx status
//! ([`ApiError`]).
//!
//! ## What it does not do
//!
//! It executes no workflow code. Its [`Engine`] is an operator one
//! ([`EngineBuilder::client_only`](durable::EngineBuilder::client_only)): a retry sets a run
//! back to `pending`, a signal records a payload; the workers with the workflows registered
//! continue the runs. The actions are the same functions as the command line's ([`ops`]).
//!
//! ## Security
//!
//! With [`ServeConfig::token`] set, POST and DELETE need `Authorization: Bearer <token>`
//! (compared in constant time), and with [`ServeConfig::protect_reads`] the reads too (except
//! `/`, `/assets/…`, `/healthz` and `/api/openapi.json`; `/api/events` also takes the token as
//! `?access_token=`, for browsers' `EventSource`). Without a token every call is allowed:
//! [`check_listen`] refuses that except for a development server on a loopback address.
//! Bodies are limited to 1 MiB; ids, query parameters and bodies are validated.
//!
//! ## Tasks it spawns
//!
//! None of its own: axum's per-connection tasks, and per `/api/events` connection a stream
//! polled by its connection.
//!
//! ## Example
//!
//! ```no_run
//! # async fn example(engine: durable::Engine) -> std::io::Result<()> {
//! let config = durable_serve::ServeConfig { token: Some("s3cret".into()), ..Default::default() };
//! let router = durable_serve::router(engine, config);
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! durable_serve::serve(listener, router, std::future::pending()).await
//! # }
//! ```
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod api;
mod assets;
mod error;
mod events;
mod extract;
mod metrics;
mod openapi;
pub mod ops;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{Method, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use durable::Engine;
use durable::PrometheusRecorder;

pub use error::ApiError;
pub use metrics::install_recorder;

type Result<T, E = ApiError> = std::result::Result<T, E>;

/// How the server answers.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// The bearer token mutating calls need (`None`: none needed — a development server).
    /// Whitespace around it is ignored; an empty one lets nobody act.
    pub token: Option<String>,
    /// Reads need the token too.
    pub protect_reads: bool,
    /// How often an `/api/events` connection reads its view (default 1 s); it also reads it at
    /// once when the engine's subscription reports an event.
    pub poll: Duration,
    /// The Prometheus recorder rendered at `/metrics` ([`install_recorder`]); `None`: one of
    /// the server's own, not installed (only the store gauges show).
    pub metrics: Option<PrometheusRecorder>,
}

impl Default for ServeConfig {
    fn default() -> Self {
        ServeConfig { token: None, protect_reads: false, poll: Duration::from_secs(1), metrics: None }
    }
}

/// What the handlers share.
#[derive(Debug)]
pub(crate) struct AppState {
    pub(crate) engine: Engine,
    pub(crate) config: ServeConfig,
    pub(crate) metrics: PrometheusRecorder,
}

/// Every route as `(method, path)`, in the router's path syntax. The OpenAPI document lists
/// the same (a test checks both ways).
pub const ROUTES: &[(&str, &str)] = &[
    ("GET", "/api/runs"),
    ("GET", "/api/runs/{id}"),
    ("DELETE", "/api/runs/{id}"),
    ("GET", "/api/runs/{id}/history"),
    ("POST", "/api/runs/{id}/retry"),
    ("POST", "/api/runs/{id}/cancel"),
    ("POST", "/api/signals"),
    ("GET", "/api/workflows"),
    ("GET", "/api/schedules"),
    ("GET", "/api/queues"),
    ("GET", "/api/workers"),
    ("GET", "/api/events"),
    ("GET", "/api/openapi.json"),
    ("GET", "/metrics"),
    ("GET", "/healthz"),
    ("GET", "/"),
    ("GET", "/assets/{name}"),
];

/// The OpenAPI 3.1 document served at `/api/openapi.json`.
pub fn openapi_document() -> serde_json::Value {
    openapi::document()
}

/// The API and the dashboard over `engine`'s store (see the [crate docs](crate)).
pub fn router(engine: Engine, mut config: ServeConfig) -> Router {
    // Whitespace around the token is no part of it (a secret file's last newline).
    config.token = config.token.map(|t| t.trim().to_string());
    let metrics = config.metrics.clone().unwrap_or_default();
    let state = Arc::new(AppState { engine, config, metrics });
    Router::new()
        .route("/api/runs", get(api::list_runs))
        .route("/api/runs/{id}", get(api::get_run).delete(api::delete))
        .route("/api/runs/{id}/history", get(api::history))
        .route("/api/runs/{id}/retry", post(api::retry))
        .route("/api/runs/{id}/cancel", post(api::cancel))
        .route("/api/signals", post(api::signal))
        .route("/api/workflows", get(api::workflows))
        .route("/api/schedules", get(api::schedules))
        .route("/api/queues", get(api::queues))
        .route("/api/workers", get(api::workers))
        .route("/api/events", get(events::events))
        .route("/api/openapi.json", get(openapi::openapi))
        .route("/metrics", get(metrics::metrics))
        .route("/healthz", get(|| async { axum::Json(serde_json::json!({ "ok": true })) }))
        .route("/", get(assets::index))
        .route("/assets/{name}", get(assets::asset))
        .fallback(|| async { ApiError::not_found("no such endpoint; see /api/openapi.json") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                axum::http::StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "this endpoint does not take that method; see /api/openapi.json",
            )
        })
        .layer(middleware::from_fn_with_state(state.clone(), authorize))
        .layer(DefaultBodyLimit::max(extract::MAX_BODY))
        .with_state(state)
}

/// Paths anyone may read, even with [`ServeConfig::protect_reads`]: the page (so the token can
/// be typed in), its assets, the health check and the API's description.
fn always_open(path: &str) -> bool {
    path == "/" || path.starts_with("/assets/") || path == "/healthz" || path == "/api/openapi.json"
}

/// Checks the bearer token of mutating calls (and of reads with `protect_reads`). Without a
/// token (`--dev`), refuses a mutating call a browser sent from another origin's page instead.
async fn authorize(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    let reading = matches!(*request.method(), Method::GET | Method::HEAD);
    let Some(token) = &state.config.token else {
        let refused = foreign_host(&request).or_else(|| if reading { None } else { cross_site(&request) });
        if let Some(why) = refused {
            return ApiError::new(axum::http::StatusCode::FORBIDDEN, "forbidden", why).into_response();
        }
        return next.run(request).await;
    };
    if reading && (!state.config.protect_reads || always_open(request.uri().path())) {
        return next.run(request).await;
    }
    let bearer = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        // The scheme is case-insensitive (RFC 9110): `bearer` and `BEARER` are `Bearer`.
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, t)| t.trim().to_string());
    let given = bearer.or_else(|| query_token(&request));
    match given {
        // An empty token (a library caller's, never checked by `check_listen`) matches nothing.
        Some(given) if !given.is_empty() && constant_time_eq(given.as_bytes(), token.as_bytes()) => {
            next.run(request).await
        }
        Some(_) => ApiError::unauthorized("the bearer token is wrong; pass the server's --token (DURABLE_TOKEN)")
            .into_response(),
        None => ApiError::unauthorized(
            "this call needs the server's token: send `Authorization: Bearer <token>` (the --token or DURABLE_TOKEN the server was started with)",
        )
        .into_response(),
    }
}

/// `?access_token=` of `/api/events` (EventSource cannot set headers), percent-decoded.
fn query_token(request: &Request) -> Option<String> {
    if request.uri().path() != "/api/events" {
        return None;
    }
    let axum::extract::Query(pairs) =
        axum::extract::Query::<Vec<(String, String)>>::try_from_uri(request.uri()).ok()?;
    pairs.into_iter().find(|(k, _)| k == "access_token").map(|(_, v)| v)
}

/// Compares two byte strings in time that depends on their lengths only, not on where they differ.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Why the server may not start as asked: without a token only a development server (`dev`)
/// may start, and a development server listens on a loopback address only.
pub fn check_listen(addr: SocketAddr, token: Option<&str>, dev: bool) -> Result<(), String> {
    if token.is_some_and(|t| t.trim().is_empty()) {
        return Err("the token is empty; pass a non-empty --token (or DURABLE_TOKEN)".into());
    }
    if dev && !addr.ip().is_loopback() {
        return Err(format!(
            "--dev listens on a loopback address only (127.0.0.1 or ::1), not {addr}: it may run without a token; \
             drop --dev and pass --token to listen on {}",
            addr.ip()
        ));
    }
    if token.is_none() && !dev {
        return Err("no token: actions (retry, cancel, delete, signal) would be open to anyone who can reach the \
                    server; pass --token T (or set DURABLE_TOKEN), or --dev for a development server on loopback"
            .into());
    }
    Ok(())
}

/// Why a request to a server without a token is refused for the host it names, if it is: only
/// a loopback name or address (`127.0.0.1`, `[::1]`, `localhost`). A web page whose own name
/// was made to resolve to 127.0.0.1 (DNS rebinding) is the same origin as the server to the
/// browser, and the `Host` it sends is that name, not this one.
fn foreign_host(request: &Request) -> Option<String> {
    let host = request.headers().get(header::HOST)?.to_str().unwrap_or("?");
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    let loopback =
        name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback());
    (!loopback).then(|| {
        format!(
            "this server has no token and answers only requests addressed to a loopback host (127.0.0.1, [::1], \
             localhost), not {}: start it with --token to serve others",
            durable::protocol::shown(host)
        )
    })
}

/// Why a request is a browser's from a page of another origin, if it is: a page anywhere on the
/// web can make a browser send a form-like POST (no preflight) to a server on loopback, which a
/// `--dev` server without a token would act on. Browsers say where a request comes from:
/// `Sec-Fetch-Site` (every current browser), else `Origin`, compared with `Host`. Other clients
/// send neither and are not concerned. (With a token, the `Authorization` header already takes
/// a preflight no other origin passes: the server allows none.)
fn cross_site(request: &Request) -> Option<String> {
    let headers = request.headers();
    let value = |name| headers.get(name).and_then(|v: &header::HeaderValue| v.to_str().ok());
    let from = match value("sec-fetch-site") {
        Some(site) => (!matches!(site, "same-origin" | "none")).then(|| format!("Sec-Fetch-Site: {site}"))?,
        None => {
            let origin = value("origin")?;
            let host = value("host").unwrap_or_default();
            let origin_host = origin.split_once("://").map_or(origin, |(_, rest)| rest);
            (!origin_host.eq_ignore_ascii_case(host)).then(|| format!("{origin}, not this server's {host}"))?
        }
    };
    Some(format!(
        "a browser sent this from a page of another origin ({from}); without a token, actions are taken only \
         from this server's own pages or from clients outside a browser"
    ))
}

/// How long open requests may run on after a shutdown was asked for (event streams never end
/// by themselves: they are dropped then).
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// Serves `router` on `listener` until `shutdown` resolves, then stops accepting connections
/// and lets the open requests finish for up to 2 s (open event streams are dropped).
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let (stopping, mut stopped) = tokio::sync::watch::channel(false);
    let server = axum::serve(listener, router).with_graceful_shutdown(async move {
        shutdown.await;
        let _ = stopping.send(true);
    });
    tokio::select! {
        result = server.into_future() => result,
        _ = async {
            let _ = stopped.wait_for(|s| *s).await;
            tokio::time::sleep(SHUTDOWN_GRACE).await;
        } => Ok(()),
    }
}
