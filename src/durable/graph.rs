//! The HNSW graph beside a checkpoint, so that a start loads it instead of rebuilding
//! it (GloVe's 400k x 50: 100-238 s to build).
//!
//! ```text
//!  data_dir/hnsw-<seq>/        the graph of the store checkpoint-<seq> holds
//!    graph.hnsw.graph          hnsw_rs's dump: links, data ids, entry point
//!    graph.hnsw.data           hnsw_rs's dump: every point's vector (dead ones too)
//!    manifest                  magic "AKERHNS\0" | format | length | xxh3_64 | rkyv Manifest
//!                              (ids per internal point, tombstones, params, and the
//!                               two files' lengths and xxh3_64)
//! ```
//!
//! Written: [`dump`] into `hnsw-<seq>.tmp/` while writers are excluded (the caller holds
//! the store's read lock: searches go on); then [`commit`], on the checkpoint's thread,
//! sums the files, writes the manifest, syncs them and renames the directory into place
//! *before* the checkpoint's own rename: a checkpoint never stands beside half a graph
//! (a crash in between leaves a graph with no checkpoint, removed by the next one).
//! Read: [`load`] verifies the manifest's checksum, the seq, the params against the
//! configuration and both files' checksums before hnsw_rs reads a byte of them: hnsw_rs
//! asserts, panics or exits the process on bad input, so no unverified byte reaches it.
//!
//! The vectors are on disk twice (the checkpoint's rows and hnsw_rs's data file, which
//! its dump always writes): the rows stay the source of truth (a rebuild needs only
//! them), and the loaded store takes every point's vector from the graph's data file,
//! which holds the dead points' too (the graph links through them).

use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use rkyv::rancor;
use shards::store::{HnswParams, HnswSaved, HnswStore};
use shards::Metric;
use xxhash_rust::xxh3::Xxh3;

use super::checkpoint::{read_framed, write_framed, CheckpointError};
use super::wal::sync_dir;

const MAGIC: &[u8; 8] = b"AKERHNS\0";
/// The manifest format this build writes and reads.
pub(crate) const FORMAT: u32 = 1;
/// hnsw_rs's file names inside a graph directory: `graph.hnsw.graph`, `graph.hnsw.data`.
const BASENAME: &str = "graph";
const FILES: [&str; 2] = ["graph.hnsw.graph", "graph.hnsw.data"];
const MANIFEST: &str = "manifest";

/// What the store keeps beside its graph, and how to know the graph's files.
#[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, Debug, Clone, PartialEq)]
pub(crate) struct Manifest {
    pub format: u32,
    /// The checkpoint this graph belongs to.
    pub seq: u64,
    pub dim: u32,
    /// The metric's name (`shards::Metric`'s `Display`).
    pub metric: String,
    pub m: u32,
    pub ef_construction: u32,
    pub max_layer: u32,
    /// Internal point number -> external id, dead points included.
    pub ids: Vec<u64>,
    /// Tombstoned internal points, ascending.
    pub dead: Vec<u64>,
    pub files: Vec<FileSum>,
}

/// One hnsw_rs file's length and xxh3_64.
#[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, Debug, Clone, PartialEq)]
pub(crate) struct FileSum {
    pub name: String,
    pub bytes: u64,
    pub xxh3: u64,
}

/// Why a saved graph is not used (the store is then built from the rows).
#[derive(Debug, thiserror::Error)]
pub(crate) enum GraphError {
    #[error("no graph saved with checkpoint {0}")]
    Missing(u64),
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("manifest: {0}")]
    Manifest(#[from] CheckpointError),
    #[error("{path}: {why}")]
    Corrupt { path: PathBuf, why: String },
    #[error("saved with {saved}, the configuration asks for {want}")]
    Mismatch { saved: String, want: String },
    #[error("{0}")]
    Load(String),
}

/// A graph dumped into its temporary directory, not yet committed.
pub(crate) struct Dumped {
    pub seq: u64,
    tmp: PathBuf,
    saved: HnswSaved,
}

/// `hnsw-<seq>` in `dir`.
pub(crate) fn path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("hnsw-{seq:020}"))
}

fn tmp_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("hnsw-{seq:020}.tmp"))
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> GraphError + '_ {
    move |source| GraphError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Dumps `store`'s graph for the checkpoint at `seq`. Call it while writers are
/// excluded (the store's read lock), so the graph and the rows exported with it agree;
/// what that costs writers is the dump's time: 1.21 s for GloVe's 400k x 50 (m 16,
/// release, bench/results/durable.md), while searches go on.
pub(crate) fn dump(dir: &Path, seq: u64, store: &HnswStore) -> Result<Dumped, GraphError> {
    let tmp = tmp_path(dir, seq);
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(io_err(&tmp))?;
    match store.save(&tmp, BASENAME) {
        Ok(saved) => Ok(Dumped { seq, tmp, saved }),
        Err(e) => {
            let _ = std::fs::remove_dir_all(&tmp);
            Err(GraphError::Load(e.to_string()))
        }
    }
}

/// Sums and syncs the dumped files, writes the manifest and renames the directory to
/// `hnsw-<seq>` (replacing one there), then syncs `dir`. Call it before the checkpoint
/// at the same seq is renamed into place.
pub(crate) fn commit(dir: &Path, d: Dumped) -> io::Result<PathBuf> {
    let done = commit_files(dir, &d);
    if done.is_err() {
        let _ = std::fs::remove_dir_all(&d.tmp);
    }
    done
}

fn commit_files(dir: &Path, d: &Dumped) -> io::Result<PathBuf> {
    let mut files = Vec::with_capacity(FILES.len());
    for name in FILES {
        let p = d.tmp.join(name);
        File::open(&p)?.sync_all()?;
        let (bytes, xxh3) = sum(&p)?;
        files.push(FileSum {
            name: name.into(),
            bytes,
            xxh3,
        });
    }
    let m = manifest(d, files);
    let archive = rkyv::to_bytes::<rancor::Error>(&m).map_err(io::Error::other)?;
    write_framed(&d.tmp.join(MANIFEST), MAGIC, FORMAT, &archive)?;
    sync_dir(&d.tmp)?;
    let to = path(dir, d.seq);
    if to.exists() {
        std::fs::remove_dir_all(&to)?;
    }
    std::fs::rename(&d.tmp, &to)?;
    sync_dir(dir)?;
    Ok(to)
}

fn manifest(d: &Dumped, files: Vec<FileSum>) -> Manifest {
    let p = d.saved.params;
    Manifest {
        format: FORMAT,
        seq: d.seq,
        dim: p.dim as u32,
        metric: p.metric.to_string(),
        m: p.m as u32,
        ef_construction: p.ef_construction as u32,
        max_layer: p.max_layer as u32,
        ids: d.saved.ids.clone(),
        dead: d.saved.dead.clone(),
        files,
    }
}

/// A file's length and xxh3_64, read in 1 MiB blocks.
fn sum(p: &Path) -> io::Result<(u64, u64)> {
    let mut f = File::open(p)?;
    let mut h = Xxh3::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut bytes = 0u64;
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            return Ok((bytes, h.digest()));
        }
        h.update(&buf[..n]);
        bytes += n as u64;
    }
}

/// Loads the graph saved with checkpoint `seq`, if its manifest and files verify and it
/// was built with `want`'s params.
pub(crate) fn load(
    dir: &Path,
    seq: u64,
    want: HnswParams,
    ef_search: usize,
) -> Result<HnswStore, GraphError> {
    let at = path(dir, seq);
    let mp = at.join(MANIFEST);
    if !mp.exists() {
        return Err(GraphError::Missing(seq));
    }
    let m = read_manifest(&mp)?;
    if m.seq != seq {
        return Err(corrupt(
            &mp,
            format!("names checkpoint {}, not {seq}", m.seq),
        ));
    }
    let saved = saved_of(&m).map_err(|why| corrupt(&mp, why))?;
    if saved.params != want {
        return Err(GraphError::Mismatch {
            saved: describe(&saved.params),
            want: describe(&want),
        });
    }
    verify_files(&at, &m)?;
    HnswStore::load(&at, BASENAME, &saved, ef_search).map_err(|e| GraphError::Load(e.to_string()))
}

fn corrupt(path: &Path, why: String) -> GraphError {
    GraphError::Corrupt {
        path: path.to_path_buf(),
        why,
    }
}

fn describe(p: &HnswParams) -> String {
    format!(
        "{}-d {} m {} ef_construction {} max_layer {}",
        p.dim, p.metric, p.m, p.ef_construction, p.max_layer
    )
}

fn read_manifest(p: &Path) -> Result<Manifest, GraphError> {
    let archive = read_framed(p, MAGIC, FORMAT)?;
    rkyv::from_bytes::<Manifest, rancor::Error>(&archive)
        .map_err(|e| corrupt(p, format!("archive: {e}")))
}

fn saved_of(m: &Manifest) -> Result<HnswSaved, String> {
    let metric: Metric = m.metric.parse()?;
    Ok(HnswSaved {
        params: HnswParams {
            dim: m.dim as usize,
            metric,
            m: m.m as usize,
            ef_construction: m.ef_construction as usize,
            max_layer: m.max_layer as usize,
        },
        ids: m.ids.clone(),
        dead: m.dead.clone(),
    })
}

/// Both hnsw_rs files are there with the manifest's lengths and checksums.
fn verify_files(at: &Path, m: &Manifest) -> Result<(), GraphError> {
    let names: Vec<&str> = m.files.iter().map(|f| f.name.as_str()).collect();
    if names != FILES {
        return Err(corrupt(at, format!("manifest lists {names:?}")));
    }
    for f in &m.files {
        let p = at.join(&f.name);
        let (bytes, xxh3) = sum(&p).map_err(io_err(&p))?;
        if (bytes, xxh3) != (f.bytes, f.xxh3) {
            return Err(corrupt(
                &p,
                format!(
                    "{bytes} bytes with xxh3 {xxh3:016x}, the manifest says {} bytes with \
                     {:016x}: the file is corrupt",
                    f.bytes, f.xxh3
                ),
            ));
        }
    }
    Ok(())
}

/// Removes graph directories (and leftover temporary ones) of checkpoints not in `kept`.
pub(crate) fn remove_unkept(dir: &Path, kept: &[u64]) -> io::Result<()> {
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let Some(rest) = name.strip_prefix("hnsw-") else {
            continue;
        };
        let keep = rest.parse::<u64>().is_ok_and(|seq| kept.contains(&seq));
        if !keep && p.is_dir() {
            std::fs::remove_dir_all(&p)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use shards::Backend;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("aker-graph-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn store() -> HnswStore {
        let data: Vec<f32> = (0..600 * 4)
            .map(|i| ((i * 7919) % 1000) as f32 / 100.0)
            .collect();
        let mut s = HnswStore::build(4, Metric::L2Sq, &data, 8, 40, 32).unwrap();
        s.delete(3).unwrap();
        s.insert(5, &[1.0, 2.0, 3.0, 4.0]).unwrap();
        s
    }

    fn saved(d: &Path, seq: u64, s: &HnswStore) -> PathBuf {
        commit(d, dump(d, seq, s).unwrap()).unwrap()
    }

    #[test]
    fn a_committed_graph_loads_with_its_params_only() {
        let d = dir("round");
        let s = store();
        let at = saved(&d, 7, &s);
        assert_eq!(at, path(&d, 7));
        assert!(!tmp_path(&d, 7).exists());
        let l = load(&d, 7, s.params(), 32).unwrap();
        assert_eq!(l.export(), s.export());
        let q = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(l.search(&q, 5).unwrap(), s.search(&q, 5).unwrap());
        assert!(matches!(
            load(&d, 8, s.params(), 32),
            Err(GraphError::Missing(8))
        ));
        let other = HnswParams {
            m: 16,
            ..s.params()
        };
        let e = load(&d, 7, other, 32).err().unwrap();
        assert!(matches!(e, GraphError::Mismatch { .. }), "{e}");
        // Saved again at the same seq (a rebuild at start): replaced.
        saved(&d, 7, &s);
        load(&d, 7, s.params(), 32).unwrap();
    }

    #[test]
    fn flipped_or_truncated_files_are_caught_before_hnsw_rs_reads_them() {
        let d = dir("bad");
        let s = store();
        let at = saved(&d, 1, &s);
        for name in FILES {
            let p = at.join(name);
            let good = std::fs::read(&p).unwrap();
            let mut flipped = good.clone();
            let mid = flipped.len() / 2;
            flipped[mid] ^= 0x04;
            std::fs::write(&p, &flipped).unwrap();
            let e = load(&d, 1, s.params(), 32).err().unwrap();
            assert!(e.to_string().contains("corrupt"), "{name}: {e}");
            std::fs::write(&p, &good[..good.len() - 3]).unwrap();
            let e = load(&d, 1, s.params(), 32).err().unwrap();
            assert!(matches!(e, GraphError::Corrupt { .. }), "{name}: {e}");
            std::fs::remove_file(&p).unwrap();
            assert!(matches!(
                load(&d, 1, s.params(), 32),
                Err(GraphError::Io { .. })
            ));
            std::fs::write(&p, &good).unwrap();
        }
        let m = at.join(MANIFEST);
        let good = std::fs::read(&m).unwrap();
        let mut flipped = good.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 0x01;
        std::fs::write(&m, &flipped).unwrap();
        let e = load(&d, 1, s.params(), 32).err().unwrap();
        assert!(e.to_string().contains("checksum"), "{e}");
        std::fs::write(&m, &good).unwrap();
        load(&d, 1, s.params(), 32).unwrap();
    }

    #[test]
    fn graphs_of_unkept_checkpoints_go() {
        let d = dir("unkept");
        let s = store();
        for seq in [1, 2, 3] {
            saved(&d, seq, &s);
        }
        std::fs::create_dir_all(tmp_path(&d, 4)).unwrap();
        remove_unkept(&d, &[3, 2]).unwrap();
        let left: Vec<bool> = (1..=4).map(|q| path(&d, q).exists()).collect();
        assert_eq!(left, vec![false, true, true, false]);
        assert!(!tmp_path(&d, 4).exists());
    }
}
