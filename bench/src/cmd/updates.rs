//! `bench updates`: the cache under inserts and deletes (paper §5.4: Figure 18, Table 3,
//! Figure 19) per data set, or with `--traces` the same scenario written as traces for an
//! end-to-end run through akerd. The runs and the report are the library's
//! (`bench::updates`, `bench::updates_report`); this is the command line over them.

use std::path::{Path, PathBuf};
use std::time::Instant;

use aker_formats::data::write_fvecs;
use bench::prepare::{self as prep_mod, Seeds, Source, SYNTHETIC, SYNTHETIC_QUICK};
use bench::updates::{Scenario, ScenarioSpec, UpdatePolicy};
use bench::updates_report::Settings as UpdateSettings;
use bench::workload;

use crate::cmd::common::{bar, fs_write, BackendChoice, Common, Fallible, HnswArgs};

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
pub(crate) struct UpdatesArgs {
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

/// `bench updates`: every data set in turn, the report rewritten after each; with
/// `--traces` the traces instead of the runs.
pub(crate) fn run(args: UpdatesArgs) -> Fallible<()> {
    args.validate()?;
    let seeds = Seeds::from_base(args.common.seed);
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
        let (sc, describe, mut timings) = scenario(&args, source, requests, seeds)?;
        if let Some(dir) = &args.traces {
            write_update_traces(&sc, &args.trace_writes, dir)?;
            continue;
        }
        let settings = args.settings(rates.clone(), threads, seeds, describe);
        let rows = bench::updates_report::run_dataset(&sc, &settings, &mut timings)?;
        let text = bench::updates_report::write(&sc, &settings, &rows, &timings)?;
        report.push_str(&text);
        fs_write(&args.out.join("report.md"), &report)?;
        let dead: u64 = rows.iter().map(|r| r.result.dead_served()).sum();
        if dead > 0 {
            return Err(format!("{}: {dead} replies carried a deleted id", sc.name).into());
        }
    }
    if args.traces.is_none() {
        println!("report: {}", args.out.join("report.md").display());
    }
    Ok(())
}

/// Timed phases of one data set, for the report.
type Timings = Vec<(String, f64)>;

/// Loads `source`, splits it into collection and inserts and prepares the stream with
/// its ground truth; the scenario, where its group bases came from (for the report's
/// header) and the phases' times.
fn scenario(
    args: &UpdatesArgs,
    source: &Source,
    requests: usize,
    seeds: Seeds,
) -> Fallible<(Scenario, String, Timings)> {
    let c = &args.common;
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
    let describe = format!("{}; {}.", source.describe(), bases.origin().describe());
    Ok((sc, describe, timings))
}

impl UpdatesArgs {
    /// The runs' settings for one data set (`describe`: its origin, for the header).
    fn settings(
        &self,
        rates: Vec<f64>,
        threads: usize,
        seeds: Seeds,
        describe: String,
    ) -> UpdateSettings {
        UpdateSettings {
            rates,
            pool_share: self.pool,
            policies: self.policies.clone(),
            risks: self.risks.clone(),
            delta_sweep: self.delta_sweep.clone(),
            exact: self.backend != BackendChoice::Hnsw,
            hnsw: self.backend != BackendChoice::Exact,
            hnsw_m: self.hnsw.hnsw_m,
            hnsw_ef_construction: self.hnsw.hnsw_ef_construction,
            target_recall: self.hnsw.target_recall,
            ef_samples: self.hnsw.ef_samples,
            threads,
            seed: seeds.potluck,
            out: self.out.clone(),
            describe,
        }
    }
}
