//! `durable serve` as a real process on a real TCP port: it refuses to start without a token
//! unless `--dev`, `--dev` refuses a non-loopback address, it prints the URL it listens on,
//! answers reads, refuses an action without the token (401) and takes it with the token, and
//! stops on SIGTERM.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::Stdio;

use support::{default_db, durable, path_str, run_bad, run_ok};

/// One HTTP/1.1 request on a fresh connection; the status and the body.
fn http(addr: &str, method: &str, path: &str, token: Option<&str>, body: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).expect("connect to the server");
    let auth = token.map_or_else(String::new, |t| format!("authorization: Bearer {t}\r\n"));
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n{auth}content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    let status = text.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    (status, body)
}

#[test]
fn serve_needs_a_token_unless_dev_and_dev_is_loopback_only() {
    let dir = tempfile::tempdir().unwrap();
    let db = default_db(dir.path());
    let dbs = path_str(&db);
    run_ok(dir.path(), &["demo", "--runs", "5", "--db", dbs]);
    run_bad(dir.path(), &["serve", "--db", dbs, "--addr", "127.0.0.1:0"], "no token");
    run_bad(
        dir.path(),
        &["serve", "--db", dbs, "--dev", "--addr", "0.0.0.0:0"],
        "--dev listens on a loopback address only",
    );
    run_bad(dir.path(), &["serve", "--db", dbs, "--token", " ", "--addr", "127.0.0.1:0"], "the token is empty");
    run_bad(
        dir.path(),
        &["serve", "--db", dbs, "--dev", "--addr", "localhost:0"],
        "\"localhost\" is not an IP address: listen on one, as 127.0.0.1:0",
    );
}

#[test]
fn serve_answers_reads_and_guards_actions_with_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let db = default_db(dir.path());
    let dbs = path_str(&db);
    run_ok(dir.path(), &["demo", "--runs", "5", "--db", dbs]);
    let mut child = durable(dir.path())
        .args(["serve", "--db", dbs, "--addr", "127.0.0.1:0"])
        .env("DURABLE_TOKEN", "s3cret")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    let url = line.split_whitespace().find(|w| w.starts_with("http://")).unwrap_or_else(|| panic!("{line}"));
    let addr = url.trim_start_matches("http://").trim_end_matches('/').to_string();

    let (status, body) = http(&addr, "GET", "/api/runs?status=failed", None, "");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("demo-saga-3"), "{body}");
    let (status, body) = http(&addr, "POST", "/api/runs/demo-order-0/cancel", None, "{}");
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("\"unauthorized\""), "{body}");
    let (status, body) = http(&addr, "DELETE", "/api/runs/demo-order-0", Some("s3cret"), "");
    assert_eq!(status, 200, "{body}");
    assert_eq!(body.trim(), "{\"deleted\":1}");
    let (status, _) = http(&addr, "GET", "/api/runs/demo-order-0", None, "");
    assert_eq!(status, 404);

    // SIGTERM: a graceful stop, exit 0.
    let killed = std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(killed.success());
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0));
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).unwrap();
    assert!(rest.contains("stopped"), "{rest}");
}
