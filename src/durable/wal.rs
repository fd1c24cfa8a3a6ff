//! The embedded store's write-ahead log: one record per acknowledged write, appended
//! in the store's apply order, made durable by `fdatasync` with group commit.
//!
//! ```text
//!  record = len u32 | xxh3_64(payload) u64 | payload
//!  payload = seq u64 | op u8 (1 insert, 2 delete) | id u64 | n u32 | n x f32
//!
//!  writer (backend thread):  store write lock { seq = append(rec); apply; queue to owners }
//!                            wait_durable(seq)          <- outside the store's lock
//!  wait_durable:  durable >= seq: done | nobody syncing: become the leader, fdatasync
//!                 everything written so far, wake all | else wait for the leader
//! ```
//!
//! A segment is `wal-<first seq>.log`; a checkpoint at seq S starts a new segment and
//! lets the older ones go. At recovery a record that is short, over `RECORD_BYTES_MAX`
//! or fails its checksum ends the segment: it and everything after it are a torn tail
//! (never acknowledged, since acknowledgement waits for the sync), truncated away,
//! unless a valid record follows the bad bytes: then they are corruption inside what
//! was synced, and recovery refuses rather than cut acknowledged writes
//! (`SegmentRead::valid_after`).

// The log's mutex and condvar are the control plane of writes (one lock per append and
// per sync, never on a search's path).

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};

use xxhash_rust::xxh3::xxh3_64;

/// Header bytes before a payload: length and checksum.
const HEADER_BYTES: usize = 12;
/// Payload bytes without the vector.
const PAYLOAD_FIXED_BYTES: usize = 8 + 1 + 8 + 4;
/// The largest record accepted at recovery (a 65,536-d vector and its header).
pub(crate) const RECORD_BYTES_MAX: usize = HEADER_BYTES + PAYLOAD_FIXED_BYTES + 4 * 65_536;

const OP_INSERT: u8 = 1;
const OP_DELETE: u8 = 2;

/// One logged write.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Op {
    Insert { id: u64, vector: Vec<f32> },
    Delete { id: u64 },
}

/// A record as read back.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Record {
    pub seq: u64,
    pub op: Op,
}

fn encode(seq: u64, op: &Op, out: &mut Vec<u8>) {
    let (code, id, vector): (u8, u64, &[f32]) = match op {
        Op::Insert { id, vector } => (OP_INSERT, *id, vector),
        Op::Delete { id } => (OP_DELETE, *id, &[]),
    };
    let mut payload = Vec::with_capacity(PAYLOAD_FIXED_BYTES + 4 * vector.len());
    payload.extend_from_slice(&seq.to_le_bytes());
    payload.push(code);
    payload.extend_from_slice(&id.to_le_bytes());
    payload.extend_from_slice(&(vector.len() as u32).to_le_bytes());
    for x in vector {
        payload.extend_from_slice(&x.to_le_bytes());
    }
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&xxh3_64(&payload).to_le_bytes());
    out.extend_from_slice(&payload);
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

/// The payload's record, or `None` when it does not parse (a checksum collision on
/// garbage is the only way here).
fn decode(payload: &[u8]) -> Option<Record> {
    if payload.len() < PAYLOAD_FIXED_BYTES {
        return None;
    }
    let (seq, code, id) = (u64_at(payload, 0), payload[8], u64_at(payload, 9));
    let n = u32_at(payload, 17) as usize;
    if payload.len() != PAYLOAD_FIXED_BYTES + 4 * n {
        return None;
    }
    let op = match code {
        OP_INSERT => Op::Insert {
            id,
            vector: payload[PAYLOAD_FIXED_BYTES..]
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
                .collect(),
        },
        OP_DELETE if n == 0 => Op::Delete { id },
        _ => return None,
    };
    Some(Record { seq, op })
}

/// What reading one segment found.
#[derive(Debug, Default)]
pub(crate) struct SegmentRead {
    pub records: Vec<Record>,
    /// Bytes of whole, valid records from the start.
    pub valid_bytes: u64,
    /// Bytes after them (a torn or corrupt tail), 0 when the segment ended cleanly.
    pub torn_bytes: u64,
    /// Valid records found in those bytes past the bad spot (0 for a torn tail: a write
    /// cut short leaves nothing whole behind it).
    pub valid_after: u64,
}

/// The whole, valid record starting at `at`, and where it ends.
fn record_at(bytes: &[u8], at: usize) -> Option<(Record, usize)> {
    if at + HEADER_BYTES > bytes.len() {
        return None;
    }
    let len = u32_at(bytes, at) as usize;
    let end = at + HEADER_BYTES + len;
    if len + HEADER_BYTES > RECORD_BYTES_MAX || end > bytes.len() {
        return None;
    }
    let payload = &bytes[at + HEADER_BYTES..end];
    let sum = u64_at(bytes, at + 4);
    let record = (xxh3_64(payload) == sum)
        .then(|| decode(payload))
        .flatten()?;
    Some((record, end))
}

/// Reads a segment's valid prefix; a bad record ends it. The bytes after it are
/// scanned for a valid record (a 64-bit checksum matching by chance is negligible), so
/// that corruption inside the log is told from a torn tail.
pub(crate) fn read_segment(path: &Path) -> io::Result<SegmentRead> {
    let mut bytes = Vec::new();
    File::open(path)?.read_to_end(&mut bytes)?;
    let mut out = SegmentRead::default();
    let mut at = 0usize;
    while let Some((record, end)) = record_at(&bytes, at) {
        out.records.push(record);
        at = end;
    }
    out.valid_bytes = at as u64;
    out.torn_bytes = (bytes.len() - at) as u64;
    if let Some(mut p) = (at + 1..bytes.len()).find(|&p| record_at(&bytes, p).is_some()) {
        while let Some((_, end)) = record_at(&bytes, p) {
            out.valid_after += 1;
            p = end;
        }
    }
    Ok(out)
}

/// `wal-<first seq>.log` in `dir`.
pub(crate) fn segment_path(dir: &Path, first_seq: u64) -> PathBuf {
    dir.join(format!("wal-{first_seq:020}.log"))
}

/// The segments in `dir`, by first seq.
pub(crate) fn segments(dir: &Path) -> io::Result<Vec<(u64, PathBuf)>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let path = e?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if let Some(seq) = name
            .strip_prefix("wal-")
            .and_then(|s| s.strip_suffix(".log"))
            .and_then(|s| s.parse::<u64>().ok())
        {
            out.push((seq, path));
        }
    }
    out.sort();
    Ok(out)
}

/// Makes a directory entry (a new or renamed file) durable.
pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

struct Inner {
    file: File,
    /// The seq the next append gets.
    next_seq: u64,
    /// The last seq handed to the OS (written).
    written: u64,
    /// The last seq known on stable storage.
    durable: u64,
    syncing: bool,
    /// After a failed write or sync nothing more is acknowledged (the page cache may
    /// have dropped what it failed to write: retrying cannot prove it durable).
    failed: Option<String>,
}

/// What metrics read without the log's mutex (they are read on executors, which must
/// never wait for a sync).
#[derive(Debug, Default)]
pub(crate) struct WalCounters {
    pub appends: AtomicU64,
    /// fdatasync calls (a sync covers every append before it: group commit).
    pub syncs: AtomicU64,
    pub durable_seq: AtomicU64,
    pub segment_bytes: AtomicU64,
}

/// The log: appends under its mutex, syncs by a leader while others wait.
pub(crate) struct Wal {
    dir: PathBuf,
    inner: Mutex<Inner>,
    synced: Condvar,
    pub counters: WalCounters,
}

impl Wal {
    /// Appends to a new segment in `dir` starting at `next_seq` (recovery read and
    /// truncated the older ones).
    pub(crate) fn open(dir: &Path, next_seq: u64) -> io::Result<Wal> {
        let file = new_segment(dir, next_seq)?;
        Ok(Wal {
            dir: dir.to_path_buf(),
            inner: Mutex::new(Inner {
                file,
                next_seq,
                written: next_seq.saturating_sub(1),
                durable: next_seq.saturating_sub(1),
                syncing: false,
                failed: None,
            }),
            synced: Condvar::new(),
            counters: WalCounters {
                durable_seq: AtomicU64::new(next_seq.saturating_sub(1)),
                ..WalCounters::default()
            },
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Appends `op` and returns its seq; not durable until `wait_durable(seq)`. Call it
    /// under the store's write lock, so the log's order is the store's.
    pub(crate) fn append(&self, op: &Op) -> io::Result<u64> {
        let mut g = self.lock();
        if let Some(e) = &g.failed {
            return Err(io::Error::other(format!("the log failed earlier: {e}")));
        }
        let seq = g.next_seq;
        let mut buf = Vec::new();
        encode(seq, op, &mut buf);
        if let Err(e) = g.file.write_all(&buf) {
            g.failed = Some(e.to_string());
            return Err(e);
        }
        g.next_seq += 1;
        g.written = seq;
        self.counters
            .segment_bytes
            .fetch_add(buf.len() as u64, Ordering::Relaxed);
        self.counters.appends.fetch_add(1, Ordering::Relaxed);
        Ok(seq)
    }

    /// Returns once `seq` is on stable storage: the first waiter syncs for everyone
    /// who appended before it started (group commit), the others wait for it.
    pub(crate) fn wait_durable(&self, seq: u64) -> io::Result<()> {
        let mut g = self.lock();
        loop {
            // Durable before the log failed: it stays durable.
            if g.durable >= seq {
                return Ok(());
            }
            if let Some(e) = &g.failed {
                return Err(io::Error::other(format!("the log failed: {e}")));
            }
            if g.syncing {
                g = self.synced.wait(g).unwrap_or_else(|e| e.into_inner());
                continue;
            }
            g.syncing = true;
            let target = g.written;
            let file = g.file.try_clone();
            drop(g);
            let r = file.and_then(|f| f.sync_data());
            g = self.lock();
            g.syncing = false;
            match r {
                Ok(()) => {
                    g.durable = g.durable.max(target);
                    self.counters.syncs.fetch_add(1, Ordering::Relaxed);
                    self.counters
                        .durable_seq
                        .store(g.durable, Ordering::Relaxed);
                }
                Err(e) => g.failed = Some(e.to_string()),
            }
            self.synced.notify_all();
        }
    }

    /// Starts a new segment at the next seq and returns the last seq of the old one (a
    /// checkpoint taken now covers it). Call it under the store's lock (read is
    /// enough: writes take the write lock), so the checkpoint's rows match.
    pub(crate) fn rotate(&self) -> io::Result<u64> {
        let mut g = self.lock();
        if let Some(e) = &g.failed {
            return Err(io::Error::other(format!("the log failed earlier: {e}")));
        }
        // A failed sync is latched like `wait_durable`'s: the kernel may have dropped
        // the pages, and a later sync of the same file would succeed without them.
        let synced = g.file.sync_data();
        let file = synced.and_then(|()| new_segment(&self.dir, g.next_seq));
        match file {
            Ok(file) => {
                g.durable = g.written;
                self.counters.syncs.fetch_add(1, Ordering::Relaxed);
                self.counters
                    .durable_seq
                    .store(g.durable, Ordering::Relaxed);
                g.file = file;
                self.counters.segment_bytes.store(0, Ordering::Relaxed);
                self.synced.notify_all();
                Ok(g.written)
            }
            Err(e) => {
                g.failed = Some(e.to_string());
                self.synced.notify_all();
                Err(e)
            }
        }
    }

    /// Bytes in the current segment (a checkpoint is due past a configured size).
    pub(crate) fn segment_bytes(&self) -> u64 {
        self.counters.segment_bytes.load(Ordering::Relaxed)
    }

    /// The last seq appended (a no-op write waits for it: its answer rests on it).
    pub(crate) fn written(&self) -> u64 {
        self.lock().written
    }

    /// (appends, syncs, last durable seq).
    pub(crate) fn counts(&self) -> (u64, u64, u64) {
        let c = &self.counters;
        (
            c.appends.load(Ordering::Relaxed),
            c.syncs.load(Ordering::Relaxed),
            c.durable_seq.load(Ordering::Relaxed),
        )
    }
}

fn new_segment(dir: &Path, first_seq: u64) -> io::Result<File> {
    let path = segment_path(dir, first_seq);
    let file = OpenOptions::new().create(true).append(true).open(&path)?;
    sync_dir(dir)?;
    Ok(file)
}

/// Cuts a segment back to its valid prefix (recovery, after a torn tail).
pub(crate) fn truncate(path: &Path, valid_bytes: u64) -> io::Result<()> {
    let f = OpenOptions::new().write(true).open(path)?;
    f.set_len(valid_bytes)?;
    f.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("aker-wal-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn ops() -> Vec<Op> {
        vec![
            Op::Insert {
                id: 7,
                vector: vec![0.5, -1.0, 3.25],
            },
            Op::Delete { id: 7 },
            Op::Insert {
                id: 9,
                vector: vec![1.0, 2.0, 3.0],
            },
        ]
    }

    #[test]
    fn appended_records_read_back_in_order() {
        let d = dir("order");
        let wal = Wal::open(&d, 1).unwrap();
        for (i, op) in ops().iter().enumerate() {
            let seq = wal.append(op).unwrap();
            assert_eq!(seq, i as u64 + 1);
        }
        wal.wait_durable(3).unwrap();
        let segs = segments(&d).unwrap();
        assert_eq!(segs.len(), 1);
        let r = read_segment(&segs[0].1).unwrap();
        assert_eq!(r.torn_bytes, 0);
        let got: Vec<Op> = r.records.iter().map(|r| r.op.clone()).collect();
        assert_eq!(got, ops());
        assert_eq!(r.records[2].seq, 3);
    }

    #[test]
    fn a_torn_or_flipped_tail_ends_the_valid_prefix() {
        let d = dir("torn");
        let wal = Wal::open(&d, 1).unwrap();
        for op in ops() {
            wal.append(&op).unwrap();
        }
        wal.wait_durable(3).unwrap();
        let path = segments(&d).unwrap()[0].1.clone();
        let full = std::fs::read(&path).unwrap();
        // Cut inside the last record: two survive.
        std::fs::write(&path, &full[..full.len() - 3]).unwrap();
        let r = read_segment(&path).unwrap();
        assert_eq!(r.records.len(), 2);
        assert!(r.torn_bytes > 0);
        assert_eq!(r.valid_after, 0, "a torn tail has nothing whole behind it");
        // A flipped byte inside the second record's vector-free payload: one survives.
        let mut bad = full.clone();
        let second = HEADER_BYTES + PAYLOAD_FIXED_BYTES + 12 + HEADER_BYTES + 3;
        bad[second] ^= 0x40;
        std::fs::write(&path, &bad).unwrap();
        let r = read_segment(&path).unwrap();
        assert_eq!(r.records.len(), 1, "the checksum catches it");
        assert_eq!(
            r.valid_after, 1,
            "the third record is found behind the bad one"
        );
        truncate(&path, r.valid_bytes).unwrap();
        let again = read_segment(&path).unwrap();
        assert_eq!((again.records.len(), again.torn_bytes), (1, 0));
    }

    #[test]
    fn concurrent_writers_share_syncs() {
        let d = dir("group");
        let wal = std::sync::Arc::new(Wal::open(&d, 1).unwrap());
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let wal = wal.clone();
                std::thread::spawn(move || {
                    for i in 0..25u64 {
                        let seq = wal.append(&Op::Delete { id: t * 100 + i }).unwrap();
                        wal.wait_durable(seq).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let (appends, syncs, durable) = wal.counts();
        assert_eq!((appends, durable), (200, 200));
        assert!(syncs <= appends, "{syncs} syncs for {appends} appends");
        let r = read_segment(&segments(&d).unwrap()[0].1).unwrap();
        let seqs: Vec<u64> = r.records.iter().map(|r| r.seq).collect();
        assert_eq!(seqs, (1..=200).collect::<Vec<_>>());
    }

    #[test]
    fn rotation_starts_a_segment_at_the_next_seq() {
        let d = dir("rotate");
        let wal = Wal::open(&d, 1).unwrap();
        wal.append(&Op::Delete { id: 1 }).unwrap();
        assert_eq!(wal.rotate().unwrap(), 1);
        wal.append(&Op::Delete { id: 2 }).unwrap();
        let segs = segments(&d).unwrap();
        assert_eq!(segs.iter().map(|s| s.0).collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!(read_segment(&segs[1].1).unwrap().records[0].seq, 2);
    }
}
