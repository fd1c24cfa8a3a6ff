//! The runner's command line (`bench recall`'s options and the jobs they make, and the
//! options every subcommand shares), parsed as clap parses them.

use std::path::PathBuf;

use bench::experiment::{Policy, Rule};
use bench::report::PoolSpec;
use clap::Parser;
use shards::floor::FloorConfig;
use shards::Capacity;

use super::jobs::jobs;
use super::{akerd_rows, RecallArgs};
use crate::{Cli, Cmd};

fn recall_args(extra: &[&str]) -> RecallArgs {
    let argv = ["bench", "recall"].iter().chain(extra).copied();
    match Cli::try_parse_from(argv).unwrap().cmd {
        Cmd::Recall(a) => a,
        _ => unreachable!("not recall"),
    }
}

fn shipped() -> String {
    format!("{}/../ops/akerd.toml", env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn pools_config_parses_and_needs_an_akerd_file() {
    let mut a = recall_args(&["--pools", "config,1%", "--normalize"]);
    assert_eq!(a.pools, vec![PoolSpec::Config, PoolSpec::Share(0.01)]);
    assert!(a.common.normalize);
    let e = akerd_rows(&mut a).unwrap_err().to_string();
    assert!(e.contains("--akerd-config"), "{e}");
    let mut a = recall_args(&["--policies", "aker,akerd"]);
    assert!(
        akerd_rows(&mut a).is_err(),
        "the akerd policy needs the file"
    );
    assert!(Cli::try_parse_from(["bench", "recall", "--pools", "0%"]).is_err());

    let mut a = recall_args(&["--pools", "config,1%", "--akerd-config", &shipped()]);
    let file = akerd_rows(&mut a).unwrap().unwrap();
    assert_eq!(file.shards(), 2);
    let akerd: Policy = "akerd".parse().unwrap();
    assert_eq!(a.policies.last(), Some(&akerd));
    assert_eq!(
        a.hnsw_policies,
        vec!["aker".parse().unwrap(), "none".parse().unwrap(), akerd]
    );
    // Listed already: not twice.
    let mut a = recall_args(&["--policies", "akerd,none", "--akerd-config", &shipped()]);
    akerd_rows(&mut a).unwrap();
    assert_eq!(a.policies.iter().filter(|p| **p == akerd).count(), 1);
}

#[test]
fn floor_flags_parse_and_add_one_row_per_floor() {
    let a = recall_args(&[]);
    assert!(a.recall_floors.is_empty() && !a.floors_on());
    assert_eq!(a.floor_sample, 0.05);
    assert_eq!((a.floor_window, a.phase_skew), (5_000, None));
    let a = recall_args(&[
        "--recall-floors",
        "0.9,0.95, 0.98",
        "--floor-sample",
        "0.1",
        "--floor-window",
        "1000",
        "--phase-skew",
        "0.30",
        "--phase-other-groups",
    ]);
    assert_eq!(a.recall_floors, vec![0.9, 0.95, 0.98]);
    assert_eq!(a.floor_sample, 0.1);
    assert_eq!(a.floor_window, 1_000);
    assert_eq!((a.phase_skew, a.phase_other_groups), (Some(0.30), true));
    let c = a.floor_config(0.95);
    assert_eq!((c.floor, c.sample), (0.95, 0.1));
    assert_eq!(
        c,
        FloorConfig {
            floor: 0.95,
            sample: 0.1,
            ..FloorConfig::default()
        }
    );
    for bad in [
        &["--recall-floors", "1.0"][..],
        &["--recall-floors", "-0.1"],
        &["--recall-floors", "0.9,x"],
        &["--floor-window", "0"],
        &["--phase-other-groups"],
    ] {
        let argv = ["bench", "recall"].iter().chain(bad).copied();
        assert!(Cli::try_parse_from(argv).is_err(), "{bad:?}");
    }
    // A sample out of range parses, and is refused by the floor's own validation.
    let a = recall_args(&["--recall-floors", "0.9", "--floor-sample", "0"]);
    assert!(shards::floor::RecallFloor::new(a.floor_config(0.9)).is_err());

    let pools = [
        (PoolSpec::Share(0.01), Capacity::Objects(100)),
        (PoolSpec::Share(0.05), Capacity::Objects(500)),
    ];
    let policies: Vec<Policy> = ["aker", "none"]
        .iter()
        .map(|p| p.parse().unwrap())
        .collect();
    let js = jobs(1, &pools, &policies, &[0.9, 0.95]);
    // aker: (plain + 2 floors) x 2 pools; none: once, no floor.
    assert_eq!(js.len(), 7);
    let floors = |rule| {
        js.iter()
            .filter(|j| j.policy.rule == rule)
            .map(|j| j.floor)
            .collect::<Vec<_>>()
    };
    assert_eq!(floors(Rule::NoCache), vec![None]);
    let aker = floors(Rule::Aker);
    for f in [None, Some(0.9), Some(0.95)] {
        assert_eq!(aker.iter().filter(|&&x| x == f).count(), 2, "{f:?}");
    }
    assert_eq!(jobs(1, &pools, &policies, &[]).len(), 3);
}

#[test]
fn a_metric_the_akerd_file_contradicts_is_refused() {
    let mut a = recall_args(&["--metric", "cosine", "--akerd-config", &shipped()]);
    let e = akerd_rows(&mut a).unwrap_err().to_string();
    assert!(e.contains("cache.metric") && e.contains("cosine"), "{e}");
}

#[test]
fn only_akerd_rows_run_the_config_pool() {
    let pools = [
        (PoolSpec::Share(0.01), Capacity::Objects(100)),
        (PoolSpec::Config, Capacity::Bytes(1 << 20)),
    ];
    let policies: Vec<Policy> = ["aker", "akerd", "none"]
        .iter()
        .map(|p| p.parse().unwrap())
        .collect();
    let js = jobs(2, &pools, &policies, &[]);
    let count = |rule: Rule, pool: Option<PoolSpec>| {
        js.iter()
            .filter(|j| j.policy.rule == rule && j.pool.map(|(p, _)| p) == pool)
            .count()
    };
    assert_eq!(count(Rule::Aker, Some(PoolSpec::Share(0.01))), 2);
    assert_eq!(count(Rule::Aker, Some(PoolSpec::Config)), 0);
    assert_eq!(count(Rule::Akerd, Some(PoolSpec::Share(0.01))), 2);
    assert_eq!(count(Rule::Akerd, Some(PoolSpec::Config)), 2);
    assert_eq!(count(Rule::NoCache, None), 2);
    assert_eq!(js.len(), 8);
}

#[test]
fn queries_groups_and_relative_default_paths_parse() {
    let a = recall_args(&[]);
    let c = &a.common;
    assert_eq!((c.queries.as_ref(), c.groups), (None, 1_000));
    assert_eq!(c.data_dir, PathBuf::from("data"));
    assert_eq!(c.cache_dir, PathBuf::from("data/cache"));
    assert_eq!(a.out, PathBuf::from("bench/results"));
    let a = recall_args(&["--queries", "q.fvecs", "--groups", "200"]);
    assert_eq!(a.common.queries, Some(PathBuf::from("q.fvecs")));
    assert_eq!(a.common.groups, 200);
    let argv = [
        "bench",
        "trace",
        "--out",
        "t.trace",
        "--queries",
        "q.npy",
        "--groups",
        "7",
    ];
    let Cmd::Trace(t) = Cli::try_parse_from(argv).unwrap().cmd else {
        unreachable!()
    };
    assert_eq!(t.common.queries, Some(PathBuf::from("q.npy")));
    assert_eq!(t.common.groups, 7);
    for bad in ["0", "-1", "x"] {
        assert!(Cli::try_parse_from(["bench", "recall", "--groups", bad]).is_err());
    }
}
