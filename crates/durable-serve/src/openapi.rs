//! The OpenAPI 3.1 document of the API (`GET /api/openapi.json`), written by hand.

use axum::Json;
use serde_json::{Value, json};

/// The document: every route of [`crate::ROUTES`] (a test compares both ways).
pub(crate) fn document() -> Value {
    let run = json!({ "$ref": "#/components/schemas/Run" });
    let error = json!({ "description": "An error", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } });
    let ok = |description: &str, schema: Value| json!({ "200": { "description": description, "content": { "application/json": { "schema": schema } } }, "4XX": error, "5XX": error });
    let id = json!({ "name": "id", "in": "path", "required": true, "description": "The run id, URL-encoded (ids may contain `:` and `/`).", "schema": { "type": "string", "maxLength": 512 } });
    let q = |name: &str, description: &str, schema: Value| json!({ "name": name, "in": "query", "required": false, "description": description, "schema": schema });
    let filters = vec![
        q(
            "status",
            "Any of these statuses, comma-separated: pending, running, suspended, blocked, completed, failed, cancelled, dead.",
            json!({"type": "string"}),
        ),
        q("workflow", "Workflow name.", json!({"type": "string"})),
        q("namespace", "Namespace.", json!({"type": "string"})),
        q("tag", "Runs carrying this tag.", json!({"type": "string"})),
        q("parent", "Children of this run.", json!({"type": "string"})),
        q("created_after", "Created at or after (epoch ms).", json!({"type": "integer", "minimum": 0})),
        q("created_before", "Created before (epoch ms).", json!({"type": "integer", "minimum": 0})),
    ];
    let mut list_params = filters.clone();
    list_params.push(q(
        "limit",
        "Page size, 1..=500 (default 50).",
        json!({"type": "integer", "minimum": 1, "maximum": 500}),
    ));
    list_params.push(q("cursor", "The next_cursor of the previous page.", json!({"type": "string"})));
    let mut event_params = vec![
        q("status", "As for GET /api/runs.", json!({"type": "string"})),
        q("workflow", "Workflow name.", json!({"type": "string"})),
        q("run", "Only this run (404 if it does not exist; not with a filter or runs).", json!({"type": "string"})),
        q(
            "runs",
            "A JSON array of at most 500 run ids followed besides the filter's newest 500 runs (the page a client shows).",
            json!({"type": "string"}),
        ),
        q(
            "access_token",
            "The bearer token, for clients that cannot set headers (EventSource), when reads are protected.",
            json!({"type": "string"}),
        ),
    ];
    event_params.extend(filters.iter().skip(2).cloned());
    let secured = json!([{ "bearer": [] }]);
    let body = |schema: Value| json!({ "required": false, "content": { "application/json": { "schema": schema } } });
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "durable serve",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Runs, their histories and the operator's actions over a durable store. Times are epoch milliseconds. Errors are {\"error\": {\"code\", \"message\"}}. POST and DELETE need `Authorization: Bearer <token>` (unless the server runs with --dev); reads need it with --protect-reads."
        },
        "paths": {
            "/api/runs": { "get": { "summary": "List runs, newest first", "parameters": list_params,
                "responses": ok("A page of runs", json!({"type": "object", "required": ["runs", "next_cursor"], "properties": {"runs": {"type": "array", "items": run}, "next_cursor": {"type": ["string", "null"]}}})) } },
            "/api/runs/{id}": {
                "get": { "summary": "A run with its timeline, children, waiters, pending remote-step tasks and admission", "parameters": [id],
                    "responses": ok("The run", json!({"type": "object", "properties": {"run": run, "timeline": {"type": "array", "items": {"$ref": "#/components/schemas/TimelineEntry"}}, "children": {"type": "array", "items": run}, "waiters": {"type": "array"}, "tasks": {"type": "array"}, "admission": {"type": ["object", "null"]}}})) },
                "delete": { "summary": "Delete a finished run and its subtree (an active one with force=true)", "security": secured,
                    "parameters": [id, q("force", "Delete an active run too.", json!({"type": "boolean"}))],
                    "responses": ok("How many runs were deleted", json!({"type": "object", "properties": {"deleted": {"type": "integer"}}})) }
            },
            "/api/runs/{id}/history": { "get": { "summary": "A run's checkpoints, as stored", "parameters": [id],
                "responses": ok("The checkpoints by seq", json!({"type": "array", "items": {"$ref": "#/components/schemas/Checkpoint"}})) } },
            "/api/runs/{id}/retry": { "post": { "summary": "Retry a failed or dead run (back to pending), or with `input` start a new run of its workflow", "security": secured, "parameters": [id],
                "requestBody": body(json!({"type": "object", "additionalProperties": false, "properties": {"input": {}}})),
                "responses": ok("The retried run, or the new run", json!({"type": "object", "properties": {"run": run}})) } },
            "/api/runs/{id}/cancel": { "post": { "summary": "Cancel an active run (and its children); with compensate, its undos run first", "security": secured, "parameters": [id],
                "requestBody": body(json!({"type": "object", "additionalProperties": false, "properties": {"compensate": {"type": "boolean", "default": false}}})),
                "responses": ok("The run after the call", json!({"type": "object", "properties": {"run": run}})) } },
            "/api/signals": { "post": { "summary": "Send a signal: the oldest run waiting on the token receives the payload, or it is buffered", "security": secured,
                "requestBody": { "required": true, "content": { "application/json": { "schema": {"type": "object", "additionalProperties": false, "required": ["token", "payload"], "properties": {"token": {"type": "string"}, "payload": {}}} } } },
                "responses": ok("Where it went", json!({"type": "object", "properties": {"delivery": {"type": "object", "properties": {"status": {"enum": ["delivered", "buffered"]}, "run_id": {"type": "string"}, "seq": {"type": "integer"}}}}})) } },
            "/api/workflows": { "get": { "summary": "Workflows and their runs by status",
                "responses": ok("Per workflow", json!({"type": "array", "items": {"type": "object", "properties": {"workflow": {"type": "string"}, "counts": {"type": "object", "additionalProperties": {"type": "integer"}}}}})) } },
            "/api/schedules": { "get": { "summary": "The stored schedules", "responses": ok("The schedules", json!({"type": "object", "properties": {"schedules": {"type": "array"}}})) } },
            "/api/queues": { "get": { "summary": "Admission gates (step queues, concurrency keys) and remote-step task queues",
                "responses": ok("Gates and task queues (null when the store keeps none)", json!({"type": "object", "properties": {"admission": {"type": ["array", "null"]}, "tasks": {"type": ["array", "null"]}}})) } },
            "/api/workers": { "get": { "summary": "Remote-step queues with their live workers, and the live workers",
                "responses": ok("Queues and workers", json!({"type": "object", "properties": {"queues": {"type": "array"}, "workers": {"type": "array"}}})) } },
            "/api/events": { "get": { "summary": "Server-sent events: `run` (data: a Run) when a run of the view appears or changes; `deleted` (data: `{\"id\": ...}`) when one is deleted", "parameters": event_params,
                "responses": { "200": { "description": "An event stream", "content": { "text/event-stream": { "schema": {"type": "string"} } } }, "4XX": error } } },
            "/api/openapi.json": { "get": { "summary": "This document", "responses": { "200": { "description": "OpenAPI 3.1", "content": { "application/json": {} } } } } },
            "/metrics": { "get": { "summary": "Prometheus text: the engine's metrics and gauges from the store (durable_runs, task queues, admission gates)",
                "responses": { "200": { "description": "Prometheus text format 0.0.4", "content": { "text/plain": {} } } } } },
            "/healthz": { "get": { "summary": "Liveness", "responses": ok("Alive", json!({"type": "object", "properties": {"ok": {"type": "boolean"}}})) } },
            "/": { "get": { "summary": "The dashboard", "responses": { "200": { "description": "HTML", "content": { "text/html": {} } } } } },
            "/assets/{name}": { "get": { "summary": "The dashboard's embedded assets", "parameters": [{"name": "name", "in": "path", "required": true, "schema": {"type": "string"}}],
                "responses": { "200": { "description": "The file" }, "404": error } } }
        },
        "components": {
            "securitySchemes": { "bearer": { "type": "http", "scheme": "bearer" } },
            "schemas": {
                "Error": { "type": "object", "required": ["error"], "properties": { "error": { "type": "object", "required": ["code", "message"], "properties": {
                    "code": { "enum": ["bad_request", "not_found", "unauthorized", "forbidden", "conflict", "payload_too_large", "method_not_allowed", "store_failed"] },
                    "message": { "type": "string" } } } } },
                "Run": { "type": "object", "description": "durable::Run as serde serializes it (as `durable runs list --json` prints it).",
                    "required": ["id", "workflow", "version", "status", "created_at", "updated_at"],
                    "properties": { "id": {"type": "string"}, "workflow": {"type": "string"}, "version": {"type": "integer"}, "status": {"enum": ["pending", "running", "suspended", "blocked", "completed", "failed", "cancelled", "dead"]}, "namespace": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}, "created_at": {"type": "integer"}, "updated_at": {"type": "integer"} } },
                "Checkpoint": { "type": "object", "description": "durable::Checkpoint as serde serializes it.", "required": ["seq", "name", "kind", "status"],
                    "properties": { "seq": {"type": "integer"}, "name": {"type": "string"}, "kind": {"type": "string"}, "status": {"enum": ["running", "waiting", "completed", "failed"]}, "attempts": {"type": "integer"}, "started_at": {"type": "integer"}, "updated_at": {"type": "integer"} } },
                "TimelineEntry": { "allOf": [ { "$ref": "#/components/schemas/Checkpoint" }, { "type": "object", "properties": { "duration_ms": { "type": ["integer", "null"], "description": "updated_at - started_at once completed or failed" } } } ] }
            }
        }
    })
}

/// `GET /api/openapi.json`.
pub(crate) async fn openapi() -> Json<Value> {
    Json(document())
}
