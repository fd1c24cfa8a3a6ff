//! The simZipf workload (ALGORITHM.md, "Workload: simZipf"; paper §5.1): similar-query
//! groups built by interpolating each base query towards random partners, and a request
//! stream that picks a group by YCSB's scrambled Zipfian rank
//! ([`aker_formats::zipf`]) and then a member uniformly. Hash collisions in the scrambled
//! generator leave about a third of the groups with no rank at all, at every skew; that
//! is expected.

use aker_formats::data::Dataset;
use aker_formats::trace::Trace;
use aker_formats::zipf::ScrambledZipfianGenerator;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shards::Metric;

/// Queries per similar-query group (§5.1).
pub const GROUP_SIZE: usize = 50;
/// Requests in a simZipf stream (§5.1).
pub const DEFAULT_REQUESTS: usize = 100_000;
/// The skews the paper evaluates (Zipfian exponents).
pub const SKEWS: [f64; 3] = [0.30, 0.60, 0.99];
/// Interpolation weights are drawn from `U(0, MAX_LAMBDA)`.
pub const MAX_LAMBDA: f32 = 0.5;

/// Similar-query groups, built once and shared by every skew.
#[derive(Clone, Debug, PartialEq)]
pub struct Groups {
    pub dim: usize,
    pub group_size: usize,
    /// Member `i` of group `g` is row `g * group_size + i`.
    pub members: Vec<f32>,
}

impl Groups {
    /// For each row `q` of `bases`, `group_size` members `(1 − λ)·q + λ·p`, each with
    /// its own partner `p` drawn uniformly from `partners` and `λ ~ U(0, 0.5)`. The
    /// paper (§5.1) draws partners from the query set itself, so the experiment runner
    /// passes the bases as `partners`.
    pub fn build(bases: &Dataset, partners: &Dataset, group_size: usize, seed: u64) -> Groups {
        assert_eq!(
            bases.dim, partners.dim,
            "bases and partners differ in dimension"
        );
        assert!(
            !partners.is_empty() && group_size > 0,
            "groups need partners and a positive size"
        );
        let mut rng = StdRng::seed_from_u64(seed);
        let mut members = Vec::with_capacity(bases.n * group_size * bases.dim);
        for q in bases.rows() {
            for _ in 0..group_size {
                let p = partners.row(rng.gen_range(0..partners.n));
                let lambda = rng.gen_range(0.0..MAX_LAMBDA);
                members.extend(
                    q.iter()
                        .zip(p)
                        .map(|(&q, &p)| (1.0 - lambda) * q + lambda * p),
                );
            }
        }
        Groups {
            dim: bases.dim,
            group_size,
            members,
        }
    }

    /// Unit-normalises every member (a zero member stays zero).
    pub fn normalize_members(&mut self) {
        aker_formats::data::normalize_rows(&mut self.members, self.dim);
    }

    /// The number of groups.
    pub fn len(&self) -> usize {
        self.members.len() / (self.dim * self.group_size)
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    pub fn member(&self, group: usize, i: usize) -> &[f32] {
        let row = group * self.group_size + i;
        &self.members[row * self.dim..(row + 1) * self.dim]
    }
}

/// A request stream over distinct vectors: equal requests share one vector, so a
/// replay sends bit-identical queries for them (the exact-match path depends on it).
#[derive(Clone, Debug, PartialEq)]
pub struct Workload {
    pub dim: usize,
    /// Distinct request vectors, row-major, in order of first request.
    pub vectors: Vec<f32>,
    /// Per request, the index of its vector in `vectors`.
    pub requests: Vec<u32>,
    /// Per distinct vector, its row in [`Groups::members`] (`group * group_size + i`):
    /// how answers computed once for every member are found for this stream.
    pub members: Vec<u32>,
}

impl Workload {
    pub fn n_vectors(&self) -> usize {
        self.vectors.len() / self.dim
    }

    pub fn vector(&self, i: u32) -> &[f32] {
        let i = i as usize;
        &self.vectors[i * self.dim..(i + 1) * self.dim]
    }

    /// A search-only trace replaying this stream with `k` results per request.
    pub fn to_trace(&self, metric: Metric, k: u32) -> Trace {
        Trace::searches(self.dim, metric, k, self.vectors.clone(), &self.requests)
    }
}

/// `n_requests` simZipf requests over `groups` at Zipfian exponent `skew`.
pub fn sim_zipf(groups: &Groups, n_requests: usize, skew: f64, seed: u64) -> Workload {
    let picks = draw_requests(groups.len(), groups.group_size, n_requests, skew, seed);
    from_picks(groups, picks)
}

/// A changed workload: the first `n_requests - n_requests / 2` requests are
/// `sim_zipf(groups, .., skew, seed)`'s, the rest come from a second simZipf stream at
/// `second_skew` (its own seed, `seed + 1`). With `other_groups` the second stream's
/// group `g` is group `(g + n / 2) mod n`, so that other groups are hot after the change.
pub fn sim_zipf_phased(
    groups: &Groups,
    n_requests: usize,
    skew: f64,
    second_skew: f64,
    other_groups: bool,
    seed: u64,
) -> Workload {
    let second = n_requests / 2;
    let n = groups.len();
    let mut picks = draw_requests(n, groups.group_size, n_requests - second, skew, seed);
    let shift = if other_groups { n / 2 } else { 0 };
    picks.extend(
        draw_requests(n, groups.group_size, second, second_skew, seed + 1)
            .into_iter()
            .map(|(g, i)| ((g + shift) % n, i)),
    );
    from_picks(groups, picks)
}

/// The workload of requests `picks` (group, member), vectors in order of first request.
fn from_picks(groups: &Groups, picks: Vec<(usize, usize)>) -> Workload {
    // (group, member) -> index into `vectors`, u32::MAX while unrequested.
    let mut index = vec![u32::MAX; groups.len() * groups.group_size];
    let mut vectors = Vec::new();
    let mut members = Vec::new();
    let requests = picks
        .into_iter()
        .map(|(g, i)| {
            let row = g * groups.group_size + i;
            let slot = &mut index[row];
            if *slot == u32::MAX {
                *slot = u32::try_from(members.len()).expect("under 2^32 distinct vectors");
                members.push(u32::try_from(row).expect("under 2^32 group members"));
                vectors.extend_from_slice(groups.member(g, i));
            }
            *slot
        })
        .collect();
    Workload {
        dim: groups.dim,
        vectors,
        requests,
        members,
    }
}

/// The (group, member) of each request.
fn draw_requests(
    n_groups: usize,
    group_size: usize,
    n_requests: usize,
    skew: f64,
    seed: u64,
) -> Vec<(usize, usize)> {
    let zipf = ScrambledZipfianGenerator::new(n_groups as u64, skew);
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n_requests)
        .map(|_| {
            let group = zipf.next(&mut rng) as usize;
            (group, rng.gen_range(0..group_size))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use aker_formats::data::synthetic;
    use aker_formats::trace::Op;

    #[test]
    fn to_trace_searches_every_request() {
        let w = Workload {
            dim: 2,
            vectors: vec![0.0, 1.0, 2.0, 3.0],
            requests: vec![0, 1, 1, 0],
            members: vec![7, 3],
        };
        let t = w.to_trace(Metric::L2Sq, 5);
        assert_eq!((t.dim, t.metric, t.k), (2, Metric::L2Sq, 5));
        assert_eq!(t.n_vectors(), 2);
        assert_eq!(t.vector(1), &[2.0, 3.0]);
        assert_eq!(
            t.ops,
            [0, 1, 1, 0].map(|vector| Op::Search { vector, k: 5 })
        );
        assert_eq!(t.ground_truth, None);
        t.validate().unwrap();
    }

    fn groups(n_groups: usize, seed: u64) -> Groups {
        let collection = synthetic(2_000, 8, 6, 10);
        let bases = synthetic(n_groups, 8, 6, 11);
        Groups::build(&bases, &collection, GROUP_SIZE, seed)
    }

    #[test]
    fn members_interpolate_towards_a_partner() {
        let bases = Dataset::new(3, vec![0.0, 0.0, 0.0, 1.0, 1.0, 1.0]).unwrap();
        let partner = Dataset::new(3, vec![2.0, -4.0, 6.0]).unwrap();
        let g = Groups::build(&bases, &partner, 200, 5);
        assert_eq!((g.len(), g.group_size), (2, 200));
        let mut lambdas = Vec::new();
        for (gi, q) in bases.rows().enumerate() {
            for i in 0..200 {
                let m = g.member(gi, i);
                // m - q = λ (p - q) for a single λ across coordinates.
                let dir: Vec<f32> = partner.row(0).iter().zip(q).map(|(p, q)| p - q).collect();
                let lambda = (m[0] - q[0]) / dir[0];
                for d in 0..3 {
                    assert!((m[d] - (q[d] + lambda * dir[d])).abs() < 1e-5);
                }
                lambdas.push(lambda);
            }
        }
        assert!(lambdas.iter().all(|&l| (0.0..0.5 + 1e-6).contains(&l)));
        let mean = lambdas.iter().sum::<f32>() / lambdas.len() as f32;
        assert!((mean - 0.25).abs() < 0.03, "mean λ {mean}");
    }

    #[test]
    fn groups_are_fixed_by_their_seed() {
        let a = groups(20, 1);
        assert_eq!(a.len(), 20);
        assert_eq!(a.members.len(), 20 * GROUP_SIZE * 8);
        assert_eq!(groups(20, 1), a);
        assert_ne!(groups(20, 2), a);
    }

    #[test]
    fn workload_shares_vectors_between_equal_requests() {
        let g = groups(40, 1);
        let w = sim_zipf(&g, 5_000, 0.99, 7);
        assert_eq!(w, sim_zipf(&g, 5_000, 0.99, 7));
        assert_eq!(w.requests.len(), 5_000);
        let picks = draw_requests(g.len(), GROUP_SIZE, 5_000, 0.99, 7);
        let mut seen = std::collections::HashMap::new();
        for (&r, &(gi, i)) in w.requests.iter().zip(&picks) {
            assert_eq!(w.vector(r), g.member(gi, i));
            assert_eq!(w.members[r as usize] as usize, gi * GROUP_SIZE + i);
            // One vector per (group, member), one (group, member) per vector.
            assert_eq!(*seen.entry((gi, i)).or_insert(r), r);
        }
        assert_eq!(seen.len(), w.n_vectors());
        assert!(w.n_vectors() < 5_000, "hot members repeat");
        // A changed workload: its first half is the plain stream's, its second another's.
        let p = sim_zipf_phased(&g, 5_000, 0.99, 0.30, true, 7);
        let first = sim_zipf(&g, 2_500, 0.99, 7);
        assert_eq!(p.requests[..2_500], first.requests[..]);
        assert_eq!(p.vectors[..first.vectors.len()], first.vectors[..]);
        let later = draw_requests(g.len(), GROUP_SIZE, 2_500, 0.30, 8);
        for (&r, &(gi, i)) in p.requests[2_500..].iter().zip(&later) {
            let gi = (gi + g.len() / 2) % g.len();
            assert_eq!(p.members[r as usize] as usize, gi * GROUP_SIZE + i);
        }
        // Vectors are numbered in order of first request.
        let mut next = 0;
        for &r in &w.requests {
            assert!(r <= next);
            next = next.max(r + 1);
        }
    }

    /// Share of requests per group, sorted descending, and the count of idle groups.
    fn group_traffic(n_groups: usize, skew: f64) -> (Vec<f64>, usize) {
        let picks = draw_requests(n_groups, GROUP_SIZE, DEFAULT_REQUESTS, skew, 42);
        let mut count = vec![0usize; n_groups];
        picks.iter().for_each(|&(g, _)| count[g] += 1);
        let idle = count.iter().filter(|&&c| c == 0).count();
        let mut share: Vec<f64> = count
            .iter()
            .map(|&c| c as f64 / DEFAULT_REQUESTS as f64)
            .collect();
        share.sort_by(|a, b| b.total_cmp(a));
        (share, idle)
    }

    #[test]
    fn high_skew_concentrates_traffic_and_a_third_of_groups_stay_idle() {
        let (low, low_idle) = group_traffic(1000, 0.30);
        let (high, high_idle) = group_traffic(1000, 0.99);
        let top10 = |s: &[f64]| s[..10].iter().sum::<f64>();
        assert!(
            top10(&high) > 4.0 * top10(&low),
            "top-10 share {} vs {}",
            top10(&high),
            top10(&low)
        );
        assert!(high[0] > 0.1, "hottest group at 0.99 gets {}", high[0]);
        // 352 of 1000 groups have no rank hashing to them.
        assert!(
            (330..=380).contains(&high_idle),
            "{high_idle} idle groups at 0.99"
        );
        assert!(
            (330..=380).contains(&low_idle),
            "{low_idle} idle groups at 0.30"
        );
    }
}
