//! Experiment building blocks: data sets, exact ground truth, the simZipf workload and
//! the trace file that the experiment runner writes and the load generator replays.

mod binio;
pub mod data;
pub mod groundtruth;
pub mod trace;
pub mod workload;
