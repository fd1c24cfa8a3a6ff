//! akerd's service end to end over loopback: the engine behind the connection layer on
//! 2 executors (4 shards), driven through the blocking client.

#[path = "akerd_common/mod.rs"]
mod common;

use std::io::{Read, Write};
use std::time::Duration;

use aker::config::{BackendKind, DataSource};
use aker::protocol::{FillCandidate, HitKind, SearchRequest, Status};
use common::*;
use shards::Metric;

#[test]
fn hello_reports_the_topology() {
    let d = start(&config());
    let c = client(d.local_addr());
    let h = c.server_info().copied().unwrap();
    assert_eq!(
        (h.dim, h.k_max, h.executors, h.shards),
        (DIM as u32, 32, 2, 4)
    );
    assert_eq!(h.metric, Metric::L2Sq);
    d.stop().unwrap();
}

/// The paper's policy with vectors kept: an approximate hit is re-ranked for the
/// request, and its repeat is an alias hit.
#[test]
fn miss_then_exact_then_approximate_then_alias() {
    let ds = dataset();
    let mut cfg = config();
    cfg.cache.policy = shards::PolicyConfig::default();
    cfg.cache.eviction = shards::Eviction::Fifo;
    cfg.cache.store_vectors = true;
    let d = start(&cfg);
    let mut c = client(d.local_addr());
    let q = query_near(&ds, 100, 0.01);

    let miss = c.search(K, &q).unwrap();
    assert_eq!(miss.hit, HitKind::Miss);
    assert_eq!(
        ids(&miss),
        exact_ids(&ds, &q, K as usize),
        "the backend's exact top-k"
    );
    assert!(miss.distances_to_query);

    let exact = search_until(&mut c, &q, HitKind::Exact);
    assert_eq!(
        ids(&exact),
        ids(&miss),
        "an exact hit returns the cached answer"
    );

    // A query well inside the entry's threshold (minD / 4; here 1% of minD away).
    let min_d = miss.neighbors[0].distance;
    let eps = (min_d.sqrt() * 0.1) / (DIM as f32).sqrt();
    let near: Vec<f32> = q.iter().map(|x| x + eps).collect();
    let approx = c.search(K, &near).unwrap();
    assert_eq!(approx.hit, HitKind::Approximate);
    assert_eq!(approx.neighbors.len(), K as usize);
    assert!(
        approx.distances_to_query,
        "vectors are stored: re-ranked for the request"
    );
    assert!(approx
        .neighbors
        .windows(2)
        .all(|w| w[0].distance <= w[1].distance));
    let mut got = ids(&approx);
    let mut want = exact_ids(&ds, &near, K as usize);
    got.sort_unstable();
    want.sort_unstable();
    assert_eq!(got, want, "so close a query has the same neighbours");

    // The approximate hit linked an alias (owner side, asynchronously).
    let alias = search_until(&mut c, &near, HitKind::Alias);
    assert_eq!(ids(&alias), ids(&approx));
    d.stop().unwrap();
}

#[test]
fn an_insert_shows_up_through_the_fast_path() {
    let ds = dataset();
    let d = start(&config());
    let mut c = client(d.local_addr());
    let q = query_near(&ds, 200, 0.01);
    let first = c.search(K, &q).unwrap();
    search_until(&mut c, &q, HitKind::Exact);

    // Closer to q than anything in the collection.
    let v: Vec<f32> = q.iter().map(|x| x + 1e-4).collect();
    c.insert(50_000, &v).unwrap();
    // The reply came after every owner applied it: the very next lookup sees it.
    let after = c.search(K, &q).unwrap();
    assert_eq!(after.hit, HitKind::Exact);
    assert_eq!(after.neighbors[0].id, 50_000, "{after:?}");
    assert_eq!(&ids(&after)[1..], &ids(&first)[..K as usize - 1]);
    // And the backend has it.
    let bypass = c
        .search_with(SearchRequest {
            bypass_cache: true,
            ..SearchRequest::new(1, v.clone())
        })
        .unwrap();
    assert_eq!(
        (bypass.hit, bypass.neighbors[0].id),
        (HitKind::Miss, 50_000)
    );
    let stats = c.stats().unwrap();
    assert!(stat(&stats, "fast_path_updates").unwrap() >= 1.0, "{stats}");
    d.stop().unwrap();
}

#[test]
fn a_delete_is_gone_from_cache_and_backend_once_acknowledged() {
    let ds = dataset();
    let d = start(&config());
    let mut c = client(d.local_addr());
    let q = query_near(&ds, 300, 0.01);
    let miss = c.search(K, &q).unwrap();
    search_until(&mut c, &q, HitKind::Exact);
    let victim = miss.neighbors[0].id;
    assert!(c.delete(victim).unwrap(), "existed");
    assert!(!c.delete(victim).unwrap(), "gone");
    assert!(!c.delete(9_999_999).unwrap());
    for _ in 0..20 {
        let r = c.search(K, &q).unwrap();
        assert!(!ids(&r).contains(&victim), "{r:?}");
        // Δ = 3 reserves: the entry promoted one and stays an exact hit.
        assert_eq!(r.hit, HitKind::Exact);
        assert_eq!(r.neighbors.len(), K as usize);
    }
    let stats = c.stats().unwrap();
    assert!(stat(&stats, "delete_repairs").unwrap() >= 1.0, "{stats}");
    d.stop().unwrap();
}

#[test]
fn bypass_refresh_and_flush() {
    let ds = dataset();
    let d = start(&config());
    let mut c = client(d.local_addr());
    let q = query_near(&ds, 400, 0.01);
    let bypass = SearchRequest {
        bypass_cache: true,
        ..SearchRequest::new(K, q.clone())
    };
    for _ in 0..3 {
        assert_eq!(c.search_with(bypass.clone()).unwrap().hit, HitKind::Miss);
    }
    let stats = c.stats().unwrap();
    assert_eq!(stat(&stats, "lookups"), Some(0.0), "bypass reads no cache");
    assert_eq!(stat(&stats, "searches_bypass"), Some(3.0));
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(
        c.search(K, &q).unwrap().hit,
        HitKind::Miss,
        "and fills none"
    );

    search_until(&mut c, &q, HitKind::Exact);
    let refresh = SearchRequest {
        refresh_entry: true,
        ..SearchRequest::new(K, q.clone())
    };
    assert_eq!(c.search_with(refresh).unwrap().hit, HitKind::Miss);
    search_until(&mut c, &q, HitKind::Exact);

    c.flush().unwrap();
    assert_eq!(c.search(K, &q).unwrap().hit, HitKind::Miss, "flushed");
    d.stop().unwrap();
}

#[test]
fn fill_in_cache_aside_mode() {
    let mut cfg = config();
    cfg.backend.kind = BackendKind::CacheAside;
    cfg.backend.data = DataSource::None { dim: DIM };
    let d = start(&cfg);
    let mut c = client(d.local_addr());
    let q: Vec<f32> = (0..DIM).map(|i| i as f32 * 0.1).collect();
    let miss = c.search(K, &q).unwrap();
    assert_eq!((miss.hit, miss.neighbors.len()), (HitKind::Miss, 0));

    // The client asked its own database: k + Δ neighbours, ascending.
    let cands: Vec<FillCandidate> = (0..K as u64 + 3)
        .map(|i| FillCandidate {
            id: 100 + i,
            distance: 0.5 + i as f32,
            vector: q.iter().map(|x| x + 0.1 + i as f32 * 0.1).collect(),
        })
        .collect();
    assert!(c.fill(&q, K, cands.clone()).unwrap(), "admitted");
    let hit = search_until(&mut c, &q, HitKind::Exact);
    assert_eq!(ids(&hit), (100..100 + K as u64).collect::<Vec<_>>());
    // Again: already cached, not admitted twice.
    assert!(!c.fill(&q, K, cands.clone()).unwrap());
    // Too few to serve k: declined.
    let q2: Vec<f32> = q.iter().map(|x| x + 5.0).collect();
    assert!(!c.fill(&q2, K, cands[..2].to_vec()).unwrap());
    // DELETE in cache-aside: "existed" is whether the cache held it.
    assert!(c.delete(100).unwrap());
    assert!(!c.delete(100).unwrap());
    let r = c.search(K, &q).unwrap();
    assert!(!ids(&r).contains(&100));
    let stats = c.stats().unwrap();
    assert_eq!(stat(&stats, "fills_admitted"), Some(1.0), "{stats}");
    d.stop().unwrap();

    // FILL without a cache-aside backend.
    let d = start(&config());
    let mut c = client(d.local_addr());
    let err = c.fill(&q, K, cands).unwrap_err();
    assert_eq!(err.status(), Some(Status::Unsupported));
    d.stop().unwrap();
}

#[test]
fn stats_and_metrics_answer_with_the_counters() {
    let ds = dataset();
    let d = start(&config());
    let mut c = client(d.local_addr());
    for i in 0..20 {
        let q = query_near(&ds, i * 7, 0.01);
        c.search(K, &q).unwrap();
        search_until(&mut c, &q, HitKind::Exact);
    }
    let stats = c.stats().unwrap();
    for name in [
        "executors",
        "shards",
        "lookups",
        "hits_exact",
        "hits_alias",
        "hits_approximate",
        "misses",
        "admissions",
        "evictions",
        "invalidations",
        "slow_path_steps",
        "pool_objects",
        "pool_bytes",
        "shard_pool_objects_0",
        "shard_pool_bytes_3",
        "shard_queue_len_1",
        "hints_dropped",
        "latency_search_exact_count",
        "latency_search_exact_p50_us",
        "latency_search_miss_p99_us",
        "latency_backend_search_p50_us",
        "requests_search",
        "server_requests",
    ] {
        assert!(stat(&stats, name).is_some(), "STATS lacks {name}:\n{stats}");
    }
    assert_eq!(stat(&stats, "shards"), Some(4.0));
    assert!(stat(&stats, "misses").unwrap() >= 20.0);
    assert!(stat(&stats, "hits_exact").unwrap() >= 20.0);
    assert!(stat(&stats, "admissions").unwrap() >= 20.0);
    assert!(stat(&stats, "pool_objects").unwrap() > 0.0);

    let admin = d.admin_addr().expect("admin endpoint");
    let get = |path: &str| {
        let mut s = std::net::TcpStream::connect(admin).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    };
    let m = get("/metrics");
    assert!(m.starts_with("HTTP/1.1 200 OK"), "{m}");
    for needle in [
        "# TYPE aker_hits_exact_total counter",
        "aker_misses_total ",
        "aker_shard_pool_objects{shard=\"0\"}",
        "aker_latency_seconds{op=\"search\",kind=\"exact\",quantile=\"0.99\"}",
        "aker_latency_seconds_count{op=\"search\",kind=\"miss\"}",
        "aker_server_requests_total",
        "aker_server_connections_current 1",
    ] {
        assert!(m.contains(needle), "/metrics lacks {needle}:\n{m}");
    }
    assert!(get("/nope").starts_with("HTTP/1.1 404"));
    assert!(get("/healthz").ends_with("ok\n"));
    d.stop().unwrap();
}

#[test]
fn bad_input_gets_its_status_and_the_server_stays_up() {
    let ds = dataset();
    let d = start(&config());
    let mut c = client(d.local_addr());
    let q = query_near(&ds, 5, 0.01);
    let status = |c: &mut aker::client::Client, req: SearchRequest| {
        c.search_with(req).unwrap_err().status().unwrap()
    };
    assert_eq!(
        status(&mut c, SearchRequest::new(K, vec![0.0; DIM + 1])),
        Status::DimMismatch
    );
    let mut nan = q.clone();
    nan[3] = f32::NAN;
    assert_eq!(
        status(&mut c, SearchRequest::new(K, nan.clone())),
        Status::NonFinite
    );
    assert_eq!(
        status(&mut c, SearchRequest::new(0, q.clone())),
        Status::BadK
    );
    assert_eq!(
        status(&mut c, SearchRequest::new(33, q.clone())),
        Status::BadK
    );
    assert_eq!(
        status(
            &mut c,
            SearchRequest {
                collection: 7,
                ..SearchRequest::new(K, q.clone())
            }
        ),
        Status::UnknownCollection
    );
    assert_eq!(
        c.insert(1, &[1.0; DIM + 2]).unwrap_err().status(),
        Some(Status::DimMismatch)
    );
    assert_eq!(
        c.insert(1, &nan).unwrap_err().status(),
        Some(Status::NonFinite)
    );
    // Still serving, on the same connection and on a new one.
    assert_eq!(c.search(K, &q).unwrap().neighbors.len(), K as usize);
    let mut c2 = client(d.local_addr());
    c2.ping().unwrap();
    let stats = c2.stats().unwrap();
    assert!(
        stat(&stats, "server_invalid_requests").unwrap() >= 6.0,
        "{stats}"
    );
    assert!(
        stat(&stats, "errors_search").unwrap() >= 1.0,
        "UNKNOWN_COLLECTION is the service's"
    );
    d.stop().unwrap();
}

/// akerd's default (the guarded policy, ids only): an approximate hit reports distances
/// to the cached query, and its repeat is promoted to an entry of its own (a miss with
/// the exact answer, then exact hits), never an alias hit.
#[test]
fn by_default_a_repeated_approximate_request_gets_its_own_entry() {
    let ds = dataset();
    let d = start(&config());
    let mut c = client(d.local_addr());
    let q = query_near(&ds, 100, 0.01);
    assert_eq!(c.search(K, &q).unwrap().hit, HitKind::Miss);
    search_until(&mut c, &q, HitKind::Exact);

    let min_d = c.search(K, &q).unwrap().neighbors[0].distance;
    let eps = (min_d.sqrt() * 0.1) / (DIM as f32).sqrt();
    let near: Vec<f32> = q.iter().map(|x| x + eps).collect();
    let approx = c.search(K, &near).unwrap();
    assert_eq!(approx.hit, HitKind::Approximate);
    assert!(
        !approx.distances_to_query,
        "no vectors kept: the cached query's distances"
    );

    // The alias is linked asynchronously: until then a repeat is approximate again.
    let end = std::time::Instant::now() + Duration::from_secs(5);
    let promoted = loop {
        let r = c.search(K, &near).unwrap();
        assert_ne!(r.hit, HitKind::Alias, "the guarded policy promotes aliases");
        if r.hit != HitKind::Approximate {
            break r;
        }
        assert!(std::time::Instant::now() < end, "no promotion within 5 s");
        std::thread::sleep(Duration::from_millis(5));
    };
    assert_eq!(
        promoted.hit,
        HitKind::Miss,
        "the promoted repeat asks the backend"
    );
    assert_eq!(ids(&promoted), exact_ids(&ds, &near, K as usize));
    let own = search_until(&mut c, &near, HitKind::Exact);
    assert_eq!(ids(&own), ids(&promoted), "the repeat's own exact answer");
    let stats = c.stats().unwrap();
    assert!(stat(&stats, "alias_promotions").unwrap() >= 1.0, "{stats}");
    d.stop().unwrap();
}

#[test]
fn the_demo_runs_small_and_sees_every_kind() {
    let o = aker::demo::DemoOptions {
        n: 3_000,
        dim: 16,
        clusters: 16,
        groups: 100,
        requests: 3_000,
        ..Default::default()
    };
    let r = aker::demo::measure(&o).unwrap();
    assert_eq!(r.errors, 0);
    assert_eq!(r.total(), 3_000);
    let counts: Vec<u64> = r.kinds.iter().map(|k| k.count).collect();
    for kind in [HitKind::Miss, HitKind::Exact, HitKind::Approximate] {
        assert!(
            counts[kind.code() as usize] > 0,
            "no {kind:?} replies: {counts:?}"
        );
    }
    // akerd's default policy promotes an alias asked for again to an entry of its own.
    assert_eq!(counts[HitKind::Alias.code() as usize], 0, "{counts:?}");
    assert!(r.recall() > 0.9, "recall {}", r.recall());
    // Misses come from the exact store.
    assert!((r.kinds[0].recall_sum / r.kinds[0].count as f64) > 0.999);
}

/// The filter's standby generation is emptied in the owners' idle time (the STATS
/// gauges say so), and every query still cached stays findable through the filter.
#[test]
fn idle_time_empties_the_standby_filter_generation() {
    let ds = dataset();
    let mut cfg = config();
    cfg.cache.filter = shards::FilterKind::default(); // the graph, as deployed
    let d = start(&cfg);
    let mut c = client(d.local_addr());
    let sum = |stats: &str, family: &str| -> f64 {
        (0..4)
            .map(|s| stat(stats, &format!("{family}_{s}")).expect(family))
            .sum()
    };
    // Distinct misses until the shards have rotated their filters a few times (the
    // busiest shards do; traffic per shard is uneven).
    let mut sent = 0;
    loop {
        let s = c.stats().unwrap();
        if sum(&s, "shard_filter_rotations") >= 4.0 {
            break;
        }
        assert!(
            sent < 3000,
            "fewer than 4 rotations after {sent} misses:\n{s}"
        );
        for _ in 0..100 {
            c.search(K, &query_near(&ds, sent, 0.01)).unwrap();
            sent += 1;
        }
    }
    // Idle now: the standbys empty (bounded wait).
    let mut polls = 0;
    let stats = loop {
        let s = c.stats().unwrap();
        if sum(&s, "shard_filter_standby_live") == 0.0 {
            break s;
        }
        polls += 1;
        assert!(polls < 250, "standby never emptied:\n{s}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(sum(&stats, "shard_filter_standby_moved") > 0.0, "{stats}");
    // The queries still cached are found by the filter: a near copy is an approximate
    // hit (an exact hit only says the exact table has it). The graph search is
    // approximate, so a rare one may be missed; entries lost by moving would be many.
    let (mut cached, mut found) = (0, 0);
    for i in sent.saturating_sub(200)..sent {
        let q = query_near(&ds, i, 0.01);
        if c.search(K, &q).unwrap().hit != HitKind::Exact {
            continue;
        }
        cached += 1;
        let near = query_near(&ds, i, 0.0101);
        found += (c.search(K, &near).unwrap().hit == HitKind::Approximate) as usize;
    }
    assert!(cached >= 20, "only {cached} of the last 200 queries cached");
    assert!(
        found * 10 >= cached * 9,
        "{found} of {cached} cached queries found"
    );
    d.stop().unwrap();
}

#[test]
fn short_deadlines_answer_deadline_exceeded_never_unavailable() {
    // A miss whose deadline passes while it waits for a backend thread used to get
    // UNAVAILABLE ("the backend has stopped"): the job was dropped unanswered.
    let ds = dataset();
    let d = start(&config());
    let mut c = client(d.local_addr());
    let (mut answered, mut exceeded) = (0, 0);
    for i in 0..600usize {
        let deadline_us = [1, 2, 5, 10, 50, 100][i % 6];
        // Distinct queries far from each other's thresholds: misses.
        let q = query_near(&ds, (i * 7) % 3000, 0.2 + i as f32 * 1e-3);
        let r = c.search_with(SearchRequest {
            deadline_us,
            ..SearchRequest::new(K, q)
        });
        match r {
            Ok(_) => answered += 1,
            Err(e) if e.status() == Some(Status::DeadlineExceeded) => exceeded += 1,
            Err(e) => panic!("search {i}, deadline {deadline_us} µs: {e}"),
        }
    }
    eprintln!("{answered} answered, {exceeded} past their deadline");
    assert!(exceeded > 0, "1 µs deadlines are missed");
    c.ping().unwrap();
    d.stop().unwrap();
}

#[test]
fn a_router_rebalance_costs_no_hits() {
    // Moving a centroid used to strand its entries in the shard it left: cached queries
    // missed once each (129 of 200 in one run), and a pipelined burst got BUSY.
    //
    // A centroid moved twice before its entries age out still strands them
    // (docs/ARCHITECTURE.md, "Engine limits"): on a loaded machine one burst can span two
    // rebalance rounds. So an attempt with misses is made again on a fresh akerd (at
    // most 3); one clean attempt shows that a move costs no hits.
    let mut attempts = Vec::new();
    for _ in 0..3 {
        let (moved, misses) = one_rebalance();
        attempts.push((moved, misses));
        if misses == 0 {
            return;
        }
    }
    panic!("(moves, misses of 200) per attempt: {attempts:?}");
}

/// Caches 200 queries, loads a few until the router moves centroids, then looks every
/// query up again: (centroids moved, queries that missed).
fn one_rebalance() -> (f64, usize) {
    let ds = dataset();
    let mut cfg = config();
    cfg.sharding.rebalance_ms = 100;
    let d = start(&cfg);
    let mut c = client(d.local_addr());
    let cached: Vec<Vec<f32>> = (0..200).map(|i| query_near(&ds, i * 15, 0.02)).collect();
    for q in &cached {
        c.search(K, q).unwrap();
    }
    for q in &cached {
        let end = std::time::Instant::now() + Duration::from_secs(5);
        while c.search(K, q).unwrap().hit == HitKind::Miss {
            assert!(std::time::Instant::now() < end, "not admitted");
        }
    }
    // Skewed load on a few queries' centroids until the router moves some; checked
    // after every burst, so that the cached queries are looked up again before a
    // second rebalance can move a centroid on.
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut moved = 0.0;
    for _burst in 0..480 {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let q = &cached[(rng % 200) as usize];
        for _ in 0..50 {
            c.search(K, q).unwrap();
        }
        moved = stat(&c.stats().unwrap(), "router_centroids_moved").unwrap();
        if moved > 0.0 {
            break;
        }
    }
    assert!(moved > 0.0, "no centroid moved");
    let stats = c.stats().unwrap();
    assert!(
        stat(&stats, "router_previous_shards").unwrap() > 0.0,
        "{stats}"
    );
    let misses = (0..cached.len())
        .filter(|&i| c.search(K, &cached[i]).unwrap().hit == HitKind::Miss)
        .count();
    d.stop().unwrap();
    (moved, misses)
}

#[test]
fn k_is_a_request_parameter_through_akerd() {
    // An entry cached for k answers every smaller k from its prefix; a larger k misses
    // and refreshes it (PROTOCOL.md, SEARCH).
    let d = start(&config());
    let mut c = client(d.local_addr());
    let ds = dataset();
    let q = query_near(&ds, 3, 0.01);
    let first = c.search(K, &q).unwrap();
    assert_eq!(first.hit, HitKind::Miss);
    let full = search_until(&mut c, &q, HitKind::Exact);
    for k in 1..K {
        let r = c.search(k, &q).unwrap();
        assert_eq!(r.hit, HitKind::Exact, "k = {k}");
        assert_eq!(r.neighbors[..], full.neighbors[..k as usize], "k = {k}");
    }
    let wide = c.search(2 * K, &q).unwrap();
    assert_eq!(wide.hit, HitKind::Miss, "more than the entry holds");
    assert_eq!(wide.neighbors[..K as usize], full.neighbors[..]);
    // The admission of the wider answer is the owner's (asynchronous): bounded wait.
    let end = std::time::Instant::now() + Duration::from_secs(5);
    let again = loop {
        let r = c.search(2 * K, &q).unwrap();
        if r.hit == HitKind::Exact || std::time::Instant::now() > end {
            break r;
        }
    };
    assert_eq!(
        (again.hit, again.neighbors.len()),
        (HitKind::Exact, 2 * K as usize)
    );
    assert_eq!(again.neighbors[..], wide.neighbors[..]);
    let prefix = c.search(K, &q).unwrap();
    assert_eq!(
        (prefix.hit, &prefix.neighbors[..]),
        (HitKind::Exact, &full.neighbors[..])
    );
    d.stop().unwrap();
}

/// With the default configuration, an insert between two cached queries is in both
/// entries' next exact hits, on any of the 4 shards: the fast path merges it into the
/// nearest one the filter finds on the two nearest shards, and a hit on the other checks
/// it itself (issue #41).
#[test]
fn an_insert_is_in_every_entry_it_belongs_in() {
    let ds = dataset();
    let mut cfg = config();
    // No slow-path steps: what reaches qb is the fast path's and the hit's own check.
    cfg.cache.risk_threshold = 1e30;
    let d = start(&cfg);
    let mut c = client(d.local_addr());
    let mut next = 60_000u64;
    for row in (0..600).step_by(60) {
        // Two entries either side of the row: each misses the other's threshold.
        let qa = query_near(&ds, row, 0.002);
        let qb = query_near(&ds, row, -0.002);
        search_until(&mut c, &qa, HitKind::Exact);
        search_until(&mut c, &qb, HitKind::Exact);
        // Next to the row on qa's side: first for qa, second for qb (after the row).
        let v = query_near(&ds, row, 0.0002);
        next += 1;
        c.insert(next, &v).unwrap();
        let a = c.search(K, &qa).unwrap();
        assert_eq!((a.hit, a.neighbors[0].id), (HitKind::Exact, next), "{a:?}");
        let b = c.search(K, &qb).unwrap();
        assert_eq!(b.hit, HitKind::Exact, "{b:?}");
        let truth = c
            .search_with(SearchRequest {
                bypass_cache: true,
                ..SearchRequest::new(K, qb.clone())
            })
            .unwrap();
        assert!(
            ids(&truth).contains(&next),
            "the backend ranks it in qb's top-k"
        );
        assert_eq!(ids(&b), ids(&truth), "row {row}");
    }
    d.stop().unwrap();
}

/// Issue #41 as a client sees it, akerd's default filter (a small HNSW graph) and the
/// slow path off: an id inserted 1e-3 from a cached query is first in that query's next
/// answer, an exact hit, in every one of 1,000 tries, while a second connection searches
/// the other cached queries all along (AKER_TEST_TRIES=10000 for the count).
/// Each query has a cached twin between it and where the inserts go (asked twice: its
/// own entry), nearer to them: the fast path merges each insert into the twin, and the
/// query's own hit has to find it itself.
#[test]
fn an_acknowledged_insert_is_first_in_the_next_exact_hit_under_load() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let ds = dataset();
    let mut cfg = config();
    cfg.cache.risk_threshold = 1e30;
    cfg.cache.filter = shards::CacheConfig::default().filter;
    let d = start(&cfg);
    let mut c = client(d.local_addr());
    let cached: Vec<Vec<f32>> = (0..100).map(|i| query_near(&ds, i * 29, 0.01)).collect();
    let step = 1e-3 / (DIM as f32).sqrt();
    for q in &cached {
        search_until(&mut c, q, HitKind::Exact);
        let twin: Vec<f32> = q.iter().map(|x| x + 0.9 * step).collect();
        search_until(&mut c, &twin, HitKind::Exact);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let background = {
        let (mut other, stop, cached) = (client(d.local_addr()), stop.clone(), cached.clone());
        std::thread::spawn(move || {
            let mut n = 0usize;
            while !stop.load(Ordering::Relaxed) && n < 1_000_000 {
                other.search(K, &cached[n % cached.len()]).unwrap();
                n += 1;
            }
            n
        })
    };
    let (mut rng, mut next) = (0x2545_f491_4f6c_dd1du64, 70_000u64);
    for trial in 0..tries(1_000) {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let q = &cached[(rng % cached.len() as u64) as usize];
        let v: Vec<f32> = q.iter().map(|x| x + step).collect();
        next += 1;
        c.insert(next, &v).unwrap();
        let r = c.search(K, q).unwrap();
        assert_eq!(
            (r.hit, r.neighbors[0].id),
            (HitKind::Exact, next),
            "try {trial}: {r:?}"
        );
        // Gone again, so that the next try near the same query is the nearest again.
        c.delete(next).unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    assert!(background.join().unwrap() > 0);
    let s = c.stats().unwrap();
    assert_eq!(stat(&s, "hits_behind"), Some(0.0), "{s}");
    assert!(
        stat(&s, "hits_with_recent").unwrap() >= 100.0,
        "the hits' own check did the work: {s}"
    );
    d.stop().unwrap();
}

/// A STATS text longer than the frame limit is cut at a line and says so in its last
/// line, instead of failing as INTERNAL; under the default limit nothing is cut.
#[test]
fn stats_under_a_small_frame_limit_is_cut_and_says_so() {
    let mut cfg = config();
    cfg.server.max_frame_bytes = 2048;
    let d = start(&cfg);
    let mut c = client(d.local_addr());
    let text = c.stats().unwrap();
    assert!(text.len() <= 2048 - 20, "{} bytes", text.len());
    assert!(text.ends_with("\nserver_stats_truncated 1\n"), "{text}");
    assert!(text.lines().all(|l| l.split_once(' ').is_some()), "{text}");
    d.stop().unwrap();
    let d = start(&config());
    let mut c = client(d.local_addr());
    let text = c.stats().unwrap();
    assert!(text.len() > 2048 && !text.contains("server_stats_truncated"));
    d.stop().unwrap();
}
