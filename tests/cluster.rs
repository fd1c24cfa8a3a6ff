//! A tier of akerd nodes coordinated through PostgreSQL (`[cluster]`, docs/CLUSTER.md):
//! concurrent first starts publish one set of centroids; clients route to owners, and
//! SQL deletes are never served by any node; a joining node takes only the centroids
//! it now owns; a node SIGKILLed under load costs the client no request and its
//! centroids move; a retrain publishes a new version every node and client follows.
//! A real PostgreSQL 18 + pgvector with `wal_level = logical` (`ops/pg.sh`) on
//! 127.0.0.1. Every loop is bounded.

#[path = "akerd_common/mod.rs"]
mod akerd_common;
#[path = "pg_common/mod.rs"]
mod pg_common;

use std::collections::{HashMap, HashSet};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use aker::client::{ClientOptions, Cluster};
use aker::config::{BackendKind, Balance, ChangesMode, Config};
use aker::protocol::{ClusterReply, HitKind, Status};
use aker::service::{Daemon, Dataset};
use aker_formats::data;
use akerd_common::{client, ids, query_near, stat};
use pg_common::PgServer;
use tokio_postgres::types::PgLsn;

const DIM: usize = 8;
const K: u32 = 5;
const LEASE_MS: u64 = 2_000;
const RENEW_MS: u64 = 200;

fn logical() -> Option<&'static PgServer> {
    static SERVER: OnceLock<Option<PgServer>> = OnceLock::new();
    SERVER
        .get_or_init(|| {
            PgServer::start_with(
                "cluster",
                "-c wal_level=logical -c max_replication_slots=30 -c max_wal_senders=10",
            )
        })
        .as_ref()
}

fn dataset() -> Dataset {
    data::synthetic(3000, DIM, 16, 11)
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// A node of cluster `name` (schema `schema`) in front of `table`.
fn node_config(pg: &PgServer, table: &str, schema: &str, name: &str) -> Config {
    let mut c = akerd_common::config();
    let port = free_port();
    c.server.listen = format!("127.0.0.1:{port}").parse().unwrap();
    c.backend.kind = BackendKind::Pgvector;
    c.backend.threads = 2;
    let mut s = pg.section(table);
    s.changes = ChangesMode::Follow;
    s.instance = Some(format!("{:016x}", rand::random::<u64>()));
    s.changes_poll_ms = 10;
    c.backend.pgvector = Some(s);
    c.cluster.name = Some(name.into());
    c.cluster.advertise = Some(format!("127.0.0.1:{port}"));
    c.cluster.schema = schema.into();
    c.cluster.lease_ms = LEASE_MS;
    c.cluster.renew_ms = RENEW_MS;
    c.cluster.balance = Balance::Rendezvous;
    c.cluster.balance_ms = 1_000;
    c
}

fn start(cfg: &Config) -> Daemon {
    Daemon::start(cfg).expect("a cluster node starts")
}

fn state(addr: impl std::net::ToSocketAddrs) -> ClusterReply {
    let mut c = aker::client::Client::connect(addr).expect("connect");
    c.hello().expect("hello");
    c.cluster().expect("CLUSTER")
}

/// Waits until the node at `addr` sees `n` live nodes; its state then.
fn wait_live(addr: &str, n: usize) -> ClusterReply {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let s = state(addr);
        if s.nodes.iter().filter(|x| x.live).count() == n {
            return s;
        }
        assert!(
            Instant::now() < end,
            "{addr} never saw {n} live nodes: {:?}",
            s.nodes
        );
        thread::sleep(Duration::from_millis(20));
    }
}

fn owners(s: &ClusterReply) -> Vec<u64> {
    let n = s.centroids.len() / s.dim as usize;
    (0..n as u32)
        .map(|c| aker::cluster::owner(s, c).unwrap())
        .collect()
}

fn opts() -> ClientOptions {
    ClientOptions {
        io_timeout: Some(Duration::from_secs(10)),
        ..Default::default()
    }
}

#[test]
fn concurrent_first_starts_publish_one_set_of_centroids() {
    let Some(pg) = logical() else { return };
    pg.sql().load("c_first", &dataset(), "vector_l2_ops");
    let cfgs: Vec<Config> = (0..2)
        .map(|_| node_config(pg, "c_first", "c_first", "first"))
        .collect();
    let go = Arc::new(std::sync::Barrier::new(2));
    let nodes: Vec<Daemon> = thread::scope(|s| {
        let hs: Vec<_> = cfgs
            .iter()
            .map(|c| {
                let go = go.clone();
                s.spawn(move || {
                    go.wait();
                    start(c)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let rows = pg.sql().query(
        "SELECT count(*) FROM c_first.routing WHERE cluster = 'first'",
        &[],
    );
    assert_eq!(
        rows[0].get::<_, i64>(0),
        1,
        "one set of centroids published"
    );
    let a = state(nodes[0].local_addr());
    let b = state(nodes[1].local_addr());
    assert_eq!(a.centroids_version, 1);
    assert_eq!(
        a.centroids, b.centroids,
        "both nodes route by the same centroids"
    );
    assert_ne!(a.self_id, b.self_id);
    // A node with other cache settings is refused, naming the difference.
    let mut other = node_config(pg, "c_first", "c_first", "first");
    other.cache.k_max = 16;
    let e = Daemon::start(&other)
        .err()
        .expect("another fingerprint is refused");
    assert!(e.to_string().contains("k_max"), "{e}");
}

#[test]
fn clients_route_to_owners_and_no_node_serves_a_deleted_id() {
    let Some(pg) = logical() else { return };
    let ds = dataset();
    pg.sql().load("c_route", &ds, "vector_l2_ops");
    let cfgs: Vec<Config> = (0..3)
        .map(|_| node_config(pg, "c_route", "c_route", "route"))
        .collect();
    let nodes: Vec<Daemon> = cfgs.iter().map(start).collect();
    let seed = cfgs[0].cluster.advertise.clone().unwrap();
    let s = wait_live(&seed, 3);
    for c in &cfgs[1..] {
        wait_live(c.cluster.advertise.as_ref().unwrap(), 3);
    }
    let mut cl = Cluster::connect(&[seed.as_str()], opts()).unwrap();
    cl.refresh().unwrap();
    assert_eq!(cl.state().routing_version, s.routing_version);
    let queries: Vec<Vec<f32>> = (0..300).map(|i| query_near(&ds, i * 7, 0.01)).collect();
    for q in &queries {
        cl.search(K, q).unwrap();
    }
    // Every node got searches, and only for the centroids it owns.
    for d in &nodes {
        let st = client(d.local_addr()).stats().unwrap();
        assert_eq!(stat(&st, "cluster_foreign_searches"), Some(0.0), "{st}");
        assert_eq!(stat(&st, "cluster_live_nodes"), Some(3.0));
        assert!(stat(&st, "searches_total").unwrap_or(1.0) > 0.0);
    }
    let per_node = cl.counters().requests.clone();
    assert_eq!(
        per_node.len(),
        3,
        "searches spread over the three nodes: {per_node:?}"
    );
    // Batches split by owner give the same answers as single searches.
    let batch = cl.search_batch(K, &queries[..64]).unwrap();
    for (q, item) in queries[..64].iter().zip(&batch) {
        let single = cl.search(K, q).unwrap();
        assert_eq!(ids(item.as_ref().unwrap()), ids(&single));
    }
    // Delete, in SQL, ids that cached answers hold, while two threads search through
    // every node; then a search at the delete's position, on every node, never serves them.
    let cached: HashSet<u64> = queries
        .iter()
        .flat_map(|q| ids(&cl.search(K, q).unwrap()))
        .collect();
    let doomed: Vec<i64> = cached.iter().take(40).map(|&i| i as i64).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let searchers: Vec<_> = (0..2)
        .map(|t| {
            let (stop, seed, qs) = (stop.clone(), seed.clone(), queries.clone());
            thread::spawn(move || {
                let mut c = Cluster::connect(&[seed.as_str()], opts()).unwrap();
                let mut n = 0u64;
                for i in 0..20_000 {
                    if stop.load(Ordering::Relaxed) && n >= 50 {
                        break;
                    }
                    c.search(K, &qs[(i * 3 + t) % qs.len()]).unwrap();
                    n += 1;
                }
                n
            })
        })
        .collect();
    let sql = pg.sql();
    sql.query("DELETE FROM c_route WHERE id = ANY($1)", &[&doomed]);
    let lsn = u64::from(sql.query("SELECT pg_current_wal_insert_lsn()", &[])[0].get::<_, PgLsn>(0));
    stop.store(true, Ordering::Relaxed);
    for h in searchers {
        assert!(h.join().unwrap() > 0);
    }
    let gone: HashSet<u64> = doomed.iter().map(|&i| i as u64).collect();
    for d in &nodes {
        let mut c = client(d.local_addr());
        for q in &queries {
            let r = c
                .search_with(aker::protocol::SearchRequest {
                    at_position: Some(lsn),
                    ..aker::protocol::SearchRequest::new(K, q.clone())
                })
                .unwrap();
            let served: Vec<u64> = ids(&r).into_iter().filter(|i| gone.contains(i)).collect();
            assert!(
                served.is_empty(),
                "node {} served deleted {served:?}",
                d.local_addr()
            );
        }
    }
    // A client that wrote through one node reads its write through another.
    let mut w = Cluster::connect(&[seed.as_str()], opts()).unwrap();
    let v = query_near(&ds, 5, 0.0);
    let victim = ids(&w.search(K, &v).unwrap())[0];
    let p = w.delete_with_position(victim).unwrap().position;
    assert!(p > 0 && w.position() == p);
    for _ in 0..20 {
        // Whichever node answers, the delete is held (the search carries its position).
        assert!(!ids(&w.search(K, &v).unwrap()).contains(&victim));
    }
    drop(nodes);
}

#[test]
fn a_joining_node_takes_only_the_centroids_it_now_owns() {
    let Some(pg) = logical() else { return };
    pg.sql().load("c_join", &dataset(), "vector_l2_ops");
    let cfgs: Vec<Config> = (0..3)
        .map(|_| node_config(pg, "c_join", "c_join", "join"))
        .collect();
    let two: Vec<Daemon> = cfgs[..2].iter().map(start).collect();
    let seed = cfgs[0].cluster.advertise.clone().unwrap();
    let before = owners(&wait_live(&seed, 2));
    let third = start(&cfgs[2]);
    let after_state = wait_live(&seed, 3);
    let after = owners(&after_state);
    let new_id = state(third.local_addr()).self_id;
    let moved: Vec<usize> = (0..before.len())
        .filter(|&c| before[c] != after[c])
        .collect();
    assert!(!moved.is_empty(), "the new node owns something");
    for &c in &moved {
        assert_eq!(
            after[c], new_id,
            "centroid {c} moved to a node other than the new one"
        );
    }
    // Its clients see it: the state every node serves names all three.
    assert_eq!(state(two[1].local_addr()).nodes.len(), 3);
    // A clean stop leaves at once: the others see two live nodes within a renewal or two.
    drop(third);
    let back = owners(&wait_live(&seed, 2));
    assert_eq!(
        back, before,
        "its centroids go back to their rendezvous owners"
    );
}

/// akerd as a child process (for SIGKILL).
struct Node {
    child: Child,
    addr: String,
    _dir: PathBufGuard,
}

struct PathBufGuard(std::path::PathBuf);
impl Drop for PathBufGuard {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Node {
    fn spawn(cfg: &Config) -> Node {
        let dir = std::env::temp_dir().join(format!(
            "aker-cluster-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("akerd.toml");
        std::fs::write(&file, cfg.to_toml()).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_akerd"))
            .arg("--config")
            .arg(&file)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("akerd runs");
        let addr = cfg.cluster.advertise.clone().unwrap();
        let end = Instant::now() + Duration::from_secs(30);
        while aker::client::Client::connect(addr.as_str())
            .and_then(|mut c| c.hello())
            .is_err()
        {
            assert!(Instant::now() < end, "akerd at {addr} did not come up");
            thread::sleep(Duration::from_millis(50));
        }
        Node {
            child,
            addr,
            _dir: PathBufGuard(dir),
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_node_killed_under_load_costs_no_request_and_its_centroids_move() {
    let Some(pg) = logical() else { return };
    let ds = dataset();
    pg.sql().load("c_kill", &ds, "vector_l2_ops");
    let cfgs: Vec<Config> = (0..3)
        .map(|_| {
            let mut c = node_config(pg, "c_kill", "c_kill", "kill");
            // The password file is absolute already; the binary reads the same TOML.
            c.admin.enabled = false;
            c
        })
        .collect();
    let mut nodes: Vec<Node> = cfgs.iter().map(Node::spawn).collect();
    let seed = nodes[0].addr.clone();
    let s = wait_live(&seed, 3);
    let queries: Arc<Vec<Vec<f32>>> =
        Arc::new((0..200).map(|i| query_near(&ds, i * 11, 0.01)).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let (done, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let load: Vec<_> = (0..2)
        .map(|t| {
            let (stop, seed, qs, done, failed) = (
                stop.clone(),
                seed.clone(),
                queries.clone(),
                done.clone(),
                failed.clone(),
            );
            thread::spawn(move || {
                let mut c = Cluster::connect(&[seed.as_str()], opts()).unwrap();
                for i in 0..1_000_000usize {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    match c.search(K, &qs[(i + t) % qs.len()]) {
                        Ok(_) => done.fetch_add(1, Ordering::Relaxed),
                        Err(e) => {
                            eprintln!("search failed: {e}");
                            failed.fetch_add(1, Ordering::Relaxed)
                        }
                    };
                }
                c.counters().retries
            })
        })
        .collect();
    // A writer too: a write is acknowledged, refused before it was sent (then tried on
    // the next node), or in doubt; never lost without an error.
    let writer = {
        let (stop, seed, qs) = (stop.clone(), seed.clone(), queries.clone());
        thread::spawn(move || {
            let mut c = Cluster::connect(&[seed.as_str()], opts()).unwrap();
            let (mut ok, mut in_doubt) = (0u64, 0u64);
            for i in 0..100_000u64 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                match c.insert(1_000_000 + i % 50, &qs[(i % 200) as usize]) {
                    Ok(()) => ok += 1,
                    Err(aker::client::ClientError::WriteInDoubt { .. }) => in_doubt += 1,
                    Err(e) => panic!("a write failed otherwise: {e}"),
                }
            }
            (ok, in_doubt)
        })
    };
    // Let the load warm the caches, then kill the node that owns the most centroids.
    thread::sleep(Duration::from_millis(800));
    let counts = owners(&s).into_iter().fold(HashMap::new(), |mut m, o| {
        *m.entry(o).or_insert(0usize) += 1;
        m
    });
    let victim_id = *counts.iter().max_by_key(|(_, n)| **n).unwrap().0;
    let victim_addr = s
        .nodes
        .iter()
        .find(|n| n.node_id == victim_id)
        .unwrap()
        .advertise
        .clone();
    let vi = nodes.iter().position(|n| n.addr == victim_addr).unwrap();
    let killed_at = Instant::now();
    let mut victim = nodes.remove(vi);
    victim.child.kill().unwrap(); // SIGKILL
    victim.child.wait().unwrap();
    let survivor = nodes[0].addr.clone();
    let after = wait_live(&survivor, 2);
    let lapse = killed_at.elapsed();
    assert!(
        lapse < Duration::from_millis(LEASE_MS + 4 * RENEW_MS + 1_500),
        "lease lapsed after {lapse:?}"
    );
    assert!(
        owners(&after).iter().all(|&o| o != victim_id),
        "its centroids moved"
    );
    thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let retries: u64 = load.into_iter().map(|h| h.join().unwrap()).sum();
    let (written, in_doubt) = writer.join().unwrap();
    assert!(
        written > 0 && in_doubt <= 1,
        "{written} writes, {in_doubt} in doubt"
    );
    assert_eq!(
        failed.load(Ordering::Relaxed),
        0,
        "retried on the next node, none lost"
    );
    assert!(done.load(Ordering::Relaxed) > 100);
    assert!(
        retries > 0,
        "the requests in flight on the killed node were retried"
    );
    // A client that never saw the error routes around it from the state alone.
    let mut fresh = Cluster::connect(&[survivor.as_str()], opts()).unwrap();
    let mut hits = 0;
    for q in queries.iter().take(50) {
        assert!(fresh.owner_of(q) != Some(victim_id));
        fresh.search(K, q).unwrap();
        if fresh.search(K, q).unwrap().hit != HitKind::Miss {
            hits += 1;
        }
    }
    assert!(hits >= 45, "hits come back on the new owners: {hits}/50");
    assert_eq!(fresh.counters().retries, 0);
}

/// A node closes a connection left idle (`idle_timeout_ms`); the client's next write
/// goes on a new connection instead of failing on the closed one, in doubt.
#[test]
fn a_write_after_a_node_closed_an_idle_connection_goes_on_a_new_one() {
    let Some(pg) = logical() else { return };
    pg.sql().load("c_idle", &dataset(), "vector_l2_ops");
    let mut cfg = node_config(pg, "c_idle", "c_idle", "idle");
    cfg.server.idle_timeout_ms = 300;
    let node = start(&cfg);
    let seed = cfg.cluster.advertise.clone().unwrap();
    let mut cl = Cluster::connect(&[seed.as_str()], opts()).unwrap();
    let q = query_near(&dataset(), 3, 0.01);
    cl.search(K, &q).unwrap();
    thread::sleep(Duration::from_millis(900)); // the node closes the idle connection
    let p = cl
        .insert_with_position(900_001, &q)
        .expect("the write goes on a new connection, not in doubt");
    assert!(p > 0 && cl.position() == p);
    let d = cl.delete_with_position(900_001).unwrap();
    assert!(d.existed);
    assert_eq!(cl.counters().retries, 0);
    drop(node);
}

#[test]
fn a_retrain_publishes_a_version_nodes_and_clients_follow() {
    let Some(pg) = logical() else { return };
    pg.sql().load("c_retrain", &dataset(), "vector_l2_ops");
    let cfg = node_config(pg, "c_retrain", "c_retrain", "retrain");
    let node = start(&cfg);
    let seed = cfg.cluster.advertise.clone().unwrap();
    let mut cl = Cluster::connect(&[seed.as_str()], opts()).unwrap();
    let before = cl.state().clone();
    let msg = aker::service::cluster_retrain(&cfg).expect("retrain");
    assert!(msg.contains("version 2"), "{msg}");
    let end = Instant::now() + Duration::from_secs(10);
    let ds = dataset();
    loop {
        cl.search(K, &query_near(&ds, 3, 0.01)).unwrap();
        if cl.state().centroids_version == 2 {
            break;
        }
        assert!(Instant::now() < end, "the client never saw version 2");
        thread::sleep(Duration::from_millis(150));
    }
    assert_ne!(cl.state().centroids, before.centroids);
    assert_ne!(cl.state().routing_version, before.routing_version);
    // Outside a cluster, CLUSTER is refused and replies carry routing version 0.
    let mut plain = node_config(pg, "c_retrain", "c_retrain", "retrain");
    plain.cluster = Default::default();
    let lone = start(&plain);
    let mut c = client(lone.local_addr());
    let e = c.cluster().unwrap_err();
    assert_eq!(e.status(), Some(Status::Unsupported));
    assert_eq!(
        c.search(K, &query_near(&ds, 3, 0.01))
            .unwrap()
            .routing_version,
        0
    );
    drop(node);
}

#[test]
fn the_slot_of_a_node_gone_too_long_is_dropped_and_the_tier_is_shown() {
    let Some(pg) = logical() else { return };
    pg.sql().load("c_sweep", &dataset(), "vector_l2_ops");
    let mut cfg = node_config(pg, "c_sweep", "c_sweep", "sweep");
    cfg.cluster.slot_drop_after_s = 1;
    let node = start(&cfg);
    let sql = pg.sql();
    // A node that left an hour ago, its slot still holding WAL.
    sql.exec("SELECT pg_create_logical_replication_slot('aker_gonefortest', 'pgoutput')");
    sql.exec(
        "INSERT INTO c_sweep.nodes (cluster, node_id, advertise, slot, lease_until) \
         VALUES ('sweep', 77, '127.0.0.1:9', 'aker_gonefortest', now() - interval '1 hour')",
    );
    // The slot goes first, then the publication, then the row (one sweep).
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let left = sql.query(
            "SELECT (SELECT count(*) FROM pg_replication_slots \
               WHERE slot_name = 'aker_gonefortest') \
             + (SELECT count(*) FROM c_sweep.nodes WHERE node_id = 77)",
            &[],
        )[0]
        .get::<_, i64>(0);
        if left == 0 {
            break;
        }
        assert!(
            Instant::now() < end,
            "the slot and the row of a long-gone node were never dropped"
        );
        thread::sleep(Duration::from_millis(50));
    }
    // Its own slot is untouched, and it counts what it dropped.
    let own = format!(
        "aker_{}",
        cfg.backend
            .pgvector
            .as_ref()
            .unwrap()
            .instance
            .as_ref()
            .unwrap()
    );
    let mine = sql.query(
        "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1",
        &[&own],
    );
    assert_eq!(mine[0].get::<_, i64>(0), 1);
    let st = client(node.local_addr()).stats().unwrap();
    assert_eq!(stat(&st, "cluster_slots_dropped"), Some(1.0), "{st}");
    // aker-cli shows the tier.
    let out = Command::new(env!("CARGO_BIN_EXE_aker-cli"))
        .args([
            "--target",
            cfg.cluster.advertise.as_deref().unwrap(),
            "cluster",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("cluster sweep") && text.contains("(this node)"),
        "{text}"
    );
    assert!(text.contains(" 1 live;"), "{text}");
}

#[test]
fn load_on_one_nodes_centroids_is_spread_by_overrides() {
    let Some(pg) = logical() else { return };
    let ds = dataset();
    pg.sql().load("c_balance", &ds, "vector_l2_ops");
    let cfgs: Vec<Config> = (0..3)
        .map(|_| {
            let mut c = node_config(pg, "c_balance", "c_balance", "balance");
            c.cluster.balance = Balance::Load;
            c.cluster.balance_ms = 500;
            c
        })
        .collect();
    let _nodes: Vec<Daemon> = cfgs.iter().map(start).collect();
    let seed = cfgs[0].cluster.advertise.clone().unwrap();
    let s = wait_live(&seed, 3);
    // Every query of the load goes to centroids one node owns: all its load, none elsewhere.
    let hot = owners(&s)[0];
    let mut qs: Vec<Vec<f32>> = Vec::new();
    let mut centroids = HashSet::new();
    for i in 0..ds.len() {
        let q = query_near(&ds, i, 0.01);
        let c = aker::cluster::nearest_centroid(&s, &q);
        if aker::cluster::owner(&s, c) == Some(hot) && qs.len() < 200 {
            centroids.insert(c);
            qs.push(q);
        }
    }
    assert!(
        centroids.len() >= 2,
        "the hot node owns queries of several centroids"
    );
    let mut cl = Cluster::connect(&[seed.as_str()], opts()).unwrap();
    let end = Instant::now() + Duration::from_secs(15);
    let mut i = 0;
    let balanced = loop {
        cl.search(K, &qs[i % qs.len()]).unwrap();
        i += 1;
        if i % 500 == 0 {
            let st = state(seed.as_str());
            if st.balance_epoch > 0 {
                break st;
            }
        }
        assert!(Instant::now() < end, "no load-aware assignment within 15 s");
    };
    assert!(!balanced.overrides.is_empty());
    let moved: HashSet<u32> = balanced.overrides.iter().map(|o| o.0).collect();
    assert!(
        moved.is_subset(&centroids),
        "only loaded centroids move: {moved:?}"
    );
    assert!(
        balanced.overrides.iter().all(|o| o.1 != hot),
        "moved off the hot node"
    );
    // The client follows (its next replies carry the new routing version).
    let end = Instant::now() + Duration::from_secs(5);
    while cl.state().balance_epoch == 0 {
        cl.search(K, &qs[0]).unwrap();
        assert!(
            Instant::now() < end,
            "the client never fetched the overrides"
        );
        thread::sleep(Duration::from_millis(20));
    }
    let spread: HashSet<u64> = qs.iter().filter_map(|q| cl.owner_of(q)).collect();
    assert!(spread.len() >= 2, "the load now goes to more than one node");
}
