//! Authentication (protocol version 3), protected mode and the per-source connection
//! limit, against a real akerd over loopback.

#[path = "akerd_common/mod.rs"]
mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use aker::auth::{random_nonce, Secret};
use aker::client::{Client, ClientError, ClientOptions, Pipeline};
use aker::config::Config;
use aker::protocol::{
    decode_request, encode_reply, encode_request, AuthRequest, HelloReply, Reply, ReplyFrame,
    Request, RequestFrame, SearchRequest, Status, HEADER_LEN,
};

const SECRET: &[u8] = b"a shared secret of some length";

fn secret() -> Secret {
    Secret::new(SECRET.to_vec()).unwrap()
}

/// The common akerd, its secret in a file of this test's own.
fn config_with_auth(name: &str) -> Config {
    let f = std::env::temp_dir().join(format!("akerd-auth-{}-{name}", std::process::id()));
    std::fs::write(&f, [SECRET, b"\n"].concat()).unwrap();
    let mut c = common::config();
    c.auth.secret_file = Some(f);
    c
}

fn authenticate(s: &mut TcpStream, id: u64) {
    let challenge = hello(s, 3).auth_challenge.expect("a challenge");
    let nonce = random_nonce();
    let auth = AuthRequest {
        nonce,
        proof: secret().client_proof(&challenge, &nonce),
    };
    let r = call(s, 3, id, Request::Auth(auth));
    assert!(matches!(r, Reply::Authenticated { .. }), "{r:?}");
}

fn raw(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.set_nodelay(true).unwrap();
    s
}

fn send(s: &mut TcpStream, version: u8, id: u64, request: Request) {
    s.write_all(&common::encoded(version, id, request)).unwrap();
}

fn recv(s: &mut TcpStream) -> Option<ReplyFrame> {
    common::read_reply(s)
}

fn call(s: &mut TcpStream, version: u8, id: u64, request: Request) -> Reply {
    send(s, version, id, request);
    let f = recv(s).expect("a reply");
    assert_eq!(f.request_id, id);
    f.reply
}

fn hello(s: &mut TcpStream, version: u8) -> HelloReply {
    match call(s, version, 1, Request::Hello) {
        Reply::Hello(h) => h,
        other => panic!("{other:?}"),
    }
}

use common::closed;

fn status(r: &Reply) -> Status {
    r.status()
}

fn every_guarded_request() -> Vec<Request> {
    let v = vec![0.5; common::DIM];
    vec![
        Request::Search(SearchRequest::new(common::K, v.clone())),
        Request::Insert(aker::protocol::InsertRequest {
            id: 1 << 40,
            collection: 0,
            vector: v.clone(),
            payload: vec![],
        }),
        Request::Delete(aker::protocol::DeleteRequest {
            id: 1,
            collection: 0,
        }),
        Request::Fill(aker::protocol::FillRequest {
            k: 1,
            query: v,
            ..Default::default()
        }),
        Request::Flush,
        Request::Stats,
    ]
}

#[test]
fn until_it_authenticates_a_connection_gets_only_hello_and_ping() {
    let d = common::start(&config_with_auth("AKER_TEST_SECRET_REFUSALS"));
    let mut s = raw(d.local_addr());
    let h = hello(&mut s, 3);
    let challenge = h.auth_challenge.expect("a challenge");
    for (i, req) in every_guarded_request().into_iter().enumerate() {
        let op = req.opcode();
        let r = call(&mut s, 3, 10 + i as u64, req);
        assert_eq!(status(&r), Status::Unauthenticated, "{op}: {r:?}");
    }
    // SEARCH_BATCH (version 4) too, as a whole frame.
    let batch = aker::protocol::SearchBatchRequest::new(common::K, vec![vec![0.5; common::DIM]; 3]);
    let r = call(&mut s, 4, 19, Request::SearchBatch(batch));
    assert_eq!(status(&r), Status::Unauthenticated, "{r:?}");
    assert!(matches!(
        call(&mut s, 3, 20, Request::Ping(b"p".to_vec())),
        Reply::Pong(_)
    ));
    // A HELLO again shows the same challenge: it belongs to the connection.
    assert_eq!(hello(&mut s, 3).auth_challenge, Some(challenge));
    let nonce = random_nonce();
    let auth = AuthRequest {
        nonce,
        proof: secret().client_proof(&challenge, &nonce),
    };
    match call(&mut s, 3, 30, Request::Auth(auth)) {
        Reply::Authenticated { server_proof } => {
            assert!(secret().verify_server(&challenge, &nonce, &server_proof));
        }
        other => panic!("{other:?}"),
    }
    // Now everything is served, in every version on this connection.
    let r = call(&mut s, 3, 31, every_guarded_request().remove(0));
    assert!(matches!(r, Reply::Search(_)), "{r:?}");
    let r = call(&mut s, 2, 32, Request::Stats);
    let Reply::Stats(text) = r else {
        panic!("{r:?}")
    };
    assert!(text.contains("server_unauthenticated_requests 7"), "{text}");
    d.stop().unwrap();
}

#[test]
fn older_versions_are_told_to_authenticate_in_version_3() {
    let d = common::start(&config_with_auth("AKER_TEST_SECRET_OLDER"));
    let mut s = raw(d.local_addr());
    for v in [1, 2] {
        let h = hello(&mut s, v);
        assert_eq!(h.auth_challenge, None, "version {v} has no place for it");
        for req in every_guarded_request() {
            if matches!(&req, Request::Fill(_)) && v == 1 {
                continue; // the same body in both; one version is enough
            }
            let op = req.opcode();
            match call(&mut s, v, 2, req) {
                Reply::Error {
                    status, message, ..
                } => {
                    assert_eq!(status, Status::Unsupported, "{op} in version {v}");
                    assert!(message.contains("version 3"), "{message}");
                }
                other => panic!("{op} in version {v}: {other:?}"),
            }
        }
    }
    // AUTH is not an operation of version 2: UNKNOWN_OP, and the connection stays.
    let mut bytes = Vec::new();
    encode_request(
        &RequestFrame {
            request_id: 3,
            version: 3,
            request: Request::Auth(AuthRequest {
                nonce: [0; 16],
                proof: [0; 32],
            }),
        },
        &mut bytes,
    )
    .unwrap();
    bytes[2] = 2;
    s.write_all(&bytes).unwrap();
    assert_eq!(status(&recv(&mut s).unwrap().reply), Status::UnknownOp);
    assert!(matches!(
        call(&mut s, 2, 4, Request::Ping(vec![])),
        Reply::Pong(_)
    ));
    d.stop().unwrap();
}

#[test]
fn a_wrong_proof_or_a_replayed_one_is_refused_and_the_connection_closed() {
    let d = common::start(&config_with_auth("AKER_TEST_SECRET_WRONG"));
    let addr = d.local_addr();
    // A client with the wrong secret.
    let wrong = ClientOptions {
        secret: Some(Secret::new(b"not the shared secret at all".to_vec()).unwrap()),
        ..Default::default()
    };
    let mut c = Client::connect_with(addr, wrong).unwrap();
    match c.hello() {
        Err(ClientError::Server { status, .. }) => assert_eq!(status, Status::Unauthenticated),
        other => panic!("{other:?}"),
    }
    // A client without one.
    let mut c = Client::connect(addr).unwrap();
    assert!(
        matches!(c.hello(), Err(ClientError::AuthRequired)),
        "no secret"
    );
    // A proof recorded on one connection, replayed on another (its own challenge).
    let mut a = raw(addr);
    let ca = hello(&mut a, 3).auth_challenge.unwrap();
    let nonce = random_nonce();
    let recorded = AuthRequest {
        nonce,
        proof: secret().client_proof(&ca, &nonce),
    };
    let mut b = raw(addr);
    let cb = hello(&mut b, 3).auth_challenge.unwrap();
    assert_ne!(ca, cb, "every connection has a challenge of its own");
    let r = call(&mut b, 3, 2, Request::Auth(recorded));
    assert_eq!(status(&r), Status::Unauthenticated, "{r:?}");
    assert!(closed(&mut b), "a failed AUTH closes the connection");
    // The recorded one still works where it belongs.
    assert!(matches!(
        call(&mut a, 3, 2, Request::Auth(recorded)),
        Reply::Authenticated { .. }
    ));
    let Reply::Stats(text) = call(&mut a, 3, 3, Request::Stats) else {
        panic!()
    };
    assert!(text.contains("server_auth_failures 2"), "{text}");
    d.stop().unwrap();
}

#[test]
fn the_clients_authenticate_with_the_secret() {
    let d = common::start(&config_with_auth("AKER_TEST_SECRET_CLIENTS"));
    let opts = ClientOptions {
        secret: Some(secret()),
        ..Default::default()
    };
    let mut c = Client::connect_with(d.local_addr(), opts.clone()).unwrap();
    let h = c.hello().unwrap();
    assert_eq!(c.version(), aker::protocol::VERSION);
    assert!(h.auth_challenge.is_some());
    let v = vec![0.25; common::DIM];
    c.insert(1 << 41, &v).unwrap();
    assert_eq!(c.search(common::K, &v).unwrap().neighbors[0].id, 1 << 41);
    assert!(c.delete(1 << 41).unwrap());
    let (mut p, _) = Pipeline::connect_negotiated(d.local_addr(), 4, opts).unwrap();
    p.send(Request::Stats).unwrap();
    let (_, r) = p.recv().unwrap();
    assert!(matches!(r, Reply::Stats(_)), "{r:?}");
    // A client with a secret wants a server that proves it knows it: one that does not
    // ask for AUTH is refused, in version 3 and when it answers in version 2.
    let plain = common::start(&common::config());
    for version in [3, 2] {
        let mut c = Client::connect_with(
            plain.local_addr(),
            ClientOptions {
                secret: Some(secret()),
                version,
                ..Default::default()
            },
        )
        .unwrap();
        assert!(
            matches!(c.hello(), Err(ClientError::ServerNotAuthentic)),
            "version {version}"
        );
    }
    plain.stop().unwrap();
    d.stop().unwrap();
}

/// A server that asks for AUTH and answers it with a proof it cannot have made.
#[test]
fn a_server_that_does_not_know_the_secret_is_caught() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let fake = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        for _ in 0..2 {
            let mut buf = vec![0u8; HEADER_LEN];
            s.read_exact(&mut buf).unwrap();
            let len = u32::from_le_bytes(buf[16..20].try_into().unwrap()) as usize;
            buf.resize(HEADER_LEN + len, 0);
            s.read_exact(&mut buf[HEADER_LEN..]).unwrap();
            let (f, _) = decode_request(&buf, usize::MAX).unwrap().unwrap();
            let reply = match f.request {
                Request::Hello => Reply::Hello(HelloReply {
                    version_min: 1,
                    version_max: 4,
                    metric: shards::Metric::L2Sq,
                    max_frame_bytes: 1 << 20,
                    dim: 4,
                    k_max: 10,
                    max_inflight: 8,
                    executors: 1,
                    shards: 1,
                    delta: Some(0),
                    auth_challenge: Some([7; 16]),
                    max_batch: Some(8),
                }),
                _ => Reply::Authenticated {
                    server_proof: [0; 32],
                },
            };
            let mut out = Vec::new();
            encode_reply(
                &ReplyFrame {
                    request_id: f.request_id,
                    version: f.version,
                    reply,
                },
                &mut out,
            )
            .unwrap();
            s.write_all(&out).unwrap();
        }
    });
    let mut c = Client::connect_with(
        addr,
        ClientOptions {
            secret: Some(secret()),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(matches!(c.hello(), Err(ClientError::ServerNotAuthentic)));
    fake.join().unwrap();
}

#[test]
fn protected_mode_refuses_public_addresses_without_authentication() {
    let mut c = common::config();
    c.admin.enabled = false;
    c.server.listen = "0.0.0.0:7799".parse().unwrap();
    let e = c.validate().unwrap_err().to_string();
    assert!(e.contains("protected mode") && e.contains("0.0.0.0"), "{e}");
    // Refused before anything is bound or loaded.
    assert!(matches!(
        aker::service::Daemon::start(&c),
        Err(aker::service::StartError::Config(_))
    ));
    c.auth.secret_env = Some("AKER_TEST_UNUSED".into());
    c.validate().unwrap();
    c.auth.secret_env = None;
    c.server.protected_mode = false;
    c.validate().unwrap();
    // The admin endpoint has no authentication: loopback only, with auth or without.
    let mut c = common::config();
    c.auth.secret_env = Some("AKER_TEST_UNUSED".into());
    c.admin.listen = "0.0.0.0:7798".parse().unwrap();
    let e = c.validate().unwrap_err().to_string();
    assert!(e.contains("admin endpoint"), "{e}");
    c.server.protected_mode = false;
    c.validate().unwrap();
    // Both sources at once are refused.
    let mut c = common::config();
    c.auth.secret_env = Some("A".into());
    c.auth.secret_file = Some("/nonexistent".into());
    assert!(c.validate().unwrap_err().to_string().contains("not both"));
}

#[test]
fn connections_past_the_per_source_limit_get_busy() {
    let mut cfg = common::config();
    cfg.server.max_connections_per_source = 3;
    let d = common::start(&cfg);
    let addr = d.local_addr();
    let mut held: Vec<Client> = (0..3).map(|_| common::client(addr)).collect();
    let mut fourth = raw(addr);
    let f = recv(&mut fourth).expect("a connection-level reply");
    assert_eq!(f.request_id, 0);
    match &f.reply {
        Reply::Error {
            status, message, ..
        } => {
            assert_eq!(*status, Status::Busy);
            assert!(message.contains("connections_per_source_max"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert!(closed(&mut fourth));
    // One leaves: a new one is served (the count is released when the server notices).
    drop(held.pop());
    let end = Instant::now() + Duration::from_secs(5);
    let mut c = loop {
        let mut c = Client::connect(addr).unwrap();
        if c.hello().is_ok() {
            break c;
        }
        assert!(Instant::now() < end, "no slot freed within 5 s");
        std::thread::sleep(Duration::from_millis(20));
    };
    let text = c.stats().unwrap();
    assert!(
        text.lines()
            .any(|l| l.starts_with("server_connections_rejected_per_source ") && !l.ends_with(" 0")),
        "{text}"
    );
    d.stop().unwrap();
}

#[test]
fn pipelined_requests_before_auth_are_refused_and_after_it_served() {
    let d = common::start(&config_with_auth("pipelined"));
    let mut s = raw(d.local_addr());
    let challenge = hello(&mut s, 3).auth_challenge.unwrap();
    let nonce = random_nonce();
    let auth = AuthRequest {
        nonce,
        proof: secret().client_proof(&challenge, &nonce),
    };
    // A bad dimension before AUTH: refused for the connection, not validated.
    let bad_dim = Request::Search(SearchRequest::new(common::K, vec![0.5; common::DIM + 1]));
    let search = every_guarded_request().remove(0);
    let mut bytes = Vec::new();
    for (id, req) in [
        (2, bad_dim),
        (3, search.clone()),
        (4, Request::Auth(auth)),
        (5, search),
    ] {
        encode_request(
            &RequestFrame {
                request_id: id,
                version: 3,
                request: req,
            },
            &mut bytes,
        )
        .unwrap();
    }
    s.write_all(&bytes).unwrap();
    let mut got: Vec<(u64, Reply)> = (0..4)
        .map(|_| {
            let f = recv(&mut s).expect("a reply");
            (f.request_id, f.reply)
        })
        .collect();
    got.sort_by_key(|g| g.0);
    assert_eq!(got[0].1.status(), Status::Unauthenticated, "{:?}", got[0]);
    assert_eq!(got[1].1.status(), Status::Unauthenticated, "{:?}", got[1]);
    assert!(
        matches!(got[2].1, Reply::Authenticated { .. }),
        "{:?}",
        got[2]
    );
    assert!(matches!(got[3].1, Reply::Search(_)), "{:?}", got[3]);
    // One AUTH per connection.
    let again = AuthRequest {
        nonce,
        proof: secret().client_proof(&challenge, &nonce),
    };
    assert_eq!(
        call(&mut s, 3, 6, Request::Auth(again)).status(),
        Status::BadRequest
    );
    // A wrong AUTH pipelined with a SEARCH: the SEARCH is never answered.
    let mut t = raw(d.local_addr());
    hello(&mut t, 3);
    let mut bytes = Vec::new();
    let wrong = AuthRequest {
        nonce,
        proof: [0; 32],
    };
    for (id, req) in [
        (2, Request::Auth(wrong)),
        (3, every_guarded_request().remove(0)),
    ] {
        encode_request(
            &RequestFrame {
                request_id: id,
                version: 3,
                request: req,
            },
            &mut bytes,
        )
        .unwrap();
    }
    t.write_all(&bytes).unwrap();
    let f = recv(&mut t).unwrap();
    assert_eq!(
        (f.request_id, f.reply.status()),
        (2, Status::Unauthenticated)
    );
    assert!(recv(&mut t).is_none(), "closed after the failed AUTH");
    d.stop().unwrap();
}

#[test]
fn before_auth_frames_are_small_and_time_is_short() {
    let mut cfg = config_with_auth("limits");
    cfg.server.auth_timeout_ms = 300;
    let d = common::start(&cfg);
    // A 2 KiB PING before AUTH: over the 1 KiB cap, TOO_LARGE and closed.
    let mut s = raw(d.local_addr());
    send(&mut s, 3, 2, Request::Ping(vec![1; 2048]));
    let f = recv(&mut s).expect("a reply");
    assert_eq!(f.reply.status(), Status::TooLarge, "{f:?}");
    assert!(closed(&mut s));
    // After AUTH the server's own limit applies.
    let mut s = raw(d.local_addr());
    authenticate(&mut s, 2);
    assert!(matches!(
        call(&mut s, 3, 3, Request::Ping(vec![1; 2048])),
        Reply::Pong(_)
    ));
    // Not authenticated within auth_timeout_ms: closed; an authenticated one stays.
    let mut idle = raw(d.local_addr());
    hello(&mut idle, 3);
    std::thread::sleep(Duration::from_millis(600));
    assert!(
        closed(&mut idle),
        "an unauthenticated connection outlived auth_timeout_ms"
    );
    assert!(matches!(
        call(&mut s, 3, 4, Request::Ping(vec![])),
        Reply::Pong(_)
    ));
    d.stop().unwrap();
}

#[test]
fn every_way_a_connection_ends_frees_its_per_source_slot() {
    let mut cfg = config_with_auth("slots");
    cfg.server.max_connections_per_source = 2;
    cfg.server.auth_timeout_ms = 200;
    let d = common::start(&cfg);
    let addr = d.local_addr();
    // Each round ends one connection a different way; the limit is 2, so a leaked slot
    // would turn the next rounds away.
    for round in 0..6 {
        let mut s = raw(addr);
        match round % 3 {
            0 => {
                hello(&mut s, 3);
                let wrong = AuthRequest {
                    nonce: [1; 16],
                    proof: [0; 32],
                };
                assert_eq!(
                    call(&mut s, 3, 2, Request::Auth(wrong)).status(),
                    Status::Unauthenticated
                );
            }
            1 => s.write_all(b"not a frame at all, just bytes").unwrap(),
            _ => std::thread::sleep(Duration::from_millis(300)), // the auth timeout
        }
        assert!(closed(&mut s), "round {round}");
    }
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        let mut a = raw(addr);
        let mut b = raw(addr);
        authenticate(&mut a, 2);
        let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| authenticate(&mut b, 2)));
        if ok.is_ok() {
            break;
        }
        assert!(Instant::now() < end, "the limit's slots were not all freed");
        std::thread::sleep(Duration::from_millis(50));
    }
    d.stop().unwrap();
}
