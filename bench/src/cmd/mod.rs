//! The runner's subcommands, one module each; the options and helpers they share are
//! `common`.

pub(crate) mod common;
pub(crate) mod recall;
pub(crate) mod trace;
pub(crate) mod updates;
