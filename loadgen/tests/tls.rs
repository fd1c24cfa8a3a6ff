//! The load generator against an akerd with `[tls]`: with `--tls-ca` every connection
//! does its handshake and its reading and writing threads share the session; without
//! it the run is refused with the server's reason.

use std::process::Command;

use aker::config::Config;
use aker::service::Daemon;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};

#[test]
fn the_load_generator_runs_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    let ca_key = KeyPair::generate().unwrap();
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name
        .push(DnType::CommonName, "loadgen test CA");
    let ca = p.self_signed(&ca_key).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&key, &ca, &ca_key)
        .unwrap();
    let write = |name: &str, text: String| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let ca_file = write("ca.crt", ca.pem());
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../ops/soak.toml"))
        .unwrap()
        .replace("n = 20000", "n = 2000");
    let mut cfg = Config::from_toml(&text).unwrap();
    cfg.server.listen = "127.0.0.1:0".parse().unwrap();
    cfg.admin.enabled = false;
    cfg.tls.cert_file = Some(write("server.crt", cert.pem()));
    cfg.tls.key_file = Some(write("server.key", key.serialize_pem()));
    let d = Daemon::start(&cfg).unwrap();
    let target = d.local_addr().to_string();
    let run = |tls: bool, mode: &[&str]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_aker-loadgen"));
        c.args(["--target", &target, "-w", "0s", "-D", "1s"])
            .args(["--connections", "4", "--threads", "2", "--quiet"])
            .args(mode)
            .args(["--mix", "search=80,insert=10,delete=10", "--json"])
            .arg(dir.path().join("run.json"));
        if tls {
            c.arg("--tls-ca").arg(&ca_file);
        }
        c.output().unwrap()
    };
    let out = run(false, &["--rate", "500"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{out:?}");
    assert!(stderr.contains("requires TLS"), "{stderr}");

    // Open loop, closed loop with 16 in flight per connection through one session, and
    // batches (many replies per server write: records of up to 16 KiB, more than
    // rustls holds unread at once).
    for mode in [
        &["--rate", "500"][..],
        &["--closed", "--depth", "16"][..],
        &["--closed", "--depth", "32", "--batch", "64"][..],
    ] {
        let out = run(true, mode);
        assert!(out.status.success(), "{mode:?}: {out:?}");
        let doc: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.path().join("run.json")).unwrap())
                .unwrap();
        assert_eq!(doc["run"]["errors"], 0, "{mode:?}: {}", doc["run"]);
        assert!(
            doc["run"]["ok"].as_u64().unwrap() > 300,
            "{mode:?}: {}",
            doc["run"]
        );
    }
    // The soak too (its checker's connections and its samples' STATS over TLS).
    let out = Command::new(env!("CARGO_BIN_EXE_aker-soak"))
        .args(["--target", &target, "--data", "synthetic:2000,32,64,7"])
        .args(["--duration", "2s", "--sample-every", "1s", "--clients", "2"])
        .args(["--rate", "50", "--out"])
        .arg(dir.path().join("soak"))
        .arg("--tls-ca")
        .arg(&ca_file)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    d.stop().unwrap();
}
