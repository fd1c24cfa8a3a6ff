//! The engine end to end over loopback against the in-process fixture server
//! (`loadgen::testserver`, the project's connection layer with a fixed-answer service).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use aker::protocol::HitKind;
use aker::server::Running;
use aker_formats::trace::{Op, Trace};
use loadgen::schedule::Arrival;
use loadgen::stats::{Phase, Summary};
use loadgen::worker::{self, EngineConfig, Mode, StopReason};
use loadgen::workload::{GenParams, OpKind, Workload};
use shards::Metric;

const DIM: u32 = 4;

struct Fixture(Option<Running>);

impl Fixture {
    fn start(busy: Duration) -> Fixture {
        let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
        Fixture(Some(
            loadgen::testserver::start(addr, DIM, busy, 128).unwrap(),
        ))
    }
    fn addr(&self) -> SocketAddr {
        self.0.as_ref().unwrap().local_addr()
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if let Some(r) = self.0.take() {
            let _ = r.stop();
        }
    }
}

fn config(addr: SocketAddr, mode: Mode) -> EngineConfig {
    EngineConfig {
        target: addr,
        mode,
        connections: 4,
        depth: 8,
        threads: 2,
        warmup: Duration::from_millis(200),
        duration: Duration::from_secs(1),
        max_requests: None,
        drain: Duration::from_secs(5),
        connect_timeout: Duration::from_secs(5),
        write_timeout: Duration::from_secs(10),
        max_frame_bytes: 1 << 20,
        spin: Duration::ZERO,
        seed: 3,
        secret: None,
        tls: None,
        batch: None,
    }
}

fn fixed(rate: f64) -> Mode {
    Mode::Open {
        rate,
        arrival: Arrival::Fixed,
    }
}

fn generated(mix: &str) -> Arc<Workload> {
    Arc::new(
        Workload::generate(
            DIM as usize,
            GenParams {
                vectors: 500,
                mix: mix.parse().unwrap(),
                ..GenParams::default()
            },
        )
        .unwrap(),
    )
}

#[test]
fn open_loop_sends_the_schedule_and_splits_ops_and_hits() {
    let f = Fixture::start(Duration::ZERO);
    let w = generated("search=80,insert=10,delete=10");
    let mut lines = Vec::new();
    let r = worker::run(&config(f.addr(), fixed(1000.0)), &w, |l| lines.push(*l)).unwrap();
    let s = &r.stats;
    assert_eq!(r.stop, StopReason::Duration);
    assert_eq!(s.total_errors(), 0, "{:?}", s.errors);
    // Fixed spacing: exactly rate x duration counted (warm-up excluded).
    assert_eq!(s.ok(), 1000);
    assert_eq!(r.sent, 1000);
    assert!((r.measured_secs - 1.0).abs() < 1e-6);
    let searches = s.ops[OpKind::Search.index()].len();
    let writes = s.ops[OpKind::Insert.index()].len() + s.ops[OpKind::Delete.index()].len();
    assert_eq!(searches + writes, 1000);
    assert!(
        searches > 700 && writes > 100,
        "{searches} searches, {writes} writes"
    );
    // The fixture answers EXACT or APPROXIMATE (by the sign of the first component).
    let exact = s.hits[HitKind::Exact.code() as usize].len();
    let approx = s.hits[HitKind::Approximate.code() as usize].len();
    assert_eq!(exact + approx, searches);
    assert!(exact > 0 && approx > 0);
    assert_eq!(s.hit_ratio(), Some(1.0));
    assert_eq!(s.recall(), None);
    // Per-second lines: the warm-up one is marked, the rate is about the target.
    assert!(lines.len() >= 2, "{lines:?}");
    assert_eq!(lines[0].phase, Phase::Warmup);
    let full: Vec<_> = lines
        .iter()
        .filter(|l| l.phase == Phase::Run && l.rate > 900.0)
        .collect();
    assert!(!full.is_empty(), "{lines:?}");
    assert!(Summary::of(&s.all).p50_ms < 50.0);
}

#[test]
fn closed_loop_measures_throughput() {
    let f = Fixture::start(Duration::ZERO);
    let w = generated("search=100");
    let mut cfg = config(f.addr(), Mode::Closed);
    cfg.duration = Duration::from_millis(500);
    let r = worker::run(&cfg, &w, |_| {}).unwrap();
    assert_eq!(r.stop, StopReason::Duration);
    assert_eq!(r.stats.total_errors(), 0, "{:?}", r.stats.errors);
    // Anything sensible: loopback with 32 requests in flight does far more than 200/s.
    assert!(r.stats.ok() > 100, "{} replies", r.stats.ok());
    assert_eq!(r.stats.ok(), r.sent);
}

/// `--batch 16` against the fixture (max_inflight 128): depth 8 frames of 16 queries;
/// every query is counted with its own hit kind, writes in the mix go out on their own,
/// and a request budget counts queries, not frames.
#[test]
fn closed_loop_batches_count_every_query() {
    let f = Fixture::start(Duration::ZERO);
    let w = generated("search=90,insert=10");
    let mut cfg = config(f.addr(), Mode::Closed);
    cfg.batch = Some(16);
    cfg.max_requests = Some(5_000);
    cfg.duration = Duration::from_secs(10);
    let r = worker::run(&cfg, &w, |_| {}).unwrap();
    assert_eq!(r.stop, StopReason::RequestCount);
    assert_eq!(r.stats.total_errors(), 0, "{:?}", r.stats.errors);
    assert_eq!((r.sent, r.stats.ok()), (5_000, 5_000));
    let searches = r.stats.ops[OpKind::Search.index()].len();
    let inserts = r.stats.ops[OpKind::Insert.index()].len();
    assert_eq!(searches + inserts, 5_000);
    assert!(inserts > 200, "{inserts} inserts");
    let exact = r.stats.hits[HitKind::Exact.code() as usize].len();
    let approx = r.stats.hits[HitKind::Approximate.code() as usize].len();
    assert_eq!(exact + approx, searches);
    assert!(exact > 0 && approx > 0);
}

/// A batch the server refuses as a whole (16 queries to a fixture of max_inflight 8,
/// hence max_batch 8) counts as 16 errors of its status.
#[test]
fn a_refused_batch_fails_each_of_its_queries() {
    let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let f = Fixture(Some(
        loadgen::testserver::start(addr, DIM, Duration::ZERO, 8).unwrap(),
    ));
    let w = generated("search=100");
    let mut cfg = config(f.addr(), Mode::Closed);
    (cfg.batch, cfg.depth, cfg.connections) = (Some(16), 1, 1);
    cfg.max_requests = Some(160);
    let r = worker::run(&cfg, &w, |_| {}).unwrap();
    assert_eq!(r.stats.ok(), 0);
    assert_eq!(r.stats.total_errors(), 160, "{:?}", r.stats.errors);
    let errors = format!("{:?}", r.stats.errors);
    assert!(errors.contains("BAD_REQUEST"), "{errors}");
}

#[test]
fn request_cap_stops_the_run() {
    let f = Fixture::start(Duration::ZERO);
    let w = generated("search=100");
    let mut cfg = config(f.addr(), fixed(2000.0));
    cfg.max_requests = Some(300);
    cfg.duration = Duration::from_secs(30);
    let r = worker::run(&cfg, &w, |_| {}).unwrap();
    assert_eq!(r.stop, StopReason::RequestCount);
    assert_eq!(r.stats.ok(), 300);
    // The 300 requests cover about 0.15 s of schedule, not the 30 s asked for.
    assert!(r.measured_secs < 1.0, "{}", r.measured_secs);
}

fn trace_with_truth() -> Trace {
    Trace {
        dim: DIM as usize,
        metric: Metric::L2Sq,
        k: 4,
        // Vector 0 is answered EXACT by the fixture, vector 1 APPROXIMATE.
        vectors: vec![0.5, 0.0, 0.0, 0.0, -0.5, 0.0, 0.0, 0.0],
        ops: (0..200)
            .map(|i| Op::Search {
                vector: i % 2,
                k: 4,
            })
            .collect(),
        // The fixture answers ids 0..k: recall 1 for vector 0, 1/2 for vector 1.
        ground_truth: Some(vec![vec![0, 1, 2, 3], vec![0, 1, 10, 11]]),
    }
}

#[test]
fn trace_replay_scores_recall_by_hit_kind_and_bypass_goes_to_the_backend() {
    let f = Fixture::start(Duration::ZERO);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.trace");
    trace_with_truth().save(&path).unwrap();

    let mut cfg = config(f.addr(), fixed(2000.0));
    cfg.warmup = Duration::ZERO;
    let w = Arc::new(Workload::from_trace(Trace::load(&path).unwrap(), false).unwrap());
    let r = worker::run(&cfg, &w, |_| {}).unwrap();
    let s = &r.stats;
    assert_eq!(r.stop, StopReason::TraceEnd);
    assert_eq!(s.ok(), 200);
    assert_eq!(r.sent, 200);
    assert_eq!(s.total_errors(), 0, "{:?}", s.errors);
    assert_eq!(s.recall_of(HitKind::Exact), Some(1.0));
    assert_eq!(s.recall_of(HitKind::Approximate), Some(0.5));
    assert_eq!(s.recall(), Some(0.75));
    assert_eq!(s.hit_ratio(), Some(1.0));
    // 200 requests at 2000/s cover 0.1 s.
    assert!((r.measured_secs - 0.1).abs() < 0.01, "{}", r.measured_secs);

    let mut bypass = Workload::from_trace(Trace::load(&path).unwrap(), false).unwrap();
    bypass.bypass = true;
    let r = worker::run(&cfg, &Arc::new(bypass), |_| {}).unwrap();
    let s = &r.stats;
    assert_eq!(s.ok(), 200);
    assert_eq!(s.hit_ratio(), Some(0.0));
    assert_eq!(s.hits[HitKind::Miss.code() as usize].len(), 200);
    assert_eq!(s.recall_of(HitKind::Miss), Some(0.75));
}

/// A server slower than the schedule: the window fills, requests go out late, and the
/// corrected latency grows with the backlog while the uncorrected one stays at the
/// service time.
#[test]
fn overload_is_charged_from_the_intended_time() {
    let f = Fixture::start(Duration::from_millis(2));
    let w = generated("search=100");
    let mut cfg = config(f.addr(), fixed(1000.0));
    cfg.connections = 1;
    cfg.depth = 1;
    cfg.threads = 1;
    cfg.warmup = Duration::ZERO;
    cfg.duration = Duration::from_millis(500);
    let r = worker::run(&cfg, &w, |_| {}).unwrap();
    let s = &r.stats;
    assert_eq!(s.total_errors(), 0, "{:?}", s.errors);
    assert_eq!(s.ok(), 500);
    let all = Summary::of(&s.all);
    let unc = Summary::of(&s.uncorrected);
    // At most 500/s served: the last of 500 requests (due at 0.5 s) is answered after
    // about 1 s, so it waited about 0.5 s.
    assert!(all.max_ms > 300.0, "corrected max {} ms", all.max_ms);
    assert!(unc.p50_ms < 50.0, "uncorrected p50 {} ms", unc.p50_ms);
    assert!(all.p50_ms > 5.0 * unc.p50_ms, "{all:?} vs {unc:?}");
}

#[test]
fn a_dead_server_is_reported_not_hung_on() {
    // A listener that accepts and closes: every connection is lost at once.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let t = std::thread::spawn(move || {
        for _ in 0..2 {
            if let Ok((s, _)) = listener.accept() {
                drop(s);
            }
        }
    });
    let w = generated("search=100");
    let mut cfg = config(addr, fixed(1000.0));
    cfg.connections = 2;
    cfg.warmup = Duration::ZERO;
    let started = std::time::Instant::now();
    let r = worker::run(&cfg, &w, |_| {}).unwrap();
    t.join().unwrap();
    assert_eq!(r.stop, StopReason::ConnectionsLost);
    assert_eq!(r.stats.ok(), 0);
    // Every scheduled request is accounted for as an error of some kind.
    assert_eq!(r.stats.total_errors(), 1000, "{:?}", r.stats.errors);
    assert!(started.elapsed() < Duration::from_secs(5));
}
