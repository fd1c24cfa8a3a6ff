//! Many shards behind one call, single-threaded: the shape the daemon has across its
//! cores, for the experiment runner and tests. A request routes to the shards of its
//! two nearest centroids, probes both (exact tables, then filters, nearest shard
//! first), and a miss is admitted by the nearest one. Inserts are logged by every
//! shard, with the fast path on the two nearest; deletes reach every shard.
//!
//! The three steps akerd shares with [`ShardedCache`] live here once: building the
//! shards ([`ShardSet::build`]), the lookup across them ([`lookup_across`]) and a
//! rebalance ([`rebalance`]). akerd runs them on its executors and owner tasks;
//! `ShardedCache` runs them in one thread.
//!
//! ```text
//!  q ─► Router::route_probes ─► [s1, s2, (shards a rebalance moved them from)]
//!        exact table of each, in order ─► hit?
//!        filter of each, in order ─────► hit?   (s1's search leaves admission seeds)
//!        miss: ticket from s1 ─► backend ─► s1 admits
//! ```

use std::sync::Arc;

use crate::backend::Backend;
use crate::budget::GlobalBudget;
use crate::cache::{Cache, CacheStats, DeleteOutcome, SearchOutcome};
use crate::config::{CacheConfig, Capacity};
use crate::error::Result;
use crate::exact_table::QueryKey;
use crate::filter::InsertSeeds;
use crate::policy::{HitPolicy, PolicyConfig};
use crate::read::{CacheReader, Lookup, MissTicket};
use crate::router::{Probes, Retirements, Router};

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

/// Router, global budget and one cache per shard, built from one configuration.
pub struct ShardSet {
    pub router: Router,
    pub budget: Arc<GlobalBudget>,
    pub caches: Vec<Cache>,
}

impl ShardSet {
    /// `sample`: row-major vectors of the collection to train the centroids on;
    /// `policy`: each shard's hit policy (a fresh one per shard: thresholds are per entry,
    /// but a policy may keep state, as Potluck+'s global threshold does).
    pub fn build(
        cfg: &CacheConfig,
        policy: &dyn Fn() -> Box<dyn HitPolicy>,
        sharding: &ShardingConfig,
        sample: &[f32],
    ) -> Result<ShardSet> {
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
        let caches = (0..sharding.shards)
            .map(|s| Cache::with_budget(cfg.clone(), policy(), budget.clone(), s))
            .collect::<Result<Vec<_>>>()?;
        Ok(ShardSet {
            router,
            budget,
            caches,
        })
    }
}

/// Algorithm 1 across shards: the exact tables of `probes` in order, then their filters
/// in order; the first that serves answers. A miss is the nearest shard's, with what
/// its filter search found for admitting `q` (`MissTicket::seeds`). `q` and `k` are
/// already validated (the protocol's validation, or the caller's).
pub fn lookup_across<'a>(
    probes: &Probes,
    reader: impl Fn(usize) -> &'a CacheReader,
    q: &[f32],
    k: usize,
) -> (usize, Lookup) {
    let (s1, probe) = (probes.first(), probes.as_slice());
    let key = QueryKey::new(q);
    let nearest = reader(s1);
    nearest.counters.lookups.bump();
    let exact = probe
        .iter()
        .find_map(|&s| reader(s).probe_exact(q, k, key).map(|l| (s, l)));
    if let Some(found) = exact {
        return found;
    }
    let mut seeds = InsertSeeds::default();
    // An entry too far behind the insert log to serve, in shard `s` (its owner should
    // catch it up; the ticket carries it only when it is the nearest shard's).
    let mut behind = None;
    for &s in probe {
        let for_admission = (s == s1).then_some(&mut seeds);
        let mut behind_here = None;
        let found = reader(s).probe_filter_seeded(q, k, key, for_admission, &mut behind_here);
        let Some(l) = found else {
            match (behind, behind_here) {
                (None, Some(r)) => behind = Some((s, r)),
                // One request per ticket: the others are not sent, so asked again later.
                (Some(_), Some(r)) => reader(s).catch_up_dropped(r),
                _ => {}
            }
            continue;
        };
        if let Some((sb, r)) = behind {
            reader(sb).catch_up_dropped(r);
        }
        return (s, l);
    }
    nearest.counters.misses.bump();
    let ticket = nearest.ticket(q, k, key, None, false);
    // A ticket carries its own shard's request only (the owner it reaches).
    let catch_up = match behind {
        Some((s, r)) if s == s1 => Some(r),
        Some((s, r)) => {
            reader(s).catch_up_dropped(r);
            None
        }
        None => None,
    };
    (
        s1,
        Lookup::Miss(MissTicket {
            seeds,
            catch_up,
            ..ticket
        }),
    )
}

/// One rebalance: centroids move to the shards that balance the load (the router),
/// the shards they left stay probed until their entries age out (`retirements`), and
/// pool shares follow demand (the budget). `evictions` and `entries` read a shard's
/// eviction count and live entries. Returns the centroids moved.
pub fn rebalance(
    router: &Router,
    budget: &GlobalBudget,
    retirements: &mut Retirements,
    evictions: impl Fn(usize) -> u64,
    entries: impl Fn(usize) -> u64,
) -> usize {
    let moves = router.rebalance();
    retirements.moved(&moves, &evictions, entries);
    retirements.retire(router, &evictions);
    budget.rebalance();
    moves.len()
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
        Self::with_policies(cfg, &|| policy.build(), sharding, sample)
    }

    /// [`ShardedCache::new`] with each shard's policy made by `policy`.
    pub fn with_policies(
        cfg: CacheConfig,
        policy: &dyn Fn() -> Box<dyn HitPolicy>,
        sharding: &ShardingConfig,
        sample: &[f32],
    ) -> Result<Self> {
        let set = ShardSet::build(&cfg, policy, sharding, sample)?;
        Ok(ShardedCache {
            router: set.router,
            shards: set.caches,
            budget: set.budget,
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

    /// Every shard's threshold scale (`CacheReader::set_threshold_scale`).
    pub fn set_threshold_scale(&self, scale: f32) {
        for c in &self.shards {
            c.read.set_threshold_scale(scale);
        }
    }

    pub fn budget(&self) -> &GlobalBudget {
        &self.budget
    }

    pub fn search(&mut self, backend: &dyn Backend, q: &[f32], k: usize) -> Result<SearchOutcome> {
        self.shards[0].read.validate_request(q, k)?;
        let probes = self.router.route_probes(q);
        let shards = &self.shards;
        let (s, lookup) = lookup_across(&probes, |s| &*shards[s].read, q, k);
        let shard = &mut self.shards[s];
        let out = shard.complete(backend, lookup)?;
        shard.run_slow_path();
        self.since_rebalance += 1;
        if self.since_rebalance >= self.every {
            self.since_rebalance = 0;
            let shards = &self.shards;
            rebalance(
                &self.router,
                &self.budget,
                &mut self.retirements,
                |s| shards[s].read.counters.evictions.get(),
                |s| shards[s].len() as u64,
            );
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
