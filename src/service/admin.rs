//! The admin endpoint: a tiny HTTP/1.0-style server on std threads that answers
//! `GET /metrics` (Prometheus text) and `GET /healthz`. A fixed number of threads share
//! the listener and serve one connection each at a time, with short timeouts and a
//! bounded request size, so scrapes cannot pile up work; more connections wait in the
//! kernel's backlog.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const IO_TIMEOUT: Duration = Duration::from_secs(2);
const MAX_REQUEST: usize = 8 * 1024;
const ACCEPT_POLL: Duration = Duration::from_millis(20);

/// Produces the body of `GET /metrics`.
pub(crate) type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// `POST /snapshot`: writes the cache's snapshot, answers its report (JSON) or why not.
pub(crate) type TakeSnapshot = Arc<dyn Fn() -> Result<String, String> + Send + Sync>;

pub(crate) struct AdminServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl AdminServer {
    pub(crate) fn start(
        addr: SocketAddr,
        threads: usize,
        render: Render,
        snapshot: Option<TakeSnapshot>,
    ) -> io::Result<AdminServer> {
        let listener = TcpListener::bind(addr)?;
        // Non-blocking accept, so each thread notices the stop flag.
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let mut handles = Vec::new();
        for i in 0..threads.max(1) {
            let (l, stop) = (listener.try_clone()?, stop.clone());
            let ops = Ops {
                render: render.clone(),
                snapshot: snapshot.clone(),
            };
            handles.push(
                std::thread::Builder::new()
                    .name(format!("aker-admin-{i}"))
                    .spawn(move || accept_loop(l, &stop, &ops))?,
            );
        }
        tracing::info!(%addr, "admin endpoint: GET /metrics");
        Ok(AdminServer {
            addr,
            stop,
            threads: handles,
        })
    }

    pub(crate) fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    pub(crate) fn stop(self) {
        self.stop.store(true, Ordering::Release);
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// What the endpoint can do.
struct Ops {
    render: Render,
    snapshot: Option<TakeSnapshot>,
}

fn accept_loop(listener: TcpListener, stop: &AtomicBool, ops: &Ops) {
    while !stop.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((stream, _)) => {
                if let Err(e) = serve(stream, ops) {
                    tracing::debug!(error = %e, "admin connection failed");
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::sleep(ACCEPT_POLL),
            Err(e) => {
                tracing::warn!(error = %e, "admin accept failed");
                std::thread::sleep(ACCEPT_POLL);
            }
        }
    }
}

fn serve(mut stream: TcpStream, ops: &Ops) -> io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    let deadline = Instant::now() + IO_TIMEOUT;
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    // Read the head only (no request here has a body).
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") && !buf.windows(2).any(|w| w == b"\n\n") {
        if buf.len() >= MAX_REQUEST || Instant::now() >= deadline {
            return respond(
                &mut stream,
                "431 Request Header Fields Too Large",
                "text/plain",
                "request too large\n",
            );
        }
        match stream.read(&mut chunk)? {
            0 => break,
            n => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let head = String::from_utf8_lossy(&buf);
    let mut parts = head.lines().next().unwrap_or("").split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    match (method, path) {
        ("GET", "/metrics") => respond(
            &mut stream,
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            &(ops.render)(),
        ),
        ("POST", "/snapshot") => match &ops.snapshot {
            Some(take) => match take() {
                Ok(report) => respond(&mut stream, "200 OK", "application/json", &report),
                Err(why) => respond(&mut stream, "409 Conflict", "text/plain", &(why + "\n")),
            },
            None => respond(
                &mut stream,
                "404 Not Found",
                "text/plain",
                "no cache snapshot without backend.data_dir\n",
            ),
        },
        ("GET", "/healthz") => respond(&mut stream, "200 OK", "text/plain", "ok\n"),
        ("GET", _) => respond(&mut stream, "404 Not Found", "text/plain", "try /metrics\n"),
        _ => respond(
            &mut stream,
            "405 Method Not Allowed",
            "text/plain",
            "GET, or POST /snapshot\n",
        ),
    }
}

fn respond(stream: &mut TcpStream, status: &str, ctype: &str, body: &str) -> io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    stream.write_all(body.as_bytes())?;
    stream.flush()?;
    let _ = stream.shutdown(std::net::Shutdown::Write);
    Ok(())
}
