//! Latency histograms and counters, and their two renderings: STATS lines (`name value`)
//! and the Prometheus text format (`GET /metrics` on the admin port).
//!
//! Each executor records into its own [`ExecutorMetrics`] (one uncontended mutex, taken
//! once per request by the executor that owns it; a STATS or a scrape takes it briefly
//! to copy). Readers merge the executors' histograms into a [`Snapshot`].
//!
//! Latencies are HdrHistograms of nanoseconds with 2 significant digits (1% precision,
//! about 30 KB each), from the moment the connection layer decoded the request to the
//! moment the service has its reply.

// The one lock here is per executor and off the engine's read path (see above).

use std::fmt::Write;
use std::sync::Mutex;
use std::time::Duration;

use hdrhistogram::Histogram;
use shards::floor::FloorState;

/// Service operations with their own latency histogram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    Search,
    Insert,
    Delete,
    Fill,
    Flush,
    Stats,
}

impl Op {
    pub(crate) const ALL: [Op; 6] = [
        Op::Search,
        Op::Insert,
        Op::Delete,
        Op::Fill,
        Op::Flush,
        Op::Stats,
    ];
    pub(crate) fn name(self) -> &'static str {
        match self {
            Op::Search => "search",
            Op::Insert => "insert",
            Op::Delete => "delete",
            Op::Fill => "fill",
            Op::Flush => "flush",
            Op::Stats => "stats",
        }
    }
}

/// Hit kinds in wire order (`protocol::HitKind::code`): miss, exact, alias, approximate.
pub(crate) const KIND_NAMES: [&str; 4] = ["miss", "exact", "alias", "approximate"];

/// `recall_floor_state` in cache-aside mode with a floor set: the code after the
/// engine's own ([`FloorState::code`]).
pub(crate) const RECALL_STATE_UNAVAILABLE: u8 = 5;

/// The name of a `recall_floor_state` code: the engine's [`FloorState::name`], or
/// `unavailable`; `None` past those.
pub(crate) fn recall_state_name(code: usize) -> Option<&'static str> {
    match FloorState::from_code(code) {
        Some(s) => Some(s.name()),
        None if code == RECALL_STATE_UNAVAILABLE as usize => Some("unavailable"),
        None => None,
    }
}

const SIGFIG: u8 = 2;
const HIGHEST_NS: u64 = 60_000_000_000;

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, HIGHEST_NS, SIGFIG).expect("static histogram bounds")
}

/// Plain counts one executor keeps beside its histograms.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ServiceCounters {
    pub requests: [u64; 6],
    pub errors: [u64; 6],
    pub searches_bypass: u64,
    pub searches_refresh: u64,
    /// SEARCH (and SEARCH_BATCH queries) with AT_POSITION (version 5).
    pub searches_at_position: u64,
    /// Of those, the ones that waited for the change stream to reach their position.
    pub searches_position_waited: u64,
    /// Of those, the ones the database answered because the cache could not be shown to
    /// hold their position (behind after the wait, or no change stream).
    pub searches_position_database: u64,
    /// Backend queue full: the request got BUSY.
    pub backend_busy: u64,
    pub backend_errors: u64,
    /// Misses whose backend answer had fewer rows than asked (served, not admitted).
    pub backend_short_answers: u64,
    pub fills_admitted: u64,
}

impl ServiceCounters {
    fn add(&mut self, o: &ServiceCounters) {
        for i in 0..6 {
            self.requests[i] += o.requests[i];
            self.errors[i] += o.errors[i];
        }
        self.searches_bypass += o.searches_bypass;
        self.searches_refresh += o.searches_refresh;
        self.searches_at_position += o.searches_at_position;
        self.searches_position_waited += o.searches_position_waited;
        self.searches_position_database += o.searches_position_database;
        self.backend_busy += o.backend_busy;
        self.backend_errors += o.backend_errors;
        self.backend_short_answers += o.backend_short_answers;
        self.fills_admitted += o.fills_admitted;
    }
}

/// What one executor records.
#[derive(Clone)]
pub(crate) struct Recorded {
    pub ops: [Histogram<u64>; 6],
    /// SEARCH by hit kind (wire order).
    pub kinds: [Histogram<u64>; 4],
    /// Backend search calls, as the executor waited for them (queue + search).
    pub backend: Histogram<u64>,
    pub counters: ServiceCounters,
}

impl Default for Recorded {
    fn default() -> Self {
        Recorded {
            ops: std::array::from_fn(|_| histogram()),
            kinds: std::array::from_fn(|_| histogram()),
            backend: histogram(),
            counters: ServiceCounters::default(),
        }
    }
}

impl Recorded {
    fn merge(&mut self, o: &Recorded) {
        // Same bounds everywhere, so `add` cannot fail.
        for (a, b) in self.ops.iter_mut().zip(&o.ops) {
            let _ = a.add(b);
        }
        for (a, b) in self.kinds.iter_mut().zip(&o.kinds) {
            let _ = a.add(b);
        }
        let _ = self.backend.add(&o.backend);
        self.counters.add(&o.counters);
    }
}

fn nanos(d: Duration) -> u64 {
    d.as_nanos().min(HIGHEST_NS as u128).max(1) as u64
}

/// One executor's metrics.
#[derive(Default)]
pub(crate) struct ExecutorMetrics {
    inner: Mutex<Recorded>,
}

impl ExecutorMetrics {
    fn with<R>(&self, f: impl FnOnce(&mut Recorded) -> R) -> R {
        // A panic while recording leaves plain counts behind: still usable.
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut g)
    }

    /// One finished request: its latency, and for SEARCH its hit kind (wire code).
    pub(crate) fn record(&self, op: Op, kind: Option<u8>, latency: Duration, ok: bool) {
        let ns = nanos(latency);
        self.with(|r| {
            let i = op as usize;
            r.counters.requests[i] += 1;
            if !ok {
                r.counters.errors[i] += 1;
                return;
            }
            r.ops[i].saturating_record(ns);
            if let Some(k) = kind.filter(|&k| (k as usize) < 4) {
                r.kinds[k as usize].saturating_record(ns);
            }
        })
    }

    pub(crate) fn record_backend(&self, latency: Duration) {
        let ns = nanos(latency);
        self.with(|r| r.backend.saturating_record(ns));
    }

    pub(crate) fn count(&self, f: impl FnOnce(&mut ServiceCounters)) {
        self.with(|r| f(&mut r.counters));
    }

    /// A copy, for merging outside the lock.
    pub(crate) fn copy(&self) -> Recorded {
        self.with(|r| r.clone())
    }
}

/// Merges every executor's metrics.
pub(crate) fn merge_all<'a>(all: impl IntoIterator<Item = &'a ExecutorMetrics>) -> Recorded {
    let mut out = Recorded::default();
    for m in all {
        out.merge(&m.copy());
    }
    out
}

/// A sample's kind and value.
#[derive(Clone, Debug)]
pub(crate) enum Value {
    Counter(u64),
    Gauge(f64),
    /// Nanoseconds. STATS shows the count and quantiles in µs; Prometheus a summary in
    /// seconds.
    Latency(Histogram<u64>),
}

/// One metric with its family, help and labels. STATS names it
/// `family[_labelvalue...]`; Prometheus `aker_family[_total|_seconds]{labels}`.
#[derive(Clone, Debug)]
pub(crate) struct Sample {
    pub family: &'static str,
    pub help: &'static str,
    pub labels: Vec<(&'static str, String)>,
    pub value: Value,
}

impl Sample {
    pub(crate) fn new(family: &'static str, help: &'static str, value: Value) -> Sample {
        Sample {
            family,
            help,
            labels: Vec::new(),
            value,
        }
    }

    pub(crate) fn counter(family: &'static str, help: &'static str, value: u64) -> Sample {
        Sample::new(family, help, Value::Counter(value))
    }

    pub(crate) fn gauge(family: &'static str, help: &'static str, value: f64) -> Sample {
        Sample::new(family, help, Value::Gauge(value))
    }

    pub(crate) fn label(mut self, key: &'static str, value: impl Into<String>) -> Sample {
        self.labels.push((key, value.into()));
        self
    }

    /// `family_labelvalue...`, the STATS name.
    fn stats_name(&self) -> String {
        let mut name = self.family.to_string();
        for (_, v) in &self.labels {
            name.push('_');
            name.push_str(v);
        }
        name
    }
}

/// Everything STATS and /metrics show, taken at one moment.
#[derive(Clone, Debug, Default)]
pub(crate) struct Snapshot {
    pub samples: Vec<Sample>,
}

const QUANTILES: [(f64, &str); 4] = [(0.5, "p50"), (0.9, "p90"), (0.99, "p99"), (0.999, "p999")];

impl Snapshot {
    pub(crate) fn push(&mut self, sample: Sample) {
        self.samples.push(sample);
    }

    pub(crate) fn counter(&mut self, family: &'static str, help: &'static str, value: u64) {
        self.push(Sample::counter(family, help, value));
    }

    pub(crate) fn gauge(&mut self, family: &'static str, help: &'static str, value: f64) {
        self.push(Sample::gauge(family, help, value));
    }

    /// The sample of `family` whose label values are `labels`.
    pub(crate) fn find(&self, family: &str, labels: &[&str]) -> Option<&Sample> {
        self.samples.iter().find(|s| {
            s.family == family
                && s.labels.len() == labels.len()
                && s.labels.iter().zip(labels).all(|((_, v), l)| v == l)
        })
    }

    /// The value of an unlabelled counter or gauge (tests, the demo).
    pub(crate) fn value(&self, family: &str) -> Option<f64> {
        match self.find(family, &[])?.value {
            Value::Counter(v) => Some(v as f64),
            Value::Gauge(v) => Some(v),
            Value::Latency(_) => None,
        }
    }

    /// The `latency` histogram with these label values (`["search", "exact"]`).
    pub(crate) fn latency(&self, labels: &[&str]) -> Option<&Histogram<u64>> {
        match &self.find("latency", labels)?.value {
            Value::Latency(h) => Some(h),
            _ => None,
        }
    }

    /// `name value` lines (STATS).
    pub(crate) fn render_stats(&self) -> String {
        let mut out = String::with_capacity(4096);
        write_stats(&mut out, &self.samples);
        out
    }

    /// The Prometheus text exposition format (version 0.0.4).
    pub(crate) fn render_prometheus(&self) -> String {
        let mut out = String::with_capacity(8192);
        write_prometheus(&mut out, &self.samples);
        out
    }
}

/// Appends `name value` lines (STATS), latencies in microseconds.
pub(crate) fn write_stats(out: &mut String, samples: &[Sample]) {
    for s in samples {
        let name = s.stats_name();
        match &s.value {
            Value::Counter(v) => {
                let _ = writeln!(out, "{name} {v}");
            }
            Value::Gauge(v) => {
                let _ = writeln!(out, "{name} {}", number(*v));
            }
            Value::Latency(h) => {
                let _ = writeln!(out, "{name}_count {}", h.len());
                if h.is_empty() {
                    continue;
                }
                for (q, label) in QUANTILES {
                    let us = h.value_at_quantile(q) as f64 / 1e3;
                    let _ = writeln!(out, "{name}_{label}_us {us:.1}");
                }
                let _ = writeln!(out, "{name}_max_us {:.1}", h.max() as f64 / 1e3);
            }
        }
    }
}

/// Appends the Prometheus text: one HELP and TYPE per family, at its first sample, then
/// all of that family's samples.
pub(crate) fn write_prometheus(out: &mut String, samples: &[Sample]) {
    let mut seen: Vec<&str> = Vec::new();
    for (i, s) in samples.iter().enumerate() {
        if seen.contains(&s.family) {
            continue;
        }
        seen.push(s.family);
        let (name, ty) = prom_name(s);
        let _ = writeln!(out, "# HELP {name} {}", s.help);
        let _ = writeln!(out, "# TYPE {name} {ty}");
        for t in samples[i..].iter().filter(|t| t.family == s.family) {
            let v = match &t.value {
                Value::Counter(v) => v.to_string(),
                Value::Gauge(v) => number(*v),
                Value::Latency(h) => {
                    write_summary(out, &name, &t.labels, h);
                    continue;
                }
            };
            out.push_str(&name);
            write_labels(out, &t.labels, None);
            let _ = writeln!(out, " {v}");
        }
    }
}

fn prom_name(s: &Sample) -> (String, &'static str) {
    match s.value {
        Value::Counter(_) => (format!("aker_{}_total", s.family), "counter"),
        Value::Gauge(_) => (format!("aker_{}", s.family), "gauge"),
        Value::Latency(_) => (format!("aker_{}_seconds", s.family), "summary"),
    }
}

/// A summary's quantiles (NaN while empty), sum and count, in seconds.
fn write_summary(out: &mut String, name: &str, labels: &[(&str, String)], h: &Histogram<u64>) {
    for (q, _) in QUANTILES {
        let v = if h.is_empty() {
            f64::NAN
        } else {
            h.value_at_quantile(q) as f64 / 1e9
        };
        out.push_str(name);
        write_labels(out, labels, Some(("quantile", q.to_string().as_str())));
        let _ = writeln!(out, " {}", number(v));
    }
    let n = h.len();
    let _ = write!(out, "{name}_sum");
    write_labels(out, labels, None);
    let _ = writeln!(out, " {}", number(h.mean() * n as f64 / 1e9));
    let _ = write!(out, "{name}_count");
    write_labels(out, labels, None);
    let _ = writeln!(out, " {n}");
}

/// `{k="v",...}`, `last` after the sample's own labels; nothing when there are none.
fn write_labels(out: &mut String, labels: &[(&str, String)], last: Option<(&str, &str)>) {
    let pairs = labels.iter().map(|(k, v)| (*k, v.as_str())).chain(last);
    let mut first = true;
    for (k, v) in pairs {
        out.push(if first { '{' } else { ',' });
        first = false;
        let _ = write!(out, "{k}=\"");
        for c in v.chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '"' => out.push_str("\\\""),
                '\n' => out.push_str("\\n"),
                c => out.push(c),
            }
        }
        out.push('"');
    }
    if !first {
        out.push('}');
    }
}

/// Integers without a fraction; NaN as Prometheus spells it.
fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recall_state_names() {
        let names: Vec<_> = (0..7).map(recall_state_name).collect();
        let want = ["off", "warming", "holding", "tightening", "unreachable"];
        let want: Vec<_> = want.into_iter().chain(["unavailable"]).map(Some).collect();
        assert_eq!(names[..6], want[..]);
        assert_eq!(names[6], None);
    }

    #[test]
    fn record_merge_and_render() {
        let a = ExecutorMetrics::default();
        let b = ExecutorMetrics::default();
        for us in 1..=100u64 {
            a.record(Op::Search, Some(1), Duration::from_micros(us), true);
        }
        b.record(Op::Search, Some(0), Duration::from_millis(2), true);
        b.record(Op::Insert, None, Duration::from_millis(1), false);
        let all = merge_all([&a, &b]);
        assert_eq!(all.ops[0].len(), 101);
        assert_eq!(all.kinds[1].len(), 100);
        assert_eq!(all.counters.requests[Op::Insert as usize], 1);
        assert_eq!(all.counters.errors[Op::Insert as usize], 1);

        let mut s = Snapshot::default();
        s.counter("hits", "Hits.", 5);
        s.push(Sample::gauge("shard_pool_objects", "Objects per shard.", 7.0).label("shard", "0"));
        let latency = |kind: &'static str, h: &Histogram<u64>| {
            Sample::new("latency", "Latency.", Value::Latency(h.clone()))
                .label("op", "search")
                .label("kind", kind)
        };
        s.push(latency("exact", &all.kinds[1]));
        s.push(latency("alias", &all.kinds[2]));
        s.counter("server_requests", "Requests.", 3);
        assert_eq!(s.value("hits"), Some(5.0));
        assert_eq!(s.latency(&["search", "exact"]).map(|h| h.len()), Some(100));

        let text = s.render_stats();
        assert!(text.contains("hits 5\n"), "{text}");
        assert!(text.contains("shard_pool_objects_0 7\n"));
        assert!(text.contains("latency_search_exact_count 100\n"));
        assert!(text.contains("latency_search_exact_p50_us 5"));
        assert!(text.contains("latency_search_alias_count 0\nserver_requests 3\n"));
        let prom = s.render_prometheus();
        assert!(prom.contains("# TYPE aker_hits_total counter\naker_hits_total 5\n"));
        assert!(prom.contains("aker_shard_pool_objects{shard=\"0\"} 7\n"));
        assert!(prom.contains(
            "# HELP aker_latency_seconds Latency.\n# TYPE aker_latency_seconds summary\n"
        ));
        assert!(
            prom.contains("aker_latency_seconds{op=\"search\",kind=\"exact\",quantile=\"0.99\"}")
        );
        assert!(prom.contains("aker_latency_seconds_count{op=\"search\",kind=\"exact\"} 100\n"));
        assert!(prom
            .contains("aker_latency_seconds{op=\"search\",kind=\"alias\",quantile=\"0.5\"} NaN\n"));
        assert!(prom.contains("aker_server_requests_total 3\n"));
    }
}
