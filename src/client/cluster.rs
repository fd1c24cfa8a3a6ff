//! [`Cluster`]: a client of a tier of akerd nodes (`docs/CLUSTER.md`). It fetches the
//! routing state (CLUSTER, protocol version 6) from any node, sends each search to the
//! owner of its query's nearest centroid, splits a batch by owner, sends writes to any
//! node and carries their positions into later searches (read-your-writes across
//! nodes). On a connection error a search is sent at once to the next node in
//! rendezvous order (at most [`ATTEMPTS_MAX`] nodes), the failed node treated as gone for
//! one lease and the state fetched again; a write moves on only when it never reached
//! the failed node, else it is [`ClientError::WriteInDoubt`]. Routing is for locality:
//! any node answers any query.
//!
//! ```no_run
//! # fn main() -> Result<(), aker::client::ClientError> {
//! use aker::client::{Cluster, ClientOptions};
//!
//! let mut c = Cluster::connect(&["10.0.0.1:7700", "10.0.0.2:7700"], ClientOptions::default())?;
//! let dim = c.state().dim as usize;
//! let pos = c.insert_with_position(7, &vec![0.5; dim])?;  // any node
//! let r = c.search(10, &vec![0.5; dim])?;                  // the owner; sees the insert
//! # Ok(())
//! # }
//! ```

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::{Client, ClientError, ClientOptions, Deleted, Result};
use crate::cluster::{nearest_centroid, owner_order};
use crate::protocol::{BatchItem, ClusterReply, SearchBatchRequest, SearchReply, SearchRequest};

/// The most nodes one request is tried on.
pub const ATTEMPTS_MAX: usize = 3;
/// The routing state is fetched again at most this often because of replies.
const REFRESH_MIN: Duration = Duration::from_millis(100);

/// Where searches go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClusterRouting {
    /// To the owner of the query's nearest centroid (the point of a cluster).
    Centroid,
    /// To a live node chosen at random (a baseline: every node caches everything).
    Random,
}

/// Requests this handle sent, retried and refetched.
#[derive(Clone, Debug, Default)]
pub struct ClusterCounters {
    /// Requests per node id.
    pub requests: HashMap<u64, u64>,
    /// Requests sent again to another node after a connection error.
    pub retries: u64,
    /// CLUSTER fetches after the first.
    pub refreshes: u64,
}

/// A client of a cluster of akerd nodes. One caller, like [`Client`]; one connection
/// per node, opened when first needed.
pub struct Cluster {
    opts: ClientOptions,
    seeds: Vec<String>,
    state: ClusterReply,
    conns: HashMap<u64, Client>,
    /// Centroid -> its owner order under `state` (emptied when the state changes).
    orders: HashMap<u32, Vec<u64>>,
    /// Nodes that failed a connection, avoided until then.
    suspect: HashMap<u64, Instant>,
    /// The newest write position seen: every later search carries it.
    position: u64,
    routing: ClusterRouting,
    last_fetch: Instant,
    rng: u64,
    counters: ClusterCounters,
}

/// An error after which the request may be sent to another node: the connection failed
/// or the server closed it (connection-level replies: SHUTTING_DOWN, BUSY).
fn is_connection_error(e: &ClientError) -> bool {
    match e {
        ClientError::Io(_) | ClientError::Closed | ClientError::Broken | ClientError::Timeout => {
            true
        }
        ClientError::Server { request_id, .. } => *request_id == 0,
        _ => false,
    }
}

impl Cluster {
    /// Connects to the first of `seeds` that answers CLUSTER.
    pub fn connect<S: AsRef<str>>(seeds: &[S], opts: ClientOptions) -> Result<Cluster> {
        let seeds: Vec<String> = seeds.iter().map(|s| s.as_ref().to_string()).collect();
        let (state, id, client) = fetch_from(&seeds, &opts)?;
        let mut conns = HashMap::new();
        conns.insert(id, client);
        Ok(Cluster {
            opts,
            seeds,
            state,
            conns,
            orders: HashMap::new(),
            suspect: HashMap::new(),
            position: 0,
            routing: ClusterRouting::Centroid,
            last_fetch: Instant::now(),
            rng: rand::random::<u64>() | 1,
            counters: ClusterCounters::default(),
        })
    }

    pub fn set_routing(&mut self, r: ClusterRouting) {
        self.routing = r;
    }

    /// The routing state as last fetched.
    pub fn state(&self) -> &ClusterReply {
        &self.state
    }

    pub fn counters(&self) -> &ClusterCounters {
        &self.counters
    }

    /// The newest write position this handle has seen (0: none).
    pub fn position(&self) -> u64 {
        self.position
    }

    /// Fetches the routing state again: over an open connection (to `prefer` first,
    /// the node whose reply said the state changed), else from a live node or a seed.
    pub fn refresh(&mut self) -> Result<()> {
        self.refresh_from(None)
    }

    fn refresh_from(&mut self, prefer: Option<u64>) -> Result<()> {
        self.last_fetch = Instant::now();
        self.counters.refreshes += 1;
        let mut open: Vec<u64> = self.conns.keys().copied().collect();
        open.sort_by_key(|&n| (Some(n) != prefer, self.is_suspect(n)));
        for n in open {
            let Some(c) = self.conns.get_mut(&n) else {
                continue;
            };
            match c.cluster() {
                Ok(state) => {
                    self.set_state(state);
                    return Ok(());
                }
                Err(_) => {
                    self.conns.remove(&n);
                }
            }
        }
        let mut addrs: Vec<String> = self
            .state
            .nodes
            .iter()
            .filter(|n| n.live && !self.is_suspect(n.node_id))
            .map(|n| n.advertise.clone())
            .collect();
        addrs.extend(self.seeds.iter().cloned());
        let (state, id, client) = fetch_from(&addrs, &self.opts)?;
        self.set_state(state);
        self.conns.insert(id, client);
        Ok(())
    }

    fn set_state(&mut self, state: ClusterReply) {
        self.state = state;
        self.orders.clear();
    }

    /// [`owner_order`] under the state held, computed once per centroid.
    fn owner_order(&mut self, centroid: u32) -> &[u64] {
        let state = &self.state;
        self.orders
            .entry(centroid)
            .or_insert_with(|| owner_order(state, centroid))
    }

    fn is_suspect(&self, node: u64) -> bool {
        self.suspect.get(&node).is_some_and(|t| Instant::now() < *t)
    }

    /// The nodes to try for a query, in order: its centroid's owners (or, with
    /// [`ClusterRouting::Random`], a random live node first), suspects last.
    pub fn nodes_for(&mut self, q: &[f32]) -> Vec<u64> {
        let c = nearest_centroid(&self.state, q);
        let mut order = self.owner_order(c).to_vec();
        if self.routing == ClusterRouting::Random {
            let live = self.state.nodes.iter().filter(|n| n.live).count().max(1);
            self.rng = crate::cluster::mix64(self.rng);
            let n = live.min(order.len());
            let by = (self.rng % n.max(1) as u64) as usize;
            order[..n].rotate_left(by);
        }
        let (ok, bad): (Vec<u64>, Vec<u64>) = order.into_iter().partition(|n| !self.is_suspect(*n));
        ok.into_iter().chain(bad).collect()
    }

    /// The owner of `q`'s nearest centroid, as this handle routes.
    pub fn owner_of(&self, q: &[f32]) -> Option<u64> {
        crate::cluster::owner(&self.state, nearest_centroid(&self.state, q))
    }

    /// A usable connection to `node`: the open one unless the server closed it while it
    /// was idle (then a write goes on a new one instead of failing, in doubt), else a
    /// new one.
    fn conn(&mut self, node: u64) -> Result<&mut Client> {
        if self.conns.get(&node).is_some_and(|c| !c.is_idle_usable()) {
            self.conns.remove(&node);
        }
        if !self.conns.contains_key(&node) {
            let addr = self
                .state
                .nodes
                .iter()
                .find(|n| n.node_id == node)
                .map(|n| n.advertise.clone())
                .ok_or_else(|| ClientError::Protocol(format!("node {node:016x} is unknown")))?;
            let mut c = Client::connect_with(addr.as_str(), self.opts.clone())?;
            c.hello()?;
            self.conns.insert(node, c);
        }
        Ok(self.conns.get_mut(&node).expect("inserted"))
    }

    /// Runs `f` on the nodes of `order` until one answers (at most [`ATTEMPTS_MAX`]).
    /// A node that cannot be reached, or that refuses at connection level (request id
    /// 0: SHUTTING_DOWN, BUSY), is suspected for a lease and the next one tried. A
    /// connection that fails after the request was sent is retried elsewhere only when
    /// `retry_sent` (searches); a write gets [`ClientError::WriteInDoubt`]: it may have
    /// committed there, and resending it could land before that late commit.
    fn on_nodes<T>(
        &mut self,
        order: &[u64],
        retry_sent: bool,
        mut f: impl FnMut(&mut Client) -> Result<T>,
    ) -> Result<(T, u64)> {
        let mut last = ClientError::Protocol("the cluster has no node".into());
        let mut tried = 0;
        for &node in order {
            if tried == ATTEMPTS_MAX {
                break;
            }
            if !self.state.nodes.iter().any(|n| n.node_id == node) {
                continue; // gone from a state fetched meanwhile
            }
            if tried > 0 {
                self.counters.retries += 1;
            }
            tried += 1;
            *self.counters.requests.entry(node).or_default() += 1;
            let sent = match self.conn(node) {
                Ok(c) => f(c),
                Err(e) if is_connection_error(&e) => {
                    self.suspect(node);
                    last = e;
                    continue;
                }
                Err(e) => return Err(e),
            };
            match sent {
                Ok(v) => return Ok((v, node)),
                Err(e) if is_connection_error(&e) => {
                    let refused = matches!(e, ClientError::Server { request_id: 0, .. });
                    self.suspect(node);
                    if !refused && !retry_sent {
                        let addr = self.address(node).unwrap_or_default();
                        return Err(ClientError::WriteInDoubt {
                            node: addr,
                            cause: Box::new(e),
                        });
                    }
                    last = e;
                }
                Err(e) => return Err(e),
            }
        }
        Err(last)
    }

    /// A node whose connection failed: dropped, avoided for a lease, the state fetched
    /// again (from another node).
    fn suspect(&mut self, node: u64) {
        self.conns.remove(&node);
        let lease = Duration::from_millis(self.state.lease_ms as u64);
        self.suspect.insert(node, Instant::now() + lease);
        let _ = self.refresh_from(None);
    }

    fn address(&self, node: u64) -> Option<String> {
        self.state
            .nodes
            .iter()
            .find(|n| n.node_id == node)
            .map(|n| n.advertise.clone())
    }

    /// A reply's routing version differs from the state's: fetch it again (at most every
    /// [`REFRESH_MIN`]; nodes may disagree for a renewal period).
    fn note_routing(&mut self, v: u64, from: Option<u64>) {
        if v != 0 && v != self.state.routing_version && self.last_fetch.elapsed() >= REFRESH_MIN {
            let _ = self.refresh_from(from);
        }
    }

    pub fn search(&mut self, k: u32, q: &[f32]) -> Result<SearchReply> {
        self.search_with(SearchRequest::new(k, q.to_vec()))
    }

    /// SEARCH on the owner of the query's centroid; `at_position` defaults to the newest
    /// write position this handle has seen.
    pub fn search_with(&mut self, mut req: SearchRequest) -> Result<SearchReply> {
        if req.at_position.is_none() && self.position != 0 {
            req.at_position = Some(self.position);
        }
        let order = self.nodes_for(&req.vector);
        let (r, node) = self.on_nodes(&order, true, |c| c.search_with(req.clone()))?;
        self.note_routing(r.routing_version, Some(node));
        Ok(r)
    }

    pub fn search_batch(&mut self, k: u32, queries: &[Vec<f32>]) -> Result<Vec<BatchItem>> {
        self.search_batch_with(SearchBatchRequest::new(k, queries.to_vec()))
    }

    /// The batch split by owner, one SEARCH_BATCH per node; items in the queries' order.
    pub fn search_batch_with(&mut self, mut req: SearchBatchRequest) -> Result<Vec<BatchItem>> {
        if req.at_position.is_none() && self.position != 0 {
            req.at_position = Some(self.position);
        }
        let queries = std::mem::take(&mut req.queries);
        let mut groups: Vec<(Vec<u64>, Vec<usize>)> = Vec::new();
        for (i, q) in queries.iter().enumerate() {
            let order = self.nodes_for(q);
            match groups.iter_mut().find(|(o, _)| o.first() == order.first()) {
                Some((_, idx)) => idx.push(i),
                None => groups.push((order, vec![i])),
            }
        }
        let mut items: Vec<Option<BatchItem>> = vec![None; queries.len()];
        let mut newest = 0;
        let mut from = None;
        for (order, idx) in groups {
            let part = SearchBatchRequest {
                queries: idx.iter().map(|&i| queries[i].clone()).collect(),
                ..req.clone()
            };
            let (got, node) = self.on_nodes(&order, true, |c| c.search_batch_with(part.clone()))?;
            from = Some(node);
            for (&i, item) in idx.iter().zip(got) {
                if let Ok(s) = &item {
                    newest = s.routing_version;
                }
                items[i] = Some(item);
            }
        }
        self.note_routing(newest, from);
        Ok(items
            .into_iter()
            .map(|i| i.expect("every query answered"))
            .collect())
    }

    /// INSERT on the owner of the vector's centroid (any node would do); the position
    /// is carried into this handle's later searches.
    pub fn insert_with_position(&mut self, id: u64, v: &[f32]) -> Result<u64> {
        let order = self.nodes_for(v);
        let (p, _) = self.on_nodes(&order, false, |c| c.insert_with_position(id, v))?;
        self.position = self.position.max(p);
        Ok(p)
    }

    pub fn insert(&mut self, id: u64, v: &[f32]) -> Result<()> {
        self.insert_with_position(id, v).map(drop)
    }

    /// DELETE on any live node; the position is carried into later searches.
    pub fn delete_with_position(&mut self, id: u64) -> Result<Deleted> {
        let mut order: Vec<u64> = self
            .state
            .nodes
            .iter()
            .filter(|n| n.live)
            .map(|n| n.node_id)
            .collect();
        order.sort_by_key(|&n| crate::cluster::mix64(n ^ id));
        order.sort_by_key(|&n| self.is_suspect(n));
        let (d, _) = self.on_nodes(&order, false, |c| c.delete_with_position(id))?;
        self.position = self.position.max(d.position);
        Ok(d)
    }

    pub fn delete(&mut self, id: u64) -> Result<bool> {
        self.delete_with_position(id).map(|d| d.existed)
    }
}

/// CLUSTER from the first of `addrs` that answers: the state, the node's id and the
/// connection (kept for its requests).
fn fetch_from(addrs: &[String], opts: &ClientOptions) -> Result<(ClusterReply, u64, Client)> {
    let mut last = ClientError::Protocol("no seed address given".into());
    for a in addrs {
        let tried = Client::connect_with(a.as_str(), opts.clone()).and_then(|mut c| {
            c.hello()?;
            let s = c.cluster()?;
            Ok((s, c))
        });
        match tried {
            Ok((s, c)) => {
                let id = s.self_id;
                return Ok((s, id, c));
            }
            Err(e) => last = e,
        }
    }
    Err(last)
}
