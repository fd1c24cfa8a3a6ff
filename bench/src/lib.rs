//! Experiment building blocks: exact ground truth, the simZipf workload, and the recall
//! experiment itself (paper §5.2) with its report and figures, and the cache under
//! updates (§5.4, `updates`). Data sets and the trace
//! file it writes for the load generator are `aker_formats`'. The `bench` binary
//! (`src/main.rs`, its subcommands in `src/cmd/`) is the command line over them.

pub mod akerd;
pub mod engine_fixture;
pub mod experiment;
pub mod groundtruth;
pub mod plot;
pub mod precomputed;
pub mod prepare;
pub mod report;
pub mod updates;
pub mod updates_report;
pub mod workers;
pub mod workload;
