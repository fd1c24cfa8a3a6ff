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
use shards::{Cache, CacheConfig, Capacity, HitKind, Lookup, Metric, MissTicket, PolicyConfig};

// mimalloc, keeping the memory it frees: see allocator/src/lib.rs.
#[global_allocator]
static ALLOCATOR: aker_alloc::MiMalloc = aker_alloc::MiMalloc;

const K: usize = 10;

fn main() {
    aker_alloc::keep_freed_memory();
    let (dim, n, iters) = (env("DIM", 768), env("REPS", 100_000), env("ITERS", 200_000));
    let op = std::env::var("OP").unwrap_or_else(|_| "approximate".into());
    let mut e = Engine::new(dim, n);
    let t = Instant::now();
    let queries = e.fixture(n, env("CHURN", 0));
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
    let mut ops = Ops {
        op: op.clone(),
        queries,
        inserted: 1u64 << 60,
        // TICKETS_AHEAD=n: admissions take tickets made n lookups earlier (a server's
        // owner admits a miss a backend call after its lookup, caches cold), not the one
        // just made.
        tickets_ahead: env("TICKETS_AHEAD", 0),
        ahead: std::collections::VecDeque::new(),
        pace_us: env("PACE_US", 0),
        pace_batch: env("PACE_BATCH", 5),
        tally: Tally::default(),
    };
    let t = Instant::now();
    for i in 0..iters {
        ops.step(&mut e, i);
    }
    report(&op, iters, t.elapsed(), &ops.tally, &e.cache);
}

/// The cache and what admits into it.
struct Engine {
    cache: Cache,
    rng: StdRng,
    clusters: Clusters,
    next_id: u64,
    /// TICKETS=lookup: the fixture's and `admit`'s tickets come from lookups (which
    /// leave the admission its filter seeds; queries that hit are drawn again), as in a
    /// server; by default they are made without one, every drawn query admitted.
    seeded: bool,
}

impl Engine {
    fn new(dim: usize, n: usize) -> Engine {
        let cfg = CacheConfig {
            delta: 2,
            k_max: 100,
            store_vectors: false,
            capacity: Capacity::Objects(n * (K + 2)),
            standby_search: bench::engine_fixture::standby_search(),
            ..CacheConfig::new(dim, Metric::L2Sq)
        };
        let cache = Cache::new(cfg, PolicyConfig::default().build()).expect("config");
        let mut rng = StdRng::seed_from_u64(dim as u64);
        let clusters = Clusters::new(dim, &mut rng);
        Engine {
            cache,
            rng,
            clusters,
            next_id: 0,
            seeded: std::env::var("TICKETS").is_ok_and(|t| t == "lookup"),
        }
    }

    /// Admits a query never seen; returns it.
    fn admit(&mut self) -> Vec<f32> {
        let t = if self.seeded {
            looked_up_ticket(&self.cache, &self.clusters, &mut self.rng, K)
        } else {
            let q = self.clusters.sample(&mut self.rng);
            self.cache.miss_ticket(&q, K, false).expect("valid")
        };
        let q = t.query.to_vec();
        self.next_id += 1_000_000;
        let a = answer(&mut self.rng, self.next_id, K + 2);
        self.cache.admit(t, a).expect("valid");
        q
    }

    /// `n` admitted queries; `churn` more admissions evict the oldest and rotate the
    /// filter (the steady state of a full cache: two generations), the looped queries
    /// then being the newest n.
    fn fixture(&mut self, n: usize, churn: usize) -> Vec<Vec<f32>> {
        let mut queries: Vec<Vec<f32>> = (0..n).map(|_| self.admit()).collect();
        for i in 0..churn {
            queries[i % n] = self.admit();
        }
        eprintln!(
            "filter after {churn} more admissions: {:?}",
            self.cache.stats().filter
        );
        queries
    }
}

/// What the loop counted: hits (or seeded tickets) and the time of the timed part.
#[derive(Default)]
struct Tally {
    hits: usize,
    timed: Duration,
    timed_n: usize,
}

/// The loop's operation and its state.
struct Ops {
    op: String,
    queries: Vec<Vec<f32>>,
    inserted: u64,
    tickets_ahead: usize,
    ahead: std::collections::VecDeque<MissTicket>,
    pace_us: usize,
    pace_batch: usize,
    tally: Tally,
}

fn near(q: &[f32]) -> Vec<f32> {
    q.iter().map(|x| x + 1e-6).collect()
}

impl Ops {
    fn step(&mut self, e: &mut Engine, i: usize) {
        let n = self.queries.len();
        let t = &mut self.tally;
        let approximate =
            |got: &Lookup| matches!(got, Lookup::Hit(h) if h.kind == HitKind::Approximate);
        match self.op.as_str() {
            "exact" => {
                black_box(e.cache.lookup(&self.queries[i % n], K).expect("valid"));
            }
            "approximate" => {
                let q = near(&self.queries[e.rng.gen_range(0..n)]);
                let got = e.cache.lookup(&q, K).expect("valid");
                t.hits += approximate(&got) as usize;
            }
            "fresh" => {
                // Approximate hits on just-admitted entries (the bench's fresh row): the
                // admission is untimed, the lookup of a near copy timed.
                let q = near(&e.admit());
                let started = Instant::now();
                let got = e.cache.lookup(&q, K).expect("valid");
                t.timed += started.elapsed();
                t.hits += approximate(&got) as usize;
            }
            "insert" => {
                self.inserted += 1;
                let v: Arc<[f32]> = Arc::from(near(&self.queries[i % n]));
                black_box(
                    e.cache
                        .insert_logged(self.inserted, v, true)
                        .expect("valid"),
                );
            }
            "admit" => {
                black_box(e.admit());
            }
            "admit_after_lookup" | "admit_without_lookup" => self.timed_admission(e),
            "delete" => {
                while e.cache.len() < n / 2 {
                    e.admit();
                }
                let victim = delete_victim(&e.cache, &mut e.rng);
                let started = Instant::now();
                black_box(e.cache.delete(victim));
                t.timed += started.elapsed();
            }
            other => panic!(
                "OP {other}: exact | approximate | fresh | insert | admit | \
                 admit_after_lookup | admit_without_lookup | delete"
            ),
        }
    }

    /// The admission alone timed, its ticket made untimed: by a lookup (its filter
    /// search leaves the insertion its seeds) or without one.
    fn timed_admission(&mut self, e: &mut Engine) {
        let after_lookup = self.op == "admit_after_lookup";
        while self.ahead.len() <= self.tickets_ahead {
            let ticket = if after_lookup {
                looked_up_ticket(&e.cache, &e.clusters, &mut e.rng, K)
            } else {
                let q = e.clusters.sample(&mut e.rng);
                e.cache.miss_ticket(&q, K, false).expect("valid")
            };
            self.ahead.push_back(ticket);
        }
        let ticket = self.ahead.pop_front().expect("filled");
        let t = &mut self.tally;
        t.hits += !ticket.seeds.is_empty() as usize;
        self.inserted += 1_000_000;
        let a = answer(&mut e.rng, self.inserted, K + 2);
        let started = Instant::now();
        black_box(e.cache.admit(ticket, a).expect("valid"));
        t.timed += started.elapsed();
        t.timed_n += 1;
        // PACE_US=p: a sleep of p µs after every PACE_BATCH admissions (5), the scaling
        // test's owner's pacing (its caches go cold in between).
        if self.pace_us > 0 && t.timed_n % self.pace_batch == 0 {
            std::thread::sleep(Duration::from_micros(self.pace_us as u64));
        }
    }
}

fn report(op: &str, iters: usize, took: Duration, t: &Tally, cache: &Cache) {
    let per_op_us = took.as_secs_f64() * 1e6 / iters as f64;
    eprintln!("{op}: {per_op_us:.2} µs per op over {iters}");
    if op == "fresh" {
        eprintln!(
            "  timed lookups alone: {:.2} µs each",
            t.timed.as_secs_f64() * 1e6 / iters as f64
        );
    }
    if op == "approximate" || op == "fresh" {
        eprintln!(
            "  approximate hits: {:.1}%",
            t.hits as f64 / iters as f64 * 100.0
        );
    }
    if op.starts_with("admit_") {
        eprintln!(
            "  timed admissions alone: {:.2} µs each over {}, {:.1}% of them seeded",
            t.timed.as_secs_f64() * 1e6 / t.timed_n.max(1) as f64,
            t.timed_n,
            t.hits as f64 / t.timed_n.max(1) as f64 * 100.0
        );
    }
    if op == "delete" {
        eprintln!(
            "  timed deletes alone: {:.2} µs each; filter {:?}",
            t.timed.as_secs_f64() * 1e6 / iters as f64,
            cache.stats().filter
        );
    }
}
