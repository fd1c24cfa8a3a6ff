//! The pipelined client: up to `window` requests on the wire, replies in any order.
//!
//! `send` only encodes into a write buffer; bytes go out when the buffer is large, when the
//! window is full, or on `flush` / `recv`. Keep `window` at or below the server's
//! `max_inflight` (HELLO) unless BUSY replies are what you want to see: the server answers
//! BUSY to every request past it.

use std::collections::{HashMap, VecDeque};
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use super::conn::Conn;
use super::{server_error, ClientError, ClientOptions, Result};
use crate::protocol::{HelloReply, Opcode, Reply, Request, RequestFrame, CONNECTION_OP};

/// Write buffer size past which `send` flushes by itself.
const FLUSH_AT: usize = 64 * 1024;

pub struct Pipeline {
    conn: Conn,
    window: usize,
    next_id: u64,
    /// Sent, not yet answered: id → opcode (to check the reply answers the request).
    pending: HashMap<u64, Opcode>,
    /// Answered while `send` waited for room in the window, not yet returned by `recv`.
    ready: VecDeque<(u64, Reply)>,
}

impl Pipeline {
    /// Connects with a window of `window` requests (at least 1).
    pub fn connect<A: ToSocketAddrs>(addr: A, window: usize) -> Result<Pipeline> {
        Pipeline::connect_with(addr, window, ClientOptions::default())
    }

    pub fn connect_with<A: ToSocketAddrs>(
        addr: A,
        window: usize,
        opts: ClientOptions,
    ) -> Result<Pipeline> {
        Ok(Pipeline {
            conn: Conn::connect(addr, &opts)?,
            window: window.max(1),
            next_id: 1,
            pending: HashMap::new(),
            ready: VecDeque::new(),
        })
    }

    /// Connects, sends HELLO, and narrows the window to the server's `max_inflight`.
    pub fn connect_negotiated<A: ToSocketAddrs>(
        addr: A,
        window: usize,
        opts: ClientOptions,
    ) -> Result<(Pipeline, HelloReply)> {
        let retry = opts.clone();
        let mut p = Pipeline::connect_with(addr, window, opts)?;
        let id = p.send(Request::Hello)?;
        let (got, reply) = p.recv()?;
        debug_assert_eq!(got, id);
        match reply {
            Reply::Hello(h) => {
                p.window = p.window.min(h.max_inflight.max(1) as usize);
                p.conn.set_server_max_frame(h.max_frame_bytes as usize);
                p.conn.version = p.conn.version.min(h.version_max);
                Ok((p, h))
            }
            // A server older than this client: HELLO again in the oldest version.
            Reply::Error {
                status: crate::protocol::Status::BadVersion,
                ..
            } if p.conn.version > crate::protocol::VERSION_MIN => {
                let opts = ClientOptions {
                    version: crate::protocol::VERSION_MIN,
                    ..retry
                };
                Pipeline::connect_negotiated(p.peer_addr()?, window, opts)
            }
            other => Err(server_error(id, other)),
        }
    }

    pub fn peer_addr(&self) -> Result<SocketAddr> {
        self.conn.peer_addr()
    }

    pub fn set_io_timeout(&mut self, t: Option<Duration>) {
        self.conn.set_io_timeout(t);
    }

    pub fn window(&self) -> usize {
        self.window
    }

    /// Requests sent and not yet answered by the server.
    pub fn in_flight(&self) -> usize {
        self.pending.len()
    }

    /// Replies received and not yet returned by [`Pipeline::recv`].
    pub fn ready(&self) -> usize {
        self.ready.len()
    }

    pub fn is_broken(&self) -> bool {
        self.conn.is_broken()
    }

    /// Queues `req` and returns its id. When the window is full, first waits for one reply
    /// (kept for `recv`).
    pub fn send(&mut self, req: Request) -> Result<u64> {
        while self.pending.len() >= self.window {
            self.conn.flush()?;
            let (id, reply) = self.read_one()?;
            self.ready.push_back((id, reply));
        }
        let id = self.next_id;
        let op = req.opcode();
        self.conn.queue(&RequestFrame {
            request_id: id,
            version: self.conn.version,
            request: req,
        })?;
        self.next_id += 1;
        self.pending.insert(id, op);
        if self.conn.pending_write() >= FLUSH_AT {
            self.conn.flush()?;
        }
        Ok(id)
    }

    /// Sends what `send` has buffered.
    pub fn flush(&mut self) -> Result<()> {
        self.conn.flush()
    }

    /// The next reply, in whatever order the server answers. Error replies are
    /// `Ok((id, Reply::Error { .. }))`: they answer one request and the connection stays.
    pub fn recv(&mut self) -> Result<(u64, Reply)> {
        if let Some(r) = self.ready.pop_front() {
            return Ok(r);
        }
        if self.pending.is_empty() {
            return Err(ClientError::Protocol("recv with nothing in flight".into()));
        }
        self.conn.flush()?;
        self.read_one()
    }

    /// Reads one reply for a pending request.
    fn read_one(&mut self) -> Result<(u64, Reply)> {
        let frame = self.conn.read_frame()?;
        let id = frame.request_id;
        if id == 0 && frame.reply.op_code() == CONNECTION_OP {
            self.conn.mark_broken();
            return Err(server_error(0, frame.reply));
        }
        let Some(op) = self.pending.remove(&id) else {
            self.conn.mark_broken();
            return Err(ClientError::Protocol(format!(
                "reply for request {id}, which is not in flight"
            )));
        };
        if !matches!(frame.reply, Reply::Error { .. }) && !frame.reply.answers(op) {
            return Err(ClientError::Protocol(format!(
                "request {id} was {op}, the reply is {:?}",
                frame.reply
            )));
        }
        Ok((id, frame.reply))
    }
}
