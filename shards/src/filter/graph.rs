//! The query filter's own HNSW graph: flat, append-only arrays of atomics, one writer
//! (the shard's owner) and any number of lock-free readers.
//!
//! Why not hnsw_rs here (it stays as the embedded store's index): on the lookup path
//! hnsw_rs allocates per search, clones an `Arc` per visited point and takes a `RwLock`
//! per neighbour list; at 100k representatives that was most of an approximate hit's
//! time (`bench/benches/engine.rs` measures both kinds of filter in one run).
//!
//! Vectors are kept as int8 codes with one scale per vector (`v ≈ scale · code`): a
//! search is bound by memory traffic, and at d = 768 a code is 768 bytes against 3 KB of
//! f32. The searched vector is quantized the same way, once, and distances are between
//! the two codes, in integer arithmetic (`kernels::dot_i8i8`): approximate (error about
//! `d · scale² / 6` in squared L2 for two independent roundings; a near duplicate of a
//! node rounds to nearly its code), and the owner's neighbour selection compares stored
//! codes without dequantizing them. Callers recompute exact distances for the few
//! candidates returned, so only which candidates come back can differ, and only among
//! near ties.
//!
//! ```text
//!   node i ──► row[i]     = [scale, |scale·code|² (f32 bits), rep id (2 words), level,
//!                            first upper item], then dim int8 packed in u32 words:
//!                            everything a search reads of a node but its links, in
//!                            one row prefetched whole before its distance
//!              layer0[i]  = [count, m0 neighbour ids]
//!              upper[first upper item + l - 1] = [count, m ids]   for layers 1..=level
//!   entry   = level << 32 | node of the top layer (EMPTY before the first insert)
//!   len     = nodes published
//! ```
//!
//! Every array is a [`SegVec`]: chunks of doubling size that are never moved or freed
//! before the graph is dropped, so a reader's reference stays valid while the owner
//! appends. Publication order: a node's row and own links are stored before any
//! link to it (Release), and readers load links with Acquire, so a reader that reaches a
//! node sees it complete. Neighbour lists are rewritten in place when pruned; a reader
//! may see a mix of the old and new list, every entry of which is a complete node — the
//! search stays correct, at worst a little less exact for that one lookup.

use std::cell::RefCell;
use std::cmp::{Ordering as CmpOrdering, Reverse};
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering};

use super::{FilterIndex, FilterQuery, InsertSeeds};
use crate::entry::RepId;
use crate::kernels::prefetch;
use crate::metric::Metric;

/// log2 of the first chunk's item count.
const FIRST_CHUNK_LOG2: u32 = 6;
/// Chunks of 64, 128, … items: 27 of them cover every u32 index.
const MAX_CHUNKS: usize = 27;
/// Node ids are u32; this bounds a generation (rotation keeps them far smaller).
const MAX_NODES: u32 = 1 << 30;
/// Levels above this are clamped (the expected top level at m = 4 and 10^9 nodes is 15).
const MAX_LEVEL: u32 = 16;
const EMPTY: u64 = u64::MAX;
/// Words before a code in its row (module docs), so one prefetch brings everything a
/// distance and the result read: scale, squared norm, rep id (low, high), level, first
/// upper item.
const CODE_HEADER_WORDS: usize = 6;
/// Upper-layer lists are at most `m` long; `m` is capped so a greedy step's batch fits
/// on the stack.
const MAX_UPPER_LINKS: usize = 256;
const ROW_REP_LO: usize = 2;
const ROW_LEVEL: usize = 4;
const ROW_FIRST_UPPER: usize = 5;
/// Layer-0 expansions a bounded search makes before the bound may stop it.
const BOUNDED_MIN_EXPANSIONS: usize = 4;
/// Most candidates one search offers its caller (`search_layer`): each costs the caller
/// an exact distance, and a search that finds nothing serving keeps changing its nearest.
const SERVING_OFFERS_MAX: usize = 3;

/// `GraphIndex::id`s are handed out from here: unique in the process, never 0, so
/// `InsertSeeds` of a dropped generation can never be taken for a later one's.
static NEXT_INDEX_ID: AtomicU64 = AtomicU64::new(1);

/// Append-only array of `stride`-wide items of atomics, in chunks that never move.
struct SegVec<T> {
    stride: usize,
    chunks: [AtomicPtr<T>; MAX_CHUNKS],
}

fn locate(i: u32) -> (usize, usize) {
    let x = i as u64 + (1u64 << FIRST_CHUNK_LOG2);
    let k = 63 - x.leading_zeros() - FIRST_CHUNK_LOG2;
    (k as usize, (x - ((1u64 << FIRST_CHUNK_LOG2) << k)) as usize)
}

fn chunk_items(k: usize) -> usize {
    1usize << (FIRST_CHUNK_LOG2 as usize + k)
}

/// Types whose all-zero bytes are a valid value (the atomics the graph is made of), so a
/// chunk can come zeroed from the allocator or the kernel.
///
/// # Safety
/// Implement only for types for which every zero byte pattern is a valid value.
unsafe trait ZeroValid {}
// SAFETY: an atomic integer of zero bytes is the integer 0.
unsafe impl ZeroValid for AtomicU32 {}
// SAFETY: as above.
unsafe impl ZeroValid for AtomicU64 {}

impl<T: ZeroValid> SegVec<T> {
    fn new(stride: usize) -> Self {
        assert!(stride > 0);
        SegVec {
            stride,
            chunks: std::array::from_fn(|_| AtomicPtr::new(std::ptr::null_mut())),
        }
    }

    fn chunk_bytes(&self, k: usize) -> usize {
        chunk_items(k) * self.stride * std::mem::size_of::<T>()
    }

    /// Owner only: makes item `i` addressable (allocates its chunk if needed).
    fn reserve(&self, i: u32) {
        let (k, _) = locate(i);
        if self.chunks[k].load(Ordering::Acquire).is_null() {
            let ptr = chunk_memory::alloc_zeroed(self.chunk_bytes(k)).cast::<T>();
            // Release: a reader that sees the pointer sees the initialised atomics.
            self.chunks[k].store(ptr, Ordering::Release);
        }
    }

    /// Item `i`, which must have been reserved (readers only ask for ids they reached
    /// through published links, which the owner reserved first).
    fn item(&self, i: u32) -> &[T] {
        let (k, off) = locate(i);
        let ptr = self.chunks[k].load(Ordering::Acquire);
        assert!(!ptr.is_null(), "graph item {i} read before it was reserved");
        // SAFETY: the chunk holds chunk_items(k) * stride initialised elements, is never
        // freed before `self` is dropped, and off < chunk_items(k).
        unsafe { std::slice::from_raw_parts(ptr.add(off * self.stride), self.stride) }
    }
}

impl<T> Drop for SegVec<T> {
    fn drop(&mut self) {
        for (k, c) in self.chunks.iter().enumerate() {
            let ptr = c.load(Ordering::Acquire);
            if !ptr.is_null() {
                let bytes = chunk_items(k) * self.stride * std::mem::size_of::<T>();
                // SAFETY: allocated in `reserve` by chunk_memory with this size; atomics
                // need no drop; `&mut self` means no reader is left.
                unsafe { chunk_memory::free(ptr.cast::<u8>(), bytes) };
            }
        }
    }
}

/// Memory for graph chunks: zeroed (a zero atomic is a valid value) and cache-line
/// aligned, so a row starts on a line as often as its stride allows. (Transparent huge
/// pages were tried for the large chunks: no measurable change in search time here.)
mod chunk_memory {
    use std::alloc::{alloc_zeroed as heap_alloc_zeroed, dealloc, handle_alloc_error, Layout};

    const CACHE_LINE_BYTES: usize = 64;

    fn layout(bytes: usize) -> Layout {
        Layout::from_size_align(bytes.max(1), CACHE_LINE_BYTES).expect("chunk layout")
    }

    pub(super) fn alloc_zeroed(bytes: usize) -> *mut u8 {
        let layout = layout(bytes);
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { heap_alloc_zeroed(layout) };
        if ptr.is_null() {
            handle_alloc_error(layout);
        }
        ptr
    }

    /// # Safety
    /// `ptr` came from `alloc_zeroed(bytes)` with the same `bytes`, and is not used after.
    pub(super) unsafe fn free(ptr: *mut u8, bytes: usize) {
        // SAFETY: forwarded contract: same layout as the allocation.
        unsafe { dealloc(ptr, layout(bytes)) }
    }
}

/// A candidate during search: distance, then node id, so heaps order deterministically.
#[derive(Clone, Copy, PartialEq)]
struct Cand {
    dist: f32,
    node: u32,
}

impl Eq for Cand {}
impl PartialOrd for Cand {
    fn partial_cmp(&self, o: &Self) -> Option<CmpOrdering> {
        Some(self.cmp(o))
    }
}
impl Ord for Cand {
    fn cmp(&self, o: &Self) -> CmpOrdering {
        self.dist.total_cmp(&o.dist).then(self.node.cmp(&o.node))
    }
}

/// One beam search's shape: its width, layer, the nodes it may see (ids below `limit`:
/// those published when the search began) and the caller's distance bound (past it
/// nothing found is wanted, so the search may stop early).
#[derive(Clone, Copy)]
struct LayerSearch {
    ef: usize,
    layer: u32,
    limit: u32,
    bound: f32,
}

/// Per-thread search buffers, reused so a lookup allocates only its answer.
struct Scratch {
    /// visited[i] == stamp  <=>  node i was seen in the current search.
    visited: Vec<u32>,
    stamp: u32,
    frontier: BinaryHeap<Reverse<Cand>>,
    best: BinaryHeap<Cand>,
    /// Unvisited neighbours of the node being expanded.
    batch: Vec<u32>,
}

impl Scratch {
    /// Starts a search over `n` nodes.
    fn begin(&mut self, n: usize) {
        if self.visited.len() < n {
            self.visited.resize(n, 0);
        }
        self.stamp = self.stamp.wrapping_add(1);
        if self.stamp == 0 {
            self.visited.iter_mut().for_each(|v| *v = 0);
            self.stamp = 1;
        }
        self.frontier.clear();
        self.best.clear();
    }

    /// True the first time `node` is seen in this search.
    fn visit(&mut self, node: u32) -> bool {
        let slot = &mut self.visited[node as usize];
        let fresh = *slot != self.stamp;
        *slot = self.stamp;
        fresh
    }
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = const { RefCell::new(Scratch {
        visited: Vec::new(),
        stamp: 0,
        frontier: BinaryHeap::new(),
        best: BinaryHeap::new(),
        batch: Vec::new(),
    }) };
}

/// Runs `f` with this thread's scratch, or a fresh one if the thread's is in use (a
/// search never nests today; this keeps a future nesting from panicking).
fn with_scratch<R>(f: impl FnOnce(&mut Scratch) -> R) -> R {
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut s) => f(&mut s),
        Err(_) => f(&mut Scratch {
            visited: Vec::new(),
            stamp: 0,
            frontier: BinaryHeap::new(),
            best: BinaryHeap::new(),
            batch: Vec::new(),
        }),
    })
}

/// A vector as the graph compares it: int8 code, scale and the squared norm of the
/// dequantized vector. A searched vector is quantized once like a node's (so a near
/// duplicate of a node lands on nearly its code), and a node's own row is a probe as it
/// stands (neighbour selection compares codes without dequantizing).
struct Probe<'a> {
    code: &'a [i8],
    scale: f32,
    norm: f32,
}

/// A quantized vector owned by its probe (searched vectors, inserted ones).
struct Quantized {
    code: Vec<i8>,
    scale: f32,
    norm: f32,
}

impl Quantized {
    /// Symmetric int8 code (`kernels::quantize_i8`).
    fn new(v: &[f32]) -> Self {
        let mut code = vec![0i8; v.len()];
        let scale = crate::kernels::quantize_i8(v, &mut code);
        let sq = crate::kernels::dot_i8i8(&code, &code);
        Quantized {
            code,
            scale,
            norm: sq as f32 * scale * scale,
        }
    }

    fn probe(&self) -> Probe<'_> {
        Probe {
            code: &self.code,
            scale: self.scale,
            norm: self.norm,
        }
    }
}

/// The owner's buffers for linking one new node (`GraphIndex::link`): the neighbours
/// kept for it, those kept by a neighbour it is linked back into, and that neighbour's
/// candidates when its list is full.
struct LinkBuffers {
    kept: Vec<u32>,
    kept_back: Vec<u32>,
    prune: Vec<Cand>,
}

impl LinkBuffers {
    fn new(m0: usize) -> Self {
        LinkBuffers {
            kept: Vec::with_capacity(m0),
            kept_back: Vec::with_capacity(m0),
            prune: Vec::with_capacity(m0 + 1),
        }
    }
}

/// One generation of the query filter (see the module docs).
pub struct GraphIndex {
    metric: Metric,
    dim: usize,
    /// Max neighbours on layers >= 1, and on layer 0.
    m: usize,
    m0: usize,
    ef_construction: usize,
    ef_search: usize,
    level_mult: f64,
    codes: SegVec<AtomicU32>,
    layer0: SegVec<AtomicU32>,
    upper: SegVec<AtomicU32>,
    /// Owner-only: upper items handed out.
    upper_len: AtomicU32,
    len: AtomicU32,
    entry: AtomicU64,
    /// Owner-only: level draws (xorshift64*, seeded per generation).
    rng: AtomicU64,
    /// Which index `InsertSeeds` came from.
    id: u64,
}

impl GraphIndex {
    pub fn new(
        metric: Metric,
        dim: usize,
        m: usize,
        ef_construction: usize,
        ef_search: usize,
    ) -> Self {
        assert!(
            dim > 0 && (2..=MAX_UPPER_LINKS).contains(&m),
            "graph index: dim > 0, 2 <= m <= {MAX_UPPER_LINKS}"
        );
        GraphIndex {
            metric,
            dim,
            m,
            m0: 2 * m,
            ef_construction: ef_construction.max(m),
            ef_search: ef_search.max(1),
            level_mult: 1.0 / (m as f64).ln(),
            codes: SegVec::new(CODE_HEADER_WORDS + dim.div_ceil(4)),
            layer0: SegVec::new(1 + 2 * m),
            upper: SegVec::new(1 + m),
            upper_len: AtomicU32::new(0),
            len: AtomicU32::new(0),
            entry: AtomicU64::new(EMPTY),
            rng: AtomicU64::new(0x9E37_79B9_7F4A_7C15),
            id: NEXT_INDEX_ID.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// A node's code row: [scale, squared norm, code words...] (see the module docs).
    fn row(&self, node: u32) -> &[AtomicU32] {
        self.codes.item(node)
    }

    fn row_code(row: &[AtomicU32], dim: usize) -> &[i8] {
        let words = &row[CODE_HEADER_WORDS..];
        // SAFETY: the row holds ceil(dim / 4) code words, so at least dim bytes; a node's
        // code is written once, before the node is reachable, and never again, so no store
        // races with this plain read.
        unsafe { std::slice::from_raw_parts(words.as_ptr() as *const i8, dim) }
    }

    /// (scale, squared norm of the dequantized vector).
    fn row_scale_norm(row: &[AtomicU32]) -> (f32, f32) {
        (
            f32::from_bits(row[0].load(Ordering::Relaxed)),
            f32::from_bits(row[1].load(Ordering::Relaxed)),
        )
    }

    /// A node's own row as a probe (owner side: neighbour selection).
    fn node_probe(&self, node: u32) -> Probe<'_> {
        let row = self.row(node);
        let (scale, norm) = Self::row_scale_norm(row);
        Probe {
            code: Self::row_code(row, self.dim),
            scale,
            norm,
        }
    }

    fn rep(&self, node: u32) -> RepId {
        let row = self.row(node);
        let lo = row[ROW_REP_LO].load(Ordering::Relaxed) as u64;
        lo | (row[ROW_REP_LO + 1].load(Ordering::Relaxed) as u64) << 32
    }

    fn level_of(&self, node: u32) -> u32 {
        self.row(node)[ROW_LEVEL].load(Ordering::Relaxed)
    }

    /// Node's neighbour list on `layer`: [count, ids...].
    fn links(&self, node: u32, layer: u32) -> &[AtomicU32] {
        if layer == 0 {
            self.layer0.item(node)
        } else {
            let first = self.row(node)[ROW_FIRST_UPPER].load(Ordering::Relaxed);
            self.upper.item(first + layer - 1)
        }
    }

    /// Approximate distance from a probe to a node's code (see the module docs).
    fn dist(&self, q: &Probe, node: u32) -> f32 {
        #[cfg(test)]
        tests::DISTANCES.with(|c| c.set(c.get() + 1));
        let row = self.row(node);
        let (scale, norm) = Self::row_scale_norm(row);
        let dot = q.scale
            * scale
            * crate::kernels::dot_i8i8(q.code, Self::row_code(row, self.dim)) as f32;
        match self.metric {
            Metric::L2Sq => (q.norm + norm - 2.0 * dot).max(0.0),
            Metric::InnerProduct => -dot,
            Metric::Cosine => {
                let denom = (q.norm * norm).sqrt();
                if denom > 0.0 {
                    1.0 - dot / denom
                } else {
                    1.0
                }
            }
        }
    }

    /// Neighbours of `node` on `layer` that lie below `limit` (readers ignore nodes
    /// published after their search began).
    fn for_each_neighbour(&self, node: u32, layer: u32, limit: u32, mut f: impl FnMut(u32)) {
        let list = self.links(node, layer);
        let count = (list[0].load(Ordering::Acquire) as usize).min(list.len() - 1);
        for slot in &list[1..1 + count] {
            let nb = slot.load(Ordering::Acquire);
            if nb < limit {
                f(nb);
            }
        }
    }

    /// Greedy walk on one upper layer: the closest node reachable from `start`.
    fn greedy(&self, q: &Probe, start: Cand, layer: u32, limit: u32) -> Cand {
        let mut cur = start;
        // Each step strictly lowers the distance, so the walk ends; the bound is a guard.
        let mut batch = [0u32; MAX_UPPER_LINKS];
        for _ in 0..limit.max(1) {
            let mut next = cur;
            // Prefetch all neighbours first so their loads overlap, as in search_layer.
            let mut n = 0;
            self.for_each_neighbour(cur.node, layer, limit, |nb| {
                if n < batch.len() {
                    prefetch(self.row(nb));
                    batch[n] = nb;
                    n += 1;
                }
            });
            for &nb in &batch[..n] {
                let c = Cand {
                    dist: self.dist(q, nb),
                    node: nb,
                };
                if c < next {
                    next = c;
                }
            }
            if next == cur {
                break;
            }
            cur = next;
        }
        cur
    }

    /// Beam search of `how.ef` on `how.layer` from `entries`; leaves the best in
    /// `s.best` (a max-heap). With `serves`, the nearest node found so far is offered to
    /// it once the search has expanded a few nodes (and again each time another node
    /// takes its place); a node that serves, at exact distance d, bounds the rest of the
    /// search to what lies nearer than d. Returns the final bound, the serving node, and
    /// whether the bound cut the search short (else it ended as a plain search of `ef`).
    fn search_layer(
        &self,
        s: &mut Scratch,
        q: &Probe,
        entries: &[Cand],
        how: LayerSearch,
        mut serves: Option<&mut dyn FnMut(u32) -> Option<f32>>,
    ) -> (f32, Option<u32>, bool) {
        let LayerSearch {
            ef,
            layer,
            limit,
            mut bound,
        } = how;
        let (mut nearest, mut offered, mut served) = (None::<Cand>, None::<u32>, None::<u32>);
        let mut offers = 0;
        s.begin(limit as usize);
        for &e in entries {
            if s.visit(e.node) {
                s.frontier.push(Reverse(e));
                s.best.push(e);
                if nearest.is_none_or(|n| e < n) {
                    nearest = Some(e);
                }
            }
        }
        while s.best.len() > ef {
            s.best.pop();
        }
        // Every node enters the frontier at most once (visited), so this ends.
        let mut expanded = 0usize;
        while let Some(Reverse(c)) = s.frontier.pop() {
            let worst = s.best.peek().map_or(f32::INFINITY, |w| w.dist);
            if c.dist > worst && s.best.len() >= ef {
                break;
            }
            // Past the caller's bound nothing found can be used: stop once the nearest
            // unexpanded node lies beyond it, after a few expansions (the walk from the
            // descent's end to a node within the bound may pass farther nodes).
            if expanded >= BOUNDED_MIN_EXPANSIONS {
                if let (Some(serves), Some(n)) = (serves.as_mut(), nearest) {
                    // After a few expansions the nearest found is usually where the
                    // walk settles: fewer than one offer per search on average.
                    if offered != Some(n.node) && offers < SERVING_OFFERS_MAX {
                        offered = Some(n.node);
                        offers += 1;
                        if let Some(d) = serves(n.node) {
                            bound = bound.min(super::index_slack(d));
                            served = Some(n.node);
                        }
                    }
                }
                if c.dist > bound {
                    return (bound, served, true);
                }
            }
            expanded += 1;
            let list = self.links(c.node, layer);
            let count = (list[0].load(Ordering::Acquire) as usize).min(list.len() - 1);
            let mut batch = std::mem::take(&mut s.batch);
            batch.clear();
            for slot in &list[1..1 + count] {
                let nb = slot.load(Ordering::Acquire);
                if nb < limit && s.visit(nb) {
                    prefetch(self.row(nb));
                    batch.push(nb);
                }
            }
            for &nb in &batch {
                let d = self.dist(q, nb);
                let worst = s.best.peek().map_or(f32::INFINITY, |w| w.dist);
                if s.best.len() < ef || d < worst {
                    // It may be expanded next: start loading its links (a miss otherwise).
                    prefetch(self.links(nb, layer));
                    let cand = Cand { dist: d, node: nb };
                    s.frontier.push(Reverse(cand));
                    s.best.push(cand);
                    if nearest.is_none_or(|n| cand < n) {
                        nearest = Some(cand);
                    }
                    if s.best.len() > ef {
                        s.best.pop();
                    }
                }
            }
            s.batch = batch;
        }
        (bound, served, false)
    }

    /// The `ef` nodes nearest `q` found by the full descent, ascending.
    /// Also returns the final bound, the node that served and whether the bound cut the
    /// search short (`search_layer`).
    fn knn(
        &self,
        s: &mut Scratch,
        q: &Probe,
        ef: usize,
        bound: f32,
        serves: Option<&mut dyn FnMut(u32) -> Option<f32>>,
    ) -> (Vec<Cand>, f32, Option<u32>, bool) {
        let entry = self.entry.load(Ordering::Acquire);
        if entry == EMPTY {
            return (Vec::new(), bound, None, false);
        }
        // Acquire on `entry` then `len`: the entry node is below `limit`.
        let limit = self.len.load(Ordering::Acquire);
        let (top, ep) = ((entry >> 32) as u32, entry as u32);
        let mut cur = Cand {
            dist: self.dist(q, ep),
            node: ep,
        };
        for layer in (1..=top).rev() {
            cur = self.greedy(q, cur, layer, limit);
        }
        let how = LayerSearch {
            ef,
            layer: 0,
            limit,
            bound,
        };
        let (bound, served, cut) = self.search_layer(s, q, &[cur], how, serves);
        // drain() keeps the heap's buffer for the next search on this thread.
        let mut out: Vec<Cand> = s.best.drain().collect();
        out.sort_unstable();
        out.truncate(ef);
        (out, bound, served, cut)
    }

    /// `FilterIndex::search`. With a bound or `serves`: one pass under a bound (given, or set by a
    /// node that serves), never widened, keeping what lies within it and the serving
    /// node; without either, the plain search that widens past tombstones (reusing a
    /// pass that offered nothing when it found enough).
    fn search_with(
        &self,
        q: &[f32],
        n: usize,
        accept: &dyn Fn(RepId) -> bool,
        bound: f32,
        serves: Option<&mut dyn FnMut(RepId) -> Option<f32>>,
        seeds: Option<&mut InsertSeeds>,
    ) -> Vec<(RepId, f32)> {
        if n == 0 || q.len() != self.dim {
            return Vec::new();
        }
        let quantized = Quantized::new(q);
        let probe = quantized.probe();
        let kept = |found: &[Cand], bound: f32, served: Option<u32>| -> Vec<(RepId, f32)> {
            found
                .iter()
                .filter(|c| c.dist <= bound || Some(c.node) == served)
                .map(|c| (self.rep(c.node), c.dist))
                .filter(|(r, _)| accept(*r))
                .take(n)
                .collect()
        };
        let ef = self.ef_search.max(n);
        if let Some(serves) = serves {
            let mut offer = |node: u32| {
                let r = self.rep(node);
                if accept(r) {
                    serves(r)
                } else {
                    None
                }
            };
            let (found, bound, served, cut) =
                with_scratch(|s| self.knn(s, &probe, ef, bound, Some(&mut offer)));
            // A search that ran its course for nothing that serves found what an
            // insertion of `q` searches for (with ef_construction, here no more than ef).
            let complete = served.is_none() && !cut && ef >= self.ef_construction;
            if let Some(seeds) = seeds.filter(|_| complete) {
                seeds.index = self.id;
                seeds.nodes.clear();
                seeds.nodes.extend(
                    found
                        .iter()
                        .take(self.ef_construction)
                        .map(|c| (c.node, c.dist)),
                );
            }
            if served.is_some() || bound < f32::INFINITY {
                return kept(&found, bound, served);
            }
            let out = kept(&found, bound, None);
            if out.len() >= n {
                return out;
            }
        } else if bound < f32::INFINITY {
            let (found, ..) = with_scratch(|s| self.knn(s, &probe, ef, bound, None));
            return kept(&found, bound, None);
        }
        super::post_filtered(n, self.ef_search, 2, accept, |ef| {
            with_scratch(|s| self.knn(s, &probe, ef, f32::INFINITY, None).0)
                .iter()
                .map(|c| (self.rep(c.node), c.dist))
                .collect()
        })
    }

    fn draw_level(&self) -> u32 {
        let mut x = self.rng.load(Ordering::Relaxed);
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng.store(x, Ordering::Relaxed);
        let r = x.wrapping_mul(0x2545_F491_4F6C_DD1D);
        // Uniform in (0, 1]: never ln(0).
        let u = ((r >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
        ((-u.ln() * self.level_mult) as u32).min(MAX_LEVEL)
    }

    /// HNSW's neighbour heuristic: keep a candidate only if it is closer to the base than
    /// to every neighbour already kept (spreads links across directions), `max` at most.
    /// Distances between nodes are between their codes (no dequantizing).
    fn select(&self, sorted: &[Cand], max: usize, out: &mut Vec<u32>) {
        out.clear();
        for c in sorted {
            if out.len() >= max {
                break;
            }
            if out.is_empty() {
                // The nearest candidate is always kept: nothing to compare it with.
                out.push(c.node);
                continue;
            }
            let probe = self.node_probe(c.node);
            if out.iter().all(|&kept| self.dist(&probe, kept) > c.dist) {
                out.push(c.node);
            }
        }
    }

    fn write_links(list: &[AtomicU32], ids: &[u32]) {
        debug_assert!(ids.len() < list.len());
        for (slot, &id) in list[1..].iter().zip(ids) {
            slot.store(id, Ordering::Release);
        }
        list[0].store(ids.len() as u32, Ordering::Release);
    }

    /// `insert`; a node that lives on layer 0 alone is linked among `seeds` if given.
    fn insert_node(&self, rep: RepId, v: &[f32], seeds: Option<&InsertSeeds>) {
        assert_eq!(
            v.len(),
            self.dim,
            "graph index: vector of the wrong dimension"
        );
        let node = self.len.load(Ordering::Relaxed);
        assert!(node < MAX_NODES, "graph index full");
        let level = self.draw_level();
        let first_upper = self.reserve_node(node, level);
        let quantized = Quantized::new(v);
        self.write_row(node, rep, level, first_upper, &quantized);

        let entry = self.entry.load(Ordering::Relaxed);
        if entry == EMPTY {
            self.len.store(node + 1, Ordering::Release);
            self.entry
                .store(((level as u64) << 32) | node as u64, Ordering::Release);
            return;
        }
        let top = (entry >> 32) as u32;
        let v = &quantized.probe();
        let mut buffers = LinkBuffers::new(self.m0);
        let found = self.seed_candidates(seeds, level, node);
        // (No seed left: searched as without seeds, so the node is linked.)
        if !found.is_empty() {
            self.link(node, 0, &found, &mut buffers);
            self.len.store(node + 1, Ordering::Release);
            return;
        }
        self.link_by_search(v, node, level, entry, &mut buffers);
        self.len.store(node + 1, Ordering::Release);
        if level > top {
            self.entry
                .store(((level as u64) << 32) | node as u64, Ordering::Release);
        }
        debug_assert!(self.level_of(node) == level);
    }

    /// Makes room for `node`'s row, its layer-0 list and its `level` upper lists;
    /// returns the first of those upper lists.
    #[inline]
    fn reserve_node(&self, node: u32, level: u32) -> u32 {
        self.codes.reserve(node);
        self.layer0.reserve(node);
        let first_upper = self.upper_len.load(Ordering::Relaxed);
        for l in 0..level {
            self.upper.reserve(first_upper + l);
        }
        self.upper_len.store(first_upper + level, Ordering::Relaxed);
        first_upper
    }

    /// Writes `node`'s row: its code, the representative it stands for, its level and
    /// where its upper lists start.
    #[inline]
    fn write_row(&self, node: u32, rep: RepId, level: u32, first_upper: u32, q: &Quantized) {
        let row = self.row(node);
        row[0].store(q.scale.to_bits(), Ordering::Relaxed);
        row[1].store(q.norm.to_bits(), Ordering::Relaxed);
        for (slot, word) in row[CODE_HEADER_WORDS..].iter().zip(q.code.chunks(4)) {
            let mut bytes = [0u8; 4];
            for (b, &c) in bytes.iter_mut().zip(word) {
                *b = c as u8;
            }
            // Native byte order: `row_code()` reads these words back as bytes in place.
            slot.store(u32::from_ne_bytes(bytes), Ordering::Relaxed);
        }
        row[ROW_REP_LO].store(rep as u32, Ordering::Relaxed);
        row[ROW_REP_LO + 1].store((rep >> 32) as u32, Ordering::Relaxed);
        row[ROW_LEVEL].store(level, Ordering::Relaxed);
        row[ROW_FIRST_UPPER].store(first_upper, Ordering::Relaxed);
    }

    /// The seeds' nodes as candidates for `node` on layer 0, nearest first; none when
    /// there are no seeds or `node` lives above layer 0.
    #[inline]
    fn seed_candidates(&self, seeds: Option<&InsertSeeds>, level: u32, node: u32) -> Vec<Cand> {
        // Nodes are never removed from a graph, so each seed is still a node here (one at
        // or past `node` cannot be, and is dropped rather than read); the distances are
        // the ones this node's own code gives (the same vector, quantized the same way).
        // Nodes added since the lookup are not among them: a few, in the time a backend
        // call takes.
        seeds
            .filter(|_| level == 0)
            .map(|seeds| {
                let found: Vec<Cand> = seeds
                    .nodes
                    .iter()
                    .filter(|&&(seed, _)| seed < node)
                    .map(|&(node, dist)| Cand { dist, node })
                    .collect();
                debug_assert_eq!(found.len(), seeds.nodes.len());
                debug_assert!(found.is_sorted());
                found
            })
            .unwrap_or_default()
    }

    /// Links `node` (on `level`, `v` its probe) by HNSW's descent from the entry point:
    /// greedy above its level, a beam search on each layer from there down.
    #[inline]
    fn link_by_search(
        &self,
        v: &Probe,
        node: u32,
        level: u32,
        entry: u64,
        buffers: &mut LinkBuffers,
    ) {
        let (top, ep) = ((entry >> 32) as u32, entry as u32);
        // The owner sees every node it wrote, the new one included.
        let limit = node + 1;
        let mut cur = Cand {
            dist: self.dist(v, ep),
            node: ep,
        };
        for layer in (level + 1..=top).rev() {
            cur = self.greedy(v, cur, layer, node);
        }
        let mut entries = vec![cur];
        with_scratch(|s| {
            for layer in (0..=level.min(top)).rev() {
                // `node` is not linked yet, so the search cannot reach it.
                let how = LayerSearch {
                    ef: self.ef_construction,
                    layer,
                    limit,
                    bound: f32::INFINITY,
                };
                self.search_layer(s, v, &entries, how, None);
                let mut found: Vec<Cand> = s.best.drain().collect();
                found.sort_unstable();
                self.link(node, layer, &found, buffers);
                let max = if layer == 0 { self.m0 } else { self.m };
                debug_assert!(buffers.kept.len() <= max && !buffers.kept.contains(&node));
                entries = found;
            }
        });
    }

    /// Links `node` on `layer` to the neighbours the heuristic keeps of `found` (sorted),
    /// and each of them back to it.
    #[inline]
    fn link(&self, node: u32, layer: u32, found: &[Cand], buffers: &mut LinkBuffers) {
        let LinkBuffers {
            kept,
            kept_back,
            prune,
        } = buffers;
        self.select(found, self.m, kept);
        Self::write_links(self.links(node, layer), kept);
        for &nb in kept.iter() {
            self.link_back(nb, node, layer, prune, kept_back);
        }
    }

    /// Adds `new` to `node`'s list on `layer`, pruning by the heuristic when full.
    fn link_back(
        &self,
        node: u32,
        new: u32,
        layer: u32,
        scratch: &mut Vec<Cand>,
        kept: &mut Vec<u32>,
    ) {
        let list = self.links(node, layer);
        let max = list.len() - 1;
        let count = list[0].load(Ordering::Relaxed) as usize;
        if count < max {
            list[1 + count].store(new, Ordering::Release);
            list[0].store(count as u32 + 1, Ordering::Release);
            return;
        }
        let base = self.node_probe(node);
        scratch.clear();
        scratch.extend(list[1..1 + count].iter().map(|s| {
            let nb = s.load(Ordering::Relaxed);
            Cand {
                dist: self.dist(&base, nb),
                node: nb,
            }
        }));
        scratch.push(Cand {
            dist: self.dist(&base, new),
            node: new,
        });
        scratch.sort_unstable();
        self.select(scratch, max, kept);
        Self::write_links(list, kept);
    }
}

impl FilterIndex for GraphIndex {
    /// Owner only (one writer per generation).
    fn insert(&self, rep: RepId, v: &[f32]) {
        self.insert_node(rep, v, None);
    }

    /// Owner only. A node drawn for layer 0 alone (3 of 4 at m = 4) is linked among the
    /// seeds' nodes (the nearest a lookup of `v` found here, `search_with`) without the
    /// descent and the layer-0 search, a third of an admission's time.
    fn insert_seeded(&self, rep: RepId, v: &[f32], seeds: &InsertSeeds) {
        // Empty seeds, or none left once filtered: `insert_node` searches.
        let seeds = (seeds.index == self.id).then_some(seeds);
        self.insert_node(rep, v, seeds);
    }

    fn search(&self, q: &[f32], want: FilterQuery<'_>) -> Vec<(RepId, f32)> {
        let FilterQuery {
            n,
            accept,
            bound,
            serves,
            seeds,
        } = want;
        self.search_with(q, n, accept, bound, serves, seeds)
    }

    fn len(&self) -> usize {
        self.len.load(Ordering::Acquire) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::FilterKind;
    use std::cell::Cell;

    thread_local! {
        /// Distances this thread's searches computed (`GraphIndex::dist`).
        pub(super) static DISTANCES: Cell<usize> = const { Cell::new(0) };
    }

    /// The searches the tests ask for, spelled out (`FilterQuery` in one line each).
    impl GraphIndex {
        fn nearest(
            &self,
            q: &[f32],
            n: usize,
            accept: &dyn Fn(RepId) -> bool,
        ) -> Vec<(RepId, f32)> {
            self.search(q, FilterQuery::nearest(n, accept))
        }

        fn search_bounded(
            &self,
            q: &[f32],
            n: usize,
            accept: &dyn Fn(RepId) -> bool,
            bound: f32,
        ) -> Vec<(RepId, f32)> {
            self.search(
                q,
                FilterQuery {
                    bound,
                    ..FilterQuery::nearest(n, accept)
                },
            )
        }

        fn search_serving(
            &self,
            q: &[f32],
            n: usize,
            accept: &dyn Fn(RepId) -> bool,
            serves: &mut dyn FnMut(RepId) -> Option<f32>,
            bound: f32,
            seeds: Option<&mut InsertSeeds>,
        ) -> Vec<(RepId, f32)> {
            let want = FilterQuery {
                n,
                accept,
                bound,
                serves: Some(serves),
                seeds,
            };
            self.search(q, want)
        }
    }

    fn distances_during<R>(f: impl FnOnce() -> R) -> (R, usize) {
        let before = DISTANCES.with(Cell::get);
        let r = f();
        (r, DISTANCES.with(Cell::get) - before)
    }

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32) / (1u64 << 24) as f32 - 0.5
    }

    #[test]
    fn locate_covers_ids_without_gaps() {
        assert_eq!(locate(0), (0, 0));
        assert_eq!(locate(63), (0, 63));
        assert_eq!(locate(64), (1, 0));
        assert_eq!(locate(191), (1, 127));
        assert_eq!(locate(192), (2, 0));
        let (k, off) = locate(u32::MAX);
        assert!(k < MAX_CHUNKS && off < chunk_items(k));
    }

    /// A graph (m 8, efc 64) of `n` uniform points in 16 dimensions, rep id = index.
    fn random_graph(seed: &mut u64, n: usize, ef_search: usize) -> (GraphIndex, Vec<Vec<f32>>) {
        let dim = 16;
        let g = GraphIndex::new(Metric::L2Sq, dim, 8, 64, ef_search);
        let pts: Vec<Vec<f32>> = (0..n)
            .map(|_| (0..dim).map(|_| lcg(seed)).collect())
            .collect();
        for (i, p) in pts.iter().enumerate() {
            g.insert(i as RepId, p);
        }
        (g, pts)
    }

    #[test]
    fn finds_the_true_nearest_almost_always() {
        let dim = 16;
        let mut seed = 7;
        let (g, pts) = random_graph(&mut seed, 3000, 32);
        assert_eq!(g.len(), 3000);
        let mut hits = 0;
        for _ in 0..200 {
            let q: Vec<f32> = (0..dim).map(|_| lcg(&mut seed)).collect();
            let truth = pts
                .iter()
                .enumerate()
                .min_by(|a, b| {
                    Metric::L2Sq
                        .distance(&q, a.1)
                        .total_cmp(&Metric::L2Sq.distance(&q, b.1))
                })
                .unwrap()
                .0 as RepId;
            let got = g.nearest(&q, 1, &|_| true);
            assert_eq!(got.len(), 1);
            hits += (got[0].0 == truth) as usize;
        }
        assert!(hits >= 190, "recall@1 {hits}/200");
    }

    /// Clustered points (`clusters` centres, spread 0.05 around them, in `dim`
    /// dimensions), the kind of data on which the paper's m 4 / efc 8 graph misses most.
    fn clustered(seed: &mut u64, n: usize, dim: usize, clusters: usize) -> Vec<Vec<f32>> {
        let centres: Vec<Vec<f32>> = (0..clusters)
            .map(|_| (0..dim).map(|_| lcg(seed)).collect())
            .collect();
        (0..n)
            .map(|i| {
                let c = &centres[i % clusters];
                c.iter().map(|x| x + 0.1 * lcg(seed)).collect()
            })
            .collect()
    }

    /// How many points a near copy of which finds the point itself first.
    fn self_found(g: &GraphIndex, pts: &[Vec<f32>]) -> usize {
        let mut found = 0;
        for (i, p) in pts.iter().enumerate() {
            let mut q = p.clone();
            q[0] = q[0].next_up();
            found +=
                (g.nearest(&q, 1, &|_| true).first().map(|r| r.0) == Some(i as RepId)) as usize;
        }
        found
    }

    /// Admission with the seeds of the miss's lookup (`insert_seeded`): a node on layer
    /// 0 alone skips the descent and the search; the graph it builds finds its points
    /// as often as one built by plain insertions (here more often: the lookup searched
    /// with ef 16, an insertion with efc 8), with fewer distances per insertion. Seeds
    /// of another index, or none, insert as `insert` does.
    #[test]
    fn seeded_insertions_build_as_good_a_graph() {
        let (dim, n) = (32, 4000);
        let pts = clustered(&mut 11, n, dim, 40);
        let (m, efc, efs) = FilterKind::PAPER;
        let plain = GraphIndex::new(Metric::L2Sq, dim, m, efc, efs);
        let seeded = GraphIndex::new(Metric::L2Sq, dim, m, efc, efs);
        let other = GraphIndex::new(Metric::L2Sq, dim, m, efc, efs);
        let (mut plain_cost, mut seeded_cost, mut used) = (0, 0, 0);
        for (i, p) in pts.iter().enumerate() {
            let r = i as RepId;
            plain_cost += distances_during(|| plain.insert(r, p)).1;
            let mut seeds = InsertSeeds::default();
            let found = seeded.search_serving(
                p,
                1,
                &|_| true,
                &mut |_| None,
                f32::INFINITY,
                Some(&mut seeds),
            );
            if i > 0 {
                // A search that ran its course for nothing serving leaves efc seeds.
                assert_eq!(seeds.index, seeded.id);
                assert_eq!(seeds.nodes.len(), i.min(efc));
                assert_eq!(seeds.nodes[0].0 as RepId, found[0].0);
                used += 1;
            }
            seeded_cost += distances_during(|| seeded.insert_seeded(r, p, &seeds)).1;
            // Another index's seeds are ignored: a plain insertion.
            other.insert_seeded(r, p, &seeds);
        }
        let (p, s, o) = (
            self_found(&plain, &pts),
            self_found(&seeded, &pts),
            self_found(&other, &pts),
        );
        println!(
            "self-found of {n}: plain {p}, seeded {s}, other's seeds {o}; \
            distances per insertion: plain {}, seeded {}",
            plain_cost / n,
            seeded_cost / n
        );
        assert_eq!(used, n - 1);
        assert!(s + n / 100 >= p, "seeded {s} vs plain {p} of {n}");
        assert_eq!(o, p, "seeds of another index must change nothing");
        assert!(
            3 * seeded_cost < 2 * plain_cost,
            "{seeded_cost} vs {plain_cost}"
        );
        // A search narrower than an insertion's leaves no seeds.
        let narrow = GraphIndex::new(Metric::L2Sq, dim, m, 4 * efs, efs);
        for (i, p) in pts.iter().take(100).enumerate() {
            narrow.insert(i as RepId, p);
        }
        let mut seeds = InsertSeeds::default();
        narrow.search_serving(
            &pts[0],
            1,
            &|_| true,
            &mut |_| None,
            f32::INFINITY,
            Some(&mut seeds),
        );
        assert!(seeds.is_empty());
        // A search cut short by its bound leaves no seeds.
        let mut seeds = InsertSeeds::default();
        seeded.search_serving(&pts[0], 1, &|_| true, &mut |_| None, 1e-9, Some(&mut seeds));
        assert!(seeds.is_empty());
    }

    /// The search that offers candidates (`search_serving`): a serving point near the
    /// query ends it early and is returned; with nothing serving it returns what the
    /// plain search does; tombstones (not accepted) are never offered.
    #[test]
    fn a_serving_candidate_ends_the_search_early() {
        let (g, pts) = random_graph(&mut 3, 5000, 16);
        let (mut found_self, mut plain_self, mut offers_max, mut offers_sum) = (0, 0, 0, 0);
        let (mut served_cost, mut plain_cost) = (0, 0);
        for i in 0..300usize {
            let mut q = pts[i * 7].clone();
            q[0] = q[0].next_up();
            let exact = |r: RepId| Metric::L2Sq.distance(&q, &pts[r as usize]);
            // Every point within 0.05 serves; odd ids are tombstones.
            let accept = |r: RepId| r & 1 == 0;
            let mut offered = Vec::new();
            let mut serves = |r: RepId| {
                offered.push(r);
                Some(exact(r)).filter(|&d| d < 0.05)
            };
            let (got, cost) = distances_during(|| {
                g.search_serving(&q, 2, &accept, &mut serves, f32::INFINITY, None)
            });
            assert!(offered.iter().all(|&r| accept(r)), "a tombstone offered");
            offers_max = offers_max.max(offered.len());
            offers_sum += offered.len();
            let (plain, plain_distances) = distances_during(|| g.nearest(&q, 2, &accept));
            plain_self += (plain.first().map(|x| x.0) == Some((i * 7) as RepId)) as usize;
            if got.first().is_some_and(|&(r, _)| exact(r) < 0.05) {
                found_self += (got[0].0 == (i * 7) as RepId) as usize;
                (served_cost, plain_cost) = (served_cost + cost, plain_cost + plain_distances);
                // Nothing the plain search found nearer than the answer is missed
                // (the early stop keeps what lies nearer than a serving candidate).
                let best = got[0].1;
                assert!(
                    plain
                        .iter()
                        .all(|&(r, d)| d >= best || got.iter().any(|g| g.0 == r)),
                    "{got:?} vs {plain:?}"
                );
            } else {
                assert_eq!(got, plain, "nothing served: the plain search's answer");
            }
        }
        assert!(
            found_self >= 135 && found_self + 3 >= plain_self,
            "even points found themselves {found_self}/150 (plain search {plain_self})"
        );
        assert!(
            offers_max <= SERVING_OFFERS_MAX,
            "{offers_max} offers in a search"
        );
        assert!(offers_sum <= 300, "{offers_sum} offers in 300 searches");
        // Where something served, the search ended early.
        assert!(
            served_cost * 10 < plain_cost * 8,
            "{served_cost} distances against {plain_cost} for the plain searches"
        );
    }

    #[test]
    fn every_point_finds_itself_and_the_predicate_holds() {
        let g = GraphIndex::new(Metric::L2Sq, 2, 4, 16, 16);
        for r in 0..500u64 {
            g.insert(r, &[(r % 25) as f32, (r / 25) as f32]);
        }
        for r in 0..500u64 {
            let q = [(r % 25) as f32, (r / 25) as f32];
            // Codes are approximate: the point itself first, at (nearly) zero.
            let got = g.nearest(&q, 1, &|_| true)[0];
            assert_eq!(got.0, r);
            assert!(got.1 < 0.5, "{got:?}");
            let got = g.nearest(&q, 3, &|x| x % 2 == 1);
            assert_eq!(got.len(), 3);
            assert!(got.iter().all(|(x, _)| x % 2 == 1));
            assert!(got.windows(2).all(|w| w[0].1 <= w[1].1));
        }
        // Nothing accepted: empty, not a hang.
        assert!(g.nearest(&[1.0, 1.0], 2, &|_| false).is_empty());
        // A bound keeps only what lies within it (the point itself, not its neighbours
        // at distance 1), and an infinite bound is the plain search.
        for r in (0..500u64).step_by(37) {
            let q = [(r % 25) as f32 + 0.1, (r / 25) as f32];
            let got = g.search_bounded(&q, 3, &|_| true, 0.5);
            assert_eq!(got.len(), 1, "{got:?}");
            assert_eq!(got[0].0, r);
            assert_eq!(
                g.search_bounded(&q, 3, &|_| true, f32::INFINITY),
                g.nearest(&q, 3, &|_| true)
            );
        }
    }

    #[test]
    fn readers_search_while_the_owner_inserts() {
        let g = std::sync::Arc::new(GraphIndex::new(Metric::L2Sq, 8, 4, 16, 16));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let readers: Vec<_> = (0..2)
            .map(|t| {
                let (g, stop) = (g.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut seed = t;
                    let mut searches = 0u64;
                    // Bounded: stops when told, or after 10^6 searches.
                    while !stop.load(Ordering::Relaxed) && searches < 1_000_000 {
                        let q: Vec<f32> = (0..8).map(|_| lcg(&mut seed)).collect();
                        let n = g.len();
                        let got = g.nearest(&q, 2, &|_| true);
                        assert!(got.len() <= 2);
                        // len >= 2 means the entry point was set (after node 0).
                        assert!(n <= 1 || !got.is_empty());
                        assert!(got.iter().all(|(r, _)| (*r as usize) < 20_000));
                        searches += 1;
                    }
                })
            })
            .collect();
        let mut seed = 99;
        for r in 0..20_000u64 {
            let v: Vec<f32> = (0..8).map(|_| lcg(&mut seed)).collect();
            g.insert(r, &v);
        }
        stop.store(true, Ordering::Relaxed);
        for r in readers {
            r.join().unwrap();
        }
        assert_eq!(g.len(), 20_000);
    }
}
