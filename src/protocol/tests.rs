use super::*;
use proptest::prelude::*;

const MAX: usize = 4096;
const LIMITS: Limits = Limits {
    dim: 4,
    k_max: 10,
    max_batch: 8,
    max_frame_bytes: 4096,
};

fn enc_req(id: u64, r: Request) -> Vec<u8> {
    let mut out = Vec::new();
    encode_request(
        &RequestFrame {
            version: VERSION,
            request_id: id,
            request: r,
        },
        &mut out,
    )
    .unwrap();
    out
}

fn enc_req_in(version: u8, id: u64, r: Request) -> Vec<u8> {
    let mut out = Vec::new();
    encode_request(
        &RequestFrame {
            version,
            request_id: id,
            request: r,
        },
        &mut out,
    )
    .unwrap();
    out
}

fn enc_reply_in(version: u8, id: u64, r: Reply) -> Vec<u8> {
    let mut out = Vec::new();
    encode_reply(
        &ReplyFrame {
            version,
            request_id: id,
            reply: r,
        },
        &mut out,
    )
    .unwrap();
    out
}

fn enc_reply(id: u64, r: Reply) -> Vec<u8> {
    let mut out = Vec::new();
    encode_reply(
        &ReplyFrame {
            version: VERSION,
            request_id: id,
            reply: r,
        },
        &mut out,
    )
    .unwrap();
    out
}

fn v4() -> Vec<f32> {
    vec![0.5, -1.0, 2.25, 0.0]
}

fn all_requests() -> Vec<Request> {
    vec![
        Request::Hello,
        Request::Ping(vec![]),
        Request::Ping(b"payload \x00\xff".to_vec()),
        Request::Search(SearchRequest::new(3, v4())),
        Request::Search(SearchRequest {
            collection: 7,
            k: 10,
            deadline_us: 1500,
            bypass_cache: true,
            refresh_entry: false,
            vector: v4(),
            at_position: None,
        }),
        Request::Search(SearchRequest {
            collection: u32::MAX,
            k: 1,
            deadline_us: u32::MAX,
            bypass_cache: true,
            refresh_entry: true,
            vector: vec![],
            at_position: None,
        }),
        Request::Insert(InsertRequest {
            id: u64::MAX,
            collection: 3,
            vector: v4(),
            payload: vec![],
        }),
        Request::Insert(InsertRequest {
            id: 42,
            collection: 0,
            vector: v4(),
            payload: b"json-ish {}".to_vec(),
        }),
        Request::Delete(DeleteRequest {
            id: 9,
            collection: 1,
        }),
        Request::Fill(FillRequest {
            token: None,
            collection: 0,
            k: 2,
            query: v4(),
            candidates: vec![],
        }),
        Request::Fill(FillRequest {
            collection: 2,
            k: 2,
            query: v4(),
            candidates: (0..3)
                .map(|i| FillCandidate {
                    id: 100 + i,
                    distance: i as f32 * 0.5,
                    vector: vec![i as f32; 4],
                })
                .collect(),
            token: None,
        }),
        Request::Fill(FillRequest {
            collection: 0,
            k: 1,
            query: v4(),
            candidates: vec![FillCandidate {
                id: 3,
                distance: 0.5,
                vector: v4(),
            }],
            token: Some(0x0102_0304_0506_0708),
        }),
        Request::Flush,
        Request::Stats,
        Request::Auth(AuthRequest {
            nonce: [0xA5; 16],
            proof: std::array::from_fn(|i| i as u8),
        }),
        Request::SearchBatch(SearchBatchRequest {
            collection: 5,
            k: 7,
            deadline_us: 2500,
            bypass_cache: false,
            refresh_entry: true,
            queries: vec![v4(), vec![1.0; 4], vec![-0.0, 3.5, 1e-30, 9.0]],
            at_position: None,
        }),
        Request::SearchBatch(SearchBatchRequest::new(1, vec![vec![2.0]])),
    ]
    .into_iter()
    .chain(positioned_requests())
    .collect()
}

/// Version 5: SEARCH and SEARCH_BATCH with AT_POSITION (every position size, with and
/// without the other flags, an empty vector).
fn positioned_requests() -> Vec<Request> {
    vec![
        Request::Search(SearchRequest {
            at_position: Some(0x16_B374_D848),
            ..SearchRequest::new(3, v4())
        }),
        Request::Search(SearchRequest {
            collection: 2,
            deadline_us: 9,
            bypass_cache: true,
            refresh_entry: true,
            at_position: Some(u64::MAX),
            ..SearchRequest::new(1, vec![])
        }),
        Request::Search(SearchRequest {
            at_position: Some(0),
            ..SearchRequest::new(1, v4())
        }),
        Request::SearchBatch(SearchBatchRequest {
            refresh_entry: true,
            at_position: Some(7),
            ..SearchBatchRequest::new(2, vec![v4(), vec![1.0; 4]])
        }),
        Request::SearchBatch(SearchBatchRequest {
            at_position: Some(u64::MAX - 1),
            ..SearchBatchRequest::new(1, vec![vec![2.0]])
        }),
    ]
}

/// One reply of each shape, and every error status; HELLO first (the tests index
/// `[0]`, `[1]`) and the full SEARCH_BATCH at `[3]`.
fn all_replies() -> Vec<Reply> {
    let mut v = hello_replies();
    v.extend(batch_replies());
    v.extend(short_replies());
    v.extend(search_replies());
    for m in [shards::Metric::L2Sq, shards::Metric::InnerProduct] {
        if let Reply::Hello(mut h) = v[0] {
            h.metric = m;
            v.push(Reply::Hello(h));
        }
    }
    v.extend(error_replies());
    v.push(cluster_reply());
    v
}

/// CLUSTER (version 6): two nodes, one gone, an override.
fn cluster_reply() -> Reply {
    Reply::Cluster(ClusterReply {
        name: "tier".into(),
        routing_version: 0xABCD,
        centroids_version: 2,
        balance_epoch: 3,
        self_id: 0x1122_3344_5566_7788,
        lease_ms: 5000,
        metric: Metric::Cosine,
        dim: 2,
        centroids: vec![1.0, 0.0, 0.0, 1.0],
        nodes: vec![
            ClusterNode {
                node_id: 1,
                live: true,
                advertise: "10.0.0.1:7700".into(),
            },
            ClusterNode {
                node_id: 2,
                live: false,
                advertise: "10.0.0.2:7700".into(),
            },
        ],
        overrides: vec![(1, 2)],
    })
}

/// HELLO with and without an auth challenge.
fn hello_replies() -> Vec<Reply> {
    vec![
        Reply::Hello(HelloReply {
            delta: Some(2),
            version_min: 1,
            version_max: 2,
            metric: shards::Metric::Cosine,
            max_frame_bytes: 1 << 20,
            dim: 768,
            k_max: 100,
            max_inflight: 64,
            executors: 4,
            shards: 16,
            auth_challenge: None,
            max_batch: Some(256),
        }),
        Reply::Hello(HelloReply {
            delta: Some(0),
            version_min: 1,
            version_max: 3,
            metric: shards::Metric::L2Sq,
            max_frame_bytes: 256,
            dim: 1,
            k_max: 1,
            max_inflight: 1,
            executors: 1,
            shards: 1,
            auth_challenge: Some(std::array::from_fn(|i| 0xF0 | i as u8)),
            max_batch: Some(1),
        }),
    ]
}

/// SEARCH_BATCH: empty, and answers mixed with failed queries.
fn batch_replies() -> Vec<Reply> {
    vec![
        Reply::SearchBatch(vec![]),
        Reply::SearchBatch(vec![
            Ok(SearchReply {
                token: None,
                routing_version: 0,
                hit: HitKind::Exact,
                distances_to_query: true,
                neighbors: vec![Neighbor {
                    id: 4,
                    distance: 0.25,
                }],
            }),
            Err(Status::NonFinite),
            Ok(SearchReply {
                token: Some(77),
                routing_version: 0,
                hit: HitKind::Miss,
                distances_to_query: true,
                neighbors: vec![],
            }),
            Err(Status::DeadlineExceeded),
            Ok(SearchReply {
                token: None,
                routing_version: 0,
                hit: HitKind::Approximate,
                distances_to_query: false,
                neighbors: (0..3)
                    .map(|i| Neighbor {
                        id: i,
                        distance: i as f32,
                    })
                    .collect(),
            }),
        ]),
    ]
}

/// The replies of a few bytes or none: AUTH, PING, empty SEARCH misses, the
/// acknowledgements, STATS.
fn short_replies() -> Vec<Reply> {
    vec![
        Reply::Authenticated {
            server_proof: [0x5A; 32],
        },
        Reply::Pong(vec![]),
        Reply::Pong(vec![1, 2, 3]),
        Reply::Search(SearchReply {
            token: None,
            routing_version: 0,
            hit: HitKind::Miss,
            distances_to_query: true,
            neighbors: vec![],
        }),
        Reply::Search(SearchReply {
            token: Some(u64::MAX - 3),
            routing_version: 0,
            hit: HitKind::Miss,
            distances_to_query: true,
            neighbors: vec![],
        }),
        Reply::Inserted { position: 0 },
        Reply::Inserted {
            position: 0x16_B374_D848,
        },
        Reply::Inserted { position: u64::MAX },
        Reply::Deleted {
            existed: true,
            position: 0,
        },
        Reply::Deleted {
            existed: false,
            position: 0,
        },
        Reply::Deleted {
            existed: true,
            position: 1,
        },
        Reply::Deleted {
            existed: false,
            position: u64::MAX,
        },
        Reply::Filled { admitted: true },
        Reply::Filled { admitted: false },
        Reply::Flushed,
        Reply::Stats(String::new()),
        Reply::Stats("hits_exact 3\nhits_alias 0\n".into()),
    ]
}

/// A SEARCH answer of five neighbours per hit kind.
fn search_replies() -> Vec<Reply> {
    HitKind::ALL
        .into_iter()
        .map(|hit| {
            Reply::Search(SearchReply {
                token: None,
                routing_version: 0,
                hit,
                distances_to_query: hit != HitKind::Approximate,
                neighbors: (0..5)
                    .map(|i| Neighbor {
                        id: i * 7,
                        distance: i as f32,
                    })
                    .collect(),
            })
        })
        .collect()
}

/// An error reply per status, one for the connection, one for an unknown opcode.
fn error_replies() -> Vec<Reply> {
    let mut v: Vec<Reply> = Status::ALL
        .into_iter()
        .filter(|s| *s != Status::Ok)
        .map(|status| Reply::error(Opcode::Search.code(), status, format!("{status} happened")))
        .collect();
    v.push(Reply::error(CONNECTION_OP, Status::Busy, ""));
    v.push(Reply::error(0x42, Status::UnknownOp, "unknown opcode 0x42"));
    v
}

#[test]
fn every_request_round_trips() {
    for (i, r) in all_requests().into_iter().enumerate() {
        let id = i as u64 * 0x0101_0101_0101;
        let bytes = enc_req(id, r.clone());
        let (f, n) = decode_request(&bytes, MAX).unwrap().unwrap();
        assert_eq!(n, bytes.len());
        assert_eq!(f.request_id, id);
        assert_eq!(f.request, r);
        // Every proper prefix asks for more bytes.
        for cut in 0..bytes.len() {
            assert_eq!(
                decode_request(&bytes[..cut], MAX),
                Ok(None),
                "{r:?} cut at {cut}"
            );
        }
    }
}

#[test]
fn every_reply_round_trips() {
    for (i, r) in all_replies().into_iter().enumerate() {
        let id = i as u64 + 1;
        let bytes = enc_reply(id, r.clone());
        let (f, n) = decode_reply(&bytes, MAX).unwrap().unwrap();
        assert_eq!(n, bytes.len());
        assert_eq!(f.request_id, id);
        assert_eq!(f.reply, r);
        for cut in 0..bytes.len() {
            assert_eq!(
                decode_reply(&bytes[..cut], MAX),
                Ok(None),
                "{r:?} cut at {cut}"
            );
        }
    }
}

/// What a version 1 peer sees of a value: version 2's, 3's, 4's and 5's additions dropped.
fn as_version_1_reply(r: Reply) -> Reply {
    match below_version_5(r) {
        Reply::Hello(h) => Reply::Hello(HelloReply {
            delta: None,
            auth_challenge: None,
            max_batch: None,
            ..h
        }),
        Reply::Search(s) => Reply::Search(SearchReply { token: None, ..s }),
        r => r,
    }
}

/// What a peer below version 5 sees of a value: the writes' positions dropped (decoded
/// as 0).
fn below_version_5(r: Reply) -> Reply {
    match r {
        Reply::Inserted { .. } => Reply::Inserted { position: 0 },
        Reply::Deleted { existed, .. } => Reply::Deleted {
            existed,
            position: 0,
        },
        r => r,
    }
}

/// The first version that can carry `r`: AUTH and UNAUTHENTICATED are version 3's,
/// SEARCH_BATCH version 4's. Encoding them in an older version is refused, never sent to
/// a peer that cannot read them.
fn since(r: &Reply) -> u8 {
    match r {
        Reply::Cluster(_) => 6,
        Reply::SearchBatch(_) => 4,
        Reply::Authenticated { .. } => 3,
        r if r.status() == Status::Unauthenticated => 3,
        _ => 1,
    }
}

/// Every reply in `version`: refused when it needs a later version, otherwise decoded
/// back to itself with HELLO's later fields dropped by `hello_in`.
fn replies_round_trip_in(version: u8, hello_in: impl Fn(HelloReply) -> HelloReply) {
    for (i, r) in all_replies().into_iter().enumerate() {
        let frame = ReplyFrame {
            request_id: i as u64 + 1,
            version,
            reply: r.clone(),
        };
        let mut bytes = Vec::new();
        if since(&r) > version {
            assert!(encode_reply(&frame, &mut bytes).is_err(), "{r:?}");
            continue;
        }
        encode_reply(&frame, &mut bytes).unwrap();
        let (f, _) = decode_reply(&bytes, MAX).unwrap().unwrap();
        let want = match r {
            Reply::Hello(h) => Reply::Hello(hello_in(h)),
            r if version < 5 => below_version_5(r),
            r => r,
        };
        assert_eq!((f.version, f.reply), (version, want));
    }
}

#[test]
fn version_4_frames_round_trip_without_version_5_fields() {
    // HELLO is the same in 4 and 5; the writes' positions are dropped below 5.
    replies_round_trip_in(4, |h| h);
    for (i, r) in positioned_requests().into_iter().enumerate() {
        // AT_POSITION has no place below version 5: refused, never dropped silently.
        let frame = RequestFrame {
            request_id: i as u64,
            version: 4,
            request: r.clone(),
        };
        assert_eq!(
            encode_request(&frame, &mut Vec::new()),
            Err(EncodeError::NotInVersion {
                what: "AT_POSITION",
                since: 5,
                version: 4
            })
        );
        // The same bytes with 4 at offset 2: an undefined flag there, BAD_REQUEST.
        let mut bytes = enc_req(30 + i as u64, r);
        bytes[2] = 4;
        let e = decode_request(&bytes, MAX).unwrap_err();
        assert_eq!(e.status(), Status::BadRequest, "{e}");
        assert!(e.reason().contains("not defined for"), "{e}");
        assert_eq!(e.consumed(), Some(bytes.len()));
        assert_eq!(e.error_reply().version, 4);
    }
    // Requests without AT_POSITION, and every reply, are the same bytes in 4 and 5 but
    // for the version byte and the writes' positions.
    for (i, r) in all_requests().into_iter().enumerate() {
        if positioned_requests().contains(&r) {
            continue;
        }
        let in_version = |v: u8| {
            let mut out = Vec::new();
            let f = RequestFrame {
                request_id: i as u64,
                version: v,
                request: r.clone(),
            };
            encode_request(&f, &mut out).unwrap();
            out
        };
        let (mut four, five) = (in_version(4), in_version(5));
        four[2] = 5;
        assert_eq!(four, five, "{r:?}");
    }
}

/// The version 5 bodies byte for byte: AT_POSITION's position ends a SEARCH's and a
/// SEARCH_BATCH's body; INSERT's reply is the position, DELETE's `existed` then it.
#[test]
fn version_5_layouts_are_the_documented_ones() {
    let position = 0x0102_0304_0506_0708u64;
    let search = enc_req_in(
        5,
        1,
        Request::Search(SearchRequest {
            at_position: Some(position),
            ..SearchRequest::new(2, vec![1.0, 0.0])
        }),
    );
    assert_eq!(search[2], 5);
    assert_eq!(u16::from_le_bytes([search[4], search[5]]), FLAG_AT_POSITION);
    let body = &search[HEADER_LEN..];
    assert_eq!(body.len(), 16 + 8 + 8);
    assert_eq!(&body[..24], &search_body(2, &[1.0, 0.0])[..]);
    assert_eq!(&body[24..], &position.to_le_bytes());
    let batch = enc_req(
        2,
        Request::SearchBatch(SearchBatchRequest {
            bypass_cache: true,
            at_position: Some(position),
            ..SearchBatchRequest::new(1, vec![vec![0.5; 4]; 2])
        }),
    );
    assert_eq!(
        u16::from_le_bytes([batch[4], batch[5]]),
        FLAG_AT_POSITION | FLAG_BYPASS_CACHE
    );
    let body = &batch[HEADER_LEN..];
    assert_eq!(&body[..body.len() - 8], &batch_body(1, 4, 2)[..]);
    assert_eq!(&body[body.len() - 8..], &position.to_le_bytes());
    let inserted = enc_reply(3, Reply::Inserted { position });
    assert_eq!(
        (inserted[3], &inserted[HEADER_LEN..]),
        (0x84, &position.to_le_bytes()[..])
    );
    let deleted = enc_reply(
        4,
        Reply::Deleted {
            existed: true,
            position,
        },
    );
    assert_eq!(deleted.len(), HEADER_LEN + 9);
    assert_eq!(deleted[HEADER_LEN], 1);
    assert_eq!(&deleted[HEADER_LEN + 1..], &position.to_le_bytes());
    // In version 4 the replies are the old bodies: empty, and `existed` alone.
    for (reply, body) in [
        (Reply::Inserted { position }, &[][..]),
        (
            Reply::Deleted {
                existed: true,
                position,
            },
            &[1][..],
        ),
    ] {
        let mut out = Vec::new();
        encode_reply(
            &ReplyFrame {
                request_id: 5,
                version: 4,
                reply,
            },
            &mut out,
        )
        .unwrap();
        assert_eq!(&out[HEADER_LEN..], body);
    }
}

/// A version 5 write reply must carry its position: the version 4 body is refused in 5
/// (and the version 5 body in 4).
#[test]
fn version_5_write_replies_are_exact() {
    #[rustfmt::skip]
    let cases: [(u8, u8, &[u8], bool); 8] = [
        (5, 0x84, &[], false),
        (5, 0x84, &[0; 7], false),
        (5, 0x84, &[0; 9], false),
        (5, 0x85, &[1], false),
        (5, 0x85, &[1, 0, 0, 0, 0, 0, 0, 0], false),
        (5, 0x85, &[2, 0, 0, 0, 0, 0, 0, 0, 0], false),
        (4, 0x84, &[0; 8], false),
        (5, 0x85, &[0, 9, 0, 0, 0, 0, 0, 0, 0], true),
    ];
    for (version, op, body, ok) in cases {
        let bytes = raw(MAGIC, version, op, 0, 0, 1, body);
        let got = decode_reply(&bytes, MAX);
        assert_eq!(got.is_ok(), ok, "v{version} {op:#x} {body:?}: {got:?}");
        if let Err(e) = got {
            assert_eq!(e.status(), Status::BadRequest);
        }
    }
}

#[test]
fn version_3_frames_round_trip_without_version_4_fields() {
    replies_round_trip_in(3, |h| HelloReply {
        max_batch: None,
        ..h
    });
    // A SEARCH_BATCH frame in version 3 is an unknown opcode there, and is not encoded.
    let batch = all_requests()
        .into_iter()
        .rfind(|r| matches!(r, Request::SearchBatch(_)))
        .unwrap();
    let frame = RequestFrame {
        request_id: 1,
        version: 3,
        request: batch.clone(),
    };
    assert!(encode_request(&frame, &mut Vec::new()).is_err());
    let mut bytes = enc_req(5, batch);
    bytes[2] = 3;
    let e = decode_request(&bytes, MAX).unwrap_err();
    assert_eq!(e.status(), Status::UnknownOp);
    assert_eq!(e.consumed(), Some(bytes.len()));
    // A SEARCH_BATCH reply in a version 3 frame is refused by the decoder.
    let mut bytes = enc_reply(6, all_replies()[3].clone());
    assert!(matches!(
        decode_reply(&bytes, MAX),
        Ok(Some((
            ReplyFrame {
                reply: Reply::SearchBatch(_),
                ..
            },
            _
        )))
    ));
    bytes[2] = 3;
    assert_eq!(
        decode_reply(&bytes, MAX).unwrap_err().status(),
        Status::BadRequest
    );
    // A version 4 HELLO reply is 4 bytes longer than version 3's (max_batch).
    let replies = all_replies();
    for hello in [&replies[0], &replies[1]] {
        let len = |v: u8| {
            let mut out = Vec::new();
            encode_reply(
                &ReplyFrame {
                    request_id: 1,
                    version: v,
                    reply: hello.clone(),
                },
                &mut out,
            )
            .unwrap()
        };
        assert_eq!(len(4), len(3) + 4);
    }
}

#[test]
fn version_2_frames_round_trip_without_version_3_fields() {
    replies_round_trip_in(2, |h| HelloReply {
        auth_challenge: None,
        max_batch: None,
        ..h
    });
    let auth = RequestFrame {
        request_id: 1,
        version: 2,
        request: all_requests()
            .into_iter()
            .find(|r| matches!(r, Request::Auth(_)))
            .unwrap(),
    };
    assert!(matches!(auth.request, Request::Auth(_)));
    assert!(encode_request(&auth, &mut Vec::new()).is_err());
    // An AUTH frame in version 2 is an unknown opcode there.
    let mut bytes = enc_req(5, auth.request.clone());
    bytes[2] = 2;
    let e = decode_request(&bytes, MAX).unwrap_err();
    assert_eq!(e.status(), Status::UnknownOp);
    assert_eq!(e.consumed(), Some(bytes.len()));
    // A version 3 HELLO reply is 1 byte longer than version 2's without a challenge, 17
    // with one.
    let replies = all_replies();
    for (hello, extra) in [(&replies[0], 1), (&replies[1], 17)] {
        let len = |v: u8| {
            let mut out = Vec::new();
            encode_reply(
                &ReplyFrame {
                    request_id: 1,
                    version: v,
                    reply: hello.clone(),
                },
                &mut out,
            )
            .unwrap()
        };
        assert_eq!(len(3), len(2) + extra);
    }
}

#[test]
fn version_1_frames_round_trip_without_version_2_fields() {
    for (i, r) in all_replies().into_iter().enumerate() {
        let mut bytes = Vec::new();
        let frame = ReplyFrame {
            request_id: i as u64 + 1,
            version: 1,
            reply: r.clone(),
        };
        if since(&r) > 1 {
            assert!(encode_reply(&frame, &mut bytes).is_err(), "{r:?}");
            continue;
        }
        encode_reply(&frame, &mut bytes).unwrap();
        assert_eq!(bytes[2], 1, "the version byte");
        let (f, _) = decode_reply(&bytes, MAX).unwrap().unwrap();
        assert_eq!((f.version, f.reply), (1, as_version_1_reply(r)));
    }
    for (i, r) in all_requests().into_iter().enumerate() {
        let frame = RequestFrame {
            request_id: i as u64,
            version: 1,
            request: r.clone(),
        };
        let mut bytes = Vec::new();
        match &r {
            // A token has no place in version 1: refused, never dropped silently.
            Request::Fill(f) if f.token.is_some() => {
                assert!(encode_request(&frame, &mut bytes).is_err());
                continue;
            }
            Request::Auth(_) | Request::SearchBatch(_) => {
                assert!(encode_request(&frame, &mut bytes).is_err());
                continue;
            }
            // AT_POSITION is version 5's.
            Request::Search(s) if s.at_position.is_some() => {
                assert!(encode_request(&frame, &mut bytes).is_err());
                continue;
            }
            _ => encode_request(&frame, &mut bytes).unwrap(),
        };
        let (f, _) = decode_request(&bytes, MAX).unwrap().unwrap();
        assert_eq!((f.version, f.request), (1, r));
    }
    // A version 2 HELLO reply is 4 bytes longer than version 1's (Δ).
    let hello = all_replies()[0].clone();
    let (mut v1, mut v2) = (Vec::new(), Vec::new());
    for (v, out) in [(1, &mut v1), (2, &mut v2)] {
        let f = ReplyFrame {
            request_id: 1,
            version: v,
            reply: hello.clone(),
        };
        encode_reply(&f, out).unwrap();
    }
    assert_eq!((v1.len(), v2.len()), (HEADER_LEN + 28, HEADER_LEN + 32));
    // An error reply to a frame of a version not spoken carries the newest.
    let bad = raw(MAGIC, 9, 0x02, 0, 0, 4, &[]);
    let e = decode_request(&bad, MAX).unwrap_err();
    assert_eq!(e.error_reply().version, VERSION);
    let garbage = decode_request(b"GET / HTTP/1.1\r\n", MAX).unwrap_err();
    assert_eq!(garbage.error_reply().version, VERSION_MIN);
}

#[test]
fn nan_bit_patterns_survive_the_wire() {
    // Validation refuses them, but the codec itself must be lossless.
    let weird = f32::from_bits(0x7fc0_1234);
    let bytes = enc_req(
        1,
        Request::Search(SearchRequest::new(1, vec![weird, f32::INFINITY])),
    );
    let (f, _) = decode_request(&bytes, MAX).unwrap().unwrap();
    let Request::Search(s) = f.request else {
        panic!()
    };
    assert_eq!(s.vector[0].to_bits(), 0x7fc0_1234);
}

#[test]
fn pipelined_frames_decode_in_sequence() {
    let mut buf = Vec::new();
    let reqs = all_requests();
    for (i, r) in reqs.iter().enumerate() {
        buf.extend(enc_req(i as u64, r.clone()));
    }
    let mut pos = 0;
    for (i, r) in reqs.iter().enumerate() {
        let (f, n) = decode_request(&buf[pos..], MAX).unwrap().unwrap();
        assert_eq!((f.request_id, &f.request), (i as u64, r));
        pos += n;
    }
    assert_eq!(pos, buf.len());
}

#[test]
fn header_layout_is_the_documented_one() {
    let bytes = enc_req_in(
        5,
        0x1122_3344_5566_7788,
        Request::Delete(DeleteRequest {
            id: 5,
            collection: 6,
        }),
    );
    assert_eq!(
        &bytes[..HEADER_LEN],
        &[
            0x41, 0x4B, // magic "AK"
            5,    // version
            0x05, // DELETE
            0, 0, // flags
            0, 0, // status
            0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11, // request id
            12, 0, 0, 0, // body length
        ]
    );
    assert_eq!(&bytes[HEADER_LEN..], &[5, 0, 0, 0, 0, 0, 0, 0, 6, 0, 0, 0]);
    let reply = enc_reply(
        3,
        Reply::Deleted {
            existed: true,
            position: 0x0807_0605_0403_0201,
        },
    );
    assert_eq!(reply[3], 0x85);
    assert_eq!(&reply[HEADER_LEN..], &[1, 1, 2, 3, 4, 5, 6, 7, 8]);
}

#[test]
fn encoder_refuses_what_it_cannot_represent() {
    let mut out = vec![9u8];
    let bad = RequestFrame {
        version: VERSION,
        request_id: 1,
        request: Request::Fill(FillRequest {
            token: None,
            collection: 0,
            k: 1,
            query: v4(),
            candidates: vec![FillCandidate {
                id: 1,
                distance: 0.0,
                vector: vec![1.0],
            }],
        }),
    };
    assert!(matches!(
        encode_request(&bad, &mut out),
        Err(EncodeError::FillDimension {
            index: 0,
            got: 1,
            expected: 4
        })
    ));
    assert_eq!(out, vec![9u8], "nothing is left behind on error");
    let ok_error = ReplyFrame {
        version: VERSION,
        request_id: 1,
        reply: Reply::Error {
            op: 3,
            status: Status::Ok,
            message: String::new(),
        },
    };
    assert_eq!(
        encode_reply(&ok_error, &mut out),
        Err(EncodeError::ErrorWithOk)
    );
    // Batches the decoder would refuse: none, empty queries, ragged ones, an item with a
    // frame's status.
    for (queries, want) in [
        (vec![], EncodeError::EmptyBatch),
        (vec![vec![], vec![]], EncodeError::EmptyBatch),
        (
            vec![v4(), vec![1.0]],
            EncodeError::BatchDimension {
                index: 1,
                got: 1,
                expected: 4,
            },
        ),
    ] {
        let f = RequestFrame::new(1, Request::SearchBatch(SearchBatchRequest::new(1, queries)));
        assert_eq!(encode_request(&f, &mut out), Err(want));
    }
    let frame_status = ReplyFrame {
        version: VERSION,
        request_id: 1,
        reply: Reply::SearchBatch(vec![Err(Status::BadK)]),
    };
    assert_eq!(
        encode_reply(&frame_status, &mut out),
        Err(EncodeError::NotAnItemStatus(Status::BadK))
    );
    assert_eq!(out, vec![9u8], "nothing is left behind on error");
    // ... and the decoder refuses such an item.
    let mut bytes = enc_reply(3, Reply::SearchBatch(vec![Err(Status::Busy)]));
    assert!(decode_reply(&bytes, MAX).is_ok());
    bytes[HEADER_LEN + 4..HEADER_LEN + 6].copy_from_slice(&Status::BadK.code().to_le_bytes());
    assert_eq!(
        decode_reply(&bytes, MAX).unwrap_err().status(),
        Status::BadRequest
    );
}

/// A hand-built frame, for inputs the encoder would never produce.
fn raw(magic: u16, version: u8, op: u8, flags: u16, status: u16, id: u64, body: &[u8]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend(magic.to_le_bytes());
    b.push(version);
    b.push(op);
    b.extend(flags.to_le_bytes());
    b.extend(status.to_le_bytes());
    b.extend(id.to_le_bytes());
    b.extend((body.len() as u32).to_le_bytes());
    b.extend(body);
    b
}

fn search_body(k: u32, v: &[f32]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend(0u32.to_le_bytes());
    b.extend(k.to_le_bytes());
    b.extend(0u32.to_le_bytes());
    b.extend((v.len() as u32).to_le_bytes());
    for x in v {
        b.extend(x.to_le_bytes());
    }
    b
}

/// `body` with `len` bytes of a position after it (8: a whole one).
fn positioned(mut body: Vec<u8>, len: usize) -> Vec<u8> {
    body.extend(&0x1122_3344_5566_7788u64.to_le_bytes().repeat(2)[..len]);
    body
}

/// A SEARCH_BATCH body: `count` queries of dimension `dim`, all 0.5.
fn batch_body(k: u32, dim: u32, count: u32) -> Vec<u8> {
    let mut b = Vec::new();
    for x in [0, k, 0, dim, count] {
        b.extend(x.to_le_bytes());
    }
    for _ in 0..dim * count {
        b.extend(0.5f32.to_le_bytes());
    }
    b
}

fn search(id: u64, k: u32, v: Vec<f32>) -> Vec<u8> {
    enc_req(id, Request::Search(SearchRequest::new(k, v)))
}

fn fill(id: u64, k: u32, cands: Vec<(u64, f32, Vec<f32>)>) -> Vec<u8> {
    enc_req(
        id,
        Request::Fill(FillRequest {
            token: None,
            collection: 0,
            k,
            query: v4(),
            candidates: cands
                .into_iter()
                .map(|(id, distance, vector)| FillCandidate {
                    id,
                    distance,
                    vector,
                })
                .collect(),
        }),
    )
}

#[derive(Debug, PartialEq)]
enum Outcome {
    /// Ok(None): wait for more bytes.
    NeedMore,
    /// Decoded and validated.
    Accepted,
    /// Error reply with this status, for this request id; `close` = framing lost.
    Rejected {
        status: Status,
        id: u64,
        close: bool,
    },
}

/// What a server does with `bytes`: decode, then validate.
fn outcome(bytes: &[u8]) -> Outcome {
    match decode_request(bytes, MAX) {
        Ok(None) => Outcome::NeedMore,
        Ok(Some((f, n))) => {
            assert_eq!(n, bytes.len());
            match validate(&f.request, &LIMITS) {
                Ok(()) => Outcome::Accepted,
                Err(r) => Outcome::Rejected {
                    status: r.status,
                    id: f.request_id,
                    close: false,
                },
            }
        }
        Err(e) => {
            if let Some(n) = e.consumed() {
                assert_eq!(n, bytes.len(), "a bad frame is skipped whole");
            }
            Outcome::Rejected {
                status: e.status(),
                id: e.request_id(),
                close: e.closes_connection(),
            }
        }
    }
}

fn rejected(status: Status, id: u64, close: bool) -> Outcome {
    Outcome::Rejected { status, id, close }
}

/// A bad-input case: its name, the bytes, what a server does with them.
type Case = (&'static str, Vec<u8>, Outcome);

/// Framing lost: reply, then close.
#[rustfmt::skip]
fn framing_lost_cases() -> Vec<Case> {
    use Status::*;
    let m = MAGIC;
    let too_long_header = {
        let mut h = raw(m, 1, 0x03, 0, 0, 77, &[]);
        h[16..20].copy_from_slice(&((MAX - HEADER_LEN + 1) as u32).to_le_bytes());
        h
    };
    vec![
        ("oversized frame, header only", too_long_header.clone(), rejected(TooLarge, 77, true)),
        ("oversized frame, body len u32::MAX", {
            let mut h = too_long_header.clone();
            h[16..20].copy_from_slice(&u32::MAX.to_le_bytes());
            h
        }, rejected(TooLarge, 77, true)),
        ("oversized frame, whole", search(5, 1, vec![0.0; MAX / 4]), rejected(TooLarge, 5, true)),
        ("bad magic", raw(0xBEEF, 1, 0x02, 0, 0, 9, &[]), rejected(BadFrame, 0, true)),
        ("bad magic, first byte only", b"G".to_vec(), rejected(BadFrame, 0, true)),
        ("bad magic, second byte", vec![0x41, 0x00], rejected(BadFrame, 0, true)),
        ("http request", b"GET / HTTP/1.1\r\n\r\n".to_vec(), rejected(BadFrame, 0, true)),
    ]
}

/// Incomplete: wait.
#[rustfmt::skip]
fn incomplete_cases() -> Vec<Case> {
    let m = MAGIC;
    vec![
        ("empty buffer", vec![], Outcome::NeedMore),
        ("magic only", vec![0x41, 0x4B], Outcome::NeedMore),
        ("truncated header", raw(m, 1, 0x02, 0, 0, 1, &[])[..HEADER_LEN - 1].to_vec(), Outcome::NeedMore),
        ("truncated body", { let b = search(3, 1, v4()); b[..b.len() - 1].to_vec() }, Outcome::NeedMore),
    ]
}

/// This request only: error reply with its id, connection stays.
#[rustfmt::skip]
fn bad_frame_cases() -> Vec<Case> {
    use Status::*;
    let m = MAGIC;
    vec![
        ("bad version 0", raw(m, 0, 0x02, 0, 0, 11, &[]), rejected(BadVersion, 11, false)),
        ("bad version 7", raw(m, 7, 0x03, 0, 0, 12, &search_body(1, &v4())), rejected(BadVersion, 12, false)),
        ("version 1 search", raw(m, 1, 0x03, 0, 0, 61, &search_body(1, &v4())), Outcome::Accepted),
        ("fill token flag in version 1", raw(m, 1, 0x06, FLAG_FILL_TOKEN, 0, 62, &[0; 24]), rejected(BadRequest, 62, false)),
        ("unknown opcode", raw(m, 1, 0x42, 0, 0, 13, b"xyz"), rejected(UnknownOp, 13, false)),
        ("opcode 0", raw(m, 1, 0x00, 0, 0, 14, &[]), rejected(UnknownOp, 14, false)),
        ("reply opcode as request", raw(m, 1, 0x83, 0, 0, 15, &[]), rejected(UnknownOp, 15, false)),
        ("status set in request", raw(m, 1, 0x02, 0, 1, 16, &[]), rejected(BadRequest, 16, false)),
        ("undefined search flag", raw(m, 1, 0x03, 0x0004, 0, 17, &search_body(1, &v4())), rejected(BadRequest, 17, false)),
        ("AT_POSITION in version 4", raw(m, 4, 0x03, FLAG_AT_POSITION, 0, 63, &positioned(search_body(1, &v4()), 8)), rejected(BadRequest, 63, false)),
        ("AT_POSITION in version 5", raw(m, 5, 0x03, FLAG_AT_POSITION, 0, 64, &positioned(search_body(1, &v4()), 8)), Outcome::Accepted),
        ("AT_POSITION with every flag", raw(m, 5, 0x03, 0x0007, 0, 65, &positioned(search_body(1, &v4()), 8)), Outcome::Accepted),
        ("undefined search flag in version 5", raw(m, 5, 0x03, 0x0008, 0, 66, &search_body(1, &v4())), rejected(BadRequest, 66, false)),
        ("AT_POSITION without its position", raw(m, 5, 0x03, FLAG_AT_POSITION, 0, 67, &search_body(1, &v4())), rejected(BadRequest, 67, false)),
        ("AT_POSITION with a truncated position", raw(m, 5, 0x03, FLAG_AT_POSITION, 0, 68, &positioned(search_body(1, &v4()), 7)), rejected(BadRequest, 68, false)),
        ("AT_POSITION with a byte too many", raw(m, 5, 0x03, FLAG_AT_POSITION, 0, 69, &positioned(search_body(1, &v4()), 9)), rejected(BadRequest, 69, false)),
        ("a position without AT_POSITION", raw(m, 5, 0x03, 0, 0, 60, &positioned(search_body(1, &v4()), 8)), rejected(BadRequest, 60, false)),
        ("flags on ping", raw(m, 1, 0x02, FLAG_BYPASS_CACHE, 0, 18, &[]), rejected(BadRequest, 18, false)),
        ("hello with a body", raw(m, 1, 0x01, 0, 0, 19, &[0]), rejected(BadRequest, 19, false)),
        ("short search body", raw(m, 1, 0x03, 0, 0, 20, &search_body(1, &v4())[..14]), rejected(BadRequest, 20, false)),
        ("search body shorter than its dim", {
            let mut b = search_body(1, &v4());
            b.truncate(b.len() - 4);
            raw(m, 1, 0x03, 0, 0, 21, &b)
        }, rejected(BadRequest, 21, false)),
        ("search body with trailing bytes", {
            let mut b = search_body(1, &v4());
            b.push(0);
            raw(m, 1, 0x03, 0, 0, 22, &b)
        }, rejected(BadRequest, 22, false)),
        ("search dim u32::MAX in a small body", {
            let mut b = search_body(1, &v4());
            b[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
            raw(m, 1, 0x03, 0, 0, 23, &b)
        }, rejected(BadRequest, 23, false)),
        ("short delete body", raw(m, 1, 0x05, 0, 0, 24, &[1, 2, 3]), rejected(BadRequest, 24, false)),
        ("insert payload longer than body", {
            let mut b = Vec::new();
            b.extend(1u64.to_le_bytes());
            b.extend(0u32.to_le_bytes());
            b.extend(0u32.to_le_bytes());
            b.extend(100u32.to_le_bytes());
            b.extend([1, 2]);
            raw(m, 1, 0x04, 0, 0, 25, &b)
        }, rejected(BadRequest, 25, false)),
        ("fill count u32::MAX", {
            let mut b = fill(26, 1, vec![]);
            b[HEADER_LEN + 12..HEADER_LEN + 16].copy_from_slice(&u32::MAX.to_le_bytes());
            b
        }, rejected(BadRequest, 26, false)),
    ]
}

/// Decoded, refused by validation against the limits.
#[rustfmt::skip]
fn refused_cases() -> Vec<Case> {
    use Status::*;
    let nan = f32::NAN;
    let inf = f32::INFINITY;
    vec![
        ("wrong dimension", search(30, 1, vec![1.0; 3]), rejected(DimMismatch, 30, false)),
        ("empty vector", search(31, 1, vec![]), rejected(DimMismatch, 31, false)),
        ("NaN component", search(32, 1, vec![0.0, nan, 0.0, 0.0]), rejected(NonFinite, 32, false)),
        ("+inf component", search(33, 1, vec![inf, 0.0, 0.0, 0.0]), rejected(NonFinite, 33, false)),
        ("-inf component", search(34, 1, vec![0.0, 0.0, 0.0, -inf]), rejected(NonFinite, 34, false)),
        ("k = 0", search(35, 0, v4()), rejected(BadK, 35, false)),
        ("k > k_max", search(36, 11, v4()), rejected(BadK, 36, false)),
        ("insert wrong dimension", enc_req(37, Request::Insert(InsertRequest { vector: vec![0.0; 5], ..Default::default() })), rejected(DimMismatch, 37, false)),
        ("insert NaN", enc_req(38, Request::Insert(InsertRequest { vector: vec![nan; 4], ..Default::default() })), rejected(NonFinite, 38, false)),
        ("fill k = 0", fill(39, 0, vec![]), rejected(BadK, 39, false)),
        ("fill k > k_max", fill(40, 11, vec![]), rejected(BadK, 40, false)),
        ("fill NaN distance", fill(41, 1, vec![(1, nan, v4())]), rejected(NonFinite, 41, false)),
        ("fill NaN in a candidate vector", fill(42, 1, vec![(1, 0.0, vec![0.0, 0.0, inf, 0.0])]), rejected(NonFinite, 42, false)),
        ("fill unsorted", fill(43, 1, vec![(1, 2.0, v4()), (2, 1.0, v4())]), rejected(BadRequest, 43, false)),
        ("fill duplicate id", fill(44, 1, vec![(1, 1.0, v4()), (1, 2.0, v4())]), rejected(BadRequest, 44, false)),
        ("fill wrong query dimension", enc_req(45, Request::Fill(FillRequest { k: 1, query: vec![0.0; 2], ..Default::default() })), rejected(DimMismatch, 45, false)),
    ]
}

/// SEARCH_BATCH (version 4).
#[rustfmt::skip]
fn batch_cases() -> Vec<Case> {
    use Status::*;
    let m = MAGIC;
    let nan = f32::NAN;
    vec![
        ("batch in version 3", raw(m, 3, 0x0A, 0, 0, 70, &batch_body(1, 4, 1)), rejected(UnknownOp, 70, false)),
        ("batch of 0", raw(m, 4, 0x0A, 0, 0, 71, &batch_body(1, 4, 0)), rejected(BadRequest, 71, false)),
        // 2^32 - 1 empty queries in a 40-byte frame: refused before anything is allocated.
        ("batch of dimension 0", {
            let mut b = batch_body(1, 0, 1);
            b[16..20].copy_from_slice(&u32::MAX.to_le_bytes());
            raw(m, 4, 0x0A, 0, 0, 83, &b)
        }, rejected(BadRequest, 83, false)),
        // Two faults: SEARCH's order, the dimension first.
        ("batch of dimension 3 at k 0", raw(m, 4, 0x0A, 0, 0, 84, &batch_body(0, 3, 2)), rejected(DimMismatch, 84, false)),
        ("batch of dimension 3 over max_batch", raw(m, 4, 0x0A, 0, 0, 85, &batch_body(1, 3, 9)), rejected(DimMismatch, 85, false)),
        ("batch over max_batch at k 0", raw(m, 4, 0x0A, 0, 0, 86, &batch_body(0, 4, 9)), rejected(BadK, 86, false)),
        ("batch count over its body", {
            let mut b = batch_body(1, 4, 2);
            b[16..20].copy_from_slice(&3u32.to_le_bytes());
            raw(m, 4, 0x0A, 0, 0, 72, &b)
        }, rejected(BadRequest, 72, false)),
        ("batch count u32::MAX", {
            let mut b = batch_body(1, 4, 1);
            b[16..20].copy_from_slice(&u32::MAX.to_le_bytes());
            raw(m, 4, 0x0A, 0, 0, 73, &b)
        }, rejected(BadRequest, 73, false)),
        ("batch dim u32::MAX", {
            let mut b = batch_body(1, 4, 1);
            b[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
            raw(m, 4, 0x0A, 0, 0, 74, &b)
        }, rejected(BadRequest, 74, false)),
        ("batch with trailing bytes", { let mut b = batch_body(1, 4, 2); b.push(0); raw(m, 4, 0x0A, 0, 0, 75, &b) }, rejected(BadRequest, 75, false)),
        ("batch undefined flag", raw(m, 4, 0x0A, 0x0004, 0, 76, &batch_body(1, 4, 1)), rejected(BadRequest, 76, false)),
        ("batch undefined flag in version 5", raw(m, 5, 0x0A, 0x0008, 0, 87, &batch_body(1, 4, 1)), rejected(BadRequest, 87, false)),
        ("batch AT_POSITION in version 4", raw(m, 4, 0x0A, FLAG_AT_POSITION, 0, 88, &positioned(batch_body(1, 4, 2), 8)), rejected(BadRequest, 88, false)),
        ("batch AT_POSITION in version 5", raw(m, 5, 0x0A, FLAG_AT_POSITION, 0, 89, &positioned(batch_body(1, 4, 2), 8)), Outcome::Accepted),
        ("batch AT_POSITION without its position", raw(m, 5, 0x0A, FLAG_AT_POSITION, 0, 90, &batch_body(1, 4, 2)), rejected(BadRequest, 90, false)),
        ("batch AT_POSITION with a truncated position", raw(m, 5, 0x0A, FLAG_AT_POSITION, 0, 91, &positioned(batch_body(1, 4, 2), 7)), rejected(BadRequest, 91, false)),
        ("batch AT_POSITION with a byte too many", raw(m, 5, 0x0A, FLAG_AT_POSITION, 0, 92, &positioned(batch_body(1, 4, 2), 9)), rejected(BadRequest, 92, false)),
        // A 20-byte header of fields and nothing after it: not even a position.
        ("batch AT_POSITION, fields only", raw(m, 5, 0x0A, FLAG_AT_POSITION, 0, 93, &batch_body(1, 4, 1)[..20]), rejected(BadRequest, 93, false)),
        ("batch over max_batch", raw(m, 4, 0x0A, 0, 0, 77, &batch_body(1, 4, 9)), rejected(BadRequest, 77, false)),
        ("batch wrong dimension", raw(m, 4, 0x0A, 0, 0, 78, &batch_body(1, 3, 2)), rejected(DimMismatch, 78, false)),
        ("batch k = 0", raw(m, 4, 0x0A, 0, 0, 79, &batch_body(0, 4, 2)), rejected(BadK, 79, false)),
        ("batch k > k_max", raw(m, 4, 0x0A, 0, 0, 80, &batch_body(11, 4, 2)), rejected(BadK, 80, false)),
        // 4096-byte frames: 24 + 8 * (16 + 12 * 10) = 1112 fits; with 40-byte frames it would not.
        ("batch of max_batch at k_max", raw(m, 4, 0x0A, FLAG_BYPASS_CACHE, 0, 81, &batch_body(10, 4, 8)), Outcome::Accepted),
        // A non-finite query is its own item's status, not the frame's.
        ("batch with a NaN query", {
            let mut b = batch_body(1, 4, 2);
            b[24..28].copy_from_slice(&nan.to_le_bytes());
            raw(m, 4, 0x0A, 0, 0, 82, &b)
        }, Outcome::Accepted),
    ]
}

/// And the good ones pass.
#[rustfmt::skip]
fn accepted_cases() -> Vec<Case> {
    vec![
        ("valid search, k = k_max", search(50, 10, v4()), Outcome::Accepted),
        ("valid fill", fill(51, 2, vec![(1, 0.5, v4()), (2, 0.5, v4()), (3, 1.0, v4())]), Outcome::Accepted),
        ("frame exactly max_frame_bytes", enc_req(52, Request::Ping(vec![7; MAX - HEADER_LEN])), Outcome::Accepted),
    ]
}

#[test]
fn every_bad_input_gets_its_exact_status() {
    let cases = [
        framing_lost_cases(),
        incomplete_cases(),
        bad_frame_cases(),
        refused_cases(),
        batch_cases(),
        accepted_cases(),
    ];
    let mut failures = Vec::new();
    for (name, bytes, want) in cases.into_iter().flatten() {
        let got = outcome(&bytes);
        if got != want {
            failures.push(format!("{name}: got {got:?}, want {want:?}"));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn a_bad_frame_is_skipped_and_the_next_one_decodes() {
    let mut buf = raw(MAGIC, 1, 0x42, 0, 0, 1, b"junk");
    buf.extend(enc_req(2, Request::Ping(b"after".to_vec())));
    let e = decode_request(&buf, MAX).unwrap_err();
    assert!(!e.closes_connection());
    let n = e.consumed().unwrap();
    let (f, _) = decode_request(&buf[n..], MAX).unwrap().unwrap();
    assert_eq!(f.request_id, 2);
    assert_eq!(f.request, Request::Ping(b"after".to_vec()));
    // The error reply answers the bad frame's id with UNKNOWN_OP, op byte echoed.
    let r = e.error_reply();
    assert_eq!(r.request_id, 1);
    assert!(matches!(
        r.reply,
        Reply::Error {
            op: 0x42,
            status: Status::UnknownOp,
            ..
        }
    ));
}

#[test]
fn bad_replies_are_classified_too() {
    // Request opcode in a reply, unknown status, non-UTF-8 error text, bad bool.
    #[rustfmt::skip]
    let cases = [
        (raw(MAGIC, 1, 0x02, 0, 0, 1, &[]), Status::UnknownOp),
        (raw(MAGIC, 1, 0x82, 0, 999, 1, &[]), Status::BadRequest),
        (raw(MAGIC, 1, 0x82, 0, Status::Busy.code(), 1, &[0xff, 0xfe]), Status::BadRequest),
        (raw(MAGIC, 1, 0x85, 0, 0, 1, &[2]), Status::BadRequest),
        (raw(MAGIC, 1, 0x82, 1, 0, 1, &[]), Status::BadRequest),
        (raw(MAGIC, 1, 0xC2, 0, 0, 1, &[]), Status::UnknownOp),
        (raw(MAGIC, 1, 0x81, 0, 0, 1, &[0; 28][..27]), Status::BadRequest),
    ];
    for (bytes, status) in cases {
        let e = decode_reply(&bytes, MAX).unwrap_err();
        assert_eq!(e.status(), status, "{e}");
        assert_eq!(e.consumed(), Some(bytes.len()));
    }
    // An error reply to an unknown opcode decodes (status != OK accepts any op byte).
    let ok = raw(MAGIC, 1, 0xC2, 0, Status::UnknownOp.code(), 1, b"no");
    assert!(decode_reply(&ok, MAX).unwrap().is_some());
}

#[test]
fn tiny_limits_never_panic() {
    let bytes = enc_req(1, Request::Ping(vec![]));
    for max in 0..=HEADER_LEN {
        let r = decode_request(&bytes, max);
        if max < HEADER_LEN {
            assert_eq!(r.unwrap_err().status(), Status::TooLarge);
        } else {
            assert!(r.unwrap().is_some());
        }
    }
}

#[test]
fn status_and_kind_codes_are_dense_and_stable() {
    for (i, s) in Status::ALL.iter().enumerate() {
        assert_eq!(s.code() as usize, i);
        assert_eq!(Status::from_code(i as u16), Some(*s));
    }
    assert_eq!(Status::from_code(Status::ALL.len() as u16), None);
    for (i, h) in HitKind::ALL.iter().enumerate() {
        assert_eq!(HitKind::from_code(i as u8), Some(*h));
    }
    for o in Opcode::ALL {
        assert_eq!(Opcode::from_code(o.code()), Some(o));
    }
    assert_eq!(Opcode::from_code(0), None);
    assert_eq!(Opcode::from_code(0x09), Some(Opcode::Auth));
    assert_eq!(Opcode::from_code(0x0A), Some(Opcode::SearchBatch));
    assert_eq!(Opcode::from_code(0x0B), Some(Opcode::Cluster));
    assert_eq!(Opcode::from_code(0x0C), None);
    assert_eq!(Status::Unauthenticated.code(), 17);
}

#[test]
fn engine_errors_map_to_statuses() {
    assert_eq!(
        status_of(&shards::Error::DimensionMismatch {
            expected: 1,
            got: 2
        }),
        Status::DimMismatch
    );
    assert_eq!(
        status_of(&shards::Error::Backend("x".into())),
        Status::Unavailable
    );
    assert_eq!(
        status_of(&shards::Error::Capacity("x".into())),
        Status::Busy
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..256)) {
        fuzz_support::frame_decode(&data);
    }

    /// Valid frames with a few bytes flipped: reaches the body parsers far more often.
    #[test]
    fn mutated_frames_never_panic(
        which in 0usize..13,
        flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..4),
    ) {
        let reqs = all_requests();
        let mut bytes = enc_req(7, reqs[which % reqs.len()].clone());
        bytes.extend(enc_reply(8, all_replies()[which].clone()));
        for (at, val) in flips {
            let i = at % bytes.len();
            bytes[i] = val;
        }
        fuzz_support::frame_decode(&bytes);
    }

    /// The body targets' properties: every operation's body parser in both versions.
    #[test]
    fn arbitrary_bodies_never_panic(data in proptest::collection::vec(any::<u8>(), 0..200)) {
        fuzz_support::request_body(&data);
        fuzz_support::reply_body(&data);
    }

    /// The config target's property on the shipped file with one line dropped or
    /// duplicated (random bytes seldom parse as TOML).
    #[test]
    fn edited_config_files_never_panic(line in 0usize..400, dup in any::<bool>()) {
        let text = include_str!("../../ops/akerd.toml");
        let mut lines: Vec<&str> = text.lines().collect();
        let at = line % lines.len();
        if dup {
            lines.insert(at, lines[at]);
        } else {
            lines.remove(at);
        }
        fuzz_support::config(lines.join("\n").as_bytes());
    }
}

/// The shipped config file passes the config target's property (it parses, validates
/// and prints back to itself).
#[test]
fn the_shipped_config_prints_back_to_itself() {
    fuzz_support::config(include_str!("../../ops/akerd.toml").as_bytes());
    let cfg = crate::config::Config::from_toml(include_str!("../../ops/akerd.toml")).unwrap();
    assert!(cfg.validate().is_ok());
}

/// The worked examples in PROTOCOL.md, byte for byte (version 4's, and version 5's
/// AT_POSITION and DELETE reply).
#[test]
fn protocol_md_example_is_exact() {
    let req = enc_req_in(
        4,
        7,
        Request::Search(SearchRequest {
            k: 2,
            ..SearchRequest::new(2, vec![1.0, 0.0])
        }),
    );
    #[rustfmt::skip]
    let want_req: &[u8] = &[
        0x41, 0x4B, 0x04, 0x03, 0x00, 0x00, 0x00, 0x00, 0x07, 0, 0, 0, 0, 0, 0, 0, 0x18, 0, 0, 0,
        0, 0, 0, 0, 0x02, 0, 0, 0, 0, 0, 0, 0, 0x02, 0, 0, 0,
        0x00, 0x00, 0x80, 0x3F, 0x00, 0x00, 0x00, 0x00,
    ];
    assert_eq!(req, want_req);
    let reply = enc_reply_in(
        4,
        7,
        Reply::Search(SearchReply {
            token: None,
            routing_version: 0,
            hit: HitKind::Exact,
            distances_to_query: true,
            neighbors: vec![
                Neighbor {
                    id: 5,
                    distance: 0.0,
                },
                Neighbor {
                    id: 9,
                    distance: 0.25,
                },
            ],
        }),
    );
    #[rustfmt::skip]
    let want_reply: &[u8] = &[
        0x41, 0x4B, 0x04, 0x83, 0x00, 0x00, 0x00, 0x00, 0x07, 0, 0, 0, 0, 0, 0, 0, 0x20, 0, 0, 0,
        0x01, 0x01, 0x00, 0x00, 0x02, 0, 0, 0,
        0x05, 0, 0, 0, 0, 0, 0, 0, 0x00, 0x00, 0x00, 0x00,
        0x09, 0, 0, 0, 0, 0, 0, 0, 0x00, 0x00, 0x80, 0x3E,
    ];
    assert_eq!(reply, want_reply);
    // The SEARCH_BATCH example: the same query and a NaN one, k 1.
    let req = enc_req_in(
        4,
        8,
        Request::SearchBatch(SearchBatchRequest::new(
            1,
            vec![vec![1.0, 0.0], vec![f32::NAN, 0.0]],
        )),
    );
    #[rustfmt::skip]
    let want_req: &[u8] = &[
        0x41, 0x4B, 0x04, 0x0A, 0x00, 0x00, 0x00, 0x00, 0x08, 0, 0, 0, 0, 0, 0, 0, 0x24, 0, 0, 0,
        0, 0, 0, 0, 0x01, 0, 0, 0, 0, 0, 0, 0, 0x02, 0, 0, 0, 0x02, 0, 0, 0,
        0x00, 0x00, 0x80, 0x3F, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0xC0, 0x7F, 0x00, 0x00, 0x00, 0x00,
    ];
    assert_eq!(req, want_req);
    let reply = enc_reply_in(
        4,
        8,
        Reply::SearchBatch(vec![
            Ok(SearchReply {
                token: None,
                routing_version: 0,
                hit: HitKind::Exact,
                distances_to_query: true,
                neighbors: vec![Neighbor {
                    id: 5,
                    distance: 0.0,
                }],
            }),
            Err(Status::NonFinite),
        ]),
    );
    #[rustfmt::skip]
    let want_reply: &[u8] = &[
        0x41, 0x4B, 0x04, 0x8A, 0x00, 0x00, 0x00, 0x00, 0x08, 0, 0, 0, 0, 0, 0, 0, 0x20, 0, 0, 0,
        0x02, 0, 0, 0,
        0x00, 0x00, 0x01, 0x01, 0x01, 0, 0, 0,
        0x05, 0, 0, 0, 0, 0, 0, 0, 0x00, 0x00, 0x00, 0x00,
        0x09, 0x00, 0x00, 0x00, 0x00, 0, 0, 0,
    ];
    assert_eq!(reply, want_reply);
    // Version 5: the first example's SEARCH AT_POSITION 16/B374D848, id 9.
    let req = enc_req_in(
        5,
        9,
        Request::Search(SearchRequest {
            at_position: Some(0x16_B374_D848),
            ..SearchRequest::new(2, vec![1.0, 0.0])
        }),
    );
    #[rustfmt::skip]
    let want_req: &[u8] = &[
        0x41, 0x4B, 0x05, 0x03, 0x04, 0x00, 0x00, 0x00, 0x09, 0, 0, 0, 0, 0, 0, 0, 0x20, 0, 0, 0,
        0, 0, 0, 0, 0x02, 0, 0, 0, 0, 0, 0, 0, 0x02, 0, 0, 0,
        0x00, 0x00, 0x80, 0x3F, 0x00, 0x00, 0x00, 0x00,
        0x48, 0xD8, 0x74, 0xB3, 0x16, 0x00, 0x00, 0x00,
    ];
    assert_eq!(req, want_req);
    // A DELETE's reply in version 5: existed, position 16/B374D848.
    let reply = enc_reply_in(
        5,
        10,
        Reply::Deleted {
            existed: true,
            position: 0x16_B374_D848,
        },
    );
    #[rustfmt::skip]
    let want_reply: &[u8] = &[
        0x41, 0x4B, 0x05, 0x85, 0x00, 0x00, 0x00, 0x00, 0x0A, 0, 0, 0, 0, 0, 0, 0, 0x09, 0, 0, 0,
        0x01, 0x48, 0xD8, 0x74, 0xB3, 0x16, 0x00, 0x00, 0x00,
    ];
    assert_eq!(reply, want_reply);
}

/// A batch AT_POSITION carries 8 more bytes: the largest count that fits a frame is
/// counted with them.
#[test]
fn batch_count_max_counts_the_position() {
    let hello = HelloReply {
        max_frame_bytes: (HEADER_LEN + 20 + 4 * 32 * 8) as u32,
        dim: 32,
        max_batch: Some(64),
        ..match hello_replies()[0] {
            Reply::Hello(h) => h,
            _ => unreachable!(),
        }
    };
    assert_eq!(batch_count_max(&hello, 32, 1), 8);
    assert_eq!(batch_count_max_for(&hello, 32, 1, false), 8);
    assert_eq!(batch_count_max_for(&hello, 32, 1, true), 7);
    for (count, at_position) in [(8, false), (7, true)] {
        let bytes = enc_req(
            1,
            Request::SearchBatch(SearchBatchRequest {
                at_position: at_position.then_some(1),
                ..SearchBatchRequest::new(1, vec![vec![0.5; 32]; count])
            }),
        );
        assert!(bytes.len() <= hello.max_frame_bytes as usize);
        assert!(bytes.len() + 4 * 32 > hello.max_frame_bytes as usize);
    }
}

/// Version 6: CLUSTER round-trips; a SEARCH reply ends with its routing version and a
/// batch carries one after its count; older versions get neither.
#[test]
fn version_6_cluster_and_routing_version_round_trip() {
    let Reply::Cluster(state) = cluster_reply() else {
        unreachable!("a CLUSTER reply")
    };
    let bytes = enc_reply(4, Reply::Cluster(state.clone()));
    let back = decode_reply(&bytes, 1 << 20).unwrap().unwrap();
    assert_eq!(back.0.reply, Reply::Cluster(state.clone()));
    // 48 fixed bytes, 16 of centroids, two nodes of 12 + 13, one override of 12, the name.
    assert_eq!(
        bytes.len(),
        HEADER_LEN + 48 + 16 + 4 + 2 * (12 + 13) + 4 + 12 + 2 + 4
    );
    // A version 5 frame cannot carry CLUSTER.
    let mut out = Vec::new();
    let v5 = ReplyFrame {
        version: 5,
        request_id: 4,
        reply: Reply::Cluster(state),
    };
    assert!(encode_reply(&v5, &mut out).is_err());
    let r = SearchReply {
        hit: HitKind::Exact,
        distances_to_query: true,
        neighbors: vec![Neighbor {
            id: 7,
            distance: 0.5,
        }],
        token: None,
        routing_version: 0x0102_0304_0506_0708,
    };
    let v6 = enc_reply(5, Reply::Search(r.clone()));
    assert_eq!(&v6[v6.len() - 8..], &0x0102_0304_0506_0708u64.to_le_bytes());
    let v5 = enc_reply_in(5, 5, Reply::Search(r.clone()));
    assert_eq!(v6.len(), v5.len() + 8);
    let back5 = decode_reply(&v5, 1 << 20).unwrap().unwrap().0.reply;
    assert_eq!(
        back5,
        Reply::Search(SearchReply {
            routing_version: 0,
            ..r.clone()
        })
    );
    let batch = enc_reply(
        6,
        Reply::SearchBatch(vec![Ok(r.clone()), Err(Status::Busy)]),
    );
    assert_eq!(
        &batch[HEADER_LEN + 4..HEADER_LEN + 12],
        &r.routing_version.to_le_bytes()
    );
    let items = match decode_reply(&batch, 1 << 20).unwrap().unwrap().0.reply {
        Reply::SearchBatch(items) => items,
        other => panic!("{other:?}"),
    };
    assert_eq!(items, vec![Ok(r), Err(Status::Busy)]);
    // Limits: a state with a non-finite centroid or too long a name is refused.
    let mut bad = bytes.clone();
    bad[HEADER_LEN + 48..HEADER_LEN + 52].copy_from_slice(&f32::NAN.to_le_bytes());
    assert!(decode_reply(&bad, 1 << 20).is_err());
}
