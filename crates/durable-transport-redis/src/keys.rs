//! The names of every key a deployment uses, all under its prefix.

/// The consumer group every consumer of a run stream belongs to.
pub(crate) const GROUP: &str = "durable";

/// Why `prefix` cannot name a deployment's keys, if it cannot: an empty (or blank) one would
/// put them at the top of the key space, beside everything else on the server.
pub(crate) fn check_prefix(prefix: &str) -> Result<(), String> {
    let problem = if prefix.trim().is_empty() {
        Some("it is empty")
    } else if prefix.chars().any(char::is_control) {
        Some("it contains a control character")
    } else {
        None
    };
    match problem {
        Some(why) => Err(format!("invalid Redis prefix {prefix:?}: {why}; give each deployment a name of its own")),
        None => Ok(()),
    }
}

/// `url` as an error may show it: a password in it (the user info's, or the `pass` or
/// `password` of a socket URL's query) replaced by `***`; one that does not parse as
/// `scheme://…` is not shown at all (`user:secret@host` reads as a scheme and a path).
pub(crate) fn shown_url(url: &str) -> String {
    let parsed = url::Url::parse(url).ok().filter(|u| !u.cannot_be_a_base());
    let Some(mut parsed) = parsed else { return "a URL that does not parse".into() };
    if parsed.password().is_some() {
        let _ = parsed.set_password(Some("***"));
    }
    if parsed.query_pairs().any(|(k, _)| k == "pass" || k == "password") {
        let pairs: Vec<(String, String)> = parsed
            .query_pairs()
            .map(|(k, v)| {
                let v = if k == "pass" || k == "password" { "***".to_string() } else { v.into_owned() };
                (k.into_owned(), v)
            })
            .collect();
        parsed.query_pairs_mut().clear().extend_pairs(pairs);
    }
    parsed.to_string()
}

/// What connecting to `url` failed with, naming the server.
pub(crate) fn connect_error(url: &str, e: impl std::fmt::Display) -> String {
    format!("could not connect to Redis at {}: {e}", shown_url(url))
}

/// Key names under one prefix.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    prefix: String,
}

impl Keys {
    pub(crate) fn new(prefix: String) -> Self {
        Keys { prefix }
    }

    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The run stream of a namespace (`None`: items sent without one) in one lane: `urgent`
    /// holds the items of priority above 0, read before the others.
    ///
    /// `<prefix>:runs:<ns>` / `<prefix>:urgent:<ns>`; without a namespace `<prefix>:runs` /
    /// `<prefix>:urgent` (no suffix at all, so no namespace name can collide with it).
    pub(crate) fn stream(&self, namespace: Option<&str>, urgent: bool) -> String {
        let lane = if urgent { "urgent" } else { "runs" };
        match namespace {
            Some(ns) => format!("{}:{lane}:{ns}", self.prefix),
            None => format!("{}:{lane}", self.prefix),
        }
    }

    /// What every urgent stream's key starts with (a normal stream's never does).
    pub(crate) fn urgent_prefix(&self) -> String {
        format!("{}:urgent", self.prefix)
    }

    /// The set of every run stream's key: what a consumer of every namespace reads.
    pub(crate) fn namespaces(&self) -> String {
        format!("{}:namespaces", self.prefix)
    }

    /// A stream of one entry, replaced whenever a run stream is created: consumers of every
    /// namespace block on it too, so a new namespace's first item wakes them.
    pub(crate) fn new_streams(&self) -> String {
        format!("{}:new-streams", self.prefix)
    }

    /// The marker that drops a second send of `dedupe_key` within the window.
    pub(crate) fn dedupe(&self, dedupe_key: &str) -> String {
        format!("{}:dedupe:{dedupe_key}", self.prefix)
    }

    /// The control plane's pub/sub channel.
    pub(crate) fn control(&self) -> String {
        format!("{}:control", self.prefix)
    }

    /// A `SCAN MATCH` pattern for every key under the prefix (glob characters in the prefix
    /// escaped, so it matches only this prefix's keys).
    pub(crate) fn pattern(&self) -> String {
        let mut pattern = String::with_capacity(self.prefix.len() + 2);
        for c in self.prefix.chars() {
            if matches!(c, '*' | '?' | '[' | ']' | '\\') {
                pattern.push('\\');
            }
            pattern.push(c);
        }
        pattern.push_str(":*");
        pattern
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blank_prefixes_are_refused_and_passwords_are_not_shown() {
        for bad in ["", "  ", "a\nb"] {
            assert!(check_prefix(bad).unwrap_err().starts_with("invalid Redis prefix"), "{bad:?}");
        }
        assert_eq!(check_prefix("prod:orders"), Ok(()));
        assert_eq!(shown_url("redis://:s3cret@h:6379/0"), "redis://:***@h:6379/0");
        assert_eq!(shown_url("redis://me:s3cret@h:6379"), "redis://me:***@h:6379");
        assert_eq!(shown_url("redis://h:6379"), "redis://h:6379");
        assert_eq!(shown_url("redis://u:p%40ss@word@h:6379"), "redis://u:***@h:6379");
        assert_eq!(
            shown_url("redis+unix:///run/redis.sock?db=1&pass=s3cret"),
            "redis+unix:///run/redis.sock?db=1&pass=***"
        );
        assert_eq!(shown_url("default:s3cret@redis:6379"), "a URL that does not parse");
        let e = connect_error("redis://:pw@h:1", "Connection refused");
        assert_eq!(e, "could not connect to Redis at redis://:***@h:1: Connection refused");
    }

    #[test]
    fn keys_are_under_the_prefix_and_do_not_collide() {
        let keys = Keys::new("app".into());
        assert_eq!(keys.stream(Some("billing"), false), "app:runs:billing");
        assert_eq!(keys.stream(Some("billing"), true), "app:urgent:billing");
        assert_eq!(keys.stream(None, false), "app:runs");
        assert_eq!(keys.stream(Some("_"), false), "app:runs:_");
        assert_ne!(keys.stream(None, false), keys.stream(Some(""), false));
        assert!(keys.stream(Some("x"), true).starts_with(&keys.urgent_prefix()));
        assert!(!keys.stream(Some("x"), false).starts_with(&keys.urgent_prefix()));
        assert_eq!(keys.dedupe("start:r1:0"), "app:dedupe:start:r1:0");
        assert_eq!(keys.control(), "app:control");
    }

    #[test]
    fn the_scan_pattern_escapes_glob_characters() {
        assert_eq!(Keys::new("a*b?[c]\\".into()).pattern(), "a\\*b\\?\\[c\\]\\\\:*");
        assert_eq!(Keys::new("plain".into()).pattern(), "plain:*");
    }
}
