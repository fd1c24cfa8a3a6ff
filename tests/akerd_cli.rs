//! The `akerd` binary: a config file, serving, and a clean exit on SIGTERM.

#[path = "akerd_common/mod.rs"]
mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const AKERD: &str = env!("CARGO_BIN_EXE_akerd");

fn temp_config(name: &str, text: &str) -> std::path::PathBuf {
    let p = std::env::temp_dir().join(format!("akerd-test-{}-{name}.toml", std::process::id()));
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn serves_from_a_config_file_and_exits_cleanly_on_sigterm() {
    let cfg = temp_config(
        "serve",
        r#"
        [server]
        listen = "127.0.0.1:0"
        executors = 2
        shutdown_poll_ms = 10
        [cache]
        capacity_objects = 1000
        prefault_bytes = 33554432
        [backend]
        index = "exact"
        data = { kind = "synthetic", n = 2000, dim = 8, clusters = 8, seed = 1 }
        [admin]
        listen = "127.0.0.1:0"
        "#,
    );
    let mut child = Command::new(AKERD)
        .arg("--config")
        .arg(&cfg)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The log says where it listens (port 0 in the config).
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let (prefault_tx, prefault_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains("cache.prefault_bytes") {
                let _ = prefault_tx.send(line.clone());
            }
            if line.contains("akerd listening") {
                let addr = line
                    .split_whitespace()
                    .find_map(|w| w.strip_prefix("addr="))
                    .map(str::to_string);
                let _ = tx.send(addr);
            }
        }
    });
    let addr = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("akerd logs its address")
        .expect("addr= in the line");
    // The memory was faulted in before the server started.
    let prefault = prefault_rx
        .try_recv()
        .expect("akerd logs its prefault first");
    assert!(prefault.contains("bytes=33554432"), "{prefault}");
    let mut c = common::client(addr.parse().unwrap());
    let q = vec![0.5f32; 8];
    assert_eq!(c.search(5, &q).unwrap().neighbors.len(), 5);
    assert_eq!(c.server_info().unwrap().executors, 2);

    let pid = child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let status = common::exit_within(&mut child, Duration::from_secs(20));
    assert!(status.success(), "{status:?}");
    let _ = std::fs::remove_file(cfg);
}

#[test]
fn print_config_and_bad_configs() {
    let out = Command::new(AKERD)
        .args([
            "--print-config",
            "--executors",
            "3",
            "--admin-listen",
            "off",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let cfg = aker::config::Config::from_toml(&text).unwrap();
    assert_eq!(cfg.server.executors, 3);
    assert!(!cfg.admin.enabled);

    let err = refused_config("bad", "[cache]\nno_such_key = 1\n");
    assert!(err.contains("no_such_key"), "{err}");

    // More memory to fault in than any machine has: refused before anything starts.
    let err = refused_config(
        "prefault",
        "[cache]\nprefault_bytes = 1152921504606846976\n",
    );
    assert!(
        err.contains("prefault_bytes") && err.contains("memory"),
        "{err}"
    );
}

/// A key's old name (issue #39: bounds spelled `*_max`) loads with one deprecation line
/// and prints under its new name; both names at once, or an unknown key, are refused.
#[test]
fn old_key_names_load_with_a_deprecation_line() {
    let path = temp_config("old-keys", "[server]\nmax_inflight = 7\n");
    let out = Command::new(AKERD)
        .arg("--config")
        .arg(&path)
        .arg("--print-config")
        .output()
        .unwrap();
    let _ = std::fs::remove_file(path);
    let (printed, log) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{log}");
    assert!(
        printed.contains("inflight_max = 7") && !printed.contains("max_inflight"),
        "{printed}"
    );
    assert_eq!(log.matches("deprecated").count(), 1, "{log}");
    assert!(log.contains("server.max_inflight"), "{log}");
    let err = refused_config(
        "both-keys",
        "[server]\nmax_inflight = 7\ninflight_max = 8\n",
    );
    assert!(
        err.contains("both") && err.contains("inflight_max"),
        "{err}"
    );
    let err = refused_config("unknown-key", "[server]\nmax_inflights = 7\n");
    assert!(
        err.contains("unknown field") && err.contains("line 2"),
        "{err}"
    );
}

/// Starts akerd on a config of `text`, which it must refuse (exit 2); its stderr.
fn refused_config(name: &str, text: &str) -> String {
    let path = temp_config(name, text);
    let out = Command::new(AKERD)
        .arg("--config")
        .arg(&path)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(path);
    assert_eq!(out.status.code(), Some(2), "{text}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Protected mode at start, and the secret kept out of `--print-config` and the log.
#[test]
fn protected_mode_and_the_secret_at_start() {
    // A public address without a secret: refused before anything is bound or loaded.
    let err = refused_config("public", "[server]\nlisten = \"0.0.0.0:7797\"\n");
    assert!(err.contains("protected mode"), "{err}");
    // A secret file that is missing, or too short: refused, its content not shown.
    let missing = std::env::temp_dir().join(format!("akerd-test-{}-nosecret", std::process::id()));
    let err = refused_config(
        "missing-secret",
        &format!("[auth]\nsecret_file = \"{}\"\n", missing.display()),
    );
    assert!(err.contains("cannot read the secret file"), "{err}");
    let short = std::env::temp_dir().join(format!("akerd-test-{}-short", std::process::id()));
    std::fs::write(&short, "hunter2\n").unwrap();
    let err = refused_config(
        "short-secret",
        &format!("[auth]\nsecret_file = \"{}\"\n", short.display()),
    );
    assert!(
        err.contains("at least 16") && !err.contains("hunter2"),
        "{err}"
    );
    let _ = std::fs::remove_file(&short);

    let secret = "correct-horse-battery-staple-42";
    let file = std::env::temp_dir().join(format!("akerd-test-{}-secret", std::process::id()));
    std::fs::write(&file, format!("{secret}\n")).unwrap();
    let cfg = temp_config(
        "auth",
        &format!(
            r#"
            [server]
            listen = "127.0.0.1:0"
            shutdown_poll_ms = 10
            [backend]
            index = "exact"
            data = {{ kind = "synthetic", n = 500, dim = 4, clusters = 4, seed = 1 }}
            [admin]
            enabled = false
            [auth]
            secret_file = "{}"
            "#,
            file.display()
        ),
    );
    let out = Command::new(AKERD)
        .arg("--config")
        .arg(&cfg)
        .arg("--print-config")
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && printed.contains("secret_file"),
        "{printed}"
    );
    assert!(!printed.contains(secret), "{printed}");
    // Started with everything logged: the secret is not in the log.
    let mut child = Command::new(AKERD)
        .arg("--config")
        .arg(&cfg)
        .env("RUST_LOG", "trace")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut log = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let ready = line.contains("akerd listening");
            log.push_str(&line);
            log.push('\n');
            if ready {
                let _ = tx.send(log.clone());
            }
        }
        let _ = tx.send(log);
    });
    let log = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("akerd starts");
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let end = Instant::now() + Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    assert!(log.contains("authentication=true"), "{log}");
    assert!(!log.contains(secret), "the secret is in the log:\n{log}");
    let _ = std::fs::remove_file(&file);
    let _ = std::fs::remove_file(&cfg);
}

/// `THP_enabled` of a started akerd's /proc status, for `[cache]` lines `cache`.
fn thp_enabled_with(name: &str, cache: &str, env: Option<(&str, &str)>) -> String {
    let cfg = temp_config(
        name,
        &format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nexecutors = 1\nshutdown_poll_ms = 10\n\
             [cache]\n{cache}\n[backend]\nindex = \"exact\"\n\
             data = {{ kind = \"synthetic\", n = 500, dim = 8, clusters = 4, seed = 1 }}\n\
             [admin]\nenabled = false\n"
        ),
    );
    let mut cmd = Command::new(AKERD);
    cmd.arg("--config")
        .arg(&cfg)
        .env("RUST_LOG", "info")
        .env_remove("MIMALLOC_ALLOW_THP")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Some((k, v)) = env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains("ready") {
                let _ = tx.send(());
            }
        }
    });
    let ready = rx.recv_timeout(Duration::from_secs(60));
    let status = std::fs::read_to_string(format!("/proc/{}/status", child.id()));
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_file(cfg);
    ready.expect("akerd says ready");
    let status = status.expect("/proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("THP_enabled:"))
        .map(|v| v.trim().to_string())
        .expect("THP_enabled in /proc status (Linux 5.0 and later)")
}

/// `cache.huge_pages`: "auto" turns transparent huge pages off for a small pool (their
/// rounding would be most of akerd's memory) and keeps them for a big one; "on" / "off"
/// decide; `MIMALLOC_ALLOW_THP` in the environment overrides all three.
#[test]
fn huge_pages_follow_the_pool_budget() {
    let small = "capacity_objects = 1000";
    assert_eq!(thp_enabled_with("thp-small", small, None), "0");
    assert_eq!(
        thp_enabled_with("thp-big", "capacity_bytes = 268435456", None),
        "1"
    );
    assert_eq!(
        thp_enabled_with("thp-on", &format!("{small}\nhuge_pages = \"on\""), None),
        "1"
    );
    assert_eq!(
        thp_enabled_with(
            "thp-off",
            "capacity_bytes = 268435456\nhuge_pages = \"off\"",
            None
        ),
        "0"
    );
    assert_eq!(
        thp_enabled_with("thp-env", small, Some(("MIMALLOC_ALLOW_THP", "1"))),
        "1"
    );
}

/// A shared object that makes io_uring_setup(2) fail with EPERM, as a container runtime's
/// default seccomp profile does (the rest of syscall(2) passes through).
const NO_URING: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
long syscall(long n, ...) {
    static long (*real)(long, ...) = 0;
    if (!real) real = (long (*)(long, ...))dlsym(RTLD_NEXT, "syscall");
    if (n == 425) { errno = EPERM; return -1; }
    va_list ap; va_start(ap, n);
    long a = va_arg(ap, long), b = va_arg(ap, long), c = va_arg(ap, long),
         d = va_arg(ap, long), e = va_arg(ap, long), f = va_arg(ap, long);
    va_end(ap);
    return real(n, a, b, c, d, e, f);
}
"#;

#[test]
fn io_uring_refused_is_said_in_one_line() {
    let dir = std::env::temp_dir().join(format!("akerd-nouring-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("nouring.c");
    let lib = dir.join("nouring.so");
    std::fs::write(&src, NO_URING).unwrap();
    let built = Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&lib)
        .arg(&src)
        .arg("-ldl")
        .status()
        .expect("a C compiler (cc)");
    assert!(built.success());
    let cfg = temp_config(
        "nouring",
        "[server]\nlisten = \"127.0.0.1:0\"\n[backend]\ndata = { kind = \"synthetic\", n = 100, dim = 4, clusters = 2, seed = 1 }\n",
    );
    let cfg = cfg.to_str().unwrap().to_string();
    for args in [vec!["--demo"], vec!["--config", cfg.as_str()]] {
        let mut child = Command::new(AKERD)
            .args(&args)
            .env("LD_PRELOAD", &lib)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let status = common::exit_within(&mut child, Duration::from_secs(20));
        let mut err = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
        assert_eq!(status.code(), Some(3), "{args:?}: {err}");
        assert!(
            err.contains("io_uring is needed") && err.contains("seccomp"),
            "{err}"
        );
        assert!(!err.contains("panicked"), "no executor panic: {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_small_locked_memory_limit_is_said_in_one_line() {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(AKERD);
    cmd.arg("--demo")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: setrlimit is async-signal-safe; the child only lowers its own limit.
    unsafe {
        cmd.pre_exec(|| {
            let lim = libc::rlimit {
                rlim_cur: 64 << 10,
                rlim_max: 64 << 10,
            };
            if libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    let status = common::exit_within(&mut child, Duration::from_secs(20));
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(3), "{err}");
    assert!(
        err.contains("locked-memory limit is 64 KiB") && err.contains("LimitMEMLOCK"),
        "{err}"
    );
}
