//! Engine micro-benchmarks (issue: engine part 2, "Speed").
//!
//! 100,000 representatives at d = 128 and d = 768 (HNSW filter, k = 10, Δ = 2), one
//! core: exact hit, approximate hit, miss admission (at capacity, so it evicts; its
//! ticket made by the lookup that missed, untimed, as a server's reader makes it, and
//! again without a lookup), insert (near a live entry, and near entries evicted long
//! ago), delete. Then the tail: p50 / p99 / p99.9 of each operation from an
//! HdrHistogram, and the read scaling of exact and approximate hits with 1 and 2 reader
//! threads while the owner admits in the background.
//!
//! Last, the query filter alone: the engine's graph against hnsw_rs with the same
//! parameters, on the same vectors in the same run (why the filter is not hnsw_rs).
//!
//! `cargo bench -p bench --bench engine` (AKER_BENCH_REPS overrides 100,000;
//! AKER_BENCH_FILTER=hnsw_rs runs the whole cache on the hnsw_rs filter instead;
//! AKER_BENCH_GROUPS=filter (or engine) runs one part only, or a comma-separated list of
//! the engine's parts: scaling, tails, timed (the criterion rows); AKER_BENCH_DIMS=768 one
//! dimension; AKER_BENCH_PREFAULT_MB memory faulted in before anything is timed, 2048 by
//! default, 0 to time first-touch faults too; AKER_BENCH_STANDBY the filter's standby
//! search; AKER_BENCH_EVICTION=second_chance akerd's eviction (the two_gen group only:
//! one_gen's approximate-hit inputs assume FIFO took the entries drawn before); AKER_BENCH_OWNER_RATE and AKER_BENCH_OWNER_US the scaling owner's admissions
//! a second and how often it wakes; AKER_BENCH_SCALING_STOP=all has every scaling reader
//! do its whole share, instead of all stopping when the first is done).

// mimalloc, keeping the memory it frees: see allocator/src/lib.rs.
#[global_allocator]
static ALLOCATOR: aker_alloc::MiMalloc = aker_alloc::MiMalloc;

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use bench::engine_fixture::{self, looked_up_ticket, Clusters};
use criterion::{criterion_group, BenchmarkId, Criterion};
use hdrhistogram::Histogram;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shards::filter::{FilterQuery, FilterStats};
use shards::{
    Cache, CacheConfig, CacheReader, Candidate, Capacity, FilterKind, HitKind, Lookup, Metric,
    MissTicket, PolicyConfig,
};

const K: usize = 10;
const DELTA: usize = 2;
const DIMS: [usize; 2] = [128, 768];

/// The dimensions to run: `DIMS`, or AKER_BENCH_DIMS (comma-separated).
fn dims() -> Vec<usize> {
    std::env::var("AKER_BENCH_DIMS").map_or(DIMS.to_vec(), |d| {
        d.split(',')
            .map(|x| {
                x.trim()
                    .parse()
                    .expect("AKER_BENCH_DIMS: comma-separated numbers")
            })
            .collect()
    })
}

/// The cache's filter: the default graph, or hnsw_rs with the same parameters.
fn filter_kind() -> FilterKind {
    match std::env::var("AKER_BENCH_FILTER").as_deref() {
        Ok("hnsw_rs") => {
            let (m, ef_construction, ef_search) = FilterKind::PAPER;
            FilterKind::HnswRs {
                m,
                ef_construction,
                ef_search,
            }
        }
        _ => FilterKind::default(),
    }
}

/// Admissions a second the scaling test's owner makes in the background,
/// AKER_BENCH_OWNER_RATE, 5,000 by default.
fn owner_rate() -> usize {
    engine_fixture::env_usize("AKER_BENCH_OWNER_RATE", 5_000).max(1)
}

/// How often the scaling test's owner wakes up, AKER_BENCH_OWNER_US, every 1,000 µs by
/// default: at each wake-up it admits the misses that arrived since the last one (5 at
/// the default rate), as akerd's owner, a task on a core that is busy serving lookups,
/// drains its queue whenever that core's executor runs it (`service/owner.rs`). 200
/// wakes it once per admission instead, as an idle server would: each sleep and
/// wake-up of a thread costs ~16 µs of CPU on these VMs, as much as the admission.
fn owner_wake_us() -> u64 {
    engine_fixture::env_usize("AKER_BENCH_OWNER_US", 1_000).max(1) as u64
}

fn reps() -> usize {
    engine_fixture::env_usize("AKER_BENCH_REPS", 100_000)
}

/// Whether a scaling run's readers all stop once the first has done its share
/// (AKER_BENCH_SCALING_STOP=first, the default) or each does all of its share (`all`).
/// With `all`, the run's time ran to the last reader's end: the owner preempts one
/// reader more than the other, so the other finished first and its core then had only
/// the owner to run, idle time counted against two readers' throughput. `first`
/// counts the lookups done while every reader was running, as a throughput test on a
/// fixed duration does.
fn scaling_stop_at_first() -> bool {
    !matches!(
        std::env::var("AKER_BENCH_SCALING_STOP").as_deref(),
        Ok("all")
    )
}

/// A cache holding `n` representatives with fabricated answers
/// (`engine_fixture::answer`: `τ = minD / 4 = 0.25`).
struct Fixture {
    cache: Cache,
    clusters: Clusters,
    queries: Vec<Vec<f32>>,
    rng: StdRng,
    dim: usize,
    next_id: u64,
}

fn answer(rng: &mut StdRng, base_id: u64) -> Vec<Candidate> {
    engine_fixture::answer(rng, base_id, K + DELTA)
}

impl Fixture {
    fn new(dim: usize, n: usize) -> Fixture {
        let cfg = CacheConfig {
            delta: DELTA,
            k_max: 100,
            store_vectors: false,
            capacity: Capacity::Objects(n * (K + DELTA)),
            filter: filter_kind(),
            standby_search: engine_fixture::standby_search(),
            eviction: engine_fixture::eviction(),
            // The insert groups log up to ~1.3 million vectors in one filter state (d =
            // 128; ~300,000 at d = 768) that the slow path does not keep up with: the
            // default caps (2^20 records; 1 GiB, 342,000 records at d = 768) would
            // invalidate the whole fixture mid-group.
            insert_log_cap: 1 << 22,
            insert_log_bytes: 4 << 30,
            ..CacheConfig::new(dim, Metric::L2Sq)
        };
        let started = Instant::now();
        let mut cache = Cache::new(cfg, PolicyConfig::default().build()).unwrap();
        let mut rng = StdRng::seed_from_u64(dim as u64);
        let clusters = Clusters::new(dim, &mut rng);
        let mut queries = Vec::with_capacity(n);
        for i in 0..n {
            let q = clusters.sample(&mut rng);
            let ticket = cache.miss_ticket(&q, K, false).unwrap();
            cache
                .admit(ticket, answer(&mut rng, i as u64 * 1_000_000))
                .unwrap();
            queries.push(q);
        }
        assert_eq!(cache.len(), n);
        println!(
            "d{dim}: fixture of {n} entries built in {:.1} s",
            started.elapsed().as_secs_f64()
        );
        Fixture {
            cache,
            clusters,
            queries,
            rng,
            dim,
            next_id: 1 << 40,
        }
    }

    /// A near copy of a fixture query: per component +1e-6, squared distance ~d·1e-12,
    /// within `τ` of its representative for the first dozen approximate hits on it
    /// (each quarters `τ`: α_T = 0.25), if the filter finds it.
    fn near_query(&mut self) -> Vec<f32> {
        let i = self.rng.gen_range(0..self.queries.len());
        let noise = 1e-6;
        self.queries[i].iter().map(|x| x + noise).collect()
    }

    fn fresh_query(&mut self) -> Vec<f32> {
        self.clusters.sample(&mut self.rng)
    }

    /// `engine_fixture::looked_up_ticket` on the fixture.
    fn looked_up_ticket(&mut self) -> MissTicket {
        looked_up_ticket(&self.cache, &self.clusters, &mut self.rng, K)
    }

    /// Admits a query never seen (with a FIFO eviction once full).
    fn admit_fresh(&mut self) {
        let q = self.fresh_query();
        let base = self.next_id;
        self.next_id += 1_000_000;
        let t = self.cache.miss_ticket(&q, K, false).unwrap();
        self.cache.admit(t, answer(&mut self.rng, base)).unwrap();
    }
}

/// Whether the part `name` runs (AKER_BENCH_GROUPS, comma-separated; default all).
fn group_enabled(name: &str) -> bool {
    std::env::var("AKER_BENCH_GROUPS").map_or(true, |g| g.split(',').any(|x| x.trim() == name))
}

/// Whether the engine part `name` (scaling, tails or timed) runs: all three with
/// AKER_BENCH_GROUPS=engine (or unset), else those it lists.
fn engine_part_enabled(name: &str) -> bool {
    group_enabled("engine") || group_enabled(name)
}

fn single_core(c: &mut Criterion) {
    if !["scaling", "tails", "timed"]
        .iter()
        .any(|p| engine_part_enabled(p))
    {
        return;
    }
    let n = reps();
    println!(
        "cache filter: {}, standby search {:?}, eviction {:?}",
        filter_kind(),
        engine_fixture::standby_search(),
        engine_fixture::eviction()
    );
    for dim in dims() {
        let f = Fixture::new(dim, n);
        // Read-mostly measurements first, while every fixture query is still cached
        // (the criterion groups below admit, evict and invalidate).
        // A scaling round admits ~30,000 entries (its pools and the background owner):
        // a smaller cache rotates its filter within every round.
        let mut f = if !engine_part_enabled("scaling") {
            f
        } else if n >= FULL_REPS_MIN {
            scaling(f)
        } else {
            println!("scaling d{dim}: skipped, it needs AKER_BENCH_REPS >= {FULL_REPS_MIN}");
            f
        };
        if engine_part_enabled("tails") {
            tails(&mut f);
        }
        if !engine_part_enabled("timed") {
            continue;
        }
        // The filter's two FIFO states (`shards::filter` module docs), costlier first.
        two_generations(&mut f);
        timed(c, &mut f, "two_gen", two_generations);
        // The insert rows leave every entry ~1 million records behind the insert log,
        // more than any owner checks: the second state starts from a fresh fixture.
        let mut f = Fixture::new(dim, n);
        timed(c, &mut f, "one_gen", one_generation);
    }
}

/// The criterion measurements in one filter state (`label`), into which `prepare` brings
/// the fixture before each group that admits (admissions move FIFO's state along).
fn timed(c: &mut Criterion, f: &mut Fixture, label: &str, prepare: fn(&mut Fixture)) {
    let (n, dim) = (reps(), f.dim);
    let mut g = c.benchmark_group(format!("engine/d{dim}/{n}reps/{label}"));
    g.sample_size(30)
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));
    // Inputs are made before timing: setup closures cannot borrow the cache.
    // Still cached after the tails' admissions and deletes (checked untimed); exact
    // only: approximate hits are sometimes sampled for verification.
    // Drawn from the live representatives' own queries: after the scaling and tail
    // runs' admissions the first fixture queries are long evicted.
    let live: Vec<Arc<[f32]>> = f.cache.representatives().map(|r| r.query.clone()).collect();
    let (exact, _) = inputs_hitting(f, HitKind::Exact, |f| {
        live[f.rng.gen_range(0..live.len())].to_vec()
    });
    let near: Vec<Vec<f32>> = (0..4096).map(|_| f.near_query()).collect();
    let mut t = Timed {
        dim,
        label,
        near,
        i: 0,
        rng: StdRng::seed_from_u64(5),
        next_id: 1u64 << 40,
    };
    // Exact hits first: the approximate-hit inputs are made by admitting fresh
    // queries, whose evictions would take exact inputs away.
    t.exact_hit(&mut g, f, &exact);
    prepare(f);
    t.approximate_hits(&mut g, f, n);
    prepare(f);
    t.admissions(&mut g, f);
    prepare(f);
    t.exact_hit_behind(&mut g, f);
    println!(
        "d{dim} {label}: filter before the inserts: {:?}",
        f.cache.stats().filter
    );
    t.inserts(&mut g, f);
    t.slow_path_step(&mut g, f);
    t.delete(&mut g, f, n);
    g.finish();
    let stats = f.cache.stats();
    println!(
        "d{dim} {label}: filter at the end: {:?}; insert log {} records, {} entries \
         invalidated by its cap",
        stats.filter, stats.insert_log_len, stats.log_cap_invalidations
    );
}

type Group<'a> = criterion::BenchmarkGroup<'a, criterion::measurement::WallTime>;

/// What the rows of one `timed` group share: the near queries (exact hits and untaken
/// inserts cycle through them with `i`), and the admissions' and deletes' generator.
struct Timed<'a> {
    dim: usize,
    label: &'a str,
    near: Vec<Vec<f32>>,
    i: usize,
    rng: StdRng,
    next_id: u64,
}

impl Timed<'_> {
    fn exact_hit(&mut self, g: &mut Group<'_>, f: &mut Fixture, exact: &[Vec<f32>]) {
        self.exact_hit_named(g, f, exact, "exact_hit");
    }

    fn exact_hit_named(
        &mut self,
        g: &mut Group<'_>,
        f: &mut Fixture,
        exact: &[Vec<f32>],
        name: &str,
    ) {
        let (cache, i) = (&mut f.cache, &mut self.i);
        g.bench_function(BenchmarkId::new(name, self.dim), |b| {
            b.iter(|| {
                *i = (*i + 1) % exact.len();
                assert!(matches!(
                    cache.lookup(black_box(&exact[*i]), K).unwrap(),
                    Lookup::Hit(ref h) if h.kind == HitKind::Exact
                ))
            })
        });
    }

    /// Exact hits on entries 64 inserts behind the log, none of them checked by the slow
    /// path: a hit then checks the 64 itself (issue #41). The inserts are near copies
    /// of live entries, logged without the fast path.
    fn exact_hit_behind(&mut self, g: &mut Group<'_>, f: &mut Fixture) {
        let live: Vec<Arc<[f32]>> = f.cache.representatives().map(|r| r.query.clone()).collect();
        for _ in 0..64 {
            self.next_id += 1;
            let q = &live[self.rng.gen_range(0..live.len())];
            let v: Arc<[f32]> = q.iter().map(|x| x + 1e-6).collect();
            f.cache.insert_logged(self.next_id, v, false).unwrap();
        }
        let (exact, _) = inputs_hitting(f, HitKind::Exact, |f| {
            live[f.rng.gen_range(0..live.len())].to_vec()
        });
        self.exact_hit_named(g, f, &exact, "exact_hit_64_behind");
    }

    /// Approximate hits on entries of every age (with two generations, three quarters
    /// of them in the standby): checked untimed, then another near copy timed
    /// (`aged_approximate_hits`); then on freshly admitted entries, each input timed once
    /// (`fresh_approximate_hits`). Nothing here admits, so the state holds.
    fn approximate_hits(&mut self, g: &mut Group<'_>, f: &mut Fixture, n: usize) {
        let (dim, label) = (self.dim, self.label);
        // A criterion run draws ~100,000 entries; each may be drawn AGED_USES_MAX times.
        if n >= FULL_REPS_MIN {
            let live: Vec<Arc<[f32]>> =
                f.cache.representatives().map(|r| r.query.clone()).collect();
            let mut uses = vec![0u8; live.len()];
            let (mut aged_checked, mut aged_not_approximate) = ((0usize, 0usize), 0usize);
            g.bench_function(BenchmarkId::new("approximate_hit_aged", dim), |b| {
                b.iter_custom(|iters| {
                    time_approximate_hits(
                        f,
                        iters,
                        |f| aged_approximate_hits(f, &live, &mut uses, 1024),
                        &mut aged_checked,
                        &mut aged_not_approximate,
                    )
                })
            });
            println!(
                "d{dim} {label}: near copies of {} of {} live entries drawn were approximate \
                 hits; {aged_not_approximate} timed lookups were not",
                aged_checked.0, aged_checked.1
            );
        } else {
            println!(
                "d{dim} {label}: approximate_hit_aged skipped, it needs \
                 AKER_BENCH_REPS >= {FULL_REPS_MIN}"
            );
        }
        let mut timed_not_approximate = 0usize;
        let mut checked = (0usize, 0usize);
        g.bench_function(BenchmarkId::new("approximate_hit", dim), |b| {
            b.iter_custom(|iters| {
                time_approximate_hits(
                    f,
                    iters,
                    |f| {
                        fresh_approximate_hits(
                            &mut f.cache,
                            &f.clusters,
                            &mut f.rng,
                            &mut f.next_id,
                            1024,
                            8,
                        )
                    },
                    &mut checked,
                    &mut timed_not_approximate,
                )
            })
        });
        println!(
            "d{dim}: near copies of {} of {} freshly admitted queries were approximate hits; \
             {timed_not_approximate} timed lookups were not; filter after: {:?}",
            checked.0,
            checked.1,
            f.cache.stats().filter
        );
    }

    /// The owner's part of a miss: with the ticket of the lookup that missed, and
    /// without one (the admission then searches the filter itself).
    fn admissions(&mut self, g: &mut Group<'_>, f: &mut Fixture) {
        let dim = self.dim;
        let (rng, next_id) = (&mut self.rng, &mut self.next_id);
        // Disjoint borrows: the setup draws from the clusters while the routine admits.
        let Fixture {
            cache, clusters, ..
        } = &mut *f;
        // The ticket comes from the lookup that missed (untimed: a reader's work), a
        // query never seen, admitted with a FIFO eviction.
        g.bench_function(BenchmarkId::new("miss_admission", dim), |b| {
            b.iter_custom(|iters| {
                let mut took = Duration::ZERO;
                for _ in 0..iters {
                    let t = looked_up_ticket(cache, clusters, rng, K);
                    *next_id += 1_000_000;
                    let a = answer(rng, *next_id);
                    let started = Instant::now();
                    black_box(cache.admit(t, a).unwrap());
                    took += started.elapsed();
                }
                took
            })
        });
        // The same without a lookup (REFRESH, or a caller's own ticket): the ticket is
        // made in the timed part, as before.
        g.bench_function(BenchmarkId::new("miss_admission_no_lookup", dim), |b| {
            b.iter_batched(
                || {
                    let q = clusters.sample(rng);
                    *next_id += 1_000_000;
                    (q, answer(rng, *next_id))
                },
                |(q, a)| {
                    let t = cache.miss_ticket(&q, K, false).unwrap();
                    black_box(cache.admit(t, a).unwrap())
                },
                criterion::BatchSize::SmallInput,
            )
        });
    }

    /// The insert itself (log append, fast path); the slow-path steps that the risk then
    /// asks for are measured on their own. Two kinds of vector: near copies of live
    /// entries drawn at random (each entry drawn a few times at most, so its maxD stays
    /// above them), which their entry takes if the filter finds it; and near copies of
    /// the fixture's first queries, evicted long ago, which mostly no entry takes (the
    /// filter is searched for one to the end). Counted: how many an entry took.
    fn inserts(&mut self, g: &mut Group<'_>, f: &mut Fixture) {
        let (dim, label) = (self.dim, self.label);
        let cache = &mut f.cache;
        let live: Vec<Arc<[f32]>> = cache.representatives().map(|r| r.query.clone()).collect();
        let mut pick = StdRng::seed_from_u64(9);
        for (name, near_live) in [("insert_fast_path", true), ("insert_untaken", false)] {
            let (mut inserts, mut taken) = (0u64, 0u64);
            let (near, i, next_id) = (&self.near, &mut self.i, &mut self.next_id);
            g.bench_function(BenchmarkId::new(name, dim), |b| {
                b.iter_batched(
                    || {
                        *next_id += 1;
                        let v: Arc<[f32]> = if near_live {
                            let q = &live[pick.gen_range(0..live.len())];
                            q.iter().map(|x| x + 1e-6).collect()
                        } else {
                            *i = (*i + 1) % near.len();
                            Arc::from(near[*i].as_slice())
                        };
                        (*next_id, v)
                    },
                    |(id, v)| {
                        let out = black_box(cache.insert_logged(id, v, true).unwrap());
                        (inserts, taken) = (inserts + 1, taken + out.fast_path as u64);
                    },
                    criterion::BatchSize::SmallInput,
                )
            });
            println!("d{dim} {label}: {name}: {taken} of {inserts} inserts taken by an entry");
        }
    }

    /// A step that finds no entry with records to scan does nothing: counted, so that
    /// this row cannot quietly time nothing.
    fn slow_path_step(&mut self, g: &mut Group<'_>, f: &mut Fixture) {
        let (dim, label, cache) = (self.dim, self.label, &mut f.cache);
        let (mut steps, mut worked) = (0u64, 0u64);
        g.bench_function(BenchmarkId::new("slow_path_step", dim), |b| {
            b.iter(|| {
                let did = black_box(cache.slow_path_step());
                steps += 1;
                worked += did as u64;
            })
        });
        println!("d{dim} {label}: slow_path_step: {worked} of {steps} steps scanned records");
        // (No steps: criterion's filter left the group out.)
        assert!(
            steps == 0 || worked * 2 > steps,
            "most slow-path steps found nothing to scan"
        );
    }

    /// Each timed delete removes an id a live entry holds (found untimed); deletes
    /// invalidate entries, so the cache is refilled (untimed) when it runs low.
    fn delete(&mut self, g: &mut Group<'_>, f: &mut Fixture, n: usize) {
        let (rng, next_id) = (&mut self.rng, &mut self.next_id);
        let Fixture {
            cache, clusters, ..
        } = &mut *f;
        g.bench_function(BenchmarkId::new("delete", self.dim), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    while cache.len() < n / 2 {
                        let q = clusters.sample(rng);
                        *next_id += 1_000_000;
                        let t = cache.miss_ticket(&q, K, false).unwrap();
                        cache.admit(t, answer(rng, *next_id)).unwrap();
                    }
                    let victim = engine_fixture::delete_victim(cache, rng);
                    let t = Instant::now();
                    black_box(cache.delete(victim));
                    total += t.elapsed();
                }
                total
            })
        });
    }
}

/// Full again (the delete measurements invalidate entries), and the idle time of a
/// server's owner has emptied the standby: one generation searched.
fn one_generation(f: &mut Fixture) {
    while f.cache.len() < reps() {
        f.admit_fresh();
    }
    let moved = f.cache.maintain(usize::MAX);
    println!(
        "d{}: idle time moved {moved} entries out of the standby; filter: {:?}",
        f.dim,
        f.cache.stats().filter
    );
}

/// Brings the fixture to the costlier of the filter's two FIFO states: two generations
/// searched, right after a rotation plus a quarter of the cache's admissions (the
/// standby still holding three quarters of the entries; it empties over the next three
/// quarters, and until the next rotation one generation is searched).
fn two_generations(f: &mut Fixture) {
    // Always a fresh rotation, so the state is reached the same way in every run: a
    // standby left by earlier parts (the scaling rounds, a group's admissions) holds
    // entries of other ages, or ones idle time moved.
    let n = reps();
    let rotations = f.cache.stats().filter.rotations;
    let mut admitted = 0usize;
    // FIFO rotates at least every two caches' worth of admissions.
    while f.cache.stats().filter.rotations == rotations && admitted < 3 * n {
        for _ in 0..256 {
            f.admit_fresh();
        }
        admitted += 256;
    }
    for _ in 0..n / 4 {
        f.admit_fresh();
    }
    println!(
        "d{}: {admitted} admissions to a rotation, {} more; filter: {:?}",
        f.dim,
        n / 4,
        f.cache.stats().filter
    );
}

/// Times `iters` lookups of inputs from `batches` (untimed; each batch's inputs timed
/// once, in order), adding its (hit, tried) counts to `checked` and the timed lookups
/// that were not approximate hits to `not_approximate`.
fn time_approximate_hits(
    f: &mut Fixture,
    iters: u64,
    mut batches: impl FnMut(&mut Fixture) -> (Vec<Vec<f32>>, (usize, usize)),
    checked: &mut (usize, usize),
    not_approximate: &mut usize,
) -> Duration {
    let mut total = Duration::ZERO;
    let mut left = iters;
    while left > 0 {
        let (batch, (tried, hit)) = batches(f);
        checked.0 += hit;
        checked.1 += tried;
        for q in batch.iter().take(left.min(usize::MAX as u64) as usize) {
            let t = Instant::now();
            let got = black_box(f.cache.lookup(black_box(q), K).unwrap());
            total += t.elapsed();
            if !matches!(got, Lookup::Hit(ref h) if h.kind == HitKind::Approximate) {
                *not_approximate += 1;
            }
        }
        left -= left.min(batch.len() as u64);
    }
    total
}

/// Draws of one entry by `aged_approximate_hits`: two hits each (check, timed copy) of
/// the ~20 its `τ` allows, leaving room for the other rows' lookups.
const AGED_USES_MAX: u8 = 6;

/// Near copies of `entries` live representatives drawn at random that were approximate
/// hits when checked (untimed; one of their ~20 hits spent), each as another near copy
/// (a distinct key), in the order checked: a timed lookup comes ~`entries` lookups after
/// its entry's check, so caches are about as cold as for a fresh request. An entry is
/// drawn at most `AGED_USES_MAX` times (`uses`), so `τ` is never spent. Returns the
/// inputs and (tried, hit) counts.
fn aged_approximate_hits(
    f: &mut Fixture,
    live: &[Arc<[f32]>],
    uses: &mut [u8],
    entries: usize,
) -> (Vec<Vec<f32>>, (usize, usize)) {
    let near = |q: &[f32], j: usize| -> Vec<f32> {
        let mut v = q.to_vec();
        let c = j % v.len();
        v[c] = v[c].next_up();
        v
    };
    let (mut out, mut tried) = (Vec::with_capacity(entries), 0usize);
    while out.len() < entries && tried < 64 * entries {
        tried += 1;
        let i = f.rng.gen_range(0..live.len());
        if uses[i] >= AGED_USES_MAX {
            continue;
        }
        uses[i] += 1;
        let q = &live[i];
        let j = f.rng.gen_range(0..q.len());
        if matches!(f.cache.lookup(&near(q, j), K), Ok(Lookup::Hit(ref h)) if h.kind == HitKind::Approximate)
        {
            out.push(near(q, j + 1));
        }
    }
    assert!(
        !out.is_empty(),
        "no live entry's near copy was an approximate hit, or every entry was drawn \
         {AGED_USES_MAX} times (a small AKER_BENCH_REPS)"
    );
    let hit = out.len();
    (out, (tried, hit))
}

/// Up to 4,096 request vectors drawn by `draw` whose lookup is a hit of `kind` (tried at
/// most 64 times as often), and how many were drawn.
fn inputs_hitting(
    f: &mut Fixture,
    kind: HitKind,
    draw: impl Fn(&mut Fixture) -> Vec<f32>,
) -> (Vec<Vec<f32>>, usize) {
    let mut out = Vec::with_capacity(4096);
    let mut tried = 0usize;
    while out.len() < 4096 && tried < 64 * 4096 {
        tried += 1;
        let q = draw(f);
        if matches!(f.cache.lookup(&q, K), Ok(Lookup::Hit(ref h)) if h.kind == kind) {
            out.push(q);
        }
    }
    assert!(!out.is_empty(), "no {kind:?} hit left");
    (out, tried)
}

/// Inputs that are approximate hits when they are timed, with `τ` to spare.
///
/// Every approximate hit quarters its entry's `τ` (α_T = 0.25, from minD / 4 = 0.25
/// here): a near copy one ulp away in one component (squared distance ~1e-14) stops
/// hitting after about 20, so replaying a fixed set of inputs turns into timing misses.
/// Instead: admit `entries` fresh queries (untimed; FIFO evicts as many of the oldest),
/// check one near copy of each (untimed; one hit spent), and return `copies` further
/// near copies of each entry that hit (each a distinct key: copy j moves component j),
/// interleaved (copy 1 of every entry, then copy 2, …) so a timed lookup finds the caches
/// as cold as a fresh request would. Returns the inputs and (checked, hit) counts.
fn fresh_approximate_hits(
    cache: &mut Cache,
    clusters: &Clusters,
    rng: &mut StdRng,
    next_id: &mut u64,
    entries: usize,
    copies: usize,
) -> (Vec<Vec<f32>>, (usize, usize)) {
    let near = |q: &[f32], j: usize| -> Vec<f32> {
        let mut v = q.to_vec();
        let c = j % v.len();
        v[c] = v[c].next_up();
        v
    };
    let mut hit = Vec::new();
    for _ in 0..entries {
        let q = clusters.sample(rng);
        let base = *next_id;
        *next_id += 1_000_000;
        let a = answer(rng, base);
        let t = cache.miss_ticket(&q, K, false).unwrap();
        cache.admit(t, a).unwrap();
        if matches!(cache.lookup(&near(&q, 0), K), Ok(Lookup::Hit(ref h)) if h.kind == HitKind::Approximate)
        {
            hit.push(q);
        }
    }
    let inputs = (1..=copies)
        .flat_map(|j| hit.iter().map(move |q| (j, q)))
        .map(|(j, q)| near(q, j))
        .collect();
    (inputs, (entries, hit.len()))
}

fn pct(h: &Histogram<u64>) -> String {
    format!(
        "p50 {:>7.2} µs  p99 {:>7.2} µs  p99.9 {:>7.2} µs",
        h.value_at_quantile(0.5) as f64 / 1000.0,
        h.value_at_quantile(0.99) as f64 / 1000.0,
        h.value_at_quantile(0.999) as f64 / 1000.0
    )
}

/// Per-operation latency distribution over 200,000 exact hits, 50,000 approximate hits
/// and 20,000 writes of each kind.
fn tails(f: &mut Fixture) {
    // Small fixtures (AKER_BENCH_REPS) must not run out of entries to delete from.
    let deletes = 20_000.min(f.cache.len() / 4);
    // Pre-checked approximate hits, each timed once (see `fresh_approximate_hits`).
    let mut hits = vec![];
    while hits.len() < 50_000 {
        let (more, (tried, hit)) = fresh_approximate_hits(
            &mut f.cache,
            &f.clusters,
            &mut f.rng,
            &mut f.next_id,
            4096,
            8,
        );
        assert!(hit > 0, "none of {tried} fresh queries' near copies hit");
        hits.extend(more);
    }
    // Exact hits: the live representatives' own queries (the scaling runs' admissions
    // evicted the first fixture queries).
    let live: Vec<Arc<[f32]>> = f.cache.representatives().map(|r| r.query.clone()).collect();
    let mut h = |name: &str, n: usize, op: &mut dyn FnMut(&mut Fixture)| {
        let mut hist = Histogram::<u64>::new(3).unwrap();
        for _ in 0..n {
            let t = Instant::now();
            op(f);
            hist.record(t.elapsed().as_nanos() as u64).unwrap();
        }
        println!("tail d{:<4} {name:<17} {}", f.dim, pct(&hist));
    };
    h("exact_hit", 200_000, &mut |f| {
        let q = live[f.rng.gen_range(0..live.len())].to_vec();
        black_box(f.cache.lookup(&q, K).unwrap());
    });
    let mut next = hits.iter();
    h("approximate_hit", hits.len(), &mut |f| {
        let q = next.next().expect("one per op");
        black_box(f.cache.lookup(q, K).unwrap());
    });
    // Near copies of live entries, as in the criterion row.
    h("insert_fast_path", 20_000, &mut |f| {
        f.next_id += 1;
        let q = &live[f.rng.gen_range(0..live.len())];
        let v: Arc<[f32]> = q.iter().map(|x| x + 1e-6).collect();
        black_box(f.cache.insert_logged(f.next_id, v, true).unwrap());
    });
    h("delete", deletes, &mut |f| {
        let victim = f.cache.representatives().next().expect("entries").nrl.ids[0];
        black_box(f.cache.delete(victim));
    });
    // The admission alone, its ticket from the lookup that missed (untimed).
    let mut hist = Histogram::<u64>::new(3).unwrap();
    for _ in 0..20_000 {
        let t = f.looked_up_ticket();
        let base = f.next_id;
        f.next_id += 1_000_000;
        let a = answer(&mut f.rng, base);
        let started = Instant::now();
        black_box(f.cache.admit(t, a).unwrap());
        hist.record(started.elapsed().as_nanos() as u64).unwrap();
    }
    println!("tail d{:<4} {:<17} {}", f.dim, "miss_admission", pct(&hist));
}

/// Approximate-hit inputs each reader thread replays in the scaling test: 6,000 entries
/// × 4 copies (80-90% of fresh entries' near copies hit, so two threads' pools take
/// ~15,000 admissions, far within the 100,000 the FIFO keeps).
const SCALING_POOL: usize = 24_000;
/// Smallest cache for the scaling rounds (smaller ones rotate the filter within every
/// round) and the any-age row (it would spend every entry's `τ`).
const FULL_REPS_MIN: usize = 60_000;
/// 1-vs-2-reader pairs per kind, half of them with 2 readers first; the median ratio is
/// the result (the machine is shared).
const SCALING_ROUNDS: usize = 6;

/// CPU time this thread has run (not waited or been preempted).
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and a valid out-pointer.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Misses the scaling test's owner admits in one run, their tickets made by lookups
/// before the run (a reader's work; drawing a 768-d vector alone costs ~4 µs of CPU that
/// would compete with the readers; the owner admits ~5,000 a second; runs last 0.2-2 s).
const OWNER_QUERIES: usize = 16_384;

/// What the background owner did during one scaling run.
struct OwnerRun {
    admitted: usize,
    /// Share of the run's wall time spent admitting, and of its thread CPU time.
    busy_share: f64,
    cpu_share: f64,
    longest: Duration,
    filter: FilterStats,
}

/// What the readers did during one scaling run.
struct ReadersRun {
    hits: usize,
    done: usize,
    /// Reader CPU time, summed (`thread_cpu`).
    cpu: Duration,
    run_s: f64,
    /// When the first reader ended, as a share of the run.
    first_end_share: f64,
}

/// One round: a 1-reader and a 2-reader run, indexed by reader count - 1.
struct Round {
    rates: [f64; 2],
    /// Lookups per second of reader CPU time.
    cpu_rates: [f64; 2],
    hit_shares: [f64; 2],
    owners: Vec<(usize, OwnerRun)>,
    /// The 2-reader run's `ReadersRun::first_end_share`.
    first_end_share: f64,
    rotations_before: u64,
}

/// Lookups per second with 1 and 2 reader threads, the owner admitting in the
/// background (`owner_rate()` a second, woken every `owner_wake_us()`), in
/// `SCALING_ROUNDS` pairs.
fn scaling(f: Fixture) -> Fixture {
    let Fixture {
        cache,
        clusters,
        queries,
        mut rng,
        dim,
        mut next_id,
    } = f;
    let reader = cache.reader();
    let queries = Arc::new(queries);
    let owner = Arc::new(Mutex::new(cache));
    for approximate in [false, true] {
        let kind = if approximate { "approximate" } else { "exact" };
        let (mut ratios, mut cpu_ratios) = (vec![], vec![]);
        let (mut round, mut attempts) = (0, 0);
        while round < SCALING_ROUNDS {
            attempts += 1;
            assert!(
                attempts <= 3 * SCALING_ROUNDS,
                "the filter rotated in every round"
            );
            // The first run of a round finds fewer of its entries (hit shares a few to 20
            // points lower, whichever reader count goes first, measured): alternate
            // which goes first, so that the median does not favour one.
            let order = if round % 2 == 0 { [1usize, 2] } else { [2, 1] };
            let inputs = ScalingInputs {
                owner: &owner,
                reader: &reader,
                queries: &queries,
                clusters: &clusters,
            };
            let r = inputs.round(&mut rng, &mut next_id, approximate, order);
            // A rotation in between compares two filter states (one generation searched
            // against two): not a scaling figure.
            if r.owners[1].1.filter.rotations != r.rotations_before {
                println!(
                    "scaling d{dim:<4} {kind:<12} attempt {attempts}: the filter rotated, redone"
                );
                continue;
            }
            round += 1;
            // Per reader CPU second, two readers against one, times two: the ratio if
            // each reader had a core to itself (what contention between readers leaves).
            let cpu_ratio = 2.0 * r.cpu_rates[1] / r.cpu_rates[0];
            print_round(dim, kind, round, order, &r, cpu_ratio);
            ratios.push(r.rates[1] / r.rates[0]);
            cpu_ratios.push(cpu_ratio);
        }
        // An even number of rounds, half of each order: the mean of the middle two.
        let median = |mut r: Vec<f64>| {
            r.sort_by(f64::total_cmp);
            let mid = r.len() / 2;
            (r[mid - 1] + r[mid]) / 2.0
        };
        println!(
            "scaling d{dim:<4} {kind:<12} median ratio {:.2}x of {SCALING_ROUNDS} rounds \
             (per reader CPU {:.2}x; owner: {} admissions/s, a wake-up every {} µs; \
             readers stop {})",
            median(ratios),
            median(cpu_ratios),
            owner_rate(),
            owner_wake_us(),
            if scaling_stop_at_first() {
                "when the first is done"
            } else {
                "each when done"
            },
        );
    }
    let cache = Arc::try_unwrap(owner)
        .ok()
        .expect("threads joined")
        .into_inner()
        .unwrap();
    let queries = Arc::try_unwrap(queries).expect("threads joined");
    Fixture {
        cache,
        clusters,
        queries,
        rng,
        dim,
        next_id,
    }
}

fn print_round(dim: usize, kind: &str, round: usize, order: [usize; 2], r: &Round, cpu_ratio: f64) {
    println!(
        "scaling d{dim:<4} {kind:<12} round {round}: 1 reader {:>10.0}/s  2 readers \
     {:>10.0}/s  ratio {:.2}x  per reader CPU {cpu_ratio:.2}x  (hits {:.1}% / {:.1}%; \
     {} reader(s) first; of 2, the first ended at {:.0}% of the run)",
        r.rates[0],
        r.rates[1],
        r.rates[1] / r.rates[0],
        r.hit_shares[0],
        r.hit_shares[1],
        order[0],
        r.first_end_share * 100.0
    );
    for (readers, o) in &r.owners {
        println!(
            "    owner with {readers} reader(s): {} admissions, busy {:.0}% \
             (CPU {:.0}%), longest {:.1} ms; filter rotations {}, standby live {}, \
             draining {}",
            o.admitted,
            o.busy_share * 100.0,
            o.cpu_share * 100.0,
            o.longest.as_secs_f64() * 1e3,
            o.filter.rotations,
            o.filter.standby_live,
            o.filter.draining
        );
    }
}

/// What every scaling run reads and admits into.
struct ScalingInputs<'a> {
    owner: &'a Arc<Mutex<Cache>>,
    reader: &'a Arc<CacheReader>,
    queries: &'a Arc<Vec<Vec<f32>>>,
    clusters: &'a Clusters,
}

impl ScalingInputs<'_> {
    /// One round: the two reader counts in `order`, each beside a background owner.
    fn round(
        &self,
        rng: &mut StdRng,
        next_id: &mut u64,
        approximate: bool,
        order: [usize; 2],
    ) -> Round {
        let mut r = Round {
            rates: [0.0; 2],
            cpu_rates: [0.0; 2],
            hit_shares: [0.0; 2],
            owners: vec![],
            first_end_share: 1.0,
            rotations_before: 0,
        };
        for (run, threads) in order.into_iter().enumerate() {
            if run == 0 {
                // One filter generation for both runs (the table's state): empty a
                // standby left by an earlier rotation, as an idle owner would. A
                // rotation from here to the end of the round has it redone.
                let mut c = self.owner.lock().unwrap();
                while c.maintain(4096) > 0 {}
                r.rotations_before = c.stats().filter.rotations;
            }
            let pools = self.approximate_pools(rng, next_id, approximate, threads);
            let stop = Arc::new(AtomicBool::new(false));
            let bg = self.spawn_owner(rng, stop.clone());
            let readers = self.run_readers(&pools, threads, approximate);
            if threads == 2 {
                r.first_end_share = readers.first_end_share;
            }
            r.cpu_rates[threads - 1] = readers.done as f64 / readers.cpu.as_secs_f64();
            r.hit_shares[threads - 1] = readers.hits as f64 / readers.done as f64 * 100.0;
            r.rates[threads - 1] = readers.done as f64 / readers.run_s;
            stop.store(true, Ordering::Relaxed);
            r.owners.push((threads, bg.join().unwrap()));
        }
        r
    }

    /// Approximate lookups replay pre-checked hits (`fresh_approximate_hits`, 4 copies
    /// per entry), each input 4 times: an entry is hit at most 1 + 4 × 4 = 17 times,
    /// within the ~20 τ allows. Built right before each run, so the FIFO has not evicted
    /// them yet: two pools, batch by batch in turn, for either reader count (one reader
    /// replays both, interleaved), so both runs replay entries of the same ages (later
    /// admissions make older entries harder to find in this fixture's graph). Exact
    /// runs get none.
    fn approximate_pools(
        &self,
        rng: &mut StdRng,
        next_id: &mut u64,
        approximate: bool,
        threads: usize,
    ) -> Vec<Arc<Vec<Vec<f32>>>> {
        let mut pools: Vec<Vec<Vec<f32>>> = vec![vec![]; 2 * approximate as usize];
        let mut c = self.owner.lock().unwrap();
        while pools.iter().any(|p| p.len() < SCALING_POOL) {
            for pool in pools.iter_mut().filter(|p| p.len() < SCALING_POOL) {
                let (more, (tried, hit)) =
                    fresh_approximate_hits(&mut c, self.clusters, rng, next_id, 1024, 4);
                assert!(hit > 0, "none of {tried} fresh queries' near copies hit");
                pool.extend(more);
            }
        }
        drop(c);
        if threads == 1 && approximate {
            // Even inputs of the first, odd of the second: both over their whole
            // length (their first halves alone are their oldest batches).
            let both = (0..SCALING_POOL).map(|j| pools[j % 2][j].clone());
            pools = vec![both.collect()];
        }
        pools
            .into_iter()
            .map(|mut p| {
                p.truncate(SCALING_POOL);
                Arc::new(p)
            })
            .collect()
    }

    /// The owner in the background, admitting the misses that have arrived at
    /// `owner_rate()` until `stop`.
    fn spawn_owner(&self, rng: &mut StdRng, stop: Arc<AtomicBool>) -> thread::JoinHandle<OwnerRun> {
        // Queries of this run's own: with one seed for every run the second
        // re-admitted the first's (cached keys), so its owner did less and its
        // graph changed less under the readers. Traffic like the rest: new
        // queries from the same clusters.
        // Made by lookups, as the misses of a server's readers make them: the
        // lookup is a reader's work, so it is not the owner's here either. Seeds
        // made before the run are older than a server's (a backend call) by up
        // to the run's admissions; an admission costs the same.
        let owner_tickets: Vec<MissTicket> = {
            let c = self.owner.lock().unwrap();
            (0..OWNER_QUERIES)
                .map(|_| looked_up_ticket(&c, self.clusters, rng, K))
                .collect()
        };
        let (owner, clusters) = (self.owner.clone(), self.clusters.clone());
        let seed = rng.gen::<u64>();
        let (rate, wake_us) = (owner_rate(), owner_wake_us());
        thread::spawn(move || {
            let mut rng = StdRng::seed_from_u64(seed);
            let mut c = owner.lock().unwrap();
            let (mut admitted, mut busy, mut longest) = (0usize, Duration::ZERO, Duration::ZERO);
            let (started, cpu_started) = (Instant::now(), thread_cpu());
            let mut tickets = owner_tickets.into_iter();
            let (period, mut wake) = (Duration::from_micros(wake_us), started);
            while !stop.load(Ordering::Relaxed) {
                // The misses that have arrived by now at `rate`.
                let due = (started.elapsed().as_secs_f64() * rate as f64) as usize;
                while admitted < due && !stop.load(Ordering::Relaxed) {
                    let t0 = Instant::now();
                    // Past the ones made before (a slow run): made here, without a lookup.
                    let t = tickets.next().unwrap_or_else(|| {
                        let q = clusters.sample(&mut rng);
                        c.miss_ticket(&q, K, false).unwrap()
                    });
                    let base = rng.gen_range(0..1u64 << 40);
                    let a = answer(&mut rng, base);
                    c.admit(t, a).unwrap();
                    let took = t0.elapsed();
                    (admitted, busy, longest) = (admitted + 1, busy + took, longest.max(took));
                }
                wake += period;
                if let Some(left) = wake.checked_duration_since(Instant::now()) {
                    thread::sleep(left);
                }
            }
            let wall = started.elapsed().as_secs_f64();
            OwnerRun {
                admitted,
                busy_share: busy.as_secs_f64() / wall,
                cpu_share: (thread_cpu() - cpu_started).as_secs_f64() / wall,
                longest,
                filter: c.stats().filter,
            }
        })
    }

    /// `threads` readers, each its share of lookups (its pool's approximate inputs, or
    /// exact ones from the newer half of the fixture's queries).
    fn run_readers(
        &self,
        pools: &[Arc<Vec<Vec<f32>>>],
        threads: usize,
        approximate: bool,
    ) -> ReadersRun {
        let per_thread = if approximate {
            4 * SCALING_POOL
        } else {
            300_000
        };
        // Set by the first reader to finish its share (`scaling_stop_at_first`).
        let first_done = Arc::new(AtomicBool::new(false));
        let stop_at_first = scaling_stop_at_first();
        let t = Instant::now();
        let workers: Vec<_> = (0..threads)
            .map(|w| {
                let pool = pools.get(w).cloned().unwrap_or_default();
                let (reader, queries) = (self.reader.clone(), self.queries.clone());
                let first_done = first_done.clone();
                thread::spawn(move || {
                    let mut rng = StdRng::seed_from_u64(w as u64);
                    let (mut hits, mut done) = (0usize, 0usize);
                    let cpu_started = thread_cpu();
                    for i in 0..per_thread {
                        // Read-only until set: the line stays shared, no traffic.
                        if stop_at_first && first_done.load(Ordering::Relaxed) {
                            break;
                        }
                        let got = if approximate {
                            reader.lookup(&pool[i % pool.len()], K).unwrap()
                        } else {
                            // the newer half: the background admissions evict the oldest
                            let q = &queries[rng.gen_range(queries.len() / 2..queries.len())];
                            reader.lookup(q, K).unwrap()
                        };
                        hits += matches!(black_box(got), Lookup::Hit(_)) as usize;
                        done += 1;
                    }
                    first_done.store(true, Ordering::Relaxed);
                    (hits, done, thread_cpu() - cpu_started, Instant::now())
                })
            })
            .collect();
        let (mut hits, mut done, mut cpu) = (0usize, 0usize, Duration::ZERO);
        let mut first_end = f64::INFINITY;
        for w in workers {
            let (h, n, c, end) = w.join().unwrap();
            (hits, done, cpu) = (hits + h, done + n, cpu + c);
            first_end = first_end.min(end.duration_since(t).as_secs_f64());
        }
        let run_s = t.elapsed().as_secs_f64();
        ReadersRun {
            hits,
            done,
            cpu,
            run_s,
            first_end_share: first_end / run_s,
        }
    }
}

/// The filter index alone (20,000 points, clustered): search for the nearest live
/// entry and insert, graph versus hnsw_rs at the paper's parameters, plus how often
/// each puts the true nearest first.
fn filter_only(c: &mut Criterion) {
    if !group_enabled("filter") {
        return;
    }
    let n = 20_000;
    let (m, ef_construction, ef_search) = FilterKind::PAPER;
    let kinds = [
        ("graph", FilterKind::default()),
        (
            "hnsw_rs",
            FilterKind::HnswRs {
                m,
                ef_construction,
                ef_search,
            },
        ),
    ];
    for dim in dims() {
        let mut rng = StdRng::seed_from_u64(11);
        let clusters = Clusters::new(dim, &mut rng);
        let points: Vec<Vec<f32>> = (0..n).map(|_| clusters.sample(&mut rng)).collect();
        let probes: Vec<Vec<f32>> = (0..1000).map(|_| clusters.sample(&mut rng)).collect();
        let truth: Vec<u64> = probes
            .iter()
            .map(|q| {
                (0..n)
                    .min_by(|&a, &b| {
                        Metric::L2Sq
                            .distance(q, &points[a])
                            .total_cmp(&Metric::L2Sq.distance(q, &points[b]))
                    })
                    .unwrap() as u64
            })
            .collect();
        let mut g = c.benchmark_group(format!("filter/d{dim}/{n}points"));
        g.sample_size(30)
            .measurement_time(Duration::from_secs(3))
            .warm_up_time(Duration::from_secs(1));
        for (name, kind) in kinds {
            let index = shards::filter::new_index(kind, Metric::L2Sq, dim, n);
            let t = Instant::now();
            for (i, p) in points.iter().enumerate() {
                index.insert(i as u64, p);
            }
            let build_us = t.elapsed().as_secs_f64() * 1e6 / n as f64;
            let found = probes
                .iter()
                .zip(&truth)
                .filter(|(q, t)| {
                    index
                        .search(q, FilterQuery::nearest(1, &|_| true))
                        .first()
                        .map(|x| x.0)
                        == Some(**t)
                })
                .count();
            println!(
                "filter d{dim:<4} {name:<8} insert {build_us:>8.1} µs/point (mean)  nearest first {:.1}%",
                found as f64 / probes.len() as f64 * 100.0
            );
            let mut i = 0usize;
            g.bench_function(BenchmarkId::new(format!("{name}_search"), dim), |b| {
                b.iter(|| {
                    i = (i + 1) % probes.len();
                    black_box(index.search(
                        black_box(&probes[i]),
                        FilterQuery::nearest(2, &|r| r % 7 != 0),
                    ))
                })
            });
        }
        g.finish();
    }
}

criterion_group!(benches, single_core, filter_only);

/// Memory faulted in before anything is timed (`engine_fixture::prefault`), in MB:
/// AKER_BENCH_PREFAULT_MB, 2048 by default (the insert log of the insert groups grows by
/// ~1 GB at d = 768); 0 times first-touch faults too.
fn prefault_mb() -> usize {
    engine_fixture::env_usize("AKER_BENCH_PREFAULT_MB", 2048)
}

fn main() {
    aker_alloc::keep_freed_memory();
    let mb = prefault_mb();
    if mb > 0 {
        // Freed memory serves any size's growth later (the insert log's vectors, graph
        // chunks): `aker_alloc::prefault`, as akerd's `cache.prefault_bytes`.
        let took = aker_alloc::prefault(mb << 20);
        println!(
            "prefault: {mb} MB allocated and freed in {:.1} s (AKER_BENCH_PREFAULT_MB)",
            took.as_secs_f64()
        );
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
