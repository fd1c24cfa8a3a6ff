//! The engine's hash maps: foldhash instead of std's SipHash.
//!
//! Why: every lookup probes two maps (exact table, representative views) and every
//! admission, delete and eviction makes a dozen probes of the object pool; SipHash was a
//! measurable part of those (the pool's `acquire` / `release` were ~9% each of a
//! delete-heavy profile). foldhash is seeded per process, so keys chosen by clients
//! (result ids, query vectors) cannot be aimed at one bucket without seeing the seed.

/// Hasher state for every map of the engine.
pub(crate) type RandomState = foldhash::fast::RandomState;
pub(crate) type HashMap<K, V> = std::collections::HashMap<K, V, RandomState>;
pub(crate) type HashSet<K> = std::collections::HashSet<K, RandomState>;
/// The lock-free maps readers probe.
pub(crate) type SharedMap<K, V> = papaya::HashMap<K, V, RandomState>;
