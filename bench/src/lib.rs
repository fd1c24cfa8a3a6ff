//! Experiment building blocks: data sets, exact ground truth, the simZipf workload, the
//! trace file that the experiment runner writes and the load generator replays, and the
//! recall experiment itself (paper §5.2) with its report and figures. The `bench`
//! binary (`src/main.rs`) is the command line over them.

mod binio;
pub mod data;
pub mod engine_fixture;
pub mod experiment;
pub mod groundtruth;
pub mod plot;
pub mod precomputed;
pub mod prepare;
pub mod report;
pub mod trace;
pub mod workload;
