//! The dashboard: one HTML page and its assets, embedded in the binary at build time (no
//! Node toolchain, nothing fetched at run time).

use axum::extract::Path;
use axum::http::header;
use axum::response::{Html, IntoResponse, Response};

use crate::error::ApiError;

/// The embedded files under `/assets/`: name, content type, bytes.
const ASSETS: &[(&str, &str, &[u8])] = &[];

/// `GET /`: the dashboard page.
pub(crate) async fn index() -> Html<&'static str> {
    Html(include_str!("../assets/index.html"))
}

/// `GET /assets/{name}`.
pub(crate) async fn asset(Path(name): Path<String>) -> Response {
    match ASSETS.iter().find(|(n, _, _)| *n == name) {
        Some((_, content_type, bytes)) => ([(header::CONTENT_TYPE, *content_type)], *bytes).into_response(),
        None => ApiError::not_found(format!("no asset {name:?}")).into_response(),
    }
}
