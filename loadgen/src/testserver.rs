//! A stand-in server for the load generator's own tests (the hidden `--test-server`
//! flag, and in-process in `tests/`): the project's real connection layer
//! (`aker::server`) in front of a fixed-answer service. It is not a cache; it exists so
//! the load generator can be tested, and can be SIGSTOPped as a separate process,
//! without the daemon.

use std::cell::Cell;
use std::io::{self, BufRead, Write};
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use aker::protocol::{HitKind, Neighbor, Reply, Request, SearchReply, Status};
use aker::server::{
    LocalBoxFuture, RequestContext, Running, Server, ServerConfig, Service, ServiceInfo,
    ServiceResult,
};
use shards::Metric;

pub const K_MAX: u32 = 100;

/// TEST FIXTURE. SEARCH answers ids `0..k` at distances `0, 1, ...`; the hit kind is
/// MISS with BYPASS_CACHE, APPROXIMATE when the first component is negative, EXACT
/// otherwise. Every request first busy-waits `busy` (holding the executor, like CPU
/// work would).
pub struct FixedService {
    dim: u32,
    busy: Duration,
    requests: Cell<u64>,
}

impl FixedService {
    pub fn new(dim: u32, busy: Duration) -> FixedService {
        FixedService {
            dim,
            busy,
            requests: Cell::new(0),
        }
    }
}

impl Service for FixedService {
    fn info(&self) -> ServiceInfo {
        ServiceInfo {
            dim: self.dim,
            metric: Metric::L2Sq,
            k_max: K_MAX,
            executors: 1,
            shards: 1,
            delta: 0,
        }
    }

    fn handle<'a>(
        &'a self,
        req: Request,
        _ctx: RequestContext,
    ) -> LocalBoxFuture<'a, ServiceResult> {
        Box::pin(async move {
            self.requests.set(self.requests.get() + 1);
            if !self.busy.is_zero() {
                let until = Instant::now() + self.busy;
                while Instant::now() < until {
                    std::hint::spin_loop();
                }
            }
            Ok(match req {
                Request::Search(s) => Reply::Search(SearchReply {
                    token: None,
                    routing_version: 0,
                    hit: if s.bypass_cache {
                        HitKind::Miss
                    } else if s.vector.first().is_some_and(|&x| x < 0.0) {
                        HitKind::Approximate
                    } else {
                        HitKind::Exact
                    },
                    distances_to_query: true,
                    neighbors: (0..u64::from(s.k))
                        .map(|id| Neighbor {
                            id,
                            distance: id as f32,
                        })
                        .collect(),
                }),
                Request::Insert(_) => Reply::Inserted { position: 0 },
                Request::Delete(_) => Reply::Deleted {
                    existed: true,
                    position: 0,
                },
                Request::Fill(_) => Reply::Filled { admitted: false },
                Request::Flush => Reply::Flushed,
                Request::Stats => Reply::Stats(format!("fixture_requests {}", self.requests.get())),
                Request::Cluster => Reply::error(0x0B, Status::Unsupported, "in no cluster"),
                Request::Hello | Request::Ping(_) | Request::Auth(_) | Request::SearchBatch(_) => {
                    Reply::error(
                        0,
                        Status::Internal,
                        "the server answers HELLO/PING/AUTH and splits SEARCH_BATCH itself",
                    )
                }
            })
        })
    }
}

/// Starts the fixture on `listen` (port 0 picks one) with one executor.
pub fn start(
    listen: SocketAddr,
    dim: u32,
    busy: Duration,
    max_inflight: u32,
) -> io::Result<Running> {
    let cfg = ServerConfig {
        listen,
        max_inflight,
        shutdown_poll_ms: 10,
        shutdown_grace_ms: 1_000,
        ..ServerConfig::default()
    };
    let server = Server::new(cfg).map_err(io::Error::other)?;
    server.start(move |_| Rc::new(FixedService::new(dim, busy)) as Rc<dyn Service>)
}

/// Runs the fixture as a process: prints `listening ADDR` on stdout, then serves until
/// stdin ends (the parent went away) or `lifetime` passes, so a forgotten child cannot
/// outlive its test for long.
pub fn serve_process(
    listen: SocketAddr,
    dim: u32,
    busy: Duration,
    max_inflight: u32,
    lifetime: Duration,
) -> io::Result<()> {
    let running = start(listen, dim, busy, max_inflight)?;
    {
        let mut out = io::stdout().lock();
        writeln!(out, "listening {}", running.local_addr())?;
        out.flush()?;
    }
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        let mut line = String::new();
        let stdin = io::stdin();
        let mut lock = stdin.lock();
        while matches!(lock.read_line(&mut line), Ok(n) if n > 0) {
            line.clear();
        }
        let _ = tx.send(());
    });
    let _ = rx.recv_timeout(lifetime);
    running.stop()
}
