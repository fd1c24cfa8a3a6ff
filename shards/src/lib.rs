//! The Aker cache engine. See `../shared/ALGORITHM.md` and the README's design section.
pub mod backend;
pub mod error;
pub mod metric;

pub use backend::{Backend, Candidate};
pub use error::{Error, Result};
pub use metric::Metric;
