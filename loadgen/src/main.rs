//! `aker-loadgen`: the command line. See `loadgen/README.md` for examples.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use aker::client::{Client, ClientOptions};
use aker::protocol::HelloReply;
use clap::Parser;

use loadgen::report::{self, Document, Point, RunReport, ServerInfo, SweepReport, SweepStepReport};
use loadgen::schedule::Arrival;
use loadgen::stats::{final_table, fmt_ms, Phase, Summary};
use loadgen::sweep::{self, SweepPlan, SweepSpec};
use loadgen::worker::{self, EngineConfig, Mode};
use loadgen::workload::{GenParams, Mix, Workload};
use loadgen::{parse_duration, parse_rate, testserver};

#[derive(Parser, Debug)]
#[command(
    name = "aker-loadgen",
    version,
    about = "Open-loop load generator for akerd: latency from the intended send time \
             (coordinated-omission corrected), HdrHistograms per operation and hit kind."
)]
struct Cli {
    /// Server address.
    #[arg(short, long, default_value = "127.0.0.1:7700")]
    target: String,
    /// The shared secret for a server that requires AUTH: this file's first line
    /// (otherwise $AKER_SECRET when set).
    #[arg(long, value_name = "FILE")]
    secret_file: Option<PathBuf>,
    /// TLS to an akerd with [tls]: trust the CA certificates in this PEM file.
    #[arg(long, value_name = "FILE")]
    tls_ca: Option<PathBuf>,
    /// The name the server's certificate must carry (default: --target's host).
    #[arg(long, value_name = "NAME", requires = "tls_ca")]
    tls_server_name: Option<String>,
    /// Mutual TLS: this client certificate (PEM, then its chain) ...
    #[arg(long, value_name = "FILE", requires_all = ["tls_ca", "tls_key"])]
    tls_cert: Option<PathBuf>,
    /// ... and its private key.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,

    /// Open loop: requests per second over all connections (2000, 2.5k).
    #[arg(short, long, value_parser = parse_rate, default_value = "1000",
          conflicts_with_all = ["closed", "sweep"])]
    rate: f64,
    /// Spacing of intended send times in open loop: poisson or fixed.
    #[arg(long, default_value = "poisson")]
    arrival: Arrival,
    /// Closed loop: every connection keeps --depth requests in flight; measures the
    /// maximum throughput.
    #[arg(long)]
    closed: bool,
    /// Open-loop runs at rates FROM:TO:STEP until p99 exceeds --p99; reports the highest
    /// rate under it.
    #[arg(long, value_name = "FROM:TO:STEP", conflicts_with = "closed")]
    sweep: Option<SweepSpec>,
    /// p99 bound for --sweep.
    #[arg(long, value_parser = parse_duration, default_value = "10ms")]
    p99: Duration,
    /// Pause between sweep steps.
    #[arg(long, value_parser = parse_duration, default_value = "1s")]
    sweep_pause: Duration,

    /// TCP connections.
    #[arg(short, long, default_value_t = 16)]
    connections: usize,
    /// Requests in flight per connection (lowered to the server's max_inflight; with
    /// --batch, frames in flight, lowered to max_inflight / batch).
    #[arg(short, long, default_value_t = 8)]
    depth: usize,
    /// Closed loop: send SEARCHes as SEARCH_BATCH frames (protocol version 4) of this
    /// many queries each. Latency is then per frame, counted for each of its queries.
    #[arg(long, value_name = "N", requires = "closed")]
    batch: Option<usize>,
    /// Sender threads (each owns some connections); default: CPUs, at most --connections.
    #[arg(short = 'T', long)]
    threads: Option<usize>,
    /// Sent first and not counted.
    #[arg(short, long, value_parser = parse_duration, default_value = "2s")]
    warmup: Duration,
    /// Counted run time.
    #[arg(short = 'D', long, value_parser = parse_duration, default_value = "10s")]
    duration: Duration,
    /// Stop after this many counted requests.
    #[arg(short = 'n', long)]
    requests: Option<u64>,
    /// After the run, how long late requests may still be sent and answered; what is
    /// still unsent or unanswered then counts as errors.
    #[arg(long, value_parser = parse_duration, default_value = "5s")]
    drain: Duration,
    /// A connection whose writes block this long is dropped.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    write_timeout: Duration,

    /// Open loop: spin (instead of sleeping) for the last part of each wait before an
    /// intended send time; tightens send times by tens of µs at the cost of a busy core
    /// per sender thread. Worth it on a dedicated load-generator machine.
    #[arg(long, value_parser = parse_duration, default_value = "0s")]
    spin: Duration,

    /// Replay this trace (formats/TRACE.md) instead of generating a workload.
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Start the trace over when it ends (otherwise the run stops there).
    #[arg(long = "loop", requires = "trace")]
    loop_trace: bool,
    /// Set BYPASS_CACHE on every SEARCH: the same operations measure the backend alone.
    #[arg(long)]
    bypass: bool,
    /// Generated workload: operation weights.
    #[arg(long, default_value = "search=100", conflicts_with = "trace")]
    mix: Mix,
    /// Generated workload: distinct vectors (dimension from the server's HELLO).
    #[arg(long, default_value_t = 10_000, conflicts_with = "trace")]
    vectors: usize,
    /// Generated workload: Gaussian clusters (0 = uniform random vectors).
    #[arg(long, default_value_t = 100, conflicts_with = "trace")]
    clusters: usize,
    /// Generated workload: Zipfian skew of query choice in [0, 1) (0 = uniform).
    #[arg(long, default_value_t = 0.99, conflicts_with = "trace")]
    skew: f64,
    /// Generated workload: neighbours per SEARCH (lowered to the server's k_max).
    #[arg(short, long, default_value_t = 10, conflicts_with = "trace")]
    k: u32,
    /// Generated workload: the first --vectors rows of this .fvecs instead of drawn
    /// vectors (the rows --pg-writes writes, for a like-with-like write comparison).
    #[arg(long, conflicts_with = "trace", value_name = "FVECS")]
    vectors_from: Option<PathBuf>,
    /// Generated workload: first INSERT id (DELETE removes this run's inserts).
    #[arg(long, default_value_t = 1 << 40, conflicts_with = "trace")]
    id_base: u64,
    /// Seed for generated vectors, operation choice and Poisson spacing.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Per-SEARCH deadline sent to the server (0 = none).
    #[arg(long, value_parser = parse_duration, default_value = "0s")]
    deadline: Duration,
    /// Collection id.
    #[arg(long, default_value_t = 0)]
    collection: u32,
    /// FLUSH the cache before the run (and before every sweep step).
    #[arg(long)]
    flush: bool,

    /// No per-second lines.
    #[arg(short, long)]
    quiet: bool,
    /// Write the results as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write HdrHistogram percentile distributions to PREFIX.all.hgrm, PREFIX.search.hgrm,
    /// PREFIX.search-exact.hgrm, ... (a sweep: PREFIX.RATE.all.hgrm, ...).
    #[arg(long, value_name = "PREFIX")]
    hgrm: Option<String>,
    /// Write a latency-versus-throughput PNG (a sweep: one point per step; a run: one
    /// point per counted second).
    #[arg(long)]
    png: Option<PathBuf>,
    /// Print the server's STATS after the run.
    #[arg(long)]
    server_stats: bool,

    /// pgvector SQL mode: send the trace's searches straight to this PostgreSQL (libpq
    /// URL, no password in it) instead of akerd, closed loop, one connection per
    /// --connections; --json gets throughput, p50 / p99 / p99.9 and recall.
    #[arg(long, value_name = "URL")]
    pg: Option<String>,
    /// A file whose first line is the --pg password.
    #[arg(long, requires = "pg")]
    pg_password_file: Option<PathBuf>,
    #[arg(long, requires = "pg", default_value = "items")]
    pg_table: String,
    #[arg(long, requires = "pg", default_value = "id")]
    pg_id_column: String,
    #[arg(long, requires = "pg", default_value = "embedding")]
    pg_vector_column: String,
    /// hnsw.ef_search of every SQL session (0: pgvector's default, 40).
    #[arg(long, requires = "pg", default_value_t = 0)]
    pg_ef: usize,
    /// Instead of a run: create --pg-table from this .fvecs (ids = row numbers) by
    /// binary COPY, build its HNSW index (--pg-index M:EF_CONSTRUCTION, metric from
    /// --pg-metric), print the times and sizes.
    #[arg(long, requires = "pg", value_name = "FVECS")]
    pg_load: Option<PathBuf>,
    #[arg(long, requires = "pg", default_value = "16:64", value_name = "M:EFC")]
    pg_index: String,
    #[arg(long, requires = "pg", default_value = "l2sq")]
    pg_metric: shards::Metric,
    /// Instead of a run: N inserts of this .fvecs' first rows as new ids from
    /// --id-base straight into --pg-table, then N deletes of them, on --connections
    /// connections; prints inserts/s and deletes/s.
    #[arg(long, requires = "pg", value_name = "FVECS")]
    pg_writes: Option<PathBuf>,
    #[arg(long, requires = "pg_writes", default_value_t = 5_000)]
    pg_writes_n: usize,

    /// Serve the test fixture on ADDR instead of generating load (for tests).
    #[arg(long, hide = true, value_name = "ADDR")]
    test_server: Option<SocketAddr>,
    #[arg(long, hide = true, default_value_t = 8)]
    test_dim: u32,
    #[arg(long, hide = true, default_value_t = 0)]
    test_busy_us: u64,
    #[arg(long, hide = true, default_value_t = 128)]
    test_max_inflight: u32,
    #[arg(long, hide = true, value_parser = parse_duration, default_value = "300s")]
    test_lifetime: Duration,
}

type Res<T> = Result<T, String>;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.test_server {
        Some(addr) => testserver::serve_process(
            addr,
            cli.test_dim,
            Duration::from_micros(cli.test_busy_us),
            cli.test_max_inflight,
            cli.test_lifetime,
        )
        .map_err(|e| format!("test server: {e}")),
        None if cli.pg.is_some() => run_pg(&cli),
        None => run(&cli),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("aker-loadgen: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `--pg`: load, direct writes, or the trace's searches as SQL.
fn run_pg(cli: &Cli) -> Res<()> {
    let password = match &cli.pg_password_file {
        Some(p) => Some(
            std::fs::read_to_string(p)
                .map_err(|e| format!("{}: {e}", p.display()))?
                .lines()
                .next()
                .unwrap_or_default()
                .to_string(),
        ),
        None => None,
    };
    let t = loadgen::pg::PgTarget {
        url: cli.pg.clone().unwrap_or_default(),
        password,
        table: cli.pg_table.clone(),
        id_column: cli.pg_id_column.clone(),
        vector_column: cli.pg_vector_column.clone(),
        ef_search: cli.pg_ef,
    };
    let write_json = |v: serde_json::Value| -> Res<()> {
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
        if let Some(path) = &cli.json {
            std::fs::write(path, serde_json::to_string_pretty(&v).unwrap_or_default())
                .map_err(|e| format!("{}: {e}", path.display()))?;
        }
        Ok(())
    };
    if let Some(fvecs) = &cli.pg_load {
        let (m, efc) = cli
            .pg_index
            .split_once(':')
            .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)))
            .ok_or("--pg-index is M:EF_CONSTRUCTION")?;
        let r = loadgen::pg::load(&t, fvecs, cli.pg_metric, m, efc)?;
        return write_json(serde_json::json!({
            "rows": r.rows, "dim": r.dim, "copy_s": r.copy_s, "index_s": r.index_s,
            "m": m, "ef_construction": efc,
            "table_bytes": r.table_bytes, "index_bytes": r.index_bytes,
        }));
    }
    if let Some(fvecs) = &cli.pg_writes {
        let data = aker_formats::data::read_fvecs(fvecs).map_err(|e| e.to_string())?;
        let n = cli.pg_writes_n.min(data.n);
        let vectors: Vec<Vec<f32>> = (0..n).map(|i| data.row(i).to_vec()).collect();
        let (ins, del) =
            loadgen::pg::run_writes(&t, &vectors, cli.id_base as i64, cli.connections)?;
        return write_json(serde_json::json!({
            "mode": "pgvector-sql-writes", "connections": cli.connections, "n": n,
            "inserts_per_s": ins, "deletes_per_s": del,
        }));
    }
    let path = cli
        .trace
        .as_ref()
        .ok_or("--pg needs --trace (or --pg-load / --pg-writes)")?;
    let trace = aker_formats::trace::Trace::load(path).map_err(|e| e.to_string())?;
    let metric = trace.metric;
    let w = Workload::from_trace(trace, cli.loop_trace)?;
    // As against akerd: open loop at --rate unless --closed.
    let pace = if cli.closed {
        loadgen::pg::Pace::Closed
    } else {
        loadgen::pg::Pace::Open {
            rate: cli.rate,
            arrival: cli.arrival,
            seed: cli.seed,
            drain: cli.drain,
        }
    };
    let r = loadgen::pg::run_searches(
        &w,
        &t,
        metric,
        cli.connections,
        pace,
        cli.warmup,
        cli.duration,
        cli.requests,
    )?;
    eprintln!(
        "pgvector SQL, {:?}, {} connections: {:.0} searches/s, p50 {} µs, p99 {} µs, recall {:?}, {} errors",
        r.pace,
        r.connections,
        r.throughput(),
        r.latency_us.value_at_quantile(0.5),
        r.latency_us.value_at_quantile(0.99),
        r.recall,
        r.errors
    );
    write_json(r.to_json(cli.pg_ef))
}

/// `--tls-*` as the connections' TLS (None without `--tls-ca`).
fn tls_options(cli: &Cli) -> Res<Option<aker::client::ClientTls>> {
    let Some(ca) = &cli.tls_ca else {
        return Ok(None);
    };
    let host = match &cli.tls_server_name {
        Some(n) => n.as_str(),
        None => aker::client::ClientTls::host_of(&cli.target),
    };
    let identity = cli.tls_cert.as_deref().zip(cli.tls_key.as_deref());
    aker::client::ClientTls::from_files(ca, host, identity)
        .map(Some)
        .map_err(|e| e.to_string())
}

fn control(
    addr: SocketAddr,
    secret: Option<aker::auth::Secret>,
    tls: Option<aker::client::ClientTls>,
) -> Res<Client> {
    let opts = ClientOptions {
        io_timeout: Some(Duration::from_secs(10)),
        secret,
        tls,
        ..ClientOptions::default()
    };
    Client::connect_with(addr, opts).map_err(|e| format!("cannot connect to {addr}: {e}"))
}

fn build_workload(cli: &Cli, hello: &HelloReply) -> Res<Workload> {
    let mut w = match &cli.trace {
        Some(path) => {
            let trace = aker_formats::trace::Trace::load(path).map_err(|e| e.to_string())?;
            let w = Workload::from_trace(trace, cli.loop_trace)?;
            if w.dim != hello.dim as usize {
                return Err(format!(
                    "the trace's vectors have dimension {}, the server's {}",
                    w.dim, hello.dim
                ));
            }
            if w.max_k() > hello.k_max {
                return Err(format!(
                    "the trace asks for k up to {}, the server's k_max is {}",
                    w.max_k(),
                    hello.k_max
                ));
            }
            if let Some(m) = w.metric.filter(|&m| m != hello.metric) {
                eprintln!(
                    "warning: the trace was made with metric {m}, the server uses {}; recall will not mean much",
                    hello.metric
                );
            }
            if w.has_ground_truth() && w.has_writes() {
                eprintln!(
                    "note: the trace has INSERT/DELETE; its ground truth describes the collection before them"
                );
            }
            w
        }
        None => {
            let params = GenParams {
                vectors: cli.vectors,
                clusters: cli.clusters,
                skew: cli.skew,
                k: cli.k,
                mix: cli.mix,
                id_base: cli.id_base,
                seed: cli.seed,
            };
            let dim = hello.dim as usize;
            let mut w = match &cli.vectors_from {
                Some(path) => {
                    let d = aker_formats::data::read_fvecs(path).map_err(|e| e.to_string())?;
                    if d.dim != dim {
                        return Err(format!(
                            "{}: {}-d, the server's {dim}-d",
                            path.display(),
                            d.dim
                        ));
                    }
                    Workload::generate_from_pool(dim, params, &d.data)?
                }
                None => Workload::generate(dim, params)?,
            };
            if cli.k > hello.k_max {
                eprintln!(
                    "note: k lowered from {} to the server's k_max {}",
                    cli.k, hello.k_max
                );
                w.clamp_k(hello.k_max);
            }
            w
        }
    };
    w.bypass = cli.bypass;
    w.version = aker::protocol::VERSION.min(hello.version_max);
    w.collection = cli.collection;
    w.deadline_us = u32::try_from(cli.deadline.as_micros())
        .map_err(|_| "the SEARCH deadline does not fit in u32 microseconds".to_string())?;
    Ok(w)
}

fn run(cli: &Cli) -> Res<()> {
    let target = cli
        .target
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {}: {e}", cli.target))?
        .next()
        .ok_or_else(|| format!("{} resolves to nothing", cli.target))?;
    let secret = loadgen::load_secret(cli.secret_file.as_deref())?;
    let tls = tls_options(cli)?;
    let mut ctl = control(target, secret.clone(), tls.clone())?;
    let hello = ctl.hello().map_err(|e| format!("HELLO to {target}: {e}"))?;
    let workload = Arc::new(build_workload(cli, &hello)?);
    let cfg = engine_config(cli, target, &hello, secret, tls, &workload)?;
    println!(
        "target {target}: dim {}, {}, k_max {}, max_inflight {}, {} executors, {} shards",
        hello.dim, hello.metric, hello.k_max, hello.max_inflight, hello.executors, hello.shards
    );
    println!("workload {}", workload.describe());

    let mut doc = Document {
        tool: "aker-loadgen",
        target: target.to_string(),
        workload: workload.describe(),
        server: ServerInfo::from(&hello),
        run: None,
        sweep: None,
    };
    match cli.sweep {
        Some(spec) => doc.sweep = Some(run_sweep(cli, spec, &cfg, &workload, &mut ctl)?),
        None => doc.run = Some(run_once(cli, &cfg, &workload, &mut ctl)?),
    }
    if cli.server_stats {
        let stats = ctl.stats().map_err(|e| format!("STATS: {e}"))?;
        println!("server STATS:\n{stats}");
    }
    if let Some(path) = &cli.json {
        report::write_json(path, &doc).map_err(|e| format!("writing {}: {e}", path.display()))?;
    }
    Ok(())
}

/// The run's shape from the command line, within the server's limits.
fn engine_config(
    cli: &Cli,
    target: SocketAddr,
    hello: &HelloReply,
    secret: Option<aker::auth::Secret>,
    tls: Option<aker::client::ClientTls>,
    workload: &Workload,
) -> Res<EngineConfig> {
    let batch = match cli.batch {
        None => None,
        Some(n) => Some(batch_size(n, hello, workload)?),
    };
    // A batch of n holds n of the server's max_inflight slots.
    let slots = hello.max_inflight.max(1) as usize / batch.unwrap_or(1);
    let depth = cli.depth.clamp(1, slots.max(1));
    if depth < cli.depth {
        eprintln!(
            "note: depth lowered from {} to {depth}: the server's max_inflight {} over {} queries per frame",
            cli.depth,
            hello.max_inflight,
            batch.unwrap_or(1)
        );
    }
    let connections = cli.connections.max(1);
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = cli.threads.unwrap_or(cpus).clamp(1, connections);
    let mode = if cli.closed {
        Mode::Closed
    } else {
        Mode::Open {
            rate: cli.rate,
            arrival: cli.arrival,
        }
    };
    Ok(EngineConfig {
        target,
        mode,
        connections,
        depth,
        threads,
        warmup: cli.warmup,
        duration: cli.duration,
        max_requests: cli.requests,
        drain: cli.drain,
        connect_timeout: Duration::from_secs(5),
        write_timeout: cli.write_timeout,
        max_frame_bytes: 64 << 20,
        spin: cli.spin,
        seed: cli.seed,
        secret,
        tls,
        batch,
    })
}

/// `--batch n` against this server: it must speak version 4, and n queries of the
/// workload's dimension and largest k must fit its `max_batch` and frame limit.
fn batch_size(n: usize, hello: &HelloReply, workload: &Workload) -> Res<usize> {
    if hello.max_batch.is_none() {
        return Err(format!(
            "--batch needs SEARCH_BATCH (protocol version 4); the server speaks up to {}",
            hello.version_max
        ));
    }
    let fits = aker::protocol::batch_count_max(hello, hello.dim, workload.max_k()) as usize;
    if n == 0 || n > fits {
        return Err(format!(
            "--batch {n}: the server takes 1 to {fits} queries per SEARCH_BATCH at k {} (max_batch {:?}, max_frame_bytes {})",
            workload.max_k(),
            hello.max_batch,
            hello.max_frame_bytes
        ));
    }
    Ok(n)
}

/// Per-second lines, unless --quiet.
fn line_printer(quiet: bool) -> impl Fn(&loadgen::stats::IntervalLine) + Copy {
    move |l| {
        if !quiet {
            println!("{l}");
        }
    }
}

/// `--sweep`: open-loop steps until p99 passes --p99.
fn run_sweep(
    cli: &Cli,
    spec: SweepSpec,
    cfg: &EngineConfig,
    workload: &Arc<Workload>,
    ctl: &mut Client,
) -> Res<SweepReport> {
    let (bound, quiet, flush) = (cli.p99.as_secs_f64() * 1000.0, cli.quiet, cli.flush);
    let base = EngineConfig {
        mode: Mode::Open {
            rate: spec.from,
            arrival: cli.arrival,
        },
        ..cfg.clone()
    };
    println!(
        "sweep {}..{} step {} req/s, {} arrivals, {} connections x depth {}, {} threads, warm-up {:?}, {:?} per step, p99 bound {}",
        spec.from, spec.to, spec.step, arrival_name(cli.arrival), cfg.connections, cfg.depth,
        cfg.threads, cli.warmup, cli.duration, fmt_ms(bound)
    );
    let plan = SweepPlan {
        spec,
        p99_bound_ms: bound,
        pause: cli.sweep_pause,
    };
    let before_step = |rate| {
        if !quiet {
            println!("--- {rate} req/s");
        }
        if flush {
            ctl.flush()
                .map_err(|e| std::io::Error::other(format!("FLUSH: {e}")))?;
        }
        Ok(())
    };
    let outcome = sweep::sweep(&base, plan, workload, before_step, line_printer(quiet), |step| {
        let s = Summary::of(&step.result.stats.all);
        println!(
            "step {:>9.0} req/s: achieved {:>9.1}  p50 {:>8}  p99 {:>8}  p99.9 {:>8}  max {:>8}  errors {}  {}",
            step.rate,
            step.result.stats.ok() as f64 / step.result.measured_secs.max(1e-9),
            fmt_ms(s.p50_ms),
            fmt_ms(s.p99_ms),
            fmt_ms(s.p999_ms),
            fmt_ms(s.max_ms),
            step.result.stats.total_errors(),
            if step.pass { "pass" } else { "FAIL" }
        );
    })
    .map_err(|e| format!("sweep: {e}"))?;
    match outcome.best_rate {
        Some(r) => println!("highest rate with p99 <= {}: {r} req/s", fmt_ms(bound)),
        None => println!("no rate kept p99 <= {}", fmt_ms(bound)),
    }
    if let Some(prefix) = &cli.hgrm {
        for s in &outcome.steps {
            report::write_hgrms(&format!("{prefix}.{}", s.rate), &s.result.stats)
                .map_err(|e| format!("writing .hgrm: {e}"))?;
        }
    }
    let reports = outcome.reports();
    if let Some(png) = &cli.png {
        let pts: Vec<Point> = reports.iter().map(|(_, _, r)| Point::of_run(r)).collect();
        let title = format!("aker-loadgen sweep, {}", cfg.target);
        plot(png, &title, &pts, true, Some(bound))?;
    }
    Ok(SweepReport {
        p99_bound_ms: bound,
        best_rate: outcome.best_rate,
        steps: reports
            .into_iter()
            .map(|(rate, pass, run)| SweepStepReport { rate, pass, run })
            .collect(),
    })
}

/// One run, open or closed loop, with its final table.
fn run_once(
    cli: &Cli,
    cfg: &EngineConfig,
    workload: &Arc<Workload>,
    ctl: &mut Client,
) -> Res<RunReport> {
    if cli.flush {
        ctl.flush().map_err(|e| format!("FLUSH: {e}"))?;
    }
    let (connections, depth, threads) = (cfg.connections, cfg.depth, cfg.threads);
    match cfg.mode {
        Mode::Open { rate, arrival } => println!(
            "open loop {rate} req/s, {} arrivals, {connections} connections x depth {depth}, {threads} threads, warm-up {:?}, duration {:?}",
            arrival_name(arrival), cli.warmup, cli.duration
        ),
        Mode::Closed => println!(
            "closed loop, {connections} connections x depth {depth}{}, {threads} threads, warm-up {:?}, duration {:?}",
            cfg.batch.map_or(String::new(), |n| format!(" SEARCH_BATCH frames of {n} queries")),
            cli.warmup, cli.duration
        ),
    }
    let result =
        worker::run(cfg, workload, line_printer(cli.quiet)).map_err(|e| format!("run: {e}"))?;
    println!();
    print!("{}", final_table(&result.stats, result.measured_secs));
    println!(
        "stopped       {:?}; {} counted requests sent over {:.2} s",
        result.stop, result.sent, result.measured_secs
    );
    if let Some(prefix) = &cli.hgrm {
        let files = report::write_hgrms(prefix, &result.stats)
            .map_err(|e| format!("writing .hgrm: {e}"))?;
        println!("wrote {}", files.join(", "));
    }
    if let Some(png) = &cli.png {
        let pts: Vec<Point> = result
            .intervals
            .iter()
            .filter(|l| l.phase == Phase::Run && l.rate > 0.0)
            .map(Point::of_line)
            .collect();
        let title = format!("aker-loadgen, {}, per second", cfg.target);
        plot(png, &title, &pts, false, None)?;
    }
    Ok(RunReport::new(cfg, &result))
}

fn arrival_name(a: Arrival) -> &'static str {
    match a {
        Arrival::Poisson => "poisson",
        Arrival::Fixed => "fixed",
    }
}

fn plot(path: &Path, title: &str, pts: &[Point], joined: bool, bound: Option<f64>) -> Res<()> {
    report::plot(path, title, pts, joined, bound).map_err(|e| {
        format!(
            "writing {}: {e} (the PNG needs a system font: apt-get install -y fonts-dejavu-core)",
            path.display()
        )
    })
}
