//! akerd in front of a real PostgreSQL 18 + pgvector 0.8 (started by `ops/pg.sh` on
//! 127.0.0.1): answers equal pgvector's, hits, write-through, del-consistency under
//! concurrent searches, one order for writes to one id, the database going away and
//! coming back, and the refusals at start. Every loop is bounded in count and time.

#[path = "akerd_common/mod.rs"]
mod akerd_common;
#[path = "pg_common/mod.rs"]
mod pg_common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use aker::config::{BackendKind, Config};
use aker::protocol::{HitKind, InsertRequest, SearchRequest, Status};
use aker::service::{Daemon, Dataset};
use aker::testing::pgvector;
use aker_formats::data;
use akerd_common::{client, ids, query_near, search_until, stat, K};
use pg_common::{shared, PgServer};
use shards::Metric;

const DIM: usize = 8;

/// akerd's test configuration (tests/akerd_common) over a pgvector table.
fn config(pg: &PgServer, table: &str) -> Config {
    let mut c = akerd_common::config();
    c.backend.kind = BackendKind::Pgvector;
    c.backend.threads = 4;
    c.backend.pgvector = Some(pg.section(table));
    c
}

fn dataset() -> Dataset {
    data::synthetic(3000, DIM, 16, 11)
}

/// A table of the shared server's, loaded with `dataset()` and indexed with `opclass`.
fn table(name: &str, opclass: &str) -> Option<&'static PgServer> {
    let pg = shared()?;
    pg.sql().load(name, &dataset(), opclass);
    Some(pg)
}

/// Repeats `q` until it is a hit of any kind (admission is asynchronous); bounded.
fn search_until_hit(c: &mut aker::client::Client, q: &[f32]) {
    let end = Instant::now() + Duration::from_secs(5);
    while c.search(K, q).unwrap().hit == HitKind::Miss {
        assert!(Instant::now() < end, "no hit within 5 s");
        thread::sleep(Duration::from_millis(5));
    }
}

fn bypass(c: &mut aker::client::Client, q: &[f32], k: u32) -> aker::protocol::SearchReply {
    c.search_with(SearchRequest {
        bypass_cache: true,
        ..SearchRequest::new(k, q.to_vec())
    })
    .unwrap()
}

#[test]
fn bypassed_searches_equal_pgvector_in_the_cache_units_for_every_metric() {
    for (opclass, op, metric) in [
        ("vector_l2_ops", "<->", Metric::L2Sq),
        ("vector_ip_ops", "<#>", Metric::InnerProduct),
        ("vector_cosine_ops", "<=>", Metric::Cosine),
    ] {
        let name = format!("t_equal_{}", metric.name());
        let Some(pg) = table(&name, opclass) else {
            return;
        };
        let ds = dataset();
        let d = Daemon::start(&config(pg, &name)).expect("akerd starts on pgvector");
        let mut c = client(d.local_addr());
        assert_eq!(
            c.server_info().unwrap().metric,
            metric,
            "metric from {opclass}"
        );
        let sql = pg.sql();
        let ef = 40; // max(k_max + delta, 40): the test config's effective ef_search
        for i in 0..40 {
            let q = query_near(&ds, i * 71, 0.05);
            let got = bypass(&mut c, &q, K);
            let want = sql.knn(&name, op, &q, K as usize, ef);
            // The same rows (near-ties may swap: akerd orders by the cache's unit, then id).
            let mut got_ids = ids(&got);
            let mut want_ids: Vec<u64> = want.iter().map(|w| w.0).collect();
            got_ids.sort_unstable();
            want_ids.sort_unstable();
            assert_eq!(got_ids, want_ids, "{metric}");
            for (n, (_, pg_d)) in got.neighbors.iter().zip(&want) {
                let id = &n.id;
                // pgvector's unit converted (<-> squared), and the engine's kernel agree.
                let engine = metric.distance(&q, ds.row(*id as usize));
                let pg_unit = if metric == Metric::L2Sq {
                    pg_d * pg_d
                } else {
                    *pg_d
                };
                assert!((n.distance as f64 - pg_unit).abs() <= 1e-4 * (1.0 + pg_unit.abs()));
                assert!(
                    (n.distance - engine).abs() <= 1e-4 * (1.0 + engine.abs()),
                    "{metric}: id {id} akerd {} engine {engine}",
                    n.distance
                );
            }
        }
        d.stop().unwrap();
    }
}

#[test]
fn searches_use_the_hnsw_index() {
    let Some(pg) = table("t_plan", "vector_l2_ops") else {
        return;
    };
    let section = pg.section("t_plan");
    let (target, sample) = pgvector::start(&section, None, 32, 3, false, 1000).unwrap();
    assert_eq!((target.dim, target.metric), (DIM, Metric::L2Sq));
    assert_eq!(target.index, "t_plan_hnsw");
    assert!(sample.unwrap().len() >= 900, "a sample for the router");
    let sql = pg.sql();
    let plan = sql
        .run(pgvector::search_plan(
            &sql.client,
            &target,
            dataset().row(5),
            35,
        ))
        .unwrap();
    assert!(plan.contains("Index Scan using t_plan_hnsw"), "{plan}");
}

#[test]
fn exact_and_approximate_hits_come_from_the_cache() {
    let Some(pg) = table("t_hits", "vector_l2_ops") else {
        return;
    };
    let ds = dataset();
    let d = Daemon::start(&config(pg, "t_hits")).unwrap();
    let mut c = client(d.local_addr());
    let q = query_near(&ds, 100, 0.05);
    let first = c.search(K, &q).unwrap();
    assert_eq!(first.hit, HitKind::Miss);
    let hit = search_until(&mut c, &q, HitKind::Exact);
    assert_eq!(ids(&hit), ids(&first));
    // A near copy of the cached query: served by the filter within its threshold.
    let near: Vec<f32> = q.iter().map(|x| x + 1e-4).collect();
    let approx = search_until(&mut c, &near, HitKind::Approximate);
    assert_eq!(approx.neighbors.len(), K as usize);
    let stats = c.stats().unwrap();
    assert!(stat(&stats, "pg_connections_up").unwrap() >= 1.0, "{stats}");
    d.stop().unwrap();

    // store_vectors: misses fetch the rows' vectors, so approximate hits are re-ranked
    // for the request's own vector.
    let mut cfg = config(pg, "t_hits");
    cfg.cache.store_vectors = true;
    let d = Daemon::start(&cfg).unwrap();
    let mut c = client(d.local_addr());
    c.search(K, &q).unwrap();
    search_until(&mut c, &q, HitKind::Exact);
    let approx = search_until(&mut c, &near, HitKind::Approximate);
    assert!(
        approx.distances_to_query,
        "re-ranked with the fetched vectors"
    );
    for n in &approx.neighbors {
        let d = Metric::L2Sq.distance(&near, ds.row(n.id as usize));
        assert!(
            (n.distance - d).abs() <= 1e-4 * (1.0 + d),
            "{} vs {d}",
            n.distance
        );
    }
    d.stop().unwrap();
}

#[test]
fn a_short_answer_is_served_but_not_cached() {
    let Some(pg) = shared() else {
        return;
    };
    // 6 rows: a miss asks for k + Δ = 8.
    pg.sql()
        .load("t_short", &data::synthetic(6, DIM, 2, 5), "vector_l2_ops");
    let d = Daemon::start(&config(pg, "t_short")).unwrap();
    let mut c = client(d.local_addr());
    let q = vec![0.5; DIM];
    for _ in 0..3 {
        let r = c.search(K, &q).unwrap();
        assert_eq!((r.hit, r.neighbors.len()), (HitKind::Miss, K as usize));
        thread::sleep(Duration::from_millis(20));
    }
    let stats = c.stats().unwrap();
    assert_eq!(stat(&stats, "backend_short_answers"), Some(3.0), "{stats}");
    assert_eq!(stat(&stats, "admissions"), Some(0.0), "{stats}");
    d.stop().unwrap();
}

#[test]
fn a_slow_database_is_cancelled_at_the_deadline_and_holds_no_connection() {
    let Some(pg) = table("t_slow", "vector_l2_ops") else {
        return;
    };
    let ds = dataset();
    let d = Daemon::start(&config(pg, "t_slow")).unwrap();
    let addr = d.local_addr();
    // Another session holds the table: every search waits on its lock.
    let locker = pg.sql();
    locker.exec("BEGIN; LOCK TABLE t_slow IN ACCESS EXCLUSIVE MODE");
    let t = Instant::now();
    let waiting: Vec<_> = (0..8)
        .map(|i| {
            let q = query_near(&ds, 300 + i * 11, 0.3);
            thread::spawn(move || {
                let mut c = client(addr);
                c.search_with(SearchRequest {
                    deadline_us: 200_000,
                    ..SearchRequest::new(K, q)
                })
            })
        })
        .collect();
    for w in waiting {
        let e = w.join().unwrap().unwrap_err();
        assert_eq!(e.status(), Some(Status::DeadlineExceeded), "{e}");
    }
    // The four connections' statements were cancelled at their deadlines (the other four
    // requests' deadlines passed in the queue), with the lock still held: no akerd
    // session is left waiting on it.
    let mut c = client(addr);
    let end = Instant::now() + Duration::from_secs(1);
    while stat(&c.stats().unwrap(), "pg_statement_timeouts").unwrap() < 4.0 {
        assert!(Instant::now() < end, "statements not cancelled");
        thread::sleep(Duration::from_millis(5));
    }
    let active = |sql: &pg_common::Sql| {
        sql.query(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'akerd' \
             AND state = 'active'",
            &[],
        )[0]
        .get::<_, i64>(0)
    };
    let watcher = pg.sql();
    assert_eq!(active(&watcher), 0, "akerd statements still running");
    let waited = t.elapsed();
    assert!(waited < Duration::from_secs(4), "{waited:?}");
    locker.exec("COMMIT");
    // The connections were kept (a cancellation is not a lost connection).
    let r = c.search(K, &query_near(&ds, 999, 0.3)).unwrap();
    assert_eq!(r.neighbors.len(), K as usize);
    let stats = c.stats().unwrap();
    assert_eq!(stat(&stats, "pg_reconnects"), Some(0.0), "{stats}");
    d.stop().unwrap();
}

#[test]
fn a_write_through_insert_is_in_the_table_and_in_cached_answers() {
    let Some(pg) = table("t_insert", "vector_l2_ops") else {
        return;
    };
    let ds = dataset();
    let d = Daemon::start(&config(pg, "t_insert")).unwrap();
    let mut c = client(d.local_addr());
    let q = query_near(&ds, 200, 0.05);
    c.search(K, &q).unwrap();
    let before = search_until(&mut c, &q, HitKind::Exact);
    // Nearer to q than anything cached: the fast path puts it first.
    let v: Vec<f32> = q.iter().map(|x| x + 1e-3).collect();
    c.insert(90_001, &v).unwrap();
    let rows = pg
        .sql()
        .query("SELECT count(*) FROM t_insert WHERE id = 90001", &[]);
    assert_eq!(rows[0].get::<_, i64>(0), 1, "committed in PostgreSQL");
    let after = c.search(K, &q).unwrap();
    assert_eq!(
        after.hit,
        HitKind::Exact,
        "still a hit: the entry was refreshed"
    );
    assert_eq!(
        after.neighbors[0].id, 90_001,
        "{after:?} (before {before:?})"
    );
    // Replaced far away: no cached answer keeps it.
    let far: Vec<f32> = v.iter().map(|x| x + 50.0).collect();
    c.insert(90_001, &far).unwrap();
    assert!(!ids(&c.search(K, &q).unwrap()).contains(&90_001));
    d.stop().unwrap();
}

#[test]
fn ids_past_bigint_and_payloads_are_refused_or_stored() {
    let Some(pg) = table("t_ids", "vector_l2_ops") else {
        return;
    };
    let ds = dataset();
    let d = Daemon::start(&config(pg, "t_ids")).unwrap();
    let mut c = client(d.local_addr());
    let e = c.insert(u64::MAX, ds.row(0)).unwrap_err();
    assert_eq!(e.status(), Some(Status::BadRequest), "{e}");
    assert!(e.to_string().contains("i64::MAX"), "{e}");
    assert!(!c.delete(u64::MAX).unwrap(), "no such row can exist");
    let with_payload = InsertRequest {
        id: 7,
        collection: 0,
        vector: ds.row(0).to_vec(),
        payload: b"doc-7".to_vec(),
    };
    let e = c.insert_with(with_payload.clone()).unwrap_err();
    assert_eq!(e.status(), Some(Status::Unsupported), "{e}");
    d.stop().unwrap();

    let mut cfg = config(pg, "t_ids");
    cfg.backend.pgvector.as_mut().unwrap().payload_column = Some("payload".into());
    let d = Daemon::start(&cfg).unwrap();
    let mut c = client(d.local_addr());
    c.insert_with(with_payload).unwrap();
    let rows = pg
        .sql()
        .query("SELECT payload FROM t_ids WHERE id = 7", &[]);
    assert_eq!(rows[0].get::<_, Vec<u8>>(0), b"doc-7");
    d.stop().unwrap();
}

#[test]
fn a_deleted_id_is_never_served_after_its_acknowledgement() {
    const RUN: Duration = Duration::from_millis(2500);
    const DELETES_MAX: u64 = 150;
    let Some(pg) = table("t_delete", "vector_l2_ops") else {
        return;
    };
    let ds = dataset();
    let d = Daemon::start(&config(pg, "t_delete")).unwrap();
    let addr = d.local_addr();
    let queries: Arc<Vec<Vec<f32>>> =
        Arc::new((0..60).map(|i| query_near(&ds, i * 43, 0.02)).collect());
    // id -> its place in acknowledgement order.
    let acked: Arc<Mutex<HashMap<u64, u64>>> = Arc::default();
    let count = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let searchers: Vec<_> = (0..2u64)
        .map(|t| {
            let (queries, acked, count, stop) =
                (queries.clone(), acked.clone(), count.clone(), stop.clone());
            thread::spawn(move || {
                let mut c = client(addr);
                let (mut hits, mut n) = (0u64, 0u64);
                while !stop.load(Ordering::Relaxed) && n < 20_000 && started.elapsed() < 2 * RUN {
                    let q = &queries[((n * 7 + t) % queries.len() as u64) as usize];
                    n += 1;
                    let seen = count.load(Ordering::Acquire);
                    let r = c.search(K, q).unwrap();
                    hits += (r.hit != HitKind::Miss) as u64;
                    let acked = acked.lock().unwrap();
                    for id in ids(&r) {
                        if let Some(&i) = acked.get(&id) {
                            assert!(i >= seen, "id {id} served ({:?}) after its DELETE", r.hit);
                        }
                    }
                }
                hits
            })
        })
        .collect();
    let mut c = client(addr);
    let mut deletes = 0;
    while started.elapsed() < RUN && deletes < DELETES_MAX {
        let q = &queries[deletes as usize % queries.len()];
        let r = c.search(K, q).unwrap();
        let id = r.neighbors[deletes as usize % r.neighbors.len()].id;
        if acked.lock().unwrap().contains_key(&id) {
            deletes += 1;
            continue;
        }
        assert!(c.delete(id).unwrap(), "id {id} was in the table");
        let n = count.load(Ordering::Relaxed);
        acked.lock().unwrap().insert(id, n);
        count.store(n + 1, Ordering::Release);
        deletes += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let hits: u64 = searchers.into_iter().map(|s| s.join().unwrap()).sum();
    let gone = acked.lock().unwrap().len();
    let rows = pg.sql().query("SELECT count(*) FROM t_delete", &[]);
    assert_eq!(
        rows[0].get::<_, i64>(0) as usize,
        3000 - gone,
        "committed deletes"
    );
    eprintln!("{gone} deletes acknowledged, {hits} hits served meanwhile");
    assert!(gone > 20 && hits > 100, "{gone} deletes, {hits} hits");
    d.stop().unwrap();
}

#[test]
fn writes_to_one_id_from_two_clients_apply_in_one_order_everywhere() {
    let Some(pg) = table("t_order", "vector_l2_ops") else {
        return;
    };
    let ds = dataset();
    let mut cfg = config(pg, "t_order");
    cfg.cache.delta = 6;
    let d = Daemon::start(&cfg).unwrap();
    let addr = d.local_addr();
    const X: u64 = 77_777;
    // Two places for X, each with a cached query that would take it first.
    let qa = query_near(&ds, 10, 0.05);
    let qb = query_near(&ds, 2500, 0.05);
    let va: Vec<f32> = qa.iter().map(|x| x + 1e-3).collect();
    let vb: Vec<f32> = qb.iter().map(|x| x + 1e-3).collect();
    let sql = pg.sql();
    let mut hits = 0u64;
    for round in 0..6u64 {
        let mut c = client(addr);
        for q in [&qa, &qb] {
            c.search(K, q).unwrap();
            search_until(&mut c, q, HitKind::Exact);
        }
        let writers: Vec<_> = [va.clone(), vb.clone()]
            .into_iter()
            .enumerate()
            .map(|(w, v)| {
                thread::spawn(move || {
                    let mut c = client(addr);
                    for i in 0..40u64 {
                        if (i + round + w as u64) % 5 == 4 {
                            c.delete(X).unwrap();
                        } else {
                            c.insert(X, &v).unwrap();
                        }
                    }
                })
            })
            .collect();
        for w in writers {
            w.join().unwrap();
        }
        // The table's final state decides what every shard must hold for X.
        let row = sql.query(
            "SELECT embedding FROM t_order WHERE id = $1",
            &[&(X as i64)],
        );
        let stored: Option<Vec<f32>> = row.first().map(|r| r.get::<_, PgVector>(0).to_vec());
        for (q, v) in [(&qa, &va), (&qb, &vb)] {
            let r = c.search(K, q).unwrap();
            hits += (r.hit != HitKind::Miss) as u64;
            let x = r.neighbors.iter().find(|n| n.id == X);
            // X is q's nearest row exactly when the table holds it at q's place.
            let here = stored.as_ref() == Some(v);
            match x {
                None => assert!(!here, "round {round}: the table's X is q's nearest, {r:?}"),
                Some(n) => {
                    assert!(
                        here,
                        "round {round}: X served ({:?}) though the table's X is {}",
                        r.hit,
                        if stored.is_some() {
                            "elsewhere"
                        } else {
                            "deleted"
                        }
                    );
                    let want = Metric::L2Sq.distance(q, v);
                    assert!(
                        (n.distance - want).abs() <= 1e-3 * (1.0 + want),
                        "round {round}: X served at {} but the table's X is at {want}",
                        n.distance
                    );
                }
            }
        }
    }
    eprintln!("{hits} of 12 final searches were hits");
    assert!(
        hits > 0,
        "the final state was checked against cached answers, not only misses"
    );
    d.stop().unwrap();
}

/// `pgvector::Vector` under a name that reads as a type in a turbofish.
type PgVector = ::pgvector::Vector;

#[test]
fn the_database_going_away_and_coming_back() {
    let Some(pg) = PgServer::start("restart") else {
        return;
    };
    pg.sql().load("t_restart", &dataset(), "vector_l2_ops");
    let ds = dataset();
    let mut cfg = config(&pg, "t_restart");
    cfg.server.request_timeout_ms = 3_000;
    let d = Daemon::start(&cfg).unwrap();
    let addr = d.local_addr();
    let mut c = client(addr);
    let cached: Vec<Vec<f32>> = (0..20).map(|i| query_near(&ds, i * 97, 0.05)).collect();
    for q in &cached {
        c.search(K, q).unwrap();
        // Exact, or an alias of a neighbour cached before it.
        search_until_hit(&mut c, q);
    }
    let acked_before = 60_000u64;
    c.insert(acked_before, ds.row(1)).unwrap();

    pg.stop();
    // Hits are still served; misses and writes fail fast with UNAVAILABLE.
    let t = Instant::now();
    for q in &cached {
        assert_ne!(c.search(K, q).unwrap().hit, HitKind::Miss);
    }
    for i in 0..10 {
        let t = Instant::now();
        let e = c.search(K, &query_near(&ds, 1000 + i, 0.3)).unwrap_err();
        assert_eq!(e.status(), Some(Status::Unavailable), "{e}");
        assert!(
            t.elapsed() < Duration::from_millis(1500),
            "{:?}",
            t.elapsed()
        );
    }
    let e = c.insert(60_001, ds.row(2)).unwrap_err();
    assert_eq!(e.status(), Some(Status::Unavailable), "{e}");
    let e = c.delete(5).unwrap_err();
    assert_eq!(e.status(), Some(Status::Unavailable), "{e}");
    eprintln!("down for {:?}", t.elapsed());

    pg.restart();
    // Recovery is automatic: misses succeed again within a bounded wait.
    let end = Instant::now() + Duration::from_secs(15);
    let q = query_near(&ds, 2222, 0.3);
    loop {
        match c.search(K, &q) {
            Ok(r) => {
                assert_eq!(r.neighbors.len(), K as usize);
                break;
            }
            Err(e) => {
                assert_eq!(e.status(), Some(Status::Unavailable), "{e}");
                assert!(Instant::now() < end, "no recovery within 15 s: {e}");
                thread::sleep(Duration::from_millis(50));
            }
        }
    }
    // Every backend thread's connection ended with the restart: none of these may be
    // the write that finds it out.
    for i in 0..8 {
        c.insert(60_002 + i, ds.row(3)).unwrap();
    }
    let sql = pg.sql();
    let present = |id: u64| {
        sql.query(
            "SELECT count(*) FROM t_restart WHERE id = $1",
            &[&(id as i64)],
        )[0]
        .get::<_, i64>(0)
    };
    assert_eq!(present(acked_before), 1, "acknowledged before the stop");
    assert_eq!(present(60_002), 1, "acknowledged after the restart");
    assert_eq!(present(60_001), 0, "refused while down");
    assert_eq!(present(5), 1, "a delete refused while down changed nothing");
    let stats = c.stats().unwrap();
    let pg_lines: Vec<&str> = stats.lines().filter(|l| l.starts_with("pg_")).collect();
    eprintln!("{pg_lines:?}");
    assert!(
        stat(&stats, "pg_reconnects").unwrap() >= 1.0,
        "{pg_lines:?}"
    );
    assert!(
        stat(&stats, "pg_connect_failures").unwrap() >= 1.0,
        "{pg_lines:?}"
    );
    d.stop().unwrap();

    // Down at start: akerd waits with backoff up to start_wait_ms, then refuses.
    pg.stop();
    let mut cfg = config(&pg, "t_restart");
    cfg.backend.pgvector.as_mut().unwrap().start_wait_ms = 1_500;
    let t = Instant::now();
    let e = Daemon::start(&cfg).err().expect("refused");
    let waited = t.elapsed();
    assert!(e.to_string().contains("cannot connect"), "{e}");
    assert!(
        waited >= Duration::from_millis(700) && waited < Duration::from_secs(6),
        "{waited:?}"
    );
    // ... and starts when the database comes up within the wait.
    cfg.backend.pgvector.as_mut().unwrap().start_wait_ms = 30_000;
    let starting = thread::spawn(move || Daemon::start(&cfg).map(|d| d.stop()));
    thread::sleep(Duration::from_millis(600));
    pg.restart();
    starting
        .join()
        .unwrap()
        .expect("started once the database came up")
        .unwrap();
}

#[test]
fn a_write_in_doubt_is_settled_before_the_next_write_to_its_id() {
    // Its own server: its akerd session is stopped (SIGSTOP) to make a write in doubt.
    let Some(pg) = PgServer::start("doubt") else {
        return;
    };
    pg.sql().load("t_doubt", &dataset(), "vector_l2_ops");
    let ds = dataset();
    let mut cfg = config(&pg, "t_doubt");
    cfg.backend.threads = 1;
    cfg.server.request_timeout_ms = 15_000;
    cfg.backend.pgvector.as_mut().unwrap().statement_timeout_ms = 300;
    let d = Daemon::start(&cfg).unwrap();
    let mut c = client(d.local_addr());
    let sql = pg.sql();
    let pids: Vec<i32> = sql
        .query(
            "SELECT pid FROM pg_stat_activity WHERE application_name = 'akerd'",
            &[],
        )
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(pids.len(), 1, "one backend thread, one session");
    let signal = |sig: &str| {
        let st = std::process::Command::new("kill")
            .arg(sig)
            .arg(pids[0].to_string())
            .status()
            .unwrap();
        assert!(st.success(), "kill {sig}");
    };
    const X: u64 = 88_888;
    // A fresh write first, so the next one does not check an idle connection.
    c.insert(X + 1, ds.row(0)).unwrap();
    signal("-STOP");
    // No answer within the statement timeout: in doubt; the stopped session cannot be
    // ended (SIGTERM stays pending), so it is not settled.
    let e = c.insert(X, ds.row(1)).unwrap_err();
    assert!(
        matches!(
            e.status(),
            Some(Status::DeadlineExceeded | Status::Unavailable)
        ),
        "{e}"
    );
    // The old session might still commit its write: the next write to X is refused.
    let e = c.insert(X, ds.row(2)).unwrap_err();
    assert_eq!(e.status(), Some(Status::Unavailable), "{e}");
    assert!(e.to_string().contains("not settled"), "{e}");
    // Continued, the session takes its SIGTERM and exits without committing: the next
    // write settles, then goes through.
    signal("-CONT");
    c.insert(X, ds.row(3)).unwrap();
    let row = sql.query(
        "SELECT embedding FROM t_doubt WHERE id = $1",
        &[&(X as i64)],
    );
    let v: Vec<f32> = row[0].get::<_, PgVector>(0).to_vec();
    assert_eq!(v, ds.row(3));
    let stats = c.stats().unwrap();
    assert_eq!(stat(&stats, "pg_writes_in_doubt"), Some(1.0), "{stats}");
    assert_eq!(stat(&stats, "pg_writes_unsettled"), Some(1.0), "{stats}");
    d.stop().unwrap();
}

fn refused(cfg: &Config) -> String {
    match Daemon::start(cfg) {
        Ok(_) => panic!("akerd started"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn wrong_tables_and_metrics_without_an_index_are_refused_at_start() {
    let Some(pg) = table("t_refuse", "vector_l2_ops") else {
        return;
    };
    let sql = pg.sql();
    // A metric with no matching index: PostgreSQL would scan the table.
    let mut cfg = config(pg, "t_refuse");
    cfg.cache.metric = Some(Metric::Cosine);
    let e = refused(&cfg);
    assert!(
        e.contains("no valid HNSW index") && e.contains("vector_cosine_ops"),
        "{e}"
    );
    // The dimension clients will send is not the table's.
    let mut cfg = config(pg, "t_refuse");
    cfg.backend.pgvector.as_mut().unwrap().dim = Some(16);
    let e = refused(&cfg);
    assert!(e.contains("8-d") && e.contains("16"), "{e}");
    // No such table, column of the wrong type, no index at all, ids without a unique index.
    let e = refused(&config(pg, "t_missing"));
    assert!(e.contains("does not exist"), "{e}");
    sql.exec(
        "DROP TABLE IF EXISTS t_bad; \
         CREATE TABLE t_bad (id int PRIMARY KEY, embedding vector(8)); \
         DROP TABLE IF EXISTS t_noindex; \
         CREATE TABLE t_noindex (id bigint PRIMARY KEY, embedding vector(8)); \
         DROP TABLE IF EXISTS t_nounique; \
         CREATE TABLE t_nounique (id bigint NOT NULL, embedding vector(8)); \
         CREATE INDEX ON t_nounique USING hnsw (embedding vector_l2_ops); \
         DROP TABLE IF EXISTS t_nullable; \
         CREATE TABLE t_nullable (id bigint UNIQUE, embedding vector(8)); \
         DROP TABLE IF EXISTS t_untyped; \
         CREATE TABLE t_untyped (id bigint PRIMARY KEY, embedding vector); \
         CREATE INDEX ON t_noindex (id);",
    );
    assert!(refused(&config(pg, "t_bad")).contains("not bigint"));
    let e = refused(&config(pg, "t_noindex"));
    assert!(e.contains("no valid HNSW index"), "{e}");
    assert!(refused(&config(pg, "t_nounique")).contains("no unique index"));
    assert!(refused(&config(pg, "t_nullable")).contains("may be NULL"));
    // An untyped column takes its dimension from a row; with none, it is refused.
    assert!(refused(&config(pg, "t_untyped")).contains("no dimension"));
    // A password in the URL is refused before anything connects.
    let mut cfg = config(pg, "t_refuse");
    cfg.backend.pgvector.as_mut().unwrap().url =
        format!("postgresql://aker:secret@127.0.0.1:{}/postgres", pg.port);
    let e = refused(&cfg);
    assert!(e.contains("password_file") && !e.contains("secret"), "{e}");
}
