//! Routing by coarse centroid (ARCHITECTURE.md, "Shards by coarse centroid").
//!
//! Many centroids (64 by default, k-means on a sample of the collection) map every
//! vector to a shard. Centroids are assigned to shards by measured load, not
//! round-robin: under skew one centroid can draw a fifth of all traffic. A query near
//! a boundary probes the shards of its two nearest centroids.
//!
//! A centroid that moves leaves its entries in the shard it left. Lookups keep probing
//! that shard for it (after the current ones: [`Router::route_probes`]) until the
//! shard's FIFO has evicted every entry it held at the move ([`Retirements`]), so a
//! rebalance costs no hits; admissions go to the new shard from the move on.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::counter::Counter;
use crate::error::{Error, Result};
use crate::metric::Metric;

/// A rebalance needs at least this many requests per centroid since the last one.
const MIN_REQUESTS_PER_CENTROID: u64 = 32;

/// Most k-means iterations (each is one pass over the sample).
const KMEANS_ITERATIONS_MAX: usize = 25;

/// Evictions beyond the old shard's entry count before a moved centroid's old shard is
/// forgotten (see `Retirements::moved`): at least an owner queue's worth (akerd's
/// default depth, 4096) plus a backend queue's (1024) of admissions routed before the
/// move may land there after it.
const RETIRE_MARGIN: u64 = 8192;

/// `previous` of a centroid that has not moved, or whose old shard is forgotten.
const NO_SHARD: u32 = u32::MAX;

/// The metric requests are routed by. On ip a request's answer depends only on its
/// direction, and the largest dot product would send most requests to the longest
/// centroids: route by angle, as the query filter ranks (`gap.rs`).
fn routing_metric(metric: Metric) -> Metric {
    if metric == Metric::InnerProduct {
        Metric::Cosine
    } else {
        metric
    }
}

/// The index of the centroid (row-major `centroids`, `dim` each) nearest to `q` under
/// `metric`'s routing metric (by angle for inner product), as a router finds it. 0 when
/// there is none.
pub fn nearest_centroid(centroids: &[f32], dim: usize, metric: Metric, q: &[f32]) -> usize {
    let m = routing_metric(metric);
    let mut best = (f32::INFINITY, 0usize);
    for (j, c) in centroids.chunks_exact(dim.max(1)).enumerate() {
        let d = m.distance(q, c);
        if d < best.0 {
            best = (d, j);
        }
    }
    best.1
}

/// A centroid re-assigned by [`Router::rebalance`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Move {
    pub centroid: usize,
    pub from: usize,
    pub to: usize,
}

/// The shards a lookup probes, nearest centroid's first (where a miss is admitted),
/// then the second nearest's, then the shards those two centroids left at their last
/// move; each once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Probes {
    shards: [usize; 4],
    len: usize,
    /// The query's nearest centroid.
    centroid: usize,
}

impl Probes {
    fn push(&mut self, s: usize) {
        if !self.shards[..self.len].contains(&s) {
            self.shards[self.len] = s;
            self.len += 1;
        }
    }

    pub fn as_slice(&self) -> &[usize] {
        &self.shards[..self.len]
    }

    /// Where a miss is admitted.
    pub fn first(&self) -> usize {
        self.shards[0]
    }

    /// The query's nearest centroid (a cluster's owner is chosen by it).
    pub fn centroid(&self) -> usize {
        self.centroid
    }
}

pub struct Router {
    dim: usize,
    metric: Metric,
    /// Row-major, `n_centroids x dim`.
    centroids: Vec<f32>,
    /// Centroid -> shard, re-assignable while readers route.
    assignment: Vec<AtomicU32>,
    /// Requests routed to each centroid (running totals).
    load: Vec<Counter>,
    /// `load` as of the last rebalance: the difference is the recent load.
    load_seen: Vec<AtomicU64>,
    /// Centroid -> the shard it left at its last move, while that shard may still hold
    /// its entries (`NO_SHARD` otherwise).
    previous: Vec<AtomicU32>,
    shards: usize,
    rebalances: AtomicU64,
}

impl Router {
    /// k-means (k-means++ seeding, Lloyd iterations) over `sample` (row-major), then
    /// an even assignment of centroids to `shards` until load is measured.
    pub fn train(
        sample: &[f32],
        dim: usize,
        metric: Metric,
        n_centroids: usize,
        shards: usize,
        seed: u64,
    ) -> Result<Self> {
        if dim == 0 || !sample.len().is_multiple_of(dim) || sample.is_empty() {
            return Err(Error::Config(
                "router sample must be a non-empty multiple of dim".into(),
            ));
        }
        if shards == 0 || n_centroids == 0 {
            return Err(Error::Config(
                "router needs at least one shard and one centroid".into(),
            ));
        }
        // On ip requests route by angle (below), so the centroids are those of the
        // sample's directions (spherical k-means): short vectors would otherwise pull
        // centroids toward the origin, where direction is noise.
        let directions: Vec<f32>;
        let sample = if metric == Metric::InnerProduct {
            directions = sample
                .chunks_exact(dim)
                .flat_map(crate::gap::unit)
                .collect();
            &directions[..]
        } else {
            sample
        };
        let n = sample.len() / dim;
        let c = n_centroids.min(n);
        let mut rng = StdRng::seed_from_u64(seed);
        let mut centroids = kmeans_pp_seeds(sample, dim, c, &mut rng);
        lloyd(sample, dim, &mut centroids);
        Ok(Router {
            dim,
            metric: routing_metric(metric),
            assignment: (0..c)
                .map(|j| AtomicU32::new((j % shards) as u32))
                .collect(),
            load: (0..c).map(|_| Counter::default()).collect(),
            load_seen: (0..c).map(|_| AtomicU64::new(0)).collect(),
            previous: (0..c).map(|_| AtomicU32::new(NO_SHARD)).collect(),
            centroids,
            shards,
            rebalances: AtomicU64::new(0),
        })
    }

    pub fn shards(&self) -> usize {
        self.shards
    }

    /// The state a warm restart needs (`snapshot.rs`); load counters start afresh.
    pub fn image(&self, shares: Vec<u64>) -> crate::snapshot::RouterImage {
        let load = |a: &AtomicU32| a.load(Ordering::Relaxed);
        crate::snapshot::RouterImage {
            centroids: self.centroids.clone(),
            assignment: self.assignment.iter().map(load).collect(),
            previous: self.previous.iter().map(load).collect(),
            shares,
        }
    }

    /// A router from [`Router::image`], for `shards` shards of `dim`-d `metric` vectors;
    /// refused unless every centroid and shard number fits.
    pub fn from_image(
        img: &crate::snapshot::RouterImage,
        dim: usize,
        metric: Metric,
        shards: usize,
    ) -> Result<Router> {
        let c = img.assignment.len();
        let ok = dim > 0
            && c > 0
            && img.centroids.len() == c * dim
            && img.previous.len() == c
            && img.centroids.iter().all(|x| x.is_finite())
            && img.assignment.iter().all(|&s| (s as usize) < shards)
            && img
                .previous
                .iter()
                .all(|&s| s == NO_SHARD || (s as usize) < shards);
        if !ok {
            return Err(Error::Config(format!(
                "router image does not fit {shards} shards of {dim}-d vectors"
            )));
        }
        let atomic = |v: &[u32]| v.iter().map(|&x| AtomicU32::new(x)).collect();
        Ok(Router {
            dim,
            metric: routing_metric(metric),
            centroids: img.centroids.clone(),
            assignment: atomic(&img.assignment),
            load: (0..c).map(|_| Counter::default()).collect(),
            load_seen: (0..c).map(|_| AtomicU64::new(0)).collect(),
            previous: atomic(&img.previous),
            shards,
            rebalances: AtomicU64::new(0),
        })
    }

    pub fn centroids(&self) -> usize {
        self.assignment.len()
    }

    /// The centroids, row-major (`centroids() x dim`).
    pub fn centroid_vectors(&self) -> &[f32] {
        &self.centroids
    }

    pub fn rebalances(&self) -> u64 {
        self.rebalances.load(Ordering::Relaxed)
    }

    fn nearest_two(&self, q: &[f32]) -> (usize, Option<usize>) {
        debug_assert_eq!(q.len(), self.dim);
        let (mut b1, mut b2) = ((f32::INFINITY, 0usize), (f32::INFINITY, usize::MAX));
        for (j, c) in self.centroids.chunks_exact(self.dim).enumerate() {
            let d = self.metric.distance(q, c);
            if d < b1.0 {
                b2 = b1;
                b1 = (d, j);
            } else if d < b2.0 {
                b2 = (d, j);
            }
        }
        (b1.1, (b2.1 != usize::MAX).then_some(b2.1))
    }

    fn shards_of(&self, j1: usize, j2: Option<usize>) -> [usize; 2] {
        // Acquire: a lookup that sees a centroid's new shard sees the one it left too.
        let s1 = self.assignment[j1].load(Ordering::Acquire) as usize;
        let s2 = j2.map_or(s1, |j| self.assignment[j].load(Ordering::Acquire) as usize);
        [s1, s2]
    }

    /// A search's two nearest centroids' shards (the same one twice when they agree);
    /// counts the request against the nearest centroid's load.
    pub fn route(&self, q: &[f32]) -> [usize; 2] {
        let (j1, j2) = self.nearest_two(q);
        self.load[j1].bump();
        self.shards_of(j1, j2)
    }

    /// [`Router::route`]'s shards plus those its two centroids left at their last
    /// move (see the module doc); counts the request as `route` does.
    pub fn route_probes(&self, q: &[f32]) -> Probes {
        let (j1, j2) = self.nearest_two(q);
        self.load[j1].bump();
        let [s1, s2] = self.shards_of(j1, j2);
        let mut p = Probes {
            shards: [s1; 4],
            len: 1,
            centroid: j1,
        };
        p.push(s2);
        for j in std::iter::once(j1).chain(j2) {
            let old = self.previous[j].load(Ordering::Relaxed);
            if old != NO_SHARD {
                p.push(old as usize);
            }
        }
        p
    }

    /// The shard `centroid` left at its last move, while it is remembered.
    pub fn previous(&self, centroid: usize) -> Option<usize> {
        let s = self.previous[centroid].load(Ordering::Relaxed);
        (s != NO_SHARD).then_some(s as usize)
    }

    /// Stops probing `shard` for `centroid` (if that is still the shard it left).
    pub fn forget_previous(&self, centroid: usize, shard: usize) {
        let _ = self.previous[centroid].compare_exchange(
            shard as u32,
            NO_SHARD,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }

    /// Centroids whose old shard lookups still probe.
    pub fn previous_count(&self) -> usize {
        self.previous
            .iter()
            .filter(|p| p.load(Ordering::Relaxed) != NO_SHARD)
            .count()
    }

    /// After a FLUSH: no shard holds anything worth probing for.
    pub fn forget_all_previous(&self) {
        for p in &self.previous {
            p.store(NO_SHARD, Ordering::Relaxed);
        }
    }

    /// The same for a write: not counted as search load.
    pub fn route_write(&self, v: &[f32]) -> [usize; 2] {
        let (j1, j2) = self.nearest_two(v);
        self.shards_of(j1, j2)
    }

    /// Re-assigns centroids to shards by the load measured since the last call
    /// (heaviest centroid first, each to the least-loaded shard: LPT), but only when
    /// that lowers the busiest shard's load by more than 15%: a move makes lookups probe
    /// one more shard until the old one's entries age out, so small gains are not worth
    /// it. Returns the moves; hand them to a [`Retirements`]. Control plane: call it from
    /// one place.
    pub fn rebalance(&self) -> Vec<Move> {
        let now: Vec<u64> = self.load.iter().map(Counter::get).collect();
        let loads: Vec<u64> = now
            .iter()
            .zip(&self.load_seen)
            .map(|(&n, seen)| n - seen.load(Ordering::Relaxed).min(n))
            .collect();
        self.rebalances.fetch_add(1, Ordering::Relaxed);
        // Too few requests to tell load from noise: they count towards the next call
        // (a slow stretch of traffic is measured over as many calls as it takes).
        if loads.iter().sum::<u64>() < MIN_REQUESTS_PER_CENTROID * loads.len() as u64 {
            return Vec::new();
        }
        for (seen, n) in self.load_seen.iter().zip(now) {
            seen.store(n, Ordering::Relaxed);
        }
        let current: Vec<usize> = self
            .assignment
            .iter()
            .map(|a| a.load(Ordering::Relaxed) as usize)
            .collect();
        let proposed = assign_by_load(&loads, self.shards);
        let busiest = |assign: &[usize]| {
            let mut per = vec![0u64; self.shards];
            for (j, &s) in assign.iter().enumerate() {
                per[s] += loads[j];
            }
            per.into_iter().max().unwrap_or(0)
        };
        if (busiest(&proposed) as f64) * 1.15 >= busiest(&current) as f64 {
            return Vec::new();
        }
        let mut moves = Vec::new();
        for (j, &to) in proposed.iter().enumerate() {
            let from = current[j];
            if from != to {
                // The old shard is remembered before lookups are sent elsewhere.
                self.previous[j].store(from as u32, Ordering::Relaxed);
                self.assignment[j].store(to as u32, Ordering::Release);
                moves.push(Move {
                    centroid: j,
                    from,
                    to,
                });
            }
        }
        moves
    }

    /// Per-shard search load since the last rebalance, under the current assignment.
    pub fn shard_loads(&self) -> Vec<u64> {
        let mut out = vec![0u64; self.shards];
        for ((a, l), seen) in self.assignment.iter().zip(&self.load).zip(&self.load_seen) {
            out[a.load(Ordering::Relaxed) as usize] +=
                l.get() - seen.load(Ordering::Relaxed).min(l.get());
        }
        out
    }
}

/// When a moved centroid's old shard may stop being probed: once that shard's FIFO has
/// evicted as many entries as it held at the move, every entry older than the move is
/// gone (each eviction takes the oldest live one; invalidations only make it sooner).
#[derive(Debug, Default)]
pub struct Retirements {
    /// (centroid, old shard, the old shard's eviction count that retires it)
    pending: Vec<(usize, usize, u64)>,
}

impl Retirements {
    /// Notes `moves`; `evictions(s)` and `entries(s)` read shard `s`'s counters now.
    pub fn moved(
        &mut self,
        moves: &[Move],
        evictions: impl Fn(usize) -> u64,
        entries: impl Fn(usize) -> u64,
    ) {
        for m in moves {
            // A centroid that moves again is probed in the shard it left last only.
            self.pending.retain(|&(j, _, _)| j != m.centroid);
            // The margin covers an entry count published up to an owner batch late and
            // admissions routed before the move that land after it.
            let target = evictions(m.from) + entries(m.from) + RETIRE_MARGIN;
            self.pending.push((m.centroid, m.from, target));
        }
    }

    /// Forgets the old shards whose entries have aged out; returns how many.
    pub fn retire(&mut self, router: &Router, evictions: impl Fn(usize) -> u64) -> usize {
        let before = self.pending.len();
        self.pending.retain(|&(j, s, target)| {
            let done = evictions(s) >= target || router.previous(j) != Some(s);
            if done {
                router.forget_previous(j, s);
            }
            !done
        });
        before - self.pending.len()
    }

    /// After a FLUSH.
    pub fn clear(&mut self) {
        self.pending.clear();
    }

    pub fn len(&self) -> usize {
        self.pending.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }
}

/// k-means++ seeding: `c` centroids drawn from `sample` (row-major, `dim` wide), each
/// with probability proportional to its squared distance from those drawn before.
fn kmeans_pp_seeds(sample: &[f32], dim: usize, c: usize, rng: &mut StdRng) -> Vec<f32> {
    let n = sample.len() / dim;
    let row = |i: usize| &sample[i * dim..(i + 1) * dim];
    let mut centroids: Vec<f32> = row(rng.gen_range(0..n)).to_vec();
    let mut d2: Vec<f64> = (0..n)
        .map(|i| Metric::L2Sq.distance(row(i), &centroids[..dim]) as f64)
        .collect();
    while centroids.len() / dim < c {
        let total: f64 = d2.iter().sum();
        let pick = if total <= 0.0 {
            rng.gen_range(0..n)
        } else {
            let mut t = rng.gen_range(0.0..total);
            d2.iter()
                .position(|&x| {
                    t -= x;
                    t <= 0.0
                })
                .unwrap_or(n - 1)
        };
        let new = row(pick).to_vec();
        for (i, d) in d2.iter_mut().enumerate() {
            *d = d.min(Metric::L2Sq.distance(row(i), &new) as f64);
        }
        centroids.extend_from_slice(&new);
    }
    centroids
}

/// Lloyd iterations over `sample` from `centroids` (row-major, `dim` wide), in place:
/// at most [`KMEANS_ITERATIONS_MAX`], until no vector changes centroid. A centroid
/// left without vectors stays where it was.
fn lloyd(sample: &[f32], dim: usize, centroids: &mut [f32]) {
    let n = sample.len() / dim;
    let c = centroids.len() / dim;
    let row = |i: usize| &sample[i * dim..(i + 1) * dim];
    let mut assign = vec![usize::MAX; n];
    for _ in 0..KMEANS_ITERATIONS_MAX {
        let mut changed = 0;
        for (i, a) in assign.iter_mut().enumerate() {
            let best = nearest(centroids, dim, Metric::L2Sq, row(i));
            if *a != best {
                *a = best;
                changed += 1;
            }
        }
        let mut sums = vec![0f64; c * dim];
        let mut counts = vec![0usize; c];
        for (i, &a) in assign.iter().enumerate() {
            counts[a] += 1;
            for (s, &x) in sums[a * dim..(a + 1) * dim].iter_mut().zip(row(i)) {
                *s += x as f64;
            }
        }
        for j in 0..c {
            if counts[j] > 0 {
                for t in 0..dim {
                    centroids[j * dim + t] = (sums[j * dim + t] / counts[j] as f64) as f32;
                }
            }
        }
        if changed == 0 {
            break;
        }
    }
}

fn nearest(centroids: &[f32], dim: usize, metric: Metric, v: &[f32]) -> usize {
    let mut best = (f32::INFINITY, 0);
    for (j, c) in centroids.chunks_exact(dim).enumerate() {
        let d = metric.distance(v, c);
        if d < best.0 {
            best = (d, j);
        }
    }
    best.1
}

/// Longest-processing-time assignment: heaviest first, to the lightest shard.
pub fn assign_by_load(loads: &[u64], shards: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..loads.len()).collect();
    order.sort_by(|&a, &b| loads[b].cmp(&loads[a]).then(a.cmp(&b)));
    let mut shard_load = vec![0u64; shards];
    let mut out = vec![0usize; loads.len()];
    for j in order {
        let s = (0..shards)
            .min_by_key(|&s| (shard_load[s], s))
            .expect("shards > 0");
        // Zero-load centroids still count one, so idle ones spread evenly.
        shard_load[s] += loads[j].max(1);
        out[j] = s;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lpt_balances_a_skewed_load() {
        // one centroid draws a fifth of the traffic
        let mut loads = vec![10u64; 63];
        loads.push(160);
        let a = assign_by_load(&loads, 4);
        let mut per = [0u64; 4];
        for (j, &s) in a.iter().enumerate() {
            per[s] += loads[j];
        }
        let (max, min) = (*per.iter().max().unwrap(), *per.iter().min().unwrap());
        assert!(max - min <= 10, "{per:?}");
        // round-robin would have put 160 + 15 * 10 = 310 on one shard
        assert!(max < 310);
    }

    #[test]
    fn on_ip_requests_route_by_direction_whatever_their_length() {
        // Four directions 60° or more apart, two with long vectors (5-20), two with short
        // ones (0.05-0.5): by the largest dot product a request along a short direction
        // would go to the long centroid 60° away; by angle each direction keeps its home
        // whatever the request's length.
        let degrees = [0.0f32, 60.0, 180.0, 240.0];
        let mut sample = Vec::new();
        for (c, d) in degrees.iter().enumerate() {
            for i in 0..50 {
                let r = if c % 2 == 0 {
                    5.0 + i as f32 * 0.3
                } else {
                    0.05 + i as f32 * 0.01
                };
                let t = (d + (i % 5) as f32 * 0.5).to_radians();
                sample.extend_from_slice(&[r * t.cos(), r * t.sin()]);
            }
        }
        let r = Router::train(&sample, 2, Metric::InnerProduct, 4, 4, 1).unwrap();
        let mut homes = std::collections::HashSet::new();
        for (c, d) in degrees.iter().enumerate() {
            let t = (d + 1.0).to_radians();
            let at = |len: f32| [len * t.cos(), len * t.sin()];
            let home = r.route(&at(1.0))[0];
            for len in [0.01, 0.3, 7.0, 500.0] {
                assert_eq!(r.route(&at(len))[0], home, "direction {c}, length {len}");
            }
            homes.insert(home);
        }
        assert_eq!(homes.len(), 4, "each direction its own shard");
    }

    #[test]
    fn kmeans_finds_separated_clusters_and_routes_to_them() {
        let mut sample = Vec::new();
        for c in 0..4 {
            for i in 0..50 {
                sample.extend_from_slice(&[
                    c as f32 * 100.0 + (i % 5) as f32 * 0.1,
                    (i / 5) as f32 * 0.1,
                ]);
            }
        }
        let r = Router::train(&sample, 2, Metric::L2Sq, 4, 2, 1).unwrap();
        // points of one cluster route to the same shard; nearest two differ across clusters
        let s0 = r.route(&[0.2, 0.2])[0];
        assert_eq!(r.route(&[0.3, 0.5])[0], s0);
        let shards: std::collections::HashSet<usize> = (0..4)
            .map(|c| r.route(&[c as f32 * 100.0, 0.0])[0])
            .collect();
        assert_eq!(shards.len(), 2, "4 centroids over 2 shards use both");
        // skewed load: one cluster draws most requests; a rebalance that helps moves
        // centroids, and the load counters restart
        for _ in 0..100 {
            r.route(&[300.0, 0.0]);
            r.route(&[0.0, 0.0]);
        }
        r.route_write(&[100.0, 0.0]);
        assert_eq!(r.shard_loads().iter().sum::<u64>(), 4 + 200 + 2);
        let before = r.shard_loads();
        let moves = r.rebalance();
        assert_eq!(r.shard_loads().iter().sum::<u64>(), 0);
        if before[0].abs_diff(before[1]) > 100 {
            assert!(!moves.is_empty(), "{before:?}");
        }
        // a moved centroid's queries probe the shard it left too, after the new ones
        for m in &moves {
            let q = &r.centroids[m.centroid * 2..m.centroid * 2 + 2];
            let p = r.route_probes(q);
            assert_eq!(p.first(), m.to);
            assert!(p.as_slice()[1..].contains(&m.from), "{p:?} {m:?}");
            assert_eq!(r.previous(m.centroid), Some(m.from));
        }
        // ... until the old shard has evicted what it held at the move
        let mut ret = Retirements::default();
        ret.moved(&moves, |_| 10, |_| 5);
        assert_eq!(ret.retire(&r, |_| 14 + RETIRE_MARGIN), 0);
        assert_eq!(ret.retire(&r, |_| 15 + RETIRE_MARGIN), moves.len());
        for m in &moves {
            assert_eq!(r.previous(m.centroid), None);
            let q = &r.centroids[m.centroid * 2..m.centroid * 2 + 2];
            assert!(
                !r.route_probes(q).as_slice().contains(&m.from) || r.route(q).contains(&m.from)
            );
        }
        // a handful of requests moves nothing
        for c in 0..4 {
            r.route(&[c as f32 * 100.0, 0.0]);
        }
        assert!(r.rebalance().is_empty());
        assert!(Router::train(&[], 2, Metric::L2Sq, 4, 2, 1).is_err());
    }
}
