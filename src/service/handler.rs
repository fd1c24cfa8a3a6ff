//! `Service` over the engine: one `AkerService` per executor, all sharing [`Shared`]
//! (router, every shard's handle, the backend queue). See the diagram in `mod.rs`.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use shards::exact_table::QueryKey;
use shards::owner::OwnerMsg;
use shards::sharded::lookup_across;
use shards::{Admission, Candidate, Lookup, MissTicket};

use super::backend::{BackendAnswer, Job};
use super::Shared;
use crate::metrics::{ExecutorMetrics, Op};
use crate::protocol::{
    DeleteRequest, FillRequest, HitKind, InsertRequest, Neighbor, Rejection, Reply, Request,
    SearchReply, SearchRequest, Status,
};
use crate::server::{LocalBoxFuture, RequestContext, Service, ServiceInfo, ServiceResult};

/// Cache-aside: miss tickets kept per executor for the FILL that follows a miss.
const PENDING_FILLS_MAX: usize = 4096;

/// The longest a SEARCH AT_POSITION (version 5) waits for the change stream to apply its
/// position (less when its deadline comes first); still behind then, the database
/// answers it.
const POSITION_WAIT: Duration = Duration::from_millis(100);
/// How often a search waiting for a position looks at the applied one again.
const POSITION_POLL: Duration = Duration::from_millis(1);

/// A MISS token (version 2, cache-aside): `shard (12 bits) | epoch (20) | delete seq (32)`:
/// the shard the miss was taken on, this process's epoch, and that shard's delete-log
/// sequence number then. A FILL presenting it has every id the shard deleted since
/// stripped, on any connection. The epoch (random at start) makes a token from before
/// a restart, whose delete log started again at 0, count as no token at all.
const TOKEN_SEQ_BITS: u32 = 32;
const TOKEN_EPOCH_BITS: u32 = 20;
const TOKEN_SHARD_BITS: u32 = 12;

/// `None` where the fields do not fit (a shard past 4,095, a delete seq past 2^32): the
/// MISS then carries no token and its FILL follows the rule for none.
fn miss_token(shard: usize, epoch: u32, delete_seq: u64) -> Option<u64> {
    let fits = (shard as u64) < 1 << TOKEN_SHARD_BITS && delete_seq < 1 << TOKEN_SEQ_BITS;
    let epoch = (epoch & ((1 << TOKEN_EPOCH_BITS) - 1)) as u64;
    let token = ((shard as u64) << (TOKEN_SEQ_BITS + TOKEN_EPOCH_BITS))
        | (epoch << TOKEN_SEQ_BITS)
        | delete_seq;
    fits.then_some(token)
}

/// (shard, delete seq) of a token of this process; `None` for another epoch's (a
/// restart, another server) or a shard this server does not have.
fn token_parts(token: u64, epoch: u32, shards: usize) -> Option<(usize, u64)> {
    let shard = (token >> (TOKEN_SEQ_BITS + TOKEN_EPOCH_BITS)) as usize;
    let e = ((token >> TOKEN_SEQ_BITS) & ((1 << TOKEN_EPOCH_BITS) - 1)) as u32;
    let seq = token & ((1 << TOKEN_SEQ_BITS) - 1);
    (shard < shards && e == epoch & ((1 << TOKEN_EPOCH_BITS) - 1)).then_some((shard, seq))
}

pub(crate) struct AkerService {
    shared: Arc<Shared>,
    metrics: Arc<ExecutorMetrics>,
    /// Cache-aside only: the tickets of recent misses on this executor, by query, for
    /// a FILL without a token (version 1) on a connection of this executor. A ticket
    /// carries the delete sequence number from before the client asked its database, so
    /// a delete acknowledged in between is stripped at admission. A FILL with neither a
    /// token nor a ticket strips every logged delete (declined once the log wrapped).
    pending_fills: RefCell<PendingFills>,
}

#[derive(Default)]
struct PendingFills {
    map: HashMap<QueryKey, (usize, MissTicket)>,
    order: VecDeque<QueryKey>,
}

impl PendingFills {
    /// Keeps a miss's ticket for its FILL. A second miss of the same query (any
    /// connection on this executor, any k) merges into the first: the older delete and
    /// insert positions (the first client's database answer may predate a delete the
    /// second saw), and a replacement if either needs one.
    fn put(&mut self, shard: usize, ticket: MissTicket) {
        let key = ticket.key;
        let merged = match self.map.remove(&key) {
            Some((s, old)) if s == shard => MissTicket {
                delete_seq: old.delete_seq.min(ticket.delete_seq),
                insert_seq: old.insert_seq.min(ticket.insert_seq),
                replace: old.replace || ticket.replace,
                ..ticket
            },
            // Another shard's sequence numbers are not comparable: the first one stays.
            Some((s, old)) => {
                let replace = old.replace || ticket.replace;
                self.map.insert(key, (s, MissTicket { replace, ..old }));
                return;
            }
            None => {
                self.order.push_back(key);
                ticket
            }
        };
        self.map.insert(key, (shard, merged));
        while self.map.len() > PENDING_FILLS_MAX {
            match self.order.pop_front() {
                Some(old) => {
                    self.map.remove(&old);
                }
                None => break,
            }
        }
        // Keys FILLed already leave stale entries in `order`; keep it bounded too.
        if self.order.len() > 2 * PENDING_FILLS_MAX {
            let map = &self.map;
            self.order.retain(|k| map.contains_key(k));
        }
    }

    fn take(&mut self, key: &QueryKey) -> Option<(usize, MissTicket)> {
        self.map.remove(key)
    }
}

fn rejection(status: Status, msg: impl Into<String>) -> Rejection {
    Rejection::new(status, msg)
}

fn unavailable() -> Rejection {
    rejection(
        Status::Unavailable,
        "a shard owner or the backend has stopped",
    )
}

fn check_collection(c: u32) -> Result<(), Rejection> {
    if c == 0 {
        Ok(())
    } else {
        Err(rejection(
            Status::UnknownCollection,
            format!("collection {c} is not served (only 0)"),
        ))
    }
}

fn wire_kind(k: shards::HitKind) -> HitKind {
    match k {
        shards::HitKind::Exact => HitKind::Exact,
        shards::HitKind::Alias => HitKind::Alias,
        shards::HitKind::Approximate => HitKind::Approximate,
        shards::HitKind::Miss => HitKind::Miss,
    }
}

fn miss_reply(answer: &[Candidate], k: usize) -> Reply {
    Reply::Search(SearchReply {
        token: None,
        routing_version: 0,
        hit: HitKind::Miss,
        distances_to_query: true,
        neighbors: answer
            .iter()
            .take(k)
            .map(|c| Neighbor {
                id: c.id,
                distance: c.distance,
            })
            .collect(),
    })
}

impl AkerService {
    pub(crate) fn new(shared: Arc<Shared>, executor: usize) -> AkerService {
        let metrics = shared.metrics[executor].clone();
        AkerService {
            shared,
            metrics,
            pending_fills: RefCell::new(PendingFills::default()),
        }
    }

    /// CLUSTER (version 6): the routing state as this node sees it.
    fn cluster(&self) -> ServiceResult {
        match &self.shared.cluster {
            Some(c) => Ok(Reply::Cluster((*c.view()).clone())),
            None => Err(rejection(
                Status::Unsupported,
                "this akerd is not in a cluster ([cluster] name is unset)",
            )),
        }
    }

    /// The routing version SEARCH replies carry (version 6): 0 outside a cluster.
    fn routing_version(&self) -> u64 {
        self.shared
            .cluster
            .as_ref()
            .map_or(0, |c| c.routing_version())
    }

    async fn search(&self, s: SearchRequest, ctx: &RequestContext) -> ServiceResult {
        let mut reply = self.search_inner(s, ctx).await?;
        if let Reply::Search(r) = &mut reply {
            r.routing_version = self.routing_version();
        }
        Ok(reply)
    }

    async fn search_inner(&self, s: SearchRequest, ctx: &RequestContext) -> ServiceResult {
        check_collection(s.collection)?;
        let sh = &*self.shared;
        let k = s.k as usize;
        // AT_POSITION (version 5): the cache answers only once it holds every change up
        // to the position; otherwise the database does (read-your-writes).
        let behind = match s.at_position {
            Some(at) => {
                self.metrics.count(|c| c.searches_at_position += 1);
                !s.bypass_cache && !self.reaches_position(at, ctx).await
            }
            None => false,
        };
        if behind {
            self.metrics.count(|c| c.searches_position_database += 1);
        }
        // The change stream further behind than max_staleness_ms: the database answers.
        let stale = || {
            sh.backend
                .pgvector()
                .is_some_and(|pg| pg.changes.too_stale())
        };
        if s.bypass_cache || behind || stale() {
            if s.bypass_cache {
                self.metrics.count(|c| c.searches_bypass += 1);
            }
            let answer = self
                .backend_search(s.vector.into(), k, s.at_position, ctx)
                .await?;
            return Ok(miss_reply(&answer.candidates, k));
        }
        let q = &s.vector[..];
        let probes = sh.router.route_probes(q);
        if let Some(c) = &sh.cluster {
            c.observe(probes.centroid(), q);
        }
        let s1 = probes.first();
        if s.refresh_entry {
            self.metrics.count(|c| c.searches_refresh += 1);
            // The replacement keeps a larger cached k (the engine never shrinks an
            // entry): ask the backend for that many, answer the request's k.
            let reader = &sh.shards[s1].reader;
            let held = reader.representative_k(QueryKey::new(q)).unwrap_or(0);
            let ticket = reader.miss_ticket(q, k.max(held), true)?;
            return self.resolve_miss(s1, ticket, k, ctx).await;
        }
        // The hit path: lock-free reads of the two nearest centroids' shards (and those a
        // rebalance moved them from) on this core (the protocol validated q and k).
        match lookup_across(&probes, |s| &*sh.shards[s].reader, q, k) {
            (s, Lookup::Hit(hit)) => {
                let h = &sh.shards[s];
                // Owner work is optional here: dropped and counted when its queue is full.
                if let Some(key) = hit.link {
                    h.hint(OwnerMsg::LinkAlias { key, rep: hit.rep });
                }
                // The hit added the inserts its entry lacked; the owner merges them for good.
                h.catch_up(hit.catch_up);
                h.slow_path_credit();
                if let Some(checks) = &sh.recall {
                    checks.offer(
                        hit.kind,
                        q,
                        k,
                        k + sh.cache_cfg.delta,
                        &hit.results,
                        s,
                        || sh.backend.queue_len(),
                        |replace| h.reader.miss_ticket(q, k, replace).ok(),
                    );
                }
                Ok(Reply::Search(SearchReply {
                    token: None,
                    routing_version: 0,
                    hit: wire_kind(hit.kind),
                    distances_to_query: hit.exact_distances,
                    // Same layout: the collect reuses the engine's allocation.
                    neighbors: hit
                        .results
                        .into_iter()
                        .map(|n| Neighbor {
                            id: n.id,
                            distance: n.distance,
                        })
                        .collect(),
                }))
            }
            // A miss, or a sampled verification (Potluck+): answered by the backend.
            (s, Lookup::Miss(ticket)) => self.resolve_miss(s, ticket, k, ctx).await,
        }
    }

    /// Whether the cache may answer a search AT_POSITION `at`: always without a change
    /// stream to wait for (the embedded store, cache-aside: a write through akerd is in
    /// every shard before it is acknowledged); with pgvector, once the stream has been
    /// applied up to `at`. Behind it, the follower is woken and the search waits on the
    /// executor (1 ms sleeps, never blocking it) until the stream gets there, its
    /// deadline, or [`POSITION_WAIT`]. pgvector without a stream (changes off, or not
    /// allowed by the server): never (a row changed in the database by another client
    /// may be cached as it was).
    async fn reaches_position(&self, at: u64, ctx: &RequestContext) -> bool {
        let Some(pg) = self.shared.backend.pgvector() else {
            return true;
        };
        let feed = &pg.changes;
        if !feed.following() {
            return false;
        }
        if feed.applied() >= at {
            return true;
        }
        self.metrics.count(|c| c.searches_position_waited += 1);
        feed.wake();
        let cap = Instant::now() + POSITION_WAIT;
        let until = ctx.deadline.map_or(cap, |d| d.min(cap));
        while Instant::now() < until {
            glommio::timer::sleep(POSITION_POLL).await;
            if !feed.following() {
                return false;
            }
            if feed.applied() >= at {
                return true;
            }
        }
        false
    }

    /// A miss: the ticket (taken before the backend call: its sequence numbers guard
    /// admission against deletes in between), the backend's `k + Δ`, the reply, and the
    /// admission handed to the shard's owner.
    async fn resolve_miss(
        &self,
        shard: usize,
        ticket: MissTicket,
        reply_k: usize,
        ctx: &RequestContext,
    ) -> ServiceResult {
        let sh = &*self.shared;
        // An entry that would have served was too far behind the insert log.
        sh.shards[shard].catch_up(ticket.catch_up);
        if !sh.backend.has_store() {
            // Cache-aside: the client searches its database and FILLs, presenting the
            // token (version 2) or on this connection (version 1: the pending ticket).
            let token = miss_token(shard, sh.token_epoch, ticket.delete_seq);
            self.pending_fills.borrow_mut().put(shard, ticket);
            let mut reply = miss_reply(&[], 0);
            if let Reply::Search(s) = &mut reply {
                s.token = token;
            }
            return Ok(reply);
        }
        let k = ticket.k;
        let answer = self
            // No position: the cache has applied the request's, if any (a read replica
            // is held to what the cache has applied).
            .backend_search(ticket.query.clone(), k + sh.cache_cfg.delta, None, ctx)
            .await?;
        let reply = miss_reply(&answer.candidates, reply_k.min(k));
        if answer.complete {
            sh.shards[shard].hint(OwnerMsg::Admit {
                ticket,
                answer: answer.candidates,
                ack: None,
            });
        } else {
            // Fewer rows than asked: what lies past them is unknown, so the answer is
            // not kept as the query's k + Δ nearest.
            self.metrics.count(|c| c.backend_short_answers += 1);
        }
        Ok(reply)
    }

    /// `at_position`: the answer must hold it (pgvector's read replicas).
    async fn backend_search(
        &self,
        query: Arc<[f32]>,
        n: usize,
        at_position: Option<u64>,
        ctx: &RequestContext,
    ) -> Result<BackendAnswer, Rejection> {
        if !self.shared.backend.has_store() {
            return Ok(BackendAnswer {
                candidates: Vec::new(),
                complete: false,
            });
        }
        let (tx, rx) = flume::bounded(1);
        let job = Job::Search {
            query,
            n,
            deadline: ctx.deadline,
            at_position,
            reply: tx,
        };
        if let Err(e) = self.shared.backend.submit(job) {
            self.metrics.count(|c| c.backend_busy += 1);
            return Err(e);
        }
        let t = Instant::now();
        let answer = rx.recv_async().await.map_err(|_| unavailable())?;
        self.metrics.record_backend(t.elapsed());
        answer.inspect_err(|_| self.metrics.count(|c| c.backend_errors += 1))
    }

    async fn insert(&self, i: InsertRequest, ctx: &RequestContext) -> ServiceResult {
        check_collection(i.collection)?;
        let vector: Arc<[f32]> = i.vector.into();
        let near = self.shared.router.route_write(&vector);
        let (tx, rx) = flume::bounded(1);
        self.submit(Job::Insert {
            id: i.id,
            vector,
            payload: i.payload,
            near,
            deadline: ctx.deadline,
            reply: tx,
        })?;
        let (acks, position) = rx.recv_async().await.map_err(|_| unavailable())??;
        for a in acks {
            a.recv_async().await.map_err(|_| unavailable())??;
        }
        Ok(Reply::Inserted {
            position: position.unwrap_or(0),
        })
    }

    async fn delete(&self, d: DeleteRequest, ctx: &RequestContext) -> ServiceResult {
        check_collection(d.collection)?;
        let (tx, rx) = flume::bounded(1);
        self.submit(Job::Delete {
            id: d.id,
            deadline: ctx.deadline,
            reply: tx,
        })?;
        let (existed, acks, position) = rx.recv_async().await.map_err(|_| unavailable())??;
        let mut cached = false;
        for a in acks {
            cached |= a.recv_async().await.map_err(|_| unavailable())?.cached;
        }
        // Cache-aside has no store to ask: "existed" is whether the cache held the id.
        Ok(Reply::Deleted {
            existed: existed.unwrap_or(cached),
            position: position.unwrap_or(0),
        })
    }

    fn submit(&self, job: Job) -> Result<(), Rejection> {
        self.shared.backend.submit(job).inspect_err(|e| {
            if e.status == Status::Busy {
                self.metrics.count(|c| c.backend_busy += 1);
            }
        })
    }

    async fn fill(&self, f: FillRequest) -> ServiceResult {
        check_collection(f.collection)?;
        let sh = &*self.shared;
        if sh.backend.has_store() {
            return Err(rejection(
                Status::Unsupported,
                "FILL needs a cache-aside backend",
            ));
        }
        let k = f.k as usize;
        let key = QueryKey::new(&f.query);
        let pending = self.pending_fills.borrow_mut().take(&key);
        let (shard, base) = match pending {
            Some((s, t)) => (s, Some(t)),
            None => (sh.router.route_write(&f.query)[0], None),
        };
        let reader = &sh.shards[shard].reader;
        // A query whose entry holds fewer than k is replaced by this answer.
        let replace = reader.representative_k(key).is_some_and(|held| held < k);
        let fresh = reader.miss_ticket(&f.query, k, replace)?;
        // The token counts only for this shard, in this process, at a seq it has reached.
        let token_seq = f
            .token
            .and_then(|t| token_parts(t, sh.token_epoch, sh.shards.len()))
            .filter(|&(s, seq)| s == shard && seq <= fresh.delete_seq)
            .map(|(_, seq)| seq);
        let ticket = match (base, token_seq) {
            // The miss's own ticket (its insert position, seeds, verification), with
            // the older of the two delete positions.
            (Some(p), seq) => MissTicket {
                k,
                delete_seq: seq.map_or(p.delete_seq, |s| s.min(p.delete_seq)),
                replace: p.replace || replace,
                ..p
            },
            // The deletes since the token's miss are stripped (Stale, admitted = 0,
            // once the shard's delete log no longer reaches back to it).
            (None, Some(seq)) => MissTicket {
                delete_seq: seq,
                ..fresh
            },
            // No miss to go by (or a token of another shard, process or future seq):
            // every delete the log holds is stripped, and the FILL is declined once the
            // log has dropped any (a delete before the window could be in the answer).
            (None, None) => MissTicket {
                delete_seq: 0,
                ..fresh
            },
        };
        let answer: Vec<Candidate> = f.candidates.into_iter().map(Candidate::from).collect();
        let (tx, rx) = flume::bounded(1);
        sh.shards[shard]
            .sender()
            .send_async(OwnerMsg::Admit {
                ticket,
                answer,
                ack: Some(tx),
            })
            .await
            .map_err(|_| unavailable())?;
        let admission = rx.recv_async().await.map_err(|_| unavailable())?;
        let admitted = matches!(admission, Admission::Admitted(_));
        if admitted {
            self.metrics.count(|c| c.fills_admitted += 1);
        }
        Ok(Reply::Filled { admitted })
    }

    async fn flush(&self) -> ServiceResult {
        // The guard ends the FLUSH for the snapshots however this future ends.
        let _flushing = match &self.shared.snapshots {
            Some(st) => {
                let (guard, removed) = st.flush_begins();
                let _ = removed.recv_async().await;
                Some(guard)
            }
            None => None,
        };
        self.flush_shards().await
    }

    async fn flush_shards(&self) -> ServiceResult {
        self.shared.router.forget_all_previous();
        let mut acks = Vec::with_capacity(self.shared.shards.len());
        for h in &self.shared.shards {
            let (tx, rx) = flume::bounded(1);
            h.sender()
                .send_async(OwnerMsg::Flush { ack: tx })
                .await
                .map_err(|_| unavailable())?;
            acks.push(rx);
        }
        for a in acks {
            a.recv_async().await.map_err(|_| unavailable())?;
        }
        Ok(Reply::Flushed)
    }
}

impl Service for AkerService {
    fn info(&self) -> ServiceInfo {
        self.shared.info
    }

    /// The service renders STATS and /metrics from one snapshot that holds the server's
    /// counters too (`snapshot.rs`).
    fn stats_has_server_lines(&self) -> bool {
        true
    }

    fn handle<'a>(
        &'a self,
        req: Request,
        ctx: RequestContext,
    ) -> LocalBoxFuture<'a, ServiceResult> {
        Box::pin(async move {
            let (op, result) = match req {
                Request::Search(s) => (Op::Search, self.search(s, &ctx).await),
                Request::Insert(i) => (Op::Insert, self.insert(i, &ctx).await),
                Request::Delete(d) => (Op::Delete, self.delete(d, &ctx).await),
                Request::Fill(f) => (Op::Fill, self.fill(f).await),
                Request::Flush => (Op::Flush, self.flush().await),
                Request::Stats => (Op::Stats, Ok(Reply::Stats(self.shared.stats_text()))),
                Request::Cluster => (Op::Stats, self.cluster()),
                Request::Hello | Request::Ping(_) | Request::Auth(_) | Request::SearchBatch(_) => {
                    return Err(rejection(
                        Status::Internal,
                        "HELLO, PING, AUTH and SEARCH_BATCH are the connection layer's",
                    ))
                }
            };
            let kind = match &result {
                Ok(Reply::Search(r)) => Some(r.hit.code()),
                _ => None,
            };
            self.metrics
                .record(op, kind, ctx.received.elapsed(), result.is_ok());
            result
        })
    }
}
