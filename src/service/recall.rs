//! The recall floor's daemon side: which hits are checked, the checks' own queue, and
//! what a check does. The estimator and the controller are the engine's
//! (`shards::floor`), shared with the experiment runner.
//!
//! ```text
//!  executor, after a hit:   draw < sample_fraction(kind)?  an idle backend thread?  a token?
//!      └─ Check { query, k + Δ, served ids, kind, shard, repair ticket } ─► checks queue
//!                                                                   (bounded; full: dropped)
//!  backend thread, only when no request waits on its queue (a check is never in a
//!  request's path, and one older than CHECK_STALE is dropped):
//!      answer = store.search(query, k + Δ)
//!      floor.record(kind, recall@k of the served ids against answer[..k]); controller step
//!          └─ a new scale ─► every shard's reader (`set_threshold_scale`)
//!      a served id the store no longer holds ─► stripped from every shard
//!      an exact or alias hit that differed   ─► its entry refreshed from this answer
//! ```

// The floor's state is the control plane's: a check takes its lock once, at the rate
// checks are made (at most `recall_checks_per_s`), never on a hit's path.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use shards::floor::{FloorConfig, FloorEstimate, RecallFloor, ServedTotals};
use shards::owner::ShardHandle;
use shards::{HitKind, MissTicket, Neighbor};

/// Checks waiting for an idle backend thread.
const CHECKS_QUEUE: usize = 64;

/// A check that waited this long describes a cache that has moved on: dropped.
pub(crate) const CHECK_STALE: Duration = Duration::from_secs(1);

/// Longest a check's backend search may run (its statement timeout on pgvector).
pub(crate) const CHECK_DEADLINE: Duration = Duration::from_secs(1);

/// Seconds after which a check weighs half. Checks are capped per second here, so they
/// fade by time, not by replies (by replies, a high request rate would leave the
/// estimate a handful of checks' worth and the bound too wide to hold any floor).
const CHECK_HALF_LIFE_S: f64 = 30.0;

/// The estimator and controller, and when its checks last faded.
struct Controller {
    floor: RecallFloor,
    faded: Instant,
}

impl Controller {
    /// Fades the checks for the time since the last call, and takes in the replies.
    fn catch_up(&mut self, shards: &[ShardHandle]) {
        let now = Instant::now();
        let dt = now.duration_since(self.faded).as_secs_f64();
        self.floor.fade_checks(0.5f64.powf(dt / CHECK_HALF_LIFE_S));
        self.faded = now;
        self.floor.observe_served(served_totals(shards));
    }
}

/// One sampled hit to check against the backend.
pub(crate) struct Check {
    pub query: Arc<[f32]>,
    pub k: usize,
    /// What a miss would ask for (`k + Δ`), so a repair can admit the answer.
    pub n: usize,
    pub served: Vec<u64>,
    pub kind: HitKind,
    pub shard: usize,
    /// Exact and alias hits: the ticket that refreshes the entry if the check differs.
    pub repair: Option<MissTicket>,
    pub queued: Instant,
}

/// Why checks did not run, and what they found.
#[derive(Debug, Default)]
pub(crate) struct CheckCounters {
    pub queued: AtomicU64,
    pub done: AtomicU64,
    pub dropped_busy: AtomicU64,
    pub dropped_rate: AtomicU64,
    pub dropped_full: AtomicU64,
    pub dropped_stale: AtomicU64,
    pub failed: AtomicU64,
    pub repairs: AtomicU64,
    pub deleted_ids: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// Tokens for `rate` checks a second, a second's worth at most.
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// The floor, its checks' queue and their counters (one per daemon).
pub(crate) struct RecallChecks {
    cfg: FloorConfig,
    floor: Mutex<Controller>,
    bucket: Mutex<Bucket>,
    rate: f64,
    /// Backend threads: a check is offered only while the request queue is shorter.
    threads: usize,
    tx: flume::Sender<Check>,
    pub counters: CheckCounters,
}

thread_local! {
    /// xorshift64* state of this thread's sampling draws.
    static DRAW: Cell<u64> = Cell::new(seed());
}

fn seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0x5eed);
    h.finish() | 1
}

/// A uniform draw in [0, 1).
fn draw() -> f64 {
    DRAW.with(|s| {
        let mut x = s.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        s.set(x);
        (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    })
}

impl RecallChecks {
    /// The floor and the receiving end of its checks' queue (for the backend threads).
    pub(crate) fn new(
        cfg: FloorConfig,
        checks_per_s: u32,
        threads: usize,
    ) -> Result<(Arc<RecallChecks>, flume::Receiver<Check>), String> {
        let cfg = FloorConfig {
            check_half_life_replies: 0.0,
            ..cfg
        };
        let floor = Controller {
            floor: RecallFloor::new(cfg.clone())?,
            faded: Instant::now(),
        };
        let (tx, rx) = flume::bounded(CHECKS_QUEUE);
        let rate = f64::from(checks_per_s.max(1));
        let checks = RecallChecks {
            cfg,
            floor: Mutex::new(floor),
            bucket: Mutex::new(Bucket {
                tokens: rate,
                at: Instant::now(),
            }),
            rate,
            threads: threads.max(1),
            tx,
            counters: CheckCounters::default(),
        };
        Ok((Arc::new(checks), rx))
    }

    /// After a hit: whether to check it, and if so the check queued. `queue_len` reads
    /// the backend's request queue (a lock inside flume: read only for a sampled hit);
    /// `ticket` makes the repair ticket (exact and alias).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn offer(
        &self,
        kind: HitKind,
        q: &[f32],
        k: usize,
        n: usize,
        served: &[Neighbor],
        shard: usize,
        queue_len: impl FnOnce() -> usize,
        ticket: impl FnOnce(bool) -> Option<MissTicket>,
    ) {
        if draw() >= self.cfg.sample_fraction(kind) {
            return;
        }
        if queue_len() >= self.threads {
            return bump(&self.counters.dropped_busy);
        }
        if !self.take_token() {
            return bump(&self.counters.dropped_rate);
        }
        let repair = match kind {
            // The same vector: the backend's answer is the entry's own, refreshed.
            HitKind::Exact => ticket(true),
            // The alias's own entry replaces the link (as the guarded policy's promotion).
            HitKind::Alias => ticket(false),
            HitKind::Approximate | HitKind::Miss => None,
        };
        let check = Check {
            query: Arc::from(q),
            k,
            n,
            served: served.iter().map(|r| r.id).collect(),
            kind,
            shard,
            repair,
            queued: Instant::now(),
        };
        match self.tx.try_send(check) {
            Ok(()) => bump(&self.counters.queued),
            Err(_) => bump(&self.counters.dropped_full),
        }
    }

    fn take_token(&self) -> bool {
        let mut b = self.bucket.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let refill = now.duration_since(b.at).as_secs_f64() * self.rate;
        b.tokens = (b.tokens + refill).min(self.rate);
        b.at = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// A check's outcome: into the estimate, then one controller step, whose new scale
    /// every shard's lookups use from then on.
    pub(crate) fn record(&self, kind: HitKind, recall: f64, shards: &[ShardHandle]) {
        let mut state = self.floor.lock().unwrap_or_else(|e| e.into_inner());
        state.catch_up(shards);
        let floor = &mut state.floor;
        floor.record(kind, recall);
        if let Some(scale) = floor.control() {
            for h in shards {
                h.reader.set_threshold_scale(scale);
            }
            let e = floor.estimate();
            tracing::info!(
                scale,
                estimate = e.recall,
                low = e.low,
                floor = e.floor,
                "recall floor: threshold scale changed"
            );
        }
        bump(&self.counters.done);
    }

    /// The estimate now: checks faded and shares taken in up to this moment, so one
    /// that has had no check for a while says so by a wider bound.
    pub(crate) fn estimate(&self, shards: &[ShardHandle]) -> FloorEstimate {
        let mut state = self.floor.lock().unwrap_or_else(|e| e.into_inner());
        state.catch_up(shards);
        state.floor.estimate()
    }
}

/// Replies by kind so far, over every shard (the shares the estimate weighs by).
fn served_totals(shards: &[ShardHandle]) -> ServedTotals {
    let mut t = ServedTotals::default();
    for h in shards {
        let c = h.reader.counters();
        t.exact += c.exact_hits.get();
        t.alias += c.alias_hits.get();
        t.approximate += c.approximate_hits.get();
        t.miss += c.misses.get();
    }
    t
}
