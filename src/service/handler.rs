//! `Service` over the engine: one `AkerService` per executor, all sharing [`Shared`]
//! (router, every shard's handle, the backend queue). See the diagram in `mod.rs`.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

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

/// A MISS token (version 2, cache-aside): the shard the miss was taken on and its delete
/// log's sequence number then. A FILL presenting it has every id that shard deleted
/// since stripped, on any connection, however long after.
const TOKEN_SEQ_BITS: u32 = 48;

fn miss_token(shard: usize, delete_seq: u64) -> u64 {
    debug_assert!(delete_seq < 1 << TOKEN_SEQ_BITS && shard < 1 << 16);
    ((shard as u64) << TOKEN_SEQ_BITS) | (delete_seq & ((1 << TOKEN_SEQ_BITS) - 1))
}

/// (shard, delete seq) of a token; `None` for a shard this server does not have.
fn token_parts(token: u64, shards: usize) -> Option<(usize, u64)> {
    let shard = (token >> TOKEN_SEQ_BITS) as usize;
    (shard < shards).then_some((shard, token & ((1 << TOKEN_SEQ_BITS) - 1)))
}

pub(crate) struct AkerService {
    shared: Arc<Shared>,
    metrics: Arc<ExecutorMetrics>,
    /// Cache-aside only. A client FILLs on the connection it missed on (so on this
    /// executor): the ticket of that miss carries the delete sequence number from before
    /// the client asked its database, so a delete acknowledged in between is stripped at
    /// admission. A FILL without one gets a fresh ticket (and only the deletes after it).
    pending_fills: RefCell<PendingFills>,
}

#[derive(Default)]
struct PendingFills {
    map: HashMap<QueryKey, (usize, MissTicket)>,
    order: VecDeque<QueryKey>,
}

impl PendingFills {
    fn put(&mut self, shard: usize, ticket: MissTicket) {
        let key = ticket.key;
        if self.map.insert(key, (shard, ticket)).is_none() {
            self.order.push_back(key);
        }
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

    async fn search(&self, s: SearchRequest, ctx: &RequestContext) -> ServiceResult {
        check_collection(s.collection)?;
        let sh = &*self.shared;
        let k = s.k as usize;
        if s.bypass_cache {
            self.metrics.count(|c| c.searches_bypass += 1);
            let answer = self.backend_search(s.vector.into(), k, ctx).await?;
            return Ok(miss_reply(&answer.candidates, k));
        }
        let q = &s.vector[..];
        let probes = sh.router.route_probes(q);
        let s1 = probes.first();
        if s.refresh_entry {
            self.metrics.count(|c| c.searches_refresh += 1);
            let ticket = sh.shards[s1].reader.miss_ticket(q, k, true)?;
            return self.resolve_miss(s1, ticket, ctx).await;
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
            (s, Lookup::Miss(ticket)) => self.resolve_miss(s, ticket, ctx).await,
        }
    }

    /// A miss: the ticket (taken before the backend call: its sequence numbers guard
    /// admission against deletes in between), the backend's `k + Δ`, the reply, and the
    /// admission handed to the shard's owner.
    async fn resolve_miss(
        &self,
        shard: usize,
        ticket: MissTicket,
        ctx: &RequestContext,
    ) -> ServiceResult {
        let sh = &*self.shared;
        if !sh.backend.has_store() {
            // Cache-aside: the client searches its database and FILLs, presenting the
            // token (version 2) or on this connection (version 1: the pending ticket).
            let token = miss_token(shard, ticket.delete_seq);
            self.pending_fills.borrow_mut().put(shard, ticket);
            let mut reply = miss_reply(&[], 0);
            if let Reply::Search(s) = &mut reply {
                s.token = Some(token);
            }
            return Ok(reply);
        }
        let k = ticket.k;
        let answer = self
            .backend_search(ticket.query.clone(), k + sh.cache_cfg.delta, ctx)
            .await?;
        let reply = miss_reply(&answer.candidates, k);
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

    async fn backend_search(
        &self,
        query: Arc<[f32]>,
        n: usize,
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
        let acks = rx.recv_async().await.map_err(|_| unavailable())??;
        for a in acks {
            a.recv_async().await.map_err(|_| unavailable())??;
        }
        Ok(Reply::Inserted)
    }

    async fn delete(&self, d: DeleteRequest, ctx: &RequestContext) -> ServiceResult {
        check_collection(d.collection)?;
        let (tx, rx) = flume::bounded(1);
        self.submit(Job::Delete {
            id: d.id,
            deadline: ctx.deadline,
            reply: tx,
        })?;
        let (existed, acks) = rx.recv_async().await.map_err(|_| unavailable())??;
        let mut cached = false;
        for a in acks {
            cached |= a.recv_async().await.map_err(|_| unavailable())?.cached;
        }
        // Cache-aside has no store to ask: "existed" is whether the cache held the id.
        Ok(Reply::Deleted {
            existed: existed.unwrap_or(cached),
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
        let (shard, ticket) = match (f.token, pending) {
            // The token names the deletes to strip: every one since its miss (Stale,
            // admitted = 0, when the shard's delete log no longer reaches back to it).
            (Some(token), _) => {
                let (s, seq) = token_parts(token, sh.shards.len()).ok_or_else(|| {
                    rejection(Status::BadRequest, "the FILL token names no shard here")
                })?;
                let t = sh.shards[s].reader.miss_ticket(&f.query, k, false)?;
                (
                    s,
                    MissTicket {
                        delete_seq: seq.min(t.delete_seq),
                        ..t
                    },
                )
            }
            (None, Some(p)) => p,
            // No miss to go by: every delete the log holds is stripped, and the FILL is
            // declined once the log has dropped any (a delete before the window could be
            // in the answer).
            (None, None) => {
                let [s1, _] = sh.router.route_write(&f.query);
                let t = sh.shards[s1].reader.miss_ticket(&f.query, k, false)?;
                (s1, MissTicket { delete_seq: 0, ..t })
            }
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
                Request::Stats => (
                    Op::Stats,
                    Ok(Reply::Stats(self.shared.snapshot().render_stats())),
                ),
                Request::Hello | Request::Ping(_) => {
                    return Err(rejection(
                        Status::Internal,
                        "HELLO and PING are the connection layer's",
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
