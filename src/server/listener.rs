//! The accept loop of one executor, the connection limit, shutdown, and `Server::start`,
//! which runs N executors on one SO_REUSEPORT port.

use std::cell::Cell;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_lite::{future, AsyncWriteExt};
use glommio::net::{TcpListener, TcpStream};
use glommio::timer::Timer;
use glommio::{LocalExecutorBuilder, Placement};

use super::conn::{linger_close, serve_connection};
use super::state::{ExecutorCtx, Server};
use super::stats::ServerStats;
use super::sync::Latch;
use super::tls::HandshakeTokens;
use super::transport::Io;
use super::Service;
use crate::protocol::{
    encode_reply, HelloReply, Limits, Reply, ReplyFrame, Status, CONNECTION_OP, VERSION,
    VERSION_MIN,
};

/// Connections being turned away at once per executor; past it they are closed without
/// the BUSY reply, so a connection flood cannot pile up tasks.
const MAX_REJECTING: usize = 64;
const REJECT_WRITE_TIMEOUT: Duration = Duration::from_millis(200);

impl Server {
    /// Binds `addr` with SO_REUSEPORT (glommio sets it), so each executor can bind the
    /// same port and the kernel spreads connections over them. Call on an executor.
    pub fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
        TcpListener::bind(addr).map_err(io::Error::from)
    }

    /// Runs this executor's accept loop on `listener` until [`Server::shutdown`]. Call
    /// inside a glommio executor; `service` is this executor's. `service.info()` is read
    /// once, here: HELLO answers and request validation use that snapshot.
    pub async fn serve(&self, listener: TcpListener, service: Rc<dyn Service>) -> io::Result<()> {
        let info = service.info();
        let cfg = self.config();
        let ctx = Rc::new(ExecutorCtx {
            server: self.clone(),
            limits: Limits {
                dim: info.dim,
                k_max: info.k_max,
                max_batch: cfg.batch_max(),
                max_frame_bytes: cfg.max_frame_bytes,
            },
            hello: HelloReply {
                version_min: VERSION_MIN,
                version_max: VERSION,
                metric: info.metric,
                max_frame_bytes: cfg.max_frame_bytes,
                dim: info.dim,
                k_max: info.k_max,
                max_inflight: cfg.max_inflight,
                executors: info.executors,
                shards: info.shards,
                delta: Some(info.delta),
                // Each connection's own challenge replaces it (conn.rs).
                auth_challenge: None,
                max_batch: Some(cfg.batch_max()),
            },
            service,
            shutdown: Latch::default(),
            live: Cell::new(0),
            rejecting: Cell::new(0),
            handshakes: HandshakeTokens::new(self.tls().map_or(0, |t| t.handshakes_per_s_max)),
        });
        tracing::info!(addr = ?listener.local_addr().ok(), "serving");

        let accept_loop = async {
            loop {
                match listener.accept().await {
                    Ok(stream) => {
                        self.admit(stream, &ctx);
                        // A flood of connections must not starve the ones already served.
                        glommio::yield_if_needed().await;
                    }
                    Err(e) => {
                        // EMFILE and friends: back off instead of spinning.
                        tracing::warn!(error = %e, "accept failed");
                        Timer::new(Duration::from_millis(10)).await;
                    }
                }
            }
        };
        // The shutdown watch runs in a task of its own and sets the latch, which wakes
        // the accept loop and every reader. glommio 0.9's accept future adds a clone of
        // its task's waker on every poll and keeps them all until a connection arrives
        // (`Source::collect_rw`): polled from a task woken every `shutdown_poll_ms`, an
        // idle listener gathered 20 clones a second until the task's 16-bit reference
        // count overflowed and the executor's reactor panicked (27 minutes at 50 ms;
        // found by the soak, docs/RELIABILITY.md). Here only a connection or the latch
        // wakes the accept loop.
        let poll = Duration::from_millis(cfg.shutdown_poll_ms);
        let (server, watch_ctx) = (self.clone(), ctx.clone());
        glommio::spawn_local(async move {
            while !server.is_shutting_down() {
                Timer::new(poll).await;
            }
            watch_ctx.shutdown.set();
        })
        .detach();
        future::or(accept_loop, ctx.shutdown.wait()).await;
        drop(listener);

        // Every reader is awake (the latch); wait for the connections to close, within
        // the grace period.
        let grace_end = Instant::now() + Duration::from_millis(cfg.shutdown_grace_ms);
        while (ctx.live.get() > 0 || ctx.rejecting.get() > 0) && Instant::now() < grace_end {
            Timer::new(Duration::from_millis(5)).await;
        }
        if ctx.live.get() > 0 {
            tracing::warn!(
                open = ctx.live.get(),
                "shutdown grace period over; dropping connections"
            );
        }
        Ok(())
    }

    /// Counts the connection in, or turns it away past `max_connections`.
    fn admit(&self, stream: TcpStream, ctx: &Rc<ExecutorCtx>) {
        let stats = self.stats();
        let peer = stream
            .peer_addr()
            .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
        let max = self.config().max_connections as u64;
        let before = stats.connections_current.fetch_add(1, Ordering::AcqRel);
        if before >= max {
            stats.connections_current.fetch_sub(1, Ordering::AcqRel);
            ServerStats::inc(&stats.connections_rejected);
            tracing::debug!(%peer, "over server.connections_max; rejecting");
            Self::turn_away(
                stream,
                ctx,
                format!("server is at server.connections_max ({max})"),
            );
            return;
        }
        if !self.source_enter(peer.ip()) {
            stats.connections_current.fetch_sub(1, Ordering::AcqRel);
            ServerStats::inc(&stats.connections_rejected_per_source);
            tracing::debug!(%peer, "over server.connections_per_source_max; rejecting");
            let why = format!(
                "{} already has server.connections_per_source_max ({}) open",
                peer.ip(),
                self.config().max_connections_per_source
            );
            Self::turn_away(stream, ctx, why);
            return;
        }
        ServerStats::inc(&stats.connections_accepted);
        ctx.live.set(ctx.live.get() + 1);
        // Made before the spawn and moved into the task: it decrements even if the
        // executor drops the task (at the end of the grace period) before it first runs.
        let guard = LiveGuard(ctx.clone(), peer.ip());
        let ctx = ctx.clone();
        glommio::spawn_local(async move {
            let _guard = guard;
            serve_connection(stream, peer, ctx).await;
        })
        .detach();
    }

    /// One BUSY reply and a close, unless too many are being turned away already.
    fn turn_away(stream: TcpStream, ctx: &Rc<ExecutorCtx>, why: String) {
        // A TLS client could not read a plaintext frame, and a handshake is the CPU an
        // overloaded server should not spend: closed.
        if ctx.server.tls().is_some() {
            return;
        }
        if ctx.rejecting.get() < MAX_REJECTING {
            ctx.rejecting.set(ctx.rejecting.get() + 1);
            let ctx = ctx.clone();
            glommio::spawn_local(async move {
                reject(stream, why).await;
                ctx.rejecting.set(ctx.rejecting.get() - 1);
            })
            .detach();
        }
    }
}

struct LiveGuard(Rc<ExecutorCtx>, IpAddr);

impl Drop for LiveGuard {
    fn drop(&mut self) {
        self.0.live.set(self.0.live.get() - 1);
        self.0.server.source_leave(self.1);
        self.0
            .server
            .stats()
            .connections_current
            .fetch_sub(1, Ordering::AcqRel);
    }
}

/// One BUSY reply with request id 0, then close.
async fn reject(stream: TcpStream, why: String) {
    let mut bytes = Vec::new();
    let frame = ReplyFrame {
        request_id: 0,
        version: VERSION_MIN,
        reply: Reply::error(CONNECTION_OP, Status::Busy, why),
    };
    if encode_reply(&frame, &mut bytes).is_err() {
        return;
    }
    let _ = stream.set_write_timeout(Some(REJECT_WRITE_TIMEOUT));
    let io = Io::new(stream);
    let mut w = io.clone();
    if w.write_all(&bytes).await.is_ok() {
        linger_close(&io).await;
    }
}

/// Executors started by [`Server::start`].
pub struct Running {
    server: Server,
    addr: SocketAddr,
    handles: Vec<glommio::ExecutorJoinHandle<io::Result<()>>>,
}

impl Server {
    /// Starts `config.executors` executor threads, each binding `config.listen` with
    /// SO_REUSEPORT and serving its own `make_service(i)` (called on that executor's
    /// thread, so the service may be `!Send`). With port 0 the first executor picks the
    /// port and the others join it. Returns once every executor is listening.
    pub fn start<F>(&self, make_service: F) -> io::Result<Running>
    where
        F: Fn(usize) -> Rc<dyn Service> + Send + Sync + 'static,
    {
        let make_service = Arc::new(make_service);
        let cfg = self.config().clone();
        let mut addr = cfg.listen;
        let mut handles = Vec::with_capacity(cfg.executors);
        for i in 0..cfg.executors {
            let placement = if !cfg.cpus.is_empty() {
                Placement::Fixed(cfg.cpus[i % cfg.cpus.len()])
            } else if cfg.pin_cpus {
                Placement::Fixed(i)
            } else {
                Placement::Unbound
            };
            let (bound_tx, bound_rx) = std::sync::mpsc::channel::<io::Result<SocketAddr>>();
            let server = self.clone();
            let make = make_service.clone();
            let bind_addr = addr;
            let spawned = LocalExecutorBuilder::new(placement)
                .name(&format!("aker-net-{i}"))
                .io_memory(cfg.io_memory_bytes)
                .spawn(move || async move {
                    let listener = match Server::bind(bind_addr) {
                        Ok(l) => l,
                        Err(e) => {
                            let msg = e.to_string();
                            let _ = bound_tx.send(Err(e));
                            return Err(io::Error::other(msg));
                        }
                    };
                    let _ = bound_tx.send(listener.local_addr().map_err(io::Error::from));
                    let service = make(i);
                    server.serve(listener, service).await
                });
            let handle = match spawned {
                Ok(h) => h,
                Err(e) => {
                    self.shutdown();
                    let _ = join_all(handles);
                    return Err(io::Error::other(format!("cannot start executor {i}: {e}")));
                }
            };
            handles.push(handle);
            match bound_rx.recv() {
                Ok(Ok(a)) => addr = a,
                Ok(Err(e)) => {
                    self.shutdown();
                    let _ = join_all(handles);
                    return Err(e);
                }
                Err(_) => {
                    self.shutdown();
                    let _ = join_all(handles);
                    return Err(io::Error::other(format!(
                        "executor {i} died before binding"
                    )));
                }
            }
        }
        Ok(Running {
            server: self.clone(),
            addr,
            handles,
        })
    }
}

fn join_all(handles: Vec<glommio::ExecutorJoinHandle<io::Result<()>>>) -> io::Result<()> {
    let mut first_err = None;
    for h in handles {
        let r = match h.join() {
            Ok(r) => r,
            Err(e) => Err(io::Error::other(e.to_string())),
        };
        if let Err(e) = r {
            first_err.get_or_insert(e);
        }
    }
    first_err.map_or(Ok(()), Err)
}

impl Running {
    /// The address every executor listens on (the real port when `listen` had port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn server(&self) -> &Server {
        &self.server
    }

    /// Shuts down and waits for every executor.
    pub fn stop(self) -> io::Result<()> {
        self.server.shutdown();
        join_all(self.handles)
    }

    /// Waits for the executors to end (after someone calls `Server::shutdown`).
    pub fn join(self) -> io::Result<()> {
        join_all(self.handles)
    }
}
