//! The global insert log (§4.6) and the delete log of in-flight misses.
//!
//! Insert log: every inserted vector gets a sequence number. Each representative's
//! cursor `LC` is the last sequence number it has accounted for; the slow path scans
//! forward from there. The head is trimmed to the oldest cursor still in use, and the
//! log has a length cap (entries left behind the cap are invalidated by the cache).
//!
//! Delete log: a miss notes the last delete sequence number before it calls the
//! backend; at admission every id deleted after that is stripped from its answer, so a
//! delete acknowledged while the miss was in flight is never admitted back.

use std::collections::VecDeque;
use std::sync::Arc;

use crate::hash::{HashMap, HashSet};
use crate::recent::RecentInserts;

#[derive(Clone, Debug)]
pub(crate) struct LogRecord {
    pub seq: u64,
    pub id: u64,
    /// `None` once the id was deleted: the slow path must not merge it back.
    pub vector: Option<Arc<[f32]>>,
}

pub(crate) struct InsertLog {
    records: VecDeque<LogRecord>,
    /// Sequence number of the newest record (0: none yet).
    last_seq: u64,
    /// Sequence numbers of the records of each id still in the log.
    by_id: HashMap<u64, Vec<u64>>,
    /// The newest records again, where readers check them at hit time: every append
    /// and tombstone goes to both.
    recent: Arc<RecentInserts>,
}

impl std::fmt::Debug for InsertLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InsertLog")
            .field("records", &self.records.len())
            .field("last_seq", &self.last_seq)
            .finish()
    }
}

impl InsertLog {
    pub(crate) fn new(recent: Arc<RecentInserts>) -> Self {
        InsertLog {
            records: VecDeque::new(),
            last_seq: 0,
            by_id: HashMap::default(),
            recent,
        }
    }

    /// Records a reader can check: the log keeps at least these (`Cache::trim_log`).
    pub(crate) fn window(&self) -> u64 {
        self.recent.capacity() as u64
    }

    pub(crate) fn append(&mut self, id: u64, v: Arc<[f32]>) -> u64 {
        self.last_seq += 1;
        self.recent.publish(self.last_seq, id, v.clone(), false);
        self.records.push_back(LogRecord {
            seq: self.last_seq,
            id,
            vector: Some(v),
        });
        self.by_id.entry(id).or_default().push(self.last_seq);
        self.last_seq
    }

    pub(crate) fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// Sequence number of the oldest record held (`last_seq + 1` when empty).
    pub(crate) fn head_seq(&self) -> u64 {
        self.records.front().map_or(self.last_seq + 1, |r| r.seq)
    }

    /// `W`: records held.
    pub(crate) fn len(&self) -> usize {
        self.records.len()
    }

    pub(crate) fn get(&self, seq: u64) -> Option<&LogRecord> {
        let head = self.head_seq();
        if seq < head {
            return None;
        }
        self.records.get((seq - head) as usize)
    }

    pub(crate) fn contains_id(&self, id: u64) -> bool {
        self.by_id.contains_key(&id)
    }

    /// Marks every record of `id` deleted.
    pub(crate) fn tombstone(&mut self, id: u64) {
        let head = self.head_seq();
        if let Some(seqs) = self.by_id.remove(&id) {
            for s in seqs {
                self.recent.tombstone(s);
                if let Some(r) = self.records.get_mut((s - head) as usize) {
                    r.vector = None;
                }
            }
        }
    }

    /// Drops every record with `seq <= upto`.
    pub(crate) fn trim_to(&mut self, upto: u64) -> usize {
        let mut n = 0;
        while self.records.front().is_some_and(|r| r.seq <= upto) {
            let r = self.records.pop_front().expect("front checked");
            if r.vector.is_some() {
                if let Some(seqs) = self.by_id.get_mut(&r.id) {
                    seqs.retain(|&s| s != r.seq);
                    if seqs.is_empty() {
                        self.by_id.remove(&r.id);
                    }
                }
            }
            n += 1;
        }
        n
    }

    /// Every record held, oldest first (a warm-restart image).
    pub(crate) fn records(&self) -> impl Iterator<Item = &LogRecord> {
        self.records.iter()
    }

    /// Appends a record that was already tombstoned where it came from: it keeps its
    /// place in the sequence but the slow path skips it.
    pub(crate) fn append_tombstoned(&mut self, id: u64) -> u64 {
        self.last_seq += 1;
        self.recent
            .publish(self.last_seq, id, Arc::from(Vec::new()), true);
        self.records.push_back(LogRecord {
            seq: self.last_seq,
            id,
            vector: None,
        });
        self.last_seq
    }
}

/// Records of the delete log allocated at start (16 bytes each); a larger cap grows past
/// this on demand.
const MAX_PREALLOCATED_DELETES: usize = 1 << 20;

#[derive(Debug)]
pub(crate) struct DeleteLog {
    records: VecDeque<(u64, u64)>,
    last_seq: u64,
    cap: usize,
    /// Tickets older than this cannot be admitted: a flush cut them off.
    floor: u64,
}

impl DeleteLog {
    pub(crate) fn new(cap: usize) -> Self {
        DeleteLog {
            // Allocated whole up front: growing it inside a delete copied the window
            // while the owner waited (1-8 ms at 8k-64k records on a fragmented heap).
            records: VecDeque::with_capacity(cap.saturating_add(1).min(MAX_PREALLOCATED_DELETES)),
            last_seq: 0,
            cap,
            floor: 0,
        }
    }

    /// A flush: every ticket taken before it is refused (its miss read the store before
    /// whatever the flush stands for, a TRUNCATE say, and no delete record covers that).
    /// Takes a sequence number of its own, so tickets taken after it are told apart.
    pub(crate) fn cut(&mut self) {
        self.last_seq += 1;
        self.floor = self.last_seq;
    }

    pub(crate) fn append(&mut self, id: u64) -> u64 {
        self.last_seq += 1;
        self.records.push_back((self.last_seq, id));
        while self.records.len() > self.cap {
            self.records.pop_front();
        }
        self.last_seq
    }

    pub(crate) fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// Ids deleted after `seq`; `None` when the log no longer reaches back that far.
    pub(crate) fn deleted_since(&self, seq: u64) -> Option<HashSet<u64>> {
        let head = self.records.front().map_or(self.last_seq + 1, |r| r.0);
        if seq + 1 < head || seq < self.floor {
            return None;
        }
        // Sequence numbers ascend (with a gap where a flush took one: `cut`): find seq + 1
        // by binary search (a scan of the whole window made every admission O(delete
        // log) after a burst of deletes).
        let skip = self.records.partition_point(|&(s, _)| s <= seq);
        Some(self.records.range(skip..).map(|&(_, id)| id).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_log_sequence_trim_and_tombstone() {
        let mut log = InsertLog::new(Arc::new(RecentInserts::new(8)));
        assert_eq!(log.head_seq(), 1);
        let v: Arc<[f32]> = Arc::from(vec![1.0]);
        assert_eq!(log.append(7, v.clone()), 1);
        assert_eq!(log.append(8, v.clone()), 2);
        assert_eq!(log.append(7, v.clone()), 3);
        log.tombstone(7);
        assert!(log.get(1).unwrap().vector.is_none());
        assert!(log.get(2).unwrap().vector.is_some());
        assert!(log.get(3).unwrap().vector.is_none());
        assert_eq!(log.trim_to(2), 2);
        assert_eq!(log.head_seq(), 3);
        assert_eq!(log.len(), 1);
        assert!(log.get(2).is_none());
        assert!(!log.contains_id(8));
    }

    #[test]
    fn delete_log_covers_only_its_window() {
        let mut d = DeleteLog::new(2);
        d.append(1);
        d.append(2);
        d.append(3);
        assert_eq!(d.deleted_since(1), Some([2, 3].into_iter().collect()));
        assert_eq!(d.deleted_since(3), Some(HashSet::default()));
        assert_eq!(
            d.deleted_since(7),
            Some(HashSet::default()),
            "past the end: nothing"
        );
        assert_eq!(d.deleted_since(0), None, "record 1 fell out of the window");
    }
}
