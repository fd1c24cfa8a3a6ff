//! The experiment runner: the command line and its dispatch; each subcommand lives in
//! `cmd/` (options, the run, its outputs), what they share in `cmd/common.rs`.
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
//! - `bench updates`: the cache under inserts and deletes (paper §5.4).

// mimalloc, keeping the memory it frees: see allocator/src/lib.rs.
#[global_allocator]
static ALLOCATOR: aker_alloc::MiMalloc = aker_alloc::MiMalloc;

mod cmd;

use clap::{Parser, Subcommand};

use cmd::recall::RecallArgs;
use cmd::trace::TraceArgs;
use cmd::updates::UpdatesArgs;

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

fn main() {
    aker_alloc::keep_freed_memory();
    let cli = Cli::parse();
    let result = match cli.cmd {
        Cmd::Recall(a) => cmd::recall::run(a),
        Cmd::Trace(a) => cmd::trace::run(a),
        Cmd::Updates(a) => cmd::updates::run(a),
    };
    if let Err(e) = result {
        eprintln!("bench: {e}");
        std::process::exit(1);
    }
}
