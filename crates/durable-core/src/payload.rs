//! JSON payloads: inputs, outputs, signal bodies. Kept as text and decoded lazily.

use std::fmt;
use std::sync::Arc;

use serde::de::{DeserializeOwned, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A JSON document kept as its text.
///
/// Payloads are stored and replayed as text and only decoded when the workflow asks for the
/// value, so loading a long history costs no JSON parsing. Cheap to clone (shared string).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Payload(Arc<str>);

impl Payload {
    /// Serializes a value to a payload.
    pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Self, serde_json::Error> {
        Ok(Payload(serde_json::to_string(value)?.into()))
    }

    /// Serializes a value that will be decoded back into `T` (a step's output, a recorded
    /// value): [`encode`](Self::encode), then, when the text holds a `null`, a decode into `T`,
    /// so a value that does not survive its JSON form is refused now rather than when a replay
    /// decodes it. serde_json writes NaN and infinite floats as `null`: an `f64` holding one
    /// does not decode back (an `Option<f64>` decodes as `None`, which this cannot tell).
    /// Text without a `null` is not decoded. The error says why, to follow "does not serialize:".
    pub fn encode_replayable<T: Serialize + DeserializeOwned>(value: &T) -> Result<Self, String> {
        let payload = Payload::encode(value).map_err(|e| e.to_string())?;
        if payload.0.contains("null")
            && let Err(e) = payload.decode::<T>()
        {
            return Err(format!(
                "its JSON form {:.80} does not decode back into its type ({e}); serde_json writes NaN and infinite \
                 floats as null",
                payload.0
            ));
        }
        Ok(payload)
    }

    /// Parses JSON text, refusing text that is not a single valid JSON document.
    ///
    /// It accepts exactly what `serde_json` decodes into a [`serde_json::Value`], so an accepted
    /// payload always decodes: numbers out of `f64`'s range (`1e999`), strings with a lone UTF-16
    /// surrogate escape (`"\ud800"`) and nesting deeper than serde_json's limit (128) are
    /// refused. The text is kept as given; checking it allocates nothing but the buffer of a
    /// string with escapes.
    pub fn from_json(text: impl Into<Arc<str>>) -> Result<Self, serde_json::Error> {
        let text = text.into();
        serde_json::from_str::<Valid>(&text)?;
        Ok(Payload(text))
    }

    /// Wraps JSON text a store wrote itself, without re-validating it.
    pub fn from_trusted(text: impl Into<Arc<str>>) -> Self {
        Payload(text.into())
    }

    /// The JSON `null` payload.
    pub fn null() -> Self {
        Payload("null".into())
    }

    /// Decodes the payload into `T`.
    pub fn decode<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_str(&self.0)
    }

    /// Decodes the payload into a generic JSON value.
    pub fn to_value(&self) -> serde_json::Value {
        serde_json::from_str(&self.0).unwrap_or(serde_json::Value::Null)
    }

    /// The JSON text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The size of the JSON text in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the text is empty (never true for a valid payload).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Payload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.len() > 200 {
            let cut = (0..=200).rev().find(|i| self.0.is_char_boundary(*i)).unwrap_or(0);
            write!(f, "{}… ({} bytes)", &self.0[..cut], self.0.len())
        } else {
            f.write_str(&self.0)
        }
    }
}

impl fmt::Display for Payload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Serialize for Payload {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let raw: &serde_json::value::RawValue = serde_json::from_str(&self.0).map_err(serde::ser::Error::custom)?;
        raw.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Payload {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = Box::<serde_json::value::RawValue>::deserialize(deserializer)?;
        Ok(Payload(raw.get().into()))
    }
}

/// A JSON document checked as [`serde_json::Value`] would be and then thrown away.
///
/// Unlike [`serde::de::IgnoredAny`], which serde_json skips over without decoding (so it lets
/// `1e999`, `"\ud800"` and unlimited nesting through), every value is decoded: numbers are
/// range-checked, escapes decoded, and nesting counts against serde_json's recursion limit.
struct Valid;

impl<'de> Deserialize<'de> for Valid {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(Valid)
    }
}

impl<'de> Visitor<'de> for Valid {
    type Value = Valid;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Valid, E> {
        Ok(Valid)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Valid, E> {
        Ok(Valid)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Valid, E> {
        Ok(Valid)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Valid, E> {
        Ok(Valid)
    }

    fn visit_str<E>(self, _: &str) -> Result<Valid, E> {
        Ok(Valid)
    }

    fn visit_unit<E>(self) -> Result<Valid, E> {
        Ok(Valid)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Valid, A::Error> {
        while seq.next_element::<Valid>()?.is_some() {}
        Ok(Valid)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Valid, A::Error> {
        while map.next_entry::<Valid, Valid>()?.is_some() {}
        Ok(Valid)
    }
}

/// Whether `payload` matches `matcher`: every field of the matcher object is present in the
/// payload with an equal value, recursively for nested objects (a JSON subset test).
///
/// A non-object matcher matches a payload equal to it. The empty object matches every object
/// payload (not a number, string or array: match those with an equal matcher).
pub fn json_subset(matcher: &serde_json::Value, payload: &serde_json::Value) -> bool {
    match (matcher, payload) {
        (serde_json::Value::Object(m), serde_json::Value::Object(p)) => {
            m.iter().all(|(k, mv)| p.get(k).is_some_and(|pv| json_subset(mv, pv)))
        }
        (m, p) => m == p,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn round_trip_and_validation() {
        let p = Payload::encode(&json!({"a": [1, 2]})).unwrap();
        assert_eq!(p.as_str(), r#"{"a":[1,2]}"#);
        assert_eq!(p.decode::<serde_json::Value>().unwrap(), json!({"a": [1, 2]}));
        assert!(Payload::from_json("{not json").is_err());
        assert!(Payload::from_json("1 2").is_err());
        // Only what decodes into a serde_json::Value: numbers in range, no lone surrogate,
        // nesting within serde_json's limit.
        for text in ["1e999", "-1e999", r#""\ud800""#, r#"{"a":"\udc00"}"#, &"[".repeat(100_000)] {
            assert!(Payload::from_json(text).is_err(), "{text:.20}");
        }
        let deep = |n| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert!(Payload::from_json(deep(127)).unwrap().decode::<serde_json::Value>().is_ok());
        assert!(Payload::from_json(deep(128)).is_err());
        assert!(Payload::from_json(r#"{"a":1,"a":2}"#).is_ok());
        // A float decodes to exactly the f64 that was encoded.
        let x = 1.761_674_251_393_938_7e-63_f64;
        assert_eq!(Payload::encode(&x).unwrap().decode::<f64>().unwrap().to_bits(), x.to_bits());
        let nested = serde_json::to_string(&json!({"p": p})).unwrap();
        assert_eq!(nested, r#"{"p":{"a":[1,2]}}"#);
    }

    #[test]
    fn a_value_that_does_not_decode_back_is_refused_before_it_is_recorded() {
        assert_eq!(Payload::encode_replayable(&1.5f64).unwrap().as_str(), "1.5");
        assert_eq!(Payload::encode_replayable(&None::<u32>).unwrap().as_str(), "null");
        for bad in [f64::NAN, f64::INFINITY] {
            let e = Payload::encode_replayable(&bad).unwrap_err();
            assert!(e.contains("null") && e.contains("NaN"), "{e}");
            let e = Payload::encode_replayable(&vec![1.0, bad]).unwrap_err();
            assert!(e.contains("[1.0,null]"), "{e}");
        }
        // What serde_json cannot tell apart is let through.
        assert_eq!(Payload::encode_replayable(&Some(f64::NAN)).unwrap().as_str(), "null");
    }

    #[test]
    fn subset_matching() {
        let payload = json!({"order_id": 42, "kind": "paid", "meta": {"a": 1, "b": 2}});
        assert!(json_subset(&json!({}), &payload));
        assert!(json_subset(&json!({"order_id": 42}), &payload));
        assert!(json_subset(&json!({"meta": {"a": 1}}), &payload));
        assert!(!json_subset(&json!({"order_id": 43}), &payload));
        assert!(!json_subset(&json!({"missing": null}), &payload));
        assert!(!json_subset(&json!({"order_id": 42}), &json!(42)));
    }
}
