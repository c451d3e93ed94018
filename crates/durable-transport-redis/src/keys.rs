//! The names of every key a deployment uses, all under its prefix.

/// The consumer group every consumer of a run stream belongs to.
pub(crate) const GROUP: &str = "durable";

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
