//! `akerd --demo`: the daemon in-process on 127.0.0.1 (port chosen by the kernel) over a
//! generated collection, a short client workload through the pipelined client, and a
//! table of what happened: hit ratio by kind, recall@10 against brute-force exact
//! neighbours, latency for hits and misses, throughput. Then a clean stop.
//!
//! The workload is the paper's shape in miniature: query groups (a base query and its
//! near duplicates, at most ~half of the base's nearest-neighbour distance away), a
//! group picked by a scrambled Zipfian rank, a member uniformly; so repeats (exact and
//! alias hits), near queries (approximate hits) and misses all occur.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, StandardNormal, Zipf};
use shards::store::ExactStore;
use shards::{Backend, Metric};

use crate::client::{ClientOptions, Pipeline};
use crate::config::{Config, IndexKind};
use crate::metrics::{Snapshot, Value};
use crate::protocol::{HitKind, Reply, Request, SearchRequest};
use crate::service::{Daemon, Dataset, StartPlan};

#[derive(Clone, Debug)]
pub struct DemoOptions {
    /// Executors (default 2); `cpus` pins them.
    pub executors: Option<usize>,
    pub cpus: Vec<usize>,
    pub shards: Option<usize>,
    pub n: usize,
    pub dim: usize,
    pub clusters: usize,
    pub groups: usize,
    pub members: usize,
    pub requests: usize,
    /// Zipfian exponent of group popularity.
    pub skew: f64,
    pub k: u32,
    /// Pool budget in objects, as a fraction of the collection.
    pub pool_fraction: f64,
    pub clients: usize,
    pub window: usize,
    pub index: IndexKind,
    /// Override `[sharding] rebalance_ms` (default: the daemon's).
    pub rebalance_ms: Option<u64>,
    pub seed: u64,
}

impl Default for DemoOptions {
    fn default() -> Self {
        DemoOptions {
            executors: None,
            cpus: Vec::new(),
            shards: None,
            n: 20_000,
            dim: 32,
            clusters: 64,
            groups: 1_000,
            members: 10,
            requests: 40_000,
            skew: 0.99,
            k: 10,
            pool_fraction: 0.25,
            clients: 2,
            // Two requests in flight per client: at 16 the clients keep both backend
            // threads saturated with misses, and the recall floor's checks, which run
            // only in the backend's spare time, would never get a turn.
            window: 2,
            // At 20,000 vectors a brute-force scan (~0.35 ms) is as fast as hnsw_rs and
            // needs no build (HNSW: ~7 s on 2 cores); misses then show exact recall.
            index: IndexKind::Exact,
            rebalance_ms: None,
            seed: 42,
        }
    }
}

/// Per hit kind (wire order: miss, exact, alias, approximate).
#[derive(Clone, Debug)]
pub struct KindRow {
    pub count: u64,
    pub recall_sum: f64,
    pub client_latency: Histogram<u64>,
}

impl Default for KindRow {
    fn default() -> Self {
        KindRow {
            count: 0,
            recall_sum: 0.0,
            client_latency: Histogram::new_with_bounds(1, 60_000_000_000, 2).expect("bounds"),
        }
    }
}

impl KindRow {
    fn add(&mut self, o: &KindRow) {
        self.count += o.count;
        self.recall_sum += o.recall_sum;
        let _ = self.client_latency.add(&o.client_latency);
    }
}

/// What the demo measured.
#[derive(Debug)]
pub struct DemoReport {
    pub kinds: [KindRow; 4],
    pub errors: u64,
    pub workload: Duration,
    pub setup: Duration,
    /// Of `setup`: building the index and starting the daemon.
    pub start: Duration,
    pub ground_truth: Duration,
    pub executors: usize,
    pub shards: usize,
    pub pool_objects: usize,
    pub(crate) server: Snapshot,
}

impl DemoReport {
    pub fn total(&self) -> u64 {
        self.kinds.iter().map(|k| k.count).sum()
    }
    pub fn hits(&self) -> u64 {
        self.kinds[1..].iter().map(|k| k.count).sum()
    }
    pub fn recall(&self) -> f64 {
        self.kinds.iter().map(|k| k.recall_sum).sum::<f64>() / self.total().max(1) as f64
    }
}

/// A query group: the base and its near duplicates.
struct Workload {
    queries: Vec<Vec<f32>>,
    /// Request stream: indices into `queries`.
    stream: Vec<usize>,
}

fn unit(rng: &mut StdRng, dim: usize) -> Vec<f32> {
    let v: Vec<f32> = (0..dim).map(|_| rng.sample(StandardNormal)).collect();
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
    v.into_iter().map(|x| x / norm).collect()
}

fn workload(o: &DemoOptions, bases: &Dataset, exact: &ExactStore) -> Workload {
    let mut rng = StdRng::seed_from_u64(o.seed ^ 0x9e37);
    let mut queries = Vec::with_capacity(bases.len() * o.members);
    for g in 0..bases.len() {
        let base = bases.row(g);
        // Plain-L2 distance to the nearest stored vector sets the group's scale.
        let r1 = exact
            .search(base, 1)
            .ok()
            .and_then(|c| c.first().map(|c| c.distance.sqrt()))
            .unwrap_or(1.0)
            .max(1e-6);
        queries.push(base.to_vec());
        for _ in 1..o.members {
            let rho: f32 = rng.gen_range(0.0..0.45);
            let u = unit(&mut rng, o.dim);
            queries.push(base.iter().zip(&u).map(|(b, d)| b + rho * r1 * d).collect());
        }
    }
    // Scrambled Zipfian: popularity rank -> group through a fixed permutation.
    let mut perm: Vec<usize> = (0..bases.len()).collect();
    perm.shuffle(&mut rng);
    let zipf = Zipf::new(bases.len() as u64, o.skew).expect("zipf parameters");
    let stream = (0..o.requests)
        .map(|_| {
            let rank = (zipf.sample(&mut rng) as usize).clamp(1, bases.len()) - 1;
            perm[rank] * o.members + rng.gen_range(0..o.members)
        })
        .collect();
    Workload { queries, stream }
}

/// Exact top-k ids of every requested query, on `threads` threads.
fn ground_truth(
    exact: &ExactStore,
    w: &Workload,
    k: usize,
    threads: usize,
) -> HashMap<usize, HashSet<u64>> {
    let distinct: Vec<usize> = w
        .stream
        .iter()
        .copied()
        .collect::<HashSet<_>>()
        .into_iter()
        .collect();
    let chunk = distinct.len().div_ceil(threads.max(1)).max(1);
    std::thread::scope(|s| {
        let parts: Vec<_> = distinct
            .chunks(chunk)
            .map(|part| {
                s.spawn(move || {
                    part.iter()
                        .map(|&q| {
                            let ids = exact
                                .search(&w.queries[q], k)
                                .map(|c| c.iter().map(|c| c.id).collect())
                                .unwrap_or_default();
                            (q, ids)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        parts
            .into_iter()
            .flat_map(|h| h.join().expect("ground truth thread"))
            .collect()
    })
}

/// One client connection: its share of the stream, pipelined.
fn client(
    addr: SocketAddr,
    window: usize,
    k: u32,
    w: &Workload,
    mine: &[usize],
    truth: &HashMap<usize, HashSet<u64>>,
) -> Result<([KindRow; 4], u64), String> {
    let opts = ClientOptions {
        io_timeout: Some(Duration::from_secs(10)),
        ..ClientOptions::default()
    };
    let (mut p, _) =
        Pipeline::connect_negotiated(addr, window, opts).map_err(|e| format!("connect: {e}"))?;
    let mut rows: [KindRow; 4] = Default::default();
    let mut errors = 0u64;
    let mut sent: HashMap<u64, (usize, Instant)> = HashMap::with_capacity(window * 2);
    let mut take = |p: &mut Pipeline,
                    sent: &mut HashMap<u64, (usize, Instant)>,
                    rows: &mut [KindRow; 4]|
     -> Result<(), String> {
        let (id, reply) = p.recv().map_err(|e| format!("recv: {e}"))?;
        let Some((q, at)) = sent.remove(&id) else {
            return Err(format!("reply to unknown request {id}"));
        };
        match reply {
            Reply::Search(r) => {
                let row = &mut rows[r.hit.code() as usize];
                row.count += 1;
                row.client_latency
                    .saturating_record(at.elapsed().as_nanos() as u64);
                let t = &truth[&q];
                let found = r.neighbors.iter().filter(|n| t.contains(&n.id)).count();
                row.recall_sum += found as f64 / t.len().max(1) as f64;
            }
            _ => errors += 1,
        }
        Ok(())
    };
    for &q in mine {
        // Keep the window full, reading replies as they come.
        while p.in_flight() + p.ready() >= window {
            take(&mut p, &mut sent, &mut rows)?;
        }
        let at = Instant::now();
        let id = p
            .send(Request::Search(SearchRequest::new(k, w.queries[q].clone())))
            .map_err(|e| format!("send: {e}"))?;
        p.flush().map_err(|e| format!("send: {e}"))?;
        sent.insert(id, (q, at));
    }
    while p.in_flight() + p.ready() > 0 {
        take(&mut p, &mut sent, &mut rows)?;
    }
    Ok((rows, errors))
}

/// Runs the demo and returns its measurements (no printing).
pub fn measure(o: &DemoOptions) -> Result<DemoReport, String> {
    let t0 = Instant::now();
    let all = aker_formats::data::synthetic(o.n + o.groups, o.dim, o.clusters, o.seed);
    let collection = Dataset::new(o.dim, all.data[..o.n * o.dim].to_vec())?;
    let bases = Dataset::new(o.dim, all.data[o.n * o.dim..].to_vec())?;
    let exact =
        ExactStore::from_rows(o.dim, Metric::L2Sq, &collection.data).map_err(|e| e.to_string())?;

    let executors = o.executors.unwrap_or(2).max(1);
    let pool_objects = ((o.n as f64 * o.pool_fraction) as usize).max(100);
    let mut cfg = Config::default();
    cfg.server.listen = SocketAddr::from(([127, 0, 0, 1], 0));
    cfg.server.executors = executors;
    cfg.server.cpus = o.cpus.clone();
    cfg.server.max_inflight = o.window.max(1) as u32;
    cfg.admin.enabled = false;
    cfg.cache.capacity_objects = Some(pool_objects);
    cfg.backend.index = o.index;
    if let Some(s) = o.shards {
        cfg.sharding.shards = s;
    }
    if let Some(ms) = o.rebalance_ms {
        cfg.sharding.rebalance_ms = ms;
    }
    let shards = cfg.sharding.shard_count(executors);
    let w = workload(o, &bases, &exact);
    let t_data = t0.elapsed();
    let plan = StartPlan::with_data(collection);
    let daemon = Daemon::start_plan(&cfg, plan).map_err(|e| e.to_string())?;
    let setup = t0.elapsed();
    let start = setup - t_data;

    let t1 = Instant::now();
    let truth = ground_truth(&exact, &w, o.k as usize, 2);
    let ground_truth = t1.elapsed();

    let clients = o.clients.max(1);
    let shares: Vec<Vec<usize>> = (0..clients)
        .map(|c| w.stream.iter().skip(c).step_by(clients).copied().collect())
        .collect();
    let addr = daemon.local_addr();
    let t2 = Instant::now();
    let results: Vec<Result<([KindRow; 4], u64), String>> = std::thread::scope(|s| {
        let hs: Vec<_> = shares
            .iter()
            .map(|mine| {
                let (w, truth) = (&w, &truth);
                s.spawn(move || client(addr, o.window.max(1), o.k, w, mine, truth))
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("client panicked".into())))
            .collect()
    });
    let workload = t2.elapsed();
    let server = daemon.snapshot();
    daemon.stop().map_err(|e| format!("stop: {e}"))?;

    let mut kinds: [KindRow; 4] = Default::default();
    let mut errors = 0;
    for r in results {
        let (rows, e) = r?;
        for (a, b) in kinds.iter_mut().zip(&rows) {
            a.add(b);
        }
        errors += e;
    }
    Ok(DemoReport {
        kinds,
        errors,
        workload,
        setup,
        start,
        ground_truth,
        executors,
        shards,
        pool_objects,
        server,
    })
}

fn us(h: &Histogram<u64>, q: f64) -> String {
    if h.is_empty() {
        "-".into()
    } else {
        format!("{:.0}", h.value_at_quantile(q) as f64 / 1e3)
    }
}

/// Server-side percentile in µs from the snapshot's latency lines.
fn server_us(s: &Snapshot, kind: Option<&str>, q: f64) -> String {
    let labels: &[&str] = match kind {
        Some("backend_search") => &["backend_search"],
        Some(k) => &["search", k],
        None => &["search"],
    };
    s.latency(labels)
        .filter(|h| !h.is_empty())
        .map(|h| format!("{:.1}", h.value_at_quantile(q) as f64 / 1e3))
        .unwrap_or_else(|| "-".into())
}

/// A gauge with one label value, or a counter (the demo's reading of the floor).
fn labelled(s: &Snapshot, family: &str, label: &str) -> Option<f64> {
    match s.find(family, &[label])?.value {
        Value::Gauge(v) => Some(v),
        Value::Counter(v) => Some(v as f64),
        Value::Latency(_) => None,
    }
}

/// akerd's own estimate of a row's recall (relative to the backend; here exact, so true
/// recall) and the checks it rests on.
fn estimate_cell(s: &Snapshot, row: &str) -> String {
    let kind = match row {
        "exact" | "alias" | "approximate" => row,
        "all" => {
            return match (s.value("recall_estimate"), s.value("recall_estimate_low")) {
                (Some(e), Some(l)) => format!("{e:.3} (>= {l:.3})"),
                _ => "-".into(),
            }
        }
        _ => return String::new(),
    };
    match (
        labelled(s, "recall_kind_estimate", kind),
        labelled(s, "recall_kind_checks", kind),
    ) {
        (Some(_), Some(n)) if n < 10.0 => format!("- ({n:.0} checks)"),
        (Some(e), Some(n)) => format!("{e:.3} ({n:.0} checks)"),
        _ => "-".into(),
    }
}

/// The floor, its state and what its checks cost.
fn floor_line(s: &Snapshot) -> String {
    let code = s.value("recall_floor_state").unwrap_or(0.0) as usize;
    let state = crate::metrics::recall_state_name(code).unwrap_or("unavailable");
    let Some(floor) = s.value("recall_floor") else {
        return format!("recall floor: {state}");
    };
    let dropped: f64 = ["busy", "rate", "full", "stale"]
        .iter()
        .filter_map(|r| labelled(s, "recall_checks_dropped", r))
        .sum();
    format!(
        "recall floor {floor}: {state}, threshold scale {}; {} checks against the backend, {} \
         sampled hits left unchecked (backend busy or over the rate), {} entries repaired",
        s.value("recall_threshold_scale").unwrap_or(1.0),
        s.value("recall_checks_done").unwrap_or(0.0),
        dropped,
        s.value("recall_repairs").unwrap_or(0.0),
    )
}

/// Runs the demo and prints its table.
pub fn run(o: &DemoOptions) -> Result<(), String> {
    let started = Instant::now();
    let r = measure(o)?;
    print_setup(o, &r);
    println!();
    print_kinds(&r);
    println!();
    print_totals(&r, started);
    if r.errors > 0 {
        return Err(format!("{} requests failed", r.errors));
    }
    Ok(())
}

/// What ran: the collection, the daemon's shape, the workload.
fn print_setup(o: &DemoOptions, r: &DemoReport) {
    println!(
        "akerd demo: {} x {} clustered synthetic vectors, embedded {} backend, {} executors, {} shards,",
        o.n,
        o.dim,
        match o.index {
            IndexKind::Hnsw => "HNSW",
            IndexKind::Exact => "exact",
        },
        r.executors,
        r.shards
    );
    println!(
        "  pool {} objects ({:.0}% of the collection); {} searches (k = {}) over {} groups x {} near duplicates,",
        r.pool_objects,
        o.pool_fraction * 100.0,
        r.total(),
        o.k,
        o.groups,
        o.members
    );
    println!(
        "  Zipfian {} popularity, {} pipelined clients (window {}) on 127.0.0.1",
        o.skew, o.clients, o.window
    );
}

/// The table by answer kind: share, recall, akerd's estimate, client and server latency.
fn print_kinds(r: &DemoReport) {
    println!(
        "  {:<12} {:>7} {:>10} {:>18} {:>22} {:>22}",
        "answer",
        "share",
        "recall@10",
        "akerd's estimate",
        "client p50 / p99 (us)",
        "server p50 / p99 (us)"
    );
    let mut hits = KindRow::default();
    for k in &r.kinds[1..] {
        hits.add(k);
    }
    let mut all = hits.clone();
    all.add(&r.kinds[0]);
    let rows: [(&str, &KindRow, Option<&str>); 6] = [
        (
            "exact",
            &r.kinds[HitKind::Exact.code() as usize],
            Some("exact"),
        ),
        (
            "alias",
            &r.kinds[HitKind::Alias.code() as usize],
            Some("alias"),
        ),
        (
            "approximate",
            &r.kinds[HitKind::Approximate.code() as usize],
            Some("approximate"),
        ),
        ("all hits", &hits, None),
        (
            "miss",
            &r.kinds[HitKind::Miss.code() as usize],
            Some("miss"),
        ),
        ("all", &all, None),
    ];
    let total = r.total().max(1);
    for (name, row, kind) in rows {
        print_kind_row(r, name, row, kind, total);
    }
}

/// One row of the kind table; `kind` names the server's histogram (none for the sums of
/// kinds: the server's over all of them is shown for `all` alone).
fn print_kind_row(r: &DemoReport, name: &str, row: &KindRow, kind: Option<&str>, total: u64) {
    let server = match (name, kind) {
        (_, Some(k)) => format!(
            "{} / {}",
            server_us(&r.server, Some(k), 0.5),
            server_us(&r.server, Some(k), 0.99)
        ),
        ("all", None) => format!(
            "{} / {}",
            server_us(&r.server, None, 0.5),
            server_us(&r.server, None, 0.99)
        ),
        _ => "".into(),
    };
    println!(
        "  {:<12} {:>6.1}% {:>10} {:>18} {:>22} {:>22}",
        name,
        100.0 * row.count as f64 / total as f64,
        if row.count == 0 {
            "-".into()
        } else {
            format!("{:.3}", row.recall_sum / row.count as f64)
        },
        estimate_cell(&r.server, name),
        format!(
            "{} / {}",
            us(&row.client_latency, 0.5),
            us(&row.client_latency, 0.99)
        ),
        server
    );
}

/// Throughput and the daemon's counters, the recall floor, the backend's latency, and
/// where the wall time went.
fn print_totals(r: &DemoReport, started: Instant) {
    let v = |name: &str| r.server.value(name).unwrap_or(0.0) as u64;
    println!(
        "  throughput {:.0} searches/s ({} in {:.2} s); admissions {}, evictions {}, aliases linked {}, hints dropped {}, centroids moved {}, errors {}",
        r.total() as f64 / r.workload.as_secs_f64().max(1e-9),
        r.total(),
        r.workload.as_secs_f64(),
        v("admissions"),
        v("evictions"),
        v("aliases_linked"),
        v("hints_dropped"),
        v("router_centroids_moved"),
        r.errors
    );
    println!("  {}", floor_line(&r.server));
    println!(
        "  backend search (queue + scan) as the executors waited for it: p50 {} us, p99 {} us",
        server_us(&r.server, Some("backend_search"), 0.5),
        server_us(&r.server, Some("backend_search"), 0.99),
    );
    println!(
        "  wall {:.2} s: data {:.2} s, index + start {:.2} s, ground truth {:.2} s, workload {:.2} s, stop",
        started.elapsed().as_secs_f64(),
        (r.setup - r.start).as_secs_f64(),
        r.start.as_secs_f64(),
        r.ground_truth.as_secs_f64(),
        r.workload.as_secs_f64()
    );
}
