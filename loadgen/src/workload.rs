//! What the load generator sends: a trace from the experiment runner replayed in file
//! order (`formats/TRACE.md`), or a generated workload (random or clustered vectors, a
//! Zipfian choice of query so that repeats reach the cache, a SEARCH / INSERT / DELETE
//! mix). Both can set BYPASS_CACHE on every SEARCH, so the same operations measure the
//! backend alone.
//!
//! The workload is shared by every sender thread. A trace is consumed through one atomic
//! cursor, so operations leave in file order across threads (replies may still come back
//! in any order, and requests on different connections may overtake each other).

use std::sync::atomic::{AtomicU64, Ordering};

use aker::protocol::{
    DeleteRequest, InsertRequest, Neighbor, Request, SearchBatchRequest, SearchRequest,
};
use aker_formats::trace::{Op, Trace};
use aker_formats::zipf::ZipfianGenerator;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Normal};
use shards::Metric;

/// Generated vector pools are capped at this many floats (1 GiB), so a typo in
/// `--vectors` cannot exhaust memory.
pub const MAX_POOL_FLOATS: usize = 1 << 28;

/// The operations the load generator measures separately.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpKind {
    Search = 0,
    Insert = 1,
    Delete = 2,
}

impl OpKind {
    pub const ALL: [OpKind; 3] = [OpKind::Search, OpKind::Insert, OpKind::Delete];

    pub fn name(self) -> &'static str {
        match self {
            OpKind::Search => "SEARCH",
            OpKind::Insert => "INSERT",
            OpKind::Delete => "DELETE",
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }
}

/// One operation chosen for sending. `vector` indexes the workload's vectors (SEARCH,
/// INSERT); `id` is the object id (INSERT, DELETE).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Planned {
    pub kind: OpKind,
    pub vector: u32,
    pub k: u32,
    pub id: u64,
}

/// Relative weights of SEARCH, INSERT and DELETE in a generated workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Mix {
    pub search: u32,
    pub insert: u32,
    pub delete: u32,
}

impl Default for Mix {
    fn default() -> Self {
        Mix {
            search: 100,
            insert: 0,
            delete: 0,
        }
    }
}

impl std::str::FromStr for Mix {
    type Err = String;
    /// `search=90,insert=5,delete=5`; operations not named get weight 0.
    fn from_str(s: &str) -> Result<Mix, String> {
        let mut mix = Mix {
            search: 0,
            insert: 0,
            delete: 0,
        };
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, w) = part
                .split_once('=')
                .ok_or_else(|| format!("mix entry '{part}' is not NAME=WEIGHT"))?;
            let w: u32 = w
                .trim()
                .parse()
                .map_err(|_| format!("mix weight '{w}' is not a whole number"))?;
            match name.trim().to_ascii_lowercase().as_str() {
                "search" => mix.search = w,
                "insert" => mix.insert = w,
                "delete" => mix.delete = w,
                other => return Err(format!("unknown operation '{other}' in the mix")),
            }
        }
        let total = u64::from(mix.search) + u64::from(mix.insert) + u64::from(mix.delete);
        if total == 0 || total > u64::from(u32::MAX) {
            return Err("mix weights must sum to between 1 and 2^32-1".into());
        }
        Ok(mix)
    }
}

/// Settings of a generated workload.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct GenParams {
    /// Distinct vectors; searches and inserts draw from them.
    pub vectors: usize,
    /// 0: vectors uniform in [-1, 1]^dim; otherwise Gaussian clusters (σ = 0.05) around
    /// this many uniform centres, so nearby (approximate-hit) queries exist.
    pub clusters: usize,
    /// Zipfian exponent in [0, 1) over the vectors: 0 is uniform, 0.99 YCSB's skew.
    pub skew: f64,
    pub k: u32,
    pub mix: Mix,
    /// INSERT ids start here (DELETE removes them again, oldest first), far from the ids
    /// of a loaded data set.
    pub id_base: u64,
    pub seed: u64,
}

impl Default for GenParams {
    fn default() -> Self {
        GenParams {
            vectors: 10_000,
            clusters: 100,
            skew: 0.99,
            k: 10,
            mix: Mix::default(),
            id_base: 1 << 40,
            seed: 42,
        }
    }
}

enum Source {
    Trace { ops: Vec<Op>, looped: bool },
    Generated(GenParams),
}

pub struct Workload {
    pub dim: usize,
    /// The trace's metric (generated workloads take the server's).
    pub metric: Option<Metric>,
    /// Set BYPASS_CACHE on every SEARCH.
    pub bypass: bool,
    /// SEARCH deadline in µs sent to the server (0 = none).
    pub deadline_us: u32,
    pub collection: u32,
    /// The protocol version requests go out in (the newest both ends speak).
    pub version: u8,
    vectors: Vec<f32>,
    ground_truth: Option<Vec<Vec<u64>>>,
    source: Source,
    /// Next trace operation.
    cursor: AtomicU64,
    /// Generated INSERT / DELETE counters (relative to `id_base`): ids in
    /// `next_delete..next_insert` were inserted by this run and not yet deleted.
    next_insert: AtomicU64,
    next_delete: AtomicU64,
}

impl Workload {
    /// Replays `trace` in file order; with `looped` it starts over when it ends.
    pub fn from_trace(trace: Trace, looped: bool) -> Result<Workload, String> {
        if trace.ops.is_empty() {
            return Err("the trace has no operations".into());
        }
        Ok(Workload {
            dim: trace.dim,
            metric: Some(trace.metric),
            bypass: false,
            deadline_us: 0,
            collection: 0,
            version: aker::protocol::VERSION,
            vectors: trace.vectors,
            ground_truth: trace.ground_truth,
            source: Source::Trace {
                ops: trace.ops,
                looped,
            },
            cursor: AtomicU64::new(0),
            next_insert: AtomicU64::new(0),
            next_delete: AtomicU64::new(0),
        })
    }

    /// A generated workload of `dim`-dimensional vectors.
    pub fn generate(dim: usize, params: GenParams) -> Result<Workload, String> {
        if dim == 0 {
            return Err("dimension must be at least 1".into());
        }
        if params.vectors < 2 {
            return Err("a generated workload needs at least 2 vectors".into());
        }
        if params.vectors.saturating_mul(dim) > MAX_POOL_FLOATS
            || params.vectors > u32::MAX as usize
        {
            return Err(format!(
                "{} vectors of dimension {dim} exceed the {MAX_POOL_FLOATS}-float pool limit",
                params.vectors
            ));
        }
        if !(0.0..1.0).contains(&params.skew) {
            return Err(format!("skew {} outside [0, 1)", params.skew));
        }
        if params.k == 0 {
            return Err("k must be at least 1".into());
        }
        let mut rng = StdRng::seed_from_u64(params.seed);
        let mut vectors = Vec::with_capacity(params.vectors * dim);
        if params.clusters == 0 {
            vectors.extend((0..params.vectors * dim).map(|_| rng.gen_range(-1.0f32..1.0)));
        } else {
            let centres: Vec<f32> = (0..params.clusters * dim)
                .map(|_| rng.gen_range(-1.0f32..1.0))
                .collect();
            let noise = Normal::new(0.0f32, 0.05).expect("valid normal");
            for _ in 0..params.vectors {
                let c = rng.gen_range(0..params.clusters);
                let centre = &centres[c * dim..(c + 1) * dim];
                vectors.extend(centre.iter().map(|&x| x + noise.sample(&mut rng)));
            }
        }
        Ok(Workload {
            dim,
            metric: None,
            bypass: false,
            deadline_us: 0,
            collection: 0,
            version: aker::protocol::VERSION,
            vectors,
            ground_truth: None,
            source: Source::Generated(params),
            cursor: AtomicU64::new(0),
            next_insert: AtomicU64::new(0),
            next_delete: AtomicU64::new(0),
        })
    }

    /// [`Workload::generate`], with the vectors taken from `pool` (row-major, `dim`
    /// floats a row; its first `params.vectors` rows) instead of drawn: the same rows
    /// another tool writes (`--pg-writes`), so two write loads compare like with like.
    pub fn generate_from_pool(
        dim: usize,
        params: GenParams,
        pool: &[f32],
    ) -> Result<Workload, String> {
        if dim == 0 || !pool.len().is_multiple_of(dim) {
            return Err("the vector pool is not a whole number of rows".into());
        }
        let rows = pool.len() / dim;
        if rows < params.vectors {
            return Err(format!(
                "the pool has {rows} rows, --vectors asks for {}",
                params.vectors
            ));
        }
        let n = params.vectors;
        let mut w = Workload::generate(dim, params)?;
        w.vectors = pool[..n * dim].to_vec();
        Ok(w)
    }

    /// A one-line description for the report.
    pub fn describe(&self) -> String {
        let bypass = if self.bypass { ", cache bypassed" } else { "" };
        match &self.source {
            Source::Trace { ops, looped } => format!(
                "trace: {} ops over {} vectors, dim {}{}{}{bypass}",
                ops.len(),
                self.n_vectors(),
                self.dim,
                if self.ground_truth.is_some() {
                    ", ground truth"
                } else {
                    ""
                },
                if *looped { ", looped" } else { "" },
            ),
            Source::Generated(p) => format!(
                "generated: {} vectors, dim {}, {} clusters, skew {}, k {}, mix search={} insert={} delete={}{bypass}",
                p.vectors, self.dim, p.clusters, p.skew, p.k, p.mix.search, p.mix.insert, p.mix.delete
            ),
        }
    }

    pub fn n_vectors(&self) -> usize {
        self.vectors.len() / self.dim
    }

    pub fn vector(&self, i: u32) -> &[f32] {
        let i = i as usize;
        &self.vectors[i * self.dim..(i + 1) * self.dim]
    }

    pub fn has_ground_truth(&self) -> bool {
        self.ground_truth.is_some()
    }

    /// Whether any INSERT or DELETE will be sent (ground truth describes the collection
    /// before the first operation, so writes can make recall look worse than it is).
    pub fn has_writes(&self) -> bool {
        match &self.source {
            Source::Trace { ops, .. } => ops.iter().any(|o| !matches!(o, Op::Search { .. })),
            Source::Generated(p) => p.mix.insert > 0 || p.mix.delete > 0,
        }
    }

    /// The largest k any SEARCH asks for.
    pub fn max_k(&self) -> u32 {
        match &self.source {
            Source::Trace { ops, .. } => ops
                .iter()
                .filter_map(|o| match o {
                    Op::Search { k, .. } => Some(*k),
                    _ => None,
                })
                .max()
                .unwrap_or(1),
            Source::Generated(p) => p.k,
        }
    }

    /// Generated workloads only: lowers k (to the server's `k_max`).
    pub fn clamp_k(&mut self, k_max: u32) {
        if let Source::Generated(p) = &mut self.source {
            p.k = p.k.clamp(1, k_max.max(1));
        }
    }

    /// Starts the trace over (each sweep step replays it from the beginning).
    pub fn rewind(&self) {
        self.cursor.store(0, Ordering::Relaxed);
    }

    /// A per-thread chooser of operations.
    pub fn picker(&self, thread: usize) -> Picker {
        let (seed, zipf) = match &self.source {
            Source::Generated(p) => (
                p.seed,
                (p.skew > 0.0).then(|| ZipfianGenerator::new(p.vectors as u64, p.skew)),
            ),
            Source::Trace { .. } => (0, None),
        };
        Picker {
            rng: StdRng::seed_from_u64(
                seed.wrapping_add(1 + thread as u64)
                    .wrapping_mul(0x2545_F491_4F6C_DD1D),
            ),
            zipf,
        }
    }

    /// The wire request for `p`.
    pub fn request(&self, p: &Planned) -> Request {
        match p.kind {
            OpKind::Search => Request::Search(SearchRequest {
                collection: self.collection,
                k: p.k,
                deadline_us: self.deadline_us,
                bypass_cache: self.bypass,
                refresh_entry: false,
                vector: self.vector(p.vector).to_vec(),
                at_position: None,
            }),
            OpKind::Insert => Request::Insert(InsertRequest {
                id: p.id,
                collection: self.collection,
                vector: self.vector(p.vector).to_vec(),
                payload: Vec::new(),
            }),
            OpKind::Delete => Request::Delete(DeleteRequest {
                id: p.id,
                collection: self.collection,
            }),
        }
    }

    /// The SEARCH_BATCH for SEARCHes `batch` (all of the first one's k).
    pub fn batch_request(&self, batch: &[Planned]) -> Request {
        Request::SearchBatch(SearchBatchRequest {
            collection: self.collection,
            k: batch.first().map_or(1, |p| p.k),
            deadline_us: self.deadline_us,
            bypass_cache: self.bypass,
            refresh_entry: false,
            queries: batch
                .iter()
                .map(|p| self.vector(p.vector).to_vec())
                .collect(),
            at_position: None,
        })
    }

    /// Recall of a SEARCH answer against the trace's ground truth:
    /// |returned ∩ exact top-k| / |exact top-k|. `None` without ground truth or when the
    /// exact list is empty.
    pub fn recall(&self, p: &Planned, neighbors: &[Neighbor]) -> Option<f64> {
        let gt = self.ground_truth.as_ref()?;
        let truth = gt.get(p.vector as usize)?;
        let truth = &truth[..truth.len().min(p.k as usize)];
        if truth.is_empty() {
            return None;
        }
        let mut got: Vec<u64> = neighbors.iter().map(|n| n.id).collect();
        got.sort_unstable();
        got.dedup();
        let found = truth
            .iter()
            .filter(|id| got.binary_search(id).is_ok())
            .count();
        Some(found as f64 / truth.len() as f64)
    }
}

/// Chooses operations for one sender thread.
pub struct Picker {
    rng: StdRng,
    zipf: Option<ZipfianGenerator>,
}

impl Picker {
    /// The next operation; `None` once a non-looping trace is used up.
    pub fn next(&mut self, w: &Workload) -> Option<Planned> {
        match &w.source {
            Source::Trace { ops, looped } => {
                let i = w.cursor.fetch_add(1, Ordering::Relaxed);
                let n = ops.len() as u64;
                if i >= n && !looped {
                    return None;
                }
                Some(match ops[(i % n) as usize] {
                    Op::Search { vector, k } => Planned {
                        kind: OpKind::Search,
                        vector,
                        k,
                        id: 0,
                    },
                    Op::Insert { id, vector } => Planned {
                        kind: OpKind::Insert,
                        vector,
                        k: 0,
                        id,
                    },
                    Op::Delete { id } => Planned {
                        kind: OpKind::Delete,
                        vector: 0,
                        k: 0,
                        id,
                    },
                })
            }
            Source::Generated(p) => Some(self.generated(w, p)),
        }
    }

    fn generated(&mut self, w: &Workload, p: &GenParams) -> Planned {
        let vector = match &self.zipf {
            Some(z) => z.next(&mut self.rng) as u32,
            None => self.rng.gen_range(0..p.vectors as u32),
        };
        let search = Planned {
            kind: OpKind::Search,
            vector,
            k: p.k,
            id: 0,
        };
        let total = p.mix.search + p.mix.insert + p.mix.delete;
        let r = self.rng.gen_range(0..total);
        if r < p.mix.search {
            search
        } else if r < p.mix.search + p.mix.insert {
            let n = w.next_insert.fetch_add(1, Ordering::Relaxed);
            Planned {
                kind: OpKind::Insert,
                vector,
                k: 0,
                id: p.id_base.wrapping_add(n),
            }
        } else {
            // Delete what this run inserted, oldest first, so deletes hit live objects;
            // with nothing to delete yet, search instead.
            let inserted = w.next_insert.load(Ordering::Relaxed);
            match w
                .next_delete
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |d| {
                    (d < inserted).then_some(d + 1)
                }) {
                Ok(d) => Planned {
                    kind: OpKind::Delete,
                    vector: 0,
                    k: 0,
                    id: p.id_base.wrapping_add(d),
                },
                Err(_) => search,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trace(ops: Vec<Op>, gt: Option<Vec<Vec<u64>>>) -> Trace {
        Trace {
            dim: 2,
            metric: Metric::L2Sq,
            k: 3,
            vectors: vec![0.0, 1.0, 2.0, 3.0],
            ops,
            ground_truth: gt,
        }
    }

    #[test]
    fn mix_parses_and_rejects() {
        let m: Mix = "search=90, insert=5,delete=5".parse().unwrap();
        assert_eq!((m.search, m.insert, m.delete), (90, 5, 5));
        let m: Mix = "insert=1".parse().unwrap();
        assert_eq!((m.search, m.insert, m.delete), (0, 1, 0));
        assert!("search=0".parse::<Mix>().is_err());
        assert!("fill=3".parse::<Mix>().is_err());
        assert!("search".parse::<Mix>().is_err());
    }

    #[test]
    fn trace_replays_in_order_then_ends_or_loops() {
        let ops = vec![
            Op::Search { vector: 1, k: 3 },
            Op::Insert { id: 7, vector: 0 },
            Op::Delete { id: 7 },
        ];
        let w = Workload::from_trace(trace(ops.clone(), None), false).unwrap();
        let mut p = w.picker(0);
        let kinds: Vec<_> = std::iter::from_fn(|| p.next(&w)).map(|p| p.kind).collect();
        assert_eq!(kinds, [OpKind::Search, OpKind::Insert, OpKind::Delete]);
        assert_eq!(p.next(&w), None);
        w.rewind();
        assert_eq!(p.next(&w).unwrap().vector, 1);

        let w = Workload::from_trace(trace(ops, None), true).unwrap();
        let mut p = w.picker(0);
        let ids: Vec<u64> = (0..7).filter_map(|_| p.next(&w)).map(|p| p.id).collect();
        assert_eq!(ids, [0, 7, 7, 0, 7, 7, 0]);
    }

    #[test]
    fn bypass_sets_the_search_flag() {
        let mut w =
            Workload::from_trace(trace(vec![Op::Search { vector: 1, k: 2 }], None), false).unwrap();
        w.bypass = true;
        let p = w.picker(0).next(&w).unwrap();
        match w.request(&p) {
            Request::Search(s) => {
                assert!(s.bypass_cache);
                assert_eq!(s.vector, vec![2.0, 3.0]);
                assert_eq!(s.k, 2);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn recall_against_ground_truth() {
        let gt = vec![vec![5, 6, 7], vec![]];
        let w = Workload::from_trace(trace(vec![Op::Search { vector: 0, k: 3 }], Some(gt)), false)
            .unwrap();
        let n = |ids: &[u64]| -> Vec<Neighbor> {
            ids.iter()
                .map(|&id| Neighbor { id, distance: 0.0 })
                .collect()
        };
        let p = Planned {
            kind: OpKind::Search,
            vector: 0,
            k: 3,
            id: 0,
        };
        assert_eq!(w.recall(&p, &n(&[7, 5, 1])), Some(2.0 / 3.0));
        // Only the first k of the truth count.
        let p2 = Planned { k: 2, ..p };
        assert_eq!(w.recall(&p2, &n(&[6, 7])), Some(0.5));
        let none = Planned { vector: 1, ..p };
        assert_eq!(w.recall(&none, &n(&[1])), None);
    }

    #[test]
    fn generated_mix_deletes_only_what_it_inserted() {
        let w = Workload::generate(
            4,
            GenParams {
                vectors: 100,
                mix: "search=50,insert=25,delete=25".parse().unwrap(),
                ..GenParams::default()
            },
        )
        .unwrap();
        let mut p = w.picker(0);
        let mut live = std::collections::HashSet::new();
        let mut counts = [0usize; 3];
        for _ in 0..10_000 {
            let op = p.next(&w).unwrap();
            counts[op.kind.index()] += 1;
            match op.kind {
                OpKind::Insert => assert!(live.insert(op.id)),
                OpKind::Delete => assert!(live.remove(&op.id), "deleted {} not live", op.id),
                OpKind::Search => assert!((op.vector as usize) < 100),
            }
        }
        assert!(counts[1] > 2000 && counts[2] > 2000, "{counts:?}");
    }

    #[test]
    fn generated_pool_is_bounded() {
        let p = GenParams {
            vectors: MAX_POOL_FLOATS,
            ..GenParams::default()
        };
        assert!(Workload::generate(2, p).is_err());
    }
}
