//! The embedded store, durable (`backend.data_dir`): a write-ahead log made durable
//! before a write is acknowledged ([`wal`]), checkpoints of every live row ([`checkpoint`]),
//! and recovery at start.
//!
//! ```text
//!  data_dir/
//!    checkpoint-<seq>.ckpt   every live row up to log seq <seq> (newest kept, one older)
//!    wal-<first seq>.log     records after the checkpoint, in the store's apply order
//!    hnsw-<seq>/             index = "hnsw": the graph of checkpoint <seq> ([`graph`])
//!
//!  start:  newest checkpoint that reads and validates (an older one if not)
//!          + every log record after its seq, segment by segment
//!          (a torn or corrupt tail of the last segment is cut off: it was never
//!           acknowledged; anything else that does not read refuses the start)
//!          first start, empty directory: the configured data imported as checkpoint 0
//!          index = "hnsw": the checkpoint's graph loaded if it verifies and its params
//!          match, the log records after it applied to it; else built from the rows,
//!          and a checkpoint with its graph written at once (the next start loads it)
//!  write:  store write lock { seq = log.append; store apply; queue to owners }
//!          log.wait_durable(seq) (group commit, outside the lock) ─► acknowledged
//!  checkpoint (log segment past backend.checkpoint_log_bytes):
//!          store read lock { log.rotate; export rows; dump the graph to hnsw-<seq>.tmp }
//!          (writes wait; searches do not)
//!          then, on its own thread: graph's checksums + manifest, synced, renamed;
//!          checkpoint written + synced + renamed; older files removed
//! ```
//!
//! A running store's writes go through [`Durable::log`] and [`Durable::made_durable`]
//! (`write.rs`), which start the checkpoints too.

pub(crate) mod checkpoint;
pub(crate) mod fingerprint;
pub(crate) mod graph;
pub(crate) mod snapshot;
pub(crate) mod wal;
mod write;

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use shards::Metric;

use checkpoint::Checkpoint;
use wal::{Op, Wal};

/// A failpoint for crash tests: sleeps for the milliseconds the environment variable
/// `var` names (at most 10 s), so that kills land inside the window it widens (between
/// a file written and its rename). Unset in production, where it costs one lookup.
pub(crate) fn failpoint_hold(var: &str) {
    let ms = std::env::var(var).ok().and_then(|v| v.parse::<u64>().ok());
    if let Some(ms) = ms {
        std::thread::sleep(std::time::Duration::from_millis(ms.min(10_000)));
    }
}

/// Why a durable store could not start.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RecoveryError {
    #[error("data_dir {dir}: {source}")]
    Io { dir: PathBuf, source: io::Error },
    #[error("data_dir {0}: no checkpoint reads back ({1}); refusing to start on partial data")]
    NoCheckpoint(PathBuf, String),
    #[error("data_dir {dir}: {why}; refusing to start")]
    Inconsistent { dir: PathBuf, why: String },
    #[error("data_dir {dir}: it holds a {got} collection, the config asks for {want}")]
    Mismatch {
        dir: PathBuf,
        got: String,
        want: String,
    },
    #[error("import: {0}")]
    Import(String),
}

/// What recovery found, for the start log and tests.
#[derive(Debug, Default, Clone)]
pub(crate) struct RecoveryReport {
    /// The checkpoint used (seq), if any.
    pub checkpoint_seq: Option<u64>,
    /// Checkpoints that did not read, with why (an older one was used).
    pub refused: Vec<String>,
    pub records_replayed: u64,
    /// Bytes cut off the last segment's torn tail.
    pub torn_bytes: u64,
    /// The directory was empty: the configured data was imported.
    pub imported: bool,
    pub rows: usize,
    pub seconds: f64,
}

/// The live rows recovered, in a stable order (checkpoint order, then log order).
pub(crate) struct Recovered {
    pub dim: usize,
    pub ids: Vec<u64>,
    /// Row-major, `ids.len() * dim`.
    pub vectors: Vec<f32>,
    pub next_seq: u64,
    pub report: RecoveryReport,
    /// The log records after the checkpoint, in order: a loaded graph (the checkpoint's
    /// state) applies them.
    pub log_tail: Vec<Op>,
}

/// Rows by id, keeping first-seen order (a replaced vector keeps its place).
struct Rows {
    dim: usize,
    order: Vec<u64>,
    data: HashMap<u64, Vec<f32>>,
    /// The log records applied over the checkpoint, in order.
    tail: Vec<Op>,
}

impl Rows {
    fn apply(&mut self, op: Op) {
        match op {
            Op::Insert { id, vector } => {
                if self.data.insert(id, vector).is_none() {
                    self.order.push(id);
                }
            }
            Op::Delete { id } => {
                self.data.remove(&id);
            }
        }
    }

    /// A log record after the checkpoint: applied, and kept for a loaded graph.
    fn replayed(&mut self, op: Op) {
        self.apply(op.clone());
        self.tail.push(op);
    }

    fn into_recovered(self, next_seq: u64, report: RecoveryReport) -> Recovered {
        let mut ids = Vec::with_capacity(self.data.len());
        let mut vectors = Vec::with_capacity(self.data.len() * self.dim);
        let mut data = self.data;
        for id in self.order {
            if let Some(v) = data.remove(&id) {
                ids.push(id);
                vectors.extend_from_slice(&v);
            }
        }
        Recovered {
            dim: self.dim,
            ids,
            vectors,
            next_seq,
            report: RecoveryReport { rows: 0, ..report },
            log_tail: self.tail,
        }
        .counted()
    }
}

impl Recovered {
    fn counted(mut self) -> Recovered {
        self.report.rows = self.ids.len();
        self
    }
}

/// Recovers `dir` (created if missing). An empty directory imports `import()`'s rows
/// (ids are row numbers) as checkpoint 0.
pub(crate) fn recover(
    dir: &Path,
    dim: Option<usize>,
    metric: Metric,
    import: impl FnOnce() -> Result<(usize, Vec<f32>), String>,
) -> Result<Recovered, RecoveryError> {
    let t = Instant::now();
    let io_err = |source| RecoveryError::Io {
        dir: dir.to_path_buf(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(io_err)?;
    let _ = std::fs::remove_file(dir.join("checkpoint.tmp"));
    let checkpoints = checkpoint::list(dir).map_err(io_err)?;
    let kept: Vec<u64> = checkpoints.iter().map(|c| c.0).collect();
    graph::remove_unkept(dir, &kept).map_err(io_err)?;
    let segments = wal::segments(dir).map_err(io_err)?;
    let mut report = RecoveryReport::default();
    if checkpoints.is_empty() && segments.is_empty() {
        let (d, data) = import().map_err(RecoveryError::Import)?;
        let ids: Vec<u64> = (0..(data.len() / d.max(1)) as u64).collect();
        let c = Checkpoint {
            format: checkpoint::FORMAT,
            seq: 0,
            dim: d as u32,
            metric: metric.to_string(),
            ids: ids.clone(),
            vectors: data,
        };
        checkpoint::write(dir, &c).map_err(io_err)?;
        report.imported = true;
        report.checkpoint_seq = Some(0);
        report.seconds = t.elapsed().as_secs_f64();
        return Ok(Recovered {
            dim: d,
            ids,
            vectors: c.vectors,
            next_seq: 1,
            report,
            log_tail: Vec::new(),
        }
        .counted());
    }
    let mut base = None;
    for (seq, p) in &checkpoints {
        match checkpoint::read(p) {
            Ok(c) => {
                base = Some(c);
                break;
            }
            Err(e) => {
                tracing::error!(error = %e, seq, "checkpoint refused");
                report.refused.push(e.to_string());
            }
        }
    }
    let Some(base) = base else {
        return Err(RecoveryError::NoCheckpoint(
            dir.to_path_buf(),
            report.refused.join("; "),
        ));
    };
    check_matches(dir, &base, dim, metric)?;
    report.checkpoint_seq = Some(base.seq);
    // A newer checkpoint that did not read stood for records up to its seq: the log
    // must still hold them all, or acknowledged writes would be silently dropped.
    let must_reach = checkpoints.first().map_or(base.seq, |c| c.0);
    let d = base.dim as usize;
    let mut rows = Rows {
        dim: d,
        order: Vec::with_capacity(base.ids.len()),
        data: HashMap::with_capacity(base.ids.len()),
        tail: Vec::new(),
    };
    for (id, v) in base.ids.iter().zip(base.vectors.chunks_exact(d.max(1))) {
        rows.apply(Op::Insert {
            id: *id,
            vector: v.to_vec(),
        });
    }
    let last = replay(dir, &segments, base.seq, d, &mut rows, &mut report)?;
    if last < must_reach {
        return Err(RecoveryError::Inconsistent {
            dir: dir.to_path_buf(),
            why: format!(
                "checkpoint {must_reach} does not read and the log after checkpoint {} ends at \
                 seq {last}: the writes in between are in neither",
                base.seq
            ),
        });
    }
    report.seconds = t.elapsed().as_secs_f64();
    Ok(rows.into_recovered(last + 1, report))
}

fn check_matches(
    dir: &Path,
    c: &Checkpoint,
    dim: Option<usize>,
    metric: Metric,
) -> Result<(), RecoveryError> {
    let dim_ok = dim.is_none_or(|d| d == c.dim as usize);
    if !dim_ok || c.metric != metric.to_string() {
        return Err(RecoveryError::Mismatch {
            dir: dir.to_path_buf(),
            got: format!("{}-d {}", c.dim, c.metric),
            want: format!(
                "{} {metric}",
                dim.map_or("any-d".into(), |d| format!("{d}-d"))
            ),
        });
    }
    Ok(())
}

/// Applies every record after `after` from the segments, in order; returns the last
/// seq. Only the last segment may end in a torn tail (cut off here).
fn replay(
    dir: &Path,
    segments: &[(u64, PathBuf)],
    after: u64,
    dim: usize,
    rows: &mut Rows,
    report: &mut RecoveryReport,
) -> Result<u64, RecoveryError> {
    let bad = |why: String| RecoveryError::Inconsistent {
        dir: dir.to_path_buf(),
        why,
    };
    let mut last = after;
    // The log must start at or before the first record the checkpoint lacks.
    let first_needed = segments.iter().rposition(|(first, _)| *first <= after + 1);
    if let (Some((first, path)), None) = (segments.first(), first_needed) {
        return Err(bad(format!(
            "{} starts at seq {first}, after {}: records after checkpoint {after} are missing",
            path.display(),
            after + 1
        )));
    }
    for (i, (_, path)) in segments.iter().enumerate().skip(first_needed.unwrap_or(0)) {
        let read = wal::read_segment(path).map_err(|source| RecoveryError::Io {
            dir: dir.to_path_buf(),
            source,
        })?;
        if read.valid_after > 0 {
            // Valid records behind bad bytes: the bad ones were synced with them (a sync
            // covers everything written before it), so this is corruption, and cutting
            // it would drop acknowledged writes. The operator decides.
            return Err(bad(format!(
                "{} is corrupt at byte {}: {} unreadable bytes with {} valid records \
                 after them; the file is left as it is (truncating it to {} bytes would \
                 start from the records before, losing those after)",
                path.display(),
                read.valid_bytes,
                read.torn_bytes,
                read.valid_after,
                read.valid_bytes
            )));
        }
        if read.torn_bytes > 0 {
            if i + 1 != segments.len() {
                return Err(bad(format!(
                    "{} has {} unreadable bytes and later segments follow it",
                    path.display(),
                    read.torn_bytes
                )));
            }
            tracing::warn!(
                segment = %path.display(),
                bytes = read.torn_bytes,
                "log: torn tail cut off (writes never acknowledged)"
            );
            wal::truncate(path, read.valid_bytes).map_err(|source| RecoveryError::Io {
                dir: dir.to_path_buf(),
                source,
            })?;
            report.torn_bytes += read.torn_bytes;
        }
        for r in read.records {
            if r.seq <= last {
                continue;
            }
            if r.seq != last + 1 {
                return Err(bad(format!(
                    "log records jump from seq {last} to {} in {}",
                    r.seq,
                    path.display()
                )));
            }
            if let Op::Insert { vector, .. } = &r.op {
                if vector.len() != dim {
                    return Err(bad(format!("record {} is {}-d", r.seq, vector.len())));
                }
            }
            rows.replayed(r.op);
            last = r.seq;
            report.records_replayed += 1;
        }
    }
    Ok(last)
}

/// Takes `dir/LOCK` exclusively (flock) for as long as the file is open: one process
/// owns a data directory, a second one is refused instead of interleaving its log.
pub(crate) fn lock_dir(dir: &Path) -> io::Result<std::fs::File> {
    std::fs::create_dir_all(dir)?;
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join("LOCK"))?;
    use std::os::fd::AsRawFd;
    // SAFETY: flock on a descriptor this function owns.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(io::Error::other(format!(
            "{} is in use by another process ({})",
            dir.display(),
            io::Error::last_os_error()
        )));
    }
    Ok(f)
}

/// The durable side of a running store: its log, and checkpoints when it grows.
pub(crate) struct Durable {
    dir: PathBuf,
    pub wal: Wal,
    metric: Metric,
    checkpoint_log_bytes: u64,
    checkpointing: Arc<AtomicBool>,
    pub checkpoints_written: Arc<AtomicU64>,
    /// The store's HNSW graph was loaded from the checkpoint at start (not built).
    pub graph_loaded: AtomicBool,
    /// Writers take it before the store's write lock; a checkpoint holds it while it
    /// rotates and exports under the read lock, so no writer waits on the store's lock
    /// then (a waiting writer would hold every new search behind it).
    pub gate: std::sync::Mutex<()>,
    thread: std::sync::Mutex<Option<std::thread::JoinHandle<()>>>,
    _lock: std::fs::File,
}

impl Durable {
    /// After `recover`: appends from `next_seq` on.
    pub(crate) fn open(
        dir: &Path,
        lock: std::fs::File,
        next_seq: u64,
        metric: Metric,
        checkpoint_log_bytes: u64,
    ) -> io::Result<Durable> {
        Ok(Durable {
            dir: dir.to_path_buf(),
            wal: Wal::open(dir, next_seq)?,
            metric,
            checkpoint_log_bytes,
            checkpointing: Arc::new(AtomicBool::new(false)),
            checkpoints_written: Arc::new(AtomicU64::new(0)),
            graph_loaded: AtomicBool::new(false),
            gate: std::sync::Mutex::new(()),
            thread: std::sync::Mutex::new(None),
            _lock: lock,
        })
    }

    /// Waits for a checkpoint being written (shutdown).
    pub(crate) fn finish(&self) {
        let t = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = t {
            let _ = t.join();
        }
    }

    /// Whether the log's segment has grown past the checkpoint size (and none runs).
    pub(crate) fn checkpoint_due(&self) -> bool {
        self.checkpoint_log_bytes > 0
            && self.wal.segment_bytes() >= self.checkpoint_log_bytes
            && !self.checkpointing.load(Ordering::Acquire)
    }

    /// Claims the one checkpoint that may run; false when one runs. The claimer calls
    /// `wal.rotate()`, exports the rows under the store's lock, then `checkpoint` (or
    /// `abandon`).
    pub(crate) fn begin_checkpoint(&self) -> bool {
        !self.checkpointing.swap(true, Ordering::AcqRel)
    }

    /// Gives a claimed checkpoint up (rotation or export failed).
    pub(crate) fn abandon_checkpoint(&self) {
        self.checkpointing.store(false, Ordering::Release);
    }

    /// Writes the claimed checkpoint of `rows` (exported right after `wal.rotate()`
    /// returned `seq`, with the graph dumped then, if any) on its own thread.
    pub(crate) fn checkpoint(
        &self,
        seq: u64,
        dim: usize,
        rows: Vec<(u64, Arc<[f32]>)>,
        graph: Option<graph::Dumped>,
    ) -> bool {
        debug_assert!(self.checkpointing(), "claimed with begin_checkpoint");
        let (dir, metric) = (self.dir.clone(), self.metric);
        let (flag, written) = (self.checkpointing.clone(), self.checkpoints_written.clone());
        let spawned = std::thread::Builder::new()
            .name("aker-checkpoint".into())
            .spawn(move || {
                match write_checkpoint(&dir, seq, dim, metric, rows, graph) {
                    Ok(()) => {
                        written.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => tracing::error!(error = %e, seq, "checkpoint failed (the log keeps every write)"),
                }
                flag.store(false, Ordering::Release);
            });
        match spawned {
            Ok(t) => {
                let old = self
                    .thread
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .replace(t);
                if let Some(old) = old {
                    let _ = old.join(); // finished: the flag was clear
                }
                true
            }
            Err(_) => {
                self.checkpointing.store(false, Ordering::Release);
                false
            }
        }
    }

    /// Dumps `store`'s graph for the checkpoint at `seq` when it is an HNSW store; call
    /// it with writers excluded. A failed dump is logged: the checkpoint goes without.
    pub(crate) fn dump_graph(
        &self,
        seq: u64,
        store: &dyn shards::Backend,
    ) -> Option<graph::Dumped> {
        // An empty store has no graph to dump, and builds at once.
        let hnsw = store.as_hnsw().filter(|_| !store.is_empty())?;
        let t = Instant::now();
        match graph::dump(&self.dir, seq, hnsw) {
            Ok(d) => {
                tracing::info!(
                    seq,
                    secs = t.elapsed().as_secs_f64(),
                    "graph dumped for a checkpoint"
                );
                Some(d)
            }
            Err(e) => {
                tracing::warn!(error = %e, seq, "graph not dumped (the checkpoint goes without it)");
                None
            }
        }
    }

    /// Whether a checkpoint is being written.
    pub(crate) fn checkpointing(&self) -> bool {
        self.checkpointing.load(Ordering::Acquire)
    }
}

/// Writes the checkpoint at `seq` (its graph first, when dumped: see [`graph`]), then
/// removes what it makes redundant: segments all of whose records it holds, and
/// checkpoints older than the previous one, with their graphs. A graph that fails to
/// commit is logged and left out: the rows are what recovery needs.
pub(crate) fn write_checkpoint(
    dir: &Path,
    seq: u64,
    dim: usize,
    metric: Metric,
    rows: Vec<(u64, Arc<[f32]>)>,
    graph: Option<graph::Dumped>,
) -> io::Result<()> {
    let t = Instant::now();
    let with_graph = match graph.map(|g| graph::commit(dir, g)) {
        Some(Ok(_)) => true,
        Some(Err(e)) => {
            tracing::warn!(error = %e, seq, "checkpoint's graph not saved (the next start rebuilds it)");
            false
        }
        None => false,
    };
    let mut ids = Vec::with_capacity(rows.len());
    let mut vectors = Vec::with_capacity(rows.len() * dim);
    for (id, v) in rows {
        ids.push(id);
        vectors.extend_from_slice(&v);
    }
    let n = ids.len();
    let c = Checkpoint {
        format: checkpoint::FORMAT,
        seq,
        dim: dim as u32,
        metric: metric.to_string(),
        ids,
        vectors,
    };
    checkpoint::write(dir, &c)?;
    // Two checkpoints are kept, and the log back to the older one, so that recovery
    // can fall back on it if the newer one does not read. Segments start at their
    // first seq: one goes when the next one starts at or before older + 1.
    let kept = checkpoint::list(dir)?;
    for (_, p) in kept.iter().skip(2) {
        std::fs::remove_file(p)?;
    }
    let seqs: Vec<u64> = kept.iter().take(2).map(|c| c.0).collect();
    graph::remove_unkept(dir, &seqs)?;
    let older = kept.get(1).map_or(0, |c| c.0);
    let segs = wal::segments(dir)?;
    for w in segs.windows(2) {
        if w[1].0 <= older + 1 {
            std::fs::remove_file(&w[0].1)?;
        }
    }
    wal::sync_dir(dir)?;
    tracing::info!(
        seq,
        rows = n,
        graph = with_graph,
        secs = t.elapsed().as_secs_f64(),
        "checkpoint written"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("aker-durable-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    fn import() -> Result<(usize, Vec<f32>), String> {
        Ok((2, vec![0.0, 0.0, 1.0, 1.0, 2.0, 2.0]))
    }

    fn ids(r: &Recovered) -> Vec<u64> {
        r.ids.clone()
    }

    #[test]
    fn first_start_imports_then_the_log_replays_over_the_checkpoint() {
        let d = dir("replay");
        let r = recover(&d, Some(2), Metric::L2Sq, import).unwrap();
        assert!(r.report.imported);
        assert_eq!((ids(&r), r.next_seq), (vec![0, 1, 2], 1));
        let dur = Durable::open(&d, lock_dir(&d).unwrap(), r.next_seq, Metric::L2Sq, 0).unwrap();
        dur.wal.append(&Op::Delete { id: 1 }).unwrap();
        let s = dur
            .wal
            .append(&Op::Insert {
                id: 9,
                vector: vec![5.0, 5.0],
            })
            .unwrap();
        dur.wal.wait_durable(s).unwrap();
        drop(dur);
        let again = recover(&d, Some(2), Metric::L2Sq, || Err("not again".into())).unwrap();
        assert!(!again.report.imported);
        assert_eq!(ids(&again), vec![0, 2, 9]);
        assert_eq!(&again.vectors[4..], &[5.0, 5.0]);
        assert_eq!((again.report.records_replayed, again.next_seq), (2, 3));
    }

    #[test]
    fn a_checkpoint_makes_old_segments_go_and_recovery_uses_it() {
        let d = dir("ckpt");
        let r = recover(&d, Some(2), Metric::L2Sq, import).unwrap();
        let dur = Durable::open(&d, lock_dir(&d).unwrap(), r.next_seq, Metric::L2Sq, 0).unwrap();
        let s = dur.wal.append(&Op::Delete { id: 0 }).unwrap();
        dur.wal.wait_durable(s).unwrap();
        let seq = dur.wal.rotate().unwrap();
        let rows: Vec<(u64, Arc<[f32]>)> = vec![
            (1, Arc::from(&[1.0f32, 1.0][..])),
            (2, Arc::from(&[2.0f32, 2.0][..])),
        ];
        write_checkpoint(&d, seq, 2, Metric::L2Sq, rows, None).unwrap();
        let s = dur.wal.append(&Op::Delete { id: 2 }).unwrap();
        dur.wal.wait_durable(s).unwrap();
        drop(dur);
        // Checkpoint 0 is kept, and with it the log back to it.
        assert_eq!(wal::segments(&d).unwrap().len(), 2);
        let again = recover(&d, Some(2), Metric::L2Sq, || Err("no".into())).unwrap();
        assert_eq!(again.report.checkpoint_seq, Some(1));
        assert_eq!(ids(&again), vec![1]);
        // The newer checkpoint rots: the older one and the kept log give the same rows.
        let newest = checkpoint::list(&d).unwrap()[0].1.clone();
        let mut b = std::fs::read(&newest).unwrap();
        let at = b.len() - 5;
        b[at] ^= 0x08;
        std::fs::write(&newest, &b).unwrap();
        let fallback = recover(&d, Some(2), Metric::L2Sq, || Err("no".into())).unwrap();
        assert_eq!(fallback.report.checkpoint_seq, Some(0));
        assert_eq!(fallback.report.refused.len(), 1);
        assert_eq!(ids(&fallback), vec![1]);
        // Without the log back to it, the fallback is refused, never silently short.
        std::fs::remove_file(&wal::segments(&d).unwrap()[0].1).unwrap();
        let e = recover(&d, Some(2), Metric::L2Sq, || Err("no".into()))
            .err()
            .unwrap();
        assert!(matches!(e, RecoveryError::Inconsistent { .. }), "{e}");
    }

    #[test]
    fn a_second_process_cannot_take_the_directory() {
        let d = dir("lock");
        let first = lock_dir(&d).unwrap();
        assert!(lock_dir(&d).is_err());
        drop(first);
        lock_dir(&d).unwrap();
    }

    #[test]
    fn corruption_is_refused_or_falls_back_and_never_panics() {
        let d = dir("corrupt");
        let r = recover(&d, Some(2), Metric::L2Sq, import).unwrap();
        let dur = Durable::open(&d, lock_dir(&d).unwrap(), r.next_seq, Metric::L2Sq, 0).unwrap();
        for id in [0, 1] {
            let s = dur.wal.append(&Op::Delete { id }).unwrap();
            dur.wal.wait_durable(s).unwrap();
        }
        drop(dur);
        // A torn tail: the last record is cut, the first survives.
        let seg = wal::segments(&d).unwrap()[0].1.clone();
        let bytes = std::fs::read(&seg).unwrap();
        std::fs::write(&seg, &bytes[..bytes.len() - 2]).unwrap();
        let torn = recover(&d, Some(2), Metric::L2Sq, || Err("no".into())).unwrap();
        assert_eq!(ids(&torn), vec![1, 2]);
        assert!(torn.report.torn_bytes > 0);
        // A flipped byte inside the log with acknowledged records after it: refused
        // (not cut), and the file is left untouched.
        let dur = Durable::open(&d, lock_dir(&d).unwrap(), torn.next_seq, Metric::L2Sq, 0).unwrap();
        for id in [1, 2] {
            let s = dur.wal.append(&Op::Delete { id }).unwrap();
            dur.wal.wait_durable(s).unwrap();
        }
        drop(dur);
        let seg = wal::segments(&d).unwrap().last().unwrap().1.clone();
        let good = std::fs::read(&seg).unwrap();
        let mut flipped = good.clone();
        flipped[14] ^= 0x01;
        std::fs::write(&seg, &flipped).unwrap();
        let e = recover(&d, Some(2), Metric::L2Sq, || Err("no".into()))
            .err()
            .unwrap();
        assert!(e.to_string().contains("corrupt at byte 0"), "{e}");
        assert_eq!(std::fs::read(&seg).unwrap(), flipped, "left as it is");
        std::fs::write(&seg, &good).unwrap();
        // The only checkpoint flipped: nothing safe remains, the start is refused.
        let ck = checkpoint::list(&d).unwrap()[0].1.clone();
        let mut c = std::fs::read(&ck).unwrap();
        let at = c.len() - 30;
        c[at] ^= 0x10;
        std::fs::write(&ck, &c).unwrap();
        let e = recover(&d, Some(2), Metric::L2Sq, || Err("no".into()))
            .err()
            .unwrap();
        assert!(e.to_string().contains("checksum"), "{e}");
        // Another collection's directory is refused too.
        let d2 = dir("other");
        recover(&d2, Some(2), Metric::L2Sq, import).unwrap();
        let e = recover(&d2, Some(3), Metric::L2Sq, import).err().unwrap();
        assert!(matches!(e, RecoveryError::Mismatch { .. }), "{e}");
    }
}
