//! The operator commands: `runs list | show | export | retry | cancel | delete` and `signal`.
//! None of them executes workflow code (see [`with_operator_engine`]).

use std::io::{Read, Write};

use std::collections::HashMap;

use durable::protocol;
use durable::store::{TaskFilter, WaitKind, Waiter};
use durable::task::{Task, TaskState};
use durable::{Cancel, Checkpoint, CheckpointStatus, Delivery, Engine, Run, RunFilter, RunId, RunStatus, StepKind};
use durable_serve::ops;
use serde_json::json;

use crate::admission::RunAdmission;
use crate::cli::{CancelArgs, DeleteArgs, ExportArgs, ListArgs, RunIdArgs, ShowArgs, SignalArgs, StoreArgs};
use crate::error::{Error, Result};
use crate::format::{Table, ago, duration_ms, interval, now_ms, plural, timestamp, truncate};
use crate::store::{Access, with_operator_engine};

/// A run id from the command line.
fn parse_id(id: &str) -> Result<RunId> {
    RunId::parse(id).map_err(|e| Error::bad(invalid_id_message(id, e.reason)))
}

/// Why `id` was refused (`reason`, from `RunId::parse`), with the id quoted and escaped once.
///
/// Not the parse error's own message: durable-core keeps an id with a control character
/// already escaped (`escape_debug`) and then prints it with `{:?}`, which escapes it a second
/// time (`"line\\nbreak"` for `line`, newline, `break`).
fn invalid_id_message(id: &str, reason: &str) -> String {
    /// How much of an over-long id is shown.
    const SHOWN: usize = 64;
    let shown = if id.len() > RunId::MAX_LEN {
        format!("{:?} ({} bytes)", format!("{}…", id.chars().take(SHOWN).collect::<String>()), id.len())
    } else {
        format!("{id:?}")
    };
    format!(
        "invalid run id {shown}: {reason}; use a non-empty id of at most {} bytes without control characters",
        RunId::MAX_LEN
    )
}

/// Reads a run that must exist.
async fn require(engine: &Engine, id: &RunId) -> Result<Run> {
    ops::require(engine, id).await.map_err(op_error)
}

/// An action refused or failed ([`ops`]), as the command line words it.
fn op_error(e: ops::OpError) -> Error {
    match e {
        ops::OpError::NotFound(id) => not_found(&id),
        ops::OpError::Engine(e) => e.into(),
        e => Error::bad(e.to_string()),
    }
}

fn not_found(id: &RunId) -> Error {
    Error::bad(format!(
        "run {} not found (list the runs with `durable runs list`, or check --db / --url)",
        Error::shown(id.as_str())
    ))
}

/// `workflow@version`.
fn workflow_at(run: &Run) -> String {
    format!("{}@{}", run.workflow, run.version)
}

/// `durable runs list`.
pub(crate) async fn list(store: &StoreArgs, args: &ListArgs, out: &mut dyn Write) -> Result<()> {
    let store = store.open(Access::Existing).await?;
    with_operator_engine(store, |engine| async move { list_runs(&engine, args, out).await }).await
}

/// `durable runs list` on `engine`'s store.
pub(crate) async fn list_runs(engine: &Engine, args: &ListArgs, out: &mut dyn Write) -> Result<()> {
    let now = now_ms();
    let (runs, more, silent) = match args.stale {
        None => {
            let (runs, more) = collect(engine, args).await?;
            (runs, more, HashMap::new())
        }
        Some(stale) => collect_stale(engine, args, now.saturating_sub(stale.as_millis() as u64)).await?,
    };
    if args.json {
        for run in &runs {
            let line =
                serde_json::to_string(run).map_err(|e| Error::failed(format!("encoding run {}: {e}", run.id)))?;
            writeln!(out, "{line}")?;
        }
        return Ok(());
    }
    if runs.is_empty() {
        match args.stale {
            Some(stale) => {
                let filtered = !args.status.is_empty() || args.workflow.is_some() || args.namespace.is_some();
                writeln!(
                    out,
                    "no runs match: no remote step{} is silent for {} or more",
                    if filtered { " of a run the other filters select" } else { "" },
                    interval(stale.as_millis() as u64)
                )?
            }
            None => writeln!(out, "no runs match")?,
        }
        return Ok(());
    }
    let mut table = Table::new(&["ID", "WORKFLOW", "STATUS", "UPDATED", "RETRIES/RECOV", "WAITING ON / ERROR"]);
    for run in &runs {
        let history = match engine.history(&run.id).await {
            Ok(history) => history,
            // Deleted since it was listed (from another shell, the API): not a row any more.
            Err(durable::Error::RunNotFound(_)) => continue,
            Err(e) => return Err(e.into()),
        };
        let admission = if waits_for_admission(run) { RunAdmission::of(engine, run, false).await? } else { None };
        let retries: u32 = history.iter().map(|c| c.attempts.saturating_sub(1)).sum();
        table.row(vec![
            run.id.to_string(),
            workflow_at(run),
            run.status.to_string(),
            ago(run.updated_at, now),
            format!("{retries}/{}", run.recovery_attempts),
            truncate(
                &silent
                    .get(&run.id)
                    .map_or_else(|| waiting_on(run, &history, admission.as_ref(), now), |tasks| tasks.join(", ")),
                72,
            ),
        ]);
    }
    table.write(out, "")?;
    if more {
        writeln!(out, "(the newest {} shown; more match: raise --limit, or --limit 0 for all)", runs.len())?;
    }
    Ok(())
}

/// The runs `list` shows, following pages up to the limit (0: no limit), and whether more
/// runs match.
async fn collect(engine: &Engine, args: &ListArgs) -> Result<(Vec<Run>, bool)> {
    const PAGE: usize = 500;
    let mut filter = RunFilter {
        workflow: args.workflow.clone(),
        statuses: args.status.clone(),
        namespace: args.namespace.clone(),
        ..RunFilter::default()
    };
    let mut runs = Vec::new();
    loop {
        let want = if args.limit == 0 { PAGE } else { (args.limit - runs.len()).min(PAGE) };
        filter.limit = want;
        let page = engine.list_runs(&filter).await?;
        runs.extend(page.runs);
        match page.next_cursor {
            Some(cursor) if args.limit == 0 || runs.len() < args.limit => filter.cursor = Some(cursor),
            Some(_) => return Ok((runs, true)),
            None => return Ok((runs, false)),
        }
    }
}

/// How many tasks `--stale` looks at: more silent remote steps than this are not listed.
const STALE_TASKS: usize = 10_000;

/// The runs `list --stale` shows: active runs with an unfinished remote step silent since
/// `since` (`TaskFilter::silent_since`), narrowed by the other flags, newest first; whether
/// more match; and per run its silent steps in words.
async fn collect_stale(
    engine: &Engine,
    args: &ListArgs,
    since: u64,
) -> Result<(Vec<Run>, bool, HashMap<RunId, Vec<String>>)> {
    let now = now_ms();
    let filter =
        TaskFilter { silent_since: Some(since), unfinished: true, limit: STALE_TASKS, ..TaskFilter::default() };
    let tasks = engine.store().list_tasks(&filter).await?;
    let mut silent: HashMap<RunId, Vec<String>> = HashMap::new();
    for task in &tasks {
        silent.entry(task.task.run_id.clone()).or_default().push(silence(task, now));
    }
    let mut runs = Vec::new();
    for id in silent.keys() {
        let Some(run) = engine.get_run(id).await? else { continue };
        let wanted = !run.status.is_terminal()
            && (args.status.is_empty() || args.status.contains(&run.status))
            && args.workflow.as_ref().is_none_or(|w| &run.workflow == w)
            && args.namespace.as_ref().is_none_or(|n| &run.namespace == n);
        if wanted {
            runs.push(run);
        }
    }
    runs.sort_by(|a, b| (b.created_at, &b.id).cmp(&(a.created_at, &a.id)));
    let more = args.limit != 0 && runs.len() > args.limit;
    if more {
        runs.truncate(args.limit);
    }
    Ok((runs, more, silent))
}

/// A silent remote step in words: `remote step resize (attempt 1) silent 20 min on w-2`, or
/// `remote step render (attempt 1) not picked up for 20 min`.
fn silence(task: &Task, now: u64) -> String {
    let t = &task.task;
    match (task.heartbeat_at, &task.worker) {
        (Some(at), Some(worker)) if task.state == TaskState::Claimed => format!(
            "remote step {} (attempt {}) silent {} on {worker}",
            t.name,
            t.attempt,
            duration_ms(now.saturating_sub(at))
        ),
        (Some(at), worker) => format!(
            "remote step {} (attempt {}) handed back, waiting {} (last held by {})",
            t.name,
            t.attempt,
            duration_ms(now.saturating_sub(at)),
            worker.as_deref().unwrap_or("?")
        ),
        (None, _) => format!(
            "remote step {} (attempt {}) not picked up for {}",
            t.name,
            t.attempt,
            duration_ms(now.saturating_sub(t.created_at))
        ),
    }
}

/// Whether `run` may wait at an admission gate: `pending` for its concurrency key, or
/// `suspended` with a step waiting for its queue.
fn waits_for_admission(run: &Run) -> bool {
    run.status == RunStatus::Suspended || is_gated(run)
}

/// A `pending` run waiting for a slot of its concurrency key ([`protocol::GATED`]).
fn is_gated(run: &Run) -> bool {
    run.status == RunStatus::Pending && run.wake_at == Some(protocol::GATED)
}

/// What an active run waits for (or, for a finished one, its error), in a few words.
/// `admission`: what it waits for at admission gates, when the store keeps such records.
fn waiting_on(run: &Run, history: &[Checkpoint], admission: Option<&RunAdmission>, now: u64) -> String {
    let gates = admission.map(|a| a.waiting_on(run)).unwrap_or_default();
    match run.status {
        RunStatus::Completed => "-".into(),
        RunStatus::Failed | RunStatus::Cancelled | RunStatus::Dead => {
            run.error.as_ref().map_or_else(|| "-".into(), |e| format!("error: {}", e.message))
        }
        RunStatus::Pending if is_gated(run) => {
            if gates.is_empty() {
                "a slot of its concurrency key".into()
            } else {
                gates.join(", ")
            }
        }
        RunStatus::Pending => match run.wake_at {
            // A delayed start (`StartOptions::start_at` / `delay`, or a schedule's jitter).
            Some(at) if at > now => format!("its delayed start at {} ({})", timestamp(at), ago(at, now)),
            _ => "a worker to pick it up".into(),
        },
        RunStatus::Running => match (&run.lease_owner, run.lease_until) {
            (Some(owner), Some(until)) if until >= now => format!("running on {owner} (lease {})", ago(until, now)),
            (_, Some(until)) => format!("recovery: its worker's lease expired {}", ago(until, now)),
            _ => "running".into(),
        },
        RunStatus::Blocked => run.error.as_ref().map_or_else(|| "blocked".into(), |e| e.message.clone()),
        RunStatus::Suspended => {
            let cancel_requested =
                run.error.as_ref().is_some_and(|e| e.code() == Some(durable::codes::CANCEL_REQUESTED));
            let mut waits = waits(history, now);
            waits.extend(gates);
            if cancel_requested {
                waits.insert(0, "a worker to run its undos (cancel requested)".into());
            } else if let Some(at) = run.wake_at.filter(|at| *at <= now) {
                // Due: something arrived or a timer fired, and its next turn is what it waits for.
                waits.insert(0, format!("a worker to run it (due {})", ago(at, now)));
            }
            if waits.is_empty() {
                match run.wake_at {
                    Some(at) => format!("a wake-up {}", ago(at, now)),
                    None => "a delivery".into(),
                }
            } else {
                waits.join(", ")
            }
        }
    }
}

/// The waiting checkpoints of a run (and its remote steps out), in words; a signal's timeout is
/// folded into its wait.
fn waits(history: &[Checkpoint], now: u64) -> Vec<String> {
    let waiting: Vec<&Checkpoint> = history.iter().filter(|c| c.status == CheckpointStatus::Waiting).collect();
    let timeout_of = |name: &str| {
        waiting
            .iter()
            .find(|c| c.kind == StepKind::Sleep && protocol::parse_timeout_name(&c.name) == Some(name))
            .and_then(|c| c.wake_at)
    };
    let mut out = Vec::new();
    for cp in &waiting {
        let text = match cp.kind {
            StepKind::Sleep if protocol::parse_timeout_name(&cp.name).is_some() => {
                let waited = protocol::parse_timeout_name(&cp.name).unwrap_or_default();
                // Folded into its wait while that waits; moot once it was delivered.
                if history.iter().any(|c| c.kind != StepKind::Sleep && c.name == waited) {
                    continue;
                }
                format!("timeout of {waited} {}", cp.wake_at.map_or_else(String::new, |at| ago(at, now)))
            }
            StepKind::Sleep => format!("timer due {}", cp.wake_at.map_or_else(|| "-".into(), |at| ago(at, now))),
            StepKind::Signal | StepKind::Event => {
                let what = if cp.kind == StepKind::Signal { "signal" } else { "event" };
                match timeout_of(&cp.name) {
                    Some(at) => format!("{what} {} (times out {})", cp.name, ago(at, now)),
                    None => format!("{what} {}", cp.name),
                }
            }
            StepKind::Child => {
                let child = cp.input.as_ref().and_then(|p| p.decode::<RunId>().ok());
                format!("child {}", child.map_or_else(|| format!("at seq {}", cp.seq), |c| c.to_string()))
            }
            StepKind::Step | StepKind::Compensation => format!(
                "retry of {} (attempt {} {})",
                cp.name,
                cp.attempts + 1,
                cp.wake_at.map_or_else(|| "soon".into(), |at| ago(at, now))
            ),
            StepKind::Remote => format!("remote step {}", cp.name),
            other => format!("{other} {}", cp.name),
        };
        out.push(text.trim_end().to_string());
    }
    // A remote step's attempt that is out: its checkpoint is running, not waiting.
    for cp in history.iter().filter(|c| c.kind == StepKind::Remote && c.status == CheckpointStatus::Running) {
        out.push(format!("remote step {} (attempt {})", cp.name, cp.attempts));
    }
    out
}

/// `durable runs show`.
pub(crate) async fn show(store: &StoreArgs, args: &ShowArgs, out: &mut dyn Write) -> Result<()> {
    let id = parse_id(&args.id)?;
    let store = store.open(Access::Existing).await?;
    with_operator_engine(store, |engine| async move { show_run(&engine, &id, args.json, out).await }).await
}

/// `durable runs show` on `engine`'s store.
pub(crate) async fn show_run(engine: &Engine, id: &RunId, json: bool, out: &mut dyn Write) -> Result<()> {
    let run = require(engine, id).await?;
    let history = engine.history(id).await?;
    let children = engine.children(id).await?;
    let waiters = engine.store().waiters(id).await?;
    let tasks = pending_tasks(engine, &run).await?;
    let admission = RunAdmission::of(engine, &run, true).await?;
    if json {
        let doc = json!({
            "run": run, "history": history, "children": children, "waiters": waiters, "remote_steps": tasks,
            "admission": admission.as_ref().map(RunAdmission::to_json),
        });
        let text = serde_json::to_string_pretty(&doc).map_err(|e| Error::failed(format!("encoding run {id}: {e}")))?;
        writeln!(out, "{text}")?;
        return Ok(());
    }
    write_run(out, &run, &history, &children, &waiters, admission.as_ref())?;
    write_tasks(out, &tasks)?;
    if let Some(admission) = admission.filter(|a| !a.is_empty()) {
        write_admission(out, &run, &admission)?;
    }
    Ok(())
}

/// The run's pending remote steps: its unfinished tasks, while it is active (a settled run's
/// leftover task only waits for a late result, which is dropped).
async fn pending_tasks(engine: &Engine, run: &Run) -> Result<Vec<Task>> {
    if run.status.is_terminal() {
        return Ok(Vec::new());
    }
    let filter = TaskFilter { run_id: Some(run.id.clone()), unfinished: true, limit: 1_000, ..TaskFilter::default() };
    Ok(engine.store().list_tasks(&filter).await?)
}

/// The admission slots the run holds and the requests it has queued.
fn write_admission(out: &mut dyn Write, run: &Run, admission: &RunAdmission) -> Result<()> {
    writeln!(out, "\nadmission ({} held, {} waiting)", admission.holds.len(), admission.waits.len())?;
    for line in admission.lines(run, now_ms()) {
        writeln!(out, "  {line}")?;
    }
    Ok(())
}

/// The pending remote steps, and the lines their handlers logged (all attempts).
fn write_tasks(out: &mut dyn Write, tasks: &[Task]) -> Result<()> {
    if tasks.is_empty() {
        return Ok(());
    }
    let now = now_ms();
    writeln!(out, "\npending remote steps ({})", tasks.len())?;
    let mut table = Table::new(&["SEQ", "NAME", "ATTEMPT", "STATE", "WORKER", "LAST HEARTBEAT", "CLAIMS", "PROGRESS"]);
    for task in tasks {
        let t = &task.task;
        let heartbeat = match task.heartbeat_at {
            Some(at) => ago(at, now),
            None => format!("never (dispatched {})", ago(t.created_at, now)),
        };
        table.row(vec![
            t.seq.to_string(),
            if t.queue == t.name { t.name.clone() } else { format!("{} (queue {})", t.name, t.queue) },
            t.attempt.to_string(),
            task.state.to_string(),
            task.worker.clone().unwrap_or_else(|| "-".into()),
            heartbeat,
            task.claims.to_string(),
            task.progress.as_ref().map_or_else(|| "-".into(), |p| truncate(p.as_str(), 60)),
        ]);
    }
    table.write(out, "  ")?;
    for task in tasks.iter().filter(|t| !t.logs.is_empty()) {
        writeln!(out, "\n  log of {} (seq {}):", task.task.name, task.task.seq)?;
        for line in &task.logs {
            let data = line.data.as_ref().map_or_else(String::new, |d| format!(" {}", truncate(&d.to_string(), 200)));
            writeln!(out, "    [{}] {} {}{data}", line.attempt, line.level, truncate(&line.message, 200))?;
        }
    }
    Ok(())
}

/// `durable runs export`.
pub(crate) async fn export(store: &StoreArgs, args: &ExportArgs, out: &mut dyn Write) -> Result<()> {
    let id = parse_id(&args.id)?;
    let store = store.open(Access::Existing).await?;
    with_operator_engine(store, |engine| async move {
        let export = match engine.export_history(&id).await {
            Err(durable::Error::RunNotFound(_)) => return Err(not_found(&id)),
            other => other?,
        };
        let mut text = export.to_json().map_err(|e| Error::failed(format!("encoding run {id}: {e}")))?;
        text.push('\n');
        let Some(path) = &args.out else {
            out.write_all(text.as_bytes())?;
            return Ok(());
        };
        write_file(path, &text)?;
        writeln!(
            out,
            "exported run {id} ({}, {}, {} checkpoint{}) to {}",
            workflow_at(&export.run),
            export.run.status,
            export.checkpoints.len(),
            plural(export.checkpoints.len() as u64),
            path.display()
        )?;
        Ok(())
    })
    .await
}

/// Writes `text` to `path` whole or not at all (a file beside it, then renamed over it),
/// creating missing parent directories. A path that cannot be written as given is bad input
/// (exit 2); a full disk or an interrupted write is a failure (exit 1).
fn write_file(path: &std::path::Path, text: &str) -> Result<()> {
    use std::io::ErrorKind;
    let error = |what: &str, e: std::io::Error| {
        let message = format!("cannot {what} {}: {e}", path.display());
        match e.kind() {
            ErrorKind::StorageFull | ErrorKind::Interrupted | ErrorKind::TimedOut | ErrorKind::WouldBlock => {
                Error::failed(message)
            }
            _ => Error::bad(message),
        }
    };
    if path.is_dir() {
        return Err(Error::bad(format!("cannot write {}: it is a directory; name a file", path.display())));
    }
    // A typo away from `--db`: never replace a database with an export.
    let mut head = [0u8; 16];
    if path.metadata().is_ok_and(|m| m.is_file())
        && std::fs::File::open(path).and_then(|mut f| std::io::Read::read_exact(&mut f, &mut head)).is_ok()
        && &head == b"SQLite format 3\0"
    {
        return Err(Error::bad(format!(
            "cannot write {}: it is an SQLite database (a durable database?), which the export would replace; \
             name another file",
            path.display()
        )));
    }
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|e| error("create the directory of", e))?;
    }
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = std::path::PathBuf::from(tmp);
    std::fs::write(&tmp, text).map_err(|e| error("write", e))?;
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        error("write", e)
    })
}

fn write_run(
    out: &mut dyn Write,
    run: &Run,
    history: &[Checkpoint],
    children: &[Run],
    waiters: &[Waiter],
    admission: Option<&RunAdmission>,
) -> Result<()> {
    let now = now_ms();
    let or_dash = |s: Option<String>| s.unwrap_or_else(|| "-".into());
    let mut fields = Table::new(&["run", run.id.as_str()]);
    fields.row(vec!["workflow".into(), workflow_at(run)]);
    fields.row(vec!["status".into(), run.status.to_string()]);
    if !run.status.is_terminal() {
        fields.row(vec!["waiting on".into(), waiting_on(run, history, admission, now)]);
    }
    fields.row(vec!["namespace".into(), run.namespace.clone()]);
    if !run.tags.is_empty() {
        fields.row(vec!["tags".into(), run.tags.join(", ")]);
    }
    if let Some(parent) = &run.parent {
        fields.row(vec!["parent".into(), format!("{} (seq {})", parent.run_id, parent.seq)]);
    }
    fields.row(vec!["created".into(), format!("{} ({})", timestamp(run.created_at), ago(run.created_at, now))]);
    fields.row(vec![
        "updated".into(),
        format!(
            "{} ({} after creation)",
            timestamp(run.updated_at),
            duration_ms(run.updated_at.saturating_sub(run.created_at))
        ),
    ]);
    match run.wake_at {
        // Never due by time: a release of its key hands it a slot and makes it due at once.
        Some(_) if is_gated(run) => fields.row(vec![
            "starts at".into(),
            "when a slot of its concurrency key is handed to it (a run holding the key settles)".into(),
        ]),
        // A pending run's `wake_at` is its delayed start.
        Some(at) if run.status == RunStatus::Pending => {
            let when = if at > now { ago(at, now) } else { format!("due {}: a worker picks it up", ago(at, now)) };
            fields.row(vec!["starts at".into(), format!("{} ({when})", timestamp(at))]);
        }
        Some(at) => fields.row(vec!["wake at".into(), format!("{} ({})", timestamp(at), ago(at, now))]),
        None => {}
    }
    if let Some(owner) = &run.lease_owner {
        let until = run.lease_until.map_or_else(String::new, |u| format!(" until {}", timestamp(u)));
        fields.row(vec!["lease".into(), format!("{owner}{until}")]);
    }
    fields.row(vec!["recoveries".into(), run.recovery_attempts.to_string()]);
    fields.row(vec!["input".into(), truncate(run.input.as_str(), 200)]);
    match protocol::successor_of(run) {
        Some(next) => fields.row(vec!["output".into(), format!("continued as new as run {next}")]),
        None => fields.row(vec!["output".into(), or_dash(run.output.as_ref().map(|o| truncate(o.as_str(), 200)))]),
    }
    fields.row(vec!["error".into(), or_dash(run.error.as_ref().map(|e| truncate(&e.to_string(), 200)))]);
    fields.write(out, "")?;

    writeln!(out, "\ntimeline ({} checkpoint{})", history.len(), plural(history.len() as u64))?;
    if !history.is_empty() {
        let mut table = Table::new(&["SEQ", "NAME", "KIND", "STATUS", "ATTEMPTS", "DURATION", "ERROR"]);
        for cp in history {
            let name = match cp.input.as_ref().and_then(|p| p.decode::<RunId>().ok()) {
                Some(child) if cp.kind == StepKind::Child => format!("{} → {child}", cp.name),
                _ => cp.name.clone(),
            };
            table.row(vec![
                cp.seq.to_string(),
                name,
                cp.kind.to_string(),
                cp.status.to_string(),
                cp.attempts.to_string(),
                match cp.status {
                    CheckpointStatus::Completed | CheckpointStatus::Failed => {
                        duration_ms(cp.updated_at.saturating_sub(cp.started_at))
                    }
                    // Left unfinished by a run that ended (a race's losing branch, a cancel).
                    CheckpointStatus::Running | CheckpointStatus::Waiting if run.status.is_terminal() => "-".into(),
                    // Still going (a remote step queued, a sleep, a wait): how long so far.
                    CheckpointStatus::Running | CheckpointStatus::Waiting => {
                        format!("{} so far", duration_ms(now.saturating_sub(cp.started_at)))
                    }
                },
                checkpoint_error(cp),
            ]);
        }
        table.write(out, "  ")?;
    }

    writeln!(out, "\nchildren ({})", children.len())?;
    if !children.is_empty() {
        let mut table = Table::new(&["ID", "WORKFLOW", "STATUS", "UPDATED"]);
        for child in children {
            table.row(vec![
                child.id.to_string(),
                workflow_at(child),
                child.status.to_string(),
                ago(child.updated_at, now),
            ]);
        }
        table.write(out, "  ")?;
    }

    writeln!(out, "\nwaiters ({})", waiters.len())?;
    if !waiters.is_empty() {
        let mut table = Table::new(&["SEQ", "WAITS FOR", "SINCE"]);
        for w in waiters {
            let what = match &w.kind {
                // The wait a remote step's result is delivered to (`protocol::remote_token`).
                WaitKind::Signal { token } if token.starts_with("remote:") => {
                    format!("the result of remote step {} ({token})", w.name)
                }
                WaitKind::Signal { token } => format!("signal {token}"),
                WaitKind::Event { name, matcher } => {
                    format!("event {name} matching {}", truncate(matcher.as_str(), 60))
                }
            };
            table.row(vec![w.seq.to_string(), what, timestamp(w.created_at)]);
        }
        table.write(out, "  ")?;
    }
    Ok(())
}

/// `durable runs retry`.
pub(crate) async fn retry(store: &StoreArgs, args: &RunIdArgs, out: &mut dyn Write) -> Result<()> {
    let id = parse_id(&args.id)?;
    let store = store.open(Access::Existing).await?;
    with_operator_engine(store, |engine| async move {
        let ops::Retried { before: run, from } = ops::retry(&engine, &id).await.map_err(op_error)?;
        let resume = from.map_or_else(
            || "from where it stopped".to_string(),
            |cp| format!("from step {:?} (seq {}) with fresh attempts; the steps before it are kept", cp.name, cp.seq),
        );
        writeln!(
            out,
            "run {id} is pending again: it resumes {resume} when a worker with workflow {} registered picks it up",
            workflow_at(&run)
        )?;
        Ok(())
    })
    .await
}

/// `durable runs cancel`.
pub(crate) async fn cancel(store: &StoreArgs, args: &CancelArgs, out: &mut dyn Write) -> Result<()> {
    let id = parse_id(&args.id)?;
    let store = store.open(Access::Existing).await?;
    with_operator_engine(store, |engine| async move {
        let how = if args.compensate { Cancel::Compensate } else { Cancel::Abandon };
        let (run, outcome) = ops::cancel(&engine, &id, how).await.map_err(op_error)?;
        match outcome {
            ops::Cancelled::AlreadyFinished(s) => match protocol::successor_of(&run) {
                Some(next) => writeln!(
                    out,
                    "run {id} continued as new as run {next}; nothing to cancel here (cancel the chain's active run)"
                )?,
                None => writeln!(out, "run {id} is already {s}; nothing to cancel")?,
            },
            ops::Cancelled::Cancelled => writeln!(out, "run {id} is cancelled (its active children too)")?,
            ops::Cancelled::Requested => writeln!(
                out,
                "cancel requested for run {id}: a worker with workflow {} registered runs its undos, then it ends cancelled",
                workflow_at(&run)
            )?,
            ops::Cancelled::FinishedFirst(s) => {
                writeln!(out, "run {id} finished as {s} before the cancel landed; nothing was cancelled")?
            }
        }
        Ok(())
    })
    .await
}

/// `durable runs delete`.
pub(crate) async fn delete(store: &StoreArgs, args: &DeleteArgs, out: &mut dyn Write) -> Result<()> {
    let id = parse_id(&args.id)?;
    let store = store.open(Access::Existing).await?;
    with_operator_engine(store, |engine| async move {
        let deleted = match ops::delete(&engine, &id, args.force).await {
            Err(ops::OpError::Active { status, .. }) => {
                return Err(Error::bad(format!(
                    "run {id} is {status} (still active): cancel it first (`durable runs cancel {id}`), or pass --force to delete it anyway"
                )));
            }
            other => other.map_err(op_error)?,
        };
        match deleted {
            1 => writeln!(out, "deleted run {id}")?,
            n => writeln!(out, "deleted run {id} and {} descendant run{}", n - 1, if n == 2 { "" } else { "s" })?,
        }
        Ok(())
    })
    .await
}

/// `durable signal`.
pub(crate) async fn signal(store: &StoreArgs, args: &SignalArgs, out: &mut dyn Write) -> Result<()> {
    if args.token.trim().is_empty() {
        return Err(op_error(ops::signal_token_empty()));
    }
    let text = if args.payload == "-" {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .map_err(|e| Error::bad(format!("could not read the payload from standard input: {e}")))?;
        text
    } else {
        args.payload.clone()
    };
    let payload: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
        Error::bad(format!(
            "the payload is not valid JSON ({e}); pass one JSON document, e.g. '{{\"approved\": true}}' or '\"yes\"'"
        ))
    })?;
    let store = store.open(Access::Existing).await?;
    with_operator_engine(store, |engine| async move {
        match ops::signal(&engine, &args.token, &payload).await.map_err(op_error)? {
            Delivery::Delivered { run_id, seq } => {
                let workflow = engine.get_run(&run_id).await?.map_or_else(|| "its workflow".into(), |r| workflow_at(&r));
                writeln!(
                    out,
                    "delivered to run {run_id} (seq {seq}): it resumes when a worker with workflow {workflow} registered picks it up"
                )?;
            }
            Delivery::Buffered => writeln!(
                out,
                "buffered: no run waits on {:?} now; the next run that waits on it receives this payload",
                args.token
            )?,
        }
        Ok(())
    })
    .await
}

/// A checkpoint's error for the timeline: a completed step keeps the error of its last failed
/// attempt, which is said as such (it did not fail).
fn checkpoint_error(cp: &Checkpoint) -> String {
    match &cp.error {
        None => String::new(),
        Some(e) if cp.status == CheckpointStatus::Completed => {
            truncate(&format!("(an earlier attempt failed: {e})"), 100)
        }
        Some(e) => truncate(&e.to_string(), 100),
    }
}
