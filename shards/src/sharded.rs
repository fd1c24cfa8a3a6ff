//! Many shards behind one call, single-threaded: the shape the daemon has across its
//! cores, for the experiment runner and tests. A request routes to the shards of its
//! two nearest centroids, probes both (exact tables, then filters, nearest shard
//! first), and a miss is admitted by the nearest one. Inserts are logged by every
//! shard, with the fast path on the two nearest; deletes reach every shard.

use std::sync::Arc;

use crate::backend::Backend;
use crate::budget::GlobalBudget;
use crate::cache::{Cache, CacheStats, DeleteOutcome, SearchOutcome};
use crate::config::{CacheConfig, Capacity};
use crate::error::Result;
use crate::exact_table::QueryKey;
use crate::filter::InsertSeeds;
use crate::policy::PolicyConfig;
use crate::read::{Lookup, MissTicket};
use crate::router::{Retirements, Router};

#[derive(Clone, Debug)]
pub struct ShardingConfig {
    pub shards: usize,
    pub centroids: usize,
    /// Searches between two rebalances of centroid assignment and pool shares.
    pub rebalance_every: u64,
    pub seed: u64,
}

impl Default for ShardingConfig {
    fn default() -> Self {
        ShardingConfig {
            shards: 4,
            centroids: 64,
            rebalance_every: 2_000,
            seed: 0x5eed,
        }
    }
}

pub struct ShardedCache {
    router: Router,
    shards: Vec<Cache>,
    budget: Arc<GlobalBudget>,
    every: u64,
    since_rebalance: u64,
    /// Moved centroids' old shards, probed until their entries age out.
    retirements: Retirements,
}

impl ShardedCache {
    /// `sample`: row-major vectors of the collection to train the centroids on.
    pub fn new(
        cfg: CacheConfig,
        policy: &PolicyConfig,
        sharding: &ShardingConfig,
        sample: &[f32],
    ) -> Result<Self> {
        cfg.validate()?;
        let router = Router::train(
            sample,
            cfg.dim,
            cfg.metric,
            sharding.centroids,
            sharding.shards,
            sharding.seed,
        )?;
        let total = match cfg.capacity {
            Capacity::Objects(n) | Capacity::Bytes(n) => n,
        };
        let budget = Arc::new(GlobalBudget::new(total, sharding.shards));
        let shards = (0..sharding.shards)
            .map(|s| Cache::with_budget(cfg.clone(), policy.build(), budget.clone(), s))
            .collect::<Result<Vec<_>>>()?;
        Ok(ShardedCache {
            router,
            shards,
            budget,
            every: sharding.rebalance_every.max(1),
            since_rebalance: 0,
            retirements: Retirements::default(),
        })
    }

    pub fn shards(&self) -> &[Cache] {
        &self.shards
    }

    pub fn router(&self) -> &Router {
        &self.router
    }

    pub fn budget(&self) -> &GlobalBudget {
        &self.budget
    }

    pub fn search(&mut self, backend: &dyn Backend, q: &[f32], k: usize) -> Result<SearchOutcome> {
        self.shards[0].read.validate_request(q, k)?;
        let probes = self.router.route_probes(q);
        let (s1, probe) = (probes.first(), probes.as_slice());
        let key = QueryKey::new(q, k);
        self.shards[s1].read.counters.lookups.bump();
        let mut found = None;
        for &s in probe {
            if let Some(l) = self.shards[s].read.probe_exact(q, k, key) {
                found = Some((s, l));
                break;
            }
        }
        // What the nearest shard's filter search finds for admitting q, should it miss.
        let mut seeds = InsertSeeds::default();
        if found.is_none() {
            for &s in probe {
                let for_admission = (s == s1).then_some(&mut seeds);
                let read = &self.shards[s].read;
                if let Some(l) = read.probe_filter_seeded(q, k, key, for_admission) {
                    found = Some((s, l));
                    break;
                }
            }
        }
        let (s, lookup) = match found {
            Some(x) => x,
            None => {
                let read = &self.shards[s1].read;
                read.counters.misses.bump();
                let ticket = read.ticket(q, k, key, None, false);
                (s1, Lookup::Miss(MissTicket { seeds, ..ticket }))
            }
        };
        let shard = &mut self.shards[s];
        let out = shard.complete(backend, lookup)?;
        shard.run_slow_path();
        self.since_rebalance += 1;
        if self.since_rebalance >= self.every {
            self.since_rebalance = 0;
            let moves = self.router.rebalance();
            let shards = &self.shards;
            let evictions = |s: usize| shards[s].read.counters.evictions.get();
            self.retirements
                .moved(&moves, evictions, |s| shards[s].len() as u64);
            self.retirements.retire(&self.router, evictions);
            self.budget.rebalance();
        }
        Ok(out)
    }

    pub fn insert(&mut self, id: u64, v: &[f32]) -> Result<()> {
        let v: Arc<[f32]> = Arc::from(v);
        let near = self.router.route_write(&v);
        for (s, shard) in self.shards.iter_mut().enumerate() {
            shard.insert_with(id, v.clone(), near.contains(&s))?;
        }
        Ok(())
    }

    pub fn delete(&mut self, id: u64) -> DeleteOutcome {
        let mut out = DeleteOutcome::default();
        for shard in &mut self.shards {
            let d = shard.delete(id);
            out.cached |= d.cached;
            out.repaired += d.repaired;
            out.invalidated += d.invalidated;
        }
        out
    }

    /// Counters and sizes summed over shards (filter rotations included).
    pub fn stats(&self) -> CacheStats {
        let mut t = CacheStats::default();
        for s in &self.shards {
            t.accumulate(&s.stats());
        }
        t
    }

    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        for (i, s) in self.shards.iter().enumerate() {
            s.check_invariants()
                .map_err(|e| format!("shard {i}: {e}"))?;
        }
        let used: usize = self.shards.iter().map(|s| s.objects()).sum();
        if matches!(self.shards[0].config().capacity, Capacity::Objects(_))
            && used > self.budget.total()
        {
            return Err(format!(
                "{used} objects over the global budget {}",
                self.budget.total()
            ));
        }
        Ok(())
    }
}
