//! The aker wire protocol, versions 1 to 6 (byte layouts and the changelog:
//! `PROTOCOL.md` at the repository root). A frame carries its version; the server
//! answers in the version of the request, so a version 1 client keeps working.
//!
//! Pelikan-style split: `parse` turns bytes into frames (a pure function over a buffer
//! that never panics and never allocates more than the frame it was allowed to read),
//! `compose` turns frames into bytes, and `validate` checks a decoded request against
//! the server's limits (dimension, finiteness, k). The connection layer
//! (`crate::server`) and the clients (`crate::client`) are built on these three.
//!
//! Every frame is a fixed 20-byte little-endian header followed by `body_len` bytes:
//!
//! ```text
//!  0      2        3        4       6        8            16         20
//!  +------+--------+--------+-------+--------+------------+----------+------ - -
//!  |magic |version |opcode  |flags  |status  |request id  |body len  | body ...
//!  | u16  |  u8    |  u8    | u16   | u16    |   u64      |   u32    |
//!  +------+--------+--------+-------+--------+------------+----------+------ - -
//! ```

mod compose;
/// The fuzz targets' properties: built for cargo-fuzz (`--cfg fuzzing`) and the unit tests.
#[cfg(any(fuzzing, test))]
#[doc(hidden)]
pub mod fuzz_support;
mod parse;
pub(crate) mod validate;

#[cfg(test)]
mod tests;

pub use compose::{encode_reply, encode_request, EncodeError};
pub use parse::{decode_reply, decode_request, peek_header, DecodeError, Header};
pub use validate::{status_of, validate, Limits, Rejection};

use shards::Metric;

/// `"AK"` on the wire (bytes `0x41 0x4B`), read as a little-endian u16.
pub const MAGIC: u16 = 0x4B41;
/// The newest protocol version this build speaks (what the clients send).
pub const VERSION: u8 = 6;
/// Oldest version this build accepts (the header layout is frozen across versions, so a
/// peer speaking another version gets a per-request `BAD_VERSION`, not a closed socket).
/// Connection-level replies go out in it: every client decodes them.
pub const VERSION_MIN: u8 = 1;

/// The version a reply to a frame of version `v` is sent in: `v` when spoken here, else
/// the newest (a `BAD_VERSION` reply tells the peer what this server speaks).
pub fn reply_version(v: u8) -> u8 {
    if (VERSION_MIN..=VERSION).contains(&v) {
        v
    } else {
        VERSION
    }
}
/// Fixed header length in bytes.
pub const HEADER_LEN: usize = 20;
/// Set in the opcode byte of every reply.
pub const REPLY_BIT: u8 = 0x80;
/// Opcode byte (without [`REPLY_BIT`]) of connection-level replies (sent with request id 0):
/// `BAD_FRAME` after garbage, `BUSY` past `max_connections`, `SHUTTING_DOWN`.
pub const CONNECTION_OP: u8 = 0;

/// SEARCH request flag: answer from the backend, do not look the cache up.
pub const FLAG_BYPASS_CACHE: u16 = 0x0001;
/// SEARCH request flag: answer from the backend and replace the cached entry.
pub const FLAG_REFRESH_ENTRY: u16 = 0x0002;
/// SEARCH and SEARCH_BATCH request flag (version 5): an 8-byte `position` ends the
/// body; the answer reflects every change committed at or before it (read-your-writes).
pub const FLAG_AT_POSITION: u16 = 0x0004;
/// Every flag bit a SEARCH may carry in versions 1 to 4.
pub const SEARCH_FLAGS: u16 = FLAG_BYPASS_CACHE | FLAG_REFRESH_ENTRY;

/// Every flag bit a SEARCH or SEARCH_BATCH of `version` may carry.
pub fn search_flags(version: u8) -> u16 {
    if version >= 5 {
        SEARCH_FLAGS | FLAG_AT_POSITION
    } else {
        SEARCH_FLAGS
    }
}
/// FILL request flag (version 2): an 8-byte MISS token ends the body.
pub const FLAG_FILL_TOKEN: u16 = 0x0001;

/// SEARCH reply body flag: the distances are to the request's own vector (re-ranked), not
/// to the cached representative query's.
pub const REPLY_DISTANCES_TO_QUERY: u8 = 0x01;
/// SEARCH reply body flag (version 2): an 8-byte MISS token follows the neighbours.
pub const REPLY_TOKEN: u8 = 0x02;

/// Request opcodes. A reply carries `opcode | REPLY_BIT`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Opcode {
    Hello = 0x01,
    Ping = 0x02,
    Search = 0x03,
    Insert = 0x04,
    Delete = 0x05,
    Fill = 0x06,
    Flush = 0x07,
    Stats = 0x08,
    /// Version 3: the client's answer to the HELLO reply's challenge.
    Auth = 0x09,
    /// Version 4: many queries of one k in one frame.
    SearchBatch = 0x0A,
    /// Version 6: the cluster's routing state (`crate::cluster`).
    Cluster = 0x0B,
}

impl Opcode {
    pub const ALL: [Opcode; 11] = [
        Opcode::Hello,
        Opcode::Ping,
        Opcode::Search,
        Opcode::Insert,
        Opcode::Delete,
        Opcode::Fill,
        Opcode::Flush,
        Opcode::Stats,
        Opcode::Auth,
        Opcode::SearchBatch,
        Opcode::Cluster,
    ];

    pub fn code(self) -> u8 {
        self as u8
    }

    /// The request opcode for a byte without [`REPLY_BIT`]; `None` for unknown codes.
    pub fn from_code(code: u8) -> Option<Opcode> {
        Opcode::ALL.iter().copied().find(|o| o.code() == code)
    }

    /// The first protocol version with this operation.
    pub fn since_version(self) -> u8 {
        match self {
            Opcode::Auth => 3,
            Opcode::SearchBatch => 4,
            Opcode::Cluster => 6,
            _ => 1,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Opcode::Hello => "HELLO",
            Opcode::Ping => "PING",
            Opcode::Search => "SEARCH",
            Opcode::Insert => "INSERT",
            Opcode::Delete => "DELETE",
            Opcode::Fill => "FILL",
            Opcode::Flush => "FLUSH",
            Opcode::Stats => "STATS",
            Opcode::Auth => "AUTH",
            Opcode::SearchBatch => "SEARCH_BATCH",
            Opcode::Cluster => "CLUSTER",
        }
    }
}

impl std::fmt::Display for Opcode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Reply status, the header's `status` field (always 0 in requests).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum Status {
    /// Success; the body is the operation's reply body.
    Ok = 0,
    /// The id the request names is not present (reserved for a service; DELETE of an
    /// absent id is `Ok` with `existed = 0`).
    NotFound = 1,
    /// Over a limit that clears by itself: in-flight requests on this connection,
    /// connections on the server (connection-level, then closed), a full internal queue.
    Busy = 2,
    /// The frame is longer than `max_frame_bytes`. Closes the connection.
    TooLarge = 3,
    /// The bytes are not a frame (bad magic). Closes the connection.
    BadFrame = 4,
    /// The header's version is not one this server speaks.
    BadVersion = 5,
    /// Unknown opcode (or a reply opcode sent as a request).
    UnknownOp = 6,
    /// The body does not match the opcode's layout, reserved bits are set, a count
    /// disagrees with the body length, or FILL candidates are unsorted / duplicated.
    BadRequest = 7,
    /// The vector's dimension is not the collection's.
    DimMismatch = 8,
    /// A vector component or a distance is NaN or infinite.
    NonFinite = 9,
    /// k is 0 or above `k_max`.
    BadK = 10,
    /// The request's deadline (or the server's request timeout) passed first. For a
    /// write the outcome is unknown.
    DeadlineExceeded = 11,
    /// The collection id is not served here.
    UnknownCollection = 12,
    /// The operation is not available in this server's configuration (e.g. FILL when the
    /// backend is not cache-aside).
    Unsupported = 13,
    /// The backend failed or cannot be reached.
    Unavailable = 14,
    /// The server is stopping (connection-level, then closed).
    ShuttingDown = 15,
    /// A bug or an unexpected failure inside the server.
    Internal = 16,
    /// Version 3: the server requires authentication and this connection has not
    /// authenticated (every request but HELLO, PING and AUTH), or its AUTH failed (then
    /// the connection is closed).
    Unauthenticated = 17,
}

impl Status {
    pub const ALL: [Status; 18] = [
        Status::Ok,
        Status::NotFound,
        Status::Busy,
        Status::TooLarge,
        Status::BadFrame,
        Status::BadVersion,
        Status::UnknownOp,
        Status::BadRequest,
        Status::DimMismatch,
        Status::NonFinite,
        Status::BadK,
        Status::DeadlineExceeded,
        Status::UnknownCollection,
        Status::Unsupported,
        Status::Unavailable,
        Status::ShuttingDown,
        Status::Internal,
        Status::Unauthenticated,
    ];

    pub fn code(self) -> u16 {
        self as u16
    }

    pub fn from_code(code: u16) -> Option<Status> {
        Status::ALL.get(code as usize).copied()
    }

    /// Whether a SEARCH_BATCH reports this status in one query's item. The others are
    /// the frame's: its layout, dimension, k, size and slots are checked once for all its
    /// queries (and the connection-level statuses are never an item).
    pub fn fails_one_batch_query(self) -> bool {
        matches!(
            self,
            Status::NotFound
                | Status::Busy
                | Status::NonFinite
                | Status::DeadlineExceeded
                | Status::UnknownCollection
                | Status::Unsupported
                | Status::Unavailable
                | Status::Internal
        )
    }

    pub fn name(self) -> &'static str {
        match self {
            Status::Ok => "OK",
            Status::NotFound => "NOT_FOUND",
            Status::Busy => "BUSY",
            Status::TooLarge => "TOO_LARGE",
            Status::BadFrame => "BAD_FRAME",
            Status::BadVersion => "BAD_VERSION",
            Status::UnknownOp => "UNKNOWN_OP",
            Status::BadRequest => "BAD_REQUEST",
            Status::DimMismatch => "DIM_MISMATCH",
            Status::NonFinite => "NON_FINITE",
            Status::BadK => "BAD_K",
            Status::DeadlineExceeded => "DEADLINE_EXCEEDED",
            Status::UnknownCollection => "UNKNOWN_COLLECTION",
            Status::Unsupported => "UNSUPPORTED",
            Status::Unavailable => "UNAVAILABLE",
            Status::ShuttingDown => "SHUTTING_DOWN",
            Status::Internal => "INTERNAL",
            Status::Unauthenticated => "UNAUTHENTICATED",
        }
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// How a SEARCH was answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum HitKind {
    /// Not answered from the cache (miss, BYPASS_CACHE or REFRESH_ENTRY): the backend's answer.
    Miss = 0,
    /// The same query vector was cached.
    Exact = 1,
    /// A query recorded as an alias of a cached representative.
    Alias = 2,
    /// Answered from a nearby cached query's result.
    Approximate = 3,
}

impl HitKind {
    pub const ALL: [HitKind; 4] = [
        HitKind::Miss,
        HitKind::Exact,
        HitKind::Alias,
        HitKind::Approximate,
    ];

    pub fn code(self) -> u8 {
        self as u8
    }

    pub fn from_code(code: u8) -> Option<HitKind> {
        HitKind::ALL.get(code as usize).copied()
    }

    pub fn name(self) -> &'static str {
        match self {
            HitKind::Miss => "miss",
            HitKind::Exact => "exact",
            HitKind::Alias => "alias",
            HitKind::Approximate => "approximate",
        }
    }
}

/// SEARCH: the `k` nearest neighbours of `vector` in `collection`.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct SearchRequest {
    pub collection: u32,
    pub k: u32,
    /// Time budget in microseconds from when the server decodes the request; 0 = none
    /// (the server's `request_timeout_ms` still applies).
    pub deadline_us: u32,
    pub bypass_cache: bool,
    pub refresh_entry: bool,
    pub vector: Vec<f32>,
    /// Version 5, AT_POSITION: answer only from a state that holds every change committed
    /// at or before this position (pgvector: a WAL position, as an INSERT or DELETE reply
    /// of version 5 gives it, or `pg_current_wal_insert_lsn()` read after one's own COMMIT).
    /// `None`: no flag. A frame below version 5 cannot carry it (the encoder refuses).
    pub at_position: Option<u64>,
}

impl SearchRequest {
    pub fn new(k: u32, vector: Vec<f32>) -> Self {
        SearchRequest {
            k,
            vector,
            ..Default::default()
        }
    }

    /// The deadline as a duration, `None` when the request carries none.
    pub fn deadline(&self) -> Option<std::time::Duration> {
        (self.deadline_us != 0).then(|| std::time::Duration::from_micros(self.deadline_us as u64))
    }

    pub(crate) fn flags(&self) -> u16 {
        let mut f = 0;
        if self.bypass_cache {
            f |= FLAG_BYPASS_CACHE;
        }
        if self.refresh_entry {
            f |= FLAG_REFRESH_ENTRY;
        }
        if self.at_position.is_some() {
            f |= FLAG_AT_POSITION;
        }
        f
    }
}

/// SEARCH_BATCH (version 4): `queries.len()` SEARCHes with one `k`, collection, deadline
/// and flags, answered in one frame.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct SearchBatchRequest {
    pub collection: u32,
    pub k: u32,
    /// For the whole batch, as [`SearchRequest::deadline_us`]: a query not answered by
    /// then is `DEADLINE_EXCEEDED` in its item.
    pub deadline_us: u32,
    pub bypass_cache: bool,
    pub refresh_entry: bool,
    /// Every query has the same length (the wire carries one dimension).
    pub queries: Vec<Vec<f32>>,
    /// Version 5, AT_POSITION for every query: as [`SearchRequest::at_position`].
    pub at_position: Option<u64>,
}

impl SearchBatchRequest {
    pub fn new(k: u32, queries: Vec<Vec<f32>>) -> Self {
        SearchBatchRequest {
            k,
            queries,
            ..Default::default()
        }
    }

    pub(crate) fn flags(&self) -> u16 {
        self.search(Vec::new()).flags()
    }

    /// The SEARCH that query `vector` of this batch is served as.
    pub fn search(&self, vector: Vec<f32>) -> SearchRequest {
        SearchRequest {
            collection: self.collection,
            k: self.k,
            deadline_us: self.deadline_us,
            bypass_cache: self.bypass_cache,
            refresh_entry: self.refresh_entry,
            vector,
            at_position: self.at_position,
        }
    }
}

/// The most bytes a SEARCH_BATCH reply of `count` queries at `k` can take, header
/// included: each item's 8 bytes, `k` neighbours and a token.
pub fn batch_reply_bytes_max(count: u32, k: u32) -> u64 {
    HEADER_LEN as u64 + 4 + count as u64 * (16 + 12 * k as u64)
}

/// The most queries of dimension `dim` at `k` one SEARCH_BATCH may carry to a server
/// that said `hello`: its `max_batch`, and both the request and the largest reply within
/// its `max_frame_bytes`. 0 when not even one fits (or the server has no SEARCH_BATCH).
pub fn batch_count_max(hello: &HelloReply, dim: u32, k: u32) -> u32 {
    batch_count_max_for(hello, dim, k, false)
}

/// [`batch_count_max`] for a batch that carries AT_POSITION's 8 bytes when `at_position`
/// (version 5).
pub fn batch_count_max_for(hello: &HelloReply, dim: u32, k: u32, at_position: bool) -> u32 {
    let frame = hello.max_frame_bytes as u64;
    let fields = HEADER_LEN as u64 + 20 + if at_position { 8 } else { 0 };
    let by_request = frame.saturating_sub(fields) / (4 * dim as u64).max(1);
    let by_reply = frame.saturating_sub(HEADER_LEN as u64 + 4) / (16 + 12 * k as u64);
    let by_limit = hello.max_batch.unwrap_or(0) as u64;
    by_request.min(by_reply).min(by_limit) as u32
}

/// INSERT: insert or replace `id` (in the backend, then the cache).
#[derive(Clone, Debug, PartialEq, Default)]
pub struct InsertRequest {
    pub id: u64,
    pub collection: u32,
    pub vector: Vec<f32>,
    /// Opaque bytes stored with the vector by backends that keep payloads.
    pub payload: Vec<u8>,
}

/// DELETE: remove `id`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct DeleteRequest {
    pub id: u64,
    pub collection: u32,
}

/// One neighbour of a cache-aside FILL: the backend's answer with its vector.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct FillCandidate {
    pub id: u64,
    pub distance: f32,
    pub vector: Vec<f32>,
}

impl From<FillCandidate> for shards::Candidate {
    fn from(c: FillCandidate) -> Self {
        shards::Candidate {
            id: c.id,
            distance: c.distance,
            vector: Some(c.vector.into()),
        }
    }
}

/// FILL (cache-aside): the client searched the backend itself after a miss and hands the
/// cache the query, its k and the backend's `k + Δ` answer, ascending by distance.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct FillRequest {
    pub collection: u32,
    pub k: u32,
    pub query: Vec<f32>,
    /// Every candidate vector has the query's dimension.
    pub candidates: Vec<FillCandidate>,
    /// The MISS reply's token (version 2): ids deleted since that miss are stripped.
    pub token: Option<u64>,
}

/// AUTH (version 3): the client's nonce and its proof for the HELLO reply's challenge
/// (`crate::auth`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AuthRequest {
    pub nonce: [u8; crate::auth::NONCE_LEN],
    pub proof: [u8; crate::auth::PROOF_LEN],
}

/// A decoded request.
#[derive(Clone, Debug, PartialEq)]
pub enum Request {
    Hello,
    /// The payload is echoed back.
    Ping(Vec<u8>),
    Search(SearchRequest),
    Insert(InsertRequest),
    Delete(DeleteRequest),
    Fill(FillRequest),
    Flush,
    Stats,
    Auth(AuthRequest),
    SearchBatch(SearchBatchRequest),
    /// Version 6: the cluster's routing state.
    Cluster,
}

impl Request {
    pub fn opcode(&self) -> Opcode {
        match self {
            Request::Hello => Opcode::Hello,
            Request::Ping(_) => Opcode::Ping,
            Request::Search(_) => Opcode::Search,
            Request::Insert(_) => Opcode::Insert,
            Request::Delete(_) => Opcode::Delete,
            Request::Fill(_) => Opcode::Fill,
            Request::Flush => Opcode::Flush,
            Request::Stats => Opcode::Stats,
            Request::Auth(_) => Opcode::Auth,
            Request::SearchBatch(_) => Opcode::SearchBatch,
            Request::Cluster => Opcode::Cluster,
        }
    }
}

/// A request with its id.
#[derive(Clone, Debug, PartialEq)]
pub struct RequestFrame {
    pub request_id: u64,
    /// The protocol version of the frame (`VERSION_MIN..=VERSION`).
    pub version: u8,
    pub request: Request,
}

impl RequestFrame {
    /// A frame of this build's newest version.
    pub fn new(request_id: u64, request: Request) -> Self {
        RequestFrame {
            request_id,
            version: VERSION,
            request,
        }
    }
}

/// HELLO reply: what a client must know before sending anything else.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HelloReply {
    pub version_min: u8,
    pub version_max: u8,
    pub metric: Metric,
    pub max_frame_bytes: u32,
    pub dim: u32,
    pub k_max: u32,
    /// Requests one connection may have in flight; more get BUSY.
    pub max_inflight: u32,
    pub executors: u32,
    pub shards: u32,
    /// Δ: a cache-aside client FILLs `k + Δ` candidates. Version 2 only (`None` in 1).
    pub delta: Option<u32>,
    /// Version 3: the server requires AUTH; the challenge to answer (one per connection).
    /// `None` when it does not, and in versions 1 and 2.
    pub auth_challenge: Option<[u8; crate::auth::NONCE_LEN]>,
    /// Version 4: the most queries one SEARCH_BATCH may carry (`None` below 4).
    pub max_batch: Option<u32>,
}

/// One search result.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct Neighbor {
    pub id: u64,
    pub distance: f32,
}

/// SEARCH reply.
#[derive(Clone, Debug, PartialEq)]
pub struct SearchReply {
    pub hit: HitKind,
    /// True when `distance`s are to the request's own vector; false when they are to the
    /// cached representative query's (an approximate hit that was not re-ranked).
    pub distances_to_query: bool,
    /// Ascending by distance.
    pub neighbors: Vec<Neighbor>,
    /// Version 2, a cache-aside MISS: the token its FILL presents.
    pub token: Option<u64>,
    /// Version 6: the version of the cluster's routing state the node holds (0: not in a
    /// cluster, and below version 6). A client holding an older one fetches CLUSTER again.
    pub routing_version: u64,
}

/// A node of a [`ClusterReply`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterNode {
    /// Stable across restarts (not the address); the rendezvous hash's input.
    pub node_id: u64,
    /// Its lease is held (judged on PostgreSQL's clock by the node that answered).
    pub live: bool,
    /// `host:port` clients reach it at (`cluster.advertise`).
    pub advertise: String,
}

/// CLUSTER reply (version 6): what a client routes by (`crate::cluster`, PROTOCOL.md
/// "Clusters"). Owner of centroid `c`: `overrides`' node for `c` when live, else the live
/// node with the highest [`crate::cluster::rendezvous_score`].
#[derive(Clone, Debug, PartialEq)]
pub struct ClusterReply {
    pub name: String,
    /// A digest of everything below that routing depends on (centroids version,
    /// overrides, live nodes): what SEARCH replies carry. Compared for equality; never 0.
    pub routing_version: u64,
    /// The centroids' version; bumped by a retrain.
    pub centroids_version: u64,
    /// The load-aware overrides' version; bumped at each publication.
    pub balance_epoch: u64,
    /// The node that answered.
    pub self_id: u64,
    pub lease_ms: u32,
    pub metric: Metric,
    pub dim: u32,
    /// Row-major, `centroids.len() / dim` centroids.
    pub centroids: Vec<f32>,
    pub nodes: Vec<ClusterNode>,
    /// `(centroid, node_id)`: a hot centroid given to a node other than its rendezvous
    /// owner, to balance load.
    pub overrides: Vec<(u32, u64)>,
}

/// The most nodes and overrides a CLUSTER reply may carry (a decoder refuses more).
pub const CLUSTER_NODES_MAX: usize = 1024;
/// The longest `advertise` or cluster name, in bytes.
pub const CLUSTER_NAME_BYTES_MAX: usize = 255;

/// One query's answer in a SEARCH_BATCH reply: its SEARCH reply, or the status it failed
/// with (never `Ok`; an item carries no message).
pub type BatchItem = Result<SearchReply, Status>;

/// A reply. Every request opcode has its own success variant; any failure is `Error`.
#[derive(Clone, Debug, PartialEq)]
pub enum Reply {
    Hello(HelloReply),
    Pong(Vec<u8>),
    Search(SearchReply),
    /// `position` (version 5): the WAL position after the write's COMMIT (pgvector);
    /// 0 where every acknowledged write is already in the cache (the embedded store,
    /// cache-aside), or where the position is unknown. Not on the wire below version 5
    /// (decoded as 0 there).
    Inserted {
        position: u64,
    },
    /// `position` (version 5): as [`Reply::Inserted`]'s.
    Deleted {
        existed: bool,
        position: u64,
    },
    Filled {
        admitted: bool,
    },
    Flushed,
    /// UTF-8 text, one `name value` pair per line.
    Stats(String),
    /// Version 3: the client's proof held; the server's own proof.
    Authenticated {
        server_proof: [u8; crate::auth::PROOF_LEN],
    },
    /// Version 4: one item per query of the SEARCH_BATCH, in its order. On the wire
    /// (version 6) the batch carries one routing version: the largest of its items'.
    SearchBatch(Vec<BatchItem>),
    /// Version 6: the cluster's routing state.
    Cluster(ClusterReply),
    /// Any non-OK status. `op` is the request opcode byte the error answers (without
    /// [`REPLY_BIT`]; [`CONNECTION_OP`] for connection-level replies). `status` is never `Ok`.
    Error {
        op: u8,
        status: Status,
        message: String,
    },
}

impl Reply {
    pub fn error(op: u8, status: Status, message: impl Into<String>) -> Reply {
        Reply::Error {
            op: op & !REPLY_BIT,
            status,
            message: message.into(),
        }
    }

    /// The request opcode byte this reply answers (without [`REPLY_BIT`]).
    pub fn op_code(&self) -> u8 {
        match self {
            Reply::Hello(_) => Opcode::Hello.code(),
            Reply::Pong(_) => Opcode::Ping.code(),
            Reply::Search(_) => Opcode::Search.code(),
            Reply::Inserted { .. } => Opcode::Insert.code(),
            Reply::Deleted { .. } => Opcode::Delete.code(),
            Reply::Filled { .. } => Opcode::Fill.code(),
            Reply::Flushed => Opcode::Flush.code(),
            Reply::Stats(_) => Opcode::Stats.code(),
            Reply::Authenticated { .. } => Opcode::Auth.code(),
            Reply::SearchBatch(_) => Opcode::SearchBatch.code(),
            Reply::Cluster(_) => Opcode::Cluster.code(),
            Reply::Error { op, .. } => *op & !REPLY_BIT,
        }
    }

    pub fn status(&self) -> Status {
        match self {
            Reply::Error { status, .. } => *status,
            _ => Status::Ok,
        }
    }

    /// Whether this is a success reply for a request with opcode `op`.
    pub fn answers(&self, op: Opcode) -> bool {
        !matches!(self, Reply::Error { .. }) && self.op_code() == op.code()
    }
}

/// A reply with the id of the request it answers (0 for connection-level replies).
#[derive(Clone, Debug, PartialEq)]
pub struct ReplyFrame {
    pub request_id: u64,
    /// The protocol version of the frame: the request's ([`reply_version`]).
    pub version: u8,
    pub reply: Reply,
}
