//! The Aker cache engine: an approximate result cache for nearest-neighbour search
//! (Aker, PVLDB 2026; `docs/ALGORITHM.md` pins down the algorithm). No network I/O.
//!
//! | mechanism (ALGORITHM.md)                         | where                       |
//! |--------------------------------------------------|-----------------------------|
//! | distances (squared L2, 1 - cos, -dot)            | `metric`, `kernels`         |
//! | the thresholds' unit (angular on ip)             | [`gap`]                     |
//! | 128-bit query keys, representative ids           | `keys`                      |
//! | exact table slots, representatives and aliases   | [`exact_table`], [`entry`]  |
//! | lookup (lock-free read side)                     | [`read`]                    |
//! | admission, FIFO eviction, deletes (owner)        | `cache`                     |
//! | epoch-published values (seize)                   | `epoch`                     |
//! | neighbour objects with reference counts          | `pool`                      |
//! | dual query filter, rotation keeps survivors      | [`filter`]                  |
//! | the filter's lock-free HNSW graph (int8 codes)   | [`filter::GraphIndex`]      |
//! | insert log, delete log (in-flight misses)        | `insert_log`                |
//! | fast path, slow path, risk                       | `refresh`                   |
//! | recent inserts that hits check                   | `recent`                    |
//! | hit policies: Aker, Proximity+, Potluck+         | `policy`                    |
//! | backends: trait, exact and HNSW stores           | [`backend`], [`store`]      |
//! | routing by centroid, load-based assignment       | [`router`]                  |
//! | global pool budget, shares follow admissions     | [`budget`]                  |
//! | owner messages (bounded channel, hints dropped)  | [`owner`]                   |
//! | lookup across shards, one constructor, rebalance | [`sharded`]                 |
//! | warm-restart images of shards and the router     | [`snapshot`]                |
//! | the maps' hasher (foldhash)                      | `hash`                      |
// Every unsafe block says why it is sound, and an unsafe fn's body is not one implicit
// unsafe block (CI runs clippy with these as errors).
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]
// Items inside private modules are `pub(crate)` unless re-exported (CI denies warnings).
#![warn(unreachable_pub)]

pub mod backend;
pub mod budget;
mod cache;
pub mod config;
pub mod counter;
pub mod entry;
pub mod epoch;
pub mod error;
pub mod exact_table;
pub mod filter;
pub mod floor;
pub mod gap;
mod hash;
mod insert_log;
mod kernels;
mod keys;
mod metric;
pub mod owner;
mod policy;
mod pool;
mod reach;
pub mod read;
mod recent;
mod refresh;
pub mod router;
pub mod sharded;
pub mod snapshot;
pub mod store;

pub use backend::{Backend, Candidate};
pub use cache::{Admission, Cache, CacheStats, DeleteOutcome, SearchOutcome};
pub use config::{CacheConfig, Capacity, Eviction, FilterKind, StandbySearch};
pub use error::{Error, Result};
pub use metric::Metric;
pub use policy::{HitPolicy, PolicyConfig};
pub use read::{CacheReader, Hit, HitKind, Lookup, MissTicket, Neighbor};
pub use refresh::InsertOutcome;

#[cfg(test)]
mod send_sync {
    fn send<T: Send>() {}
    fn sync<T: Send + Sync>() {}
    #[test]
    fn owner_moves_across_threads_and_readers_are_shared() {
        send::<crate::Cache>();
        sync::<crate::CacheReader>();
        sync::<crate::owner::ShardHandle>();
        sync::<crate::router::Router>();
        send::<crate::store::HnswStore>();
    }
}
