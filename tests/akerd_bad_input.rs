//! PROTOCOL.md's statuses and limits, row by row, against a real akerd over loopback:
//! for each bad input, the status it gets, whether the connection stays, and a PING
//! answered afterwards (on the same connection when it stays, on a new one when it
//! closes). Raw sockets, so that nothing a client library would refuse to send is left
//! out.

#[path = "akerd_common/mod.rs"]
mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use aker::config::Config;
use aker::protocol::{
    FillCandidate, FillRequest, InsertRequest, Reply, ReplyFrame, Request, SearchBatchRequest,
    SearchRequest, Status, HEADER_LEN, MAGIC,
};
use common::*;

/// Small limits, so that each can be met quickly.
const MAX_FRAME: u32 = 64 << 10;
const MAX_CONNECTIONS: usize = 6;

fn limited() -> Config {
    let mut c = config();
    c.server.max_frame_bytes = MAX_FRAME;
    c.server.max_connections = MAX_CONNECTIONS;
    c.server.idle_timeout_ms = 1_500;
    c.server.write_timeout_ms = 1_000;
    c.server.output_high_water_bytes = 64 << 10;
    c
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
    s.set_nodelay(true).unwrap();
    s
}

/// A frame from its header fields and body, as PROTOCOL.md lays it out.
fn frame(version: u8, op: u8, flags: u16, status: u16, id: u64, body: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(HEADER_LEN + body.len());
    b.extend(MAGIC.to_le_bytes());
    b.push(version);
    b.push(op);
    b.extend(flags.to_le_bytes());
    b.extend(status.to_le_bytes());
    b.extend(id.to_le_bytes());
    b.extend((body.len() as u32).to_le_bytes());
    b.extend(body);
    b
}

/// The body of a valid request (its bytes after the header).
fn body(request: Request) -> Vec<u8> {
    encoded(2, 1, request)[HEADER_LEN..].to_vec()
}

/// A SEARCH_BATCH body's first 20 bytes: collection 0, `k`, no deadline, `n`, `count`.
fn batch_header(k: u32, n: u32, count: u32) -> Vec<u8> {
    [0, k, 0, n, count]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect()
}

/// The body of a version 4 request.
fn body4(request: Request) -> Vec<u8> {
    encoded(4, 1, request)[HEADER_LEN..].to_vec()
}

/// `body` with `len` bytes of an AT_POSITION position after it (8: a whole one).
fn at_position(mut body: Vec<u8>, len: usize) -> Vec<u8> {
    body.extend(&[7u8; 16][..len]);
    body
}

fn status_of(f: &ReplyFrame) -> Status {
    match &f.reply {
        Reply::Error { status, .. } => *status,
        _ => Status::Ok,
    }
}

fn ping_answers(s: &mut TcpStream) {
    s.write_all(&encoded(2, 99, Request::Ping(b"after".to_vec())))
        .unwrap();
    let f = read_reply(s).expect("a PING reply");
    assert_eq!(f.request_id, 99);
    assert!(
        matches!(f.reply, Reply::Pong(ref p) if p == b"after"),
        "{f:?}"
    );
}

struct Row {
    name: &'static str,
    bytes: Vec<u8>,
    status: Status,
    /// The request id the reply carries (0 for connection-level replies).
    id: u64,
    stays: bool,
}

fn row(name: &'static str, bytes: Vec<u8>, status: Status, id: u64, stays: bool) -> Row {
    Row {
        name,
        bytes,
        status,
        id,
        stays,
    }
}

fn vector(x: f32) -> Vec<f32> {
    vec![x; DIM]
}

/// A SEARCH_BATCH (version 4) of `n` queries of `x`, dimension `dim`.
fn batch(k: u32, n: usize, dim: usize) -> Request {
    Request::SearchBatch(SearchBatchRequest::new(k, vec![vec![0.5; dim]; n]))
}

fn search(k: u32, v: Vec<f32>) -> Request {
    Request::Search(SearchRequest::new(k, v))
}

fn fill(candidates: Vec<(u64, f32)>) -> Request {
    Request::Fill(FillRequest {
        collection: 0,
        k: 2,
        query: vector(0.5),
        candidates: candidates
            .into_iter()
            .map(|(id, distance)| FillCandidate {
                id,
                distance,
                vector: vector(0.5),
            })
            .collect(),
        token: None,
    })
}

fn rows() -> Vec<Row> {
    let ping = body(Request::Ping(vec![1, 2, 3]));
    let mut no_magic = frame(2, 0x02, 0, 0, 5, &ping);
    no_magic[0] = b'X';
    let mut truncated_search = body(search(K, vector(0.5)));
    truncated_search.truncate(truncated_search.len() - 2);
    let mut long_search = body(search(K, vector(0.5)));
    long_search.extend([0, 0, 0, 0]);
    let mut count_too_big = body(search(K, vector(0.5)));
    count_too_big[12..16].copy_from_slice(&(DIM as u32 + 1).to_le_bytes());
    let big_payload = Request::Insert(InsertRequest {
        id: 77,
        collection: 0,
        vector: vector(0.5),
        payload: vec![7; MAX_FRAME as usize],
    });
    let ok_payload = Request::Insert(InsertRequest {
        id: 78,
        collection: 0,
        vector: vector(0.5),
        payload: vec![7; 1000],
    });
    let max_id = Request::Insert(InsertRequest {
        id: u64::MAX,
        collection: 0,
        vector: vector(0.25),
        payload: vec![],
    });
    use Status::*;
    vec![
        row("bad magic", no_magic, BadFrame, 0, false),
        row(
            "version 0",
            frame(0, 0x02, 0, 0, 6, &ping),
            BadVersion,
            6,
            true,
        ),
        row(
            "version 7",
            frame(7, 0x02, 0, 0, 7, &ping),
            BadVersion,
            7,
            true,
        ),
        row(
            "version 255",
            frame(255, 0x01, 0, 0, 8, &[]),
            BadVersion,
            8,
            true,
        ),
        row(
            "opcode 0x09 (AUTH) in version 2",
            frame(2, 0x09, 0, 0, 9, &[]),
            UnknownOp,
            9,
            true,
        ),
        row(
            "opcode 0x0B",
            frame(4, 0x0B, 0, 0, 9, &[]),
            UnknownOp,
            9,
            true,
        ),
        row(
            "AUTH on a server without authentication",
            frame(3, 0x09, 0, 0, 9, &[0; 48]),
            Unsupported,
            9,
            true,
        ),
        row(
            "opcode 0x00",
            frame(2, 0x00, 0, 0, 10, &[]),
            UnknownOp,
            10,
            true,
        ),
        row(
            "opcode 0x80",
            frame(2, 0x80, 0, 0, 11, &[]),
            UnknownOp,
            11,
            true,
        ),
        row(
            "reply opcode 0x83",
            frame(2, 0x83, 0, 0, 12, &[]),
            UnknownOp,
            12,
            true,
        ),
        row(
            "status set",
            frame(2, 0x02, 0, 3, 13, &ping),
            BadRequest,
            13,
            true,
        ),
        row(
            "PING flag",
            frame(2, 0x02, 1, 0, 14, &ping),
            BadRequest,
            14,
            true,
        ),
        row(
            "SEARCH flag 0x0004",
            frame(2, 0x03, 4, 0, 15, &body(search(K, vector(0.5)))),
            BadRequest,
            15,
            true,
        ),
        row(
            "FILL token flag in version 1",
            frame(1, 0x06, 1, 0, 16, &body(fill(vec![(1, 0.1), (2, 0.2)]))),
            BadRequest,
            16,
            true,
        ),
        row(
            "HELLO with a body",
            frame(2, 0x01, 0, 0, 17, &[0]),
            BadRequest,
            17,
            true,
        ),
        row(
            "SEARCH body 2 bytes short",
            frame(2, 0x03, 0, 0, 18, &truncated_search),
            BadRequest,
            18,
            true,
        ),
        row(
            "SEARCH body 4 bytes long",
            frame(2, 0x03, 0, 0, 19, &long_search),
            BadRequest,
            19,
            true,
        ),
        row(
            "SEARCH n past the body",
            frame(2, 0x03, 0, 0, 20, &count_too_big),
            BadRequest,
            20,
            true,
        ),
        row(
            "NaN component",
            encoded(2, 21, search(K, vec![f32::NAN; DIM])),
            NonFinite,
            21,
            true,
        ),
        row(
            "+inf component",
            encoded(2, 22, search(K, vector(f32::INFINITY))),
            NonFinite,
            22,
            true,
        ),
        row(
            "dimension 3",
            encoded(2, 23, search(K, vec![0.5; 3])),
            DimMismatch,
            23,
            true,
        ),
        row(
            "k 0",
            encoded(2, 24, search(0, vector(0.5))),
            BadK,
            24,
            true,
        ),
        row(
            "k 33",
            encoded(2, 25, search(33, vector(0.5))),
            BadK,
            25,
            true,
        ),
        row(
            "unknown collection",
            encoded(
                2,
                26,
                Request::Search(SearchRequest {
                    collection: 9,
                    ..SearchRequest::new(K, vector(0.5))
                }),
            ),
            UnknownCollection,
            26,
            true,
        ),
        row(
            "FILL without a cache-aside backend",
            encoded(2, 27, fill(vec![(1, 0.1), (2, 0.2)])),
            Unsupported,
            27,
            true,
        ),
        row(
            "FILL repeated id",
            encoded(2, 28, fill(vec![(1, 0.1), (1, 0.2)])),
            BadRequest,
            28,
            true,
        ),
        row(
            "FILL unsorted",
            encoded(2, 29, fill(vec![(1, 0.3), (2, 0.2)])),
            BadRequest,
            29,
            true,
        ),
        row(
            "FILL NaN distance",
            encoded(2, 30, fill(vec![(1, f32::NAN), (2, 0.2)])),
            NonFinite,
            30,
            true,
        ),
        row(
            "INSERT payload within the frame limit (embedded: not kept)",
            encoded(2, 31, ok_payload),
            Ok,
            31,
            true,
        ),
        row("INSERT id u64::MAX", encoded(2, 32, max_id), Ok, 32, true),
        row(
            "DELETE of an absent id",
            encoded(
                2,
                33,
                Request::Delete(aker::protocol::DeleteRequest {
                    id: u64::MAX - 1,
                    collection: 0,
                }),
            ),
            Ok,
            33,
            true,
        ),
        // SEARCH_BATCH (version 4); its per-query statuses: tests/akerd_batch.rs.
        row(
            "SEARCH_BATCH in a version 3 frame",
            frame(3, 0x0A, 0, 0, 40, &body4(batch(K, 2, DIM))),
            UnknownOp,
            40,
            true,
        ),
        row(
            "SEARCH_BATCH of 0 queries",
            frame(4, 0x0A, 0, 0, 41, &batch_header(K, DIM as u32, 0)),
            BadRequest,
            41,
            true,
        ),
        row(
            "SEARCH_BATCH of 2^32 - 1 queries of dimension 0 (a 40-byte frame)",
            frame(4, 0x0A, 0, 0, 49, &batch_header(K, 0, u32::MAX)),
            BadRequest,
            49,
            true,
        ),
        row(
            "SEARCH_BATCH over max_batch (64 here: max_inflight)",
            encoded(4, 42, batch(K, 65, DIM)),
            BadRequest,
            42,
            true,
        ),
        row(
            "SEARCH_BATCH of dimension 3",
            encoded(4, 43, batch(K, 2, 3)),
            DimMismatch,
            43,
            true,
        ),
        row(
            "SEARCH_BATCH k 0",
            encoded(4, 44, batch(0, 2, DIM)),
            BadK,
            44,
            true,
        ),
        row(
            "SEARCH_BATCH k 33",
            encoded(4, 45, batch(33, 2, DIM)),
            BadK,
            45,
            true,
        ),
        row(
            "SEARCH_BATCH undefined flag 0x0004",
            frame(4, 0x0A, 4, 0, 46, &body4(batch(K, 2, DIM))),
            BadRequest,
            46,
            true,
        ),
        // AT_POSITION (version 5): an undefined flag below it; its position exact.
        row(
            "SEARCH AT_POSITION in a version 4 frame",
            frame(
                4,
                0x03,
                4,
                0,
                50,
                &at_position(body4(search(K, vector(0.5))), 8),
            ),
            BadRequest,
            50,
            true,
        ),
        row(
            "SEARCH AT_POSITION (the embedded store: served as usual)",
            frame(
                5,
                0x03,
                4,
                0,
                51,
                &at_position(body4(search(K, vector(0.5))), 8),
            ),
            Ok,
            51,
            true,
        ),
        row(
            "SEARCH AT_POSITION with 7 bytes of position",
            frame(
                5,
                0x03,
                4,
                0,
                52,
                &at_position(body4(search(K, vector(0.5))), 7),
            ),
            BadRequest,
            52,
            true,
        ),
        row(
            "SEARCH AT_POSITION with no position",
            frame(5, 0x03, 4, 0, 53, &body4(search(K, vector(0.5)))),
            BadRequest,
            53,
            true,
        ),
        row(
            "SEARCH_BATCH AT_POSITION in a version 4 frame",
            frame(4, 0x0A, 4, 0, 54, &at_position(body4(batch(K, 2, DIM)), 8)),
            BadRequest,
            54,
            true,
        ),
        row(
            "SEARCH_BATCH AT_POSITION with 9 bytes of position",
            frame(5, 0x0A, 4, 0, 55, &at_position(body4(batch(K, 2, DIM)), 9)),
            BadRequest,
            55,
            true,
        ),
        row(
            "SEARCH_BATCH AT_POSITION",
            frame(5, 0x0A, 4, 0, 56, &at_position(body4(batch(K, 2, DIM)), 8)),
            Ok,
            56,
            true,
        ),
        row(
            "SEARCH_BATCH count past its body",
            {
                let mut b = body4(batch(K, 2, DIM));
                b[16..20].copy_from_slice(&3u32.to_le_bytes());
                frame(4, 0x0A, 0, 0, 47, &b)
            },
            BadRequest,
            47,
            true,
        ),
        row(
            "SEARCH_BATCH with a NaN query: OK, the query's item says NON_FINITE",
            encoded(
                4,
                48,
                Request::SearchBatch(SearchBatchRequest::new(
                    K,
                    vec![vector(0.5), vector(f32::NAN)],
                )),
            ),
            Ok,
            48,
            true,
        ),
        row(
            "INSERT payload past max_frame_bytes",
            encoded(2, 34, big_payload),
            TooLarge,
            34,
            false,
        ),
        row(
            "body_len 4 GiB - 1",
            {
                let mut h = frame(2, 0x03, 0, 0, 35, &[]);
                h[16..20].copy_from_slice(&u32::MAX.to_le_bytes());
                h
            },
            TooLarge,
            35,
            false,
        ),
        row(
            "body_len one past max_frame_bytes",
            {
                let mut h = frame(2, 0x02, 0, 0, 36, &[]);
                let len = MAX_FRAME - HEADER_LEN as u32 + 1;
                h[16..20].copy_from_slice(&len.to_le_bytes());
                h
            },
            TooLarge,
            36,
            false,
        ),
    ]
}

#[test]
fn every_bad_input_gets_its_status_and_a_ping_is_answered_afterwards() {
    let d = start(&limited());
    let addr = d.local_addr();
    let rows = rows();
    for r in &rows {
        let mut s = connect(addr);
        // An oversized frame is answered from its header: write what fits, then read.
        let sent = if r.status == Status::TooLarge {
            let n = r.bytes.len().min(HEADER_LEN + 1024);
            s.write_all(&r.bytes[..n]).unwrap();
            n
        } else {
            s.write_all(&r.bytes).unwrap();
            r.bytes.len()
        };
        let f = read_reply(&mut s).unwrap_or_else(|| panic!("{}: no reply", r.name));
        assert_eq!(status_of(&f), r.status, "{}: {f:?}", r.name);
        assert_eq!(f.request_id, r.id, "{}", r.name);
        if r.stays {
            ping_answers(&mut s);
        } else {
            assert!(closed(&mut s), "{}: the connection stays", r.name);
            ping_answers(&mut connect(addr));
        }
        assert!(sent > 0);
    }
    // Every status a client's bytes alone can cause here (BUSY, DEADLINE_EXCEEDED,
    // UNAVAILABLE, SHUTTING_DOWN and INTERNAL need load, time, a failing backend or a
    // stopping server: tests/server.rs, tests/pgvector.rs and the tests below).
    let statuses: std::collections::HashSet<Status> = rows.iter().map(|r| r.status).collect();
    assert!(statuses.len() >= 11, "{statuses:?}");
    d.stop().unwrap();
}

/// A frame sent one byte at a time, 2 ms apart, is answered like any other.
#[test]
fn a_slow_sender_is_answered() {
    let d = start(&limited());
    let mut s = connect(d.local_addr());
    for b in encoded(2, 5, search(K, vector(0.5))) {
        s.write_all(&[b]).unwrap();
        std::thread::sleep(Duration::from_millis(2));
    }
    let f = read_reply(&mut s).expect("a reply");
    assert_eq!((f.request_id, status_of(&f)), (5, Status::Ok));
    ping_answers(&mut s);
    d.stop().unwrap();
}

/// Past `idle_timeout_ms` with nothing in flight the server closes without a frame; a
/// half-sent frame does not keep it open either.
#[test]
fn idle_and_half_sent_connections_are_closed_without_a_frame() {
    let d = start(&limited());
    let mut idle = connect(d.local_addr());
    let mut half = connect(d.local_addr());
    half.write_all(&encoded(2, 5, search(K, vector(0.5)))[..30])
        .unwrap();
    let started = Instant::now();
    let mut b = [0u8; 8];
    assert!(matches!(idle.read(&mut b), Ok(0)), "closed without a frame");
    assert!(matches!(half.read(&mut b), Ok(0)), "closed without a frame");
    assert!(started.elapsed() >= Duration::from_millis(1_000));
    ping_answers(&mut connect(d.local_addr()));
    d.stop().unwrap();
}

/// Past `max_connections`, connection-level BUSY (request id 0) and a close; once one
/// closes, a new connection is served.
#[test]
fn connections_past_the_limit_get_busy_and_the_server_recovers() {
    let d = start(&limited());
    let addr = d.local_addr();
    let mut held: Vec<TcpStream> = (0..MAX_CONNECTIONS).map(|_| connect(addr)).collect();
    for s in &mut held {
        ping_answers(s);
    }
    let mut over = connect(addr);
    let f = read_reply(&mut over).expect("connection-level BUSY");
    assert_eq!((f.request_id, status_of(&f)), (0, Status::Busy), "{f:?}");
    assert!(closed(&mut over));
    drop(held.pop());
    // The slot frees once the server has seen the close: bounded retries.
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        let mut s = connect(addr);
        s.write_all(&encoded(2, 99, Request::Ping(b"after".to_vec())))
            .unwrap();
        match read_reply(&mut s) {
            Some(f) if status_of(&f) == Status::Ok => break,
            _ if Instant::now() < end => std::thread::sleep(Duration::from_millis(20)),
            other => panic!("no slot freed: {other:?}"),
        }
    }
    d.stop().unwrap();
}

/// A client that sends requests and never reads: the server stops reading once its
/// queued replies pass `output_high_water_bytes` and drops the connection after
/// `write_timeout_ms`; the server itself keeps answering others throughout.
#[test]
fn a_client_that_never_reads_is_disconnected_and_others_are_served() {
    let d = start(&limited());
    let addr = d.local_addr();
    let mut hog = connect(addr);
    hog.set_write_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    // PINGs with 16 KiB payloads: their replies fill the server's output.
    let ping = encoded(2, 7, Request::Ping(vec![1; 16 << 10]));
    let mut written = 0usize;
    let end = Instant::now() + Duration::from_secs(10);
    while Instant::now() < end && written < 512 << 20 {
        match hog.write(&ping) {
            Ok(n) => written += n,
            Err(_) => break, // pushed back (or dropped)
        }
    }
    assert!(written < 512 << 20, "the server never pushed back");
    let mut other = connect(addr);
    ping_answers(&mut other);
    // Dropped by the server within a few write timeouts: what it had queued, then the
    // end of the stream.
    std::thread::sleep(Duration::from_millis(2_500));
    hog.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    assert!(
        closed(&mut hog),
        "a client that never reads is still connected"
    );
    // (`other` has been idle past `idle_timeout_ms` by now: a new connection.)
    ping_answers(&mut connect(addr));
    d.stop().unwrap();
}
