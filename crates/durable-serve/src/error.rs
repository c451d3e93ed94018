//! The API's error: an HTTP status and the JSON body `{"error": {"code", "message"}}`.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use durable::store::{StoreError, StoreErrorKind};
use serde_json::json;

use crate::ops::OpError;

/// An error answered to an HTTP client: a status, a stable snake_case `code` and a message
/// that says what went wrong and what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// `bad_request`, `not_found`, `unauthorized`, `conflict`, `payload_too_large`,
    /// `store_failed`, …
    pub code: &'static str,
    /// What went wrong and what to do.
    pub message: String,
}

impl ApiError {
    /// A 400 `bad_request`.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    /// A 404 `not_found`.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    /// A 409 `conflict`: the run is in a state the action does not apply to.
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "conflict", message)
    }

    /// A 401 `unauthorized`.
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
    }

    /// A 413 `payload_too_large`.
    pub fn payload_too_large(message: impl Into<String>) -> Self {
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", message)
    }

    /// A 500 `store_failed`: the store could not answer (trying again later may help).
    pub fn store_failed(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "store_failed", message)
    }

    pub(crate) fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError { status, code, message: message.into() }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({ "error": { "code": self.code, "message": self.message } });
        (self.status, Json(body)).into_response()
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e.kind() {
            StoreErrorKind::NotFound => ApiError::not_found(e.to_string()),
            StoreErrorKind::Unavailable => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "store_failed", format!("{e}; try again later"))
            }
            _ => ApiError::store_failed(e.to_string()),
        }
    }
}

impl From<durable::Error> for ApiError {
    fn from(e: durable::Error) -> Self {
        use durable::Error as E;
        match e {
            E::Store(s) => s.into(),
            e @ (E::RunNotFound(_) | E::ScheduleNotFound { .. } | E::UnknownWorkflow { .. }) => {
                ApiError::not_found(e.to_string())
            }
            e @ (E::NotRetryable { .. } | E::Compensated { .. }) => ApiError::conflict(e.to_string()),
            e @ E::PayloadTooLarge { .. } => ApiError::payload_too_large(e.to_string()),
            e @ (E::InvalidInput { .. }
            | E::Serialize { .. }
            | E::InvalidName { .. }
            | E::InvalidId(_)
            | E::StartTooLate { .. }) => ApiError::bad_request(e.to_string()),
            e => ApiError::store_failed(e.to_string()),
        }
    }
}

impl From<OpError> for ApiError {
    fn from(e: OpError) -> Self {
        match e {
            OpError::NotFound(id) => ApiError::not_found(format!("run {id} not found")),
            OpError::Conflict(message) => ApiError::conflict(message),
            OpError::Active { id, status } => ApiError::conflict(format!(
                "run {id} is {status} (still active): cancel it first (POST /api/runs/{{id}}/cancel), or pass ?force=true to delete it anyway"
            )),
            OpError::Invalid(message) => ApiError::bad_request(message),
            OpError::Engine(e) => e.into(),
        }
    }
}
