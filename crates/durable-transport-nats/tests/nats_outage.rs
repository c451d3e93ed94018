//! A server that goes away and comes back, played by a TCP proxy between the client and the
//! real server (DURABLE_NATS_URL; skipped without it).

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_nats::connection::State;
use common::*;
use durable_core::{ControlMessage, ControlPlane, RunId};
use durable_transport::Transport;
use durable_transport_nats::test_support::{unique_prefix, url_or_skip};
use durable_transport_nats::{NatsControlPlane, NatsTransport};
use parking_lot::Mutex;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Records the message of every `tracing` event at INFO or above (the crate's reports).
#[derive(Default)]
struct Logs {
    lines: Mutex<Vec<String>>,
    changed: tokio::sync::Notify,
}

impl Logs {
    fn contains(&self, needle: &str) -> bool {
        self.lines.lock().iter().any(|l| l.contains(needle))
    }

    fn count(&self, needle: &str) -> usize {
        self.lines.lock().iter().filter(|l| l.contains(needle)).count()
    }

    async fn wait_for(&self, needle: &str) {
        wait_for(&format!("a log line with {needle:?}"), &self.changed, || self.contains(needle)).await;
    }
}

struct Capture(Arc<Logs>);

struct Message<'a>(&'a mut String);

impl tracing::field::Visit for Message<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        use std::fmt::Write;
        let _ = write!(self.0, " {}={:?}", field.name(), value);
    }
}

impl tracing::Subscriber for Capture {
    fn enabled(&self, metadata: &tracing::Metadata<'_>) -> bool {
        *metadata.level() <= tracing::Level::INFO && metadata.target().starts_with("durable_transport_nats")
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut line = event.metadata().level().to_string();
        event.record(&mut Message(&mut line));
        self.0.lines.lock().push(line);
        self.0.changed.notify_waiters();
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// Forwards connections to the server while up; cut, it closes them all and every new one.
struct Proxy {
    addr: SocketAddr,
    up: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    async fn start(server: String) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the proxy");
        let addr = listener.local_addr().expect("proxy address");
        let (up, _) = watch::channel(true);
        let up_rx = up.subscribe();
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else { continue };
                if !*up_rx.borrow() {
                    drop(client); // refused while down
                    continue;
                }
                let (server, mut up_rx) = (server.clone(), up_rx.clone());
                tokio::spawn(async move {
                    let Ok(upstream) = TcpStream::connect(&server).await else { return };
                    let (mut client, mut upstream) = (client, upstream);
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut upstream) => {}
                        _ = up_rx.wait_for(|up| !*up) => {} // cut: both sockets dropped
                    }
                });
            }
        });
        Proxy { addr, up, task }
    }

    fn url(&self) -> String {
        format!("nats://{}", self.addr)
    }

    fn set(&self, up: bool) {
        self.up.send_replace(up);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// `host:port` of a `nats://host:port` URL.
fn host_port(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
    rest.split(',').next().unwrap_or(rest).trim_end_matches('/').to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_and_a_plane_resume_by_themselves_after_an_outage() {
    let Some(url) = url_or_skip("a_consumer_and_a_plane_resume_by_themselves_after_an_outage") else { return };
    // The only test of this binary: its reports go to `logs`.
    let logs = Arc::new(Logs::default());
    tracing::subscriber::set_global_default(Capture(logs.clone())).expect("the only subscriber");
    let proxy = Proxy::start(host_port(&url)).await;
    let prefix = unique_prefix("outage");
    let behind = NatsTransport::connect(&proxy.url(), &prefix).await.expect("connect through the proxy");
    let behind = behind.poll_interval(Duration::from_millis(200));
    let direct = NatsTransport::connect(&url, &prefix).await.expect("connect directly");
    let plane = NatsControlPlane::from_client(behind.client().clone(), &prefix).await.expect("plane");
    let direct_plane = NatsControlPlane::connect(&url, &prefix).await.expect("direct plane");
    let heard = Arc::new((Mutex::new(Vec::<ControlMessage>::new()), tokio::sync::Notify::new()));
    let sink = {
        let heard = heard.clone();
        Arc::new(move |m| {
            heard.0.lock().push(m);
            heard.1.notify_waiters();
        })
    };
    plane.subscribe(sink).await.expect("subscribe");

    let r = Recorder::new();
    let consumer = behind.consume_runs(None, 2, r.clone());
    direct.dispatch_runs(None, vec![item("before")]).await.expect("dispatch");
    r.wait_count(1).await;

    proxy.set(false);
    let client = behind.client().clone();
    poll_until("the client to see the outage", || {
        let down = client.connection_state() == State::Disconnected;
        async move { down }
    })
    .await;
    // Sending through the cut connection fails at once.
    assert!(behind.dispatch_runs(None, vec![item("lost")]).await.is_err());
    assert!(plane.publish(ControlMessage::Cancel { origin: "x".into(), run_id: RunId::from("r") }).await.is_err());
    // Both report the outage (the first failure at once, then at most once a minute).
    logs.wait_for("the NATS run queue consumer is failing").await;
    logs.wait_for("lost the NATS connection of the control plane").await;
    // Sent by another instance meanwhile: waits in JetStream.
    direct.dispatch_runs(None, vec![item("during")]).await.expect("dispatch directly");

    proxy.set(true);
    r.wait_count(2).await;
    assert_eq!(r.runs(), ["before", "during"]);
    logs.wait_for("the NATS run queue consumer is fetching again").await;
    logs.wait_for("the control plane is connected to NATS again").await;
    assert_eq!(logs.count("the NATS run queue consumer is failing"), 1, "{:#?}", logs.lines.lock());
    // The plane's subscription is back too (control messages sent while it was away are lost:
    // send until one arrives).
    let ping = ControlMessage::Cancel { origin: "direct".into(), run_id: RunId::from("back") };
    poll_until("a control message through the restored connection", || {
        let (plane, ping, heard) = (&direct_plane, ping.clone(), heard.clone());
        async move {
            plane.publish(ping).await.expect("publish directly");
            tokio::time::sleep(Duration::from_millis(100)).await;
            !heard.0.lock().is_empty()
        }
    })
    .await;
    assert!(heard.0.lock().iter().all(|m| m.origin() == "direct"));
    // And sending through it works again.
    poll_until("a dispatch through the restored connection", || {
        let behind = behind.clone();
        async move { behind.dispatch_runs(None, vec![item("after")]).await.is_ok() }
    })
    .await;
    r.wait_count(3).await;
    consumer.stop().await;
    direct.delete().await.expect("delete");
}
