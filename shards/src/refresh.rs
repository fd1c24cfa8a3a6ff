//! Inserts and lazy refresh (§4.6, Algorithm 2): the insert log, the fast path, the
//! slow path and the risk `R` that decides when the slow path runs; the catch-up a hit
//! asks for.
//!
//! ```text
//!  insert(id, v) ─► log.append (and the readers' window, recent.rs) ─► length cap
//!                   (entries left behind: invalidated)
//!               ─► fast path: the nearest representative the filter finds, with
//!                  d(v, RQ) < maxD ⇒ sorted insert
//!               ─► slow path while R ≥ τ_risk (bounded steps)
//!  every other entry that takes v: its hits add v themselves until LC passes it
//!  slow path step: next representative round-robin with unchecked records;
//!                  scan B records from LC, sorted-merge those with d < maxD, advance LC
//!  catch-up (a hit found the entry behind): the same scan, up to the last record
//!  R = mean(r) · U / W,  r = d_k / d_(k+Δ),  U = mean unchecked records,
//!  W = records since the oldest cursor
//! ```

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::cache::{Cache, Removal};
use crate::entry::{RepId, RISK_SCALE};
use crate::error::{validate_vector, Result};

/// Most vector components one catch-up reads (records × dimension): ~1-2 ms of the
/// owner's time, while its other messages wait. An entry further behind is caught up
/// over several requests, or by the slow path.
const CATCH_UP_COMPONENTS_MAX: u64 = 1 << 24;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InsertOutcome {
    pub seq: u64,
    /// The fast path put the vector into a list (its nearest representative's).
    pub fast_path: bool,
    pub slow_path_steps: usize,
    /// The id was cached or logged before: treated as delete + insert.
    pub replaced: bool,
}

impl Cache {
    /// INSERT: call after the backend has applied the insert.
    pub fn insert(&mut self, id: u64, v: &[f32]) -> Result<InsertOutcome> {
        self.insert_with(id, Arc::from(v), true)
    }

    /// INSERT as a shard of many sees it: every shard logs every insert (so its hits and
    /// its slow path can reach all of its entries), only the shards nearest the vector
    /// run the fast path (`fast_path`). The vector is shared, so a shard's log costs a
    /// record, not a copy.
    pub fn insert_with(
        &mut self,
        id: u64,
        v: Arc<[f32]>,
        fast_path: bool,
    ) -> Result<InsertOutcome> {
        let mut out = self.insert_logged(id, v, fast_path)?;
        out.slow_path_steps = self.run_slow_path();
        self.trim_log();
        Ok(out)
    }

    /// The insert without the slow-path steps that follow it (`insert_with` runs them):
    /// log append, length cap, fast path (`fast_path` as in `insert_with`).
    pub fn insert_logged(
        &mut self,
        id: u64,
        v: Arc<[f32]>,
        fast_path: bool,
    ) -> Result<InsertOutcome> {
        self.insert_logged_as(id, v, Some(fast_path))
    }

    /// Tests and tools: an insert logged without any fast path (no slow-path steps
    /// either), so that every entry owes the slow path its record.
    pub fn insert_log_only(&mut self, id: u64, v: Arc<[f32]>) -> Result<InsertOutcome> {
        self.insert_logged_as(id, v, None)
    }

    /// `fast_path`: `Some(routed here)`, or `None` for none at all.
    fn insert_logged_as(
        &mut self,
        id: u64,
        v: Arc<[f32]>,
        fast_path: Option<bool>,
    ) -> Result<InsertOutcome> {
        validate_vector(&v, self.cfg.dim)?;
        self.read.counters.inserts.bump();
        let mut out = InsertOutcome::default();
        // An upsert: cached distances to the old vector are wrong now.
        if self.pool.contains(id) || self.log.contains_id(id) {
            self.delete(id);
            out.replaced = true;
        }
        if !self.cfg.refresh {
            // The no-refresh ablation: entries never learn of inserts (no record, so
            // no risk and no slow path either).
            return Ok(out);
        }
        out.seq = self.log.append(id, v.clone());
        self.enforce_log_cap();
        self.publish_seqs();
        out.fast_path = fast_path.is_some_and(|here| self.fast_path(id, &v, here));
        Ok(out)
    }

    /// Entries whose cursor fell behind the cap (records or bytes) are invalidated; the
    /// head moves up.
    pub(crate) fn enforce_log_cap(&mut self) {
        let cap = self.cfg.insert_log_records_max() as u64;
        if (self.log.len() as u64) <= cap {
            return;
        }
        let new_head = self.log.last_seq() + 1 - cap;
        while let Some(&(cursor, rid)) = self.cursors.first() {
            if cursor + 1 >= new_head {
                break;
            }
            self.remove_rep(rid, Removal::LogCap);
        }
        self.log.trim_to(new_head - 1);
    }

    fn fast_path(&mut self, id: u64, v: &Arc<[f32]>, routed_here: bool) -> bool {
        routed_here && self.nearest_fast_path(id, v)
    }

    /// The nearest representative to `v` takes it if it is closer than its `maxD`.
    /// (Distances and `maxD`s here are the filter's: `Gauge::filter_max_d`.) The
    /// filter's search is approximate: an entry it does not find, and every
    /// near-duplicate of the one it finds, get it from their hits' own check of recent
    /// inserts until a catch-up or the slow path merges it (issue #41: `recent.rs`).
    fn nearest_fast_path(&mut self, id: u64, v: &Arc<[f32]>) -> bool {
        let max_d = &self.max_d_by_rep;
        let takes = |r: RepId, d: f32| max_d.get(&r).is_some_and(|&m| d < m);
        // No list ends farther than `reach`: nothing beyond it can take the vector.
        let Some(reach) = self.max_ds.max() else {
            return false;
        };
        let Some((rid, df)) = self.filter.nearest_taker(v, reach, &takes) else {
            return false;
        };
        if df >= self.max_d_by_rep[&rid] {
            return false;
        }
        // The list keeps the metric's own distance, which the filter's is not on `ip`
        // (there the exact test is repeated: the two agree but for rounding).
        let angular = self.gauge().angular();
        let d = if angular {
            self.cfg.metric.distance(v, &self.reps[&rid].query)
        } else {
            df
        };
        if (!angular || d < self.reps[&rid].max_d()) && self.merge(rid, id, d, v) {
            self.read.counters.fast_path_updates.bump();
            return true;
        }
        false
    }

    /// Sorted insert of `(id, d)` into `rid`'s list, dropping what falls past `k + Δ`.
    fn merge(&mut self, rid: RepId, id: u64, d: f32, v: &Arc<[f32]>) -> bool {
        let rep = &self.reps[&rid];
        if rep.nrl.position(id).is_some() {
            return false;
        }
        let cap = self.answer_len(rep.k);
        let mut nrl = (*rep.nrl).clone();
        let vector = self.cfg.store_vectors.then(|| v.clone());
        let at = nrl.insert_sorted(id, d, vector.clone());
        if at >= cap {
            return false;
        }
        self.pool.acquire(id, rid, vector, None);
        while nrl.len() > cap {
            let dropped = nrl.remove_at(nrl.len() - 1);
            self.pool.release(dropped, rid);
        }
        self.set_nrl(rid, nrl, Some((d, &**v)));
        // A merged id can be a new object: make room the way admission does (`Eviction`).
        self.evict_to_budget();
        true
    }

    /// `R = mean(r) · U / W` (0 with no entries or an empty log).
    pub fn risk(&self) -> f64 {
        let n = self.reps.len() as f64;
        let w = self.log_span() as f64;
        if n == 0.0 || w == 0.0 {
            return 0.0;
        }
        let unchecked =
            (self.reps.len() as u128 * self.log.last_seq() as u128 - self.risk.sum_cursor) as f64;
        (self.risk.sum_r as f64 / RISK_SCALE) * unchecked / (n * n * w)
    }

    /// Runs slow-path steps while `R ≥ τ_risk`, at most `slow_path_max_steps`.
    pub fn run_slow_path(&mut self) -> usize {
        let mut steps = 0;
        while steps < self.cfg.slow_path_max_steps && self.risk() >= self.cfg.risk_threshold {
            if !self.slow_path_step() {
                break;
            }
            steps += 1;
        }
        steps
    }

    /// One step: the next representative (round-robin by id) with unchecked records
    /// scans up to `B` of them. False when no representative lags.
    pub fn slow_path_step(&mut self) -> bool {
        let last = self.log.last_seq();
        let after = self.slow_path_last;
        let next = self
            .reps
            .range(after + 1..)
            .chain(self.reps.range(..=after))
            .find(|(_, r)| r.cursor < last)
            .map(|(&id, _)| id);
        let Some(rid) = next else { return false };
        self.slow_path_last = rid;
        self.read.counters.slow_path_steps.bump();
        let from = self.reps[&rid].cursor;
        let to = (from + self.cfg.slow_path_batch as u64).min(last);
        self.scan_log(rid, to);
        true
    }

    /// CATCH_UP (a hit found `rid` behind the log): scans its records up to the last,
    /// at most `CATCH_UP_COMPONENTS_MAX / dim` of them, as slow-path steps would. Returns
    /// the records scanned (0: gone, or nothing behind).
    pub fn catch_up(&mut self, rid: RepId) -> usize {
        // Never fewer than a hit checks itself.
        let records = (CATCH_UP_COMPONENTS_MAX / self.cfg.dim as u64)
            .max(self.cfg.hit_check_records_max as u64);
        self.catch_up_by(rid, records)
    }

    /// `catch_up`, scanning at most `records`.
    pub(crate) fn catch_up_by(&mut self, rid: RepId, records: u64) -> usize {
        let Some(rep) = self.reps.get(&rid) else {
            return 0;
        };
        // Cleared first: a hit after this sees the new cursor or asks again.
        rep.state.catch_up_asked.store(false, Ordering::Release);
        let from = rep.cursor;
        let to = (from + records).min(self.log.last_seq());
        if to <= from {
            return 0;
        }
        self.read.counters.catch_ups.bump();
        self.scan_log(rid, to);
        (to - from) as usize
    }

    /// Merges into `rid`'s list the records after its cursor up to `to` that it takes,
    /// then moves the cursor to `to` and publishes it with the list.
    fn scan_log(&mut self, rid: RepId, to: u64) {
        let (from, query) = {
            let r = &self.reps[&rid];
            (r.cursor, r.query.clone())
        };
        debug_assert!(
            from + 1 >= self.log.head_seq(),
            "the log holds what is scanned"
        );
        for seq in from + 1..=to {
            let Some(rec) = self.log.get(seq) else {
                continue;
            };
            let (Some(v), id) = (rec.vector.clone(), rec.id) else {
                continue;
            };
            let d = self.cfg.metric.distance(&v, &query);
            let Some(rep) = self.reps.get(&rid) else {
                break;
            };
            if d < rep.max_d() && self.merge(rid, id, d, &v) {
                self.read.counters.slow_path_merges.bump();
            }
        }
        // A merge may have evicted this very entry to stay within budget.
        let Some(rep) = self.reps.get_mut(&rid) else {
            return;
        };
        self.cursors.remove(&(rep.cursor, rid));
        self.risk.sum_cursor += (to - rep.cursor) as u128;
        rep.view.cursor = to;
        if to == self.log.last_seq() {
            // Whatever asked for a catch-up has it (a slow-path step may get there first).
            rep.state.catch_up_asked.store(false, Ordering::Release);
        }
        self.cursors.insert((to, rid));
        let view = rep.view.clone();
        self.publish_view(view);
        self.trim_log();
    }
}
