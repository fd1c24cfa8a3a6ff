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
#![allow(clippy::disallowed_types)]

use std::fmt::Write;
use std::sync::Mutex;
use std::time::Duration;

use hdrhistogram::Histogram;

/// Service operations with their own latency histogram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Search,
    Insert,
    Delete,
    Fill,
    Flush,
    Stats,
}

impl Op {
    pub const ALL: [Op; 6] = [
        Op::Search,
        Op::Insert,
        Op::Delete,
        Op::Fill,
        Op::Flush,
        Op::Stats,
    ];
    pub fn name(self) -> &'static str {
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
pub const KIND_NAMES: [&str; 4] = ["miss", "exact", "alias", "approximate"];

const SIGFIG: u8 = 2;
const HIGHEST_NS: u64 = 60_000_000_000;

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, HIGHEST_NS, SIGFIG).expect("static histogram bounds")
}

/// Plain counts one executor keeps beside its histograms.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServiceCounters {
    pub requests: [u64; 6],
    pub errors: [u64; 6],
    pub searches_bypass: u64,
    pub searches_refresh: u64,
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
        self.backend_busy += o.backend_busy;
        self.backend_errors += o.backend_errors;
        self.backend_short_answers += o.backend_short_answers;
        self.fills_admitted += o.fills_admitted;
    }
}

/// What one executor records.
#[derive(Clone)]
pub struct Recorded {
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
pub struct ExecutorMetrics {
    inner: Mutex<Recorded>,
}

impl ExecutorMetrics {
    fn with<R>(&self, f: impl FnOnce(&mut Recorded) -> R) -> R {
        // A panic while recording leaves plain counts behind: still usable.
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut g)
    }

    /// One finished request: its latency, and for SEARCH its hit kind (wire code).
    pub fn record(&self, op: Op, kind: Option<u8>, latency: Duration, ok: bool) {
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

    pub fn record_backend(&self, latency: Duration) {
        let ns = nanos(latency);
        self.with(|r| r.backend.saturating_record(ns));
    }

    pub fn count(&self, f: impl FnOnce(&mut ServiceCounters)) {
        self.with(|r| f(&mut r.counters));
    }

    /// A copy, for merging outside the lock.
    pub fn copy(&self) -> Recorded {
        self.with(|r| r.clone())
    }
}

/// Merges every executor's metrics.
pub fn merge_all<'a>(all: impl IntoIterator<Item = &'a ExecutorMetrics>) -> Recorded {
    let mut out = Recorded::default();
    for m in all {
        out.merge(&m.copy());
    }
    out
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SampleKind {
    Counter,
    Gauge,
}

/// One number with its family and labels. STATS writes it as
/// `family[_labelvalue...] value`; Prometheus as `aker_family[_total]{labels} value`.
#[derive(Clone, Debug)]
pub struct Sample {
    pub family: &'static str,
    pub help: &'static str,
    pub kind: SampleKind,
    pub labels: Vec<(&'static str, String)>,
    pub value: f64,
}

/// A latency distribution with its labels (`op`, and `kind` for SEARCH by hit kind).
#[derive(Clone, Debug)]
pub struct Latency {
    pub op: &'static str,
    pub kind: Option<&'static str>,
    pub hist: Histogram<u64>,
}

/// Everything STATS and /metrics show, taken at one moment.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub samples: Vec<Sample>,
    pub latencies: Vec<Latency>,
}

const QUANTILES: [(f64, &str); 4] = [(0.5, "p50"), (0.9, "p90"), (0.99, "p99"), (0.999, "p999")];

impl Snapshot {
    pub fn push(
        &mut self,
        family: &'static str,
        help: &'static str,
        kind: SampleKind,
        labels: Vec<(&'static str, String)>,
        value: f64,
    ) {
        self.samples.push(Sample {
            family,
            help,
            kind,
            labels,
            value,
        });
    }

    pub fn counter(&mut self, family: &'static str, help: &'static str, value: u64) {
        self.push(family, help, SampleKind::Counter, vec![], value as f64);
    }

    pub fn gauge(&mut self, family: &'static str, help: &'static str, value: f64) {
        self.push(family, help, SampleKind::Gauge, vec![], value);
    }

    /// The value of an unlabelled sample (tests, the demo).
    pub fn value(&self, family: &str) -> Option<f64> {
        self.samples
            .iter()
            .find(|s| s.family == family && s.labels.is_empty())
            .map(|s| s.value)
    }

    /// `name value` lines (STATS). Latencies in microseconds.
    pub fn render_stats(&self) -> String {
        let mut out = String::with_capacity(4096);
        for s in &self.samples {
            out.push_str(s.family);
            for (_, v) in &s.labels {
                out.push('_');
                out.push_str(v);
            }
            let _ = writeln!(out, " {}", number(s.value));
        }
        for l in &self.latencies {
            let mut name = format!("latency_{}", l.op);
            if let Some(k) = l.kind {
                name.push('_');
                name.push_str(k);
            }
            let _ = writeln!(out, "{name}_count {}", l.hist.len());
            if l.hist.is_empty() {
                continue;
            }
            for (q, label) in QUANTILES {
                let _ = writeln!(
                    out,
                    "{name}_{label}_us {:.1}",
                    l.hist.value_at_quantile(q) as f64 / 1e3
                );
            }
            let _ = writeln!(out, "{name}_max_us {:.1}", l.hist.max() as f64 / 1e3);
        }
        out
    }

    /// The Prometheus text exposition format (version 0.0.4), `extra` appended as
    /// `aker_`-prefixed lines (the connection layer's counters).
    pub fn render_prometheus(&self, extra: &[(String, SampleKind, f64)]) -> String {
        let mut out = String::with_capacity(8192);
        let mut seen: Vec<&str> = Vec::new();
        for (i, s) in self.samples.iter().enumerate() {
            if seen.contains(&s.family) {
                continue;
            }
            seen.push(s.family);
            let (name, ty) = prom_name(s.family, s.kind);
            let _ = writeln!(out, "# HELP {name} {}", s.help);
            let _ = writeln!(out, "# TYPE {name} {ty}");
            for t in self.samples[i..].iter().filter(|t| t.family == s.family) {
                out.push_str(&name);
                write_labels(&mut out, t.labels.iter().map(|(k, v)| (*k, v.as_str())));
                let _ = writeln!(out, " {}", number(t.value));
            }
        }
        if !self.latencies.is_empty() {
            out.push_str(
                "# HELP aker_latency_seconds Service time per operation and SEARCH hit kind.\n",
            );
            out.push_str("# TYPE aker_latency_seconds summary\n");
            for l in &self.latencies {
                let mut labels: Vec<(&str, &str)> = vec![("op", l.op)];
                if let Some(k) = l.kind {
                    labels.push(("kind", k));
                }
                for (q, _) in QUANTILES {
                    out.push_str("aker_latency_seconds");
                    let qs = q.to_string();
                    write_labels(
                        &mut out,
                        labels.iter().copied().chain([("quantile", qs.as_str())]),
                    );
                    let v = if l.hist.is_empty() {
                        f64::NAN
                    } else {
                        l.hist.value_at_quantile(q) as f64 / 1e9
                    };
                    let _ = writeln!(out, " {}", number(v));
                }
                let n = l.hist.len();
                out.push_str("aker_latency_seconds_sum");
                write_labels(&mut out, labels.iter().copied());
                let _ = writeln!(out, " {}", number(l.hist.mean() * n as f64 / 1e9));
                out.push_str("aker_latency_seconds_count");
                write_labels(&mut out, labels.iter().copied());
                let _ = writeln!(out, " {n}");
            }
        }
        for (name, kind, v) in extra {
            let (name, ty) = prom_name(name, *kind);
            let _ = writeln!(out, "# TYPE {name} {ty}");
            let _ = writeln!(out, "{name} {}", number(*v));
        }
        out
    }
}

fn prom_name(family: &str, kind: SampleKind) -> (String, &'static str) {
    match kind {
        SampleKind::Counter => (format!("aker_{family}_total"), "counter"),
        SampleKind::Gauge => (format!("aker_{family}"), "gauge"),
    }
}

fn write_labels<'a>(out: &mut String, labels: impl Iterator<Item = (&'a str, &'a str)>) {
    let mut first = true;
    for (k, v) in labels {
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
        s.push(
            "shard_pool_objects",
            "Objects per shard.",
            SampleKind::Gauge,
            vec![("shard", "0".into())],
            7.0,
        );
        s.latencies.push(Latency {
            op: "search",
            kind: Some("exact"),
            hist: all.kinds[1].clone(),
        });
        let text = s.render_stats();
        assert!(text.contains("hits 5\n"), "{text}");
        assert!(text.contains("shard_pool_objects_0 7\n"));
        assert!(text.contains("latency_search_exact_count 100\n"));
        assert!(text.contains("latency_search_exact_p50_us 5"));
        let prom = s.render_prometheus(&[("server_requests".into(), SampleKind::Counter, 3.0)]);
        assert!(prom.contains("# TYPE aker_hits_total counter\naker_hits_total 5\n"));
        assert!(prom.contains("aker_shard_pool_objects{shard=\"0\"} 7\n"));
        assert!(
            prom.contains("aker_latency_seconds{op=\"search\",kind=\"exact\",quantile=\"0.99\"}")
        );
        assert!(prom.contains("aker_latency_seconds_count{op=\"search\",kind=\"exact\"} 100\n"));
        assert!(prom.contains("aker_server_requests_total 3\n"));
    }
}
