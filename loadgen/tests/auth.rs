//! The load generator and the soak against an akerd that requires AUTH: with
//! `--secret-file` every connection authenticates; without it the run is refused with
//! a clear error.

use std::process::Command;

use aker::config::Config;
use aker::service::Daemon;

const SECRET: &str = "loadgen-test-shared-secret";

fn daemon(secret_file: &std::path::Path) -> Daemon {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../ops/soak.toml"))
        .unwrap()
        .replace("n = 20000", "n = 2000");
    let mut cfg = Config::from_toml(&text).unwrap();
    cfg.server.listen = "127.0.0.1:0".parse().unwrap();
    cfg.admin.enabled = false;
    cfg.auth.secret_file = Some(secret_file.to_path_buf());
    Daemon::start(&cfg).unwrap()
}

#[test]
fn the_tools_authenticate_with_a_secret_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("secret");
    std::fs::write(&file, format!("{SECRET}\n")).unwrap();
    let d = daemon(&file);
    let target = d.local_addr().to_string();
    let run = |with_secret: bool| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_aker-loadgen"));
        c.args(["--target", &target, "--rate", "500", "-w", "0s", "-D", "1s"])
            .args(["--connections", "2", "--threads", "1", "--quiet"])
            .args(["--mix", "search=80,insert=10,delete=10", "--json"])
            .arg(dir.path().join("run.json"))
            .env_remove("AKER_SECRET");
        if with_secret {
            c.arg("--secret-file").arg(&file);
        }
        c.output().unwrap()
    };
    let out = run(false);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{out:?}");
    assert!(stderr.contains("requires authentication"), "{stderr}");

    let out = run(true);
    assert!(out.status.success(), "{out:?}");
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("run.json")).unwrap())
            .unwrap();
    assert_eq!(doc["run"]["errors"], 0, "{}", doc["run"]);
    assert!(doc["run"]["ok"].as_u64().unwrap() > 300, "{}", doc["run"]);

    // The soak too, with the secret from the environment.
    let out = Command::new(env!("CARGO_BIN_EXE_aker-soak"))
        .args(["--target", &target, "--data", "synthetic:2000,32,64,7"])
        .args(["--duration", "2s", "--sample-every", "1s", "--clients", "2"])
        .args(["--rate", "50", "--out"])
        .arg(dir.path().join("soak"))
        .env("AKER_SECRET", SECRET)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    d.stop().unwrap();
}
