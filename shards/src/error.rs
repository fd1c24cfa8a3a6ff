//! One error type with kinds. Bad input is an error value, never a panic.

use thiserror::Error;

#[derive(Debug, Error, Clone, PartialEq)]
pub enum Error {
    #[error("vector has dimension {got}, the collection has {expected}")]
    DimensionMismatch { expected: usize, got: usize },
    #[error("vector component {index} is not finite ({value})")]
    NonFinite { index: usize, value: f32 },
    #[error("k = {k} is out of range (1..={k_max})")]
    KOutOfRange { k: usize, k_max: usize },
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("backend: {0}")]
    Backend(String),
    #[error("id {0} is not present")]
    NotFound(u64),
    #[error("capacity: {0}")]
    Capacity(String),
    #[error("i/o: {0}")]
    Io(String),
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::Io(e.to_string())
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// All exponent bits set: infinity or NaN.
const EXPONENT: u32 = 0x7f80_0000;

/// Checks a vector at the boundary: dimension and finiteness.
pub fn validate_vector(v: &[f32], dim: usize) -> Result<()> {
    if v.len() != dim {
        return Err(Error::DimensionMismatch {
            expected: dim,
            got: v.len(),
        });
    }
    // A branch-free fold the compiler vectorises (a lookup's hot path scans every
    // request vector); the index is looked for only once something is wrong.
    let all_finite = v
        .iter()
        .fold(true, |ok, x| ok & (x.to_bits() & EXPONENT != EXPONENT));
    if !all_finite {
        if let Some((index, &value)) = v.iter().enumerate().find(|(_, x)| !x.is_finite()) {
            return Err(Error::NonFinite { index, value });
        }
    }
    Ok(())
}

pub fn validate_k(k: usize, k_max: usize) -> Result<()> {
    if k == 0 || k > k_max {
        return Err(Error::KOutOfRange { k, k_max });
    }
    Ok(())
}
