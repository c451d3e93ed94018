//! Request extractors that validate their input and answer a bad one with the JSON error
//! shape ([`ApiError`]): a run id from the path, the query parameters, a JSON body.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use durable::RunId;
use serde::de::DeserializeOwned;

use crate::error::ApiError;

/// The largest request body accepted (a signal's payload, a retry's input).
pub(crate) const MAX_BODY: usize = 1024 * 1024;

/// The `{id}` of `/api/runs/{id}…`, percent-decoded and checked as a run id.
#[derive(Debug)]
pub(crate) struct RunPath(pub(crate) RunId);

impl<S: Send + Sync> FromRequestParts<S> for RunPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Path(id) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|e| ApiError::bad_request(format!("bad run id in the path: {e}; URL-encode the id")))?;
        parse_run_id(&id).map(RunPath)
    }
}

/// A run id from the network, or a 400 naming it and the rule.
pub(crate) fn parse_run_id(id: &str) -> Result<RunId, ApiError> {
    RunId::parse(id).map_err(|e| {
        let shown: String = id.chars().take(64).collect();
        ApiError::bad_request(format!(
            "invalid run id {shown:?}: {}; use a non-empty id of at most {} bytes without control characters",
            e.reason,
            RunId::MAX_LEN
        ))
    })
}

/// The query parameters, decoded, in order; a parameter named twice is refused.
#[derive(Debug, Default)]
pub(crate) struct Params(pub(crate) Vec<(String, String)>);

impl<S: Send + Sync> FromRequestParts<S> for Params {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Query(pairs) = Query::<Vec<(String, String)>>::from_request_parts(parts, state)
            .await
            .map_err(|e| ApiError::bad_request(format!("malformed query string: {e}")))?;
        for (i, (name, _)) in pairs.iter().enumerate() {
            if pairs[..i].iter().any(|(n, _)| n == name) {
                return Err(ApiError::bad_request(format!("query parameter {name:?} is given twice; give it once")));
            }
        }
        Ok(Params(pairs))
    }
}

impl Params {
    /// Refuses parameters not in `known`, naming them and the known ones.
    pub(crate) fn only(&self, known: &[&str]) -> Result<(), ApiError> {
        match self.0.iter().find(|(name, _)| !known.contains(&name.as_str())) {
            Some((name, _)) => Err(ApiError::bad_request(format!(
                "unknown query parameter {name:?}; known: {}",
                if known.is_empty() { "none".to_string() } else { known.join(", ") }
            ))),
            None => Ok(()),
        }
    }

    /// The value of `name`, if given and not empty.
    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.0.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str()).filter(|v| !v.is_empty())
    }

    /// `name` as a number, if given.
    pub(crate) fn number<T: std::str::FromStr>(&self, name: &str) -> Result<Option<T>, ApiError> {
        self.get(name)
            .map(|v| {
                v.parse().map_err(|_| {
                    ApiError::bad_request(format!("query parameter {name}={v:?} is not a valid non-negative integer"))
                })
            })
            .transpose()
    }

    /// `name` as a boolean (`true` / `false`), if given.
    pub(crate) fn flag(&self, name: &str) -> Result<bool, ApiError> {
        match self.get(name) {
            None | Some("false") => Ok(false),
            Some("true") => Ok(true),
            Some(v) => Err(ApiError::bad_request(format!("query parameter {name}={v:?} must be true or false"))),
        }
    }
}

/// A JSON object of at most [`MAX_BODY`] bytes, decoded into `T` (whose unknown fields are
/// refused). An empty body decodes as `{}`.
#[derive(Debug)]
pub(crate) struct JsonBody<T>(pub(crate) T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let bytes = Bytes::from_request(req, state).await.map_err(|e| {
            if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::payload_too_large(format!("the request body is over {MAX_BODY} bytes; send a smaller one"))
            } else {
                ApiError::bad_request(format!("could not read the request body: {e}"))
            }
        })?;
        let text: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) { b"{}" } else { &bytes };
        let bad =
            |e: serde_json::Error| ApiError::bad_request(format!("the request body is not the JSON expected: {e}"));
        // Every body is an object: serde would also read a struct from an array of its fields.
        let value: serde_json::Value = serde_json::from_slice(text).map_err(bad)?;
        if !value.is_object() {
            return Err(ApiError::bad_request("the request body is not the JSON expected: a JSON object"));
        }
        serde_json::from_value(value).map(JsonBody).map_err(bad)
    }
}
