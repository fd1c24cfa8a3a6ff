//! The change stream: akerd follows the table's committed changes through PostgreSQL's
//! logical decoding (`pgoutput`), so that writes made straight into the database (an
//! ORM, an ingestion job, `psql`) reach the cache as akerd's own writes do.
//!
//! ```text
//!  start:   wal_level = logical? replica identity holds the id? privileges?
//!           ─► advisory lock on aker_<instance> (one akerd per slot)
//!           ─► publication aker_<instance> FOR TABLE t, slot aker_<instance> (pgoutput)
//!           ─► cold cache: the slot advanced to the WAL's flush position
//!  follow:  (thread aker-changes, two connections: `ctl` holds the lock, reads positions
//!           and snapshots; `stream` reads the changes)
//!           every changes_poll_ms, or at once when a write through akerd asks:
//!             upto = flush position (and a snapshot)  ── ctl
//!             peek_binary_changes(slot, upto)         ── stream, row by row
//!               Begin ─► wait until its transaction is visible to new snapshots
//!               Insert / Update / Delete / Truncate ─► the shard owners, as akerd's
//!               own writes are applied (acks awaited every 1,024 changes)
//!             applied = upto ─► writes through akerd waiting on it answered
//!             slot advanced to `applied` (at most every ADVANCE_EVERY)
//! ```
//!
//! **One order.** While akerd follows, every write reaches the cache from the stream,
//! akerd's own too: a write through akerd commits, reads the WAL position after its
//! commit and waits until the stream has applied that far (`PgSide`). So the cache
//! sees the writes to an id in commit order, whoever made them.
//!
//! **A miss cannot admit what is gone.** A commit can be decoded a moment before new
//! snapshots see it. A transaction's changes are applied only once a snapshot taken
//! after its decoding sees it: a miss whose ticket comes after the delete runs on a
//! later snapshot (it sees the delete); one whose ticket came before has the id
//! stripped at admission (the delete log).
//!
//! ```text
//!  changes/
//!    mod.rs     the shared state (ChangeFeed: applied position, waiters, counters),
//!               the instance name, starting the follower
//!    setup.rs   the checks, the lock, the publication and the slot; --drop-slot
//!    follow.rs  the follower's loop: positions, decoding, applying
//! ```

mod catch_up;
mod decode;
mod follow;
mod setup;

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use shards::router::Router;

use super::pgoutput::Lsn;
use super::PgTarget;
use crate::config::{check_instance_name, ChangesMode, PgvectorSection, INSTANCE_LEN_MAX};
use crate::service::backend::Owners;
use crate::service::StartError;

pub(crate) use catch_up::{catch_up, collection_id};
pub(crate) use setup::drop_slot;

/// How long start-up waits for the follower's checks, lock, publication and slot.
const SETUP_WAIT: Duration = Duration::from_secs(60);

/// The follower's state, as `pg_changes_state` shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u64)]
pub(crate) enum FeedState {
    /// Not following: only writes through akerd reach the cache.
    Off = 0,
    /// Following, connected.
    Following = 1,
    /// Following, the database away: reconnecting (writes through akerd wait).
    Reconnecting = 2,
    /// Stopped following (the table was dropped, renamed or changed): said in the log.
    Stopped = 3,
}

/// Counters of the change stream, for STATS and /metrics.
#[derive(Default)]
pub(crate) struct ChangeStats {
    pub state: AtomicU64,
    pub inserts: AtomicU64,
    pub updates: AtomicU64,
    pub deletes: AtomicU64,
    pub truncates: AtomicU64,
    /// Transactions applied.
    pub commits: AtomicU64,
    /// WAL between the server's flush position and the applied one, at the last poll.
    pub lag_bytes: AtomicU64,
    /// Commit to applied, of the last transaction applied; 0 once a poll finds nothing.
    pub lag_ms: AtomicU64,
    /// WAL the slot holds back (`pg_current_wal_lsn() - restart_lsn`).
    pub retained_bytes: AtomicU64,
    /// Slots found gone or invalidated: the cache flushed, the slot made anew.
    pub slot_lost: AtomicU64,
    /// Updates whose new id came without its vector (unchanged TOAST): the old id
    /// stripped, the new row left to the next miss.
    pub updates_partial: AtomicU64,
    pub polls: AtomicU64,
    pub reconnects: AtomicU64,
    /// Searches sent to the database because the stream was behind `max_staleness_ms`.
    pub stale_searches: AtomicU64,
    /// The position every shard has applied the stream to (a copy for the metrics).
    pub applied_lsn: AtomicU64,
}

/// What a write through akerd learned waiting for the stream.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Waited {
    /// The stream has applied past the write: the cache holds it.
    Applied,
    /// akerd does not follow (any more): the write is applied directly.
    NotFollowing,
    /// Not applied by the deadline.
    TimedOut,
}

/// The shared state of the change stream: its applied position and whether it follows.
pub(crate) struct ChangeFeed {
    /// The position every shard has applied the stream to (0: not following).
    applied: Mutex<Lsn>,
    moved: Condvar,
    following: AtomicBool,
    /// A write through akerd asks the follower to read the stream now.
    wake_tx: flume::Sender<()>,
    wake_rx: flume::Receiver<()>,
    /// A snapshot restored at start was caught up to the applied position: the
    /// follower resumes from its slot instead of starting cold.
    warm: AtomicBool,
    /// The slot is confirmed no further than this (`u64::MAX`: up to what is applied);
    /// set at shutdown, before the last snapshot, so that the next start can replay
    /// from that snapshot's position.
    confirm_cap: AtomicU64,
    /// A snapshot asks the follower for the shards' images at a position.
    export_tx: flume::Sender<ExportRequest>,
    export_rx: flume::Receiver<ExportRequest>,
    /// `max_staleness_ms` in µs (0: no bound).
    staleness_max_us: AtomicU64,
    /// When the last read that caught up began (µs since `epoch`): every commit before
    /// it is applied.
    caught_up_us: AtomicU64,
    epoch: Instant,
    pub stats: ChangeStats,
}

/// The shards' images, each as of every change up to the position, and the position.
pub(crate) type Export = (Lsn, Vec<flume::Receiver<shards::snapshot::ShardImage>>);
/// A snapshot's request to the follower (answered between two reads of the stream).
type ExportRequest = flume::Sender<Export>;

impl Default for ChangeFeed {
    fn default() -> Self {
        let (wake_tx, wake_rx) = flume::bounded(1);
        let (export_tx, export_rx) = flume::bounded(1);
        ChangeFeed {
            applied: Mutex::new(0),
            moved: Condvar::new(),
            following: AtomicBool::new(false),
            wake_tx,
            wake_rx,
            warm: AtomicBool::new(false),
            confirm_cap: AtomicU64::new(u64::MAX),
            export_tx,
            export_rx,
            staleness_max_us: AtomicU64::new(0),
            caught_up_us: AtomicU64::new(0),
            epoch: Instant::now(),
            stats: ChangeStats::default(),
        }
    }
}

impl ChangeFeed {
    pub(crate) fn following(&self) -> bool {
        self.following.load(Ordering::Acquire)
    }

    /// Following, but the database away: the stream cannot apply anything now.
    pub(crate) fn reconnecting(&self) -> bool {
        self.stats.state.load(Ordering::Relaxed) == FeedState::Reconnecting as u64
    }

    pub(crate) fn applied(&self) -> Lsn {
        *self.applied.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set_state(&self, s: FeedState) {
        self.stats.state.store(s as u64, Ordering::Relaxed);
    }

    /// Starts or stops following; waiters are woken either way.
    fn set_following(&self, on: bool, s: FeedState) {
        self.set_state(s);
        let g = self.applied.lock().unwrap_or_else(|e| e.into_inner());
        self.following.store(on, Ordering::Release);
        drop(g);
        self.moved.notify_all();
    }

    /// The stream is applied up to `at` in every shard.
    fn advance(&self, at: Lsn) {
        let mut g = self.applied.lock().unwrap_or_else(|e| e.into_inner());
        if at > *g {
            *g = at;
            self.stats.applied_lsn.store(at, Ordering::Relaxed);
            drop(g);
            self.moved.notify_all();
        }
    }

    /// A snapshot was restored and caught up to `at` (plan time, before the follower).
    pub(crate) fn resume_warm(&self, at: Lsn) {
        self.warm.store(true, Ordering::Release);
        self.advance(at);
    }

    /// The restored snapshot could not be used after all: the follower starts cold.
    pub(crate) fn start_cold(&self) {
        self.warm.store(false, Ordering::Release);
    }

    pub(crate) fn is_warm(&self) -> bool {
        self.warm.load(Ordering::Acquire)
    }

    /// From now on the slot is confirmed no further than what is applied now (shutdown:
    /// the last snapshot, taken next, is at or past it, so the next start can use it).
    pub(crate) fn hold_slot(&self) {
        self.confirm_cap.store(self.applied(), Ordering::Release);
    }

    fn confirm_cap(&self) -> Lsn {
        self.confirm_cap.load(Ordering::Acquire)
    }

    /// The shards' images at the applied position, asked of the follower (it queues
    /// every owner's export between two reads of the stream); bounded by `until`.
    pub(crate) fn export(&self, until: Instant) -> Result<Export, String> {
        if !self.following() {
            return Err(
                "akerd does not follow the table's changes: a snapshot would have \
                        no position to resume from"
                    .into(),
            );
        }
        let (tx, rx) = flume::bounded(1);
        self.export_tx
            .send_deadline(tx, until)
            .map_err(|_| "the change stream did not take the snapshot's request".to_string())?;
        self.wake();
        rx.recv_deadline(until)
            .map_err(|_| "the change stream did not answer the snapshot's request".to_string())
    }

    /// Microseconds since the feed was made (the follower's clock for staleness).
    fn now_us(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64
    }

    /// Every commit before `began_us` is applied.
    fn caught_up(&self, began_us: u64) {
        self.caught_up_us.fetch_max(began_us, Ordering::Release);
    }

    /// Whether a search must go to the database: following, connected, and further
    /// behind than `max_staleness_ms`. While the database cannot be reached
    /// (reconnecting), nothing can commit there, and hits are served.
    pub(crate) fn too_stale(&self) -> bool {
        let stale = self.past_staleness();
        if stale {
            self.stats.stale_searches.fetch_add(1, Ordering::Relaxed);
        }
        stale
    }

    /// [`ChangeFeed::too_stale`] without counting a search (a read replica, which may be
    /// as far behind as the stream, is then passed over: `replica.rs`).
    pub(crate) fn past_staleness(&self) -> bool {
        let max = self.staleness_max_us.load(Ordering::Relaxed);
        let state = self.stats.state.load(Ordering::Relaxed);
        if max == 0 || state == FeedState::Reconnecting as u64 {
            return false;
        }
        if state != FeedState::Following as u64 {
            // Stopped (the table changed, the slot taken): no bound holds any more.
            return true;
        }
        let behind = self
            .now_us()
            .saturating_sub(self.caught_up_us.load(Ordering::Acquire));
        behind > max
    }

    /// A new slot's start position, which may lie before the old applied one.
    fn reset_applied(&self, at: Lsn) {
        let mut g = self.applied.lock().unwrap_or_else(|e| e.into_inner());
        *g = at;
        self.stats.applied_lsn.store(at, Ordering::Relaxed);
        drop(g);
        self.moved.notify_all();
    }

    /// Wakes the follower (a write through akerd waits on it).
    pub(crate) fn wake(&self) {
        let _ = self.wake_tx.try_send(());
    }

    /// Waits until the stream is applied at or past `at`, or `until`.
    pub(crate) fn wait_applied(&self, at: Lsn, until: Instant) -> Waited {
        self.wake();
        let mut g = self.applied.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if !self.following() {
                return Waited::NotFollowing;
            }
            if *g >= at {
                return Waited::Applied;
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Waited::TimedOut;
            }
            g = self
                .moved
                .wait_timeout(g, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

/// A snapshot's view of which transactions have ended (`pg_current_snapshot()`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Snap {
    pub xmin: u64,
    pub xmax: u64,
    pub xip: Vec<u64>,
}

impl Snap {
    /// A decoded 32-bit xid as the 64-bit one nearest this snapshot's `xmax`: xids in
    /// use lie within 2^31 of it, before it (ended or running) or just after it (a
    /// transaction that has committed but not yet ended, as a decoded one may be).
    pub(crate) fn widen(&self, xid: u32) -> u64 {
        let diff = i64::from(xid.wrapping_sub(self.xmax as u32) as i32);
        (self.xmax as i64 + diff).max(0) as u64
    }

    /// Whether a transaction known to have committed is visible to this snapshot.
    pub(crate) fn sees(&self, xid: u64) -> bool {
        xid < self.xmin || (xid < self.xmax && !self.xip.contains(&xid))
    }
}

/// The instance name: configured, kept in `data_dir/instance` (made there once), or
/// the host name and the listen port.
pub(crate) fn instance_name(
    section: &PgvectorSection,
    data_dir: Option<&Path>,
    port: u16,
) -> Result<String, StartError> {
    if let Some(n) = &section.instance {
        return Ok(n.clone());
    }
    let Some(dir) = data_dir else {
        if port == 0 {
            return Err(StartError::Config(crate::config::ConfigError::invalid(
                "backend.pgvector.instance",
                "is needed (or backend.data_dir) with an ephemeral listen port: the slot's \
                 name must stay the same across restarts",
            )));
        }
        let name = host_instance(&host_name(), port);
        tracing::warn!(instance = %name,
            "pgvector: the slot's name comes from the host name and port: a new host name \
             (a new pod, a new machine) makes a new slot, and the old one holds WAL until \
             dropped (akerd --drop-slot with the old name as backend.pgvector.instance). Set \
             backend.pgvector.instance or backend.data_dir");
        return Ok(name);
    };
    let file = dir.join("instance");
    match std::fs::read_to_string(&file) {
        Ok(s) => {
            let name = s.trim().to_string();
            check_instance_name(&name)
                .map_err(|why| StartError::Data(format!("{}: {why}", file.display())))?;
            Ok(name)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(dir)?;
            let name = format!("{:016x}", rand::random::<u64>());
            let tmp = dir.join("instance.tmp");
            std::fs::write(&tmp, format!("{name}\n"))?;
            std::fs::File::open(&tmp)?.sync_all()?;
            std::fs::rename(&tmp, &file)?;
            tracing::info!(instance = %name, file = %file.display(), "pgvector: a new instance name");
            Ok(name)
        }
        Err(e) => Err(e.into()),
    }
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "host".into())
}

/// `host_port`, lower-cased, other characters as `_`, cut to the longest name.
fn host_instance(host: &str, port: u16) -> String {
    let suffix = format!("_{port}");
    let mut h: String = host
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9') => c,
            _ => '_',
        })
        .collect();
    h.truncate(INSTANCE_LEN_MAX - suffix.len());
    h + &suffix
}

/// The slot's and the publication's name.
pub(crate) fn slot_name(instance: &str) -> String {
    format!("aker_{instance}")
}

/// What the follower needs besides the target.
pub(crate) struct FollowParts {
    pub owners: Owners,
    pub router: Arc<Router>,
    pub stop: Arc<AtomicBool>,
    pub instance: String,
}

/// Starts following the table's changes as `section.changes` asks: `Ok(None)` when
/// akerd does not follow (off, or auto and the server does not allow it: said loudly).
pub(crate) fn start(
    target: Arc<PgTarget>,
    section: &PgvectorSection,
    parts: FollowParts,
) -> Result<Option<JoinHandle<()>>, StartError> {
    let mode = section.changes;
    target.changes.set_state(FeedState::Off);
    if mode == ChangesMode::Off {
        tracing::warn!(
            "pgvector: changes = \"off\": only writes through akerd reach the cache; rows \
             changed in the database by anyone else are served stale until their entries go"
        );
        return Ok(None);
    }
    if let Some(ms) = section.max_staleness_ms {
        target
            .changes
            .staleness_max_us
            .store(ms.saturating_mul(1000), Ordering::Relaxed);
    }
    let cfg = follow::FollowConfig::new(section, &parts.instance);
    let flush_owners = parts.owners.clone();
    let (tx, rx) = flume::bounded(1);
    let t = target.clone();
    let handle = std::thread::Builder::new()
        .name("aker-changes".into())
        .spawn(move || follow::run(t, cfg, parts, tx))?;
    let outcome = rx.recv_timeout(SETUP_WAIT).unwrap_or_else(|_| {
        Err(setup::SetupError::Other(format!(
            "no answer from the change stream's setup within {SETUP_WAIT:?}"
        )))
    });
    // A setup still running finds no one waiting once it is done, and ends (the joins
    // below are bounded by its statements' timeouts).
    drop(rx);
    match outcome {
        Ok(()) => Ok(Some(handle)),
        Err(e) if mode == ChangesMode::Auto && e.allows_auto() => {
            if target.changes.is_warm() {
                // The restored entries cannot be kept up to date: they go.
                target.changes.start_cold();
                flush_at_start(&flush_owners);
            }
            tracing::warn!(
                "pgvector: NOT following the table's changes ({e}). Only writes through \
                 akerd reach the cache: rows changed in the database by anyone else are \
                 served stale until their entries go. pg_changes_up reads 0."
            );
            if target.replicas.len() > 0 {
                tracing::warn!(
                    "pgvector: replica_urls are not used: a replica is held to the change \
                     stream's position; every miss goes to the primary"
                );
            }
            let _ = handle.join();
            Ok(None)
        }
        Err(e) => {
            let _ = handle.join();
            Err(StartError::Backend(format!(
                "changes = \"{}\": {e}",
                mode.as_str()
            )))
        }
    }
}

/// Queues a flush to every owner before they serve (their executors are not running
/// yet: the acknowledgements are not awaited).
fn flush_at_start(owners: &Owners) {
    if owners.flush().is_err() {
        tracing::error!("pgvector: the owners stopped before serving");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xids_widen_into_the_snapshots_epoch() {
        let s = Snap {
            xmin: (3 << 32) + 10,
            xmax: (3 << 32) + 20,
            xip: vec![(3 << 32) + 12],
        };
        assert_eq!(s.widen(15), (3 << 32) + 15);
        // Committed, not ended yet: at or just past xmax, in the same epoch (not one
        // epoch back, which would read as long visible).
        assert_eq!(s.widen(20), (3 << 32) + 20);
        assert_eq!(s.widen(25), (3 << 32) + 25);
        assert!(!s.sees(s.widen(25)));
        // Just below an epoch's start: the epoch before.
        let e = Snap {
            xmin: (3 << 32) + 2,
            xmax: (3 << 32) + 5,
            xip: vec![],
        };
        assert_eq!(e.widen(u32::MAX - 1), (2 << 32) + u64::from(u32::MAX - 1));
        let first = Snap {
            xmin: 5,
            xmax: 9,
            xip: vec![],
        };
        assert_eq!(first.widen(7), 7);
        assert_eq!(first.widen(12), 12);
    }

    #[test]
    fn a_snapshot_sees_ended_transactions_only() {
        let s = Snap {
            xmin: 10,
            xmax: 20,
            xip: vec![12, 15],
        };
        assert!(s.sees(9));
        assert!(s.sees(11));
        assert!(!s.sees(12));
        assert!(!s.sees(15));
        assert!(s.sees(19));
        assert!(!s.sees(20));
    }

    #[test]
    fn host_instance_names_are_slot_names() {
        let n = host_instance("Web-01.example.COM", 7700);
        assert_eq!(n, "web_01_example_com_7700");
        assert!(check_instance_name(&n).is_ok());
        let long = host_instance(&"x".repeat(100), 65535);
        assert_eq!(long.len(), INSTANCE_LEN_MAX);
        assert!(long.ends_with("_65535"));
    }

    #[test]
    fn a_writer_waits_for_the_applied_position() {
        let feed = Arc::new(ChangeFeed::default());
        let soon = Instant::now() + Duration::from_millis(20);
        assert_eq!(feed.wait_applied(5, soon), Waited::NotFollowing);
        feed.set_following(true, FeedState::Following);
        assert_eq!(feed.wait_applied(5, soon), Waited::TimedOut);
        let f = feed.clone();
        let t = std::thread::spawn(move || {
            f.wait_applied(100, Instant::now() + Duration::from_secs(10))
        });
        feed.advance(50);
        feed.advance(100);
        assert_eq!(t.join().unwrap(), Waited::Applied);
        // Stopping wakes a waiter, who then applies directly.
        let f = feed.clone();
        let t = std::thread::spawn(move || {
            f.wait_applied(200, Instant::now() + Duration::from_secs(10))
        });
        std::thread::sleep(Duration::from_millis(10));
        feed.set_following(false, FeedState::Stopped);
        assert_eq!(t.join().unwrap(), Waited::NotFollowing);
    }
}
