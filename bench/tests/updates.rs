//! The cache-under-updates experiment on a small synthetic set: every reply is checked
//! against the ids not live at that moment (and the check fires on a planted defect),
//! the policies differ the way their switches say, and the traces for akerd agree with
//! the collection they describe.

use aker_formats::data;
use aker_formats::trace::Op;
use bench::prepare::Seeds;
use bench::updates::{
    self, Fault, LiveBackend, Phases, RunResult, Scenario, ScenarioSpec, UpdatePolicy, UpdateRun,
};
use shards::{Backend, Capacity, Metric};

fn scenario(dir: &std::path::Path) -> Scenario {
    let all = data::synthetic(6_200, 8, 40, 7);
    let (rows, bases) = data::split_queries(&all, 100, 1);
    let spec = ScenarioSpec {
        name: "synthetic-test".into(),
        metric: Metric::L2Sq,
        k: 10,
        bases: &bases,
        rows: &rows,
        insert_share: 0.05,
        requests: 4_000,
        skew: 0.99,
        unit_requests: false,
        seeds: Seeds::from_base(3),
        cache_dir: dir,
    };
    Scenario::prepare(&spec, &|_| {}).unwrap()
}

/// The exact top-k ids of `q` among the `live` rows, by a scan of its own.
fn brute_force(sc: &Scenario, q: &[f32], live: &[bool], k: usize) -> Vec<u64> {
    let mut d: Vec<(f32, u64)> = (0..sc.union.n)
        .filter(|&i| live[i])
        .map(|i| (Metric::L2Sq.distance(q, sc.union.row(i)), i as u64))
        .collect();
    d.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    d.iter().take(k).map(|x| x.1).collect()
}

fn run_as(sc: &Scenario, policy: &str, rate: f64, pool: usize, fault: Fault) -> RunResult {
    let warm = sc.truth(&sc.liveness(None)).unwrap();
    let replay = sc.truth(&sc.liveness(Some(rate))).unwrap();
    let run = UpdateRun {
        policy: policy.parse::<UpdatePolicy>().unwrap(),
        rate,
        pool: Capacity::Objects(pool),
    };
    let phases = Phases {
        lists: &sc.exact,
        hnsw: None,
        warm_truth: &warm,
        replay_truth: &replay,
    };
    updates::run_with(&run, sc, &phases, 5, fault, &|_| {}).unwrap()
}

fn run(sc: &Scenario, policy: &str, rate: f64) -> RunResult {
    run_as(sc, policy, rate, sc.collection / 20, Fault::None)
}

#[test]
fn the_split_keeps_inserts_out_of_the_warm_collection_and_truth_is_exact() {
    let dir = tempfile::tempdir().unwrap();
    let sc = scenario(dir.path());
    assert_eq!(sc.union.n, 6_100);
    assert_eq!(sc.union.n - sc.collection, 305);
    let warm = sc.liveness(None);
    assert!(sc.inserts().all(|id| !warm[id as usize]));
    let after = sc.liveness(Some(0.25));
    let deleted = sc.deletes(0.25);
    assert_eq!(
        deleted.len(),
        (sc.collection as f64 * 0.25).round() as usize
    );
    let mut distinct = deleted.to_vec();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), deleted.len(), "each id deleted once");
    assert!(deleted.iter().all(|&id| !after[id as usize]));
    let truth = sc.truth(&after).unwrap();
    for i in [0u32, 17, 99] {
        let q = sc.workload.vector(i);
        assert_eq!(
            truth[i as usize],
            brute_force(&sc, q, &after, 10),
            "vector {i}"
        );
    }
}

#[test]
fn the_live_backend_searches_deeper_when_its_list_runs_out() {
    let dir = tempfile::tempdir().unwrap();
    let sc = scenario(dir.path());
    let q = sc.workload.vector(0);
    let mut live = sc.liveness(Some(0.0));
    // Kill 75 of the 80 prepared neighbours: 5 survive, fewer than k.
    for c in sc.exact.list(q).unwrap().iter().take(75) {
        live[c.id as usize] = false;
    }
    let b = LiveBackend::new(&sc, &sc.exact, None, live.clone());
    let got: Vec<u64> = b.search(q, 10).unwrap().iter().map(|c| c.id).collect();
    assert_eq!(got, brute_force(&sc, q, &live, 10));
    assert_eq!(b.deeper.load(std::sync::atomic::Ordering::Relaxed), 1);
}

#[test]
fn no_policy_serves_a_deleted_id_and_the_switches_do_what_they_say() {
    let dir = tempfile::tempdir().unwrap();
    let sc = scenario(dir.path());
    let none = run(&sc, "none", 0.25);
    assert_eq!(none.replay.recall(), 1.0, "the exact backend is the truth");
    let d10 = run(&sc, "ak-d10", 0.25);
    let d0 = run(&sc, "ak-d0", 0.25);
    let rd = run(&sc, "ak-rd", 0.25);
    let pl = run(&sc, "pl10", 0.25);
    for (name, r) in [
        ("none", &none),
        ("ak-d10", &d10),
        ("ak-d0", &d0),
        ("ak-rd", &rd),
        ("pl10", &pl),
    ] {
        assert_eq!(r.dead_served(), 0, "{name}");
        assert_eq!(r.replay.requests, 4_000, "{name}");
    }
    assert!(d10.entries_repaired > 0, "Δ = 10: reserves were promoted");
    // Δ 0 with and without refresh: only the refresh switch differs.
    assert!(d0.slow_path_steps > 0, "refresh: the slow path ran");
    assert_eq!(
        (rd.slow_path_steps, rd.fast_path_inserts),
        (0, 0),
        "no refresh"
    );
    assert!(d10.insert.count == 305 && d10.delete.count == sc.deletes(0.25).len());
    assert!(d10.replay_head.requests > 0 && d10.replay_head.requests <= d10.replay.requests);
}

#[test]
fn the_check_catches_a_cache_that_misses_deletes() {
    let dir = tempfile::tempdir().unwrap();
    let sc = scenario(dir.path());
    // A pool as large as the collection: entries from the warm-up live on into the replay.
    let r = run_as(
        &sc,
        "ak-d10",
        0.25,
        sc.collection,
        Fault::CacheMissesDeletes,
    );
    assert!(
        r.dead_served() > 0,
        "deleted ids served from the cache must be counted: {r:?}"
    );
    assert_eq!(r.warm.dead_served, 0);
}

#[test]
fn the_traces_describe_the_collection_after_their_writes() {
    let dir = tempfile::tempdir().unwrap();
    let sc = scenario(dir.path());
    let set = sc.traces(0.10).unwrap();
    let searches = sc.workload.requests.len();
    let (mut live, mut ins, mut del) = (sc.liveness(None), 0, 0);
    for op in &set.writes.ops {
        match *op {
            Op::Insert { id, vector } => {
                assert!(sc.inserts().contains(&id));
                assert_eq!(set.writes.vector(vector), sc.union.row(id as usize));
                live[id as usize] = true;
                ins += 1;
            }
            Op::Delete { id } => {
                assert!(id < sc.collection as u64 && live[id as usize], "a live row");
                live[id as usize] = false;
                del += 1;
            }
            Op::Search { .. } => {}
        }
    }
    assert_eq!((ins, del), (set.inserts, set.deletes));
    let writes = ins + del;
    assert_eq!(set.writes.ops.len(), searches + writes);
    assert!((writes as f64 / (searches + writes) as f64 - 0.10).abs() < 0.001);
    assert!(ins.abs_diff(del) <= 1, "alternating");
    let replay = set.replay.ground_truth.as_ref().unwrap();
    let warm = set.warm.ground_truth.as_ref().unwrap();
    for i in [0u32, 5, 42] {
        let q = sc.workload.vector(i);
        assert_eq!(replay[i as usize], brute_force(&sc, q, &live, 10));
        assert_eq!(
            warm[i as usize],
            brute_force(&sc, q, &sc.liveness(None), 10)
        );
    }
}
