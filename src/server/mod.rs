//! The connection layer: glommio executors that speak the wire protocol (`PROTOCOL.md`)
//! and hand validated requests to a [`Service`]. It knows nothing about the cache; the
//! daemon implements `Service` over the engine.
//!
//! ```text
//!                 one glommio executor (thread per core, !Send, SO_REUSEPORT listener)
//!  ┌──────────────────────────────────────────────────────────────────────────────────┐
//!  │ accept loop ── open connections >= max_connections? ──yes──► BUSY (id 0), close   │
//!  │      │ no (global count, all executors)          (with [tls]: close, no frame)   │
//!  │      ▼ one task per connection                                                   │
//!  │  [tls]: handshake (tls.rs), bounded by its timeout and a per-executor rate;       │
//!  │         the socket becomes a TLS session both tasks share (transport.rs)         │
//!  │  reader: socket ─► read buffer (grows to max_frame_bytes, no further)             │
//!  │      │  decode_request ──Framing err──► BAD_FRAME / TOO_LARGE, stop reading ─┐    │
//!  │      │               ──Frame err────► error reply (same id), skip frame      │    │
//!  │      ▼                                                                       │    │
//!  │  dispatch: HELLO, PING ─────────────────────────► answered inline ──┐        │    │
//!  │      │  validate (dim, finite, k) ──refused──► DIM_MISMATCH, ... ───┤        │    │
//!  │      │  in flight + n > max_inflight ────────► BUSY ────────────────┤        │    │
//!  │      │  (n = 1, or a SEARCH_BATCH's queries: run as n SEARCHes      │        │    │
//!  │      │   in one task, one reply when the last is done)              │        │    │
//!  │      ▼                                                              │        │    │
//!  │  spawn: service.handle(req) raced with its deadline                 │        │    │
//!  │      │  (many at once, finish in any order)  ──timer first──► DEADLINE_EXCEEDED   │
//!  │      ▼                                                              ▼        │    │
//!  │  encode reply (id from the request) ──────────────────────► output buffer    │    │
//!  │                                  over high water? reader waits ◄───┘│        │    │
//!  │  writer: output buffer ─► one write per batch ─► socket             │        │    │
//!  │      write fails / times out ─► connection dead                              │    │
//!  │  close: reader stopped + nothing in flight + output written ◄────────────────┘    │
//!  │         then FIN, discard input briefly (so the last reply is not lost to RST)    │
//!  └──────────────────────────────────────────────────────────────────────────────────┘
//! ```
//!
//! Why this shape:
//! - Replies go out as soon as their request finishes, so a slow miss (backend over a
//!   channel) does not hold up the hits pipelined behind it; clients match by request id.
//! - A connection is closed only when framing is lost (or it is idle, its peer stops
//!   reading, or the server stops): every other bad input gets an error reply and the
//!   connection keeps working.
//! - Every buffer is bounded: the read buffer by `max_frame_bytes`, the requests in the
//!   service by `max_inflight`, queued output by `output_high_water_bytes` (plus the
//!   in-flight replies), connections by `max_connections`.
//! - A panic inside `Service::handle` becomes an INTERNAL reply, not a dead executor.
//!
//! The daemon either calls [`Server::start`] (N executors, one service per executor from
//! a factory) or runs [`Server::serve`] inside executors it builds itself.

mod conn;
mod listener;
mod state;
mod stats;
mod sync;
pub mod tls;
mod transport;
mod uring;

pub use aker_config::ServerConfig;

// The smallest frame limit the configuration allows holds a header and more.
const _: () = assert!(aker_config::FRAME_BYTES_MIN as usize > crate::protocol::HEADER_LEN);
pub use listener::Running;
pub use state::Server;
pub use stats::ServerStats;
pub use tls::{TlsAcceptor, TlsFiles};
pub use uring::{check_io_uring, KERNEL_MIN};

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::time::Instant;

use shards::Metric;

use crate::protocol::{Rejection, Reply, Request};

/// A boxed future that stays on its executor.
pub type LocalBoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + 'a>>;

/// What a service answers: a reply, or a status and message for an error reply
/// (`From<shards::Error>` maps the engine's error kinds, so `?` works on engine calls).
pub type ServiceResult = Result<Reply, Rejection>;

/// Facts about the collection behind the service. Read once per executor when
/// [`Server::serve`] starts: HELLO replies carry them and every request is validated
/// against `dim` and `k_max` before the service sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServiceInfo {
    pub dim: u32,
    pub metric: Metric,
    pub k_max: u32,
    /// Topology reported by HELLO.
    pub executors: u32,
    pub shards: u32,
    /// Δ, reported by HELLO version 2 (a cache-aside client FILLs `k + Δ`).
    pub delta: u32,
}

/// Per-request facts from the connection layer.
#[derive(Clone, Copy, Debug)]
pub struct RequestContext {
    pub request_id: u64,
    /// When the frame was decoded.
    pub received: Instant,
    /// The earlier of the request's own deadline (SEARCH) and `request_timeout_ms`. The
    /// server stops waiting at this instant (DEADLINE_EXCEEDED); a service may pass it on
    /// to its backend to stop work early.
    pub deadline: Option<Instant>,
    pub peer: SocketAddr,
}

/// The request handler one executor runs, shared by all its connections as
/// `Rc<dyn Service>`.
///
/// `handle` gets requests that are already validated (dimension, finite components,
/// `1 <= k <= k_max`, FILL candidates finite, ascending and distinct): SEARCH, INSERT,
/// DELETE, FILL, FLUSH and STATS. HELLO, PING and AUTH never reach it; a SEARCH_BATCH
/// reaches it as one SEARCH per query (the connection layer runs them at once and
/// gathers one reply). It returns a future so
/// that a cache miss can await a backend on another thread without blocking the executor;
/// many of these futures run at once on one connection and may finish in any order.
///
/// Contract:
/// - Answer with the reply variant of the request's opcode (`Reply::Search` for SEARCH,
///   `Reply::Inserted` for INSERT, `Reply::Deleted` for DELETE, `Reply::Filled` for FILL,
///   `Reply::Flushed` for FLUSH, `Reply::Stats` for STATS) or an error (`Err(Rejection)` or
///   `Ok(Reply::Error)`); anything else is sent as INTERNAL.
/// - The future may be dropped at any `.await` when the deadline passes: keep it
///   cancel-safe (hold no epoch guard or lock across an await; glommio tasks are `!Send`,
///   so the compiler will not catch it). For a write the client then sees
///   DEADLINE_EXCEEDED and the outcome is unknown.
/// - Do not block the thread: blocking work belongs on another thread, awaited over a
///   channel.
/// - STATS: return `name value` lines; the server appends its own `server_*` lines
///   unless [`Service::stats_has_server_lines`] says the service did, and cuts the text
///   to one frame.
pub trait Service {
    fn info(&self) -> ServiceInfo;
    fn handle<'a>(&'a self, req: Request, ctx: RequestContext)
        -> LocalBoxFuture<'a, ServiceResult>;

    /// Whether this service's STATS text already ends with the connection layer's
    /// `server_*` lines (`ServerStats::samples` of the [`Server::stats`] it was given
    /// at start). The daemon's does, so that STATS and its `/metrics` render one set of
    /// samples; by default the server appends them.
    fn stats_has_server_lines(&self) -> bool {
        false
    }
}
