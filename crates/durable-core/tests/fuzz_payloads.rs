//! Fuzzing, as property tests (proptest runs in `cargo test`; cargo-fuzz would need nightly):
//! payload decoding, the serde of the stored model and every parser of persisted strings, fed
//! arbitrary strings, arbitrary nested JSON and byte-level mutations of valid encodings.
//!
//! What must hold for any input: no panic; [`Payload::from_json`] accepts exactly the text
//! serde_json accepts as a JSON value (so a payload it lets in always decodes into a
//! `serde_json::Value`); a payload or a model value that round-trips encodes identically the
//! second time; each parser returns `None`/an error or a value its formatter turns back into
//! the same string.
//!
//! Each property runs a fixed, small number of cases (a few seconds in all on 2 cores, debug
//! build); a failure is shrunk and saved under `proptest-regressions/` to be replayed first.

use std::collections::BTreeMap;

use durable_core::protocol::{
    self, ChildResult, TaskResult, chain_position, parse_child_failure_code, parse_timeout_name, parse_undo_name,
    successor_id,
};
use durable_core::{
    Checkpoint, CheckpointStatus, ParentLink, Payload, Run, RunId, RunStatus, StepError, StepKind, WaitKind, Waiter,
    decode_cursor, encode_cursor, json_subset,
};
use proptest::prelude::*;
use proptest::sample::Index;
use serde::{Deserialize, Serialize};
use serde_json::Value;

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig { cases, max_shrink_iters: 2_000, ..ProptestConfig::default() }
}

// ---------------------------------------------------------------------------------------------
// Strategies
// ---------------------------------------------------------------------------------------------

/// Strings that stress JSON string encoding: escapes, control characters, non-BMP characters.
fn json_string() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => "[a-z0-9_:~.-]{0,12}",
        1 => "[\"\\\\/\u{0}-\u{1f}\u{7f}\u{80}-\u{10ffff}a ]{0,8}",
        1 => any::<String>(),
    ]
}

fn json_leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter_map("JSON has no NaN or infinities", |f| serde_json::Number::from_f64(f).map(Value::Number)),
        json_string().prop_map(Value::String),
    ]
}

/// Nested JSON values: arrays and objects up to 6 deep, 64 leaves.
fn json_value() -> impl Strategy<Value = Value> {
    json_leaf().prop_recursive(6, 64, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((json_string(), inner), 0..6)
                .prop_map(|fields| Value::Object(fields.into_iter().collect())),
        ]
    })
}

/// A valid encoding of a value: compact, pretty, or padded with JSON whitespace.
fn json_text() -> impl Strategy<Value = String> {
    (json_value(), 0..3u8, "[ \t\r\n]{0,2}", "[ \t\r\n]{0,2}").prop_map(|(v, style, before, after)| match style {
        0 => serde_json::to_string(&v).unwrap(),
        1 => serde_json::to_string_pretty(&v).unwrap(),
        _ => format!("{before}{v}{after}"),
    })
}

/// One byte-level change to a text.
#[derive(Debug, Clone)]
enum Mutation {
    FlipBit(Index, u8),
    Delete(Index, u8),
    Insert(Index, u8),
    Truncate(Index),
    Duplicate(Index, u8),
}

/// Bytes that mean something to a JSON parser.
const INTERESTING: &[u8] = b"[]{}\",:\\/0123456789eE.+-tfnrulbuU \t\n\x00\x1f\x7f\xc3\xa9\xed\xa0\x80\xf0\x9f";

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<Index>(), 0..8u8).prop_map(|(i, bit)| Mutation::FlipBit(i, bit)),
        (any::<Index>(), 1..4u8).prop_map(|(i, n)| Mutation::Delete(i, n)),
        (any::<Index>(), prop_oneof![prop::sample::select(INTERESTING), any::<u8>()])
            .prop_map(|(i, b)| Mutation::Insert(i, b)),
        any::<Index>().prop_map(Mutation::Truncate),
        (any::<Index>(), 1..16u8).prop_map(|(i, n)| Mutation::Duplicate(i, n)),
    ]
}

fn mutate(text: &str, mutations: &[Mutation]) -> String {
    let mut bytes = text.as_bytes().to_vec();
    for m in mutations {
        let at = |i: &Index, extra: usize| i.index(bytes.len() + extra);
        match m {
            Mutation::FlipBit(i, bit) if !bytes.is_empty() => {
                let at = at(i, 0);
                bytes[at] ^= 1 << bit;
            }
            Mutation::Delete(i, n) if !bytes.is_empty() => {
                let start = at(i, 0);
                let end = (start + usize::from(*n)).min(bytes.len());
                bytes.drain(start..end);
            }
            Mutation::Insert(i, b) => {
                let at = at(i, 1);
                bytes.insert(at, *b);
            }
            Mutation::Truncate(i) => {
                let at = at(i, 1);
                bytes.truncate(at);
            }
            Mutation::Duplicate(i, n) if !bytes.is_empty() => {
                let start = at(i, 0);
                let end = (start + usize::from(*n)).min(bytes.len());
                let copy = bytes[start..end].to_vec();
                bytes.splice(end..end, copy);
            }
            _ => {}
        }
    }
    // Payloads are `str`: the mutation that broke UTF-8 shows up as U+FFFD, itself valid text.
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Text close to JSON: a valid encoding with a few byte-level mutations.
fn mutated_json() -> impl Strategy<Value = String> {
    (json_text(), prop::collection::vec(mutation(), 1..4)).prop_map(|(t, ms)| mutate(&t, &ms))
}

/// Short strings of JSON tokens: reach the parser's odd states (`-`, `1e`, `"\u12`, `[,`).
fn json_tokens() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop::sample::select(vec![
            "[",
            "]",
            "{",
            "}",
            ",",
            ":",
            "\"",
            "\\",
            "\\u",
            "\\ud800",
            "\\udc00",
            "d83d",
            "0",
            "1",
            "-",
            "+",
            ".",
            "e",
            "E",
            "999",
            "1e999",
            "-1e999",
            "1e-999",
            "18446744073709551616",
            "true",
            "false",
            "null",
            "nul",
            " ",
            "\n",
            "\u{0}",
            "é",
            "😀",
            "a",
        ]),
        0..24,
    )
    .prop_map(|tokens| tokens.concat())
}

/// Any text a caller might hand to a decoder.
fn any_text() -> impl Strategy<Value = String> {
    prop_oneof![
        2 => json_text(),
        4 => mutated_json(),
        2 => json_tokens(),
        1 => any::<String>(),
        1 => (1..300usize, prop::sample::select(vec![("[", "]"), ("{\"a\":", "}"), ("[{\"k\":[", "]}]")]), any::<bool>())
            .prop_map(|(depth, (open, close), closed)| {
                // Nesting around serde_json's recursion limit (128), closed or not.
                let tail = if closed { close.repeat(depth) } else { String::new() };
                format!("{}0{tail}", open.repeat(depth))
            }),
    ]
}

fn payload() -> impl Strategy<Value = Payload> {
    json_value().prop_map(|v| Payload::encode(&v).unwrap())
}

/// An optional payload, never `Some(null)`: that one encodes as `null` and decodes as `None`
/// (pinned by `an_optional_null_payload_decodes_as_none`).
fn opt_payload() -> impl Strategy<Value = Option<Payload>> {
    prop::option::of(payload()).prop_map(|p| p.filter(|p| p.as_str() != "null"))
}

fn run_id() -> impl Strategy<Value = RunId> {
    prop_oneof!["[a-z0-9:._~-]{1,16}", any::<String>()].prop_map(RunId::from)
}

fn step_error() -> impl Strategy<Value = StepError> {
    (json_string(), prop::option::of(json_string()), any::<bool>()).prop_map(|(message, code, retryable)| StepError {
        message,
        code,
        retryable,
    })
}

fn run() -> impl Strategy<Value = Run> {
    (
        (run_id(), json_string(), any::<u32>(), json_string(), prop::sample::select(RunStatus::ALL.to_vec())),
        (payload(), opt_payload(), prop::option::of(step_error())),
        (prop::collection::vec(json_string(), 0..3), any::<i32>(), prop::option::of((run_id(), any::<u32>()))),
        (any::<u64>(), any::<u64>(), prop::option::of(any::<u64>()), prop::option::of(json_string())),
        (prop::option::of(any::<u64>()), any::<u32>(), any::<u64>()),
    )
        .prop_map(|(a, b, c, d, e)| Run {
            trace_context: None,
            id: a.0,
            workflow: a.1,
            version: a.2,
            namespace: a.3,
            status: a.4,
            input: b.0,
            output: b.1,
            error: b.2,
            tags: c.0,
            priority: c.1,
            parent: c.2.map(|(run_id, seq)| ParentLink { run_id, seq }),
            created_at: d.0,
            updated_at: d.1,
            wake_at: d.2,
            lease_owner: d.3,
            lease_until: e.0,
            recovery_attempts: e.1,
            wake_gen: e.2,
            claims: 0,
        })
}

fn checkpoint() -> impl Strategy<Value = Checkpoint> {
    (
        (run_id(), any::<u32>(), json_string(), prop::sample::select(StepKind::ALL.to_vec())),
        (prop::sample::select(CheckpointStatus::ALL.to_vec()), opt_payload(), opt_payload()),
        (prop::option::of(step_error()), any::<u32>(), prop::option::of(any::<u64>()), any::<u64>(), any::<u64>()),
    )
        .prop_map(|(a, b, c)| {
            let mut cp = Checkpoint::new(a.0, a.1, a.2, a.3, b.0, c.3);
            cp.input = b.1;
            cp.output = b.2;
            cp.error = c.0;
            cp.attempts = c.1;
            cp.wake_at = c.2;
            cp.updated_at = c.4;
            cp
        })
}

fn waiter() -> impl Strategy<Value = Waiter> {
    let kind = prop_oneof![
        json_string().prop_map(|token| WaitKind::Signal { token }),
        (json_string(), payload()).prop_map(|(name, matcher)| WaitKind::Event { name, matcher }),
    ];
    (run_id(), any::<u32>(), json_string(), kind, any::<u64>())
        .prop_map(|(run_id, seq, name, kind, created_at)| Waiter { run_id, seq, name, kind, created_at })
}

// ---------------------------------------------------------------------------------------------
// Checks
// ---------------------------------------------------------------------------------------------

/// JSON's whitespace (RFC 8259): what a parser skips around a value.
fn trim_json_ws(s: &str) -> &str {
    s.trim_matches([' ', '\t', '\n', '\r'])
}

/// A workflow's own input type.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Order {
    id: u64,
    items: Vec<String>,
    #[serde(default)]
    meta: Option<BTreeMap<String, Value>>,
}

/// A struct that embeds payloads, as `Run` and `Checkpoint` do.
#[derive(Debug, Serialize, Deserialize)]
struct Holder {
    p: Payload,
    list: Vec<Payload>,
}

/// Decodes `p` into `T`; if it decodes, its encoding round-trips identically.
fn decodes_stably<T>(p: &Payload)
where
    T: Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
{
    if let Ok(value) = p.decode::<T>() {
        let again = Payload::encode(&value).expect("a decoded value encodes");
        let back: T = again.decode().expect("an encoding decodes");
        assert_eq!(back, value, "{} did not round-trip through {again}", std::any::type_name::<T>());
        assert_eq!(Payload::encode(&back).unwrap(), again, "the second encoding differs");
    }
}

/// Everything that decodes text: no panic, and the guarantees of `Payload`.
fn check_text(text: &str) {
    let accepted = Payload::from_json(text);
    let value = serde_json::from_str::<Value>(text);
    assert_eq!(
        accepted.is_ok(),
        value.is_ok(),
        "from_json and serde_json disagree on {text:?}: from_json {:?}, serde_json {:?}",
        accepted.as_ref().err().map(ToString::to_string),
        value.as_ref().err().map(ToString::to_string),
    );
    let Ok(p) = accepted else { return };
    let value = value.unwrap();
    assert_eq!(p.as_str(), text, "from_json keeps the text as given");
    assert_eq!(p.decode::<Value>().unwrap(), value);
    assert_eq!(p.to_value(), value);
    assert_eq!(p.len(), text.len());
    assert!(!p.is_empty());
    let _ = format!("{p:?} {p}");

    // Serialized, a payload is its text (without the whitespace around it), embedded as is.
    let encoded = serde_json::to_string(&p).expect("a valid payload serializes");
    assert_eq!(encoded, trim_json_ws(text));
    let decoded: Payload = serde_json::from_str(&encoded).unwrap();
    assert_eq!(decoded.as_str(), encoded);
    assert_eq!(serde_json::to_string(&decoded).unwrap(), encoded, "a round-tripped payload encodes identically");
    let holder = Holder { p: p.clone(), list: vec![p.clone(), Payload::null()] };
    let holder_text = serde_json::to_string(&holder).unwrap();
    let holder_back: Holder = serde_json::from_str(&holder_text).expect("an encoded holder decodes");
    assert_eq!(holder_back.p.as_str(), encoded);
    assert_eq!(serde_json::to_string(&holder_back).unwrap(), holder_text);
    // Through a `Value` (as inside internally tagged enums): the value's canonical text.
    let via_value: Payload = serde_json::from_value(value.clone()).unwrap();
    assert_eq!(via_value.to_value(), value);

    // Into a few types: errors, never panics; what decodes re-encodes identically.
    decodes_stably::<Value>(&p);
    decodes_stably::<u64>(&p);
    decodes_stably::<i64>(&p);
    decodes_stably::<f64>(&p);
    decodes_stably::<bool>(&p);
    decodes_stably::<String>(&p);
    decodes_stably::<Option<String>>(&p);
    decodes_stably::<Vec<Value>>(&p);
    decodes_stably::<BTreeMap<String, Value>>(&p);
    decodes_stably::<Order>(&p);
    check_model_text(text);

    // Matching is total and reflexive.
    assert!(json_subset(&value, &value));
    assert!(json_subset(&Value::Object(Default::default()), &value) == value.is_object());
}

/// The model's serde on any text: errors, never panics; what decodes re-encodes identically.
fn check_model_text(text: &str) {
    let p = Payload::from_trusted(text);
    decodes_stably::<Run>(&p);
    decodes_stably::<Checkpoint>(&p);
    decodes_stably::<Waiter>(&p);
    decodes_stably::<StepError>(&p);
    decodes_stably::<ChildResult>(&p);
    decodes_stably::<TaskResult>(&p);
    decodes_stably::<RunStatus>(&p);
    decodes_stably::<StepKind>(&p);
    decodes_stably::<Vec<Checkpoint>>(&p);
}

/// A model value: its encoding decodes to it and encodes identically.
fn check_round_trip<T>(value: &T) -> String
where
    T: Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
{
    let text = serde_json::to_string(value).expect("a model value serializes");
    let back: T = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text} does not decode: {e}"));
    assert_eq!(&back, value);
    assert_eq!(serde_json::to_string(&back).unwrap(), text, "the second encoding differs");
    text
}

/// Every parser of persisted strings on `s`: no panic, and what parses formats back to `s`.
fn check_parsers(s: &str) {
    if let Some(wait) = parse_timeout_name(s) {
        assert_eq!(protocol::timeout_name(wait), s);
    }
    if let Some(step) = parse_undo_name(s) {
        assert_eq!(protocol::undo_name(step), s);
    }
    if let Some(status) = parse_child_failure_code(s) {
        assert_eq!(protocol::child_failure_code(status), s);
    }
    if let Ok(status) = s.parse::<RunStatus>() {
        assert_eq!(status.as_str(), s);
    }
    if let Ok(kind) = s.parse::<StepKind>() {
        assert_eq!(kind.as_str(), s);
    }
    if let Ok(status) = s.parse::<CheckpointStatus>() {
        assert_eq!(status.as_str(), s);
    }
    match RunId::parse(s) {
        Ok(id) => {
            assert_eq!(id.as_str(), s);
            assert!(!s.is_empty() && s.len() <= RunId::MAX_LEN && !s.chars().any(char::is_control));
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
    if let Ok((created_at, id)) = decode_cursor(s) {
        // `<created_at>:<id>`; the time may be spelled `+7` or `007`, the id is kept as is.
        assert_eq!(s.split_once(':').map(|(_, rest)| rest), Some(id.as_str()));
        let canonical = format!("{created_at}:{id}");
        assert_eq!(decode_cursor(&canonical).ok(), Some((created_at, id)));
    }

    let id = RunId::from(s);
    let (root, n) = chain_position(&id);
    if root != s {
        // `<root>~<digits>`, the digits spelling `n` (maybe with leading zeros).
        let digits = s.strip_prefix(root).and_then(|rest| rest.strip_prefix('~')).expect("root~n");
        assert!(!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()), "{s:?}");
        assert_eq!(digits.parse::<u32>().ok(), Some(n), "{s:?}");
    } else {
        assert_eq!(n, 0, "a root is its own chain");
    }
    let next = successor_id(&id);
    // (RunId::parse refuses the empty id, whose successor `~1` is a root. At u32::MAX the
    // position saturates: see the report that introduced this test.)
    if !s.is_empty() && n < u32::MAX {
        assert_ne!(next, id, "{s:?} continues as itself");
        assert_eq!(chain_position(&next), (root, n + 1), "{s:?} -> {next:?}");
    }
    let _ = (id.child(1), id.step_id(1), protocol::retry_id(&id, 1), protocol::continued_marker(&id));
    assert_eq!(protocol::continued_marker(&id).to_value()["$continued_as_new"], Value::String(s.to_string()));
}

// ---------------------------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(config(4_096))]

    /// Payload decoding on arbitrary text, near-JSON text and mutations of valid encodings.
    #[test]
    fn payload_decoding_never_panics_and_agrees_with_serde_json(text in any_text()) {
        check_text(&text);
    }

    /// Persisted-string parsers on arbitrary strings, and on strings shaped like their formats.
    #[test]
    fn protocol_parsers_invert_their_formatters(
        s in prop_oneof![
            any::<String>(),
            "(timeout:|undo:|child_|task:|update:)?[a-z0-9:~._-]{0,12}",
            "[a-z~]{0,4}(~retry)?~[0-9+-]{0,12}",
            "[0-9+-]{0,21}:[a-z:]{0,6}",
        ]
    ) {
        check_parsers(&s);
    }
}

proptest! {
    #![proptest_config(config(512))]

    /// The model's serde: arbitrary values round-trip; mutations of their encodings decode to
    /// an error or to a value that round-trips.
    #[test]
    fn model_serde_round_trips_and_survives_mutation(
        run in run(),
        cp in checkpoint(),
        waiter in waiter(),
        error in step_error(),
        mutations in prop::collection::vec(mutation(), 1..6),
    ) {
        for text in [
            check_round_trip(&run),
            check_round_trip(&cp),
            check_round_trip(&waiter),
            check_round_trip(&error),
            check_round_trip(&vec![cp.clone(), cp.clone()]),
        ] {
            check_model_text(&mutate(&text, &mutations));
            check_text(&mutate(&text, &mutations));
        }
        let child = ChildResult { run_id: run.id.clone(), status: run.status, output: run.output.clone(), error: run.error.clone() };
        check_round_trip(&child);
        assert_eq!(child.encode().decode::<ChildResult>().unwrap(), child);
        check_round_trip(&TaskResult::Ok(run.input.clone()));
        check_round_trip(&TaskResult::Err(error.message.clone()));
        let cursor = encode_cursor(&run);
        // Any id a store holds round-trips; one no store can hold (empty, or with a control
        // character) is refused.
        let id = run.id.as_str();
        if id.is_empty() || id.chars().any(char::is_control) {
            assert!(decode_cursor(&cursor).is_err(), "{cursor:?}");
        } else {
            assert_eq!(decode_cursor(&cursor).unwrap(), (run.created_at, run.id.clone()));
        }
    }

    /// Matching never panics, is reflexive, and a matcher made of a payload's own fields matches it.
    #[test]
    fn json_subset_is_total(matcher in json_value(), payload in json_value(), keep in any::<Index>()) {
        let _ = json_subset(&matcher, &payload);
        prop_assert!(json_subset(&payload, &payload));
        if let Value::Object(fields) = &payload {
            // A matcher with a subset of the payload's fields matches it.
            let n = keep.index(fields.len() + 1);
            let sub: serde_json::Map<String, Value> = fields.iter().take(n).map(|(k, v)| (k.clone(), v.clone())).collect();
            prop_assert!(json_subset(&Value::Object(sub), &payload));
        }
        if json_subset(&matcher, &payload) && !matcher.is_object() {
            prop_assert_eq!(&matcher, &payload);
        }
    }
}

/// Hostile inputs that random generation is unlikely to hit, each checked like fuzzed text.
#[test]
fn hostile_payloads() {
    let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
    for text in [
        deep(127),
        deep(128),
        deep(129),
        deep(100_000),
        "[".repeat(100_000),
        format!("{}1{}", "{\"a\":".repeat(5_000), "}".repeat(5_000)),
        "1e999".into(),
        "-1e999".into(),
        "1e-999".into(),
        "18446744073709551616".into(),
        "-9223372036854775809".into(),
        "\"\\ud800\"".into(),
        "\"\\udc00\\ud800\"".into(),
        "\"\\ud83d\\ude00\"".into(),
        "\"\u{0}\"".into(),
        "\u{feff}{}".into(),
        format!("\"{}\"", "x".repeat(1 << 20)),
        String::new(),
        " ".into(),
        "nul".into(),
    ] {
        check_text(&text);
        check_parsers(&text);
    }
}

/// `Option<Payload>` cannot tell `Some(null)` from `None` in JSON: both encode as `null`, which
/// decodes as `None`. Readers treat the two alike (a completed child without an output joins
/// as `null`); the encoding is the same text either way.
#[test]
fn an_optional_null_payload_decodes_as_none() {
    let with_null = ChildResult {
        run_id: RunId::from("c"),
        status: RunStatus::Completed,
        output: Some(Payload::null()),
        error: None,
    };
    let text = serde_json::to_string(&with_null).unwrap();
    let back: ChildResult = serde_json::from_str(&text).unwrap();
    assert_eq!(back.output, None);
    assert_eq!(serde_json::to_string(&back).unwrap(), text);
}
