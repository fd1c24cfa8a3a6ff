//! What the subcommands share: the options every experiment takes (`Common`, `HnswArgs`,
//! `BackendChoice`), the progress bars, and loading a data set with its exact ground
//! truth (`prepare`). One place, so that `recall`, `trace` and `updates` read the same
//! flags the same way.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bench::prepare::{self as prep_mod, Bases, Prepared, Seeds, Source};
use bench::workload;
use clap::ValueEnum;
use indicatif::{ProgressBar, ProgressStyle};
use shards::Metric;

/// What a subcommand returns: its error is printed as `bench: {e}`.
pub(crate) type Fallible<T> = Result<T, Box<dyn std::error::Error>>;

/// Options shared by both commands.
#[derive(clap::Args)]
pub(crate) struct Common {
    /// Distance: l2sq (squared L2), cosine (1 - cos) or ip (-dot). Cosine distance is
    /// scale-invariant, so group members (1 - λ)·q + λ·p are not renormalised;
    /// --normalize normalises them.
    #[arg(long, default_value = "l2sq")]
    pub(crate) metric: Metric,
    /// Results per request.
    #[arg(long, default_value_t = 10)]
    pub(crate) k: usize,
    /// Base seed; every random choice derives from it (printed).
    #[arg(long, default_value_t = 42)]
    pub(crate) seed: u64,
    /// Where GloVe lives, relative to the working directory (`ops/get-glove.sh` puts
    /// it in the repository's data/).
    #[arg(long, default_value = "data")]
    pub(crate) data_dir: PathBuf,
    /// Where exact ground truth is cached between runs, relative to the working
    /// directory (created if missing).
    #[arg(long, default_value = "data/cache")]
    pub(crate) cache_dir: PathBuf,
    /// Scale every vector of the data set (and of --queries) to unit L2 norm (a zero
    /// vector stays zero) before the hold-out, groups and ground truth, and every
    /// request (simZipf member) too; the set is named e.g. `glove/unit`.
    #[arg(long)]
    pub(crate) normalize: bool,
    /// A .npy or .fvecs file whose first --groups rows are the simZipf group bases (the
    /// partners are drawn from the same rows); the WHOLE data set is then the
    /// collection, nothing held out. Without it, --groups rows of the data set are held
    /// out as the bases and only the rest is the collection (the ids ground truth and
    /// --base-out refer to).
    #[arg(long, value_name = "FILE")]
    pub(crate) queries: Option<PathBuf>,
    /// Group bases (one simZipf group of 50 members each): the first N rows of
    /// --queries, or N rows held out of the data set without it.
    #[arg(
        long,
        value_name = "N",
        default_value_t = prep_mod::HELD_OUT as u64,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub(crate) groups: u64,
}

impl Common {
    /// The group bases `--queries` and `--groups` ask for.
    pub(crate) fn bases(&self) -> Fallible<Bases> {
        let groups = usize::try_from(self.groups)?;
        Ok(match &self.queries {
            Some(path) => Bases::from_file(path, groups, self.normalize)?,
            None => Bases::HeldOut(groups),
        })
    }
}

/// The HNSW backend's graph and how its `ef` is tuned (both experiments).
#[derive(clap::Args)]
pub(crate) struct HnswArgs {
    /// HNSW backend graph degree.
    #[arg(long, default_value_t = 16)]
    pub(crate) hnsw_m: usize,
    /// HNSW backend build breadth.
    #[arg(long, default_value_t = 128)]
    pub(crate) hnsw_ef_construction: usize,
    /// Recall@k the HNSW backend's ef is tuned to reach without a cache.
    #[arg(long, default_value_t = 0.9)]
    pub(crate) target_recall: f64,
    /// Requests per stream the ef sweep measures on.
    #[arg(long, default_value_t = 500)]
    pub(crate) ef_samples: usize,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum BackendChoice {
    Exact,
    Hnsw,
    Both,
}

pub(crate) fn bar(len: u64, what: &str) -> ProgressBar {
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

pub(crate) fn spinner(what: &str) -> ProgressBar {
    let s = ProgressBar::new_spinner();
    s.set_message(what.to_string());
    s.enable_steady_tick(Duration::from_millis(200));
    s
}

/// Loads `source` and finds every group member's exact top `depth`, with progress.
pub(crate) fn prepare(
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

pub(crate) fn fs_write(path: &Path, text: &str) -> Fallible<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, text)?;
    Ok(())
}
