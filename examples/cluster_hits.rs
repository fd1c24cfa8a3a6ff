//! Hit ratio, database searches per request and load per node of a cluster of akerds
//! (or of one akerd) replaying a trace's searches: `bench/results/cluster.md`, run by
//! `ops/cluster-bench.sh`. Counts from the replies: a MISS is a search the database
//! answered; the node a request went to is the client's choice (its owner, or random).
//!
//! ```text
//! cluster_hits --seed 127.0.0.1:7711 --trace glove-0.99.trace --routing centroid \
//!     --threads 4 --warm 30000 --requests 60000 [--single]
//! ```

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use aker::client::{Client, ClientOptions, Cluster, ClusterRouting};
use aker::protocol::{HitKind, SearchRequest};
use aker_formats::trace::{Op, Trace};
use clap::Parser;

#[derive(Parser)]
struct Args {
    /// A node of the cluster (or the one akerd with --single).
    #[arg(long)]
    seed: String,
    #[arg(long)]
    trace: PathBuf,
    /// centroid | random
    #[arg(long, default_value = "centroid")]
    routing: String,
    #[arg(long, default_value_t = 4)]
    threads: usize,
    /// Searches (all threads) before counting.
    #[arg(long, default_value_t = 30_000)]
    warm: usize,
    /// Searches counted.
    #[arg(long, default_value_t = 60_000)]
    requests: usize,
    /// One akerd, not a cluster: plain CLUSTER-less requests.
    #[arg(long)]
    single: bool,
    #[arg(long, default_value_t = 10)]
    k: u32,
}

#[derive(Default)]
struct Count {
    requests: u64,
    misses: u64,
    per_node: HashMap<u64, (u64, u64)>,
}

enum Conn {
    One(Box<Client>),
    Many(Box<Cluster>),
}

impl Conn {
    fn search(&mut self, k: u32, q: &[f32]) -> (u64, HitKind) {
        match self {
            Conn::One(c) => (
                0,
                c.search_with(SearchRequest::new(k, q.to_vec()))
                    .expect("search")
                    .hit,
            ),
            Conn::Many(c) => {
                let node = c.nodes_for(q)[0];
                (node, c.search(k, q).expect("search").hit)
            }
        }
    }
}

fn connect(a: &Args) -> Conn {
    if a.single {
        let mut c =
            Client::connect_with(a.seed.as_str(), ClientOptions::default()).expect("connect");
        c.hello().expect("hello");
        return Conn::One(Box::new(c));
    }
    let mut c = Cluster::connect(&[a.seed.as_str()], ClientOptions::default()).expect("cluster");
    c.set_routing(if a.routing == "random" {
        ClusterRouting::Random
    } else {
        ClusterRouting::Centroid
    });
    Conn::Many(Box::new(c))
}

fn main() {
    let a = Arc::new(Args::parse());
    let trace = Arc::new(Trace::load(&a.trace).expect("trace"));
    let searches: Arc<Vec<u32>> = Arc::new(
        trace
            .ops
            .iter()
            .filter_map(|o| match o {
                Op::Search { vector, .. } => Some(*vector),
                _ => None,
            })
            .collect(),
    );
    let t0 = Instant::now();
    let handles: Vec<_> = (0..a.threads)
        .map(|t| {
            let (a, trace, searches) = (a.clone(), trace.clone(), searches.clone());
            std::thread::spawn(move || {
                let mut conn = connect(&a);
                let mut c = Count::default();
                let (warm, total) = (a.warm / a.threads, (a.warm + a.requests) / a.threads);
                for i in 0..total {
                    // Threads interleave over the trace in its order (and loop over it).
                    let v = searches[(i * a.threads + t) % searches.len()];
                    let (node, hit) = conn.search(a.k, trace.vector(v));
                    if i < warm {
                        continue;
                    }
                    c.requests += 1;
                    let miss = hit == HitKind::Miss;
                    c.misses += miss as u64;
                    let e = c.per_node.entry(node).or_default();
                    e.0 += 1;
                    e.1 += miss as u64;
                }
                c
            })
        })
        .collect();
    let mut all = Count::default();
    for h in handles {
        let c = h.join().expect("thread");
        all.requests += c.requests;
        all.misses += c.misses;
        for (n, (r, m)) in c.per_node {
            let e = all.per_node.entry(n).or_default();
            e.0 += r;
            e.1 += m;
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    let hit = 1.0 - all.misses as f64 / all.requests.max(1) as f64;
    let mut nodes: Vec<_> = all.per_node.into_iter().collect();
    nodes.sort();
    let per: Vec<String> = nodes
        .iter()
        .map(|(n, (r, m))| {
            format!(
                "{{\"node\": \"{n:016x}\", \"share\": {:.4}, \"hit_ratio\": {:.4}}}",
                *r as f64 / all.requests.max(1) as f64,
                1.0 - *m as f64 / (*r).max(1) as f64
            )
        })
        .collect();
    println!(
        "{{\"routing\": \"{}\", \"single\": {}, \"requests\": {}, \"hit_ratio\": {hit:.4}, \
         \"db_searches_per_request\": {:.4}, \"seconds\": {secs:.1}, \"nodes\": [{}]}}",
        a.routing,
        a.single,
        all.requests,
        1.0 - hit,
        per.join(", ")
    );
}
