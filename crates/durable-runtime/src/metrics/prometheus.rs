//! [`PrometheusRecorder`]: a `metrics` recorder that renders the Prometheus text format.

use std::collections::{BTreeMap, HashMap};
use std::fmt::{self, Write};
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use ::metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder, SetRecorderError,
    SharedString, Unit,
};
use parking_lot::RwLock;

use super::{BATCH_BUCKETS, SECONDS_BUCKETS, STORE_COMMIT_BATCH_SIZE};

/// Buckets of a histogram that is neither one of the engine's nor named `…_seconds`: the
/// Prometheus client libraries' default.
const DEFAULT_BUCKETS: &[f64] = &[0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// The series of one kind are spread over this many maps, each behind its own lock, so threads
/// recording different series rarely touch the same lock word.
const SHARDS: usize = 8;

/// A [`metrics::Recorder`] that keeps every series in memory and renders it as the Prometheus
/// text exposition format (version 0.0.4), without an exporter crate: `durable serve`'s
/// `/metrics`, or the endpoint of your own application.
///
/// - Counters are atomic `u64`s, gauges `f64`s in an atomic, histograms fixed buckets with a
///   sum and a count. Recording looks the series up under a read lock (the series are spread
///   over a few shards), then does atomic operations; only the first sample of a series takes
///   a write lock.
/// - Histogram buckets are chosen by the metric's name: [`SECONDS_BUCKETS`] for the engine's
///   `_seconds` histograms (and any other name ending in `_seconds`), [`BATCH_BUCKETS`] for
///   [`STORE_COMMIT_BATCH_SIZE`], otherwise the Prometheus clients' default (5 ms to 10 s).
/// - [`render`](Self::render) writes the families sorted by name and each family's series
///   sorted by labels: `# HELP` (from the `describe_*` calls; the unit is not rendered),
///   `# TYPE`, then the samples; a histogram's `_bucket` lines are cumulative and end with
///   `le="+Inf"`, then `_sum` and `_count`. Names are sanitized (a character Prometheus does
///   not allow becomes `_`), label values escaped (`\`, `"`, newline). A name is one kind of
///   metric: record a name as a counter and a gauge and both families are rendered, which
///   a scraper rejects.
///
/// Clones share the series. [`install`](Self::install) makes it the process's global recorder;
/// install it before building the engine, which describes its metrics when it is built. In a
/// test, record into one of its own on the test's thread with `metrics::with_local_recorder`:
///
/// ```
/// use durable_runtime::metrics::{PrometheusRecorder, RUNS_STARTED};
///
/// let recorder = PrometheusRecorder::new();
/// metrics::with_local_recorder(&recorder, || {
///     metrics::counter!(RUNS_STARTED, "workflow" => "checkout").increment(2);
/// });
/// assert_eq!(
///     recorder.render(),
///     "# TYPE durable_runs_started_total counter\n\
///      durable_runs_started_total{workflow=\"checkout\"} 2\n"
/// );
/// ```
#[derive(Clone, Default)]
pub struct PrometheusRecorder {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    counters: Series<AtomicCounter>,
    gauges: Series<AtomicGauge>,
    histograms: Series<Buckets>,
    /// Help texts by sanitized name.
    help: RwLock<HashMap<String, SharedString>>,
}

impl PrometheusRecorder {
    /// An empty recorder, not installed.
    pub fn new() -> Self {
        Self::default()
    }

    /// Installs a clone of this recorder as the `metrics` facade's global recorder (what
    /// every thread without a local recorder records into); keep `self` to render it.
    ///
    /// # Errors
    ///
    /// A global recorder is installed already (there is one per process, set once); nothing
    /// recorded through the facade reaches this one then.
    pub fn install(&self) -> Result<(), SetRecorderError<PrometheusRecorder>> {
        ::metrics::set_global_recorder(self.clone())
    }

    /// Everything recorded so far, as Prometheus text (see the [type docs](Self)).
    pub fn render(&self) -> String {
        let inner = &*self.inner;
        let mut families: BTreeMap<(String, &str), Vec<(String, Sample)>> = BTreeMap::new();
        let mut add = |key: &Key, kind, sample| {
            families.entry((sanitize(key.name(), true), kind)).or_default().push((labels(key), sample));
        };
        for (key, c) in inner.counters.all() {
            add(&key, "counter", Sample::Counter(c.0.load(Relaxed)));
        }
        for (key, g) in inner.gauges.all() {
            add(&key, "gauge", Sample::Gauge(f64::from_bits(g.0.load(Relaxed))));
        }
        for (key, h) in inner.histograms.all() {
            let counts = h.counts.iter().map(|n| n.load(Relaxed)).collect();
            add(
                &key,
                "histogram",
                Sample::Histogram { bounds: h.bounds, counts, sum: f64::from_bits(h.sum.load(Relaxed)) },
            );
        }
        let help = inner.help.read();
        let mut out = String::new();
        for ((name, kind), mut series) in families {
            series.sort_by(|a, b| a.0.cmp(&b.0));
            if let Some(text) = help.get(&name) {
                let _ = writeln!(out, "# HELP {name} {}", text.replace('\\', "\\\\").replace('\n', "\\n"));
            }
            let _ = writeln!(out, "# TYPE {name} {kind}");
            for (labels, sample) in series {
                let braced = if labels.is_empty() { String::new() } else { format!("{{{labels}}}") };
                match sample {
                    Sample::Counter(v) => {
                        let _ = writeln!(out, "{name}{braced} {v}");
                    }
                    Sample::Gauge(v) => {
                        let _ = writeln!(out, "{name}{braced} {}", Number(v));
                    }
                    Sample::Histogram { bounds, counts, sum } => {
                        let comma = if labels.is_empty() { "" } else { "," };
                        let mut cumulative = 0;
                        let bounds = bounds.iter().map(|le| Number(*le).to_string()).chain(["+Inf".to_string()]);
                        for (le, n) in bounds.zip(counts) {
                            cumulative += n;
                            let _ = writeln!(out, "{name}_bucket{{{labels}{comma}le=\"{le}\"}} {cumulative}");
                        }
                        let _ = writeln!(out, "{name}_sum{braced} {}", Number(sum));
                        let _ = writeln!(out, "{name}_count{braced} {cumulative}");
                    }
                }
            }
        }
        out
    }

    fn describe(&self, key: &KeyName, description: SharedString) {
        self.inner.help.write().entry(sanitize(key.as_str(), true)).or_insert(description);
    }
}

impl fmt::Debug for PrometheusRecorder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PrometheusRecorder").finish_non_exhaustive()
    }
}

impl Recorder for PrometheusRecorder {
    fn describe_counter(&self, key: KeyName, _unit: Option<Unit>, description: SharedString) {
        self.describe(&key, description);
    }

    fn describe_gauge(&self, key: KeyName, _unit: Option<Unit>, description: SharedString) {
        self.describe(&key, description);
    }

    fn describe_histogram(&self, key: KeyName, _unit: Option<Unit>, description: SharedString) {
        self.describe(&key, description);
    }

    fn register_counter(&self, key: &Key, _metadata: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.inner.counters.get(key, AtomicCounter::default))
    }

    fn register_gauge(&self, key: &Key, _metadata: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(self.inner.gauges.get(key, AtomicGauge::default))
    }

    fn register_histogram(&self, key: &Key, _metadata: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(self.inner.histograms.get(key, || Buckets::new(buckets(key.name()))))
    }
}

/// The buckets of histogram `name` (see [`PrometheusRecorder`]).
fn buckets(name: &str) -> &'static [f64] {
    if name == STORE_COMMIT_BATCH_SIZE {
        BATCH_BUCKETS
    } else if name.ends_with("_seconds") {
        SECONDS_BUCKETS
    } else {
        DEFAULT_BUCKETS
    }
}

/// One series' value, read for a render.
enum Sample {
    Counter(u64),
    Gauge(f64),
    Histogram { bounds: &'static [f64], counts: Vec<u64>, sum: f64 },
}

/// A name as Prometheus allows it: `[a-zA-Z_:][a-zA-Z0-9_:]*` for a metric (`colon`), without
/// the colons for a label; any other character becomes `_`, a leading digit gets a `_` before it.
fn sanitize(name: &str, colon: bool) -> String {
    let mut out = String::with_capacity(name.len() + 1);
    if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
        out.push('_');
    }
    out.extend(
        name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' || (colon && c == ':') { c } else { '_' }),
    );
    out
}

/// A series' labels as `k="v",…` in the order they were given, values escaped.
fn labels(key: &Key) -> String {
    let mut out = String::new();
    for (i, label) in key.labels().enumerate() {
        let value = label.value().replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n");
        let _ = write!(out, "{}{}=\"{value}\"", if i == 0 { "" } else { "," }, sanitize(label.key(), false));
    }
    out
}

/// A sample value as the text format spells it (`+Inf`, `-Inf`, `NaN`, else the shortest
/// decimal that reads back as the same `f64`).
struct Number(f64);

impl fmt::Display for Number {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            v if v.is_nan() => f.write_str("NaN"),
            f64::INFINITY => f.write_str("+Inf"),
            f64::NEG_INFINITY => f.write_str("-Inf"),
            v => write!(f, "{v}"),
        }
    }
}

/// Passes through the hash a [`Key`] computed when it was built (its `Hash` writes just that
/// `u64`); other writes are folded in (FNV-1a), so any key hashes correctly.
#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 ^= n;
    }
}

type KeyMap<T> = HashMap<Key, Arc<T>, BuildHasherDefault<KeyHasher>>;

/// The series of one kind, by key.
struct Series<T> {
    shards: [RwLock<KeyMap<T>>; SHARDS],
}

impl<T> Default for Series<T> {
    fn default() -> Self {
        Series { shards: std::array::from_fn(|_| RwLock::default()) }
    }
}

impl<T> Series<T> {
    /// The series of `key`, created by `new` on its first use.
    fn get(&self, key: &Key, new: impl FnOnce() -> T) -> Arc<T> {
        // The middle bits: the map uses the low ones for its slot and the top ones for its tags.
        let hash = BuildHasherDefault::<KeyHasher>::default().hash_one(key);
        let shard = &self.shards[(hash >> 32) as usize % SHARDS];
        if let Some(series) = shard.read().get(key) {
            return Arc::clone(series);
        }
        Arc::clone(shard.write().entry(key.clone()).or_insert_with(|| Arc::new(new())))
    }

    /// Every series (the locks are held one shard at a time).
    fn all(&self) -> Vec<(Key, Arc<T>)> {
        self.shards
            .iter()
            .flat_map(|s| s.read().iter().map(|(k, v)| (k.clone(), Arc::clone(v))).collect::<Vec<_>>())
            .collect()
    }
}

#[derive(Default)]
struct AtomicCounter(AtomicU64);

impl CounterFn for AtomicCounter {
    fn increment(&self, value: u64) {
        self.0.fetch_add(value, Relaxed);
    }

    fn absolute(&self, value: u64) {
        self.0.fetch_max(value, Relaxed);
    }
}

/// An `f64`'s bits.
#[derive(Default)]
struct AtomicGauge(AtomicU64);

/// Adds `delta` to the `f64` whose bits `cell` holds.
fn add_f64(cell: &AtomicU64, delta: f64) {
    let _ = cell.fetch_update(Relaxed, Relaxed, |bits| Some((f64::from_bits(bits) + delta).to_bits()));
}

impl GaugeFn for AtomicGauge {
    fn increment(&self, value: f64) {
        add_f64(&self.0, value);
    }

    fn decrement(&self, value: f64) {
        add_f64(&self.0, -value);
    }

    fn set(&self, value: f64) {
        self.0.store(value.to_bits(), Relaxed);
    }
}

/// A histogram: per bucket the samples that fell in it (not cumulative; the last slot is
/// above every bound), and the sum (`f64` bits). The count is the slots' total, so a render
/// always shows `+Inf` equal to `_count`.
struct Buckets {
    bounds: &'static [f64],
    counts: Box<[AtomicU64]>,
    sum: AtomicU64,
}

impl Buckets {
    fn new(bounds: &'static [f64]) -> Self {
        Buckets { bounds, counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(), sum: AtomicU64::new(0) }
    }
}

impl HistogramFn for Buckets {
    fn record(&self, value: f64) {
        self.record_many(value, 1);
    }

    fn record_many(&self, value: f64, count: usize) {
        // The first bucket whose bound is at least the value (`le`: less or equal); NaN is
        // above every bound.
        let slot = if value.is_nan() { self.bounds.len() } else { self.bounds.partition_point(|le| *le < value) };
        self.counts[slot].fetch_add(count as u64, Relaxed);
        add_f64(&self.sum, value * count as f64);
    }
}

#[cfg(test)]
mod tests {
    use ::metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};

    use super::*;
    use crate::metrics::{STEP_DURATION, TASKS};

    fn recorded(f: impl FnOnce()) -> String {
        let recorder = PrometheusRecorder::new();
        ::metrics::with_local_recorder(&recorder, f);
        let text = recorder.render();
        check_format(&text);
        text
    }

    #[test]
    fn a_counter_renders_with_its_help_type_and_series_sorted_by_labels() {
        let text = recorded(|| {
            describe_counter!(TASKS, Unit::Count, "Remote-step attempts.\nBy queue \\ outcome.");
            counter!(TASKS, "queue" => "mail", "outcome" => "failed").increment(1);
            counter!(TASKS, "queue" => "echo", "outcome" => "completed").increment(2);
            // The same series, labels in another order.
            counter!(TASKS, "outcome" => "completed", "queue" => "echo").increment(3);
            counter!("requests").absolute(7);
            counter!("requests").absolute(5);
        });
        assert_eq!(
            text,
            "# HELP durable_tasks_total Remote-step attempts.\\nBy queue \\\\ outcome.\n\
             # TYPE durable_tasks_total counter\n\
             durable_tasks_total{queue=\"echo\",outcome=\"completed\"} 5\n\
             durable_tasks_total{queue=\"mail\",outcome=\"failed\"} 1\n\
             # TYPE requests counter\n\
             requests 7\n"
        );
    }

    #[test]
    fn a_gauge_renders_its_last_value_and_sanitized_names() {
        let text = recorded(|| {
            describe_gauge!("queue.depth", "Tasks waiting.");
            gauge!("queue.depth", "queue-name" => "a").set(4.0);
            gauge!("queue.depth", "queue-name" => "a").increment(1.5);
            gauge!("queue.depth", "queue-name" => "b").decrement(2.25);
            gauge!("9lives:x").set(f64::INFINITY);
            gauge!("temperature").set(f64::NAN);
        });
        assert_eq!(
            text,
            "# TYPE _9lives:x gauge\n\
             _9lives:x +Inf\n\
             # HELP queue_depth Tasks waiting.\n\
             # TYPE queue_depth gauge\n\
             queue_depth{queue_name=\"a\"} 5.5\n\
             queue_depth{queue_name=\"b\"} -2.25\n\
             # TYPE temperature gauge\n\
             temperature NaN\n"
        );
    }

    #[test]
    fn a_histogram_renders_cumulative_buckets_sum_and_count_with_escaped_labels() {
        let text = recorded(|| {
            describe_histogram!("payload_bytes", Unit::Bytes, "Payload size.");
            let odd = "a \"quoted\" \\path\\\nnext line";
            // Sums exact in binary.
            histogram!("payload_bytes", "source" => odd).record(0.03125);
            histogram!("payload_bytes", "source" => odd).record(0.00390625);
            histogram!("payload_bytes", "source" => odd).record(7.0);
            histogram!("payload_bytes", "source" => odd).record(100.0);
            histogram!("payload_bytes").record_many(1.0, 3);
        });
        let series = |labels: &str, counts: [u64; 12], sum: &str, count: u64| {
            let les = ["0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1", "2.5", "5", "10", "+Inf"];
            let comma = if labels.is_empty() { "" } else { "," };
            let mut s = String::new();
            for (le, n) in les.iter().zip(counts) {
                s += &format!("payload_bytes_bucket{{{labels}{comma}le=\"{le}\"}} {n}\n");
            }
            let braced = if labels.is_empty() { String::new() } else { format!("{{{labels}}}") };
            s + &format!("payload_bytes_sum{braced} {sum}\npayload_bytes_count{braced} {count}\n")
        };
        let expected = "# HELP payload_bytes Payload size.\n# TYPE payload_bytes histogram\n".to_string()
            + &series("", [0, 0, 0, 0, 0, 0, 0, 3, 3, 3, 3, 3], "3", 3)
            + &series(
                r#"source="a \"quoted\" \\path\\\nnext line""#,
                [1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 3, 4],
                "107.03515625",
                4,
            );
        assert_eq!(text, expected);
    }

    #[test]
    fn the_engine_histograms_take_the_buckets_of_their_names() {
        let text = recorded(|| {
            histogram!(STEP_DURATION).record(0.2);
            histogram!(STORE_COMMIT_BATCH_SIZE).record(3.0);
            histogram!("my_wait_seconds").record(400.0);
        });
        let les = |name: &str| -> Vec<f64> {
            text.lines()
                .filter_map(|l| l.strip_prefix(&format!("{name}_bucket{{le=\"")))
                .filter_map(|rest| rest.split('"').next()?.parse().ok())
                .filter(|le: &f64| le.is_finite())
                .collect()
        };
        assert_eq!(les(STEP_DURATION), SECONDS_BUCKETS);
        assert_eq!(les(STORE_COMMIT_BATCH_SIZE), BATCH_BUCKETS);
        assert_eq!(les("my_wait_seconds"), SECONDS_BUCKETS);
        assert!(text.contains("durable_store_commit_batch_size_bucket{le=\"2\"} 0\n"), "{text}");
        assert!(text.contains("durable_store_commit_batch_size_bucket{le=\"4\"} 1\n"), "{text}");
        assert!(text.contains("my_wait_seconds_bucket{le=\"300\"} 0\nmy_wait_seconds_bucket{le=\"+Inf\"} 1\n"));
    }

    #[test]
    fn the_render_does_not_depend_on_the_order_of_registration() {
        let record = |names: &[&'static str]| {
            recorded(|| {
                for name in names {
                    counter!(*name, "k" => *name).increment(1);
                    counter!("shared", "k" => *name).increment(1);
                    histogram!("h", "k" => *name).record(1.0);
                }
            })
        };
        let names = ["c", "a", "d", "b", "e", "f", "g", "h2", "i", "j"];
        let mut reversed = names;
        reversed.reverse();
        assert_eq!(record(&names), record(&reversed));
    }

    #[test]
    fn threads_recording_the_same_series_lose_nothing() {
        let recorder = PrometheusRecorder::new();
        std::thread::scope(|s| {
            for t in 0..4 {
                let recorder = &recorder;
                s.spawn(move || {
                    ::metrics::with_local_recorder(recorder, || {
                        for i in 0..10_000 {
                            counter!("hits", "shard" => (i % 3).to_string()).increment(1);
                            histogram!("took_seconds").record(f64::from(t));
                            gauge!("level").increment(0.5);
                        }
                    });
                });
            }
        });
        let text = recorder.render();
        check_format(&text);
        let value = |series: &str| -> f64 {
            text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok()).expect(series)
        };
        let hits: f64 = (0..3).map(|i| value(&format!("hits{{shard=\"{i}\"}}"))).sum();
        assert_eq!(hits, 40_000.0);
        assert_eq!(value("took_seconds_count"), 40_000.0);
        assert_eq!(value("took_seconds_sum"), 60_000.0);
        assert_eq!(value("level"), 20_000.0);
    }

    #[test]
    fn a_recorder_without_samples_renders_nothing() {
        assert_eq!(recorded(crate::metrics::describe), "");
    }

    /// Reads `text` line by line as the text exposition format (0.0.4) says, and panics where
    /// it does not: `# HELP` and `# TYPE` once per family and before its samples, names and
    /// label names of the allowed characters, label values quoted with only `\\`, `\"` and
    /// `\n` escapes, values that parse as floats; a histogram's buckets rising and cumulative,
    /// ending with `+Inf` equal to its `_count`.
    fn check_format(text: &str) {
        fn name_ok(name: &str, colon: bool) -> bool {
            let ok = |c: char| c.is_ascii_alphanumeric() || c == '_' || (colon && c == ':');
            !name.is_empty() && !name.starts_with(|c: char| c.is_ascii_digit()) && name.chars().all(ok)
        }
        fn value(v: &str) -> f64 {
            match v {
                "+Inf" => f64::INFINITY,
                "-Inf" => f64::NEG_INFINITY,
                "NaN" => f64::NAN,
                v => v.parse().unwrap_or_else(|_| panic!("{v:?} is not a float")),
            }
        }
        /// `{k="v",…}` → the pairs, unescaped.
        fn labels(mut s: &str) -> Vec<(String, String)> {
            let mut out = Vec::new();
            while !s.is_empty() {
                let (key, rest) = s.split_once("=\"").expect("label=\"value\"");
                assert!(name_ok(key, false), "label name {key:?}");
                let mut value = String::new();
                let mut chars = rest.char_indices();
                let end = loop {
                    match chars.next().expect("a closing quote") {
                        (i, '"') => break i,
                        (_, '\\') => value.push(match chars.next().expect("an escaped character").1 {
                            '\\' => '\\',
                            '"' => '"',
                            'n' => '\n',
                            c => panic!("escape \\{c}"),
                        }),
                        (_, '\n') => panic!("a raw newline in a label value"),
                        (_, c) => value.push(c),
                    }
                };
                out.push((key.to_string(), value));
                s = &rest[end + 1..];
                s = s.strip_prefix(',').unwrap_or(s);
                assert!(s.is_empty() || !s.starts_with(','), "{s}");
            }
            out
        }
        let mut types: HashMap<String, String> = HashMap::new();
        let mut helped: Vec<String> = Vec::new();
        let mut sampled: Vec<String> = Vec::new();
        // A histogram series' buckets so far, by family and labels without `le`: the last le
        // and count.
        let mut buckets: HashMap<String, (f64, f64)> = HashMap::new();
        assert!(text.is_empty() || text.ends_with('\n'));
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let (name, help) = rest.split_once(' ').expect("# HELP name text");
                assert!(name_ok(name, true) && !helped.contains(&name.to_string()), "{line}");
                assert!(!sampled.iter().any(|s| s == name), "HELP after the samples: {line}");
                assert!(!help.replace("\\\\", "").replace("\\n", "").contains('\\'), "{line}");
                helped.push(name.to_string());
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').expect("# TYPE name kind");
                assert!(["counter", "gauge", "histogram"].contains(&kind), "{line}");
                assert!(types.insert(name.to_string(), kind.to_string()).is_none(), "TYPE twice: {line}");
                assert!(!sampled.iter().any(|s| s == name), "TYPE after the samples: {line}");
            } else {
                assert!(!line.starts_with('#') && !line.is_empty(), "{line:?}");
                let (series, v) = line.rsplit_once(' ').expect("series value");
                let v = value(v);
                let (name, labels) = match series.split_once('{') {
                    Some((name, rest)) => (name, labels(rest.strip_suffix('}').expect("a closing brace"))),
                    None => (series, Vec::new()),
                };
                assert!(name_ok(name, true), "{line}");
                let family = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|s| name.strip_suffix(s).filter(|f| types.get(*f).is_some_and(|k| k == "histogram")))
                    .unwrap_or(name);
                assert!(types.contains_key(family), "no TYPE before {line}");
                if !sampled.iter().any(|s| s == family) {
                    sampled.push(family.to_string());
                }
                assert_eq!(sampled.last().map(String::as_str), Some(family), "families interleaved: {line}");
                if types[family] == "histogram" {
                    let mut rest: Vec<(String, String)> = labels.iter().filter(|(k, _)| k != "le").cloned().collect();
                    rest.sort();
                    let at = buckets.entry(format!("{family}{rest:?}")).or_insert((f64::NEG_INFINITY, 0.0));
                    if name.ends_with("_bucket") {
                        let le = value(&labels.last().filter(|(k, _)| k == "le").expect("le last").1);
                        assert!(le > at.0 && v >= at.1, "buckets rise: {line}");
                        *at = (le, v);
                    } else if name.ends_with("_count") {
                        assert_eq!(*at, (f64::INFINITY, v), "+Inf is the count: {line}");
                    }
                }
            }
        }
    }

    #[test]
    fn the_format_check_rejects_what_the_format_forbids() {
        for bad in [
            "x 1\n",
            "# TYPE x counter\nx{a=\"b\\t\"} 1\n",
            "# TYPE x counter\nx one\n",
            "# TYPE x histogram\nx_bucket{le=\"1\"} 2\nx_bucket{le=\"+Inf\"} 1\nx_sum 1\nx_count 1\n",
            "# TYPE x histogram\nx_bucket{le=\"+Inf\"} 2\nx_sum 1\nx_count 1\n",
            "# TYPE x gauge\n# TYPE x counter\nx 1\n",
        ] {
            assert!(std::panic::catch_unwind(|| check_format(bad)).is_err(), "accepted {bad:?}");
        }
    }
}
