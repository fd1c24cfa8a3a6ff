//! `aker-overload` end to end against a real akerd in this process (ops/overload.toml,
//! shrunk): misses past the backend's capacity are refused with BUSY, hits keep being
//! answered, clients that never read are dropped, and a fresh miss is answered soon
//! after the load stops. The latency bound is not checked here (a debug build on a
//! shared machine); the documented release run in docs/RELIABILITY.md checks it.

use std::process::Command;

use aker::config::Config;
use aker::service::Daemon;
use serde_json::Value;

#[test]
fn overload_sheds_misses_keeps_hits_and_recovers() {
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../ops/overload.toml"))
            .unwrap()
            .replace("n = 100000", "n = 5000")
            .replace("write_timeout_ms = 2000", "write_timeout_ms = 500");
    let mut cfg = Config::from_toml(&text).unwrap();
    cfg.server.listen = "127.0.0.1:0".parse().unwrap();
    cfg.admin.enabled = false;
    let daemon = Daemon::start(&cfg).unwrap();
    let target = daemon.local_addr().to_string();
    let dir = tempfile::tempdir().unwrap();
    let pid = std::process::id().to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_aker-overload"))
        .args(["--target", &target, "--pid", &pid, "--out"])
        .arg(dir.path())
        .args(["--data", "synthetic:5000,128,64,7", "--hit-queries", "50"])
        .args([
            "--hit-rate",
            "200",
            "--hit-connections",
            "2",
            "--miss-connections",
            "4",
        ])
        .args(["--probe", "2s", "--baseline", "2s", "--overload", "3s"])
        .args(["--recovered", "1s", "--warmup", "500ms"])
        .args(["--idle-connections", "50", "--never-readers", "2"])
        .args(["--hit-p99-ratio-max", "1000000", "--recovery-max", "10s"])
        .output()
        .unwrap();
    eprintln!("{}", String::from_utf8_lossy(&out.stdout));
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    daemon.stop().unwrap();
    assert!(out.status.success(), "{out:?}");
    let r: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("overload.json")).unwrap())
            .unwrap();
    let s = r["sustainable_miss_per_s"].as_f64().unwrap();
    assert!(s > 0.0, "{r}");
    // The probe stayed within the queue: nothing refused.
    assert!(r["probe"]["errors"].as_object().unwrap().is_empty(), "{r}");
    // Ten times that was offered; what the backend could not take came back BUSY.
    let b = &r["overload_misses"];
    assert!((b["offered_per_s"].as_f64().unwrap() - 10.0 * s).abs() < 1e-6 * s + 1.5);
    assert!(b["errors"]["BUSY"].as_u64().unwrap() > 0, "{b}");
    assert_eq!(b["errors"].as_object().unwrap().len(), 1, "{b}");
    // Every hit answered, as a hit, in every phase.
    for phase in ["baseline_hits", "overload_hits", "recovered_hits"] {
        let p = &r[phase];
        assert!(p["errors"].as_object().unwrap().is_empty(), "{phase}: {p}");
        assert_eq!(p["hits_by_kind"][0], 0, "{phase}: {p}");
        assert!(p["ok"].as_u64().unwrap() > 100, "{phase}: {p}");
    }
    assert_eq!(r["idle_connections_held"], 50);
    assert!(r["never_readers_dropped"].as_u64().unwrap() >= 2, "{r}");
    assert!(r["recovery_s"].as_f64().unwrap() < 10.0);
}
