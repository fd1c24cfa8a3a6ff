//! What `aker-cli` prints: the STATS text (`name value` lines, `crate::metrics`) as a
//! table, as JSON and as watch lines, and a SEARCH reply. Pure functions over the text,
//! so they are tested without a daemon.

use std::fmt::Write;
use std::time::Duration;

use crate::metrics::{recall_state_name, KIND_NAMES};
use crate::protocol::{HelloReply, SearchReply};

/// The operations STATS counts requests of (`metrics::Op`, in its order).
const OPS: [&str; 6] = ["search", "insert", "delete", "fill", "flush", "stats"];

/// A STATS reply: its `name value` pairs in the order sent.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Stats {
    pub entries: Vec<(String, String)>,
}

impl Stats {
    /// Lines without a space-separated value are skipped.
    pub fn parse(text: &str) -> Stats {
        let entries = text
            .lines()
            .filter_map(|l| l.trim().split_once(' '))
            .map(|(n, v)| (n.to_string(), v.trim().to_string()))
            .collect();
        Stats { entries }
    }

    /// A stat's value as a number (`None` when absent or not a number).
    pub fn get(&self, name: &str) -> Option<f64> {
        self.entries
            .iter()
            .find(|(n, _)| n == name)
            .and_then(|(_, v)| v.parse().ok())
    }

    /// A counter, 0 when absent.
    fn count(&self, name: &str) -> f64 {
        self.get(name).unwrap_or(0.0)
    }

    /// One JSON object of every stat, in STATS order: numbers as JSON numbers (integers
    /// digit for digit, so a u64 counter keeps its value), NaN and infinities as `null`,
    /// anything else as a string.
    pub fn to_json(&self) -> String {
        let mut out = String::from("{");
        for (i, (name, value)) in self.entries.iter().enumerate() {
            out.push_str(if i == 0 { "\n  " } else { ",\n  " });
            json_string(&mut out, name);
            out.push_str(": ");
            json_value(&mut out, value);
        }
        out.push_str(if self.entries.is_empty() {
            "}\n"
        } else {
            "\n}\n"
        });
        out
    }
}

/// A STATS value as JSON.
fn json_value(out: &mut String, v: &str) {
    let integer = {
        let digits = v.strip_prefix('-').unwrap_or(v);
        !digits.is_empty()
            && digits.bytes().all(|b| b.is_ascii_digit())
            && (digits == "0" || !digits.starts_with('0'))
    };
    if integer {
        out.push_str(v);
        return;
    }
    match v.parse::<f64>() {
        // Rust writes finite f64s without exponents or a leading '+': valid JSON.
        Ok(x) if x.is_finite() => {
            let _ = write!(out, "{x}");
        }
        Ok(_) => out.push_str("null"),
        Err(_) => json_string(out, v),
    }
}

/// `s` as a JSON string literal.
fn json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn percent(part: f64, whole: f64) -> String {
    if whole > 0.0 {
        format!("{:.1}%", 100.0 * part / whole)
    } else {
        "-".into()
    }
}

/// A latency quantile in µs as STATS has it, `-` while the histogram is empty.
fn micros(s: &Stats, name: &str) -> String {
    match s.get(name) {
        Some(v) => format!("{v:.1}"),
        None => "-".into(),
    }
}

fn uptime(secs: f64) -> String {
    let s = secs.max(0.0) as u64;
    match s {
        s if s >= 86_400 => format!("{}d{:02}h{:02}m", s / 86_400, s / 3600 % 24, s / 60 % 60),
        s if s >= 3600 => format!("{}h{:02}m{:02}s", s / 3600, s / 60 % 60, s % 60),
        s if s >= 60 => format!("{}m{:02}s", s / 60, s % 60),
        s => format!("{s}s"),
    }
}

/// Counts as integers, gauges with their fraction.
fn num(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v:.3}")
    }
}

/// The hit kinds' counters, in wire order (miss, exact, alias, approximate).
fn kind_counts(s: &Stats) -> [f64; 4] {
    [
        s.count("misses"),
        s.count("hits_exact"),
        s.count("hits_alias"),
        s.count("hits_approximate"),
    ]
}

/// `stats`: the STATS reply grouped for a person.
pub(crate) fn table(s: &Stats, hello: &HelloReply, target: &str) -> String {
    let mut t = String::new();
    let w = &mut t;
    write_title(w, s, hello, target);
    write_requests(w, s);
    write_lookups(w, s);
    write_latency(w, s);
    write_pool(w, s);
    write_recall(w, s);
    write_connections(w, s);
    t
}

/// The table's first line: the daemon and what HELLO said of it.
fn write_title(w: &mut String, s: &Stats, hello: &HelloReply, target: &str) {
    let _ = writeln!(
        w,
        "akerd {target}   up {}   protocol v{}   dim {}   metric {}   k_max {}   {} executors   {} shards{}",
        uptime(s.count("uptime_seconds")),
        hello.version_max,
        hello.dim,
        hello.metric.name(),
        hello.k_max,
        hello.executors,
        hello.shards,
        if hello.auth_challenge.is_some() { "   auth" } else { "" },
    );
}

/// Requests and errors per operation, and the searches' flags.
fn write_requests(w: &mut String, s: &Stats) {
    let _ = writeln!(
        w,
        "\nrequests              {:>12} {:>10}",
        "total", "errors"
    );
    for op in OPS {
        let _ = writeln!(
            w,
            "  {op:<20}{:>12} {:>10}",
            num(s.count(&format!("requests_{op}"))),
            num(s.count(&format!("errors_{op}")))
        );
    }
    let _ = writeln!(
        w,
        "  searches with BYPASS_CACHE {}, REFRESH_ENTRY {}",
        num(s.count("searches_bypass")),
        num(s.count("searches_refresh"))
    );
}

/// Cache lookups by how they were answered, each with its share, and the hit ratio.
fn write_lookups(w: &mut String, s: &Stats) {
    let kinds = kind_counts(s);
    let answered: f64 = kinds.iter().sum();
    let _ = writeln!(
        w,
        "\ncache lookups         {:>12} {:>10}",
        num(s.count("lookups")),
        "ratio"
    );
    let [miss, exact, alias, approximate] = kinds;
    for (name, v) in [
        ("exact", exact),
        ("alias", alias),
        ("approximate", approximate),
        ("miss", miss),
    ] {
        let _ = writeln!(w, "  {name:<20}{:>12} {:>10}", num(v), percent(v, answered));
    }
    let _ = writeln!(
        w,
        "  {:<20}{:>12} {:>10}",
        "hit ratio",
        "",
        percent(answered - miss, answered)
    );
}

/// Latency quantiles: searches by hit kind, the backend, and the other operations
/// that have run.
fn write_latency(w: &mut String, s: &Stats) {
    let _ = writeln!(
        w,
        "\nlatency (us)          {:>12} {:>10} {:>10} {:>10}",
        "count", "p50", "p99", "max"
    );
    let mut row = |label: &str, key: &str| {
        let _ = writeln!(
            w,
            "  {label:<20}{:>12} {:>10} {:>10} {:>10}",
            num(s.count(&format!("latency_{key}_count"))),
            micros(s, &format!("latency_{key}_p50_us")),
            micros(s, &format!("latency_{key}_p99_us")),
            micros(s, &format!("latency_{key}_max_us")),
        );
    };
    for kind in KIND_NAMES {
        row(&format!("search {kind}"), &format!("search_{kind}"));
    }
    row("backend", "backend_search");
    for op in ["insert", "delete", "fill", "flush"] {
        if s.count(&format!("latency_{op}_count")) > 0.0 {
            row(op, op);
        }
    }
}

/// The pool's size and its admissions, evictions and invalidations.
fn write_pool(w: &mut String, s: &Stats) {
    let _ = writeln!(w, "\npool");
    let objects = s.count("pool_objects");
    let _ = writeln!(
        w,
        "  objects {}   bytes {}   capacity {}   representatives {}   aliases {}",
        num(objects),
        num(s.count("pool_bytes")),
        num(s.count("pool_capacity")),
        num(s.count("representatives")),
        num(s.count("aliases")),
    );
    let _ = writeln!(
        w,
        "  admissions {} (refused {})   evictions {}   invalidations {}",
        num(s.count("admissions")),
        num(s.count("admissions_refused")),
        num(s.count("evictions")),
        num(s.count("invalidations")),
    );
}

/// The recall floor's state, and its estimate when there is one.
fn write_recall(w: &mut String, s: &Stats) {
    let state = s.count("recall_floor_state") as usize;
    let state_name = recall_state_name(state).unwrap_or("unknown");
    match (s.get("recall_floor"), s.get("recall_estimate")) {
        (Some(floor), Some(est)) => {
            let _ = writeln!(
                w,
                "\nrecall floor          {state_name}: floor {floor:.3}   estimate {est:.3} [{:.3}, {:.3}]   checks {}   threshold scale {:.3}",
                s.count("recall_estimate_low"),
                s.count("recall_estimate_high"),
                num(s.count("recall_checks_done")),
                s.count("recall_threshold_scale"),
            );
        }
        _ => {
            let _ = writeln!(w, "\nrecall floor          {state_name}");
        }
    }
}

/// Connections now, accepted, turned away, and failed authentications.
fn write_connections(w: &mut String, s: &Stats) {
    let _ = writeln!(
        w,
        "\nconnections           current {}   accepted {}   turned away {}   auth failures {}",
        num(s.count("server_connections_current")),
        num(s.count("server_connections_accepted")),
        num(s.count("server_connections_rejected")
            + s.count("server_connections_rejected_per_source")),
        num(s.count("server_auth_failures")),
    );
}

/// `search`: how it was answered, then one line per neighbour.
pub(crate) fn search_reply(r: &SearchReply, k: u32, took: Duration) -> String {
    let mut t = String::new();
    let to = if r.distances_to_query {
        "to the query"
    } else {
        "to the cached query it was answered from"
    };
    let _ = writeln!(
        t,
        "hit {}   {} of k={k}   {:.3} ms   distances {to}",
        r.hit.name(),
        r.neighbors.len(),
        took.as_secs_f64() * 1e3
    );
    let _ = writeln!(t, "{:>4}  {:>20}  distance", "#", "id");
    for (i, n) in r.neighbors.iter().enumerate() {
        let _ = writeln!(t, "{:>4}  {:>20}  {}", i + 1, n.id, n.distance);
    }
    t
}

/// The requests of an interval, without the watcher's own STATS.
fn requests(s: &Stats) -> f64 {
    OPS.iter()
        .filter(|&&op| op != "stats")
        .map(|op| s.count(&format!("requests_{op}")))
        .sum()
}

/// `watch`'s column titles.
pub(crate) fn watch_header(with_recall: bool) -> String {
    let mut h = format!(
        "{:>8} {:>10} {:>7} {:>7} {:>7} {:>7} | {:>10} {:>10} {:>10} {:>10}",
        "secs",
        "req/s",
        "exact",
        "alias",
        "approx",
        "miss",
        "p99us miss",
        "exact",
        "alias",
        "approx"
    );
    if with_recall {
        h.push_str(&format!(" | {:>7}", "recall"));
    }
    h
}

/// One `watch` line: the rate and hit ratios over the interval from `prev` to `cur`,
/// the daemon's p99 per kind (µs; its histograms are since start), the recall estimate.
pub(crate) fn watch_line(
    prev: &Stats,
    cur: &Stats,
    interval: Duration,
    since_start: Duration,
    with_recall: bool,
) -> String {
    let secs = interval.as_secs_f64().max(1e-9);
    let rate = (requests(cur) - requests(prev)).max(0.0) / secs;
    let (before, after) = (kind_counts(prev), kind_counts(cur));
    let delta: Vec<f64> = after
        .iter()
        .zip(before)
        .map(|(a, b)| (a - b).max(0.0))
        .collect();
    let answered: f64 = delta.iter().sum();
    let p99 = |kind: &str| micros(cur, &format!("latency_search_{kind}_p99_us"));
    let mut line = format!(
        "{:>8.1} {:>10.1} {:>7} {:>7} {:>7} {:>7} | {:>10} {:>10} {:>10} {:>10}",
        since_start.as_secs_f64(),
        rate,
        percent(delta[1], answered),
        percent(delta[2], answered),
        percent(delta[3], answered),
        percent(delta[0], answered),
        p99("miss"),
        p99("exact"),
        p99("alias"),
        p99("approximate"),
    );
    if with_recall {
        let r = cur
            .get("recall_estimate")
            .filter(|r| r.is_finite())
            .map_or_else(|| "-".to_string(), |r| format!("{r:.3}"));
        line.push_str(&format!(" | {r:>7}"));
    }
    line
}
