//! Checkpoints of the embedded store: every live row (id, vector) at one log seq, as an
//! rkyv archive validated when read, behind a header with its own checksum (rkyv's
//! validation checks structure, not the bytes of vector data).
//!
//! ```text
//!  checkpoint-<seq>.ckpt = magic "AKERCKP\0" | format u32 | length u64 | xxh3_64(archive) u64 | archive
//!  archive (rkyv)        = Checkpoint { format, seq, dim, metric, ids, vectors (row-major) }
//! ```
//! Written to `checkpoint.tmp`, synced, renamed, the directory synced: a crash leaves the
//! old checkpoint or the new one, never half of one.

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use rkyv::rancor;
use rkyv::util::AlignedVec;
use xxhash_rust::xxh3::xxh3_64;

use super::wal::sync_dir;

const MAGIC: &[u8; 8] = b"AKERCKP\0";
/// The checkpoint format this build writes and reads.
pub(crate) const FORMAT: u32 = 1;
pub(crate) const HEADER_BYTES: usize = 8 + 4 + 8 + 8;

/// What a checkpoint holds.
#[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, Debug, Clone, PartialEq)]
pub(crate) struct Checkpoint {
    pub format: u32,
    /// Every log record up to this seq is in it.
    pub seq: u64,
    pub dim: u32,
    /// The metric's name (`shards::Metric`'s `Display`).
    pub metric: String,
    pub ids: Vec<u64>,
    pub vectors: Vec<f32>,
}

/// Why a checkpoint could not be used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CheckpointError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("{path}: not a file of this format ({why})")]
    Format { path: PathBuf, why: String },
    #[error("{path}: checksum mismatch (stored {stored:016x}, computed {computed:016x}): the file is corrupt")]
    Checksum {
        path: PathBuf,
        stored: u64,
        computed: u64,
    },
}

/// `checkpoint-<seq>.ckpt` in `dir`.
pub(crate) fn path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("checkpoint-{seq:020}.ckpt"))
}

/// The checkpoints in `dir`, newest first.
pub(crate) fn list(dir: &Path) -> io::Result<Vec<(u64, PathBuf)>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if let Some(seq) = name
            .strip_prefix("checkpoint-")
            .and_then(|s| s.strip_suffix(".ckpt"))
            .and_then(|s| s.parse::<u64>().ok())
        {
            out.push((seq, p));
        }
    }
    out.sort_by_key(|b| std::cmp::Reverse(b.0));
    Ok(out)
}

/// Writes `c` atomically into `dir`; returns its path.
pub(crate) fn write(dir: &Path, c: &Checkpoint) -> io::Result<PathBuf> {
    let archive = rkyv::to_bytes::<rancor::Error>(c).map_err(io::Error::other)?;
    let tmp = dir.join("checkpoint.tmp");
    write_framed(&tmp, MAGIC, FORMAT, &archive)?;
    super::failpoint_hold("AKER_TEST_CHECKPOINT_HOLD_MS");
    let to = path(dir, c.seq);
    std::fs::rename(&tmp, &to)?;
    sync_dir(dir)?;
    Ok(to)
}

/// Writes `magic | format | length | xxh3_64 | archive` to `p` and syncs it (the
/// caller renames it into place). The graph's manifest uses it too.
pub(crate) fn write_framed(
    p: &Path,
    magic: &[u8; 8],
    format: u32,
    archive: &[u8],
) -> io::Result<()> {
    let mut f = File::create(p)?;
    f.write_all(magic)?;
    f.write_all(&format.to_le_bytes())?;
    f.write_all(&(archive.len() as u64).to_le_bytes())?;
    f.write_all(&xxh3_64(archive).to_le_bytes())?;
    f.write_all(archive)?;
    f.sync_all()
}

/// Reads and validates a checkpoint (header, checksum, then rkyv's structural check).
pub(crate) fn read(p: &Path) -> Result<Checkpoint, CheckpointError> {
    let archive = read_framed(p, MAGIC, FORMAT)?;
    let c = rkyv::from_bytes::<Checkpoint, rancor::Error>(&archive)
        .map_err(|e| format_err(p, format!("archive: {e}")))?;
    if c.vectors.len() != c.ids.len() * c.dim as usize {
        return Err(format_err(
            p,
            format!(
                "{} ids but {} floats at dimension {}",
                c.ids.len(),
                c.vectors.len(),
                c.dim
            ),
        ));
    }
    Ok(c)
}

fn format_err(p: &Path, why: String) -> CheckpointError {
    CheckpointError::Format {
        path: p.to_path_buf(),
        why,
    }
}

/// Reads what [`write_framed`] wrote: checks the magic, the format, the length and the
/// checksum, and returns the archive (aligned for rkyv), not yet validated by rkyv.
pub(crate) fn read_framed(
    p: &Path,
    magic: &[u8; 8],
    want_format: u32,
) -> Result<AlignedVec<16>, CheckpointError> {
    let io_err = |source| CheckpointError::Io {
        path: p.to_path_buf(),
        source,
    };
    let mut f = File::open(p).map_err(io_err)?;
    let mut header = [0u8; HEADER_BYTES];
    f.read_exact(&mut header)
        .map_err(|_| format_err(p, "shorter than its header".into()))?;
    if &header[..8] != magic {
        return Err(format_err(p, "bad magic".into()));
    }
    let format = u32::from_le_bytes(header[8..12].try_into().expect("4 bytes"));
    if format != want_format {
        return Err(format_err(
            p,
            format!("format {format}, this build reads {want_format}"),
        ));
    }
    let len = u64::from_le_bytes(header[12..20].try_into().expect("8 bytes")) as usize;
    let stored = u64::from_le_bytes(header[20..28].try_into().expect("8 bytes"));
    let size = f.metadata().map_err(io_err)?.len() as usize;
    if size != HEADER_BYTES + len {
        return Err(format_err(
            p,
            format!("{size} bytes, the header says {}", HEADER_BYTES + len),
        ));
    }
    let mut archive = AlignedVec::<16>::with_capacity(len);
    archive.resize(len, 0);
    f.read_exact(&mut archive).map_err(io_err)?;
    let computed = xxh3_64(&archive);
    if computed != stored {
        return Err(CheckpointError::Checksum {
            path: p.to_path_buf(),
            stored,
            computed,
        });
    }
    Ok(archive)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("aker-ckpt-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn sample(seq: u64) -> Checkpoint {
        Checkpoint {
            format: FORMAT,
            seq,
            dim: 2,
            metric: "l2sq".into(),
            ids: vec![3, 1, 4],
            vectors: vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0],
        }
    }

    #[test]
    fn a_checkpoint_reads_back_and_the_newest_lists_first() {
        let d = dir("round");
        write(&d, &sample(5)).unwrap();
        write(&d, &sample(9)).unwrap();
        let l = list(&d).unwrap();
        assert_eq!(l.iter().map(|x| x.0).collect::<Vec<_>>(), vec![9, 5]);
        assert_eq!(read(&l[0].1).unwrap(), sample(9));
        assert!(!d.join("checkpoint.tmp").exists());
    }

    #[test]
    fn flipped_truncated_or_foreign_bytes_are_refused_with_the_reason() {
        let d = dir("bad");
        let p = write(&d, &sample(1)).unwrap();
        let good = std::fs::read(&p).unwrap();
        // A flipped bit in the vector data: rkyv alone would accept it.
        let mut flipped = good.clone();
        let last = flipped.len() - 20;
        flipped[last] ^= 1;
        std::fs::write(&p, &flipped).unwrap();
        assert!(matches!(read(&p), Err(CheckpointError::Checksum { .. })));
        std::fs::write(&p, &good[..good.len() - 1]).unwrap();
        assert!(matches!(read(&p), Err(CheckpointError::Format { .. })));
        std::fs::write(&p, b"not a checkpoint at all, just text").unwrap();
        let e = read(&p).unwrap_err().to_string();
        assert!(e.contains("bad magic"), "{e}");
        std::fs::write(&p, &good).unwrap();
        assert_eq!(read(&p).unwrap(), sample(1));
    }
}
