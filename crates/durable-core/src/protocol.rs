//! Every persisted string format and id scheme, formatted and parsed in one place.
//!
//! Histories outlive the code that wrote them: a run started by this version must replay in
//! every later one. So each string the engine stores or sends — checkpoint names it derives,
//! signal tokens, ids of runs it creates, the output marker of a continued run, the payloads a
//! child or an external task delivers — is built and read here and nowhere else, and the golden
//! tests at the bottom pin each format. Changing one of them breaks stored runs: add a new
//! format beside the old one instead.
//!
//! | what | format | example |
//! |---|---|---|
//! | step id (idempotency key) | `<run>:<seq>` | `order:42:3` |
//! | child run id | `<run>.child.<seq>` | `order:42.child.3` |
//! | continue-as-new successor | `<root>~<n>` | `order:42~2` |
//! | operator retry with a new input | `<run>~retry~<n>` | `order:42~retry~1` |
//! | child result token | `child:<parent>:<seq>` | `child:order:42:3` |
//! | update token | `update:<run>:<name>` | `update:order:42:approve` |
//! | external task token | `task:<run>:<name>` | `task:order:42:review` |
//! | external task dispatch step | `task:<name>` | `task:review` |
//! | wait deadline checkpoint | `timeout:<name>` | `timeout:approve` |
//! | undo checkpoint | `undo:<name>` | `undo:charge` |
//! | continued run's output | `{"$continued_as_new": "<successor>"}` | |

use serde::{Deserialize, Serialize};

use crate::{Payload, Run, RunId, RunStatus, StepError};

/// The idempotency key of the step at `seq`: `<run>:<seq>`.
pub fn step_id(run: &RunId, seq: u32) -> String {
    format!("{run}:{seq}")
}

/// The id of the child started at `seq` of `parent` (when the workflow gives none):
/// `<parent>.child.<seq>`.
pub fn child_id(parent: &RunId, seq: u32) -> RunId {
    RunId::new(format!("{parent}.child.{seq}"))
}

const SUCCESSOR_SEP: char = '~';
const RETRY_INFIX: &str = "~retry~";

/// The root of a continue-as-new chain and `id`'s position in it (0 for the root): `a~3` is
/// `("a", 3)`. A retry id (`a~retry~1`) is a root of its own: `("a~retry~1", 0)`.
pub fn chain_position(id: &RunId) -> (&str, u32) {
    let s = id.as_str();
    if let Some((root, n)) = s.rsplit_once(SUCCESSOR_SEP)
        && !root.is_empty()
        && !n.is_empty()
        && n.bytes().all(|b| b.is_ascii_digit())
        && !root.ends_with(RETRY_INFIX.trim_end_matches(SUCCESSOR_SEP))
        && let Ok(n) = n.parse::<u32>()
    {
        return (root, n);
    }
    (s, 0)
}

/// The id of the run that continues `id` as new: `<root>~<n+1>`, where `id` is the `n`-th run
/// of its chain (`a` → `a~1`, `a~1` → `a~2`, `a~retry~1` → `a~retry~1~1`).
pub fn successor_id(id: &RunId) -> RunId {
    let (root, n) = chain_position(id);
    RunId::new(format!("{root}{SUCCESSOR_SEP}{}", n.saturating_add(1)))
}

/// The id of the `n`-th run started by an operator's retry of `id` with a new input:
/// `<id>~retry~<n>`.
pub fn retry_id(id: &RunId, n: u32) -> RunId {
    RunId::new(format!("{id}{RETRY_INFIX}{n}"))
}

/// The token a child's result is sent to: the parent's wait at the child's seq.
pub fn child_token(parent: &RunId, seq: u32) -> String {
    format!("child:{parent}:{seq}")
}

/// The parent a [`child_token`] belongs to (`None` for any other token). The seq is the
/// digits after the last `:`, so a parent id holding `:` parses too.
pub fn child_token_parent(token: &str) -> Option<&str> {
    let (parent, seq) = token.strip_prefix("child:")?.rsplit_once(':')?;
    (!parent.is_empty() && !seq.is_empty() && seq.bytes().all(|b| b.is_ascii_digit())).then_some(parent)
}

/// The token `ctx.on_update(name)` waits on.
pub fn update_token(run: &RunId, name: &str) -> String {
    format!("update:{run}:{name}")
}

/// The token `ctx.task(name, ..)` waits on for its completion.
pub fn task_token(run: &RunId, name: &str) -> String {
    format!("task:{run}:{name}")
}

/// The token the wait of the remote step at `seq` is registered on; a worker's result is
/// delivered to it by [`Store::complete_task`](crate::Store::complete_task).
pub fn remote_token(run: &RunId, seq: u32) -> String {
    format!("remote:{run}:{seq}")
}

/// The admission gate of a workflow's concurrency key: `key:<namespace>:<workflow>:<key>`,
/// with `%` and `:` in the namespace and the workflow written `%25` and `%3A`, so that no two
/// (namespace, workflow, key) share a gate (`w:x` with key `y` and `w` with key `x:y` would).
pub fn key_gate(namespace: &str, workflow: &str, key: &str) -> String {
    format!("key:{}:{}:{key}", gate_part(namespace), gate_part(workflow))
}

/// The admission gate of a step queue: `queue:<namespace>:<name>`, the namespace written as
/// in [`key_gate`].
pub fn queue_gate(namespace: &str, name: &str) -> String {
    format!("queue:{}:{name}", gate_part(namespace))
}

/// A gate name taken apart ([`parse_gate`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GateName {
    /// A workflow's concurrency key ([`key_gate`]).
    Key {
        /// The runs' namespace.
        namespace: String,
        /// The workflow.
        workflow: String,
        /// The key.
        key: String,
    },
    /// A step queue ([`queue_gate`]).
    Queue {
        /// The runs' namespace.
        namespace: String,
        /// The queue.
        name: String,
    },
}

/// The parts of a gate name [`key_gate`] or [`queue_gate`] made; `None` for another name.
pub fn parse_gate(gate: &str) -> Option<GateName> {
    let (kind, rest) = gate.split_once(':')?;
    let (ns, rest) = rest.split_once(':')?;
    let namespace = gate_part_decoded(ns);
    match kind {
        "key" => {
            let (workflow, key) = rest.split_once(':').unwrap_or((rest, ""));
            Some(GateName::Key { namespace, workflow: gate_part_decoded(workflow), key: key.to_string() })
        }
        "queue" => Some(GateName::Queue { namespace, name: rest.to_string() }),
        _ => None,
    }
}

/// `part` with `%` and `:` escaped (`%25`, `%3A`), as a gate name holds it.
fn gate_part(part: &str) -> std::borrow::Cow<'_, str> {
    if part.contains(['%', ':']) { part.replace('%', "%25").replace(':', "%3A").into() } else { part.into() }
}

/// [`gate_part`] undone.
fn gate_part_decoded(part: &str) -> String {
    part.replace("%3A", ":").replace("%25", "%")
}

/// The `wake_at` of a run created `pending` while it waits for its concurrency key: never
/// due by time; a release hands it a slot and makes it due at once.
///
/// One below `i64::MAX`, so it reads back unchanged from an SQL `BIGINT` (the SQL stores keep
/// times past `i64::MAX` as `i64::MAX` and read that back as `u64::MAX`, the "forever"
/// sentinel, which is not a gated run).
pub const GATED: crate::Millis = (i64::MAX - 1) as crate::Millis;

/// The name of the step that hands an external task out.
pub fn task_step_name(name: &str) -> String {
    format!("task:{name}")
}

/// The longest name a store indexes, in bytes of UTF-8: a signal token, an event, update or
/// task name, a tag, a namespace, a concurrency or fairness key, a queue or a capability.
/// PostgreSQL's index entries must fit in a third of a page (about 2,700 bytes): a longer token
/// made every commit of its turn fail. A ctx call's own name (a step's) is stored, not indexed,
/// and has no such limit.
pub const MAX_NAME_BYTES: usize = 1024;

/// The most bytes an admission request's gate name ([`key_gate`], [`queue_gate`]) and fairness
/// key may take together. Each part fits [`MAX_NAME_BYTES`], but a store indexes the gate with
/// the fairness key, and three or four parts near the limit would pass PostgreSQL's index entry
/// limit: a start or a step whose request is longer is refused ([`gate_problem`]).
pub const MAX_GATE_BYTES: usize = 2 * MAX_NAME_BYTES;

/// What keeps a store from indexing an admission request on `gate` with `fairness_key` (`""`:
/// none), if anything: more than [`MAX_GATE_BYTES`] bytes together.
pub fn gate_problem(gate: &str, fairness_key: &str) -> Option<String> {
    let len = gate.len() + fairness_key.len();
    (len > MAX_GATE_BYTES).then(|| {
        let what = if fairness_key.is_empty() { "the gate name" } else { "the gate name with the fairness key" };
        format!("{what} {} takes {len} bytes, over the limit of {MAX_GATE_BYTES} bytes", shown(gate))
    })
}

/// What is wrong with `name` as a signal token, event name, update name, task name, tag or
/// namespace, if anything: it must have a character that is not whitespace, and be storable
/// and indexable ([`storage_problem`]).
pub fn name_problem(name: &str) -> Option<String> {
    if name.is_empty() {
        Some("it must be non-empty".into())
    } else if name.chars().all(char::is_whitespace) {
        Some("it is only whitespace".into())
    } else {
        storage_problem(name)
    }
}

/// What keeps some store from keeping `name`, if anything: a control character (PostgreSQL
/// cannot store a NUL in text, and the CLI could not type one), or more than
/// [`MAX_NAME_BYTES`] bytes.
pub fn storage_problem(name: &str) -> Option<String> {
    if has_control_char(name) {
        Some("it contains a control character".into())
    } else if name.len() > MAX_NAME_BYTES {
        Some(format!("it is {} bytes long, over the limit of {MAX_NAME_BYTES} bytes", name.len()))
    } else {
        None
    }
}

/// Whether `name` holds a control character (PostgreSQL cannot store a NUL in text).
pub fn has_control_char(name: &str) -> bool {
    name.chars().any(char::is_control)
}

/// `name` for a message, quoted: up to 80 characters of it, then how long it was.
pub fn shown(name: &str) -> String {
    const SHOWN: usize = 80;
    match name.char_indices().nth(SHOWN) {
        None => format!("{name:?}"),
        Some((cut, _)) => format!("{:?}… ({} bytes)", &name[..cut], name.len()),
    }
}

/// What the name check calls a signal token ([`check_name`]): one more rule applies to it, no
/// reserved prefix ([`RESERVED_TOKEN_PREFIXES`]).
pub const SIGNAL_TOKEN: &str = "signal token";

/// Whether `name` is usable as `what` — a signal token, event name, update name or task name —
/// the same rule on both sides: the engine refuses to send to an invalid name, and a new wait
/// on one fails its run at once (it could never be satisfied). The reason is [`problem_of`]'s.
pub fn check_name(what: &str, name: &str) -> Result<(), String> {
    problem_of(what, name).map_or(Ok(()), |reason| Err(format!("invalid {}: {reason}", described(what, name))))
}

/// What is wrong with `name` as `what`, if anything: [`name_problem`], and for a
/// [`SIGNAL_TOKEN`] a reserved prefix (a signal there would go around what guards the engine's
/// own messages: an update's validator, the run that is the child).
pub fn problem_of(what: &str, name: &str) -> Option<String> {
    if let Some(reason) = name_problem(name) {
        return Some(reason);
    }
    let prefix = reserved_prefix(name).filter(|_| what == SIGNAL_TOKEN)?;
    Some(format!(
        "tokens beginning with {prefix:?} carry the engine's own messages; use another token for signals \
         (send an update with Engine::update, an external task's result with Engine::complete_task)"
    ))
}

/// `what` with the name it was given, for messages: `signal token "a b"` (`what` alone for an
/// empty name; a long name is cut, [`shown`]).
pub fn described(what: &str, name: &str) -> String {
    if name.is_empty() { what.to_string() } else { format!("{what} {}", shown(name)) }
}

/// The prefixes of the tokens the engine delivers to itself: a child's result
/// ([`child_token`]), an update ([`update_token`]), an external task's result
/// ([`task_token`]) and a remote step's result ([`remote_token`]). A signal sent to one would go
/// around what guards them (an update's validator, the run that is the child), so
/// `Engine::signal` refuses them and a new `wait_for_signal` on one fails its run
/// ([`problem_of`]).
pub const RESERVED_TOKEN_PREFIXES: [&str; 4] = ["child:", "update:", "task:", "remote:"];

/// The reserved prefix `token` begins with ([`RESERVED_TOKEN_PREFIXES`]), if any.
pub fn reserved_prefix(token: &str) -> Option<&'static str> {
    RESERVED_TOKEN_PREFIXES.into_iter().find(|p| token.starts_with(p))
}

const TIMEOUT_PREFIX: &str = "timeout:";
const UNDO_PREFIX: &str = "undo:";

/// The checkpoint name of a wait's deadline (a sleep recorded one seq before the wait).
pub fn timeout_name(wait: &str) -> String {
    format!("{TIMEOUT_PREFIX}{wait}")
}

/// The wait a deadline checkpoint name belongs to (`timeout:approve` → `approve`).
pub fn parse_timeout_name(name: &str) -> Option<&str> {
    name.strip_prefix(TIMEOUT_PREFIX)
}

/// The checkpoint name of the undo of step `step`.
pub fn undo_name(step: &str) -> String {
    format!("{UNDO_PREFIX}{step}")
}

/// The step an undo checkpoint name belongs to (`undo:charge` → `charge`).
pub fn parse_undo_name(name: &str) -> Option<&str> {
    name.strip_prefix(UNDO_PREFIX)
}

const CONTINUED_AS_NEW: &str = "$continued_as_new";

/// The output of a run that continued as new: names its successor.
pub fn continued_marker(successor: &RunId) -> Payload {
    let mut map = serde_json::Map::new();
    map.insert(CONTINUED_AS_NEW.to_string(), serde_json::Value::String(successor.to_string()));
    Payload::from_trusted(serde_json::Value::Object(map).to_string())
}

/// The successor a completed run's output names, if it continued as new.
pub fn successor_of(run: &Run) -> Option<RunId> {
    if run.status != RunStatus::Completed {
        return None;
    }
    let value = run.output.as_ref()?.to_value();
    value.get(CONTINUED_AS_NEW)?.as_str().map(RunId::from)
}

/// What a child run delivers to its parent's wait when it settles.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChildResult {
    /// The child.
    pub run_id: RunId,
    /// How it ended.
    pub status: RunStatus,
    /// Its output, when completed.
    pub output: Option<Payload>,
    /// Its error, otherwise.
    pub error: Option<StepError>,
}

impl ChildResult {
    /// The payload sent to the parent.
    pub fn encode(&self) -> Payload {
        Payload::encode(self).unwrap_or_else(|_| Payload::null())
    }
}

/// The signal a settling child run sends its parent's wait (none for a run without a parent):
/// a [`ChildResult`] to [`child_token`]. Every path that settles a run — the end of a turn, a
/// cancel, a burial — sends exactly this.
pub fn child_notice(
    run: &Run,
    status: RunStatus,
    output: Option<Payload>,
    error: Option<StepError>,
) -> Option<crate::OutgoingSignal> {
    let parent = run.parent.as_ref()?;
    let result = ChildResult { run_id: run.id.clone(), status, output, error };
    Some(crate::OutgoingSignal { token: child_token(&parent.run_id, parent.seq), payload: result.encode() })
}

const CHILD_CODE_PREFIX: &str = "child_";

/// The error code a parent records for a child that ended with `status`: `child_<status>`.
pub fn child_failure_code(status: RunStatus) -> String {
    format!("{CHILD_CODE_PREFIX}{status}")
}

/// The child status a `child_<status>` code names.
pub fn parse_child_failure_code(code: &str) -> Option<RunStatus> {
    code.strip_prefix(CHILD_CODE_PREFIX)?.parse().ok()
}

/// What `Engine::complete_task` / `fail_task` deliver to the task's wait.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskResult {
    /// Completed with this value.
    Ok(Payload),
    /// Failed with this reason.
    Err(String),
}

impl TaskResult {
    /// The payload delivered to the wait.
    pub fn encode(&self) -> Payload {
        Payload::encode(self).unwrap_or_else(|_| Payload::null())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> RunId {
        RunId::from(s)
    }

    /// Golden values: each format is persisted; a change here breaks stored runs.
    #[test]
    fn formats_are_pinned() {
        let r = id("order:42");
        assert_eq!(step_id(&r, 3), "order:42:3");
        assert_eq!(child_id(&r, 3).as_str(), "order:42.child.3");
        assert_eq!(retry_id(&r, 1).as_str(), "order:42~retry~1");
        assert_eq!(child_token(&r, 3), "child:order:42:3");
        assert_eq!(child_token_parent("child:order:42:3"), Some("order:42"));
        for other in ["child:order:42:", "child:order", "child::3", "child:order:4x", "update:order:42:3"] {
            assert_eq!(child_token_parent(other), None, "{other}");
        }
        assert_eq!(update_token(&r, "approve"), "update:order:42:approve");
        assert_eq!(task_token(&r, "review"), "task:order:42:review");
        assert_eq!(task_step_name("review"), "task:review");
        assert_eq!(timeout_name("approve"), "timeout:approve");
        assert_eq!(undo_name("charge"), "undo:charge");
        assert_eq!(key_gate("default", "sync", "acme"), "key:default:sync:acme");
        assert_eq!(queue_gate("default", "api"), "queue:default:api");
        let key = |namespace: &str, workflow: &str, key: &str| GateName::Key {
            namespace: namespace.into(),
            workflow: workflow.into(),
            key: key.into(),
        };
        assert_eq!(parse_gate("key:default:sync:acme"), Some(key("default", "sync", "acme")));
        assert_eq!(parse_gate("key:default:sync:acme:eu"), Some(key("default", "sync", "acme:eu")));
        assert_eq!(
            parse_gate("queue:default:api"),
            Some(GateName::Queue { namespace: "default".into(), name: "api".into() })
        );
        assert_eq!(parse_gate("other:x:y"), None);
        // A `:` or `%` in a namespace or workflow is escaped: no two keys share a gate.
        assert_eq!(key_gate("default", "w:x", "y"), "key:default:w%3Ax:y");
        assert_eq!(key_gate("default", "w", "x:y"), "key:default:w:x:y");
        assert_eq!(key_gate("a:b", "100%", "k"), "key:a%3Ab:100%25:k");
        assert_eq!(queue_gate("a:b", "c"), "queue:a%3Ab:c");
        assert_eq!(parse_gate(&key_gate("a:b", "w:100%3A", "k:1")), Some(key("a:b", "w:100%3A", "k:1")));
        assert_eq!(GATED, 9_223_372_036_854_775_806);
        assert_eq!(continued_marker(&id("a~1")).as_str(), r#"{"$continued_as_new":"a~1"}"#);
        assert_eq!(child_failure_code(RunStatus::Cancelled), "child_cancelled");
        let cr =
            ChildResult { run_id: id("c"), status: RunStatus::Completed, output: Some(Payload::null()), error: None };
        assert_eq!(cr.encode().as_str(), r#"{"run_id":"c","status":"completed","output":null,"error":null}"#);
        assert_eq!(TaskResult::Ok(Payload::encode(&7).unwrap()).encode().as_str(), r#"{"ok":7}"#);
        assert_eq!(TaskResult::Err("no".into()).encode().as_str(), r#"{"err":"no"}"#);
    }

    #[test]
    fn names_are_checked_one_way() {
        assert_eq!(check_name("signal token", ""), Err("invalid signal token: it must be non-empty".to_string()));
        assert_eq!(check_name("signal token", "t"), Ok(()));
        assert_eq!(check_name("signal token", "a b"), Ok(()));
        assert_eq!(
            check_name("step name", " \t"),
            Err(r#"invalid step name " \t": it is only whitespace"#.to_string())
        );
        assert_eq!(
            check_name("signal token", "a\0b"),
            Err(r#"invalid signal token "a\0b": it contains a control character"#.to_string())
        );
        assert_eq!(reserved_prefix("update:r:qty"), Some("update:"));
        assert_eq!(reserved_prefix("order:42"), None);
        assert_eq!(check_name(SIGNAL_TOKEN, "order:42"), Ok(()));
        assert_eq!(check_name("update name", "task:r:review"), Ok(()), "only signal tokens are reserved");
        let refused = check_name(SIGNAL_TOKEN, "task:r:review").unwrap_err();
        assert!(
            refused.starts_with(r#"invalid signal token "task:r:review": tokens beginning with "task:""#),
            "{refused}"
        );
    }

    #[test]
    fn parsers_invert_formatters() {
        assert_eq!(parse_timeout_name(&timeout_name("a:b")), Some("a:b"));
        assert_eq!(parse_timeout_name("sleep"), None);
        assert_eq!(parse_undo_name(&undo_name("x")), Some("x"));
        for s in [RunStatus::Failed, RunStatus::Cancelled, RunStatus::Dead] {
            assert_eq!(parse_child_failure_code(&child_failure_code(s)), Some(s));
        }
        assert_eq!(parse_child_failure_code("child_bogus"), None);
        let mut run = crate::NewRun {
            trace_context: None,
            admission: None,
            id: id("a"),
            workflow: "w".into(),
            version: 1,
            namespace: "default".into(),
            input: Payload::null(),
            tags: vec![],
            priority: 0,
            parent: None,
            created_at: 0,
            start_at: None,
        }
        .into_run();
        run.status = RunStatus::Completed;
        run.output = Some(continued_marker(&id("a~1")));
        assert_eq!(successor_of(&run), Some(id("a~1")));
        run.output = Some(Payload::encode(&5).unwrap());
        assert_eq!(successor_of(&run), None);
    }

    #[test]
    fn chains_and_retries_never_collide() {
        assert_eq!(successor_id(&id("a")).as_str(), "a~1");
        assert_eq!(successor_id(&id("a~1")).as_str(), "a~2");
        assert_eq!(chain_position(&id("a~7")), ("a", 7));
        // A retry id starts a chain of its own: its successor is not the next retry.
        let retry = retry_id(&id("r1"), 1);
        assert_eq!(chain_position(&retry), ("r1~retry~1", 0));
        assert_eq!(successor_id(&retry).as_str(), "r1~retry~1~1");
        assert_ne!(successor_id(&retry), retry_id(&id("r1"), 2));
        assert_eq!(successor_id(&successor_id(&retry)).as_str(), "r1~retry~1~2");
        // Odd ids are roots.
        for s in ["~1", "a~", "a~x", "a~-1", "a~+1"] {
            assert_eq!(chain_position(&id(s)), (s, 0), "{s}");
        }
    }
}
