//! Issues #25 and #41: with the default configuration, an acknowledged insert is in
//! every hit it belongs in.
//!
//! The guarantee: for every live representative `e` with `d(v, RQ_e) < maxD_e` (its
//! list's last, `k + Δ`-th distance, so in particular below its `k`-th) when `v` is
//! inserted, every hit `e` serves once the insert returns has `v` at its place: the
//! owner's fast path merges it into the nearest entry the filter finds, and a hit on any
//! other checks the inserts its list has not accounted for (`recent.rs`). Each test
//! checks every entry exhaustively, not only the nearest one, with the slow path off:
//! the slow path is not what keeps the guarantee.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shards::sharded::{ShardedCache, ShardingConfig};
use shards::store::ExactStore;
use shards::{
    Backend, Cache, CacheConfig, Capacity, FilterKind, HitKind, Lookup, Metric, PolicyConfig,
};

const DIM: usize = 16;
const K: usize = 5;
const DELTA: usize = 2;

fn clustered(rng: &mut StdRng, n: usize) -> Vec<f32> {
    let centres: Vec<Vec<f32>> = (0..12)
        .map(|_| (0..DIM).map(|_| rng.gen_range(-1.0f32..1.0)).collect())
        .collect();
    (0..n)
        .flat_map(|i| {
            let c = &centres[i % centres.len()];
            c.iter()
                .map(|x| x + rng.gen_range(-0.15f32..0.15))
                .collect::<Vec<_>>()
        })
        .collect()
}

fn config(metric: Metric, store_vectors: bool, capacity: usize) -> CacheConfig {
    CacheConfig {
        delta: DELTA,
        k_max: 10,
        store_vectors,
        capacity: Capacity::Objects(capacity),
        // No slow-path steps: what reaches a hit is the fast path's and the hit's own
        // check of recent inserts alone.
        risk_threshold: 1e30,
        // Every insert of a test stays checkable (the default, 1,024, is the rule of
        // `an_entry_behind_the_window_misses_and_is_caught_up`, rules.rs).
        hit_check_records_max: 4096,
        // The paper's graph at its smallest: it misses entries, which the fix must not.
        filter: FilterKind::Hnsw {
            m: 4,
            ef_construction: 8,
            ef_search: 16,
        },
        ..CacheConfig::new(DIM, metric)
    }
}

fn near(rng: &mut StdRng, q: &[f32], scale: f32) -> Vec<f32> {
    q.iter().map(|x| x + rng.gen_range(-scale..scale)).collect()
}

/// Every live entry's `maxD`, by representative.
fn max_ds<'a>(caches: impl IntoIterator<Item = &'a Cache>) -> HashMap<(usize, u64), f32> {
    let mut m = HashMap::new();
    for (s, c) in caches.into_iter().enumerate() {
        for r in c.representatives() {
            m.insert((s, r.id), *r.nrl.dists.last().expect("k results at least"));
        }
    }
    m
}

/// Every entry still live whose `maxD` was farther than `v` serves `id` in its next
/// exact hit wherever it ranks in the first `k` (nearer results only ahead of it);
/// returns how many entries took it. `caught_up`: the catch-ups the hits ask for.
fn check_all<'a>(
    caches: impl IntoIterator<Item = &'a Cache>,
    before: &HashMap<(usize, u64), f32>,
    metric: Metric,
    id: u64,
    v: &[f32],
    caught_up: &mut Vec<(usize, u64)>,
) -> usize {
    let mut takers = 0;
    for (s, c) in caches.into_iter().enumerate() {
        for r in c.representatives() {
            let Some(&max_d) = before.get(&(s, r.id)) else {
                continue; // admitted after the insert
            };
            let d = metric.distance(v, &r.query);
            if d >= max_d {
                continue;
            }
            takers += 1;
            let Lookup::Hit(h) = c.lookup(&r.query, r.k).unwrap() else {
                panic!("shard {s} entry {} missed ({metric})", r.id);
            };
            assert_eq!((h.kind, h.rep), (HitKind::Exact, r.id));
            caught_up.extend(h.catch_up.map(|rep| (s, rep)));
            if !h.results.iter().any(|n| n.id == id) {
                let last = h.results.last().expect("k results");
                assert!(
                    h.results.len() == r.k && last.distance <= d,
                    "shard {s} entry {} (d {d} < maxD {max_d}) leaves {id} out of {:?} \
                     ({metric})",
                    r.id,
                    h.results,
                );
            }
        }
    }
    takers
}

/// Admits `queries` (and, for a fifth of them, near-duplicates at 1e-4) as their own
/// entries, the backend answering.
fn admit_all(c: &mut Cache, db: &ExactStore, rng: &mut StdRng, queries: &[Vec<f32>]) {
    for q in queries {
        let mut admit = |q: &[f32]| {
            let t = c.miss_ticket(q, K, false).unwrap();
            c.admit(t, db.search(q, K + DELTA).unwrap()).unwrap();
        };
        admit(q);
        if rng.gen_bool(0.2) {
            admit(&near(rng, q, 1e-4));
        }
    }
}

fn engine_trials(metric: Metric, store_vectors: bool, trials: usize, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let data = clustered(&mut rng, 1500);
    let mut db = ExactStore::from_rows(DIM, metric, &data).unwrap();
    // Room for the entries; the trials evict some themselves (below).
    let mut c = Cache::new(
        config(metric, store_vectors, 1000),
        PolicyConfig::default().build(),
    )
    .unwrap();
    let queries: Vec<Vec<f32>> = (0..400)
        .map(|i| near(&mut rng, &data[i * DIM..(i + 1) * DIM], 0.05))
        .collect();
    admit_all(&mut c, &db, &mut rng, &queries[..200]);
    let (mut next, mut took) = (1u64 << 40, 0usize);
    for t in 0..trials {
        if t % 25 == 0 {
            // Evictions and new entries keep the filter rotating (the pool's objects are
            // shared widely enough that the budget alone rarely evicts here).
            for _ in 0..30 {
                c.evict_oldest();
            }
            let from = rng.gen_range(0..queries.len() - 20);
            admit_all(&mut c, &db, &mut rng, &queries[from..from + 20]);
        }
        let rq = {
            let reps: Vec<_> = c.representatives().collect();
            reps[rng.gen_range(0..reps.len())].query.to_vec()
        };
        let v = near(&mut rng, &rq, 1e-3);
        let before = max_ds([&c]);
        next += 1;
        db.insert(next, &v).unwrap();
        c.insert(next, &v).unwrap();
        let mut asked = Vec::new();
        took += check_all([&c], &before, metric, next, &v, &mut asked);
        // Half the trials catch the entries up as their owner would (their lists then
        // hold what the hits added); the others leave them behind, as a request dropped
        // on a full queue does.
        for (_, rep) in asked {
            if t % 2 == 0 {
                c.catch_up(rep);
            } else {
                c.reader().catch_up_dropped(rep);
            }
        }
        // The next hit of the entry asked for shows it, first where it is nearest.
        if let Lookup::Hit(h) = c.lookup(&rq, K).unwrap() {
            let best = db.search(&rq, 1).unwrap()[0].id;
            if best == next {
                assert_eq!(h.results[0].id, next, "{metric}: exact hit leaves it out");
            }
        }
    }
    c.check_invariants().unwrap();
    let filter = c.stats().filter;
    assert!(filter.rotations > 0, "the filter rotated: {filter:?}");
    // On l2sq and cosine the entry asked for takes every insert; on ip a vector next to
    // `RQ` need not outscore its results.
    if metric != Metric::InnerProduct {
        assert!(took >= trials, "every insert has at least its own entry");
    }
}

#[test]
fn every_entry_that_takes_a_vector_lists_it_on_every_metric() {
    // 6 configurations × 1,000 inserts, each checked against every entry.
    for (i, metric) in [Metric::L2Sq, Metric::Cosine, Metric::InnerProduct]
        .into_iter()
        .enumerate()
    {
        for store_vectors in [true, false] {
            engine_trials(
                metric,
                store_vectors,
                1000,
                10 + i as u64 * 2 + store_vectors as u64,
            );
        }
    }
}

#[test]
fn every_entry_in_every_shard_that_takes_a_vector_lists_it() {
    let mut rng = StdRng::seed_from_u64(7);
    let data = clustered(&mut rng, 1500);
    let mut db = ExactStore::from_rows(DIM, Metric::L2Sq, &data).unwrap();
    let guarded = PolicyConfig::Guarded {
        alpha_l: 1.1,
        alpha_t: 0.25,
        tau_init_divisor: 4.0,
        spread: 0.0,
    };
    let sharding = ShardingConfig {
        shards: 4,
        centroids: 16,
        rebalance_every: 200,
        seed: 3,
    };
    let mut c = ShardedCache::new(
        config(Metric::L2Sq, false, 4000),
        &guarded,
        &sharding,
        &data[..800 * DIM],
    )
    .unwrap();
    let mut next = 1u64 << 40;
    for t in 0..2000 {
        // Queries asked twice, and near copies asked twice (promoted aliases: near-
        // duplicate entries, possibly in another shard than the original's).
        let row = rng.gen_range(0..1500) * DIM;
        let q = near(&mut rng, &data[row..row + DIM], 0.05);
        let q2 = near(&mut rng, &q, 1e-4);
        for x in [&q, &q, &q2, &q2] {
            c.search(&db, x, K).unwrap();
        }
        let v = near(&mut rng, &q, 1e-3);
        let before = max_ds(c.shards());
        next += 1;
        db.insert(next, &v).unwrap();
        c.insert(next, &v).unwrap();
        let mut asked = Vec::new();
        check_all(c.shards(), &before, Metric::L2Sq, next, &v, &mut asked);
        // Not applied (the searches above catch up what they hit): dropped requests.
        for (s, rep) in asked {
            c.shards()[s].reader().catch_up_dropped(rep);
        }
        if t % 100 == 0 {
            c.check_invariants().unwrap();
        }
    }
}

/// A reader thread serving lookups while the owner inserts: once `insert` has
/// returned, the next exact hit of the entry the vector was inserted next to (at 1e-3)
/// has it first, in every trial, on every metric (1,000 each here; the 10,000 of issue
/// #41 below).
#[test]
fn under_load_the_next_exact_hit_has_the_insert_first() {
    for metric in METRICS {
        under_load(metric, 1_000);
    }
}

/// Issue #41's 10,000 of 10,000 on each metric, too slow for a debug `cargo test` on
/// two shared cores (thread hand-overs per trial): `cargo test -p shards --release
/// --test fast_path -- --ignored`.
#[test]
#[ignore]
fn under_load_10_000_of_10_000_trials() {
    for metric in METRICS {
        under_load(metric, 10_000);
    }
}

const METRICS: [Metric; 3] = [Metric::L2Sq, Metric::Cosine, Metric::InnerProduct];

fn under_load(metric: Metric, trials: usize) {
    let mut rng = StdRng::seed_from_u64(11);
    let data = clustered(&mut rng, 1500);
    let mut db = ExactStore::from_rows(DIM, metric, &data).unwrap();
    // Room for every entry and every insert: nothing is evicted under the reader; the
    // default window of recent inserts a hit checks.
    let cfg = CacheConfig {
        hit_check_records_max: CacheConfig::default().hit_check_records_max,
        ..config(metric, false, 1 << 20)
    };
    let mut c = Cache::new(cfg, PolicyConfig::default().build()).unwrap();
    let queries: Vec<Vec<f32>> = (0..400)
        .map(|i| near(&mut rng, &data[i * DIM..(i + 1) * DIM], 0.05))
        .collect();
    admit_all(&mut c, &db, &mut rng, &queries);
    let max_norm = data
        .chunks(DIM)
        .map(|x| x.iter().map(|a| a * a).sum::<f32>().sqrt())
        .fold(0.0f32, f32::max);
    let reader = c.reader();
    let stop = Arc::new(AtomicBool::new(false));
    // What hits ask of the owner (akerd's `OwnerMsg::CatchUp`), applied between trials.
    let (catch_up_tx, catch_up_rx) = mpsc::channel::<u64>();
    // Background lookups all along, so reads overlap the owner's writes.
    let background = {
        let (reader, stop, busy) = (c.reader(), stop.clone(), queries.clone());
        let catch_up = catch_up_tx.clone();
        std::thread::spawn(move || {
            let mut i = 0usize;
            while !stop.load(Ordering::Relaxed) {
                if let Lookup::Hit(h) = reader.lookup(&busy[i % busy.len()], K).unwrap() {
                    let _ = catch_up.send(h.catch_up.unwrap_or(0));
                }
                i += 1;
                // On one core a spinning reader would hold up every hand-over below.
                std::thread::yield_now();
            }
        })
    };
    // The check runs on another thread than the owner's, after `insert` returned.
    let (tx, rx) = mpsc::sync_channel::<(Vec<f32>, u64)>(0);
    let (ack_tx, ack_rx) = mpsc::sync_channel::<()>(0);
    let checker = std::thread::spawn(move || {
        let mut exact = 0usize;
        while let Ok((rq, id)) = rx.recv() {
            let Lookup::Hit(h) = reader.lookup(&rq, K).unwrap() else {
                panic!("a cached query missed ({metric})");
            };
            assert_eq!(h.kind, HitKind::Exact);
            assert_eq!(
                h.results[0].id, id,
                "the insert at 1e-3 is not first ({metric})"
            );
            let _ = catch_up_tx.send(h.catch_up.unwrap_or(0));
            exact += 1;
            ack_tx.send(()).unwrap();
        }
        exact
    });
    let mut next = 1u64 << 40;
    let (mut sent, mut tries) = (0, 0);
    // Bounded: nearly every try is ranked first (the deletes below keep it so).
    while sent < trials && tries < 2 * trials {
        tries += 1;
        // The owner's loop: the catch-ups asked for, then idle-time upkeep (entries
        // more than half the window behind).
        while let Ok(rep) = catch_up_rx.try_recv() {
            c.catch_up(rep);
        }
        c.maintain(64);
        let rq = {
            let reps: Vec<_> = c.representatives().collect();
            reps[rng.gen_range(0..reps.len())].query.to_vec()
        };
        let mut v = near(&mut rng, &rq, 1e-3 / (DIM as f32).sqrt());
        if metric == Metric::InnerProduct {
            // On ip the nearest is the largest product: the same direction, longer than
            // anything stored.
            let scale = 2.0 * max_norm / rq.iter().map(|a| a * a).sum::<f32>().sqrt();
            v.iter_mut().for_each(|x| *x *= scale);
        }
        next += 1;
        db.insert(next, &v).unwrap();
        c.insert(next, &v).unwrap();
        // Only where the backend ranks it first (its nearest is the new vector).
        if db.search(&rq, 1).unwrap()[0].id == next {
            tx.send((rq, next)).unwrap();
            ack_rx.recv().unwrap();
            sent += 1;
        }
        // Deleted once checked, so the next trial near the same entry is ranked first
        // again (kept, the trials near an entry would crowd it and the share the backend
        // ranks first would fall with every trial); and a random insert that stays.
        db.delete(next).unwrap();
        c.delete(next);
        next += 1;
        let elsewhere = clustered(&mut rng, 1);
        db.insert(next, &elsewhere).unwrap();
        c.insert(next, &elsewhere).unwrap();
    }
    drop(tx);
    assert_eq!(sent, trials, "{tries} tries ({metric})");
    assert_eq!(checker.join().unwrap(), trials);
    stop.store(true, Ordering::Relaxed);
    background.join().unwrap();
    c.check_invariants().unwrap();
    let st = c.stats();
    assert_eq!(st.hits_behind, 0, "{st:?}");
    assert!(
        st.hits_with_recent > 0,
        "hits added inserts themselves: {st:?}"
    );
}
