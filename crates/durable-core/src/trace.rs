//! The W3C trace context a run carries ([`Run::trace_context`](crate::Run::trace_context)):
//! a `traceparent` string, `00-<trace id: 32 hex>-<parent span id: 16 hex>-<flags: 2 hex>`.
//!
//! The runtime stores one on every run it creates (taken from the caller's span, or fresh),
//! children and remote tasks inherit it, and every turn's span is parented on it, so all the
//! spans of a run — on any process — share one trace id. This module only parses, validates
//! and formats: no randomness, no clock (the runtime brings the random ids).

use std::fmt;

use crate::RunId;

/// A parsed, valid W3C `traceparent` (version `00`): non-zero trace and span ids.
///
/// ```
/// use durable_core::trace::TraceParent;
/// let tp: TraceParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".parse().unwrap();
/// assert_eq!(tp.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
/// assert!(tp.sampled());
/// assert_eq!(tp.to_string(), "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
/// assert!("00-00000000000000000000000000000000-00f067aa0ba902b7-01".parse::<TraceParent>().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceParent {
    trace_id: [u8; 16],
    span_id: [u8; 8],
    flags: u8,
}

/// A `traceparent` that [`TraceParent::parse`] refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid traceparent {value:?}: {reason}; expected W3C `00-<32 lower-case hex trace id>-<16 lower-case hex span id>-<2 hex flags>` with non-zero ids"
)]
pub struct BadTraceParent {
    /// The refused value (shortened for display).
    pub value: String,
    /// Why it was refused.
    pub reason: &'static str,
}

impl TraceParent {
    /// The trace context of these ids; `None` if either is all zeros (invalid in W3C).
    pub fn new(trace_id: [u8; 16], span_id: [u8; 8], flags: u8) -> Option<Self> {
        (trace_id != [0; 16] && span_id != [0; 8]).then_some(TraceParent { trace_id, span_id, flags })
    }

    /// Parses and validates a `traceparent` (version `00`, lower-case hex, non-zero ids).
    pub fn parse(s: &str) -> Result<Self, BadTraceParent> {
        let bad = |reason| BadTraceParent { value: s.chars().take(80).collect(), reason };
        let parts: Vec<&str> = s.split('-').collect();
        let [version, trace, span, flags] = parts[..] else {
            return Err(bad("it does not have four dash-separated fields"));
        };
        if version != "00" {
            return Err(bad("only version 00 is supported"));
        }
        let trace_id = hex::<16>(trace).ok_or_else(|| bad("the trace id is not 32 lower-case hex digits"))?;
        let span_id = hex::<8>(span).ok_or_else(|| bad("the parent span id is not 16 lower-case hex digits"))?;
        let [flags] = hex::<1>(flags).ok_or_else(|| bad("the flags are not 2 lower-case hex digits"))?;
        TraceParent::new(trace_id, span_id, flags).ok_or_else(|| bad("the trace id or the span id is all zeros"))
    }

    /// The trace context of a run that has none stored (a run created before trace contexts
    /// were kept): derived from its id alone, so every process derives the same one and all
    /// the run's turns still share a trace. Sampled.
    pub fn derived(run_id: &RunId) -> Self {
        let h = crate::seed_for(run_id.as_str(), 0, 0);
        let (a, b, c) = (crate::splitmix64(h), crate::splitmix64(h ^ 1), crate::splitmix64(h ^ 2));
        let mut trace_id = [0; 16];
        trace_id[..8].copy_from_slice(&a.to_be_bytes());
        trace_id[8..].copy_from_slice(&b.to_be_bytes());
        // splitmix64 is a bijection: at most one of 2^64 inputs maps to 0; `| 1` rules it out.
        TraceParent { trace_id, span_id: (c | 1).to_be_bytes(), flags: 1 }
    }

    /// The trace context of `run`: the stored one when it is valid, else [`TraceParent::derived`].
    pub fn of_run(run: &crate::Run) -> Self {
        TraceParent::stored_or_derived(run.trace_context.as_deref(), &run.id)
    }

    /// `stored` (a run's or a task's trace context) when it is valid, else the one
    /// [derived](TraceParent::derived) from the run id.
    pub fn stored_or_derived(stored: Option<&str>, run_id: &RunId) -> Self {
        stored.and_then(|s| s.parse().ok()).unwrap_or_else(|| TraceParent::derived(run_id))
    }

    /// The trace id.
    pub fn trace_id(&self) -> [u8; 16] {
        self.trace_id
    }

    /// The parent span id.
    pub fn span_id(&self) -> [u8; 8] {
        self.span_id
    }

    /// The trace flags.
    pub fn flags(&self) -> u8 {
        self.flags
    }

    /// Whether the sampled flag is set.
    pub fn sampled(&self) -> bool {
        self.flags & 1 == 1
    }

    /// The trace id as 32 lower-case hex digits (what logs and trace backends show).
    pub fn trace_id_hex(&self) -> String {
        to_hex(&self.trace_id)
    }
}

impl std::str::FromStr for TraceParent {
    type Err = BadTraceParent;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        TraceParent::parse(s)
    }
}

impl fmt::Display for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "00-{}-{}-{:02x}", to_hex(&self.trace_id), to_hex(&self.span_id), self.flags)
    }
}

fn hex<const N: usize>(s: &str) -> Option<[u8; N]> {
    if s.len() != 2 * N || !s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        return None;
    }
    let mut out = [0; N];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// Lower-case hex, two digits a byte, in one allocation (every run created writes three of
/// these: a `format!` per byte cost more than the rest of the trace context).
fn to_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(2 * bytes.len());
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn parses_and_formats_round_trip() {
        let tp = TraceParent::parse(GOOD).expect("valid");
        assert_eq!(tp.to_string(), GOOD);
        assert_eq!(tp.span_id(), [0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7]);
        assert_eq!(tp.flags(), 1);
        let unsampled = TraceParent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00").expect("valid");
        assert!(!unsampled.sampled());
    }

    #[test]
    fn refuses_malformed_and_zero_ids() {
        for bad in [
            "",
            "garbage",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
            "00-+bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            let err = TraceParent::parse(bad).expect_err(bad);
            assert!(err.to_string().contains("invalid traceparent"), "{err}");
        }
    }

    #[test]
    fn derived_is_stable_valid_and_differs_by_run() {
        let a = TraceParent::derived(&RunId::from("order:1"));
        assert_eq!(a, TraceParent::derived(&RunId::from("order:1")));
        assert_ne!(a.trace_id(), TraceParent::derived(&RunId::from("order:2")).trace_id());
        assert_eq!(TraceParent::parse(&a.to_string()), Ok(a));
    }

    #[test]
    fn a_run_uses_its_stored_context_or_a_derived_one() {
        let mut run = crate::NewRun {
            admission: None,
            trace_context: Some(GOOD.into()),
            id: RunId::from("r"),
            workflow: "w".into(),
            version: 1,
            namespace: "default".into(),
            input: crate::Payload::null(),
            tags: vec![],
            priority: 0,
            parent: None,
            created_at: 0,
            start_at: None,
        }
        .into_run();
        assert_eq!(TraceParent::of_run(&run).to_string(), GOOD);
        run.trace_context = None;
        assert_eq!(TraceParent::of_run(&run), TraceParent::derived(&run.id));
        run.trace_context = Some("not a traceparent".into());
        assert_eq!(TraceParent::of_run(&run), TraceParent::derived(&run.id));
    }
}
