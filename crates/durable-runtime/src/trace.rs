//! Spans and trace contexts: the `run`, `turn`, `step` and `task` spans, and the W3C trace
//! context ([`Run::trace_context`]) that ties them into one trace per run, on any process.
//!
//! A run gets its trace context when it is created: with the `otel` feature, from its `run`
//! span (a child of the caller's current span) when that span has a valid OpenTelemetry
//! context; otherwise a fresh random trace id. Children and remote tasks carry their run's. A
//! turn's span, and a worker's span for a task attempt, are parented on the stored context
//! (with `otel`; `OpenTelemetrySpanExt::set_parent`), so every span of a run shares its trace
//! id. Every span also records `trace_id` as a field, so plain logs correlate without `otel`.

use durable_core::task::Task;
use durable_core::trace::TraceParent;
use durable_core::{Run, RunId, StepKind};
use tracing::Span;
use tracing::field::Empty;

/// The trace context to store on a run being created (`id`: `None` while it is not known
/// yet, for a run a trigger buffer will start): its `run` span's, a child of the caller's
/// current span, when that span has a valid OpenTelemetry context (the `otel` feature);
/// otherwise a fresh trace. The `run` span closes at once: it marks the run's creation in
/// the trace, and every turn of the run is its child.
pub(crate) fn new_trace_context(id: Option<&RunId>, workflow: &str, version: u32) -> String {
    let span = tracing::info_span!(
        "run",
        run_id = id.map(tracing::field::display),
        workflow = %workflow,
        version,
        trace_id = Empty,
    );
    let tp = otel::context_of(&span).unwrap_or_else(fresh);
    span.record("trace_id", tp.trace_id_hex());
    tp.to_string()
}

/// The span of one turn of `run` on the engine `owner`, parented on the run's trace context.
pub(crate) fn turn_span(run: &Run, owner: &str) -> Span {
    let tp = TraceParent::of_run(run);
    let span = tracing::info_span!(
        "turn",
        run_id = %run.id,
        workflow = %run.workflow,
        version = run.version,
        engine = %owner,
        trace_id = %tp.trace_id_hex(),
        outcome = Empty,
    );
    otel::set_parent(&span, &tp);
    span
}

/// The span of one attempt of a step executed in the turn (a child of the turn's span).
pub(crate) fn step_span(run_id: &RunId, seq: u32, name: &str, kind: StepKind, attempt: u32) -> Span {
    tracing::info_span!("step", run_id = %run_id, seq, name = %name, kind = %kind, attempt, outcome = Empty)
}

/// A worker's span for one attempt of a remote step, parented on the run's trace context (the
/// task's, or one derived from the run id for a task dispatched before contexts were stored).
pub(crate) fn task_span(task: &Task, worker: &str) -> Span {
    let t = &task.task;
    let tp = TraceParent::stored_or_derived(t.trace_context.as_deref(), &t.run_id);
    let span = tracing::info_span!(
        "task",
        run_id = %t.run_id,
        seq = t.seq,
        step_id = %t.step_id(),
        name = %t.name,
        kind = %StepKind::Remote,
        attempt = t.attempt,
        worker = %worker,
        trace_id = %tp.trace_id_hex(),
        outcome = Empty,
    );
    otel::set_parent(&span, &tp);
    span
}

/// Records how the work of `span` ended.
pub(crate) fn outcome(span: &Span, outcome: &'static str) {
    span.record("outcome", outcome);
}

/// A fresh trace context: random trace and span ids, sampled.
fn fresh() -> TraceParent {
    loop {
        let (trace, span) = (rand::random::<u128>(), rand::random::<u64>());
        if let Some(tp) = TraceParent::new(trace.to_be_bytes(), span.to_be_bytes(), 1) {
            return tp;
        }
    }
}

/// The OpenTelemetry side (the `otel` feature): reading a span's context, setting a span's
/// parent. Without the feature, spans carry `trace_id` fields only.
#[cfg(feature = "otel")]
mod otel {
    use durable_core::trace::TraceParent;
    use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
    use tracing::Span;
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    /// The OpenTelemetry context of `span` (started by this call), if it has a valid one: a
    /// `tracing-opentelemetry` layer is installed and the span is enabled.
    pub(super) fn context_of(span: &Span) -> Option<TraceParent> {
        let cx = span.context();
        let otel = cx.span();
        let sc = otel.span_context();
        if !sc.is_valid() {
            return None;
        }
        TraceParent::new(sc.trace_id().to_bytes(), sc.span_id().to_bytes(), sc.trace_flags().to_u8())
    }

    /// Parents `span` (not yet entered) on the remote span `tp` names.
    pub(super) fn set_parent(span: &Span, tp: &TraceParent) {
        let sc = SpanContext::new(
            TraceId::from_bytes(tp.trace_id()),
            SpanId::from_bytes(tp.span_id()),
            TraceFlags::new(tp.flags()),
            true,
            TraceState::default(),
        );
        if let Err(e) = span.set_parent(opentelemetry::Context::new().with_remote_span_context(sc)) {
            tracing::trace!(error = %e, "span not parented on the run's trace context");
        }
    }
}

#[cfg(not(feature = "otel"))]
mod otel {
    use durable_core::trace::TraceParent;
    use tracing::Span;

    pub(super) fn context_of(_: &Span) -> Option<TraceParent> {
        None
    }

    pub(super) fn set_parent(_: &Span, _: &TraceParent) {}
}
