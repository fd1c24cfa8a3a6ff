//! One connection: a reader task that decodes and dispatches, one detached task per
//! request in the service, and a writer task that batches encoded replies into writes.
//! See the diagram in `server/mod.rs`.

use std::cell::{Cell, RefCell};
use std::io;
use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::rc::Rc;
use std::time::{Duration, Instant};

use futures_lite::{future, AsyncReadExt, AsyncWriteExt, FutureExt};
use glommio::net::TcpStream;
use glommio::timer::Timer;

use super::state::ExecutorCtx;
use super::stats::ServerStats;
use super::sync::Signal;
use super::tls::{self, Accepted};
use super::transport::Io;
use super::{RequestContext, ServiceResult};
use crate::metrics;
use crate::protocol::{
    self, encode_reply, validate, BatchItem, Opcode, Reply, ReplyFrame, Request, RequestFrame,
    SearchBatchRequest, Status, CONNECTION_OP, HEADER_LEN,
};

/// Read buffer to start with; grows to the largest frame seen, shrinks back when idle.
const INITIAL_READ: usize = 16 * 1024;
/// Error messages are for people; keep them from eating a small client's frame budget.
const MAX_MESSAGE: usize = 256;
/// How long a closing connection keeps reading (and discarding) so that our last reply
/// reaches the peer before the close: closing with unread input sends RST, and the peer's
/// kernel may then drop the reply it has not read yet.
const LINGER: Duration = Duration::from_millis(500);
/// Largest frame a connection may send before it has authenticated (with `[auth]`):
/// room for HELLO, AUTH and a short PING, so a peer without the secret cannot make the
/// server buffer `max_frame_bytes` per connection.
const PRE_AUTH_FRAME_BYTES: usize = 1024;
const LINGER_BYTES: usize = 1 << 20;

/// State shared by a connection's tasks.
struct ConnState {
    /// Encoded replies not yet handed to the writer.
    out: RefCell<Vec<u8>>,
    /// Wakes the writer: output queued, a request finished, or closing.
    writer_wake: Signal,
    /// Wakes the reader: output drained below the high-water mark, or the writer died.
    reader_wake: Signal,
    /// Wakes the connection task while it waits for in-flight requests at shutdown.
    done_wake: Signal,
    inflight: Cell<u32>,
    /// The reader has stopped: the writer exits once nothing is in flight or queued.
    closing: Cell<bool>,
    /// The writer failed (peer gone, write timeout): drop output, stop reading.
    dead: Cell<bool>,
    max_frame: usize,
    stats: std::sync::Arc<ServerStats>,
    /// With authentication on: this connection's challenge (sent in its version 3
    /// HELLO replies, spent by its AUTH).
    challenge: Option<[u8; crate::auth::NONCE_LEN]>,
    /// Requests other than HELLO, PING and AUTH are served (always, without auth).
    authenticated: Cell<bool>,
}

impl ConnState {
    /// Encodes `reply` for `request_id` into the output buffer. A reply that cannot be
    /// encoded or is over the frame limit becomes INTERNAL, so the peer always gets an
    /// answer it can read.
    /// Queues a reply in `version` (the request's: a version 1 client gets version 1).
    fn push(&self, request_id: u64, version: u8, reply: Reply) {
        if self.dead.get() {
            return;
        }
        let op = reply.op_code();
        let reply = match reply {
            Reply::Error {
                op,
                status,
                mut message,
            } => {
                truncate_utf8(&mut message, MAX_MESSAGE);
                Reply::Error {
                    op,
                    status,
                    message,
                }
            }
            r => r,
        };
        let mut out = self.out.borrow_mut();
        let start = out.len();
        let frame = ReplyFrame {
            request_id,
            version,
            reply,
        };
        let failure = match encode_reply(&frame, &mut out) {
            Ok(n) if n <= self.max_frame => None,
            Ok(n) => {
                out.truncate(start);
                Some(format!("reply of {n} bytes is over server.frame_bytes_max"))
            }
            Err(e) => Some(format!("reply cannot be encoded: {e}")),
        };
        if let Some(msg) = failure {
            ServerStats::inc(&self.stats.internal_errors);
            tracing::warn!(request_id, "{msg}");
            let fallback = ReplyFrame {
                request_id,
                version,
                reply: Reply::error(op, Status::Internal, msg),
            };
            // A short error always encodes and fits (max_frame >= 256 by config).
            let _ = encode_reply(&fallback, &mut out);
        }
        ServerStats::inc(&self.stats.replies);
        drop(out);
        self.writer_wake.notify();
    }

    fn push_error(
        &self,
        request_id: u64,
        version: u8,
        op: u8,
        status: Status,
        message: impl Into<String>,
    ) {
        self.push(request_id, version, Reply::error(op, status, message));
    }
}

fn truncate_utf8(s: &mut String, max: usize) {
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
}

/// Why the reader stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReadEnd {
    /// The peer closed its side.
    Eof,
    /// Framing lost; the error reply is queued.
    FramingLost,
    /// Executor shutdown.
    Shutdown,
    /// Nothing in flight and nothing received for `idle_timeout_ms`.
    Idle,
    /// Read error, or the writer died.
    Failed,
    /// An AUTH whose proof did not hold; its UNAUTHENTICATED reply is queued.
    AuthFailed,
}

/// Serves one accepted connection to the end. Never panics on peer input; all waits are
/// bounded by the configured timeouts or by shutdown.
pub(crate) async fn serve_connection(stream: TcpStream, peer: SocketAddr, ctx: Rc<ExecutorCtx>) {
    let cfg = ctx.server.config();
    let _ = stream.set_nodelay(true);
    if cfg.idle_timeout_ms > 0 {
        let _ = stream.set_read_timeout(Some(Duration::from_millis(cfg.idle_timeout_ms)));
    }
    if cfg.write_timeout_ms > 0 {
        let _ = stream.set_write_timeout(Some(Duration::from_millis(cfg.write_timeout_ms)));
    }
    let accepted_at = Instant::now();
    let io = match ctx.server.tls() {
        None => Io::new(stream),
        Some(acceptor) => match tls_accept(acceptor, stream, peer, &ctx).await {
            Some(io) => io,
            None => return,
        },
    };
    let conn = Rc::new(ConnState {
        out: RefCell::new(Vec::new()),
        writer_wake: Signal::default(),
        reader_wake: Signal::default(),
        done_wake: Signal::default(),
        inflight: Cell::new(0),
        closing: Cell::new(false),
        dead: Cell::new(false),
        max_frame: cfg.max_frame_bytes as usize,
        stats: ctx.server.stats_arc(),
        challenge: ctx.server.secret().map(|_| crate::auth::random_nonce()),
        authenticated: Cell::new(ctx.server.secret().is_none()),
    });
    let writer = glommio::spawn_local(writer(conn.clone(), io.clone()));
    if conn.challenge.is_some() && cfg.auth_timeout_ms > 0 {
        // Not authenticated in time (from accept, a TLS handshake included): dropped, as
        // a peer that stopped reading would be.
        let wait = Duration::from_millis(cfg.auth_timeout_ms).saturating_sub(accepted_at.elapsed());
        let c = conn.clone();
        glommio::spawn_local(async move {
            Timer::new(wait).await;
            if !c.authenticated.get() && !c.dead.get() {
                tracing::debug!(%peer, "not authenticated within auth_timeout_ms; closing");
                c.dead.set(true);
                c.reader_wake.notify();
                c.writer_wake.notify();
            }
        })
        .detach();
    }

    let end = reader(&conn, &io, &ctx, peer).await;
    tracing::debug!(%peer, ?end, "connection reader stopped");

    if end == ReadEnd::Shutdown {
        // Let in-flight requests answer (each is bounded by its deadline, and the whole
        // executor by shutdown_grace_ms), then say why we close.
        while conn.inflight.get() > 0 && !conn.dead.get() {
            conn.done_wake.wait().await;
        }
        conn.push_error(
            0,
            protocol::VERSION_MIN,
            CONNECTION_OP,
            Status::ShuttingDown,
            "server is shutting down",
        );
    }
    conn.closing.set(true);
    conn.writer_wake.notify();
    writer.await;

    if matches!(
        end,
        ReadEnd::FramingLost | ReadEnd::Shutdown | ReadEnd::Idle | ReadEnd::AuthFailed
    ) && !conn.dead.get()
    {
        linger_close(&io).await;
    }
}

/// The TLS handshake of a connection, counted; `None`: closed (or shutting down).
async fn tls_accept(
    acceptor: &tls::TlsAcceptor,
    stream: TcpStream,
    peer: SocketAddr,
    ctx: &Rc<ExecutorCtx>,
) -> Option<Io> {
    let stats = ctx.server.stats();
    let accepted = future::or(
        async { Some(tls::accept(acceptor, &ctx.handshakes, stream).await) },
        async {
            ctx.shutdown.wait().await;
            None
        },
    )
    .await;
    match accepted? {
        Accepted::Tls(s) => {
            ServerStats::inc(&stats.tls_handshakes);
            return Some(Io::tls(s));
        }
        Accepted::Plaintext => {
            ServerStats::inc(&stats.tls_plaintext_refused);
            tracing::debug!(%peer, "plaintext client on the TLS port; told and closed");
        }
        Accepted::Closed => tracing::debug!(%peer, "closed before a TLS handshake"),
        Accepted::TimedOut => {
            ServerStats::inc(&stats.tls_handshake_timeouts);
            tracing::debug!(%peer, "no TLS handshake within tls.handshake_timeout_ms");
        }
        Accepted::Failed(e) => {
            ServerStats::inc(&stats.tls_handshake_failures);
            tracing::debug!(%peer, error = %e, "TLS handshake failed");
        }
    }
    None
}

/// Sends FIN after our last bytes, then discards input until the peer closes (bounded).
pub(crate) async fn linger_close(io: &Io) {
    let mut io = io.clone();
    // poll_close is glommio's shutdown(SHUT_WR): a FIN after everything written.
    if io.close().await.is_err() {
        return;
    }
    let mut sink = [0u8; 4096];
    let mut discarded = 0;
    future::or(
        async {
            while discarded < LINGER_BYTES {
                match io.read(&mut sink).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => discarded += n,
                }
            }
        },
        async {
            Timer::new(LINGER).await;
        },
    )
    .await;
}

async fn reader(conn: &Rc<ConnState>, io: &Io, ctx: &Rc<ExecutorCtx>, peer: SocketAddr) -> ReadEnd {
    let max_frame = ctx.server.config().max_frame_bytes as usize;
    let mut io = io.clone();
    let mut rb = ReadBuf::new(max_frame);
    loop {
        if let Some(end) = dispatch_frames(conn, ctx, &mut rb, peer).await {
            return end;
        }
        if !rb.make_room(max_frame, peer) {
            return ReadEnd::Failed;
        }

        enum Woke {
            Read(io::Result<usize>),
            Stop,
        }
        let woke = future::or(async { Woke::Read(io.read(rb.free()).await) }, async {
            future::or(ctx.shutdown.wait(), conn.reader_wake_until_dead()).await;
            Woke::Stop
        })
        .await;
        match woke {
            Woke::Stop if conn.dead.get() => return ReadEnd::Failed,
            Woke::Stop => return ReadEnd::Shutdown,
            Woke::Read(Ok(0)) => return ReadEnd::Eof,
            Woke::Read(Ok(n)) => {
                rb.end += n;
                // TLS records the read produced (transport.rs): the writer sends them.
                if io.output_pending() {
                    conn.writer_wake.notify();
                }
            }
            Woke::Read(Err(e)) if e.kind() == io::ErrorKind::TimedOut => {
                // The read timeout is the idle timeout; it only counts while we owe the
                // peer nothing.
                if conn.inflight.get() == 0 && conn.out.borrow().is_empty() {
                    return ReadEnd::Idle;
                }
            }
            Woke::Read(Err(e)) => {
                tracing::debug!(%peer, error = %e, "read failed");
                return ReadEnd::Failed;
            }
        }
    }
}

/// The reader's buffer: `buf[start..end]` is read and not yet decoded.
struct ReadBuf {
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

impl ReadBuf {
    fn new(max_frame: usize) -> ReadBuf {
        ReadBuf {
            buf: vec![0u8; INITIAL_READ.min(max_frame)],
            start: 0,
            end: 0,
        }
    }

    /// Where the next read goes.
    fn free(&mut self) -> &mut [u8] {
        &mut self.buf[self.end..]
    }

    /// Makes room: reset, compact, or grow toward the frame being read. `false` when the
    /// buffer is full without a complete frame (the connection is closed).
    fn make_room(&mut self, max_frame: usize, peer: SocketAddr) -> bool {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
            if self.buf.len() > 4 * INITIAL_READ {
                self.buf = vec![0u8; INITIAL_READ.min(max_frame)];
            }
        }
        if self.end < self.buf.len() {
            return true;
        }
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
            return true;
        }
        // The decoder refused frames over max_frame, so this one fits in max_frame.
        let want = protocol::peek_header(&self.buf[..self.end])
            .map(|h| h.frame_len() as usize)
            .unwrap_or(HEADER_LEN);
        let grown = (self.buf.len() * 2)
            .max(want)
            .min(max_frame.max(HEADER_LEN));
        if grown <= self.buf.len() {
            // Unreachable with a correct decoder; close rather than spin.
            tracing::error!(%peer, "read buffer full without a complete frame");
            return false;
        }
        self.buf.resize(grown, 0);
        true
    }
}

/// Dispatches every complete frame in the buffer; `Some` when the reader must stop.
async fn dispatch_frames(
    conn: &Rc<ConnState>,
    ctx: &Rc<ExecutorCtx>,
    rb: &mut ReadBuf,
    peer: SocketAddr,
) -> Option<ReadEnd> {
    let cfg = ctx.server.config();
    let max_frame = cfg.max_frame_bytes as usize;
    let high_water = cfg.output_high_water_bytes;
    loop {
        if conn.dead.get() {
            return Some(ReadEnd::Failed);
        }
        // Back-pressure: a peer that does not read its replies stops being read.
        if conn.out.borrow().len() > high_water {
            ServerStats::inc(&ctx.server.stats().output_stalls);
            while conn.out.borrow().len() > high_water && !conn.dead.get() {
                conn.reader_wake.wait().await;
            }
        }
        let limit = if conn.authenticated.get() {
            max_frame
        } else {
            max_frame.min(PRE_AUTH_FRAME_BYTES)
        };
        match protocol::decode_request(&rb.buf[rb.start..rb.end], limit) {
            Ok(None) => return None,
            Ok(Some((frame, n))) => {
                rb.start += n;
                if dispatch(conn, ctx, frame, peer) == Dispatched::Close {
                    return Some(ReadEnd::AuthFailed);
                }
            }
            Err(e) => {
                let (counter, framing) = if e.closes_connection() {
                    (&ctx.server.stats().framing_errors, true)
                } else {
                    (&ctx.server.stats().frame_errors, false)
                };
                ServerStats::inc(counter);
                tracing::debug!(%peer, error = %e, "bad frame");
                let r = e.error_reply();
                conn.push(r.request_id, r.version, r.reply);
                match e.consumed() {
                    Some(n) if !framing => rb.start += n,
                    _ => return Some(ReadEnd::FramingLost),
                }
            }
        }
    }
}

impl ConnState {
    /// Completes once the writer has died (a read that never ends must not outlive it).
    async fn reader_wake_until_dead(&self) {
        while !self.dead.get() {
            self.reader_wake.wait().await;
        }
    }
}

/// What the reader does after a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dispatched {
    Continue,
    /// A failed AUTH: its reply is queued; close the connection.
    Close,
}

/// Answers HELLO, PING and AUTH inline; refuses the rest until the connection has
/// authenticated; validates the rest and hands it to the service, or answers BUSY past
/// `max_inflight`.
fn dispatch(
    conn: &Rc<ConnState>,
    ctx: &Rc<ExecutorCtx>,
    frame: RequestFrame,
    peer: SocketAddr,
) -> Dispatched {
    let stats = ctx.server.stats();
    ServerStats::inc(&stats.requests);
    let (id, version) = (frame.request_id, frame.version);
    let op = frame.request.opcode();
    let req = match frame.request {
        Request::Hello => {
            // The encoder leaves the challenge out of a version 1 or 2 reply.
            let mut hello = ctx.hello;
            hello.auth_challenge = conn.challenge;
            conn.push(id, version, Reply::Hello(hello));
            return Dispatched::Continue;
        }
        Request::Ping(payload) => {
            conn.push(id, version, Reply::Pong(payload));
            return Dispatched::Continue;
        }
        Request::Auth(a) => return authenticate(conn, ctx, id, version, a),
        other => other,
    };
    if !conn.authenticated.get() {
        ServerStats::inc(&stats.unauthenticated_requests);
        // Versions 1 and 2 have no UNAUTHENTICATED (and no AUTH to clear it).
        let (status, message) = if version >= 3 {
            (Status::Unauthenticated, "this server requires AUTH first")
        } else {
            (
                Status::Unsupported,
                "this server requires authentication: protocol version 3 (HELLO, AUTH)",
            )
        };
        conn.push_error(id, version, op.code(), status, message);
        return Dispatched::Continue;
    }
    if let Err(r) = validate(&req, &ctx.limits) {
        ServerStats::inc(&stats.invalid_requests);
        conn.push_error(id, version, op.code(), r.status, r.message);
        return Dispatched::Continue;
    }
    // A batch holds one slot per query: max_inflight bounds the queries in the service.
    let slots = match &req {
        Request::SearchBatch(b) => b.queries.len() as u32,
        _ => 1,
    };
    let max_inflight = ctx.server.config().max_inflight;
    if u64::from(conn.inflight.get()) + u64::from(slots) > u64::from(max_inflight) {
        ServerStats::inc(&stats.busy_inflight);
        let message = if slots == 1 {
            format!("more than {max_inflight} requests in flight")
        } else {
            let free = max_inflight - conn.inflight.get();
            format!("a batch of {slots} needs {slots} of the {max_inflight} in-flight slots; {free} are free")
        };
        conn.push_error(id, version, op.code(), Status::Busy, message);
        return Dispatched::Continue;
    }
    let now = Instant::now();
    let request_deadline = match &req {
        Request::Search(s) => s.deadline().map(|d| now + d),
        Request::SearchBatch(b) => b.search(Vec::new()).deadline().map(|d| now + d),
        _ => None,
    };
    let timeout = ctx.server.config().request_timeout_ms;
    let server_deadline = (timeout > 0).then(|| now + Duration::from_millis(timeout));
    let deadline = match (request_deadline, server_deadline) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    conn.inflight.set(conn.inflight.get() + slots);
    let rctx = RequestContext {
        request_id: id,
        received: now,
        deadline,
        peer,
    };
    let (conn, ctx) = (conn.clone(), ctx.clone());
    match req {
        Request::SearchBatch(b) => glommio::spawn_local(run_batch(conn, ctx, version, b, rctx)),
        req => glommio::spawn_local(run_request(conn, ctx, op, version, req, rctx)),
    }
    .detach();
    Dispatched::Continue
}

/// AUTH: the proof for this connection's challenge, checked in constant time. A proof
/// that does not hold closes the connection, so every guess costs a connection (and the
/// per-source limit bounds how many run at once).
fn authenticate(
    conn: &ConnState,
    ctx: &ExecutorCtx,
    id: u64,
    version: u8,
    a: crate::protocol::AuthRequest,
) -> Dispatched {
    let op = Opcode::Auth.code();
    let (Some(secret), Some(challenge)) = (ctx.server.secret(), conn.challenge.as_ref()) else {
        conn.push_error(
            id,
            version,
            op,
            Status::Unsupported,
            "authentication is not enabled",
        );
        return Dispatched::Continue;
    };
    if conn.authenticated.get() {
        // The challenge is spent: one AUTH per connection.
        let why = "this connection has authenticated already";
        conn.push_error(id, version, op, Status::BadRequest, why);
        return Dispatched::Continue;
    }
    if secret.verify_client(challenge, &a.nonce, &a.proof) {
        conn.authenticated.set(true);
        let server_proof = secret.server_proof(challenge, &a.nonce);
        conn.push(id, version, Reply::Authenticated { server_proof });
        Dispatched::Continue
    } else {
        ServerStats::inc(&ctx.server.stats().auth_failures);
        conn.push_error(
            id,
            version,
            op,
            Status::Unauthenticated,
            "authentication failed",
        );
        Dispatched::Close
    }
}

/// One request in the service, raced against its deadline. A panic in the service
/// becomes INTERNAL instead of taking the executor down.
async fn run_request(
    conn: Rc<ConnState>,
    ctx: Rc<ExecutorCtx>,
    op: Opcode,
    version: u8,
    req: Request,
    rctx: RequestContext,
) {
    let id = rctx.request_id;
    let deadline = rctx.deadline;
    let stats = ctx.server.stats();
    let service = ctx.service.clone();
    let work = async {
        let handled = AssertUnwindSafe(service.handle(req, rctx))
            .catch_unwind()
            .await;
        Some(handled)
    };
    let outcome = match deadline {
        None => work.await,
        Some(d) => {
            future::or(work, async {
                Timer::new(d.saturating_duration_since(Instant::now())).await;
                None
            })
            .await
        }
    };
    let reply = match outcome {
        None => {
            ServerStats::inc(&stats.deadline_exceeded);
            Reply::error(op.code(), Status::DeadlineExceeded, "deadline exceeded")
        }
        Some(Err(_panic)) => {
            ServerStats::inc(&stats.internal_errors);
            tracing::error!(request_id = id, "service panicked handling {op}");
            Reply::error(op.code(), Status::Internal, "service panicked")
        }
        Some(Ok(result)) => service_reply(op, result, stats),
    };
    // STATS: the connection layer's counters follow the service's lines.
    let reply = match reply {
        Reply::Stats(mut text) => {
            if !ctx.service.stats_has_server_lines() {
                if !text.is_empty() && !text.ends_with('\n') {
                    text.push('\n');
                }
                metrics::write_stats(&mut text, &stats.samples());
            }
            fit_stats(&mut text, conn.max_frame);
            Reply::Stats(text)
        }
        r => r,
    };
    conn.push(id, version, reply);
    conn.inflight.set(conn.inflight.get() - 1);
    conn.writer_wake.notify();
    conn.done_wake.notify();
}

/// What a SEARCH_BATCH's query tasks share with the batch: an item per query, filled as
/// each is answered, and how many are still running.
struct BatchSlots {
    items: RefCell<Vec<Option<BatchItem>>>,
    running: Cell<usize>,
    /// Notified when the last running query is answered.
    done: Signal,
}

/// A SEARCH_BATCH: every query served as its own SEARCH (the service sees only SEARCHes)
/// in its own task, so that the executor interleaves them with other connections' work
/// as it would single SEARCHes; one reply with an item per query once all are answered
/// or the batch's deadline passes. The tasks still running then are cancelled (dropped,
/// as a single request is at its deadline) and their items are DEADLINE_EXCEEDED.
async fn run_batch(
    conn: Rc<ConnState>,
    ctx: Rc<ExecutorCtx>,
    version: u8,
    mut batch: SearchBatchRequest,
    rctx: RequestContext,
) {
    let stats = ctx.server.stats();
    let queries = std::mem::take(&mut batch.queries);
    let count = queries.len();
    ServerStats::inc(&stats.batches);
    ServerStats::add(&stats.batch_queries, count as u64);
    let slots = Rc::new(BatchSlots {
        items: RefCell::new(vec![None; count]),
        running: Cell::new(0),
        done: Signal::default(),
    });
    let mut tasks = Vec::with_capacity(count);
    for (i, q) in queries.into_iter().enumerate() {
        if let Err(r) = protocol::validate::batch_query(&q, &ctx.limits) {
            ServerStats::inc(&stats.invalid_requests);
            slots.items.borrow_mut()[i] = Some(Err(r.status));
            continue;
        }
        slots.running.set(slots.running.get() + 1);
        let req = Request::Search(batch.search(q));
        let (slots, ctx) = (slots.clone(), ctx.clone());
        tasks.push(glommio::spawn_local(async move {
            let work = async { ctx.service.handle(req, rctx).await };
            let outcome = AssertUnwindSafe(work).catch_unwind().await;
            slots.items.borrow_mut()[i] = Some(batch_item(outcome, ctx.server.stats()));
            slots.running.set(slots.running.get() - 1);
            if slots.running.get() == 0 {
                slots.done.notify();
            }
        }));
    }
    let all_answered = async {
        while slots.running.get() > 0 {
            slots.done.wait().await;
        }
    };
    match rctx.deadline {
        None => all_answered.await,
        Some(d) => {
            let timer = async {
                Timer::new(d.saturating_duration_since(Instant::now())).await;
            };
            future::or(all_answered, timer).await
        }
    }
    // Cancels the queries still running (a Task is cancelled when dropped).
    drop(tasks);
    let items = slots
        .items
        .take()
        .into_iter()
        .map(|item| {
            item.unwrap_or_else(|| {
                ServerStats::inc(&stats.deadline_exceeded);
                Err(Status::DeadlineExceeded)
            })
        })
        .collect();
    conn.push(rctx.request_id, version, Reply::SearchBatch(items));
    conn.inflight.set(conn.inflight.get() - count as u32);
    conn.writer_wake.notify();
    conn.done_wake.notify();
}

/// One query's outcome as its batch item (a panic is INTERNAL, as for a single request).
fn batch_item(outcome: std::thread::Result<ServiceResult>, stats: &ServerStats) -> BatchItem {
    let Ok(result) = outcome else {
        ServerStats::inc(&stats.internal_errors);
        tracing::error!("service panicked handling a SEARCH_BATCH query");
        return Err(Status::Internal);
    };
    match service_reply(Opcode::Search, result, stats) {
        Reply::Search(s) => Ok(s),
        Reply::Error { status, .. } if status.fails_one_batch_query() => Err(status),
        // A frame-level status from the service (the frame was validated already), or a
        // reply other than SEARCH's: the service's bug, reported as one.
        other => {
            ServerStats::inc(&stats.internal_errors);
            tracing::error!("service answered a SEARCH_BATCH query with {other:?}");
            Err(Status::Internal)
        }
    }
}

/// The line that ends a STATS text cut to fit the frame limit.
const STATS_CUT: &str = "server_stats_truncated 1\n";

/// Cuts a STATS text that would not fit in one frame of `max_frame` bytes at a line
/// boundary and says so in its last line, so that a server with a small frame limit still
/// answers STATS (with its first lines) instead of INTERNAL.
fn fit_stats(text: &mut String, max_frame: usize) {
    let room = max_frame.saturating_sub(HEADER_LEN);
    if text.len() <= room {
        return;
    }
    let mut keep = room.saturating_sub(STATS_CUT.len()).min(text.len());
    while !text.is_char_boundary(keep) {
        keep -= 1;
    }
    let cut = text[..keep].rfind('\n').map_or(0, |i| i + 1);
    text.truncate(cut);
    text.push_str(STATS_CUT);
}

/// Checks that the service answered the operation it was asked.
fn service_reply(op: Opcode, result: ServiceResult, stats: &ServerStats) -> Reply {
    match result {
        Err(r) => Reply::error(op.code(), r.status, r.message),
        Ok(Reply::Error {
            status: Status::Ok, ..
        }) => {
            ServerStats::inc(&stats.internal_errors);
            Reply::error(
                op.code(),
                Status::Internal,
                "service returned an error with status OK",
            )
        }
        Ok(Reply::Error {
            status, message, ..
        }) => Reply::error(op.code(), status, message),
        Ok(r) if r.answers(op) => r,
        Ok(r) => {
            ServerStats::inc(&stats.internal_errors);
            tracing::error!("service answered {op} with {:?}", r.op_code());
            Reply::error(
                op.code(),
                Status::Internal,
                format!("service answered {op} with the wrong reply"),
            )
        }
    }
}

/// Moves queued replies to the socket, many per write. Exits when the reader has stopped
/// and nothing is in flight or queued, or when a write fails (then marks the connection
/// dead so the reader and the request tasks stop producing).
async fn writer(conn: Rc<ConnState>, mut io: Io) {
    let mut spare: Vec<u8> = Vec::new();
    loop {
        loop {
            if !conn.out.borrow().is_empty() {
                break;
            }
            if conn.closing.get() && conn.inflight.get() == 0 {
                let _ = io.flush().await;
                return;
            }
            if io.output_pending() {
                if let Err(e) = io.flush().await {
                    writer_failed(&conn, e);
                    return;
                }
                continue;
            }
            conn.writer_wake.wait().await;
        }
        std::mem::swap(&mut *conn.out.borrow_mut(), &mut spare);
        conn.reader_wake.notify();
        // flush: with TLS, what the socket did not take at once is still in the session.
        let written = match io.write_all(&spare).await {
            Ok(()) => io.flush().await,
            Err(e) => Err(e),
        };
        if let Err(e) = written {
            writer_failed(&conn, e);
            return;
        }
        spare.clear();
        // Do not keep a big reply's buffer for the life of the connection.
        if spare.capacity() > 4 * INITIAL_READ {
            spare = Vec::new();
        }
    }
}

/// The peer is gone or not reading (write timeout): drop what is queued, stop the reader.
fn writer_failed(conn: &ConnState, e: io::Error) {
    tracing::debug!(error = %e, "write failed; dropping connection");
    conn.dead.set(true);
    conn.out.borrow_mut().clear();
    conn.reader_wake.notify();
    conn.done_wake.notify();
}
