//! The engine: sender threads that each own some connections, a receiver thread per
//! connection, and the main thread printing a line per second.
//!
//! ```text
//!  sender thread i (schedule rate R/T)          receiver thread per connection
//!  ┌─────────────────────────────────────┐      ┌──────────────────────────────────┐
//!  │ next intended instant t             │      │ blocking read (50 ms timeout)     │
//!  │ t in the future? flush, sleep to t  │      │ decode replies (aker::protocol)   │
//!  │ a connection with a free slot?      │      │ pending.remove(id) → intended t   │
//!  │   no: flush, wait for a reply ──────┼──◄───┼─ slot freed: wake the sender      │
//!  │   yes: pending[id] = t; encode      │      │ latency = now − t → Recorder      │
//!  │ t = next intended instant           │      │ EOF / garbage: fail what pends    │
//!  └─────────────────────────────────────┘      └──────────────────────────────────┘
//! ```
//!
//! Why a split connection instead of `aker::client::Pipeline`: an open-loop sender must
//! keep sending on schedule while replies are outstanding, and must timestamp each reply
//! when it arrives, not when the sender next gets round to reading. `Pipeline` owns one
//! stream and reads only inside `send` / `recv`, so it cannot be written by one thread
//! while another blocks on its replies. The connection here uses the same codec
//! (`aker::protocol::{encode_request, decode_reply}`) over a `TcpStream` and its clone.
//!
//! Coordinated omission: a request's latency is measured from its intended instant. When
//! every slot of every connection is taken (the server is slow or stopped), the sender
//! does not skip or delay the schedule; the next request simply goes out late, and its
//! wait counts. Bounds: at most `depth` requests in flight per connection, a drain
//! deadline after the schedule ends (requests still unsent or unanswered then are
//! counted as errors), and a socket write timeout.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};

use aker::client::{SplitRead, SplitWrite};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use aker::protocol::{decode_reply, encode_request, Opcode, Reply, RequestFrame, CONNECTION_OP};

use crate::schedule::{Arrival, Schedule};
use crate::stats::{
    IntervalLine, Phase, Recorder, RunStats, ERR_CONN_LOST, ERR_NOT_SENT, ERR_NO_REPLY,
};
use crate::workload::{OpKind, Planned, Workload};

/// How requests are paced.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Mode {
    /// Requests at `rate` per second regardless of replies; latency from the intended time.
    Open { rate: f64, arrival: Arrival },
    /// Every connection keeps `depth` requests in flight: the maximum throughput.
    Closed,
}

#[derive(Clone, Debug)]
pub struct EngineConfig {
    pub target: SocketAddr,
    pub mode: Mode,
    pub connections: usize,
    /// Requests in flight per connection (keep at or below the server's `max_inflight`).
    pub depth: usize,
    /// Sender threads; connections are dealt out to them round robin.
    pub threads: usize,
    /// Sent but not counted.
    pub warmup: Duration,
    /// Counted part of the schedule.
    pub duration: Duration,
    /// Counted requests to send at most.
    pub max_requests: Option<u64>,
    /// After the schedule ends, how long late requests may still be sent and answered.
    pub drain: Duration,
    pub connect_timeout: Duration,
    pub write_timeout: Duration,
    /// Largest reply frame accepted.
    pub max_frame_bytes: usize,
    /// Open loop: the last part of each wait before an intended instant is spent
    /// spinning instead of sleeping (a sleeping thread wakes tens of µs late; spinning
    /// costs a core per sender thread). Zero: always sleep.
    pub spin: Duration,
    pub seed: u64,
    /// For a server that requires AUTH: every connection authenticates before the clock
    /// starts.
    pub secret: Option<aker::auth::Secret>,
    /// For a server with `[tls]`: every connection does its TLS handshake before the
    /// clock starts, and its reading and writing threads share the session.
    pub tls: Option<aker::client::ClientTls>,
    /// Closed loop: SEARCHes go out as SEARCH_BATCH frames (protocol version 4) of this
    /// many queries; `depth` then counts frames. `None`: one SEARCH per frame.
    pub batch: Option<usize>,
}

/// Why the sending stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    Duration,
    RequestCount,
    TraceEnd,
    ConnectionsLost,
    DrainDeadline,
}

impl StopReason {
    fn rank(self) -> u8 {
        // When threads disagree, report the most telling reason.
        match self {
            StopReason::Duration => 0,
            StopReason::TraceEnd => 1,
            StopReason::RequestCount => 2,
            StopReason::DrainDeadline => 3,
            StopReason::ConnectionsLost => 4,
        }
    }
}

pub struct RunResult {
    pub stats: RunStats,
    pub intervals: Vec<IntervalLine>,
    /// Seconds of counted schedule actually covered (less than the duration when the
    /// run stopped early); throughput is counted replies over this.
    pub measured_secs: f64,
    /// Counted requests sent.
    pub sent: u64,
    pub stop: StopReason,
}

/// A request on the wire.
struct Pending {
    intended: Instant,
    sent: Instant,
    plan: Planned,
    /// A SEARCH_BATCH's queries (`plan` is the first); empty for any other request.
    batch: Vec<Planned>,
    measured: bool,
}

impl Pending {
    /// Operations this frame carries: a batch's queries, else one.
    fn operations(&self) -> u64 {
        self.batch.len().max(1) as u64
    }
}

/// Wakes a sender waiting for a free slot. `waiting` avoids a futex call per reply when
/// the sender is not waiting.
#[derive(Default)]
struct Notify {
    lock: Mutex<()>,
    cv: Condvar,
    waiting: AtomicBool,
}

impl Notify {
    fn wake(&self) {
        if self.waiting.load(Ordering::SeqCst) {
            let _g = lock(&self.lock);
            self.cv.notify_one();
        }
    }
}

/// A poisoned lock only means another thread panicked; the data (counters) is still
/// usable for the report.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What the sender and the receiver of one connection share.
struct ConnShared {
    pending: Mutex<HashMap<u64, Pending>>,
    in_flight: AtomicUsize,
    dead: AtomicBool,
    notify: Arc<Notify>,
    recorder: Arc<Mutex<Recorder>>,
}

impl ConnShared {
    fn free(&self, depth: usize) -> bool {
        !self.dead.load(Ordering::SeqCst) && self.in_flight.load(Ordering::SeqCst) < depth
    }

    /// Marks the connection dead and counts everything still pending as `cause`.
    fn fail_all(&self, cause: &str) {
        self.dead.store(true, Ordering::SeqCst);
        let drained: Vec<Pending> = lock(&self.pending).drain().map(|(_, p)| p).collect();
        self.in_flight.fetch_sub(drained.len(), Ordering::SeqCst);
        self.notify.wake();
        record_failures(&self.recorder, &drained, cause);
    }
}

fn record_failures(recorder: &Mutex<Recorder>, failed: &[Pending], cause: &str) {
    if failed.is_empty() {
        return;
    }
    let mut r = lock(recorder);
    r.interval.errors += failed.iter().map(Pending::operations).sum::<u64>();
    for p in failed.iter().filter(|p| p.measured) {
        r.run
            .record_errors(Some(p.plan.kind), cause, p.operations());
    }
}

struct Clock {
    start: Instant,
    measure_from: Instant,
    end: Instant,
    drain_deadline: Instant,
}

struct Shared {
    clock: Clock,
    max_requests: Option<u64>,
    measured_sent: AtomicU64,
    /// Set by the main thread when the run is over; receivers then leave quietly.
    finished: AtomicBool,
}

impl Shared {
    /// Takes one counted request from the `--requests` budget.
    fn take_budget(&self) -> bool {
        let n = self.measured_sent.fetch_add(1, Ordering::Relaxed);
        match self.max_requests {
            Some(max) if n >= max => {
                self.measured_sent.fetch_sub(1, Ordering::Relaxed);
                false
            }
            _ => true,
        }
    }
}

/// The sending half of one connection.
struct SendConn {
    stream: SplitWrite,
    shared: Arc<ConnShared>,
    wbuf: Vec<u8>,
    next_id: u64,
}

impl SendConn {
    /// Encodes the request and registers it as pending (before any byte of it can reach
    /// the server, so the receiver always finds it).
    fn queue(&mut self, w: &Workload, plan: Planned, intended: Instant, measured: bool) {
        self.queue_frame(w, plan, Vec::new(), intended, measured);
    }

    /// Queues SEARCHes `batch` (of one k, at least one) as one SEARCH_BATCH frame.
    fn queue_batch(
        &mut self,
        w: &Workload,
        batch: Vec<Planned>,
        intended: Instant,
        measured: bool,
    ) {
        self.queue_frame(w, batch[0], batch, intended, measured);
    }

    fn queue_frame(
        &mut self,
        w: &Workload,
        plan: Planned,
        batch: Vec<Planned>,
        intended: Instant,
        measured: bool,
    ) {
        let id = self.next_id;
        self.next_id += 1;
        let start = self.wbuf.len();
        let request = if batch.is_empty() {
            w.request(&plan)
        } else {
            w.batch_request(&batch)
        };
        let frame = RequestFrame {
            version: w.version,
            request_id: id,
            request,
        };
        let pending = Pending {
            intended,
            sent: Instant::now(),
            plan,
            batch,
            measured,
        };
        if let Err(e) = encode_request(&frame, &mut self.wbuf) {
            self.wbuf.truncate(start);
            let mut r = lock(&self.shared.recorder);
            r.interval.errors += pending.operations();
            if measured {
                let cause = format!("cannot encode: {e}");
                r.run
                    .record_errors(Some(plan.kind), &cause, pending.operations());
            }
            return;
        }
        lock(&self.shared.pending).insert(id, pending);
        self.shared.in_flight.fetch_add(1, Ordering::SeqCst);
    }

    fn flush(&mut self) {
        if self.wbuf.is_empty() {
            return;
        }
        if self.stream.write_all(&self.wbuf).is_err() {
            // Part of a frame may be on the wire: the connection is unusable. Shutting
            // it down wakes the receiver, which fails what is pending.
            self.shared.dead.store(true, Ordering::SeqCst);
            let _ = self.stream.shutdown();
        }
        self.wbuf.clear();
    }
}

/// One sender thread's share of the run.
struct Sender {
    index: usize,
    threads: usize,
    conns: Vec<SendConn>,
    notify: Arc<Notify>,
    recorder: Arc<Mutex<Recorder>>,
    workload: Arc<Workload>,
    shared: Arc<Shared>,
    mode: Mode,
    depth: usize,
    spin: Duration,
    seed: u64,
    rr: usize,
    /// Closed loop: SEARCHes per SEARCH_BATCH frame (`EngineConfig::batch`).
    batch: Option<usize>,
}

/// Requests queued before a flush while catching up, so a sender that is behind sends
/// in batches instead of a syscall per request.
const MAX_BATCH: usize = 64;

impl Sender {
    fn flush_all(&mut self) {
        for c in &mut self.conns {
            c.flush();
        }
    }

    fn all_dead(&self) -> bool {
        self.conns
            .iter()
            .all(|c| c.shared.dead.load(Ordering::SeqCst))
    }

    /// A live connection with a free slot, round robin.
    fn pick(&mut self) -> Option<usize> {
        let n = self.conns.len();
        for k in 0..n {
            let i = (self.rr + k) % n;
            if self.conns[i].shared.free(self.depth) {
                self.rr = (i + 1) % n;
                return Some(i);
            }
        }
        None
    }

    /// Sleeps until a reply frees a slot, `deadline`, or 100 ms (a bound that also
    /// covers a connection dying without a wake-up).
    fn wait_for_slot(&self, deadline: Instant) {
        let g = lock(&self.notify.lock);
        self.notify.waiting.store(true, Ordering::SeqCst);
        let depth = self.depth;
        if !self.conns.iter().any(|c| c.shared.free(depth)) && !self.all_dead() {
            let t = deadline
                .saturating_duration_since(Instant::now())
                .min(Duration::from_millis(100));
            if !t.is_zero() {
                let _ = self.notify.cv.wait_timeout(g, t);
            }
        }
        self.notify.waiting.store(false, Ordering::SeqCst);
    }

    fn fail_unsent(&self, n: u64) {
        let mut r = lock(&self.recorder);
        r.interval.errors += n;
        r.run.record_errors(None, ERR_NOT_SENT, n);
    }

    /// Runs the schedule; returns why it stopped and where the covered span ends.
    fn run(mut self) -> (StopReason, Instant) {
        set_fine_timer_slack();
        let out = match self.mode {
            Mode::Open { rate, arrival } => self.open_loop(rate, arrival),
            Mode::Closed => self.closed_loop(),
        };
        self.flush_all();
        out
    }

    fn open_loop(&mut self, rate: f64, arrival: Arrival) -> (StopReason, Instant) {
        let clock = &self.shared.clock;
        let (start, measure_from, end, drain) = (
            clock.start,
            clock.measure_from,
            clock.end,
            clock.drain_deadline,
        );
        let mut sched = Schedule::new(start, rate, self.threads, self.index, arrival, self.seed);
        let mut picker = self.workload.picker(self.index);
        let mut t = sched.next_instant();
        let mut batch = 0;
        loop {
            if t >= end {
                return (StopReason::Duration, end);
            }
            let now = Instant::now();
            let lost = self.all_dead();
            if now >= drain || lost {
                // What the schedule still owed counts against the run, not silently away.
                // (An upper bound when a trace end or --requests would have come first.)
                let owed = u64::from(t >= measure_from) + sched.count_between(measure_from, end);
                let owed = match self.shared.max_requests {
                    Some(max) => owed
                        .min(max.saturating_sub(self.shared.measured_sent.load(Ordering::Relaxed))),
                    None => owed,
                };
                self.fail_unsent(owed);
                let why = if lost {
                    StopReason::ConnectionsLost
                } else {
                    StopReason::DrainDeadline
                };
                return (why, end);
            }
            if t > now {
                self.flush_all();
                batch = 0;
                let wait = t - now;
                if wait > self.spin {
                    thread::sleep(wait - self.spin);
                } else {
                    while Instant::now() < t {
                        std::hint::spin_loop();
                    }
                }
                continue;
            }
            let Some(ci) = self.pick() else {
                self.flush_all();
                batch = 0;
                self.wait_for_slot(drain);
                continue;
            };
            let Some(plan) = picker.next(&self.workload) else {
                return (StopReason::TraceEnd, t);
            };
            let measured = t >= measure_from;
            if measured && !self.shared.take_budget() {
                return (StopReason::RequestCount, t);
            }
            self.conns[ci].queue(&self.workload, plan, t, measured);
            t = sched.next_instant();
            batch += 1;
            if batch >= MAX_BATCH {
                self.flush_all();
                batch = 0;
            }
        }
    }

    fn closed_loop(&mut self) -> (StopReason, Instant) {
        let (measure_from, end) = (self.shared.clock.measure_from, self.shared.clock.end);
        let mut picker = self.workload.picker(self.index);
        let start = self.shared.clock.start;
        if let Some(d) = start.checked_duration_since(Instant::now()) {
            thread::sleep(d);
        }
        loop {
            let now = Instant::now();
            if now >= end {
                return (StopReason::Duration, end);
            }
            let Some(ci) = self.pick() else {
                self.flush_all();
                if self.all_dead() {
                    return (StopReason::ConnectionsLost, now);
                }
                self.wait_for_slot(end);
                continue;
            };
            let Some(plan) = picker.next(&self.workload) else {
                return (StopReason::TraceEnd, now);
            };
            let measured = now >= measure_from;
            if measured && !self.shared.take_budget() {
                return (StopReason::RequestCount, now);
            }
            if let (Some(n), OpKind::Search) = (self.batch, plan.kind) {
                if let Some(stop) = self.send_batch(ci, &mut picker, plan, n, measured, now) {
                    return (stop, now);
                }
                continue;
            }
            // Closed loop: the request is meant to go now; there is no schedule to fall
            // behind.
            self.conns[ci].queue(&self.workload, plan, now, measured);
        }
    }

    /// Closed loop with batches: `first` and up to `n - 1` more SEARCHes of its k in one
    /// SEARCH_BATCH frame. A write (or another k) that comes up goes out on its own
    /// after the frame. `Some` when the workload or the request budget ran out.
    fn send_batch(
        &mut self,
        ci: usize,
        picker: &mut crate::workload::Picker,
        first: Planned,
        n: usize,
        measured: bool,
        now: Instant,
    ) -> Option<StopReason> {
        let mut batch = vec![first];
        let mut stop = None;
        let mut apart = None;
        while batch.len() < n {
            let Some(plan) = picker.next(&self.workload) else {
                stop = Some(StopReason::TraceEnd);
                break;
            };
            if measured && !self.shared.take_budget() {
                stop = Some(StopReason::RequestCount);
                break;
            }
            if plan.kind != OpKind::Search || plan.k != first.k {
                apart = Some(plan);
                break;
            }
            batch.push(plan);
        }
        self.conns[ci].queue_batch(&self.workload, batch, now, measured);
        if let Some(plan) = apart {
            self.conns[ci].queue(&self.workload, plan, now, measured);
        }
        stop
    }
}

/// Linux rounds sleeps up by the thread's timer slack (50 µs by default); the schedule
/// wants its instants kept closer than that.
fn set_fine_timer_slack() {
    #[cfg(target_os = "linux")]
    // SAFETY: PR_SET_TIMERSLACK takes an integer argument and only affects this thread.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0);
    }
}

/// The receiving half of one connection.
fn receive(
    mut stream: SplitRead,
    conn: Arc<ConnShared>,
    workload: Arc<Workload>,
    shared: Arc<Shared>,
    max_frame: usize,
) {
    let mut buf = vec![0u8; 64 * 1024];
    let (mut start, mut end) = (0usize, 0usize);
    loop {
        if shared.finished.load(Ordering::SeqCst) {
            return;
        }
        if end == buf.len() {
            if start > 0 {
                buf.copy_within(start..end, 0);
                end -= start;
                start = 0;
            } else if buf.len() < max_frame {
                // The decoder refuses frames over max_frame, so the buffer stays bounded.
                let grown = (buf.len() * 2).min(max_frame);
                buf.resize(grown, 0);
            } else {
                conn.fail_all("reply larger than the frame limit");
                return;
            }
        }
        let n = match stream.read(&mut buf[end..]) {
            Ok(0) => {
                if !shared.finished.load(Ordering::SeqCst) {
                    conn.fail_all(ERR_CONN_LOST);
                }
                return;
            }
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) =>
            {
                continue
            }
            Err(_) => {
                if !shared.finished.load(Ordering::SeqCst) {
                    conn.fail_all(ERR_CONN_LOST);
                }
                return;
            }
        };
        // Every reply in this read arrived now; decoding them is not their latency.
        let now = Instant::now();
        end += n;
        loop {
            match decode_reply(&buf[start..end], max_frame) {
                Ok(Some((frame, used))) => {
                    start += used;
                    if frame.request_id == 0 && frame.reply.op_code() == CONNECTION_OP {
                        // Connection-level (BUSY over max_connections, SHUTTING_DOWN):
                        // the server closes after it.
                        conn.fail_all(&format!("{} (connection)", frame.reply.status()));
                        let _ = stream.shutdown();
                        return;
                    }
                    if !complete(&conn, &workload, frame.request_id, Ok(frame.reply), now) {
                        conn.fail_all("reply to a request not in flight");
                        let _ = stream.shutdown();
                        return;
                    }
                }
                Ok(None) => break,
                Err(e) => match e.consumed() {
                    Some(used) => {
                        // One undecodable reply: it answers its request with an error.
                        start += used;
                        let id = e.error_reply().request_id;
                        complete(&conn, &workload, id, Err("undecodable reply"), now);
                    }
                    None => {
                        conn.fail_all("reply framing lost");
                        let _ = stream.shutdown();
                        return;
                    }
                },
            }
        }
        if start == end {
            start = 0;
            end = 0;
        }
    }
}

fn opcode(kind: OpKind) -> Opcode {
    match kind {
        OpKind::Search => Opcode::Search,
        OpKind::Insert => Opcode::Insert,
        OpKind::Delete => Opcode::Delete,
    }
}

/// Records the answer to request `id`; false when no such request is in flight.
fn complete(
    conn: &ConnShared,
    workload: &Workload,
    id: u64,
    reply: Result<Reply, &str>,
    now: Instant,
) -> bool {
    let Some(p) = lock(&conn.pending).remove(&id) else {
        return false;
    };
    conn.in_flight.fetch_sub(1, Ordering::SeqCst);
    conn.notify.wake();
    let latency = now.saturating_duration_since(p.intended).as_micros() as u64;
    let uncorrected = now.saturating_duration_since(p.sent).as_micros() as u64;
    if !p.batch.is_empty() {
        record_batch(conn, workload, &p, reply, latency, uncorrected);
        return true;
    }
    let refused = matches!(reply, Ok(Reply::Error { .. }));
    let outcome: Result<(Option<_>, Option<f64>), String> = match &reply {
        Err(why) => Err((*why).to_string()),
        Ok(Reply::Error { status, .. }) => Err(status.name().to_string()),
        Ok(Reply::Search(s)) if p.plan.kind == OpKind::Search => {
            Ok((Some(s.hit), workload.recall(&p.plan, &s.neighbors)))
        }
        Ok(r) if r.answers(opcode(p.plan.kind)) => Ok((None, None)),
        Ok(_) => Err("reply of the wrong operation".to_string()),
    };
    let mut r = lock(&conn.recorder);
    match outcome {
        Ok((hit, recall)) => {
            r.interval.hist.saturating_record(latency.max(1));
            if p.measured {
                r.run
                    .record_ok(p.plan.kind, hit, latency, uncorrected, recall);
            }
        }
        Err(cause) => {
            r.interval.errors += 1;
            if p.measured {
                r.run.record_errors(Some(p.plan.kind), &cause, 1);
                if refused {
                    r.run.error_replies.saturating_record(latency.max(1));
                }
            }
        }
    }
    true
}

/// A SEARCH_BATCH's answer, one query at a time: each query answered has the frame's
/// latency and its own hit kind and recall; a failed item counts as its status, and a
/// frame that failed as a whole fails every query in it.
fn record_batch(
    conn: &ConnShared,
    workload: &Workload,
    p: &Pending,
    reply: Result<Reply, &str>,
    latency: u64,
    uncorrected: u64,
) {
    let items = match reply {
        Ok(Reply::SearchBatch(items)) if items.len() == p.batch.len() => items,
        failed => {
            let cause = match failed {
                Err(why) => why.to_string(),
                Ok(Reply::Error { status, .. }) => status.name().to_string(),
                Ok(Reply::SearchBatch(items)) => format!(
                    "a batch of {} queries answered with {} items",
                    p.batch.len(),
                    items.len()
                ),
                Ok(_) => "reply of the wrong operation".to_string(),
            };
            let mut r = lock(&conn.recorder);
            r.interval.errors += p.operations();
            if p.measured {
                r.run
                    .record_errors(Some(OpKind::Search), &cause, p.operations());
            }
            return;
        }
    };
    let mut r = lock(&conn.recorder);
    for (plan, item) in p.batch.iter().zip(items) {
        match item {
            Ok(s) => {
                r.interval.hist.saturating_record(latency.max(1));
                if p.measured {
                    let recall = workload.recall(plan, &s.neighbors);
                    r.run
                        .record_ok(OpKind::Search, Some(s.hit), latency, uncorrected, recall);
                }
            }
            Err(status) => {
                r.interval.errors += 1;
                if p.measured {
                    r.run.record_errors(Some(OpKind::Search), status.name(), 1);
                }
            }
        }
    }
}

/// Runs one load test. `on_line` gets each per-second line as it happens.
pub fn run(
    cfg: &EngineConfig,
    workload: &Arc<Workload>,
    mut on_line: impl FnMut(&IntervalLine),
) -> std::io::Result<RunResult> {
    let connections = cfg.connections.max(1);
    let threads = cfg.threads.clamp(1, connections);
    // Connect everything before the clock starts.
    let streams = connect_all(cfg, connections)?;
    // A short lead so every thread is up before the first intended instant.
    let start = Instant::now() + Duration::from_millis(20);
    let measure_from = start + cfg.warmup;
    let end = measure_from + cfg.duration;
    let shared = Arc::new(Shared {
        clock: Clock {
            start,
            measure_from,
            end,
            drain_deadline: end + cfg.drain,
        },
        max_requests: cfg.max_requests,
        measured_sent: AtomicU64::new(0),
        finished: AtomicBool::new(false),
    });
    let load = Load {
        cfg,
        workload,
        shared: &shared,
        threads,
        depth: cfg.depth.max(1),
        recorders: (0..threads)
            .map(|_| Arc::new(Mutex::new(Recorder::default())))
            .collect(),
        notifies: (0..threads).map(|_| Arc::new(Notify::default())).collect(),
    };
    let wired = load.wire(streams)?;
    let senders = load.spawn_senders(wired.per_thread)?;
    let intervals = load.report_intervals(&senders, &wired.conns, &mut on_line);
    let (stop, covered_until) =
        load.wind_down(&wired.conns, &wired.closers, senders, wired.receivers)?;

    let mut stats = RunStats::default();
    for r in &load.recorders {
        stats.merge(&lock(r).run);
    }
    let measured_secs = covered_until
        .min(end)
        .saturating_duration_since(measure_from)
        .as_secs_f64();
    Ok(RunResult {
        stats,
        intervals,
        measured_secs,
        sent: shared.measured_sent.load(Ordering::Relaxed),
        stop,
    })
}

fn connect_all(cfg: &EngineConfig, connections: usize) -> std::io::Result<Vec<Connected>> {
    let mut conns = Vec::with_capacity(connections);
    for _ in 0..connections {
        let s = TcpStream::connect_timeout(&cfg.target, cfg.connect_timeout)?;
        s.set_nodelay(true)?;
        let c = if cfg.secret.is_some() || cfg.tls.is_some() {
            handshake(s, cfg)?
        } else {
            Connected {
                read: SplitRead::Plain(s.try_clone()?),
                write: SplitWrite::Plain(s.try_clone()?),
                sock: s,
            }
        };
        c.sock
            .set_write_timeout(Some(cfg.write_timeout.max(Duration::from_millis(1))))?;
        conns.push(c);
    }
    Ok(conns)
}

/// One connection, ready for its reading and its writing thread.
struct Connected {
    read: SplitRead,
    write: SplitWrite,
    /// The socket, for its timeouts and the shutdown that ends the run.
    sock: TcpStream,
}

/// TLS (with `cfg.tls`) and HELLO + AUTH (with a secret) on a fresh socket, which then
/// carries the run's requests.
fn handshake(s: TcpStream, cfg: &EngineConfig) -> std::io::Result<Connected> {
    let opts = aker::client::ClientOptions {
        connect_timeout: cfg.connect_timeout,
        io_timeout: Some(cfg.connect_timeout),
        secret: cfg.secret.clone(),
        tls: cfg.tls.clone(),
        ..Default::default()
    };
    let mut c = aker::client::Client::from_stream(s, opts).map_err(std::io::Error::other)?;
    if cfg.secret.is_some() {
        c.hello()
            .map_err(|e| std::io::Error::other(format!("HELLO / AUTH: {e}")))?;
    }
    let (read, write, sock) = c.into_split().map_err(std::io::Error::other)?;
    Ok(Connected { read, write, sock })
}

/// One run's threads and what they share: a recorder and a wake-up per sender thread.
struct Load<'a> {
    cfg: &'a EngineConfig,
    workload: &'a Arc<Workload>,
    shared: &'a Arc<Shared>,
    threads: usize,
    depth: usize,
    recorders: Vec<Arc<Mutex<Recorder>>>,
    notifies: Vec<Arc<Notify>>,
}

/// The connections once wired: each one's sending half (by sender thread), its shared
/// state, its receiver thread, and a handle to close it with.
struct Wired {
    per_thread: Vec<Vec<SendConn>>,
    conns: Vec<Arc<ConnShared>>,
    receivers: Vec<thread::JoinHandle<()>>,
    closers: Vec<TcpStream>,
}

type SenderHandle = thread::JoinHandle<(StopReason, Instant)>;

impl Load<'_> {
    /// Connection `i` goes to sender thread `i % threads`; each gets a receiver thread.
    fn wire(&self, streams: Vec<Connected>) -> std::io::Result<Wired> {
        let n = streams.len();
        let mut w = Wired {
            per_thread: (0..self.threads).map(|_| Vec::new()).collect(),
            conns: Vec::with_capacity(n),
            receivers: Vec::with_capacity(n),
            closers: Vec::with_capacity(n),
        };
        for (i, stream) in streams.into_iter().enumerate() {
            let t = i % self.threads;
            let cs = Arc::new(ConnShared {
                pending: Mutex::new(HashMap::with_capacity(self.depth)),
                in_flight: AtomicUsize::new(0),
                dead: AtomicBool::new(false),
                notify: self.notifies[t].clone(),
                recorder: self.recorders[t].clone(),
            });
            let Connected {
                read: read_half,
                write: stream,
                sock,
            } = stream;
            // The timeout only bounds how long a quiet connection takes to notice the end.
            sock.set_read_timeout(Some(Duration::from_millis(50)))?;
            w.closers.push(sock);
            let (c, wl, s, mf) = (
                cs.clone(),
                self.workload.clone(),
                self.shared.clone(),
                self.cfg.max_frame_bytes,
            );
            w.receivers.push(
                thread::Builder::new()
                    .name(format!("loadgen-recv-{i}"))
                    .spawn(move || receive(read_half, c, wl, s, mf))?,
            );
            w.per_thread[t].push(SendConn {
                stream,
                shared: cs.clone(),
                wbuf: Vec::new(),
                next_id: 1,
            });
            w.conns.push(cs);
        }
        Ok(w)
    }

    fn spawn_senders(&self, per_thread: Vec<Vec<SendConn>>) -> std::io::Result<Vec<SenderHandle>> {
        let mut senders = Vec::with_capacity(self.threads);
        for (t, conns) in per_thread.into_iter().enumerate() {
            let s = Sender {
                index: t,
                threads: self.threads,
                conns,
                notify: self.notifies[t].clone(),
                recorder: self.recorders[t].clone(),
                workload: self.workload.clone(),
                shared: self.shared.clone(),
                mode: self.cfg.mode,
                depth: self.depth,
                spin: self.cfg.spin,
                seed: self.cfg.seed,
                rr: 0,
                batch: self.cfg.batch,
            };
            senders.push(
                thread::Builder::new()
                    .name(format!("loadgen-send-{t}"))
                    .spawn(move || s.run())?,
            );
        }
        Ok(senders)
    }

    /// Per-second lines until every sender is done and nothing is in flight, or the
    /// drain deadline. Ticks are whole seconds from the start during the warm-up, with
    /// a short one ending exactly where counting begins, so no line mixes the two.
    fn report_intervals(
        &self,
        senders: &[SenderHandle],
        conns: &[Arc<ConnShared>],
        on_line: &mut impl FnMut(&IntervalLine),
    ) -> Vec<IntervalLine> {
        let c = &self.shared.clock;
        let (start, measure_from, end) = (c.start, c.measure_from, c.end);
        let mut intervals = Vec::new();
        let mut tick_start = start;
        let tick_after = |t: Instant| {
            let next = t + Duration::from_secs(1);
            if t < measure_from {
                next.min(measure_from)
            } else if t < end {
                next.min(end)
            } else {
                next
            }
        };
        loop {
            let now = Instant::now();
            let senders_done = senders.iter().all(|h| h.is_finished());
            let idle = conns
                .iter()
                .all(|c| c.in_flight.load(Ordering::SeqCst) == 0);
            let over = (senders_done && idle) || now >= c.drain_deadline;
            let tick_end = tick_after(tick_start);
            if now >= tick_end || (over && now > tick_start) {
                let at = tick_end.min(now);
                let line = self.interval_line(tick_start, at);
                // A final partial interval with nothing in it is not worth a line.
                if at == tick_end || line.rate > 0.0 || line.errors > 0 {
                    on_line(&line);
                    intervals.push(line);
                }
                tick_start = at;
            }
            if over {
                return intervals;
            }
            let next = tick_after(tick_start).min(now + Duration::from_millis(20));
            thread::sleep(next.saturating_duration_since(Instant::now()));
        }
    }

    /// The line of the interval `from..at`: every sender thread's interval, merged.
    fn interval_line(&self, from: Instant, at: Instant) -> IntervalLine {
        let c = &self.shared.clock;
        let (start, measure_from, end) = (c.start, c.measure_from, c.end);
        let mut merged = crate::stats::Interval::default();
        for r in &self.recorders {
            let i = std::mem::take(&mut lock(r).interval);
            merged.hist.add(&i.hist).expect("same bounds");
            merged.errors += i.errors;
        }
        let phase = if at <= measure_from {
            Phase::Warmup
        } else if from >= end {
            Phase::Drain
        } else {
            Phase::Run
        };
        IntervalLine::from_interval(
            at.saturating_duration_since(start).as_secs_f64(),
            phase,
            at.saturating_duration_since(from).as_secs_f64(),
            &merged,
        )
    }

    /// Ends the run: what never got a reply is counted, every connection closed, every
    /// thread joined. Returns why the senders stopped and how far they covered.
    fn wind_down(
        &self,
        conns: &[Arc<ConnShared>],
        closers: &[TcpStream],
        senders: Vec<SenderHandle>,
        receivers: Vec<thread::JoinHandle<()>>,
    ) -> std::io::Result<(StopReason, Instant)> {
        self.shared.finished.store(true, Ordering::SeqCst);
        let no_reply = |conn: &ConnShared| {
            let left: Vec<Pending> = lock(&conn.pending).drain().map(|(_, p)| p).collect();
            conn.in_flight.fetch_sub(left.len(), Ordering::SeqCst);
            record_failures(&conn.recorder, &left, ERR_NO_REPLY);
        };
        for c in conns {
            no_reply(c);
            c.dead.store(true, Ordering::SeqCst);
            c.notify.wake();
        }
        // Unblocks a sender stuck in a write and every receiver.
        for s in closers {
            let _ = s.shutdown(Shutdown::Both);
        }
        let mut stop = StopReason::Duration;
        let mut covered_until = self.shared.clock.measure_from;
        for h in senders {
            let (why, until) = h
                .join()
                .map_err(|_| std::io::Error::other("a sender thread panicked"))?;
            if why.rank() > stop.rank() {
                stop = why;
            }
            covered_until = covered_until.max(until);
        }
        for h in receivers {
            h.join()
                .map_err(|_| std::io::Error::other("a receiver thread panicked"))?;
        }
        // A request queued after the first sweep above (a sender racing the deadline).
        for c in conns {
            no_reply(c);
        }
        Ok((stop, covered_until))
    }
}
