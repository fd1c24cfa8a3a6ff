//! The coordinated-omission self-test: a fixed-rate run against a server process that
//! is stopped with SIGSTOP for 200 ms in the middle. A corrected load generator must
//! report a maximum of at least 200 ms and count every request scheduled during the
//! stall; an uncorrected one (latency from the actual send) sees only the few requests
//! that were already on the wire.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use loadgen::schedule::Arrival;
use loadgen::stats::Summary;
use loadgen::worker::{self, EngineConfig, Mode, StopReason};
use loadgen::workload::{GenParams, Workload};

const DIM: u32 = 8;

/// The fixture server as a child process; killed when dropped.
struct Fixture {
    child: Child,
    addr: SocketAddr,
}

impl Fixture {
    fn spawn() -> Fixture {
        let mut child = Command::new(env!("CARGO_BIN_EXE_aker-loadgen"))
            .args([
                "--test-server",
                "127.0.0.1:0",
                "--test-dim",
                &DIM.to_string(),
            ])
            .args(["--test-lifetime", "60s"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn the fixture server");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .trim()
            .strip_prefix("listening ")
            .unwrap_or_else(|| panic!("unexpected fixture output {line:?}"))
            .parse()
            .unwrap();
        Fixture { child, addr }
    }

    fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {sig} failed");
    }

    /// Whether the process is in the stopped state ('T' in /proc/PID/stat).
    fn stopped(&self) -> bool {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap();
        // The state follows the parenthesised command name.
        let after = &stat[stat.rfind(')').unwrap() + 2..];
        after.starts_with('T')
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn sigstop_stall_is_counted_from_the_intended_time() {
    let fixture = Fixture::spawn();
    let workload = Arc::new(
        Workload::generate(
            DIM as usize,
            GenParams {
                vectors: 1000,
                ..GenParams::default()
            },
        )
        .unwrap(),
    );
    let (rate, secs) = (2000.0, 2.0);
    let cfg = EngineConfig {
        target: fixture.addr,
        mode: Mode::Open {
            rate,
            arrival: Arrival::Fixed,
        },
        connections: 2,
        depth: 4,
        threads: 1,
        warmup: Duration::from_millis(300),
        duration: Duration::from_secs_f64(secs),
        max_requests: None,
        drain: Duration::from_secs(5),
        connect_timeout: Duration::from_secs(5),
        write_timeout: Duration::from_secs(10),
        max_frame_bytes: 1 << 20,
        spin: Duration::ZERO,
        seed: 1,
        secret: None,
        tls: None,
        batch: None,
    };

    // Stop the server about 1 s into the run (0.7 s into the counted part) for 200 ms,
    // timed from when the kernel reports it stopped.
    let stall = Duration::from_millis(200);
    let (result, stopped_for) = thread::scope(|scope| {
        let stopper = scope.spawn(|| {
            thread::sleep(Duration::from_millis(1000));
            fixture.signal("-STOP");
            let t0 = Instant::now();
            while !fixture.stopped() {
                assert!(t0.elapsed() < Duration::from_secs(2), "never stopped");
                thread::yield_now();
            }
            let stopped_at = Instant::now();
            thread::sleep(stall);
            fixture.signal("-CONT");
            stopped_at.elapsed()
        });
        let result = worker::run(&cfg, &workload, |l| eprintln!("{l}")).unwrap();
        (result, stopper.join().unwrap())
    });
    assert!(!fixture.stopped());

    let s = &result.stats;
    let all = Summary::of(&s.all);
    let unc = Summary::of(&s.uncorrected);
    let over_100ms = s.all.count_between(100_000, u64::MAX);
    let unc_over_100ms = s.uncorrected.count_between(100_000, u64::MAX);
    eprintln!(
        "stopped for {stopped_for:?}; corrected: count {} p50 {:.3} ms p99 {:.3} ms max {:.3} ms, \
         {over_100ms} over 100 ms; uncorrected: p99 {:.3} ms max {:.3} ms, {unc_over_100ms} over 100 ms",
        all.count, all.p50_ms, all.p99_ms, all.max_ms, unc.p99_ms, unc.max_ms
    );

    assert_eq!(result.stop, StopReason::Duration);
    assert_eq!(s.total_errors(), 0, "{:?}", s.errors);
    assert!(stopped_for >= stall);
    // The maximum covers the whole stall.
    assert!(all.max_ms >= 200.0, "max {} ms", all.max_ms);
    // No coordinated omission: every request of the schedule was sent and counted,
    // including the ~400 scheduled while the server was stopped.
    let expected = rate * secs;
    assert!(
        (all.count as f64 - expected).abs() <= expected * 0.01,
        "{} replies counted, {expected} scheduled",
        all.count
    );
    // Requests meant for the first 100 ms of the stall waited at least 100 ms each.
    assert!(over_100ms >= 150, "{over_100ms} requests over 100 ms");
    assert!(all.p99_ms >= 100.0, "corrected p99 {} ms", all.p99_ms);
    // Measured from the actual send, only the requests already on the wire (at most
    // connections x depth = 8) look slow: the uncorrected tail hides the stall.
    assert!(
        unc_over_100ms <= 8,
        "{unc_over_100ms} uncorrected over 100 ms"
    );
    assert!(unc.p99_ms < 100.0, "uncorrected p99 {} ms", unc.p99_ms);
}
