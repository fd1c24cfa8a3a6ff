//! Latency bookkeeping: HdrHistograms per operation and per SEARCH hit kind, error
//! counts by cause, recall sums, and the per-second interval; merging across threads;
//! the per-second line and the final table.
//!
//! Values are microseconds, 3 significant digits, up to one hour (longer ones saturate
//! at the top). A histogram is about 190 KB, so there is one [`Recorder`] per sender
//! thread, shared by the receivers of that thread's connections, rather than one per
//! connection.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use aker::protocol::HitKind;
use hdrhistogram::Histogram;
use serde::Serialize;

use crate::workload::OpKind;

/// Largest value tracked exactly, in µs.
pub const HIST_MAX_US: u64 = 3_600_000_000;

pub fn new_hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, HIST_MAX_US, 3).expect("valid histogram bounds")
}

/// Error causes that are not a server status.
pub const ERR_CONN_LOST: &str = "connection lost";
pub const ERR_NOT_SENT: &str = "not sent before the drain deadline";
pub const ERR_NO_REPLY: &str = "no reply before the drain deadline";

/// Everything measured over the counted part of a run.
#[derive(Clone)]
pub struct RunStats {
    /// Successful replies per operation, latency from the intended send time.
    pub ops: [Histogram<u64>; 3],
    pub op_errors: [u64; 3],
    /// Successful SEARCH replies per hit kind (`HitKind` code order).
    pub hits: [Histogram<u64>; 4],
    pub recall_sum: [f64; 4],
    pub recall_n: [u64; 4],
    /// Every successful reply, latency from the intended send time.
    pub all: Histogram<u64>,
    /// Every successful reply, latency from when it actually left: what a load generator
    /// without the correction would report. Kept to show the difference.
    pub uncorrected: Histogram<u64>,
    /// How late each counted request left against its intended time. Large values mean
    /// the window was full (the server fell behind) or the load generator itself could
    /// not keep up; the corrected latency includes this wait either way.
    pub send_lag: Histogram<u64>,
    /// Error replies and failures by cause (status name or one of the `ERR_*`).
    pub errors: BTreeMap<String, u64>,
    /// Every error reply the server sent (BUSY, DEADLINE_EXCEEDED, ...), latency from the
    /// intended send time: how fast a refusal comes back.
    pub error_replies: Histogram<u64>,
}

impl Default for RunStats {
    fn default() -> Self {
        RunStats {
            ops: std::array::from_fn(|_| new_hist()),
            op_errors: [0; 3],
            hits: std::array::from_fn(|_| new_hist()),
            recall_sum: [0.0; 4],
            recall_n: [0; 4],
            all: new_hist(),
            uncorrected: new_hist(),
            send_lag: new_hist(),
            errors: BTreeMap::new(),
            error_replies: new_hist(),
        }
    }
}

impl RunStats {
    pub fn record_ok(
        &mut self,
        kind: OpKind,
        hit: Option<HitKind>,
        latency_us: u64,
        uncorrected_us: u64,
        recall: Option<f64>,
    ) {
        let v = latency_us.max(1);
        self.ops[kind.index()].saturating_record(v);
        self.all.saturating_record(v);
        self.uncorrected.saturating_record(uncorrected_us.max(1));
        // Both measure to the same reply, so their difference is the send delay.
        self.send_lag
            .saturating_record(latency_us.saturating_sub(uncorrected_us).max(1));
        if let Some(h) = hit {
            let i = h.code() as usize;
            self.hits[i].saturating_record(v);
            if let Some(r) = recall {
                self.recall_sum[i] += r;
                self.recall_n[i] += 1;
            }
        }
    }

    /// Counts `n` failures of `cause` (for `kind` when known).
    pub fn record_errors(&mut self, kind: Option<OpKind>, cause: &str, n: u64) {
        if n == 0 {
            return;
        }
        if let Some(k) = kind {
            self.op_errors[k.index()] += n;
        }
        *self.errors.entry(cause.to_string()).or_default() += n;
    }

    pub fn merge(&mut self, o: &RunStats) {
        for (a, b) in self.ops.iter_mut().zip(&o.ops) {
            a.add(b).expect("same bounds");
        }
        for (a, b) in self.hits.iter_mut().zip(&o.hits) {
            a.add(b).expect("same bounds");
        }
        for i in 0..3 {
            self.op_errors[i] += o.op_errors[i];
        }
        for i in 0..4 {
            self.recall_sum[i] += o.recall_sum[i];
            self.recall_n[i] += o.recall_n[i];
        }
        self.all.add(&o.all).expect("same bounds");
        self.uncorrected.add(&o.uncorrected).expect("same bounds");
        self.send_lag.add(&o.send_lag).expect("same bounds");
        self.error_replies
            .add(&o.error_replies)
            .expect("same bounds");
        for (k, v) in &o.errors {
            *self.errors.entry(k.clone()).or_default() += v;
        }
    }

    pub fn ok(&self) -> u64 {
        self.all.len()
    }

    pub fn total_errors(&self) -> u64 {
        self.errors.values().sum()
    }

    /// Successful SEARCH replies.
    pub fn searches(&self) -> u64 {
        self.ops[OpKind::Search.index()].len()
    }

    /// Share of successful SEARCH replies answered by the cache (any hit kind but miss).
    pub fn hit_ratio(&self) -> Option<f64> {
        let s = self.searches();
        (s > 0).then(|| 1.0 - self.hits[HitKind::Miss.code() as usize].len() as f64 / s as f64)
    }

    /// Share of successful SEARCH replies of hit kind `h`.
    pub fn hit_share(&self, h: HitKind) -> Option<f64> {
        let s = self.searches();
        (s > 0).then(|| self.hits[h.code() as usize].len() as f64 / s as f64)
    }

    /// Mean recall over every scored SEARCH.
    pub fn recall(&self) -> Option<f64> {
        let n: u64 = self.recall_n.iter().sum();
        (n > 0).then(|| self.recall_sum.iter().sum::<f64>() / n as f64)
    }

    pub fn recall_of(&self, h: HitKind) -> Option<f64> {
        let i = h.code() as usize;
        (self.recall_n[i] > 0).then(|| self.recall_sum[i] / self.recall_n[i] as f64)
    }
}

/// Completions within the current second, counted or not (warm-up lines are printed
/// too, marked).
pub struct Interval {
    pub hist: Histogram<u64>,
    pub errors: u64,
}

impl Default for Interval {
    fn default() -> Self {
        Interval {
            hist: new_hist(),
            errors: 0,
        }
    }
}

/// What one sender thread and its receivers record into.
#[derive(Default)]
pub struct Recorder {
    pub run: RunStats,
    pub interval: Interval,
}

/// Percentiles of one histogram, in milliseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Summary {
    pub count: u64,
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub p9999_ms: f64,
    pub max_ms: f64,
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

impl Summary {
    pub fn of(h: &Histogram<u64>) -> Summary {
        if h.is_empty() {
            return Summary::default();
        }
        Summary {
            count: h.len(),
            mean_ms: h.mean() / 1000.0,
            p50_ms: ms(h.value_at_quantile(0.5)),
            p90_ms: ms(h.value_at_quantile(0.9)),
            p99_ms: ms(h.value_at_quantile(0.99)),
            p999_ms: ms(h.value_at_quantile(0.999)),
            p9999_ms: ms(h.value_at_quantile(0.9999)),
            max_ms: ms(h.max()),
        }
    }
}

/// Which part of a run an interval belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// Sent during the warm-up; not counted.
    Warmup,
    /// The counted schedule.
    Run,
    /// After the schedule: replies to late requests (counted, but a rate over this
    /// short tail means little).
    Drain,
}

/// One per-second line.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct IntervalLine {
    /// Seconds since the run started, at the end of the interval.
    pub at_s: f64,
    pub phase: Phase,
    /// Successful replies per second.
    pub rate: f64,
    pub errors: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
}

impl IntervalLine {
    /// The line for an interval of `secs` seconds ending `at_s` seconds into the run.
    pub fn from_interval(at_s: f64, phase: Phase, secs: f64, i: &Interval) -> IntervalLine {
        let s = Summary::of(&i.hist);
        IntervalLine {
            at_s,
            phase,
            rate: i.hist.len() as f64 / secs.max(1e-9),
            errors: i.errors,
            p50_ms: s.p50_ms,
            p99_ms: s.p99_ms,
            p999_ms: s.p999_ms,
            max_ms: s.max_ms,
        }
    }
}

impl std::fmt::Display for IntervalLine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:>7.1}s  {:>9.0} req/s  errors {:>5}  p50 {:>8}  p99 {:>8}  p99.9 {:>8}  max {:>8}{}",
            self.at_s,
            self.rate,
            self.errors,
            fmt_ms(self.p50_ms),
            fmt_ms(self.p99_ms),
            fmt_ms(self.p999_ms),
            fmt_ms(self.max_ms),
            match self.phase {
                Phase::Warmup => "  (warm-up)",
                Phase::Run => "",
                Phase::Drain => "  (drain)",
            }
        )
    }
}

/// A latency with a unit that keeps three significant digits readable.
pub fn fmt_ms(v: f64) -> String {
    if v <= 0.0 {
        "-".into()
    } else if v < 1.0 {
        format!("{:.0}us", v * 1000.0)
    } else if v < 1000.0 {
        format!("{v:.2}ms")
    } else {
        format!("{:.3}s", v / 1000.0)
    }
}

fn pct(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{:.1}%", v * 100.0))
}

fn row(out: &mut String, name: &str, h: &Histogram<u64>, secs: f64, errors: Option<u64>) {
    let s = Summary::of(h);
    let _ = writeln!(
        out,
        "{name:<14}{:>10}{:>11.1}{:>9}{:>9}{:>9}{:>9}{:>9}{:>9}{:>8}",
        s.count,
        s.count as f64 / secs.max(1e-9),
        fmt_ms(s.p50_ms),
        fmt_ms(s.p90_ms),
        fmt_ms(s.p99_ms),
        fmt_ms(s.p999_ms),
        fmt_ms(s.p9999_ms),
        fmt_ms(s.max_ms),
        errors.map_or_else(String::new, |e| e.to_string()),
    );
}

/// The final table over `secs` counted seconds: a row per operation that was sent, a row
/// per hit kind under SEARCH, the total; then hit ratio, recall, errors and the
/// uncorrected view.
pub fn final_table(s: &RunStats, secs: f64) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<14}{:>10}{:>11}{:>9}{:>9}{:>9}{:>9}{:>9}{:>9}{:>8}",
        "operation", "ok", "tput/s", "p50", "p90", "p99", "p99.9", "p99.99", "max", "errors"
    );
    for k in OpKind::ALL {
        let h = &s.ops[k.index()];
        if h.is_empty() && s.op_errors[k.index()] == 0 {
            continue;
        }
        row(&mut out, k.name(), h, secs, Some(s.op_errors[k.index()]));
        if k == OpKind::Search {
            for hk in HitKind::ALL {
                let h = &s.hits[hk.code() as usize];
                if !h.is_empty() {
                    row(&mut out, &format!("  {}", hk.name()), h, secs, None);
                }
            }
        }
    }
    row(&mut out, "all", &s.all, secs, Some(s.total_errors()));
    if let Some(r) = s.hit_ratio() {
        let kinds: Vec<String> = [HitKind::Exact, HitKind::Alias, HitKind::Approximate]
            .iter()
            .map(|&h| format!("{} {}", h.name(), pct(s.hit_share(h))))
            .collect();
        let _ = writeln!(out, "hit ratio     {} ({})", pct(Some(r)), kinds.join(", "));
    }
    if let Some(r) = s.recall() {
        let kinds: Vec<String> = HitKind::ALL
            .iter()
            .filter_map(|&h| s.recall_of(h).map(|v| format!("{} {v:.4}", h.name())))
            .collect();
        let _ = writeln!(out, "recall        {r:.4} ({})", kinds.join(", "));
    }
    if !s.errors.is_empty() {
        let e: Vec<String> = s.errors.iter().map(|(k, v)| format!("{k} {v}")).collect();
        let _ = writeln!(out, "errors        {}", e.join(", "));
    }
    let u = Summary::of(&s.uncorrected);
    let _ = writeln!(
        out,
        "uncorrected   p50 {}  p99 {}  p99.9 {}  max {}  (from the actual send; not coordinated-omission corrected)",
        fmt_ms(u.p50_ms),
        fmt_ms(u.p99_ms),
        fmt_ms(u.p999_ms),
        fmt_ms(u.max_ms)
    );
    let l = Summary::of(&s.send_lag);
    let _ = writeln!(
        out,
        "send lag      p50 {}  p99 {}  max {}  (actual send behind the intended time)",
        fmt_ms(l.p50_ms),
        fmt_ms(l.p99_ms),
        fmt_ms(l.max_ms)
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_adds_everything() {
        let mut a = RunStats::default();
        a.record_ok(OpKind::Search, Some(HitKind::Exact), 100, 50, Some(1.0));
        a.record_errors(Some(OpKind::Insert), "BUSY", 2);
        let mut b = RunStats::default();
        b.record_ok(OpKind::Search, Some(HitKind::Miss), 300, 300, Some(0.5));
        b.record_ok(OpKind::Delete, None, 10, 10, None);
        b.record_errors(None, ERR_CONN_LOST, 1);
        a.merge(&b);
        assert_eq!(a.ok(), 3);
        assert_eq!(a.searches(), 2);
        assert_eq!(a.total_errors(), 3);
        assert_eq!(a.op_errors, [0, 2, 0]);
        assert_eq!(a.hit_ratio(), Some(0.5));
        assert_eq!(a.recall(), Some(0.75));
        assert_eq!(a.recall_of(HitKind::Miss), Some(0.5));
        assert_eq!(a.all.max(), a.all.highest_equivalent(300));
        let table = final_table(&a, 1.0);
        assert!(table.contains("  exact"), "{table}");
        assert!(table.contains("hit ratio     50.0%"), "{table}");
        assert!(table.contains("BUSY 2"), "{table}");
    }

    #[test]
    fn summary_percentiles() {
        let mut h = new_hist();
        for v in 1..=10_000u64 {
            h.record(v).unwrap();
        }
        let s = Summary::of(&h);
        assert_eq!(s.count, 10_000);
        assert!((s.p50_ms - 5.0).abs() < 0.01, "{s:?}");
        assert!((s.p99_ms - 9.9).abs() < 0.01, "{s:?}");
        assert!((s.max_ms - 10.0).abs() < 0.01, "{s:?}");
    }

    #[test]
    fn units() {
        assert_eq!(fmt_ms(0.213), "213us");
        assert_eq!(fmt_ms(12.5), "12.50ms");
        assert_eq!(fmt_ms(2500.0), "2.500s");
        assert_eq!(fmt_ms(0.0), "-");
    }
}
