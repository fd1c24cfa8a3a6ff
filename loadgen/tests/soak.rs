//! `aker-soak` end to end: a short soak of a real akerd (in this process, ops/soak.toml
//! shrunk) passes every check; the same soak of a server that keeps answering deleted
//! ids (the fixed-answer fixture) fails with violations.

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use aker::config::Config;
use aker::service::Daemon;
use serde_json::Value;

fn soak(target: &str, out: &Path, extra: &[&str]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_aker-soak"))
        .args(["--target", target, "--out"])
        .arg(out)
        .args([
            "--duration",
            "4s",
            "--sample-every",
            "1s",
            "--flush-every",
            "1500ms",
        ])
        .args(["--clients", "4", "--rate", "100", "--io-timeout", "5s"])
        .args(extra)
        .output()
        .unwrap();
    eprintln!("{}", String::from_utf8_lossy(&out.stdout));
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    out
}

fn report(out: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(out.join("soak.json")).unwrap()).unwrap()
}

#[test]
fn a_short_soak_of_akerd_passes_every_check() {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../ops/soak.toml"))
        .unwrap()
        .replace("n = 20000", "n = 3000");
    let mut cfg = Config::from_toml(&text).unwrap();
    cfg.server.listen = "127.0.0.1:0".parse().unwrap();
    cfg.admin.enabled = false;
    let daemon = Daemon::start(&cfg).unwrap();
    let target = daemon.local_addr().to_string();
    let dir = tempfile::tempdir().unwrap();
    let pid = std::process::id().to_string();
    let out = soak(
        &target,
        dir.path(),
        &["--data", "synthetic:3000,32,64,7", "--pid", &pid],
    );
    daemon.stop().unwrap();
    assert!(out.status.success(), "{out:?}");
    let r = report(dir.path());
    assert_eq!(r["violations"], 0);
    assert_eq!(r["live_inserts_missing"], 0);
    // Every kind of operation ran, and searches after deletes were checked.
    for key in [
        "searches",
        "inserts",
        "deletes_acknowledged",
        "flushes",
        "hits",
        "top1_deletes",
    ] {
        assert!(r[key].as_u64().unwrap() > 0, "{key}: {r}");
    }
    assert!(r["live_inserts_checked"].as_u64().unwrap() > 0);
    assert_eq!(r["fresh_connection_failures"], 0);
    let samples = r["samples"].as_array().unwrap();
    assert!(samples.len() >= 3, "{samples:?}");
    assert!(samples.iter().all(|s| s["rss_mib"].as_f64().unwrap() > 1.0));
    let png = std::fs::read(dir.path().join("soak.png")).unwrap();
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"));
    let csv = std::fs::read_to_string(dir.path().join("soak.csv")).unwrap();
    assert_eq!(csv.lines().count(), samples.len() + 1);
}

#[test]
fn a_server_that_serves_deleted_ids_fails_the_soak() {
    // SEARCH always answers ids 0..k, so the top-1 a client deletes comes back at once.
    let fixture =
        loadgen::testserver::start("127.0.0.1:0".parse().unwrap(), 4, Duration::ZERO, 128).unwrap();
    let target = fixture.local_addr().to_string();
    let dir = tempfile::tempdir().unwrap();
    let out = soak(&target, dir.path(), &["--data", "synthetic:200,4,4,1"]);
    let _ = fixture.stop();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("FAIL del-consistency"), "{stdout}");
    let r = report(dir.path());
    assert!(r["violations"].as_u64().unwrap() > 0, "{r}");
    let v = &r["violations_kept"][0];
    assert!(v["id"].as_u64().unwrap() < 10, "{v}");
    // The fixture keeps no inserts either.
    assert!(r["live_inserts_missing"].as_u64().unwrap() > 0, "{r}");
}
