//! `bench updates`: runs the cache-under-updates experiment (`updates`) for one data set
//! on both backends, and writes what it found: `report.md` (Figure 18's and Table 3's
//! figures, Figure 19's costs, insert visibility, the best Δ at equal pool bytes, the
//! checks against the paper), `results.csv` and the PNGs.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

use plotters::prelude::*;
use shards::store::HnswStore;
use shards::Capacity;

use crate::experiment::{self, EF_LADDER};
use crate::precomputed::PrecomputedBackend;
use crate::prepare::file_stem;
use crate::updates::{self, RunResult, Scenario, UpdatePolicy, UpdateRun, DEPTH};

type Fallible<T> = Result<T, Box<dyn std::error::Error>>;

/// What the command line chose (besides the scenario itself).
#[derive(Clone, Debug)]
pub struct Settings {
    pub rates: Vec<f64>,
    /// Pool capacity in objects as a share of the collection (the paper: 1%).
    pub pool_share: f64,
    pub policies: Vec<UpdatePolicy>,
    /// τ_risk values AK-D10 also runs at, at the second rate (visibility vs risk).
    pub risks: Vec<f64>,
    /// Δ values run at the bytes AK-D10 took after its warm-up, per rate.
    pub delta_sweep: Vec<usize>,
    pub hnsw: bool,
    pub exact: bool,
    pub hnsw_m: usize,
    pub hnsw_ef_construction: usize,
    pub target_recall: f64,
    pub ef_samples: usize,
    pub threads: usize,
    pub seed: u64,
    pub out: PathBuf,
    /// Describes where the group bases came from and the rest of the set-up (header).
    pub describe: String,
}

/// One finished run and what it ran on.
#[derive(Clone, Debug)]
pub struct Row {
    pub backend: &'static str,
    /// `main`, `risk` or `sweep` (equal bytes).
    pub group: &'static str,
    pub run: UpdateRun,
    pub result: RunResult,
}

/// A backend's prepared answers and the graph behind them (HNSW).
struct Prepared<'a> {
    name: &'static str,
    lists: &'a PrecomputedBackend,
    hnsw: Option<&'a HnswStore>,
}

/// Everything for one data set; returns the rows (also written to `settings.out`).
pub fn run_dataset(
    sc: &Scenario,
    s: &Settings,
    timings: &mut Vec<(String, f64)>,
) -> Fallible<Vec<Row>> {
    let t = Instant::now();
    let warm_truth = sc.truth(&sc.liveness(None))?;
    let replay_truths: Vec<Vec<Vec<u64>>> = s
        .rates
        .iter()
        .map(|&r| sc.truth(&sc.liveness(Some(r))))
        .collect::<shards::Result<_>>()?;
    timings.push(("truths per phase".into(), t.elapsed().as_secs_f64()));
    let pool = Capacity::Objects(((sc.collection as f64) * s.pool_share).round().max(1.0) as usize);
    let mut rows = Vec::new();
    let hnsw_parts = if s.hnsw {
        let t = Instant::now();
        let (store, memo, ef) = hnsw_backend(sc, s)?;
        timings.push((
            format!("HNSW build, ef sweep (ef {ef}), answers"),
            t.elapsed().as_secs_f64(),
        ));
        Some((store, memo))
    } else {
        None
    };
    let mut backends = Vec::new();
    if s.exact {
        backends.push(Prepared {
            name: "exact",
            lists: &sc.exact,
            hnsw: None,
        });
    }
    if let Some((store, memo)) = &hnsw_parts {
        backends.push(Prepared {
            name: "hnsw",
            lists: memo,
            hnsw: Some(store),
        });
    }
    for b in &backends {
        let t = Instant::now();
        let mut jobs = Vec::new();
        for (ri, &rate) in s.rates.iter().enumerate() {
            for &policy in &s.policies {
                jobs.push(("main", ri, UpdateRun { policy, rate, pool }));
            }
        }
        if b.hnsw.is_none() && s.rates.len() > 1 {
            for &r in &s.risks {
                let policy = UpdatePolicy::Aker {
                    delta: 10,
                    refresh: true,
                    risk: Some(r),
                };
                jobs.push((
                    "risk",
                    1,
                    UpdateRun {
                        policy,
                        rate: s.rates[1],
                        pool,
                    },
                ));
            }
        }
        let done = run_jobs(sc, b, &jobs, &warm_truth, &replay_truths, s)?;
        rows.extend(done);
        if b.hnsw.is_none() && !s.delta_sweep.is_empty() {
            // Equal bytes: what AK-D10 took after warming (the same stream every rate).
            let reference = rows
                .iter()
                .find(|r| r.backend == b.name && r.run.policy.to_string() == "ak-d10")
                .map(|r| r.result.bytes_warm)
                .ok_or("the Δ sweep needs ak-d10 among --policies")?;
            let mut sweep = Vec::new();
            for (ri, &rate) in s.rates.iter().enumerate() {
                for &delta in &s.delta_sweep {
                    let policy = UpdatePolicy::Aker {
                        delta,
                        refresh: true,
                        risk: None,
                    };
                    let pool = Capacity::Bytes(reference);
                    sweep.push(("sweep", ri, UpdateRun { policy, rate, pool }));
                }
            }
            rows.extend(run_jobs(sc, b, &sweep, &warm_truth, &replay_truths, s)?);
        }
        timings.push((format!("{} runs", b.name), t.elapsed().as_secs_f64()));
    }
    Ok(rows)
}

/// The HNSW graph over the whole union, its `ef` tuned to `target_recall` on the
/// union's exact top-k of requests sampled from the stream, and its top-`DEPTH` for each distinct vector.
fn hnsw_backend(sc: &Scenario, s: &Settings) -> Fallible<(HnswStore, PrecomputedBackend, usize)> {
    let mut store = HnswStore::build(
        sc.union.dim,
        sc.metric,
        &sc.union.data,
        s.hnsw_m,
        s.hnsw_ef_construction,
        EF_LADDER[0],
    )?;
    // Requests, not distinct vectors: hot groups weigh as in the stream (as `recall`).
    let requests = &sc.workload.requests;
    let step = (requests.len() / s.ef_samples.max(1)).max(1);
    let truth: Vec<(u32, Vec<u64>)> = requests
        .iter()
        .step_by(step)
        .map(|&r| {
            let list = sc.exact.list(sc.workload.vector(r)).expect("prepared");
            (r, list.iter().take(sc.k).map(|c| c.id).collect())
        })
        .collect();
    let samples: Vec<(&[f32], &[u64])> = truth
        .iter()
        .map(|(r, t)| (sc.workload.vector(*r), t.as_slice()))
        .collect();
    let sweep = experiment::tune_ef(&mut store, &samples, sc.k, s.target_recall, &EF_LADDER)?;
    let ef = sweep.last().expect("the ladder is not empty").ef;
    let memo =
        PrecomputedBackend::memoise(&store, &sc.workload.vectors, DEPTH, s.threads, &|_| {})?;
    Ok((store, memo, ef))
}

/// Runs `jobs` (group, rate index, run) against backend `b` on `s.threads` workers;
/// rows in job order.
fn run_jobs(
    sc: &Scenario,
    b: &Prepared,
    jobs: &[(&'static str, usize, UpdateRun)],
    warm_truth: &[Vec<u64>],
    replay_truths: &[Vec<Vec<u64>>],
    s: &Settings,
) -> Fallible<Vec<Row>> {
    let rows = crate::workers::run_all(jobs, s.threads, |&(group, ri, run)| {
        let result = updates::run(
            &run,
            sc,
            b.lists,
            b.hnsw,
            warm_truth,
            &replay_truths[ri],
            s.seed,
            &|_| {},
        )
        .map_err(|e| format!("{run:?}: {e}"))?;
        println!(
            "[{}/{}] {:<14} delete {:>4.0}%: recall {:.4}, hits {:.4}, dead served {} ({:.1} s)",
            sc.name,
            b.name,
            run.policy.to_string(),
            run.rate * 100.0,
            result.replay.recall(),
            result.replay.hit_ratio(),
            result.dead_served(),
            result.seconds
        );
        Ok(Row {
            backend: b.name,
            group,
            run,
            result,
        })
    })?;
    Ok(rows)
}

fn pct(x: f64) -> String {
    format!("{:.1}%", 100.0 * x)
}

fn find<'a>(
    rows: &'a [Row],
    backend: &str,
    group: &str,
    policy: &str,
    rate: f64,
) -> Option<&'a Row> {
    rows.iter().find(|r| {
        r.backend == backend
            && r.group == group
            && r.run.policy.to_string() == policy
            && (r.run.rate - rate).abs() < 1e-9
    })
}

/// The paper's Table 3 (SPACEV, 5% deleted): entries and hit ratio.
const PAPER_TABLE3: [(&str, u32, f64); 4] = [
    ("ak-d10", 625, 0.1252),
    ("ak-d30", 315, 0.0971),
    ("pl10", 1170, 0.1664),
    ("ak-rd", 1284, 0.0639),
];

/// `report.md` of one data set.
pub fn report(sc: &Scenario, s: &Settings, rows: &[Row], timings: &[(String, f64)]) -> String {
    let mut o = String::new();
    let dead: u64 = rows.iter().map(|r| r.result.dead_served()).sum();
    let replies: u64 = rows
        .iter()
        .map(|r| r.result.warm.requests + r.result.replay.requests)
        .sum();
    let _ = writeln!(o, "## {}: the cache under updates\n", sc.name);
    let _ = writeln!(o, "{}\n", s.describe);
    let _ = writeln!(
        o,
        "Collection {} x {}-d ({}), insert set {} rows held out of it (ids {}..{}), stream {} requests at simZipf {:.2} over {} distinct vectors, k = {}, pool {} of the collection in objects ({} objects; the Δ sweep: bytes, below). Ground truth: exact top-{DEPTH} over collection + insert set by brute force ({}); each phase's truth is its first k live ids (a deeper exact scan where fewer than k survive). Deletion rates are shares of the collection, drawn at random from collection + insert set, nested (5% ⊂ 10% ⊂ 25%).\n",
        sc.collection,
        sc.union.dim,
        sc.metric,
        sc.union.n - sc.collection,
        sc.collection,
        sc.union.n,
        sc.workload.requests.len(),
        sc.skew,
        sc.workload.n_vectors(),
        sc.k,
        pct(s.pool_share),
        ((sc.collection as f64) * s.pool_share).round(),
        if sc.truth_loaded { "loaded from the cache" } else { "computed" },
    );
    let _ = writeln!(
        o,
        "**Deleted ids served: {dead} in {replies} replies** (every reply of every run, both phases, checked against the ids not live at that moment).\n"
    );
    for backend in ["exact", "hnsw"] {
        if !rows.iter().any(|r| r.backend == backend) {
            continue;
        }
        let _ = writeln!(
            o,
            "### Figure 18 / {backend} backend: after the writes, the same stream again\n"
        );
        let _ = writeln!(o, "Recall and hits over the whole replay are the steady state of a pool rebuilt from the backend (FIFO, admitting on nearly every miss); \"until one turnover\" is the replay until it admitted as many entries as the pool held before the writes, the part served while entries that lived through the writes can still be there.\n");
        let _ = writeln!(o, "| delete | policy | recall@10 | hit ratio | exact / approx. hits | backend calls | until one turnover: requests, recall, hits | entries warm / after writes / end | dead served | warm recall, hits | the writes' own cost |");
        let _ = writeln!(o, "|---|---|---|---|---|---|---|---|---|---|---|");
        for &rate in &s.rates {
            for p in &s.policies {
                let Some(r) = find(rows, backend, "main", &p.to_string(), rate) else {
                    continue;
                };
                let x = &r.result;
                let _ = writeln!(
                    o,
                    "| {:.0}% | {} | {:.4} | {} | {} / {} | {} | {} | {} / {} / {} | {} | {:.4}, {} | {} |",
                    rate * 100.0,
                    p,
                    x.replay.recall(),
                    pct(x.replay.hit_ratio()),
                    x.replay.exact,
                    x.replay.approximate + x.replay.alias,
                    x.replay.misses,
                    head(x),
                    x.entries_warm,
                    x.entries_after_writes,
                    x.entries_end,
                    x.dead_served(),
                    x.warm.recall(),
                    pct(x.warm.hit_ratio()),
                    writes_cost(rows, backend, &p.to_string(), rate)
                        .map_or("-".into(), |c| format!("{c:+.2}")),
                );
            }
        }
        let _ = writeln!(o);
    }
    table3(&mut o, s, rows);
    costs(&mut o, s, rows);
    visibility(&mut o, s, rows);
    sweep(&mut o, s, rows);
    checks(&mut o, s, rows);
    let _ = writeln!(
        o,
        "Phases: {}.\n",
        timings
            .iter()
            .map(|(n, t)| format!("{n} {t:.1} s"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    o
}

/// "requests, recall, hits" of the replay until one turnover; "-" without a cache.
fn head(x: &RunResult) -> String {
    if x.entries_warm == 0 {
        return "-".into();
    }
    let h = &x.replay_head;
    format!("{}, {:.4}, {}", h.requests, h.recall(), pct(h.hit_ratio()))
}

fn table3(o: &mut String, s: &Settings, rows: &[Row]) {
    let Some(&rate) = s.rates.iter().find(|&&r| (r - 0.05).abs() < 1e-9) else {
        return;
    };
    let _ = writeln!(
        o,
        "### Table 3: entries and hit ratio at {:.0}% deleted (exact backend)\n",
        rate * 100.0
    );
    let _ = writeln!(o, "| policy | entries (end of replay) | hit ratio | paper (SPACEV): entries | paper: hit ratio |");
    let _ = writeln!(o, "|---|---|---|---|---|");
    for (name, entries, hits) in PAPER_TABLE3 {
        if let Some(r) = find(rows, "exact", "main", name, rate) {
            let _ = writeln!(
                o,
                "| {name} | {} | {} | {entries} | {} |",
                r.result.entries_end,
                pct(r.result.replay.hit_ratio()),
                pct(hits)
            );
        }
    }
    let _ = writeln!(o);
}

fn costs(o: &mut String, s: &Settings, rows: &[Row]) {
    let _ = writeln!(o, "### Figure 19: refresh cost per write (ak-d10, exact backend; `Cache::insert` / `Cache::delete` timed one by one, µs)\n");
    let _ = writeln!(o, "| delete | inserts | insert p50 / p99 / max | fast path took | slow-path steps | deletes | delete p50 / p99 / max | entries repaired / dropped |");
    let _ = writeln!(o, "|---|---|---|---|---|---|---|---|");
    for &rate in &s.rates {
        let Some(r) = find(rows, "exact", "main", "ak-d10", rate) else {
            continue;
        };
        let x = &r.result;
        let deletes = if x.delete.count == 0 {
            "-".to_string()
        } else {
            format!(
                "{:.2} / {:.2} / {:.1}",
                x.delete.p50, x.delete.p99, x.delete.max
            )
        };
        let _ = writeln!(
            o,
            "| {:.0}% | {} | {:.1} / {:.1} / {:.1} | {} | {} | {} | {deletes} | {} / {} |",
            rate * 100.0,
            x.insert.count,
            x.insert.p50,
            x.insert.p99,
            x.insert.max,
            x.fast_path_inserts,
            x.slow_path_steps,
            x.delete.count,
            x.entries_repaired,
            x.entries_invalidated
        );
    }
    let _ = writeln!(o);
}

fn visibility(o: &mut String, s: &Settings, rows: &[Row]) {
    let Some(&rate) = s.rates.get(1) else {
        return;
    };
    let _ = writeln!(
        o,
        "### Insert visibility at {:.0}% deleted (exact backend)\n",
        rate * 100.0
    );
    let _ = writeln!(o, "Per inserted vector that some exact hit of the replay should have carried (it is in the exact top-k of the request, which is the entry's own query): was it in the first such hit, in a later one (the median number of hits without it first), or in none. Split by whether the insert's fast path put it into an entry at once. With τ_risk 1 or more the slow path never runs (R < 1): the difference to 0.3 is the slow path's share; entries admitted after the insert carry it from the backend.\n");
    let _ = writeln!(o, "| policy | τ_risk | slow-path steps | wanted | fast path took: at once / later / never | not taken: at once / later (median hits before) / never |");
    let _ = writeln!(o, "|---|---|---|---|---|---|");
    let mut cands: Vec<&Row> = rows
        .iter()
        .filter(|r| {
            r.backend == "exact"
                && (r.run.rate - rate).abs() < 1e-9
                && r.group != "sweep"
                && r.run.policy.is_cache()
        })
        .collect();
    cands.sort_by_key(|r| r.group != "main");
    for r in cands {
        let v = &r.result.visibility;
        let risk = match r.run.policy {
            UpdatePolicy::Aker {
                refresh: true,
                risk,
                ..
            } => format!(
                "{}",
                risk.unwrap_or(shards::CacheConfig::default().risk_threshold)
            ),
            _ => "-".into(),
        };
        let share = |n: u64, i: usize| {
            if v.wanted[i] == 0 {
                "-".into()
            } else {
                pct(n as f64 / v.wanted[i] as f64)
            }
        };
        let median = |i: usize| {
            v.later[i]
                .get(v.later[i].len() / 2)
                .map_or("-".into(), |m| m.to_string())
        };
        let _ = writeln!(
            o,
            "| {} | {risk} | {} | {} | {} / {} / {} | {} / {} ({}) / {} |",
            r.run.policy,
            r.result.slow_path_steps,
            v.wanted[0] + v.wanted[1],
            share(v.at_once[1], 1),
            share(v.later[1].len() as u64, 1),
            share(v.never[1], 1),
            share(v.at_once[0], 0),
            share(v.later[0].len() as u64, 0),
            median(0),
            share(v.never[0], 0),
        );
    }
    let _ = writeln!(o);
}

fn sweep(o: &mut String, s: &Settings, rows: &[Row]) {
    let sweep: Vec<&Row> = rows.iter().filter(|r| r.group == "sweep").collect();
    let Some(first) = sweep.first() else {
        return;
    };
    let bytes = match first.run.pool {
        Capacity::Bytes(b) => b,
        Capacity::Objects(o) => o,
    };
    let _ = writeln!(o, "### The best Δ at equal pool bytes (exact backend, {} bytes: what ak-d10 took after warming)\n", bytes);
    let _ = writeln!(o, "A 0.5-point tolerance on recall, then the most hits: with recalls this close the choice can move by one step between runs; the trade-off itself is the row.\n");
    let _ = write!(o, "| delete |");
    for d in &s.delta_sweep {
        let _ = write!(o, " Δ = {d}: recall, hits, entries |");
    }
    let _ = writeln!(
        o,
        " best Δ: most hits within 0.5 points of the row's best recall |"
    );
    let _ = writeln!(o, "|---|{}---|", "---|".repeat(s.delta_sweep.len()));
    for &rate in &s.rates {
        let _ = write!(o, "| {:.0}% |", rate * 100.0);
        let mut best: Option<(usize, f64)> = None;
        let floor = sweep
            .iter()
            .filter(|r| (r.run.rate - rate).abs() < 1e-9)
            .map(|r| r.result.replay.recall())
            .fold(0.0, f64::max)
            - 0.005;
        for &d in &s.delta_sweep {
            let Some(r) = sweep
                .iter()
                .find(|r| r.run.policy.delta() == d && (r.run.rate - rate).abs() < 1e-9)
            else {
                let _ = write!(o, " - |");
                continue;
            };
            let (rec, hits) = (r.result.replay.recall(), r.result.replay.hit_ratio());
            let _ = write!(o, " {rec:.4}, {}, {} |", pct(hits), r.result.entries_end);
            // What larger reserves buy in recall is within half a point: hits decide.
            if rec >= floor && best.is_none_or(|(_, bh)| hits > bh) {
                best = Some((d, hits));
            }
        }
        let _ = writeln!(o, " {} |", best.map_or("-".into(), |b| b.0.to_string()));
    }
    let _ = writeln!(o);
}

fn checks(o: &mut String, s: &Settings, rows: &[Row]) {
    let _ = writeln!(o, "### Against the paper (§5.4)\n");
    for backend in ["exact", "hnsw"] {
        for &rate in &s.rates {
            let none = find(rows, backend, "main", "none", rate).map(|r| r.result.replay.recall());
            let d10 = find(rows, backend, "main", "ak-d10", rate);
            let d30 = find(rows, backend, "main", "ak-d30", rate);
            if let (Some(none), Some(d10)) = (none, d10) {
                let drop = 100.0 * (none - d10.result.replay.recall());
                let _ = write!(
                    o,
                    "- {backend}, {:.0}% deleted: AK-D10 recall {:.4} vs no cache {none:.4}: {drop:.2} points lower ({}; paper: at most 2)",
                    rate * 100.0,
                    d10.result.replay.recall(),
                    if drop <= 2.0 { "holds" } else { "does not hold" }
                );
                let _ = write!(
                    o,
                    "; the writes' own cost: {:.2} points",
                    writes_cost(rows, backend, "ak-d10", rate).unwrap_or(f64::NAN)
                );
                if let Some(d30) = d30 {
                    let ratio =
                        d10.result.entries_end as f64 / d30.result.entries_end.max(1) as f64;
                    let _ = write!(o, "; entries AK-D10 / AK-D30 {ratio:.2}x (paper: about 2x)");
                }
                let _ = writeln!(o, ".");
            }
            let rd = find(rows, backend, "main", "ak-rd", rate);
            if let (Some(rd), Some(d10)) = (rd, d10) {
                let (h_rd, h_10) = (rd.result.replay.hit_ratio(), d10.result.replay.hit_ratio());
                let _ = writeln!(
                    o,
                    "- {backend}, {:.0}% deleted: AK-RD {} hits against AK-D10's {} ({}; paper: AK-RD the fewest, 6.4% against 12.5%), recall {:.4} against {:.4} (paper: AK-RD the highest); an entry dropped here is re-admitted at its next miss, and Δ = 0 entries take half the objects.",
                    rate * 100.0,
                    pct(h_rd),
                    pct(h_10),
                    if h_rd < h_10 { "as the paper" } else { "unlike the paper" },
                    rd.result.replay.recall(),
                    d10.result.replay.recall(),
                );
            }
        }
    }
    let _ = writeln!(o, "\nThe writes' own cost: the policy's recall lost from the warm-up to the replay, less what no cache lost (the collection itself changed: deleted neighbours, new ones); positive = lost. Deletes here are ids of the collection and the insert set drawn at random (the paper invalidates random neighbour objects: the same in expectation for the pool).\n");
}

/// Recall `policy` lost from its warm-up to its replay at `rate`, beyond what no cache
/// lost over the same writes (points; positive = lost).
pub fn writes_cost(rows: &[Row], backend: &str, policy: &str, rate: f64) -> Option<f64> {
    let p = find(rows, backend, "main", policy, rate)?;
    let n = find(rows, backend, "main", "none", rate)?;
    let lost = |x: &RunResult| x.warm.recall() - x.replay.recall();
    Some(100.0 * (lost(&p.result) - lost(&n.result)))
}

/// `results.csv`: one row per run.
pub fn csv(sc: &Scenario, rows: &[Row]) -> String {
    let mut o = String::from("dataset,backend,group,policy,delta,refresh,risk,pool,delete_rate,warm_recall,warm_hit_ratio,recall,hit_ratio,head_recall,head_hit_ratio,exact_hits,approximate_hits,alias_hits,misses,entries_warm,bytes_warm,entries_after_writes,entries_end,insert_us_p50,insert_us_p99,insert_us_max,delete_us_p50,delete_us_p99,delete_us_max,fast_path_inserts,slow_path_steps,entries_repaired,entries_invalidated,dead_served,visibility_wanted,visibility_at_once,visibility_later,visibility_never,deeper_searches,seconds\n");
    for r in rows {
        let x = &r.result;
        let v = &x.visibility;
        let (refresh, risk) = match r.run.policy {
            UpdatePolicy::Aker { refresh, risk, .. } => {
                (refresh, risk.map_or(String::new(), |r| r.to_string()))
            }
            _ => (false, String::new()),
        };
        let pool = match r.run.pool {
            Capacity::Objects(n) => format!("{n} objects"),
            Capacity::Bytes(b) => format!("{b} bytes"),
        };
        let _ = writeln!(
            o,
            "{},{},{},{},{},{},{},{},{},{:.6},{:.6},{:.6},{:.6},{:.6},{:.6},{},{},{},{},{},{},{},{},{:.2},{:.2},{:.2},{:.2},{:.2},{:.2},{},{},{},{},{},{},{},{},{},{},{:.2}",
            sc.name, r.backend, r.group, r.run.policy, r.run.policy.delta(), refresh, risk, pool, r.run.rate,
            x.warm.recall(), x.warm.hit_ratio(), x.replay.recall(), x.replay.hit_ratio(),
            x.replay_head.recall(), x.replay_head.hit_ratio(),
            x.replay.exact, x.replay.approximate, x.replay.alias, x.replay.misses,
            x.entries_warm, x.bytes_warm, x.entries_after_writes, x.entries_end,
            x.insert.p50, x.insert.p99, x.insert.max, x.delete.p50, x.delete.p99, x.delete.max,
            x.fast_path_inserts, x.slow_path_steps, x.entries_repaired, x.entries_invalidated,
            x.dead_served(), v.wanted[0] + v.wanted[1], v.at_once[0] + v.at_once[1],
            v.later[0].len() + v.later[1].len(), v.never[0] + v.never[1], x.deeper_searches, x.seconds
        );
    }
    o
}

const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
    RGBColor(140, 86, 75),
    RGBColor(23, 190, 207),
];

/// Figure 18: recall (left) and hit ratio (right) against the deletion rate, one line
/// per cached policy, no cache's recall in red.
pub fn figure18(
    sc: &Scenario,
    s: &Settings,
    rows: &[Row],
    backend: &str,
    path: &Path,
) -> Fallible<()> {
    let root = BitMapBackend::new(path, (1240, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(
        &format!("{}: the cache under updates ({backend} backend)", sc.name),
        ("sans-serif", 20),
    )?;
    let panels = root.split_evenly((1, 2));
    let x_max = s.rates.iter().cloned().fold(0.0, f64::max) * 100.0 + 2.0;
    let cached: Vec<&UpdatePolicy> = s.policies.iter().filter(|p| p.is_cache()).collect();
    for (pi, panel) in panels.iter().enumerate() {
        let recall = pi == 0;
        let y_min = if recall {
            rows.iter()
                .filter(|r| r.backend == backend && r.group == "main")
                .map(|r| r.result.replay.recall())
                .fold(1.0, f64::min)
                .min(0.9)
                - 0.05
        } else {
            0.0
        };
        let y_max = if recall { 1.0 } else { 100.0 };
        let mut chart = ChartBuilder::on(panel)
            .margin(14)
            .x_label_area_size(42)
            .y_label_area_size(56)
            .build_cartesian_2d(-1.0f64..x_max, y_min.max(0.0)..y_max)?;
        chart
            .configure_mesh()
            .x_desc("deleted (% of the collection)")
            .y_desc(if recall { "recall@10" } else { "hit ratio (%)" })
            .label_style(("sans-serif", 14))
            .axis_desc_style(("sans-serif", 15))
            .draw()?;
        if recall {
            let line: Vec<(f64, f64)> = s
                .rates
                .iter()
                .filter_map(|&r| {
                    find(rows, backend, "main", "none", r)
                        .map(|x| (r * 100.0, x.result.replay.recall()))
                })
                .collect();
            chart
                .draw_series(LineSeries::new(line, RED.stroke_width(2)))?
                .label("no cache")
                .legend(|(x, y)| PathElement::new([(x, y), (x + 18, y)], RED.stroke_width(2)));
        }
        for (j, p) in cached.iter().enumerate() {
            let c = COLORS[j % COLORS.len()];
            let pts: Vec<(f64, f64)> = s
                .rates
                .iter()
                .filter_map(|&r| {
                    find(rows, backend, "main", &p.to_string(), r).map(|x| {
                        let y = if recall {
                            x.result.replay.recall()
                        } else {
                            100.0 * x.result.replay.hit_ratio()
                        };
                        (r * 100.0, y)
                    })
                })
                .collect();
            chart.draw_series(PointSeries::of_element(
                pts.clone(),
                4,
                c.filled(),
                &|p, s, st| Circle::new(p, s, st),
            ))?;
            chart
                .draw_series(LineSeries::new(pts, c.stroke_width(2)))?
                .label(p.to_string())
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], c.stroke_width(2)));
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .position(if recall {
                SeriesLabelPosition::LowerLeft
            } else {
                SeriesLabelPosition::UpperRight
            })
            .draw()?;
    }
    root.present()?;
    Ok(())
}

/// Figure 19: AK-D10's refresh cost per insert and per delete (median and p99, µs)
/// at each deletion rate.
pub fn figure19(sc: &Scenario, s: &Settings, rows: &[Row], path: &Path) -> Fallible<()> {
    let pts: Vec<(f64, &RunResult)> = s
        .rates
        .iter()
        .filter_map(|&r| find(rows, "exact", "main", "ak-d10", r).map(|x| (r, &x.result)))
        .collect();
    if pts.is_empty() {
        return Ok(());
    }
    let y_max = pts
        .iter()
        .map(|(_, x)| x.insert.p99.max(x.delete.p99))
        .fold(1.0, f64::max)
        * 1.15;
    let root = BitMapBackend::new(path, (820, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let n = pts.len();
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("{}: AK-D10 refresh cost per write (exact backend)", sc.name),
            ("sans-serif", 19),
        )
        .margin(14)
        .x_label_area_size(42)
        .y_label_area_size(60)
        .build_cartesian_2d(-0.5f64..(n as f64 - 0.5), 0f64..y_max)?;
    let labels: Vec<String> = pts
        .iter()
        .map(|(r, _)| format!("{:.0}% deleted", r * 100.0))
        .collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(2 * n + 1)
        .x_label_formatter(&|x| {
            let i = x.round();
            if (x - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < labels.len() {
                labels[i as usize].clone()
            } else {
                String::new()
            }
        })
        .y_desc("µs per write")
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 15))
        .draw()?;
    let series = [
        ("insert p50", COLORS[0].mix(0.5), 0usize),
        ("insert p99", COLORS[0].to_rgba(), 1),
        ("delete p50", COLORS[3].mix(0.5), 2),
        ("delete p99", COLORS[3].to_rgba(), 3),
    ];
    for (label, color, j) in series {
        let bars: Vec<Rectangle<(f64, f64)>> = pts
            .iter()
            .enumerate()
            .map(|(i, (_, x))| {
                let v = match j {
                    0 => x.insert.p50,
                    1 => x.insert.p99,
                    2 => x.delete.p50,
                    _ => x.delete.p99,
                };
                let x0 = i as f64 - 0.4 + 0.2 * j as f64;
                Rectangle::new([(x0, 0.0), (x0 + 0.18, v)], color.filled())
            })
            .collect();
        chart
            .draw_series(bars)?
            .label(label)
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 14, y + 6)], color.filled()));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()?;
    root.present()?;
    Ok(())
}

/// Writes one data set's CSV and figures under `out`; returns its part of `report.md`.
pub fn write(
    sc: &Scenario,
    s: &Settings,
    rows: &[Row],
    timings: &[(String, f64)],
) -> Fallible<String> {
    fs::create_dir_all(&s.out)?;
    let stem = file_stem(&sc.name);
    let text = report(sc, s, rows, timings);
    fs::write(s.out.join(format!("results-{stem}.csv")), csv(sc, rows))?;
    for backend in ["exact", "hnsw"] {
        if rows.iter().any(|r| r.backend == backend) {
            let path = s.out.join(format!("fig18-{stem}-{backend}.png"));
            figure18(sc, s, rows, backend, &path)?;
        }
    }
    figure19(sc, s, rows, &s.out.join(format!("fig19-{stem}.png")))?;
    Ok(text)
}
