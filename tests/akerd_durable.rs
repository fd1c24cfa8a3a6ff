//! The durable embedded store (`backend.data_dir`) against a real akerd process killed
//! with SIGKILL mid-write: every acknowledged insert is there after the restart, every
//! acknowledged delete is gone and never served, and the store's row count matches the
//! acknowledged writes up to those in flight at the kill. Corrupt files are detected.
//! With `index = "hnsw"` a restart loads the checkpoint's graph (`store_graph_loaded`)
//! and answers as before; a corrupt graph is caught and rebuilt from the rows.

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aker::client::{Client, ClientOptions};
use aker::protocol::SearchRequest;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const DIM: usize = 8;
/// The imported collection: ids 0..ROWS.
const ROWS: u64 = 2_000;
const WRITERS: u64 = 3;

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("aker-durable-it-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A config for a child akerd: exact store over a small synthetic set, durable in
/// `dir/data`, checkpoints every 2 KiB of log (~30 writes: kills land in checkpoints too).
fn write_config(dir: &Path, port: u16) -> PathBuf {
    write_config_with(dir, port, "exact", None)
}

/// `write_config` with `index` ("exact" or "hnsw"; a wide HNSW search, near exact on
/// 2,000 rows) and the admin endpoint on `admin` (off when `None`).
fn write_config_with(dir: &Path, port: u16, index: &str, admin: Option<u16>) -> PathBuf {
    let admin = match admin {
        Some(a) => format!("enabled = true\nlisten = \"127.0.0.1:{a}\""),
        None => "enabled = false".into(),
    };
    let p = dir.join("akerd.toml");
    let text = format!(
        r#"
[server]
listen = "127.0.0.1:{port}"
executors = 1
shutdown_grace_ms = 200
[cache]
capacity_objects = 2000
recall_floor = 0.0
[sharding]
rebalance_ms = 0
centroids = 8
[backend]
index = "{index}"
hnsw_ef_search = 400
data = {{ kind = "synthetic", n = {ROWS}, dim = {DIM}, clusters = 8, seed = 3 }}
data_dir = "data"
checkpoint_log_bytes = 2048
[admin]
{admin}
"#
    );
    std::fs::write(&p, text).unwrap();
    p
}

struct Akerd {
    child: Child,
    addr: SocketAddr,
}

impl Akerd {
    /// Starts akerd and waits (bounded) until it answers PING; `None` if it exited.
    fn start(config: &Path, port: u16) -> Result<Akerd, String> {
        let child = Command::new(env!("CARGO_BIN_EXE_akerd"))
            .arg("--config")
            .arg(config)
            // Snapshots pause 30 ms before their rename, checkpoints 80 ms (one runs at
            // a time, and a slow machine logs few writes): kills land inside them often.
            .env("AKER_TEST_SNAPSHOT_HOLD_MS", "30")
            .env("AKER_TEST_CHECKPOINT_HOLD_MS", "80")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| e.to_string())?;
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let mut a = Akerd { child, addr };
        let end = Instant::now() + Duration::from_secs(30);
        while Instant::now() < end {
            if let Some(status) = a.child.try_wait().map_err(|e| e.to_string())? {
                let mut err = String::new();
                use std::io::Read;
                if let Some(mut e) = a.child.stderr.take() {
                    let _ = e.read_to_string(&mut err);
                }
                return Err(format!("akerd exited ({status}): {err}"));
            }
            if let Ok(mut c) = Client::connect(a.addr) {
                if c.hello().is_ok() && c.ping().is_ok() {
                    return Ok(a);
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = a.child.kill();
        Err("akerd did not answer within 30 s".into())
    }

    fn client(&self) -> Client {
        let mut c = Client::connect_with(
            self.addr,
            ClientOptions {
                io_timeout: Some(Duration::from_secs(5)),
                ..Default::default()
            },
        )
        .unwrap();
        c.hello().unwrap();
        c
    }

    fn kill(mut self) {
        let _ = self.child.kill(); // SIGKILL
        let _ = self.child.wait();
    }
}

/// What the writers were told: acknowledged inserts (id -> vector) and deletes.
#[derive(Default)]
struct Acked {
    live: HashMap<u64, Vec<f32>>,
    deleted: HashMap<u64, Vec<f32>>,
    /// Writes sent and not answered when the process died (at most one per writer):
    /// (id, vector, is a delete). Either outcome is allowed; the restart tells which.
    in_flight: Vec<(u64, Vec<f32>, bool)>,
}

fn vector(rng: &mut StdRng) -> Vec<f32> {
    (0..DIM).map(|_| rng.gen::<f32>() * 10.0 - 5.0).collect()
}

/// One writer until the server dies: inserts new ids, deletes some it inserted.
fn writer(addr: SocketAddr, w: u64, round: u64, acked: Arc<Mutex<Acked>>, stop: Arc<AtomicBool>) {
    let mut rng = StdRng::seed_from_u64(round * 100 + w);
    let Ok(mut c) = Client::connect_with(
        addr,
        ClientOptions {
            io_timeout: Some(Duration::from_secs(5)),
            ..Default::default()
        },
    ) else {
        return;
    };
    if c.hello().is_err() {
        return;
    }
    let mut mine: Vec<u64> = Vec::new();
    for i in 0..100_000u64 {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let delete = !mine.is_empty() && rng.gen_bool(0.3);
        if delete {
            let id = mine.swap_remove(rng.gen_range(0..mine.len()));
            let ok = c.delete(id).is_ok();
            let mut a = acked.lock().unwrap();
            let v = a.live.remove(&id).expect("deleted what was acknowledged");
            if !ok {
                a.in_flight.push((id, v, true));
                return;
            }
            a.deleted.insert(id, v);
        } else {
            let id = 1_000_000 * (round + 1) + 10_000 * w + i;
            let v = vector(&mut rng);
            let ok = c.insert(id, &v).is_ok();
            let mut a = acked.lock().unwrap();
            if !ok {
                a.in_flight.push((id, v, false));
                return;
            }
            a.live.insert(id, v);
            mine.push(id);
        }
    }
}

/// The store's nearest id to `v`, asked past the cache.
fn nearest(c: &mut Client, v: &[f32]) -> (u64, f32) {
    let r = c
        .search_with(SearchRequest {
            k: 1,
            vector: v.to_vec(),
            bypass_cache: true,
            ..Default::default()
        })
        .unwrap();
    (r.neighbors[0].id, r.neighbors[0].distance)
}

fn stat(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter_map(|l| l.split_once(' '))
        .find(|(n, _)| *n == name)
        .and_then(|(_, v)| v.trim().parse().ok())
}

/// `POST /snapshot` on the admin endpoint: whether a snapshot was written.
fn post_snapshot(admin: SocketAddr) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect_timeout(&admin, Duration::from_secs(2)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    if s.write_all(b"POST /snapshot HTTP/1.1\r\nContent-Length: 0\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut reply = String::new();
    let _ = s.read_to_string(&mut reply);
    reply.starts_with("HTTP/1.1 200")
}

/// Searches the writers' vectors through the cache until `stop`, so the snapshots hold
/// entries that list ids deleted later.
fn searcher(addr: SocketAddr, acked: Arc<Mutex<Acked>>, stop: Arc<AtomicBool>) {
    let Ok(mut c) = Client::connect(addr) else {
        return;
    };
    if c.hello().is_err() {
        return;
    }
    for i in 0..100_000usize {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let v = {
            let a = acked.lock().unwrap();
            a.live
                .values()
                .chain(a.deleted.values())
                .nth(i % 64)
                .cloned()
        };
        let v = v.unwrap_or_else(|| vec![0.5; DIM]);
        if c.search(10, &v).is_err() {
            return;
        }
    }
}

/// Asks for snapshots back to back until `stop` (or the server dies); how many were written.
fn snapshotter(admin: SocketAddr, stop: Arc<AtomicBool>) -> u64 {
    let mut written = 0;
    for _ in 0..100_000 {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        if post_snapshot(admin) {
            written += 1;
        } else {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    written
}

/// After a restart: the writes in flight at the kill are settled by what the store
/// holds, then every acknowledged one is checked.
fn check(a: &Akerd, acked: &mut Acked, round: u64) {
    let mut c = a.client();
    for (id, v, was_delete) in std::mem::take(&mut acked.in_flight) {
        let there = nearest(&mut c, &v) == (id, 0.0);
        match (there, was_delete) {
            (true, _) => {
                acked.live.insert(id, v);
            }
            (false, true) => {
                acked.deleted.insert(id, v);
            }
            (false, false) => {}
        }
    }
    for (id, v) in &acked.live {
        assert_eq!(
            nearest(&mut c, v),
            (*id, 0.0),
            "round {round}: acknowledged insert {id} lost"
        );
    }
    for (id, v) in &acked.deleted {
        assert_ne!(
            nearest(&mut c, v).0,
            *id,
            "round {round}: acknowledged delete {id} back"
        );
        let served = c.search(10, v).unwrap();
        for n in &served.neighbors {
            assert!(
                !acked.deleted.contains_key(&n.id),
                "round {round}: deleted {} served ({:?})",
                n.id,
                served.hit
            );
        }
    }
    let rows = stat(&c.stats().unwrap(), "store_rows").unwrap() as u64;
    assert_eq!(
        rows,
        ROWS + acked.live.len() as u64,
        "round {round}: rows against acknowledged inserts"
    );
}

#[test]
fn acknowledged_writes_survive_sigkill_at_random_points() {
    let dir = scratch("crash");
    let (port, admin_port) = (free_port(), free_port());
    let config = write_config_with(&dir, port, "exact", Some(admin_port));
    let admin: SocketAddr = ([127, 0, 0, 1], admin_port).into();
    let acked = Arc::new(Mutex::new(Acked::default()));
    let mut rng = StdRng::seed_from_u64(99);
    // At least 20 kills, and more (up to 40) until one lands while a snapshot is written.
    let (rounds_min, rounds_max) = (20, 40);
    let (mut checkpoints, mut snapshots, mut restored) = (0.0, 0, 0.0);
    let (mut mid_snapshot, mut mid_checkpoint) = (0, 0);
    let mut round = 0;
    while round < rounds_min || ((mid_snapshot == 0 || mid_checkpoint == 0) && round < rounds_max) {
        let a = Akerd::start(&config, port).unwrap_or_else(|e| panic!("round {round}: {e}"));
        check(&a, &mut acked.lock().unwrap(), round);
        let s = a.client().stats().unwrap();
        restored += stat(&s, "cache_snapshot_restored_entries").unwrap_or(0.0);
        let stop = Arc::new(AtomicBool::new(false));
        let writers: Vec<_> = (0..WRITERS)
            .map(|w| {
                let (acked, stop, addr) = (acked.clone(), stop.clone(), a.addr);
                std::thread::spawn(move || writer(addr, w, round, acked, stop))
            })
            .collect();
        let search = {
            let (acked, stop, addr) = (acked.clone(), stop.clone(), a.addr);
            std::thread::spawn(move || searcher(addr, acked, stop))
        };
        let snap = {
            let stop = stop.clone();
            std::thread::spawn(move || snapshotter(admin, stop))
        };
        std::thread::sleep(Duration::from_millis(rng.gen_range(30..400)));
        if let Ok(mut c) = Client::connect(a.addr) {
            if c.hello().is_ok() {
                let s = c.stats().unwrap_or_default();
                checkpoints += stat(&s, "store_checkpoints").unwrap_or(0.0);
            }
        }
        a.kill();
        stop.store(true, Ordering::Relaxed);
        for w in writers {
            w.join().unwrap();
        }
        search.join().unwrap();
        snapshots += snap.join().unwrap();
        // The snapshot's temporary file left behind: the kill landed while one was written.
        mid_snapshot += usize::from(dir.join("data/cache.snapshot.tmp").exists());
        mid_checkpoint += usize::from(dir.join("data/checkpoint.tmp").exists());
        round += 1;
    }
    let a = Akerd::start(&config, port).unwrap();
    let mut g = acked.lock().unwrap();
    check(&a, &mut g, round);
    eprintln!(
        "{round} kills, {mid_snapshot} during a snapshot, {mid_checkpoint} during a \
         checkpoint; {snapshots} snapshots written, {restored} entries restored over the \
         restarts"
    );
    assert!(
        mid_snapshot > 0,
        "no kill landed during a snapshot in {round} rounds"
    );
    assert!(
        mid_checkpoint > 0,
        "no kill landed during a checkpoint in {round} rounds"
    );
    assert!(
        snapshots > 0 && restored > 0.0,
        "snapshots {snapshots}, restored {restored}"
    );
    assert!(
        g.live.len() + g.deleted.len() > 200,
        "the writers wrote: {} live, {} deleted",
        g.live.len(),
        g.deleted.len()
    );
    // Checkpoints that ran: those written before a round's kill, and those it cut.
    assert!(
        checkpoints + mid_checkpoint as f64 >= 5.0,
        "checkpoints ran while the writers wrote: {checkpoints} written, {mid_checkpoint} cut"
    );
    a.kill();
}

#[test]
fn a_corrupt_checkpoint_refuses_the_start_and_a_torn_log_tail_is_cut() {
    let dir = scratch("corrupt");
    let port = free_port();
    let config = write_config(&dir, port);
    let a = Akerd::start(&config, port).unwrap();
    let mut c = a.client();
    c.insert(777_777, &[1.0; DIM]).unwrap();
    c.insert(777_778, &[2.0; DIM]).unwrap();
    a.kill();
    // The last log record torn in half: the first insert survives, the start goes on.
    let data = dir.join("data");
    let log = std::fs::read_dir(&data)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .max()
        .unwrap();
    let bytes = std::fs::read(&log).unwrap();
    std::fs::write(&log, &bytes[..bytes.len() - 7]).unwrap();
    let a = Akerd::start(&config, port).unwrap();
    let mut c = a.client();
    assert_eq!(nearest(&mut c, &[1.0; DIM]).0, 777_777);
    assert_ne!(
        nearest(&mut c, &[2.0; DIM]).0,
        777_778,
        "torn: never acknowledged as far as the disk knows"
    );
    a.kill();
    // Every checkpoint flipped: nothing safe remains, akerd refuses to start and says why.
    for e in std::fs::read_dir(&data).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|e| e == "ckpt") {
            let mut b = std::fs::read(&p).unwrap();
            let at = b.len() - 9;
            b[at] ^= 0x20;
            std::fs::write(&p, &b).unwrap();
        }
    }
    let e = Akerd::start(&config, port).err().expect("refused");
    assert!(e.contains("checksum"), "{e}");
}

/// Sends SIGTERM and waits (bounded) for the exit: akerd writes its snapshot first.
fn terminate(mut a: Akerd) -> String {
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(a.child.id() as i32, libc::SIGTERM) };
    let end = Instant::now() + Duration::from_secs(30);
    while a.child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < end, "akerd did not exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    }
    stderr_of(&mut a)
}

fn stderr_of(a: &mut Akerd) -> String {
    use std::io::Read;
    let mut err = String::new();
    if let Some(mut e) = a.child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    err
}

#[test]
fn a_restart_is_warm_and_never_serves_a_delete_made_after_the_snapshot() {
    let dir = scratch("warm");
    let (port, admin_port) = (free_port(), free_port());
    let config = write_config_with(&dir, port, "exact", Some(admin_port));
    let admin: SocketAddr = ([127, 0, 0, 1], admin_port).into();
    let snapshot = dir.join("data/cache.snapshot");
    let mut rng = StdRng::seed_from_u64(5);
    let queries: Vec<Vec<f32>> = (0..50).map(|_| vector(&mut rng)).collect();
    let a = Akerd::start(&config, port).unwrap();
    let mut c = a.client();
    let answers: Vec<_> = queries.iter().map(|q| c.search(10, q).unwrap()).collect();
    let entries = stat(&c.stats().unwrap(), "representatives").unwrap();
    assert!(entries >= 40.0, "{entries} entries");
    drop(c);
    // SIGTERM: the snapshot is written on the way out; the restart serves from it.
    let _ = terminate(a);
    assert!(snapshot.exists());
    let a = Akerd::start(&config, port).unwrap();
    let mut c = a.client();
    let s = c.stats().unwrap();
    assert_eq!(stat(&s, "cache_snapshot_restored_entries"), Some(entries));
    for (q, before) in queries.iter().zip(&answers) {
        let r = c.search(10, q).unwrap();
        assert_ne!(
            r.hit,
            aker::protocol::HitKind::Miss,
            "a cached query missed"
        );
        assert_eq!(r.neighbors, before.neighbors);
    }
    // A snapshot, then a delete of a cached id, then SIGKILL: the delete is in the log
    // only, and replayed into the restored cache before the first reply.
    assert!(post_snapshot(admin));
    let gone = answers[0].neighbors[0].id;
    assert!(c.delete(gone).unwrap());
    drop(c);
    a.kill();
    let a = Akerd::start(&config, port).unwrap();
    let mut c = a.client();
    assert!(stat(&c.stats().unwrap(), "cache_snapshot_restored_entries").unwrap() > 0.0);
    for q in &queries {
        let r = c.search(10, q).unwrap();
        assert!(
            r.neighbors.iter().all(|n| n.id != gone),
            "deleted {gone} served"
        );
    }
    // FLUSH removes the snapshot: a restart must not bring back what was flushed.
    c.flush().unwrap();
    assert!(!snapshot.exists(), "FLUSH left the snapshot");
    drop(c);
    a.kill();
    let a = Akerd::start(&config, port).unwrap();
    let mut c = a.client();
    assert_eq!(
        stat(&c.stats().unwrap(), "cache_snapshot_restored_entries"),
        Some(0.0)
    );
    for q in &queries {
        c.search(10, q).unwrap();
    }
    drop(c);
    let _ = terminate(a);
    // A flipped byte: refused with the reason, and the cache starts cold.
    let mut b = std::fs::read(&snapshot).unwrap();
    let at = b.len() - 11;
    b[at] ^= 0x04;
    std::fs::write(&snapshot, &b).unwrap();
    let mut a = Akerd::start(&config, port).unwrap();
    let mut c = a.client();
    assert_eq!(
        stat(&c.stats().unwrap(), "cache_snapshot_restored_entries"),
        Some(0.0)
    );
    assert!(c.search(10, &queries[1]).is_ok());
    drop(c);
    let _ = a.child.kill();
    let _ = a.child.wait();
    let err = stderr_of(&mut a);
    assert!(
        err.contains("cache snapshot refused") && err.contains("checksum"),
        "{err}"
    );
}

/// The store's 10 nearest ids to a fixed set of queries, asked past the cache.
fn answers(c: &mut Client) -> Vec<Vec<u64>> {
    let mut rng = StdRng::seed_from_u64(5);
    (0..40)
        .map(|_| {
            let r = c
                .search_with(SearchRequest {
                    k: 10,
                    vector: vector(&mut rng),
                    bypass_cache: true,
                    ..Default::default()
                })
                .unwrap();
            r.neighbors.iter().map(|n| n.id).collect()
        })
        .collect()
}

fn graph_loaded(c: &mut Client) -> f64 {
    stat(&c.stats().unwrap(), "store_graph_loaded").expect("store_graph_loaded")
}

fn graph_files(data: &Path, name: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(data)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .map(|p| p.join(name))
        .collect();
    v.sort();
    v
}

/// Of `a`'s ids, the share `b` has too, query by query.
fn overlap(a: &[Vec<u64>], b: &[Vec<u64>]) -> f64 {
    let same: usize = a
        .iter()
        .zip(b)
        .map(|(x, y)| x.iter().filter(|id| y.contains(id)).count())
        .sum();
    same as f64 / a.iter().map(Vec::len).sum::<usize>() as f64
}

/// Starts akerd, checks whether it loaded its graph, and returns its answers.
fn start_and_answer(config: &Path, port: u16, loaded: f64) -> Vec<Vec<u64>> {
    let a = Akerd::start(config, port).unwrap();
    let mut c = a.client();
    assert_eq!(graph_loaded(&mut c), loaded, "store_graph_loaded");
    let got = answers(&mut c);
    a.kill();
    got
}

#[test]
fn an_hnsw_store_restarted_loads_its_graph_and_answers_the_same() {
    let dir = scratch("hnsw");
    let port = free_port();
    let config = write_config_with(&dir, port, "hnsw", None);
    // First start: imported, built, its graph saved at once; writes (and checkpoints
    // with their graphs) after.
    let a = Akerd::start(&config, port).unwrap();
    let mut c = a.client();
    assert_eq!(graph_loaded(&mut c), 0.0);
    let mut rng = StdRng::seed_from_u64(8);
    for i in 0..300u64 {
        c.insert(500_000 + i, &vector(&mut rng)).unwrap();
        if i % 3 == 0 {
            c.delete(i * 5).unwrap();
        }
        if i % 7 == 0 {
            c.insert(i * 5 + 1, &vector(&mut rng)).unwrap();
        }
    }
    let before = answers(&mut c);
    let rows = stat(&c.stats().unwrap(), "store_rows").unwrap();
    assert!(stat(&c.stats().unwrap(), "store_checkpoints").unwrap() >= 1.0);
    a.kill();
    // Second start: the newest checkpoint's graph loaded and the log after it inserted
    // (those points get other layers than the first time: answers may differ a little).
    let a = Akerd::start(&config, port).unwrap();
    let mut c = a.client();
    assert_eq!(graph_loaded(&mut c), 1.0);
    assert_eq!(stat(&c.stats().unwrap(), "store_rows").unwrap(), rows);
    let loaded = answers(&mut c);
    a.kill();
    let o = overlap(&before, &loaded);
    assert!(
        o >= 0.9,
        "answers before and after the restart: {o:.3} in common"
    );
    // Third start: the graph the second one saved (it replayed the log), no log after
    // it: exactly the same answers.
    assert_eq!(start_and_answer(&config, port, 1.0), loaded);
    // Every saved graph flipped: caught by its checksum, the store rebuilt from the
    // rows; that start saves its graph, and the next one loads it, answering the same.
    for p in graph_files(&dir.join("data"), "graph.hnsw.graph") {
        let mut b = std::fs::read(&p).unwrap();
        let at = b.len() / 2;
        b[at] ^= 0x40;
        std::fs::write(&p, &b).unwrap();
    }
    let rebuilt = start_and_answer(&config, port, 0.0);
    // Another graph over the same rows (hnsw_rs's parallel build is not deterministic,
    // and tombstones cut into a search's candidates): close, not equal (0.89-0.95 seen).
    let o = overlap(&before, &rebuilt);
    assert!(
        o >= 0.8,
        "answers before and after a rebuild: {o:.3} in common"
    );
    assert_eq!(start_and_answer(&config, port, 1.0), rebuilt);
    // Another m in the config: the saved graph does not fit, it is rebuilt (and saved).
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        text.replace("hnsw_ef_search = 400", "hnsw_ef_search = 400\nhnsw_m = 8"),
    )
    .unwrap();
    let other_m = start_and_answer(&config, port, 0.0);
    assert_eq!(start_and_answer(&config, port, 1.0), other_m);
}

#[test]
fn an_insert_after_the_snapshot_reaches_the_restored_entry_and_a_refused_snapshot_goes() {
    let dir = scratch("warm-insert");
    let (port, admin_port) = (free_port(), free_port());
    let config = write_config_with(&dir, port, "exact", Some(admin_port));
    let admin: SocketAddr = ([127, 0, 0, 1], admin_port).into();
    let snapshot = dir.join("data/cache.snapshot");
    let q: Vec<f32> = vec![0.25; DIM];
    let a = Akerd::start(&config, port).unwrap();
    let mut c = a.client();
    c.search(10, &q).unwrap();
    assert!(post_snapshot(admin));
    // After the snapshot: a vector at the cached query itself. The restart replays it
    // through the refresh path, so the restored entry's next hit lists it first.
    c.insert(424_242, &q).unwrap();
    drop(c);
    a.kill();
    let a = Akerd::start(&config, port).unwrap();
    let mut c = a.client();
    let r = c.search(10, &q).unwrap();
    assert_ne!(
        r.hit,
        aker::protocol::HitKind::Miss,
        "the restored entry answers"
    );
    assert_eq!(r.neighbors[0].id, 424_242, "{:?}", r.neighbors);
    c.insert(515_151, &[3.0; DIM]).unwrap();
    c.search(10, &[3.0; DIM]).unwrap();
    drop(c);
    // SIGTERM: a snapshot that reflects the last insert. Its log record then cut as a
    // torn tail: the snapshot reflects a write the log lost, so it is refused and
    // removed, and a later write reusing that seq must not revive it.
    let _ = terminate(a);
    let log = std::fs::read_dir(dir.join("data"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .max()
        .unwrap();
    let bytes = std::fs::read(&log).unwrap();
    std::fs::write(&log, &bytes[..bytes.len() - 5]).unwrap();
    let mut a = Akerd::start(&config, port).unwrap();
    assert!(!snapshot.exists(), "the refused snapshot was removed");
    let mut c = a.client();
    c.insert(616_161, &[4.0; DIM]).unwrap(); // takes the cut record's seq
    drop(c);
    let _ = a.child.kill();
    let _ = a.child.wait();
    let err = stderr_of(&mut a);
    assert!(err.contains("refused and removed"), "{err}");
    let a = Akerd::start(&config, port).unwrap();
    let mut c = a.client();
    let r = c.search(10, &[3.0; DIM]).unwrap();
    assert!(
        r.neighbors.iter().all(|n| n.id != 515_151),
        "an insert the log lost is served: {r:?}"
    );
    a.kill();
}
