//! pgvector SQL mode: the baseline of "aker in front of pgvector against pgvector
//! alone". The trace's searches go straight to PostgreSQL as SQL (what an application
//! without aker sends), one connection per thread, closed loop or open loop; plus a
//! loader (binary COPY of an `.fvecs` collection, then the HNSW index) and a direct
//! write load.
//!
//! ```text
//!  thread i ── own connection (SET hnsw.ef_search once per session)
//!    loop { [open loop: wait for this thread's next intended send time]
//!           op = trace[cursor++]; SELECT id ... ORDER BY embedding <op> $1 LIMIT k }
//!    latency (µs) ─► histogram; ids ─► recall against the trace's ground truth
//! ```
//!
//! Open loop measures latency from the intended send time (the schedule of
//! [`crate::schedule`], as akerd's open-loop runs do), so a run at the same rate against
//! akerd and against PostgreSQL alone compares the same thing: the time a user waits.
//!
//! Every loop is bounded by the run time and a request count; every statement by
//! `statement_timeout` (set per session).

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use aker::protocol::Neighbor;
use aker::service::pgvector as pgvector_backend;
use aker::service::pgvector::sql::{describe, opclass, operator, quote_ident as quote};
use hdrhistogram::Histogram;
use pgvector::Vector;
use shards::Metric;
use tokio_postgres::binary_copy::BinaryCopyInWriter;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, NoTls};

use crate::schedule::{Arrival, Schedule};
use crate::workload::{OpKind, Workload};

/// Longest a single statement may run (statement_timeout, per session).
const STATEMENT_TIMEOUT_MS: u64 = 30_000;
/// Rows per COPY before the loader reports progress.
const COPY_REPORT_ROWS: usize = 100_000;

/// Where the table is and how to search it.
#[derive(Clone, Debug)]
pub struct PgTarget {
    /// libpq URL without a password.
    pub url: String,
    pub password: Option<String>,
    pub table: String,
    pub id_column: String,
    pub vector_column: String,
    /// `hnsw.ef_search` of every session (0: leave pgvector's default).
    pub ef_search: usize,
}

/// Sleeps until `at`. A thread's sleep, not tokio's timer (millisecond ticks: up to 1 ms
/// of lag counted as latency): the thread's one connection has nothing in flight here.
fn wait_until(at: Instant) {
    let left = at.saturating_duration_since(Instant::now());
    if !left.is_zero() {
        std::thread::sleep(left);
    }
}

fn runtime() -> Result<tokio::runtime::Runtime, String> {
    pgvector_backend::runtime().map_err(|e| format!("tokio runtime: {e}"))
}

async fn connect(t: &PgTarget) -> Result<Client, String> {
    let mut c: tokio_postgres::Config = t.url.parse().map_err(|e| format!("--pg: {e}"))?;
    if let Some(p) = &t.password {
        c.password(p);
    }
    c.connect_timeout(Duration::from_secs(5));
    c.application_name("aker-loadgen");
    let (client, conn) = tokio::time::timeout(Duration::from_secs(10), c.connect(NoTls))
        .await
        .map_err(|_| format!("{}: no answer within 10 s", t.url))?
        .map_err(|e| format!("{}: {}", t.url, describe(&e)))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut settings = format!("SET statement_timeout = {STATEMENT_TIMEOUT_MS}");
    if t.ef_search > 0 {
        settings.push_str(&format!("; SET hnsw.ef_search = {}", t.ef_search));
    }
    client
        .batch_execute(&settings)
        .await
        .map_err(|e| describe(&e))?;
    Ok(client)
}

/// One SQL thread's counts: latency, searches, errors, recall sum and count, and (open
/// loop) the counted intended sends it never made because the run ended first.
type ThreadTally = (Histogram<u64>, u64, u64, f64, u64, u64);

/// How a SQL run paces its searches.
#[derive(Clone, Copy, Debug)]
pub enum Pace {
    /// Each connection sends its next search when the last one answered.
    Closed,
    /// `rate` searches per second over all connections, latency from the intended send
    /// time (a connection that falls behind sends at once, and its waits count). The
    /// searches due before the end are still sent, for up to `drain` after it (the
    /// backlog of a slow server is measured, not dropped); what is left then is `unsent`.
    Open {
        rate: f64,
        arrival: Arrival,
        seed: u64,
        drain: Duration,
    },
}

/// What a closed-loop SQL run measured.
pub struct PgRunResult {
    pub connections: usize,
    pub pace: Pace,
    pub requests: u64,
    pub errors: u64,
    /// Open loop: intended sends in the counted window that were still waiting when the
    /// run ended (the backlog of a server slower than the rate; 0 in closed loop).
    pub unsent: u64,
    pub seconds: f64,
    /// Latency of counted searches, µs.
    pub latency_us: Histogram<u64>,
    /// Mean recall@k against the trace's ground truth.
    pub recall: Option<f64>,
}

impl PgRunResult {
    pub fn throughput(&self) -> f64 {
        self.requests as f64 / self.seconds.max(1e-9)
    }

    pub fn to_json(&self, ef_search: usize) -> serde_json::Value {
        let h = &self.latency_us;
        let (loop_kind, rate) = match self.pace {
            Pace::Closed => ("closed", None),
            Pace::Open { rate, .. } => ("open", Some(rate)),
        };
        serde_json::json!({
            "mode": "pgvector-sql",
            "loop": loop_kind,
            "target_rate": rate,
            "connections": self.connections,
            "ef_search": ef_search,
            "requests": self.requests,
            "errors": self.errors,
            "unsent": self.unsent,
            "seconds": self.seconds,
            "throughput": self.throughput(),
            "p50_us": h.value_at_quantile(0.50),
            "p99_us": h.value_at_quantile(0.99),
            "p999_us": h.value_at_quantile(0.999),
            "max_us": h.max(),
            "recall": self.recall,
        })
    }
}

/// The trace's searches as SQL on `connections` connections, paced by `pace`: `warmup`
/// uncounted, then `duration` (or `requests_max` counted searches, whichever first).
/// Trace writes are skipped (a search-only baseline).
#[allow(clippy::too_many_arguments)]
pub fn run_searches(
    w: &Workload,
    t: &PgTarget,
    metric: Metric,
    connections: usize,
    pace: Pace,
    warmup: Duration,
    duration: Duration,
    requests_max: Option<u64>,
) -> Result<PgRunResult, String> {
    // The limit in the text, as akerd sends it (a generic plan keeps the index).
    let sql_prefix = format!(
        "SELECT {id} FROM {table} ORDER BY {v} {op} $1 LIMIT ",
        id = quote(&t.id_column),
        table = t.table,
        v = quote(&t.vector_column),
        op = operator(metric)
    );
    let counted = AtomicU64::new(0);
    let start = Instant::now();
    let count_from = start + warmup;
    let end = count_from + duration;
    let run = SqlRun {
        w,
        t,
        pace,
        connections,
        start,
        count_from,
        end,
        requests_max,
        sql_prefix: &sql_prefix,
        counted: &counted,
    };
    let results: Vec<Result<ThreadTally, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..connections.max(1))
            .map(|i| {
                let run = &run;
                s.spawn(move || {
                    let rt = runtime()?;
                    rt.block_on(async { search_connection(run, i).await })
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a SQL thread panicked".into()))
            })
            .collect()
    });
    let seconds = (Instant::now().min(end) - count_from.min(Instant::now()))
        .as_secs_f64()
        .max(1e-9);
    let mut latency_us = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("bounds");
    let (mut requests, mut errors, mut rs, mut rn, mut unsent) = (0, 0, 0.0, 0, 0);
    for r in results {
        let (h, n, e, s, c, u) = r?;
        unsent += u;
        latency_us.add(&h).map_err(|e| e.to_string())?;
        requests += n;
        errors += e;
        rs += s;
        rn += c;
    }
    Ok(PgRunResult {
        connections,
        pace,
        requests,
        errors,
        unsent,
        seconds,
        latency_us,
        recall: (rn > 0).then(|| rs / rn as f64),
    })
}

/// What every SQL connection of one run shares.
#[derive(Clone, Copy)]
struct SqlRun<'a> {
    w: &'a Workload,
    t: &'a PgTarget,
    pace: Pace,
    connections: usize,
    start: Instant,
    count_from: Instant,
    end: Instant,
    requests_max: Option<u64>,
    /// The search's text up to its limit (one statement per k is prepared from it).
    sql_prefix: &'a str,
    /// Counted searches over all connections (`requests_max`).
    counted: &'a AtomicU64,
}

/// Connection `i`'s part of the run: its searches, paced, with their latency and recall.
async fn search_connection(run: &SqlRun<'_>, i: usize) -> Result<ThreadTally, String> {
    let SqlRun {
        w,
        t,
        pace,
        connections,
        start,
        count_from,
        end,
        requests_max,
        sql_prefix,
        counted,
    } = *run;
    let c = connect(t).await?;
    // One statement per k, prepared on first use (k <= the trace's).
    let mut by_k = std::collections::HashMap::new();
    let mut hist =
        Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).map_err(|e| e.to_string())?;
    let (mut n, mut errors, mut recall_sum, mut recall_n) = (0u64, 0u64, 0f64, 0u64);
    let mut picker = w.picker(i);
    let (mut schedule, stop_at) = match pace {
        Pace::Closed => (None, end),
        Pace::Open {
            rate,
            arrival,
            seed,
            drain,
        } => {
            let n = connections.max(1);
            let s = Schedule::new(start, rate, n, i, arrival, seed);
            (Some(s), end + drain)
        }
    };
    // Whether the loop ended owing the schedule nothing (the budget or
    // the trace ran out, or every instant before `end` was sent).
    let mut owes_nothing = false;
    while Instant::now() < stop_at {
        if requests_max.is_some_and(|m| counted.load(Ordering::Relaxed) >= m) {
            owes_nothing = true;
            break;
        }
        let Some(p) = picker.next(w) else {
            owes_nothing = true;
            break;
        };
        if p.kind != OpKind::Search {
            continue;
        }
        let q = Vector::from(w.vector(p.vector).to_vec());
        // Prepared before the wait: a first use's prepare is not latency.
        let st = match by_k.entry(p.k) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                let text = format!("{sql_prefix}{}", p.k);
                let st = c.prepare(&text).await.map_err(|e| describe(&e))?;
                e.insert(st)
            }
        };
        // Open loop: the latency clock starts at the intended time.
        let intended = match schedule.as_mut() {
            None => None,
            Some(s) => {
                let at = s.next_instant();
                if at >= end {
                    owes_nothing = true;
                    break;
                }
                wait_until(at);
                Some(at)
            }
        };
        let t0 = intended.unwrap_or_else(Instant::now);
        let r = c.query(&*st, &[&q]).await;
        let lat = t0.elapsed();
        if t0 < count_from {
            continue;
        }
        match r {
            Ok(rows) => {
                let got: Vec<Neighbor> = rows
                    .iter()
                    .map(|r| Neighbor {
                        id: r.get::<_, i64>(0) as u64,
                        distance: 0.0,
                    })
                    .collect();
                if let Some(x) = w.recall(&p, &got) {
                    recall_sum += x;
                    recall_n += 1;
                }
                hist.saturating_record(lat.as_micros() as u64);
                n += 1;
                counted.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => errors += 1,
        }
    }
    let unsent = match schedule {
        Some(mut s) if !owes_nothing => s.count_between(count_from, end),
        _ => 0,
    };
    Ok((hist, n, errors, recall_sum, recall_n, unsent))
}

/// What loading took.
pub struct LoadReport {
    pub rows: usize,
    pub dim: usize,
    pub copy_s: f64,
    pub index_s: f64,
    pub table_bytes: i64,
    pub index_bytes: i64,
}

/// Creates `t.table` (`id bigint PRIMARY KEY, embedding vector(dim)`), binary-COPYs the
/// `.fvecs` rows in (ids = row numbers), and builds the HNSW index (`m`,
/// `ef_construction`) for `metric`; then ANALYZE.
pub fn load(
    t: &PgTarget,
    fvecs: &Path,
    metric: Metric,
    m: usize,
    ef_construction: usize,
) -> Result<LoadReport, String> {
    let data = aker_formats::data::read_fvecs(fvecs).map_err(|e| e.to_string())?;
    let rt = runtime()?;
    rt.block_on(async {
        let c = connect(t).await?;
        let db = |e: tokio_postgres::Error| describe(&e);
        let (id, v) = (quote(&t.id_column), quote(&t.vector_column));
        c.batch_execute(&format!(
            "SET statement_timeout = 0; DROP TABLE IF EXISTS {table}; \
             CREATE TABLE {table} ({id} bigint PRIMARY KEY, {v} vector({dim}))",
            table = t.table,
            dim = data.dim
        ))
        .await
        .map_err(db)?;
        let vector_type = c.prepare("SELECT $1::vector").await.map_err(db)?.params()[0].clone();
        let t0 = Instant::now();
        let sink = c
            .copy_in(&format!(
                "COPY {} ({id}, {v}) FROM STDIN (FORMAT binary)",
                t.table
            ))
            .await
            .map_err(db)?;
        let writer = BinaryCopyInWriter::new(sink, &[Type::INT8, vector_type]);
        let mut writer = std::pin::pin!(writer);
        for i in 0..data.n {
            let row = Vector::from(data.row(i).to_vec());
            writer
                .as_mut()
                .write(&[&(i as i64), &row])
                .await
                .map_err(db)?;
            if (i + 1) % COPY_REPORT_ROWS == 0 {
                eprintln!("copied {} rows", i + 1);
            }
        }
        writer.finish().await.map_err(db)?;
        let copy_s = t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        c.batch_execute(&format!(
            "SET maintenance_work_mem = '1GB'; \
             CREATE INDEX {name} ON {table} USING hnsw ({v} {ops}) \
             WITH (m = {m}, ef_construction = {ef_construction}); ANALYZE {table}",
            name = quote(&format!("{}_hnsw", t.table.replace('.', "_"))),
            table = t.table,
            ops = opclass(metric)
        ))
        .await
        .map_err(db)?;
        let index_s = t1.elapsed().as_secs_f64();
        let sizes = c
            .query_one(
                "SELECT pg_relation_size($1::text::regclass), pg_indexes_size($1::text::regclass)",
                &[&t.table],
            )
            .await
            .map_err(db)?;
        Ok(LoadReport {
            rows: data.n,
            dim: data.dim,
            copy_s,
            index_s,
            table_bytes: sizes.get(0),
            index_bytes: sizes.get(1),
        })
    })
}

/// Direct writes, closed loop on `connections` connections: `n` inserts of the `.fvecs`
/// rows `0..n` as new ids `id_base..`, then `n` deletes of them. Returns (inserts/s,
/// deletes/s).
pub fn run_writes(
    t: &PgTarget,
    vectors: &[Vec<f32>],
    id_base: i64,
    connections: usize,
) -> Result<(f64, f64), String> {
    let insert = format!(
        "INSERT INTO {} ({}, {}) VALUES ($1, $2)",
        t.table,
        quote(&t.id_column),
        quote(&t.vector_column)
    );
    let delete = format!("DELETE FROM {} WHERE {} = $1", t.table, quote(&t.id_column));
    let phase = |sql: &str, with_vector: bool| -> Result<f64, String> {
        let next = AtomicU64::new(0);
        let n = connections.max(1);
        // Timed from when every connection is open and prepared.
        let ready = std::sync::Barrier::new(n + 1);
        let mut t0 = Instant::now();
        std::thread::scope(|s| {
            let hs: Vec<_> = (0..n)
                .map(|_| {
                    let (next, ready) = (&next, &ready);
                    s.spawn(move || -> Result<(), String> {
                        let rt = runtime()?;
                        rt.block_on(async {
                            let prepared = async {
                                let c = connect(t).await?;
                                let st = c.prepare(sql).await.map_err(|e| describe(&e))?;
                                Ok::<_, String>((c, st))
                            }
                            .await;
                            ready.wait();
                            let (c, st) = prepared?;
                            loop {
                                let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                                if i >= vectors.len() {
                                    return Ok(());
                                }
                                let id = id_base + i as i64;
                                let r = if with_vector {
                                    let v = Vector::from(vectors[i].clone());
                                    c.execute(&st, &[&id, &v]).await
                                } else {
                                    c.execute(&st, &[&id]).await
                                };
                                r.map_err(|e| describe(&e))?;
                            }
                        })
                    })
                })
                .collect();
            ready.wait();
            t0 = Instant::now();
            for h in hs {
                h.join()
                    .unwrap_or_else(|_| Err("a write thread panicked".into()))?;
            }
            Ok::<(), String>(())
        })?;
        Ok(vectors.len() as f64 / t0.elapsed().as_secs_f64())
    };
    let ins = phase(&insert, true)?;
    let del = phase(&delete, false)?;
    Ok((ins, del))
}
