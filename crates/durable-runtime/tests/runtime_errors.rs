//! Acceptance: bad input and panics give clear errors; the engine keeps serving other runs.

use durable_conformance::{Counter, TestEngine};
use durable_core::{RunStatus, StepError, codes};
use durable_runtime::{Error, StartOptions, WorkflowCtx, WorkflowError};

fn register_echo(t: &TestEngine, executions: &Counter) {
    let executions = executions.clone();
    t.register("echo", 1, move |ctx: WorkflowCtx, n: u32| {
        let executions = executions.clone();
        async move {
            let out: u32 = ctx
                .step("echo", move |_| {
                    executions.bump();
                    async move { Ok(n) }
                })
                .await?;
            Ok::<_, WorkflowError>(out)
        }
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starting_the_same_id_twice_runs_once() {
    let t = TestEngine::new();
    let executions = Counter::new();
    register_echo(&t, &executions);
    let first = t.start("echo", &7u32, StartOptions::id("once")).await.unwrap();
    assert!(first.created);
    t.assert_output(&first.id, 7u32).await;
    let second = t.start("echo", &8u32, StartOptions::id("once")).await.unwrap();
    assert!(!second.created);
    assert_eq!(second.run.status, RunStatus::Completed);
    assert_eq!(second.run.input.decode::<u32>().unwrap(), 7, "the existing run is returned unchanged");
    t.assert_output(&first.id, 7u32).await;
    assert_eq!(executions.get(), 1);

    // The id is the echo run's: a start of another workflow with it is refused, and changes
    // nothing.
    t.register("other", 1, |_: WorkflowCtx, n: u32| async move { Ok::<_, WorkflowError>(n) });
    let err = t.start("other", &9u32, StartOptions::id("once")).await.unwrap_err();
    assert!(
        matches!(&err, Error::IdTaken { id, existing, requested } if id.as_str() == "once" && existing == "echo" && requested == "other"),
        "{err}"
    );
    assert!(err.to_string().contains("another id"), "{err}");
    let run = t.get_run(&first.id).await.unwrap().unwrap();
    assert_eq!((run.workflow.as_str(), run.input.decode::<u32>().unwrap()), ("echo", 7));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_workflows_and_bad_input_are_refused_before_anything_is_persisted() {
    let t = TestEngine::new();
    register_echo(&t, &Counter::new());
    let err = t.start("nope", &1u32, StartOptions::id("x")).await.unwrap_err();
    assert!(matches!(&err, Error::UnknownWorkflow { name } if name == "nope"), "{err}");
    assert!(err.to_string().contains("register"), "{err}");

    let err = t.start("echo", &"not a number", StartOptions::id("bad-input")).await.unwrap_err();
    assert!(matches!(&err, Error::InvalidInput { workflow, .. } if workflow == "echo"), "{err}");
    assert!(t.get_run(&"bad-input".into()).await.unwrap().is_none());

    let err = t.start("echo", &1u32, StartOptions::id("")).await.unwrap_err();
    assert!(matches!(err, Error::InvalidId(_)), "{err}");
    let err = t.start("echo", &1u32, StartOptions::id("no-ns").namespace("")).await.unwrap_err();
    assert!(matches!(&err, Error::InvalidName { what, .. } if what.contains("namespace")), "{err}");
    let err = t.start("echo", &1u32, StartOptions::id("no-tag").tag("vip").tag("")).await.unwrap_err();
    assert!(matches!(&err, Error::InvalidName { what, .. } if what.contains("tag")), "{err}");
    // PostgreSQL cannot store a NUL in text: refused before anything is written, by name.
    let err = t.start("echo", &1u32, StartOptions::id("nul-tag").tag("a\0b")).await.unwrap_err();
    assert!(matches!(&err, Error::InvalidName { what, .. } if what.contains(r#"tag "a\0b""#)), "{err}");
    assert!(err.to_string().contains("control character"), "{err}");
    let err = t.start("echo", &1u32, StartOptions::id("nul-ns").namespace("n\0s")).await.unwrap_err();
    assert!(matches!(&err, Error::InvalidName { what, .. } if what.contains("namespace")), "{err}");
    assert!(t.list_runs(&Default::default()).await.unwrap().runs.is_empty());
}

/// Registration happens once at boot: a workflow without a name, or with one no store could
/// index for its runs' listings, is a bug, refused loudly; a name at the limit registers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registering_a_workflow_without_a_usable_name_panics() {
    let t = TestEngine::new();
    let register = |name: &str| {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            t.register(name, 1, |_ctx: WorkflowCtx, _: ()| async { Ok::<_, WorkflowError>(()) })
        }))
        .err()
        .map(|panic| panic.downcast_ref::<String>().cloned().unwrap_or_default())
    };
    let message = register("").expect("an empty name is refused");
    assert!(message.contains("a workflow's name must be non-empty"), "{message}");
    let message = register("tab\tname").expect("a control character is refused");
    assert!(message.contains("control character"), "{message}");
    let limit = durable_core::protocol::MAX_NAME_BYTES;
    let message = register(&"w".repeat(limit + 1)).expect("a name over the limit is refused");
    assert!(message.contains("1025 bytes long, over the limit of 1024 bytes"), "{message}");
    assert!(message.len() < 400, "the name is cut in the message: {message}");
    assert_eq!(register(&"w".repeat(limit)), None, "a name at the limit registers");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn panics_in_steps_and_bodies_fail_only_their_run() {
    let t = TestEngine::new();
    register_echo(&t, &Counter::new());
    t.register("step_panics", 1, |ctx: WorkflowCtx, _: ()| async move {
        let r = ctx
            .step("boom", |_| async {
                if true {
                    panic!("step exploded")
                }
                Ok::<u32, StepError>(1)
            })
            .await;
        let failed = r.expect_err("a panicking step fails");
        assert_eq!(failed.error.code(), Some(codes::PANIC));
        assert!(failed.error.retryable);
        Ok::<_, WorkflowError>(failed.error.message)
    });
    t.register("body_panics", 1, |ctx: WorkflowCtx, _: ()| async move {
        ctx.step("fine", |_| async { Ok(()) }).await?;
        if ctx.run_id().as_str().starts_with("body") {
            panic!("body exploded");
        }
        Ok::<_, WorkflowError>(())
    });
    let step = t.start("step_panics", &(), StartOptions::id("step")).await.unwrap();
    let body = t.start("body_panics", &(), StartOptions::id("body")).await.unwrap();
    let out: String = t.wait_for_run(&step.id).await.unwrap().output().unwrap();
    assert!(out.contains("step exploded"), "{out}");

    let outcome = t.wait_for_run(&body.id).await.unwrap();
    assert_eq!(outcome.status(), RunStatus::Failed);
    let error = outcome.error().unwrap();
    assert_eq!(error.code(), Some(codes::PANIC));
    assert!(error.message.contains("body exploded") && error.message.contains("body"), "{}", error.message);

    // The engine keeps serving.
    let after = t.start("echo", &5u32, StartOptions::id("after")).await.unwrap();
    t.assert_output(&after.id, 5u32).await;
}

/// A value that would not decode back on replay (serde_json writes NaN as `null`) is refused
/// when it is produced, not when a later turn replays it: the step fails fatally with
/// `bad_payload` (the workflow can handle it), a recorded value fails the run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_that_would_not_decode_on_replay_are_refused_when_made() {
    let t = TestEngine::new();
    t.register("nan_step", 1, |ctx: WorkflowCtx, _: ()| async move {
        let failed = ctx.step("nan", |_| async { Ok(f64::NAN) }).await.expect_err("a NaN output is refused");
        assert_eq!(failed.error.code(), Some(codes::BAD_PAYLOAD));
        assert!(!failed.error.retryable, "the same value would come back");
        // Finite values and nulls of an Option are fine.
        let x: f64 = ctx.step("finite", |_| async { Ok(2.5) }).await?;
        let none: Option<u32> = ctx.step("none", |_| async { Ok(None) }).await?;
        Ok::<_, WorkflowError>((failed.error.message, x, none))
    });
    t.register("nan_record", 1, |ctx: WorkflowCtx, _: ()| async move {
        let v: f64 = ctx.side_effect("nan", || f64::INFINITY).await;
        Ok::<_, WorkflowError>(v)
    });
    let step = t.start("nan_step", &(), StartOptions::id("nan-step")).await.unwrap();
    let (message, x, none): (String, f64, Option<u32>) = t.wait_for_run(&step.id).await.unwrap().output().unwrap();
    assert!(message.contains(r#"step "nan""#) && message.contains("NaN"), "{message}");
    assert_eq!((x, none), (2.5, None));
    t.assert_step_names(&step.id, &["nan", "finite", "none"]).await;

    let record = t.start("nan_record", &(), StartOptions::id("nan-record")).await.unwrap();
    let outcome = t.wait_for_run(&record.id).await.unwrap();
    assert_eq!(outcome.status(), RunStatus::Failed);
    let error = outcome.error().unwrap();
    assert_eq!(error.code(), Some(codes::BAD_PAYLOAD));
    assert!(error.message.contains("nan-record") && error.message.contains(r#""nan" (seq 0)"#), "{}", error.message);
}

/// `?` on the engine's own errors keeps a code on the failed run: `child_failed` for a child
/// that did not complete, `bad_payload` for a signal that does not decode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_returned_with_question_mark_keep_their_codes() {
    let t = TestEngine::new();
    t.register("doomed", 1, |_ctx: WorkflowCtx, _: ()| async move {
        Err::<(), _>(WorkflowError::new("the child gives up").with_code("gave_up"))
    });
    t.register("parent", 1, |ctx: WorkflowCtx, _: ()| async move {
        ctx.child::<_, ()>("doomed", &()).await?;
        Ok::<_, WorkflowError>(())
    });
    t.register("listener", 1, |ctx: WorkflowCtx, _: ()| async move {
        let n: u32 = ctx.wait_for_signal("tok-listener").await?;
        Ok::<_, WorkflowError>(n)
    });
    let parent = t.start("parent", &(), StartOptions::id("parent")).await.unwrap();
    let listener = t.start("listener", &(), StartOptions::id("listener")).await.unwrap();
    t.signal("tok-listener", &"not a number").await.unwrap();
    for (id, code, names) in
        [(&parent.id, codes::CHILD_FAILED, "the child gives up"), (&listener.id, codes::BAD_PAYLOAD, "tok-listener")]
    {
        let outcome = t.wait_for_run(id).await.unwrap();
        assert_eq!(outcome.status(), RunStatus::Failed, "run {id}");
        let error = outcome.error().unwrap();
        assert_eq!(error.code(), Some(code), "run {id}: {}", error.message);
        assert!(error.message.contains(names), "run {id}: {}", error.message);
    }
}
