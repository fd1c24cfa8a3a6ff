//! TLS on the client port (`[tls]`): the Rust clients over TLS, pipelining, mutual TLS,
//! and every way a handshake goes wrong; certificates made here (rcgen), loopback only.

#[path = "akerd_common/mod.rs"]
mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use aker::client::{Client, ClientError, ClientOptions, ClientTls, Pipeline};
use aker::config::Config;
use aker::protocol::{Reply, Request, SearchRequest, Status, VERSION};
use aker::service::Daemon;
use rcgen::{
    date_time_ymd, BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair,
};

/// A CA: its certificate's PEM, and what signs with it.
struct Ca {
    cert: rcgen::Certificate,
    key: KeyPair,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name.push(DnType::CommonName, name);
        let cert = p.self_signed(&key).unwrap();
        Ca { cert, key }
    }

    /// A leaf for `names` (DNS names or IP addresses), for a server or a client;
    /// `expired`: valid only in 2019.
    fn leaf(
        &self,
        names: &[&str],
        purpose: ExtendedKeyUsagePurpose,
        expired: bool,
    ) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .unwrap();
        p.distinguished_name.push(DnType::CommonName, names[0]);
        p.extended_key_usages = vec![purpose];
        if expired {
            p.not_before = date_time_ymd(2019, 1, 1);
            p.not_after = date_time_ymd(2019, 12, 31);
        }
        let cert = p.signed_by(&key, &self.cert, &self.key).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

/// A folder of PEM files for one test.
struct Pki {
    dir: PathBuf,
}

impl Pki {
    fn new(name: &str) -> Pki {
        let dir = std::env::temp_dir().join(format!("aker-tls-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Pki { dir }
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    fn ca(&self, name: &str, ca: &Ca) -> PathBuf {
        self.write(name, &ca.cert.pem())
    }

    fn pair(&self, name: &str, (cert, key): (String, String)) -> (PathBuf, PathBuf) {
        (
            self.write(&format!("{name}.crt"), &cert),
            self.write(&format!("{name}.key"), &key),
        )
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn server_pair(ca: &Ca, expired: bool) -> (String, String) {
    ca.leaf(
        &["localhost", "127.0.0.1"],
        ExtendedKeyUsagePurpose::ServerAuth,
        expired,
    )
}

fn tls_config(cert: &Path, key: &Path, client_ca: Option<&Path>) -> Config {
    let mut c = common::config();
    c.tls.cert_file = Some(cert.to_path_buf());
    c.tls.key_file = Some(key.to_path_buf());
    c.tls.client_ca_file = client_ca.map(Path::to_path_buf);
    c.tls.handshake_timeout_ms = 1_000;
    c
}

fn opts(tls: Option<ClientTls>) -> ClientOptions {
    ClientOptions {
        io_timeout: Some(Duration::from_secs(10)),
        connect_timeout: Duration::from_secs(5),
        tls,
        ..Default::default()
    }
}

fn trust(ca_file: &Path) -> ClientTls {
    ClientTls::with_ca_file(ca_file, "localhost").unwrap()
}

fn tls_client(addr: SocketAddr, tls: ClientTls) -> Result<Client, ClientError> {
    let mut c = Client::connect_with(addr, opts(Some(tls)))?;
    c.hello()?;
    Ok(c)
}

fn server_stat(d: &Daemon, name: &str) -> f64 {
    let text = d.prometheus();
    common::stat(&text, &format!("aker_{name}_total"))
        .unwrap_or_else(|| panic!("{name} in /metrics"))
}

/// Waits (bounded) for a counter to reach `want`: the server counts after the client
/// has seen the outcome.
fn wait_stat(d: &Daemon, name: &str, want: f64) {
    let end = Instant::now() + Duration::from_secs(5);
    while server_stat(d, name) < want && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(server_stat(d, name), want, "{name}");
}

#[test]
fn the_clients_work_over_tls_and_pipelining_keeps_every_reply() {
    let pki = Pki::new("happy");
    let ca = Ca::new("aker test CA");
    let ca_file = pki.ca("ca.crt", &ca);
    let (cert, key) = pki.pair("server", server_pair(&ca, false));
    let d = common::start(&tls_config(&cert, &key, None));
    let addr = d.local_addr();

    // The blocking client: search, insert, delete, as over plaintext.
    let mut c = tls_client(addr, trust(&ca_file)).expect("TLS client connects");
    let q = common::query_near(&common::dataset(), 7, 0.01);
    let r = c.search(common::K, &q).unwrap();
    assert_eq!(r.neighbors.len(), common::K as usize);
    c.insert(9_000_000, &q).unwrap();
    let r = c.search(common::K, &q).unwrap();
    assert_eq!(
        r.neighbors[0].id, 9_000_000,
        "the insert is in the next answer"
    );
    assert!(c.delete(9_000_000).unwrap());

    // Pipelined: many requests in flight at once through one TLS session, the reader
    // and writer tasks sharing it; every reply arrives and matches its request.
    let ds = common::dataset();
    let (mut p, _) = Pipeline::connect_negotiated(addr, 64, opts(Some(trust(&ca_file)))).unwrap();
    let n = 3_000usize;
    let mut sent = std::collections::HashMap::new();
    let mut received = 0usize;
    let mut next = 0usize;
    let end = Instant::now() + Duration::from_secs(60);
    while received < n {
        assert!(
            Instant::now() < end,
            "pipelined TLS run did not finish in 60 s"
        );
        while next < n && p.in_flight() < p.window() {
            let row = next % 500;
            let q = common::query_near(&ds, row, 0.0);
            let id = p
                .send(Request::Search(SearchRequest::new(common::K, q)))
                .unwrap();
            sent.insert(id, row);
            next += 1;
        }
        let (id, reply) = p.recv().unwrap();
        let row = sent.remove(&id).expect("a reply to a request sent");
        match reply {
            Reply::Search(s) => assert_eq!(
                common::ids(&s)[..],
                common::exact_ids(&ds, &common::query_near(&ds, row, 0.0), common::K as usize)[..],
                "row {row}: the reply for that request"
            ),
            other => panic!("{other:?}"),
        }
        received += 1;
    }
    assert!(sent.is_empty());
    assert!(server_stat(&d, "server_tls_handshakes") >= 2.0);
    assert_eq!(server_stat(&d, "server_tls_handshake_failures"), 0.0);
    d.stop().unwrap();
}

#[test]
fn a_handshake_that_goes_wrong_is_refused_clearly_and_the_server_stays_up() {
    let pki = Pki::new("wrong");
    let ca = Ca::new("aker test CA");
    let other = Ca::new("another CA");
    let ca_file = pki.ca("ca.crt", &ca);
    let other_file = pki.ca("other.crt", &other);
    let (cert, key) = pki.pair("server", server_pair(&ca, false));
    let d = common::start(&tls_config(&cert, &key, None));
    let addr = d.local_addr();

    // A client that trusts another CA.
    match tls_client(addr, trust(&other_file)) {
        Err(ClientError::Tls(m)) => assert!(m.contains("certificate"), "{m}"),
        other => panic!("expected a TLS error, got {:?}", other.map(|_| ())),
    }
    // A name the certificate is not for.
    match tls_client(
        addr,
        ClientTls::with_ca_file(&ca_file, "aker.example.com").unwrap(),
    ) {
        Err(ClientError::Tls(m)) => assert!(m.contains("certificate"), "{m}"),
        other => panic!("expected a TLS error, got {:?}", other.map(|_| ())),
    }
    wait_stat(&d, "server_tls_handshake_failures", 2.0);

    // A plaintext client: one plaintext error frame that says TLS is required.
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(&common::encoded(VERSION, 1, Request::Hello))
        .unwrap();
    let f = common::read_reply(&mut s).expect("an error frame in clear");
    match f.reply {
        Reply::Error {
            status,
            message,
            op,
        } => {
            assert_eq!(status, Status::BadRequest);
            assert_eq!(op, aker::protocol::CONNECTION_OP);
            assert!(message.contains("requires TLS"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert!(common::closed(&mut s));
    wait_stat(&d, "server_tls_plaintext_refused", 1.0);

    // A handshake started and left hanging: closed after handshake_timeout_ms (1 s).
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(&[0x16, 0x03, 0x01]).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let t = Instant::now();
    let mut b = [0u8; 64];
    let n = s.read(&mut b).unwrap_or(0);
    assert_eq!(n, 0, "closed without a reply");
    let waited = t.elapsed();
    assert!(
        waited >= Duration::from_millis(800) && waited < Duration::from_secs(5),
        "{waited:?}"
    );
    wait_stat(&d, "server_tls_handshake_timeouts", 1.0);

    // And the server still serves a good client.
    let mut c = tls_client(addr, trust(&ca_file)).unwrap();
    c.ping().unwrap();
    d.stop().unwrap();
}

#[test]
fn an_expired_server_certificate_is_refused_by_the_client() {
    let pki = Pki::new("expired");
    let ca = Ca::new("aker test CA");
    let ca_file = pki.ca("ca.crt", &ca);
    let (cert, key) = pki.pair("server", server_pair(&ca, true));
    let d = common::start(&tls_config(&cert, &key, None));
    match tls_client(d.local_addr(), trust(&ca_file)) {
        Err(ClientError::Tls(m)) => assert!(m.to_lowercase().contains("expired"), "{m}"),
        other => panic!("expected a TLS error, got {:?}", other.map(|_| ())),
    }
    d.stop().unwrap();
}

#[test]
fn a_tls_client_against_a_plaintext_port_fails_fast() {
    let pki = Pki::new("plainport");
    let ca = Ca::new("aker test CA");
    let ca_file = pki.ca("ca.crt", &ca);
    let d = common::start(&common::config());
    let t = Instant::now();
    let r = tls_client(d.local_addr(), trust(&ca_file));
    assert!(
        matches!(
            r,
            Err(ClientError::Tls(_)) | Err(ClientError::Closed) | Err(ClientError::Io(_))
        ),
        "{:?}",
        r.map(|_| ())
    );
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    // The plaintext port still serves plaintext.
    common::client(d.local_addr()).ping().unwrap();
    d.stop().unwrap();
}

#[test]
fn mutual_tls_admits_only_certificates_from_the_client_ca() {
    let pki = Pki::new("mutual");
    let ca = Ca::new("aker test CA");
    let clients = Ca::new("aker clients CA");
    let stranger = Ca::new("stranger CA");
    let ca_file = pki.ca("ca.crt", &ca);
    let clients_file = pki.ca("clients.crt", &clients);
    let (cert, key) = pki.pair("server", server_pair(&ca, false));
    let (ccert, ckey) = pki.pair(
        "client",
        clients.leaf(&["client-1"], ExtendedKeyUsagePurpose::ClientAuth, false),
    );
    let (scert, skey) = pki.pair(
        "stranger",
        stranger.leaf(&["client-2"], ExtendedKeyUsagePurpose::ClientAuth, false),
    );
    let mut cfg = tls_config(&cert, &key, Some(&clients_file));
    // Mutual TLS stands for authentication in protected mode: beyond loopback is
    // allowed (the test still listens on loopback; the check is on the config).
    cfg.server.listen = "127.0.0.1:0".parse().unwrap();
    let d = common::start(&cfg);
    let addr = d.local_addr();

    let mut ok = tls_client(addr, trust(&ca_file).identity(&ccert, &ckey).unwrap())
        .expect("a certificate from the client CA is admitted");
    ok.ping().unwrap();
    // No certificate, or one from another CA: refused. (TLS 1.3 tells the client after
    // its handshake ends: the refusal can surface on the first request instead.)
    for tls in [
        trust(&ca_file),
        trust(&ca_file).identity(&scert, &skey).unwrap(),
    ] {
        let r = tls_client(addr, tls).and_then(|mut c| c.ping());
        assert!(
            matches!(r, Err(ClientError::Tls(_)) | Err(ClientError::Closed)),
            "{r:?}"
        );
    }
    wait_stat(&d, "server_tls_handshake_failures", 2.0);
    d.stop().unwrap();

    // Protected mode counts mutual TLS as authentication; TLS without it does not.
    let mut beyond = tls_config(&cert, &key, Some(&clients_file));
    beyond.server.listen = "0.0.0.0:0".parse().unwrap();
    aker::config::validate(&beyond).expect("mutual TLS may listen beyond loopback");
    beyond.tls.client_ca_file = None;
    let e = aker::config::validate(&beyond).unwrap_err().to_string();
    assert!(e.contains("client_ca_file"), "{e}");
}

#[test]
fn a_reload_takes_new_files_and_a_broken_one_keeps_the_old() {
    let pki = Pki::new("reload");
    let ca1 = Ca::new("first CA");
    let ca2 = Ca::new("second CA");
    let ca1_file = pki.ca("ca1.crt", &ca1);
    let ca2_file = pki.ca("ca2.crt", &ca2);
    let (cert, key) = pki.pair("server", server_pair(&ca1, false));
    let d = common::start(&tls_config(&cert, &key, None));
    let addr = d.local_addr();
    let mut old = tls_client(addr, trust(&ca1_file)).unwrap();

    // New files in place, reloaded: new connections get the new certificate, the open
    // one keeps its session.
    pki.pair("server", server_pair(&ca2, false));
    d.server()
        .tls()
        .unwrap()
        .reload()
        .expect("a good pair reloads");
    assert!(matches!(
        tls_client(addr, trust(&ca1_file)),
        Err(ClientError::Tls(_))
    ));
    tls_client(addr, trust(&ca2_file)).unwrap().ping().unwrap();
    old.ping()
        .expect("an open connection is not dropped by a reload");

    // A broken key: the reload fails and says why; the pair in force stays.
    std::fs::write(
        &key,
        "-----BEGIN PRIVATE KEY-----\nbm90IGEga2V5\n-----END PRIVATE KEY-----\n",
    )
    .unwrap();
    let e = d.server().tls().unwrap().reload().unwrap_err();
    assert!(e.contains("key"), "{e}");
    tls_client(addr, trust(&ca2_file)).unwrap().ping().unwrap();
    old.ping().unwrap();
    d.stop().unwrap();
}

#[test]
fn a_start_with_a_bad_certificate_file_fails_and_says_which() {
    let pki = Pki::new("badstart");
    let ca = Ca::new("aker test CA");
    let (cert, key) = pki.pair("server", server_pair(&ca, false));
    let missing = pki.dir.join("missing.crt");
    let refused = |cfg: &Config| match Daemon::start(cfg) {
        Ok(d) => {
            d.stop().unwrap();
            panic!("akerd started with a bad certificate file")
        }
        Err(e) => e.to_string(),
    };
    let e = refused(&tls_config(&missing, &key, None));
    assert!(e.contains("missing.crt"), "{e}");
    let not_pem = pki.write("garbage.crt", "not a certificate\n");
    let e = refused(&tls_config(&not_pem, &key, None));
    assert!(e.contains("garbage.crt"), "{e}");
    // Only a key, no certificate: refused by the configuration's own check.
    let mut c = common::config();
    c.tls.key_file = Some(key.clone());
    assert!(aker::config::validate(&c).is_err());
    // A key that is not the certificate's.
    let (_, other_key) = pki.pair("other", server_pair(&ca, false));
    let e = refused(&tls_config(&cert, &other_key, None));
    assert!(e.contains("other.key") && e.contains("Mismatch"), "{e}");
    // And the pair itself starts.
    common::start(&tls_config(&cert, &key, None))
        .stop()
        .unwrap();
}

const AKERD: &str = env!("CARGO_BIN_EXE_akerd");
const CLI: &str = env!("CARGO_BIN_EXE_aker-cli");

#[test]
fn aker_cli_speaks_tls() {
    let pki = Pki::new("cli");
    let ca = Ca::new("aker test CA");
    let ca_file = pki.ca("ca.crt", &ca);
    let (cert, key) = pki.pair("server", server_pair(&ca, false));
    let d = common::start(&tls_config(&cert, &key, None));
    let target = d.local_addr().to_string();
    let run = |extra: &[&str]| {
        let out = std::process::Command::new(CLI)
            .args(["--target", &target, "--timeout-ms", "5000"])
            .args(extra)
            .arg("ping")
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let ca_arg = ca_file.to_str().unwrap();
    let (ok, err) = run(&["--tls-ca", ca_arg, "--tls-server-name", "localhost"]);
    assert!(ok, "{err}");
    // Without TLS: the server's plaintext frame says why.
    let (ok, err) = run(&[]);
    assert!(!ok && err.contains("requires TLS"), "{err}");
    // The target's host (127.0.0.1, in the certificate) is the default name.
    let (ok, err) = run(&["--tls-ca", ca_arg]);
    assert!(ok, "{err}");
    d.stop().unwrap();
}

/// The daemon binary: SIGHUP reloads the files (a broken pair keeps the old one), and
/// akerd keeps serving; SIGTERM still stops it cleanly.
#[test]
fn sighup_reloads_the_files_and_akerd_stays_up() {
    let pki = Pki::new("sighup");
    let ca1 = Ca::new("first CA");
    let ca2 = Ca::new("second CA");
    let ca1_file = pki.ca("ca1.crt", &ca1);
    let ca2_file = pki.ca("ca2.crt", &ca2);
    let (cert, key) = pki.pair("server", server_pair(&ca1, false));
    let cfg = pki.write(
        "akerd.toml",
        &format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nexecutors = 1\nshutdown_poll_ms = 10\n\
             [cache]\ncapacity_objects = 1000\n[backend]\nindex = \"exact\"\n\
             data = {{ kind = \"synthetic\", n = 500, dim = {}, clusters = 4, seed = 1 }}\n\
             [admin]\nenabled = false\n[tls]\ncert_file = \"{}\"\nkey_file = \"{}\"\n",
            common::DIM,
            cert.display(),
            key.display()
        ),
    );
    let log = pki.dir.join("akerd.log");
    let mut child = std::process::Command::new(AKERD)
        .arg("--config")
        .arg(&cfg)
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let wait_log = |what: &str| -> String {
        let end = Instant::now() + Duration::from_secs(30);
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if text.contains(what) {
                return text;
            }
            assert!(Instant::now() < end, "no '{what}' in akerd's log:\n{text}");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let text = wait_log("akerd: ready");
    let addr: SocketAddr = text
        .split_whitespace()
        .find_map(|w| w.strip_prefix("listen="))
        .unwrap()
        .parse()
        .unwrap();
    let pid = child.id().to_string();
    let signal = |sig: &str| {
        assert!(std::process::Command::new("kill")
            .args([sig, &pid])
            .status()
            .unwrap()
            .success());
    };
    tls_client(addr, trust(&ca1_file)).unwrap().ping().unwrap();

    pki.pair("server", server_pair(&ca2, false));
    signal("-HUP");
    wait_log("TLS certificate and key reloaded");
    tls_client(addr, trust(&ca2_file)).unwrap().ping().unwrap();
    assert!(child.try_wait().unwrap().is_none(), "SIGHUP ended akerd");

    std::fs::write(&cert, "not a certificate\n").unwrap();
    signal("-HUP");
    wait_log("TLS reload failed");
    tls_client(addr, trust(&ca2_file)).unwrap().ping().unwrap();

    signal("-TERM");
    let status = common::exit_within(&mut child, Duration::from_secs(20));
    assert!(status.success(), "{status:?}");
}

/// Replies that pile up while the client does not read (more than the sockets and the
/// TLS session buffer hold): the writer waits on the socket, and once the client reads,
/// every reply arrives, each once.
#[test]
fn a_client_that_reads_late_gets_every_reply_over_tls() {
    let pki = Pki::new("late");
    let ca = Ca::new("aker test CA");
    let ca_file = pki.ca("ca.crt", &ca);
    let (cert, key) = pki.pair("server", server_pair(&ca, false));
    let d = common::start(&tls_config(&cert, &key, None));
    let mut c = tls_client(d.local_addr(), trust(&ca_file)).unwrap();
    let ds = common::dataset();
    let n = 3_000u64;
    let mut bytes = Vec::new();
    for id in 1..=n {
        let q = common::query_near(&ds, (id % 500) as usize, 0.0);
        bytes.extend(common::encoded(
            VERSION,
            id,
            Request::Search(SearchRequest::new(32, q)),
        ));
    }
    c.send_raw(&bytes).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let mut seen = std::collections::HashSet::new();
    let (mut ok, mut busy) = (0, 0);
    while seen.len() < n as usize {
        let f = c.recv_frame().expect("every reply arrives");
        assert!(seen.insert(f.request_id), "reply {} twice", f.request_id);
        match f.reply {
            Reply::Search(s) => {
                assert_eq!(s.neighbors.len(), 32);
                ok += 1;
            }
            Reply::Error {
                status: Status::Busy,
                ..
            } => busy += 1,
            other => panic!("{other:?}"),
        }
    }
    assert!(ok >= 64, "ok {ok}, busy {busy}");
    c.ping().unwrap();
    d.stop().unwrap();
}

/// A handshake still waiting (a stalled client) does not hold up shutdown, and a client
/// that sends one byte of the magic and stalls is closed at the handshake timeout.
#[test]
fn stalled_handshakes_neither_hold_shutdown_nor_stay_open() {
    let pki = Pki::new("stall");
    let ca = Ca::new("aker test CA");
    let (cert, key) = pki.pair("server", server_pair(&ca, false));
    let mut cfg = tls_config(&cert, &key, None);
    cfg.tls.handshake_timeout_ms = 600;
    let d = common::start(&cfg);
    let addr = d.local_addr();
    let mut half_magic = TcpStream::connect(addr).unwrap();
    half_magic.write_all(b"A").unwrap();
    half_magic
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut b = [0u8; 16];
    assert_eq!(
        half_magic.read(&mut b).unwrap_or(0),
        0,
        "closed, nothing said"
    );
    wait_stat(&d, "server_tls_handshake_timeouts", 1.0);

    let mut cfg = tls_config(&cert, &key, None);
    cfg.tls.handshake_timeout_ms = 60_000;
    cfg.server.shutdown_grace_ms = 30_000;
    let d2 = common::start(&cfg);
    let _stalled = {
        let mut s = TcpStream::connect(d2.local_addr()).unwrap();
        s.write_all(&[0x16, 0x03, 0x01]).unwrap();
        s
    };
    std::thread::sleep(Duration::from_millis(200));
    let t = Instant::now();
    d2.stop().unwrap();
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "shutdown took {:?}",
        t.elapsed()
    );
    d.stop().unwrap();
}

/// `Client::is_idle_usable` over TLS (what the cluster handle asks before reusing a
/// connection): true on a connection in use after HELLO, false once the server closed it
/// for idleness (close_notify, then the end of stream), true on a new one.
#[test]
fn an_idle_tls_connection_the_server_closed_is_known_before_a_request() {
    let pki = Pki::new("idle");
    let ca = Ca::new("aker test CA");
    let ca_file = pki.ca("ca.crt", &ca);
    let (cert, key) = pki.pair("server", server_pair(&ca, false));
    let mut cfg = tls_config(&cert, &key, None);
    cfg.server.idle_timeout_ms = 300;
    let d = common::start(&cfg);
    let mut c = tls_client(d.local_addr(), trust(&ca_file)).unwrap();
    c.ping().unwrap();
    assert!(c.is_idle_usable(), "a connection in use");
    std::thread::sleep(Duration::from_millis(900)); // the server closes it
    assert!(!c.is_idle_usable(), "closed by the server while idle");
    let mut again = tls_client(d.local_addr(), trust(&ca_file)).unwrap();
    assert!(again.is_idle_usable(), "a new connection after HELLO");
    again.ping().unwrap();
    d.stop().unwrap();
}
