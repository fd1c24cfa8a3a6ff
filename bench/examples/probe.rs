// Scratch probe for the faithfulness investigation (deleted afterwards).
use bench::experiment::recall_at;
use bench::precomputed::PrecomputedBackend;
use bench::prepare::{Prepared, Seeds, Source};
use bench::workload;
use shards::{Cache, CacheConfig, Capacity, FilterKind, HitKind, Metric, PolicyConfig};
use std::path::Path;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let fc: usize = args[1].parse().unwrap();
    let seed: u64 = args[2].parse().unwrap();
    let skews: Vec<f64> = args[3].split(',').map(|s| s.parse().unwrap()).collect();
    let pools: Vec<f64> = args[4].split(',').map(|s| s.parse().unwrap()).collect();
    let seeds = Seeds::from_base(seed);
    let all = Source::Glove.load(Path::new("data"), 0).unwrap();
    let mut prep = Prepared::new(
        "glove".into(),
        &all,
        Metric::L2Sq,
        10,
        Seeds::from_base(args.get(6).map_or(42, |s| s.parse().unwrap())),
        Path::new("data/cache"),
        &|_| {},
    )
    .unwrap();
    if args.get(5).map(|s| s.as_str()) == Some("collection") {
        let (_, bases) = bench::data::split_queries(&all, 1000, Seeds::from_base(42).split);
        prep.groups = workload::Groups::build(&bases, &prep.base, 50, Seeds::from_base(42).groups);
        prep.member_truth = bench::groundtruth::exact_top_n_cached(
            &prep.base,
            &prep.groups.members,
            Metric::L2Sq,
            10,
            Path::new("data/cache"),
            &|_| {},
        )
        .unwrap()
        .lists;
        println!("partners from the collection");
    }
    let be = PrecomputedBackend::new(
        50,
        Metric::L2Sq,
        prep.base.n,
        &prep.groups.members,
        prep.member_truth.clone(),
    );
    for &skew in &skews {
        let w = workload::sim_zipf(&prep.groups, 100_000, skew, seeds.stream);
        let truth = prep.truth_ids(&w, 10);
        for &pool in &pools {
            let cfg = CacheConfig {
                delta: 0,
                capacity: Capacity::Objects((pool * prep.base.n as f64).round() as usize),
                filter: FilterKind::BruteForce,
                k_max: 100,
                store_vectors: false,
                filter_candidates: fc,
                ..CacheConfig::new(50, Metric::L2Sq)
            };
            let mut c = Cache::new(cfg, PolicyConfig::default().build()).unwrap();
            let (mut rs, mut hits) = (0.0, 0u64);
            for &r in &w.requests {
                let o = c.search(&be, w.vector(r), 10).unwrap();
                rs += recall_at(o.results.iter().map(|n| n.id), &truth[r as usize]);
                if o.kind != HitKind::Miss {
                    hits += 1;
                }
            }
            println!(
                "fc {fc} seed {seed} skew {skew} pool {pool}: recall {:.3} hits {:.1}%",
                rs / 1e5,
                hits as f64 / 1e3
            );
        }
    }
}
