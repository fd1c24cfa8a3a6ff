//! `aker-changes`: the change stream's lag and akerd's search throughput while
//! PostgreSQL takes SQL writes that do not go through akerd (`loadgen::changes`).
//!
//! ```text
//! aker-changes --pg postgresql://aker@127.0.0.1:5432/postgres --pg-password-file pw \
//!     --table items --akerd 127.0.0.1:7700 --seconds 20 --writers 4 \
//!     --fractions 0,0.1,0.5,0.9 --search-threads 2 --out changes.md
//! ```
//!
//! akerd must already run in front of the table with `changes = "follow"` (or "auto" and
//! following): STATS must show `pg_changes_up 1`.

use std::io::Write;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

use loadgen::changes::{self, Config, PgConn, PhaseResult, ProbeLsn, Run};
use loadgen::parse_duration;
use loadgen::schedule::Arrival;

#[derive(Parser, Debug)]
#[command(
    name = "aker-changes",
    version,
    about = "Lag of akerd's change stream and akerd's search throughput while PostgreSQL \
             takes SQL writes: a closed-loop capacity phase (R writes/s, no searches), then \
             one phase per --fractions at f*R writes/s with closed-loop searches; a probe \
             measures commit-to-applied lag every 100 ms throughout."
)]
struct Cli {
    /// PostgreSQL (libpq URL, no password in it).
    #[arg(long, value_name = "URL")]
    pg: String,
    /// A file whose first line is the password.
    #[arg(long, value_name = "FILE")]
    pg_password_file: Option<PathBuf>,
    /// The table (id bigint primary key, vector(n) column; loaded and indexed). Taken
    /// as SQL text: schema-qualify or quote it as needed.
    #[arg(long, default_value = "items")]
    table: String,
    #[arg(long, default_value = "id")]
    id_column: String,
    #[arg(long, default_value = "embedding")]
    vector_column: String,
    /// statement_timeout of every session (SET once per session).
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    statement_timeout: Duration,

    /// akerd, already running in front of the table and following its changes.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7700")]
    akerd: String,
    /// The shared secret for an akerd that requires AUTH: this file's first line
    /// (otherwise $AKER_SECRET when set).
    #[arg(long, value_name = "FILE")]
    secret_file: Option<PathBuf>,

    /// Seconds per phase.
    #[arg(long, default_value_t = 20.0)]
    seconds: f64,
    /// SQL writer connections.
    #[arg(long, default_value_t = 4)]
    writers: usize,
    /// Fractions of the capacity write rate, one phase each (0: no writes).
    #[arg(long, default_value = "0,0.1,0.5,0.9")]
    fractions: String,
    /// akerd client threads searching in closed loop during the fraction phases.
    #[arg(long, default_value_t = 2)]
    search_threads: usize,
    /// The fixed query pool: this many sampled rows plus noise (repeats make hits).
    #[arg(long, default_value_t = 2_000)]
    queries: usize,
    #[arg(short, long, default_value_t = 10)]
    k: u32,
    /// Noise on queries and inserted vectors: standard deviation per component,
    /// relative to the sampled rows' RMS component.
    #[arg(long, default_value_t = 0.01)]
    noise: f32,
    /// Spacing of the open-loop writes: poisson or fixed.
    #[arg(long, default_value = "poisson")]
    arrival: Arrival,
    /// The lag probe's period.
    #[arg(long, value_parser = parse_duration, default_value = "100ms")]
    probe_every: Duration,
    /// A probe akerd has not applied within this counts as a timeout.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    probe_timeout: Duration,
    /// STATS polling period while a probe waits.
    #[arg(long, value_parser = parse_duration, default_value = "1ms")]
    stats_poll: Duration,
    /// The WAL position a probe waits for: write (pg_current_wal_lsn()) or flush
    /// (pg_current_wal_flush_lsn(), what akerd's follower reads), after its COMMIT.
    #[arg(long, default_value = "write")]
    probe_lsn: ProbeLsn,
    /// No uncounted SEARCH of every pool query before the first fraction phase.
    #[arg(long)]
    no_warm: bool,
    /// Leave the rows this tool inserted in the table (by default deleted at the end).
    #[arg(long)]
    keep_rows: bool,
    /// Also write the results as a Markdown table here.
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    #[arg(long, default_value_t = 42)]
    seed: u64,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("aker-changes: {e}");
            ExitCode::from(2)
        }
    }
}

fn parse_fractions(s: &str) -> Result<Vec<f64>, String> {
    s.split(',')
        .map(|x| {
            let f: f64 = x
                .trim()
                .parse()
                .map_err(|_| format!("--fractions '{s}': '{x}' is not a number"))?;
            if !(0.0..=10.0).contains(&f) {
                return Err(format!("--fractions: {f} is not in [0, 10]"));
            }
            Ok(f)
        })
        .collect()
}

fn run(cli: &Cli) -> Result<(), String> {
    let fractions = parse_fractions(&cli.fractions)?;
    if !(cli.seconds.is_finite() && cli.seconds >= 1.0 && cli.seconds <= 3600.0) {
        return Err("--seconds must be in [1, 3600]".into());
    }
    if cli.writers == 0 || cli.writers > 256 || cli.search_threads > 256 {
        return Err("--writers must be in 1..=256, --search-threads at most 256".into());
    }
    if cli.queries == 0 || cli.k == 0 {
        return Err("--queries and -k must be positive".into());
    }
    if !(cli.noise.is_finite() && cli.noise >= 0.0) {
        return Err("--noise must be >= 0".into());
    }
    let password = match &cli.pg_password_file {
        Some(p) => Some(
            std::fs::read_to_string(p)
                .map_err(|e| format!("{}: {e}", p.display()))?
                .lines()
                .next()
                .unwrap_or("")
                .to_string(),
        ),
        None => None,
    };
    let akerd: SocketAddr = cli
        .akerd
        .to_socket_addrs()
        .map_err(|e| format!("--akerd {}: {e}", cli.akerd))?
        .next()
        .ok_or_else(|| format!("--akerd {}: no address", cli.akerd))?;
    let cfg = Config {
        pg: PgConn {
            url: cli.pg.clone(),
            password,
            table: cli.table.clone(),
            id_column: cli.id_column.clone(),
            vector_column: cli.vector_column.clone(),
            statement_timeout: cli.statement_timeout,
        },
        akerd,
        secret: loadgen::load_secret(cli.secret_file.as_deref())?,
        phase: Duration::from_secs_f64(cli.seconds),
        writers: cli.writers,
        fractions: fractions.clone(),
        search_threads: cli.search_threads,
        queries: cli.queries,
        k: cli.k,
        noise: cli.noise,
        arrival: cli.arrival,
        probe_every: cli.probe_every,
        probe_timeout: cli.probe_timeout,
        stats_poll: cli.stats_poll,
        probe_lsn: cli.probe_lsn,
        warm: !cli.no_warm,
        keep_rows: cli.keep_rows,
        seed: cli.seed,
    };
    let started = changes::utc_now();
    let mut run = Run::prepare(cfg)?;
    let header = header(&run, &started);
    for l in &header {
        println!("{l}");
    }
    let results = phases(&mut run, &fractions);
    // The clean-up runs whatever happened to the phases.
    let cleaned = run.cleanup();
    let results = results?;
    match cleaned {
        Ok(n) if n > 0 => println!("clean-up: deleted the {n} rows this run inserted"),
        Ok(_) => {}
        Err(e) => eprintln!("aker-changes: clean-up failed: {e}"),
    }
    let (h, rows) = changes::table(&results);
    println!();
    print!("{}", changes::render_text(&h, &rows));
    let notes = changes::notes(&results);
    println!();
    for n in &notes {
        println!("{n}");
    }
    if let Some(path) = &cli.out {
        let mut f = std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut text = String::new();
        for (i, l) in header.iter().enumerate() {
            if i == 0 {
                text.push_str(&format!("# {l}\n\n"));
            } else {
                text.push_str(&format!("{l}\n"));
            }
        }
        text.push('\n');
        text.push_str(&changes::render_markdown(&h, &rows));
        text.push('\n');
        for n in &notes {
            text.push_str(&format!("- {n}\n"));
        }
        f.write_all(text.as_bytes())
            .map_err(|e| format!("{}: {e}", path.display()))?;
        println!("\nwrote {}", path.display());
    }
    Ok(())
}

/// The header lines: date, table, writers, write mix, cores, the other settings.
fn header(run: &Run, started: &str) -> Vec<String> {
    let (cfg, t) = (run.config(), &run.table);
    vec![
        format!(
            "aker-changes {started}: table {} ({} rows, dim {}), {} writers, {} cores, \
             PostgreSQL {}, akerd {}",
            cfg.pg.table,
            t.rows,
            t.dim,
            cfg.writers,
            changes::cores(),
            t.server_version,
            cfg.akerd
        ),
        format!("write mix: {}.", changes::write_mix(cfg, t)),
        format!(
            "phases of {:.1} s: capacity (writers in closed loop, NO akerd search load; the \
             lag probe runs), then per fraction f of its rate: writers in open loop ({:?}) at \
             f x capacity in total, {} akerd search threads in closed loop (k = {}, {} fixed \
             queries = sampled rows + noise; searches/s = median over whole 1-s windows; \
             hits % = akerd STATS delta (hits_exact + hits_alias + hits_approximate) / \
             (those + misses)); catch-up = time after the phase until akerd applied the WAL \
             position read then.",
            cfg.phase.as_secs_f64(),
            cfg.arrival,
            cfg.search_threads,
            cfg.k,
            cfg.queries
        ),
    ]
}

fn phases(run: &mut Run, fractions: &[f64]) -> Result<Vec<PhaseResult>, String> {
    let mut out = Vec::new();
    eprintln!("phase capacity ...");
    let cap = run.capacity()?;
    let r = cap.achieved_rate();
    eprintln!(
        "  capacity: {r:.1} writes/s ({} writes, {} errors)",
        cap.writes.writes(),
        cap.writes.errors
    );
    out.push(cap);
    if r <= 0.0 {
        return Err("the capacity phase made no writes".into());
    }
    if run.config().warm && fractions.iter().any(|_| run.config().search_threads > 0) {
        let (hits, misses) = run.warm()?;
        eprintln!("warm-up: {hits} hits, {misses} misses over the query pool");
    }
    for &f in fractions {
        eprintln!("phase f={f} (target {:.1} writes/s) ...", f * r);
        let p = run.at_fraction(f, r)?;
        eprintln!(
            "  achieved {:.1} writes/s, {} probes, lag p50 {:.1} ms",
            p.achieved_rate(),
            p.probe.probes,
            p.probe.lag_us.value_at_quantile(0.5) as f64 / 1000.0
        );
        out.push(p);
    }
    eprintln!(
        "tool rows still in the table before clean-up: {}",
        run.live_rows()
    );
    Ok(out)
}
