//! The command line's grammar: every command, flag and argument, as clap derive structs. The
//! doc comments are the `--help` texts.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use clap::parser::ValueSource;
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use durable::RunStatus;

/// The end of `durable --help`: examples, and what the exit codes mean. Every `durable …`
/// line of a help text is run by the tests (tests/cli_examples.rs) on a database the demo
/// made: it must exit 0, or with the code a trailing `# exits N: …` comment gives.
const AFTER_HELP: &str = "\
Examples:
  durable demo --runs 50
  durable runs list --status failed
  durable runs show demo-saga-3
  durable runs export demo-order-0 --out tests/fixtures/replay/order.json
  durable runs delete demo-fanout-4
  durable signal approve:demo-approval-2 '{\"approved\": true, \"by\": \"ops\"}'
  durable schedules list
  durable schedules show daily-order
  durable workers
  durable queues

Exit codes:
  0    success
  2    the command was wrong: a usage error, an unknown run or schedule, malformed JSON, a run
       in the wrong state, or a --db / --url that cannot be opened as given (a missing directory, a file that
       is not a durable database, a newer schema or an older one (durable migrate), a malformed URL, an
       unknown database)
  1    it failed while running: the store is busy or unreachable, an I/O error (trying again
       later may help)
  130  interrupted (Ctrl-C or SIGTERM) before the work was done (`durable serve` exits 0)";

/// Operate durable workflow runs: inspect, retry, cancel and delete them, send signals, operate
/// the stored schedules, and try the engine with a demo.
///
/// Operator commands (`runs`, `signal`, `signals`, `schedules`, `workers`, `queues`, `serve`,
/// `migrate`) never execute workflow code: workers are your own binaries, which embed the
/// workflow code and an engine. A run set back to `pending` by `runs retry`, woken by `signal`,
/// or started by a schedule continues when a worker with its workflow registered picks it up.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "durable",
    version,
    // Without a command: one line naming the commands (see `usage_error` in lib.rs), not the
    // whole help on stderr.
    subcommand_required = true,
    arg_required_else_help = false,
    after_help = AFTER_HELP
)]
pub struct Cli {
    /// Where the runs are kept.
    #[command(flatten)]
    pub store: StoreArgs,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// Parses the arguments like [`Parser::try_parse_from`], and refuses `--db` together with
    /// `--url` wherever each is given: clap checks a conflict between global flags only among
    /// those given on the same side of the command, so `durable --url … runs list --db x.db`
    /// would otherwise pick one store silently.
    pub fn try_parse_args<I, T>(args: I) -> Result<Cli, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        let mut cmd = Cli::command();
        let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
        let flag_given = |id: &str| {
            let flag = format!("--{id}");
            args.iter().any(|a| a.to_str().is_some_and(|a| a == flag || a.starts_with(&format!("{flag}="))))
        };
        // A store flag on the command line wins over the other store's variable: `--url` with
        // DURABLE_DB set (or `--db` with DURABLE_URL) is that one store, not a conflict.
        for (flag, other) in [("url", "db"), ("db", "url")] {
            if flag_given(flag) && !flag_given(other) {
                cmd = cmd.mut_arg(other, |a| a.env(None));
            }
        }
        let set = |var: &str| std::env::var_os(var).is_some_and(|v| !v.is_empty());
        if !flag_given("db") && !flag_given("url") && set("DURABLE_DB") && set("DURABLE_URL") {
            return Err(cmd.error(
                clap::error::ErrorKind::ArgumentConflict,
                "DURABLE_DB and DURABLE_URL are both set: unset one, or choose the store with --db or --url",
            ));
        }
        // A store variable set but empty reads as an empty flag value: ignored when the flag is
        // given, named otherwise.
        for (var, id) in [("DURABLE_DB", "db"), ("DURABLE_URL", "url"), ("DURABLE_SCHEMA", "schema")] {
            if !std::env::var_os(var).is_some_and(|v| v.is_empty()) {
                continue;
            }
            let flag = format!("--{id}");
            let other_store = match id {
                "db" => flag_given("url"),
                "url" => flag_given("db"),
                _ => false,
            };
            if !flag_given(id) && !other_store {
                return Err(cmd.error(
                    clap::error::ErrorKind::InvalidValue,
                    format!("{var} is set but empty: unset it, or set it to a value for {flag}"),
                ));
            }
            cmd = cmd.mut_arg(id, |a| a.env(None));
        }
        let matches = cmd.try_get_matches_from_mut(args)?;
        let given = |id: &str| {
            let mut level = Some(&matches);
            while let Some(m) = level {
                if m.value_source(id) == Some(ValueSource::CommandLine) {
                    return true;
                }
                level = m.subcommand().map(|(_, sub)| sub);
            }
            false
        };
        if given("url") && given("db") {
            return Err(cmd.error(
                clap::error::ErrorKind::ArgumentConflict,
                "the argument '--url <URL>' cannot be used with '--db <PATH>': give one store",
            ));
        }
        let cli = Cli::from_arg_matches(&matches).map_err(|e| e.format(&mut cmd))?;
        // A schema is PostgreSQL's: given for the SQLite file, it would be dropped unseen, and
        // the command would act on ./durable.db where the user meant a database.
        if cli.store.url.is_some() && cli.store.schema.trim().is_empty() {
            return Err(cmd.error(
                clap::error::ErrorKind::InvalidValue,
                "--schema is empty: name the PostgreSQL schema the runs live in (the workers' PostgresOptions::schema; \
                 durable by default)",
            ));
        }
        if given("schema") && cli.store.url.is_none() {
            return Err(cmd.error(
                clap::error::ErrorKind::ArgumentConflict,
                "--schema names a PostgreSQL schema and needs --url (or DURABLE_URL); the runs of --db are in the \
                 SQLite file",
            ));
        }
        Ok(cli)
    }
}

/// The store flags, shared by every command (they may be given before or after the command):
/// an SQLite file (`--db`, the default) or a PostgreSQL database (`--url`, with `--schema`).
/// [`StoreArgs`] is the one place that turns the flags into a store.
#[derive(Debug, Clone, Args)]
pub struct StoreArgs {
    /// The SQLite database file. Operator commands only open an existing durable database and
    /// never create one (nor migrate one an older durable wrote: `durable migrate` does); `demo`
    /// creates it if needed.
    #[arg(long, global = true, value_name = "PATH", env = "DURABLE_DB", default_value = "./durable.db")]
    pub db: PathBuf,

    /// A PostgreSQL database instead of the SQLite file:
    /// `postgres://user[:password]@host[:port]/database`. Operator commands only open an existing
    /// durable schema and never create one (nor migrate one an older durable wrote: `durable
    /// migrate` does); `demo` creates it if needed.
    #[arg(long, global = true, value_name = "URL", env = "DURABLE_URL", hide_env_values = true, conflicts_with = "db")]
    pub url: Option<String>,

    /// With --url: the schema the runs live in (the workers' `PostgresOptions::schema`).
    #[arg(long, global = true, value_name = "NAME", env = "DURABLE_SCHEMA", default_value = "durable")]
    pub schema: String,
}

/// The commands.
#[derive(Debug, Clone, Subcommand)]
pub enum Command {
    /// Run a mix of example workflows (on the SQLite file, or the PostgreSQL database of --url),
    /// with a live progress bar.
    ///
    /// Registers five example workflows — an order whose payment step fails twice and is
    /// retried, a durable sleep, an approval that waits for a signal (which the demo sends), a
    /// saga whose last step fails so its undos run, and a fan-out over child runs — and runs N
    /// of them. Run ids are deterministic (`demo-<kind>-<i>`): kill the demo (Ctrl-C, or even
    /// `kill -9`) and run it again, and it resumes the same runs instead of starting over.
    #[command(after_help = "\
Examples:
  durable demo
  durable demo --runs 20 --db demo.db        # a database of its own")]
    Demo(DemoArgs),

    /// List, inspect and operate runs.
    #[command(subcommand, arg_required_else_help = false)]
    Runs(RunsCommand),

    /// List, inspect, pause, resume, trigger and delete the stored schedules.
    ///
    /// Schedules are declared by workers (`Engine::schedule`): a cron expression read in a time
    /// zone, or an interval. They are fired by the scheduler of every worker that has the
    /// schedule's workflow registered; these commands change the stored schedule and start
    /// nothing themselves.
    #[command(subcommand, arg_required_else_help = false)]
    Schedules(SchedulesCommand),

    /// Send a signal: the oldest run waiting on TOKEN receives the JSON payload, or it is
    /// buffered for the next run that waits on TOKEN.
    ///
    /// The run resumes when a worker with its workflow registered picks it up.
    #[command(after_help = "\
Example:
  durable signal approve:demo-approval-2 '{\"approved\": true, \"by\": \"ops\"}'")]
    Signal(SignalArgs),

    /// List and purge the signals and events buffered because no run waited for them yet.
    ///
    /// A signal no wait takes is kept for the next wait on its token, and an event no wait
    /// accepts for the next wait on its name that matches it, however long that takes. One
    /// sent to a mistyped token, or to a run that already finished, stays until purged.
    #[command(subcommand, arg_required_else_help = false)]
    Signals(SignalsCommand),

    /// The health of remote steps: per queue, its depth (tasks waiting for a worker), the tasks
    /// claimed, how long the oldest has waited and the live workers serving it; and every live
    /// worker (heartbeated within 30 s) with its queues, capabilities, concurrency and last
    /// heartbeat.
    ///
    /// Workers are processes running `durable::Worker`; they execute the remote steps
    /// (`ctx.remote_step`) of runs. A queue with tasks and no live worker is why its runs wait
    /// (or show as `blocked` when they require capabilities no live worker has).
    #[command(after_help = "\
Examples:
  durable workers
  durable workers --json")]
    Workers(WorkersArgs),

    /// Flow control: every admission gate in the store — step queues (`engine.register_queue`)
    /// and workflow concurrency keys (`WorkflowOptions::concurrency` / `singleton`) — with its
    /// limits, the slots held, the requests waiting (per fairness key), the current rate
    /// window's count and how long the oldest waiter has waited.
    ///
    /// A gate appears the first time a run asks to pass it: a start of a workflow with a
    /// concurrency key, or a step sent through a registered queue (`.queue(name)`). What one
    /// run holds and waits for is in `runs show` (its place in its key's line too).
    #[command(after_help = "\
Examples:
  durable queues
  durable queues --kind key --namespace default
  durable queues --json")]
    Queues(QueuesArgs),

    /// Serve the JSON API, Prometheus metrics and the web dashboard over the store, until
    /// Ctrl-C or SIGTERM.
    ///
    /// Like the other operator commands it executes no workflow code: retry, cancel, delete
    /// and signal from the page or the API change the store, and the workers with the
    /// workflows registered continue the runs. Actions (POST, DELETE) need `Authorization:
    /// Bearer <token>`; without --token (or DURABLE_TOKEN) the server refuses to start unless
    /// --dev is given, and --dev listens on a loopback address only. The endpoints are listed
    /// at /api/openapi.json.
    #[command(after_help = "\
Examples (a server runs until Ctrl-C or SIGTERM):
  DURABLE_TOKEN=... durable serve --addr 0.0.0.0:8080
  (development, no token, 127.0.0.1:8080 only:)   durable serve --dev
  curl -H 'Authorization: Bearer ...' -X POST localhost:8080/api/runs/demo-saga-3/cancel -d '{}'
Refused:
  durable serve --addr 127.0.0.1:0           # exits 2: no token and no --dev
  durable serve --dev --addr 0.0.0.0:8080    # exits 2: --dev listens on loopback only")]
    Serve(ServeArgs),

    /// Migrate the database (the SQLite file of --db, or the PostgreSQL schema of --url and
    /// --schema) that an older durable wrote to this build's schema version.
    ///
    /// Workers migrate it when they start; the other operator commands refuse an older
    /// database rather than upgrade it while they look. Once migrated, builds older than this
    /// one refuse the database: upgrade every worker that shares it. A database already at this
    /// build's version is left as it is.
    #[command(after_help = "\
Examples:
  durable migrate                 # ./durable.db
  (PostgreSQL:)   durable migrate --url postgres://app@db.example.com/app --schema durable")]
    Migrate,

    /// Print a shell completion script, e.g. `durable completions bash > /etc/bash_completion.d/durable`.
    Completions(CompletionsArgs),
}

/// Flags of `durable demo`.
#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// How many runs to execute (a mix of the five example workflows, in turn).
    #[arg(long, allow_hyphen_values = true, value_name = "N", default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub runs: u32,
}

/// The `durable runs` commands.
#[derive(Debug, Clone, Subcommand)]
pub enum RunsCommand {
    /// List runs, newest first: a table, or one JSON object per line with --json.
    #[command(after_help = "\
Examples:
  durable runs list --status failed,dead
  durable runs list --workflow demo_order --limit 5
  durable runs list --status blocked
  durable runs list --stale 15m
  durable runs list --json --limit 0")]
    List(ListArgs),

    /// Show a run: its fields, its timeline (one line per checkpoint), its children, what it
    /// waits for, its pending remote steps (worker, last heartbeat, progress, redeliveries
    /// and the lines their handlers logged), and the admission slots it holds and waits for
    /// (its concurrency key, with its place in the line; its steps' queues).
    #[command(
        alias = "history",
        after_help = "\
Examples:
  durable runs show demo-saga-3
  durable runs show demo-fanout-4 --json"
    )]
    Show(ShowArgs),

    /// Export a run's history as one versioned JSON document (the run, its checkpoints by seq,
    /// its waiters and its query state), to standard output or a file.
    ///
    /// Commit exports of real runs next to your workflow code and check in a test that the code
    /// still replays them (`durable::testing::replay::assert_replayable`): a change that would
    /// break running runs then fails in CI, not in production. Workflow code is not needed here
    /// and nothing is executed.
    #[command(after_help = "\
Examples:
  durable runs export demo-order-0
  durable runs export demo-saga-3 --out tests/fixtures/replay/saga.json")]
    Export(ExportArgs),

    /// Retry a failed or dead run: it goes back to `pending` and resumes from its first failed
    /// step (completed steps are kept) when a worker with its workflow registered picks it up.
    ///
    /// A run whose undos ran (a failed saga) is not retried: its steps' effects were undone.
    /// Start a new run instead.
    #[command(after_help = "\
Examples:
  durable runs list --status failed,dead     # the runs retry applies to
  durable runs retry demo-saga-3             # exits 2: a demo saga ran its undos")]
    Retry(RunIdArgs),

    /// Cancel an active run (and its children). With --compensate, its undos run first (on a
    /// worker), then it ends `cancelled`.
    Cancel(CancelArgs),

    /// Delete a finished run with its whole subtree (children, histories, waiters, state).
    #[command(after_help = "\
Example:
  durable runs delete demo-fanout-4          # and its three children")]
    Delete(DeleteArgs),
}

/// The `durable schedules` commands.
#[derive(Debug, Clone, Subcommand)]
pub enum SchedulesCommand {
    /// List the schedules by key: a table (workflow, cadence, paused, fires/skipped/missed, the
    /// next fire in the schedule's own time zone), or one JSON object per line with --json.
    #[command(after_help = "\
Examples:
  durable schedules list
  durable schedules list --json")]
    List(ScheduleListArgs),

    /// Show a schedule: its definition, what was fired so far (the last fire and its run, a
    /// fire held back by `buffer_one`, a manual fire not yet started) and its next 5 fire times
    /// in its own time zone and in UTC.
    #[command(after_help = "\
Examples:
  durable schedules show daily-order
  durable schedules show daily-order --json")]
    Show(ScheduleShowArgs),

    /// Pause a schedule: it fires nothing until resumed (a manual `trigger` still fires).
    #[command(after_help = "\
Example:
  durable schedules pause daily-order")]
    Pause(ScheduleKeyArgs),

    /// Resume a paused schedule: it fires again from its next fire time after now; the fires
    /// it would have had while paused are skipped.
    #[command(after_help = "\
Example:
  durable schedules resume daily-order")]
    Resume(ScheduleKeyArgs),

    /// Fire a schedule now, whatever its cadence, overlap policy or pause: prints the id of
    /// the run it starts (`sched:<key>:<ms>`).
    ///
    /// The run is created by the scheduler of a worker with the schedule's workflow registered
    /// (at once when one is running).
    #[command(after_help = "\
Example:
  durable schedules trigger daily-order")]
    Trigger(ScheduleKeyArgs),

    /// Delete a schedule. The runs it started are kept. A worker that declares it at startup
    /// (`Engine::schedule`) declares it again.
    #[command(after_help = "\
Example:
  durable schedules delete daily-order")]
    Delete(ScheduleKeyArgs),
}

/// Flags of `durable schedules list`.
#[derive(Debug, Clone, Args)]
pub struct ScheduleListArgs {
    /// One JSON object per schedule and per line (the schedule as stored), instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Flags of `durable schedules show`.
#[derive(Debug, Clone, Args)]
pub struct ScheduleShowArgs {
    /// The schedule key.
    #[arg(value_name = "KEY")]
    pub key: String,

    /// One JSON document: `{"schedule": …, "upcoming": [{"at": …, "local": …, "utc": …}, …]}`.
    #[arg(long)]
    pub json: bool,
}

/// A schedule key argument.
#[derive(Debug, Clone, Args)]
pub struct ScheduleKeyArgs {
    /// The schedule key.
    #[arg(value_name = "KEY")]
    pub key: String,
}

/// Flags of `durable runs list`.
#[derive(Debug, Clone, Args)]
pub struct ListArgs {
    /// Only runs with one of these statuses (comma-separated or repeated): pending, running,
    /// suspended, blocked, completed, failed, cancelled, dead.
    #[arg(long, value_name = "STATUS", value_delimiter = ',', value_parser = parse_status)]
    pub status: Vec<RunStatus>,

    /// Only runs of this workflow.
    #[arg(long, value_name = "NAME", value_parser = parse_name)]
    pub workflow: Option<String>,

    /// Only runs of this namespace.
    #[arg(long, value_name = "NAME", value_parser = parse_name)]
    pub namespace: Option<String>,

    /// Only active runs with a remote step silent for at least this long: its worker has not
    /// heartbeated (or, never claimed, no worker has picked it up) since. A number and a unit:
    /// 90s, 15m, 1h30m, 2d (units ms, s, m, h, d).
    #[arg(long, allow_hyphen_values = true, value_name = "DURATION", value_parser = parse_duration)]
    pub stale: Option<Duration>,

    /// At most this many runs (0: all of them).
    #[arg(long, allow_hyphen_values = true, value_name = "N", default_value_t = 50)]
    pub limit: usize,

    /// One JSON object per run and per line (the run as stored), instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Flags of `durable serve`.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// The address to listen on (port 0: any free port; the URL is printed).
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:8080", value_parser = parse_addr)]
    pub addr: std::net::SocketAddr,

    /// The bearer token actions (and with --protect-reads, reads) need.
    #[arg(long, value_name = "TOKEN", env = "DURABLE_TOKEN", hide_env_values = true)]
    pub token: Option<String>,

    /// A development server: no token needed, loopback addresses only.
    #[arg(long)]
    pub dev: bool,

    /// Reads need the token too (the page, its assets, /healthz and /api/openapi.json stay open).
    #[arg(long)]
    pub protect_reads: bool,

    /// How often an open event stream (/api/events) reads its view: 500ms, 1s, 5s.
    #[arg(long, allow_hyphen_values = true, value_name = "DURATION", default_value = "1s", value_parser = parse_duration)]
    pub poll: Duration,
}

/// Flags of `durable workers`.
#[derive(Debug, Clone, Args)]
pub struct WorkersArgs {
    /// One JSON document: `{"queues": [{"namespace", "queue", "depth", "claimed",
    /// "oldest_age_ms", "workers"}, …], "workers": [the live workers' descriptors, …]}`.
    #[arg(long)]
    pub json: bool,
}

/// Flags of `durable queues`.
#[derive(Debug, Clone, Args)]
pub struct QueuesArgs {
    /// Only gates of this kind: `queue` (step queues) or `key` (workflow concurrency keys).
    #[arg(long, value_name = "KIND", value_enum)]
    pub kind: Option<GateKind>,

    /// Only gates of this namespace.
    #[arg(long, value_name = "NAME", value_parser = parse_name)]
    pub namespace: Option<String>,

    /// One JSON object per gate and per line, instead of a table: `{"gate", "kind",
    /// "namespace", "name", "key", "limits", "held", "waiting", "waiting_by_fairness_key",
    /// "window_count", "window_start", "window_end", "oldest_waiting_since", "oldest_wait_ms"}`.
    #[arg(long)]
    pub json: bool,
}

/// The kinds of admission gates (`durable queues --kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum GateKind {
    /// A step queue (`engine.register_queue`, `ctx.step(..).queue(name)`).
    Queue,
    /// A workflow's concurrency key (`WorkflowOptions::concurrency`, `singleton`).
    Key,
}

impl GateKind {
    /// As gate names and `--json` spell it (`queue`, `key`).
    pub fn as_str(self) -> &'static str {
        match self {
            GateKind::Queue => "queue",
            GateKind::Key => "key",
        }
    }
}

/// Flags of `durable runs show`.
#[derive(Debug, Clone, Args)]
pub struct ShowArgs {
    /// The run id.
    #[arg(value_name = "ID")]
    pub id: String,

    /// One JSON document: `{"run": …, "history": […], "children": […], "waiters": […],
    /// "remote_steps": […], "admission": {"holds": […], "waits": […]}}` (`"admission"` is null
    /// on a store without flow control).
    #[arg(long)]
    pub json: bool,
}

/// Flags of `durable runs export`.
#[derive(Debug, Clone, Args)]
pub struct ExportArgs {
    /// The run id.
    #[arg(value_name = "ID")]
    pub id: String,

    /// Write the export to this file (its missing parent directories are created, an existing
    /// file is replaced) instead of standard output.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
}

/// A run id argument.
#[derive(Debug, Clone, Args)]
pub struct RunIdArgs {
    /// The run id.
    #[arg(value_name = "ID")]
    pub id: String,
}

/// Flags of `durable runs cancel`.
#[derive(Debug, Clone, Args)]
pub struct CancelArgs {
    /// The run id.
    #[arg(value_name = "ID")]
    pub id: String,

    /// Run the run's registered undos (newest first) before it ends `cancelled`. The undos are
    /// workflow code: a worker with the run's workflow registered runs them.
    #[arg(long)]
    pub compensate: bool,
}

/// Flags of `durable runs delete`.
#[derive(Debug, Clone, Args)]
pub struct DeleteArgs {
    /// The run id.
    #[arg(value_name = "ID")]
    pub id: String,

    /// Delete the run even if it is still active (pending, running or suspended). A worker
    /// executing it loses its work; cancel it first unless you are sure.
    #[arg(long)]
    pub force: bool,
}

/// Arguments of `durable signal`.
#[derive(Debug, Clone, Args)]
pub struct SignalArgs {
    /// The signal token the run waits on (`ctx.wait_for_signal(token)`).
    #[arg(value_name = "TOKEN")]
    pub token: String,

    /// The payload: a JSON document, e.g. '{"approved": true}' or '"yes"'. `-` reads it from
    /// standard input.
    // A negative number (`-1`, `-2.5`) is a payload, not a flag.
    #[arg(value_name = "JSON", allow_negative_numbers = true)]
    pub payload: String,
}

/// The `durable signals` commands.
#[derive(Debug, Clone, Subcommand)]
pub enum SignalsCommand {
    /// List the buffered signals and events per token or event name: how many, and when the
    /// oldest and the newest were buffered. Signals first, then events, each by key.
    #[command(after_help = "\
Examples:
  durable signals list
  durable signals list --older-than 7d
  durable signals list --kind event --prefix order. --json")]
    List(SignalsListArgs),

    /// Delete the buffered signals of one token (or with --kind event, the buffered events of
    /// one name): all of them, or with --older-than those buffered longer ago. Prints how many.
    ///
    /// Runs and their waits are not touched; a signal sent after the purge is buffered again.
    #[command(after_help = "\
Examples:
  durable signals purge approve:demo-approval-0
  durable signals purge order.paid --kind event --older-than 30d")]
    Purge(SignalsPurgeArgs),
}

/// Flags of `durable signals list`.
#[derive(Debug, Clone, Args)]
pub struct SignalsListArgs {
    /// Only signals or only events.
    #[arg(long, value_name = "KIND", value_enum)]
    pub kind: Option<BufferKindArg>,

    /// Only tokens or event names that begin with this.
    #[arg(long, value_name = "PREFIX", value_parser = parse_name)]
    pub prefix: Option<String>,

    /// Only keys whose oldest delivery was buffered longer ago than this (e.g. 7d, 12h).
    #[arg(long, allow_hyphen_values = true, value_name = "DURATION", value_parser = parse_duration)]
    pub older_than: Option<Duration>,

    /// At most this many keys.
    #[arg(long, allow_hyphen_values = true, value_name = "N", default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub limit: u32,

    /// One JSON object per line: `{"kind", "key", "count", "oldest_at", "newest_at"}` (times in
    /// ms since the epoch).
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `durable signals purge`.
#[derive(Debug, Clone, Args)]
pub struct SignalsPurgeArgs {
    /// The signal token (or with --kind event, the event name), exactly.
    #[arg(value_name = "KEY")]
    pub key: String,

    /// `signal` (the default) or `event`.
    #[arg(long, value_name = "KIND", value_enum, default_value = "signal")]
    pub kind: BufferKindArg,

    /// Only those buffered longer ago than this (e.g. 30d); without it, all of them.
    #[arg(long, allow_hyphen_values = true, value_name = "DURATION", value_parser = parse_duration)]
    pub older_than: Option<Duration>,
}

/// What a buffered delivery is kept under (`durable signals --kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BufferKindArg {
    /// Signals, kept per token.
    Signal,
    /// Events, kept per name.
    Event,
}

/// Arguments of `durable completions`.
#[derive(Debug, Clone, Args)]
pub struct CompletionsArgs {
    /// The shell to write a completion script for.
    #[arg(value_name = "SHELL")]
    pub shell: clap_complete::Shell,
}

/// A duration from the command line: numbers with units, largest first or not (`90s`, `15m`,
/// `1h30m`, `2d`, `500ms`), the way `durable schedules` prints intervals.
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    let bad = |why: &str| {
        format!(
            "invalid duration {s:?}: {why}; use a number and a unit, e.g. 90s, 15m, 1h30m, 2d (units: ms, s, m, h, d)"
        )
    };
    let text = s.trim();
    if text.is_empty() {
        return Err(bad("it is empty"));
    }
    let mut total: u64 = 0;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        if digits == 0 {
            return Err(bad("expected a number"));
        }
        let n: u64 = rest[..digits].parse().map_err(|_| bad("the number is too large"))?;
        rest = &rest[digits..];
        let unit_len = rest.find(|c: char| c.is_ascii_digit()).unwrap_or(rest.len());
        let size: u64 = match &rest[..unit_len] {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            "" => return Err(bad("a number needs a unit")),
            other => return Err(bad(&format!("unknown unit {other:?}"))),
        };
        rest = &rest[unit_len..];
        total = n.checked_mul(size).and_then(|ms| total.checked_add(ms)).ok_or_else(|| bad("it is too long"))?;
    }
    if total == 0 {
        return Err(bad("it must be longer than 0"));
    }
    Ok(Duration::from_millis(total))
}

/// A workflow or namespace name to filter by: not empty (no run has an empty one, so the
/// filter would only ever match nothing).
fn parse_name(s: &str) -> Result<String, String> {
    if s.trim().is_empty() {
        return Err("it is empty (leave the flag out to list every one)".into());
    }
    Ok(s.to_string())
}

/// An IP address and a port: the server listens on one address, so a host name (which may
/// resolve to several) is refused, naming the address to write instead.
fn parse_addr(s: &str) -> Result<std::net::SocketAddr, String> {
    s.parse().map_err(|_| match s.rsplit_once(':') {
        Some((host, port)) if port.parse::<u16>().is_ok() && host.eq_ignore_ascii_case("localhost") => {
            format!("{host:?} is not an IP address: listen on one, as 127.0.0.1:{port} ([::1]:{port} for IPv6)")
        }
        Some((host, port)) if port.parse::<u16>().is_ok() && !host.is_empty() => {
            format!("{host:?} is not an IP address: give the address of the interface to listen on, as 10.0.0.5:{port}")
        }
        _ => "expected an IP address and a port, as 127.0.0.1:8080 or [::1]:8080".to_string(),
    })
}

fn parse_status(s: &str) -> Result<RunStatus, String> {
    s.trim().parse::<RunStatus>().map_err(|_| {
        let known: Vec<&str> = RunStatus::ALL.iter().map(|st| st.as_str()).collect();
        format!("unknown run status {s:?} (known: {})", known.join(", "))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grammar_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn db_is_global_and_statuses_split_on_commas() {
        let cli = Cli::try_parse_from(["durable", "runs", "list", "--status", "failed,dead", "--db", "x.db"]).unwrap();
        assert_eq!(cli.store.db, PathBuf::from("x.db"));
        assert_eq!(cli.store.url, None);
        match cli.command {
            Command::Runs(RunsCommand::List(l)) => assert_eq!(l.status, [RunStatus::Failed, RunStatus::Dead]),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn url_and_schema_are_global_and_url_conflicts_with_db() {
        let cli =
            Cli::try_parse_args(["durable", "--url", "postgres://u@h/d", "runs", "list", "--schema", "s"]).unwrap();
        assert_eq!(cli.store.url.as_deref(), Some("postgres://u@h/d"));
        assert_eq!(cli.store.schema, "s");
        let cli = Cli::try_parse_from(["durable", "runs", "list"]).unwrap();
        assert_eq!(cli.store.schema, "durable");
        let e =
            Cli::try_parse_args(["durable", "runs", "list", "--url", "postgres://u@h/d", "--db", "x.db"]).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        // Either order, before or after the command.
        for args in [
            &["durable", "--db", "x.db", "--url", "postgres://u@h/d", "runs", "list"][..],
            &["durable", "runs", "list", "--db", "x.db", "--url", "postgres://u@h/d"][..],
            &["durable", "--url", "postgres://u@h/d", "runs", "list", "--db", "x.db"][..],
        ] {
            let e = Cli::try_parse_args(args).expect_err(&format!("{args:?} must be refused"));
            assert_eq!(e.exit_code(), 2, "{args:?}");
        }
    }

    #[test]
    fn a_negative_number_is_a_signal_payload() {
        for payload in ["-1", "-2.5", "-1e3"] {
            let cli = Cli::try_parse_from(["durable", "signal", "tok", payload, "--db", "x.db"]).unwrap();
            match cli.command {
                Command::Signal(s) => assert_eq!(s.payload, payload),
                other => panic!("{other:?}"),
            }
        }
        // Other dashes are still flags: a mistyped flag is not taken for a payload.
        assert!(Cli::try_parse_from(["durable", "signal", "tok", "--bd", "x.db"]).is_err());
    }

    #[test]
    fn durations_parse_like_intervals_print() {
        let ms = |s: &str| parse_duration(s).map(|d| d.as_millis() as u64);
        assert_eq!(ms("15m"), Ok(900_000));
        assert_eq!(ms("90s"), Ok(90_000));
        assert_eq!(ms("1h30m"), Ok(5_400_000));
        assert_eq!(ms("2d"), Ok(172_800_000));
        assert_eq!(ms("2s500ms"), Ok(2_500));
        assert_eq!(ms(" 5m "), Ok(300_000));
        for (bad, why) in [
            ("abc", "expected a number"),
            ("", "it is empty"),
            ("15", "a number needs a unit"),
            ("15 m", "unknown unit \" m\""),
            ("3w", "unknown unit \"w\""),
            ("0s", "longer than 0"),
            ("m5", "expected a number"),
            ("99999999999999999999s", "too large"),
            ("999999999999999d", "too long"),
        ] {
            let e = parse_duration(bad).unwrap_err();
            assert!(e.contains(why) && e.contains("e.g. 90s, 15m"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn bad_values_are_usage_errors() {
        for args in [
            &["durable", "runs", "list", "--status", "bogus"][..],
            &["durable", "runs", "list", "--limit", "many"],
            &["durable", "demo", "--runs", "0"],
            &["durable", "runs", "show"],
            &["durable", "runs", "export"],
            &["durable", "runs", "export", "x", "--out"],
            &["durable", "completions", "tcsh"],
            &["durable", "schedules", "show"],
            &["durable", "schedules", "trigger"],
            &["durable", "schedules", "list", "extra"],
            &["durable", "runs", "list", "--stale", "abc"],
            &["durable", "runs", "list", "--stale"],
            &["durable", "workers", "extra"],
            &["durable", "queues", "extra"],
            &["durable", "queues", "--kind", "bogus"],
            &["durable", "queues", "--kind"],
            &["durable", "queues", "--namespace"],
        ] {
            let e = Cli::try_parse_from(args).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{args:?}");
        }
    }
}
