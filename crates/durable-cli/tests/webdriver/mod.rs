//! A small WebDriver client for the browser tests: Debian's `chromedriver` driving headless
//! Chromium over the W3C WebDriver protocol (JSON over HTTP/1.1 on loopback).
//!
//! Hand-written on `std::net::TcpStream` rather than a client crate: the protocol needs a dozen
//! JSON requests, one connection per request (`Connection: close`) is plenty for a test, and so
//! the tests add no dependency to the build (a crate such as `fantoccini` brings an HTTP client
//! stack with it).
//!
//! Waiting for the page is event driven: [`Browser::wait_for`] runs an asynchronous script that
//! re-checks a JavaScript condition whenever the DOM changes (a `MutationObserver`) and answers
//! as soon as it holds, or when its deadline passes.
#![allow(dead_code, unreachable_pub)]

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// The W3C name of an element reference in a JSON answer.
const ELEMENT_KEY: &str = "element-6066-11e4-a52e-4f735466cecf";

/// The `chromedriver` to use: `DURABLE_CHROMIUM` (a path to `chromedriver`), else `chromedriver`
/// on the `PATH`; `None` (the test prints why it is skipped) when there is neither.
pub fn find_driver() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("DURABLE_CHROMIUM").filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        assert!(
            path.is_file(),
            "DURABLE_CHROMIUM={} is not a file: set it to the chromedriver binary (Debian: /usr/bin/chromedriver \
             from the chromium-driver package), or unset it to look chromedriver up on the PATH",
            path.display()
        );
        return Some(path);
    }
    std::env::var_os("PATH")?.to_str()?.split(':').map(|dir| Path::new(dir).join("chromedriver")).find(|p| p.is_file())
}

/// One request to the driver: the answer's `value`, or the driver's error.
fn request(port: u16, method: &str, path: &str, body: Option<&Value>) -> Result<Value, WebDriverError> {
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let mut stream = TcpStream::connect(("127.0.0.1", port))
        .unwrap_or_else(|e| panic!("connect to chromedriver on 127.0.0.1:{port}: {e}"));
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\
         Content-Type: application/json; charset=utf-8\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap_or_else(|e| panic!("send {method} {path} to chromedriver: {e}"));
    let (status, body) = read_response(BufReader::new(stream))
        .unwrap_or_else(|e| panic!("{method} {path}: no valid HTTP answer from chromedriver: {e}"));
    let json: Value = serde_json::from_slice(&body).unwrap_or_else(|e| {
        panic!("{method} {path}: the answer is not JSON ({e}): {}", String::from_utf8_lossy(&body))
    });
    let value = json.get("value").cloned().unwrap_or(Value::Null);
    if status == 200 {
        Ok(value)
    } else {
        Err(WebDriverError {
            error: value["error"].as_str().unwrap_or("unknown error").to_string(),
            message: value["message"].as_str().unwrap_or("").lines().next().unwrap_or("").to_string(),
        })
    }
}

/// The status code and the body of an HTTP/1.1 answer (chromedriver keeps the connection open
/// despite `Connection: close`, so the body is read by its length).
fn read_response(mut reader: impl BufRead) -> std::io::Result<(u16, Vec<u8>)> {
    let bad = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string());
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let status = line.split(' ').nth(1).and_then(|s| s.parse().ok()).ok_or_else(|| bad(&line))?;
    let (mut length, mut chunked) = (None, false);
    loop {
        line.clear();
        reader.read_line(&mut line)?;
        let header = line.trim_end();
        if header.is_empty() {
            break;
        }
        let (name, value) = header.split_once(':').ok_or_else(|| bad(header))?;
        match name.trim().to_ascii_lowercase().as_str() {
            "content-length" => length = Some(value.trim().parse::<usize>().map_err(|_| bad(header))?),
            "transfer-encoding" => chunked = value.contains("chunked"),
            _ => {}
        }
    }
    let mut body = Vec::new();
    if chunked {
        loop {
            line.clear();
            reader.read_line(&mut line)?;
            let size = usize::from_str_radix(line.trim(), 16).map_err(|_| bad(&line))?;
            let mut chunk = vec![0; size + 2];
            reader.read_exact(&mut chunk)?;
            if size == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..size]);
        }
    } else if let Some(length) = length {
        body.resize(length, 0);
        reader.read_exact(&mut body)?;
    } else {
        reader.read_to_end(&mut body)?;
    }
    Ok((status, body))
}

/// An error answer of the driver.
#[derive(Debug)]
pub struct WebDriverError {
    /// The W3C error code (`no such element`, `javascript error`, …).
    pub error: String,
    /// The first line of the driver's message.
    pub message: String,
}

/// A headless Chromium session, driven through its own `chromedriver` process; both end when it
/// is dropped.
#[derive(Debug)]
pub struct Browser {
    driver: Child,
    port: u16,
    session: String,
    _profile: tempfile::TempDir,
}

/// An element found on the page.
#[derive(Debug, Clone)]
pub struct Element(String);

impl Browser {
    /// Starts `driver` on a free port and a headless Chromium session with a window of
    /// `width` × `height` CSS pixels.
    pub fn start(driver: &Path, width: u32, height: u32) -> Browser {
        let mut child = Command::new(driver)
            .arg("--port=0")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", driver.display()));
        // "ChromeDriver was started successfully on port 41234."
        let mut lines = BufReader::new(child.stdout.take().expect("piped stdout")).lines();
        let port = loop {
            let line = match lines.next() {
                Some(Ok(line)) => line,
                _ => {
                    let _ = child.kill();
                    panic!("{} exited before it said which port it listens on", driver.display());
                }
            };
            if let Some(rest) = line.split("started successfully on port ").nth(1) {
                break rest.trim_end_matches('.').trim().parse::<u16>().expect("a port number");
            }
        };
        // Keep reading (and dropping) its output so it never blocks on a full pipe.
        std::thread::spawn(move || lines.for_each(drop));
        let profile = tempfile::tempdir().expect("a profile dir");
        // No sandbox: CI runs as root, where Chromium's sandbox refuses to start.
        let args = [
            "--headless=new".to_string(),
            "--no-sandbox".to_string(),
            "--disable-gpu".to_string(),
            "--disable-dev-shm-usage".to_string(),
            "--disable-extensions".to_string(),
            "--no-first-run".to_string(),
            format!("--window-size={width},{height}"),
            format!("--user-data-dir={}", profile.path().display()),
        ];
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "pageLoadStrategy": "normal",
            "goog:chromeOptions": {"args": args},
        }}});
        let mut browser = Browser { driver: child, port, session: String::new(), _profile: profile };
        let answer = request(port, "POST", "/session", Some(&caps))
            .unwrap_or_else(|e| panic!("start a Chromium session through {}: {e:?}", driver.display()));
        browser.session = answer["sessionId"].as_str().expect("a session id").to_string();
        browser.call("POST", "/timeouts", json!({"script": 120_000, "pageLoad": 60_000})).expect("set the timeouts");
        browser.set_window_size(width, height);
        browser
    }

    fn call(&self, method: &str, path: &str, body: Value) -> Result<Value, WebDriverError> {
        let path = format!("/session/{}{path}", self.session);
        request(self.port, method, &path, if method == "GET" { None } else { Some(&body) })
    }

    fn must(&self, method: &str, path: &str, body: Value) -> Value {
        self.call(method, path, body).unwrap_or_else(|e| panic!("WebDriver {method} {path}: {e:?}"))
    }

    /// Loads `url` and waits until the page's `load` event.
    pub fn goto(&self, url: &str) {
        self.must("POST", "/url", json!({ "url": url }));
    }

    /// Sets the window's outer size.
    pub fn set_window_size(&self, width: u32, height: u32) {
        self.must("POST", "/window/rect", json!({"width": width, "height": height}));
    }

    /// The first element matching the CSS selector, if any.
    pub fn find(&self, css: &str) -> Option<Element> {
        match self.call("POST", "/element", json!({"using": "css selector", "value": css})) {
            Ok(v) => Some(Element(v[ELEMENT_KEY].as_str().expect("an element reference").to_string())),
            Err(e) if e.error == "no such element" => None,
            Err(e) => panic!("find {css:?}: {e:?}"),
        }
    }

    /// The first element matching the CSS selector; panics when there is none.
    pub fn element(&self, css: &str) -> Element {
        self.find(css).unwrap_or_else(|| panic!("no element {css:?} on the page; it shows:\n{}", self.page_text()))
    }

    /// Clicks an element as a user would (scrolled into view; fails if something covers it).
    pub fn click(&self, element: &Element) {
        self.must("POST", &format!("/element/{}/click", element.0), json!({}));
    }

    /// Clicks the first element matching the CSS selector (found again if the page replaced it
    /// between finding and clicking).
    pub fn click_on(&self, css: &str) {
        for _ in 0..5 {
            let element = self.element(css);
            match self.call("POST", &format!("/element/{}/click", element.0), json!({})) {
                Ok(_) => return,
                Err(e) if e.error == "stale element reference" => continue,
                Err(e) => panic!("click {css:?}: {e:?}"),
            }
        }
        panic!("click {css:?}: the page replaced the element five times in a row");
    }

    /// Types `text` into an input.
    pub fn type_into(&self, css: &str, text: &str) {
        let element = self.element(css);
        self.must("POST", &format!("/element/{}/clear", element.0), json!({}));
        self.must("POST", &format!("/element/{}/value", element.0), json!({ "text": text }));
    }

    /// An element's rendered text.
    pub fn text(&self, element: &Element) -> String {
        self.must("GET", &format!("/element/{}/text", element.0), Value::Null).as_str().unwrap_or("").to_string()
    }

    /// Runs `script` (a function body: `return …`) in the page with `args`; its return value.
    pub fn exec(&self, script: &str, args: Value) -> Value {
        self.must("POST", "/execute/sync", json!({"script": script, "args": args}))
    }

    /// The page's visible text (for failure messages).
    pub fn page_text(&self) -> String {
        self.exec("return document.body ? document.body.innerText : ''", json!([])).as_str().unwrap_or("").to_string()
    }

    /// Waits until the JavaScript expression `condition` is truthy and returns its value. It is
    /// evaluated at once and again after every change of the DOM; after `timeout` the test fails
    /// with `what`, the page's text and a screenshot.
    pub fn wait_for(&self, what: &str, condition: &str, timeout: Duration) -> Value {
        let script = format!(
            r#"const done = arguments[arguments.length - 1];
            const check = () => {{ try {{ return ({condition}); }} catch (e) {{ return null; }} }};
            const first = check();
            if (first) return done({{ok: first}});
            const timer = setTimeout(() => {{ observer.disconnect(); done({{timeout: true}}); }}, {ms});
            const observer = new MutationObserver(() => {{
                const v = check();
                if (v) {{ observer.disconnect(); clearTimeout(timer); done({{ok: v}}); }}
            }});
            observer.observe(document.documentElement, {{subtree: true, childList: true, attributes: true, characterData: true}});"#,
            ms = timeout.as_millis()
        );
        let deadline = Instant::now() + timeout;
        loop {
            match self.call("POST", "/execute/async", json!({"script": script, "args": []})) {
                Ok(v) if v.get("ok").is_some() => return v["ok"].clone(),
                Ok(_) => break,
                // The page navigated while the script waited: check again on the new page.
                Err(e) if Instant::now() < deadline && e.message.contains("unloaded") => continue,
                Err(e) => panic!("waiting for {what}: {e:?}"),
            }
        }
        let shot = self.screenshot(&format!("timeout-{}", what.replace(|c: char| !c.is_ascii_alphanumeric(), "-")));
        panic!(
            "timed out after {timeout:?} waiting for {what} (`{condition}`); screenshot: {}\nthe page shows:\n{}",
            shot.display(),
            self.page_text()
        );
    }

    /// Saves a PNG of the window as `<target>/browser-screenshots/<name>.png`, prints and returns
    /// its path.
    pub fn screenshot(&self, name: &str) -> PathBuf {
        let b64 = self.must("GET", "/screenshot", Value::Null);
        let png = base64_decode(b64.as_str().expect("base64 text"));
        let dir = screenshot_dir();
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        let path = dir.join(format!("{name}.png"));
        std::fs::write(&path, png).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        println!("screenshot: {}", path.display());
        path
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = request(self.port, "DELETE", &format!("/session/{}", self.session), None);
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// `browser-screenshots` in the target directory: `CARGO_TARGET_DIR`, else the directory above
/// the test binary's `debug/deps`.
pub fn screenshot_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| {
        let exe = std::env::current_exe().expect("the test binary's path");
        // <target>/<profile>/deps/<test binary>
        exe.ancestors().nth(3).expect("a target dir above the test binary").to_path_buf()
    });
    target.join("browser-screenshots")
}

fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => u32::from(c - b'A'),
            b'a'..=b'z' => u32::from(c - b'a') + 26,
            b'0'..=b'9' => u32::from(c - b'0') + 52,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: {c:?}"),
        }
    };
    let clean: Vec<u8> = text.bytes().filter(|c| !c.is_ascii_whitespace() && *c != b'=').collect();
    let mut out = Vec::with_capacity(clean.len() * 3 / 4);
    for chunk in clean.chunks(4) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, &c)| n | (value(c) << (18 - 6 * i)));
        out.extend_from_slice(&n.to_be_bytes()[1..chunk.len()]);
    }
    out
}

#[test]
fn base64_decodes_every_padding() {
    assert_eq!(base64_decode("TWFu"), b"Man");
    assert_eq!(base64_decode("TWE="), b"Ma");
    assert_eq!(base64_decode("TQ=="), b"M");
    assert_eq!(base64_decode(""), b"");
}
