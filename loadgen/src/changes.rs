//! `aker-changes`: how far behind PostgreSQL akerd's change stream runs, and what akerd
//! still serves, while the table takes SQL writes that do not go through akerd.
//!
//! ```text
//!  phase "capacity": W writer connections, closed loop, no akerd searches ─► R writes/s
//!  phase f (each --fractions):
//!    W writer connections, open loop at f·R writes/s in total (f = 0: none)
//!    S akerd clients, closed loop SEARCH k over a fixed query pool ─► searches per second
//!    probe (every phase): every 100 ms
//!        INSERT a row (autocommit) ── commit instant t0
//!        SELECT pg_current_wal_lsn() ── L (same connection, right after the commit)
//!        STATS every 1 ms until pg_changes_applied_lsn >= L ── instant t1
//!        lag = t1 - t0 ─► histogram (10 s without it: a timeout)
//!    then: catch-up, the time until akerd has applied the WAL's position at the end
//! ```
//!
//! Every SQL write is its own autocommit transaction: half INSERT a new row (an id above
//! the table's max id, the vector of a sampled row plus Gaussian noise, so it lands near
//! the cached queries), half DELETE a row this tool inserted (an INSERT when none is
//! left), so the table's size stays about constant and its original rows stay. At the
//! end the rows this tool inserted and did not delete are deleted (unless --keep-rows).
//!
//! Every loop is bounded by its phase's time and a count; every statement by
//! `statement_timeout` (SET once per session) and, client side, a bit more.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Barrier, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use aker::auth::Secret;
use aker::client::{Client as Aker, ClientOptions};
use aker::protocol::HitKind;
use aker::service::pgvector::sql::{describe, quote_ident as quote};
use hdrhistogram::Histogram;
use pgvector::Vector;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Normal};
use tokio::runtime::Runtime;
use tokio_postgres::types::PgLsn;
use tokio_postgres::{Client, NoTls, Statement};

use crate::schedule::{Arrival, Schedule};

/// Writes one writer thread makes in a phase at most.
const WRITES_MAX_PER_THREAD: u64 = 10_000_000;
/// Searches one search thread makes in a phase at most.
const SEARCHES_MAX_PER_THREAD: u64 = 100_000_000;
/// STATS reads of one probe at most (with its time bound, whichever first).
const POLLS_MAX_PER_PROBE: u64 = 100_000;
/// How long the end-of-phase catch-up may take before it is reported as not reached.
const CATCH_UP_MAX: Duration = Duration::from_secs(30);
/// Pause between reconnection attempts (PostgreSQL or akerd) within a phase.
const RECONNECT_PAUSE: Duration = Duration::from_millis(200);
/// Rows deleted per statement by the final clean-up.
const CLEANUP_BATCH: usize = 5_000;

/// What the probe compares akerd's applied position with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeLsn {
    /// `pg_current_wal_lsn()`: the WAL written so far (at or past the probe's commit).
    Write,
    /// `pg_current_wal_flush_lsn()`: the WAL flushed so far, what akerd's follower reads
    /// (at or past the probe's commit too with synchronous_commit on; never later than
    /// `Write`, so a slightly tighter bound).
    Flush,
}

impl ProbeLsn {
    fn sql(self) -> &'static str {
        match self {
            ProbeLsn::Write => "SELECT pg_current_wal_lsn()",
            ProbeLsn::Flush => "SELECT pg_current_wal_flush_lsn()",
        }
    }

    pub fn function(self) -> &'static str {
        match self {
            ProbeLsn::Write => "pg_current_wal_lsn()",
            ProbeLsn::Flush => "pg_current_wal_flush_lsn()",
        }
    }
}

impl std::str::FromStr for ProbeLsn {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "write" => Ok(ProbeLsn::Write),
            "flush" => Ok(ProbeLsn::Flush),
            _ => Err(format!("'{s}' is neither 'write' nor 'flush'")),
        }
    }
}

/// Where the table is.
#[derive(Clone, Debug)]
pub struct PgConn {
    /// libpq URL without a password.
    pub url: String,
    pub password: Option<String>,
    pub table: String,
    pub id_column: String,
    pub vector_column: String,
    pub statement_timeout: Duration,
}

/// The whole run's settings.
#[derive(Clone)]
pub struct Config {
    pub pg: PgConn,
    pub akerd: SocketAddr,
    pub secret: Option<Secret>,
    pub phase: Duration,
    pub writers: usize,
    pub fractions: Vec<f64>,
    pub search_threads: usize,
    /// The fixed query pool (and the rows sampled for it and for the inserts).
    pub queries: usize,
    pub k: u32,
    /// Noise of queries and inserted vectors, relative to the rows' RMS component.
    pub noise: f32,
    pub arrival: Arrival,
    pub probe_every: Duration,
    pub probe_timeout: Duration,
    pub stats_poll: Duration,
    pub probe_lsn: ProbeLsn,
    /// One SEARCH of every pool query before the first search phase (not counted).
    pub warm: bool,
    pub keep_rows: bool,
    pub seed: u64,
}

/// The table as found at the start.
#[derive(Clone, Debug)]
pub struct TableInfo {
    pub rows: i64,
    pub dim: usize,
    pub max_id: i64,
    pub server_version: String,
    /// Rows sampled (their vectors; queries and inserts are drawn near them).
    pub sampled: usize,
    /// The noise's standard deviation per component (absolute).
    pub sigma: f32,
}

/// A blocking PostgreSQL session: its own current-thread runtime, `statement_timeout`
/// set once, the write statements prepared.
struct Session {
    rt: Runtime,
    c: Client,
    insert: Statement,
    delete: Statement,
    /// Client-side bound on one call (the statement timeout and a margin).
    bound: Duration,
}

impl Session {
    fn open(pg: &PgConn, app: &str) -> Result<Session, String> {
        let rt = aker::service::pgvector::runtime().map_err(|e| format!("tokio runtime: {e}"))?;
        let mut cfg: tokio_postgres::Config = pg.url.parse().map_err(|e| format!("--pg: {e}"))?;
        if let Some(p) = &pg.password {
            cfg.password(p);
        }
        cfg.connect_timeout(Duration::from_secs(5));
        cfg.application_name(app);
        let bound = pg.statement_timeout + Duration::from_secs(5);
        let (c, insert, delete) = rt.block_on(async {
            let (c, conn) = tokio::time::timeout(Duration::from_secs(10), cfg.connect(NoTls))
                .await
                .map_err(|_| format!("{}: no answer within 10 s", pg.url))?
                .map_err(|e| format!("{}: {}", pg.url, describe(&e)))?;
            tokio::spawn(async move {
                let _ = conn.await;
            });
            let ms = pg.statement_timeout.as_millis().max(1);
            let setup = async {
                c.batch_execute(&format!(
                    "SET statement_timeout = {ms}; SET synchronous_commit = on"
                ))
                .await?;
                let (id, v) = (quote(&pg.id_column), quote(&pg.vector_column));
                let insert = c
                    .prepare(&format!(
                        "INSERT INTO {} ({id}, {v}) VALUES ($1, $2)",
                        pg.table
                    ))
                    .await?;
                let delete = c
                    .prepare(&format!("DELETE FROM {} WHERE {id} = $1", pg.table))
                    .await?;
                Ok::<_, tokio_postgres::Error>((insert, delete))
            };
            let (insert, delete) = tokio::time::timeout(bound, setup)
                .await
                .map_err(|_| "session setup: no answer".to_string())?
                .map_err(|e| describe(&e))?;
            Ok::<_, String>((c, insert, delete))
        })?;
        Ok(Session {
            rt,
            c,
            insert,
            delete,
            bound,
        })
    }

    /// Runs `f` on this session's runtime, bounded client side.
    fn call<T>(
        &self,
        f: impl std::future::Future<Output = Result<T, tokio_postgres::Error>>,
    ) -> Result<T, String> {
        self.rt.block_on(async {
            match tokio::time::timeout(self.bound, f).await {
                Ok(r) => r.map_err(|e| describe(&e)),
                Err(_) => Err(format!("no answer within {:?}", self.bound)),
            }
        })
    }

    fn insert(&self, id: i64, v: Vec<f32>) -> Result<(), String> {
        let v = Vector::from(v);
        self.call(self.c.execute(&self.insert, &[&id, &v]))
            .map(|_| ())
    }

    /// Rows deleted (0: the id was gone).
    fn delete(&self, id: i64) -> Result<u64, String> {
        self.call(self.c.execute(&self.delete, &[&id]))
    }

    fn lsn(&self, which: ProbeLsn) -> Result<u64, String> {
        let row = self.call(self.c.query_one(which.sql(), &[]))?;
        Ok(u64::from(row.get::<_, PgLsn>(0)))
    }

    fn is_closed(&self) -> bool {
        self.c.is_closed()
    }
}

/// The rows this tool writes: fresh ids, the ones still in the table, the vectors.
struct Writes {
    next_id: AtomicI64,
    /// Ids this tool inserted (committed) and has not deleted.
    live: Mutex<Vec<i64>>,
    /// Ids whose INSERT or DELETE failed (may or may not be there): cleaned up at the end.
    doubt: Mutex<Vec<i64>>,
    base: Vec<Vec<f32>>,
    noise: Normal<f32>,
}

impl Writes {
    fn vector(&self, rng: &mut StdRng) -> Vec<f32> {
        let b = &self.base[rng.gen_range(0..self.base.len())];
        b.iter().map(|x| x + self.noise.sample(rng)).collect()
    }

    fn take_live(&self, rng: &mut StdRng) -> Option<i64> {
        let mut l = self.live.lock().unwrap_or_else(|e| e.into_inner());
        if l.is_empty() {
            return None;
        }
        let i = rng.gen_range(0..l.len());
        Some(l.swap_remove(i))
    }

    fn add_live(&self, id: i64) {
        self.live.lock().unwrap_or_else(|e| e.into_inner()).push(id);
    }

    fn add_doubt(&self, id: i64) {
        self.doubt
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(id);
    }
}

/// One phase's write counts (summed over the writer threads).
#[derive(Clone, Debug, Default)]
pub struct WriteTally {
    pub inserts: u64,
    pub deletes: u64,
    /// DELETEs that found their row gone (should stay 0).
    pub deletes_missing: u64,
    pub errors: u64,
    /// Open loop: intended writes before the phase's end that were never sent.
    pub unsent: u64,
    pub first_error: Option<String>,
}

impl WriteTally {
    pub fn writes(&self) -> u64 {
        self.inserts + self.deletes
    }

    fn add(&mut self, o: WriteTally) {
        self.inserts += o.inserts;
        self.deletes += o.deletes;
        self.deletes_missing += o.deletes_missing;
        self.errors += o.errors;
        self.unsent += o.unsent;
        if self.first_error.is_none() {
            self.first_error = o.first_error;
        }
    }

    fn error(&mut self, e: String) {
        self.errors += 1;
        if self.first_error.is_none() {
            self.first_error = Some(e);
        }
    }
}

/// The lag probe's results.
pub struct ProbeTally {
    /// Commit to applied, µs.
    pub lag_us: Histogram<u64>,
    pub probes: u64,
    /// Probes akerd had not applied within --probe-timeout.
    pub timeouts: u64,
    /// Probes that failed before a lag was measured (SQL or STATS errors).
    pub errors: u64,
    pub first_error: Option<String>,
    /// The largest `pg_changes_lag_ms` STATS showed meanwhile.
    pub akerd_lag_ms_max: f64,
    /// STATS reads that showed `pg_changes_up 0`.
    pub down_seen: u64,
    pub stats_reads: u64,
}

impl ProbeTally {
    fn new() -> ProbeTally {
        ProbeTally {
            lag_us: Histogram::new_with_bounds(1, 60_000_000, 3).expect("bounds"),
            probes: 0,
            timeouts: 0,
            errors: 0,
            first_error: None,
            akerd_lag_ms_max: 0.0,
            down_seen: 0,
            stats_reads: 0,
        }
    }

    fn error(&mut self, e: String) {
        self.errors += 1;
        if self.first_error.is_none() {
            self.first_error = Some(e);
        }
    }
}

/// The search threads' results.
#[derive(Default)]
pub struct SearchTally {
    pub searches: u64,
    pub hits: u64,
    pub errors: u64,
    pub first_error: Option<String>,
    /// Searches answered in each whole second of the phase.
    pub per_second: Vec<u64>,
}

impl SearchTally {
    /// The median of the per-second counts (the phase's whole seconds).
    pub fn median_per_second(&self) -> Option<f64> {
        let mut v = self.per_second.clone();
        if v.is_empty() {
            return None;
        }
        v.sort_unstable();
        let n = v.len();
        Some(if n % 2 == 1 {
            v[n / 2] as f64
        } else {
            (v[n / 2 - 1] + v[n / 2]) as f64 / 2.0
        })
    }
}

/// One phase's results.
pub struct PhaseResult {
    pub name: String,
    pub fraction: Option<f64>,
    /// Writes per second asked for (open loop); `None` in closed loop or without writes.
    pub target_rate: Option<f64>,
    pub closed_loop: bool,
    pub seconds: f64,
    pub writes: WriteTally,
    pub probe: ProbeTally,
    /// `None`: no search load in this phase.
    pub search: Option<SearchTally>,
    /// STATS counter deltas over the phase.
    pub stats_delta: HashMap<String, f64>,
    /// Time from the phase's end until akerd had applied the WAL position read then;
    /// `None` when it did not within the bound.
    pub catch_up: Option<Duration>,
}

impl PhaseResult {
    pub fn achieved_rate(&self) -> f64 {
        self.writes.writes() as f64 / self.seconds.max(1e-9)
    }

    fn delta(&self, name: &str) -> f64 {
        self.stats_delta.get(name).copied().unwrap_or(0.0)
    }

    /// akerd's hits over its lookups in this phase (STATS deltas).
    pub fn hit_ratio(&self) -> Option<f64> {
        let hits =
            self.delta("hits_exact") + self.delta("hits_alias") + self.delta("hits_approximate");
        let all = hits + self.delta("misses");
        (all > 0.0).then(|| hits / all)
    }

    /// Transactions akerd applied from the stream per second of the phase.
    pub fn applied_commits_rate(&self) -> f64 {
        self.delta("pg_changes_commits") / self.seconds.max(1e-9)
    }
}

/// akerd's STATS as `name -> value`.
pub fn parse_stats(text: &str) -> HashMap<String, f64> {
    text.lines()
        .filter_map(|l| {
            let (k, v) = l.trim().split_once(' ')?;
            Some((k.to_string(), v.trim().parse::<f64>().ok()?))
        })
        .collect()
}

/// The value of STATS line `name` (exact for integers: parsed as u64 first).
pub fn stat_u64(text: &str, name: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.trim().split_once(' ')?;
        if k != name {
            return None;
        }
        let v = v.trim();
        v.parse::<u64>()
            .ok()
            .or_else(|| v.parse::<f64>().ok().map(|f| f as u64))
    })
}

fn open_akerd(cfg: &Config) -> Result<Aker, String> {
    let opts = ClientOptions {
        connect_timeout: Duration::from_secs(5),
        io_timeout: Some(Duration::from_secs(10)),
        secret: cfg.secret.clone(),
        ..ClientOptions::default()
    };
    let mut c = Aker::connect_with(cfg.akerd, opts).map_err(|e| format!("{}: {e}", cfg.akerd))?;
    c.hello().map_err(|e| format!("{} HELLO: {e}", cfg.akerd))?;
    Ok(c)
}

/// Sleeps until `at` (a thread's sleep: nothing else runs on these threads meanwhile).
fn wait_until(at: Instant) {
    let left = at.saturating_duration_since(Instant::now());
    if !left.is_zero() {
        std::thread::sleep(left);
    }
}

/// The run: the table's facts, then the capacity phase and one phase per fraction.
pub struct Run {
    cfg: Config,
    pub table: TableInfo,
    writes: Writes,
    /// The query pool (sampled rows plus noise, fixed).
    queries: Vec<Vec<f32>>,
    /// A control session (catch-up positions, clean-up).
    ctl: Session,
    stats: Aker,
}

impl Run {
    /// Reads the table (rows, dim, max id), samples its vectors, builds the query pool,
    /// and checks that akerd answers and follows the table's changes.
    pub fn prepare(cfg: Config) -> Result<Run, String> {
        let ctl = Session::open(&cfg.pg, "aker-changes")?;
        let pg = &cfg.pg;
        let (rows, max_id) = {
            let r = ctl.call(ctl.c.query_one(
                &format!(
                    "SELECT count(*), coalesce(max({}), 0)::bigint FROM {}",
                    quote(&pg.id_column),
                    pg.table
                ),
                &[],
            ))?;
            (r.get::<_, i64>(0), r.get::<_, i64>(1))
        };
        if rows == 0 {
            return Err(format!("table {} is empty", pg.table));
        }
        let server_version: String = ctl
            .call(ctl.c.query_one("SHOW server_version", &[]))?
            .get(0);
        // A Bernoulli sample of about 3x what is needed, in id order (the same rows for
        // the same seed and table), shuffled here with the seed, cut.
        let want = cfg.queries.max(1);
        let pct = (300.0 * want as f64 / rows as f64).clamp(0.0001, 100.0);
        let sample = ctl.call(ctl.c.query(
            &format!(
                "SELECT {v} FROM {t} TABLESAMPLE BERNOULLI ({pct}) REPEATABLE ({seed}) \
                 WHERE {v} IS NOT NULL ORDER BY {id}",
                v = quote(&pg.vector_column),
                id = quote(&pg.id_column),
                t = pg.table,
                seed = cfg.seed % 1_000_000
            ),
            &[],
        ))?;
        let mut rng = StdRng::seed_from_u64(cfg.seed);
        let mut base: Vec<Vec<f32>> = sample
            .iter()
            .map(|r| r.get::<_, Vector>(0).to_vec())
            .collect();
        base.shuffle(&mut rng);
        base.truncate(want);
        let Some(dim) = base.first().map(Vec::len) else {
            return Err(format!("no vectors sampled from {}", pg.table));
        };
        if base.iter().any(|v| v.len() != dim) {
            return Err("sampled vectors of different dimensions".into());
        }
        let mean_sq = base
            .iter()
            .map(|v| v.iter().map(|x| (x * x) as f64).sum::<f64>())
            .sum::<f64>()
            / (base.len() * dim) as f64;
        let sigma = (cfg.noise as f64 * mean_sq.sqrt()) as f32;
        let noise = Normal::new(0.0f32, sigma.max(0.0)).map_err(|e| e.to_string())?;
        let queries: Vec<Vec<f32>> = (0..want)
            .map(|i| {
                base[i % base.len()]
                    .iter()
                    .map(|x| x + noise.sample(&mut rng))
                    .collect()
            })
            .collect();

        let mut stats = open_akerd(&cfg)?;
        if let Some(h) = stats.server_info() {
            if h.dim as usize != dim {
                return Err(format!(
                    "akerd at {} serves {}-d vectors, the table's are {dim}-d",
                    cfg.akerd, h.dim
                ));
            }
        }
        let text = stats
            .stats()
            .map_err(|e| format!("{} STATS: {e}", cfg.akerd))?;
        match (
            stat_u64(&text, "pg_changes_up"),
            stat_u64(&text, "pg_changes_applied_lsn"),
        ) {
            (Some(1), Some(_)) => {}
            (None, _) | (_, None) => {
                return Err(format!(
                    "akerd at {} shows no pg_changes_up / pg_changes_applied_lsn in STATS: \
                     not a pgvector backend following its table's changes",
                    cfg.akerd
                ))
            }
            (Some(up), _) => {
                return Err(format!(
                    "akerd at {} does not follow the table's changes (pg_changes_up {up}, \
                     pg_changes_state {:?})",
                    cfg.akerd,
                    stat_u64(&text, "pg_changes_state")
                ))
            }
        }
        let table = TableInfo {
            rows,
            dim,
            max_id,
            server_version,
            sampled: base.len(),
            sigma,
        };
        Ok(Run {
            writes: Writes {
                next_id: AtomicI64::new(max_id + 1),
                live: Mutex::new(Vec::new()),
                doubt: Mutex::new(Vec::new()),
                base,
                noise,
            },
            queries,
            ctl,
            stats,
            table,
            cfg,
        })
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// One SEARCH of every pool query (uncounted): the hits / misses after it
    /// (`None` when it was cut short by its bound).
    pub fn warm(&mut self) -> Result<(u64, u64), String> {
        let until = Instant::now() + Duration::from_secs(120);
        let mut c = open_akerd(&self.cfg)?;
        let (mut hits, mut misses) = (0, 0);
        for q in &self.queries {
            if Instant::now() >= until {
                break;
            }
            let r = c
                .search(self.cfg.k, q)
                .map_err(|e| format!("warm-up SEARCH: {e}"))?;
            if r.hit == HitKind::Miss {
                misses += 1;
            } else {
                hits += 1;
            }
        }
        Ok((hits, misses))
    }

    /// The capacity phase: writers in closed loop, no searches.
    pub fn capacity(&mut self) -> Result<PhaseResult, String> {
        self.phase("capacity".into(), None, Pace::Closed, false)
    }

    /// A phase at `fraction` of `capacity` writes/s, with searches.
    pub fn at_fraction(&mut self, fraction: f64, capacity: f64) -> Result<PhaseResult, String> {
        let rate = fraction * capacity;
        let pace = if rate > 0.0 {
            Pace::Open(rate)
        } else {
            Pace::None
        };
        self.phase(format!("f={fraction}"), Some(fraction), pace, true)
    }

    fn phase(
        &mut self,
        name: String,
        fraction: Option<f64>,
        pace: Pace,
        searches: bool,
    ) -> Result<PhaseResult, String> {
        let cfg = &self.cfg;
        let writers = match pace {
            Pace::None => 0,
            _ => cfg.writers.max(1),
        };
        let searchers = if searches { cfg.search_threads } else { 0 };
        let dur = cfg.phase;
        let barrier = Barrier::new(writers + searchers + 2);
        let start_cell = OnceLock::new();
        let windows: Vec<AtomicU64> = (0..dur.as_secs() as usize + 1)
            .map(|_| AtomicU64::new(0))
            .collect();
        let phase_seed = cfg
            .seed
            .wrapping_add(fraction.map_or(0, |f| (f * 1e6) as u64 + 1));
        let ctx = PhaseCtx {
            cfg,
            writes: &self.writes,
            queries: &self.queries,
            barrier: &barrier,
            start: &start_cell,
            dur,
            windows: &windows,
            seed: phase_seed,
        };
        let mut before = None;
        let (w, s, p) = std::thread::scope(|sc| {
            let ctx = &ctx;
            let wh: Vec<_> = (0..writers)
                .map(|i| sc.spawn(move || writer(ctx, pace, writers, i)))
                .collect();
            let sh: Vec<_> = (0..searchers)
                .map(|i| sc.spawn(move || searcher(ctx, i)))
                .collect();
            let ph = sc.spawn(move || probe(ctx));
            barrier.wait();
            start_cell.get_or_init(Instant::now);
            before = Some(self.stats.stats());
            let mut wt = WriteTally::default();
            let mut first_err = None;
            for h in wh {
                match h.join() {
                    Ok(Ok(t)) => wt.add(t),
                    Ok(Err(e)) => {
                        first_err.get_or_insert(e);
                    }
                    Err(_) => {
                        first_err.get_or_insert("a writer thread panicked".to_string());
                    }
                }
            }
            let mut st = SearchTally::default();
            for h in sh {
                match h.join() {
                    Ok(Ok(t)) => {
                        st.searches += t.searches;
                        st.hits += t.hits;
                        st.errors += t.errors;
                        if st.first_error.is_none() {
                            st.first_error = t.first_error;
                        }
                    }
                    Ok(Err(e)) => {
                        first_err.get_or_insert(e);
                    }
                    Err(_) => {
                        first_err.get_or_insert("a search thread panicked".to_string());
                    }
                }
            }
            let pt = match ph.join() {
                Ok(Ok(t)) => Some(t),
                Ok(Err(e)) => {
                    first_err.get_or_insert(e);
                    None
                }
                Err(_) => {
                    first_err.get_or_insert("the probe thread panicked".to_string());
                    None
                }
            };
            match first_err {
                Some(e) => Err(e),
                None => Ok((wt, st, pt.expect("a probe tally"))),
            }
        })?;
        let start = *start_cell.get().expect("the phase started");
        let seconds = (Instant::now().min(start + dur) - start).as_secs_f64();
        let after = self.stats.stats();
        let stats_delta = match (before, after) {
            (Some(Ok(b)), Ok(a)) => {
                let (b, a) = (parse_stats(&b), parse_stats(&a));
                a.iter()
                    .filter_map(|(k, v)| b.get(k).map(|bv| (k.clone(), v - bv)))
                    .collect()
            }
            _ => HashMap::new(),
        };
        let catch_up = self.catch_up()?;
        let search = searches.then(|| {
            let whole = (dur.as_secs() as usize).max(1).min(windows.len());
            SearchTally {
                per_second: windows[..whole]
                    .iter()
                    .map(|a| a.load(Ordering::Relaxed))
                    .collect(),
                ..s
            }
        });
        Ok(PhaseResult {
            name,
            fraction,
            target_rate: match pace {
                Pace::Open(r) => Some(r),
                _ => None,
            },
            closed_loop: matches!(pace, Pace::Closed),
            seconds,
            writes: w,
            probe: p,
            search,
            stats_delta,
            catch_up,
        })
    }

    /// The time until akerd has applied the WAL position read now (bounded).
    fn catch_up(&mut self) -> Result<Option<Duration>, String> {
        let target = self.ctl.lsn(self.cfg.probe_lsn)?;
        let t0 = Instant::now();
        let mut polls = 0u64;
        while t0.elapsed() < CATCH_UP_MAX && polls < POLLS_MAX_PER_PROBE * 4 {
            polls += 1;
            let text = self
                .stats
                .stats()
                .map_err(|e| format!("{} STATS: {e}", self.cfg.akerd))?;
            if stat_u64(&text, "pg_changes_applied_lsn").is_some_and(|a| a >= target) {
                return Ok(Some(t0.elapsed()));
            }
            std::thread::sleep(self.cfg.stats_poll);
        }
        Ok(None)
    }

    /// Deletes the rows this tool inserted and did not delete (and the ones in doubt).
    /// The number deleted.
    pub fn cleanup(&mut self) -> Result<u64, String> {
        let mut ids =
            std::mem::take(&mut *self.writes.live.lock().unwrap_or_else(|e| e.into_inner()));
        ids.extend(std::mem::take(
            &mut *self.writes.doubt.lock().unwrap_or_else(|e| e.into_inner()),
        ));
        if self.cfg.keep_rows || ids.is_empty() {
            return Ok(0);
        }
        if self.ctl.is_closed() {
            self.ctl = Session::open(&self.cfg.pg, "aker-changes")?;
        }
        let sql = format!(
            "DELETE FROM {} WHERE {} = ANY($1)",
            self.cfg.pg.table,
            quote(&self.cfg.pg.id_column)
        );
        let mut n = 0;
        for chunk in ids.chunks(CLEANUP_BATCH) {
            n += self
                .ctl
                .call(self.ctl.c.execute(&sql, &[&chunk.to_vec()]))?;
        }
        Ok(n)
    }

    /// Rows this tool inserted that are still in the table.
    pub fn live_rows(&self) -> usize {
        self.writes
            .live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }
}

#[derive(Clone, Copy, Debug)]
enum Pace {
    None,
    Closed,
    /// Writes per second over all writers.
    Open(f64),
}

/// What a phase's threads share.
struct PhaseCtx<'a> {
    cfg: &'a Config,
    writes: &'a Writes,
    queries: &'a [Vec<f32>],
    barrier: &'a Barrier,
    start: &'a OnceLock<Instant>,
    dur: Duration,
    windows: &'a [AtomicU64],
    seed: u64,
}

impl PhaseCtx<'_> {
    /// Waits for every thread of the phase, then the phase's start instant.
    fn ready(&self) -> Instant {
        self.barrier.wait();
        *self.start.get_or_init(Instant::now)
    }
}

/// One write: half INSERT of a new row near a sampled one, half DELETE of a row this tool
/// inserted (an INSERT when there is none).
fn one_write(s: &Session, w: &Writes, rng: &mut StdRng, t: &mut WriteTally) {
    if rng.gen_bool(0.5) {
        if let Some(id) = w.take_live(rng) {
            match s.delete(id) {
                Ok(n) => {
                    t.deletes += 1;
                    t.deletes_missing += u64::from(n == 0);
                }
                Err(e) => {
                    w.add_doubt(id);
                    t.error(e);
                }
            }
            return;
        }
    }
    let id = w.next_id.fetch_add(1, Ordering::Relaxed);
    match s.insert(id, w.vector(rng)) {
        Ok(()) => {
            w.add_live(id);
            t.inserts += 1;
        }
        Err(e) => {
            w.add_doubt(id);
            t.error(e);
        }
    }
}

/// Reopens a lost session, retrying until `end`.
fn reopen(pg: &PgConn, end: Instant) -> Option<Session> {
    while Instant::now() < end {
        if let Ok(s) = Session::open(pg, "aker-changes-writer") {
            return Some(s);
        }
        std::thread::sleep(RECONNECT_PAUSE);
    }
    None
}

fn writer(ctx: &PhaseCtx, pace: Pace, writers: usize, i: usize) -> Result<WriteTally, String> {
    let opened = Session::open(&ctx.cfg.pg, "aker-changes-writer");
    let start = ctx.ready();
    let mut s = opened?;
    let end = start + ctx.dur;
    let mut rng = StdRng::seed_from_u64(ctx.seed ^ (0x5752_4954_4552 + i as u64));
    let mut schedule = match pace {
        Pace::Open(rate) => Some(Schedule::new(
            start,
            rate,
            writers,
            i,
            ctx.cfg.arrival,
            ctx.seed ^ 0xC4A1,
        )),
        _ => None,
    };
    let mut t = WriteTally::default();
    let mut n = 0u64;
    while n < WRITES_MAX_PER_THREAD {
        if let Some(sch) = schedule.as_mut() {
            let at = sch.next_instant();
            if at >= end {
                break;
            }
            if Instant::now() >= end {
                // Behind at the end: this one and the rest before the end were not sent.
                t.unsent += 1 + sch.count_between(start, end);
                break;
            }
            wait_until(at);
        } else if Instant::now() >= end {
            break;
        }
        one_write(&s, ctx.writes, &mut rng, &mut t);
        n += 1;
        if s.is_closed() {
            match reopen(&ctx.cfg.pg, end) {
                Some(x) => s = x,
                None => break,
            }
        }
    }
    Ok(t)
}

fn searcher(ctx: &PhaseCtx, i: usize) -> Result<SearchTally, String> {
    let opened = open_akerd(ctx.cfg);
    let start = ctx.ready();
    let mut c = opened?;
    let end = start + ctx.dur;
    let mut rng = StdRng::seed_from_u64(ctx.seed ^ (0x5345_4152_4348 + i as u64));
    let mut t = SearchTally::default();
    while t.searches + t.errors < SEARCHES_MAX_PER_THREAD {
        if Instant::now() >= end {
            break;
        }
        let q = &ctx.queries[rng.gen_range(0..ctx.queries.len())];
        match c.search(ctx.cfg.k, q) {
            Ok(r) => {
                let now = Instant::now();
                if now < end {
                    t.searches += 1;
                    t.hits += u64::from(r.hit != HitKind::Miss);
                    let sec = (now - start).as_secs() as usize;
                    if let Some(w) = ctx.windows.get(sec) {
                        w.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            Err(e) => {
                t.errors += 1;
                if t.first_error.is_none() {
                    t.first_error = Some(e.to_string());
                }
                if c.is_broken() {
                    let mut again = None;
                    while again.is_none() && Instant::now() < end {
                        std::thread::sleep(RECONNECT_PAUSE);
                        again = open_akerd(ctx.cfg).ok();
                    }
                    match again {
                        Some(x) => c = x,
                        None => break,
                    }
                }
            }
        }
    }
    Ok(t)
}

/// Every --probe-every: one INSERT, the WAL position after its commit, then STATS until
/// akerd has applied that far.
fn probe(ctx: &PhaseCtx) -> Result<ProbeTally, String> {
    let cfg = ctx.cfg;
    let opened =
        Session::open(&cfg.pg, "aker-changes-probe").and_then(|s| open_akerd(cfg).map(|a| (s, a)));
    let start = ctx.ready();
    let (mut s, mut a) = opened?;
    let end = start + ctx.dur;
    let mut rng = StdRng::seed_from_u64(ctx.seed ^ 0x50_524F_4245);
    let mut t = ProbeTally::new();
    let every = cfg.probe_every.max(Duration::from_millis(1));
    let ticks_max = (ctx.dur.as_secs_f64() / every.as_secs_f64()).ceil() as u64 + 1;
    let mut tick = 0u64;
    while tick < ticks_max {
        let at = start + every * tick as u32;
        if at >= end {
            break;
        }
        wait_until(at);
        // A late probe skips the ticks it missed (no burst).
        tick = ((Instant::now() - start).as_secs_f64() / every.as_secs_f64()).floor() as u64 + 1;
        if s.is_closed() {
            match reopen(&cfg.pg, end) {
                Some(x) => s = x,
                None => break,
            }
        }
        let id = ctx.writes.next_id.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = s.insert(id, ctx.writes.vector(&mut rng)) {
            ctx.writes.add_doubt(id);
            t.error(format!("probe INSERT: {e}"));
            continue;
        }
        let committed = Instant::now();
        ctx.writes.add_live(id);
        let lsn = match s.lsn(cfg.probe_lsn) {
            Ok(l) => l,
            Err(e) => {
                t.error(format!("probe {}: {e}", cfg.probe_lsn.function()));
                continue;
            }
        };
        t.probes += 1;
        let mut polls = 0u64;
        let applied = loop {
            if committed.elapsed() >= cfg.probe_timeout || polls >= POLLS_MAX_PER_PROBE {
                break None;
            }
            polls += 1;
            let text = match a.stats() {
                Ok(x) => x,
                Err(e) => {
                    t.error(format!("STATS: {e}"));
                    if a.is_broken() {
                        std::thread::sleep(RECONNECT_PAUSE);
                        if let Ok(x) = open_akerd(cfg) {
                            a = x;
                        }
                    }
                    continue;
                }
            };
            let now = Instant::now();
            t.stats_reads += 1;
            if let Some(l) = stat_u64(&text, "pg_changes_lag_ms") {
                t.akerd_lag_ms_max = t.akerd_lag_ms_max.max(l as f64);
            }
            if stat_u64(&text, "pg_changes_up") == Some(0) {
                t.down_seen += 1;
            }
            if stat_u64(&text, "pg_changes_applied_lsn").is_some_and(|x| x >= lsn) {
                break Some(now);
            }
            std::thread::sleep(cfg.stats_poll);
        };
        match applied {
            Some(at) => {
                t.lag_us
                    .saturating_record((at - committed).as_micros().max(1) as u64);
            }
            None => t.timeouts += 1,
        }
    }
    Ok(t)
}

/// The number of CPUs this process may run on.
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Now as `YYYY-MM-DD HH:MM:SS UTC`.
pub fn utc_now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs()) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// The write mix, as the report states it.
pub fn write_mix(cfg: &Config, t: &TableInfo) -> String {
    format!(
        "each SQL write its own autocommit transaction: 50% INSERT of a new row (id above the \
         table's max id {}, vector = one of {} sampled rows' + N(0, {:.4}) per component), 50% \
         DELETE of a row this tool inserted (an INSERT when none is left); the original rows \
         stay. Lag probe: one INSERT every {} ms on its own connection, then {} after its \
         COMMIT, then akerd STATS every {} ms until pg_changes_applied_lsn reaches it (given \
         up after {} s: a timeout)",
        t.max_id,
        t.sampled,
        t.sigma,
        cfg.probe_every.as_millis(),
        cfg.probe_lsn.function(),
        cfg.stats_poll.as_millis(),
        cfg.probe_timeout.as_secs_f64()
    )
}

fn ms(us: u64) -> String {
    format!("{:.1}", us as f64 / 1000.0)
}

/// The result table: a header row and one row per phase.
pub fn table(results: &[PhaseResult]) -> (Vec<&'static str>, Vec<Vec<String>>) {
    let header = vec![
        "phase",
        "target w/s",
        "achieved w/s",
        "writes",
        "lag p50 ms",
        "lag p99 ms",
        "lag max ms",
        "probes",
        "timeouts",
        "searches/s",
        "hits %",
        "applied tx/s",
        "catch-up ms",
    ];
    let rows = results
        .iter()
        .map(|r| {
            let h = &r.probe.lag_us;
            let lag = |q: f64| {
                if h.is_empty() {
                    "-".to_string()
                } else {
                    ms(h.value_at_quantile(q))
                }
            };
            vec![
                r.name.clone(),
                match (r.closed_loop, r.target_rate) {
                    (true, _) => "closed loop".into(),
                    (false, Some(x)) => format!("{x:.1}"),
                    (false, None) => "0".into(),
                },
                format!("{:.1}", r.achieved_rate()),
                r.writes.writes().to_string(),
                lag(0.5),
                lag(0.99),
                if h.is_empty() {
                    "-".into()
                } else {
                    ms(h.max())
                },
                r.probe.probes.to_string(),
                r.probe.timeouts.to_string(),
                match &r.search {
                    Some(s) => s
                        .median_per_second()
                        .map_or("-".into(), |m| format!("{m:.0}")),
                    None => "no searches".into(),
                },
                match (&r.search, r.hit_ratio()) {
                    (Some(_), Some(x)) => format!("{:.1}", 100.0 * x),
                    _ => "-".into(),
                },
                format!("{:.1}", r.applied_commits_rate()),
                match r.catch_up {
                    Some(d) => format!("{:.1}", d.as_secs_f64() * 1e3),
                    None => format!(">{}", CATCH_UP_MAX.as_millis()),
                },
            ]
        })
        .collect();
    (header, rows)
}

/// The table with aligned columns.
pub fn render_text(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut w: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        cells
            .iter()
            .enumerate()
            .map(|(i, c)| {
                if i == 0 {
                    format!("{c:<width$}", width = w[i])
                } else {
                    format!("{c:>width$}", width = w[i])
                }
            })
            .collect::<Vec<_>>()
            .join("  ")
    };
    let mut out = line(header.to_vec());
    out.push('\n');
    for r in rows {
        out.push_str(&line(r.iter().map(String::as_str).collect()));
        out.push('\n');
    }
    out
}

/// The table in Markdown.
pub fn render_markdown(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut out = format!("| {} |\n", header.join(" | "));
    out.push_str(&format!(
        "|{}\n",
        header
            .iter()
            .enumerate()
            .map(|(i, _)| if i == 0 { "---|" } else { "---:|" })
            .collect::<String>()
    ));
    for r in rows {
        out.push_str(&format!("| {} |\n", r.join(" | ")));
    }
    out
}

/// Lines on what the table does not show: errors, unsent writes, akerd's own lag gauge.
pub fn notes(results: &[PhaseResult]) -> Vec<String> {
    let mut out = Vec::new();
    for r in results {
        let mut parts = Vec::new();
        let w = &r.writes;
        parts.push(format!(
            "{} inserts / {} deletes in {:.1} s",
            w.inserts, w.deletes, r.seconds
        ));
        if w.errors > 0 {
            parts.push(format!(
                "{} write errors (first: {})",
                w.errors,
                w.first_error.as_deref().unwrap_or("-")
            ));
        }
        if w.unsent > 0 {
            parts.push(format!(
                "{} intended writes unsent (behind schedule)",
                w.unsent
            ));
        }
        if w.deletes_missing > 0 {
            parts.push(format!(
                "{} DELETEs found their row gone",
                w.deletes_missing
            ));
        }
        let p = &r.probe;
        if p.errors > 0 {
            parts.push(format!(
                "{} probe errors (first: {})",
                p.errors,
                p.first_error.as_deref().unwrap_or("-")
            ));
        }
        if p.down_seen > 0 {
            parts.push(format!(
                "pg_changes_up read 0 in {} of {} STATS reads",
                p.down_seen, p.stats_reads
            ));
        }
        parts.push(format!(
            "akerd pg_changes_lag_ms max {:.0} (over {} STATS reads)",
            p.akerd_lag_ms_max, p.stats_reads
        ));
        if let Some(s) = &r.search {
            let client_hits = if s.searches > 0 {
                format!("{:.1}%", 100.0 * s.hits as f64 / s.searches as f64)
            } else {
                "-".into()
            };
            parts.push(format!(
                "{} searches ({} hits as the client saw them), per second {:?}",
                s.searches, client_hits, s.per_second
            ));
            if s.errors > 0 {
                parts.push(format!(
                    "{} search errors (first: {})",
                    s.errors,
                    s.first_error.as_deref().unwrap_or("-")
                ));
            }
        }
        let d = |n: &str| r.stats_delta.get(n).copied().unwrap_or(0.0);
        parts.push(format!(
            "applied from the stream: {:.0} commits, {:.0} inserts, {:.0} deletes",
            d("pg_changes_commits"),
            d("pg_changes_inserts"),
            d("pg_changes_deletes")
        ));
        out.push(format!("{}: {}", r.name, parts.join("; ")));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_lines_parse() {
        let text = "hits_exact 3\npg_changes_applied_lsn 123456789012\npg_changes_up 1\n\
                    pg_changes_lag_ms 2\nx 1.5\n";
        assert_eq!(
            stat_u64(text, "pg_changes_applied_lsn"),
            Some(123_456_789_012)
        );
        assert_eq!(stat_u64(text, "pg_changes_up"), Some(1));
        assert_eq!(stat_u64(text, "pg_changes"), None);
        assert_eq!(stat_u64(text, "x"), Some(1));
        let m = parse_stats(text);
        assert_eq!(m["hits_exact"], 3.0);
        assert_eq!(m["x"], 1.5);
    }

    #[test]
    fn median_of_windows() {
        let s = SearchTally {
            per_second: vec![5, 1, 3],
            ..Default::default()
        };
        assert_eq!(s.median_per_second(), Some(3.0));
        let s = SearchTally {
            per_second: vec![4, 1, 3, 10],
            ..Default::default()
        };
        assert_eq!(s.median_per_second(), Some(3.5));
    }

    #[test]
    fn utc_date_has_its_shape() {
        let d = utc_now();
        assert_eq!(d.len(), "2025-01-01 00:00:00 UTC".len());
        assert!(d.starts_with("20"));
    }

    #[test]
    fn tables_render() {
        let h = vec!["phase", "n"];
        let rows = vec![vec!["f=0".to_string(), "12".to_string()]];
        let t = render_text(&h, &rows);
        assert_eq!(t, "phase   n\nf=0    12\n");
        let m = render_markdown(&h, &rows);
        assert_eq!(m, "| phase | n |\n|---|---:|\n| f=0 | 12 |\n");
    }
}
