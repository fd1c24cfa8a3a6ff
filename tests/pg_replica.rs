//! Misses to a read replica (`backend.pgvector.replica_urls`): answered there once the
//! replica has replayed what the cache holds, the same answers as the primary's; a
//! replica held behind (replay paused) never answers, so rows deleted on the primary
//! and applied by the change stream are never served, and it answers again once
//! resumed, also under a database default of REPEATABLE READ (the search sets READ
//! COMMITTED itself) and a url's `options` default of SERIALIZABLE; a read-your-writes
//! search is not answered by a replica that has not replayed its position, and a bogus
//! position does not switch the replica off for other misses; a replica that cannot be
//! reached costs no miss; a slow one delays few misses and fails none. A real
//! PostgreSQL 18 + pgvector primary with `wal_level = logical` and a streaming replica
//! made by pg_basebackup (`ops/pg.sh standby`), both on 127.0.0.1. Every loop is
//! bounded.

#[path = "akerd_common/mod.rs"]
mod akerd_common;
#[path = "pg_common/mod.rs"]
mod pg_common;

use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use aker::client::Client;
use aker::config::{BackendKind, ChangesMode, Config};
use aker::protocol::{HitKind, SearchRequest};
use aker::service::{Daemon, Dataset};
use aker_formats::data;
use akerd_common::{client, ids, query_near, stat, K};
use pg_common::{PgServer, Sql};
use tokio_postgres::types::PgLsn;

const DIM: usize = 8;
/// `cache.delta` of `akerd_common::config()`: a miss asks for `K + DELTA` rows.
const DELTA: usize = 3;
/// The `hnsw.ef_search` akerd sends with that config (`k_max + delta`, at least 40).
const EF_SEARCH: usize = 40;
/// Longest wait for a position to be replayed or applied, or connections to open.
const WAIT: Duration = Duration::from_secs(10);
/// Longer than a replica found behind is passed over (100 ms).
const SKIP_PASSED: Duration = Duration::from_millis(250);

/// A primary with logical decoding and its streaming replica.
struct Pair {
    primary: PgServer,
    replica: PgServer,
}

fn pair() -> Option<&'static Pair> {
    static PAIR: OnceLock<Option<Pair>> = OnceLock::new();
    PAIR.get_or_init(|| {
        let primary = PgServer::start_with(
            "replica-primary",
            "-c wal_level=logical -c max_replication_slots=10 -c max_wal_senders=10",
        )?;
        let replica = primary.standby("replica-standby")?;
        Some(Pair { primary, replica })
    })
    .as_ref()
}

/// The tests that pause the replica's replay run one at a time.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn dataset() -> Dataset {
    data::synthetic(3000, DIM, 16, 11)
}

fn config(primary: &PgServer, table: &str, replica_urls: Vec<String>, poll_ms: u64) -> Config {
    let mut c = akerd_common::config();
    c.backend.kind = BackendKind::Pgvector;
    c.backend.threads = 2;
    let mut s = primary.section(table);
    s.changes = ChangesMode::Follow;
    s.instance = Some(table.into());
    s.changes_poll_ms = poll_ms;
    s.replica_urls = replica_urls;
    c.backend.pgvector = Some(s);
    c
}

fn lsn(sql: &Sql, query: &str) -> u64 {
    let r = sql.query(query, &[]);
    u64::from(r[0].get::<_, PgLsn>(0))
}

fn wal_now(primary: &Sql) -> u64 {
    lsn(primary, "SELECT pg_current_wal_insert_lsn()")
}

fn replayed(replica: &Sql) -> u64 {
    lsn(replica, "SELECT pg_last_wal_replay_lsn()")
}

/// Waits until `what` holds, bounded by [`WAIT`].
fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let end = Instant::now() + WAIT;
    while !done() {
        assert!(Instant::now() < end, "not within {WAIT:?}: {what}");
        thread::sleep(Duration::from_millis(5));
    }
}

fn wait_replayed(replica: &Sql, at: u64) {
    wait_for(&format!("the replica replays {at}"), || {
        replayed(replica) >= at
    });
}

/// Replay paused on the replica (it still receives the WAL), once it says so.
fn pause(replica: &Sql) {
    replica.exec("SELECT pg_wal_replay_pause()");
    wait_for("replay paused", || {
        let r = replica.query("SELECT pg_get_wal_replay_pause_state()::text", &[]);
        r[0].get::<_, String>(0) == "paused"
    });
}

fn resume(replica: &Sql) {
    replica.exec("SELECT pg_wal_replay_resume()");
}

fn stats(d: &Daemon) -> String {
    client(d.local_addr()).stats().unwrap()
}

fn metric(d: &Daemon, name: &str) -> f64 {
    let s = stats(d);
    stat(&s, name).unwrap_or_else(|| panic!("no {name} in STATS:\n{s}"))
}

fn wait_applied(d: &Daemon, at: u64) {
    wait_for(&format!("the stream applied to {at}"), || {
        metric(d, "pg_changes_applied_lsn") as u64 >= at
    });
}

/// Every backend thread connected to the replica (they open in the background).
fn wait_replica_up(d: &Daemon, threads: f64) {
    wait_for("the replica connections up", || {
        metric(d, "pg_replica_up") >= threads
    });
}

fn queries(ds: &Dataset, rows: std::ops::Range<usize>) -> Vec<Vec<f32>> {
    rows.map(|i| query_near(ds, i * 71 % ds.len(), 0.01))
        .collect()
}

/// A server's own answer, as akerd asks it on a miss (`K + DELTA` rows), cut to K.
fn db_ids(server: &Sql, table: &str, q: &[f32]) -> Vec<u64> {
    let rows = server.knn(table, "<->", q, K as usize + DELTA, EF_SEARCH);
    let mut v: Vec<u64> = rows.iter().take(K as usize).map(|r| r.0).collect();
    v.sort_unstable();
    v
}

/// Asserts that `got` (a miss's ids) is the database's own answer to `q`: the
/// primary's, or the replica's where it differs. A table this small sits near the
/// planner's line between the HNSW index and a sequential scan, and the two servers may
/// plan the search differently (the primary's heap file can hold empty pages extended
/// ahead by a bulk COPY, which the standby's lacks, so their row estimates differ).
fn databases_answer(got: &[u64], (primary, replica): (&Sql, &Sql), table: &str, q: &[f32]) {
    let got = sorted(got.to_vec());
    if got != db_ids(primary, table, q) {
        assert_eq!(got, db_ids(replica, table, q), "neither server's answer");
    }
}

fn sorted(mut v: Vec<u64>) -> Vec<u64> {
    v.sort_unstable();
    v
}

/// Repeats `q` until it is a hit (admission is asynchronous); bounded.
fn until_hit(c: &mut Client, q: &[f32]) -> Vec<u64> {
    let end = Instant::now() + WAIT;
    loop {
        let r = c.search(K, q).unwrap();
        if r.hit != HitKind::Miss {
            return ids(&r);
        }
        assert!(Instant::now() < end, "no hit within {WAIT:?}");
        thread::sleep(Duration::from_millis(5));
    }
}

/// Asserts that no search of `qs` returns an id of `gone`, `rounds` times over.
fn never_served(c: &mut Client, qs: &[Vec<f32>], gone: &HashSet<u64>, rounds: usize) {
    for _ in 0..rounds {
        for q in qs {
            let r = c.search(K, q).unwrap();
            for id in ids(&r) {
                assert!(!gone.contains(&id), "deleted id {id} served ({:?})", r.hit);
            }
        }
    }
}

#[test]
fn misses_go_to_the_replica_only_once_it_has_replayed_what_the_cache_holds() {
    let Some(p) = pair() else { return };
    let _one = serial();
    let (primary, replica) = (p.primary.sql(), p.replica.sql());
    resume(&replica);
    let ds = dataset();
    primary.load("r_miss", &ds, "vector_l2_ops");
    wait_replayed(&replica, wal_now(&primary));
    let d = Daemon::start(&config(&p.primary, "r_miss", vec![p.replica.url()], 10)).unwrap();
    wait_replica_up(&d, 2.0);
    let mut c = client(d.local_addr());
    let asked = answered_by_the_replica(&d, &mut c, (&primary, &replica), "r_miss", &ds);
    let gone = held_behind(&d, &mut c, (&primary, &replica), "r_miss", &ds, &asked);
    used_again_once_resumed(&d, &mut c, (&primary, &replica), &ds, &gone);
    d.stop().unwrap();
}

/// `ALTER DATABASE postgres SET default_transaction_isolation` on the primary (it
/// replicates), reset when dropped, a failed test included.
struct DefaultIsolation<'a>(&'a PgServer);

impl<'a> DefaultIsolation<'a> {
    fn set(primary: &'a PgServer, level: &str) -> DefaultIsolation<'a> {
        primary.sql().exec(&format!(
            "ALTER DATABASE postgres SET default_transaction_isolation = '{level}'"
        ));
        DefaultIsolation(primary)
    }
}

impl Drop for DefaultIsolation<'_> {
    fn drop(&mut self) {
        self.0
            .sql()
            .exec("ALTER DATABASE postgres RESET default_transaction_isolation");
    }
}

/// A new session's `default_transaction_isolation` on `server`.
fn session_default(server: &PgServer) -> String {
    let r = server
        .sql()
        .query("SHOW default_transaction_isolation", &[]);
    r[0].get(0)
}

#[test]
fn the_replica_check_holds_whatever_the_default_isolation() {
    let Some(p) = pair() else { return };
    let _one = serial();
    // Opened before the default changes: these sessions keep READ COMMITTED.
    let (primary, replica) = (p.primary.sql(), p.replica.sql());
    resume(&replica);
    let ds = dataset();
    primary.load("r_iso", &ds, "vector_l2_ops");
    {
        let _rr = DefaultIsolation::set(&p.primary, "repeatable read");
        wait_replayed(&replica, wal_now(&primary));
        assert_eq!(session_default(&p.replica), "repeatable read");
        // A new akerd: every connection of it is a new session under that default.
        let d = Daemon::start(&config(&p.primary, "r_iso", vec![p.replica.url()], 10)).unwrap();
        wait_replica_up(&d, 2.0);
        let mut c = client(d.local_addr());
        let asked = answered_by_the_replica(&d, &mut c, (&primary, &replica), "r_iso", &ds);
        let gone = held_behind(&d, &mut c, (&primary, &replica), "r_iso", &ds, &asked);
        used_again_once_resumed(&d, &mut c, (&primary, &replica), &ds, &gone);
        d.stop().unwrap();
    }
    wait_replayed(&replica, wal_now(&primary));
    assert_eq!(session_default(&p.replica), "read committed");
    // SERIALIZABLE in the url's options: a standby refuses it for any statement that
    // takes a snapshot, so only a search that sets its own level is answered there.
    let serializable = format!(
        "{}?options=-c%20default_transaction_isolation%3Dserializable",
        p.replica.url()
    );
    let d = Daemon::start(&config(&p.primary, "r_iso", vec![serializable], 10)).unwrap();
    wait_replica_up(&d, 2.0);
    let mut c = client(d.local_addr());
    let qs = queries(&ds, 100..130);
    let mut used = false;
    for q in qs.chunks(5) {
        for q in q {
            let r = c.search(K, q).unwrap();
            if r.hit == HitKind::Miss {
                databases_answer(&ids(&r), (&primary, &replica), "r_iso", q);
            }
        }
        if metric(&d, "pg_replica_searches") > 0.0 {
            used = true;
            break;
        }
        thread::sleep(SKIP_PASSED);
    }
    assert!(
        used,
        "no miss on a SERIALIZABLE-default replica\n{}",
        stats(&d)
    );
    d.stop().unwrap();
}

/// Misses answered by the replica, each the database's own answer; the queries.
fn answered_by_the_replica(
    d: &Daemon,
    c: &mut Client,
    servers: (&Sql, &Sql),
    table: &str,
    ds: &Dataset,
) -> Vec<Vec<f32>> {
    let qs = queries(ds, 0..30);
    let mut misses = 0;
    for q in &qs {
        let r = c.search(K, q).unwrap();
        if r.hit == HitKind::Miss {
            misses += 1;
            databases_answer(&ids(&r), servers, table, q);
        }
    }
    let s = stats(d);
    let by_replica = stat(&s, "pg_replica_searches").unwrap();
    assert!(misses >= 20, "{misses} misses of 30");
    // A miss right after a read of the stream may find the replica a moment behind
    // (then it is passed over for 100 ms): most, not all, go there.
    eprintln!("{by_replica} of {misses} misses answered by the replica");
    assert!(by_replica >= 1.0, "no miss on the replica\n{s}");
    qs
}

/// Replay paused, rows of cached answers and of answers not asked yet deleted on the
/// primary and applied by the stream: no deleted id is served, no miss is answered by
/// the replica. The deleted ids.
fn held_behind(
    d: &Daemon,
    c: &mut Client,
    (primary, replica): (&Sql, &Sql),
    table: &str,
    ds: &Dataset,
    asked: &[Vec<f32>],
) -> HashSet<u64> {
    pause(replica);
    let cached: Vec<Vec<u64>> = asked[..10].iter().map(|q| until_hit(c, q)).collect();
    let fresh = queries(ds, 30..50);
    let mut gone: HashSet<u64> = cached.iter().map(|a| a[0]).collect();
    for q in &fresh {
        gone.extend(db_ids(primary, table, q).into_iter().take(2));
    }
    let list: Vec<String> = gone.iter().map(u64::to_string).collect();
    primary.exec(&format!(
        "DELETE FROM {table} WHERE id IN ({})",
        list.join(",")
    ));
    let deleted_at = wal_now(primary);
    wait_applied(d, deleted_at);
    assert!(
        replayed(replica) < deleted_at,
        "the replica replayed while paused"
    );
    let (searches, behind) = (
        metric(d, "pg_replica_searches"),
        metric(d, "pg_replica_behind"),
    );
    never_served(c, &fresh, &gone, 1);
    never_served(c, &asked[..10], &gone, 1);
    thread::sleep(SKIP_PASSED);
    never_served(c, &queries(ds, 50..60), &gone, 1);
    never_served(c, &fresh, &gone, 2);
    let s = stats(d);
    assert_eq!(stat(&s, "pg_replica_searches"), Some(searches), "{s}");
    assert!(stat(&s, "pg_replica_behind").unwrap() > behind, "{s}");
    assert!(stat(&s, "pg_replica_lag_bytes").unwrap() > 0.0, "{s}");
    gone
}

/// Replay resumed: new misses are answered by the replica again, still without the
/// deleted ids.
fn used_again_once_resumed(
    d: &Daemon,
    c: &mut Client,
    (primary, replica): (&Sql, &Sql),
    ds: &Dataset,
    gone: &HashSet<u64>,
) {
    resume(replica);
    wait_replayed(replica, wal_now(primary));
    thread::sleep(SKIP_PASSED);
    let before = metric(d, "pg_replica_searches");
    let more = queries(ds, 60..100);
    let mut used = false;
    for q in more.chunks(4) {
        never_served(c, q, gone, 1);
        if metric(d, "pg_replica_searches") > before {
            used = true;
            break;
        }
        thread::sleep(SKIP_PASSED);
    }
    assert!(used, "no miss on the replica once resumed\n{}", stats(d));
}

#[test]
fn a_search_at_a_position_is_not_answered_by_a_replica_behind_it() {
    let Some(p) = pair() else { return };
    let _one = serial();
    let (primary, replica) = (p.primary.sql(), p.replica.sql());
    resume(&replica);
    primary.load("r_ryw", &dataset(), "vector_l2_ops");
    wait_replayed(&replica, wal_now(&primary));
    // A slow poll: only writes through akerd and positions waited for move the stream.
    let d = Daemon::start(&config(&p.primary, "r_ryw", vec![p.replica.url()], 5_000)).unwrap();
    wait_replica_up(&d, 2.0);
    let mut c = client(d.local_addr());
    pause(&replica);
    let searches = metric(&d, "pg_replica_searches");
    let mine = vec![40.0f32; DIM];
    let at = c.insert_with_position(900_001, &mine).unwrap();
    assert!(replayed(&replica) < at);
    for bypass_cache in [false, true] {
        let r = at_position(&mut c, &mine, at, bypass_cache);
        assert_eq!(ids(&r)[0], 900_001, "bypass {bypass_cache}: {r:?}");
    }
    // Replayed up to now, paused again, and a row inserted in SQL: the replica holds
    // what akerd has applied but not the row; only the position keeps it out.
    resume(&replica);
    wait_replayed(&replica, wal_now(&primary));
    pause(&replica);
    thread::sleep(SKIP_PASSED);
    let theirs = vec![-40.0f32; DIM];
    let text: Vec<String> = theirs.iter().map(f32::to_string).collect();
    primary.exec(&format!(
        "INSERT INTO r_ryw (id, embedding) VALUES (900002, '[{}]')",
        text.join(",")
    ));
    let at2 = wal_now(&primary);
    if metric(&d, "pg_changes_applied_lsn") >= at2 as f64 {
        eprintln!("the stream applied the SQL insert first: the position is not the floor");
    }
    let r = at_position(&mut c, &theirs, at2, true);
    assert_eq!(ids(&r)[0], 900_002, "{r:?}");
    assert_eq!(metric(&d, "pg_replica_searches"), searches, "{}", stats(&d));
    // Replayed: the replica may answer at that position (once not passed over, and
    // not a moment behind a read of the stream).
    resume(&replica);
    let mut used = false;
    for _ in 0..10 {
        wait_replayed(&replica, wal_now(&primary));
        thread::sleep(SKIP_PASSED);
        let r = at_position(&mut c, &theirs, at2, true);
        assert_eq!(ids(&r)[0], 900_002, "{r:?}");
        if metric(&d, "pg_replica_searches") > searches {
            used = true;
            break;
        }
    }
    assert!(
        used,
        "the replica did not answer once replayed\n{}",
        stats(&d)
    );
    a_bogus_position_passes_nothing_over(&d, &mut c, (&primary, &replica), &theirs);
    d.stop().unwrap();
}

/// A position far past any WAL sends its own request to the primary; the next miss,
/// right after it, is still answered by the replica (only a replica behind what the
/// node holds is passed over).
fn a_bogus_position_passes_nothing_over(
    d: &Daemon,
    c: &mut Client,
    (primary, replica): (&Sql, &Sql),
    q: &[f32],
) {
    let bogus = u64::MAX / 2;
    let plain = SearchRequest {
        bypass_cache: true,
        ..SearchRequest::new(K, q.to_vec())
    };
    let mut used = false;
    // Retried: the replica may be a moment behind a read of the stream.
    for _ in 0..10 {
        wait_replayed(replica, wal_now(primary));
        thread::sleep(SKIP_PASSED);
        let (searches, behind) = (
            metric(d, "pg_replica_searches"),
            metric(d, "pg_replica_behind"),
        );
        let r = at_position(c, q, bogus, true);
        assert_eq!(ids(&r)[0], 900_002, "{r:?}");
        let s = stats(d);
        assert_eq!(stat(&s, "pg_replica_searches"), Some(searches), "{s}");
        assert!(stat(&s, "pg_replica_behind").unwrap() > behind, "{s}");
        let r = c.search_with(plain.clone()).unwrap();
        assert_eq!(ids(&r)[0], 900_002, "{r:?}");
        if metric(d, "pg_replica_searches") > searches {
            used = true;
            break;
        }
    }
    assert!(
        used,
        "a bogus position switched the replica off\n{}",
        stats(d)
    );
}

fn at_position(
    c: &mut Client,
    q: &[f32],
    at: u64,
    bypass_cache: bool,
) -> aker::protocol::SearchReply {
    c.search_with(SearchRequest {
        at_position: Some(at),
        bypass_cache,
        ..SearchRequest::new(K, q.to_vec())
    })
    .unwrap()
}

#[test]
fn a_replica_that_cannot_be_reached_costs_no_miss() {
    let Some(p) = pair() else { return };
    // Not while another test has changed the database's defaults.
    let _one = serial();
    let primary = p.primary.sql();
    primary.load("r_down", &dataset(), "vector_l2_ops");
    let closed = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    let nowhere = format!("postgresql://aker@127.0.0.1:{closed}/postgres");
    let d = Daemon::start(&config(&p.primary, "r_down", vec![nowhere], 10)).unwrap();
    let mut c = client(d.local_addr());
    for q in queries(&dataset(), 0..20) {
        let r = c.search(K, &q).unwrap();
        if r.hit == HitKind::Miss {
            assert_eq!(sorted(ids(&r)), db_ids(&primary, "r_down", &q));
        }
    }
    let s = stats(&d);
    assert_eq!(stat(&s, "pg_replica_up"), Some(0.0), "{s}");
    assert_eq!(stat(&s, "pg_replica_searches"), Some(0.0), "{s}");
    assert_eq!(stat(&s, "backend_errors"), Some(0.0), "{s}");
    d.stop().unwrap();
}

/// A TCP proxy to a server on 127.0.0.1 whose answers (server to client) are held
/// `delay_ms` each once set: a replica that has become slow.
struct SlowProxy {
    port: u16,
    delay_ms: Arc<AtomicU64>,
}

impl SlowProxy {
    fn to(port: u16) -> SlowProxy {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let proxy = SlowProxy {
            port: l.local_addr().unwrap().port(),
            delay_ms: Arc::new(AtomicU64::new(0)),
        };
        let delay = proxy.delay_ms.clone();
        thread::spawn(move || {
            for s in l.incoming() {
                let Ok(client) = s else { continue };
                let Ok(server) = TcpStream::connect(("127.0.0.1", port)) else {
                    continue;
                };
                let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                thread::spawn(move || pump(c2, s2, None));
                let delay = delay.clone();
                thread::spawn(move || pump(server, client, Some(delay)));
            }
        });
        proxy
    }

    fn url(&self) -> String {
        format!("postgresql://aker@127.0.0.1:{}/postgres", self.port)
    }

    fn delay(&self, d: Duration) {
        self.delay_ms.store(d.as_millis() as u64, Ordering::Relaxed);
    }
}

/// Copies `from` to `to`, each read held `delay` first where given, until either ends.
fn pump(mut from: TcpStream, mut to: TcpStream, delay: Option<Arc<AtomicU64>>) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if let Some(ms) = delay.as_ref().map(|d| d.load(Ordering::Relaxed)) {
            thread::sleep(Duration::from_millis(ms));
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}

#[test]
fn a_slow_replica_delays_few_misses_and_fails_none() {
    let Some(p) = pair() else { return };
    let _one = serial();
    let (primary, replica) = (p.primary.sql(), p.replica.sql());
    resume(&replica);
    let ds = dataset();
    primary.load("r_slow", &ds, "vector_l2_ops");
    wait_replayed(&replica, wal_now(&primary));
    let proxy = SlowProxy::to(p.replica.port);
    let d = Daemon::start(&config(&p.primary, "r_slow", vec![proxy.url()], 10)).unwrap();
    wait_replica_up(&d, 2.0);
    let mut c = client(d.local_addr());
    answered_by_the_replica(&d, &mut c, (&primary, &replica), "r_slow", &ds);
    // Answers held longer than the requests' deadline: a replica attempt may take half
    // of it, then the primary answers in what is left.
    proxy.delay(Duration::from_secs(3));
    let deadline = Duration::from_millis(1_500);
    let searches = metric(&d, "pg_replica_searches");
    let (mut misses, mut slow) = (0, 0);
    let started = Instant::now();
    for q in queries(&ds, 100..140) {
        let t = Instant::now();
        let r = c
            .search_with(SearchRequest {
                deadline_us: deadline.as_micros() as u32,
                ..SearchRequest::new(K, q.clone())
            })
            .unwrap_or_else(|e| panic!("a miss failed behind a slow replica: {e}"));
        let took = t.elapsed();
        assert!(took < deadline, "{took:?}");
        if r.hit == HitKind::Miss {
            misses += 1;
            assert_eq!(sorted(ids(&r)), db_ids(&primary, "r_slow", &q));
        }
        if took >= deadline / 4 {
            slow += 1;
        }
    }
    let s = stats(&d);
    eprintln!(
        "{slow} of {misses} misses waited on the slow replica, in {:?}",
        started.elapsed()
    );
    assert!(misses >= 20, "{misses} misses of 40\n{s}");
    assert_eq!(stat(&s, "pg_replica_searches"), Some(searches), "{s}");
    assert_eq!(stat(&s, "backend_errors"), Some(0.0), "{s}");
    // The waits on the slow replica are counted.
    assert!(stat(&s, "pg_replica_failed").unwrap_or(0.0) >= 1.0, "{s}");
    // Passed over for a second after each: one wait per thread, per second or so.
    let allowed = 2 * (started.elapsed().as_secs() as usize + 2);
    assert!(
        slow <= allowed,
        "{slow} slow misses (at most {allowed})\n{s}"
    );
    // Fast again: answered by the replica once reconnected and no longer passed over.
    proxy.delay(Duration::ZERO);
    let more = queries(&ds, 140..200);
    let mut used = false;
    let end = Instant::now() + WAIT;
    for q in more.iter().cycle() {
        let r = c.search(K, q).unwrap();
        if r.hit == HitKind::Miss && metric(&d, "pg_replica_searches") > searches {
            used = true;
            break;
        }
        if Instant::now() > end {
            break;
        }
        thread::sleep(Duration::from_millis(20));
    }
    assert!(
        used,
        "the replica did not answer once fast again\n{}",
        stats(&d)
    );
    d.stop().unwrap();
}
