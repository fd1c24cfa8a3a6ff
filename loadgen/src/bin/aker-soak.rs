//! `aker-soak`: a long run of mixed searches, inserts, deletes and FLUSHes against one
//! akerd with a del-consistency checker, sampling RSS and latency (`loadgen::soak`).
//! Exits 1 when a check fails. docs/RELIABILITY.md has the commands and the results.

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

use loadgen::daemon::DaemonArgs;
use loadgen::soak::{self, Sample, SoakConfig, SoakReport};
use loadgen::{parse_duration, parse_rate};

#[derive(Parser, Debug)]
#[command(
    name = "aker-soak",
    version,
    about = "Soak akerd: mixed searches, inserts, deletes and FLUSHes from many clients; \
             checks that no reply carries an id after its delete was acknowledged; samples \
             RSS and latency every --sample-every into a CSV and a PNG."
)]
struct Cli {
    /// Where akerd listens (passed as --listen when the tool starts it).
    #[arg(long, default_value = "127.0.0.1:7720")]
    target: SocketAddr,
    #[command(flatten)]
    daemon: DaemonArgs,
    /// The collection's rows, near which queries and inserts fall: synthetic:N,DIM,CLUSTERS,SEED
    /// (akerd's `data = { kind = "synthetic", ... }`) or a .npy / .fvecs file.
    #[arg(long, default_value = "synthetic:20000,32,64,7")]
    data: String,

    #[arg(short = 'D', long, value_parser = parse_duration, default_value = "30m")]
    duration: Duration,
    #[arg(short, long, default_value_t = 16)]
    clients: usize,
    /// Operations per second per client.
    #[arg(short, long, value_parser = parse_rate, default_value = "50")]
    rate: f64,
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    sample_every: Duration,
    /// FLUSH period (client 0); 0 = never.
    #[arg(long, value_parser = parse_duration, default_value = "30s")]
    flush_every: Duration,
    /// Percent weights SEARCH,INSERT,DELETE.
    #[arg(long, default_value = "70,15,15")]
    mix: String,
    #[arg(short, long, default_value_t = 10)]
    k: u32,
    #[arg(long, default_value_t = 2_000)]
    queries: usize,
    #[arg(long, default_value_t = 0.9)]
    skew: f64,
    /// Noise on half the searches and on every insert (standard deviation).
    #[arg(long, default_value_t = 0.01)]
    jitter: f32,
    #[arg(long, default_value_t = 500)]
    live_per_client: usize,
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    io_timeout: Duration,
    #[arg(long, default_value_t = 1 << 40)]
    id_base: u64,
    #[arg(long, default_value_t = 42)]
    seed: u64,

    /// Writes soak.csv, soak.json and soak.png here.
    #[arg(long, default_value = "soak-out")]
    out: PathBuf,
    /// Fails when the RSS peak of the run's second half passes its first half's by more.
    #[arg(long, default_value_t = 64.0)]
    rss_growth_max_mib: f64,
    /// Report live inserts missing from a bypassing search instead of failing (an
    /// approximate backend may miss a few).
    #[arg(long)]
    allow_missing: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("aker-soak: {e}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: &Cli) -> Result<bool, String> {
    let mix = parse_mix(&cli.mix)?;
    if !(0.0..1.0).contains(&cli.skew) || cli.queries < 2 {
        return Err("--skew must be in [0, 1) and --queries at least 2".into());
    }
    let rows = loadgen::load_rows(&cli.data)?;
    let queries = soak::pick_queries(&rows, cli.queries, cli.jitter, cli.seed);
    std::fs::create_dir_all(&cli.out).map_err(|e| format!("{}: {e}", cli.out.display()))?;
    let mut daemon = cli.daemon.start(cli.target)?;
    let cfg = SoakConfig {
        target: cli.target,
        clients: cli.clients.max(1),
        rate_per_client: cli.rate,
        duration: cli.duration,
        sample_every: cli.sample_every,
        flush_every: cli.flush_every,
        mix,
        k: cli.k,
        queries: cli.queries,
        skew: cli.skew,
        jitter: cli.jitter,
        live_per_client: cli.live_per_client,
        io_timeout: cli.io_timeout,
        id_base: cli.id_base,
        seed: cli.seed,
        secret: cli.daemon.secret()?,
        tls: cli.daemon.tls(cli.target)?,
    };
    println!(
        "soak {:?}: {} clients x {} ops/s, mix search/insert/delete {:?}, FLUSH every {:?}, akerd pid {}",
        cli.duration,
        cfg.clients,
        cli.rate,
        mix,
        cli.flush_every,
        daemon.pid.map_or("-".into(), |p| p.to_string())
    );
    let csv_path = cli.out.join("soak.csv");
    let mut csv =
        std::fs::File::create(&csv_path).map_err(|e| format!("{}: {e}", csv_path.display()))?;
    writeln!(csv, "{}", Sample::CSV_HEADER).map_err(|e| e.to_string())?;
    let report = soak::run(cfg, &mut daemon, queries, |s| {
        println!("{}", s.line());
        let _ = writeln!(csv, "{}", s.csv());
    })?;
    let stopped = daemon.stop()?;
    write_outputs(&cli.out, &report)?;
    Ok(verdict(cli, &report, stopped))
}

fn parse_mix(s: &str) -> Result<[u32; 3], String> {
    let v: Vec<u32> = s
        .split(',')
        .map(|x| {
            x.trim()
                .parse()
                .map_err(|_| format!("--mix '{s}': want SEARCH,INSERT,DELETE"))
        })
        .collect::<Result<_, _>>()?;
    match v[..] {
        [a, b, c] if a + b + c > 0 => Ok([a, b, c]),
        _ => Err(format!("--mix '{s}': want three weights, not all zero")),
    }
}

fn write_outputs(out: &Path, r: &SoakReport) -> Result<(), String> {
    let json = serde_json::to_string_pretty(r).map_err(|e| e.to_string())?;
    std::fs::write(out.join("soak.json"), json).map_err(|e| e.to_string())?;
    let title = format!(
        "aker-soak: {:.1} min, {} clients, {} violations",
        r.seconds / 60.0,
        r.clients,
        r.violations
    );
    soak::plot(&out.join("soak.png"), &title, &r.samples)
}

/// Prints the summary; true when every check passed.
fn verdict(cli: &Cli, r: &SoakReport, stopped: Option<std::process::ExitStatus>) -> bool {
    println!(
        "searches {} (all checked), inserts {}, deletes acknowledged {}, FLUSHes {}, BUSY {}",
        r.searches, r.inserts, r.deletes_acknowledged, r.flushes, r.busy
    );
    let mut ok = true;
    let mut check = |pass: bool, what: String| {
        println!("{} {what}", if pass { "pass" } else { "FAIL" });
        ok &= pass;
    };
    check(
        r.violations == 0,
        format!(
            "del-consistency: {} replies carried an id deleted before they were asked for",
            r.violations
        ),
    );
    for v in r.violations_kept.iter().take(10) {
        println!("     id {} in a {} reply to client {}, {} µs after its delete was acknowledged (t = {:.1} s)", v.id, v.hit, v.client, v.after_ack_us, v.at_s);
    }
    check(
        r.hits > 0 && r.top1_deletes > 0,
        format!(
            "exercised: {} of {} searches from the cache; {} deletes of a just-served id, their re-search {} times from the cache",
            r.hits, r.searches, r.top1_deletes, r.top1_research_hits
        ),
    );
    check(
        r.fresh_connection_failures == 0,
        format!(
            "a new connection served at every sample: {} failed",
            r.fresh_connection_failures
        ),
    );
    check(
        r.final_check_error.is_none(),
        format!("the final check ran: {:?}", r.final_check_error),
    );
    check(
        r.error_count() == 0,
        format!("errors other than BUSY: {} {:?}", r.error_count(), r.errors),
    );
    let missing_ok = r.live_inserts_missing == 0 || cli.allow_missing;
    check(
        missing_ok,
        format!(
            "acknowledged inserts: {} of {} live ones missing from a bypassing search {:?}",
            r.live_inserts_missing, r.live_inserts_checked, r.missing_examples
        ),
    );
    match r.rss_growth_mib() {
        Some(g) => check(
            g <= cli.rss_growth_max_mib,
            format!(
                "RSS: peak {:.1} MiB in the first half, {:.1} MiB in the second: growth {g:.1} MiB (bound {} MiB)",
                r.rss_first_half_max_mib.unwrap_or(0.0),
                r.rss_second_half_max_mib.unwrap_or(0.0),
                cli.rss_growth_max_mib
            ),
        ),
        None => println!("     RSS not sampled (no pid)"),
    }
    if let Some(s) = stopped {
        check(s.success(), format!("akerd stopped on SIGTERM: {s}"));
    }
    println!("wrote {}/soak.csv, soak.json, soak.png", cli.out.display());
    ok
}
