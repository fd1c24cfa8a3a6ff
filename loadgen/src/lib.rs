//! `aker-loadgen`: an open-loop load generator for `akerd` that measures latency from
//! each request's intended send time (coordinated-omission corrected, as wrk2 does).
//!
//! - [`schedule`]: intended send instants, Poisson or fixed spacing.
//! - [`workload`]: trace replay (`formats/TRACE.md`) or a generated SEARCH / INSERT /
//!   DELETE mix, optionally with the cache bypassed.
//! - [`worker`]: sender threads owning connections, a receiver per connection, the
//!   per-second lines; open and closed loop.
//! - [`stats`]: HdrHistograms per operation and hit kind, the final table.
//! - [`report`]: JSON, `.hgrm`, the latency-versus-throughput PNG.
//! - [`sweep`]: the highest rate whose p99 stays under a bound.
//! - [`testserver`]: a fixed-answer server on the project's connection layer, for tests.
//! - [`soak`] (`aker-soak`): a long mixed run with a del-consistency checker and RSS and
//!   latency samples; [`overload`] (`aker-overload`): hits under ten times the
//!   sustainable rate of misses; [`daemon`]: the akerd they start or attach to.
//! - [`changes`] (`aker-changes`): the lag of akerd's change stream and its search
//!   throughput while PostgreSQL takes SQL writes.

pub mod changes;
pub mod daemon;
pub mod overload;
pub mod pg;
pub mod report;
pub mod schedule;
pub mod soak;
pub mod stats;
pub mod sweep;
pub mod testserver;
pub mod worker;
pub mod workload;

use std::path::Path;
use std::time::Duration;

/// The rows a tool draws its queries near (`--data`): `synthetic:N,DIM,CLUSTERS,SEED`
/// (akerd's `data = { kind = "synthetic", ... }`, the same generator) or a .npy / .fvecs
/// file.
pub fn load_rows(spec: &str) -> Result<aker_formats::data::Dataset, String> {
    use aker_formats::data;
    if let Some(rest) = spec.strip_prefix("synthetic:") {
        let v: Vec<u64> = rest
            .split(',')
            .map(|x| x.trim().parse().map_err(|_| format!("--data '{spec}'")))
            .collect::<Result<_, _>>()?;
        return match v[..] {
            [n, dim, clusters, seed] if n > 0 && dim > 0 && clusters > 0 => Ok(data::synthetic(
                n as usize,
                dim as usize,
                clusters as usize,
                seed,
            )),
            _ => Err(format!(
                "--data '{spec}': want synthetic:N,DIM,CLUSTERS,SEED"
            )),
        };
    }
    data::load(Path::new(spec)).map_err(|e| format!("--data {spec}: {e}"))
}

/// The environment variable the tools read the shared secret from without --secret-file.
pub use aker::auth::SECRET_ENV;

/// The secret a tool authenticates with (`aker::auth::Secret::for_tool`).
pub fn load_secret(file: Option<&Path>) -> Result<Option<aker::auth::Secret>, String> {
    aker::auth::Secret::for_tool(file)
}

/// A rate in requests per second: `2000`, `2.5k`, `1m`.
pub fn parse_rate(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let (num, mul) = match t.char_indices().last() {
        Some((i, 'k' | 'K')) => (&t[..i], 1e3),
        Some((i, 'm' | 'M')) => (&t[..i], 1e6),
        _ => (t, 1.0),
    };
    let v: f64 = num
        .parse()
        .map_err(|_| format!("'{s}' is not a rate (e.g. 2000, 2.5k)"))?;
    let v = v * mul;
    if !v.is_finite() || v <= 0.0 {
        return Err(format!("rate '{s}' must be positive"));
    }
    Ok(v)
}

/// A duration: `10s`, `500ms`, `250us`, `2m`, `1h`, or bare seconds (`1.5`).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let v: f64 = num
        .parse()
        .map_err(|_| format!("'{s}' is not a duration (e.g. 10s, 500ms)"))?;
    let secs = match unit.trim() {
        "" | "s" => v,
        "ms" => v / 1e3,
        "us" | "µs" => v / 1e6,
        "m" | "min" => v * 60.0,
        "h" => v * 3600.0,
        other => return Err(format!("unknown unit '{other}' in duration '{s}'")),
    };
    Duration::try_from_secs_f64(secs).map_err(|_| format!("duration '{s}' is out of range"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_and_durations() {
        assert_eq!(parse_rate("2000"), Ok(2000.0));
        assert_eq!(parse_rate("2.5k"), Ok(2500.0));
        assert_eq!(parse_rate("1M"), Ok(1e6));
        assert!(parse_rate("0").is_err());
        assert!(parse_rate("fast").is_err());
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("250us"), Ok(Duration::from_micros(250)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert!(parse_duration("3 fortnights").is_err());
        assert!(parse_duration("-1s").is_err());
    }
}
