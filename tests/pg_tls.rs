//! TLS to PostgreSQL (`sslmode` / `sslrootcert` in the url, libpq's meanings): akerd in
//! front of PgBouncer (Debian's, 1.18), which terminates TLS from its clients with a
//! certificate made here and forwards to the bundled PostgreSQL (built without OpenSSL),
//! in session pooling. Needs `pgbouncer` on PATH (CI installs it; without CI set, the
//! tests say why and skip).

#[path = "akerd_common/mod.rs"]
mod akerd_common;
#[path = "pg_common/mod.rs"]
mod pg_common;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use aker::config::{BackendKind, Config};
use aker::protocol::SearchRequest;
use aker::service::Daemon;
use aker_formats::data;
use akerd_common::{client, K};
use pg_common::{shared, PgServer};
use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair};

const DIM: usize = 8;

/// A CA and a server certificate for `names`, written into `dir`: (ca, cert, key).
fn certs(dir: &Path, tag: &str, names: &[&str]) -> (PathBuf, PathBuf, PathBuf) {
    let ca_key = KeyPair::generate().unwrap();
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name
        .push(DnType::CommonName, format!("{tag} CA"));
    let ca = p.self_signed(&ca_key).unwrap();
    let key = KeyPair::generate().unwrap();
    let mut p =
        CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
    p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let cert = p.signed_by(&key, &ca, &ca_key).unwrap();
    let w = |name: String, text: String| {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    (
        w(format!("{tag}-ca.crt"), ca.pem()),
        w(format!("{tag}.crt"), cert.pem()),
        w(format!("{tag}.key"), key.serialize_pem()),
    )
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// PgBouncer with TLS from its clients required, in front of `pg`.
struct Bouncer {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Drop for Bouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Bouncer {
    fn start(pg: &PgServer, cert: &Path, key: &Path, tag: &str) -> Option<Bouncer> {
        let Some(bin) = ["/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"]
            .into_iter()
            .map(PathBuf::from)
            .find(|p| p.exists())
        else {
            if std::env::var_os("CI").is_some() {
                panic!("no pgbouncer (CI installs it: apt-get install pgbouncer)");
            }
            eprintln!("SKIPPED: no pgbouncer for this test");
            return None;
        };
        let dir = std::env::temp_dir().join(format!("aker-pgbouncer-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(cert, dir.join("server.crt")).unwrap();
        std::fs::copy(key, dir.join("server.key")).unwrap();
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        std::fs::write(
            dir.join("userlist.txt"),
            format!("\"aker\" \"{}\"\n", pg.password()),
        )
        .unwrap();
        let d = dir.display();
        std::fs::write(
            dir.join("pgbouncer.ini"),
            format!(
                "[databases]\npostgres = host=127.0.0.1 port={pg_port} dbname=postgres\n\
                 [pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
                 auth_type = scram-sha-256\nauth_file = {d}/userlist.txt\npool_mode = session\n\
                 client_tls_sslmode = require\nclient_tls_cert_file = {d}/server.crt\n\
                 client_tls_key_file = {d}/server.key\nserver_tls_sslmode = disable\n\
                 max_client_conn = 100\ndefault_pool_size = 40\n\
                 ignore_startup_parameters = extra_float_digits\nlogfile = {d}/pgbouncer.log\n",
                pg_port = pg.port
            ),
        )
        .unwrap();
        // PgBouncer refuses to run as root: the PostgreSQL user of ops/pg.sh runs it.
        let mut cmd = if is_root() {
            Command::new("chmod")
                .args(["-R", "a+rX"])
                .arg(&dir)
                .status()
                .unwrap();
            Command::new("chown")
                .args(["-R", "aker-pg"])
                .arg(&dir)
                .status()
                .unwrap();
            let mut c = Command::new("runuser");
            c.args(["-u", "aker-pg", "--"]).arg(&bin);
            c
        } else {
            Command::new(&bin)
        };
        let child = cmd
            .arg(dir.join("pgbouncer.ini"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("pgbouncer starts");
        let b = Bouncer { child, port, dir };
        let end = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < end, "pgbouncer not listening: {}", b.log());
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(b)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("pgbouncer.log")).unwrap_or_default()
    }
}

fn config(pg: &PgServer, table: &str, url: String) -> Config {
    let mut c = akerd_common::config();
    c.backend.kind = BackendKind::Pgvector;
    c.backend.threads = 2;
    let mut s = pg.section(table);
    s.url = url;
    c.backend.pgvector = Some(s);
    c
}

fn refused(cfg: &Config) -> String {
    match Daemon::start(cfg) {
        Ok(d) => {
            d.stop().unwrap();
            panic!("akerd started")
        }
        Err(e) => e.to_string(),
    }
}

/// Every sslmode against a server that requires TLS (PgBouncer) and one that has none
/// (the bundled PostgreSQL): what connects, what is refused, and that searches work.
#[test]
fn sslmodes_mean_what_libpq_says() {
    let Some(pg) = shared() else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("aker-pg-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ds = data::synthetic(2000, DIM, 8, 5);
    pg.sql().load("t_tls", &ds, "vector_l2_ops");
    // A certificate for 127.0.0.1, and one for another name only.
    let (ca, cert, key) = certs(&dir, "good", &["127.0.0.1", "localhost"]);
    let (other_ca, _, _) = certs(&dir, "other", &["127.0.0.1"]);
    let Some(b) = Bouncer::start(pg, &cert, &key, "good") else {
        return;
    };
    let url = |q: &str| format!("postgresql://aker@127.0.0.1:{}/postgres?{q}", b.port);
    let ca = ca.display().to_string();

    // verify-full: served through TLS; searches equal the database's own answer.
    let d = Daemon::start(&config(
        pg,
        "t_tls",
        url(&format!("sslmode=verify-full&sslrootcert={ca}")),
    ))
    .unwrap_or_else(|e| panic!("{e}\n{}", b.log()));
    let mut c = client(d.local_addr());
    let q = ds.row(3).to_vec();
    let r = c
        .search_with(SearchRequest {
            bypass_cache: true,
            ..SearchRequest::new(K, q.clone())
        })
        .unwrap();
    assert_eq!(r.neighbors[0].id, 3);
    let inserted = 5_000_000;
    c.insert(inserted, &q).unwrap();
    assert!(
        pg.sql()
            .query("SELECT 1 FROM t_tls WHERE id = $1", &[&(inserted as i64)])
            .len()
            == 1
    );
    d.stop().unwrap();

    // require: encrypted, not authenticated (any certificate): connects.
    let d = Daemon::start(&config(pg, "t_tls", url("sslmode=require"))).unwrap();
    client(d.local_addr()).ping().unwrap();
    d.stop().unwrap();
    // prefer (the default): TLS when offered.
    let d = Daemon::start(&config(pg, "t_tls", url(""))).unwrap();
    client(d.local_addr()).ping().unwrap();
    d.stop().unwrap();

    // verify-full with a CA that did not sign it: refused, and the error says TLS.
    let e = refused(&config(
        pg,
        "t_tls",
        url(&format!(
            "sslmode=verify-full&sslrootcert={}",
            other_ca.display()
        )),
    ));
    assert!(e.to_lowercase().contains("certificate"), "{e}");
    // A certificate from the right CA that does not name 127.0.0.1: verify-full
    // refuses it, verify-ca (the chain only) admits it.
    let (misnamed_ca, misnamed, misnamed_key) = certs(&dir, "misnamed", &["db.example.com"]);
    let m = Bouncer::start(pg, &misnamed, &misnamed_key, "misnamed").unwrap();
    let m_url = |q: &str| format!("postgresql://aker@127.0.0.1:{}/postgres?{q}", m.port);
    let m_ca = misnamed_ca.display();
    let e = refused(&config(
        pg,
        "t_tls",
        m_url(&format!("sslmode=verify-full&sslrootcert={m_ca}")),
    ));
    assert!(e.contains("NotValidForName") || e.contains("name"), "{e}");
    let d = Daemon::start(&config(
        pg,
        "t_tls",
        m_url(&format!("sslmode=verify-ca&sslrootcert={m_ca}")),
    ))
    .unwrap();
    client(d.local_addr()).ping().unwrap();
    d.stop().unwrap();
    drop(m);
    // disable: PgBouncer requires TLS from its clients: refused.
    let e = refused(&config(pg, "t_tls", url("sslmode=disable")));
    assert!(!e.is_empty());

    // Against the bundled server (no TLS at all): prefer falls back to plaintext,
    // require is refused.
    let direct = |q: &str| format!("{}?{q}", pg.url());
    let d = Daemon::start(&config(pg, "t_tls", direct("sslmode=prefer"))).unwrap();
    client(d.local_addr()).ping().unwrap();
    d.stop().unwrap();
    let e = refused(&config(pg, "t_tls", direct("sslmode=require")));
    assert!(
        e.to_lowercase().contains("tls") || e.to_lowercase().contains("ssl"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A url's TLS keys are checked with the rest of the configuration, before data loads.
#[test]
fn bad_tls_keys_in_the_url_are_refused_by_the_config_check() {
    let mut cfg = Config::from_toml(include_str!("../ops/akerd-pgvector.toml")).unwrap();
    for (url, what) in [
        (
            "postgresql://aker@db/postgres?sslmode=verify-everything",
            "sslmode",
        ),
        (
            "postgresql://aker@db/postgres?sslmode=disable&sslrootcert=/ca.crt",
            "sslrootcert",
        ),
    ] {
        cfg.backend.pgvector.as_mut().unwrap().url = url.into();
        let e = aker::config::validate(&cfg).unwrap_err().to_string();
        assert!(e.contains(what), "{url}: {e}");
    }
    cfg.backend.pgvector.as_mut().unwrap().url =
        "postgresql://aker@db/postgres?sslmode=verify-full&sslrootcert=/ca.crt&application_name=x"
            .into();
    aker::config::validate(&cfg).unwrap();
}
