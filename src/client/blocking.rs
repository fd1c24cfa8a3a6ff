//! The blocking client: one request on the wire at a time.

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use super::conn::Conn;
use super::{auth_done, auth_step, server_error, AuthStep, ClientError, ClientOptions, Result};
use crate::protocol::{
    batch_count_max_for, BatchItem, DeleteRequest, FillCandidate, FillRequest, HelloReply,
    InsertRequest, Reply, ReplyFrame, Request, RequestFrame, SearchBatchRequest, SearchReply,
    SearchRequest, CONNECTION_OP,
};

/// A DELETE's answer with its position: [`Client::delete_with_position`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Deleted {
    /// The id was present (cache-aside: whether the cache held it).
    pub existed: bool,
    /// As [`Client::insert_with_position`]'s.
    pub position: u64,
}

/// A blocking client. Not thread-safe by design: one connection, one caller.
pub struct Client {
    conn: Conn,
    next_id: u64,
    server: Option<HelloReply>,
}

impl Client {
    pub fn connect<A: ToSocketAddrs>(addr: A) -> Result<Client> {
        Client::connect_with(addr, ClientOptions::default())
    }

    pub fn connect_with<A: ToSocketAddrs>(addr: A, opts: ClientOptions) -> Result<Client> {
        Ok(Client {
            conn: Conn::connect(addr, &opts)?,
            next_id: 1,
            server: None,
        })
    }

    /// A client on a socket connected elsewhere (a load generator's own connections):
    /// [`Client::hello`] on it, then [`Client::into_stream`] to take it back.
    pub fn from_stream(stream: std::net::TcpStream, opts: ClientOptions) -> Result<Client> {
        Ok(Client {
            conn: Conn::from_stream(stream, &opts)?,
            next_id: 1,
            server: None,
        })
    }

    /// The socket back, with nothing buffered (after a handshake), timeouts cleared.
    pub fn into_stream(self) -> Result<std::net::TcpStream> {
        self.conn.into_stream()
    }

    /// A half to read replies with and a half to write requests with, for two threads
    /// (plain or TLS alike), and a clone of the socket for its timeouts and shutdown;
    /// only once nothing is buffered (after HELLO, say).
    pub fn into_split(self) -> Result<(super::SplitRead, super::SplitWrite, std::net::TcpStream)> {
        self.conn.into_split()
    }

    pub fn peer_addr(&self) -> Result<SocketAddr> {
        self.conn.peer_addr()
    }

    pub fn set_io_timeout(&mut self, t: Option<Duration>) {
        self.conn.set_io_timeout(t);
    }

    /// The server's HELLO answer, once [`Client::hello`] has been called.
    pub fn server_info(&self) -> Option<&HelloReply> {
        self.server.as_ref()
    }

    pub fn is_broken(&self) -> bool {
        self.conn.is_broken()
    }

    /// Whether an idle connection (no request in flight) can take a request: not broken,
    /// and not closed by the server meanwhile (`idle_timeout_ms`, a restart), which a
    /// write would otherwise find only after it was sent. A pool or a cluster handle asks
    /// before reusing one (after HELLO: a TLS connection that has read nothing yet still
    /// holds its session tickets, and is judged unusable).
    pub fn is_idle_usable(&self) -> bool {
        self.conn.idle_usable()
    }

    /// Sends `req` and waits for its reply. Error replies come back as `Ok(Reply::Error)`;
    /// the typed helpers turn them into [`ClientError::Server`].
    pub fn call(&mut self, req: Request) -> Result<Reply> {
        let id = self.next_id;
        self.next_id += 1;
        self.conn.queue(&RequestFrame {
            request_id: id,
            version: self.conn.version,
            request: req,
        })?;
        self.conn.flush()?;
        loop {
            let frame = self.conn.read_frame()?;
            if frame.request_id == id {
                return Ok(frame.reply);
            }
            if frame.request_id == 0 && frame.reply.op_code() == CONNECTION_OP {
                // Connection-level: the server closes after it.
                self.conn.mark_broken();
                return Err(server_error(0, frame.reply));
            }
            if frame.request_id > id {
                self.conn.mark_broken();
                return Err(ClientError::Protocol(format!(
                    "reply for request {} that was never sent",
                    frame.request_id
                )));
            }
            // An earlier call timed out; its reply arrived late. Drop it.
        }
    }

    /// Queues raw bytes and sends them (malformed input for tests and tools).
    pub fn send_raw(&mut self, bytes: &[u8]) -> Result<()> {
        self.conn.queue_raw(bytes)?;
        self.conn.flush()
    }

    /// The next reply frame, whatever its id.
    pub fn recv_frame(&mut self) -> Result<ReplyFrame> {
        self.conn.read_frame()
    }

    /// HELLO: the server's limits, remembered so that oversized requests are refused here
    /// instead of costing the connection; the connection then speaks the newest version
    /// both ends know (a server that answers `BAD_VERSION` is asked again in the oldest,
    /// then in the newest it names). A server that requires AUTH gets it here, from
    /// [`ClientOptions::secret`], and must prove it knows the secret too.
    pub fn hello(&mut self) -> Result<HelloReply> {
        let wanted = self.conn.version;
        let mut reply = self.call(Request::Hello)?;
        if reply.status() == crate::protocol::Status::BadVersion
            && self.conn.version > crate::protocol::VERSION_MIN
        {
            self.conn.version = crate::protocol::VERSION_MIN;
            reply = self.call(Request::Hello)?;
            if let Reply::Hello(h) = &reply {
                let agreed = wanted.min(h.version_max);
                if agreed > self.conn.version {
                    // Again in the agreed version: its HELLO reply has more in it.
                    self.conn.version = agreed;
                    reply = self.call(Request::Hello)?;
                }
            }
        }
        let h = match reply {
            Reply::Hello(h) => h,
            other => return Err(server_error(self.next_id - 1, other)),
        };
        self.conn.set_server_max_frame(h.max_frame_bytes as usize);
        self.conn.version = self.conn.version.min(h.version_max);
        if let AuthStep::Send { request, challenge } = auth_step(&h, self.conn.secret.as_ref())? {
            let reply = self.call(Request::Auth(request))?;
            let secret = self.conn.secret.clone();
            auth_done(
                self.next_id - 1,
                reply,
                secret.as_ref(),
                &request,
                &challenge,
            )?;
        }
        self.server = Some(h);
        Ok(h)
    }

    /// The protocol version this connection's requests go out in.
    pub fn version(&self) -> u8 {
        self.conn.version
    }

    pub fn ping(&mut self) -> Result<()> {
        match self.call(Request::Ping(Vec::new()))? {
            Reply::Pong(_) => Ok(()),
            other => Err(server_error(self.next_id - 1, other)),
        }
    }

    /// CLUSTER (version 6): the routing state of the cluster this node is in
    /// (`Status::Unsupported` from a node in none). [`super::Cluster`] routes by it.
    pub fn cluster(&mut self) -> Result<crate::protocol::ClusterReply> {
        match self.call(Request::Cluster)? {
            Reply::Cluster(c) => Ok(c),
            other => Err(server_error(self.next_id - 1, other)),
        }
    }

    /// SEARCH in collection 0 with no flags and no deadline.
    pub fn search(&mut self, k: u32, vector: &[f32]) -> Result<SearchReply> {
        self.search_with(SearchRequest::new(k, vector.to_vec()))
    }

    /// SEARCH as `req` says: flags, deadline, collection, and with
    /// [`SearchRequest::at_position`] (protocol version 5) a position the answer must
    /// hold every change up to (read-your-writes). AT_POSITION to a server below version
    /// 5 is [`ClientError::NotInVersion`], sent nowhere.
    pub fn search_with(&mut self, req: SearchRequest) -> Result<SearchReply> {
        match self.call(Request::Search(req))? {
            Reply::Search(s) => Ok(s),
            other => Err(server_error(self.next_id - 1, other)),
        }
    }

    /// SEARCH_BATCH of `queries` in collection 0 at `k`, no flags, no deadline: one item
    /// per query, in their order. See [`Client::search_batch_with`].
    pub fn search_batch(&mut self, k: u32, queries: &[Vec<f32>]) -> Result<Vec<BatchItem>> {
        self.search_batch_with(SearchBatchRequest::new(k, queries.to_vec()))
    }

    /// The queries of `req` in as few SEARCH_BATCH frames (version 4) as the server's
    /// limits allow (HELLO: `max_batch`, `max_frame_bytes`), one frame after another; a
    /// server below version 4 (or no HELLO yet) gets one SEARCH per query, with the same
    /// items. A query that fails has its status as its item; a frame refused as a whole
    /// (`BAD_K`, `DIM_MISMATCH`, ...) fails the call, and the answers of the frames before
    /// it are dropped. `deadline_us` is each frame's (each SEARCH's below version 4), so
    /// a call of several frames can take several deadlines. `at_position` (version 5)
    /// goes with every frame, as [`Client::search_with`]'s.
    pub fn search_batch_with(&mut self, mut req: SearchBatchRequest) -> Result<Vec<BatchItem>> {
        let queries = std::mem::take(&mut req.queries);
        let dim = queries.first().map_or(0, |q| q.len() as u32);
        let chunk = match self.server {
            Some(h) if self.conn.version >= 4 => {
                batch_count_max_for(&h, dim, req.k, req.at_position.is_some()).max(1)
            }
            _ => return self.searches_one_by_one(&req, queries),
        };
        let mut items = Vec::with_capacity(queries.len());
        let mut rest = queries.into_iter();
        loop {
            let part: Vec<Vec<f32>> = rest.by_ref().take(chunk as usize).collect();
            if part.is_empty() {
                return Ok(items);
            }
            let frame = SearchBatchRequest {
                queries: part,
                ..req.clone()
            };
            let sent = frame.queries.len();
            match self.call(Request::SearchBatch(frame))? {
                // Items pair with queries by position: a count that differs pairs nothing.
                Reply::SearchBatch(got) if got.len() != sent => {
                    self.conn.mark_broken();
                    return Err(ClientError::Protocol(format!(
                        "a batch of {sent} queries was answered with {} items",
                        got.len()
                    )));
                }
                Reply::SearchBatch(got) => items.extend(got),
                other => return Err(server_error(self.next_id - 1, other)),
            }
        }
    }

    /// A batch as single SEARCHes (a server without SEARCH_BATCH).
    fn searches_one_by_one(
        &mut self,
        req: &SearchBatchRequest,
        queries: Vec<Vec<f32>>,
    ) -> Result<Vec<BatchItem>> {
        let mut items = Vec::with_capacity(queries.len());
        for q in queries {
            items.push(match self.search_with(req.search(q)) {
                Ok(s) => Ok(s),
                // What a batch reports per query; the rest would refuse a whole frame.
                Err(ClientError::Server {
                    status, request_id, ..
                }) if request_id != 0 && status.fails_one_batch_query() => Err(status),
                Err(e) => return Err(e),
            });
        }
        Ok(items)
    }

    /// INSERT into collection 0, no payload.
    pub fn insert(&mut self, id: u64, vector: &[f32]) -> Result<()> {
        self.insert_with(InsertRequest {
            id,
            vector: vector.to_vec(),
            ..Default::default()
        })
    }

    pub fn insert_with(&mut self, req: InsertRequest) -> Result<()> {
        self.insert_request_with_position(req).map(drop)
    }

    /// INSERT into collection 0, no payload; the write's **position** (protocol version
    /// 5): with a pgvector backend, the WAL position after its COMMIT; a search with
    /// [`SearchRequest::at_position`] set to it sees the write. 0 where there is nothing
    /// to wait for: the embedded store and cache-aside (every acknowledged write is
    /// already in the cache), a position pgvector could not read, or a server below
    /// version 5 (which reports none, and cannot take AT_POSITION either).
    pub fn insert_with_position(&mut self, id: u64, vector: &[f32]) -> Result<u64> {
        self.insert_request_with_position(InsertRequest {
            id,
            vector: vector.to_vec(),
            ..Default::default()
        })
    }

    /// [`Client::insert_with_position`] for a whole request (collection, payload).
    pub fn insert_request_with_position(&mut self, req: InsertRequest) -> Result<u64> {
        match self.call(Request::Insert(req))? {
            Reply::Inserted { position } => Ok(position),
            other => Err(server_error(self.next_id - 1, other)),
        }
    }

    /// DELETE from collection 0; `Ok(false)` when the id was not there.
    pub fn delete(&mut self, id: u64) -> Result<bool> {
        self.delete_with_position(id).map(|d| d.existed)
    }

    /// DELETE from collection 0: whether the id was there, and the write's position (as
    /// [`Client::insert_with_position`]'s): a search at that position never serves the id.
    pub fn delete_with_position(&mut self, id: u64) -> Result<Deleted> {
        match self.call(Request::Delete(DeleteRequest { id, collection: 0 }))? {
            Reply::Deleted { existed, position } => Ok(Deleted { existed, position }),
            other => Err(server_error(self.next_id - 1, other)),
        }
    }

    /// FILL collection 0 with a backend answer; `Ok(true)` when the cache admitted it.
    pub fn fill(&mut self, query: &[f32], k: u32, candidates: Vec<FillCandidate>) -> Result<bool> {
        self.fill_with(FillRequest {
            token: None,
            collection: 0,
            k,
            query: query.to_vec(),
            candidates,
        })
    }

    /// FILL after a MISS, presenting its token (version 2; `SearchReply::token`): every
    /// id deleted since that miss is stripped, whichever connection the FILL comes on.
    pub fn fill_token(
        &mut self,
        query: &[f32],
        k: u32,
        candidates: Vec<FillCandidate>,
        token: Option<u64>,
    ) -> Result<bool> {
        self.fill_with(FillRequest {
            token,
            collection: 0,
            k,
            query: query.to_vec(),
            candidates,
        })
    }

    pub fn fill_with(&mut self, req: FillRequest) -> Result<bool> {
        match self.call(Request::Fill(req))? {
            Reply::Filled { admitted } => Ok(admitted),
            other => Err(server_error(self.next_id - 1, other)),
        }
    }

    pub fn flush(&mut self) -> Result<()> {
        match self.call(Request::Flush)? {
            Reply::Flushed => Ok(()),
            other => Err(server_error(self.next_id - 1, other)),
        }
    }

    pub fn stats(&mut self) -> Result<String> {
        match self.call(Request::Stats)? {
            Reply::Stats(s) => Ok(s),
            other => Err(server_error(self.next_id - 1, other)),
        }
    }
}
