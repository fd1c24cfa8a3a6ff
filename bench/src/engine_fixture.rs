//! The engine benchmarks' synthetic inputs, shared by the criterion bench
//! (`benches/engine.rs`) and the profiling loop (`examples/engine_loop.rs`).

use rand::rngs::StdRng;
use rand::Rng;
use shards::{Cache, Candidate, Eviction, Lookup, MissTicket, StandbySearch};

/// Query vectors shaped like real embeddings: 1,000 clusters of varying spread (uniform
/// random vectors in 128+ dimensions are a known worst case for any graph index, and no
/// workload looks like them).
#[derive(Clone)]
pub struct Clusters {
    centres: Vec<Vec<f32>>,
    spreads: Vec<f32>,
}

impl Clusters {
    pub fn new(dim: usize, rng: &mut StdRng) -> Clusters {
        let centres = (0..1000)
            .map(|_| (0..dim).map(|_| rng.gen_range(-1.0f32..1.0)).collect())
            .collect();
        let spreads = (0..1000).map(|_| rng.gen_range(0.01f32..0.1)).collect();
        Clusters { centres, spreads }
    }

    pub fn sample(&self, rng: &mut StdRng) -> Vec<f32> {
        let c = rng.gen_range(0..self.centres.len());
        let s = self.spreads[c];
        self.centres[c]
            .iter()
            .map(|x| x + rng.gen_range(-s..s))
            .collect()
    }
}

/// A miss's ticket as a server's owner gets it: made by the lookup of a query never
/// seen (one that hits is drawn again), carrying what that lookup's filter search found
/// for the admission (`MissTicket::seeds`).
pub fn looked_up_ticket(
    cache: &Cache,
    clusters: &Clusters,
    rng: &mut StdRng,
    k: usize,
) -> MissTicket {
    // Fresh queries hit now and then (a cluster's entries serve near queries): bounded.
    for _ in 0..1000 {
        let q = clusters.sample(rng);
        if let Lookup::Miss(t) = cache.lookup(&q, k).expect("valid") {
            return t;
        }
    }
    panic!("1000 fresh queries in a row were hits");
}

/// A fabricated backend answer of `len` results: ids drawn from `base_id`'s own range
/// (give each query a base 1,000,000 apart), distances 1.0, 1.1, … so an entry's
/// `τ = minD / 4 = 0.25`.
pub fn answer(rng: &mut StdRng, base_id: u64, len: usize) -> Vec<Candidate> {
    (0..len)
        .map(|i| {
            Candidate::new(
                base_id + rng.gen_range(0..50_000u64) * 16 + i as u64,
                1.0 + i as f32 * 0.1,
            )
        })
        .collect()
}

/// An id that a live entry holds (the first result of one of the 64 entries the map
/// iterates first), so that deleting it does real work: the entries listing it
/// promote a reserve or are invalidated.
pub fn delete_victim(cache: &Cache, rng: &mut StdRng) -> u64 {
    cache
        .representatives()
        .nth(rng.gen_range(0..64))
        .expect("entries")
        .nrl
        .ids[0]
}

/// Which filter generation answers while there are two: akerd's default (`learned`),
/// or AKER_BENCH_STANDBY=active_first, or ALGORITHM.md's `nearest`.
pub fn standby_search() -> StandbySearch {
    match std::env::var("AKER_BENCH_STANDBY").as_deref() {
        Ok("nearest") => StandbySearch::Nearest,
        Ok("active_first") => StandbySearch::ActiveFirst,
        Ok("learned") | Err(_) => StandbySearch::Learned,
        Ok(other) => panic!("AKER_BENCH_STANDBY: nearest, active_first or learned, not {other}"),
    }
}

/// The eviction order: FIFO (the paper's, the engine's default), or
/// AKER_BENCH_EVICTION=second_chance (akerd's default: every hit sets its entry's mark).
pub fn eviction() -> Eviction {
    match std::env::var("AKER_BENCH_EVICTION").as_deref() {
        Ok("fifo") | Err(_) => Eviction::Fifo,
        Ok("second_chance") => Eviction::SecondChance,
        Ok(other) => panic!("AKER_BENCH_EVICTION: fifo or second_chance, not {other}"),
    }
}

/// The number in environment variable `name`, or `default` when it is unset or not a
/// number (the benches' and `engine_loop`'s knobs).
pub fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
