//! Identifiers: run ids, child ids, continue-as-new ids and step ids.

use std::borrow::Borrow;
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// The identifier of a workflow run.
///
/// Any non-empty UTF-8 string of at most [`RunId::MAX_LEN`] bytes. The engine generates a UUID v7
/// when the caller gives none. Cheap to clone (shared string).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RunId(Arc<str>);

impl RunId {
    /// The longest id accepted, in bytes.
    pub const MAX_LEN: usize = 512;

    /// Wraps a string as a run id without validation (stores use this for ids they persisted).
    pub fn new(id: impl Into<Arc<str>>) -> Self {
        RunId(id.into())
    }

    /// Wraps a string as a run id, refusing empty ids, ids longer than [`RunId::MAX_LEN`] and
    /// ids containing control characters.
    pub fn parse(id: &str) -> Result<Self, InvalidId> {
        if id.is_empty() {
            return Err(InvalidId { id: id.into(), reason: "it is empty" });
        }
        if id.len() > Self::MAX_LEN {
            return Err(InvalidId { id: id.chars().take(64).collect(), reason: "it is longer than 512 bytes" });
        }
        if id.chars().any(char::is_control) {
            return Err(InvalidId { id: id.escape_debug().to_string(), reason: "it contains a control character" });
        }
        Ok(RunId(id.into()))
    }

    /// The id as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The id of the child started at `seq` by this run: `<run>.child.<seq>`.
    pub fn child(&self, seq: u32) -> RunId {
        crate::protocol::child_id(self, seq)
    }

    /// The id of the run that continues this one as new: `<root>~<n+1>` (see
    /// [`crate::protocol::successor_id`]).
    pub fn successor(&self) -> RunId {
        crate::protocol::successor_id(self)
    }

    /// The root of a continue-as-new chain and this run's position in it (0 for the root).
    pub fn chain_position(&self) -> (&str, u32) {
        crate::protocol::chain_position(self)
    }

    /// The id of a step: `<run>:<seq>`. Stable across retries and replays, so side effects can
    /// be made idempotent with it.
    pub fn step_id(&self, seq: u32) -> String {
        crate::protocol::step_id(self, seq)
    }
}

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", &*self.0)
    }
}

impl From<&str> for RunId {
    fn from(s: &str) -> Self {
        RunId::new(s)
    }
}

/// `"id".parse::<RunId>()`: [`RunId::parse`], which validates (`From<&str>` does not).
impl std::str::FromStr for RunId {
    type Err = InvalidId;

    fn from_str(s: &str) -> Result<Self, InvalidId> {
        RunId::parse(s)
    }
}

impl From<String> for RunId {
    fn from(s: String) -> Self {
        RunId::new(s)
    }
}

impl Borrow<str> for RunId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for RunId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// An id that [`RunId::parse`] refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid run id {id:?}: {reason}; use a non-empty id of at most 512 bytes without control characters")]
pub struct InvalidId {
    /// The refused id (shortened or escaped for display).
    pub id: String,
    /// Why it was refused.
    pub reason: &'static str,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_ids() {
        let id = RunId::from("order:42");
        assert_eq!(id.child(3).as_str(), "order:42.child.3");
        assert_eq!(id.step_id(7), "order:42:7");
        assert_eq!(id.successor().as_str(), "order:42~1");
        assert_eq!(id.successor().successor().as_str(), "order:42~2");
        assert_eq!(RunId::from("a~7").chain_position(), ("a", 7));
        assert_eq!(RunId::from("a~x").chain_position(), ("a~x", 0));
    }

    #[test]
    fn parse_refuses_bad_ids() {
        assert!(RunId::parse("").is_err());
        assert!(RunId::parse(&"x".repeat(513)).is_err());
        assert!(RunId::parse("a\nb").is_err());
        assert_eq!(RunId::parse("заказ-🚀").unwrap().as_str(), "заказ-🚀");
        assert_eq!("order:1".parse::<RunId>().unwrap().as_str(), "order:1");
        assert!("".parse::<RunId>().is_err());
    }
}
