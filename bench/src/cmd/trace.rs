//! `bench trace`: one simZipf stream with exact ground truth as a trace file
//! (`formats/TRACE.md`) for the load generator, and optionally the collection it refers
//! to as `.fvecs`.

use std::path::PathBuf;

use aker_formats::data::write_fvecs;
use bench::prepare::{Seeds, Source};
use bench::workload;

use crate::cmd::common::{prepare, Common, Fallible};

#[derive(clap::Args)]
pub(crate) struct TraceArgs {
    #[command(flatten)]
    pub(crate) common: Common,
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

/// `bench trace`.
pub(crate) fn run(args: TraceArgs) -> Fallible<()> {
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
