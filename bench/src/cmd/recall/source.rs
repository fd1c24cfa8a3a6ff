//! One data set's part of `bench recall`: load it, draw its streams, run every policy
//! on the exact and the HNSW backend (`ef` tuned per stream, answers memoised), and the
//! filter check; what the report says about it (`DatasetSummary`).

use std::sync::Arc;
use std::time::Instant;

use bench::akerd::{AkerdFile, AkerdSetup};
use bench::experiment::{self, Policy, EF_LADDER, THRESHOLD_PAIRS, THRESHOLD_PERCENTILE};
use bench::precomputed::{PrecomputedBackend, WithVectors};
use bench::prepare::{Prepared, Seeds, Source};
use bench::report::{DatasetSummary, HnswStream, HnswSummary, PoolSpec, Row, SkewSummary};
use bench::workload::{self, Workload};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shards::store::HnswStore;
use shards::{Backend, Capacity, FilterKind, Metric};

use super::jobs::{at_equal_bytes, jobs, Job, Pool, Runs, StreamBackends};
use super::RecallArgs;
use crate::cmd::common::{bar, prepare, spinner, BackendChoice, Fallible};

/// One stream of a data set with what its runs need.
pub(super) struct Stream {
    pub(super) skew: f64,
    pub(super) workload: Workload,
    pub(super) truth: Vec<Vec<u64>>,
    pub(super) threshold: f32,
    /// The collection sample the sharded path's centroids train on (shared by streams).
    pub(super) routing: Arc<[f32]>,
    /// The sample akerd rows' centroids train on (`sharding.sample_rows` rows).
    pub(super) akerd_routing: Arc<[f32]>,
}

/// Mixed into the Potluck+ seed for the floor's shadow-check sampling (so `Seeds`,
/// printed in every report, stays as it was).
pub(super) const FLOOR_SEED: u64 = 0x0f10_0a5e;

/// Query filters checked for finding the nearest entry: the engine's default (its own
/// graph with the paper's m 4, efc 8, efs 16), hnsw_rs with the same parameters (the
/// authors' artifact), and a well-connected graph for contrast.
fn filter_check_params() -> Vec<FilterKind> {
    let (m, ef_construction, ef_search) = FilterKind::PAPER;
    vec![
        FilterKind::default(),
        FilterKind::HnswRs {
            m,
            ef_construction,
            ef_search,
        },
        FilterKind::Hnsw {
            m: 16,
            ef_construction: 100,
            ef_search: 16,
        },
    ]
}

/// Representatives (and as many look-ups) in the filter check.
const FILTER_CHECK_ENTRIES: usize = 5_000;

/// Memoised HNSW answers searched again to check that searches repeat.
const DETERMINISM_CHECK: usize = 200;

/// One stream's memoised HNSW answers: at the paper rows' depth, and at the akerd rows'
/// when it differs.
type Memo = (PrecomputedBackend, Option<PrecomputedBackend>);

/// Timed phases of one data set's runs, for the report.
type Phases = Vec<(String, f64)>;

/// One data set's runs: the settings every step shares.
pub(super) struct SourceRun<'a> {
    pub(super) args: &'a RecallArgs,
    pub(super) seeds: Seeds,
    pub(super) threads: usize,
    /// `--akerd-config`: akerd rows run beside the paper's.
    pub(super) akerd: Option<&'a AkerdFile>,
}

impl SourceRun<'_> {
    /// Neighbours per answer the paper rows' backend gives (`k + Δ`).
    fn paper_depth(&self) -> usize {
        self.args.common.k + self.args.delta
    }

    /// Neighbours per answer the akerd rows' backend gives (`k +` the file's Δ).
    fn akerd_depth(&self) -> Option<usize> {
        self.akerd.map(|a| self.args.common.k + a.delta())
    }

    /// Prepare the data set, then its streams, the exact-backend runs, the HNSW-backend
    /// runs and the filter check; its summary and rows.
    pub(super) fn all(
        &self,
        source: &Source,
        requests: usize,
    ) -> Fallible<(DatasetSummary, Vec<Row>)> {
        let (args, k) = (self.args, self.args.common.k);
        // Exact truth as deep as any row's backend answers (the paper rows read a prefix:
        // the lists are sorted by distance, then id, whatever their depth).
        let depth = self.paper_depth().max(self.akerd_depth().unwrap_or(0));
        let (prep, load_s, gt_s) = prepare(source, &args.common, depth, self.seeds)?;
        let akerd = self
            .akerd
            .map(|a| a.setup(prep.base.dim))
            .transpose()
            .map_err(|e| format!("{}: {e}", prep.name))?;
        let mut phases: Phases = vec![
            ("load".to_string(), load_s),
            ("ground truth".to_string(), gt_s),
        ];
        let t = Instant::now();
        let streams = self.streams(&prep, requests, akerd.as_ref());
        phases.push(("streams + thresholds".into(), t.elapsed().as_secs_f64()));
        // Every share in objects, the same for every policy (akerd's too); `config`: the
        // akerd file's own budget.
        let pools: Vec<Pool> = args
            .pools
            .iter()
            .filter_map(|&p| match p {
                PoolSpec::Share(share) => {
                    let objects = (share * prep.base.n as f64).round() as usize;
                    Some((p, Capacity::Objects(objects.max(k + args.delta))))
                }
                PoolSpec::Config => akerd.as_ref().map(|a| (p, a.cache.capacity)),
            })
            .collect();
        let mut rows = Vec::new();
        if args.backend != BackendChoice::Hnsw {
            let t = Instant::now();
            rows.extend(self.exact_runs(&prep, &streams, &pools, akerd.as_ref())?);
            phases.push(("exact-backend runs".into(), t.elapsed().as_secs_f64()));
        }
        let mut hnsw = None;
        if args.backend != BackendChoice::Exact {
            let (hnsw_rows, summary) =
                self.hnsw_runs(&prep, &streams, &pools, akerd.as_ref(), &mut phases)?;
            rows.extend(hnsw_rows);
            hnsw = Some(summary);
        }
        let t = Instant::now();
        let filter_checks = filter_checks(&prep.name, &streams[0].workload, args.common.metric);
        phases.push(("filter check".into(), t.elapsed().as_secs_f64()));
        let summary = dataset_summary(
            source,
            &prep,
            &streams,
            args.common.metric,
            hnsw,
            filter_checks,
            phases,
        );
        Ok((summary, rows))
    }

    /// The simZipf streams of every skew, with exact truth and Proximity+'s threshold.
    fn streams(&self, prep: &Prepared, requests: usize, akerd: Option<&AkerdSetup>) -> Vec<Stream> {
        let (args, seeds, k) = (self.args, self.seeds, self.args.common.k);
        let routing: Arc<[f32]> = prep.base.sample(experiment::ROUTING_SAMPLE_ROWS).into();
        let akerd_routing: Arc<[f32]> = match akerd {
            Some(a) if a.sample_rows != experiment::ROUTING_SAMPLE_ROWS => {
                prep.base.sample(a.sample_rows).into()
            }
            _ => routing.clone(),
        };
        args.skews
            .iter()
            .map(|&skew| {
                let workload = match args.phase_skew {
                    Some(second) => workload::sim_zipf_phased(
                        &prep.groups,
                        requests,
                        skew,
                        second,
                        args.phase_other_groups,
                        seeds.stream,
                    ),
                    None => workload::sim_zipf(&prep.groups, requests, skew, seeds.stream),
                };
                let truth = prep.truth_ids(&workload, k);
                let threshold = experiment::inter_query_percentile(
                    &workload,
                    args.common.metric,
                    THRESHOLD_PAIRS,
                    THRESHOLD_PERCENTILE,
                    seeds.threshold,
                );
                println!(
                    "[{}] skew {skew:.2}: {} distinct vectors, Proximity+ threshold {threshold}",
                    prep.name,
                    workload.n_vectors()
                );
                Stream {
                    skew,
                    workload,
                    truth,
                    threshold,
                    routing: routing.clone(),
                    akerd_routing: akerd_routing.clone(),
                }
            })
            .collect()
    }

    /// Every policy and pool against the precomputed exact answers.
    fn exact_runs(
        &self,
        prep: &Prepared,
        streams: &[Stream],
        pools: &[Pool],
        akerd: Option<&AkerdSetup>,
    ) -> Fallible<Vec<Row>> {
        let exact = PrecomputedBackend::new(
            prep.base.dim,
            self.args.common.metric,
            prep.base.n,
            &prep.groups.members,
            prep.member_truth.clone(),
        );
        // On ip a threshold is an angle to the answer's results, which takes their
        // vectors at admission whether the cache keeps them or not (`shards::gap`).
        let ip = self.args.common.metric == Metric::InnerProduct;
        let with_vectors = WithVectors::new(&exact, &prep.base);
        let both = StreamBackends {
            paper: if ip { &with_vectors } else { &exact },
            akerd: if ip || akerd.is_some_and(|a| a.cache.store_vectors) {
                &with_vectors
            } else {
                &exact
            },
        };
        let runs = Runs {
            streams,
            backends: &vec![both; streams.len()],
            akerd,
            backend_name: "exact",
            dataset: &prep.name,
            args: self.args,
            seeds: self.seeds,
            threads: self.threads,
        };
        self.policy_runs(&runs, pools, &self.args.policies)
    }

    /// `policies` over every stream and pool (`jobs`) on `runs`' backends; at equal
    /// bytes with `--equal-bytes`.
    fn policy_runs(&self, runs: &Runs, pools: &[Pool], policies: &[Policy]) -> Fallible<Vec<Row>> {
        let js = jobs(
            runs.streams.len(),
            pools,
            policies,
            &self.args.recall_floors,
        );
        let run = |js: &[Job]| runs.run(js);
        if self.args.equal_bytes {
            at_equal_bytes(&js, runs.streams, &run)
        } else {
            run(&js)
        }
    }

    /// An HNSW index over the collection, `ef` tuned per stream, its answers memoised,
    /// then every HNSW policy and pool against them.
    fn hnsw_runs(
        &self,
        prep: &Prepared,
        streams: &[Stream],
        pools: &[Pool],
        akerd: Option<&AkerdSetup>,
        phases: &mut Phases,
    ) -> Fallible<(Vec<Row>, HnswSummary)> {
        let (args, name) = (self.args, &prep.name);
        let t = Instant::now();
        let sp = spinner(&format!(
            "{name}: building HNSW (m {}, efc {})",
            args.hnsw.hnsw_m, args.hnsw.hnsw_ef_construction
        ));
        let mut store = HnswStore::build(
            prep.base.dim,
            args.common.metric,
            &prep.base.data,
            args.hnsw.hnsw_m,
            args.hnsw.hnsw_ef_construction,
            EF_LADDER[0],
        )?;
        sp.finish_and_clear();
        let build_s = t.elapsed().as_secs_f64();
        println!("[{name}] HNSW built in {build_s:.1} s");
        phases.push(("HNSW build".into(), build_s));

        let t = Instant::now();
        let (tuned, memos) = self.tune_and_memoise(prep, streams, &mut store)?;
        phases.push(("ef sweeps + HNSW answers".into(), t.elapsed().as_secs_f64()));

        let t = Instant::now();
        // akerd rows: the HNSW answers at their own depth, vectors attached if stored.
        let akerd_memos: Vec<&(dyn Backend + Sync)> = memos
            .iter()
            .map(|(paper, deeper)| deeper.as_ref().unwrap_or(paper) as &(dyn Backend + Sync))
            .collect();
        let with_vectors: Vec<WithVectors> = akerd_memos
            .iter()
            .map(|&m| WithVectors::new(m, &prep.base))
            .collect();
        let paper_vectors: Vec<WithVectors> = memos
            .iter()
            .map(|(paper, _)| WithVectors::new(paper, &prep.base))
            .collect();
        // Vectors where the cache keeps them, and on ip always (see `exact_runs`).
        let ip = args.common.metric == Metric::InnerProduct;
        let stores_vectors = ip || akerd.is_some_and(|a| a.cache.store_vectors);
        let backends: Vec<StreamBackends> = memos
            .iter()
            .zip(&akerd_memos)
            .zip(with_vectors.iter().zip(&paper_vectors))
            .map(
                |(((paper, _), &deeper), (vectors, paper_vectors))| StreamBackends {
                    paper: if ip { paper_vectors } else { paper },
                    akerd: if stores_vectors { vectors } else { deeper },
                },
            )
            .collect();
        let runs = Runs {
            streams,
            backends: &backends,
            akerd,
            backend_name: "hnsw",
            dataset: name,
            args,
            seeds: self.seeds,
            threads: self.threads,
        };
        let rows = self.policy_runs(&runs, pools, &args.hnsw_policies)?;
        phases.push(("HNSW-backend runs".into(), t.elapsed().as_secs_f64()));
        let summary = HnswSummary {
            m: args.hnsw.hnsw_m,
            ef_construction: args.hnsw.hnsw_ef_construction,
            build_seconds: build_s,
            samples: args.hnsw.ef_samples,
            target: args.hnsw.target_recall,
            streams: tuned,
        };
        Ok((rows, summary))
    }

    /// Per stream, as the paper tunes "for each workload": ef from requests sampled from
    /// the stream (so hot groups weigh as in the stream), then every distinct vector
    /// searched once and the runs served from those answers (a static index answers a
    /// repeated question identically; checked here on the first vectors). With akerd
    /// rows whose `k + Δ` differs from the paper rows', their answers are searched
    /// once more at that depth (an HNSW search for more results is not a prefix of
    /// one for fewer: it searches with `ef` at least the results asked for).
    fn tune_and_memoise(
        &self,
        prep: &Prepared,
        streams: &[Stream],
        store: &mut HnswStore,
    ) -> Fallible<(Vec<HnswStream>, Vec<Memo>)> {
        let (args, name, k) = (self.args, &prep.name, self.args.common.k);
        let mut tuned = Vec::new();
        let mut memos = Vec::new();
        for (i, st) in streams.iter().enumerate() {
            let seed = self.seeds.ef_sample + i as u64;
            let picks = request_samples(&st.workload, args.hnsw.ef_samples, seed);
            let samples: Vec<(&[f32], &[u64])> = picks
                .iter()
                .map(|&r| (st.workload.vector(r), st.truth[r as usize].as_slice()))
                .collect();
            let sweep =
                experiment::tune_ef(store, &samples, k, args.hnsw.target_recall, &EF_LADDER)?;
            let chosen = *sweep.last().expect("the ladder is not empty");
            let n = st.workload.n_vectors();
            let b = bar(n as u64, &format!("{name} {:.2}: HNSW answers", st.skew));
            let depth = k + args.delta;
            let memo = PrecomputedBackend::memoise(
                store,
                &st.workload.vectors,
                depth,
                self.threads,
                &|n| b.inc(n as u64),
            )?;
            b.finish_and_clear();
            let checked = n.min(DETERMINISM_CHECK);
            let again = &st.workload.vectors[..checked * prep.base.dim];
            let disagreements = memo.disagreements(store, again, depth)?;
            println!(
                "[{name}] skew {:.2}: ef {} (recall@{k} {:.3} on {} sampled requests); {n} vectors searched, {disagreements} of {checked} differ when searched again",
                st.skew,
                chosen.ef,
                chosen.recall,
                samples.len()
            );
            tuned.push(HnswStream {
                skew: st.skew,
                sweep,
                memoised: n,
                checked,
                disagreements,
            });
            let deeper = match self.akerd_depth().filter(|&d| d != depth) {
                Some(d) => {
                    let b = bar(n as u64, &format!("{name} {:.2}: akerd answers", st.skew));
                    let m = PrecomputedBackend::memoise(
                        store,
                        &st.workload.vectors,
                        d,
                        self.threads,
                        &|n| b.inc(n as u64),
                    )?;
                    b.finish_and_clear();
                    Some(m)
                }
                None => None,
            };
            memos.push((memo, deeper));
        }
        Ok((tuned, memos))
    }
}

/// Why the HNSW filter finds fewer approximate hits than the brute-force one: the
/// paper's parameters, and a well-connected graph for contrast.
fn filter_checks(name: &str, w: &Workload, metric: Metric) -> Vec<(FilterKind, usize, f64)> {
    filter_check_params()
        .into_iter()
        .map(|kind| {
            let (n, share) =
                experiment::filter_nearest_share(w, metric, kind, FILTER_CHECK_ENTRIES);
            println!(
                "[{name}] filter {kind}: nearest entry first for {:.1}% of {n} look-ups",
                100.0 * share
            );
            (kind, n, share)
        })
        .collect()
}

fn dataset_summary(
    source: &Source,
    prep: &Prepared,
    streams: &[Stream],
    metric: Metric,
    hnsw: Option<HnswSummary>,
    filter_checks: Vec<(FilterKind, usize, f64)>,
    phases: Phases,
) -> DatasetSummary {
    let truth_from = if prep.truth_loaded {
        "loaded from the cache"
    } else {
        "computed"
    };
    DatasetSummary {
        name: prep.name.clone(),
        description: source.describe(),
        bases: prep.bases.clone(),
        collection: prep.base.n,
        dim: prep.base.dim,
        metric,
        members: prep.members(),
        truth: format!(
            "exact top-{} by brute force, {truth_from} ({})",
            prep.depth,
            prep.truth_path.display()
        ),
        skews: streams
            .iter()
            .map(|s| SkewSummary {
                skew: s.skew,
                distinct: s.workload.n_vectors(),
                threshold: s.threshold,
            })
            .collect(),
        hnsw,
        filter_checks,
        phases,
    }
}

/// `n` request positions of `w` drawn uniformly with replacement: the vectors they
/// name weigh as much as they do in the stream.
fn request_samples(w: &Workload, n: usize, seed: u64) -> Vec<u32> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| w.requests[rng.gen_range(0..w.requests.len())])
        .collect()
}
