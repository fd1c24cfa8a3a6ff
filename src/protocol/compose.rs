//! Frames → bytes. Appends to a caller-owned `Vec<u8>` so that a connection can batch many
//! replies into one write. Encoding is canonical: `decode(encode(f)) == f`, and every byte
//! string that decodes re-encodes to itself (the fuzz target checks both).

use super::*;

/// Why a frame could not be encoded. On error nothing is left appended to the output.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    #[error("body of {0} bytes does not fit the u32 length field")]
    BodyTooLong(usize),
    #[error("{what} count {n} does not fit its u32 field")]
    CountTooLarge { what: &'static str, n: usize },
    #[error("fill candidate {index} has dimension {got}, the query has {expected}")]
    FillDimension {
        index: usize,
        got: usize,
        expected: usize,
    },
    #[error("batch query {index} has dimension {got}, the first has {expected}")]
    BatchDimension {
        index: usize,
        got: usize,
        expected: usize,
    },
    #[error("a batch needs at least one query of at least one component")]
    EmptyBatch,
    #[error("{0} is a frame's status, not a batch item's")]
    NotAnItemStatus(Status),
    #[error("an error reply cannot carry status OK")]
    ErrorWithOk,
    #[error("{0} is not part of protocol version 1")]
    NotInVersion1(&'static str),
    #[error("{what} is protocol version {since} (the frame is version {version})")]
    NotInVersion {
        what: &'static str,
        since: u8,
        version: u8,
    },
    #[error("version {0} is not spoken here")]
    Version(u8),
    #[error("{0} is over the protocol's limits")]
    TooLarge(&'static str),
}

fn count(what: &'static str, n: usize) -> Result<u32, EncodeError> {
    u32::try_from(n).map_err(|_| EncodeError::CountTooLarge { what, n })
}

fn put_u16(out: &mut Vec<u8>, v: u16) {
    out.extend_from_slice(&v.to_le_bytes());
}
fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}
fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}
fn put_f32s(out: &mut Vec<u8>, v: &[f32]) {
    out.reserve(v.len() * 4);
    for x in v {
        out.extend_from_slice(&x.to_bits().to_le_bytes());
    }
}

/// Writes a header with a zero length, the body via `body`, then patches the length.
/// Truncates `out` back on error.
#[allow(clippy::too_many_arguments)]
fn frame(
    out: &mut Vec<u8>,
    version: u8,
    opcode: u8,
    flags: u16,
    status: u16,
    request_id: u64,
    body: impl FnOnce(&mut Vec<u8>) -> Result<(), EncodeError>,
) -> Result<usize, EncodeError> {
    let start = out.len();
    put_u16(out, MAGIC);
    out.push(version);
    out.push(opcode);
    put_u16(out, flags);
    put_u16(out, status);
    put_u64(out, request_id);
    put_u32(out, 0);
    let result = body(out).and_then(|()| {
        let body_len = out.len() - start - HEADER_LEN;
        u32::try_from(body_len).map_err(|_| EncodeError::BodyTooLong(body_len))
    });
    match result {
        Ok(len) => {
            out[start + 16..start + 20].copy_from_slice(&len.to_le_bytes());
            Ok(out.len() - start)
        }
        Err(e) => {
            out.truncate(start);
            Err(e)
        }
    }
}

/// Appends one request frame to `out`; returns its length.
pub fn encode_request(f: &RequestFrame, out: &mut Vec<u8>) -> Result<usize, EncodeError> {
    let op = f.request.opcode().code();
    if !(VERSION_MIN..=VERSION).contains(&f.version) {
        return Err(EncodeError::Version(f.version));
    }
    let since = f.request.opcode().since_version();
    if f.version < since {
        return Err(EncodeError::NotInVersion {
            what: f.request.opcode().name(),
            since,
            version: f.version,
        });
    }
    let flags = match &f.request {
        Request::Search(SearchRequest {
            at_position: Some(_),
            ..
        })
        | Request::SearchBatch(SearchBatchRequest {
            at_position: Some(_),
            ..
        }) if f.version < 5 => {
            return Err(EncodeError::NotInVersion {
                what: "AT_POSITION",
                since: 5,
                version: f.version,
            });
        }
        Request::Search(s) => s.flags(),
        Request::SearchBatch(b) => b.flags(),
        Request::Fill(fill) if fill.token.is_some() => {
            if f.version < 2 {
                return Err(EncodeError::NotInVersion1("a FILL token"));
            }
            FLAG_FILL_TOKEN
        }
        _ => 0,
    };
    frame(out, f.version, op, flags, 0, f.request_id, |out| {
        match &f.request {
            Request::Hello | Request::Flush | Request::Stats | Request::Cluster => {}
            Request::Auth(a) => {
                out.extend_from_slice(&a.nonce);
                out.extend_from_slice(&a.proof);
            }
            Request::Ping(payload) => out.extend_from_slice(payload),
            Request::Search(s) => {
                put_u32(out, s.collection);
                put_u32(out, s.k);
                put_u32(out, s.deadline_us);
                put_u32(out, count("vector", s.vector.len())?);
                put_f32s(out, &s.vector);
                if let Some(p) = s.at_position {
                    put_u64(out, p);
                }
            }
            Request::SearchBatch(b) => {
                let n = b.queries.first().map_or(0, Vec::len);
                if n == 0 {
                    // The decoder refuses it: what is encoded must decode.
                    return Err(EncodeError::EmptyBatch);
                }
                put_u32(out, b.collection);
                put_u32(out, b.k);
                put_u32(out, b.deadline_us);
                put_u32(out, count("query", n)?);
                put_u32(out, count("queries", b.queries.len())?);
                for (index, q) in b.queries.iter().enumerate() {
                    if q.len() != n {
                        return Err(EncodeError::BatchDimension {
                            index,
                            got: q.len(),
                            expected: n,
                        });
                    }
                    put_f32s(out, q);
                }
                if let Some(p) = b.at_position {
                    put_u64(out, p);
                }
            }
            Request::Insert(i) => {
                put_u64(out, i.id);
                put_u32(out, i.collection);
                put_u32(out, count("vector", i.vector.len())?);
                put_u32(out, count("payload", i.payload.len())?);
                put_f32s(out, &i.vector);
                out.extend_from_slice(&i.payload);
            }
            Request::Delete(d) => {
                put_u64(out, d.id);
                put_u32(out, d.collection);
            }
            Request::Fill(fill) => {
                let n = fill.query.len();
                put_u32(out, fill.collection);
                put_u32(out, fill.k);
                put_u32(out, count("query", n)?);
                put_u32(out, count("candidates", fill.candidates.len())?);
                put_f32s(out, &fill.query);
                for (index, c) in fill.candidates.iter().enumerate() {
                    if c.vector.len() != n {
                        return Err(EncodeError::FillDimension {
                            index,
                            got: c.vector.len(),
                            expected: n,
                        });
                    }
                    put_u64(out, c.id);
                    put_u32(out, c.distance.to_bits());
                    put_f32s(out, &c.vector);
                }
                if let Some(t) = fill.token {
                    put_u64(out, t);
                }
            }
        }
        Ok(())
    })
}

/// Appends one reply frame to `out`; returns its length.
pub fn encode_reply(f: &ReplyFrame, out: &mut Vec<u8>) -> Result<usize, EncodeError> {
    let opcode = f.reply.op_code() | REPLY_BIT;
    let status = f.reply.status();
    check_reply(f)?;
    frame(
        out,
        f.version,
        opcode,
        0,
        status.code(),
        f.request_id,
        |out| put_reply_body(out, &f.reply, f.version),
    )
}

/// Refuses a reply its frame cannot carry: an error with status OK, a version not spoken
/// here, or a reply newer than the frame's version.
fn check_reply(f: &ReplyFrame) -> Result<(), EncodeError> {
    let status = f.reply.status();
    if matches!(f.reply, Reply::Error { .. }) && status == Status::Ok {
        return Err(EncodeError::ErrorWithOk);
    }
    if !(VERSION_MIN..=VERSION).contains(&f.version) {
        return Err(EncodeError::Version(f.version));
    }
    let since = match Opcode::from_code(f.reply.op_code()) {
        Some(op) if status == Status::Ok => op.since_version(),
        _ => VERSION_MIN,
    };
    if f.version < since {
        return Err(EncodeError::NotInVersion {
            what: "this operation's reply",
            since,
            version: f.version,
        });
    }
    // Only a version 3 peer knows AUTH and its status.
    if f.version < 3
        && (matches!(f.reply, Reply::Authenticated { .. }) || status == Status::Unauthenticated)
    {
        return Err(EncodeError::NotInVersion {
            what: "AUTH and UNAUTHENTICATED",
            since: 3,
            version: f.version,
        });
    }
    Ok(())
}

/// A reply's body, in `version`'s layout.
fn put_reply_body(out: &mut Vec<u8>, reply: &Reply, version: u8) -> Result<(), EncodeError> {
    // Version 1 has no place for what version 2 added: a version 1 peer never gets it.
    let v2 = version >= 2;
    match reply {
        Reply::Hello(h) => put_hello(out, h, version),
        Reply::Pong(payload) => out.extend_from_slice(payload),
        Reply::Search(s) => {
            out.push(s.hit.code());
            out.push(search_flags(s, v2));
            put_u16(out, 0);
            put_answer(out, s, v2)?;
            if version >= 6 {
                put_u64(out, s.routing_version);
            }
        }
        Reply::SearchBatch(items) => put_batch(out, items, version)?,
        Reply::Cluster(c) => put_cluster(out, c)?,
        Reply::Flushed => {}
        // Version 5 adds the position; an older peer gets the older body.
        Reply::Inserted { position } => {
            if version >= 5 {
                put_u64(out, *position);
            }
        }
        Reply::Deleted { existed, position } => {
            out.push(*existed as u8);
            if version >= 5 {
                put_u64(out, *position);
            }
        }
        Reply::Filled { admitted } => out.push(*admitted as u8),
        Reply::Stats(text) => out.extend_from_slice(text.as_bytes()),
        Reply::Authenticated { server_proof } => out.extend_from_slice(server_proof),
        Reply::Error { message, .. } => out.extend_from_slice(message.as_bytes()),
    }
    Ok(())
}

/// A HELLO reply's body: each version appends its fields to the one before.
fn put_hello(out: &mut Vec<u8>, h: &HelloReply, version: u8) {
    out.push(h.version_min);
    out.push(h.version_max);
    out.push(h.metric.code());
    out.push(0);
    put_u32(out, h.max_frame_bytes);
    put_u32(out, h.dim);
    put_u32(out, h.k_max);
    put_u32(out, h.max_inflight);
    put_u32(out, h.executors);
    put_u32(out, h.shards);
    if version >= 2 {
        put_u32(out, h.delta.unwrap_or(0));
    }
    if version >= 3 {
        match &h.auth_challenge {
            None => out.push(0),
            Some(c) => {
                out.push(1);
                out.extend_from_slice(c);
            }
        }
    }
    if version >= 4 {
        put_u32(out, h.max_batch.unwrap_or(0));
    }
}

/// A SEARCH_BATCH reply's body: the item count, then per item its status and SEARCH
/// answer, or zeros for a failed query.
fn put_batch(out: &mut Vec<u8>, items: &[BatchItem], version: u8) -> Result<(), EncodeError> {
    let v2 = version >= 2;
    put_u32(out, count("items", items.len())?);
    if version >= 6 {
        let routing = items.iter().flatten().map(|s| s.routing_version).max();
        put_u64(out, routing.unwrap_or(0));
    }
    for item in items {
        match item {
            Ok(s) => {
                put_u16(out, Status::Ok.code());
                out.push(s.hit.code());
                out.push(search_flags(s, v2));
                put_answer(out, s, v2)?;
            }
            Err(status) if !status.fails_one_batch_query() => {
                return Err(EncodeError::NotAnItemStatus(*status))
            }
            Err(status) => {
                put_u16(out, status.code());
                put_u16(out, 0);
                put_u32(out, 0);
            }
        }
    }
    Ok(())
}

/// A SEARCH answer's flags byte (the token only where version 2 has room for it).
fn search_flags(s: &SearchReply, v2: bool) -> u8 {
    let mut flags = 0;
    if s.distances_to_query {
        flags |= REPLY_DISTANCES_TO_QUERY;
    }
    if s.token.is_some() && v2 {
        flags |= REPLY_TOKEN;
    }
    flags
}

/// A SEARCH answer after its hit kind and flags: count, neighbours, token.
fn put_answer(out: &mut Vec<u8>, s: &SearchReply, v2: bool) -> Result<(), EncodeError> {
    put_u32(out, count("neighbors", s.neighbors.len())?);
    out.reserve(s.neighbors.len() * 12);
    for n in &s.neighbors {
        put_u64(out, n.id);
        put_u32(out, n.distance.to_bits());
    }
    if let Some(t) = s.token.filter(|_| v2) {
        put_u64(out, t);
    }
    Ok(())
}

/// A CLUSTER reply's body (version 6): the header fields, the centroids, the nodes, the
/// overrides, the name.
fn put_cluster(out: &mut Vec<u8>, c: &ClusterReply) -> Result<(), EncodeError> {
    let dim = c.dim.max(1) as usize;
    // What a decoder refuses is never sent: dimension 0, a non-finite centroid.
    let too_many = c.dim == 0
        || c.centroids.iter().any(|x| !x.is_finite())
        || c.nodes.len() > CLUSTER_NODES_MAX
        || c.overrides.len() > CLUSTER_NODES_MAX
        || !c.centroids.len().is_multiple_of(dim)
        || c.name.len() > CLUSTER_NAME_BYTES_MAX
        || c.nodes
            .iter()
            .any(|n| n.advertise.len() > CLUSTER_NAME_BYTES_MAX);
    if too_many {
        return Err(EncodeError::TooLarge("cluster state"));
    }
    put_u64(out, c.routing_version);
    put_u64(out, c.centroids_version);
    put_u64(out, c.balance_epoch);
    put_u64(out, c.self_id);
    put_u32(out, c.lease_ms);
    out.extend_from_slice(&[c.metric.code(), 0, 0, 0]);
    put_u32(out, c.dim);
    put_u32(out, count("centroids", c.centroids.len() / dim)?);
    put_f32s(out, &c.centroids);
    put_u32(out, c.nodes.len() as u32);
    for n in &c.nodes {
        put_u64(out, n.node_id);
        out.push(n.live as u8);
        out.push(0);
        put_u16(out, n.advertise.len() as u16);
        out.extend_from_slice(n.advertise.as_bytes());
    }
    put_u32(out, c.overrides.len() as u32);
    for &(centroid, node) in &c.overrides {
        put_u32(out, centroid);
        put_u64(out, node);
    }
    put_u16(out, c.name.len() as u16);
    out.extend_from_slice(c.name.as_bytes());
    Ok(())
}
