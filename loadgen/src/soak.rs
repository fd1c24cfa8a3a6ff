//! The soak: a long run of mixed searches, inserts, deletes and FLUSHes from many
//! clients against one akerd, checking del-consistency all along and sampling the
//! daemon's memory and latency so that growth shows.
//!
//! ```text
//!  client threads (one connection each, paced at --rate per client)
//!    SEARCH ──reply──► Checker::check(ids, sent_at)   an id whose DELETE was acknowledged
//!                                                     before the search was sent: violation
//!    DELETE ──ack────► Checker::record(id, acked_at)  the top-1 of the client's last search
//!                      then the same search again     (the cached entry that held the id)
//!    INSERT ──ack────► the client's live list         near a query, so cached entries take it
//!    FLUSH  (client 0, every --flush-every)
//!  sampler, every --sample-every: akerd's RSS, the window's latency and counts ─► CSV row
//!  at the end: every live insert searched with BYPASS_CACHE (nothing acknowledged is lost)
//! ```
//!
//! Latency is from the send of each request to its reply (each client waits for its
//! reply before the next request: a paced closed loop, not coordinated-omission
//! corrected; the soak watches for drift, `aker-loadgen` measures tails).

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use aker::client::{Client, ClientError};
use aker::protocol::{HitKind, InsertRequest, SearchReply, SearchRequest, Status};
use aker_formats::data::Dataset;
use aker_formats::zipf::ZipfianGenerator;
use hdrhistogram::Histogram;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Normal};
use serde::Serialize;

use crate::daemon::{self, Daemon};
use crate::stats::new_hist;

/// Violations kept with their details (all are counted).
const VIOLATIONS_KEPT: usize = 100;
/// Live inserts looked up at the end, per client at most.
const LOST_CHECK_PER_CLIENT_MAX: usize = 10_000;
/// A client that loses its connection tries again this many times in a row.
const RECONNECTS_MAX: u32 = 20;

#[derive(Clone, Debug)]
pub struct SoakConfig {
    pub target: SocketAddr,
    pub clients: usize,
    /// Operations per second per client.
    pub rate_per_client: f64,
    pub duration: Duration,
    pub sample_every: Duration,
    /// FLUSH period (client 0); zero: never.
    pub flush_every: Duration,
    /// Percent weights of SEARCH / INSERT / DELETE.
    pub mix: [u32; 3],
    pub k: u32,
    /// Distinct queries (rows of the data near which searches and inserts fall).
    pub queries: usize,
    /// Zipfian skew of query choice.
    pub skew: f64,
    /// Standard deviation of the noise on half the searches and on every insert.
    pub jitter: f32,
    /// Inserts a client keeps before it deletes its oldest.
    pub live_per_client: usize,
    pub io_timeout: Duration,
    pub id_base: u64,
    pub seed: u64,
    /// For a server that requires AUTH.
    pub secret: Option<aker::auth::Secret>,
    /// For a server with `[tls]`.
    pub tls: Option<aker::client::ClientTls>,
}

impl SoakConfig {
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

/// A reply that carried an id after its delete was acknowledged.
#[derive(Clone, Debug, Serialize)]
pub struct Violation {
    pub id: u64,
    pub hit: String,
    pub client: usize,
    /// From the delete's acknowledgement to the search's send.
    pub after_ack_us: u64,
    pub at_s: f64,
}

/// Every acknowledged delete, and the replies checked against them.
#[derive(Default)]
pub struct Checker {
    deleted: Mutex<HashMap<u64, Instant>>,
    kept: Mutex<Vec<Violation>>,
    violations: AtomicU64,
    checked: AtomicU64,
}

impl Checker {
    /// A delete acknowledged at `acked_at` (the first acknowledgement counts).
    pub fn record(&self, id: u64, acked_at: Instant) {
        lock(&self.deleted).entry(id).or_insert(acked_at);
    }

    pub fn is_deleted(&self, id: u64) -> bool {
        lock(&self.deleted).contains_key(&id)
    }

    /// Checks a reply to a search sent at `sent_at`; returns the violations found.
    pub fn check(
        &self,
        reply: &SearchReply,
        sent_at: Instant,
        client: usize,
        t0: Instant,
    ) -> usize {
        self.checked.fetch_add(1, Ordering::Relaxed);
        let deleted = lock(&self.deleted);
        let mut found = Vec::new();
        for n in &reply.neighbors {
            if let Some(&acked) = deleted.get(&n.id) {
                if acked < sent_at {
                    found.push(Violation {
                        id: n.id,
                        hit: format!("{:?}", reply.hit).to_lowercase(),
                        client,
                        after_ack_us: (sent_at - acked).as_micros() as u64,
                        at_s: (sent_at - t0).as_secs_f64(),
                    });
                }
            }
        }
        drop(deleted);
        let n = found.len();
        if n > 0 {
            self.violations.fetch_add(n as u64, Ordering::Relaxed);
            let mut kept = lock(&self.kept);
            let room = VIOLATIONS_KEPT.saturating_sub(kept.len());
            kept.extend(found.into_iter().take(room));
        }
        n
    }

    pub fn violations(&self) -> u64 {
        self.violations.load(Ordering::Relaxed)
    }

    pub fn deletes(&self) -> usize {
        lock(&self.deleted).len()
    }
}

/// What the clients did since the last sample.
struct Window {
    search_us: Histogram<u64>,
    write_us: Histogram<u64>,
    searches: u64,
    hits: u64,
    inserts: u64,
    deletes: u64,
    deletes_absent: u64,
    flushes: u64,
    busy: u64,
    errors: HashMap<String, u64>,
    /// Deletes of a search's first id, each searched again right after.
    top1_deletes: u64,
    /// Of those searches, the ones answered from the cache.
    probe_hits: u64,
}

impl Default for Window {
    fn default() -> Self {
        Window {
            search_us: new_hist(),
            write_us: new_hist(),
            searches: 0,
            hits: 0,
            inserts: 0,
            deletes: 0,
            deletes_absent: 0,
            flushes: 0,
            busy: 0,
            errors: HashMap::new(),
            top1_deletes: 0,
            probe_hits: 0,
        }
    }
}

/// One sample: a CSV row and a point of the PNG.
#[derive(Clone, Debug, Serialize)]
pub struct Sample {
    pub t_s: f64,
    pub rss_mib: Option<f64>,
    pub ops_per_s: f64,
    pub searches: u64,
    pub hit_ratio: f64,
    pub inserts: u64,
    pub deletes: u64,
    pub deletes_absent: u64,
    pub flushes: u64,
    pub busy: u64,
    pub errors: u64,
    pub search_p50_ms: f64,
    pub search_p99_ms: f64,
    pub search_max_ms: f64,
    pub write_p99_ms: f64,
    pub violations_total: u64,
    pub connections: Option<f64>,
    /// A new connection (connect, HELLO, PING) was served at this sample.
    pub fresh_connection_ok: bool,
}

impl Sample {
    pub const CSV_HEADER: &'static str = "t_s,rss_mib,ops_per_s,searches,hit_ratio,inserts,\
        deletes,deletes_absent,flushes,busy,errors,search_p50_ms,search_p99_ms,search_max_ms,\
        write_p99_ms,violations_total,connections,fresh_connection_ok";

    pub fn csv(&self) -> String {
        let opt = |v: Option<f64>| v.map(|x| format!("{x:.1}")).unwrap_or_default();
        format!(
            "{:.1},{},{:.1},{},{:.4},{},{},{},{},{},{},{:.3},{:.3},{:.3},{:.3},{},{},{}",
            self.t_s,
            opt(self.rss_mib),
            self.ops_per_s,
            self.searches,
            self.hit_ratio,
            self.inserts,
            self.deletes,
            self.deletes_absent,
            self.flushes,
            self.busy,
            self.errors,
            self.search_p50_ms,
            self.search_p99_ms,
            self.search_max_ms,
            self.write_p99_ms,
            self.violations_total,
            opt(self.connections),
            u8::from(self.fresh_connection_ok),
        )
    }

    pub fn line(&self) -> String {
        format!(
            "{:7.0}s  rss {:>8}  {:7.0} ops/s  hits {:5.1}%  search p50 {:7.3} p99 {:7.3} max {:8.3} ms  \
             write p99 {:7.3} ms  busy {}  errors {}  violations {}{}",
            self.t_s,
            self.rss_mib
                .map(|m| format!("{m:.1}MiB"))
                .unwrap_or_else(|| "-".into()),
            self.ops_per_s,
            100.0 * self.hit_ratio,
            self.search_p50_ms,
            self.search_p99_ms,
            self.search_max_ms,
            self.write_p99_ms,
            self.busy,
            self.errors,
            self.violations_total,
            if self.fresh_connection_ok {
                ""
            } else {
                "  NEW CONNECTION NOT SERVED"
            },
        )
    }
}

/// The whole run.
#[derive(Debug, Serialize)]
pub struct SoakReport {
    pub seconds: f64,
    pub clients: usize,
    pub searches: u64,
    pub searches_checked: u64,
    pub inserts: u64,
    pub deletes_acknowledged: usize,
    pub flushes: u64,
    pub busy: u64,
    pub errors: HashMap<String, u64>,
    /// Searches answered from the cache, over the run.
    pub hits: u64,
    /// Deletes of a search's first id, each searched again right after; and how many of
    /// those searches the cache answered.
    pub top1_deletes: u64,
    pub top1_research_hits: u64,
    /// Samples whose fresh connection (connect, HELLO, PING) failed.
    pub fresh_connection_failures: u64,
    /// The final check could not run (why).
    pub final_check_error: Option<String>,
    pub violations: u64,
    pub violations_kept: Vec<Violation>,
    pub live_inserts_checked: usize,
    pub live_inserts_missing: usize,
    pub missing_examples: Vec<u64>,
    pub rss_first_half_max_mib: Option<f64>,
    pub rss_second_half_max_mib: Option<f64>,
    pub samples: Vec<Sample>,
}

impl SoakReport {
    /// Growth of the resident set from the run's first half to its second.
    pub fn rss_growth_mib(&self) -> Option<f64> {
        Some(self.rss_second_half_max_mib? - self.rss_first_half_max_mib?)
    }

    pub fn error_count(&self) -> u64 {
        self.errors.values().sum()
    }
}

struct Shared {
    cfg: SoakConfig,
    queries: Vec<Vec<f32>>,
    zipf: ZipfianGenerator,
    checker: Checker,
    window: Mutex<Window>,
    stop: AtomicBool,
    t0: Instant,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// `queries` rows of `data` chosen at random, each moved by noise of `jitter`.
pub fn pick_queries(data: &Dataset, queries: usize, jitter: f32, seed: u64) -> Vec<Vec<f32>> {
    let mut rng = StdRng::seed_from_u64(seed);
    let noise = Normal::new(0.0f32, jitter.max(1e-9)).expect("a valid normal");
    (0..queries.max(2))
        .map(|_| {
            let row = data.row(rng.gen_range(0..data.n));
            row.iter().map(|&x| x + noise.sample(&mut rng)).collect()
        })
        .collect()
}

/// Runs the soak against `daemon`; `on_sample` gets each sample as it is taken.
pub fn run(
    cfg: SoakConfig,
    daemon: &mut Daemon,
    queries: Vec<Vec<f32>>,
    mut on_sample: impl FnMut(&Sample),
) -> Result<SoakReport, String> {
    let shared = Arc::new(Shared {
        zipf: ZipfianGenerator::new(queries.len() as u64, cfg.skew),
        queries,
        checker: Checker::default(),
        window: Mutex::new(Window::default()),
        stop: AtomicBool::new(false),
        t0: Instant::now(),
        cfg,
    });
    let handles: Vec<_> = (0..shared.cfg.clients)
        .map(|i| {
            let s = shared.clone();
            std::thread::Builder::new()
                .name(format!("soak-client-{i}"))
                .spawn(move || client_loop(&s, i))
                .map_err(|e| e.to_string())
        })
        .collect::<Result<_, _>>()?;

    let mut samples = Vec::new();
    let mut totals = Window::default();
    let end = shared.t0 + shared.cfg.duration;
    let mut next = shared.t0 + shared.cfg.sample_every;
    let mut stats_client = shared.cfg.connect().ok();
    while next <= end {
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
        if let Some(status) = daemon.exited() {
            shared.stop.store(true, Ordering::Relaxed);
            return Err(format!("akerd exited during the soak: {status}"));
        }
        let w = std::mem::take(&mut *lock(&shared.window));
        let s = sample(&shared, &w, daemon, &mut stats_client);
        add_window(&mut totals, &w);
        on_sample(&s);
        samples.push(s);
        next += shared.cfg.sample_every;
    }
    shared.stop.store(true, Ordering::Relaxed);
    let mut live = Vec::new();
    for h in handles {
        live.push(h.join().map_err(|_| "a soak client panicked".to_string())?);
    }
    add_window(&mut totals, &lock(&shared.window));
    let (checked, missing, final_check_error) = match check_live_inserts(&shared, &live) {
        Ok((c, m)) => (c, m, None),
        Err(e) => (0, Vec::new(), Some(e)),
    };
    Ok(report(
        &shared,
        totals,
        samples,
        checked,
        missing,
        final_check_error,
    ))
}

fn report(
    shared: &Shared,
    totals: Window,
    samples: Vec<Sample>,
    checked: usize,
    missing: Vec<u64>,
    final_check_error: Option<String>,
) -> SoakReport {
    let half = samples.len() / 2;
    let max_rss = |s: &[Sample]| s.iter().filter_map(|x| x.rss_mib).reduce(f64::max);
    SoakReport {
        seconds: shared.t0.elapsed().as_secs_f64(),
        clients: shared.cfg.clients,
        searches: totals.searches,
        searches_checked: shared.checker.checked.load(Ordering::Relaxed),
        inserts: totals.inserts,
        deletes_acknowledged: shared.checker.deletes(),
        flushes: totals.flushes,
        busy: totals.busy,
        hits: totals.hits,
        top1_deletes: totals.top1_deletes,
        top1_research_hits: totals.probe_hits,
        fresh_connection_failures: samples.iter().filter(|s| !s.fresh_connection_ok).count() as u64,
        final_check_error,
        errors: totals.errors,
        violations: shared.checker.violations(),
        violations_kept: lock(&shared.checker.kept).clone(),
        live_inserts_checked: checked,
        live_inserts_missing: missing.len(),
        missing_examples: missing.into_iter().take(20).collect(),
        rss_first_half_max_mib: max_rss(&samples[..half]),
        rss_second_half_max_mib: max_rss(&samples[half..]),
        samples,
    }
}

fn add_window(total: &mut Window, w: &Window) {
    total.searches += w.searches;
    total.hits += w.hits;
    total.inserts += w.inserts;
    total.deletes += w.deletes;
    total.deletes_absent += w.deletes_absent;
    total.flushes += w.flushes;
    total.busy += w.busy;
    total.top1_deletes += w.top1_deletes;
    total.probe_hits += w.probe_hits;
    for (k, v) in &w.errors {
        *total.errors.entry(k.clone()).or_default() += v;
    }
}

fn sample(
    shared: &Shared,
    w: &Window,
    daemon: &Daemon,
    stats_client: &mut Option<Client>,
) -> Sample {
    let secs = shared.cfg.sample_every.as_secs_f64();
    let ms = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1e3;
    let connections = stats_client
        .as_mut()
        .and_then(|c| c.stats().ok())
        .and_then(|t| daemon::stat(&t, "server_connections_current"));
    if connections.is_none() {
        // Reconnect for the next sample.
        *stats_client = shared.cfg.connect().ok();
    }
    let ops = w.searches + w.inserts + w.deletes + w.deletes_absent + w.flushes;
    Sample {
        t_s: shared.t0.elapsed().as_secs_f64(),
        rss_mib: daemon.rss_bytes().map(|b| b as f64 / (1u64 << 20) as f64),
        ops_per_s: ops as f64 / secs,
        searches: w.searches,
        hit_ratio: if w.searches == 0 {
            0.0
        } else {
            w.hits as f64 / w.searches as f64
        },
        inserts: w.inserts,
        deletes: w.deletes,
        deletes_absent: w.deletes_absent,
        flushes: w.flushes,
        busy: w.busy,
        errors: w.errors.values().sum(),
        search_p50_ms: ms(&w.search_us, 0.5),
        search_p99_ms: ms(&w.search_us, 0.99),
        search_max_ms: w.search_us.max() as f64 / 1e3,
        write_p99_ms: ms(&w.write_us, 0.99),
        violations_total: shared.checker.violations(),
        connections,
        fresh_connection_ok: shared.cfg.connect().and_then(|mut c| c.ping()).is_ok(),
    }
}

/// One client's state.
struct ClientState {
    index: usize,
    rng: StdRng,
    conn: Option<Client>,
    /// Its acknowledged inserts, oldest first, with their vectors.
    live: VecDeque<(u64, Vec<f32>)>,
    next_id: u64,
    /// The last search and the first id of its reply: the next delete's target.
    last: Option<(Vec<f32>, u64)>,
    noise: Normal<f32>,
}

enum Op {
    Search,
    Insert,
    Delete,
}

/// A client: paced operations until the stop flag; returns its live inserts.
fn client_loop(shared: &Shared, index: usize) -> Vec<(u64, Vec<f32>)> {
    let cfg = &shared.cfg;
    let mut st = ClientState {
        index,
        rng: StdRng::seed_from_u64(cfg.seed ^ (index as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)),
        conn: None,
        live: VecDeque::new(),
        next_id: cfg.id_base + ((index as u64) << 32),
        last: None,
        noise: Normal::new(0.0f32, cfg.jitter.max(1e-9)).expect("a valid normal"),
    };
    let spacing = Duration::from_secs_f64(1.0 / cfg.rate_per_client.max(1e-3));
    let mut due = Instant::now();
    let mut next_flush = shared.t0 + cfg.flush_every;
    let mut failures = 0u32;
    while !shared.stop.load(Ordering::Relaxed) {
        std::thread::sleep(due.saturating_duration_since(Instant::now()));
        due = (due + spacing).max(Instant::now() - spacing * 4);
        if st.conn.is_none() {
            match cfg.connect() {
                Ok(c) => st.conn = Some(c),
                Err(e) => {
                    note_error(shared, &e);
                    failures += 1;
                    if failures > RECONNECTS_MAX {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
            }
        }
        let result = if index == 0 && !cfg.flush_every.is_zero() && Instant::now() >= next_flush {
            next_flush += cfg.flush_every;
            flush(shared, &mut st)
        } else {
            match choose(&mut st.rng, cfg.mix) {
                Op::Search => search(shared, &mut st).map(|_| ()),
                Op::Insert => insert(shared, &mut st),
                Op::Delete => delete(shared, &mut st),
            }
        };
        match result {
            Ok(()) => failures = 0,
            Err(e) => {
                let broken = st.conn.as_ref().is_none_or(|c| c.is_broken());
                if !matches!(e.status(), Some(Status::Busy)) {
                    note_error(shared, &e);
                }
                if broken {
                    st.conn = None;
                }
            }
        }
    }
    st.live.into()
}

fn choose(rng: &mut StdRng, mix: [u32; 3]) -> Op {
    let total = mix.iter().sum::<u32>().max(1);
    let r = rng.gen_range(0..total);
    if r < mix[0] {
        Op::Search
    } else if r < mix[0] + mix[1] {
        Op::Insert
    } else {
        Op::Delete
    }
}

fn note_error(shared: &Shared, e: &ClientError) {
    let cause = match e.status() {
        Some(s) => format!("{s}"),
        None => match e {
            ClientError::Timeout => "timeout".into(),
            _ => "connection".into(),
        },
    };
    *lock(&shared.window).errors.entry(cause).or_default() += 1;
}

/// A query, exact half the time and moved by noise otherwise (approximate hits).
fn next_query(shared: &Shared, st: &mut ClientState) -> Vec<f32> {
    let q = &shared.queries[shared.zipf.next(&mut st.rng) as usize];
    if st.rng.gen_bool(0.5) {
        q.clone()
    } else {
        q.iter()
            .map(|&x| x + st.noise.sample(&mut st.rng))
            .collect()
    }
}

fn search(shared: &Shared, st: &mut ClientState) -> aker::client::Result<()> {
    let q = next_query(shared, st);
    search_vector(shared, st, q, false, false)
}

/// Sends one search and checks its reply; remembers it for the next delete.
fn search_vector(
    shared: &Shared,
    st: &mut ClientState,
    vector: Vec<f32>,
    bypass: bool,
    probe: bool,
) -> aker::client::Result<()> {
    let conn = st.conn.as_mut().expect("connected");
    let req = SearchRequest {
        bypass_cache: bypass,
        ..SearchRequest::new(shared.cfg.k, vector.clone())
    };
    let sent = Instant::now();
    let res = conn.search_with(req);
    let took = sent.elapsed();
    let reply = match res {
        Ok(r) => r,
        Err(e) => {
            if matches!(e.status(), Some(Status::Busy)) {
                lock(&shared.window).busy += 1;
            }
            return Err(e);
        }
    };
    shared.checker.check(&reply, sent, st.index, shared.t0);
    {
        let mut w = lock(&shared.window);
        w.searches += 1;
        w.hits += u64::from(reply.hit != HitKind::Miss);
        w.probe_hits += u64::from(probe && reply.hit != HitKind::Miss);
        let _ = w.search_us.record(took.as_micros().max(1) as u64);
    }
    st.last = reply.neighbors.first().map(|n| (vector, n.id));
    Ok(())
}

fn insert(shared: &Shared, st: &mut ClientState) -> aker::client::Result<()> {
    let base = &shared.queries[st.rng.gen_range(0..shared.queries.len())];
    let v: Vec<f32> = base
        .iter()
        .map(|&x| x + st.noise.sample(&mut st.rng))
        .collect();
    // Advanced before the send: an insert that timed out may still have been applied,
    // and its id must never come back with another vector.
    let id = st.next_id;
    st.next_id += 1;
    let conn = st.conn.as_mut().expect("connected");
    let sent = Instant::now();
    conn.insert_with(InsertRequest {
        id,
        collection: 0,
        vector: v.clone(),
        payload: Vec::new(),
    })?;
    let took = sent.elapsed();
    st.live.push_back((id, v));
    let mut w = lock(&shared.window);
    w.inserts += 1;
    let _ = w.write_us.record(took.as_micros().max(1) as u64);
    Ok(())
}

/// Half the time (and whenever it has no insert of its own to delete) the first id of
/// the client's last search, which it then searches again: the entry that served the id
/// must not serve it now. Otherwise its oldest insert. Past `live_per_client` inserts it
/// deletes its oldest one besides, so the collection keeps its size.
fn delete(shared: &Shared, st: &mut ClientState) -> aker::client::Result<()> {
    while st.live.len() > shared.cfg.live_per_client {
        let (id, _) = st.live.pop_front().expect("non-empty");
        delete_id(shared, st, id)?;
    }
    let top1 = st.last.is_some() && (st.live.is_empty() || st.rng.gen_bool(0.5));
    let (id, probe) = if top1 {
        let (q, id) = st.last.take().expect("checked");
        (id, Some(q))
    } else {
        match st.live.pop_front() {
            Some((id, _)) => (id, None),
            None => return search(shared, st),
        }
    };
    delete_id(shared, st, id)?;
    match probe {
        Some(q) => {
            lock(&shared.window).top1_deletes += 1;
            search_vector(shared, st, q, false, true)
        }
        None => Ok(()),
    }
}

fn delete_id(shared: &Shared, st: &mut ClientState, id: u64) -> aker::client::Result<()> {
    let conn = st.conn.as_mut().expect("connected");
    let sent = Instant::now();
    let existed = conn.delete(id)?;
    let acked = Instant::now();
    shared.checker.record(id, acked);
    {
        let mut w = lock(&shared.window);
        if existed {
            w.deletes += 1;
        } else {
            w.deletes_absent += 1;
        }
        let _ = w.write_us.record((acked - sent).as_micros().max(1) as u64);
    }
    Ok(())
}

fn flush(shared: &Shared, st: &mut ClientState) -> aker::client::Result<()> {
    st.conn.as_mut().expect("connected").flush()?;
    lock(&shared.window).flushes += 1;
    st.last = None;
    Ok(())
}

/// Every live insert (not deleted by anyone) searched with BYPASS_CACHE: it must be
/// among the k nearest of its own vector. Returns (checked, missing ids).
fn check_live_inserts(
    shared: &Shared,
    live: &[Vec<(u64, Vec<f32>)>],
) -> Result<(usize, Vec<u64>), String> {
    let mut conn = shared
        .cfg
        .connect()
        .map_err(|e| format!("the final check cannot connect: {e}"))?;
    let mut checked = 0;
    let mut missing = Vec::new();
    for list in live {
        for (id, v) in list.iter().rev().take(LOST_CHECK_PER_CLIENT_MAX) {
            if shared.checker.is_deleted(*id) {
                continue;
            }
            let req = SearchRequest {
                bypass_cache: true,
                ..SearchRequest::new(shared.cfg.k, v.clone())
            };
            let reply = conn
                .search_with(req)
                .map_err(|e| format!("the final check's search failed: {e}"))?;
            checked += 1;
            if !reply.neighbors.iter().any(|n| n.id == *id) {
                missing.push(*id);
            }
        }
    }
    Ok((checked, missing))
}

/// Two panels over time: akerd's RSS, and the search p50 / p99 and write p99.
pub fn plot(path: &std::path::Path, title: &str, samples: &[Sample]) -> Result<(), String> {
    use plotters::prelude::*;
    let err = |e: &dyn std::fmt::Display| format!("cannot draw {}: {e}", path.display());
    let t_max = samples.iter().map(|s| s.t_s / 60.0).fold(0.1, f64::max);
    let rss: Vec<(f64, f64)> = samples
        .iter()
        .filter_map(|s| Some((s.t_s / 60.0, s.rss_mib?)))
        .collect();
    let rss_max = rss.iter().map(|p| p.1).fold(1.0, f64::max) * 1.15;
    let lat_max = samples
        .iter()
        .map(|s| s.search_p99_ms.max(s.write_p99_ms))
        .fold(0.01, f64::max)
        * 1.15;

    let root = BitMapBackend::new(path, (1000, 760)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let root = root
        .titled(title, ("sans-serif", 22))
        .map_err(|e| err(&e))?;
    let (top, bottom) = root.split_vertically(360);
    let mut c = ChartBuilder::on(&top)
        .margin(14)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..t_max, 0f64..rss_max)
        .map_err(|e| err(&e))?;
    c.configure_mesh()
        .x_desc("minutes")
        .y_desc("akerd RSS (MiB)")
        .draw()
        .map_err(|e| err(&e))?;
    let blue = RGBColor(31, 119, 180);
    c.draw_series(LineSeries::new(rss, blue.stroke_width(2)))
        .map_err(|e| err(&e))?;

    let mut c = ChartBuilder::on(&bottom)
        .margin(14)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..t_max, 0f64..lat_max)
        .map_err(|e| err(&e))?;
    c.configure_mesh()
        .x_desc("minutes")
        .y_desc("latency per 10 s window (ms)")
        .draw()
        .map_err(|e| err(&e))?;
    type Get = fn(&Sample) -> f64;
    let series: [(&str, RGBColor, Get); 3] = [
        ("search p50", RGBColor(31, 119, 180), |s| s.search_p50_ms),
        ("search p99", RGBColor(214, 39, 40), |s| s.search_p99_ms),
        ("insert/delete p99", RGBColor(44, 160, 44), |s| {
            s.write_p99_ms
        }),
    ];
    for (name, color, get) in series {
        let pts: Vec<(f64, f64)> = samples.iter().map(|s| (s.t_s / 60.0, get(s))).collect();
        c.draw_series(LineSeries::new(pts, color.stroke_width(2)))
            .map_err(|e| err(&e))?
            .label(name)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
    }
    c.configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use aker::protocol::Neighbor;

    fn reply(ids: &[u64]) -> SearchReply {
        SearchReply {
            hit: HitKind::Exact,
            distances_to_query: true,
            neighbors: ids
                .iter()
                .map(|&id| Neighbor { id, distance: 0.0 })
                .collect(),
            token: None,
            routing_version: 0,
        }
    }

    #[test]
    fn the_checker_flags_only_searches_sent_after_the_ack() {
        let c = Checker::default();
        let t0 = Instant::now();
        let before = Instant::now();
        std::thread::sleep(Duration::from_millis(2));
        c.record(7, Instant::now());
        std::thread::sleep(Duration::from_millis(2));
        let after = Instant::now();
        // In flight when the delete was acknowledged: allowed.
        assert_eq!(c.check(&reply(&[7, 8]), before, 0, t0), 0);
        assert_eq!(c.check(&reply(&[8, 9]), after, 0, t0), 0);
        assert_eq!(c.check(&reply(&[1, 7]), after, 3, t0), 1);
        // A second acknowledgement does not move the first.
        c.record(7, Instant::now());
        assert_eq!(c.check(&reply(&[7]), after, 0, t0), 1);
        assert_eq!(c.violations(), 2);
        let kept = lock(&c.kept).clone();
        assert_eq!((kept[0].id, kept[0].client), (7, 3));
        assert!(kept[0].after_ack_us >= 1_000, "{kept:?}");
        assert_eq!(c.deletes(), 1);
    }

    #[test]
    fn the_report_measures_growth_from_the_first_half_to_the_second() {
        let s = |t: f64, rss: f64| Sample {
            t_s: t,
            rss_mib: Some(rss),
            ops_per_s: 0.0,
            searches: 0,
            hit_ratio: 0.0,
            inserts: 0,
            deletes: 0,
            deletes_absent: 0,
            flushes: 0,
            busy: 0,
            errors: 0,
            search_p50_ms: 0.0,
            search_p99_ms: 0.0,
            search_max_ms: 0.0,
            write_p99_ms: 0.0,
            violations_total: 0,
            connections: None,
            fresh_connection_ok: true,
        };
        let samples = vec![s(10.0, 50.0), s(20.0, 80.0), s(30.0, 81.0), s(40.0, 95.0)];
        let shared = Shared {
            cfg: SoakConfig {
                target: "127.0.0.1:1".parse().unwrap(),
                clients: 1,
                rate_per_client: 1.0,
                duration: Duration::from_secs(40),
                sample_every: Duration::from_secs(10),
                flush_every: Duration::ZERO,
                mix: [1, 1, 1],
                k: 1,
                queries: 1,
                skew: 0.5,
                jitter: 0.1,
                live_per_client: 1,
                io_timeout: Duration::from_secs(1),
                id_base: 0,
                seed: 0,
                secret: None,
                tls: None,
            },
            queries: vec![vec![0.0], vec![1.0]],
            zipf: ZipfianGenerator::new(2, 0.5),
            checker: Checker::default(),
            window: Mutex::new(Window::default()),
            stop: AtomicBool::new(false),
            t0: Instant::now(),
        };
        let r = report(&shared, Window::default(), samples, 0, vec![], None);
        assert_eq!(r.rss_first_half_max_mib, Some(80.0));
        assert_eq!(r.rss_second_half_max_mib, Some(95.0));
        assert_eq!(r.rss_growth_mib(), Some(15.0));
        assert!(s(1.0, 1.0).csv().split(',').count() == Sample::CSV_HEADER.split(',').count());
    }
}
