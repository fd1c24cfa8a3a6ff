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
//!  restore: router from its image, pool shares, every shard's entries (validated),
//!           then the log's records after seq: deletes, inserts through the refresh path
//!  FLUSH:   { file lock: flushes += 1 (odd: one runs); remove the snapshot } ... flushes += 1
//! ```
//! Why the gate: a write holds it from its log append until it is queued to every owner,
//! so the images reflect exactly the writes up to `seq`. Why wait for `seq` to be durable:
//! a snapshot reflecting a write the log then loses (a torn, never acknowledged tail)
//! would serve an id the store does not hold; recovery refuses a snapshot past its log.

#[allow(clippy::disallowed_types)] // control plane: a snapshot's rename against a FLUSH.
use std::sync::Mutex;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use shards::owner::OwnerMsg;
use shards::router::Router;
use shards::sharded::ShardSet;
use shards::snapshot::RestoreReport;
use shards::Metric;

use super::Shared;
use crate::durable::snapshot::{self as file, CacheSnapshot, WarmStart};
use crate::durable::wal::Op;

/// Longest wait for a shard's owner to hand its image over.
const EXPORT_WAIT: Duration = Duration::from_secs(60);

/// The snapshot's place and what coordinates it with FLUSH.
pub(crate) struct SnapshotState {
    pub(crate) dir: PathBuf,
    pub(crate) collection: u64,
    pub(crate) on_shutdown: bool,
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
}

/// What one snapshot wrote.
#[derive(Debug, Clone, Copy)]
pub struct SnapshotReport {
    pub seq: u64,
    pub entries: usize,
    pub aliases: usize,
    pub bytes: u64,
    pub seconds: f64,
}

impl SnapshotReport {
    pub fn json(&self) -> String {
        format!(
            "{{\"seq\":{},\"entries\":{},\"aliases\":{},\"bytes\":{},\"seconds\":{:.3}}}\n",
            self.seq, self.entries, self.aliases, self.bytes, self.seconds
        )
    }
}

impl SnapshotState {
    pub(crate) fn new(dir: PathBuf, collection: u64, on_shutdown: bool) -> SnapshotState {
        SnapshotState {
            dir,
            collection,
            on_shutdown,
            flushes: AtomicU64::new(0),
            file_lock: Mutex::new(()),
            running: AtomicBool::new(false),
            written: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            last_seq: AtomicU64::new(0),
            last_secs_bits: AtomicU64::new(0),
            restored: AtomicU64::new(0),
        }
    }

    /// A FLUSH begins: the snapshot on disk holds entries it drops, so it goes now,
    /// and a snapshot being taken is discarded.
    pub(crate) fn flush_begins(&self) {
        let _file = self.file_lock.lock().unwrap_or_else(|e| e.into_inner());
        self.flushes.fetch_add(1, Ordering::AcqRel);
        if let Err(e) = file::remove(&self.dir) {
            tracing::error!(error = %e, "FLUSH: the cache snapshot could not be removed");
        }
    }

    pub(crate) fn flush_ends(&self) {
        self.flushes.fetch_add(1, Ordering::AcqRel);
    }
}

/// Takes a snapshot now (blocking: never call it on an executor, whose owners it waits for).
pub(crate) fn take(shared: &Shared) -> Result<SnapshotReport, String> {
    let (Some(st), Some(d)) = (&shared.snapshots, &shared.durable) else {
        return Err("the cache snapshot needs the durable store (backend.data_dir)".into());
    };
    if st.running.swap(true, Ordering::AcqRel) {
        return Err("a snapshot is being taken".into());
    }
    let r = take_claimed(shared, st, d);
    st.running.store(false, Ordering::Release);
    match &r {
        Ok(rep) => {
            st.written.fetch_add(1, Ordering::Relaxed);
            st.last_seq.store(rep.seq, Ordering::Relaxed);
            st.last_secs_bits
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
            st.failed.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(error = %e, "cache snapshot not written");
        }
    }
    r
}

fn take_claimed(
    shared: &Shared,
    st: &SnapshotState,
    d: &crate::durable::Durable,
) -> Result<SnapshotReport, String> {
    let t = Instant::now();
    let flushes = st.flushes.load(Ordering::Acquire);
    if flushes % 2 == 1 {
        return Err("a FLUSH is running".into());
    }
    let (seq, router, acks) = {
        let _gate = d.gate.lock();
        let seq = d.wal.written();
        let router = shared.router.image(shared.budget.shares());
        let mut acks = Vec::with_capacity(shared.shards.len());
        for (s, h) in shared.shards.iter().enumerate() {
            let (tx, rx) = flume::bounded(1);
            h.sender()
                .send(OwnerMsg::Export { ack: tx })
                .map_err(|_| format!("shard {s}'s owner has stopped"))?;
            acks.push(rx);
        }
        (seq, router, acks)
    };
    d.wal
        .wait_durable(seq)
        .map_err(|e| format!("the log: {e}"))?;
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
    let snap = CacheSnapshot {
        format: file::FORMAT,
        collection: st.collection,
        seq,
        dim: shared.info.dim,
        metric: shared.info.metric.to_string(),
        shards: shared.shards.len() as u32,
        taken_unix_s: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        router,
        images,
    };
    let bytes = file::write_tmp(&st.dir, &snap).map_err(|e| e.to_string())?;
    drop(snap);
    hold_for_tests();
    let _file = st.file_lock.lock().unwrap_or_else(|e| e.into_inner());
    let keep = st.flushes.load(Ordering::Acquire) == flushes;
    file::install(&st.dir, keep).map_err(|e| e.to_string())?;
    if !keep {
        return Err("a FLUSH ran while it was taken: discarded".into());
    }
    Ok(SnapshotReport {
        seq,
        entries,
        aliases,
        bytes,
        seconds: t.elapsed().as_secs_f64(),
    })
}

/// `AKER_TEST_SNAPSHOT_HOLD_MS`: a pause between writing the temporary file and renaming
/// it, so that a crash test's kills land inside snapshots often (a failpoint; unset in
/// production, where it costs one environment lookup per snapshot).
fn hold_for_tests() {
    let ms = std::env::var("AKER_TEST_SNAPSHOT_HOLD_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok());
    if let Some(ms) = ms {
        std::thread::sleep(Duration::from_millis(ms.min(10_000)));
    }
}

/// Restores `warm` into freshly built shards before they serve: the router, the pool
/// shares, the entries, then the log's writes after the snapshot. On an error the
/// shards are emptied again (a cold start).
pub(crate) fn restore(
    set: &mut ShardSet,
    warm: WarmStart,
    dim: usize,
    metric: Metric,
) -> Result<RestoreReport, String> {
    let s = warm.snapshot;
    set.router =
        Router::from_image(&s.router, dim, metric, set.caches.len()).map_err(|e| e.to_string())?;
    if !set.budget.set_shares(&s.router.shares) {
        tracing::info!("cache snapshot: pool shares do not fit this budget; shares start even");
    }
    let mut report = RestoreReport::default();
    for (c, img) in set.caches.iter_mut().zip(s.images) {
        report.add(c.restore_image(img));
    }
    if let Err(e) = replay(set, warm.tail) {
        for c in &mut set.caches {
            c.flush();
        }
        return Err(e);
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
