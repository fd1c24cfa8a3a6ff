//! Bytes → frames. Pure functions over a byte buffer: no I/O, no panics on any input, and
//! no allocation larger than the frame, which is never longer than `max_frame_bytes`
//! (every count is checked against the body length before anything is allocated).
//!
//! Each decoder answers one of
//! - `Ok(Some((frame, consumed)))`: a frame, `consumed` bytes long;
//! - `Ok(None)`: the buffer holds a prefix of a valid-so-far frame, read more;
//! - `Err(DecodeError::Framing { .. })`: the stream is not made of our frames any more
//!   (bad magic, or a length over the limit that we refuse to buffer): reply, then close;
//! - `Err(DecodeError::Frame { consumed, .. })`: the frame boundary is known and only this
//!   frame is bad (bad version, unknown opcode, wrong body): answer it with its request
//!   id, skip `consumed` bytes, keep the connection.
//!
//! A bad frame is only reported once it is complete, so that skipping it is always
//! possible; the length check comes first, so that a client cannot make us buffer more
//! than `max_frame_bytes` to find out.

use super::*;
use crate::auth::{NONCE_LEN, PROOF_LEN};

/// The fixed header, as read (not yet checked).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub magic: u16,
    pub version: u8,
    pub opcode: u8,
    pub flags: u16,
    pub status: u16,
    pub request_id: u64,
    pub body_len: u32,
}

impl Header {
    /// Header plus body, in bytes (u64: cannot overflow).
    pub fn frame_len(&self) -> u64 {
        HEADER_LEN as u64 + self.body_len as u64
    }
}

/// Reads the header if `buf` holds at least [`HEADER_LEN`] bytes; checks nothing.
pub fn peek_header(buf: &[u8]) -> Option<Header> {
    let h = buf.get(..HEADER_LEN)?;
    Some(Header {
        magic: u16::from_le_bytes([h[0], h[1]]),
        version: h[2],
        opcode: h[3],
        flags: u16::from_le_bytes([h[4], h[5]]),
        status: u16::from_le_bytes([h[6], h[7]]),
        request_id: u64::from_le_bytes([h[8], h[9], h[10], h[11], h[12], h[13], h[14], h[15]]),
        body_len: u32::from_le_bytes([h[16], h[17], h[18], h[19]]),
    })
}

/// Why a buffer did not decode.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Framing is lost: send the error reply (best effort), then close the connection.
    #[error("{status}: {reason} (framing lost)")]
    Framing {
        status: Status,
        /// From the header when it could be read and trusted that far, else 0.
        request_id: u64,
        /// Opcode byte without the reply bit ([`CONNECTION_OP`] when unknown).
        op: u8,
        /// The header's version, when a header was read.
        version: Option<u8>,
        reason: String,
    },
    /// Only this frame is bad: answer `request_id` with `status`, skip `consumed` bytes.
    #[error("{status} for request {request_id}: {reason}")]
    Frame {
        status: Status,
        request_id: u64,
        op: u8,
        version: Option<u8>,
        consumed: usize,
        reason: String,
    },
}

impl DecodeError {
    /// True when the connection must be closed after the error reply.
    pub fn closes_connection(&self) -> bool {
        matches!(self, DecodeError::Framing { .. })
    }

    pub fn status(&self) -> Status {
        match self {
            DecodeError::Framing { status, .. } | DecodeError::Frame { status, .. } => *status,
        }
    }

    pub fn request_id(&self) -> u64 {
        match self {
            DecodeError::Framing { request_id, .. } | DecodeError::Frame { request_id, .. } => {
                *request_id
            }
        }
    }

    /// Bytes to skip for a `Frame` error; `None` when framing is lost.
    pub fn consumed(&self) -> Option<usize> {
        match self {
            DecodeError::Framing { .. } => None,
            DecodeError::Frame { consumed, .. } => Some(*consumed),
        }
    }

    pub fn reason(&self) -> &str {
        match self {
            DecodeError::Framing { reason, .. } | DecodeError::Frame { reason, .. } => reason,
        }
    }

    /// The reply a server sends for this error.
    /// The version an error reply is sent in: the frame's when spoken here (and known),
    /// the oldest for bytes that are not a frame, the newest for a version not spoken.
    fn reply_version(&self) -> u8 {
        match self {
            DecodeError::Framing { version, .. } | DecodeError::Frame { version, .. } => {
                version.map_or(VERSION_MIN, reply_version)
            }
        }
    }

    pub fn error_reply(&self) -> ReplyFrame {
        let (op, status, request_id, reason) = match self {
            DecodeError::Framing {
                op,
                status,
                request_id,
                reason,
                ..
            }
            | DecodeError::Frame {
                op,
                status,
                request_id,
                reason,
                ..
            } => (*op, *status, *request_id, reason),
        };
        ReplyFrame {
            request_id,
            version: self.reply_version(),
            reply: Reply::error(op, status, reason.clone()),
        }
    }
}

/// A checked header and its complete body.
struct RawFrame<'a> {
    header: Header,
    body: &'a [u8],
    consumed: usize,
}

impl RawFrame<'_> {
    fn bad(&self, status: Status, reason: impl Into<String>) -> DecodeError {
        DecodeError::Frame {
            status,
            request_id: self.header.request_id,
            op: self.header.opcode & !REPLY_BIT,
            version: Some(self.header.version),
            consumed: self.consumed,
            reason: reason.into(),
        }
    }
}

fn bad_magic() -> DecodeError {
    DecodeError::Framing {
        status: Status::BadFrame,
        request_id: 0,
        op: CONNECTION_OP,
        version: None,
        reason: "bad magic: not an aker frame".into(),
    }
}

/// Steps shared by both directions: magic, length limit, completeness, version.
fn split_frame(buf: &[u8], max_frame_bytes: usize) -> Result<Option<RawFrame<'_>>, DecodeError> {
    // Reject garbage from its first byte, so that e.g. an HTTP request is refused at once
    // instead of waiting for 20 bytes that may never come.
    let magic = MAGIC.to_le_bytes();
    if buf.iter().zip(magic.iter()).any(|(a, b)| a != b) {
        return Err(bad_magic());
    }
    let Some(header) = peek_header(buf) else {
        return Ok(None);
    };
    let frame_len = header.frame_len();
    if frame_len > max_frame_bytes as u64 {
        return Err(DecodeError::Framing {
            status: Status::TooLarge,
            request_id: header.request_id,
            op: header.opcode & !REPLY_BIT,
            version: Some(header.version),
            reason: format!("frame of {frame_len} bytes is over the limit of {max_frame_bytes}"),
        });
    }
    // frame_len <= max_frame_bytes, a usize: the cast cannot truncate.
    let frame_len = frame_len as usize;
    if buf.len() < frame_len {
        return Ok(None);
    }
    let raw = RawFrame {
        header,
        body: &buf[HEADER_LEN..frame_len],
        consumed: frame_len,
    };
    if !(VERSION_MIN..=VERSION).contains(&header.version) {
        return Err(raw.bad(
            Status::BadVersion,
            format!(
                "version {} is not supported ({VERSION_MIN}..={VERSION})",
                header.version
            ),
        ));
    }
    Ok(Some(raw))
}

/// Decodes one request frame from the front of `buf`.
pub fn decode_request(
    buf: &[u8],
    max_frame_bytes: usize,
) -> Result<Option<(RequestFrame, usize)>, DecodeError> {
    let Some(raw) = split_frame(buf, max_frame_bytes)? else {
        return Ok(None);
    };
    let h = raw.header;
    if h.opcode & REPLY_BIT != 0 {
        return Err(raw.bad(
            Status::UnknownOp,
            format!("opcode {:#04x} is a reply opcode", h.opcode),
        ));
    }
    let Some(op) = Opcode::from_code(h.opcode) else {
        return Err(raw.bad(
            Status::UnknownOp,
            format!("unknown opcode {:#04x}", h.opcode),
        ));
    };
    if h.version < op.since_version() {
        return Err(raw.bad(
            Status::UnknownOp,
            format!(
                "{op} is protocol version {} (this frame is version {})",
                op.since_version(),
                h.version
            ),
        ));
    }
    if h.status != 0 {
        return Err(raw.bad(Status::BadRequest, "status field must be 0 in a request"));
    }
    let allowed_flags = match op {
        Opcode::Search | Opcode::SearchBatch => search_flags(h.version),
        Opcode::Fill if h.version >= 2 => FLAG_FILL_TOKEN,
        _ => 0,
    };
    if h.flags & !allowed_flags != 0 {
        return Err(raw.bad(
            Status::BadRequest,
            format!("flags {:#06x} are not defined for {op}", h.flags),
        ));
    }
    let request = parse_request_body(op, h.flags, raw.body)
        .map_err(|reason| raw.bad(Status::BadRequest, format!("{op} body: {reason}")))?;
    Ok(Some((
        RequestFrame {
            request_id: h.request_id,
            version: h.version,
            request,
        },
        raw.consumed,
    )))
}

/// Decodes one reply frame from the front of `buf`.
pub fn decode_reply(
    buf: &[u8],
    max_frame_bytes: usize,
) -> Result<Option<(ReplyFrame, usize)>, DecodeError> {
    let Some(raw) = split_frame(buf, max_frame_bytes)? else {
        return Ok(None);
    };
    let h = raw.header;
    if h.opcode & REPLY_BIT == 0 {
        return Err(raw.bad(
            Status::UnknownOp,
            format!("opcode {:#04x} is not a reply opcode", h.opcode),
        ));
    }
    let op = h.opcode & !REPLY_BIT;
    let Some(status) = Status::from_code(h.status) else {
        return Err(raw.bad(Status::BadRequest, format!("unknown status {}", h.status)));
    };
    if h.flags != 0 {
        return Err(raw.bad(Status::BadRequest, "reply flags must be 0"));
    }
    // An error reply may echo AUTH's opcode to an older peer (UNKNOWN_OP); a success may not.
    let auth_reply = status == Status::Ok && op == Opcode::Auth.code();
    if h.version < 3 && (status == Status::Unauthenticated || auth_reply) {
        return Err(raw.bad(
            Status::BadRequest,
            format!(
                "AUTH and UNAUTHENTICATED are protocol version 3 (the frame is version {})",
                h.version
            ),
        ));
    }
    let reply = if status == Status::Ok {
        let Some(op) = Opcode::from_code(op) else {
            return Err(raw.bad(Status::UnknownOp, format!("unknown reply opcode {op:#04x}")));
        };
        if h.version < op.since_version() {
            return Err(raw.bad(
                Status::BadRequest,
                format!(
                    "{op} is protocol version {} (the frame is version {})",
                    op.since_version(),
                    h.version
                ),
            ));
        }
        parse_reply_body(op, h.version, raw.body)
            .map_err(|reason| raw.bad(Status::BadRequest, format!("{op} reply body: {reason}")))?
    } else {
        let message = std::str::from_utf8(raw.body)
            .map_err(|_| raw.bad(Status::BadRequest, "error message is not UTF-8"))?;
        Reply::Error {
            op,
            status,
            message: message.to_owned(),
        }
    };
    Ok(Some((
        ReplyFrame {
            request_id: h.request_id,
            version: h.version,
            reply,
        },
        raw.consumed,
    )))
}

/// Little-endian cursor over a body; every read is bounds-checked.
struct Cursor<'a> {
    buf: &'a [u8],
}

type Parse<T> = Result<T, String>;

impl<'a> Cursor<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Cursor { buf }
    }

    fn take(&mut self, n: usize, what: &str) -> Parse<&'a [u8]> {
        if self.buf.len() < n {
            return Err(format!(
                "short body: {what} needs {n} bytes, {} left",
                self.buf.len()
            ));
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }

    fn u8(&mut self, what: &str) -> Parse<u8> {
        Ok(self.take(1, what)?[0])
    }

    fn u16(&mut self, what: &str) -> Parse<u16> {
        let b = self.take(2, what)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    fn u32(&mut self, what: &str) -> Parse<u32> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self, what: &str) -> Parse<u64> {
        let b = self.take(8, what)?;
        Ok(u64::from_le_bytes([
            b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7],
        ]))
    }

    fn f32(&mut self, what: &str) -> Parse<f32> {
        Ok(f32::from_bits(self.u32(what)?))
    }

    fn bool(&mut self, what: &str) -> Parse<bool> {
        match self.u8(what)? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(format!("{what} must be 0 or 1, got {v}")),
        }
    }

    /// `n` f32s; the length is checked before allocating, so `n` from the wire cannot
    /// make us allocate more than the body holds.
    fn f32s(&mut self, n: u32, what: &str) -> Parse<Vec<f32>> {
        let bytes = (n as usize)
            .checked_mul(4)
            .ok_or_else(|| format!("{what}: count {n} overflows"))?;
        let raw = self.take(bytes, what)?;
        Ok(raw
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.buf)
    }

    fn finish(&self) -> Parse<()> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(format!("{} trailing bytes", self.buf.len()))
        }
    }
}

fn parse_request_body(op: Opcode, flags: u16, body: &[u8]) -> Parse<Request> {
    let mut c = Cursor::new(body);
    let req = match op {
        Opcode::Hello => Request::Hello,
        Opcode::Ping => Request::Ping(c.rest().to_vec()),
        Opcode::Search => Request::Search(search_request(&mut c, flags)?),
        Opcode::SearchBatch => Request::SearchBatch(search_batch_request(&mut c, flags)?),
        Opcode::Insert => Request::Insert(insert_request(&mut c)?),
        Opcode::Delete => {
            let id = c.u64("id")?;
            let collection = c.u32("collection")?;
            Request::Delete(DeleteRequest { id, collection })
        }
        Opcode::Fill => Request::Fill(fill_request(&mut c, flags)?),
        Opcode::Flush => Request::Flush,
        Opcode::Stats => Request::Stats,
        Opcode::Cluster => Request::Cluster,
        Opcode::Auth => {
            let nonce = c.take(NONCE_LEN, "nonce")?.try_into().expect("16 bytes");
            let proof = c.take(PROOF_LEN, "proof")?.try_into().expect("32 bytes");
            Request::Auth(AuthRequest { nonce, proof })
        }
    };
    c.finish()?;
    Ok(req)
}

/// A SEARCH body; `flags` are the header's (already checked).
fn search_request(c: &mut Cursor<'_>, flags: u16) -> Parse<SearchRequest> {
    let collection = c.u32("collection")?;
    let k = c.u32("k")?;
    let deadline_us = c.u32("deadline_us")?;
    let n = c.u32("dim")?;
    let vector = c.f32s(n, "vector")?;
    // Version 5: the position ends the body (after the vector).
    let at_position = if flags & FLAG_AT_POSITION != 0 {
        Some(c.u64("position")?)
    } else {
        None
    };
    Ok(SearchRequest {
        collection,
        k,
        deadline_us,
        bypass_cache: flags & FLAG_BYPASS_CACHE != 0,
        refresh_entry: flags & FLAG_REFRESH_ENTRY != 0,
        vector,
        at_position,
    })
}

/// A SEARCH_BATCH body; `flags` are the header's (already checked).
fn search_batch_request(c: &mut Cursor<'_>, flags: u16) -> Parse<SearchBatchRequest> {
    let collection = c.u32("collection")?;
    let k = c.u32("k")?;
    let deadline_us = c.u32("deadline_us")?;
    let n = c.u32("dim")?;
    let count = c.u32("count")?;
    // An empty batch would carry a dimension nothing uses (and could not
    // re-encode); empty queries would let a 40-byte frame claim 2^32 of them.
    if count == 0 || n == 0 {
        return Err(format!(
            "a batch carries at least one query of at least one component (count {count}, n {n})"
        ));
    }
    // Version 5: the position ends the body (after the queries).
    let at_position = if flags & FLAG_AT_POSITION != 0 {
        let at = c.buf.len().checked_sub(8).ok_or("short body: position")?;
        let (rest, tail) = c.buf.split_at(at);
        c.buf = rest;
        Some(u64::from_le_bytes(tail.try_into().expect("8 bytes")))
    } else {
        None
    };
    // Check the whole matrix fits before reserving room for it (u128: 2^32 queries
    // of 2^32 components do not fit in a u64).
    let need = 4 * n as u128 * count as u128;
    if need != c.buf.len() as u128 {
        return Err(format!(
            "{count} queries of dimension {n} need {need} bytes, {} left",
            c.buf.len()
        ));
    }
    let mut queries = Vec::with_capacity(count as usize);
    for _ in 0..count {
        queries.push(c.f32s(n, "query")?);
    }
    Ok(SearchBatchRequest {
        collection,
        k,
        deadline_us,
        bypass_cache: flags & FLAG_BYPASS_CACHE != 0,
        refresh_entry: flags & FLAG_REFRESH_ENTRY != 0,
        queries,
        at_position,
    })
}

/// An INSERT body.
fn insert_request(c: &mut Cursor<'_>) -> Parse<InsertRequest> {
    let id = c.u64("id")?;
    let collection = c.u32("collection")?;
    let n = c.u32("dim")?;
    let p = c.u32("payload_len")?;
    let vector = c.f32s(n, "vector")?;
    let payload = c.take(p as usize, "payload")?.to_vec();
    Ok(InsertRequest {
        id,
        collection,
        vector,
        payload,
    })
}

/// A FILL body; `flags` are the header's (already checked).
fn fill_request(c: &mut Cursor<'_>, flags: u16) -> Parse<FillRequest> {
    let collection = c.u32("collection")?;
    let k = c.u32("k")?;
    let n = c.u32("dim")?;
    let m = c.u32("count")?;
    let query = c.f32s(n, "query")?;
    // Version 2: the MISS token ends the body (after the candidates).
    let token = if flags & FLAG_FILL_TOKEN != 0 {
        let at = c.buf.len().checked_sub(8).ok_or("short body: token")?;
        let (rest, tail) = c.buf.split_at(at);
        c.buf = rest;
        Some(u64::from_le_bytes(tail.try_into().expect("8 bytes")))
    } else {
        None
    };
    // Check the whole candidate array fits before reserving room for it.
    // u128: 2^32 candidates of 2^32 components do not fit in a u64.
    let need = (12u128 + 4 * n as u128) * m as u128;
    if need != c.buf.len() as u128 {
        return Err(format!(
            "{m} candidates of dimension {n} need {need} bytes, {} left",
            c.buf.len()
        ));
    }
    let mut candidates = Vec::with_capacity(m as usize);
    for _ in 0..m {
        let id = c.u64("candidate id")?;
        let distance = c.f32("candidate distance")?;
        let vector = c.f32s(n, "candidate vector")?;
        candidates.push(FillCandidate {
            id,
            distance,
            vector,
        });
    }
    Ok(FillRequest {
        collection,
        k,
        query,
        candidates,
        token,
    })
}

fn parse_reply_body(op: Opcode, version: u8, body: &[u8]) -> Parse<Reply> {
    let mut c = Cursor::new(body);
    let reply = match op {
        Opcode::Hello => {
            let version_min = c.u8("version_min")?;
            let version_max = c.u8("version_max")?;
            let metric_code = c.u8("metric")?;
            let metric = Metric::from_code(metric_code)
                .ok_or_else(|| format!("unknown metric code {metric_code}"))?;
            if c.u8("reserved")? != 0 {
                return Err("reserved byte must be 0".into());
            }
            Reply::Hello(HelloReply {
                version_min,
                version_max,
                metric,
                max_frame_bytes: c.u32("max_frame_bytes")?,
                dim: c.u32("dim")?,
                k_max: c.u32("k_max")?,
                max_inflight: c.u32("max_inflight")?,
                executors: c.u32("executors")?,
                shards: c.u32("shards")?,
                delta: if version >= 2 {
                    Some(c.u32("delta")?)
                } else {
                    None
                },
                auth_challenge: if version >= 3 {
                    match c.u8("auth")? {
                        0 => None,
                        1 => Some(
                            c.take(NONCE_LEN, "challenge")?
                                .try_into()
                                .expect("16 bytes"),
                        ),
                        other => return Err(format!("unknown auth mode {other}")),
                    }
                } else {
                    None
                },
                max_batch: if version >= 4 {
                    Some(c.u32("max_batch")?)
                } else {
                    None
                },
            })
        }
        Opcode::Ping => Reply::Pong(c.rest().to_vec()),
        Opcode::Search => {
            let hit = c.u8("hit kind")?;
            let flags = c.u8("flags")?;
            if c.u16("reserved")? != 0 {
                return Err("reserved field must be 0".into());
            }
            let mut reply = search_answer(&mut c, version, hit, flags)?;
            if version >= 6 {
                reply.routing_version = c.u64("routing version")?;
            }
            if !c.buf.is_empty() {
                return Err(format!("{} bytes after the neighbours", c.buf.len()));
            }
            Reply::Search(reply)
        }
        Opcode::SearchBatch => {
            let count = c.u32("count")?;
            let routing = if version >= 6 {
                c.u64("routing version")?
            } else {
                0
            };
            // An item is at least 8 bytes: a count the body cannot hold allocates nothing.
            if count as usize > c.buf.len() / 8 {
                return Err(format!("{count} items cannot fit in {} bytes", c.buf.len()));
            }
            let mut items = Vec::with_capacity(count as usize);
            for i in 0..count {
                let mut item = batch_item(&mut c, version).map_err(|e| format!("item {i}: {e}"))?;
                if let Ok(s) = &mut item {
                    s.routing_version = routing;
                }
                items.push(item);
            }
            // The encoder writes the largest of the answered items' versions.
            if routing != 0 && !items.iter().any(|i| i.is_ok()) {
                return Err("a batch with no answered query carries routing version 0".into());
            }
            Reply::SearchBatch(items)
        }
        Opcode::Cluster => Reply::Cluster(cluster_reply(&mut c)?),
        Opcode::Insert => Reply::Inserted {
            position: position(&mut c, version)?,
        },
        Opcode::Delete => Reply::Deleted {
            existed: c.bool("existed")?,
            position: position(&mut c, version)?,
        },
        Opcode::Fill => Reply::Filled {
            admitted: c.bool("admitted")?,
        },
        Opcode::Flush => Reply::Flushed,
        Opcode::Auth => Reply::Authenticated {
            server_proof: c
                .take(PROOF_LEN, "server proof")?
                .try_into()
                .expect("32 bytes"),
        },
        Opcode::Stats => {
            let text =
                std::str::from_utf8(c.rest()).map_err(|_| "stats text is not UTF-8".to_string())?;
            Reply::Stats(text.to_owned())
        }
    };
    c.finish()?;
    Ok(reply)
}

/// A write reply's `position` (version 5; 0 below, where the body has none).
fn position(c: &mut Cursor<'_>, version: u8) -> Parse<u64> {
    if version >= 5 {
        c.u64("position")
    } else {
        Ok(0)
    }
}

/// A SEARCH answer after its hit kind and flags: the neighbour count, the neighbours and
/// (version 2, with the TOKEN flag) the token.
fn search_answer(c: &mut Cursor<'_>, version: u8, hit: u8, flags: u8) -> Parse<SearchReply> {
    let hit = HitKind::from_code(hit).ok_or_else(|| format!("unknown hit kind {hit}"))?;
    let defined = if version >= 2 {
        REPLY_DISTANCES_TO_QUERY | REPLY_TOKEN
    } else {
        REPLY_DISTANCES_TO_QUERY
    };
    if flags & !defined != 0 {
        return Err(format!("undefined search reply flags {flags:#04x}"));
    }
    let n = c.u32("count")?;
    let token_len = if flags & REPLY_TOKEN != 0 { 8 } else { 0 };
    let need = 12 * n as u64 + token_len;
    if need > c.buf.len() as u64 {
        return Err(format!(
            "{n} neighbours need {need} bytes, {} left",
            c.buf.len()
        ));
    }
    let mut neighbors = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let id = c.u64("id")?;
        let distance = c.f32("distance")?;
        neighbors.push(Neighbor { id, distance });
    }
    let token = if token_len > 0 {
        Some(c.u64("token")?)
    } else {
        None
    };
    Ok(SearchReply {
        hit,
        distances_to_query: flags & REPLY_DISTANCES_TO_QUERY != 0,
        neighbors,
        token,
        routing_version: 0,
    })
}

/// A CLUSTER reply's body (version 6; PROTOCOL.md "CLUSTER").
fn cluster_reply(c: &mut Cursor<'_>) -> Parse<ClusterReply> {
    let routing_version = c.u64("routing version")?;
    let centroids_version = c.u64("centroids version")?;
    let balance_epoch = c.u64("balance epoch")?;
    let self_id = c.u64("self id")?;
    let lease_ms = c.u32("lease_ms")?;
    let code = c.u8("metric")?;
    let metric = Metric::from_code(code).ok_or_else(|| format!("unknown metric code {code}"))?;
    if c.take(3, "reserved")? != [0, 0, 0] {
        return Err("reserved bytes must be 0".into());
    }
    let dim = c.u32("dim")?;
    let n = c.u32("centroids")?;
    let floats = dim as u64 * n as u64;
    if dim == 0 || floats > (c.buf.len() / 4) as u64 {
        return Err(format!(
            "{n} centroids of dimension {dim} do not fit the body"
        ));
    }
    let centroids = c.f32s(floats as u32, "centroids")?;
    if centroids.iter().any(|x| !x.is_finite()) {
        return Err("a centroid is not finite".into());
    }
    let n_nodes = c.u32("nodes")? as usize;
    if n_nodes > CLUSTER_NODES_MAX {
        return Err(format!("{n_nodes} nodes (at most {CLUSTER_NODES_MAX})"));
    }
    let mut nodes = Vec::with_capacity(n_nodes);
    for _ in 0..n_nodes {
        let node_id = c.u64("node id")?;
        let live = c.bool("live")?;
        if c.u8("reserved")? != 0 {
            return Err("reserved byte must be 0".into());
        }
        let advertise = text(c, "advertise")?;
        nodes.push(ClusterNode {
            node_id,
            live,
            advertise,
        });
    }
    let n_over = c.u32("overrides")? as usize;
    if n_over > CLUSTER_NODES_MAX {
        return Err(format!("{n_over} overrides (at most {CLUSTER_NODES_MAX})"));
    }
    let mut overrides = Vec::with_capacity(n_over);
    for _ in 0..n_over {
        overrides.push((c.u32("centroid")?, c.u64("node id")?));
    }
    let name = text(c, "name")?;
    Ok(ClusterReply {
        name,
        routing_version,
        centroids_version,
        balance_epoch,
        self_id,
        lease_ms,
        metric,
        dim,
        centroids,
        nodes,
        overrides,
    })
}

/// A u16 length and that many bytes of UTF-8, at most [`CLUSTER_NAME_BYTES_MAX`].
fn text(c: &mut Cursor<'_>, what: &str) -> Parse<String> {
    let len = c.u16(what)? as usize;
    if len > CLUSTER_NAME_BYTES_MAX {
        return Err(format!(
            "{what} of {len} bytes (at most {CLUSTER_NAME_BYTES_MAX})"
        ));
    }
    let bytes = c.take(len, what)?;
    std::str::from_utf8(bytes)
        .map(str::to_owned)
        .map_err(|_| format!("{what} is not UTF-8"))
}

/// One SEARCH_BATCH reply item: a status, then a SEARCH answer, or zeros when the status
/// is not OK.
fn batch_item(c: &mut Cursor<'_>, version: u8) -> Parse<BatchItem> {
    let code = c.u16("status")?;
    let status = Status::from_code(code).ok_or_else(|| format!("unknown status {code}"))?;
    let hit = c.u8("hit kind")?;
    let flags = c.u8("flags")?;
    if status == Status::Ok {
        return search_answer(c, version, hit, flags).map(Ok);
    }
    if !status.fails_one_batch_query() {
        return Err(format!("{status} is a frame's status, not an item's"));
    }
    if hit != 0 || flags != 0 || c.u32("count")? != 0 {
        return Err(format!("a {status} item must have hit, flags and count 0"));
    }
    Ok(Err(status))
}
