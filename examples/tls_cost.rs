//! What TLS costs: exact hits per second and their p99 on one connection and on eight,
//! and full handshakes per second, TLS against plaintext, alternated in one run.
//!
//! ```text
//! cargo build --release --bin akerd --example tls_cost
//! taskset -c 1 target/release/examples/tls_cost [--akerd target/release/akerd]
//!     [--server-cpu 0] [--rounds 3] [--seconds 5]
//! ```
//!
//! Two akerds (one plaintext, one with `[tls]`, certificates made here, ECDSA P-256),
//! both pinned to `--server-cpu`; this client runs where it is started (pin it to
//! another core). Each round runs every measurement on both, in turn; the medians over
//! rounds are printed as a Markdown table, every round's figures before it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use aker::client::{Client, ClientOptions, ClientTls, Pipeline};
use aker::protocol::{Reply, Request, SearchRequest};
use hdrhistogram::Histogram;

const DIM: usize = 32;
const K: u32 = 10;
/// Distinct vectors the hit loops cycle through (each admitted once, then exact hits).
const HOT: usize = 64;
const WINDOW: usize = 64;

struct Args {
    akerd: PathBuf,
    server_cpu: usize,
    rounds: usize,
    seconds: u64,
}

fn args() -> Args {
    let mut a = Args {
        akerd: PathBuf::from("target/release/akerd"),
        server_cpu: 0,
        rounds: 3,
        seconds: 5,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let v = it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--akerd" => a.akerd = v.into(),
            "--server-cpu" => a.server_cpu = v.parse().expect("a CPU"),
            "--rounds" => a.rounds = v.parse().expect("a count"),
            "--seconds" => a.seconds = v.parse().expect("seconds"),
            other => panic!("unknown flag {other}"),
        }
    }
    a
}

/// A CA and a server certificate for localhost / 127.0.0.1 in `dir`.
fn make_certs(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name.push(DnType::CommonName, "tls_cost CA");
    let ca = p.self_signed(&ca_key).unwrap();
    let key = KeyPair::generate().unwrap();
    let p = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
    let cert = p.signed_by(&key, &ca, &ca_key).unwrap();
    let write = |name: &str, text: String| {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    (
        write("ca.crt", ca.pem()),
        write("server.crt", cert.pem()),
        write("server.key", key.serialize_pem()),
    )
}

struct Akerd {
    child: Child,
    addr: SocketAddr,
}

impl Drop for Akerd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_akerd(a: &Args, dir: &Path, name: &str, tls: Option<(&Path, &Path)>) -> Akerd {
    let tls = tls.map_or(String::new(), |(c, k)| {
        format!(
            "[tls]\ncert_file = \"{}\"\nkey_file = \"{}\"\nhandshakes_per_s_max = 100000\n",
            c.display(),
            k.display()
        )
    });
    let cfg = dir.join(format!("{name}.toml"));
    std::fs::write(
        &cfg,
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nexecutors = 1\ncpus = [{cpu}]\ninflight_max = 256\n\
             [cache]\nk_max = {K}\ncapacity_objects = 100000\n[backend]\nindex = \"exact\"\n\
             data = {{ kind = \"synthetic\", n = 20000, dim = {DIM}, clusters = 16, seed = 3 }}\n\
             [admin]\nenabled = false\n{tls}",
            cpu = a.server_cpu
        ),
    )
    .unwrap();
    let log = dir.join(format!("{name}.log"));
    #[allow(clippy::zombie_processes)]
    // Akerd's Drop kills and waits; a panic below ends the example
    let child = Command::new(&a.akerd)
        .arg("--config")
        .arg(&cfg)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("akerd starts");
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if let Some(addr) = text
            .split_whitespace()
            .find_map(|w| w.strip_prefix("listen="))
        {
            return Akerd {
                child,
                addr: addr.parse().expect("listen= an address"),
            };
        }
        assert!(Instant::now() < end, "akerd not ready in 60 s: {text}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn hot_vector(i: usize) -> Vec<f32> {
    (0..DIM)
        .map(|j| ((i * 31 + j * 7) % 97) as f32 / 97.0)
        .collect()
}

/// Exact hits for `secs` on one pipelined connection: (replies per second, latency
/// histogram in µs).
fn hits(addr: SocketAddr, opts: &ClientOptions, secs: u64) -> (f64, Histogram<u64>) {
    let (mut p, _) = Pipeline::connect_negotiated(addr, WINDOW, opts.clone()).expect("connect");
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).unwrap();
    let mut sent_at = std::collections::HashMap::new();
    let (mut next, mut done) = (0usize, 0u64);
    let start = Instant::now();
    let end = start + Duration::from_secs(secs);
    while Instant::now() < end {
        while p.in_flight() < WINDOW {
            let id = p
                .send(Request::Search(SearchRequest::new(
                    K,
                    hot_vector(next % HOT),
                )))
                .unwrap();
            sent_at.insert(id, Instant::now());
            next += 1;
        }
        let (id, reply) = p.recv().unwrap();
        assert!(matches!(reply, Reply::Search(_)), "{reply:?}");
        let t = sent_at.remove(&id).unwrap();
        hist.record(t.elapsed().as_micros().max(1) as u64).unwrap();
        done += 1;
    }
    (done as f64 / start.elapsed().as_secs_f64(), hist)
}

/// `conns` connections, one thread each: (total replies per second, merged latency).
fn hits_many(
    addr: SocketAddr,
    opts: &ClientOptions,
    conns: usize,
    secs: u64,
) -> (f64, Histogram<u64>) {
    let threads: Vec<_> = (0..conns)
        .map(|_| {
            let o = opts.clone();
            std::thread::spawn(move || hits(addr, &o, secs))
        })
        .collect();
    let mut total = 0.0;
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).unwrap();
    for t in threads {
        let (r, h) = t.join().unwrap();
        total += r;
        hist.add(h).unwrap();
    }
    (total, hist)
}

/// New connections (connect, handshake, HELLO, close) per second, one at a time.
fn handshakes(addr: SocketAddr, opts: &ClientOptions, secs: u64) -> f64 {
    let start = Instant::now();
    let end = start + Duration::from_secs(secs);
    let mut n = 0u64;
    while Instant::now() < end {
        let mut c = Client::connect_with(addr, opts.clone()).expect("connect");
        c.hello().expect("hello");
        n += 1;
    }
    n as f64 / start.elapsed().as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    let a = args();
    let dir = std::env::temp_dir().join(format!("aker-tls-cost-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (ca, cert, key) = make_certs(&dir);
    let plain = start_akerd(&a, &dir, "plain", None);
    let tls = start_akerd(&a, &dir, "tls", Some((&cert, &key)));
    let plain_opts = ClientOptions::default();
    let tls_opts = ClientOptions {
        tls: Some(ClientTls::with_ca_file(&ca, "localhost").unwrap()),
        ..ClientOptions::default()
    };
    // Admit the hot vectors on both (a miss each), so the loops are exact hits.
    for (addr, o) in [(plain.addr, &plain_opts), (tls.addr, &tls_opts)] {
        let mut c = Client::connect_with(addr, o.clone()).unwrap();
        c.hello().unwrap();
        for i in 0..HOT {
            for _ in 0..3 {
                c.search(K, &hot_vector(i)).unwrap();
            }
        }
    }
    let names = [
        "hits/s, 1 conn",
        "p99 µs, 1 conn",
        "hits/s, 8 conns",
        "p99 µs, 8 conns",
        "handshakes/s",
    ];
    let mut rows: Vec<[Vec<f64>; 2]> = (0..names.len()).map(|_| [Vec::new(), Vec::new()]).collect();
    println!("round | side | {}", names.join(" | "));
    for r in 1..=a.rounds {
        for (side, addr, o) in [(0, plain.addr, &plain_opts), (1, tls.addr, &tls_opts)] {
            let (t1, h1) = hits(addr, o, a.seconds);
            let (t8, h8) = hits_many(addr, o, 8, a.seconds);
            let hs = handshakes(addr, o, a.seconds);
            let v = [
                t1,
                h1.value_at_quantile(0.99) as f64,
                t8,
                h8.value_at_quantile(0.99) as f64,
                hs,
            ];
            for (i, x) in v.iter().enumerate() {
                rows[i][side].push(*x);
            }
            println!(
                "{r} | {} | {}",
                ["plain", "TLS"][side],
                v.iter()
                    .map(|x| format!("{x:.0}"))
                    .collect::<Vec<_>>()
                    .join(" | ")
            );
        }
    }
    println!(
        "\n| median of {} rounds | plaintext | TLS | TLS / plaintext |",
        a.rounds
    );
    println!("|---|---:|---:|---:|");
    for (i, name) in names.iter().enumerate() {
        let (p, t) = (median(rows[i][0].clone()), median(rows[i][1].clone()));
        println!("| {name} | {p:.0} | {t:.0} | {:.2}x |", t / p);
    }
    drop((plain, tls));
    let _ = std::fs::remove_dir_all(&dir);
}
