//! The recent inserts readers check at hit time: the last `hit_check_records_max`
//! insert-log records, published so that any core can read them without the owner.
//!
//! ```text
//!  owner: insert ─► InsertLog::append ─► RecentInserts::publish(seq, id, v) ─► insert_seq
//!         delete ─► RecentInserts::tombstone(seq) (before the delete is acknowledged)
//!  reader: hit on e ─► records (LC_e, insert_seq] ─► those e takes (d < maxD_e, live,
//!          not listed) join its list for this answer; a record no longer held
//!          (overwritten by a newer one) makes the hit unanswerable from the cache
//! ```
//!
//! Slot `seq % capacity` holds record `seq`: a reader that finds another sequence
//! number there knows the record left the window.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::epoch::{EpochSlots, SlotsGuard};

/// One insert as readers see it.
pub(crate) struct RecentRecord {
    pub seq: u64,
    pub id: u64,
    pub vector: Arc<[f32]>,
    /// Set before the id's delete is acknowledged: the record is never served after.
    deleted: AtomicBool,
}

impl RecentRecord {
    pub(crate) fn live(&self) -> bool {
        !self.deleted.load(Ordering::Acquire)
    }
}

pub(crate) struct RecentInserts {
    slots: EpochSlots<RecentRecord>,
}

/// The window no longer holds a record a reader needs (or never will: it is behind).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct OutOfWindow;

impl RecentInserts {
    pub(crate) fn new(capacity: usize) -> Self {
        assert!(capacity > 0, "the window holds at least one record");
        RecentInserts {
            slots: EpochSlots::new(capacity),
        }
    }

    /// Records the window holds: a hit may check up to this many.
    pub(crate) fn capacity(&self) -> usize {
        self.slots.len()
    }

    fn slot(&self, seq: u64) -> usize {
        (seq % self.slots.len() as u64) as usize
    }

    /// Owner: record `seq` (live unless `deleted`), replacing the one `capacity` older.
    pub(crate) fn publish(&self, seq: u64, id: u64, vector: Arc<[f32]>, deleted: bool) {
        let rec = RecentRecord {
            seq,
            id,
            vector,
            deleted: AtomicBool::new(deleted),
        };
        self.slots.store(self.slot(seq), rec);
    }

    /// Owner: record `seq` is deleted (no-op once it left the window).
    pub(crate) fn tombstone(&self, seq: u64) {
        self.slots.read(|g| {
            if let Some(r) = g.get(self.slot(seq)).filter(|r| r.seq == seq) {
                r.deleted.store(true, Ordering::Release);
            }
        })
    }

    /// Reader: calls `f` on every live record in `after + 1 ..= upto`, oldest first.
    /// `Err` when one of them is no longer held: whoever asked cannot know what it was.
    pub(crate) fn scan(
        &self,
        after: u64,
        upto: u64,
        mut f: impl FnMut(&RecentRecord),
    ) -> Result<(), OutOfWindow> {
        if upto <= after {
            return Ok(());
        }
        if upto - after > self.slots.len() as u64 {
            return Err(OutOfWindow);
        }
        self.slots.read(|g: &SlotsGuard<'_, RecentRecord>| {
            for seq in after + 1..=upto {
                let rec = g
                    .get(self.slot(seq))
                    .filter(|r| r.seq == seq)
                    .ok_or(OutOfWindow)?;
                if rec.live() {
                    f(rec);
                }
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(x: f32) -> Arc<[f32]> {
        Arc::from(vec![x])
    }

    fn seen(w: &RecentInserts, after: u64, upto: u64) -> Result<Vec<u64>, OutOfWindow> {
        let mut ids = Vec::new();
        w.scan(after, upto, |r| ids.push(r.id))?;
        Ok(ids)
    }

    #[test]
    fn a_window_serves_what_it_holds_and_refuses_what_it_lost() {
        let w = RecentInserts::new(4);
        for seq in 1..=6 {
            w.publish(seq, 100 + seq, v(seq as f32), false);
        }
        assert_eq!(seen(&w, 2, 6), Ok(vec![103, 104, 105, 106]));
        assert_eq!(seen(&w, 6, 6), Ok(vec![]), "nothing after the last");
        assert_eq!(seen(&w, 1, 6), Err(OutOfWindow), "record 2 was overwritten");
        assert_eq!(
            seen(&w, 4, 7),
            Err(OutOfWindow),
            "record 7 is not there yet"
        );
        w.tombstone(5);
        w.tombstone(1); // long gone: nothing happens
        assert_eq!(seen(&w, 2, 6), Ok(vec![103, 104, 106]));
        w.publish(7, 107, v(7.0), true);
        assert_eq!(seen(&w, 3, 7), Ok(vec![104, 106]), "published deleted");
    }

    #[test]
    fn readers_see_whole_records_while_the_owner_publishes() {
        let w = Arc::new(RecentInserts::new(64));
        let stop = Arc::new(AtomicBool::new(false));
        let reader = {
            let (w, stop) = (w.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut scans = 0u64;
                while !stop.load(Ordering::Relaxed) && scans < 2_000_000 {
                    let _ = w.scan(0, 64, |r| assert_eq!(r.vector[0], r.id as f32));
                    scans += 1;
                }
            })
        };
        for seq in 1..50_000u64 {
            w.publish(seq, seq, v(seq as f32), false);
        }
        stop.store(true, Ordering::Relaxed);
        reader.join().unwrap();
    }
}
