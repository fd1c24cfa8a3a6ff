//! akerd follows PostgreSQL's committed changes (`backend.pgvector.changes`): rows
//! deleted, inserted, updated and truncated by plain SQL from another session reach the
//! cache; the visibility race forced; akerd's own writes racing SQL writes; the
//! database restarted and the slot dropped under a running akerd; one akerd per slot;
//! the refusals (wal_level, replica identity). A real PostgreSQL 18 + pgvector with
//! `wal_level = logical`, started by `ops/pg.sh` on 127.0.0.1. Every loop is bounded.

#[path = "akerd_common/mod.rs"]
mod akerd_common;
#[path = "pg_common/mod.rs"]
mod pg_common;

use std::collections::HashSet;
use std::sync::OnceLock;
use std::thread;
use std::time::{Duration, Instant};

use aker::config::{BackendKind, ChangesMode, Config};
use aker::protocol::{HitKind, SearchRequest};
use aker::service::{Daemon, Dataset};
use aker_formats::data;
use akerd_common::{client, ids, query_near, stat, tries, K};
use pg_common::{PgServer, Sql};
use tokio_postgres::types::PgLsn;

const DIM: usize = 8;
/// Longest wait for the stream to apply a position.
const APPLY_WAIT: Duration = Duration::from_secs(10);

/// One server with logical decoding for the tests of this binary.
fn logical() -> Option<&'static PgServer> {
    static SERVER: OnceLock<Option<PgServer>> = OnceLock::new();
    SERVER
        .get_or_init(|| {
            PgServer::start_with(
                "changes",
                "-c wal_level=logical -c max_replication_slots=30 -c max_wal_senders=10",
            )
        })
        .as_ref()
}

fn dataset() -> Dataset {
    data::synthetic(3000, DIM, 16, 11)
}

/// A table of `pg` loaded with `dataset()`, L2.
fn table(pg: &PgServer, name: &str) {
    pg.sql().load(name, &dataset(), "vector_l2_ops");
}

fn config(pg: &PgServer, table: &str, instance: &str) -> Config {
    let mut c = akerd_common::config();
    c.backend.kind = BackendKind::Pgvector;
    c.backend.threads = 4;
    let mut s = pg.section(table);
    s.changes = ChangesMode::Follow;
    s.instance = Some(instance.into());
    s.changes_poll_ms = 10;
    c.backend.pgvector = Some(s);
    c
}

fn wal_now(sql: &Sql) -> u64 {
    let r = sql.query("SELECT pg_current_wal_insert_lsn()", &[]);
    u64::from(r[0].get::<_, PgLsn>(0))
}

fn stats(d: &Daemon) -> String {
    client(d.local_addr()).stats().unwrap()
}

/// Waits until akerd has applied the stream up to `lsn`.
fn wait_applied(d: &Daemon, lsn: u64) {
    let end = Instant::now() + APPLY_WAIT;
    loop {
        let s = stats(d);
        let at = stat(&s, "pg_changes_applied_lsn").unwrap_or(0.0) as u64;
        if at >= lsn {
            return;
        }
        assert!(
            Instant::now() < end,
            "stream not applied to {lsn} within {APPLY_WAIT:?}:\n{s}"
        );
        thread::sleep(Duration::from_millis(5));
    }
}

/// Repeats `q` until it is a hit (admission is asynchronous); bounded.
fn until_hit(c: &mut aker::client::Client, q: &[f32]) -> Vec<u64> {
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        let r = c.search(K, q).unwrap();
        if r.hit != HitKind::Miss {
            return ids(&r);
        }
        assert!(Instant::now() < end, "no hit within 5 s");
        thread::sleep(Duration::from_millis(5));
    }
}

fn queries(ds: &Dataset, n: usize) -> Vec<Vec<f32>> {
    (0..n).map(|i| query_near(ds, i * 71, 0.01)).collect()
}

#[test]
fn rows_deleted_by_sql_are_never_served_once_applied() {
    let Some(pg) = logical() else { return };
    table(pg, "c_delete");
    let d = Daemon::start(&config(pg, "c_delete", "c_delete")).unwrap();
    let mut c = client(d.local_addr());
    let qs = queries(&dataset(), 40);
    let cached: Vec<Vec<u64>> = qs.iter().map(|q| until_hit(&mut c, q)).collect();
    // Each query's nearest row, deleted by another session (one transaction each).
    let sql = pg.sql();
    let mut gone = HashSet::new();
    for ans in &cached {
        if gone.insert(ans[0]) {
            sql.exec(&format!("DELETE FROM c_delete WHERE id = {}", ans[0]));
        }
    }
    wait_applied(&d, wal_now(&sql));
    let mut hits = 0;
    for _ in 0..3 {
        for q in &qs {
            let r = c.search(K, q).unwrap();
            hits += (r.hit != HitKind::Miss) as usize;
            for id in ids(&r) {
                assert!(
                    !gone.contains(&id),
                    "id {id} deleted by SQL, served ({:?})",
                    r.hit
                );
            }
        }
    }
    let s = stats(&d);
    assert_eq!(stat(&s, "pg_changes_up"), Some(1.0), "{s}");
    assert_eq!(
        stat(&s, "pg_changes_deletes"),
        Some(gone.len() as f64),
        "{s}"
    );
    assert!(
        hits > 60,
        "hits still served after the deletes: {hits} of 120"
    );
    d.stop().unwrap();
}

#[test]
fn rows_inserted_and_updated_by_sql_reach_the_next_exact_hit() {
    let Some(pg) = logical() else { return };
    table(pg, "c_upd");
    let d = Daemon::start(&config(pg, "c_upd", "c_upd")).unwrap();
    let mut c = client(d.local_addr());
    let ds = dataset();
    let q = query_near(&ds, 100, 0.01);
    let before = until_hit(&mut c, &q);
    let sql = pg.sql();
    let v = |x: &[f32]| {
        format!(
            "'[{}]'",
            x.iter()
                .map(|f| f.to_string())
                .collect::<Vec<_>>()
                .join(",")
        )
    };
    // A new row right on the query; a row of the answer moved far away; another given a
    // new id; a third changed in another column only.
    let far = vec![1000.0f32; DIM];
    sql.exec(&format!(
        "INSERT INTO c_upd (id, embedding) VALUES (900001, {})",
        v(&q)
    ));
    sql.exec(&format!(
        "UPDATE c_upd SET embedding = {} WHERE id = {}",
        v(&far),
        before[1]
    ));
    sql.exec(&format!(
        "UPDATE c_upd SET id = 900002 WHERE id = {}",
        before[2]
    ));
    sql.exec(&format!(
        "UPDATE c_upd SET payload = '\\x01' WHERE id = {}",
        before[3]
    ));
    wait_applied(&d, wal_now(&sql));
    let after = until_hit(&mut c, &q);
    assert_eq!(after[0], 900001, "the inserted row first: {after:?}");
    assert!(
        !after.contains(&before[1]),
        "the moved row is not near: {after:?}"
    );
    assert!(!after.contains(&before[2]), "the old id is gone: {after:?}");
    assert!(after.contains(&900002), "the new id is there: {after:?}");
    assert!(
        after.contains(&before[3]),
        "a payload update keeps the row: {after:?}"
    );
    let s = stats(&d);
    assert_eq!(stat(&s, "pg_changes_inserts"), Some(1.0), "{s}");
    assert_eq!(stat(&s, "pg_changes_updates"), Some(3.0), "{s}");
    // TRUNCATE: the cache is flushed; the empty table answers nothing.
    sql.exec("TRUNCATE c_upd");
    wait_applied(&d, wal_now(&sql));
    let r = c.search(K, &q).unwrap();
    assert_eq!(r.hit, HitKind::Miss);
    assert!(r.neighbors.is_empty(), "{:?}", ids(&r));
    assert_eq!(stat(&stats(&d), "pg_changes_truncates"), Some(1.0));
    d.stop().unwrap();
}

/// Issue #41 for writes made straight into PostgreSQL, slow path off: a row inserted by
/// SQL 1e-3 from a cached query is first in that query's next exact hit once the stream
/// has applied its commit, in every try, with a second connection searching the other
/// cached queries all along (200 tries; AKER_TEST_TRIES sets another count). A cached
/// twin sits between each query and its inserts, so the fast path merges them there and
/// the query's hit has to find them itself.
#[test]
fn sql_inserts_are_first_in_the_next_exact_hit_once_applied() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let Some(pg) = logical() else { return };
    table(pg, "c_first");
    let mut cfg = config(pg, "c_first", "c_first");
    cfg.cache.risk_threshold = 1e30;
    let d = Daemon::start(&cfg).unwrap();
    let mut c = client(d.local_addr());
    let qs = queries(&dataset(), 40);
    let step = 1e-3 / (DIM as f32).sqrt();
    let exact = |c: &mut aker::client::Client, q: &[f32]| {
        let end = Instant::now() + Duration::from_secs(5);
        while c.search(K, q).unwrap().hit != HitKind::Exact {
            assert!(Instant::now() < end, "no exact hit within 5 s");
            thread::sleep(Duration::from_millis(5));
        }
    };
    for q in &qs {
        exact(&mut c, q);
        let twin: Vec<f32> = q.iter().map(|x| x + 0.9 * step).collect();
        exact(&mut c, &twin);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let background = {
        let (mut other, stop, qs) = (client(d.local_addr()), stop.clone(), qs.clone());
        thread::spawn(move || {
            let mut n = 0usize;
            while !stop.load(Ordering::Relaxed) && n < 1_000_000 {
                other.search(K, &qs[n % qs.len()]).unwrap();
                n += 1;
            }
            n
        })
    };
    let sql = pg.sql();
    let n = tries(200);
    for t in 0..n {
        let q = &qs[(t * 7 % qs.len() as u64) as usize];
        let v: Vec<String> = q.iter().map(|x| (x + step).to_string()).collect();
        let id = 910_000 + t;
        sql.exec(&format!(
            "INSERT INTO c_first (id, embedding) VALUES ({id}, '[{}]')",
            v.join(",")
        ));
        wait_applied(&d, wal_now(&sql));
        let r = c.search(K, q).unwrap();
        assert_eq!(
            (r.hit, r.neighbors[0].id),
            (HitKind::Exact, id),
            "try {t}: {r:?}"
        );
        // Gone again, so that the next try near the same query is the nearest again.
        sql.exec(&format!("DELETE FROM c_first WHERE id = {id}"));
    }
    stop.store(true, Ordering::Relaxed);
    assert!(background.join().unwrap() > 0);
    let s = stats(&d);
    assert_eq!(stat(&s, "pg_changes_inserts"), Some(n as f64), "{s}");
    assert_eq!(stat(&s, "hits_behind"), Some(0.0), "{s}");
    assert!(stat(&s, "hits_with_recent").unwrap() >= 20.0, "{s}");
    d.stop().unwrap();
}

/// A commit decoded before it is visible, forced: with `synchronous_standby_names` set
/// and no standby, a COMMIT with `synchronous_commit = on` is in the WAL (decodable)
/// but waits, invisible to other sessions, until it is cancelled. A miss runs meanwhile
/// and sees the row; once the commit is visible the row must go from the cache.
#[test]
fn a_delete_decoded_before_it_is_visible_is_not_lost_by_a_miss() {
    let Some(pg) = logical() else { return };
    table(pg, "c_race");
    let d = Daemon::start(&config(pg, "c_race", "c_race")).unwrap();
    let mut c = client(d.local_addr());
    // A second akerd, with max_staleness_ms: the stream held behind by the waiting
    // commit sends its searches to the database (the first has no bound, so its miss
    // is admitted: the race under test).
    let mut cfg = config(pg, "c_race", "c_race_s");
    cfg.backend.pgvector.as_mut().unwrap().max_staleness_ms = Some(150);
    let d2 = Daemon::start(&cfg).unwrap();
    let mut c2 = client(d2.local_addr());
    let ds = dataset();
    let q = query_near(&ds, 700, 0.01);
    let cached = query_near(&ds, 1500, 0.01);
    until_hit(&mut c2, &cached);
    let sql = pg.sql();
    let first = sql.knn("c_race", "<->", &q, 1, 100)[0].0;
    // ALTER SYSTEM runs outside a transaction block: one statement each.
    sql.exec("ALTER SYSTEM SET synchronous_standby_names = 'nobody'");
    sql.exec("ALTER SYSTEM SET synchronous_commit = 'local'");
    sql.exec("SELECT pg_reload_conf()");
    thread::sleep(Duration::from_millis(300));
    let url = pg.url();
    let pw = pg.password();
    let deleter = thread::spawn(move || {
        let s = Sql::connect(&url, &pw);
        s.exec("SET synchronous_commit = on");
        let pid: i32 = s.query("SELECT pg_backend_pid()", &[])[0].get(0);
        let h = thread::spawn(move || {
            // Returns once cancelled (committed locally, with a warning).
            let _ = s.run(
                s.client
                    .batch_execute(&format!("DELETE FROM c_race WHERE id = {first}")),
            );
        });
        (pid, h)
    });
    let (pid, waiting) = deleter.join().unwrap();
    // The stream has decoded the commit by now (it polls every 10 ms).
    thread::sleep(Duration::from_millis(300));
    let r = c.search(K, &q).unwrap();
    assert_eq!(r.hit, HitKind::Miss);
    assert!(
        ids(&r).contains(&first),
        "the delete is not visible yet: {:?}",
        ids(&r)
    );
    // The stream waits on the invisible commit, over 150 ms behind: the database answers.
    assert_eq!(c2.search(K, &cached).unwrap().hit, HitKind::Miss);
    assert!(stat(&stats(&d2), "pg_changes_stale_searches").unwrap() >= 1.0);
    thread::sleep(Duration::from_millis(100));
    sql.exec(&format!("SELECT pg_cancel_backend({pid})"));
    waiting.join().unwrap();
    sql.exec("ALTER SYSTEM RESET synchronous_standby_names");
    sql.exec("ALTER SYSTEM RESET synchronous_commit");
    sql.exec("SELECT pg_reload_conf()");
    assert!(sql
        .query(&format!("SELECT 1 FROM c_race WHERE id = {first}"), &[])
        .is_empty());
    wait_applied(&d, wal_now(&sql));
    let end = Instant::now() + Duration::from_secs(2);
    while Instant::now() < end {
        let r = c.search(K, &q).unwrap();
        assert!(
            !ids(&r).contains(&first),
            "deleted id {first} served ({:?})",
            r.hit
        );
    }
    // Caught up: hits again.
    wait_applied(&d2, wal_now(&sql));
    until_hit(&mut c2, &cached);
    d.stop().unwrap();
    d2.stop().unwrap();
}

#[test]
fn akerds_writes_and_sql_writes_to_the_same_ids_end_in_the_tables_state() {
    let Some(pg) = logical() else { return };
    table(pg, "c_mix");
    let d = Daemon::start(&config(pg, "c_mix", "c_mix")).unwrap();
    let addr = d.local_addr();
    let ds = dataset();
    let qs = queries(&ds, 30);
    let mut c = client(addr);
    for q in &qs {
        until_hit(&mut c, q);
    }
    // ids 0..200 toggled by akerd and by SQL at once, each side its own order.
    let akerd = {
        let ds = ds.clone();
        thread::spawn(move || {
            let mut c = client(addr);
            for round in 0..3u64 {
                for id in 0..200u64 {
                    if (id + round) % 2 == 0 {
                        c.delete(id).unwrap();
                    } else {
                        c.insert(id, ds.row(id as usize)).unwrap();
                    }
                }
            }
        })
    };
    let sql = pg.sql();
    for round in 0..3u64 {
        for id in (0..200u64).rev() {
            if (id + round) % 3 == 0 {
                sql.exec(&format!("DELETE FROM c_mix WHERE id = {id}"));
            }
        }
    }
    akerd.join().unwrap();
    wait_applied(&d, wal_now(&sql));
    let live: HashSet<u64> = sql
        .query("SELECT id FROM c_mix WHERE id < 200", &[])
        .iter()
        .map(|r| r.get::<_, i64>(0) as u64)
        .collect();
    for q in &qs {
        for _ in 0..3 {
            for id in ids(&c.search(K, q).unwrap()) {
                assert!(
                    id >= 200 || live.contains(&id),
                    "id {id} served, not in the table"
                );
            }
        }
    }
    d.stop().unwrap();
}

#[test]
fn the_database_restarted_and_the_slot_dropped_under_a_running_akerd() {
    let Some(pg) = PgServer::start_with("changes-restart", "-c wal_level=logical") else {
        return;
    };
    table(&pg, "c_restart");
    let mut cfg = config(&pg, "c_restart", "c_restart");
    cfg.backend.pgvector.as_mut().unwrap().reconnect_max_ms = 100;
    let d = Daemon::start(&cfg).unwrap();
    let mut c = client(d.local_addr());
    let qs = queries(&dataset(), 10);
    let first: Vec<u64> = qs.iter().map(|q| until_hit(&mut c, q)[0]).collect();
    pg.stop();
    pg.restart();
    let sql = pg.sql();
    sql.exec(&format!("DELETE FROM c_restart WHERE id = {}", first[0]));
    wait_applied(&d, wal_now(&sql));
    for q in &qs {
        assert!(!ids(&c.search(K, q).unwrap()).contains(&first[0]));
    }
    assert!(stat(&stats(&d), "pg_changes_reconnects").unwrap() >= 1.0);
    // The slot dropped between two reads: a cold start, counted; the stream goes on.
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        let r = sql.run(
            sql.client
                .execute("SELECT pg_drop_replication_slot('aker_c_restart')", &[]),
        );
        if r.is_ok() {
            break;
        }
        assert!(Instant::now() < end, "slot never free to drop: {r:?}");
        thread::sleep(Duration::from_millis(2));
    }
    let end = Instant::now() + APPLY_WAIT;
    while stat(&stats(&d), "pg_changes_slot_lost") != Some(1.0) {
        assert!(
            Instant::now() < end,
            "the lost slot not seen:\n{}",
            stats(&d)
        );
        thread::sleep(Duration::from_millis(10));
    }
    for q in &qs[1..] {
        until_hit(&mut c, q);
    }
    sql.exec(&format!("DELETE FROM c_restart WHERE id = {}", first[1]));
    wait_applied(&d, wal_now(&sql));
    for q in &qs {
        assert!(!ids(&c.search(K, q).unwrap()).contains(&first[1]));
    }
    assert_eq!(stat(&stats(&d), "pg_changes_up"), Some(1.0));
    d.stop().unwrap();
}

#[test]
fn a_second_akerd_on_the_same_slot_is_refused() {
    let Some(pg) = logical() else { return };
    table(pg, "c_two");
    let cfg = config(pg, "c_two", "c_two");
    let d = Daemon::start(&cfg).unwrap();
    for mode in [ChangesMode::Follow, ChangesMode::Auto] {
        let mut other = cfg.clone();
        other.backend.pgvector.as_mut().unwrap().changes = mode;
        let e = Daemon::start(&other)
            .err()
            .expect("a second akerd on one slot is refused");
        assert!(e.to_string().contains("held by another akerd"), "{e}");
    }
    // Another instance name is another slot.
    let mut other = cfg.clone();
    other.backend.pgvector.as_mut().unwrap().instance = Some("c_two_b".into());
    Daemon::start(&other).unwrap().stop().unwrap();
    d.stop().unwrap();
}

#[test]
fn a_table_without_a_usable_replica_identity_is_refused_and_left_alone() {
    let Some(pg) = logical() else { return };
    let sql = pg.sql();
    table(pg, "c_ident");
    // The primary key on another column: its deletes would carry that key, not the id.
    sql.exec(
        "ALTER TABLE c_ident DROP CONSTRAINT c_ident_pkey; \
         ALTER TABLE c_ident ADD COLUMN k serial PRIMARY KEY; \
         ALTER TABLE c_ident ALTER COLUMN id SET NOT NULL; \
         CREATE UNIQUE INDEX c_ident_id ON c_ident (id)",
    );
    let e = Daemon::start(&config(pg, "c_ident", "c_ident"))
        .err()
        .expect("refused");
    let msg = e.to_string();
    assert!(
        msg.contains("REPLICA IDENTITY USING INDEX c_ident_id"),
        "{msg}"
    );
    // Nothing was made: the application's UPDATE and DELETE still work.
    sql.exec("UPDATE c_ident SET payload = '\\x02' WHERE id = 5; DELETE FROM c_ident WHERE id = 6");
    let pubs = sql.query(
        "SELECT count(*) FROM pg_publication WHERE pubname = 'aker_c_ident'",
        &[],
    );
    assert_eq!(pubs[0].get::<_, i64>(0), 0);
    // auto: starts, does not follow, says so.
    let mut cfg = config(pg, "c_ident", "c_ident");
    cfg.backend.pgvector.as_mut().unwrap().changes = ChangesMode::Auto;
    let d = Daemon::start(&cfg).unwrap();
    assert_eq!(stat(&stats(&d), "pg_changes_up"), Some(0.0));
    d.stop().unwrap();
}

#[test]
fn without_logical_decoding_auto_starts_unfollowing_and_follow_refuses() {
    let Some(pg) = pg_common::shared() else {
        return;
    };
    pg.sql().load("c_replica", &dataset(), "vector_l2_ops");
    let mut cfg = config(pg, "c_replica", "c_replica");
    let e = Daemon::start(&cfg).err().expect("follow refuses");
    assert!(e.to_string().contains("wal_level"), "{e}");
    cfg.backend.pgvector.as_mut().unwrap().changes = ChangesMode::Auto;
    let d = Daemon::start(&cfg).unwrap();
    let s = stats(&d);
    assert_eq!(stat(&s, "pg_changes_up"), Some(0.0), "{s}");
    assert_eq!(stat(&s, "pg_changes_state"), Some(0.0), "{s}");
    d.stop().unwrap();
}

/// A child akerd process (SIGKILL) over `table`, its instance name kept in `dir/data`.
struct Child {
    child: std::process::Child,
    addr: std::net::SocketAddr,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn child_config(
    pg: &PgServer,
    dir: &std::path::Path,
    table: &str,
    port: u16,
) -> std::path::PathBuf {
    let p = dir.join("akerd.toml");
    let text = format!(
        r#"
[server]
listen = "127.0.0.1:{port}"
executors = 1
shutdown_grace_ms = 200
[cache]
capacity_objects = 2000
snapshot_interval_s = 1
[sharding]
rebalance_ms = 0
centroids = 8
[backend]
kind = "pgvector"
threads = 2
data_dir = "data"
[backend.pgvector]
url = "{url}"
password_file = "{pw}"
table = "{table}"
changes = "follow"
changes_poll_ms = 10
start_wait_ms = 0
[admin]
enabled = false
"#,
        url = pg.url(),
        pw = pg.password_file().display(),
    );
    std::fs::write(&p, text).unwrap();
    p
}

impl Child {
    fn start(config: &std::path::Path, port: u16) -> Child {
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_akerd"))
            .arg("--config")
            .arg(config)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let mut c = Child {
            child,
            addr: ([127, 0, 0, 1], port).into(),
        };
        let end = Instant::now() + Duration::from_secs(30);
        loop {
            assert!(
                c.child.try_wait().unwrap().is_none(),
                "akerd exited at start"
            );
            if let Ok(mut cl) = aker::client::Client::connect(c.addr) {
                if cl.hello().is_ok() && cl.ping().is_ok() {
                    return c;
                }
            }
            assert!(Instant::now() < end, "akerd did not answer within 30 s");
            thread::sleep(Duration::from_millis(20));
        }
    }

    fn applied(&self) -> u64 {
        let s = client(self.addr).stats().unwrap();
        stat(&s, "pg_changes_applied_lsn").unwrap_or(0.0) as u64
    }

    fn kill(mut self) {
        let _ = self.child.kill(); // SIGKILL
        let _ = self.child.wait();
    }
}

#[test]
fn akerd_killed_mid_stream_resumes_on_its_slot_and_drop_slot_retires_it() {
    let Some(pg) = logical() else { return };
    table(pg, "c_kill");
    let dir = std::env::temp_dir().join(format!("aker-c-kill-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let port = free_port();
    let config = child_config(pg, &dir, "c_kill", port);
    let a = Child::start(&config, port);
    let qs = queries(&dataset(), 10);
    let mut c = client(a.addr);
    let first: Vec<u64> = qs.iter().map(|q| until_hit(&mut c, q)[0]).collect();
    // A snapshot on the timer (every second): restored after the kill only if the slot
    // was not confirmed past it meanwhile.
    let end = Instant::now() + Duration::from_secs(10);
    while stat(&client(a.addr).stats().unwrap(), "cache_snapshots").unwrap_or(0.0) < 1.0 {
        assert!(Instant::now() < end, "no snapshot within 10 s");
        thread::sleep(Duration::from_millis(20));
    }
    // SQL deletes of the answers' first rows and of others, while akerd is killed and
    // started again.
    let (url, pw) = (pg.url(), pg.password());
    let doomed: Vec<u64> = first.iter().copied().chain(2000..2100).collect();
    let deleter = {
        let doomed = doomed.clone();
        thread::spawn(move || {
            let s = Sql::connect(&url, &pw);
            for id in doomed {
                s.exec(&format!("DELETE FROM c_kill WHERE id = {id}"));
                thread::sleep(Duration::from_millis(5));
            }
        })
    };
    thread::sleep(Duration::from_millis(150));
    a.kill();
    let a = Child::start(&config, port);
    deleter.join().unwrap();
    let sql = pg.sql();
    let at = wal_now(&sql);
    let end = Instant::now() + APPLY_WAIT;
    while a.applied() < at {
        assert!(Instant::now() < end, "not applied after the restart");
        thread::sleep(Duration::from_millis(5));
    }
    let mut c = client(a.addr);
    // Warm only if the slot had not been confirmed past the last snapshot before the
    // kill (docs/PGVECTOR.md, "Warm restart"); correct either way.
    for q in &qs {
        for _ in 0..3 {
            for id in ids(&c.search(K, q).unwrap()) {
                assert!(!doomed.contains(&id), "id {id} deleted by SQL, served");
            }
        }
    }
    // The same instance, the same slot: one, not one per start.
    let instance = std::fs::read_to_string(dir.join("data/instance")).unwrap();
    let slot = format!("aker_{}", instance.trim());
    let n = |q: &str| sql.query(q, &[&slot])[0].get::<_, i64>(0);
    assert_eq!(
        n("SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1"),
        1
    );
    let drop_slot = || {
        std::process::Command::new(env!("CARGO_BIN_EXE_akerd"))
            .arg("--config")
            .arg(&config)
            .arg("--drop-slot")
            .output()
            .unwrap()
    };
    // Not while an akerd runs with the slot.
    let refused = drop_slot();
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("still runs"));
    a.kill();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_akerd"))
        .arg("--config")
        .arg(&config)
        .arg("--drop-slot")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("dropped"));
    assert_eq!(
        n("SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1"),
        0
    );
    assert_eq!(
        n("SELECT count(*) FROM pg_publication WHERE pubname = $1::text"),
        0
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A slot another process holds for a moment longer while it ends (here pg_recvlogical,
/// stopped 0.3 s after akerd took the slot's lock; in production a killed akerd's read
/// of the slot still running) is waited for at start (setup.rs, `wait_slot_inactive`),
/// not taken for another akerd's, which would refuse the start.
#[test]
fn a_slot_held_a_moment_by_an_ending_process_is_waited_for_at_start() {
    let Some(pg) = logical() else { return };
    table(pg, "c_wait");
    let dir = Scratch::new("c-wait");
    let port = free_port();
    let config = child_config(pg, &dir.0, "c_wait", port);
    Child::start(&config, port).kill();
    let instance = std::fs::read_to_string(dir.0.join("data/instance")).unwrap();
    let slot = format!("aker_{}", instance.trim());
    let sql = pg.sql();
    let active = || -> bool {
        sql.query(
            "SELECT coalesce(bool_or(active), false) FROM pg_replication_slots \
             WHERE slot_name = $1",
            &[&slot],
        )[0]
        .get(0)
    };
    let until = |want: bool, what: &str| {
        let end = Instant::now() + Duration::from_secs(10);
        while active() != want {
            assert!(Instant::now() < end, "{what} within 10 s");
            thread::sleep(Duration::from_millis(10));
        }
    };
    until(false, "the killed akerd's slot not released");
    let install = std::process::Command::new("bash")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/ops/pg.sh"))
        .arg("install")
        .output()
        .unwrap();
    assert!(install.status.success());
    let bin = std::path::PathBuf::from(String::from_utf8(install.stdout).unwrap().trim());
    let holder = KillOnDrop(
        std::process::Command::new(bin.join("pg_recvlogical"))
            .args(["-h", "127.0.0.1", "-U", "aker", "-d", "postgres", "--start"])
            .args([
                "-p",
                &pg.port.to_string(),
                "--slot",
                &slot,
                "-f",
                "/dev/null",
            ])
            .args(["-o", "proto_version=1", "-o"])
            .arg(format!("publication_names={slot}"))
            .env("PGPASSWORD", pg.password())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    until(true, "pg_recvlogical did not take the slot");
    // Stopped only once akerd holds the slot's lock (and so is at, or about to be at,
    // the slot itself), 0.3 s later: the start meets the slot in use.
    let stopper = {
        let (url, pw, slot) = (pg.url(), pg.password(), slot.clone());
        thread::spawn(move || {
            let s = Sql::connect(&url, &pw);
            let end = Instant::now() + Duration::from_secs(20);
            while s.query(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted \
                 AND objid = hashtext($1)::oid",
                &[&slot],
            )[0]
            .get::<_, i64>(0)
                == 0
            {
                assert!(Instant::now() < end, "akerd never took the slot's lock");
                thread::sleep(Duration::from_millis(10));
            }
            thread::sleep(Duration::from_millis(300));
            drop(holder);
        })
    };
    let b = Child::start(&config, port); // "akerd exited at start" without the wait
    stopper.join().unwrap();
    sql.exec("DELETE FROM c_wait WHERE id = 5");
    let at = wal_now(&sql);
    let end = Instant::now() + APPLY_WAIT;
    while b.applied() < at {
        assert!(
            Instant::now() < end,
            "the change stream not followed after the wait"
        );
        thread::sleep(Duration::from_millis(5));
    }
    b.kill();
}

/// A child process killed (and reaped) when dropped, a failed test included.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A scratch folder removed on drop.
struct Scratch(std::path::PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let p = std::env::temp_dir().join(format!("aker-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Scratch(p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn a_restart_in_front_of_postgres_is_warm_and_sees_what_changed_while_down() {
    let Some(pg) = logical() else { return };
    table(pg, "c_warm");
    let dir = Scratch::new("c-warm");
    let mut cfg = config(pg, "c_warm", "unused");
    cfg.backend.data_dir = Some(dir.0.join("data"));
    cfg.backend.pgvector.as_mut().unwrap().instance = None;
    let qs = queries(&dataset(), 20);
    let d = Daemon::start(&cfg).unwrap();
    let mut c = client(d.local_addr());
    let cached: Vec<Vec<u64>> = qs.iter().map(|q| until_hit(&mut c, q)).collect();
    d.stop().unwrap(); // the snapshot at shutdown
                       // While akerd is down: the first rows of five answers deleted, a row put right on
                       // a sixth query.
    let sql = pg.sql();
    let gone: HashSet<u64> = cached[..5].iter().map(|a| a[0]).collect();
    for id in &gone {
        sql.exec(&format!("DELETE FROM c_warm WHERE id = {id}"));
    }
    let v: Vec<String> = qs[5].iter().map(|f| f.to_string()).collect();
    sql.exec(&format!(
        "INSERT INTO c_warm (id, embedding) VALUES (800001, '[{}]')",
        v.join(",")
    ));
    let d = Daemon::start(&cfg).unwrap();
    let mut c = client(d.local_addr());
    let s = stats(&d);
    assert!(
        stat(&s, "cache_snapshot_restored_entries").unwrap() >= 15.0,
        "{s}"
    );
    let mut hits = 0;
    for (i, q) in qs.iter().enumerate() {
        let r = c.search(K, q).unwrap();
        hits += (r.hit != HitKind::Miss) as usize;
        for id in ids(&r) {
            assert!(
                !gone.contains(&id),
                "id {id} deleted while akerd was down, served"
            );
        }
        if i == 5 {
            assert_eq!(
                ids(&r)[0],
                800001,
                "the row inserted while down ({:?})",
                r.hit
            );
        }
    }
    assert!(
        hits >= 15,
        "{hits} of 20 first requests after a warm restart hit"
    );
    d.stop().unwrap();
    // A snapshot the slot can no longer replay from (confirmed past it): discarded,
    // the cache starts cold, answers stay right.
    sql.exec("DELETE FROM c_warm WHERE id = 800001");
    let instance = std::fs::read_to_string(dir.0.join("data/instance")).unwrap();
    sql.exec(&format!(
        "SELECT pg_replication_slot_advance('aker_{}', pg_current_wal_insert_lsn())",
        instance.trim()
    ));
    let d = Daemon::start(&cfg).unwrap();
    let s = stats(&d);
    assert_eq!(
        stat(&s, "cache_snapshot_restored_entries"),
        Some(0.0),
        "{s}"
    );
    let mut c = client(d.local_addr());
    assert!(!ids(&c.search(K, &qs[5]).unwrap()).contains(&800001));
    d.stop().unwrap();
}

#[test]
fn a_search_at_the_position_of_a_sql_delete_never_returns_the_id() {
    let Some(pg) = logical() else { return };
    table(pg, "c_ryw");
    let mut cfg = config(pg, "c_ryw", "c_ryw");
    // A slow poll: only the position's wake-up gets the deletes applied in time.
    cfg.backend.pgvector.as_mut().unwrap().changes_poll_ms = 5_000;
    let d = Daemon::start(&cfg).unwrap();
    let mut c = client(d.local_addr());
    let qs = queries(&dataset(), 20);
    let cached: Vec<Vec<u64>> = qs.iter().map(|q| until_hit(&mut c, q)).collect();
    let sql = pg.sql();
    let mut stale = 0;
    for (q, ans) in qs.iter().zip(&cached) {
        sql.exec(&format!("DELETE FROM c_ryw WHERE id = {}", ans[0]));
        let at = wal_now(&sql);
        // Without the position the cached answer may still hold the id for a while.
        stale += ids(&c.search(K, q).unwrap()).contains(&ans[0]) as usize;
        let r = c
            .search_with(SearchRequest {
                at_position: Some(at),
                ..SearchRequest::new(K, q.clone())
            })
            .unwrap();
        assert!(
            !ids(&r).contains(&ans[0]),
            "id {} deleted at {at}, served ({:?})",
            ans[0],
            r.hit
        );
    }
    eprintln!("{stale} of 20 searches without the position still returned the deleted id");
    // Writes through akerd answer their commit's position.
    let at = c.insert_with_position(900_100, &qs[0]).unwrap();
    assert!(at > 0 && at <= wal_now(&sql));
    let s = stats(&d);
    assert_eq!(stat(&s, "searches_at_position"), Some(20.0), "{s}");
    // Mostly answered by the cache once the stream was woken, not by the database
    // fallback (on a loaded machine a read can take over the 100 ms wait now and then).
    let by_database = stat(&s, "searches_position_database").unwrap();
    assert!(
        by_database <= 10.0,
        "{by_database} of 20 fell back to the database\n{s}"
    );
    d.stop().unwrap();
}
