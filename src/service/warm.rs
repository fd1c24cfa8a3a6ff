//! The cache's warm restart (durable store only): taking the snapshot while serving,
//! and restoring it at start before the first reply.
//!
//! ```text
//!  take:    log gate (writers wait; searches and hits do not) {
//!             seq = last logged write; router + pool shares;
//!             Export queued to every owner (behind every write <= seq, ahead of any after)
//!           }
//!           wait until seq is durable; collect the images; write tmp + sync;
//!           { file lock: no FLUSH began meanwhile ? rename : discard }
//!  restore: router from its image, pool shares, every shard's entries (validated) and
//!           insert log, then the log's records after seq: deletes, inserts through the
//!           refresh path; a snapshot of the result at once when there were any
//!  FLUSH:   flushes += 1 (odd: one runs); { file lock: remove the snapshot, on a thread }
//!           ... flushes += 1 (a guard: also when the FLUSH is cancelled)
//! ```
//! Why the gate: a write holds it from its log append until it is queued to every owner,
//! so the images reflect exactly the writes up to `seq`. Why wait for `seq` to be durable:
//! a snapshot reflecting a write the log then loses (a torn, never acknowledged tail)
//! would serve an id the store does not hold; recovery refuses a snapshot past its log.

// Control plane: a snapshot's rename against a FLUSH.
use std::sync::Mutex;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use shards::owner::OwnerMsg;
use shards::router::Router;
use shards::sharded::ShardSet;
use shards::snapshot::RestoreReport;

use super::pgvector::changes::ChangeFeed;
use super::Shared;
use crate::durable::fingerprint;
use crate::durable::snapshot::{self as file, CacheSnapshot, WarmStart};
use crate::durable::wal::Op;

/// Longest wait for a shard's owner to hand its image over.
const EXPORT_WAIT: Duration = Duration::from_secs(60);

/// Longest wait at shutdown for a snapshot already being taken, before taking one.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(60);

/// The snapshot's place and what coordinates it with FLUSH.
pub(crate) struct SnapshotState {
    pub(crate) dir: PathBuf,
    pub(crate) collection: u64,
    pub(crate) on_shutdown: bool,
    /// What the snapshot records of the configuration (`durable::fingerprint`).
    pub(crate) settings: u64,
    pub(crate) capacity: u64,
    /// Incremented when a FLUSH begins and when it ends: odd while one runs.
    flushes: AtomicU64,
    /// A snapshot holds it to install its file, a FLUSH to remove it.
    file_lock: Mutex<()>,
    running: AtomicBool,
    pub(crate) written: AtomicU64,
    pub(crate) failed: AtomicU64,
    pub(crate) last_seq: AtomicU64,
    /// `f64` bits of the last snapshot's seconds.
    pub(crate) last_secs_bits: AtomicU64,
    /// What the start restored (entries), for /metrics.
    pub(crate) restored: AtomicU64,
    /// pgvector: the data directory's lock, held while akerd runs (the durable store
    /// holds its own).
    pub(crate) dir_lock: Option<std::fs::File>,
}

/// What one snapshot wrote.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SnapshotReport {
    pub seq: u64,
    pub entries: usize,
    pub aliases: usize,
    pub bytes: u64,
    pub seconds: f64,
}

impl SnapshotReport {
    pub(crate) fn json(&self) -> String {
        format!(
            "{{\"seq\":{},\"entries\":{},\"aliases\":{},\"bytes\":{},\"seconds\":{:.3}}}\n",
            self.seq, self.entries, self.aliases, self.bytes, self.seconds
        )
    }
}

impl SnapshotState {
    pub(crate) fn new(
        dir: PathBuf,
        collection: u64,
        on_shutdown: bool,
        cache: &crate::config::CacheSection,
        engine: &shards::CacheConfig,
    ) -> SnapshotState {
        SnapshotState {
            dir,
            collection,
            on_shutdown,
            settings: fingerprint::settings(&cache.policy, engine.store_vectors),
            capacity: fingerprint::capacity(engine.capacity),
            flushes: AtomicU64::new(0),
            file_lock: Mutex::new(()),
            running: AtomicBool::new(false),
            written: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            last_seq: AtomicU64::new(0),
            last_secs_bits: AtomicU64::new(0),
            restored: AtomicU64::new(0),
            dir_lock: None,
        }
    }

    /// A FLUSH begins: a snapshot being taken is discarded (it sees the count move), and
    /// the one on disk, which holds entries the FLUSH drops, is removed on a thread (a
    /// file removal and a directory sync must not stall an executor). Await the receiver
    /// before flushing the shards; drop the guard when the FLUSH is over.
    pub(crate) fn flush_begins(self: &Arc<Self>) -> (FlushGuard, flume::Receiver<()>) {
        self.flushes.fetch_add(1, Ordering::AcqRel);
        let guard = FlushGuard(self.clone());
        let (tx, rx) = flume::bounded(1);
        let st = self.clone();
        let remove = move || {
            st.remove_file();
            let _ = tx.send(());
        };
        if let Err(e) = std::thread::Builder::new()
            .name("aker-flush-snapshot".into())
            .spawn(remove)
        {
            // Rare: then on this thread, which is still better than keeping the file.
            tracing::warn!(error = %e, "FLUSH: no thread for the snapshot's removal");
            self.remove_file();
        }
        (guard, rx)
    }

    fn remove_file(&self) {
        let _file = self.file_lock.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = file::remove(&self.dir) {
            tracing::error!(error = %e, "the cache snapshot could not be removed");
        }
    }

    fn snapshot_of(
        &self,
        info: &crate::server::ServiceInfo,
        seq: u64,
        router: shards::snapshot::RouterImage,
        images: Vec<shards::snapshot::ShardImage>,
    ) -> CacheSnapshot {
        CacheSnapshot {
            format: file::FORMAT,
            collection: self.collection,
            seq,
            dim: info.dim,
            metric: info.metric.to_string(),
            shards: images.len() as u32,
            settings: self.settings,
            capacity: self.capacity,
            taken_unix_s: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            router,
            images,
        }
    }

    /// Writes `snap` atomically unless a FLUSH began since `flushes` was read.
    fn write(&self, snap: &CacheSnapshot, flushes: u64) -> Result<u64, String> {
        let bytes = file::write_tmp(&self.dir, snap).map_err(|e| e.to_string())?;
        crate::durable::failpoint_hold("AKER_TEST_SNAPSHOT_HOLD_MS");
        let _file = self.file_lock.lock().unwrap_or_else(|e| e.into_inner());
        let keep = self.flushes.load(Ordering::Acquire) == flushes;
        file::install(&self.dir, keep).map_err(|e| e.to_string())?;
        if !keep {
            return Err("a FLUSH ran while it was taken: discarded".into());
        }
        Ok(bytes)
    }

    /// A refused or unusable snapshot goes, so that no later start, after the log has
    /// moved on (a cut tail reuses seqs), can take it for one of its own history.
    pub(crate) fn discard(&self, why: &str) {
        tracing::warn!(%why, "cache snapshot refused and removed; the cache starts cold");
        self.remove_file();
    }

    /// Counts a snapshot written (or not) and logs it.
    fn record(&self, r: &Result<SnapshotReport, String>) {
        match r {
            Ok(rep) => {
                self.written.fetch_add(1, Ordering::Relaxed);
                self.last_seq.store(rep.seq, Ordering::Relaxed);
                self.last_secs_bits
                    .store(rep.seconds.to_bits(), Ordering::Relaxed);
                tracing::info!(
                    seq = rep.seq,
                    entries = rep.entries,
                    bytes = rep.bytes,
                    secs = rep.seconds,
                    "cache snapshot written"
                );
            }
            Err(e) => {
                self.failed.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(error = %e, "cache snapshot not written");
            }
        }
    }
}

/// Ends a FLUSH for the snapshots when dropped: after the shards answered, or when the
/// FLUSH was cancelled (its deadline) or failed.
pub(crate) struct FlushGuard(Arc<SnapshotState>);

impl Drop for FlushGuard {
    fn drop(&mut self) {
        self.0.flushes.fetch_add(1, Ordering::AcqRel);
    }
}

/// At shutdown: waits (bounded) for a snapshot already being taken, then takes one.
pub(crate) fn take_at_shutdown(shared: &Shared) {
    let Some(st) = &shared.snapshots else { return };
    // pgvector: the slot stays where the last snapshot can replay from.
    if let Some(pg) = shared.backend.pgvector() {
        pg.changes.hold_slot();
    }
    let until = Instant::now() + SHUTDOWN_WAIT;
    while st.running.load(Ordering::Acquire) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = take(shared);
}

/// Takes a snapshot now (blocking: never call it on an executor, whose owners it waits for).
pub(crate) fn take(shared: &Shared) -> Result<SnapshotReport, String> {
    let Some(st) = &shared.snapshots else {
        return Err("no cache snapshot without backend.data_dir".into());
    };
    let position = match (&shared.durable, shared.backend.pgvector()) {
        (Some(d), _) => Position::Log(d),
        (None, Some(pg)) => Position::Stream(&pg.changes),
        (None, None) => return Err("no cache snapshot without backend.data_dir".into()),
    };
    if st.running.swap(true, Ordering::AcqRel) {
        return Err("a snapshot is being taken".into());
    }
    let r = take_claimed(shared, st, position);
    st.running.store(false, Ordering::Release);
    st.record(&r);
    r
}

/// What a snapshot's position is: the durable store's log seq, or the pgvector change
/// stream's applied WAL position.
enum Position<'a> {
    Log(&'a crate::durable::Durable),
    Stream(&'a ChangeFeed),
}

/// The position and every shard's image exactly as of it (queued under the log's gate,
/// or by the change stream's follower between two reads).
type Images = (u64, Vec<flume::Receiver<shards::snapshot::ShardImage>>);

impl Position<'_> {
    fn images(&self, shared: &Shared) -> Result<Images, String> {
        match self {
            Position::Log(d) => {
                let _gate = d.gate.lock();
                let seq = d.wal.written();
                let mut acks = Vec::with_capacity(shared.shards.len());
                for (s, h) in shared.shards.iter().enumerate() {
                    let (tx, rx) = flume::bounded(1);
                    h.sender()
                        .send(OwnerMsg::Export { ack: tx })
                        .map_err(|_| format!("shard {s}'s owner has stopped"))?;
                    acks.push(rx);
                }
                Ok((seq, acks))
            }
            Position::Stream(feed) => feed.export(Instant::now() + EXPORT_WAIT),
        }
    }

    /// Once the images are in: the log is durable up to `seq` (a snapshot must not
    /// reflect writes the log could lose).
    fn settle(&self, seq: u64) -> Result<(), String> {
        match self {
            Position::Log(d) => d.wal.wait_durable(seq).map_err(|e| format!("the log: {e}")),
            Position::Stream(_) => Ok(()),
        }
    }
}

fn take_claimed(
    shared: &Shared,
    st: &SnapshotState,
    position: Position<'_>,
) -> Result<SnapshotReport, String> {
    let t = Instant::now();
    let flushes = st.flushes.load(Ordering::Acquire);
    if flushes % 2 == 1 {
        return Err("a FLUSH is running".into());
    }
    // The router's image before the shards': a rebalance in between only leaves a
    // centroid's previous shard unremembered (lookups miss once, then re-admit).
    let router = shared.router.image(shared.budget.shares());
    let (seq, acks) = position.images(shared)?;
    position.settle(seq)?;
    let images = acks
        .iter()
        .enumerate()
        .map(|(s, rx)| {
            rx.recv_timeout(EXPORT_WAIT)
                .map_err(|_| format!("shard {s}'s owner did not hand its image over"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let entries = images.iter().map(|i| i.entries.len()).sum();
    let aliases = images
        .iter()
        .flat_map(|i| &i.entries)
        .map(|e| e.aliases.len())
        .sum();
    let snap = st.snapshot_of(&shared.info, seq, router, images);
    let bytes = st.write(&snap, flushes)?;
    Ok(SnapshotReport {
        seq,
        entries,
        aliases,
        bytes,
        seconds: t.elapsed().as_secs_f64(),
    })
}

/// Restores `warm` into freshly built shards before they serve: the router, the pool
/// shares, the entries, then the log's writes after the snapshot. On an error the
/// shards are emptied again (a cold start).
pub(crate) fn restore(
    set: &mut ShardSet,
    warm: WarmStart,
    st: &SnapshotState,
    info: &crate::server::ServiceInfo,
) -> Result<RestoreReport, String> {
    let (dim, metric) = (info.dim as usize, info.metric);
    let s = warm.snapshot;
    let image =
        Router::from_image(&s.router, dim, metric, set.caches.len()).map_err(|e| e.to_string())?;
    let trained = std::mem::replace(&mut set.router, image);
    let even = set.budget.shares();
    if s.capacity != st.capacity || !set.budget.set_shares(&s.router.shares) {
        tracing::info!("cache snapshot: another pool capacity; shares start even");
    }
    let mut report = RestoreReport::default();
    for (c, img) in set.caches.iter_mut().zip(s.images) {
        report.add(c.restore_image(img));
    }
    let replayed = !warm.tail.is_empty();
    if let Err(e) = replay(set, warm.tail) {
        for c in &mut set.caches {
            c.flush();
        }
        set.router = trained;
        set.budget.set_shares(&even);
        return Err(e);
    }
    // What survived the replay (deletes and the log's cap invalidate entries).
    report.restored = set.caches.iter().map(|c| c.len()).sum();
    if replayed {
        // The file on disk is older than what the log will reach back to once the
        // start's checkpoint has truncated it: a snapshot of what will serve replaces it.
        let t = Instant::now();
        let images = set.caches.iter().map(|c| c.export_image()).collect();
        let router = set.router.image(set.budget.shares());
        let snap = st.snapshot_of(info, warm.last_seq, router, images);
        let written = st.write(&snap, st.flushes.load(Ordering::Acquire));
        st.record(&written.map(|bytes| SnapshotReport {
            seq: warm.last_seq,
            entries: report.restored,
            aliases: report.aliases,
            bytes,
            seconds: t.elapsed().as_secs_f64(),
        }));
    }
    Ok(report)
}

/// The log's writes after the snapshot, as the owners applied them when they were made.
fn replay(set: &mut ShardSet, tail: Vec<Op>) -> Result<(), String> {
    for op in tail {
        match op {
            Op::Insert { id, vector } => {
                let v: Arc<[f32]> = Arc::from(vector);
                let near = set.router.route_write(&v);
                for (s, c) in set.caches.iter_mut().enumerate() {
                    c.insert_with(id, v.clone(), near.contains(&s))
                        .map_err(|e| format!("replaying the insert of {id}: {e}"))?;
                }
            }
            Op::Delete { id } => {
                for c in &mut set.caches {
                    c.delete(id);
                }
            }
        }
    }
    Ok(())
}
