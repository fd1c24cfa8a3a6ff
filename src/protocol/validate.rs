//! Checks a decoded request against the server's limits before a service sees it, so that
//! every `Service::handle` can assume a well-formed request: the collection's dimension,
//! finite components, `1 <= k <= k_max`, and FILL candidates that are finite, ascending
//! and distinct. The vector checks are the engine's own (`shards::error`).

use std::collections::HashSet;

use super::*;

/// What the server enforces on request contents (frame size is the decoder's job).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub dim: u32,
    pub k_max: u32,
    /// Queries one SEARCH_BATCH may carry.
    pub max_batch: u32,
    /// Every reply must fit in it: a SEARCH_BATCH whose reply could not is refused.
    pub max_frame_bytes: u32,
}

/// A request refused by [`validate`]: the status and message of its error reply.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{status}: {message}")]
pub struct Rejection {
    pub status: Status,
    pub message: String,
}

impl Rejection {
    pub fn new(status: Status, message: impl Into<String>) -> Self {
        Rejection {
            status,
            message: message.into(),
        }
    }
}

/// Maps the engine's error kinds to wire statuses.
pub fn status_of(e: &shards::Error) -> Status {
    use shards::Error as E;
    match e {
        E::DimensionMismatch { .. } => Status::DimMismatch,
        E::NonFinite { .. } => Status::NonFinite,
        E::KOutOfRange { .. } => Status::BadK,
        E::NotFound(_) => Status::NotFound,
        E::Capacity(_) => Status::Busy,
        E::Backend(_) => Status::Unavailable,
        E::Config(_) | E::Io(_) => Status::Internal,
    }
}

impl From<shards::Error> for Rejection {
    fn from(e: shards::Error) -> Self {
        Rejection {
            status: status_of(&e),
            message: e.to_string(),
        }
    }
}

fn vector(v: &[f32], limits: &Limits, what: &str) -> Result<(), Rejection> {
    shards::error::validate_vector(v, limits.dim as usize).map_err(|e| {
        let r = Rejection::from(e);
        Rejection::new(r.status, format!("{what}: {}", r.message))
    })
}

fn k(k: u32, limits: &Limits) -> Result<(), Rejection> {
    shards::error::validate_k(k as usize, limits.k_max as usize).map_err(Rejection::from)
}

/// A SEARCH_BATCH as a whole: k, dimension, count and the size of its reply. Each query's
/// own components are checked by [`batch_query`], so one bad query fails alone.
fn batch(b: &SearchBatchRequest, limits: &Limits) -> Result<(), Rejection> {
    // SEARCH's order: dimension, then k; then what only a batch has.
    if let Some(q) = b.queries.iter().find(|q| q.len() != limits.dim as usize) {
        return Err(Rejection::new(
            Status::DimMismatch,
            format!(
                "queries have dimension {}, the collection {}",
                q.len(),
                limits.dim
            ),
        ));
    }
    k(b.k, limits)?;
    let count = b.queries.len();
    if count == 0 || count > limits.max_batch as usize {
        return Err(Rejection::new(
            Status::BadRequest,
            format!(
                "a batch carries 1 to {} queries, not {count}",
                limits.max_batch
            ),
        ));
    }
    let reply = batch_reply_bytes_max(count as u32, b.k);
    if reply > limits.max_frame_bytes as u64 {
        return Err(Rejection::new(
            Status::BadRequest,
            format!(
                "the reply to {count} queries at k {} can take {reply} bytes, over max_frame_bytes {}",
                b.k, limits.max_frame_bytes
            ),
        ));
    }
    Ok(())
}

/// One query of a validated SEARCH_BATCH: its components (the dimension is the batch's).
pub(crate) fn batch_query(q: &[f32], limits: &Limits) -> Result<(), Rejection> {
    vector(q, limits, "query")
}

/// Checks `req` against `limits`. HELLO, PING, AUTH, FLUSH, STATS and DELETE have nothing
/// to check.
pub fn validate(req: &Request, limits: &Limits) -> Result<(), Rejection> {
    match req {
        Request::Hello
        | Request::Ping(_)
        | Request::Auth(_)
        | Request::Delete(_)
        | Request::Flush
        | Request::Stats
        | Request::Cluster => Ok(()),
        Request::Search(s) => {
            vector(&s.vector, limits, "vector")?;
            k(s.k, limits)
        }
        Request::SearchBatch(b) => batch(b, limits),
        Request::Insert(i) => vector(&i.vector, limits, "vector"),
        Request::Fill(f) => {
            k(f.k, limits)?;
            vector(&f.query, limits, "query")?;
            let mut seen = HashSet::with_capacity(f.candidates.len());
            let mut last = f32::NEG_INFINITY;
            for (i, c) in f.candidates.iter().enumerate() {
                // Dimension is the query's by construction of the wire format, but a
                // request built in-process may differ.
                vector(&c.vector, limits, &format!("candidate {i} vector"))?;
                if !c.distance.is_finite() {
                    return Err(Rejection::new(
                        Status::NonFinite,
                        format!("candidate {i} distance is {}", c.distance),
                    ));
                }
                // The cache trusts the order to cut k out of k + Δ.
                if c.distance < last {
                    return Err(Rejection::new(
                        Status::BadRequest,
                        format!("candidate {i} is out of order (distances must ascend)"),
                    ));
                }
                last = c.distance;
                if !seen.insert(c.id) {
                    return Err(Rejection::new(
                        Status::BadRequest,
                        format!("candidate {i} repeats id {}", c.id),
                    ));
                }
            }
            Ok(())
        }
    }
}
