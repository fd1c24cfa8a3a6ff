//! SEARCH_BATCH (protocol version 4) end to end over loopback: a batch answers each query
//! as its own SEARCH would, in order; the client chunks by the server's limits; one bad
//! query fails alone; a batch needs one in-flight slot per query; a batch's deadline
//! answers the queries that are done; a version 3 client gets the same items from single
//! SEARCHes.

#[path = "akerd_common/mod.rs"]
mod common;

use std::net::TcpStream;
use std::time::Duration;

use aker::client::{ClientOptions, Pipeline};
use aker::protocol::{
    BatchItem, HitKind, Reply, Request, SearchBatchRequest, SearchRequest, Status,
};
use aker::service::{Daemon, StartPlan};
use common::*;

/// SEARCH_BATCH frames served (read in-process: a STATS reply is over these tests' small
/// frame limits).
fn batches(d: &Daemon) -> u64 {
    d.server()
        .stats()
        .batches
        .load(std::sync::atomic::Ordering::Relaxed)
}

fn batch_ids(items: &[BatchItem]) -> Vec<Vec<u64>> {
    items
        .iter()
        .map(|i| ids(i.as_ref().expect("query answered")))
        .collect()
}

fn queries(ds: &aker::service::Dataset, n: usize, offset: f32) -> Vec<Vec<f32>> {
    (0..n)
        .map(|i| query_near(ds, 37 * i % 3000, offset))
        .collect()
}

/// The first batch misses and is answered by the exact store; once admitted, the same
/// batch is answered from the cache, and every item equals the single SEARCH's answer.
#[test]
fn a_batch_answers_each_query_as_its_search_would() {
    let ds = dataset();
    let d = Daemon::start_plan(&config(), StartPlan::with_data(ds.clone())).unwrap();
    let mut c = client(d.local_addr());
    assert_eq!(c.version(), aker::protocol::VERSION);
    assert_eq!(c.server_info().unwrap().max_batch, Some(64));
    let qs = queries(&ds, 40, 0.01);
    let first = c.search_batch(K, &qs).unwrap();
    assert_eq!(first.len(), qs.len());
    for (q, item) in qs.iter().zip(&first) {
        let r = item.as_ref().unwrap();
        assert_eq!(r.hit, HitKind::Miss);
        assert_eq!(ids(r), exact_ids(&ds, q, K as usize));
    }
    // Admission is the owner's, asynchronous: wait until a single SEARCH of each hits.
    for q in &qs {
        search_until(&mut c, q, HitKind::Exact);
    }
    let again = c.search_batch(K, &qs).unwrap();
    assert!(again
        .iter()
        .all(|i| i.as_ref().unwrap().hit == HitKind::Exact));
    let singles: Vec<Vec<u64>> = qs.iter().map(|q| ids(&c.search(K, q).unwrap())).collect();
    assert_eq!(batch_ids(&again), singles);
    assert_eq!(batch_ids(&first), singles);
    let text = c.stats().unwrap();
    assert_eq!(stat(&text, "server_batches"), Some(2.0));
    assert_eq!(stat(&text, "server_batch_queries"), Some(80.0));
    d.stop().unwrap();
}

/// max_batch 8 and a 4 KiB frame limit: the client splits 30 queries into frames of 8
/// (k 5), and 8 at k 32 (3,224 reply bytes) into one; the server refuses a frame over
/// max_batch as a whole.
#[test]
fn the_client_chunks_to_the_servers_limits_and_the_server_holds_them() {
    let ds = dataset();
    let mut cfg = config();
    cfg.server.max_batch = 8;
    cfg.server.max_frame_bytes = 4096;
    let d = Daemon::start_plan(&cfg, StartPlan::with_data(ds.clone())).unwrap();
    let mut c = client(d.local_addr());
    let qs = queries(&ds, 30, 0.02);
    let items = c.search_batch(K, &qs).unwrap();
    assert_eq!(items.len(), 30);
    assert_eq!(batches(&d), 4, "30 queries in frames of 8");
    for (q, item) in qs.iter().zip(&items) {
        assert_eq!(ids(item.as_ref().unwrap()), exact_ids(&ds, q, K as usize));
    }
    // k 32: a reply of 8 items can take 24 + 8 * (16 + 384) = 3224 bytes: fits in 4 KiB,
    // so 8 at k 32 is one frame too (the next test has a limit that splits them).
    let wide = c.search_batch(32, &qs[..8]).unwrap();
    assert_eq!(batches(&d), 5);
    assert!(wide
        .iter()
        .all(|i| i.as_ref().unwrap().neighbors.len() == 32));
    // Over max_batch, sent as one frame by hand: refused whole.
    let nine = SearchBatchRequest::new(K, qs[..9].to_vec());
    match c.call(Request::SearchBatch(nine)).unwrap() {
        Reply::Error { status, .. } => assert_eq!(status, Status::BadRequest),
        other => panic!("a batch of 9 over max_batch 8 was answered {other:?}"),
    }
    d.stop().unwrap();
}

/// A frame whose largest reply could be over max_frame_bytes is refused; the client's
/// chunking keeps under it.
#[test]
fn a_batch_whose_reply_could_be_over_the_frame_limit_is_refused_whole() {
    let ds = dataset();
    let mut cfg = config();
    cfg.server.max_frame_bytes = 2048;
    let d = Daemon::start_plan(&cfg, StartPlan::with_data(ds.clone())).unwrap();
    let mut c = client(d.local_addr());
    let qs = queries(&ds, 8, 0.03);
    // 24 + 8 * (16 + 12 * 32) = 3224 > 2048.
    let req = SearchBatchRequest::new(32, qs.clone());
    match c.call(Request::SearchBatch(req)).unwrap() {
        Reply::Error {
            status, message, ..
        } => {
            assert_eq!(status, Status::BadRequest, "{message}");
            assert!(message.contains("max_frame_bytes"), "{message}");
        }
        other => panic!("answered {other:?}"),
    }
    let items = c.search_batch(32, &qs).unwrap();
    assert_eq!(items.len(), 8);
    assert!(items.iter().all(|i| i.is_ok()));
    assert_eq!(
        batches(&d),
        2,
        "the client's 8 in frames of 5 and 3 (a refused frame is not served)"
    );
    d.stop().unwrap();
}

/// A non-finite component fails its own query (NON_FINITE item); the others are served.
#[test]
fn one_bad_query_fails_alone() {
    let ds = dataset();
    let d = Daemon::start_plan(&config(), StartPlan::with_data(ds.clone())).unwrap();
    let mut c = client(d.local_addr());
    let mut qs = queries(&ds, 5, 0.01);
    qs[2][3] = f32::NAN;
    qs[4][0] = f32::INFINITY;
    let items = c.search_batch(K, &qs).unwrap();
    let statuses: Vec<Status> = items
        .iter()
        .map(|i| i.as_ref().err().copied().unwrap_or(Status::Ok))
        .collect();
    use Status::*;
    assert_eq!(statuses, [Ok, Ok, NonFinite, Ok, NonFinite]);
    assert_eq!(ids(items[0].as_ref().unwrap()), exact_ids(&ds, &qs[0], 5));
    d.stop().unwrap();
}

/// max_inflight 8 and a backend that takes 300 ms: with one miss in flight a batch of 8
/// is BUSY (it needs 8 slots, 7 are free) and a batch of 7 is served at once; once the
/// miss is answered a batch of 8 is served too. The pipelined client refuses a batch
/// wider than its window (the server's max_inflight) before sending it.
#[test]
fn a_batch_needs_one_in_flight_slot_per_query() {
    let ds = dataset();
    let mut cfg = config();
    cfg.server.max_inflight = 8;
    let (store, _) = SlowStore::boxed(&ds, Duration::from_millis(300));
    let d = Daemon::start_plan(&cfg, StartPlan::embedded(ds.clone(), store)).unwrap();
    let cached = queries(&ds, 8, 0.01);
    {
        let mut c = client(d.local_addr());
        for q in &cached {
            search_until(&mut c, q, HitKind::Exact);
        }
    }
    let batch = |n: usize| Request::SearchBatch(SearchBatchRequest::new(K, cached[..n].to_vec()));
    let mut raw = TcpStream::connect(d.local_addr()).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let miss = Request::Search(SearchRequest::new(K, query_near(&ds, 7, 0.05)));
    let mut bytes = encoded(4, 1, miss);
    bytes.extend(encoded(4, 2, batch(8)));
    bytes.extend(encoded(4, 3, batch(7)));
    std::io::Write::write_all(&mut raw, &bytes).unwrap();
    let mut replies: Vec<_> = (0..3).map(|_| read_reply(&mut raw).unwrap()).collect();
    replies.sort_by_key(|r| r.request_id);
    assert_eq!(
        replies[1].reply.status(),
        Status::Busy,
        "{:?}",
        replies[1].reply
    );
    match &replies[2].reply {
        Reply::SearchBatch(items) => assert!(items
            .iter()
            .all(|i| i.as_ref().unwrap().hit == HitKind::Exact)),
        other => panic!("batch of 7 answered {other:?}"),
    }
    assert!(matches!(replies[0].reply, Reply::Search(_)));
    std::io::Write::write_all(&mut raw, &encoded(4, 4, batch(8))).unwrap();
    let r = read_reply(&mut raw).unwrap();
    assert!(
        matches!(r.reply, Reply::SearchBatch(ref items) if items.len() == 8),
        "{r:?}"
    );

    let opts = ClientOptions {
        io_timeout: Some(Duration::from_secs(10)),
        ..Default::default()
    };
    let (mut p, hello) = Pipeline::connect_negotiated(d.local_addr(), 64, opts).unwrap();
    assert_eq!((p.window(), hello.max_batch), (8, Some(8)));
    let one = p
        .send(Request::Search(SearchRequest::new(K, cached[0].clone())))
        .unwrap();
    let seven = p.send(batch(7)).unwrap();
    assert_eq!(p.slots_in_flight(), 8);
    let wide = SearchBatchRequest::new(K, [cached.clone(), cached.clone()].concat());
    let err = p.send(Request::SearchBatch(wide)).unwrap_err();
    assert!(err.to_string().contains("wider than the window"), "{err}");
    let got: Vec<u64> = (0..2).map(|_| p.recv().unwrap().0).collect();
    assert!(got.contains(&one) && got.contains(&seven));
    assert_eq!(p.slots_in_flight(), 0);
    d.stop().unwrap();
}

/// A batch's deadline: the cached query is answered, the miss stuck behind a 500 ms
/// backend is DEADLINE_EXCEEDED in its item, and the reply does not wait for it.
#[test]
fn a_batch_deadline_answers_the_queries_that_are_done() {
    let ds = dataset();
    let cfg = config();
    let (store, _) = SlowStore::boxed(&ds, Duration::from_millis(500));
    let d = Daemon::start_plan(&cfg, StartPlan::embedded(ds.clone(), store)).unwrap();
    let mut c = client(d.local_addr());
    let cached = query_near(&ds, 3, 0.01);
    search_until(&mut c, &cached, HitKind::Exact);
    let req = SearchBatchRequest {
        deadline_us: 100_000,
        ..SearchBatchRequest::new(K, vec![cached, query_near(&ds, 900, 0.04)])
    };
    let items = c.search_batch_with(req).unwrap();
    assert_eq!(items[0].as_ref().unwrap().hit, HitKind::Exact);
    assert_eq!(items[1].as_ref().unwrap_err(), &Status::DeadlineExceeded);
    assert!(stat(&c.stats().unwrap(), "server_deadline_exceeded").unwrap() >= 1.0);
    // The batch gave its slots back at its deadline: a batch of max_inflight (64) of the
    // cached query is served at once, though the cancelled miss's backend call may still
    // be running.
    let cached = items[0].as_ref().unwrap().clone();
    let full = c
        .search_batch(K, &vec![query_near(&ds, 3, 0.01); 64])
        .unwrap();
    assert!(full
        .iter()
        .all(|i| i.as_ref().unwrap().neighbors == cached.neighbors));
    d.stop().unwrap();
}

/// A client that speaks version 3 has no SEARCH_BATCH: its `search_batch` sends single
/// SEARCHes and gets the same items; a version 3 frame with opcode 0x0A is UNKNOWN_OP.
#[test]
fn a_version_3_client_gets_the_same_items_from_single_searches() {
    let ds = dataset();
    let d = Daemon::start_plan(&config(), StartPlan::with_data(ds.clone())).unwrap();
    let mut c = aker::client::Client::connect_with(
        d.local_addr(),
        ClientOptions {
            version: 3,
            io_timeout: Some(Duration::from_secs(10)),
            ..Default::default()
        },
    )
    .unwrap();
    let h = c.hello().unwrap();
    assert_eq!((c.version(), h.max_batch), (3, None));
    let mut qs = queries(&ds, 6, 0.01);
    qs[1][0] = f32::NAN;
    let items = c.search_batch(K, &qs).unwrap();
    assert_eq!(items[1].as_ref().unwrap_err(), &Status::NonFinite);
    for (i, q) in qs.iter().enumerate().filter(|(i, _)| *i != 1) {
        assert_eq!(
            ids(items[i].as_ref().unwrap()),
            exact_ids(&ds, q, K as usize)
        );
    }
    assert_eq!(stat(&c.stats().unwrap(), "server_batches"), Some(0.0));
    // A whole-frame error stays an error of the call, as a batch frame's would.
    assert_eq!(
        c.search_batch(0, &qs[..1]).unwrap_err().status(),
        Some(Status::BadK)
    );
    let mut raw = TcpStream::connect(d.local_addr()).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut bytes = encoded(4, 9, Request::SearchBatch(SearchBatchRequest::new(K, qs)));
    bytes[2] = 3;
    std::io::Write::write_all(&mut raw, &bytes).unwrap();
    let r = read_reply(&mut raw).unwrap();
    assert_eq!((r.request_id, r.reply.status()), (9, Status::UnknownOp));
    d.stop().unwrap();
}

/// Version 5, AT_POSITION: with the embedded store (no change stream to wait for, every
/// acknowledged write already in the cache) a batch at a position is answered as it
/// would be without one, from the cache once admitted, and counted per query.
#[test]
fn a_batch_at_a_position_is_served_as_usual_by_the_embedded_store() {
    let ds = dataset();
    let d = Daemon::start_plan(&config(), StartPlan::with_data(ds.clone())).unwrap();
    let mut c = client(d.local_addr());
    let qs = queries(&ds, 5, 0.01);
    let at = |queries: Vec<Vec<f32>>| SearchBatchRequest {
        at_position: Some(0x16_B374_D848),
        ..SearchBatchRequest::new(K, queries)
    };
    let first = c.search_batch_with(at(qs.clone())).unwrap();
    for (q, item) in qs.iter().zip(&first) {
        let r = item.as_ref().unwrap();
        assert_eq!(r.hit, HitKind::Miss);
        assert_eq!(ids(r), exact_ids(&ds, q, K as usize));
    }
    for q in &qs {
        search_until(&mut c, q, HitKind::Exact);
    }
    let again = c.search_batch_with(at(qs.clone())).unwrap();
    assert_eq!(batch_ids(&again), batch_ids(&first));
    assert!(again
        .iter()
        .all(|i| i.as_ref().unwrap().hit == HitKind::Exact));
    // A write's position is 0 here, and a single SEARCH at it is a hit too.
    assert_eq!(c.insert_with_position(900_002, &qs[0]).unwrap(), 0);
    let gone = c.delete_with_position(900_002).unwrap();
    assert_eq!((gone.existed, gone.position), (true, 0));
    let r = c
        .search_with(SearchRequest {
            at_position: Some(gone.position),
            ..SearchRequest::new(K, qs[1].clone())
        })
        .unwrap();
    assert_eq!(r.hit, HitKind::Exact);
    let s = c.stats().unwrap();
    assert_eq!(stat(&s, "searches_at_position"), Some(11.0), "{s}");
    assert_eq!(stat(&s, "searches_position_waited"), Some(0.0), "{s}");
    assert_eq!(stat(&s, "searches_position_database"), Some(0.0), "{s}");
    d.stop().unwrap();
}
