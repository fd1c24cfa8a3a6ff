//! Concurrency stress: reader threads look up (lock-free) and resolve misses while each
//! shard's owner thread admits, evicts, rotates its filter, refreshes, and applies the
//! inserts and deletes a writer thread sends. Bounded in time and operations.
//!
//! Asserts: no id whose delete was acknowledged before a lookup began is returned by
//! it; every hit has exactly k ids in ascending distance; afterwards every shard's
//! invariants hold (capacity, reference counts, no deleted id cached).
//! `.ci/run` also runs this under AddressSanitizer.
//!
//! The test's stand-in database sits behind an `RwLock`: it is the backend, not the
//! cache, so the engine's lock rule does not apply to it.
#![allow(clippy::disallowed_types)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::thread;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use shards::budget::GlobalBudget;
use shards::exact_table::QueryKey;
use shards::filter::InsertSeeds;
use shards::owner::{channel, OwnerMsg, ShardHandle};
use shards::router::Router;
use shards::store::ExactStore;
use shards::{
    Backend, Cache, CacheConfig, Capacity, FilterKind, Lookup, Metric, MissTicket, PolicyConfig,
    StandbySearch,
};

const DIM: usize = 8;
const K: usize = 5;
const SHARDS: usize = 2;
const READERS: usize = 2;
const RUN_TIME: Duration = Duration::from_millis(2500);
const READER_OPS_MAX: u64 = 400_000;
const WRITER_OPS_MAX: u64 = 4_000;

struct Acked {
    /// id -> order in which its delete was acknowledged
    order: papaya::HashMap<u64, u64>,
    count: AtomicU64,
}

fn run_stress(filter: FilterKind, standby_search: StandbySearch) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let base: Vec<f32> = (0..3000 * DIM)
        .map(|_| rng.gen_range(-1.0f32..1.0))
        .collect();
    let db = Arc::new(RwLock::new(
        ExactStore::from_rows(DIM, Metric::L2Sq, &base).unwrap(),
    ));
    // queries: 300 centres, each with close variants, so all hit kinds occur
    let centres: Vec<Vec<f32>> = (0..300)
        .map(|i| {
            base[i * DIM..(i + 1) * DIM]
                .iter()
                .map(|x| x * 0.9)
                .collect()
        })
        .collect();
    let router = Arc::new(Router::train(&base, DIM, Metric::L2Sq, 16, SHARDS, 3).unwrap());
    let budget = Arc::new(GlobalBudget::new(600, SHARDS));
    let cfg = CacheConfig {
        delta: 2,
        k_max: 10,
        filter,
        standby_search,
        capacity: Capacity::Objects(600),
        insert_log_cap: 256,
        ..CacheConfig::new(DIM, Metric::L2Sq)
    };
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(Acked {
        order: papaya::HashMap::new(),
        count: AtomicU64::new(0),
    });

    let mut handles: Vec<ShardHandle> = vec![];
    let mut owners = vec![];
    for s in 0..SHARDS {
        let mut cache = Cache::with_budget(
            cfg.clone(),
            PolicyConfig::default().build(),
            budget.clone(),
            s,
        )
        .unwrap();
        let (h, rx) = channel(&cache, 256);
        handles.push(h);
        owners.push(thread::spawn(move || {
            // until every sender is gone
            while let Ok(msg) = rx.recv() {
                cache.apply(msg);
            }
            cache
        }));
    }
    let handles = Arc::new(handles);

    let readers: Vec<_> = (0..READERS)
        .map(|r| {
            let (handles, router, db, stop, acked, centres) = (
                handles.clone(),
                router.clone(),
                db.clone(),
                stop.clone(),
                acked.clone(),
                centres.clone(),
            );
            thread::spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(100 + r as u64);
                let (mut hits, mut ops, mut seeded) = (0u64, 0u64, 0u64);
                let started = Instant::now();
                while !stop.load(Ordering::Relaxed)
                    && ops < READER_OPS_MAX
                    && started.elapsed() < RUN_TIME * 2
                {
                    ops += 1;
                    let c = &centres[rng.gen_range(0..centres.len())];
                    let q: Vec<f32> = match rng.gen_range(0..3) {
                        0 => c.clone(),
                        _ => c
                            .iter()
                            .map(|x| x + rng.gen_range(-0.02f32..0.02))
                            .collect(),
                    };
                    let seen_acks = acked.count.load(Ordering::Acquire);
                    // As akerd's handler: the shards a moved centroid left are probed too.
                    let probes = router.route_probes(&q);
                    let (s1, probe) = (probes.first(), probes.as_slice());
                    let key = QueryKey::new(&q);
                    // As akerd's handler: the nearest shard's filter search leaves the
                    // admission its seeds (the owner links the new node among them).
                    let mut seeds = InsertSeeds::default();
                    let found = probe
                        .iter()
                        .find_map(|&s| handles[s].reader.probe_exact(&q, K, key).map(|l| (s, l)))
                        .or_else(|| {
                            probe.iter().find_map(|&s| {
                                let seeds = (s == s1).then_some(&mut seeds);
                                let reader = &handles[s].reader;
                                reader
                                    .probe_filter_seeded(&q, K, key, seeds, &mut None)
                                    .map(|l| (s, l))
                            })
                        });
                    let ids: Vec<u64> = match found {
                        Some((s, Lookup::Hit(hit))) => {
                            hits += 1;
                            assert_eq!(hit.results.len(), K, "a hit returns exactly k");
                            assert!(
                                hit.results
                                    .windows(2)
                                    .all(|w| w[0].distance <= w[1].distance),
                                "ascending"
                            );
                            if let Some(key) = hit.link {
                                handles[s].hint(OwnerMsg::LinkAlias { key, rep: hit.rep });
                            }
                            handles[s].catch_up(hit.catch_up);
                            handles[s].slow_path_credit();
                            hit.results.iter().map(|n| n.id).collect()
                        }
                        _ => {
                            seeded += !seeds.is_empty() as u64;
                            let ticket = MissTicket {
                                seeds,
                                ..handles[s1].reader.miss_ticket(&q, K, false).unwrap()
                            };
                            let answer = db.read().unwrap().search(&q, K + 2).unwrap();
                            let ids = answer.iter().take(K).map(|c| c.id).collect();
                            handles[s1].hint(OwnerMsg::Admit {
                                ticket,
                                answer,
                                ack: None,
                            });
                            ids
                        }
                    };
                    for id in ids {
                        if let Some(&i) = acked.order.pin().get(&id) {
                            assert!(
                                i >= seen_acks,
                                "id {id} returned after its delete was acknowledged"
                            );
                        }
                    }
                }
                (ops, hits, seeded)
            })
        })
        .collect();

    // writer: deletes of cached-looking ids and inserts of fresh ones, acked by every owner
    let writer = {
        let (handles, router, db, acked) =
            (handles.clone(), router.clone(), db.clone(), acked.clone());
        thread::spawn(move || {
            let mut rng = rand::rngs::StdRng::seed_from_u64(7);
            let started = Instant::now();
            let mut next_id = 1_000_000u64;
            let mut ops = 0;
            while started.elapsed() < RUN_TIME && ops < WRITER_OPS_MAX {
                ops += 1;
                if rng.gen_bool(0.5) {
                    let id = rng.gen_range(0..3000u64);
                    if acked.order.pin().contains_key(&id) {
                        continue;
                    }
                    db.write().unwrap().delete(id).unwrap();
                    let acks: Vec<_> = handles
                        .iter()
                        .map(|h| {
                            let (tx, rx) = flume::bounded(1);
                            h.sender().send(OwnerMsg::Delete { id, ack: tx }).unwrap();
                            rx
                        })
                        .collect();
                    for a in acks {
                        a.recv().unwrap();
                    }
                    let n = acked.count.load(Ordering::Relaxed);
                    acked.order.pin().insert(id, n);
                    acked.count.store(n + 1, Ordering::Release);
                } else {
                    let v: Vec<f32> = (0..DIM).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
                    next_id += 1;
                    db.write().unwrap().insert(next_id, &v).unwrap();
                    let v: Arc<[f32]> = Arc::from(v);
                    let near = router.route_write(&v);
                    let acks: Vec<_> = handles
                        .iter()
                        .enumerate()
                        .map(|(s, h)| {
                            let (tx, rx) = flume::bounded(1);
                            let msg = OwnerMsg::Insert {
                                id: next_id,
                                vector: v.clone(),
                                fast_path: near.contains(&s),
                                ack: tx,
                            };
                            h.sender().send(msg).unwrap();
                            rx
                        })
                        .collect();
                    for a in acks {
                        a.recv().unwrap().unwrap();
                    }
                }
                if ops % 64 == 0 {
                    let moves = router.rebalance();
                    // Old shards stay probed until the next rebalance here: rotations of
                    // which shard lookups read are what the stress is after.
                    for m in moves {
                        if ops % 128 == 0 {
                            router.forget_previous(m.centroid, m.from);
                        }
                    }
                }
            }
            ops
        })
    };

    let writes = writer.join().unwrap();
    stop.store(true, Ordering::Relaxed);
    let (mut total_hits, mut total_seeded) = (0, 0);
    for r in readers {
        let (ops, hits, seeded) = r.join().unwrap();
        assert!(ops > 0);
        total_hits += hits;
        total_seeded += seeded;
    }
    let dropped: u64 = handles.iter().map(|h| h.dropped()).sum();
    drop(handles);
    let deleted: Vec<u64> = acked.order.pin().keys().copied().collect();
    let mut stats = shards::CacheStats::default();
    for o in owners {
        let cache = o.join().unwrap();
        cache.check_invariants().unwrap();
        for rep in cache.representatives() {
            for id in &rep.nrl.ids {
                assert!(!deleted.contains(id), "deleted id {id} still cached");
            }
        }
        stats.accumulate(&cache.stats());
    }
    assert!(writes > 10 && !deleted.is_empty());
    assert!(
        total_hits > 0 && stats.admissions > 0 && stats.evictions > 0,
        "{stats:?}"
    );
    // Misses whose admission went to the owner with seeds (the seeded insertion ran
    // under the readers' searches and the rotations); only the graph leaves them.
    if matches!(filter, FilterKind::Hnsw { .. }) {
        assert!(total_seeded > 0, "no miss carried insert seeds");
    }
    eprintln!(
        "stress: {writes} writes, {total_hits} hits, {total_seeded} seeded misses, \
         {dropped} hints dropped, {stats:?}"
    );
}

#[test]
fn concurrent_readers_with_owner_writes_brute_filter() {
    run_stress(FilterKind::BruteForce, StandbySearch::Nearest);
}

#[test]
fn concurrent_readers_with_owner_writes_hnsw_filter() {
    // akerd's configuration: the generation hits come from is searched first, and the
    // first with a candidate that serves answers.
    run_stress(FilterKind::default(), StandbySearch::Learned);
}
