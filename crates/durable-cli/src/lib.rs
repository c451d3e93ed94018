//! # durable-cli
//!
//! The `durable` command line: a demo worker, and the operator's view of the runs and the
//! schedules in a store.
//!
//! ```text
//! durable demo [--runs N]                       run example workflows with a live progress bar
//! durable runs list [--status S] [--workflow W] [--namespace N] [--stale D] [--limit N] [--json]
//! durable runs show <id> [--json]               a run, its timeline, children, waiters, remote steps, slots
//! durable runs export <id> [--out FILE]         a run's history as a versioned JSON document
//! durable runs retry <id>                       a failed or dead run goes back to pending
//! durable runs cancel <id> [--compensate]       cancel an active run (and its children)
//! durable runs delete <id> [--force]            delete a finished run and its subtree
//! durable signal <token> <json>                 send a signal
//! durable schedules list [--json]               the schedules: cadence, fires, next fire (in their zone)
//! durable schedules show <key> [--json]         a schedule, its last fire and its next 5 fire times
//! durable schedules pause <key>                 it fires nothing until resumed
//! durable schedules resume <key>                it fires again; the fires of the pause are skipped
//! durable schedules trigger <key>               fire it now: prints the run id it starts
//! durable schedules delete <key>                delete it (the runs it started are kept)
//! durable workers [--json]                      remote steps: queue depths, live workers
//! durable queues [--kind K] [--namespace N] [--json]  flow control: step queues and concurrency keys
//! durable serve [--addr A] [--token T | --dev] [--protect-reads] [--poll D]  the JSON API, /metrics, the dashboard
//! durable migrate                               migrate a database an older durable wrote
//! durable completions <shell>                   a shell completion script
//! ```
//!
//! Every command takes `--db PATH` (default `./durable.db`, or `$DURABLE_DB`), or `--url
//! postgres://user@host/database` (or `$DURABLE_URL`) with `--schema NAME` (default `durable`,
//! or `$DURABLE_SCHEMA`) for runs kept in PostgreSQL.
//!
//! ## What it does not do
//!
//! Operator commands (`runs`, `signal`, `schedules`, `workers`, `queues`) never execute workflow code. Workflows are code, and
//! workers are your own binaries that embed it: an [`Engine`](durable::Engine) with the
//! workflows registered. `runs retry` sets a run back to `pending`, `signal` records a payload
//! and wakes the run; a worker with the run's workflow registered then continues it (for the
//! demo's runs, `durable demo` is that worker). `schedules` commands change the stored
//! schedule; a fire's run is started by the scheduler of a worker with the schedule's workflow
//! registered. Operator commands open an existing database
//! only: a missing, empty or foreign file is refused ("… is not a durable database") and
//! nothing is created; so is a database an older durable wrote, which they do not migrate
//! (its older workers would refuse it then): `durable migrate` does, on purpose.
//!
//! ## Exit codes
//!
//! `0` success; `2` the command was wrong: a usage error, an unknown run id or schedule key,
//! malformed JSON, a
//! run in the wrong state, or a `--db` / `--url` that cannot be opened as given (a missing
//! directory, a file that is not a durable database, a newer schema or an older one (`durable
//! migrate`), a malformed URL, an unknown database); `1` it failed while running (the store is busy or unreachable, an I/O
//! error: trying again later may help); `130` interrupted. Errors are one line on stderr.
//! `durable --help` ends with the same list.
//!
//! ## As a library
//!
//! The binary is [`main`]; [`Cli`] is its grammar and [`run`] executes a parsed command, so the
//! commands can be embedded in another binary. [`register_demo_workflows`] registers the
//! demo's workflows on an engine of your own.
//!
//! ```no_run
//! use clap::Parser;
//!
//! # async fn example() -> Result<(), durable_cli::Error> {
//! let cli = durable_cli::Cli::parse_from(["durable", "--db", "app.db", "runs", "list", "--status", "failed"]);
//! durable_cli::run(cli).await?;
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod admission;
mod buffered;
mod cli;
mod demo;
mod error;
mod format;
mod queues;
mod runs;
mod schedules;
mod serve;
mod store;
mod workers;
mod workflows;

#[cfg(test)]
mod flow_tests;

use std::io::{BufWriter, Write};
use std::process::ExitCode;
use std::time::Duration;

use clap::CommandFactory;

pub use cli::{
    BufferKindArg, CancelArgs, Cli, Command, CompletionsArgs, DeleteArgs, DemoArgs, ExportArgs, GateKind, ListArgs,
    QueuesArgs, RunIdArgs, RunsCommand, ScheduleKeyArgs, ScheduleListArgs, ScheduleShowArgs, SchedulesCommand,
    ServeArgs, ShowArgs, SignalArgs, SignalsCommand, SignalsListArgs, SignalsPurgeArgs, StoreArgs, WorkersArgs,
};
pub use error::{Error, Result};
pub use workflows::register_demo_workflows;

/// Executes a parsed command, writing its output to stdout (and the demo's progress to
/// stderr). Must be called inside a tokio runtime (the binary uses a multi-threaded one).
pub async fn run(cli: Cli) -> Result<()> {
    let mut out = BufWriter::new(std::io::stdout());
    let result = match &cli.command {
        Command::Demo(args) => demo::demo(&cli.store, args, &mut out).await,
        Command::Runs(RunsCommand::List(args)) => runs::list(&cli.store, args, &mut out).await,
        Command::Runs(RunsCommand::Show(args)) => runs::show(&cli.store, args, &mut out).await,
        Command::Runs(RunsCommand::Export(args)) => runs::export(&cli.store, args, &mut out).await,
        Command::Runs(RunsCommand::Retry(args)) => runs::retry(&cli.store, args, &mut out).await,
        Command::Runs(RunsCommand::Cancel(args)) => runs::cancel(&cli.store, args, &mut out).await,
        Command::Runs(RunsCommand::Delete(args)) => runs::delete(&cli.store, args, &mut out).await,
        Command::Schedules(SchedulesCommand::List(args)) => schedules::list(&cli.store, args, &mut out).await,
        Command::Schedules(SchedulesCommand::Show(args)) => schedules::show(&cli.store, args, &mut out).await,
        Command::Schedules(SchedulesCommand::Pause(args)) => schedules::pause(&cli.store, args, &mut out).await,
        Command::Schedules(SchedulesCommand::Resume(args)) => schedules::resume(&cli.store, args, &mut out).await,
        Command::Schedules(SchedulesCommand::Trigger(args)) => schedules::trigger(&cli.store, args, &mut out).await,
        Command::Schedules(SchedulesCommand::Delete(args)) => schedules::delete(&cli.store, args, &mut out).await,
        Command::Signal(args) => runs::signal(&cli.store, args, &mut out).await,
        Command::Signals(SignalsCommand::List(args)) => buffered::list(&cli.store, args, &mut out).await,
        Command::Signals(SignalsCommand::Purge(args)) => buffered::purge(&cli.store, args, &mut out).await,
        Command::Workers(args) => workers::workers(&cli.store, args, &mut out).await,
        Command::Queues(args) => queues::queues(&cli.store, args, &mut out).await,
        Command::Serve(args) => serve::serve(&cli.store, args, &mut out).await,
        Command::Migrate => store::migrate(&cli.store, &mut out).await,
        Command::Completions(args) => {
            clap_complete::generate(args.shell, &mut Cli::command(), "durable", &mut out);
            Ok(())
        }
    };
    let flushed = out.flush();
    result?;
    flushed?;
    Ok(())
}

/// The `durable` binary: parses the arguments, runs the command, and turns the outcome into an
/// exit code with a one-line message on stderr (see the [crate docs](crate) for the codes).
pub fn main() -> ExitCode {
    quiet_panics();
    let cli = match Cli::try_parse_args(std::env::args_os()) {
        Ok(cli) => cli,
        Err(e) => return usage_error(&e),
    };
    init_tracing();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => return report(&Error::failed(format!("could not start the async runtime: {e}"))),
    };
    let result = runtime.block_on(run(cli));
    runtime.shutdown_timeout(Duration::from_secs(1));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => report(&e),
    }
}

/// Prints the error (unless the output was closed under us, e.g. `| head`) and picks the code.
fn report(e: &Error) -> ExitCode {
    match e {
        // The demo already said what happened.
        Error::Interrupted => {}
        Error::Output(io) if io.kind() == std::io::ErrorKind::BrokenPipe => return ExitCode::SUCCESS,
        _ => {
            let _ = writeln!(std::io::stderr().lock(), "error: {}", e.one_line());
        }
    }
    ExitCode::from(e.exit_code())
}

/// Help and version go to stdout with code 0; usage errors are one line with code 2.
fn usage_error(e: &clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            let _ = e.print();
            ExitCode::SUCCESS
        }
        ErrorKind::MissingSubcommand => {
            let _ = writeln!(std::io::stderr().lock(), "{}", missing_subcommand(e));
            ExitCode::from(2)
        }
        _ => {
            // clap's message, without the usage block, on one line; and without its tip to
            // pass an unknown flag as a value after `--` (`runs cancel <id> -- --force`): no
            // command here takes such a value, so the tip only leads to another error.
            let rendered = e.render().to_string();
            let parts: Vec<&str> = rendered
                .lines()
                .map(str::trim)
                .take_while(|l| !l.starts_with("Usage:") && !l.starts_with("For more information"))
                .filter(|l| !l.is_empty() && !l.starts_with("tip: to pass '"))
                .collect();
            let text = parts.join(" ");
            let line = if text.starts_with("error:") { text } else { format!("error: {text}") };
            let _ = writeln!(std::io::stderr().lock(), "{line} (see --help)");
            ExitCode::from(2)
        }
    }
}

/// `durable runs` without its subcommand: one line that names the subcommands, and where the
/// help is. (clap's own message for it is several lines with the usage.)
fn missing_subcommand(e: &clap::Error) -> String {
    use clap::error::{ContextKind, ContextValue};
    let name = match e.get(ContextKind::InvalidSubcommand) {
        Some(ContextValue::String(name)) => name.clone(),
        _ => "durable".to_string(),
    };
    // The command's own subcommands, by name: clap's list in the error has their aliases too.
    let mut cmd = Cli::command();
    for word in name.split(' ').skip(1) {
        match cmd.find_subcommand(word) {
            Some(sub) => cmd = sub.clone(),
            None => break,
        }
    }
    let subcommands: Vec<&str> =
        cmd.get_subcommands().filter(|s| !s.is_hide_set() && s.get_name() != "help").map(|s| s.get_name()).collect();
    let what = if name.contains(' ') { "subcommand" } else { "command" };
    format!("error: '{name}' needs a {what}: {} (see '{name} --help')", subcommands.join(", "))
}

/// A panic (a bug) prints one line instead of a backtrace.
fn quiet_panics() {
    std::panic::set_hook(Box::new(|info| {
        let msg = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "panic".into());
        let at = info.location().map(|l| format!(" at {}:{}", l.file(), l.line())).unwrap_or_default();
        let msg = msg.split_whitespace().collect::<Vec<_>>().join(" ");
        let _ =
            writeln!(std::io::stderr().lock(), "error: internal error (a bug in durable, please report it): {msg}{at}");
    }));
}

/// Engine diagnostics on stderr: errors only, unless `RUST_LOG` asks for more.
fn init_tracing() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("error"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
}
