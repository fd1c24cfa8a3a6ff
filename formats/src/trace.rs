//! The trace file: what the experiment runner writes and the load generator replays.
//! A header, the distinct vectors, the operation stream (SEARCH / INSERT / DELETE) and
//! optional exact ground truth per vector. The byte layout is specified in `TRACE.md`
//! beside this crate's `Cargo.toml`; this module is its reference implementation.

use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use shards::{Candidate, Metric};

use crate::binio;

pub const MAGIC: &[u8; 8] = b"AKERTRC\0";
pub const VERSION: u32 = 1;
/// Bytes before the vector section.
pub const HEADER_LEN: usize = 40;
/// Bounds a reader enforces on the header, so a corrupt one is rejected outright.
pub const MAX_DIM: u32 = 1 << 16;
pub const MAX_K: u32 = 1 << 16;
/// Vector indices are u32.
pub const MAX_VECTORS: u64 = u32::MAX as u64;

const FLAG_GROUND_TRUTH: u8 = 1;
const TAG_SEARCH: u8 = 1;
const TAG_INSERT: u8 = 2;
const TAG_DELETE: u8 = 3;
/// Items preallocated from a header count; past this, vectors grow as data arrives.
const PREALLOC_LIMIT: usize = 1 << 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Search for vector `vector` with `k` results.
    Search { vector: u32, k: u32 },
    /// Insert object `id` whose vector is `vector`.
    Insert { id: u64, vector: u32 },
    /// Delete object `id`.
    Delete { id: u64 },
}

#[derive(Clone, Debug, PartialEq)]
pub struct Trace {
    pub dim: usize,
    pub metric: Metric,
    /// The largest `k` of any search, and the depth of the ground truth.
    pub k: u32,
    /// Distinct vectors, row-major; operations refer to them by index.
    pub vectors: Vec<f32>,
    pub ops: Vec<Op>,
    /// Per vector, the ids of its exact top `k` (at most `k`; empty for a vector no
    /// search uses), nearest first.
    pub ground_truth: Option<Vec<Vec<u64>>>,
}

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("trace I/O: {0}")]
    Io(#[from] io::Error),
    #[error("truncated trace: {0} ends early")]
    Truncated(&'static str),
    #[error("corrupt trace: {0}")]
    Corrupt(String),
    /// A trace that breaks the format's rules, refused by the writer.
    #[error("invalid trace: {0}")]
    Invalid(String),
    #[error("{}: {source}", path.display())]
    At {
        path: PathBuf,
        #[source]
        source: Box<TraceError>,
    },
}

impl TraceError {
    fn at(self, path: &Path) -> TraceError {
        TraceError::At {
            path: path.to_owned(),
            source: Box::new(self),
        }
    }
}

/// Maps a short read in `section` to `Truncated`.
fn eof(section: &'static str) -> impl Fn(io::Error) -> TraceError {
    move |e| match e.kind() {
        io::ErrorKind::UnexpectedEof => TraceError::Truncated(section),
        _ => TraceError::Io(e),
    }
}

impl Trace {
    /// A search-only trace over `vectors` (row-major, `dim` floats each): one search
    /// with `k` results for each index in `requests`, in order.
    pub fn searches(
        dim: usize,
        metric: Metric,
        k: u32,
        vectors: Vec<f32>,
        requests: &[u32],
    ) -> Trace {
        Trace {
            dim,
            metric,
            k,
            vectors,
            ops: requests
                .iter()
                .map(|&vector| Op::Search { vector, k })
                .collect(),
            ground_truth: None,
        }
    }

    /// Attaches ground truth from exact result lists, one per vector, keeping the
    /// first `k` ids of each.
    pub fn set_ground_truth(&mut self, lists: &[Vec<Candidate>]) {
        let k = self.k as usize;
        self.ground_truth = Some(
            lists
                .iter()
                .map(|l| l.iter().take(k).map(|c| c.id).collect())
                .collect(),
        );
    }

    pub fn n_vectors(&self) -> usize {
        self.vectors.len() / self.dim
    }

    pub fn vector(&self, i: u32) -> &[f32] {
        let i = i as usize;
        &self.vectors[i * self.dim..(i + 1) * self.dim]
    }

    /// Checks every rule a reader enforces.
    pub fn validate(&self) -> Result<(), TraceError> {
        let invalid = |m: String| Err(TraceError::Invalid(m));
        if self.dim == 0 || self.dim > MAX_DIM as usize {
            return invalid(format!("dimension {} outside 1..={MAX_DIM}", self.dim));
        }
        if self.k == 0 || self.k > MAX_K {
            return invalid(format!("k {} outside 1..={MAX_K}", self.k));
        }
        if self.vectors.len() % self.dim != 0 {
            return invalid(format!(
                "{} floats are not whole {}-d vectors",
                self.vectors.len(),
                self.dim
            ));
        }
        let n = self.n_vectors();
        if n as u64 > MAX_VECTORS {
            return invalid(format!("{n} vectors, more than {MAX_VECTORS}"));
        }
        for (i, op) in self.ops.iter().enumerate() {
            check_op(op, n, self.k)
                .map_err(|m| TraceError::Invalid(format!("operation {i}: {m}")))?;
        }
        if let Some(gt) = &self.ground_truth {
            if gt.len() != n {
                return invalid(format!("{} ground-truth lists for {n} vectors", gt.len()));
            }
            if let Some(i) = gt.iter().position(|l| l.len() > self.k as usize) {
                return invalid(format!(
                    "ground truth of vector {i} is longer than k = {}",
                    self.k
                ));
            }
        }
        Ok(())
    }

    /// Writes the trace after [`Trace::validate`].
    pub fn write_to(&self, mut w: impl Write) -> Result<(), TraceError> {
        self.validate()?;
        let flags = if self.ground_truth.is_some() {
            FLAG_GROUND_TRUTH
        } else {
            0
        };
        w.write_all(MAGIC)?;
        w.write_all(&VERSION.to_le_bytes())?;
        w.write_all(&(self.dim as u32).to_le_bytes())?;
        w.write_all(&[self.metric.code(), flags, 0, 0])?;
        w.write_all(&self.k.to_le_bytes())?;
        w.write_all(&(self.n_vectors() as u64).to_le_bytes())?;
        w.write_all(&(self.ops.len() as u64).to_le_bytes())?;
        binio::write_f32s(&mut w, &self.vectors)?;
        for op in &self.ops {
            match *op {
                Op::Search { vector, k } => {
                    w.write_all(&[TAG_SEARCH])?;
                    w.write_all(&vector.to_le_bytes())?;
                    w.write_all(&k.to_le_bytes())?;
                }
                Op::Insert { id, vector } => {
                    w.write_all(&[TAG_INSERT])?;
                    w.write_all(&id.to_le_bytes())?;
                    w.write_all(&vector.to_le_bytes())?;
                }
                Op::Delete { id } => {
                    w.write_all(&[TAG_DELETE])?;
                    w.write_all(&id.to_le_bytes())?;
                }
            }
        }
        for list in self.ground_truth.iter().flatten() {
            w.write_all(&(list.len() as u32).to_le_bytes())?;
            for id in list {
                w.write_all(&id.to_le_bytes())?;
            }
        }
        w.flush()?;
        Ok(())
    }

    /// Writes the trace to `path` (created or truncated).
    pub fn save(&self, path: &Path) -> Result<(), TraceError> {
        File::create(path)
            .map_err(TraceError::from)
            .and_then(|f| self.write_to(BufWriter::new(f)))
            .map_err(|e| e.at(path))
    }

    /// Reads a trace from a stream, rejecting anything that breaks the format.
    pub fn read_from(mut r: impl Read) -> Result<Trace, TraceError> {
        let header = Header::read(&mut r)?;
        header.read_body(&mut r)
    }

    /// Reads the trace at `path`. Besides [`Trace::read_from`]'s checks, the header's
    /// counts are checked against the file's length before anything is read.
    pub fn load(path: &Path) -> Result<Trace, TraceError> {
        let inner = || {
            let file = File::open(path)?;
            let len = file.metadata()?.len();
            let mut r = BufReader::with_capacity(1 << 20, file);
            let header = Header::read(&mut r)?;
            let least = header.min_len();
            if least > u128::from(len) {
                return Err(TraceError::Corrupt(format!(
                    "header needs at least {least} bytes, the file has {len}"
                )));
            }
            header.read_body(&mut r)
        };
        inner().map_err(|e| e.at(path))
    }
}

fn check_op(op: &Op, n_vectors: usize, max_k: u32) -> Result<(), String> {
    let vector = match *op {
        Op::Search { vector, k } => {
            if k == 0 || k > max_k {
                return Err(format!("search k {k} outside 1..={max_k}"));
            }
            vector
        }
        Op::Insert { vector, .. } => vector,
        Op::Delete { .. } => return Ok(()),
    };
    if vector as usize >= n_vectors {
        return Err(format!("vector index {vector} out of {n_vectors}"));
    }
    Ok(())
}

/// The header fields, validated.
struct Header {
    dim: usize,
    metric: Metric,
    ground_truth: bool,
    k: u32,
    n_vectors: usize,
    n_ops: u64,
}

impl Header {
    fn read(r: &mut impl Read) -> Result<Header, TraceError> {
        let raw: [u8; HEADER_LEN] = binio::read_array(r).map_err(eof("the header"))?;
        let u32_at = |o: usize| u32::from_le_bytes(raw[o..o + 4].try_into().expect("4 bytes"));
        let u64_at = |o: usize| u64::from_le_bytes(raw[o..o + 8].try_into().expect("8 bytes"));
        let corrupt = |m: String| Err(TraceError::Corrupt(m));
        if &raw[..8] != MAGIC {
            return corrupt("not an Aker trace (bad magic)".into());
        }
        let version = u32_at(8);
        if version != VERSION {
            return corrupt(format!(
                "unsupported version {version} (this reader knows {VERSION})"
            ));
        }
        let dim = u32_at(12);
        if dim == 0 || dim > MAX_DIM {
            return corrupt(format!("dimension {dim} outside 1..={MAX_DIM}"));
        }
        let metric = Metric::from_code(raw[16])
            .ok_or_else(|| TraceError::Corrupt(format!("unknown metric code {}", raw[16])))?;
        let flags = raw[17];
        if flags & !FLAG_GROUND_TRUTH != 0 {
            return corrupt(format!("unknown flags {flags:#04x}"));
        }
        if raw[18..20] != [0, 0] {
            return corrupt("reserved header bytes are not zero".into());
        }
        let k = u32_at(20);
        if k == 0 || k > MAX_K {
            return corrupt(format!("k {k} outside 1..={MAX_K}"));
        }
        let n_vectors = u64_at(24);
        if n_vectors > MAX_VECTORS {
            return corrupt(format!("{n_vectors} vectors, more than {MAX_VECTORS}"));
        }
        Ok(Header {
            dim: dim as usize,
            metric,
            ground_truth: flags & FLAG_GROUND_TRUTH != 0,
            k,
            n_vectors: n_vectors as usize,
            n_ops: u64_at(32),
        })
    }

    /// The smallest file this header allows: every operation at least 9 bytes, every
    /// ground-truth list at least its 4-byte count.
    fn min_len(&self) -> u128 {
        let vectors = self.n_vectors as u128 * self.dim as u128 * 4;
        let gt = if self.ground_truth {
            self.n_vectors as u128 * 4
        } else {
            0
        };
        HEADER_LEN as u128 + vectors + u128::from(self.n_ops) * 9 + gt
    }

    fn read_body(self, r: &mut impl Read) -> Result<Trace, TraceError> {
        let mut vectors = Vec::new();
        binio::read_f32s(r, self.n_vectors * self.dim, &mut vectors)
            .map_err(eof("the vector section"))?;

        let mut ops = Vec::with_capacity((self.n_ops as usize).min(PREALLOC_LIMIT));
        for i in 0..self.n_ops {
            let op_eof = eof("the operation section");
            let op = match binio::read_u8(r).map_err(&op_eof)? {
                TAG_SEARCH => Op::Search {
                    vector: binio::read_u32(r).map_err(&op_eof)?,
                    k: binio::read_u32(r).map_err(&op_eof)?,
                },
                TAG_INSERT => Op::Insert {
                    id: binio::read_u64(r).map_err(&op_eof)?,
                    vector: binio::read_u32(r).map_err(&op_eof)?,
                },
                TAG_DELETE => Op::Delete {
                    id: binio::read_u64(r).map_err(&op_eof)?,
                },
                tag => {
                    return Err(TraceError::Corrupt(format!(
                        "operation {i}: unknown tag {tag}"
                    )))
                }
            };
            check_op(&op, self.n_vectors, self.k)
                .map_err(|m| TraceError::Corrupt(format!("operation {i}: {m}")))?;
            ops.push(op);
        }

        let ground_truth = if self.ground_truth {
            let gt_eof = eof("the ground-truth section");
            let mut lists = Vec::with_capacity(self.n_vectors.min(PREALLOC_LIMIT));
            for i in 0..self.n_vectors {
                let len = binio::read_u32(r).map_err(&gt_eof)?;
                if len > self.k {
                    return Err(TraceError::Corrupt(format!(
                        "ground truth of vector {i} has {len} ids, more than k = {}",
                        self.k
                    )));
                }
                let list = (0..len)
                    .map(|_| binio::read_u64(r))
                    .collect::<io::Result<Vec<u64>>>()
                    .map_err(&gt_eof)?;
                lists.push(list);
            }
            Some(lists)
        } else {
            None
        };
        binio::expect_eof(r, "the trace").map_err(|e| TraceError::Corrupt(e.to_string()))?;
        Ok(Trace {
            dim: self.dim,
            metric: self.metric,
            k: self.k,
            vectors,
            ops,
            ground_truth,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> Trace {
        Trace {
            dim: 3,
            metric: Metric::Cosine,
            k: 10,
            vectors: vec![1.0, 2.0, 3.0, -0.5, f32::MIN_POSITIVE, 1e30],
            ops: vec![
                Op::Search { vector: 0, k: 10 },
                Op::Insert {
                    id: u64::MAX,
                    vector: 1,
                },
                Op::Search { vector: 1, k: 3 },
                Op::Delete { id: 7 },
            ],
            ground_truth: Some(vec![vec![4, 2, 9], vec![]]),
        }
    }

    fn bytes(t: &Trace) -> Vec<u8> {
        let mut b = Vec::new();
        t.write_to(&mut b).unwrap();
        b
    }

    #[test]
    fn layout_matches_trace_md() {
        let b = bytes(&sample());
        assert_eq!(&b[..8], b"AKERTRC\0");
        assert_eq!(b[8..12], 1u32.to_le_bytes());
        assert_eq!(b[12..16], 3u32.to_le_bytes());
        assert_eq!(b[16..20], [1, 1, 0, 0]);
        assert_eq!(b[20..24], 10u32.to_le_bytes());
        assert_eq!(b[24..32], 2u64.to_le_bytes());
        assert_eq!(b[32..40], 4u64.to_le_bytes());
        assert_eq!(b[40..44], 1.0f32.to_le_bytes());
        let ops = 40 + 6 * 4;
        assert_eq!(b[ops..ops + 9], [1, 0, 0, 0, 0, 10, 0, 0, 0]);
        assert_eq!(b[ops + 9], 2);
        assert_eq!(b[ops + 10..ops + 18], u64::MAX.to_le_bytes());
        assert_eq!(b[ops + 18..ops + 22], 1u32.to_le_bytes());
        let gt = ops + 9 + 13 + 9 + 9;
        assert_eq!(b[gt..gt + 4], 3u32.to_le_bytes());
        assert_eq!(b[gt + 4..gt + 12], 4u64.to_le_bytes());
        assert_eq!(b.len(), gt + 4 + 3 * 8 + 4);
    }

    #[test]
    fn round_trip_through_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.trace");
        let mut t = sample();
        t.save(&p).unwrap();
        assert_eq!(Trace::load(&p).unwrap(), t);
        t.ground_truth = None;
        t.save(&p).unwrap();
        assert_eq!(Trace::load(&p).unwrap(), t);
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 40 + 24 + 40);
    }

    #[test]
    fn searches_cover_every_request() {
        let mut t = Trace::searches(2, Metric::L2Sq, 5, vec![0.0, 1.0, 2.0, 3.0], &[0, 1, 1, 0]);
        assert_eq!(t.n_vectors(), 2);
        assert_eq!(t.vector(1), &[2.0, 3.0]);
        assert_eq!(t.ops.len(), 4);
        assert_eq!(t.ops[2], Op::Search { vector: 1, k: 5 });
        let lists: Vec<Vec<Candidate>> = (0..2)
            .map(|v| {
                (0..8)
                    .map(|i| Candidate::new(v * 100 + i, i as f32))
                    .collect()
            })
            .collect();
        t.set_ground_truth(&lists);
        assert_eq!(
            t.ground_truth.as_ref().unwrap()[1],
            vec![100, 101, 102, 103, 104]
        );
        assert_eq!(Trace::read_from(bytes(&t).as_slice()).unwrap(), t);
    }

    #[test]
    fn every_truncation_is_reported() {
        let b = bytes(&sample());
        for cut in 0..b.len() {
            match Trace::read_from(&b[..cut]) {
                Err(TraceError::Truncated(_)) => {}
                other => panic!("cut at {cut}: {other:?}"),
            }
        }
        let mut long = b.clone();
        long.push(0);
        assert!(
            matches!(Trace::read_from(long.as_slice()), Err(TraceError::Corrupt(m)) if m.contains("trailing"))
        );
    }

    fn corrupt_message(b: &[u8]) -> String {
        match Trace::read_from(b) {
            Err(TraceError::Corrupt(m)) => m,
            other => panic!("expected corruption, got {other:?}"),
        }
    }

    #[test]
    fn corrupt_fields_are_named() {
        let good = bytes(&sample());
        let ops = 40 + 24;
        let gt = ops + 40;
        let cases: [(usize, &[u8], &str); 11] = [
            (0, b"X", "bad magic"),
            (8, &[2], "version 2"),
            (12, &[0, 0], "dimension 0"),
            (16, &[9], "metric code 9"),
            (17, &[3], "flags"),
            (18, &[1], "reserved"),
            (20, &[0], "k 0"),
            (28, &[1], "more than 4294967295"),
            (ops, &[4], "unknown tag 4"),
            (ops + 1, &[2], "vector index 2 out of 2"),
            (gt, &[11], "11 ids, more than k = 10"),
        ];
        for (at, patch, want) in cases {
            let mut b = good.clone();
            b[at..at + patch.len()].copy_from_slice(patch);
            let m = corrupt_message(&b);
            assert!(m.contains(want), "patch at {at}: {m}");
        }
        let mut b = good.clone();
        b[ops + 5..ops + 9].copy_from_slice(&11u32.to_le_bytes());
        assert!(corrupt_message(&b).contains("search k 11 outside 1..=10"));
    }

    #[test]
    fn huge_counts_fail_without_allocating_them() {
        let mut b = bytes(&sample());
        b[24..32].copy_from_slice(&MAX_VECTORS.to_le_bytes());
        b[12..16].copy_from_slice(&MAX_DIM.to_le_bytes());
        // A stream reader runs out of data; the vectors were never allocated up front.
        assert!(matches!(
            Trace::read_from(b.as_slice()),
            Err(TraceError::Truncated("the vector section"))
        ));

        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("huge.trace");
        let mut ops_only = bytes(&sample());
        ops_only[32..40].copy_from_slice(&u64::MAX.to_le_bytes());
        std::fs::write(&p, &ops_only).unwrap();
        let err = Trace::load(&p).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("huge.trace") && msg.contains("header needs at least"),
            "{msg}"
        );
    }

    #[test]
    fn writer_refuses_invalid_traces() {
        type Breaker = fn(&mut Trace);
        let cases: [(Breaker, &str); 5] = [
            (
                |t| t.ops.push(Op::Search { vector: 2, k: 1 }),
                "vector index 2",
            ),
            (
                |t| t.ops.push(Op::Search { vector: 0, k: 11 }),
                "search k 11",
            ),
            (|t| t.vectors.push(0.0), "not whole"),
            (
                |t| t.ground_truth.as_mut().unwrap().pop().map(drop).unwrap(),
                "1 ground-truth lists for 2",
            ),
            (
                |t| t.ground_truth.as_mut().unwrap()[1] = (0..11).collect(),
                "longer than k",
            ),
        ];
        for (break_it, want) in cases {
            let mut t = sample();
            break_it(&mut t);
            let mut sink = Vec::new();
            match t.write_to(&mut sink) {
                Err(TraceError::Invalid(m)) => assert!(m.contains(want), "{m}"),
                other => panic!("expected {want}, got {other:?}"),
            }
            assert!(sink.is_empty(), "nothing is written for an invalid trace");
        }
    }

    fn arb_trace() -> impl Strategy<Value = Trace> {
        (1usize..6, 1usize..20, 1u32..50, any::<bool>()).prop_flat_map(|(dim, n, k, with_gt)| {
            let vectors = proptest::collection::vec(
                any::<f32>().prop_filter("NaN != NaN", |v| !v.is_nan()),
                dim * n,
            );
            let op = prop_oneof![
                (0..n as u32, 1..=k).prop_map(|(vector, k)| Op::Search { vector, k }),
                (any::<u64>(), 0..n as u32).prop_map(|(id, vector)| Op::Insert { id, vector }),
                any::<u64>().prop_map(|id| Op::Delete { id }),
            ];
            let gt = proptest::collection::vec(
                proptest::collection::vec(any::<u64>(), 0..=k as usize),
                n,
            );
            (vectors, proptest::collection::vec(op, 0..60), gt, 0u8..3).prop_map(
                move |(vectors, ops, gt, m)| Trace {
                    dim,
                    metric: Metric::from_code(m).unwrap(),
                    k,
                    vectors,
                    ops,
                    ground_truth: with_gt.then_some(gt),
                },
            )
        })
    }

    proptest! {
        #[test]
        fn any_valid_trace_round_trips(t in arb_trace()) {
            let b = bytes(&t);
            prop_assert_eq!(Trace::read_from(b.as_slice()).unwrap(), t);
        }
    }
}
