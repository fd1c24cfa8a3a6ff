//! Many shards behind one call: routing, probing two shards, fan-out of writes, and
//! the global budget whose shares follow admissions.

use rand::{Rng, SeedableRng};
use shards::sharded::{ShardedCache, ShardingConfig};
use shards::store::ExactStore;
use shards::{Backend, CacheConfig, Capacity, FilterKind, HitKind, Metric, PolicyConfig};

const DIM: usize = 4;

fn clustered(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n)
        .flat_map(|i| {
            let c = (i % 8) as f32 * 10.0;
            (0..DIM)
                .map(|_| c + rng.gen_range(-1.0f32..1.0))
                .collect::<Vec<_>>()
        })
        .collect()
}

fn setup(capacity: usize) -> (ShardedCache, ExactStore, Vec<f32>) {
    let data = clustered(4000, 1);
    let db = ExactStore::from_rows(DIM, Metric::L2Sq, &data).unwrap();
    let cfg = CacheConfig {
        delta: 2,
        k_max: 10,
        capacity: Capacity::Objects(capacity),
        filter: FilterKind::BruteForce,
        ..CacheConfig::new(DIM, Metric::L2Sq)
    };
    let sharding = ShardingConfig {
        shards: 4,
        centroids: 16,
        rebalance_every: 200,
        seed: 2,
    };
    let cache = ShardedCache::new(
        cfg,
        &PolicyConfig::default(),
        &sharding,
        &data[..2000 * DIM],
    )
    .unwrap();
    (cache, db, data)
}

#[test]
fn hits_deletes_and_inserts_across_shards() {
    let (mut c, mut db, data) = setup(10_000);
    let q: Vec<f32> = data[..DIM].iter().map(|x| x + 0.01).collect();
    assert_eq!(c.search(&db, &q, 5).unwrap().kind, HitKind::Miss);
    let hit = c.search(&db, &q, 5).unwrap();
    assert_eq!(hit.kind, HitKind::Exact);
    let near: Vec<f32> = q.iter().map(|x| x + 1e-4).collect();
    assert_eq!(c.search(&db, &near, 5).unwrap().kind, HitKind::Approximate);
    // a delete reaches whichever shard cached the id
    let victim = hit.results[0].id;
    db.delete(victim).unwrap();
    let d = c.delete(victim);
    assert!(d.cached && d.repaired >= 1);
    let again = c.search(&db, &q, 5).unwrap();
    assert!(again.results.iter().all(|n| n.id != victim));
    // an insert right at the query enters its list through the fast path
    db.insert(99_999, &q).unwrap();
    c.insert(99_999, &q).unwrap();
    let r = c.search(&db, &q, 5).unwrap();
    assert_eq!((r.kind, r.results[0].id), (HitKind::Exact, 99_999));
    c.check_invariants().unwrap();
}

#[test]
fn the_global_budget_holds_and_shares_follow_admissions() {
    let (mut c, db, data) = setup(600);
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    // skewed traffic: most queries near cluster 0
    for i in 0..3000 {
        let row = if rng.gen_bool(0.8) {
            8 * rng.gen_range(0..100)
        } else {
            rng.gen_range(0..4000)
        };
        let q: Vec<f32> = data[row * DIM..(row + 1) * DIM]
            .iter()
            .map(|x| x + rng.gen_range(-0.3f32..0.3))
            .collect();
        c.search(&db, &q, 5).unwrap();
        if i % 500 == 0 {
            c.check_invariants().unwrap();
        }
    }
    c.check_invariants().unwrap();
    let objects: usize = c.shards().iter().map(|s| s.objects()).sum();
    assert!(objects <= 600);
    let shares: Vec<usize> = (0..4).map(|s| c.budget().share(s)).collect();
    assert!(
        shares.iter().max() > shares.iter().min(),
        "shares moved with skew: {shares:?}"
    );
    assert!(c.router().rebalances() > 0);
    let st = c.stats();
    assert!(
        st.exact_hits + st.approximate_hits + st.alias_hits > 0 && st.evictions > 0,
        "{st:?}"
    );
}
