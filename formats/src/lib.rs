//! The file formats and generators that the daemon (`aker`), the experiment runner
//! (`bench`) and the load generator (`loadgen`) share, without pulling in any of them:
//!
//! - [`data`]: the in-memory [`data::Dataset`], the `.npy` / `.fvecs` readers, the
//!   `.fvecs` writer, the seeded synthetic generators and the base / query split.
//! - [`trace`]: the trace file the runner writes and the load generator replays
//!   (`TRACE.md` beside this crate's `Cargo.toml`).
//! - [`zipf`]: YCSB's Zipfian and scrambled Zipfian rank generators.
//! - [`binio`]: the little-endian helpers behind the binary formats.

pub mod binio;
pub mod data;
pub mod trace;
pub mod zipf;
