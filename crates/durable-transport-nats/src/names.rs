//! Every name this crate uses on the server, derived from the deployment's prefix: the stream,
//! its subjects, the consumers and the control subject. Formatted in one place, pinned by tests.

use std::fmt::Write as _;

/// The subject token of items sent with no namespace (hex never produces it).
const NO_NAMESPACE: &str = "_";

/// The longest JetStream stream or consumer name the server accepts.
const MAX_NAME: usize = 255;

/// Why a prefix is refused.
pub(crate) fn check_prefix(prefix: &str) -> Result<(), String> {
    let problem = if prefix.is_empty() {
        Some("it is empty")
    } else if prefix.chars().any(|c| c.is_whitespace() || c.is_control()) {
        Some("it contains whitespace or a control character")
    } else if prefix.contains(['*', '>']) {
        Some("it contains a wildcard (`*` or `>`)")
    } else if prefix.split('.').any(str::is_empty) {
        Some("it has an empty subject token (a leading, trailing or doubled `.`)")
    } else if stream_name(prefix).len() > MAX_NAME {
        Some("it is too long for a stream name")
    } else {
        None
    };
    match problem {
        Some(why) => Err(format!("invalid NATS prefix {prefix:?}: {why}")),
        None => Ok(()),
    }
}

/// The prefix as a JetStream name: ASCII letters and digits upper-cased, anything else `_`.
fn name_part(prefix: &str) -> String {
    prefix.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_uppercase() } else { '_' }).collect()
}

/// The stream holding the run queue: `<PREFIX>_RUNS`.
pub(crate) fn stream_name(prefix: &str) -> String {
    format!("{}_RUNS", name_part(prefix))
}

/// A namespace as one subject token: `n` then its UTF-8 bytes in lower-case hex (`None`: `_`).
/// Hex keeps any namespace (dots, spaces, wildcards) a single, safe token, and two namespaces
/// apart; the `n` keeps the empty namespace a non-empty token.
pub(crate) fn namespace_token(namespace: Option<&str>) -> String {
    match namespace {
        None => NO_NAMESPACE.to_string(),
        Some(ns) => {
            let mut token = String::with_capacity(1 + ns.len() * 2);
            token.push('n');
            for byte in ns.bytes() {
                let _ = write!(token, "{byte:02x}");
            }
            token
        }
    }
}

/// The two lanes of the run queue: items with a priority above 0 go to the first, which every
/// consumer drains before the second.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lane {
    /// Priority above 0: `<prefix>.prio.<ns-token>`.
    Priority,
    /// Everything else: `<prefix>.runs.<ns-token>`.
    Normal,
}

impl Lane {
    /// The lane of an item of `priority`.
    pub(crate) fn of(priority: i32) -> Lane {
        if priority > 0 { Lane::Priority } else { Lane::Normal }
    }

    /// The lane's subject word (also in its consumers' names).
    pub(crate) fn word(self) -> &'static str {
        match self {
            Lane::Priority => "prio",
            Lane::Normal => "runs",
        }
    }
}

/// The subjects the stream captures: both lanes, every namespace.
pub(crate) fn stream_subjects(prefix: &str) -> Vec<String> {
    [Lane::Priority, Lane::Normal].iter().map(|lane| format!("{prefix}.{}.>", lane.word())).collect()
}

/// The subject an item of `namespace` is published to in `lane`.
pub(crate) fn item_subject(prefix: &str, lane: Lane, namespace: Option<&str>) -> String {
    format!("{prefix}.{}.{}", lane.word(), namespace_token(namespace))
}

/// The subject filter of a consumer of `namespace` (`None`: every namespace, and the items sent
/// with none) in `lane`.
pub(crate) fn consumer_filter(prefix: &str, lane: Lane, namespace: Option<&str>) -> String {
    match namespace {
        None => format!("{prefix}.{}.>", lane.word()),
        Some(_) => item_subject(prefix, lane, namespace),
    }
}

/// The durable consumer every instance consuming `namespace` in `lane` shares: `runs-all` /
/// `prio-all` for every namespace, `runs-<ns-token>` / `prio-<ns-token>` for one.
pub(crate) fn consumer_name(lane: Lane, namespace: Option<&str>) -> String {
    match namespace {
        None => format!("{}-all", lane.word()),
        Some(_) => format!("{}-{}", lane.word(), namespace_token(namespace)),
    }
}

/// Why a consumer of `namespace` cannot exist (its name would be too long), if it cannot.
pub(crate) fn check_namespace(namespace: Option<&str>) -> Result<(), String> {
    if consumer_name(Lane::Priority, namespace).len() > MAX_NAME {
        return Err(format!(
            "namespace {:?} is too long for a JetStream consumer name (at most {} bytes)",
            namespace.unwrap_or_default(),
            (MAX_NAME - "prio-n".len()) / 2
        ));
    }
    Ok(())
}

/// The core NATS subject rung (an empty message) after items of `namespace` were sent, so idle
/// consumers look at once: `<prefix>.bell.<ns-token>`. Not captured by the stream.
pub(crate) fn bell_subject(prefix: &str, namespace: Option<&str>) -> String {
    format!("{prefix}.bell.{}", namespace_token(namespace))
}

/// The bells a consumer of `namespace` (`None`: every namespace) listens to.
pub(crate) fn bell_filter(prefix: &str, namespace: Option<&str>) -> String {
    match namespace {
        None => format!("{prefix}.bell.>"),
        Some(_) => bell_subject(prefix, namespace),
    }
}

/// The core NATS subject of the control plane: `<prefix>.control`.
pub(crate) fn control_subject(prefix: &str) -> String {
    format!("{prefix}.control")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_pinned() {
        assert_eq!(stream_name("prod.orders-eu"), "PROD_ORDERS_EU_RUNS");
        assert_eq!(stream_subjects("p"), ["p.prio.>", "p.runs.>"]);
        assert_eq!(item_subject("p", Lane::Normal, None), "p.runs._");
        assert_eq!(item_subject("p", Lane::Normal, Some("a.b")), "p.runs.n612e62");
        assert_eq!(item_subject("p", Lane::Priority, Some("a")), "p.prio.n61");
        assert_eq!(consumer_filter("p", Lane::Normal, None), "p.runs.>");
        assert_eq!(consumer_filter("p", Lane::Priority, Some("a")), "p.prio.n61");
        assert_eq!(consumer_name(Lane::Normal, None), "runs-all");
        assert_eq!(consumer_name(Lane::Priority, Some("a")), "prio-n61");
        assert_eq!(control_subject("p.q"), "p.q.control");
        assert_eq!(bell_subject("p", None), "p.bell._");
        assert_eq!(bell_subject("p", Some("a")), "p.bell.n61");
        assert_eq!(bell_filter("p", None), "p.bell.>");
        assert_eq!(bell_filter("p", Some("a")), "p.bell.n61");
        assert_eq!(Lane::of(1), Lane::Priority);
        assert_eq!(Lane::of(0), Lane::Normal);
        assert_eq!(Lane::of(-5), Lane::Normal);
    }

    #[test]
    fn namespace_tokens_are_single_safe_tokens_and_distinct() {
        for ns in ["", "a", "a.b", "*", ">", "with space", "ünï"] {
            let token = namespace_token(Some(ns));
            assert!(token.starts_with('n') && token[1..].bytes().all(|b| b.is_ascii_hexdigit()), "{token}");
            assert_ne!(token, namespace_token(None));
        }
        assert_ne!(namespace_token(Some("ab")), namespace_token(Some("a")));
        assert!(check_namespace(Some(&"x".repeat(124))).is_ok());
        assert!(check_namespace(Some(&"x".repeat(125))).is_err());
    }

    #[test]
    fn prefixes_are_checked() {
        assert!(check_prefix("durable").is_ok());
        assert!(check_prefix("prod.orders").is_ok());
        for bad in ["", "a b", "a.*", "a.>", ".a", "a.", "a..b"] {
            assert!(check_prefix(bad).is_err(), "{bad:?}");
        }
    }
}
