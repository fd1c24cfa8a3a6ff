//! `aker-overload`: hits at a steady rate, then the same hits under ten times the
//! sustainable rate of misses, idle connections and clients that never read, then the
//! hits alone again (`loadgen::overload`). Exits 1 when a check fails.
//! docs/RELIABILITY.md has the commands and the results.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

use loadgen::daemon::DaemonArgs;
use loadgen::overload::{self, OverloadConfig, OverloadReport, PhaseReport};
use loadgen::stats::fmt_ms;
use loadgen::{parse_duration, parse_rate};

#[derive(Parser, Debug)]
#[command(
    name = "aker-overload",
    version,
    about = "Overload akerd: hit latency with and without ten times the sustainable rate of \
             misses, idle connections and clients that never read; RSS, BUSY and recovery."
)]
struct Cli {
    #[arg(long, default_value = "127.0.0.1:7730")]
    target: SocketAddr,
    #[command(flatten)]
    daemon: DaemonArgs,
    /// The collection's rows: synthetic:N,DIM,CLUSTERS,SEED or a .npy / .fvecs file.
    #[arg(long, default_value = "synthetic:100000,128,64,7")]
    data: String,

    #[arg(long, value_parser = parse_rate, default_value = "2000")]
    hit_rate: f64,
    #[arg(long, default_value_t = 200)]
    hit_queries: usize,
    #[arg(long, default_value_t = 8)]
    hit_connections: usize,
    /// Offered misses, as a multiple of the rate the backend sustains.
    #[arg(long, default_value_t = 10.0)]
    miss_factor: f64,
    #[arg(long, default_value_t = 16)]
    miss_connections: usize,
    #[arg(short, long, default_value_t = 32)]
    depth: usize,
    /// Sender threads per engine.
    #[arg(short = 'T', long, default_value_t = 1)]
    threads: usize,
    #[arg(long, value_parser = parse_duration, default_value = "5s")]
    probe: Duration,
    /// Misses in flight in the probe (keep it at or below backend.queue_depth).
    #[arg(long, default_value_t = 8)]
    probe_inflight: usize,
    #[arg(long, value_parser = parse_duration, default_value = "20s")]
    baseline: Duration,
    #[arg(long, value_parser = parse_duration, default_value = "20s")]
    overload: Duration,
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    recovered: Duration,
    /// Sent before each phase's counted part.
    #[arg(long, value_parser = parse_duration, default_value = "1s")]
    warmup: Duration,
    #[arg(long, default_value_t = 400)]
    idle_connections: usize,
    #[arg(long, default_value_t = 8)]
    never_readers: usize,
    #[arg(short, long, default_value_t = 10)]
    k: u32,
    /// Noise around data rows for fresh misses (standard deviation).
    #[arg(long, default_value_t = 1.0)]
    miss_spread: f32,
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    io_timeout: Duration,
    #[arg(long, default_value_t = 42)]
    seed: u64,

    /// Writes overload.json here.
    #[arg(long, default_value = "overload-out")]
    out: PathBuf,
    /// Fails when the hit p99 under overload passes this multiple of the baseline's.
    #[arg(long, default_value_t = 2.0)]
    hit_p99_ratio_max: f64,
    /// Fails when akerd's RSS peak under overload passes its level before by more.
    #[arg(long, default_value_t = 128.0)]
    rss_growth_max_mib: f64,
    /// Fails when the first fresh miss after the overload takes longer to be answered.
    #[arg(long, value_parser = parse_duration, default_value = "5s")]
    recovery_max: Duration,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("aker-overload: {e}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: &Cli) -> Result<bool, String> {
    let rows = loadgen::load_rows(&cli.data)?;
    std::fs::create_dir_all(&cli.out).map_err(|e| format!("{}: {e}", cli.out.display()))?;
    let daemon = cli.daemon.start(cli.target)?;
    let cfg = OverloadConfig {
        target: cli.target,
        hit_rate: cli.hit_rate,
        hit_queries: cli.hit_queries,
        hit_connections: cli.hit_connections,
        miss_factor: cli.miss_factor,
        miss_connections: cli.miss_connections,
        depth: cli.depth,
        threads: cli.threads,
        probe: cli.probe,
        probe_inflight: cli.probe_inflight,
        baseline: cli.baseline,
        overload: cli.overload,
        recovered: cli.recovered,
        warmup: cli.warmup,
        idle_connections: cli.idle_connections,
        never_readers: cli.never_readers,
        k: cli.k,
        miss_spread: cli.miss_spread,
        io_timeout: cli.io_timeout,
        seed: cli.seed,
        secret: cli.daemon.secret()?,
        tls: cli.daemon.tls(cli.target)?,
    };
    let r = overload::run(&cfg, &daemon, rows.data, rows.dim, &|l| println!("{l}"))?;
    let stopped = daemon.stop()?;
    let json = serde_json::to_string_pretty(&r).map_err(|e| e.to_string())?;
    let path = cli.out.join("overload.json");
    std::fs::write(&path, json).map_err(|e| format!("{}: {e}", path.display()))?;
    let ok = verdict(cli, &r, stopped);
    println!("wrote {}", path.display());
    Ok(ok)
}

fn row(name: &str, p: &PhaseReport) {
    let l = &p.latency;
    println!(
        "{name:<16} offered {:>7.0}/s  answered {:>7.0}/s  p50 {:>8}  p99 {:>8}  p99.9 {:>8}  max {:>8}  miss/exact/alias/approx {:?}  refused {:?} (p99 {})",
        p.offered_per_s,
        p.ok_per_s,
        fmt_ms(l.p50_ms),
        fmt_ms(l.p99_ms),
        fmt_ms(l.p999_ms),
        fmt_ms(l.max_ms),
        p.hits_by_kind,
        p.errors,
        fmt_ms(p.refusals.p99_ms),
    );
}

/// Prints the table and the checks; true when every check passed.
fn verdict(cli: &Cli, r: &OverloadReport, stopped: Option<std::process::ExitStatus>) -> bool {
    println!();
    row("probe misses", &r.probe);
    row("A hits", &r.baseline_hits);
    row("B hits", &r.overload_hits);
    row("B misses", &r.overload_misses);
    row("C hits", &r.recovered_hits);
    let mib = |v: Option<f64>| v.map_or("-".into(), |m| format!("{m:.1} MiB"));
    println!(
        "sustainable misses {:.0}/s; B offered {:.0}/s, sent {:.0}/s; idle connections held {}; never-readers wrote {:?} bytes, dropped by akerd {} times ({} clients)",
        r.sustainable_miss_per_s,
        r.overload_misses.offered_per_s,
        r.overload_misses.sent as f64 / r.overload_misses.seconds.max(1e-9),
        r.idle_connections_held,
        r.never_reader_bytes,
        r.never_readers_dropped,
        r.never_reader_bytes.len(),
    );
    println!(
        "B misses: answered p99 {} (each waited behind at most the backend's queue), refused p99 {} (BUSY comes back at once)",
        fmt_ms(r.overload_misses.latency.p99_ms),
        fmt_ms(r.overload_misses.refusals.p99_ms)
    );
    println!(
        "RSS before B {}, peak in B {}, after C {}; backend_busy {:?}",
        mib(r.rss_before_overload_mib),
        mib(r.rss_peak_overload_mib),
        mib(r.rss_after_mib),
        r.backend_busy
    );
    let mut ok = true;
    let mut check = |pass: bool, what: String| {
        println!("{} {what}", if pass { "pass" } else { "FAIL" });
        ok &= pass;
    };
    check(
        r.idle_connections_held == cli.idle_connections,
        format!(
            "idle connections held: {} of {}",
            r.idle_connections_held, cli.idle_connections
        ),
    );
    for (name, p) in [
        ("A", &r.baseline_hits),
        ("B", &r.overload_hits),
        ("C", &r.recovered_hits),
    ] {
        check(
            p.errors.is_empty() && p.hits_by_kind[0] == 0 && p.ok > 0,
            format!(
                "{name}: every hit query answered as a hit ({} answered, {} misses, errors {:?})",
                p.ok, p.hits_by_kind[0], p.errors
            ),
        );
    }
    let m = &r.overload_misses;
    check(
        m.hits_by_kind[0] as f64 >= 0.9 * m.ok as f64,
        format!(
            "B's misses were misses: {} of {} answered",
            m.hits_by_kind[0], m.ok
        ),
    );
    let busy = r.overload_misses.errors.get("BUSY").copied().unwrap_or(0);
    check(
        busy > 0,
        format!("overloaded: {busy} misses refused with BUSY in B"),
    );
    let others: u64 = r
        .overload_misses
        .errors
        .iter()
        .filter(|(k, _)| k.as_str() != "BUSY")
        .map(|(_, v)| v)
        .sum::<u64>()
        + r.overload_hits.errors.values().sum::<u64>();
    check(
        others == 0,
        format!("no failures but BUSY on misses: {others} others"),
    );
    check(
        r.hit_p99_ratio() <= cli.hit_p99_ratio_max,
        format!(
            "hit p99 under overload {} vs {} alone: {:.2}x (bound {}x)",
            fmt_ms(r.overload_hits.latency.p99_ms),
            fmt_ms(r.baseline_hits.latency.p99_ms),
            r.hit_p99_ratio(),
            cli.hit_p99_ratio_max
        ),
    );
    if let Some(g) = r.rss_growth_mib() {
        check(
            g <= cli.rss_growth_max_mib,
            format!(
                "RSS growth under overload {g:.1} MiB (bound {} MiB)",
                cli.rss_growth_max_mib
            ),
        );
    }
    check(
        r.recovery_s <= cli.recovery_max.as_secs_f64(),
        format!(
            "recovery: a fresh miss answered {:.3} s after the overload (bound {:?})",
            r.recovery_s, cli.recovery_max
        ),
    );
    let c_ratio = r.recovered_hits.latency.p99_ms / r.baseline_hits.latency.p99_ms.max(1e-9);
    check(
        c_ratio <= cli.hit_p99_ratio_max,
        format!(
            "recovered hit p99 {} ({c_ratio:.2}x the baseline's)",
            fmt_ms(r.recovered_hits.latency.p99_ms)
        ),
    );
    if let Some(s) = stopped {
        check(s.success(), format!("akerd stopped on SIGTERM: {s}"));
    }
    ok
}
