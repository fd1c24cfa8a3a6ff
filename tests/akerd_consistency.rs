//! akerd under concurrency: deletes stay deleted across shards while others search (with
//! centroids moving between shards), a miss in flight during a delete does not bring the
//! id back, and a flood gets BUSY instead of growing queues. Bounded in time and requests.

#[path = "akerd_common/mod.rs"]
mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use aker::client::{ClientOptions, Pipeline};
use aker::config::{BackendKind, DataSource};
use aker::protocol::{FillCandidate, HitKind, Reply, Request, SearchRequest, Status};
use aker::service::{Daemon, StartPlan};
use common::*;
use rand::{Rng, SeedableRng};

/// Deletes acknowledged so far: id -> its place in acknowledgement order.
#[derive(Default)]
struct Acked {
    order: Mutex<HashMap<u64, u64>>,
    count: AtomicU64,
}

#[test]
fn a_deleted_id_never_comes_back_across_shards() {
    const RUN: Duration = Duration::from_millis(2500);
    const SEARCHES_MAX: u64 = 4_000;
    const DELETES_MAX: u64 = 300;
    let ds = dataset();
    let mut cfg = config();
    // Centroids move between shards while this runs.
    cfg.sharding.rebalance_ms = 20;
    cfg.cache.filter = shards::FilterKind::default();
    let d = start(&cfg);
    let addr = d.local_addr();
    // 80 centres with 3 near variants each: exact, approximate and alias hits all occur.
    let queries: Arc<Vec<Vec<f32>>> = Arc::new(
        (0..80)
            .flat_map(|i| {
                let base = query_near(&ds, i * 37, 0.01);
                (0..4).map(move |j| base.iter().map(|x| x + j as f32 * 1e-4).collect())
            })
            .collect(),
    );
    let acked = Arc::new(Acked::default());
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();

    let searchers: Vec<_> = (0..2)
        .map(|t| {
            let (queries, acked, stop) = (queries.clone(), acked.clone(), stop.clone());
            thread::spawn(move || {
                let mut c = client(addr);
                let mut rng = rand::rngs::StdRng::seed_from_u64(t);
                let mut kinds = [0u64; 4];
                let mut n = 0;
                while !stop.load(Ordering::Relaxed)
                    && n < SEARCHES_MAX
                    && started.elapsed() < 2 * RUN
                {
                    n += 1;
                    let q = &queries[rng.gen_range(0..queries.len())];
                    let seen = acked.count.load(Ordering::Acquire);
                    let r = c.search(K, q).unwrap();
                    kinds[r.hit.code() as usize] += 1;
                    assert_eq!(r.neighbors.len(), K as usize);
                    let order = acked.order.lock().unwrap();
                    for id in ids(&r) {
                        if let Some(&i) = order.get(&id) {
                            assert!(
                                i >= seen,
                                "id {id} returned after its delete was acknowledged ({:?})",
                                r.hit
                            );
                        }
                    }
                }
                kinds
            })
        })
        .collect();

    let deleter = {
        let (queries, acked) = (queries.clone(), acked.clone());
        thread::spawn(move || {
            let mut c = client(addr);
            let mut rng = rand::rngs::StdRng::seed_from_u64(99);
            let mut deletes = 0;
            while started.elapsed() < RUN && deletes < DELETES_MAX {
                // Delete what a cached answer holds, so hits must change.
                let q = &queries[rng.gen_range(0..queries.len())];
                let r = c.search(K, q).unwrap();
                let id = r.neighbors[rng.gen_range(0..r.neighbors.len())].id;
                if acked.order.lock().unwrap().contains_key(&id) {
                    continue;
                }
                assert!(c.delete(id).unwrap(), "id {id} existed");
                deletes += 1;
                let mut order = acked.order.lock().unwrap();
                let n = acked.count.load(Ordering::Relaxed);
                order.insert(id, n);
                acked.count.store(n + 1, Ordering::Release);
                drop(order);
                thread::sleep(Duration::from_millis(2));
            }
            deletes
        })
    };
    let deletes = deleter.join().unwrap();
    stop.store(true, Ordering::Relaxed);
    let mut kinds = [0u64; 4];
    for s in searchers {
        for (a, b) in kinds.iter_mut().zip(s.join().unwrap()) {
            *a += b;
        }
    }
    // Afterwards nothing deleted is served by any shard.
    let mut c = client(addr);
    let deleted: Vec<u64> = acked.order.lock().unwrap().keys().copied().collect();
    for q in queries.iter() {
        let r = c.search(K, q).unwrap();
        assert!(ids(&r).iter().all(|id| !deleted.contains(id)), "{r:?}");
    }
    let stats = c.stats().unwrap();
    eprintln!("deletes {deletes}, hit kinds (miss, exact, alias, approx) {kinds:?}");
    assert!(deletes > 20, "{deletes} deletes");
    assert!(kinds[1] > 0 && kinds[0] > 0, "{kinds:?}");
    assert!(stat(&stats, "router_rebalances").unwrap() > 0.0, "{stats}");
    d.stop().unwrap();
}

#[test]
fn a_miss_in_flight_during_a_delete_does_not_bring_the_id_back() {
    let ds = dataset();
    let mut cfg = config();
    cfg.backend.threads = 2;
    let (store, searches) = SlowStore::boxed(&ds, Duration::from_millis(80));
    let d = Daemon::start_plan(&cfg, StartPlan::embedded(ds.clone(), store)).unwrap();
    let addr = d.local_addr();
    // Several search/delete pairs at once, each on its own query.
    let pairs: Vec<_> = (0..4)
        .map(|p| {
            let ds = ds.clone();
            thread::spawn(move || {
                for round in 0..3 {
                    let q = query_near(&ds, 100 + p * 500 + round * 31, 0.01);
                    let victim = exact_ids(&ds, &q, K as usize)[0];
                    let miss = {
                        let q = q.clone();
                        thread::spawn(move || client(addr).search(K, &q).unwrap())
                    };
                    // The search is inside the slow backend now.
                    thread::sleep(Duration::from_millis(20));
                    let mut c = client(addr);
                    assert!(c.delete(victim).unwrap());
                    // Acknowledged: from here on no reply may hold it, whatever the
                    // in-flight miss admits.
                    let r = miss.join().unwrap();
                    assert_eq!(r.hit, HitKind::Miss);
                    for _ in 0..5 {
                        let r = c.search(K, &q).unwrap();
                        assert!(
                            !ids(&r).contains(&victim),
                            "deleted {victim} came back: {r:?}"
                        );
                        assert_eq!(r.neighbors.len(), K as usize);
                    }
                }
            })
        })
        .collect();
    for p in pairs {
        p.join().unwrap();
    }
    assert!(searches.load(Ordering::Relaxed) >= 12);
    d.stop().unwrap();
}

#[test]
fn cache_aside_fill_after_a_delete_strips_the_deleted_id() {
    // The deterministic form of the rule: the miss ticket is taken before the client
    // asks its database; a delete acknowledged before the FILL is stripped from it.
    let mut cfg = config();
    cfg.backend.kind = BackendKind::CacheAside;
    cfg.backend.data = DataSource::None { dim: DIM };
    let d = start(&cfg);
    let mut c = client(d.local_addr());
    let q: Vec<f32> = (0..DIM).map(|i| i as f32).collect();
    assert_eq!(c.search(K, &q).unwrap().hit, HitKind::Miss);
    // The client's database answered (k + Δ = 8), then id 7 is deleted.
    let cands = db_answer(&q, 7, 8);
    assert!(!c.delete(7).unwrap(), "not cached yet");
    assert!(c.fill(&q, K, cands).unwrap());
    let hit = search_until(&mut c, &q, HitKind::Exact);
    assert_eq!(
        ids(&hit),
        vec![8, 9, 10, 11, 12],
        "7 was stripped at admission"
    );
    d.stop().unwrap();
}

/// A cache-aside client's database answer for `q`: `n` candidates from id `first` on,
/// ascending by distance.
fn db_answer(q: &[f32], first: u64, n: u64) -> Vec<FillCandidate> {
    (0..n)
        .map(|i| FillCandidate {
            id: first + i,
            distance: 1.0 + i as f32,
            vector: q.iter().map(|x| x + 1.0 + i as f32).collect(),
        })
        .collect()
}

#[test]
fn cache_aside_fill_never_readmits_a_deleted_id() {
    // Defect 1 of #25: DELETE x, then a FILL whose answer holds x with no SEARCH miss
    // before it was admitted, and x then served as an EXACT hit.
    let mut cfg = config();
    cfg.backend.kind = BackendKind::CacheAside;
    cfg.backend.data = DataSource::None { dim: DIM };
    let d = start(&cfg);
    let mut c = client(d.local_addr());
    let answer = |q: &[f32], first: u64| db_answer(q, first, 8);
    // No miss before the FILL (another connection, no token): the logged delete of 7 is
    // stripped.
    let q: Vec<f32> = (0..DIM).map(|i| i as f32 * 2.0).collect();
    assert!(!c.delete(7).unwrap());
    let mut other = client(d.local_addr());
    assert!(other.fill(&q, K, answer(&q, 7)).unwrap());
    let hit = search_until(&mut c, &q, HitKind::Exact);
    assert!(
        !ids(&hit).contains(&7),
        "deleted id re-admitted: {:?}",
        ids(&hit)
    );
    // With the MISS reply's token, on another connection: the delete between the miss
    // and the FILL is stripped too.
    let q2: Vec<f32> = (0..DIM).map(|i| i as f32 * -3.0).collect();
    let miss = c.search(K, &q2).unwrap();
    assert_eq!(miss.hit, HitKind::Miss);
    let token = miss
        .token
        .expect("a version 2 MISS in cache-aside carries a token");
    assert!(!c.delete(107).unwrap());
    assert!(other
        .fill_token(&q2, K, answer(&q2, 107), Some(token))
        .unwrap());
    let hit = search_until(&mut c, &q2, HitKind::Exact);
    assert!(!ids(&hit).contains(&107), "{:?}", ids(&hit));
    // A forged token (another epoch, a future seq, a shard not here) counts as none:
    // the logged deletes are stripped all the same.
    let q3: Vec<f32> = (0..DIM).map(|i| i as f32 * 7.0).collect();
    assert!(!c.delete(300).unwrap());
    assert!(other
        .fill_token(&q3, K, answer(&q3, 300), Some(u64::MAX))
        .unwrap());
    let hit = search_until(&mut c, &q3, HitKind::Exact);
    assert!(!ids(&hit).contains(&300), "{:?}", ids(&hit));
    // A wider k for a cached query: the MISS's FILL replaces the entry (version 2 too).
    let wide = c.search(2 * K, &q2).unwrap();
    assert_eq!(wide.hit, HitKind::Miss);
    let cands = db_answer(&q2, 500, 2 * K as u64 + 3);
    assert!(other.fill_token(&q2, 2 * K, cands, wide.token).unwrap());
    let end = Instant::now() + Duration::from_secs(5);
    let r = loop {
        let r = c.search(2 * K, &q2).unwrap();
        if r.hit == HitKind::Exact || Instant::now() > end {
            break r;
        }
    };
    assert_eq!((r.hit, r.neighbors.len()), (HitKind::Exact, 2 * K as usize));
    d.stop().unwrap();
}

#[test]
fn a_fill_without_a_token_is_declined_once_the_delete_log_wrapped() {
    let mut cfg = config();
    cfg.backend.kind = BackendKind::CacheAside;
    cfg.backend.data = DataSource::None { dim: DIM };
    cfg.cache.delete_log_cap = 4;
    let d = start(&cfg);
    let mut c = client(d.local_addr());
    for id in 0..10 {
        c.delete(1_000 + id).unwrap();
    }
    let q: Vec<f32> = (0..DIM).map(|i| i as f32 * 5.0).collect();
    let cands = db_answer(&q, 50, 8);
    // Deletes older than the log's window could be in the answer: declined.
    assert!(!c.fill(&q, K, cands.clone()).unwrap());
    // A miss's token is within the window: admitted.
    let token = c.search(K, &q).unwrap().token;
    assert!(c.fill_token(&q, K, cands, token).unwrap());
    d.stop().unwrap();
}

#[test]
fn a_token_from_before_a_restart_counts_as_none() {
    let mut cfg = config();
    cfg.backend.kind = BackendKind::CacheAside;
    cfg.backend.data = DataSource::None { dim: DIM };
    let q: Vec<f32> = (0..DIM).map(|i| i as f32 * 11.0).collect();
    let d = start(&cfg);
    let mut c = client(d.local_addr());
    for id in 0..5 {
        c.delete(10_000 + id).unwrap();
    }
    let token = c.search(K, &q).unwrap().token; // at delete seq 5
    assert!(token.is_some());
    d.stop().unwrap();
    // A new process: its delete log starts at 0 again. 900 is deleted at seq 1, then five
    // more: taken for this process's, the old token (seq 5) would strip only seq 6.
    let d = start(&cfg);
    let mut c = client(d.local_addr());
    assert!(!c.delete(900).unwrap());
    for id in 0..5 {
        c.delete(20_000 + id).unwrap();
    }
    let cands = db_answer(&q, 900, 8);
    assert!(client(d.local_addr())
        .fill_token(&q, K, cands, token)
        .unwrap());
    let hit = search_until(&mut c, &q, HitKind::Exact);
    assert!(!ids(&hit).contains(&900), "{:?}", ids(&hit));
    d.stop().unwrap();
}

#[test]
fn a_version_1_cache_aside_client_gets_version_1_bytes() {
    // The version 1 decoder is strict: a MISS with the version 2 TOKEN flag, or a HELLO
    // with Δ, would fail to decode here.
    let mut cfg = config();
    cfg.backend.kind = BackendKind::CacheAside;
    cfg.backend.data = DataSource::None { dim: DIM };
    let d = start(&cfg);
    let v1 = ClientOptions {
        version: 1,
        ..Default::default()
    };
    let mut c = aker::client::Client::connect_with(d.local_addr(), v1).unwrap();
    assert_eq!(c.hello().unwrap().delta, None);
    let q: Vec<f32> = (0..DIM).map(|i| i as f32 * 13.0).collect();
    let miss = c.search(K, &q).unwrap();
    assert_eq!((miss.hit, miss.token), (HitKind::Miss, None));
    let cands = db_answer(&q, 700, 8);
    assert!(!c.delete(700).unwrap());
    assert!(
        c.fill(&q, K, cands).unwrap(),
        "the pending ticket of the miss"
    );
    let hit = search_until(&mut c, &q, HitKind::Exact);
    assert!(!ids(&hit).contains(&700));
    d.stop().unwrap();
}

#[test]
fn a_version_1_client_keeps_working() {
    let d = start(&config());
    let mut c = aker::client::Client::connect_with(
        d.local_addr(),
        aker::client::ClientOptions {
            version: 1,
            ..Default::default()
        },
    )
    .unwrap();
    let h = c.hello().unwrap();
    assert_eq!(
        (h.version_max, h.delta, c.version()),
        (aker::protocol::VERSION, None, 1)
    );
    let q: Vec<f32> = (0..DIM).map(|i| i as f32 * 0.3).collect();
    let miss = c.search(K, &q).unwrap();
    assert_eq!((miss.hit, miss.token), (HitKind::Miss, None));
    let hit = search_until(&mut c, &q, HitKind::Exact);
    assert_eq!(hit.neighbors.len(), K as usize);
    c.insert(9_999_999, &q).unwrap();
    assert!(c.delete(9_999_999).unwrap());
    assert!(c.stats().unwrap().contains("lookups"));
    d.stop().unwrap();
}

/// Sends `n` distinct searches (misses) on one connection with a window far above
/// the server's `max_inflight`; returns the reply statuses.
fn flood(
    addr: std::net::SocketAddr,
    ds: &aker::service::Dataset,
    n: usize,
    seed: u64,
) -> HashMap<Status, u64> {
    const WINDOW: usize = 256;
    let opts = ClientOptions {
        io_timeout: Some(Duration::from_secs(10)),
        ..Default::default()
    };
    let mut p = Pipeline::connect_with(addr, WINDOW, opts).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut statuses: HashMap<Status, u64> = HashMap::new();
    let mut take = |p: &mut Pipeline| {
        let (_, reply) = p.recv().unwrap();
        let s = match reply {
            Reply::Search(_) => Status::Ok,
            r => r.status(),
        };
        *statuses.entry(s).or_default() += 1;
    };
    for _ in 0..n {
        while p.in_flight() + p.ready() >= WINDOW {
            take(&mut p);
        }
        let q = query_near(ds, rng.gen_range(0..ds.len()), rng.gen_range(0.01..0.1));
        p.send(Request::Search(SearchRequest::new(K, q))).unwrap();
    }
    while p.in_flight() + p.ready() > 0 {
        take(&mut p);
    }
    statuses
}

fn check_flood(total: &HashMap<Status, u64>, n: u64) {
    eprintln!("flood replies: {total:?}");
    assert_eq!(total.values().sum::<u64>(), n, "every request answered");
    assert!(
        total.get(&Status::Busy).copied().unwrap_or(0) > 0,
        "{total:?}"
    );
    assert!(
        total.get(&Status::Ok).copied().unwrap_or(0) > 0,
        "{total:?}"
    );
    assert_eq!(total.len(), 2, "only OK and BUSY: {total:?}");
}

#[test]
fn a_flood_gets_busy_and_queues_stay_bounded() {
    let ds = dataset();
    // 1. Past max_inflight on a connection: the connection layer answers BUSY.
    let mut cfg = config();
    cfg.server.max_inflight = 8;
    cfg.backend.threads = 1;
    cfg.backend.queue_depth = 64;
    let (store, _) = SlowStore::boxed(&ds, Duration::from_millis(5));
    let d = Daemon::start_plan(&cfg, StartPlan::embedded(ds.clone(), store)).unwrap();
    check_flood(&flood(d.local_addr(), &ds, 300, 1), 300);
    let mut c = client(d.local_addr());
    let stats = c.stats().unwrap();
    assert!(
        stat(&stats, "server_busy_inflight").unwrap() > 0.0,
        "{stats}"
    );
    assert_eq!(stat(&stats, "backend_busy"), Some(0.0), "{stats}");
    d.stop().unwrap();

    // 2. Past the backend queue: the service answers BUSY instead of queueing more.
    cfg.server.max_inflight = 64;
    cfg.backend.queue_depth = 2;
    let (store, _) = SlowStore::boxed(&ds, Duration::from_millis(5));
    let d = Daemon::start_plan(&cfg, StartPlan::embedded(ds.clone(), store)).unwrap();
    let addr = d.local_addr();
    let floods: Vec<_> = (0..2)
        .map(|seed| {
            let ds = ds.clone();
            thread::spawn(move || flood(addr, &ds, 200, seed))
        })
        .collect();
    let mut total: HashMap<Status, u64> = HashMap::new();
    for f in floods {
        for (s, n) in f.join().unwrap() {
            *total.entry(s).or_default() += n;
        }
    }
    check_flood(&total, 400);
    let mut c = client(addr);
    c.ping().unwrap();
    let stats = c.stats().unwrap();
    assert!(stat(&stats, "backend_busy").unwrap() > 0.0, "{stats}");
    assert!(stat(&stats, "backend_queue_len").unwrap() <= 2.0);
    // Still answering normally.
    let q = query_near(&ds, 1, 0.01);
    assert_eq!(c.search(K, &q).unwrap().neighbors.len(), K as usize);
    d.stop().unwrap();
}
