//! One engine operation in a loop, for `perf`: the harness behind the README's "found
//! with perf on a loop of one operation" (criterion's runs are too short and mixed for a
//! profile). Builds the engine bench's kind of fixture (clustered vectors, fabricated
//! answers, the default graph filter), then repeats OP.
//!
//! ```text
//! cargo build --release -p bench --example engine_loop
//! OP=approximate DIM=768 perf record -D 8000 target/release/examples/engine_loop
//! ```
//! OP: exact | approximate | fresh | insert | admit | admit_after_lookup |
//! admit_without_lookup | delete; DIM (768), REPS (100000),
//! ITERS (200000), CHURN (0: admissions past REPS before the loop, for the steady state
//! of a full cache), PREFAULT (0: vectors allocated and freed before the loop, so that
//! growth in it reuses memory already faulted in), AKER_BENCH_STANDBY (learned, akerd's
//! default, active_first or nearest), TICKETS (direct, the default, or lookup: see
//! `seeded` below); for `admit_after_lookup` / `admit_without_lookup`, TICKETS_AHEAD (0:
//! each admission takes a ticket made that many earlier) and PACE_US / PACE_BATCH (0 /
//! 5: a sleep after every batch of admissions, the scaling owner's pacing).
//! `approximate` times near copies of random cached queries (misses included: it reports
//! the share that hit); `fresh` admits a new query, then looks up a near copy of it (the
//! lookups alone are timed too); `delete` refills the cache untimed and prints the mean
//! of the timed deletes alone.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bench::engine_fixture::{answer, delete_victim, env_usize as env, looked_up_ticket, Clusters};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shards::{Cache, CacheConfig, Capacity, HitKind, Lookup, Metric, PolicyConfig};

// mimalloc, keeping the memory it frees: see allocator/src/lib.rs.
#[global_allocator]
static ALLOCATOR: aker_alloc::MiMalloc = aker_alloc::MiMalloc;

const K: usize = 10;

fn main() {
    aker_alloc::keep_freed_memory();
    let (dim, n, iters) = (env("DIM", 768), env("REPS", 100_000), env("ITERS", 200_000));
    let op = std::env::var("OP").unwrap_or_else(|_| "approximate".into());
    let cfg = CacheConfig {
        delta: 2,
        k_max: 100,
        store_vectors: false,
        capacity: Capacity::Objects(n * (K + 2)),
        standby_search: bench::engine_fixture::standby_search(),
        ..CacheConfig::new(dim, Metric::L2Sq)
    };
    let mut cache = Cache::new(cfg, PolicyConfig::default().build()).expect("config");
    let mut rng = StdRng::seed_from_u64(dim as u64);
    let clusters = Clusters::new(dim, &mut rng);
    let mut next_id = 0u64;
    // TICKETS=lookup: the fixture's and `admit`'s tickets come from lookups (which
    // leave the admission its filter seeds; queries that hit are drawn again), as in a
    // server; by default they are made without one, every drawn query admitted.
    let seeded = std::env::var("TICKETS").is_ok_and(|t| t == "lookup");
    let mut admit = |cache: &mut Cache, rng: &mut StdRng| -> Vec<f32> {
        let t = if seeded {
            looked_up_ticket(cache, &clusters, rng, K)
        } else {
            let q = clusters.sample(rng);
            cache.miss_ticket(&q, K, false).expect("valid")
        };
        let q = t.query.to_vec();
        next_id += 1_000_000;
        cache.admit(t, answer(rng, next_id, K + 2)).expect("valid");
        q
    };
    let t = Instant::now();
    let queries: Vec<Vec<f32>> = (0..n).map(|_| admit(&mut cache, &mut rng)).collect();
    // CHURN more admissions evict the oldest and rotate the filter (the steady state of a
    // full cache: two generations); the looped queries are then the newest n.
    let churn = env("CHURN", 0);
    let mut queries = queries;
    for i in 0..churn {
        queries[i % n] = admit(&mut cache, &mut rng);
    }
    eprintln!(
        "filter after {churn} more admissions: {:?}",
        cache.stats().filter
    );
    eprintln!(
        "fixture: {n} reps at d {dim}, {:.1} µs per admission",
        t.elapsed().as_secs_f64() * 1e6 / n as f64
    );
    // PREFAULT=n: n vectors' worth of memory allocated and freed first
    // (`aker_alloc::prefault`).
    let prefault = env("PREFAULT", 0);
    if prefault > 0 {
        let took = aker_alloc::prefault(prefault * dim * 4);
        eprintln!(
            "prefault: {prefault} vectors in {:.0} ms",
            took.as_secs_f64() * 1e3
        );
    }
    let near = |q: &[f32]| -> Vec<f32> { q.iter().map(|x| x + 1e-6).collect() };
    let (mut hits, mut timed, mut timed_n) = (0usize, Duration::ZERO, 0usize);
    let mut inserted = 1u64 << 60;
    // TICKETS_AHEAD=n: admissions take tickets made n lookups earlier (a server's owner
    // admits a miss a backend call after its lookup, caches cold), not the one just made.
    let tickets_ahead = env("TICKETS_AHEAD", 0);
    let mut ahead = std::collections::VecDeque::new();
    let (pace_us, pace_batch) = (env("PACE_US", 0), env("PACE_BATCH", 5));
    let t = Instant::now();
    for i in 0..iters {
        match op.as_str() {
            "exact" => {
                black_box(cache.lookup(&queries[i % n], K).expect("valid"));
            }
            "approximate" => {
                let q = near(&queries[rng.gen_range(0..n)]);
                let got = cache.lookup(&q, K).expect("valid");
                hits +=
                    matches!(got, Lookup::Hit(ref h) if h.kind == HitKind::Approximate) as usize;
            }
            "fresh" => {
                // Approximate hits on just-admitted entries (the bench's fresh row): the
                // admission is untimed, the lookup of a near copy timed.
                let q = near(&admit(&mut cache, &mut rng));
                let t = Instant::now();
                let got = cache.lookup(&q, K).expect("valid");
                timed += t.elapsed();
                hits +=
                    matches!(got, Lookup::Hit(ref h) if h.kind == HitKind::Approximate) as usize;
            }
            "insert" => {
                inserted += 1;
                let v: Arc<[f32]> = Arc::from(near(&queries[i % n]));
                black_box(cache.insert_logged(inserted, v, true).expect("valid"));
            }
            "admit" => {
                black_box(admit(&mut cache, &mut rng));
            }
            "admit_after_lookup" | "admit_without_lookup" => {
                // The admission alone timed, its ticket made untimed: by a lookup (its
                // filter search leaves the insertion its seeds) or without one.
                let make = |cache: &Cache, rng: &mut StdRng| {
                    if op == "admit_after_lookup" {
                        looked_up_ticket(cache, &clusters, rng, K)
                    } else {
                        let q = clusters.sample(rng);
                        cache.miss_ticket(&q, K, false).expect("valid")
                    }
                };
                while ahead.len() <= tickets_ahead {
                    ahead.push_back(make(&cache, &mut rng));
                }
                let ticket = ahead.pop_front().expect("filled");
                hits += !ticket.seeds.is_empty() as usize;
                inserted += 1_000_000;
                let a = answer(&mut rng, inserted, K + 2);
                let t = Instant::now();
                black_box(cache.admit(ticket, a).expect("valid"));
                timed += t.elapsed();
                timed_n += 1;
                // PACE_US=p: a sleep of p µs after every PACE_BATCH admissions (5), the
                // scaling test's owner's pacing (its caches go cold in between).
                if pace_us > 0 && timed_n % pace_batch == 0 {
                    std::thread::sleep(Duration::from_micros(pace_us as u64));
                }
            }
            "delete" => {
                while cache.len() < n / 2 {
                    admit(&mut cache, &mut rng);
                }
                let victim = delete_victim(&cache, &mut rng);
                let t = Instant::now();
                black_box(cache.delete(victim));
                timed += t.elapsed();
            }
            other => panic!(
                "OP {other}: exact | approximate | fresh | insert | admit | \
                 admit_after_lookup | admit_without_lookup | delete"
            ),
        }
    }
    let per_op_us = t.elapsed().as_secs_f64() * 1e6 / iters as f64;
    eprintln!("{op}: {per_op_us:.2} µs per op over {iters}");
    if op == "fresh" {
        eprintln!(
            "  timed lookups alone: {:.2} µs each",
            timed.as_secs_f64() * 1e6 / iters as f64
        );
    }
    if op == "approximate" || op == "fresh" {
        eprintln!(
            "  approximate hits: {:.1}%",
            hits as f64 / iters as f64 * 100.0
        );
    }
    if op.starts_with("admit_") {
        eprintln!(
            "  timed admissions alone: {:.2} µs each over {timed_n}, {:.1}% of them seeded",
            timed.as_secs_f64() * 1e6 / timed_n.max(1) as f64,
            hits as f64 / timed_n.max(1) as f64 * 100.0
        );
    }
    if op == "delete" {
        eprintln!(
            "  timed deletes alone: {:.2} µs each; filter {:?}",
            timed.as_secs_f64() * 1e6 / iters as f64,
            cache.stats().filter
        );
    }
}
