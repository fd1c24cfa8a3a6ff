//! Faults of the embedded backend, end to end over loopback: a backend whose every
//! search takes 50 ms, saturated by misses; and shard owners with a queue of one message
//! under a write burst. For each: what is served, what fails and how (statuses), and
//! that akerd recovers by itself once the load stops.

#[path = "akerd_common/mod.rs"]
mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use aker::client::ClientOptions;
use aker::protocol::{HitKind, SearchRequest, Status};
use aker::service::{Daemon, StartPlan};
use common::*;

/// Every backend search sleeps 50 ms; 2 backend threads and a queue of 4 jobs.
/// Twelve clients (more than threads and queue hold) send nothing but fresh misses for 1.5 s while another repeats cached
/// queries. Hits are all served (EXACT), whatever the backend's queue; misses past the
/// queue fail at once with BUSY or at their deadline with DEADLINE_EXCEEDED, never with
/// another status; the backend sees no more searches than its threads can run; and once
/// the flood stops a fresh miss is answered again.
#[test]
fn a_slow_saturated_backend_still_serves_hits_and_sheds_misses() {
    let ds = dataset();
    let mut cfg = config();
    cfg.backend.threads = 2;
    cfg.backend.queue_depth = 4;
    cfg.server.request_timeout_ms = 400;
    let (store, searches) = SlowStore::boxed(&ds, Duration::from_millis(50));
    let d = Daemon::start_plan(&cfg, StartPlan::embedded(ds.clone(), store)).unwrap();
    let addr = d.local_addr();
    let cached: Vec<Vec<f32>> = (0..8).map(|i| query_near(&ds, 40 * i, 0.01)).collect();
    {
        let mut c = client(addr);
        for q in &cached {
            search_until(&mut c, q, HitKind::Exact);
        }
    }
    let before = searches.load(Ordering::Relaxed);
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, busy, late) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let flood: Vec<_> = (0..12)
        .map(|t| {
            let (ds, stop) = (ds.clone(), stop.clone());
            let (ok, busy, late) = (ok.clone(), busy.clone(), late.clone());
            thread::spawn(move || {
                let mut c = client(addr);
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    // Fresh each time: offsets no entry has seen.
                    i += 1;
                    let q = query_near(&ds, (t * 400 + i) % 3000, 0.03 + i as f32 * 1e-4);
                    match c.search_with(SearchRequest::new(K, q)) {
                        Ok(_) => ok.fetch_add(1, Ordering::Relaxed),
                        Err(e) => match e.status() {
                            Some(Status::Busy) => busy.fetch_add(1, Ordering::Relaxed),
                            Some(Status::DeadlineExceeded) => late.fetch_add(1, Ordering::Relaxed),
                            other => panic!("a miss failed with {other:?}: {e}"),
                        },
                    };
                }
            })
        })
        .collect();
    let flood_start = Instant::now();
    let mut hits = 0;
    let mut c = client(addr);
    while flood_start.elapsed() < Duration::from_millis(1_500) {
        for q in &cached {
            let r = c.search(K, q).unwrap();
            assert_eq!(r.hit, HitKind::Exact, "a hit during the flood: {r:?}");
            hits += 1;
        }
    }
    stop.store(true, Ordering::Relaxed);
    for f in flood {
        f.join().unwrap();
    }
    let flood_s = flood_start.elapsed().as_secs_f64();
    let ran = searches.load(Ordering::Relaxed) - before;
    let (ok, busy, late) = (
        ok.load(Ordering::Relaxed),
        busy.load(Ordering::Relaxed),
        late.load(Ordering::Relaxed),
    );
    eprintln!("{hits} hits; misses ok {ok}, busy {busy}, late {late}; {ran} backend searches in {flood_s:.2} s");
    assert!(hits > 20, "{hits} hits");
    assert!(busy + late > 0, "the flood was never shed: ok {ok}");
    // Two threads at 50 ms each, plus what was queued when the flood stopped.
    let most = (flood_s * 2.0 / 0.05).ceil() as u64 + 2 + 4 + 12;
    assert!(ran <= most, "{ran} searches ran, at most {most} fit");
    // Recovery: a fresh miss is answered once the queue drains.
    let q = query_near(&ds, 2_999, 0.02);
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        match c.search(K, &q) {
            Ok(r) => {
                assert_eq!(r.hit, HitKind::Miss);
                break;
            }
            Err(e) if Instant::now() < end => {
                eprintln!("still shedding: {e}");
                thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("no recovery: {e}"),
        }
    }
    let stats = c.stats().unwrap();
    assert!(
        stat(&stats, "backend_busy").unwrap_or(0.0) > 0.0 || late > 0,
        "{stats}"
    );
    d.stop().unwrap();
}

/// Shard owners with a queue of one message: a burst of inserts and deletes from four
/// clients, with searches in between, is acknowledged in full (the writers wait for
/// room; nothing is refused), every acknowledged insert is in the backend and every
/// acknowledged delete is gone from every reply, and searches keep being answered.
#[test]
fn full_owner_queues_slow_writes_down_and_lose_nothing() {
    let ds = dataset();
    let mut cfg = config();
    cfg.cache.owner_queue_depth = 1;
    let d = Daemon::start_plan(&cfg, StartPlan::with_data(ds.clone())).unwrap();
    let addr = d.local_addr();
    let writers: Vec<_> = (0..4u64)
        .map(|t| {
            let ds = ds.clone();
            thread::spawn(move || {
                let mut c = aker::client::Client::connect_with(
                    addr,
                    ClientOptions {
                        io_timeout: Some(Duration::from_secs(10)),
                        ..Default::default()
                    },
                )
                .unwrap();
                let (mut deleted, mut kept) = (Vec::new(), Vec::new());
                for i in 0..150u64 {
                    let id = 100_000 + t * 1_000 + i;
                    let v = query_near(&ds, (t * 700 + i) as usize, 0.001);
                    c.insert(id, &v).unwrap();
                    if i % 3 == 0 {
                        assert!(c.delete(id).unwrap(), "{id} was inserted");
                        deleted.push((id, v));
                    } else {
                        if i % 5 == 0 {
                            let r = c.search(K, &v).unwrap();
                            assert!(r.neighbors.iter().any(|n| n.id == id), "{id}: {r:?}");
                        }
                        kept.push((id, v));
                    }
                }
                (deleted, kept)
            })
        })
        .collect();
    let (mut deleted, mut kept) = (Vec::new(), Vec::new());
    for w in writers {
        let (d, k) = w.join().unwrap();
        deleted.extend(d);
        kept.extend(k);
    }
    assert_eq!(deleted.len() + kept.len(), 600);
    let mut c = client(addr);
    for (id, v) in &deleted {
        let r = c.search(K, v).unwrap();
        assert!(
            !r.neighbors.iter().any(|n| n.id == *id),
            "deleted {id}: {r:?}"
        );
    }
    // Every insert acknowledged and not deleted is in the backend (its own vector's
    // nearest row).
    for (id, v) in &kept {
        let bypass = c
            .search_with(SearchRequest {
                bypass_cache: true,
                ..SearchRequest::new(1, v.clone())
            })
            .unwrap();
        assert_eq!(bypass.neighbors[0].id, *id, "{bypass:?}");
    }
    d.stop().unwrap();
}
