//! The `aker-loadgen` binary end to end against the in-process fixture server: outputs
//! (table, JSON, .hgrm, PNG), a sweep, closed loop, trace replay with --bypass, and
//! refusals.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use aker::server::Running;
use aker_formats::trace::{Op, Trace};
use serde_json::Value;
use shards::Metric;

const DIM: u32 = 4;

struct Fixture(Option<Running>);

impl Fixture {
    fn start() -> Fixture {
        let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
        Fixture(Some(
            loadgen::testserver::start(addr, DIM, Duration::ZERO, 128).unwrap(),
        ))
    }
    fn addr(&self) -> String {
        self.0.as_ref().unwrap().local_addr().to_string()
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if let Some(r) = self.0.take() {
            let _ = r.stop();
        }
    }
}

fn loadgen(target: &str, args: &[&str]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_aker-loadgen"))
        .args(["--target", target, "--connections", "2", "--threads", "1"])
        .args(args)
        .output()
        .unwrap();
    eprintln!("{}", String::from_utf8_lossy(&out.stdout));
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    out
}

fn json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn is_png(path: &Path) -> bool {
    std::fs::read(path).is_ok_and(|b| b.starts_with(b"\x89PNG\r\n\x1a\n"))
}

#[test]
fn run_writes_table_json_hgrm_and_png() {
    let f = Fixture::start();
    let dir = tempfile::tempdir().unwrap();
    let (j, png) = (dir.path().join("r.json"), dir.path().join("r.png"));
    let prefix = dir.path().join("r").to_string_lossy().into_owned();
    let out = loadgen(
        &f.addr(),
        &[
            "--rate",
            "500",
            "--arrival",
            "fixed",
            "--warmup",
            "200ms",
            "--duration",
            "1s",
            "--mix",
            "search=80,insert=10,delete=10",
            "--vectors",
            "200",
            "--json",
            j.to_str().unwrap(),
            "--hgrm",
            &prefix,
            "--png",
            png.to_str().unwrap(),
        ],
    );
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "operation",
        "SEARCH",
        "  exact",
        "INSERT",
        "DELETE",
        "all",
        "hit ratio",
        "uncorrected",
        "(warm-up)",
    ] {
        assert!(stdout.contains(needle), "missing {needle:?}");
    }
    let v = json(&j);
    let run = &v["run"];
    assert_eq!(run["mode"], "open");
    assert_eq!(run["ok"], 500);
    assert_eq!(run["errors"], 0);
    assert_eq!(run["stop"], "duration");
    assert_eq!(v["server"]["dim"], DIM);
    let ops: Vec<&str> = run["ops"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["op"].as_str().unwrap())
        .collect();
    assert_eq!(ops, ["SEARCH", "INSERT", "DELETE"]);
    assert!(run["latency"]["p9999_ms"].as_f64().unwrap() > 0.0);
    assert!(run["hits"]
        .as_array()
        .unwrap()
        .iter()
        .any(|h| h["kind"] == "exact"));
    assert!(run["intervals"].as_array().unwrap().len() >= 2);
    for f in [
        "all",
        "search",
        "insert",
        "delete",
        "search-exact",
        "uncorrected",
    ] {
        let text = std::fs::read_to_string(format!("{prefix}.{f}.hgrm")).unwrap();
        assert!(text.contains("Value     Percentile TotalCount"), "{f}");
        assert!(text.contains("#[Max     ="), "{f}");
    }
    assert!(is_png(&png));
}

#[test]
fn sweep_finds_the_highest_rate_under_the_bound() {
    let f = Fixture::start();
    let dir = tempfile::tempdir().unwrap();
    let (j, png) = (dir.path().join("s.json"), dir.path().join("s.png"));
    let out = loadgen(
        &f.addr(),
        &[
            "--sweep",
            "200:600:200",
            "--p99",
            "1s",
            "--warmup",
            "100ms",
            "--duration",
            "500ms",
            "--sweep-pause",
            "0s",
            "--quiet",
            "--flush",
            "--json",
            j.to_str().unwrap(),
            "--png",
            png.to_str().unwrap(),
        ],
    );
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("highest rate with p99 <= 1.000s: 600 req/s"),
        "{stdout}"
    );
    let v = json(&j);
    assert_eq!(v["sweep"]["best_rate"], 600.0);
    let steps = v["sweep"]["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 3);
    assert!(steps.iter().all(|s| s["pass"] == true));
    assert!(is_png(&png));

    // An impossible bound: the first step fails and the sweep stops there.
    let out = loadgen(
        &f.addr(),
        &[
            "--sweep",
            "200:600:200",
            "--p99",
            "1us",
            "--warmup",
            "0s",
            "--duration",
            "300ms",
            "--quiet",
        ],
    );
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("FAIL"), "{stdout}");
    assert!(stdout.contains("no rate kept p99"), "{stdout}");
    assert_eq!(
        stdout.lines().filter(|l| l.starts_with("step ")).count(),
        1,
        "{stdout}"
    );
}

#[test]
fn closed_loop_reports_throughput() {
    let f = Fixture::start();
    let dir = tempfile::tempdir().unwrap();
    let j = dir.path().join("c.json");
    let out = loadgen(
        &f.addr(),
        &[
            "--closed",
            "--depth",
            "4",
            "--warmup",
            "100ms",
            "--duration",
            "500ms",
            "--quiet",
            "--json",
            j.to_str().unwrap(),
        ],
    );
    assert!(out.status.success());
    let run = &json(&j)["run"];
    assert_eq!(run["mode"], "closed");
    assert!(run["throughput"].as_f64().unwrap() > 100.0, "{run}");
    assert_eq!(run["errors"], 0);
}

fn write_trace(path: &Path, dim: usize) {
    Trace {
        dim,
        metric: Metric::L2Sq,
        k: 2,
        vectors: vec![0.5; dim],
        ops: vec![Op::Search { vector: 0, k: 2 }; 100],
        ground_truth: Some(vec![vec![1, 7]]),
    }
    .save(path)
    .unwrap();
}

#[test]
fn trace_replay_with_and_without_the_cache() {
    let f = Fixture::start();
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.trace");
    write_trace(&trace, DIM as usize);
    let t = trace.to_str().unwrap();
    for bypass in [false, true] {
        let j = dir.path().join(format!("t{bypass}.json"));
        let mut args = vec![
            "--trace",
            t,
            "--rate",
            "1000",
            "--warmup",
            "0s",
            "--json",
            j.to_str().unwrap(),
        ];
        if bypass {
            args.push("--bypass");
        }
        let out = loadgen(&f.addr(), &args);
        assert!(out.status.success());
        let run = &json(&j)["run"];
        assert_eq!(run["ok"], 100);
        assert_eq!(run["stop"], "trace_end");
        // The fixture answers ids 0 and 1; the truth is {1, 7}.
        assert_eq!(run["recall"], 0.5);
        assert_eq!(run["hit_ratio"], if bypass { 0.0 } else { 1.0 });
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains("recall        0.5000"), "{stdout}");
        assert_eq!(stdout.contains("cache bypassed"), bypass);
    }
}

#[test]
fn refuses_a_trace_of_another_dimension_and_a_dead_target() {
    let f = Fixture::start();
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("wrong.trace");
    write_trace(&trace, DIM as usize + 1);
    let out = loadgen(&f.addr(), &["--trace", trace.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("dimension"));

    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = closed.local_addr().unwrap().to_string();
    drop(closed);
    let out = loadgen(&addr, &["--duration", "1s"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot connect"));
}
