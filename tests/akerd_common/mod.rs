//! Shared by the `akerd_*` tests: a small daemon on 127.0.0.1:0 with 2 executors, a
//! deliberately slow store, and query helpers.
#![allow(dead_code)]

use std::io::{ErrorKind, Read};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use aker::client::{Client, ClientOptions};
use aker::config::{Config, DataSource, IndexKind};
use aker::protocol::{
    decode_reply, encode_request, HitKind, ReplyFrame, Request, RequestFrame, SearchReply,
    HEADER_LEN,
};
use aker::service::{Daemon, Dataset, Store};
use aker_formats::data;
use shards::store::ExactStore;
use shards::{Backend, Candidate, FilterKind, Metric};

pub const DIM: usize = 8;
pub const K: u32 = 5;

/// Clustered data, 3000 x 8.
pub fn dataset() -> Dataset {
    data::synthetic(3000, DIM, 16, 11)
}

/// 2 executors, 4 shards, exact store, brute-force filter (deterministic), no periodic
/// rebalancing, admin on an ephemeral loopback port, short timeouts.
pub fn config() -> Config {
    let mut c = Config::default();
    c.server.listen = "127.0.0.1:0".parse().unwrap();
    c.server.executors = 2;
    c.server.max_inflight = 64;
    c.server.request_timeout_ms = 5_000;
    c.server.shutdown_poll_ms = 10;
    c.server.shutdown_grace_ms = 2_000;
    c.cache.delta = 3;
    c.cache.k_max = 32;
    c.cache.capacity_objects = Some(2_000);
    c.cache.filter = FilterKind::BruteForce;
    c.sharding.centroids = 16;
    c.sharding.rebalance_ms = 0;
    c.backend.index = IndexKind::Exact;
    c.backend.data = DataSource::Synthetic {
        n: 3000,
        dim: DIM,
        clusters: 16,
        seed: 11,
    };
    c.admin.listen = "127.0.0.1:0".parse().unwrap();
    c
}

pub fn start(cfg: &Config) -> Daemon {
    Daemon::start(cfg).expect("akerd starts")
}

pub fn client(addr: SocketAddr) -> Client {
    let mut c = Client::connect_with(
        addr,
        ClientOptions {
            io_timeout: Some(Duration::from_secs(10)),
            ..Default::default()
        },
    )
    .expect("connect");
    c.hello().expect("hello");
    c
}

/// A query near row `i` but not on it (its nearest distance is positive, so its
/// threshold is too).
pub fn query_near(ds: &Dataset, i: usize, offset: f32) -> Vec<f32> {
    ds.row(i)
        .iter()
        .enumerate()
        .map(|(t, x)| x + if t % 2 == 0 { offset } else { -offset })
        .collect()
}

pub fn ids(r: &SearchReply) -> Vec<u64> {
    r.neighbors.iter().map(|n| n.id).collect()
}

/// Repeats `q` until the reply's hit kind is `want` (admissions and alias links are
/// applied by the owner asynchronously). Bounded in time.
pub fn search_until(c: &mut Client, q: &[f32], want: HitKind) -> SearchReply {
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        let r = c.search(K, q).expect("search");
        if r.hit == want {
            return r;
        }
        assert!(
            Instant::now() < end,
            "no {want:?} within 5 s (last {:?})",
            r.hit
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The exact top-k ids of `q` over `ds`.
pub fn exact_ids(ds: &Dataset, q: &[f32], k: usize) -> Vec<u64> {
    let s = ExactStore::from_rows(ds.dim, Metric::L2Sq, &ds.data).unwrap();
    s.search(q, k).unwrap().iter().map(|c| c.id).collect()
}

/// A store that sleeps in every search (while holding the backend's read lock, as a
/// slow database call would hold a connection) and counts searches.
pub struct SlowStore {
    pub inner: ExactStore,
    pub delay: Duration,
    pub searches: Arc<AtomicU64>,
}

impl SlowStore {
    pub fn boxed(ds: &Dataset, delay: Duration) -> (Store, Arc<AtomicU64>) {
        let searches = Arc::new(AtomicU64::new(0));
        let s = SlowStore {
            inner: ExactStore::from_rows(ds.dim, Metric::L2Sq, &ds.data).unwrap(),
            delay,
            searches: searches.clone(),
        };
        (Box::new(s), searches)
    }
}

impl Backend for SlowStore {
    fn dim(&self) -> usize {
        self.inner.dim()
    }
    fn metric(&self) -> Metric {
        self.inner.metric()
    }
    fn search(&self, q: &[f32], n: usize) -> shards::Result<Vec<Candidate>> {
        self.searches.fetch_add(1, Ordering::Relaxed);
        let r = self.inner.search(q, n);
        std::thread::sleep(self.delay);
        r
    }
    fn insert(&mut self, id: u64, v: &[f32]) -> shards::Result<()> {
        self.inner.insert(id, v)
    }
    fn delete(&mut self, id: u64) -> shards::Result<bool> {
        self.inner.delete(id)
    }
    fn len(&self) -> usize {
        self.inner.len()
    }
    fn name(&self) -> &'static str {
        "slow"
    }
}

/// How many tries a trial test makes: `default`, or AKER_TEST_TRIES (issue #41's
/// 10,000 are run that way, outside the README's test command).
pub fn tries(default: u64) -> u64 {
    std::env::var("AKER_TEST_TRIES").map_or(default, |v| {
        v.parse().expect("AKER_TEST_TRIES: a number of tries")
    })
}

/// The child's exit status once it exits (after a SIGTERM); killed, and the test
/// failed, when it has not within `limit`.
pub fn exit_within(child: &mut std::process::Child, limit: Duration) -> std::process::ExitStatus {
    let end = Instant::now() + limit;
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        if Instant::now() > end {
            let _ = child.kill();
            panic!("akerd did not exit within {limit:?} of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `name value` from a STATS text.
pub fn stat(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter_map(|l| l.split_once(' '))
        .find(|(n, _)| *n == name)
        .and_then(|(_, v)| v.trim().parse().ok())
}

// Raw-socket helpers (the bad-input and auth tests send what a client library refuses to).

/// A valid request's bytes in `version`.
pub fn encoded(version: u8, id: u64, request: Request) -> Vec<u8> {
    let mut out = Vec::new();
    encode_request(
        &RequestFrame {
            request_id: id,
            version,
            request,
        },
        &mut out,
    )
    .unwrap();
    out
}

/// The next reply, or `None` at end of stream (or a reset).
pub fn read_reply(s: &mut TcpStream) -> Option<ReplyFrame> {
    let mut header = [0u8; HEADER_LEN];
    if s.read_exact(&mut header).is_err() {
        return None;
    }
    let len = u32::from_le_bytes(header[16..20].try_into().unwrap()) as usize;
    let mut buf = header.to_vec();
    buf.resize(HEADER_LEN + len, 0);
    s.read_exact(&mut buf[HEADER_LEN..]).ok()?;
    let (f, _) = decode_reply(&buf, usize::MAX).unwrap().unwrap();
    Some(f)
}

/// The server closed: end of stream (or a reset), what was queued before it read and
/// dropped; a read that times out means the connection is still open.
pub fn closed(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 64 << 10];
    let end = Instant::now() + Duration::from_secs(10);
    while Instant::now() < end {
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return false
            }
            Err(_) => return true,
        }
    }
    false
}
