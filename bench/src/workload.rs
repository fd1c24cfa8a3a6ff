//! The simZipf workload (ALGORITHM.md, "Workload: simZipf"; paper §5.1): similar-query
//! groups built by interpolating each base query towards random partners, and a request
//! stream that picks a group by YCSB's scrambled Zipfian rank and then a member
//! uniformly.
//!
//! The Zipfian generators follow YCSB-C (`core/zipfian_generator.h`,
//! `core/scrambled_zipfian_generator.h`), the C++ port the paper cites: the Zipfian
//! draws ranks over exactly the item count (Gray et al.'s method), and the scrambled one
//! hashes each rank with FNV-64 modulo the item count. Hash collisions therefore leave
//! about a third of the groups with no rank at all, at every skew; that is expected.
//! (Java YCSB's scrambled generator differs: it draws from a fixed 10^10-item space and
//! takes `Math.abs` of the signed hash.)

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::data::Dataset;

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
}

/// `n_requests` simZipf requests over `groups` at Zipfian exponent `skew`.
pub fn sim_zipf(groups: &Groups, n_requests: usize, skew: f64, seed: u64) -> Workload {
    let picks = draw_requests(groups.len(), groups.group_size, n_requests, skew, seed);
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

/// YCSB's Zipfian rank generator over `0..items`, rank 0 the most popular.
#[derive(Clone, Debug)]
pub struct ZipfianGenerator {
    items: u64,
    theta: f64,
    alpha: f64,
    zeta_n: f64,
    eta: f64,
}

/// `sum_{i=1..n} 1 / i^theta`, summed in YCSB's order.
pub fn zeta(n: u64, theta: f64) -> f64 {
    (1..=n).map(|i| 1.0 / (i as f64).powf(theta)).sum()
}

impl ZipfianGenerator {
    /// `theta` in `[0, 1)`: 0 is uniform, 0.99 is YCSB's default skew.
    pub fn new(items: u64, theta: f64) -> ZipfianGenerator {
        assert!(items >= 2, "a Zipfian needs at least 2 items");
        assert!(
            (0.0..1.0).contains(&theta),
            "Zipfian exponent {theta} outside [0, 1)"
        );
        let zeta_n = zeta(items, theta);
        let eta = (1.0 - (2.0 / items as f64).powf(1.0 - theta)) / (1.0 - zeta(2, theta) / zeta_n);
        ZipfianGenerator {
            items,
            theta,
            alpha: 1.0 / (1.0 - theta),
            zeta_n,
            eta,
        }
    }

    pub fn next(&self, rng: &mut impl Rng) -> u64 {
        let u: f64 = rng.gen();
        let uz = u * self.zeta_n;
        if uz < 1.0 {
            return 0;
        }
        if uz < 1.0 + 0.5f64.powf(self.theta) {
            return 1;
        }
        let rank = (self.items as f64 * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as u64;
        // Rounding can reach `items` as u approaches 1; YCSB lets it through.
        rank.min(self.items - 1)
    }
}

/// YCSB's scrambled Zipfian: a Zipfian rank, hashed with FNV-64 modulo the item count,
/// so popular items are scattered over the key space instead of being the low keys.
#[derive(Clone, Debug)]
pub struct ScrambledZipfianGenerator {
    ranks: ZipfianGenerator,
}

impl ScrambledZipfianGenerator {
    pub fn new(items: u64, theta: f64) -> ScrambledZipfianGenerator {
        ScrambledZipfianGenerator {
            ranks: ZipfianGenerator::new(items, theta),
        }
    }

    pub fn next(&self, rng: &mut impl Rng) -> u64 {
        fnv_hash64(self.ranks.next(rng)) % self.ranks.items
    }
}

/// YCSB's `FNVHash64`: FNV-1a over the value's 8 little-endian bytes.
pub fn fnv_hash64(mut value: u64) -> u64 {
    const OFFSET_BASIS: u64 = 0xCBF2_9CE4_8422_2325;
    const PRIME: u64 = 1_099_511_628_211;
    let mut hash = OFFSET_BASIS;
    for _ in 0..8 {
        hash ^= value & 0xff;
        hash = hash.wrapping_mul(PRIME);
        value >>= 8;
    }
    hash
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::synthetic;

    #[test]
    fn fnv_matches_reference_values() {
        // FNV-1a over 8 bytes, computed independently.
        assert_eq!(fnv_hash64(0), 0xa8c7_f832_281a_39c5);
        assert_eq!(fnv_hash64(1), 0x89cd_3129_1d2a_efa4);
        assert_eq!(fnv_hash64(123_456_789), 0xdf60_4ac5_d726_ce19);
    }

    #[test]
    fn zeta_is_the_generalised_harmonic_number() {
        assert_eq!(zeta(1, 0.99), 1.0);
        assert!((zeta(2, 0.5) - (1.0 + 1.0 / 2f64.sqrt())).abs() < 1e-12);
        assert_eq!(zeta(1000, 0.0), 1000.0);
        let h = (1..=1000).map(|i| 1.0 / i as f64).sum::<f64>();
        assert!((zeta(1000, 1.0 - 1e-12) - h).abs() < 1e-6);
    }

    #[test]
    fn zipfian_rank_frequencies_follow_the_law() {
        let n = 1000u64;
        let draws = 400_000usize;
        for theta in SKEWS {
            let zipf = ZipfianGenerator::new(n, theta);
            let mut rng = StdRng::seed_from_u64(1);
            let mut count = vec![0usize; n as usize];
            for _ in 0..draws {
                count[zipf.next(&mut rng) as usize] += 1;
            }
            let z = zeta(n, theta);
            // Ranks 0 and 1 are exact in Gray's method; the tail is approximate.
            for (rank, tol) in [(0usize, 0.03), (1, 0.04)] {
                let want = 1.0 / ((rank + 1) as f64).powf(theta) / z;
                let got = count[rank] as f64 / draws as f64;
                assert!(
                    (got / want - 1.0).abs() < tol,
                    "theta {theta} rank {rank}: {got} vs {want}"
                );
            }
            let top: f64 = (1..=100).map(|i| 1.0 / (i as f64).powf(theta)).sum::<f64>() / z;
            let got = count[..100].iter().sum::<usize>() as f64 / draws as f64;
            assert!(
                (got - top).abs() < 0.02,
                "theta {theta} top-100 share: {got} vs {top}"
            );
        }
    }

    #[test]
    fn zipfian_zero_skew_is_uniform() {
        let zipf = ZipfianGenerator::new(10, 0.0);
        let mut rng = StdRng::seed_from_u64(2);
        let mut count = [0usize; 10];
        for _ in 0..100_000 {
            count[zipf.next(&mut rng) as usize] += 1;
        }
        assert!(
            count.iter().all(|&c| (9_000..11_000).contains(&c)),
            "{count:?}"
        );
    }

    #[test]
    fn scrambled_keys_are_the_hashed_ranks() {
        let scrambled = ScrambledZipfianGenerator::new(1000, 0.99);
        let reachable: std::collections::HashSet<u64> =
            (0..1000).map(|r| fnv_hash64(r) % 1000).collect();
        let mut rng = StdRng::seed_from_u64(3);
        let mut hottest = std::collections::HashMap::new();
        for _ in 0..50_000 {
            let key = scrambled.next(&mut rng);
            assert!(reachable.contains(&key));
            *hottest.entry(key).or_insert(0usize) += 1;
        }
        // Rank 0 is the hottest rank; the key it hashes to is the hottest key.
        let top = hottest
            .iter()
            .max_by_key(|(_, &c)| c)
            .map(|(&k, _)| k)
            .unwrap();
        assert_eq!(top, fnv_hash64(0) % 1000);
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
