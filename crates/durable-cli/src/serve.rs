//! `durable serve`: the JSON API, metrics and dashboard of `durable-serve` over the store of
//! the flags, until Ctrl-C or SIGTERM.

use std::io::Write;
use std::time::Duration;

use durable_serve::{ServeConfig, check_listen};

use crate::cli::{ServeArgs, StoreArgs};
use crate::error::{Error, Result};
use crate::store::{Access, with_operator_engine};

/// The shortest `--poll`: each open event stream reads the store this often.
const MIN_POLL: Duration = Duration::from_millis(50);

/// `durable serve`.
pub(crate) async fn serve(store: &StoreArgs, args: &ServeArgs, out: &mut dyn Write) -> Result<()> {
    check_listen(args.addr, args.token.as_deref(), args.dev).map_err(Error::bad)?;
    if args.poll < MIN_POLL {
        return Err(Error::bad(format!(
            "--poll {} ms is too short; pass at least {} ms",
            args.poll.as_millis(),
            MIN_POLL.as_millis()
        )));
    }
    let where_ = store.describe();
    let opened = store.open_with_events(Access::Existing).await?;
    let listener = tokio::net::TcpListener::bind(args.addr)
        .await
        .map_err(|e| Error::bad(format!("cannot listen on {}: {e}; pick another --addr", args.addr)))?;
    let addr = listener.local_addr().map_err(|e| Error::failed(format!("cannot read the listening address: {e}")))?;
    let config = ServeConfig {
        token: args.token.clone(),
        protect_reads: args.protect_reads,
        poll: args.poll,
        metrics: Some(durable_serve::install_recorder()),
    };
    with_operator_engine(opened, |engine| async move {
        let router = durable_serve::router(engine, config);
        let mode = if args.token.is_none() { " (development server: no token needed)" } else { "" };
        writeln!(out, "serving {where_} on http://{addr}/{mode}")?;
        out.flush()?;
        durable_serve::serve(listener, router, durable::shutdown_signal())
            .await
            .map_err(|e| Error::failed(format!("the server stopped: {e}")))?;
        writeln!(out, "stopped")?;
        Ok(())
    })
    .await
}
