//! The recall floor in the experiment runner (`RunSpec::floor`): sampled shadow checks
//! against the backend drive `shards::floor`'s controller, which narrows paper-Aker's
//! approximate hits until the served recall holds the floor.

use aker_formats::data::{split_queries, synthetic};
use bench::experiment::{self, FloorSpec, Policy, RunResult, RunSpec};
use bench::groundtruth::exact_top_n;
use bench::precomputed::PrecomputedBackend;
use bench::workload::{sim_zipf, Groups, Workload, GROUP_SIZE};
use shards::floor::FloorConfig;
use shards::{Backend, Capacity, Metric};

const K: usize = 10;
const REQUESTS: usize = 6_000;

struct Setup {
    workload: Workload,
    truth: Vec<Vec<u64>>,
    backend: PrecomputedBackend,
    pool: usize,
}

fn setup() -> Setup {
    let all = synthetic(20_200, 16, 20, 7);
    let (base, bases) = split_queries(&all, 200, 8);
    let groups = Groups::build(&bases, &bases, GROUP_SIZE, 9);
    let workload = sim_zipf(&groups, REQUESTS, 0.99, 10);
    let lists = exact_top_n(&base, &workload.vectors, Metric::L2Sq, K);
    let truth = lists
        .iter()
        .map(|l| l.iter().map(|c| c.id).collect())
        .collect();
    let backend = PrecomputedBackend::new(16, Metric::L2Sq, base.n, &workload.vectors, lists);
    Setup {
        workload,
        truth,
        backend,
        pool: base.n / 20,
    }
}

fn spec(floor: Option<f64>, window: usize) -> RunSpec {
    RunSpec {
        policy: "aker-bf".parse::<Policy>().unwrap(),
        pool: Capacity::Objects(1_000),
        k: K,
        delta: 0,
        global_threshold: 0.0,
        potluck_grow: experiment::POTLUCK_GROW,
        potluck_shrink: experiment::POTLUCK_SHRINK,
        potluck_seed: 12,
        filter_candidates: 1,
        standby_search: shards::StandbySearch::Nearest,
        shards: 1,
        akerd: None,
        // Every hit checked: a short stream gives the controller enough samples.
        floor: floor.map(|floor| FloorSpec {
            config: FloorConfig {
                floor,
                sample: 1.0,
                ..FloorConfig::default()
            },
            seed: 5,
        }),
        relative: false,
        window,
    }
}

fn run(s: &Setup, spec: &RunSpec) -> RunResult {
    let spec = RunSpec {
        pool: Capacity::Objects(s.pool),
        ..spec.clone()
    };
    experiment::run(
        &spec,
        &s.workload,
        &s.truth,
        &[],
        &s.backend as &dyn Backend,
        &|_| {},
    )
    .unwrap()
}

/// Tolerance of the measured recall below the floor: the whole run counts, the
/// controller's warm-up (50 checks before its first step) included.
const TOLERANCE: f64 = 0.01;

#[test]
fn a_floor_above_the_plain_recall_is_held_at_fewer_hits() {
    let s = setup();
    let plain = run(&s, &spec(None, 0));
    assert_eq!(plain.shadow_calls, 0);
    assert!(plain.floor.is_none() && plain.series.is_empty());
    let floor = 0.97;
    assert!(
        plain.recall() < floor - 0.01,
        "the plain row must lose recall for the test to mean anything: {}",
        plain.recall()
    );
    let held = run(&s, &spec(Some(floor), 1_000));
    println!(
        "plain {:.4} / {} hits; floor {floor}: {:.4} / {} hits, {:?}",
        plain.recall(),
        plain.hits(),
        held.recall(),
        held.hits(),
        held.floor
    );
    assert!(
        held.recall() >= floor - TOLERANCE,
        "floor {floor}: measured {:.4}",
        held.recall()
    );
    assert!(
        held.hits() > 0 && held.hits() < plain.hits(),
        "{} hits against {}",
        held.hits(),
        plain.hits()
    );
    let f = held.floor.expect("a floor outcome");
    assert!(f.estimate.tightened > 0 && f.estimate.scale < 1.0, "{f:?}");
    // Every hit was checked (exact ones at an eighth), each a backend search of its own.
    assert!(held.shadow_calls >= held.approximate.count + held.alias.count);
    assert!(held.shadow_calls <= held.hits());
    assert_eq!(held.backend_calls(), held.miss.count);
    assert!(held.shadow_share() > 0.0 && held.shadow_share() < 1.0);
    // The exact backend: the estimate speaks of exact recall, and it is close to it
    // over the run's last part (the estimate's memory).
    let tail = held.recall_since(3_000).unwrap();
    assert_eq!(tail.requests, 3_000);
    assert!(
        (f.estimate.recall - tail.recall()).abs() < 0.03,
        "estimate {:.4} against {:.4} measured over the last 3,000",
        f.estimate.recall,
        tail.recall()
    );
    // The series: one point per 1,000 requests that add up to the run.
    assert_eq!(held.series.len(), REQUESTS / 1_000);
    let sum: f64 = held.series.iter().map(|w| w.recall_sum).sum();
    assert!((sum / REQUESTS as f64 - held.recall()).abs() < 1e-9);
    assert_eq!(held.series.iter().map(|w| w.hits).sum::<u64>(), held.hits());
    assert!(held.series.iter().all(|w| w.estimate.is_some()));
}

#[test]
fn floor_zero_checks_but_never_steers() {
    let s = setup();
    let plain = run(&s, &spec(None, 0));
    let zero = run(&s, &spec(Some(0.0), 0));
    // The same answers: the checks are extra backend searches, nothing else.
    for (a, b) in [
        (&plain.exact, &zero.exact),
        (&plain.alias, &zero.alias),
        (&plain.approximate, &zero.approximate),
        (&plain.miss, &zero.miss),
    ] {
        assert_eq!(a, b);
    }
    assert_eq!(plain.recall(), zero.recall());
    assert!(zero.shadow_calls > 0);
    let e = zero.floor.unwrap().estimate;
    assert_eq!((e.scale, e.tightened, e.state.name()), (1.0, 0, "off"));
}

#[test]
fn a_floor_the_plain_row_already_holds_keeps_its_hits() {
    let s = setup();
    let plain = run(&s, &spec(None, 0));
    let low = run(&s, &spec(Some(0.5), 0));
    assert_eq!(low.floor.unwrap().estimate.tightened, 0);
    assert_eq!(low.hits(), plain.hits());
    assert_eq!(low.recall(), plain.recall());
}
