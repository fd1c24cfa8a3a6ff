//! The pipelined client: up to `window` requests on the wire, replies in any order.
//!
//! `send` only encodes into a write buffer; bytes go out when the buffer is large, when the
//! window is full, or on `flush` / `recv`. Keep `window` at or below the server's
//! `max_inflight` (HELLO) unless BUSY replies are what you want to see: the server answers
//! BUSY to every request past it. A SEARCH_BATCH of n queries takes n slots of the
//! window, as it takes n of the server's `max_inflight`.

use std::collections::{HashMap, VecDeque};
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use super::conn::Conn;
use super::{auth_done, auth_step, server_error, AuthStep, ClientError, ClientOptions, Result};
use crate::protocol::{HelloReply, Opcode, Reply, Request, RequestFrame, CONNECTION_OP};

/// Write buffer size past which `send` flushes by itself.
const FLUSH_AT: usize = 64 * 1024;

pub struct Pipeline {
    conn: Conn,
    window: usize,
    next_id: u64,
    /// Sent, not yet answered: id → opcode (to check the reply answers the request) and
    /// the window slots it holds.
    pending: HashMap<u64, (Opcode, usize)>,
    /// Window slots the pending requests hold (a batch holds one per query).
    slots: usize,
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
            slots: 0,
            ready: VecDeque::new(),
        })
    }

    /// Connects, sends HELLO (and AUTH when the server requires it, as
    /// [`super::Client::hello`] does), and narrows the window to the server's
    /// `max_inflight`.
    pub fn connect_negotiated<A: ToSocketAddrs>(
        addr: A,
        window: usize,
        opts: ClientOptions,
    ) -> Result<(Pipeline, HelloReply)> {
        let wanted = opts.version;
        let mut p = Pipeline::connect_with(addr, window, opts)?;
        let mut reply = p.call_one(Request::Hello)?;
        if reply.status() == crate::protocol::Status::BadVersion
            && p.conn.version > crate::protocol::VERSION_MIN
        {
            // A server older than this client: HELLO in the oldest version, then in the
            // newest both speak.
            p.conn.version = crate::protocol::VERSION_MIN;
            reply = p.call_one(Request::Hello)?;
            if let Reply::Hello(h) = &reply {
                let agreed = wanted.min(h.version_max);
                if agreed > p.conn.version {
                    p.conn.version = agreed;
                    reply = p.call_one(Request::Hello)?;
                }
            }
        }
        let h = match reply {
            Reply::Hello(h) => h,
            other => return Err(server_error(p.next_id - 1, other)),
        };
        p.window = p.window.min(h.max_inflight.max(1) as usize);
        p.conn.set_server_max_frame(h.max_frame_bytes as usize);
        p.conn.version = p.conn.version.min(h.version_max);
        if let AuthStep::Send { request, challenge } = auth_step(&h, p.conn.secret.as_ref())? {
            let reply = p.call_one(Request::Auth(request))?;
            let secret = p.conn.secret.clone();
            auth_done(p.next_id - 1, reply, secret.as_ref(), &request, &challenge)?;
        }
        Ok((p, h))
    }

    /// One request and its reply, with nothing else in flight (the handshake).
    fn call_one(&mut self, req: Request) -> Result<Reply> {
        let id = self.send(req)?;
        let (got, reply) = self.recv()?;
        debug_assert_eq!(got, id);
        Ok(reply)
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

    /// Window slots the requests in flight hold: one each, a SEARCH_BATCH one per query.
    pub fn slots_in_flight(&self) -> usize {
        self.slots
    }

    /// Replies received and not yet returned by [`Pipeline::recv`].
    pub fn ready(&self) -> usize {
        self.ready.len()
    }

    pub fn is_broken(&self) -> bool {
        self.conn.is_broken()
    }

    /// Queues `req` and returns its id. When the window has no room for it, first waits
    /// for replies (kept for `recv`). A SEARCH_BATCH wider than the window is refused.
    pub fn send(&mut self, req: Request) -> Result<u64> {
        let weight = match &req {
            Request::SearchBatch(b) if b.queries.is_empty() => {
                return Err(ClientError::Protocol(
                    "a batch needs at least one query".into(),
                ))
            }
            Request::SearchBatch(b) => b.queries.len(),
            _ => 1,
        };
        if weight > self.window {
            return Err(ClientError::Protocol(format!(
                "a batch of {weight} queries is wider than the window of {}",
                self.window
            )));
        }
        while self.slots + weight > self.window {
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
        self.pending.insert(id, (op, weight));
        self.slots += weight;
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
    /// A SEARCH_BATCH's items pair with its queries by position: check their count.
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
        let Some((op, weight)) = self.pending.remove(&id) else {
            self.conn.mark_broken();
            return Err(ClientError::Protocol(format!(
                "reply for request {id}, which is not in flight"
            )));
        };
        self.slots -= weight;
        if !matches!(frame.reply, Reply::Error { .. }) && !frame.reply.answers(op) {
            return Err(ClientError::Protocol(format!(
                "request {id} was {op}, the reply is {:?}",
                frame.reply
            )));
        }
        Ok((id, frame.reply))
    }
}
