//! The runs of `bench recall`: which configurations run (`jobs`), the equal-bytes
//! variant (`at_equal_bytes`), and running them in parallel against a stream's backends
//! (`run_jobs`, on the library's worker pool shared with `bench updates`).

use bench::akerd::AkerdSetup;
use bench::experiment::{self, FloorSpec, Policy, Rule, RunSpec};
use bench::prepare::Seeds;
use bench::report::{PoolSpec, Row};
use bench::workers;
use indicatif::ProgressBar;
use shards::{Backend, Capacity};

use super::source::{Stream, FLOOR_SEED};
use super::RecallArgs;
use crate::cmd::common::{bar, Fallible};

/// A pool as `--pools` names it and the budget its runs get.
pub(super) type Pool = (PoolSpec, Capacity);

/// One configuration to run.
#[derive(Clone, Copy)]
pub(super) struct Job {
    pub(super) stream: usize,
    pub(super) pool: Option<Pool>,
    pub(super) policy: Policy,
    /// `--recall-floors`: the floor this run holds; `None`: the plain row.
    pub(super) floor: Option<f64>,
}

/// The jobs of `policies` over every stream and pool (no-cache once per stream; the
/// `config` pool for akerd rows only), each cached one also once per floor of
/// `floors`, the slowest first so that the last ones to finish are short.
pub(super) fn jobs(
    streams: usize,
    pools: &[Pool],
    policies: &[Policy],
    floors: &[f64],
) -> Vec<Job> {
    let mut out = Vec::new();
    for stream in 0..streams {
        for &policy in policies {
            if policy.rule == Rule::NoCache {
                out.push(Job {
                    stream,
                    pool: None,
                    policy,
                    floor: None,
                });
            } else {
                for &p in pools
                    .iter()
                    .filter(|(p, _)| *p != PoolSpec::Config || policy.rule == Rule::Akerd)
                {
                    for floor in std::iter::once(None).chain(floors.iter().map(|&f| Some(f))) {
                        out.push(Job {
                            stream,
                            pool: Some(p),
                            policy,
                            floor,
                        });
                    }
                }
            }
        }
    }
    out.sort_by_key(|j| {
        let size = match j.pool {
            None => 0,
            Some((_, Capacity::Objects(n))) => n,
            Some((_, Capacity::Bytes(_))) => usize::MAX,
        };
        std::cmp::Reverse((j.policy.brute_force_filter, size))
    });
    out
}

/// What one stream's runs search: the paper rows' backend, and the akerd rows' (as
/// deep as `k + Δ` of the file, neighbour vectors attached when it stores them).
#[derive(Clone, Copy)]
pub(super) struct StreamBackends<'a> {
    pub(super) paper: &'a (dyn Backend + Sync),
    pub(super) akerd: &'a (dyn Backend + Sync),
}

/// Runs `jobs` on `threads` workers, stream `i`'s against `backends[i]`; rows in job
/// order. `akerd`: the setup akerd rows run (`--akerd-config`).
/// `--equal-bytes`: first paper-Aker's default (`aker`) at each stream's share pools in
/// objects, then every job of a share pool with the bytes that run took at its end
/// (`RunResult::bytes`) as its budget. The reference runs themselves are not reported;
/// `aker` runs again at the bytes like every other row.
pub(super) fn at_equal_bytes(
    jobs: &[Job],
    streams: &[Stream],
    run: &dyn Fn(&[Job]) -> Fallible<Vec<Row>>,
) -> Fallible<Vec<Row>> {
    let aker: Policy = "aker".parse()?;
    let mut refs: Vec<Job> = Vec::new();
    for j in jobs {
        if let Some((PoolSpec::Share(_), Capacity::Objects(_))) = j.pool {
            let r = Job {
                policy: aker,
                floor: None,
                ..*j
            };
            if !refs
                .iter()
                .any(|x| x.stream == r.stream && x.pool == r.pool)
            {
                refs.push(r);
            }
        }
    }
    let reference = run(&refs)?;
    let budget = |stream: usize, spec: PoolSpec| -> Fallible<usize> {
        reference
            .iter()
            .find(|r| r.skew == streams[stream].skew && r.pool.map(|p| p.0) == Some(spec))
            .map(|r| r.result.bytes)
            .ok_or_else(|| format!("no reference run for pool {spec}").into())
    };
    let mut moved = Vec::with_capacity(jobs.len());
    for j in jobs {
        let pool = match j.pool {
            Some((spec @ PoolSpec::Share(_), Capacity::Objects(_))) => {
                Some((spec, Capacity::Bytes(budget(j.stream, spec)?)))
            }
            other => other,
        };
        moved.push(Job { pool, ..*j });
    }
    run(&moved)
}

/// What every run of one data set on one backend shares.
pub(super) struct Runs<'a> {
    pub(super) streams: &'a [Stream],
    /// Stream `i`'s runs search `backends[i]`.
    pub(super) backends: &'a [StreamBackends<'a>],
    /// The setup akerd rows run (`--akerd-config`).
    pub(super) akerd: Option<&'a AkerdSetup>,
    pub(super) backend_name: &'static str,
    pub(super) dataset: &'a str,
    pub(super) args: &'a RecallArgs,
    pub(super) seeds: Seeds,
    pub(super) threads: usize,
}

impl Runs<'_> {
    /// Runs `jobs` on `threads` workers with a progress bar over their requests; rows in
    /// job order.
    pub(super) fn run(&self, jobs: &[Job]) -> Fallible<Vec<Row>> {
        let (dataset, backend_name) = (self.dataset, self.backend_name);
        let total: u64 = jobs
            .iter()
            .map(|j| self.streams[j.stream].workload.requests.len() as u64)
            .sum();
        let b = bar(total, &format!("{dataset}/{backend_name}: runs"));
        let rows = workers::run_all(jobs, self.threads, |job| {
            let row = self
                .one(job, &b)
                .map_err(|e| format!("{dataset}/{backend_name} {}: {e}", job.policy))?;
            // Printed whether or not the bar is drawn (it is not off a terminal).
            b.suspend(|| println!("{}", self.progress_line(&row)));
            Ok(row)
        });
        b.finish_and_clear();
        Ok(rows?)
    }

    /// One job's run and its row.
    fn one(&self, job: &Job, b: &ProgressBar) -> shards::Result<Row> {
        let st = &self.streams[job.stream];
        let spec = self.spec(job);
        let (backend, routing) = if job.policy.rule == Rule::Akerd {
            (self.backends[job.stream].akerd, &st.akerd_routing)
        } else {
            (self.backends[job.stream].paper, &st.routing)
        };
        let result = experiment::run(&spec, &st.workload, &st.truth, routing, backend, &|n| {
            b.inc(n)
        })?;
        Ok(Row {
            dataset: self.dataset.to_string(),
            backend: self.backend_name.to_string(),
            k: self.args.common.k,
            metric: self.args.common.metric,
            skew: st.skew,
            pool: job.pool,
            policy: job.policy,
            filter: spec.filter_used(),
            threshold: spec.global_threshold_used(),
            floor: job.floor,
            result,
        })
    }

    /// The experiment's settings for `job`.
    fn spec(&self, job: &Job) -> RunSpec {
        let (args, seeds) = (self.args, self.seeds);
        let is_akerd = job.policy.rule == Rule::Akerd;
        RunSpec {
            policy: job.policy,
            pool: job.pool.map_or(Capacity::Objects(1), |(_, c)| c),
            k: args.common.k,
            delta: args.delta,
            global_threshold: self.streams[job.stream].threshold,
            potluck_grow: args.potluck_grow,
            potluck_shrink: args.potluck_shrink,
            potluck_seed: seeds.potluck,
            filter_candidates: args.filter_candidates,
            standby_search: args.standby_search.engine(),
            shards: args.shards as usize,
            akerd: self.akerd.filter(|_| is_akerd).cloned(),
            floor: job.floor.map(|f| FloorSpec {
                config: args.floor_config(f),
                seed: seeds.potluck ^ FLOOR_SEED,
            }),
            // The backend's own answer per request: the floor's reference, which
            // differs from exact truth only on an approximate backend.
            relative: args.floors_on() && self.backend_name != "exact",
            window: if args.floors_on() {
                args.floor_window as usize
            } else {
                0
            },
        }
    }

    /// The line printed when a row is done.
    fn progress_line(&self, row: &Row) -> String {
        let floor = row.result.floor.map_or(String::new(), |f| {
            format!(
                " floor: est {:.3} low {:.3} scale {:.4} {} shadow {}{}",
                f.estimate.recall,
                f.estimate.low,
                f.estimate.scale,
                f.estimate.state.name(),
                row.result.shadow_calls,
                row.result
                    .relative_recall()
                    .map_or(String::new(), |r| format!(" relative {r:.3}"))
            )
        });
        format!(
            "  {}/{} skew {:.2} pool {:>3} {:<8} recall {:.3} hits {:5.1}% ({:.1} s){floor}",
            self.dataset,
            self.backend_name,
            row.skew,
            row.pool_label(),
            row.label(),
            row.result.recall(),
            100.0 * row.result.ratio(row.result.hits()),
            row.result.seconds,
        )
    }
}
