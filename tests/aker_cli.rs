//! The `aker-cli` binary against a real akerd on 127.0.0.1 (started in-process, as the
//! other `akerd_*` tests do): every command, its output, and its errors (exit 1, a
//! message, never a panic). Every run of the binary is bounded in time.

#[path = "akerd_common/mod.rs"]
mod common;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use aker::cli::stats::Stats;
use aker::config::Config;
use aker::protocol::HitKind;

const CLI: &str = env!("CARGO_BIN_EXE_aker-cli");
/// No run of the binary may take longer.
const RUN_LIMIT: Duration = Duration::from_secs(30);
const SECRET: &str = "a shared secret of some length";

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Out {
    /// Exit 0, nothing on stderr.
    fn ok(self) -> String {
        assert_eq!(
            self.code, 0,
            "stdout:\n{}\nstderr:\n{}",
            self.stdout, self.stderr
        );
        assert!(self.stderr.is_empty(), "{}", self.stderr);
        self.stdout
    }

    /// Exit 1 with one `aker-cli: ...` line on stderr; the line.
    fn failed(self) -> String {
        assert_eq!(
            self.code, 1,
            "stdout:\n{}\nstderr:\n{}",
            self.stdout, self.stderr
        );
        assert!(!self.stderr.contains("panicked"), "{}", self.stderr);
        assert!(self.stderr.starts_with("aker-cli: "), "{}", self.stderr);
        assert_eq!(self.stderr.lines().count(), 1, "{}", self.stderr);
        assert!(self.stdout.is_empty(), "output on failure: {}", self.stdout);
        self.stderr
    }
}

/// Runs `aker-cli args...` with `env` (and no `$AKER_SECRET` of the caller's); killed and
/// failed past [`RUN_LIMIT`].
fn run_env(args: &[&str], env: &[(&str, &str)]) -> Out {
    let mut cmd = Command::new(CLI);
    cmd.args(args)
        .env_remove("AKER_SECRET")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("aker-cli starts");
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            r.read_to_string(&mut s).expect("utf-8 output");
            s
        })
    };
    let stdout = drain(Box::new(child.stdout.take().unwrap()));
    let stderr = drain(Box::new(child.stderr.take().unwrap()));
    let end = Instant::now() + RUN_LIMIT;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > end {
            let _ = child.kill();
            let _ = child.wait();
            panic!("aker-cli {args:?} ran past {RUN_LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Out {
        code: status.code().expect("exited, not killed by a signal"),
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
    }
}

fn run(args: &[&str]) -> Out {
    run_env(args, &[])
}

/// `aker-cli --target ADDR args...`.
fn at(d: &aker::service::Daemon, args: &[&str]) -> Out {
    let target = d.local_addr().to_string();
    let mut all = vec!["--target", target.as_str()];
    all.extend_from_slice(args);
    run(&all)
}

fn literal(v: &[f32]) -> String {
    v.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// A search's output: its hit kind and the (id, distance) lines.
fn parse_search(out: &str) -> (String, Vec<(u64, f32)>) {
    let mut lines = out.lines();
    let first = lines.next().expect("a first line");
    let hit = first
        .strip_prefix("hit ")
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("{out}"))
        .to_string();
    assert!(lines.next().unwrap().contains("distance"), "{out}");
    let rows = lines
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(f.len(), 3, "{l}");
            (f[1].parse().unwrap(), f[2].parse().unwrap())
        })
        .collect();
    (hit, rows)
}

fn temp_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("aker-cli-test-{}-{name}", std::process::id()))
}

/// A version 1.0 `.npy` file of float32 rows, C order, written by hand.
fn write_npy(path: &Path, dim: usize, rows: &[&[f32]]) {
    let mut header = format!(
        "{{'descr': '<f4', 'fortran_order': False, 'shape': ({}, {dim}), }}",
        rows.len()
    );
    // magic (6) + version (2) + length (2) + header, padded with spaces to 64, then '\n'.
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
    bytes.extend_from_slice(header.as_bytes());
    for row in rows {
        assert_eq!(row.len(), dim);
        for x in *row {
            bytes.extend_from_slice(&x.to_le_bytes());
        }
    }
    std::fs::write(path, bytes).unwrap();
}

fn config_with_auth(name: &str) -> (Config, PathBuf) {
    let f = temp_path(&format!("secret-{name}"));
    std::fs::write(&f, format!("{SECRET}\n")).unwrap();
    let mut c = common::config();
    c.auth.secret_file = Some(f.clone());
    (c, f)
}

#[test]
fn ping_prints_the_round_trip_time() {
    let d = common::start(&common::config());
    let out = at(&d, &["ping"]).ok();
    // PONG 127.0.0.1:PORT 0.081 ms
    let f: Vec<&str> = out.split_whitespace().collect();
    assert_eq!(f.len(), 4, "{out}");
    assert_eq!(f[0], "PONG");
    assert_eq!(f[1], d.local_addr().to_string());
    assert!(f[2].parse::<f64>().unwrap() > 0.0, "{out}");
    assert_eq!(f[3], "ms");
}

#[test]
fn stats_table_and_json_agree_with_the_daemon() {
    let d = common::start(&common::config());
    let ds = common::dataset();
    let mut c = common::client(d.local_addr());
    let q = common::query_near(&ds, 7, 0.01);
    c.search(common::K, &q).unwrap();
    common::search_until(&mut c, &q, HitKind::Exact);

    let table = at(&d, &["stats"]).ok();
    for heading in [
        "requests",
        "cache lookups",
        "hit ratio",
        "latency (us)",
        "search exact",
        "search miss",
        "search approximate",
        "pool",
        "recall floor",
        "floor 0.950   estimate",
        "connections",
    ] {
        assert!(table.contains(heading), "no '{heading}' in\n{table}");
    }
    let line = |label: &str| {
        table
            .lines()
            .find(|l| l.trim_start().starts_with(label))
            .unwrap_or_else(|| panic!("no {label} line in\n{table}"))
            .split_whitespace()
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    let misses: u64 = line("miss")[1].parse().unwrap();
    let exact: u64 = line("exact")[1].parse().unwrap();
    assert!(misses >= 1 && exact >= 1, "{table}");
    assert_eq!(
        line("search exact").len(),
        6,
        "label, count, p50, p99, max:\n{table}"
    );

    // --json: one object, every stat of the raw reply, numbers as numbers.
    let json = at(&d, &["stats", "--json"]).ok();
    let v: serde_json::Value = serde_json::from_str(&json).expect("valid JSON");
    let obj = v.as_object().expect("an object");
    let raw = Stats::parse(&at(&d, &["stats", "--raw"]).ok());
    assert!(raw.entries.len() > 50, "{raw:?}");
    let only_raw: Vec<&String> = raw
        .entries
        .iter()
        .map(|(n, _)| n)
        .filter(|n| !obj.contains_key(*n))
        .collect();
    assert_eq!(
        obj.len(),
        raw.entries.len(),
        "only in the raw reply: {only_raw:?}"
    );
    for (name, value) in &raw.entries {
        let n = obj.get(name).unwrap_or_else(|| panic!("{name} missing"));
        assert!(n.is_number(), "{name}: {n}");
        assert_eq!(value.parse::<f64>().is_ok(), n.as_f64().is_some(), "{name}");
    }
    // Nothing searches between the table, the JSON and the raw reply.
    for name in ["hits_exact", "misses", "lookups", "store_rows", "executors"] {
        assert_eq!(
            obj[name].as_u64(),
            raw.get(name).map(|v| v as u64),
            "{name}"
        );
    }
    assert_eq!(obj["hits_exact"].as_u64(), Some(exact));
    assert_eq!(obj["misses"].as_u64(), Some(misses));
    // A number (a whole one, 46, reads as an integer: not `is_f64`).
    assert!(obj["latency_search_exact_p99_us"].is_number(), "{json}");
    assert_eq!(obj["recall_floor"].as_f64(), Some(0.95));
}

#[test]
fn json_of_awkward_values_is_valid() {
    let s = Stats::parse(
        "big 18446744073709551615\nneg -3\nzero 0\nhalf 0.5\nnan NaN\ninf inf\n\
         tiny 1e-7\nword some\"text\\\nlead 007\n",
    );
    let v: serde_json::Value = serde_json::from_str(&s.to_json()).unwrap();
    assert_eq!(v["big"].as_u64(), Some(u64::MAX));
    assert_eq!(v["neg"].as_i64(), Some(-3));
    assert_eq!(v["zero"].as_u64(), Some(0));
    assert_eq!(v["half"].as_f64(), Some(0.5));
    assert!(v["nan"].is_null() && v["inf"].is_null());
    assert_eq!(v["tiny"].as_f64(), Some(1e-7));
    assert_eq!(v["word"].as_str(), Some("some\"text\\"));
    assert_eq!(v["lead"].as_f64(), Some(7.0));
    assert_eq!(Stats::parse("").to_json(), "{}\n");
}

#[test]
fn search_with_a_literal_vector_shows_ids_distances_and_the_hit_kind() {
    let d = common::start(&common::config());
    let ds = common::dataset();
    let q = common::query_near(&ds, 42, 0.01);
    let want = common::exact_ids(&ds, &q, common::K as usize);
    let v = literal(&q);
    let k = common::K.to_string();
    let args = ["search", "--vector", v.as_str(), "-k", k.as_str()];

    let (hit, rows) = parse_search(&at(&d, &args).ok());
    assert_eq!(hit, "miss");
    assert_eq!(rows.iter().map(|r| r.0).collect::<Vec<_>>(), want);
    assert!(rows.windows(2).all(|w| w[0].1 <= w[1].1), "{rows:?}");

    // Admitted asynchronously by the shard's owner: bounded retries.
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let (hit, again) = parse_search(&at(&d, &args).ok());
        if hit == "exact" {
            assert_eq!(again, rows);
            break;
        }
        assert!(Instant::now() < end, "no exact hit within 10 s ({hit})");
        std::thread::sleep(Duration::from_millis(20));
    }
    // --bypass: the backend's answer even though the query is cached.
    let mut bypass = args.to_vec();
    bypass.push("--bypass");
    let (hit, again) = parse_search(&at(&d, &bypass).ok());
    assert_eq!((hit.as_str(), again), ("miss", rows));
    let mut c = common::client(d.local_addr());
    let s = c.stats().unwrap();
    assert_eq!(common::stat(&s, "searches_bypass"), Some(1.0), "{s}");
}

#[test]
fn search_from_an_npy_row() {
    let d = common::start(&common::config());
    let ds = common::dataset();
    let rows: Vec<Vec<f32>> = (0..3)
        .map(|i| common::query_near(&ds, 100 * i + 5, 0.02))
        .collect();
    let refs: Vec<&[f32]> = rows.iter().map(|r| r.as_slice()).collect();
    let f = temp_path("queries.npy");
    write_npy(&f, common::DIM, &refs);
    let path = f.to_str().unwrap();

    for row in [0usize, 2] {
        let r = row.to_string();
        let out = at(&d, &["search", "--npy", path, "--row", &r, "-k", "4"]).ok();
        let (hit, got) = parse_search(&out);
        assert_eq!(hit, "miss", "{out}");
        let ids: Vec<u64> = got.iter().map(|g| g.0).collect();
        assert_eq!(ids, common::exact_ids(&ds, &rows[row], 4), "row {row}");
    }
    // A row past the end, a file that is not .npy: exit 1, said plainly.
    let e = at(&d, &["search", "--npy", path, "--row", "3"]).failed();
    assert!(e.contains("has 3 rows"), "{e}");
    let junk = temp_path("junk.npy");
    std::fs::write(&junk, b"not an array").unwrap();
    let e = at(&d, &["search", "--npy", junk.to_str().unwrap()]).failed();
    assert!(e.contains("not a .npy file"), "{e}");
    let _ = std::fs::remove_file(f);
    let _ = std::fs::remove_file(junk);
}

#[test]
fn flush_drops_the_cached_entries() {
    let d = common::start(&common::config());
    let ds = common::dataset();
    let mut c = common::client(d.local_addr());
    let q = common::query_near(&ds, 9, 0.01);
    c.search(common::K, &q).unwrap();
    common::search_until(&mut c, &q, HitKind::Exact);

    let out = at(&d, &["flush"]).ok();
    assert!(out.starts_with("OK"), "{out}");
    assert_eq!(c.search(common::K, &q).unwrap().hit, HitKind::Miss);
}

#[test]
fn watch_prints_count_lines_and_stops() {
    let mut cfg = common::config();
    cfg.cache.recall_floor = 0.9;
    let d = common::start(&cfg);
    let addr = d.local_addr();
    // Searches while it watches, until it is done (bounded: 30 s).
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = {
        let done = done.clone();
        std::thread::spawn(move || {
            let ds = common::dataset();
            let mut c = common::client(addr);
            let end = Instant::now() + RUN_LIMIT;
            let mut i = 0;
            while !done.load(std::sync::atomic::Ordering::Relaxed) && Instant::now() < end {
                c.search(common::K, &common::query_near(&ds, i % 20, 0.01))
                    .unwrap();
                i += 1;
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };
    let t = Instant::now();
    let out = at(&d, &["watch", "--interval-ms", "200", "--count", "2"]).ok();
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    load.join().unwrap();
    assert!(
        t.elapsed() >= Duration::from_millis(400),
        "{:?}",
        t.elapsed()
    );

    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "a header and 2 lines:\n{out}");
    assert!(
        lines[0].contains("req/s") && lines[0].contains("recall"),
        "{out}"
    );
    let fields = |l: &str| l.split_whitespace().map(str::to_string).collect::<Vec<_>>();
    let header = fields(lines[0]);
    let mut rates = Vec::new();
    for l in &lines[1..] {
        let f = fields(l);
        // secs, req/s, 4 ratios, |, 4 p99s, |, recall
        assert_eq!(f.len(), 13, "{l} (header {header:?})");
        rates.push(f[1].parse::<f64>().unwrap());
        let recall: f64 = f[12].parse().unwrap();
        assert!((0.0..=1.0).contains(&recall), "{l}");
    }
    assert!(rates.iter().any(|&r| r > 0.0), "{out}");
}

#[test]
fn a_vector_of_the_wrong_dimension_is_refused() {
    let d = common::start(&common::config());
    let e = at(&d, &["search", "--vector", "0.1,0.2,0.3"]).failed();
    assert!(e.contains("wrong dimension"), "{e}");
    assert!(
        e.contains("3 components") && e.contains("dimension 8"),
        "{e}"
    );
}

#[test]
fn a_bad_vector_or_k_is_refused_before_anything_is_sent() {
    let d = common::start(&common::config());
    for (v, want) in [
        ("0.1,abc", "component 2 'abc' is not a number"),
        ("0.1,,0.3", "component 2 '' is not a number"),
        ("0.1,NaN", "is not finite"),
        ("inf", "is not finite"),
    ] {
        let e = at(&d, &["search", "--vector", v]).failed();
        assert!(e.contains(want), "{v}: {e}");
    }
    let v = literal(&[0.5; common::DIM]);
    let e = at(&d, &["search", "--vector", &v, "-k", "0"]).failed();
    assert!(e.contains("allows 1..=32"), "{e}");
    // Negative components are values, not options.
    let v = literal(&[-0.5; common::DIM]);
    at(&d, &["search", "--vector", &v]).ok();
}

#[test]
fn connection_refused_is_said_plainly() {
    // A port nothing listens on: bound, then closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let target = format!("127.0.0.1:{port}");
    for cmd in ["ping", "stats", "flush"] {
        let e = run(&["--target", &target, cmd]).failed();
        assert!(
            e.contains("cannot connect to") && e.contains("refused"),
            "{e}"
        );
    }
    // No port: refused before any lookup.
    let e = run(&["--target", "127.0.0.1", "ping"]).failed();
    assert!(e.contains("cannot connect to 127.0.0.1:"), "{e}");
}

#[test]
fn with_auth_a_wrong_or_missing_secret_fails_and_the_right_one_works() {
    let (cfg, secret_file) = config_with_auth("auth");
    let d = common::start(&cfg);
    let target = d.local_addr().to_string();
    let t = target.as_str();

    let wrong = temp_path("wrong-secret");
    std::fs::write(&wrong, "not the secret, though long enough\n").unwrap();
    let e = run(&[
        "--target",
        t,
        "--secret-file",
        wrong.to_str().unwrap(),
        "stats",
    ])
    .failed();
    assert!(e.contains("authentication failed"), "{e}");
    let e = run_env(
        &["--target", t, "ping"],
        &[("AKER_SECRET", "also wrong, also long")],
    )
    .failed();
    assert!(e.contains("authentication failed"), "{e}");

    let e = run(&["--target", t, "stats"]).failed();
    assert!(
        e.contains("requires authentication") && e.contains("--secret-file"),
        "{e}"
    );
    let e = run_env(&["--target", t, "ping"], &[("AKER_SECRET", "short")]).failed();
    assert!(e.contains("$AKER_SECRET") && !e.contains("short"), "{e}");

    let good = secret_file.to_str().unwrap();
    let out = run(&["--target", t, "--secret-file", good, "stats", "--json"]).ok();
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(v["server_auth_failures"].as_u64().unwrap() >= 2, "{out}");
    let out = run_env(&["--target", t, "ping"], &[("AKER_SECRET", SECRET)]).ok();
    assert!(out.starts_with("PONG"), "{out}");

    // A secret against an akerd without [auth]: refused by the client, said so.
    let open = common::start(&common::config());
    let e = run(&[
        "--target",
        &open.local_addr().to_string(),
        "--secret-file",
        good,
        "ping",
    ])
    .failed();
    assert!(e.contains("does not prove it knows the secret"), "{e}");
    for f in [secret_file, wrong] {
        let _ = std::fs::remove_file(f);
    }
}

#[test]
fn parse_vector_reads_what_operators_type() {
    use aker::cli::parse_vector;
    assert_eq!(parse_vector("0.1, 0.2 ,-3").unwrap(), vec![0.1, 0.2, -3.0]);
    assert_eq!(parse_vector("1e-3").unwrap(), vec![1e-3]);
    assert!(parse_vector("").is_err());
    assert!(parse_vector("1,2,").is_err());
}

#[test]
fn parse_position_reads_numbers_and_pg_lsns() {
    use aker::cli::{parse_position, position_text};
    assert_eq!(parse_position("16/B374D848"), Ok(0x16_B374_D848));
    assert_eq!(parse_position("16/b374d848"), Ok(0x16_B374_D848));
    assert_eq!(parse_position(" 0/0 "), Ok(0));
    assert_eq!(parse_position("96939890760"), Ok(96_939_890_760));
    assert_eq!(parse_position("FFFFFFFF/FFFFFFFF"), Ok(u64::MAX));
    for bad in [
        "",
        "/",
        "1/",
        "/1",
        "x/1",
        "1/2/3",
        "123456789/0",
        "-1",
        "0x10",
        "1.5",
    ] {
        assert!(parse_position(bad).is_err(), "{bad}");
    }
    for p in [0, 1, 0x16_B374_D848, u64::MAX] {
        assert_eq!(parse_position(&position_text(p)), Ok(p));
    }
}

/// `insert` and `delete` print the write's position (0/0 with the embedded store: the
/// cache has every acknowledged write); `search --at-position` takes one in either form.
#[test]
fn insert_and_delete_print_the_position_and_search_takes_one() {
    let d = common::start(&common::config());
    let v = literal(&[0.123; common::DIM]);
    let out = at(&d, &["insert", "--id", "900001", "--vector", &v]).ok();
    assert!(out.starts_with("OK: id 900001 inserted "), "{out}");
    assert!(out.contains("position 0/0"), "{out}");
    for at_position in ["16/B374D848", "12345"] {
        let args = [
            "search",
            "--vector",
            v.as_str(),
            "-k",
            "1",
            "--at-position",
            at_position,
        ];
        let (_, rows) = parse_search(&at(&d, &args).ok());
        assert_eq!(rows.first().map(|r| r.0), Some(900001));
    }
    let out = at(&d, &["delete", "--id", "900001"]).ok();
    assert!(out.starts_with("OK: id 900001 deleted "), "{out}");
    assert!(out.contains("position 0/0"), "{out}");
    let out = at(&d, &["delete", "--id", "900001"]).ok();
    assert!(out.starts_with("OK: id 900001 was not there "), "{out}");
    let args = ["search", "--vector", &v, "-k", "1", "--at-position", "0/1"];
    let (_, rows) = parse_search(&at(&d, &args).ok());
    assert!(rows.iter().all(|r| r.0 != 900001), "{rows:?}");
    let mut c = common::client(d.local_addr());
    let s = c.stats().unwrap();
    assert_eq!(common::stat(&s, "searches_at_position"), Some(3.0), "{s}");
    // The embedded store has no change stream to wait for.
    assert_eq!(
        common::stat(&s, "searches_position_waited"),
        Some(0.0),
        "{s}"
    );
    assert_eq!(
        common::stat(&s, "searches_position_database"),
        Some(0.0),
        "{s}"
    );
    // A position that is not one: clap's usage error (exit 2), nothing sent.
    let bad = at(&d, &["search", "--vector", &v, "--at-position", "16/"]);
    assert_eq!(bad.code, 2, "{}", bad.stderr);
    assert!(bad.stderr.contains("not a position"), "{}", bad.stderr);
    // A vector of the wrong dimension is refused before the INSERT.
    let e = at(&d, &["insert", "--id", "1", "--vector", "1,2"]).failed();
    assert!(e.contains("wrong dimension"), "{e}");
}
