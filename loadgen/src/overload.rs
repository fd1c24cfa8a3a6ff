//! The overload run: hits at a steady rate while misses arrive at ten times what the
//! backend sustains, on top of hundreds of idle connections and clients that never
//! read; then the load stops and the daemon must recover by itself.
//!
//! ```text
//!  setup     the hit set cached (every query searched until it is an EXACT hit)
//!  probe     fresh misses, closed loop, no more in flight than the backend queues:
//!            S = the misses per second the backend answers
//!  A         hits alone, open loop at --hit-rate                 → hit p99 (baseline)
//!  B         hits as in A + fresh misses, open loop at F × S
//!            + idle connections + clients that never read          → hit p99, BUSY, RSS
//!  recovery  a fresh miss every 20 ms until one is answered       → seconds to recover
//!  C         hits alone again                                      → hit p99 (recovered)
//!  RSS of akerd sampled every 100 ms throughout
//! ```
//!
//! Latency is the load generator's: from each request's intended send time
//! (coordinated omission corrected). The load generator runs on the same machine, so
//! what the misses cost it shows in the hit latency too.

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aker::client::Client;
use aker::protocol::{encode_request, HitKind, Request, RequestFrame, SearchRequest};
use aker_formats::trace::{Op, Trace};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Normal};
use serde::Serialize;
use shards::Metric;

use crate::daemon::{self, Daemon};
use crate::schedule::Arrival;
use crate::stats::{RunStats, Summary};
use crate::worker::{self, EngineConfig, Mode};
use crate::workload::Workload;

/// Setup: rounds of searching the hit set before a query that is still no EXACT hit is
/// an error.
const SETUP_ROUNDS_MAX: usize = 20;
/// Recovery: how long a fresh miss may keep failing after the overload.
const RECOVERY_MAX: Duration = Duration::from_secs(30);
const RSS_EVERY: Duration = Duration::from_millis(100);
/// What a client that never reads writes per request: a PING with a 16 KiB payload,
/// whose reply is as large, so the server's output fills.
const HOG_PING_BYTES: usize = 16 << 10;
/// A client that never reads stops writing after this much (the server should have
/// pushed it back long before).
const HOG_WRITE_MAX: usize = 256 << 20;

#[derive(Clone, Debug)]
pub struct OverloadConfig {
    pub target: SocketAddr,
    pub hit_rate: f64,
    pub hit_queries: usize,
    pub hit_connections: usize,
    /// Offered misses in B, as a multiple of the sustainable rate.
    pub miss_factor: f64,
    pub miss_connections: usize,
    pub depth: usize,
    pub threads: usize,
    pub probe: Duration,
    /// Misses in flight in the probe: at most the backend's queue, so that none is
    /// refused and the probe measures what the backend answers.
    pub probe_inflight: usize,
    pub baseline: Duration,
    pub overload: Duration,
    pub recovered: Duration,
    pub warmup: Duration,
    pub idle_connections: usize,
    pub never_readers: usize,
    pub k: u32,
    /// Spread of the fresh misses around data rows (far from every cached query).
    pub miss_spread: f32,
    pub io_timeout: Duration,
    pub seed: u64,
    /// For a server that requires AUTH (every connection, the idle ones too; the clients
    /// that never read do not authenticate: their PINGs need none).
    pub secret: Option<aker::auth::Secret>,
    /// For a server with `[tls]`: every connection, the never-readers' too.
    pub tls: Option<aker::client::ClientTls>,
}

impl OverloadConfig {
    /// A connection to the target that has said HELLO, with the run's secret and TLS.
    pub fn connect(&self) -> aker::client::Result<aker::client::Client> {
        daemon::connect(
            self.target,
            self.io_timeout,
            self.secret.as_ref(),
            self.tls.as_ref(),
        )
    }
}

/// One phase's numbers from the load generator.
#[derive(Clone, Debug, Serialize)]
pub struct PhaseReport {
    pub offered_per_s: f64,
    pub seconds: f64,
    pub sent: u64,
    pub ok: u64,
    pub ok_per_s: f64,
    /// Answered searches by hit kind (miss, exact, alias, approximate).
    pub hits_by_kind: [u64; 4],
    pub latency: Summary,
    pub errors: std::collections::BTreeMap<String, u64>,
    /// Error replies (BUSY mostly): latency from the intended send time.
    pub refusals: Summary,
}

impl PhaseReport {
    fn of(offered: f64, r: &worker::RunResult) -> PhaseReport {
        let s: &RunStats = &r.stats;
        PhaseReport {
            offered_per_s: offered,
            seconds: r.measured_secs,
            sent: r.sent,
            ok: s.ok(),
            ok_per_s: s.ok() as f64 / r.measured_secs.max(1e-9),
            hits_by_kind: std::array::from_fn(|i| s.hits[i].len()),
            latency: Summary::of(&s.all),
            errors: s.errors.clone(),
            refusals: Summary::of(&s.error_replies),
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct RssPoint {
    pub t_s: f64,
    pub mib: f64,
}

#[derive(Debug, Serialize)]
pub struct OverloadReport {
    /// Misses per second the backend answered in the closed-loop probe.
    pub sustainable_miss_per_s: f64,
    pub probe: PhaseReport,
    pub baseline_hits: PhaseReport,
    pub overload_hits: PhaseReport,
    pub overload_misses: PhaseReport,
    pub recovered_hits: PhaseReport,
    /// From the end of B's miss schedule to the first fresh miss answered (the misses
    /// still queued then, and the drain of those in flight, included).
    pub recovery_s: f64,
    pub idle_connections_held: usize,
    /// Per client that never reads: bytes it wrote over phase B.
    pub never_reader_bytes: Vec<usize>,
    /// Times the server dropped one of them (each then connected again).
    pub never_readers_dropped: usize,
    pub rss_before_overload_mib: Option<f64>,
    pub rss_peak_overload_mib: Option<f64>,
    pub rss_after_mib: Option<f64>,
    pub backend_busy: Option<f64>,
    pub phase_starts_s: [f64; 4],
    pub rss: Vec<RssPoint>,
}

impl OverloadReport {
    /// Hit p99 under overload over the baseline's.
    pub fn hit_p99_ratio(&self) -> f64 {
        self.overload_hits.latency.p99_ms / self.baseline_hits.latency.p99_ms.max(1e-9)
    }

    pub fn rss_growth_mib(&self) -> Option<f64> {
        Some(self.rss_peak_overload_mib? - self.rss_before_overload_mib?)
    }
}

/// akerd's RSS every [`RSS_EVERY`] on a thread of its own.
struct RssSampler {
    points: Arc<Mutex<Vec<RssPoint>>>,
    stop: Arc<AtomicBool>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl RssSampler {
    fn start(pid: Option<u32>, t0: Instant) -> RssSampler {
        let points = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (p, s) = (points.clone(), stop.clone());
        let handle = std::thread::spawn(move || {
            let probe = Daemon::attach("127.0.0.1:1".parse().expect("an address"), pid);
            while !s.load(Ordering::Relaxed) {
                if let Some(b) = probe.rss_bytes() {
                    p.lock().expect("not poisoned").push(RssPoint {
                        t_s: t0.elapsed().as_secs_f64(),
                        mib: b as f64 / (1u64 << 20) as f64,
                    });
                }
                std::thread::sleep(RSS_EVERY);
            }
        });
        RssSampler {
            points,
            stop,
            handle: Some(handle),
        }
    }

    fn last(&self) -> Option<f64> {
        self.points
            .lock()
            .expect("not poisoned")
            .last()
            .map(|p| p.mib)
    }

    fn finish(mut self) -> Vec<RssPoint> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
        std::mem::take(&mut *self.points.lock().expect("not poisoned"))
    }
}

fn peak_between(points: &[RssPoint], from_s: f64, to_s: f64) -> Option<f64> {
    points
        .iter()
        .filter(|p| p.t_s >= from_s && p.t_s <= to_s)
        .map(|p| p.mib)
        .reduce(f64::max)
}

/// The vectors the run sends: the hit set, and fresh misses drawn far from data rows.
struct Vectors {
    dim: usize,
    metric: Metric,
    hits: Vec<f32>,
    rng: StdRng,
    rows: Vec<f32>,
}

impl Vectors {
    fn hit_workload(&self, k: u32, ops: usize) -> Result<Arc<Workload>, String> {
        let n = self.hits.len() / self.dim;
        let trace = Trace {
            dim: self.dim,
            metric: self.metric,
            k,
            vectors: self.hits.clone(),
            ops: (0..ops)
                .map(|i| Op::Search {
                    vector: (i % n) as u32,
                    k,
                })
                .collect(),
            ground_truth: None,
        };
        Workload::from_trace(trace, true).map(Arc::new)
    }

    /// `n` fresh vectors, each searched once (not looped).
    fn miss_workload(&mut self, k: u32, n: usize, spread: f32) -> Result<Arc<Workload>, String> {
        let noise = Normal::new(0.0f32, spread.max(1e-6)).expect("a valid normal");
        let rows = self.rows.len() / self.dim;
        let mut vectors = Vec::with_capacity(n * self.dim);
        for _ in 0..n {
            let r = self.rng.gen_range(0..rows);
            let row = &self.rows[r * self.dim..(r + 1) * self.dim];
            vectors.extend(row.iter().map(|&x| x + noise.sample(&mut self.rng)));
        }
        let trace = Trace {
            dim: self.dim,
            metric: self.metric,
            k,
            vectors,
            ops: (0..n as u32)
                .map(|vector| Op::Search { vector, k })
                .collect(),
            ground_truth: None,
        };
        Workload::from_trace(trace, false).map(Arc::new)
    }

    fn fresh(&mut self, spread: f32) -> Vec<f32> {
        let noise = Normal::new(0.0f32, spread.max(1e-6)).expect("a valid normal");
        let rows = self.rows.len() / self.dim;
        let r = self.rng.gen_range(0..rows);
        self.rows[r * self.dim..(r + 1) * self.dim]
            .iter()
            .map(|&x| x + noise.sample(&mut self.rng))
            .collect()
    }
}

fn engine(cfg: &OverloadConfig, mode: Mode, connections: usize, secs: Duration) -> EngineConfig {
    EngineConfig {
        target: cfg.target,
        mode,
        connections,
        depth: cfg.depth,
        threads: cfg.threads,
        warmup: cfg.warmup,
        duration: secs,
        max_requests: None,
        drain: Duration::from_secs(5),
        connect_timeout: cfg.io_timeout,
        write_timeout: Duration::from_secs(10),
        max_frame_bytes: 1 << 20,
        spin: Duration::ZERO,
        seed: cfg.seed,
        secret: cfg.secret.clone(),
        tls: cfg.tls.clone(),
        batch: None,
    }
}

fn open(rate: f64) -> Mode {
    Mode::Open {
        rate,
        arrival: Arrival::Poisson,
    }
}

fn run_engine(
    e: &EngineConfig,
    w: &Arc<Workload>,
    offered: f64,
    label: &str,
    on_line: &(dyn Fn(&str) + Sync),
) -> Result<PhaseReport, String> {
    let r = worker::run(e, w, |l| {
        on_line(&format!(
            "  {label:<14} {:5.1}s {:8.0}/s  errors {:6}  p50 {:8.3} p99 {:8.3} max {:8.3} ms",
            l.at_s, l.rate, l.errors, l.p50_ms, l.p99_ms, l.max_ms
        ))
    })
    .map_err(|e| format!("{label}: {e}"))?;
    Ok(PhaseReport::of(offered, &r))
}

/// Searches every hit query until each answers EXACT.
fn cache_hit_set(cfg: &OverloadConfig, v: &Vectors) -> Result<(), String> {
    let mut c = cfg.connect().map_err(|e| e.to_string())?;
    for round in 0..SETUP_ROUNDS_MAX {
        let mut exact = 0;
        for q in v.hits.chunks_exact(v.dim) {
            let r = c
                .search_with(SearchRequest::new(cfg.k, q.to_vec()))
                .map_err(|e| format!("setup search: {e}"))?;
            exact += usize::from(r.hit == HitKind::Exact);
        }
        if exact == v.hits.len() / v.dim {
            return Ok(());
        }
        if round + 1 == SETUP_ROUNDS_MAX {
            return Err(format!(
                "only {exact} of {} hit queries answer EXACT after {SETUP_ROUNDS_MAX} rounds",
                v.hits.len() / v.dim
            ));
        }
    }
    Ok(())
}

/// A client that never reads, all through phase B: connects, writes 16 KiB PINGs (whole
/// frames, resumed where a write stopped) and never reads their replies; once the server
/// drops it, it connects again. Returns the bytes written and how many times the server
/// dropped it.
fn never_reader(
    target: SocketAddr,
    tls: Option<&aker::client::ClientTls>,
    stop: &AtomicBool,
) -> (usize, usize) {
    let mut frame = Vec::new();
    let ping = RequestFrame::new(1, Request::Ping(vec![7; HOG_PING_BYTES]));
    encode_request(&ping, &mut frame).expect("a PING encodes");
    let (mut written, mut dropped) = (0usize, 0usize);
    while !stop.load(Ordering::Relaxed) && written < HOG_WRITE_MAX {
        let Some((mut w, sock)) = hog_connection(target, tls) else {
            std::thread::sleep(Duration::from_millis(100));
            continue;
        };
        let _ = sock.set_write_timeout(Some(Duration::from_millis(200)));
        let mut at = 0;
        let closed = loop {
            if stop.load(Ordering::Relaxed) || written >= HOG_WRITE_MAX {
                break false;
            }
            match w.write(&frame[at..]) {
                Ok(0) => break true,
                Ok(n) => {
                    written += n;
                    at = (at + n) % frame.len();
                }
                // Pushed back: the server stopped reading this connection.
                Err(e)
                    if e.kind() == std::io::ErrorKind::WouldBlock
                        || e.kind() == std::io::ErrorKind::TimedOut =>
                {
                    if peer_closed(&sock) {
                        break true;
                    }
                    if tls.is_some() {
                        // Part of a TLS record may be out: writing on would corrupt the
                        // session, so wait for the server to drop the connection.
                        break loop {
                            if stop.load(Ordering::Relaxed) {
                                break false;
                            }
                            if peer_closed(&sock) {
                                break true;
                            }
                            std::thread::sleep(Duration::from_millis(50));
                        };
                    }
                }
                Err(_) => break true,
            }
        };
        dropped += usize::from(closed);
    }
    (written, dropped)
}

/// A never-reader's connection: its writing half (TLS done first with `tls`) and the
/// socket.
fn hog_connection(
    target: SocketAddr,
    tls: Option<&aker::client::ClientTls>,
) -> Option<(aker::client::SplitWrite, TcpStream)> {
    let s = TcpStream::connect(target).ok()?;
    match tls {
        None => Some((aker::client::SplitWrite::Plain(s.try_clone().ok()?), s)),
        Some(tls) => {
            let opts = aker::client::ClientOptions {
                tls: Some(tls.clone()),
                ..Default::default()
            };
            let c = Client::from_stream(s, opts).ok()?;
            let (_, w, sock) = c.into_split().ok()?;
            Some((w, sock))
        }
    }
}

/// Whether the peer has closed or reset `s`, without reading from it (its unread
/// replies stay where they are).
fn peer_closed(s: &TcpStream) -> bool {
    use std::os::fd::AsRawFd;
    let mut p = libc::pollfd {
        fd: s.as_raw_fd(),
        events: libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: one valid pollfd for a socket this function borrows; timeout 0.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n > 0 && p.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0
}

/// What phase B measured.
struct Overloaded {
    hits: PhaseReport,
    misses: PhaseReport,
    idle_held: usize,
    /// Per client that never reads: (bytes written, times dropped by the server).
    hogs: Vec<(usize, usize)>,
    misses_end: Instant,
}

/// Phase B: hits and misses at once, idle connections and never-readers around them.
fn overload_phase(
    cfg: &OverloadConfig,
    hits: &Arc<Workload>,
    misses: &Arc<Workload>,
    miss_rate: f64,
    on_line: &(dyn Fn(&str) + Sync),
) -> Result<Overloaded, String> {
    let mut idle: Vec<Client> = Vec::with_capacity(cfg.idle_connections);
    for _ in 0..cfg.idle_connections {
        match cfg.connect() {
            Ok(c) => idle.push(c),
            Err(_) => break, // at the server's limit: what it holds is what counts
        }
    }
    let held = idle.len();
    let stop = AtomicBool::new(false);
    let secs = cfg.overload;
    // When the misses' schedule ends (the engines start within a few ms of here): the
    // recovery is timed from then, not from after their drain.
    let misses_end = Instant::now() + cfg.warmup + secs;
    std::thread::scope(|s| {
        let hogs: Vec<_> = (0..cfg.never_readers)
            .map(|_| s.spawn(|| never_reader(cfg.target, cfg.tls.as_ref(), &stop)))
            .collect();
        let miss = s.spawn(|| {
            let e = engine(cfg, open(miss_rate), cfg.miss_connections, secs);
            run_engine(&e, misses, miss_rate, "B misses", on_line)
        });
        let e = engine(cfg, open(cfg.hit_rate), cfg.hit_connections, secs);
        let hit = run_engine(&e, hits, cfg.hit_rate, "B hits", on_line);
        let miss = miss.join();
        stop.store(true, Ordering::Relaxed);
        let miss = miss.map_err(|_| "the miss engine panicked".to_string())?;
        let hogs = hogs
            .into_iter()
            .map(|h| h.join().unwrap_or((0, 0)))
            .collect();
        drop(idle);
        Ok(Overloaded {
            hits: hit?,
            misses: miss?,
            idle_held: held,
            hogs,
            misses_end,
        })
    })
}

/// A fresh miss every 20 ms until one is answered; seconds it took.
fn recovery(cfg: &OverloadConfig, v: &mut Vectors, from: Instant) -> Result<f64, String> {
    let mut c = cfg.connect().map_err(|e| e.to_string())?;
    while from.elapsed() < RECOVERY_MAX {
        let q = v.fresh(cfg.miss_spread);
        match c.search_with(SearchRequest::new(cfg.k, q)) {
            Ok(r) if r.hit == HitKind::Miss => return Ok(from.elapsed().as_secs_f64()),
            Ok(_) => {}
            Err(_) if !c.is_broken() => {}
            Err(_) => c = cfg.connect().map_err(|e| e.to_string())?,
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(format!(
        "no fresh miss was answered within {RECOVERY_MAX:?} after the overload"
    ))
}

/// Runs every phase against `daemon`. `rows` are the collection's rows (hits and misses
/// are drawn near them), `hit_queries` of them become the hit set.
pub fn run(
    cfg: &OverloadConfig,
    daemon: &Daemon,
    rows: Vec<f32>,
    dim: usize,
    on_line: &(dyn Fn(&str) + Sync),
) -> Result<OverloadReport, String> {
    let mut hello = cfg.connect().map_err(|e| e.to_string())?;
    let info = hello.server_info().cloned().ok_or("no HELLO reply")?;
    if info.dim as usize != dim {
        return Err(format!("the data has dimension {dim}, akerd {}", info.dim));
    }
    let mut rng = StdRng::seed_from_u64(cfg.seed);
    let n_rows = rows.len() / dim;
    let mut hits = Vec::with_capacity(cfg.hit_queries * dim);
    for _ in 0..cfg.hit_queries.max(1) {
        let r = rng.gen_range(0..n_rows);
        hits.extend(rows[r * dim..(r + 1) * dim].iter().map(|&x| x + 1e-3));
    }
    let mut v = Vectors {
        dim,
        metric: info.metric,
        hits,
        rng,
        rows,
    };
    let t0 = Instant::now();
    let rss = RssSampler::start(daemon.pid, t0);
    on_line("setup: caching the hit set");
    cache_hit_set(cfg, &v)?;
    let hit_w = v.hit_workload(cfg.k, 100_000)?;

    on_line("probe: fresh misses, closed loop");
    let probe_w = v.miss_workload(cfg.k, 200_000, cfg.miss_spread)?;
    let e = EngineConfig {
        warmup: Duration::from_secs(1),
        depth: cfg.probe_inflight.max(1),
        threads: 1,
        ..engine(cfg, Mode::Closed, 1, cfg.probe)
    };
    let probe = run_engine(&e, &probe_w, 0.0, "probe", on_line)?;
    let sustainable = probe.hits_by_kind[0] as f64 / probe.seconds.max(1e-9);

    let start_a = t0.elapsed().as_secs_f64();
    on_line(&format!("A: hits alone at {} /s", cfg.hit_rate));
    let e = engine(cfg, open(cfg.hit_rate), cfg.hit_connections, cfg.baseline);
    let baseline = run_engine(&e, &hit_w, cfg.hit_rate, "A hits", on_line)?;
    let rss_before = rss.last();

    let miss_rate = (sustainable * cfg.miss_factor).max(1.0);
    let total = (miss_rate * (cfg.overload + cfg.warmup).as_secs_f64() * 1.2) as usize + 1_000;
    let miss_w = v.miss_workload(cfg.k, total, cfg.miss_spread)?;
    let start_b = t0.elapsed().as_secs_f64();
    on_line(&format!(
        "B: hits at {} /s + misses at {miss_rate:.0} /s ({} x {sustainable:.0}), {} idle connections, {} clients that never read",
        cfg.hit_rate, cfg.miss_factor, cfg.idle_connections, cfg.never_readers
    ));
    let b = overload_phase(cfg, &hit_w, &miss_w, miss_rate, on_line)?;
    let end_b_s = t0.elapsed().as_secs_f64();
    let recovery_s = recovery(cfg, &mut v, b.misses_end)?;

    let start_c = t0.elapsed().as_secs_f64();
    on_line("C: hits alone again");
    let e = engine(cfg, open(cfg.hit_rate), cfg.hit_connections, cfg.recovered);
    let recovered = run_engine(&e, &hit_w, cfg.hit_rate, "C hits", on_line)?;
    let backend_busy = hello
        .stats()
        .ok()
        .and_then(|t| daemon::stat(&t, "backend_busy"));
    let rss_after = rss.last();
    let points = rss.finish();
    Ok(OverloadReport {
        sustainable_miss_per_s: sustainable,
        probe,
        baseline_hits: baseline,
        overload_hits: b.hits,
        overload_misses: b.misses,
        recovered_hits: recovered,
        recovery_s,
        idle_connections_held: b.idle_held,
        never_reader_bytes: b.hogs.iter().map(|h| h.0).collect(),
        never_readers_dropped: b.hogs.iter().map(|h| h.1).sum(),
        rss_before_overload_mib: rss_before,
        rss_peak_overload_mib: peak_between(&points, start_b, end_b_s),
        rss_after_mib: rss_after,
        backend_busy,
        phase_starts_s: [start_a, start_b, end_b_s, start_c],
        rss: points,
    })
}
