//! A shard's owner: a local task on its executor that applies the shard's messages in
//! order (the single writer of that `Cache`), and publishes the few sizes that only the
//! owner can see (pool objects and bytes, log length, filter generations) as gauges for
//! STATS and /metrics.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use shards::owner::OwnerMsg;
use shards::Cache;

/// Messages applied before the owner publishes gauges and offers to yield.
const BATCH: usize = 64;
/// Full stats (filter generations) are published at least every this many batches.
const FULL_STATS_EVERY: u64 = 32;
/// Filter survivors migrated per idle step (~20 µs each at d = 768), between checks for
/// messages.
const IDLE_MIGRATIONS: usize = 8;

/// Sizes the owner publishes (relaxed: they are gauges, nothing is ordered by them).
#[derive(Debug, Default)]
pub(crate) struct ShardGauges {
    pub objects: AtomicU64,
    pub bytes: AtomicU64,
    pub representatives: AtomicU64,
    pub aliases: AtomicU64,
    pub insert_log_len: AtomicU64,
    /// `f64` bits of the risk `R`.
    pub risk_bits: AtomicU64,
    pub filter_live: AtomicU64,
    pub filter_tombstones: AtomicU64,
    pub filter_rotations: AtomicU64,
    pub filter_standby_live: AtomicU64,
    pub filter_standby_moved: AtomicU64,
    pub messages: AtomicU64,
}

impl ShardGauges {
    fn publish(&self, c: &Cache, full: bool) {
        let set = |a: &AtomicU64, v: u64| a.store(v, Ordering::Relaxed);
        set(&self.objects, c.objects() as u64);
        set(&self.bytes, c.bytes() as u64);
        set(&self.representatives, c.len() as u64);
        set(&self.aliases, c.aliases() as u64);
        set(&self.insert_log_len, c.insert_log_len() as u64);
        set(&self.risk_bits, c.risk().to_bits());
        if full {
            // `stats()` sums every striped counter too: not for every batch.
            let f = c.stats().filter;
            set(&self.filter_live, f.live as u64);
            set(&self.filter_tombstones, f.tombstones as u64);
            set(&self.filter_rotations, f.rotations);
            set(&self.filter_standby_live, f.standby_live as u64);
            set(&self.filter_standby_moved, f.standby_moved);
        }
    }

    pub(crate) fn get(a: &AtomicU64) -> u64 {
        a.load(Ordering::Relaxed)
    }

    pub(crate) fn risk(&self) -> f64 {
        f64::from_bits(self.risk_bits.load(Ordering::Relaxed))
    }
}

/// The owner loop: until every sender is gone or the executor stops. Never holds
/// anything across an await but the cache itself, which no other task touches.
pub(crate) async fn run(mut cache: Cache, rx: flume::Receiver<OwnerMsg>, gauges: Arc<ShardGauges>) {
    gauges.publish(&cache, true);
    let mut until_full = FULL_STATS_EVERY;
    loop {
        // Idle: the filter's migrations (survivors of a dropped generation, then the
        // standby's entries: `shards::filter`) in short steps, messages first.
        let mut moved = 0;
        while rx.is_empty() {
            let m = cache.maintain(IDLE_MIGRATIONS);
            if m == 0 {
                break;
            }
            moved += m;
            glommio::yield_if_needed().await;
        }
        if moved > 0 {
            gauges.publish(&cache, true);
        }
        let Ok(msg) = rx.recv_async().await else {
            break;
        };
        cache.apply(msg);
        let mut n = 1;
        // Drain what is already queued without a wake-up per message.
        while n < BATCH {
            match rx.try_recv() {
                Ok(msg) => {
                    cache.apply(msg);
                    n += 1;
                }
                Err(_) => break,
            }
        }
        until_full -= 1;
        let full = rx.is_empty() || until_full == 0;
        if full {
            until_full = FULL_STATS_EVERY;
        }
        gauges.messages.fetch_add(n as u64, Ordering::Relaxed);
        gauges.publish(&cache, full);
        // A long backlog must not starve this executor's connections.
        glommio::yield_if_needed().await;
    }
}
