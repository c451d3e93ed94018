//! The dashboard of `durable serve` in a real browser (headless Chromium through Debian's
//! `chromedriver`): the runs list loads and filters, a run's page shows its timeline, and the
//! retry button retries a failed run, which the page then shows completing through the live
//! event stream, without a reload.
//!
//! Each test runs the real `durable serve` binary on a SQLite file and, in the test process, an
//! engine on the same file with the workflow registered (as a user's worker process would be):
//! it executes the runs, and the retried run after the dashboard's retry. The tests run when
//! `chromedriver` is on the PATH or `DURABLE_CHROMIUM` names it, and otherwise print one line
//! saying they were skipped. Screenshots go to `<target>/browser-screenshots/`.

mod support;
mod webdriver;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::Duration;

use durable::{Engine, RunId, RunStatus, SqliteStore, StartOptions, StepError, WorkflowCtx, WorkflowError};
use serde_json::json;
use support::{default_db, durable, path_str, show};
use tokio::sync::watch;
use webdriver::Browser;

/// How long the page may take to show something (generous: the CPU may be busy).
const PAGE: Duration = Duration::from_secs(60);

/// The `chromedriver` to use, or `None` after printing why the test is skipped.
fn driver(test: &str) -> Option<PathBuf> {
    let found = webdriver::find_driver();
    if found.is_none() {
        println!(
            "skipped {test}: no chromedriver on the PATH; install Debian's chromium and chromium-driver \
             (apt-get install chromium chromium-driver) or set DURABLE_CHROMIUM=/path/to/chromedriver"
        );
    }
    found
}

/// `durable serve` on the database file, as a child process killed on drop.
struct Server {
    child: Child,
    url: String,
}

impl Server {
    /// A development server (no token), or with `token` one whose actions need it.
    fn start(dir: &Path, db: &Path, token: Option<&str>) -> Server {
        let mut cmd = durable(dir);
        cmd.args(["serve", "--addr", "127.0.0.1:0", "--db", path_str(db)]);
        match token {
            Some(token) => cmd.args(["--token", token]),
            None => cmd.arg("--dev"),
        };
        let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn().expect("start durable serve");
        let mut lines = BufReader::new(child.stdout.take().expect("piped stdout")).lines();
        let url = loop {
            match lines.next() {
                Some(Ok(line)) => {
                    if let Some(at) = line.find("http://") {
                        break line[at..].split_whitespace().next().unwrap().trim_end_matches('/').to_string();
                    }
                }
                _ => panic!("durable serve exited before it printed its address: {:?}", child.wait()),
            }
        };
        std::thread::spawn(move || lines.for_each(drop));
        Server { child, url }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The outside system the test's workflow fetches from.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Source {
    /// `fetch` fails at once (fatally).
    Down,
    /// `fetch` waits until the source is up or down again.
    Held,
    /// `fetch` succeeds.
    Up,
}

/// The test's workflow, `import`: `prepare`, then `fetch`, which asks the source when the input
/// says `"source": true`, then `save`.
fn register(engine: &Engine, source: &watch::Receiver<Source>) {
    let source = source.clone();
    engine.register("import", 1, move |ctx: WorkflowCtx, input: serde_json::Value| {
        let source = source.clone();
        async move {
            ctx.step("prepare", |_| async { Ok(1) }).await?;
            let needs_source = input["source"].as_bool().unwrap_or(false);
            let rows: u32 = ctx
                .step("fetch", move |_| {
                    let mut source = source.clone();
                    async move {
                        if !needs_source {
                            return Ok(42);
                        }
                        loop {
                            match *source.borrow_and_update() {
                                Source::Down => return Err(StepError::fatal("the source is down")),
                                Source::Up => return Ok(42),
                                Source::Held => {}
                            }
                            source.changed().await.map_err(|_| StepError::fatal("the test ended"))?;
                        }
                    }
                })
                .await?;
            ctx.step("save", move |_| async move { Ok(rows) }).await?;
            Ok::<_, WorkflowError>(json!({ "rows": rows }))
        }
    });
}

/// `approval`: waits for the signal `approve:<run id>`; `resize`: one remote step on the
/// queue `images`, which no worker serves here.
fn register_waiting(engine: &Engine) {
    engine.register("approval", 1, |ctx: WorkflowCtx, _: serde_json::Value| async move {
        let ok: bool = ctx.wait_for_signal(&format!("approve:{}", ctx.run_id())).await?;
        Ok::<_, WorkflowError>(ok)
    });
    engine.register("resize", 1, |ctx: WorkflowCtx, width: u32| async move {
        let out: u32 = ctx.remote_step("resize", &width).queue("images").await?;
        Ok::<_, WorkflowError>(out)
    });
}

/// A tokio runtime and an engine on `db` with the workflow registered; the runtime's threads
/// execute runs while the test thread drives the browser.
struct Worker {
    rt: tokio::runtime::Runtime,
    engine: Engine,
    source: watch::Sender<Source>,
}

impl Worker {
    fn start(db: &Path) -> Worker {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let (source, rx) = watch::channel(Source::Down);
        let engine = rt.block_on(async {
            let engine = Engine::builder().store(SqliteStore::open(db).expect("open the database")).build().unwrap();
            register(&engine, &rx);
            register_waiting(&engine);
            engine
        });
        Worker { rt, engine, source }
    }

    /// Starts a run and waits for its end; its status.
    fn run(&self, id: &str, input: serde_json::Value, tags: &[&str]) -> RunStatus {
        self.rt.block_on(async {
            let opts = tags.iter().fold(StartOptions::id(id), |opts, t| opts.tag(*t));
            self.engine.start("import", &input, opts).await.unwrap();
            let run = tokio::time::timeout(PAGE, self.engine.wait_for_run(&RunId::from(id))).await.unwrap().unwrap();
            run.status()
        })
    }
}

impl Worker {
    /// Starts a run of `workflow` and waits until it is parked (suspended or blocked).
    fn park<I: serde::Serialize>(&self, workflow: &str, id: &str, input: I) {
        self.rt.block_on(async {
            self.engine.start(workflow, &input, StartOptions::id(id)).await.unwrap();
            let id = RunId::from(id);
            tokio::time::timeout(PAGE, self.engine.wait_until_suspended_or_terminal(&id)).await.unwrap().unwrap();
        })
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.rt.block_on(self.engine.shutdown());
    }
}

/// What each test starts from: a worker on a database file in a temp dir, and the driver. (The
/// tests drop the worker at their end, before the directory goes.)
struct Setup {
    worker: Worker,
    db: PathBuf,
    dir: tempfile::TempDir,
    driver: PathBuf,
}

/// The test's [`Setup`], or `None` (with one printed line) when there is no chromedriver.
fn setup(test: &str) -> Option<Setup> {
    let driver = driver(test)?;
    let dir = tempfile::tempdir().unwrap();
    let db = default_db(dir.path());
    Some(Setup { worker: Worker::start(&db), db, dir, driver })
}

/// A JavaScript expression: whether the page shows what its address names (and not still the
/// view it had before the last navigation).
const SHOWN: &str = "document.querySelector('#view').dataset.route === location.hash";

/// A JavaScript expression: the ids of the rows of the runs table, in order.
const ROW_IDS: &str = "[...document.querySelectorAll('#runs-table tr[data-run-id]')].map(r => r.dataset.runId)";

#[test]
fn the_runs_list_loads_and_filters_by_status() {
    let Some(Setup { worker, db, dir, driver }) = setup("the_runs_list_loads_and_filters_by_status") else { return };
    // A run id and a tag that are HTML: the page must show them as text.
    let html_id = "import/<img src=x onerror=\"window.__xss=1\">";
    assert_eq!(worker.run("import-a", json!({}), &["nightly"]), RunStatus::Completed);
    assert_eq!(
        worker.run(html_id, json!({"note": "<script>window.__xss=2</script>"}), &["<b>bold</b>"]),
        RunStatus::Completed
    );
    assert_eq!(worker.run("import-b", json!({"source": true}), &["nightly"]), RunStatus::Failed);
    assert_eq!(worker.run("import-c", json!({}), &[]), RunStatus::Completed);
    let server = Server::start(dir.path(), &db, None);
    let browser = Browser::start(&driver, 1280, 900);

    browser.goto(&format!("{}/#/runs", server.url));
    browser.wait_for("the four runs", &format!("{ROW_IDS}.length === 4"), PAGE);
    let ids = browser.exec(&format!("return {ROW_IDS}"), json!([]));
    assert_eq!(ids, json!(["import-c", "import-b", html_id, "import-a"]), "newest first");
    let statuses = browser.exec(
        "return [...document.querySelectorAll('#runs-table tr[data-run-id] td.status')].map(td => td.textContent)",
        json!([]),
    );
    assert_eq!(statuses, json!(["completed", "failed", "completed", "completed"]));
    // The HTML in the id and the tag is text, and none of it ran.
    let row = browser.exec(
        "const r = document.querySelector('#runs-table tr[data-run-id]:nth-child(3)'); \
         return [r.querySelector('td.id a').textContent, r.querySelector('td.tags').textContent, \
                 document.querySelectorAll('#runs-table img, #runs-table b').length, window.__xss === undefined]",
        json!([]),
    );
    assert_eq!(row, json!([html_id, "<b>bold</b>", 0, true]));
    assert!(browser.find("#error:not([hidden])").is_none(), "no error banner: {}", browser.page_text());

    // A run started while the page is open appears at the top, without a reload.
    browser.exec("window.__before_new_run = 'still here'", json!([]));
    assert_eq!(worker.run("import-d", json!({}), &[]), RunStatus::Completed);
    browser.wait_for(
        "the new run at the top",
        &format!("{ROW_IDS}[0] === 'import-d' && document.querySelector('#runs-table tr[data-run-id=\"import-d\"] td.status').textContent === 'completed'"),
        PAGE,
    );
    assert_eq!(browser.exec(&format!("return {ROW_IDS}.length"), json!([])), json!(5));
    assert_eq!(
        browser.exec("return window.__before_new_run", json!([])),
        json!("still here"),
        "the page was not reloaded"
    );
    browser.screenshot("runs-list");

    // The status filter narrows the rows to the failed run, and says so in the address.
    browser.click_on("#filter-status option[value=\"failed\"]");
    browser.click_on("#apply-filters");
    browser.wait_for("only the failed run", &format!("JSON.stringify({ROW_IDS}) === '[\"import-b\"]'"), PAGE);
    let statuses = browser.exec(
        "return [...document.querySelectorAll('#runs-table tr[data-run-id] td.status')].map(td => td.textContent)",
        json!([]),
    );
    assert_eq!(statuses, json!(["failed"]));
    assert_eq!(browser.exec("return location.hash", json!([])), json!("#/runs?status=failed"));
    // Filters combine: a tag and a status that no run has together.
    browser.click_on("#filter-status option[value=\"completed\"]");
    browser.type_into("#filter-tag", "nightly");
    browser.click_on("#apply-filters");
    browser.wait_for("the completed nightly run", &format!("JSON.stringify({ROW_IDS}) === '[\"import-a\"]'"), PAGE);
    browser.screenshot("runs-list-filtered");

    // Pages of two: "next page" walks through every run once, newest first.
    browser.goto(&format!("{}/#/runs?limit=2", server.url));
    let mut seen = Vec::new();
    loop {
        let page = browser.wait_for(
            "a page of runs",
            &format!(
                "{SHOWN} && {ROW_IDS}.length > 0 && !{ROW_IDS}.some(id => {}.includes(id)) && {ROW_IDS}",
                json!(seen)
            ),
            PAGE,
        );
        let page: Vec<String> = serde_json::from_value(page).unwrap();
        assert!(page.len() <= 2, "{page:?}");
        seen.extend(page);
        if browser.find("#next-page").is_none() {
            break;
        }
        browser.click_on("#next-page");
    }
    assert_eq!(seen, ["import-d", "import-c", "import-b", html_id, "import-a"]);

    // On a narrow screen the list still fits the width (rows become cards, no sideways scroll).
    browser.goto(&format!("{}/#/runs", server.url));
    browser.wait_for("the five runs again", &format!("{SHOWN} && {ROW_IDS}.length === 5"), PAGE);
    browser.set_window_size(400, 900);
    browser.wait_for(
        "the list to fit 400 px",
        "window.innerWidth <= 400 && document.documentElement.scrollWidth <= window.innerWidth",
        PAGE,
    );
    browser.screenshot("runs-list-narrow");

    // A run deleted while the page is open leaves the list, without a reload.
    browser.exec("fetch('/api/runs/import-c', { method: 'DELETE' }); return true", json!([]));
    browser.wait_for(
        "the deleted run to leave the list",
        &format!("{ROW_IDS}.length === 4 && !{ROW_IDS}.includes('import-c')"),
        PAGE,
    );
    assert!(browser.find("#error:not([hidden])").is_none(), "no error banner: {}", browser.page_text());
    drop(worker);
}

/// The text of every body cell of the table `table` (a selector), row after row.
fn cells(browser: &Browser, table: &str) -> Vec<String> {
    let script = format!("return [...document.querySelectorAll('{table} tbody tr td')].map(td => td.textContent)");
    serde_json::from_value(browser.exec(&script, json!([]))).unwrap()
}

/// A parked run's page says what it waits for in words (a signal's token), and lists its
/// pending remote step by name, queue and state (both were shown as raw JSON).
#[test]
fn a_parked_runs_page_says_what_it_waits_for() {
    let Some(Setup { worker, db, dir, driver }) = setup("a_parked_runs_page_says_what_it_waits_for") else { return };
    worker.park("approval", "approve-7", json!({}));
    worker.park("resize", "resize-7", 640);
    let server = Server::start(dir.path(), &db, None);
    let browser = Browser::start(&driver, 1280, 900);

    browser.goto(&format!("{}/#/runs/approve-7", server.url));
    browser.wait_for("the waits table", "document.querySelector('#run-waiters tbody tr')", PAGE);
    let row = cells(&browser, "#run-waiters");
    assert_eq!(row[..3], ["0".to_string(), "approve:approve-7".into(), "signal approve:approve-7".into()], "{row:?}");

    browser.goto(&format!("{}/#/runs/resize-7", server.url));
    browser.wait_for("the pending remote steps", "document.querySelector('#run-tasks tbody tr')", PAGE);
    let row = cells(&browser, "#run-tasks");
    assert_eq!(row[..3], ["0".to_string(), "resize".into(), "images".into()], "{row:?}");
    assert!(!row.iter().any(|cell| cell.contains('{')), "no raw JSON: {row:?}");
    let waits = cells(&browser, "#run-waiters");
    assert!(waits.contains(&"a remote step (remote:resize-7:0)".to_string()), "{waits:?}");
    // The step still going says for how long, not "running" twice.
    let duration = browser.text(&browser.element("#timeline li[data-seq='0'] .duration"));
    assert!(duration.ends_with(" so far"), "{duration}");
    assert!(browser.find("#error:not([hidden])").is_none(), "no error banner: {}", browser.page_text());
    browser.screenshot("run-page-waiting");
    drop(worker);
}

#[test]
fn clicking_a_run_shows_its_timeline() {
    let Some(Setup { worker, db, dir, driver }) = setup("clicking_a_run_shows_its_timeline") else { return };
    let id = "orders/2024:17";
    assert_eq!(worker.run(id, json!({"order": 17}), &[]), RunStatus::Completed);
    assert_eq!(worker.run("other", json!({}), &[]), RunStatus::Completed);
    let history = show(dir.path(), &db, id)["history"].as_array().unwrap().clone();
    let names: Vec<&str> = history.iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["prepare", "fetch", "save"]);
    let server = Server::start(dir.path(), &db, None);
    let browser = Browser::start(&driver, 1280, 900);

    browser.goto(&format!("{}/#/runs", server.url));
    browser.wait_for("the run's row", &format!("{ROW_IDS}.includes({})", json!(id)), PAGE);
    browser.click_on(&format!("#runs-table tr[data-run-id={}] td.id a", json!(id)));
    browser.wait_for(
        "one timeline entry per checkpoint",
        "document.querySelectorAll('#timeline li[data-seq]').length === 3",
        PAGE,
    );
    let entries = browser.exec(
        "return [...document.querySelectorAll('#timeline li[data-seq]')].map(li => \
           [Number(li.dataset.seq), li.querySelector('.name').textContent, li.querySelector('.badge').textContent])",
        json!([]),
    );
    assert_eq!(entries, json!([[0, "prepare", "completed"], [1, "fetch", "completed"], [2, "save", "completed"]]));
    assert_eq!(browser.text(&browser.element("#run-status")), "completed");
    assert_eq!(browser.text(&browser.element("#run-id")), id);
    assert_eq!(
        browser.exec("return decodeURIComponent(location.hash)", json!([])),
        json!(format!("#/runs/{id}")),
        "the run's page has its own address"
    );
    assert!(browser.text(&browser.element("#run-output")).contains("\"rows\": 42"));
    browser.screenshot("run-page");
    browser.set_window_size(400, 900);
    browser.wait_for(
        "the run page to fit 400 px",
        "window.innerWidth <= 400 && document.documentElement.scrollWidth <= window.innerWidth",
        PAGE,
    );
    browser.screenshot("run-page-narrow");
    drop(worker);
}

#[test]
fn the_retry_button_retries_a_failed_run_and_the_page_shows_it_completing() {
    let Some(Setup { worker, db, dir, driver }) =
        setup("the_retry_button_retries_a_failed_run_and_the_page_shows_it_completing")
    else {
        return;
    };
    let id = "import-retry";
    assert_eq!(worker.run(id, json!({"source": true}), &[]), RunStatus::Failed);
    let server = Server::start(dir.path(), &db, Some("s3cret-token"));
    let browser = Browser::start(&driver, 1280, 900);

    browser.goto(&format!("{}/#/runs/{id}", server.url));
    browser.wait_for("the failed run", "document.querySelector('#run-status')?.textContent === 'failed'", PAGE);
    assert_eq!(browser.exec("return document.querySelectorAll('#timeline li[data-seq]').length", json!([])), json!(2));
    assert!(browser.text(&browser.element("#timeline li[data-seq=\"1\"]")).contains("the source is down"));
    assert!(browser.find("#cancel-run:disabled").is_some(), "a failed run cannot be cancelled");
    // A mark that a reload would erase.
    browser.exec("window.__before_retry = 'still here'", json!([]));

    // The operator retries from the page, after confirming. The retried run holds in `fetch`
    // until the page shows it active again, so its completion can only reach the page later,
    // through the live event stream.
    // Without the server's token the retry is refused, and the page says what to do.
    browser.click_on("#retry-run");
    browser.wait_for("the confirmation dialog", "document.querySelector('#confirm').open", PAGE);
    browser.click_on("#confirm-yes");
    browser.wait_for("the refusal", "!document.querySelector('#error').hidden", PAGE);
    let refusal = browser.text(&browser.element("#error-text"));
    assert!(refusal.contains("[unauthorized]") && refusal.contains("enter the server's token"), "{refusal}");
    assert_eq!(browser.text(&browser.element("#run-status")), "failed");
    browser.screenshot("retry-unauthorized");
    browser.type_into("#token", "s3cret-token");
    browser.click_on("#save-token");
    browser.wait_for("the token saved", "sessionStorage.getItem('durable.token') === 's3cret-token'", PAGE);
    browser.wait_for("the banner gone", "document.querySelector('#error').hidden", PAGE);

    worker.source.send_replace(Source::Held);
    browser.click_on("#retry-run");
    browser.wait_for("the confirmation dialog", "document.querySelector('#confirm').open", PAGE);
    browser.screenshot("retry-confirm");
    browser.click_on("#confirm-yes");
    browser.wait_for(
        "the run to be active again",
        "['pending', 'running', 'suspended'].includes(document.querySelector('#run-status')?.textContent)",
        PAGE,
    );
    worker.source.send_replace(Source::Up);
    browser.wait_for("the run to complete", "document.querySelector('#run-status')?.textContent === 'completed'", PAGE);
    browser.wait_for("the full timeline", "document.querySelectorAll('#timeline li[data-seq]').length === 3", PAGE);
    assert_eq!(
        browser.exec("return window.__before_retry", json!([])),
        json!("still here"),
        "the page was not reloaded"
    );
    let fetch =
        browser.exec("return document.querySelector('#timeline li[data-seq=\"1\"] .badge').textContent", json!([]));
    assert_eq!(fetch, json!("completed"));
    assert!(browser.find("#error:not([hidden])").is_none(), "no error banner: {}", browser.page_text());
    browser.screenshot("retry-completed");
    let stored = show(dir.path(), &db, id);
    assert_eq!(stored["run"]["status"], "completed");
    drop(worker);
}
