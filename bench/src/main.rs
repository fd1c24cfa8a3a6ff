//! The experiment runner.
//!
//! - `bench recall`: reproduces the paper's §5.2 (Figures 10 and 11) on GloVe, a
//!   synthetic set and any `.npy`/`.fvecs` file: recall@10 against exact neighbours and
//!   hit ratios for paper-Aker (HNSW and brute-force filters), Proximity+, Potluck+ and
//!   no cache, at pools of 1% and 5% of the collection, over simZipf streams. Writes
//!   `report.md`, `results.csv` and PNG figures to `--out`. With `--akerd-config FILE`
//!   each data set x skew x pool also runs an `akerd` row per backend: akerd's effective
//!   cache configuration from FILE (`bench::akerd`).
//! - `bench trace`: writes one simZipf stream with exact ground truth as a trace file
//!   (`formats/TRACE.md`) for the load generator.

// mimalloc, keeping the memory it frees: see allocator/src/lib.rs.
#[global_allocator]
static ALLOCATOR: aker_alloc::MiMalloc = aker_alloc::MiMalloc;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aker_formats::data::write_fvecs;
use bench::akerd::{AkerdFile, AkerdSetup};
use bench::experiment::{self, FloorSpec, Policy, Rule, RunSpec};
use bench::plot::{self, Figure};
use bench::precomputed::{PrecomputedBackend, WithVectors};
use bench::prepare::{
    self as prep_mod, Bases, Prepared, Seeds, Source, SYNTHETIC, SYNTHETIC_QUICK,
};
use bench::report::{
    self, DatasetSummary, Header, HnswStream, HnswSummary, PoolSpec, Row, SkewSummary,
};
use bench::updates::{Scenario, ScenarioSpec, UpdatePolicy};
use bench::updates_report::Settings as UpdateSettings;
use bench::workload::{self, Workload};
use clap::{Parser, Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shards::floor::FloorConfig;
use shards::store::HnswStore;
use shards::{Backend, Capacity, FilterKind, Metric, StandbySearch};

type Fallible<T> = Result<T, Box<dyn std::error::Error>>;

#[derive(Parser)]
#[command(name = "bench", about = "Aker experiment runner (paper §5.2)")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
#[allow(clippy::large_enum_variant)] // parsed once
enum Cmd {
    /// Recall and hit ratios per data set x skew x pool x policy (Figures 10 and 11).
    Recall(RecallArgs),
    /// Write a simZipf trace with exact ground truth for the load generator.
    Trace(TraceArgs),
    /// The cache under inserts and deletes (paper §5.4: Figure 18, Table 3, Figure 19).
    Updates(UpdatesArgs),
}

/// Options shared by both commands.
#[derive(clap::Args)]
struct Common {
    /// Distance: l2sq (squared L2), cosine (1 - cos) or ip (-dot). Cosine distance is
    /// scale-invariant, so group members (1 - λ)·q + λ·p are not renormalised;
    /// --normalize normalises them.
    #[arg(long, default_value = "l2sq")]
    metric: Metric,
    /// Results per request.
    #[arg(long, default_value_t = 10)]
    k: usize,
    /// Base seed; every random choice derives from it (printed).
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Where GloVe lives, relative to the working directory (`ops/get-glove.sh` puts
    /// it in the repository's data/).
    #[arg(long, default_value = "data")]
    data_dir: PathBuf,
    /// Where exact ground truth is cached between runs, relative to the working
    /// directory (created if missing).
    #[arg(long, default_value = "data/cache")]
    cache_dir: PathBuf,
    /// Scale every vector of the data set (and of --queries) to unit L2 norm (a zero
    /// vector stays zero) before the hold-out, groups and ground truth, and every
    /// request (simZipf member) too; the set is named e.g. `glove/unit`.
    #[arg(long)]
    normalize: bool,
    /// A .npy or .fvecs file whose first --groups rows are the simZipf group bases (the
    /// partners are drawn from the same rows); the WHOLE data set is then the
    /// collection, nothing held out. Without it, --groups rows of the data set are held
    /// out as the bases and only the rest is the collection (the ids ground truth and
    /// --base-out refer to).
    #[arg(long, value_name = "FILE")]
    queries: Option<PathBuf>,
    /// Group bases (one simZipf group of 50 members each): the first N rows of
    /// --queries, or N rows held out of the data set without it.
    #[arg(
        long,
        value_name = "N",
        default_value_t = prep_mod::HELD_OUT as u64,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    groups: u64,
}

impl Common {
    /// The group bases `--queries` and `--groups` ask for.
    fn bases(&self) -> Fallible<Bases> {
        let groups = usize::try_from(self.groups)?;
        Ok(match &self.queries {
            Some(path) => Bases::from_file(path, groups, self.normalize)?,
            None => Bases::HeldOut(groups),
        })
    }
}

/// The HNSW backend's graph and how its `ef` is tuned (both experiments).
#[derive(clap::Args)]
struct HnswArgs {
    /// HNSW backend graph degree.
    #[arg(long, default_value_t = 16)]
    hnsw_m: usize,
    /// HNSW backend build breadth.
    #[arg(long, default_value_t = 128)]
    hnsw_ef_construction: usize,
    /// Recall@k the HNSW backend's ef is tuned to reach without a cache.
    #[arg(long, default_value_t = 0.9)]
    target_recall: f64,
    /// Requests per stream the ef sweep measures on.
    #[arg(long, default_value_t = 500)]
    ef_samples: usize,
}

/// `shards::StandbySearch` on the command line.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum StandbyChoice {
    Nearest,
    ActiveFirst,
    Learned,
}

impl StandbyChoice {
    fn engine(self) -> StandbySearch {
        match self {
            StandbyChoice::Nearest => StandbySearch::Nearest,
            StandbyChoice::ActiveFirst => StandbySearch::ActiveFirst,
            StandbyChoice::Learned => StandbySearch::Learned,
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum BackendChoice {
    Exact,
    Hnsw,
    Both,
}

#[derive(clap::Args)]
struct RecallArgs {
    #[command(flatten)]
    common: Common,
    /// Data sets, comma-separated: glove, synthetic, synthetic:N:DIM:CLUSTERS, or a
    /// .npy/.fvecs path [default: glove,synthetic; with --quick a small synthetic set].
    #[arg(long, value_delimiter = ',')]
    dataset: Option<Vec<Source>>,
    /// Zipfian exponents of the streams.
    #[arg(long, value_delimiter = ',', default_value = "0.30,0.60,0.99")]
    skews: Vec<f64>,
    /// Pool sizes as shares of the collection ("1%" or "0.01"), in objects; "config":
    /// the --akerd-config file's own capacity (akerd rows only; the others skip it).
    #[arg(long, value_delimiter = ',', default_value = "1%,5%")]
    pools: Vec<PoolSpec>,
    /// Policies on the exact backend: aker, prx, pl10, pl25 (plNN), none; "-bf" suffix =
    /// brute-force filter.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "aker,aker-bf,prx,prx-bf,pl10,pl25,none"
    )]
    policies: Vec<Policy>,
    /// Policies on the HNSW backend.
    #[arg(long, value_delimiter = ',', default_value = "aker,none")]
    hnsw_policies: Vec<Policy>,
    /// Requests per stream [default: 100000; with --quick 10000].
    #[arg(long)]
    requests: Option<usize>,
    /// Backends: exact (precomputed exact answers), hnsw (hnsw_rs, ef tuned per stream).
    #[arg(long, value_enum, default_value = "both")]
    backend: BackendChoice,
    /// Reserve results per entry (Δ).
    #[arg(long, default_value_t = 0)]
    delta: usize,
    /// Nearest representatives a lookup checks against their thresholds: 1 is the
    /// paper's rule (the closest candidate); the engine's default is 2.
    #[arg(long, default_value_t = 1)]
    filter_candidates: usize,
    /// Which filter generation answers while a rotation leaves two: `nearest` is
    /// ALGORITHM.md's rule (the engine's default), `learned` akerd's default,
    /// `active-first` the newer generation first.
    #[arg(long, value_enum, default_value = "nearest")]
    standby_search: StandbyChoice,
    /// Cache shards: 1 is one unsharded cache (the paper's set-up); more run akerd's
    /// sharded path (two nearest centroids' shards probed, one global pool budget,
    /// centroids trained on the collection as akerd trains them).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=1024))]
    shards: u64,
    /// Output folder for report.md, results.csv and the figures, relative to the
    /// working directory (created if missing).
    #[arg(long, default_value = "bench/results")]
    out: PathBuf,
    /// Runs in parallel (each run is single-threaded) [default: all cores].
    #[arg(long)]
    threads: Option<usize>,
    #[command(flatten)]
    hnsw: HnswArgs,
    /// Potluck+'s threshold factor after a verified match.
    #[arg(long, default_value_t = experiment::POTLUCK_GROW)]
    potluck_grow: f32,
    /// Potluck+'s threshold factor after a verified mismatch.
    #[arg(long, default_value_t = experiment::POTLUCK_SHRINK)]
    potluck_shrink: f32,
    /// Small smoke configuration: a 20,000 x 16 synthetic set and 10,000 requests.
    #[arg(long)]
    quick: bool,
    /// Equal memory: every row of a share pool gets the bytes paper-Aker's default
    /// (`aker`, ids only) took at that share in objects, in the same stream, however it
    /// spends them (entries, reserves, vectors, aliases).
    #[arg(long)]
    equal_bytes: bool,
    /// An akerd configuration file (e.g. ops/akerd.toml): each data set x skew x pool
    /// also runs an `akerd` row per backend with the file's [cache] and [sharding] as
    /// akerd runs them (its pool follows --pools unless the pool is "config"; --delta,
    /// --filter-candidates, --standby-search and --shards are the paper rows' only).
    #[arg(long)]
    akerd_config: Option<PathBuf>,
    /// Recall floors, comma-separated (e.g. 0.9,0.95,0.98; 0: shadow checks and the
    /// estimate without control): every cached row also runs once per floor, labelled
    /// `policy@floor` (`shards::floor`). Also writes floor-series.csv.
    #[arg(long, value_delimiter = ',', value_parser = parse_floor)]
    recall_floors: Vec<f64>,
    /// Fraction of approximate and alias hits a floor checks against the backend
    /// (exact hits: an eighth of it).
    #[arg(long, default_value_t = FloorConfig::default().sample)]
    floor_sample: f64,
    /// Requests per window of floor-series.csv.
    #[arg(long, default_value_t = 5_000, value_parser = clap::value_parser!(u64).range(1..))]
    floor_window: u64,
    /// A changed workload: each stream's second half comes from a simZipf stream at
    /// this skew (a row's skew is its first half's).
    #[arg(long)]
    phase_skew: Option<f64>,
    /// With --phase-skew: the second half's hot groups are other groups (g -> g + n/2).
    #[arg(long, requires = "phase_skew")]
    phase_other_groups: bool,
}

/// A recall floor in `[0, 1)`.
fn parse_floor(s: &str) -> Result<f64, String> {
    let f: f64 = s
        .trim()
        .parse()
        .map_err(|e| format!("recall floor '{s}': {e}"))?;
    if (0.0..1.0).contains(&f) {
        Ok(f)
    } else {
        Err(format!("recall floor '{s}' is not in [0, 1)"))
    }
}

impl RecallArgs {
    /// The floor configuration of a row at `floor`.
    fn floor_config(&self, floor: f64) -> FloorConfig {
        FloorConfig {
            floor,
            sample: self.floor_sample,
            ..FloorConfig::default()
        }
    }

    fn floors_on(&self) -> bool {
        !self.recall_floors.is_empty()
    }
}

#[derive(clap::Args)]
struct TraceArgs {
    #[command(flatten)]
    common: Common,
    /// glove, synthetic, synthetic:N:DIM:CLUSTERS, or a .npy/.fvecs path.
    #[arg(long, default_value = "glove")]
    dataset: Source,
    /// Zipfian exponent.
    #[arg(long, default_value_t = 0.99)]
    skew: f64,
    /// Requests in the stream.
    #[arg(long, default_value_t = workload::DEFAULT_REQUESTS)]
    requests: usize,
    /// The trace file to write.
    #[arg(long)]
    out: PathBuf,
    /// Also write the collection the ground truth refers to (ids = row numbers) as
    /// .fvecs, for a server to load (held-out bases are not in it; with --queries it is
    /// the whole data set).
    #[arg(long)]
    base_out: Option<PathBuf>,
}

fn main() {
    aker_alloc::keep_freed_memory();
    let cli = Cli::parse();
    let result = match cli.cmd {
        Cmd::Recall(a) => recall(a),
        Cmd::Trace(a) => trace(a),
        Cmd::Updates(a) => updates(a),
    };
    if let Err(e) = result {
        eprintln!("bench: {e}");
        std::process::exit(1);
    }
}

fn bar(len: u64, what: &str) -> ProgressBar {
    let b = ProgressBar::new(len);
    b.set_style(
        ProgressStyle::with_template(
            "{msg:>28} [{bar:40}] {human_pos}/{human_len} {elapsed_precise} eta {eta}",
        )
        .expect("static template")
        .progress_chars("=> "),
    );
    b.set_message(what.to_string());
    b
}

fn spinner(what: &str) -> ProgressBar {
    let s = ProgressBar::new_spinner();
    s.set_message(what.to_string());
    s.enable_steady_tick(Duration::from_millis(200));
    s
}

/// Loads `source` and finds every group member's exact top `depth`, with progress.
fn prepare(
    source: &Source,
    c: &Common,
    depth: usize,
    seeds: Seeds,
) -> Fallible<(Prepared, f64, f64)> {
    let t = Instant::now();
    let mut all = source.load(&c.data_dir, seeds.synthetic)?;
    if c.normalize {
        all.normalize_rows();
    }
    let bases = c.bases()?;
    let load_s = t.elapsed().as_secs_f64();
    let name = prep_mod::dataset_name(source, c.normalize);
    println!(
        "[{name}] {} vectors x {}-d loaded{} in {load_s:.1} s",
        all.n,
        all.dim,
        if c.normalize {
            " and unit-normalised"
        } else {
            ""
        }
    );
    println!("[{name}] {}", bases.origin().describe());
    let t = Instant::now();
    let members = bases.count() * workload::GROUP_SIZE;
    let b = bar(members as u64, &format!("{name}: exact top-{depth}"));
    let prep = Prepared::with_bases(
        name.clone(),
        all,
        bases,
        c.metric,
        depth,
        c.normalize,
        seeds,
        &c.cache_dir,
        &|n| b.inc(n as u64),
    )?;
    b.finish_and_clear();
    let gt_s = t.elapsed().as_secs_f64();
    println!(
        "[{name}] ground truth for {} members: {} {} in {gt_s:.1} s",
        prep.members(),
        if prep.truth_loaded {
            "loaded from"
        } else {
            "computed, cached at"
        },
        prep.truth_path.display()
    );
    Ok((prep, load_s, gt_s))
}

/// One stream of a data set with what its runs need.
struct Stream {
    skew: f64,
    workload: Workload,
    truth: Vec<Vec<u64>>,
    threshold: f32,
    /// The collection sample the sharded path's centroids train on (shared by streams).
    routing: Arc<[f32]>,
    /// The sample akerd rows' centroids train on (`sharding.sample_rows` rows).
    akerd_routing: Arc<[f32]>,
}

/// A pool as `--pools` names it and the budget its runs get.
type Pool = (PoolSpec, Capacity);

/// One configuration to run.
#[derive(Clone, Copy)]
struct Job {
    stream: usize,
    pool: Option<Pool>,
    policy: Policy,
    /// `--recall-floors`: the floor this run holds; `None`: the plain row.
    floor: Option<f64>,
}

/// The jobs of `policies` over every stream and pool (no-cache once per stream; the
/// `config` pool for akerd rows only), each cached one also once per floor of
/// `floors`, the slowest first so that the last ones to finish are short.
fn jobs(streams: usize, pools: &[Pool], policies: &[Policy], floors: &[f64]) -> Vec<Job> {
    let mut out = Vec::new();
    for stream in 0..streams {
        for &policy in policies {
            if policy.rule == Rule::NoCache {
                out.push(Job {
                    stream,
                    pool: None,
                    policy,
                    floor: None,
                });
            } else {
                for &p in pools
                    .iter()
                    .filter(|(p, _)| *p != PoolSpec::Config || policy.rule == Rule::Akerd)
                {
                    for floor in std::iter::once(None).chain(floors.iter().map(|&f| Some(f))) {
                        out.push(Job {
                            stream,
                            pool: Some(p),
                            policy,
                            floor,
                        });
                    }
                }
            }
        }
    }
    out.sort_by_key(|j| {
        let size = match j.pool {
            None => 0,
            Some((_, Capacity::Objects(n))) => n,
            Some((_, Capacity::Bytes(_))) => usize::MAX,
        };
        std::cmp::Reverse((j.policy.brute_force_filter, size))
    });
    out
}

/// What one stream's runs search: the paper rows' backend, and the akerd rows' (as
/// deep as `k + Δ` of the file, neighbour vectors attached when it stores them).
#[derive(Clone, Copy)]
struct StreamBackends<'a> {
    paper: &'a (dyn Backend + Sync),
    akerd: &'a (dyn Backend + Sync),
}

/// Runs `jobs` on `threads` workers, stream `i`'s against `backends[i]`; rows in job
/// order. `akerd`: the setup akerd rows run (`--akerd-config`).
/// `--equal-bytes`: first paper-Aker's default (`aker`) at each stream's share pools in
/// objects, then every job of a share pool with the bytes that run took at its end
/// (`RunResult::bytes`) as its budget. The reference runs themselves are not reported;
/// `aker` runs again at the bytes like every other row.
fn at_equal_bytes(
    jobs: &[Job],
    streams: &[Stream],
    run: &dyn Fn(&[Job]) -> Fallible<Vec<Row>>,
) -> Fallible<Vec<Row>> {
    let aker: Policy = "aker".parse()?;
    let mut refs: Vec<Job> = Vec::new();
    for j in jobs {
        if let Some((PoolSpec::Share(_), Capacity::Objects(_))) = j.pool {
            let r = Job {
                policy: aker,
                floor: None,
                ..*j
            };
            if !refs
                .iter()
                .any(|x| x.stream == r.stream && x.pool == r.pool)
            {
                refs.push(r);
            }
        }
    }
    let reference = run(&refs)?;
    let budget = |stream: usize, spec: PoolSpec| -> Fallible<usize> {
        reference
            .iter()
            .find(|r| r.skew == streams[stream].skew && r.pool.map(|p| p.0) == Some(spec))
            .map(|r| r.result.bytes)
            .ok_or_else(|| format!("no reference run for pool {spec}").into())
    };
    let mut moved = Vec::with_capacity(jobs.len());
    for j in jobs {
        let pool = match j.pool {
            Some((spec @ PoolSpec::Share(_), Capacity::Objects(_))) => {
                Some((spec, Capacity::Bytes(budget(j.stream, spec)?)))
            }
            other => other,
        };
        moved.push(Job { pool, ..*j });
    }
    run(&moved)
}

#[allow(clippy::too_many_arguments)]
fn run_jobs(
    jobs: &[Job],
    streams: &[Stream],
    backends: &[StreamBackends],
    akerd: Option<&AkerdSetup>,
    backend_name: &str,
    dataset: &str,
    args: &RecallArgs,
    seeds: Seeds,
    threads: usize,
) -> Fallible<Vec<Row>> {
    let total: u64 = jobs
        .iter()
        .map(|j| streams[j.stream].workload.requests.len() as u64)
        .sum();
    let b = bar(total, &format!("{dataset}/{backend_name}: runs"));
    let next = AtomicUsize::new(0);
    let done: Mutex<Vec<(usize, Row)>> = Mutex::new(Vec::new());
    let failed: Mutex<Option<String>> = Mutex::new(None);
    std::thread::scope(|s| {
        for _ in 0..threads.min(jobs.len()).max(1) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= jobs.len() || failed.lock().expect("poisoned").is_some() {
                    break;
                }
                let job = jobs[i];
                let st = &streams[job.stream];
                let is_akerd = job.policy.rule == Rule::Akerd;
                let spec = RunSpec {
                    policy: job.policy,
                    pool: job.pool.map_or(Capacity::Objects(1), |(_, c)| c),
                    k: args.common.k,
                    delta: args.delta,
                    global_threshold: st.threshold,
                    potluck_grow: args.potluck_grow,
                    potluck_shrink: args.potluck_shrink,
                    potluck_seed: seeds.potluck,
                    filter_candidates: args.filter_candidates,
                    standby_search: args.standby_search.engine(),
                    shards: args.shards as usize,
                    akerd: akerd.filter(|_| is_akerd).cloned(),
                    floor: job.floor.map(|f| FloorSpec {
                        config: args.floor_config(f),
                        seed: seeds.potluck ^ FLOOR_SEED,
                    }),
                    // The backend's own answer per request: the floor's reference, which
                    // differs from exact truth only on an approximate backend.
                    relative: args.floors_on() && backend_name != "exact",
                    window: if args.floors_on() {
                        args.floor_window as usize
                    } else {
                        0
                    },
                };
                let (backend, routing) = if is_akerd {
                    (backends[job.stream].akerd, &st.akerd_routing)
                } else {
                    (backends[job.stream].paper, &st.routing)
                };
                let run = experiment::run(&spec, &st.workload, &st.truth, routing, backend, &|n| {
                    b.inc(n)
                });
                match run {
                    Ok(result) => {
                        let row = Row {
                            dataset: dataset.to_string(),
                            backend: backend_name.to_string(),
                            k: args.common.k,
                            metric: args.common.metric,
                            skew: st.skew,
                            pool: job.pool,
                            policy: job.policy,
                            filter: spec.filter_used(),
                            threshold: spec.global_threshold_used(),
                            floor: job.floor,
                            result,
                        };
                        // Printed whether or not the bar is drawn (it is not off a terminal).
                        b.suspend(|| {
                            println!(
                                "  {dataset}/{backend_name} skew {:.2} pool {:>3} {:<8} recall {:.3} hits {:5.1}% ({:.1} s){}",
                                row.skew,
                                row.pool_label(),
                                row.label(),
                                row.result.recall(),
                                100.0 * row.result.ratio(row.result.hits()),
                                row.result.seconds,
                                row.result.floor.map_or(String::new(), |f| format!(
                                    " floor: est {:.3} low {:.3} scale {:.4} {} shadow {}{}",
                                    f.estimate.recall,
                                    f.estimate.low,
                                    f.estimate.scale,
                                    f.estimate.state.name(),
                                    row.result.shadow_calls,
                                    row.result.relative_recall().map_or(String::new(), |r| format!(" relative {r:.3}"))
                                ))
                            )
                        });
                        done.lock().expect("poisoned").push((i, row));
                    }
                    Err(e) => {
                        *failed.lock().expect("poisoned") =
                            Some(format!("{dataset}/{backend_name} {}: {e}", job.policy));
                    }
                }
            });
        }
    });
    b.finish_and_clear();
    if let Some(e) = failed.into_inner().expect("poisoned") {
        return Err(e.into());
    }
    let mut rows = done.into_inner().expect("poisoned");
    rows.sort_by_key(|(i, _)| *i);
    Ok(rows.into_iter().map(|(_, r)| r).collect())
}

/// Mixed into the Potluck+ seed for the floor's shadow-check sampling (so `Seeds`,
/// printed in every report, stays as it was).
const FLOOR_SEED: u64 = 0x0f10_0a5e;

use experiment::{EF_LADDER, THRESHOLD_PAIRS, THRESHOLD_PERCENTILE};

/// Query filters checked for finding the nearest entry: the engine's default (its own
/// graph with the paper's m 4, efc 8, efs 16), hnsw_rs with the same parameters (the
/// authors' artifact), and a well-connected graph for contrast.
fn filter_check_params() -> Vec<FilterKind> {
    let (m, ef_construction, ef_search) = FilterKind::PAPER;
    vec![
        FilterKind::default(),
        FilterKind::HnswRs {
            m,
            ef_construction,
            ef_search,
        },
        FilterKind::Hnsw {
            m: 16,
            ef_construction: 100,
            ef_search: 16,
        },
    ]
}

/// Representatives (and as many look-ups) in the filter check.
const FILTER_CHECK_ENTRIES: usize = 5_000;

/// Memoised HNSW answers searched again to check that searches repeat.
const DETERMINISM_CHECK: usize = 200;

fn recall(mut args: RecallArgs) -> Fallible<()> {
    let started = Instant::now();
    let command = std::iter::once("cargo run -p bench --release --".to_string())
        .chain(std::env::args().skip(1))
        .collect::<Vec<_>>()
        .join(" ");
    let sources = args.dataset.take().unwrap_or_else(|| {
        if args.quick {
            vec![SYNTHETIC_QUICK]
        } else {
            vec![Source::Glove, SYNTHETIC]
        }
    });
    let requests = args.requests.unwrap_or(if args.quick {
        10_000
    } else {
        workload::DEFAULT_REQUESTS
    });
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let akerd = akerd_rows(&mut args)?;
    if let Some(&f) = args.recall_floors.first() {
        shards::floor::RecallFloor::new(args.floor_config(f))?;
    }
    let seeds = Seeds::from_base(args.common.seed);
    println!("seeds: {seeds}");
    println!(
        "k = {}, Δ = {}, {requests} requests, skews {:?}, {threads} threads, {} shards",
        args.common.k, args.delta, args.skews, args.shards
    );
    if let Some(a) = &akerd {
        println!("akerd rows: {}", a.settings());
    }
    std::fs::create_dir_all(&args.out)?;

    let mut rows: Vec<Row> = Vec::new();
    let mut summaries = Vec::new();
    for source in &sources {
        let run = SourceRun {
            args: &args,
            seeds,
            threads,
            akerd: akerd.as_ref(),
        };
        let (summary, source_rows) = run.all(source, requests)?;
        summaries.push(summary);
        rows.extend(source_rows);
        let header = header(&args, &command, seeds, requests, threads, started, &akerd);
        write_outputs(&args, &header, &summaries, &rows)?;
    }
    println!(
        "report: {} ({:.0} s in all)",
        args.out.join("report.md").display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// `--akerd-config`'s file, loaded and checked against the other options, with an
/// `akerd` policy added to both backends' lists; `None` without it. `--pools config`
/// and an `akerd` policy need the file.
fn akerd_rows(args: &mut RecallArgs) -> Fallible<Option<AkerdFile>> {
    let asks_akerd = args
        .policies
        .iter()
        .chain(&args.hnsw_policies)
        .any(|p| p.rule == Rule::Akerd);
    let Some(path) = &args.akerd_config else {
        if args.pools.contains(&PoolSpec::Config) {
            return Err("--pools config is the akerd file's own capacity: it needs \
                        --akerd-config FILE (the paper's policies have no config pool)"
                .into());
        }
        if asks_akerd {
            return Err("the akerd policy needs --akerd-config FILE".into());
        }
        return Ok(None);
    };
    let file = AkerdFile::load(path, args.common.metric)?;
    let akerd: Policy = "akerd".parse()?;
    for list in [&mut args.policies, &mut args.hnsw_policies] {
        if !list.contains(&akerd) {
            list.push(akerd);
        }
    }
    Ok(Some(file))
}

/// Timed phases of one data set's runs, for the report.
type Phases = Vec<(String, f64)>;

/// One data set's runs: the settings every step shares.
struct SourceRun<'a> {
    args: &'a RecallArgs,
    seeds: Seeds,
    threads: usize,
    /// `--akerd-config`: akerd rows run beside the paper's.
    akerd: Option<&'a AkerdFile>,
}

impl SourceRun<'_> {
    /// Neighbours per answer the paper rows' backend gives (`k + Δ`).
    fn paper_depth(&self) -> usize {
        self.args.common.k + self.args.delta
    }

    /// Neighbours per answer the akerd rows' backend gives (`k +` the file's Δ).
    fn akerd_depth(&self) -> Option<usize> {
        self.akerd.map(|a| self.args.common.k + a.delta())
    }

    /// Prepare the data set, then its streams, the exact-backend runs, the HNSW-backend
    /// runs and the filter check; its summary and rows.
    fn all(&self, source: &Source, requests: usize) -> Fallible<(DatasetSummary, Vec<Row>)> {
        let (args, k) = (self.args, self.args.common.k);
        // Exact truth as deep as any row's backend answers (the paper rows read a prefix:
        // the lists are sorted by distance, then id, whatever their depth).
        let depth = self.paper_depth().max(self.akerd_depth().unwrap_or(0));
        let (prep, load_s, gt_s) = prepare(source, &args.common, depth, self.seeds)?;
        let akerd = self
            .akerd
            .map(|a| a.setup(prep.base.dim))
            .transpose()
            .map_err(|e| format!("{}: {e}", prep.name))?;
        let mut phases: Phases = vec![
            ("load".to_string(), load_s),
            ("ground truth".to_string(), gt_s),
        ];
        let t = Instant::now();
        let streams = self.streams(&prep, requests, akerd.as_ref());
        phases.push(("streams + thresholds".into(), t.elapsed().as_secs_f64()));
        // Every share in objects, the same for every policy (akerd's too); `config`: the
        // akerd file's own budget.
        let pools: Vec<Pool> = args
            .pools
            .iter()
            .filter_map(|&p| match p {
                PoolSpec::Share(share) => {
                    let objects = (share * prep.base.n as f64).round() as usize;
                    Some((p, Capacity::Objects(objects.max(k + args.delta))))
                }
                PoolSpec::Config => akerd.as_ref().map(|a| (p, a.cache.capacity)),
            })
            .collect();
        let mut rows = Vec::new();
        if args.backend != BackendChoice::Hnsw {
            let t = Instant::now();
            rows.extend(self.exact_runs(&prep, &streams, &pools, akerd.as_ref())?);
            phases.push(("exact-backend runs".into(), t.elapsed().as_secs_f64()));
        }
        let mut hnsw = None;
        if args.backend != BackendChoice::Exact {
            let (hnsw_rows, summary) =
                self.hnsw_runs(&prep, &streams, &pools, akerd.as_ref(), &mut phases)?;
            rows.extend(hnsw_rows);
            hnsw = Some(summary);
        }
        let t = Instant::now();
        let filter_checks = filter_checks(&prep.name, &streams[0].workload, args.common.metric);
        phases.push(("filter check".into(), t.elapsed().as_secs_f64()));
        let summary = dataset_summary(
            source,
            &prep,
            &streams,
            args.common.metric,
            hnsw,
            filter_checks,
            phases,
        );
        Ok((summary, rows))
    }

    /// The simZipf streams of every skew, with exact truth and Proximity+'s threshold.
    fn streams(&self, prep: &Prepared, requests: usize, akerd: Option<&AkerdSetup>) -> Vec<Stream> {
        let (args, seeds, k) = (self.args, self.seeds, self.args.common.k);
        let routing: Arc<[f32]> = prep.base.sample(experiment::ROUTING_SAMPLE_ROWS).into();
        let akerd_routing: Arc<[f32]> = match akerd {
            Some(a) if a.sample_rows != experiment::ROUTING_SAMPLE_ROWS => {
                prep.base.sample(a.sample_rows).into()
            }
            _ => routing.clone(),
        };
        args.skews
            .iter()
            .map(|&skew| {
                let workload = match args.phase_skew {
                    Some(second) => workload::sim_zipf_phased(
                        &prep.groups,
                        requests,
                        skew,
                        second,
                        args.phase_other_groups,
                        seeds.stream,
                    ),
                    None => workload::sim_zipf(&prep.groups, requests, skew, seeds.stream),
                };
                let truth = prep.truth_ids(&workload, k);
                let threshold = experiment::inter_query_percentile(
                    &workload,
                    args.common.metric,
                    THRESHOLD_PAIRS,
                    THRESHOLD_PERCENTILE,
                    seeds.threshold,
                );
                println!(
                    "[{}] skew {skew:.2}: {} distinct vectors, Proximity+ threshold {threshold}",
                    prep.name,
                    workload.n_vectors()
                );
                Stream {
                    skew,
                    workload,
                    truth,
                    threshold,
                    routing: routing.clone(),
                    akerd_routing: akerd_routing.clone(),
                }
            })
            .collect()
    }

    /// Every policy and pool against the precomputed exact answers.
    fn exact_runs(
        &self,
        prep: &Prepared,
        streams: &[Stream],
        pools: &[Pool],
        akerd: Option<&AkerdSetup>,
    ) -> Fallible<Vec<Row>> {
        let exact = PrecomputedBackend::new(
            prep.base.dim,
            self.args.common.metric,
            prep.base.n,
            &prep.groups.members,
            prep.member_truth.clone(),
        );
        // On ip a threshold is an angle to the answer's results, which takes their
        // vectors at admission whether the cache keeps them or not (`shards::gap`).
        let ip = self.args.common.metric == Metric::InnerProduct;
        let with_vectors = WithVectors::new(&exact, &prep.base);
        let both = StreamBackends {
            paper: if ip { &with_vectors } else { &exact },
            akerd: if ip || akerd.is_some_and(|a| a.cache.store_vectors) {
                &with_vectors
            } else {
                &exact
            },
        };
        let js = jobs(
            streams.len(),
            pools,
            &self.args.policies,
            &self.args.recall_floors,
        );
        let backends = vec![both; streams.len()];
        let (args, seeds, threads) = (self.args, self.seeds, self.threads);
        let run = |js: &[Job]| {
            run_jobs(
                js, streams, &backends, akerd, "exact", &prep.name, args, seeds, threads,
            )
        };
        if args.equal_bytes {
            at_equal_bytes(&js, streams, &run)
        } else {
            run(&js)
        }
    }

    /// An HNSW index over the collection, `ef` tuned per stream, its answers memoised,
    /// then every HNSW policy and pool against them.
    fn hnsw_runs(
        &self,
        prep: &Prepared,
        streams: &[Stream],
        pools: &[Pool],
        akerd: Option<&AkerdSetup>,
        phases: &mut Phases,
    ) -> Fallible<(Vec<Row>, HnswSummary)> {
        let (args, name) = (self.args, &prep.name);
        let t = Instant::now();
        let sp = spinner(&format!(
            "{name}: building HNSW (m {}, efc {})",
            args.hnsw.hnsw_m, args.hnsw.hnsw_ef_construction
        ));
        let mut store = HnswStore::build(
            prep.base.dim,
            args.common.metric,
            &prep.base.data,
            args.hnsw.hnsw_m,
            args.hnsw.hnsw_ef_construction,
            EF_LADDER[0],
        )?;
        sp.finish_and_clear();
        let build_s = t.elapsed().as_secs_f64();
        println!("[{name}] HNSW built in {build_s:.1} s");
        phases.push(("HNSW build".into(), build_s));

        let t = Instant::now();
        let (tuned, memos) = self.tune_and_memoise(prep, streams, &mut store)?;
        phases.push(("ef sweeps + HNSW answers".into(), t.elapsed().as_secs_f64()));

        let t = Instant::now();
        // akerd rows: the HNSW answers at their own depth, vectors attached if stored.
        let akerd_memos: Vec<&(dyn Backend + Sync)> = memos
            .iter()
            .map(|(paper, deeper)| deeper.as_ref().unwrap_or(paper) as &(dyn Backend + Sync))
            .collect();
        let with_vectors: Vec<WithVectors> = akerd_memos
            .iter()
            .map(|&m| WithVectors::new(m, &prep.base))
            .collect();
        let paper_vectors: Vec<WithVectors> = memos
            .iter()
            .map(|(paper, _)| WithVectors::new(paper, &prep.base))
            .collect();
        // Vectors where the cache keeps them, and on ip always (see `exact_runs`).
        let ip = args.common.metric == Metric::InnerProduct;
        let stores_vectors = ip || akerd.is_some_and(|a| a.cache.store_vectors);
        let backends: Vec<StreamBackends> = memos
            .iter()
            .zip(&akerd_memos)
            .zip(with_vectors.iter().zip(&paper_vectors))
            .map(
                |(((paper, _), &deeper), (vectors, paper_vectors))| StreamBackends {
                    paper: if ip { paper_vectors } else { paper },
                    akerd: if stores_vectors { vectors } else { deeper },
                },
            )
            .collect();
        let js = jobs(
            streams.len(),
            pools,
            &args.hnsw_policies,
            &args.recall_floors,
        );
        let (seeds, threads) = (self.seeds, self.threads);
        let run = |js: &[Job]| {
            run_jobs(
                js, streams, &backends, akerd, "hnsw", name, args, seeds, threads,
            )
        };
        let rows = if args.equal_bytes {
            at_equal_bytes(&js, streams, &run)?
        } else {
            run(&js)?
        };
        phases.push(("HNSW-backend runs".into(), t.elapsed().as_secs_f64()));
        let summary = HnswSummary {
            m: args.hnsw.hnsw_m,
            ef_construction: args.hnsw.hnsw_ef_construction,
            build_seconds: build_s,
            samples: args.hnsw.ef_samples,
            target: args.hnsw.target_recall,
            streams: tuned,
        };
        Ok((rows, summary))
    }

    /// Per stream, as the paper tunes "for each workload": ef from requests sampled from
    /// the stream (so hot groups weigh as in the stream), then every distinct vector
    /// searched once and the runs served from those answers (a static index answers a
    /// repeated question identically; checked here on the first vectors). With akerd
    /// rows whose `k + Δ` differs from the paper rows', their answers are searched
    /// once more at that depth (an HNSW search for more results is not a prefix of
    /// one for fewer: it searches with `ef` at least the results asked for).
    #[allow(clippy::type_complexity)]
    fn tune_and_memoise(
        &self,
        prep: &Prepared,
        streams: &[Stream],
        store: &mut HnswStore,
    ) -> Fallible<(
        Vec<HnswStream>,
        Vec<(PrecomputedBackend, Option<PrecomputedBackend>)>,
    )> {
        let (args, name, k) = (self.args, &prep.name, self.args.common.k);
        let mut tuned = Vec::new();
        let mut memos = Vec::new();
        for (i, st) in streams.iter().enumerate() {
            let seed = self.seeds.ef_sample + i as u64;
            let picks = request_samples(&st.workload, args.hnsw.ef_samples, seed);
            let samples: Vec<(&[f32], &[u64])> = picks
                .iter()
                .map(|&r| (st.workload.vector(r), st.truth[r as usize].as_slice()))
                .collect();
            let sweep =
                experiment::tune_ef(store, &samples, k, args.hnsw.target_recall, &EF_LADDER)?;
            let chosen = *sweep.last().expect("the ladder is not empty");
            let n = st.workload.n_vectors();
            let b = bar(n as u64, &format!("{name} {:.2}: HNSW answers", st.skew));
            let depth = k + args.delta;
            let memo = PrecomputedBackend::memoise(
                store,
                &st.workload.vectors,
                depth,
                self.threads,
                &|n| b.inc(n as u64),
            )?;
            b.finish_and_clear();
            let checked = n.min(DETERMINISM_CHECK);
            let again = &st.workload.vectors[..checked * prep.base.dim];
            let disagreements = memo.disagreements(store, again, depth)?;
            println!(
                "[{name}] skew {:.2}: ef {} (recall@{k} {:.3} on {} sampled requests); {n} vectors searched, {disagreements} of {checked} differ when searched again",
                st.skew,
                chosen.ef,
                chosen.recall,
                samples.len()
            );
            tuned.push(HnswStream {
                skew: st.skew,
                sweep,
                memoised: n,
                checked,
                disagreements,
            });
            let deeper = match self.akerd_depth().filter(|&d| d != depth) {
                Some(d) => {
                    let b = bar(n as u64, &format!("{name} {:.2}: akerd answers", st.skew));
                    let m = PrecomputedBackend::memoise(
                        store,
                        &st.workload.vectors,
                        d,
                        self.threads,
                        &|n| b.inc(n as u64),
                    )?;
                    b.finish_and_clear();
                    Some(m)
                }
                None => None,
            };
            memos.push((memo, deeper));
        }
        Ok((tuned, memos))
    }
}

/// Why the HNSW filter finds fewer approximate hits than the brute-force one: the
/// paper's parameters, and a well-connected graph for contrast.
fn filter_checks(name: &str, w: &Workload, metric: Metric) -> Vec<(FilterKind, usize, f64)> {
    filter_check_params()
        .into_iter()
        .map(|kind| {
            let (n, share) =
                experiment::filter_nearest_share(w, metric, kind, FILTER_CHECK_ENTRIES);
            println!(
                "[{name}] filter {kind}: nearest entry first for {:.1}% of {n} look-ups",
                100.0 * share
            );
            (kind, n, share)
        })
        .collect()
}

fn dataset_summary(
    source: &Source,
    prep: &Prepared,
    streams: &[Stream],
    metric: Metric,
    hnsw: Option<HnswSummary>,
    filter_checks: Vec<(FilterKind, usize, f64)>,
    phases: Phases,
) -> DatasetSummary {
    let truth_from = if prep.truth_loaded {
        "loaded from the cache"
    } else {
        "computed"
    };
    DatasetSummary {
        name: prep.name.clone(),
        description: source.describe(),
        bases: prep.bases.clone(),
        collection: prep.base.n,
        dim: prep.base.dim,
        metric,
        members: prep.members(),
        truth: format!(
            "exact top-{} by brute force, {truth_from} ({})",
            prep.depth,
            prep.truth_path.display()
        ),
        skews: streams
            .iter()
            .map(|s| SkewSummary {
                skew: s.skew,
                distinct: s.workload.n_vectors(),
                threshold: s.threshold,
            })
            .collect(),
        hnsw,
        filter_checks,
        phases,
    }
}

/// `n` request positions of `w` drawn uniformly with replacement: the vectors they
/// name weigh as much as they do in the stream.
fn request_samples(w: &Workload, n: usize, seed: u64) -> Vec<u32> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| w.requests[rng.gen_range(0..w.requests.len())])
        .collect()
}

/// The backends a run reports on, in order.
fn backend_names(b: BackendChoice) -> Vec<String> {
    match b {
        BackendChoice::Exact => vec!["exact".into()],
        BackendChoice::Hnsw => vec!["hnsw".into()],
        BackendChoice::Both => vec!["exact".into(), "hnsw".into()],
    }
}

/// The report's header: the paper configuration's settings, and akerd's when its rows
/// ran.
#[allow(clippy::too_many_arguments)]
fn header(
    args: &RecallArgs,
    command: &str,
    seeds: Seeds,
    requests: usize,
    threads: usize,
    started: Instant,
    akerd: &Option<AkerdFile>,
) -> Header {
    Header {
        command: command.to_string(),
        seeds: seeds.to_string(),
        k: args.common.k,
        delta: args.delta,
        filter_candidates: args.filter_candidates,
        standby_search: args.standby_search.engine(),
        shards: args.shards as usize,
        potluck: (args.potluck_grow, args.potluck_shrink),
        requests,
        pools: args.pools.clone(),
        akerd: akerd.as_ref().map(AkerdFile::settings),
        backends: backend_names(args.backend),
        threads,
        total_seconds: started.elapsed().as_secs_f64(),
        floors: args.recall_floors.clone(),
        floor_sample: args.floor_sample,
        floor_window: args.floor_window as usize,
        phase: args.phase_skew.map(|s| (s, args.phase_other_groups)),
    }
}

/// Writes report.md, results.csv and the figures for everything measured so far (after
/// each data set, so a long run leaves its finished part behind).
fn write_outputs(
    args: &RecallArgs,
    header: &Header,
    summaries: &[DatasetSummary],
    rows: &[Row],
) -> Fallible<()> {
    std::fs::write(
        args.out.join("report.md"),
        report::markdown(header, summaries, rows),
    )?;
    std::fs::write(args.out.join("results.csv"), report::csv(rows))?;
    if args.floors_on() {
        std::fs::write(
            args.out.join("floor-series.csv"),
            report::series_csv(rows, args.phase_skew),
        )?;
    }
    for d in summaries {
        for backend in &header.backends {
            let policies: Vec<String> = if backend == "exact" {
                &args.policies
            } else {
                &args.hnsw_policies
            }
            .iter()
            .map(|p| p.to_string())
            .collect();
            if !rows
                .iter()
                .any(|r| r.dataset == d.name && &r.backend == backend)
            {
                continue;
            }
            let fig = Figure {
                rows,
                dataset: &d.name,
                backend,
                skews: &args.skews,
                pools: &header.pools,
                policies: &policies,
            };
            // `glove/unit` -> recall-glove-unit-exact.png
            let stem = prep_mod::file_stem(&d.name);
            plot::recall_figure(&fig, &args.out.join(format!("recall-{stem}-{backend}.png")))?;
            plot::hits_figure(&fig, &args.out.join(format!("hits-{stem}-{backend}.png")))?;
            // Swept policies (`aker:...`, `guarded...`): their recall-vs-hits frontiers.
            if policies
                .iter()
                .any(|p| p.starts_with("guarded") || p.starts_with("aker:"))
            {
                for &pool in &header.pools {
                    let tag = pool.to_string().replace('%', "pct");
                    let path = args
                        .out
                        .join(format!("frontier-{stem}-{backend}-{tag}.png"));
                    plot::frontier_figure(&fig, pool, &path)?;
                }
            }
        }
    }
    Ok(())
}

/// A share such as `5%` or `0.05` in `[0, 1)`.
fn parse_share(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let share = match t.strip_suffix('%') {
        Some(p) => p.parse::<f64>().map(|p| p / 100.0),
        None => t.parse::<f64>(),
    }
    .map_err(|e| format!("'{s}': {e} (a share such as 5% or 0.05)"))?;
    if (0.0..1.0).contains(&share) {
        Ok(share)
    } else {
        Err(format!("'{s}' is not a share in [0, 100%)"))
    }
}

#[derive(clap::Args)]
struct UpdatesArgs {
    #[command(flatten)]
    common: Common,
    /// Data sets, as for `recall` [default: glove,synthetic; with --quick a small
    /// synthetic set].
    #[arg(long, value_delimiter = ',')]
    dataset: Option<Vec<Source>>,
    /// Deletion rates: shares of the collection deleted after the warm-up (random ids of
    /// the collection and the insert set, nested), one run per rate and policy.
    #[arg(long, value_delimiter = ',', default_value = "0,5%,10%,25%", value_parser = parse_share)]
    deletes: Vec<f64>,
    /// Share of the data set held out and inserted after the warm-up.
    #[arg(long, default_value = "5%", value_parser = parse_share)]
    inserts: f64,
    /// Pool capacity in objects, as a share of the collection.
    #[arg(long, default_value = "1%", value_parser = parse_share)]
    pool: f64,
    /// Zipfian exponent of the stream.
    #[arg(long, default_value_t = 0.99)]
    skew: f64,
    /// Requests per phase (the warm-up, then the same stream again) [default: 100000;
    /// with --quick 10000].
    #[arg(long)]
    requests: Option<usize>,
    /// Policies: ak-dN (paper-Aker, reserve Δ = N), ak-rd (Δ 0, refresh off: the
    /// paper's no-refresh ablation), plNN (Potluck+, p = NN %, Δ 0, no refresh), none;
    /// an ak-dN name takes :risk=R (τ_risk).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "ak-d10,ak-d30,ak-rd,ak-d0,pl10,none"
    )]
    policies: Vec<UpdatePolicy>,
    /// τ_risk values ak-d10 also runs at, at the second deletion rate (insert visibility
    /// against the risk threshold; exact backend).
    #[arg(long, value_delimiter = ',', default_value = "0.1,1,3")]
    risks: Vec<f64>,
    /// Δ values run at equal pool bytes (what ak-d10 took after its warm-up) per
    /// deletion rate (exact backend); empty: none.
    #[arg(long, value_delimiter = ',', default_value = "0,2,5,10,20,30")]
    delta_sweep: Vec<usize>,
    /// Backends: exact (prepared exact answers), hnsw (one graph over the collection and
    /// the insert set, ids not live filtered out), or both.
    #[arg(long, value_enum, default_value = "both")]
    backend: BackendChoice,
    #[command(flatten)]
    hnsw: HnswArgs,
    /// Runs in parallel (each run is single-threaded) [default: all cores].
    #[arg(long)]
    threads: Option<usize>,
    /// Small smoke configuration: a 20,000 x 16 synthetic set and 10,000 requests.
    #[arg(long)]
    quick: bool,
    /// Output folder for report.md, the per-set reports, CSVs and figures.
    #[arg(long, default_value = "bench/results/updates")]
    out: PathBuf,
    /// Instead of the runs: write, per data set, the traces of the same scenario end to
    /// end through akerd into DIR: `<set>-collection.fvecs` (what akerd loads),
    /// `<set>-warm.trace`, and per --trace-writes share `<set>-writes-<P>.trace` (the
    /// stream with inserts and deletes mixed in) and `<set>-replay-<P>.trace` (the stream
    /// with ground truth as of after those writes).
    #[arg(long, value_name = "DIR")]
    traces: Option<PathBuf>,
    /// Shares of writes among the middle trace's operations (--traces).
    #[arg(long, value_delimiter = ',', default_value = "1%,10%", value_parser = parse_share)]
    trace_writes: Vec<f64>,
}

/// `bench updates --traces DIR`: the end-to-end traces of `sc` (`Scenario::traces`).
fn write_update_traces(sc: &Scenario, shares: &[f64], dir: &Path) -> Fallible<()> {
    std::fs::create_dir_all(dir)?;
    let stem = prep_mod::file_stem(&sc.name);
    let collection = aker_formats::data::Dataset::new(
        sc.union.dim,
        sc.union.data[..sc.collection * sc.union.dim].to_vec(),
    )?;
    write_fvecs(&dir.join(format!("{stem}-collection.fvecs")), &collection)?;
    for (i, &share) in shares.iter().enumerate() {
        let set = sc.traces(share)?;
        let pct = format!("{}pct", (share * 100.0).round());
        if i == 0 {
            set.warm.save(&dir.join(format!("{stem}-warm.trace")))?;
        }
        set.writes
            .save(&dir.join(format!("{stem}-writes-{pct}.trace")))?;
        set.replay
            .save(&dir.join(format!("{stem}-replay-{pct}.trace")))?;
        println!(
            "[{}] {pct}: {} searches, {} inserts, {} deletes per phase -> {}",
            sc.name,
            sc.workload.requests.len(),
            set.inserts,
            set.deletes,
            dir.display()
        );
    }
    Ok(())
}

impl UpdatesArgs {
    /// What the runs need, checked before any data is loaded.
    fn validate(&self) -> Fallible<()> {
        if self.pool <= 0.0 {
            return Err("--pool must be above 0".into());
        }
        if self.requests == Some(0) {
            return Err("--requests must be at least 1".into());
        }
        if self.deletes.is_empty() {
            return Err("--deletes needs at least one rate".into());
        }
        if let Some(r) = self.risks.iter().find(|r| !(r.is_finite() && **r > 0.0)) {
            return Err(format!("--risks: {r} is not above 0").into());
        }
        let has_d10 = self.policies.iter().any(|p| p.to_string() == "ak-d10");
        if !has_d10 && (!self.delta_sweep.is_empty() || !self.risks.is_empty()) {
            return Err(
                "--delta-sweep and --risks run beside ak-d10: add it to --policies or empty them"
                    .into(),
            );
        }
        let delta_max = self
            .policies
            .iter()
            .map(|p| p.delta())
            .chain(self.delta_sweep.iter().copied())
            .max()
            .unwrap_or(0);
        let depth = bench::updates::DEPTH;
        if 2 * (self.common.k + delta_max) > depth {
            return Err(format!(
                "k + the largest Δ ({}) is above {} (half the prepared depth, {depth}): every miss would scan",
                self.common.k + delta_max,
                depth / 2
            )
            .into());
        }
        if let Some(w) = self
            .trace_writes
            .iter()
            .find(|w| ((**w * 100.0).round() - **w * 100.0).abs() > 1e-9 || **w == 0.0)
        {
            return Err(format!("--trace-writes: {w} is not a whole percent above 0").into());
        }
        Ok(())
    }
}

fn updates(args: UpdatesArgs) -> Fallible<()> {
    args.validate()?;
    let c = &args.common;
    let seeds = Seeds::from_base(c.seed);
    let sources = match (&args.dataset, args.quick) {
        (Some(d), _) => d.clone(),
        (None, true) => vec![SYNTHETIC_QUICK],
        (None, false) => vec![Source::Glove, SYNTHETIC],
    };
    let requests = args.requests.unwrap_or(if args.quick {
        10_000
    } else {
        workload::DEFAULT_REQUESTS
    });
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |p| p.get()))
        .max(1);
    let mut rates = args.deletes.clone();
    rates.sort_by(f64::total_cmp);
    rates.dedup();
    let mut report = format!(
        "# The cache under updates (paper §5.4)\n\nCommand: `bench {}`; seeds: {seeds}.\n\n",
        std::env::args().skip(1).collect::<Vec<_>>().join(" ")
    );
    for source in &sources {
        let t = Instant::now();
        let mut all = source.load(&c.data_dir, seeds.synthetic)?;
        if c.normalize {
            all.normalize_rows();
        }
        let name = prep_mod::dataset_name(source, c.normalize);
        let bases = c.bases()?;
        let (rows, base_rows) = bases.split(&name, &all, seeds)?;
        let mut timings = vec![("load".to_string(), t.elapsed().as_secs_f64())];
        let t = Instant::now();
        let b = bar(
            requests as u64,
            &format!("{name}: exact top-{}", bench::updates::DEPTH),
        );
        let spec = ScenarioSpec {
            name: name.clone(),
            metric: c.metric,
            k: c.k,
            bases: &base_rows,
            rows: &rows,
            insert_share: args.inserts,
            requests,
            skew: args.skew,
            unit_requests: c.normalize,
            seeds,
            cache_dir: &c.cache_dir,
        };
        let sc = Scenario::prepare(&spec, &|n| b.inc(n as u64))?;
        b.finish_and_clear();
        timings.push((
            "split, stream, ground truth".into(),
            t.elapsed().as_secs_f64(),
        ));
        println!(
            "[{name}] collection {} + {} inserts, {} distinct vectors in the stream",
            sc.collection,
            sc.union.n - sc.collection,
            sc.workload.n_vectors()
        );
        if let Some(dir) = &args.traces {
            write_update_traces(&sc, &args.trace_writes, dir)?;
            continue;
        }
        let settings = UpdateSettings {
            rates: rates.clone(),
            pool_share: args.pool,
            policies: args.policies.clone(),
            risks: args.risks.clone(),
            delta_sweep: args.delta_sweep.clone(),
            exact: args.backend != BackendChoice::Hnsw,
            hnsw: args.backend != BackendChoice::Exact,
            hnsw_m: args.hnsw.hnsw_m,
            hnsw_ef_construction: args.hnsw.hnsw_ef_construction,
            target_recall: args.hnsw.target_recall,
            ef_samples: args.hnsw.ef_samples,
            threads,
            seed: seeds.potluck,
            out: args.out.clone(),
            describe: format!("{}; {}.", source.describe(), bases.origin().describe()),
        };
        let rows = bench::updates_report::run_dataset(&sc, &settings, &mut timings)?;
        let text = bench::updates_report::write(&sc, &settings, &rows, &timings)?;
        report.push_str(&text);
        fs_write(&args.out.join("report.md"), &report)?;
        let dead: u64 = rows.iter().map(|r| r.result.dead_served()).sum();
        if dead > 0 {
            return Err(format!("{name}: {dead} replies carried a deleted id").into());
        }
    }
    if args.traces.is_none() {
        println!("report: {}", args.out.join("report.md").display());
    }
    Ok(())
}

fn fs_write(path: &Path, text: &str) -> Fallible<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, text)?;
    Ok(())
}

fn trace(args: TraceArgs) -> Fallible<()> {
    let c = &args.common;
    let seeds = Seeds::from_base(c.seed);
    println!("seeds: {seeds}");
    let (prep, _, _) = prepare(&args.dataset, c, c.k, seeds)?;
    let w = workload::sim_zipf(&prep.groups, args.requests, args.skew, seeds.stream);
    let mut t = w.to_trace(c.metric, u32::try_from(c.k)?);
    t.set_ground_truth(&prep.truth_lists(&w));
    t.save(&args.out)?;
    if let Some(path) = &args.base_out {
        write_fvecs(path, &prep.base)?;
        println!(
            "wrote {}: the collection, {} x {}",
            path.display(),
            prep.base.n,
            prep.base.dim
        );
    }
    println!(
        "wrote {}: {} searches over {} distinct vectors ({}, skew {:.2}, k {}), exact ground truth",
        args.out.display(),
        t.ops.len(),
        t.n_vectors(),
        prep.name,
        args.skew,
        c.k
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recall_args(extra: &[&str]) -> RecallArgs {
        let argv = ["bench", "recall"].iter().chain(extra).copied();
        match Cli::try_parse_from(argv).unwrap().cmd {
            Cmd::Recall(a) => a,
            _ => unreachable!("not recall"),
        }
    }

    fn shipped() -> String {
        format!("{}/../ops/akerd.toml", env!("CARGO_MANIFEST_DIR"))
    }

    #[test]
    fn pools_config_parses_and_needs_an_akerd_file() {
        let mut a = recall_args(&["--pools", "config,1%", "--normalize"]);
        assert_eq!(a.pools, vec![PoolSpec::Config, PoolSpec::Share(0.01)]);
        assert!(a.common.normalize);
        let e = akerd_rows(&mut a).unwrap_err().to_string();
        assert!(e.contains("--akerd-config"), "{e}");
        let mut a = recall_args(&["--policies", "aker,akerd"]);
        assert!(
            akerd_rows(&mut a).is_err(),
            "the akerd policy needs the file"
        );
        assert!(Cli::try_parse_from(["bench", "recall", "--pools", "0%"]).is_err());

        let mut a = recall_args(&["--pools", "config,1%", "--akerd-config", &shipped()]);
        let file = akerd_rows(&mut a).unwrap().unwrap();
        assert_eq!(file.shards(), 2);
        let akerd: Policy = "akerd".parse().unwrap();
        assert_eq!(a.policies.last(), Some(&akerd));
        assert_eq!(
            a.hnsw_policies,
            vec!["aker".parse().unwrap(), "none".parse().unwrap(), akerd]
        );
        // Listed already: not twice.
        let mut a = recall_args(&["--policies", "akerd,none", "--akerd-config", &shipped()]);
        akerd_rows(&mut a).unwrap();
        assert_eq!(a.policies.iter().filter(|p| **p == akerd).count(), 1);
    }

    #[test]
    fn floor_flags_parse_and_add_one_row_per_floor() {
        let a = recall_args(&[]);
        assert!(a.recall_floors.is_empty() && !a.floors_on());
        assert_eq!(a.floor_sample, 0.05);
        assert_eq!((a.floor_window, a.phase_skew), (5_000, None));
        let a = recall_args(&[
            "--recall-floors",
            "0.9,0.95, 0.98",
            "--floor-sample",
            "0.1",
            "--floor-window",
            "1000",
            "--phase-skew",
            "0.30",
            "--phase-other-groups",
        ]);
        assert_eq!(a.recall_floors, vec![0.9, 0.95, 0.98]);
        assert_eq!(a.floor_sample, 0.1);
        assert_eq!(a.floor_window, 1_000);
        assert_eq!((a.phase_skew, a.phase_other_groups), (Some(0.30), true));
        let c = a.floor_config(0.95);
        assert_eq!((c.floor, c.sample), (0.95, 0.1));
        assert_eq!(
            c,
            FloorConfig {
                floor: 0.95,
                sample: 0.1,
                ..FloorConfig::default()
            }
        );
        for bad in [
            &["--recall-floors", "1.0"][..],
            &["--recall-floors", "-0.1"],
            &["--recall-floors", "0.9,x"],
            &["--floor-window", "0"],
            &["--phase-other-groups"],
        ] {
            let argv = ["bench", "recall"].iter().chain(bad).copied();
            assert!(Cli::try_parse_from(argv).is_err(), "{bad:?}");
        }
        // A sample out of range parses, and is refused by the floor's own validation.
        let a = recall_args(&["--recall-floors", "0.9", "--floor-sample", "0"]);
        assert!(shards::floor::RecallFloor::new(a.floor_config(0.9)).is_err());

        let pools = [
            (PoolSpec::Share(0.01), Capacity::Objects(100)),
            (PoolSpec::Share(0.05), Capacity::Objects(500)),
        ];
        let policies: Vec<Policy> = ["aker", "none"]
            .iter()
            .map(|p| p.parse().unwrap())
            .collect();
        let js = jobs(1, &pools, &policies, &[0.9, 0.95]);
        // aker: (plain + 2 floors) x 2 pools; none: once, no floor.
        assert_eq!(js.len(), 7);
        let floors = |rule| {
            js.iter()
                .filter(|j| j.policy.rule == rule)
                .map(|j| j.floor)
                .collect::<Vec<_>>()
        };
        assert_eq!(floors(Rule::NoCache), vec![None]);
        let aker = floors(Rule::Aker);
        for f in [None, Some(0.9), Some(0.95)] {
            assert_eq!(aker.iter().filter(|&&x| x == f).count(), 2, "{f:?}");
        }
        assert_eq!(jobs(1, &pools, &policies, &[]).len(), 3);
    }

    #[test]
    fn a_metric_the_akerd_file_contradicts_is_refused() {
        let mut a = recall_args(&["--metric", "cosine", "--akerd-config", &shipped()]);
        let e = akerd_rows(&mut a).unwrap_err().to_string();
        assert!(e.contains("cache.metric") && e.contains("cosine"), "{e}");
    }

    #[test]
    fn only_akerd_rows_run_the_config_pool() {
        let pools = [
            (PoolSpec::Share(0.01), Capacity::Objects(100)),
            (PoolSpec::Config, Capacity::Bytes(1 << 20)),
        ];
        let policies: Vec<Policy> = ["aker", "akerd", "none"]
            .iter()
            .map(|p| p.parse().unwrap())
            .collect();
        let js = jobs(2, &pools, &policies, &[]);
        let count = |rule: Rule, pool: Option<PoolSpec>| {
            js.iter()
                .filter(|j| j.policy.rule == rule && j.pool.map(|(p, _)| p) == pool)
                .count()
        };
        assert_eq!(count(Rule::Aker, Some(PoolSpec::Share(0.01))), 2);
        assert_eq!(count(Rule::Aker, Some(PoolSpec::Config)), 0);
        assert_eq!(count(Rule::Akerd, Some(PoolSpec::Share(0.01))), 2);
        assert_eq!(count(Rule::Akerd, Some(PoolSpec::Config)), 2);
        assert_eq!(count(Rule::NoCache, None), 2);
        assert_eq!(js.len(), 8);
    }

    #[test]
    fn queries_groups_and_relative_default_paths_parse() {
        let a = recall_args(&[]);
        let c = &a.common;
        assert_eq!((c.queries.as_ref(), c.groups), (None, 1_000));
        assert_eq!(c.data_dir, PathBuf::from("data"));
        assert_eq!(c.cache_dir, PathBuf::from("data/cache"));
        assert_eq!(a.out, PathBuf::from("bench/results"));
        let a = recall_args(&["--queries", "q.fvecs", "--groups", "200"]);
        assert_eq!(a.common.queries, Some(PathBuf::from("q.fvecs")));
        assert_eq!(a.common.groups, 200);
        let argv = [
            "bench",
            "trace",
            "--out",
            "t.trace",
            "--queries",
            "q.npy",
            "--groups",
            "7",
        ];
        let Cmd::Trace(t) = Cli::try_parse_from(argv).unwrap().cmd else {
            unreachable!()
        };
        assert_eq!(t.common.queries, Some(PathBuf::from("q.npy")));
        assert_eq!(t.common.groups, 7);
        for bad in ["0", "-1", "x"] {
            assert!(Cli::try_parse_from(["bench", "recall", "--groups", bad]).is_err());
        }
    }
}
