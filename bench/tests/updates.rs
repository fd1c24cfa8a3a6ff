//! The cache-under-updates experiment on a small synthetic set: every reply is checked
//! against the ids not live at that moment, and the policies differ the way §5.4 says
//! they must (reserves keep entries through deletes, the no-refresh ablation loses them).

use aker_formats::data;
use bench::prepare::Seeds;
use bench::updates::{self, RunResult, Scenario, ScenarioSpec, UpdatePolicy, UpdateRun};
use shards::{Capacity, Metric};

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

fn run(sc: &Scenario, policy: &str, rate: f64) -> RunResult {
    let warm = sc.truth(&sc.liveness(None)).unwrap();
    let replay = sc.truth(&sc.liveness(Some(rate))).unwrap();
    let run = UpdateRun {
        policy: policy.parse::<UpdatePolicy>().unwrap(),
        rate,
        pool: Capacity::Objects(sc.collection / 20),
    };
    updates::run(&run, sc, &sc.exact, None, &warm, &replay, 5, &|_| {}).unwrap()
}

#[test]
fn the_split_keeps_inserts_out_of_the_warm_collection() {
    let dir = tempfile::tempdir().unwrap();
    let sc = scenario(dir.path());
    assert_eq!(sc.union.n, 6_100);
    assert_eq!(sc.union.n - sc.collection, 305);
    let warm = sc.liveness(None);
    assert!(sc.inserts().all(|id| !warm[id as usize]));
    let after = sc.liveness(Some(0.25));
    assert_eq!(
        sc.deletes(0.25).len(),
        (sc.collection as f64 * 0.25).round() as usize
    );
    assert!(sc.deletes(0.25).iter().all(|&id| !after[id as usize]));
    assert!(
        sc.deletes(0.05)
            .iter()
            .zip(sc.deletes(0.25))
            .all(|(a, b)| a == b),
        "nested"
    );
    // The truth after the writes: the exact top-k among live rows, brute force.
    let truth = sc.truth(&after).unwrap();
    let q = sc.workload.vector(0);
    let mut live: Vec<(f32, u64)> = (0..sc.union.n)
        .filter(|&i| after[i])
        .map(|i| (Metric::L2Sq.distance(q, sc.union.row(i)), i as u64))
        .collect();
    live.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let want: Vec<u64> = live.iter().take(10).map(|x| x.1).collect();
    assert_eq!(truth[0], want);
}

#[test]
fn no_policy_serves_a_deleted_id_and_reserves_keep_entries() {
    let dir = tempfile::tempdir().unwrap();
    let sc = scenario(dir.path());
    let none = run(&sc, "none", 0.25);
    assert_eq!(none.replay.recall(), 1.0, "the exact backend is the truth");
    let d10 = run(&sc, "ak-d10", 0.25);
    let rd = run(&sc, "ak-rd", 0.25);
    let pl = run(&sc, "pl10", 0.25);
    for (name, r) in [
        ("none", &none),
        ("ak-d10", &d10),
        ("ak-rd", &rd),
        ("pl10", &pl),
    ] {
        assert_eq!(r.dead_served(), 0, "{name}");
        assert_eq!(r.replay.requests, 4_000, "{name}");
    }
    assert!(d10.entries_repaired > 0, "reserves were promoted");
    assert_eq!(rd.entries_repaired, 0, "no refresh: nothing promoted");
    assert_eq!(
        rd.fast_path_inserts, 0,
        "no refresh: inserts reach no entry"
    );
    let kept = |r: &RunResult| r.entries_after_writes as f64 / r.entries_warm as f64;
    assert!(
        kept(&d10) > kept(&rd),
        "Δ = 10 keeps more of its entries through a quarter deleted: {} vs {}",
        kept(&d10),
        kept(&rd)
    );
    assert!(d10.insert.count == 305 && d10.delete.count == sc.deletes(0.25).len());
}
