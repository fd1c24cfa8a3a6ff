//! The cache's warm-restart snapshot: every shard's image and the router's
//! (`shards::snapshot`), tagged with the store's log position, in the data directory.
//!
//! ```text
//!  cache.snapshot = magic "AKERSNP\0" | format u32 | length u64 | xxh3_64(archive) u64 | archive
//!  archive (rkyv) = CacheSnapshot { format, collection, seq, dim, metric, shards,
//!                                   settings, capacity (`durable::fingerprint`), taken,
//!                                   router image, shard images }
//! ```
//! Taken (`service::warm`) while writers are held at the log's gate: every write up to
//! `seq` is in it and none after; written to `cache.snapshot.tmp`, synced, renamed. At start
//! it is used only when the log still holds every record after `seq` (they are replayed
//! into the cache, so a snapshot never serves an id deleted after it was taken); a
//! FLUSH removes it.

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use rkyv::rancor;
use shards::snapshot::{RouterImage, ShardImage};

use super::checkpoint::{read_framed, write_framed, HEADER_BYTES};
use super::wal::{self, sync_dir, Op};

const MAGIC: &[u8; 8] = b"AKERSNP\0";
/// The snapshot format this build writes and reads; its history, each change refusing
/// the snapshots written before it once (the cache starts cold, the log says why):
/// - 2: query keys no longer hash `k` (an entry answers any smaller `k`); a format 1
///   snapshot's keys would not match.
/// - 3 (issue #39): the configuration it was taken under is recorded as stable
///   fingerprints (`durable::fingerprint`), no longer as Rust's `Debug` text of the
///   policy and the capacity, which a renamed field would have changed.
pub(crate) const FORMAT: u32 = 3;
/// The last format that recorded the configuration as `Debug` text.
const FORMAT_DEBUG_TEXT: u32 = 2;
/// The snapshot's file name in the data directory.
pub(crate) const FILE: &str = "cache.snapshot";
const TMP: &str = "cache.snapshot.tmp";
/// The data directory's collection id (a new one at each import).
const COLLECTION_FILE: &str = "collection-id";

#[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, Debug, Clone, PartialEq)]
pub(crate) struct CacheSnapshot {
    pub format: u32,
    /// The data directory's collection id ([`collection_id`]).
    pub collection: u64,
    /// Every log record up to this seq is reflected in it, none after.
    pub seq: u64,
    pub dim: u32,
    pub metric: String,
    pub shards: u32,
    /// The hit policy with its parameters and `store_vectors`
    /// (`fingerprint::settings`): τ means what it means only under the policy that set it.
    pub settings: u64,
    /// The pool's capacity (`fingerprint::capacity`): shares are in its unit.
    pub capacity: u64,
    pub taken_unix_s: u64,
    pub router: RouterImage,
    pub images: Vec<ShardImage>,
}

/// What a start restores: the snapshot and the log records after it.
#[derive(Debug)]
pub(crate) struct WarmStart {
    pub snapshot: CacheSnapshot,
    pub tail: Vec<Op>,
    /// The last seq the tail reaches (recovery's last).
    pub last_seq: u64,
}

/// `dir/cache.snapshot`.
pub(crate) fn path(dir: &Path) -> PathBuf {
    dir.join(FILE)
}

/// Writes `s` to the temporary file, synced; [`install`] renames it into place.
pub(crate) fn write_tmp(dir: &Path, s: &CacheSnapshot) -> io::Result<u64> {
    let archive = rkyv::to_bytes::<rancor::Error>(s).map_err(io::Error::other)?;
    write_framed(&dir.join(TMP), MAGIC, FORMAT, &archive)?;
    Ok((HEADER_BYTES + archive.len()) as u64)
}

/// Removes a temporary file a crash left behind (at start, before anything writes one).
pub(crate) fn remove_tmp(dir: &Path) {
    let _ = std::fs::remove_file(dir.join(TMP));
}

/// The written temporary file becomes the snapshot (atomically), or goes (`keep` false).
pub(crate) fn install(dir: &Path, keep: bool) -> io::Result<()> {
    if keep {
        std::fs::rename(dir.join(TMP), path(dir))?;
    } else {
        std::fs::remove_file(dir.join(TMP))?;
    }
    sync_dir(dir)
}

/// Removes the snapshot (a FLUSH: the entries it holds were dropped on purpose).
pub(crate) fn remove(dir: &Path) -> io::Result<()> {
    match std::fs::remove_file(path(dir)) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => sync_dir(dir),
    }
}

/// Reads and validates a snapshot: header, checksum, then rkyv's structural check.
pub(crate) fn read(p: &Path) -> Result<CacheSnapshot, String> {
    let archive = read_framed(p, MAGIC, FORMAT).map_err(|e| match stored_format(p) {
        Some(f) if f <= FORMAT_DEBUG_TEXT => format!(
            "{e}: written before format {FORMAT}, which records the configuration as a \
             stable fingerprint instead of Rust's Debug text; refused this once"
        ),
        _ => e.to_string(),
    })?;
    rkyv::from_bytes::<CacheSnapshot, rancor::Error>(&archive).map_err(|e| format!("archive: {e}"))
}

/// The format a snapshot file's header names, if it has this file's magic.
fn stored_format(p: &Path) -> Option<u32> {
    use std::io::Read;
    let mut header = [0u8; 12];
    File::open(p).ok()?.read_exact(&mut header).ok()?;
    let format = header[8..12].try_into().ok().map(u32::from_le_bytes)?;
    (&header[..8] == MAGIC).then_some(format)
}

/// The data directory's collection id: read, or made (random) when missing or `fresh`
/// (an import: a snapshot of another collection must not load here).
pub(crate) fn collection_id(dir: &Path, fresh: bool) -> io::Result<u64> {
    let p = dir.join(COLLECTION_FILE);
    if !fresh {
        if let Ok(text) = std::fs::read_to_string(&p) {
            if let Ok(id) = u64::from_str_radix(text.trim(), 16) {
                return Ok(id);
            }
        }
    }
    let id: u64 = rand::random();
    let tmp = dir.join("collection-id.tmp");
    {
        let mut f = File::create(&tmp)?;
        writeln!(f, "{id:016x}")?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, &p)?;
    sync_dir(dir)?;
    Ok(id)
}

/// What the start expects of a snapshot.
pub(crate) struct Expect<'a> {
    pub collection: u64,
    pub dim: usize,
    pub metric: &'a str,
    pub shards: usize,
    /// `fingerprint::settings` of this configuration.
    pub settings: u64,
    /// The last seq recovery applied.
    pub last_seq: u64,
}

/// The snapshot in `dir` and the log records after it, if it may be used: `Ok(None)`
/// when there is none, `Err(why)` when it is refused (the cache then starts cold).
pub(crate) fn load(dir: &Path, want: &Expect) -> Result<Option<WarmStart>, String> {
    let Some(s) = load_unlogged(dir, want)? else {
        return Ok(None);
    };
    if s.seq > want.last_seq {
        return Err(format!(
            "taken at log seq {}, but the log recovered ends at {}: writes it reflects are lost",
            s.seq, want.last_seq
        ));
    }
    let tail = records_after(dir, s.seq, want.last_seq)?;
    Ok(Some(WarmStart {
        snapshot: s,
        tail,
        last_seq: want.last_seq,
    }))
}

/// The snapshot in `dir` if it was taken of this collection under this configuration,
/// without its log's tail (pgvector: the slot holds what comes after its position).
pub(crate) fn load_unlogged(dir: &Path, want: &Expect) -> Result<Option<CacheSnapshot>, String> {
    let p = path(dir);
    if !p.exists() {
        return Ok(None);
    }
    let s = read(&p)?;
    if s.collection != want.collection {
        return Err(
            "taken of another collection (the data directory was imported again, or \
             another database or table)"
                .into(),
        );
    }
    if (s.dim as usize, s.metric.as_str()) != (want.dim, want.metric) {
        return Err(format!(
            "taken of {}-d {} vectors, the store holds {}-d {}",
            s.dim, s.metric, want.dim, want.metric
        ));
    }
    if s.shards as usize != want.shards || s.images.len() != want.shards {
        return Err(format!(
            "taken with {} shards, this configuration has {}",
            s.shards, want.shards
        ));
    }
    if s.settings != want.settings {
        return Err(format!(
            "taken under another hit policy or store_vectors (settings fingerprint {:016x}, \
             this configuration's {:016x})",
            s.settings, want.settings
        ));
    }
    Ok(Some(s))
}

/// The log's records `after + 1 ..= last`, in order; `Err` unless the log holds every one.
pub(crate) fn records_after(dir: &Path, after: u64, last: u64) -> Result<Vec<Op>, String> {
    let segments = wal::segments(dir).map_err(|e| e.to_string())?;
    let from = segments
        .iter()
        .rposition(|(first, _)| *first <= after + 1)
        .ok_or_else(|| {
            format!(
                "the log starts after seq {}: records after the snapshot were truncated \
                 by a checkpoint",
                after + 1
            )
        })?;
    let mut out = Vec::new();
    let mut at = after;
    for (_, p) in &segments[from..] {
        let read = wal::read_segment(p).map_err(|e| format!("{}: {e}", p.display()))?;
        for r in read.records {
            if r.seq <= at || r.seq > last {
                continue;
            }
            if r.seq != at + 1 {
                return Err(format!("log records jump from seq {at} to {}", r.seq));
            }
            at = r.seq;
            out.push(r.op);
        }
    }
    if at != last {
        return Err(format!(
            "the log after seq {after} ends at {at}, not {last}"
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("aker-snap-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn sample(collection: u64, seq: u64) -> CacheSnapshot {
        CacheSnapshot {
            format: FORMAT,
            collection,
            seq,
            dim: 2,
            metric: "l2sq".into(),
            shards: 1,
            settings: 1,
            capacity: 2,
            taken_unix_s: 0,
            router: RouterImage {
                centroids: vec![0.0, 1.0],
                assignment: vec![0],
                previous: vec![u32::MAX],
                shares: vec![100],
            },
            images: vec![ShardImage::default()],
        }
    }

    fn expect(collection: u64, last_seq: u64) -> Expect<'static> {
        Expect {
            collection,
            dim: 2,
            metric: "l2sq",
            shards: 1,
            settings: 1,
            last_seq,
        }
    }

    #[test]
    fn a_snapshot_loads_with_the_log_after_it_and_is_refused_otherwise() {
        let d = dir("load");
        let id = collection_id(&d, false).unwrap();
        assert_eq!(collection_id(&d, false).unwrap(), id);
        let w = wal::Wal::open(&d, 1).unwrap();
        for i in 0..4 {
            let s = w.append(&Op::Delete { id: i }).unwrap();
            w.wait_durable(s).unwrap();
        }
        drop(w);
        assert!(load(&d, &expect(id, 4)).unwrap().is_none(), "none yet");
        write_tmp(&d, &sample(id, 2)).unwrap();
        install(&d, true).unwrap();
        let warm = load(&d, &expect(id, 4)).unwrap().unwrap();
        assert_eq!(warm.snapshot, sample(id, 2));
        assert_eq!(warm.tail, vec![Op::Delete { id: 2 }, Op::Delete { id: 3 }]);
        // Newer than the log, another collection, another shard count: refused.
        assert!(load(&d, &expect(id, 1)).unwrap_err().contains("lost"));
        assert!(load(&d, &expect(id ^ 1, 4))
            .unwrap_err()
            .contains("another collection"));
        let three = Expect {
            shards: 3,
            ..expect(id, 4)
        };
        assert!(load(&d, &three).unwrap_err().contains("shards"));
        let other = Expect {
            settings: 3,
            ..expect(id, 4)
        };
        assert!(load(&d, &other).unwrap_err().contains("policy"));
        // The log no longer reaches back to it.
        assert!(records_after(&d, 2, 9).unwrap_err().contains("ends at 4"));
        let seg = wal::segments(&d).unwrap()[0].1.clone();
        std::fs::rename(&seg, d.join(format!("wal-{:020}.log", 4))).unwrap();
        assert!(load(&d, &expect(id, 4)).unwrap_err().contains("truncated"));
        // A new import is another collection.
        assert_ne!(collection_id(&d, true).unwrap(), id);
    }

    #[test]
    fn flipped_or_truncated_snapshots_are_refused_with_the_reason() {
        let d = dir("bad");
        write_tmp(&d, &sample(7, 0)).unwrap();
        install(&d, true).unwrap();
        let p = path(&d);
        let good = std::fs::read(&p).unwrap();
        let mut flipped = good.clone();
        let at = good.len() - 9;
        flipped[at] ^= 0x20;
        std::fs::write(&p, &flipped).unwrap();
        assert!(read(&p).unwrap_err().contains("checksum"));
        std::fs::write(&p, &good[..good.len() - 3]).unwrap();
        assert!(read(&p).unwrap_err().contains("header says"));
        std::fs::write(&p, b"AKERSNP").unwrap();
        assert!(read(&p).unwrap_err().contains("shorter"));
        // A snapshot of format 2 (the configuration as Debug text): refused, saying why.
        let mut older = good.clone();
        older[8..12].copy_from_slice(&FORMAT_DEBUG_TEXT.to_le_bytes());
        std::fs::write(&p, &older).unwrap();
        let e = read(&p).unwrap_err();
        assert!(
            e.contains("stable fingerprint") && e.contains("once"),
            "{e}"
        );
        std::fs::write(&p, &good).unwrap();
        assert_eq!(read(&p).unwrap(), sample(7, 0));
        remove(&d).unwrap();
        remove(&d).unwrap();
        assert!(!p.exists());
    }
}
