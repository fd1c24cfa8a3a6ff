//! Warm-restart images: what a shard's cache and the router hold, as plain data that
//! akerd archives (rkyv, `src/durable/snapshot.rs`) and restores at its next start.
//!
//! ```text
//!  ShardImage  = representatives in admission order, each with what its hits depend on:
//!                key, k, RQ, NRL (ids, distances, vectors when kept), τ, minD's gap,
//!                the second-chance mark, its aliases' keys
//!  RouterImage = centroids, centroid -> shard, the shards moved centroids left, pool shares
//! ```
//!
//! Rebuilt at restore rather than saved: the pool (from the lists), the query filter
//! (every representative inserted again: a graph over the same points, not the same
//! graph), the fast path's reach and the risk sums. Not kept: the insert log (a restored
//! entry's cursor is the fresh log's start, and the writes after the snapshot are replayed
//! through the refresh path instead), the counters, Potluck+'s global threshold.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::backend::Candidate;
use crate::cache::{Cache, NewEntry};
use crate::entry::Representative;
use crate::exact_table::QueryKey;
use crate::filter::InsertSeeds;

/// One representative.
#[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, Clone, Debug, PartialEq)]
pub struct EntryImage {
    /// `QueryKey` of (`query`, `k`): checked against a fresh hash at restore.
    pub key: u128,
    pub k: u32,
    pub query: Vec<f32>,
    pub ids: Vec<u64>,
    pub dists: Vec<f32>,
    /// Row-major `ids.len() x dim`; empty when the cache keeps no vectors.
    pub vectors: Vec<f32>,
    pub tau: f32,
    pub min_gap: f32,
    pub referenced: bool,
    pub aliases: Vec<u128>,
    /// `LC`, in the shard's insert log as exported ([`ShardImage::log_head`]).
    pub cursor: u64,
}

/// One insert-log record: the entries whose cursor is behind it have not scanned it yet.
#[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, Clone, Debug, PartialEq)]
pub struct LogImage {
    pub id: u64,
    /// Empty once the id was deleted (the record is kept for its place).
    pub vector: Vec<f32>,
}

/// One shard's cache.
#[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, Clone, Debug, PartialEq, Default)]
pub struct ShardImage {
    /// Oldest admission first, so restoring in order keeps the FIFO's order.
    pub entries: Vec<EntryImage>,
    /// Seq of `log[0]` in the shard's insert log as exported.
    pub log_head: u64,
    /// The insert log's records, oldest first: the work entries still owe the slow path.
    pub log: Vec<LogImage>,
}

/// The router's state and the pool shares (`GlobalBudget`).
#[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, Clone, Debug, PartialEq)]
pub struct RouterImage {
    /// Row-major, in the router's own metric (directions on `ip`).
    pub centroids: Vec<f32>,
    pub assignment: Vec<u32>,
    /// The shard each centroid left at its last move, `u32::MAX` for none.
    pub previous: Vec<u32>,
    pub shares: Vec<u64>,
}

/// What a restore did with an image.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RestoreReport {
    pub restored: usize,
    pub aliases: usize,
    /// Entries that did not validate (key, dimension, order, lengths), or whose key was
    /// already present.
    pub refused: usize,
    /// Entries that did not fit this configuration's budget.
    pub dropped: usize,
}

impl RestoreReport {
    pub fn add(&mut self, o: RestoreReport) {
        self.restored += o.restored;
        self.aliases += o.aliases;
        self.refused += o.refused;
        self.dropped += o.dropped;
    }
}

impl EntryImage {
    fn of(r: &Representative, dim: usize) -> EntryImage {
        let all_kept = r
            .nrl
            .vectors
            .iter()
            .all(|v| v.as_ref().is_some_and(|v| v.len() == dim));
        let vectors = if all_kept && !r.nrl.vectors.is_empty() {
            r.nrl
                .vectors
                .iter()
                .flatten()
                .flat_map(|v| v.iter().copied())
                .collect()
        } else {
            Vec::new()
        };
        EntryImage {
            key: r.key.0,
            k: r.k as u32,
            query: r.query.to_vec(),
            ids: r.nrl.ids.clone(),
            dists: r.nrl.dists.clone(),
            vectors,
            tau: r.state.tau.load(),
            min_gap: r.min_gap,
            referenced: r.state.referenced.load(Ordering::Relaxed),
            aliases: r.aliases.iter().map(|a| a.0).collect(),
            cursor: r.cursor,
        }
    }
}

impl Cache {
    /// This shard's image (owner side: call it between messages).
    pub fn export_image(&self) -> ShardImage {
        let dim = self.cfg.dim;
        let log = self
            .log
            .records()
            .map(|r| LogImage {
                id: r.id,
                vector: r.vector.as_deref().map(<[f32]>::to_vec).unwrap_or_default(),
            })
            .collect();
        ShardImage {
            entries: self.reps.values().map(|r| EntryImage::of(r, dim)).collect(),
            log_head: self.log.head_seq(),
            log,
        }
    }

    /// Installs an image's entries, oldest first, evicting by the configured rule when
    /// this configuration's budget is smaller than the one that took it. Entries that
    /// do not validate are counted and skipped, never trusted: the file's checksum
    /// says the bytes are the ones written, not that this build reads them the same.
    pub fn restore_image(&mut self, image: ShardImage) -> RestoreReport {
        let mut out = RestoreReport::default();
        // The log first: restored cursors point into it (mapped from the exported seqs).
        let base = self.restore_log(&image.log);
        let map = |c: u64| (c + 1).saturating_sub(image.log_head) + base;
        for mut e in image.entries {
            e.cursor = map(e.cursor);
            let aliases = e.aliases.clone();
            let Some(entry) = self.validated(e) else {
                out.refused += 1;
                continue;
            };
            let n = entry.answer.len();
            self.evict_to_budget();
            while !self.fits(n) {
                if !self.evict_one() {
                    break;
                }
            }
            if !self.fits(n) {
                out.dropped += 1;
                continue;
            }
            // The evictions trim the log: an entry whose unchecked records went with it
            // could not be caught up, nor its hits check them (a Stale admission).
            if entry.cursor + 1 < self.log.head_seq() {
                out.refused += 1;
                continue;
            }
            let id = self.install(entry, &InsertSeeds::default());
            out.restored += 1;
            for a in aliases {
                out.aliases += usize::from(self.link_alias(QueryKey(a), id));
            }
        }
        // A smaller cap than the one that took the image: entries behind it go.
        self.enforce_log_cap();
        self.trim_log();
        self.publish_seqs();
        out
    }

    /// Appends an image's insert-log records in order; returns the seq before the first.
    fn restore_log(&mut self, log: &[LogImage]) -> u64 {
        let base = self.log.last_seq();
        for r in log {
            if r.vector.len() == self.cfg.dim && r.vector.iter().all(|x| x.is_finite()) {
                self.log.append(r.id, Arc::from(&r.vector[..]));
            } else {
                self.log.append_tombstoned(r.id);
            }
        }
        base
    }

    /// An image entry as one `install` takes, or `None` when it is not one this cache
    /// could have made (a list longer than this Δ is cut to `k + Δ`).
    fn validated(&self, e: EntryImage) -> Option<NewEntry> {
        let (dim, k) = (self.cfg.dim, e.k as usize);
        let finite = |x: &[f32]| x.iter().all(|v| v.is_finite());
        let shape_ok = e.query.len() == dim
            && (1..=self.cfg.k_max).contains(&k)
            && e.ids.len() == e.dists.len()
            && e.ids.len() >= k
            && (e.vectors.is_empty() || e.vectors.len() == e.ids.len() * dim)
            && finite(&e.query)
            && finite(&e.dists)
            && finite(&e.vectors)
            && e.tau.is_finite()
            && e.tau >= 0.0
            && e.min_gap.is_finite();
        if !shape_ok || QueryKey::new(&e.query).0 != e.key {
            return None;
        }
        let key = QueryKey(e.key);
        if self.read.table.pin().get(&key).is_some() {
            return None;
        }
        let sorted = e
            .dists
            .windows(2)
            .zip(e.ids.windows(2))
            .all(|(d, i)| d[0].total_cmp(&d[1]).then(i[0].cmp(&i[1])).is_lt());
        let mut ids = e.ids.clone();
        ids.sort_unstable();
        ids.dedup();
        if !sorted || ids.len() != e.ids.len() {
            return None;
        }
        let mut answer: Vec<Candidate> = e
            .ids
            .iter()
            .zip(&e.dists)
            .enumerate()
            .map(|(i, (&id, &distance))| Candidate {
                id,
                distance,
                vector: (!e.vectors.is_empty())
                    .then(|| Arc::from(&e.vectors[i * dim..(i + 1) * dim])),
            })
            .collect();
        answer.truncate(self.answer_len(k));
        Some(NewEntry {
            key,
            k,
            query: Arc::from(e.query),
            answer,
            tau: e.tau,
            min_gap: e.min_gap,
            // Within the restored log (`restore_image` refuses one behind its head).
            cursor: e.cursor.min(self.log.last_seq()),
            referenced: e.referenced,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{CacheConfig, Capacity};
    use crate::policy::PolicyConfig;
    use crate::store::ExactStore;
    use crate::{Backend, HitKind};

    fn setup() -> (Cache, ExactStore, Vec<Vec<f32>>) {
        let dim = 4;
        let data: Vec<f32> = (0..400).map(|i| ((i * 37 % 101) as f32) / 10.0).collect();
        let store = ExactStore::from_rows(dim, crate::Metric::L2Sq, &data).unwrap();
        let cfg = CacheConfig {
            dim,
            k_max: 10,
            delta: 2,
            capacity: Capacity::Objects(10_000),
            ..CacheConfig::default()
        };
        let cache = Cache::new(cfg, PolicyConfig::default().build()).unwrap();
        let queries = (0..30)
            .map(|i| (0..dim).map(|j| ((i * 7 + j * 3) % 11) as f32).collect())
            .collect();
        (cache, store, queries)
    }

    #[test]
    fn a_restored_cache_answers_its_cached_queries_as_the_original_did() {
        let (mut a, store, queries) = setup();
        for q in &queries {
            a.search(&store, q, 5).unwrap();
        }
        let image = a.export_image();
        assert_eq!(image.entries.len(), a.len());
        let (mut b, _, _) = setup();
        let r = b.restore_image(image.clone());
        assert_eq!((r.restored, r.refused, r.dropped), (a.len(), 0, 0));
        b.check_invariants().unwrap();
        // The image of the restored cache is the same image (before hits move τ).
        assert_eq!(b.export_image(), image);
        for q in &queries {
            let (x, y) = (a.lookup(q, 5).unwrap(), b.lookup(q, 5).unwrap());
            let (crate::Lookup::Hit(x), crate::Lookup::Hit(y)) = (x, y) else {
                panic!("a cached query missed");
            };
            assert_eq!((x.kind, &x.results), (y.kind, &y.results));
            assert!(matches!(x.kind, HitKind::Exact | HitKind::Alias));
        }
        assert!(a.aliases() > 0 && b.aliases() == a.aliases());
    }

    #[test]
    fn the_slow_path_work_entries_owe_is_restored_with_them() {
        let (mut a, store, queries) = setup();
        for q in &queries {
            a.search(&store, q, 5).unwrap();
        }
        // Vectors at cached queries, logged without the fast path: every entry owes the
        // slow path a scan of them; one of them is deleted again (a tombstoned record).
        for (i, q) in queries.iter().take(6).enumerate() {
            a.insert_log_only(9_000 + i as u64, Arc::from(&q[..]))
                .unwrap();
        }
        a.delete(9_005);
        let image = a.export_image();
        assert_eq!(image.log.len(), 6);
        assert!(
            image.log[5].vector.is_empty(),
            "the deleted id's record is kept empty"
        );
        let (mut b, _, _) = setup();
        b.restore_image(image.clone());
        b.check_invariants().unwrap();
        assert_eq!(
            b.export_image(),
            image,
            "entries, cursors and log as exported"
        );
        // Both scan the log to its end: the same lists, the inserted ids merged.
        for c in [&mut a, &mut b] {
            for _ in 0..10_000 {
                if !c.slow_path_step() {
                    break;
                }
            }
        }
        assert_eq!(a.export_image(), b.export_image());
        let merged = b
            .representatives()
            .filter(|r| r.nrl.ids.contains(&9_000))
            .count();
        assert!(merged > 0, "the slow path merged a restored record");
        assert!(b.representatives().all(|r| !r.nrl.ids.contains(&9_005)));
    }

    #[test]
    fn a_router_image_routes_as_the_router_did() {
        let data: Vec<f32> = (0..800).map(|i| ((i * 13 % 97) as f32) / 7.0).collect();
        let r =
            crate::router::Router::train(&data, 4, crate::Metric::InnerProduct, 8, 3, 1).unwrap();
        let img = r.image(vec![1, 2, 3]);
        let back =
            crate::router::Router::from_image(&img, 4, crate::Metric::InnerProduct, 3).unwrap();
        for q in data.chunks_exact(4) {
            assert_eq!(r.route_write(q), back.route_write(q));
        }
        assert!(
            crate::router::Router::from_image(&img, 4, crate::Metric::InnerProduct, 2).is_err()
        );
    }

    #[test]
    fn bad_entries_are_refused_and_a_smaller_budget_drops_the_oldest() {
        let (mut a, store, queries) = setup();
        for q in &queries {
            a.search(&store, q, 5).unwrap();
        }
        let mut image = a.export_image();
        let n = image.entries.len();
        image.entries[0].key ^= 1; // not the hash of its query
        image.entries[1].dists.reverse(); // not ascending
        image.entries[2].query.push(0.0); // wrong dimension
        image.entries[3].dists[0] = f32::NAN;
        let (mut b, _, _) = setup();
        let r = b.restore_image(image.clone());
        assert_eq!((r.restored, r.refused), (n - 4, 4));
        b.check_invariants().unwrap();

        let (small, _, _) = setup();
        let cfg = CacheConfig {
            capacity: Capacity::Objects(20),
            ..small.config().clone()
        };
        let mut c = Cache::new(cfg, PolicyConfig::default().build()).unwrap();
        let r = c.restore_image(a.export_image());
        assert!(c.objects() <= 20 && r.restored > 0, "{r:?}");
        c.check_invariants().unwrap();
        // A restored cache takes writes: a delete of a listed id repairs or invalidates.
        let id = c.representatives().next().unwrap().nrl.ids[0];
        c.delete(id);
        c.check_invariants().unwrap();
        assert!(c.representatives().all(|r| !r.nrl.ids.contains(&id)));
        assert!(store.len() > 0);
    }
}
