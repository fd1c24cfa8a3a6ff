//! YCSB's Zipfian rank generators, as in YCSB-C (`core/zipfian_generator.h`,
//! `core/scrambled_zipfian_generator.h`), the C++ port the paper cites: the Zipfian
//! draws ranks over exactly the item count (Gray et al.'s method), and the scrambled one
//! hashes each rank with FNV-64 modulo the item count. Hash collisions therefore leave
//! about a third of the items with no rank at all, at every skew; that is expected.
//! (Java YCSB's scrambled generator differs: it draws from a fixed 10^10-item space and
//! takes `Math.abs` of the signed hash.)

use rand::Rng;

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
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    /// The skews the paper evaluates.
    const SKEWS: [f64; 3] = [0.30, 0.60, 0.99];

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
}
