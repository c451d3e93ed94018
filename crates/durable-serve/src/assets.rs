//! The dashboard: one HTML page and its assets, embedded in the binary at build time (no
//! Node toolchain, nothing fetched at run time).

use axum::extract::Path;
use axum::http::header;
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;

/// The embedded files under `/assets/`: name, content type, bytes.
const ASSETS: &[(&str, &str, &[u8])] = &[
    ("app.js", "text/javascript; charset=utf-8", include_bytes!("../assets/app.js")),
    ("app.css", "text/css; charset=utf-8", include_bytes!("../assets/app.css")),
];

/// The page loads only its own scripts, styles and API: an injected tag could run nothing.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// Headers of every dashboard file: the page's policy, no type sniffing, and revalidation
/// (a newer binary serves newer files under the same names).
const HEADERS: [(header::HeaderName, &str); 3] = [
    (header::CONTENT_SECURITY_POLICY, CSP),
    (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
    (header::CACHE_CONTROL, "no-cache"),
];

/// `GET /`: the dashboard page.
pub(crate) async fn index() -> Response {
    (HEADERS, [(header::CONTENT_TYPE, "text/html; charset=utf-8")], include_str!("../assets/index.html"))
        .into_response()
}

/// `GET /assets/{name}`.
pub(crate) async fn asset(Path(name): Path<String>) -> Response {
    match ASSETS.iter().find(|(n, _, _)| *n == name) {
        Some((_, content_type, bytes)) => (HEADERS, [(header::CONTENT_TYPE, *content_type)], *bytes).into_response(),
        None => ApiError::not_found(format!("no asset {name:?}")).into_response(),
    }
}
