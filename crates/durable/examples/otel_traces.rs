//! OpenTelemetry traces: one trace per run, across its turns, its remote step on a worker and
//! its child. Installs a `tracing-opentelemetry` layer over an in-memory exporter, runs an
//! order workflow, and prints every span it exported as a tree.
//!
//! ```text
//! cargo run -p durable --example otel_traces --features otel
//! ```
//!
//! In a service, use the exporter of your choice (OTLP to a collector, stdout, …) in place of
//! the in-memory one: nothing else changes.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use durable::otel::opentelemetry::trace::TracerProvider as _;
use durable::otel::tracing_opentelemetry;
use durable::{Engine, MemoryStore, StartOptions, StepError, Worker, WorkflowCtx, WorkflowError};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use tracing_subscriber::prelude::*;

async fn order(ctx: WorkflowCtx, items: u32) -> Result<String, WorkflowError> {
    let reserved: u32 = ctx.step("reserve", move |_| async move { Ok(items) }).await?;
    // A durable sleep: the run suspends, and its next turn is a new `turn` span in the same trace.
    ctx.sleep(Duration::from_millis(50)).await;
    let label: String = ctx.remote_step("print-label", &reserved).await?;
    let receipt: String = ctx.child("receipt", &label).await?;
    Ok(receipt)
}

async fn receipt(ctx: WorkflowCtx, label: String) -> Result<String, WorkflowError> {
    let text = format!("receipt for {label}");
    Ok(ctx.step("email", move |_| std::future::ready(Ok(text.clone()))).await?)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // readme:begin
    // Spans go to OpenTelemetry: here to memory; in a service, to your exporter (OTLP, stdout, …).
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder().with_simple_exporter(exporter.clone()).build();
    tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("otel-traces-example")))
        .init();
    // readme:end

    // 2. An engine and a worker on one store.
    let store = Arc::new(MemoryStore::new());
    let engine = Engine::builder().shared_store(store.clone()).build()?;
    engine.register("order", 1, order);
    engine.register("receipt", 1, receipt);
    let worker = Worker::builder()
        .engine(&engine)
        .handle("print-label", |_ctx, n: u32| async move { Ok::<_, StepError>(format!("{n} items")) })
        .build();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let worker = tokio::spawn(async move {
        worker
            .run(async {
                let _ = stopped.await;
            })
            .await
    });

    // 3. A run started inside the caller's span joins its trace.
    let request = tracing::info_span!("checkout-request");
    let run =
        tracing::Instrument::instrument(engine.start("order", &3u32, StartOptions::id("order-1")), request).await?;
    let done = engine.wait_for_run(&run.id).await?;
    println!("run {} {}: {:?}", run.id, done.status(), done.output::<String>()?);
    println!("trace context stored on the run: {}", run.run.trace_context.as_deref().unwrap_or("-"));
    engine.drain(Duration::from_secs(5)).await;
    let _ = stop.send(());
    worker.await?;

    // 4. What was exported: one trace, as a tree of spans.
    let spans = exporter.get_finished_spans()?;
    let mut by_trace: BTreeMap<String, Vec<&SpanData>> = BTreeMap::new();
    for span in &spans {
        by_trace.entry(span.span_context.trace_id().to_string()).or_default().push(span);
    }
    for (trace, spans) in &by_trace {
        println!("\ntrace {trace}: {} spans", spans.len());
        let roots = spans.iter().filter(|s| !spans.iter().any(|p| p.span_context.span_id() == s.parent_span_id));
        for root in roots {
            print_tree(root, spans, 1);
        }
    }
    Ok(())
}

fn print_tree(span: &SpanData, all: &[&SpanData], depth: usize) {
    let attrs: Vec<String> = span
        .attributes
        .iter()
        .filter(|kv| !kv.key.as_str().starts_with("code.") && !kv.key.as_str().starts_with("thread."))
        .filter(|kv| !matches!(kv.key.as_str(), "busy_ns" | "idle_ns" | "target" | "trace_id"))
        .map(|kv| format!("{}={}", kv.key, kv.value))
        .collect();
    println!("{}{} {}", "  ".repeat(depth), span.name, attrs.join(" "));
    let mut children: Vec<&&SpanData> =
        all.iter().filter(|c| c.parent_span_id == span.span_context.span_id()).collect();
    children.sort_by_key(|c| c.start_time);
    for child in children {
        print_tree(child, all, depth + 1);
    }
}
