//! `bench recall`: reproduces the paper's §5.2 (Figures 10 and 11): recall@k against
//! exact neighbours and hit ratios per data set x skew x pool x policy, on the exact and
//! the HNSW backend, with optional akerd rows (`--akerd-config`) and recall floors.
//! This file holds the options, the top-level loop and the outputs; one data set's
//! preparation and runs are `source`, the parallel runs themselves `jobs`.

mod jobs;
mod source;
#[cfg(test)]
mod tests;

use std::path::PathBuf;
use std::time::Instant;

use bench::akerd::AkerdFile;
use bench::experiment::{self, Policy, Rule};
use bench::plot::{self, Figure};
use bench::prepare::{self as prep_mod, Seeds, Source, SYNTHETIC, SYNTHETIC_QUICK};
use bench::report::{self, DatasetSummary, Header, PoolSpec, Row};
use bench::workload;
use clap::ValueEnum;
use shards::floor::FloorConfig;
use shards::StandbySearch;

use crate::cmd::common::{BackendChoice, Common, Fallible, HnswArgs};
use source::SourceRun;

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

#[derive(clap::Args)]
pub(crate) struct RecallArgs {
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

/// `bench recall`: every data set in turn, the report rewritten after each.
pub(crate) fn run(mut args: RecallArgs) -> Fallible<()> {
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
