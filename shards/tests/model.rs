//! The engine against a model: a second, deliberately plain implementation of
//! ALGORITHM.md (vectors of structs, linear scans, no indexes), driven through random
//! sequences of searches, inserts, deletes, evictions and in-flight misses. With the
//! engine on its brute-force filter, both must agree step for step: the same hit kind
//! and the same ids in the same order. Invariants are checked after every step.
//!
//! Every run picks a metric. The model computes the thresholds' unit (`gap.rs`: the
//! angular gap and `minD` on `ip`) with the engine's own numeric helpers
//! (`shards::gap::Gauge`, unit-tested there), so that the two agree to the bit at
//! near-ties; all else is its own.

use proptest::prelude::*;

use shards::gap::{norm, Gauge};
use shards::store::ExactStore;
use shards::{
    Admission, Backend, Cache, CacheConfig, Capacity, FilterKind, HitKind, Lookup, Metric,
    PolicyConfig,
};

// ---------------------------------------------------------------------------- model

#[derive(Clone, Debug)]
struct MRep {
    id: u64,
    q: Vec<f32>,
    k: usize,
    /// (id, distance to q, vector), ascending by (distance, id).
    list: Vec<(u64, f32, Vec<f32>)>,
    tau: f32,
    cursor: u64,
    aliases: Vec<Vec<f32>>,
}

#[derive(Clone, Debug)]
struct Params {
    delta: usize,
    capacity: usize,
    candidates: usize,
    batch: u64,
    max_steps: usize,
    risk_threshold: f64,
    log_cap: usize,
    proximity: Option<f32>,
    metric: Metric,
    /// `CacheConfig::hit_check_records_max`.
    window: u64,
}

struct Model {
    p: Params,
    reps: Vec<MRep>,
    next_id: u64,
    /// (seq, id, vector or None once deleted)
    log: Vec<(u64, u64, Option<Vec<f32>>)>,
    last_seq: u64,
    head: u64,
    rr_last: u64,
    deletes: Vec<(u64, u64)>,
    /// Set by a lookup that missed because the query's entry holds fewer than the `k`
    /// asked for: the admission that follows replaces it.
    replace_next: bool,
}

fn before(a: (f32, u64), b: (f32, u64)) -> bool {
    a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).is_lt()
}

impl Model {
    /// The default fast path: the nearest representative as the filter sees it (on ip,
    /// by -dot with RQ's direction, against maxD per unit of |RQ|).
    fn nearest_fast_path(&mut self, id: u64, v: &[f32]) {
        let g = self.gauge();
        let mut near: Vec<(f32, u64, usize)> = self
            .reps
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let p = g.filter_point(&std::sync::Arc::from(&r.q[..]));
                (self.dist(v, &p), r.id, i)
            })
            .collect();
        near.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        if let Some(&(df, _, i)) = near.first() {
            let max_d = self.reps[i].list.last().unwrap().1;
            let d = self.dist(v, &self.reps[i].q);
            if df < g.filter_max_d(max_d, norm(&self.reps[i].q)) && d < max_d {
                self.merge(i, id, d, v);
            }
        }
    }

    fn new(p: Params) -> Self {
        // The engine's ring is no larger than the log's cap.
        let window = p.window.min(p.log_cap as u64);
        Model {
            p: Params { window, ..p },
            reps: vec![],
            next_id: 1,
            log: vec![],
            last_seq: 0,
            head: 1,
            rr_last: 0,
            replace_next: false,
            deletes: vec![],
        }
    }

    fn dist(&self, a: &[f32], b: &[f32]) -> f32 {
        self.p.metric.distance(a, b)
    }

    fn gauge(&self) -> Gauge {
        Gauge(self.p.metric)
    }

    /// `minD` in the thresholds' unit: on `ip` the smallest angle to a result.
    fn min_gap(&self, r: &MRep) -> f32 {
        let listed = r.list.iter().map(|(_, d, v)| (*d, Some(&v[..])));
        self.gauge().min_gap(&r.q, listed).unwrap()
    }

    /// The filter's distance from request `q` to `r` (ranks candidates) and its gap.
    fn lookup_distance(&self, q: &[f32], r: &MRep) -> (f32, f32) {
        let g = self.gauge();
        let d = g.filter_distance(&g.filter_query(q), &r.q, norm(&r.q));
        (d, g.gap(d))
    }

    fn objects(&self) -> usize {
        let mut ids: Vec<u64> = self
            .reps
            .iter()
            .flat_map(|r| r.list.iter().map(|x| x.0))
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids.len()
    }

    fn threshold(&self, r: &MRep) -> f32 {
        self.p.proximity.unwrap_or(r.tau)
    }

    fn trim(&mut self) {
        let upto = self
            .reps
            .iter()
            .map(|r| r.cursor)
            .min()
            .unwrap_or(self.last_seq)
            .min(self.last_seq.saturating_sub(self.p.window));
        self.head = self.head.max(upto + 1);
        let head = self.head;
        self.log.retain(|r| r.0 >= head);
    }

    fn remove(&mut self, id: u64) {
        self.reps.retain(|r| r.id != id);
        self.trim();
    }

    /// Whether a hit on `i` cannot check what its list lacks (`recent.rs`).
    fn behind(&self, i: usize) -> bool {
        self.last_seq - self.reps[i].cursor > self.p.window
    }

    /// `i`'s list with the logged inserts after its cursor merged in one by one as a
    /// slow-path scan would (closer than its `maxD` as it stands, live, not listed; cut
    /// to `k + Δ`): what a hit serves. With it, whether any was added.
    fn with_recent(&self, i: usize) -> (Vec<(u64, f32, Vec<f32>)>, bool) {
        let r = &self.reps[i];
        let cap = (r.k + self.p.delta).max(r.list.len());
        let mut list = r.list.clone();
        let mut added = false;
        for (seq, id, v) in &self.log {
            let Some(v) = v else { continue };
            if *seq <= r.cursor || list.iter().any(|x| x.0 == *id) {
                continue;
            }
            let d = self.dist(v, &r.q);
            if d < list.last().unwrap().1 {
                let at = list
                    .iter()
                    .position(|x| before((d, *id), (x.1, x.0)))
                    .unwrap_or(list.len());
                list.insert(at, (*id, d, v.clone()));
                list.truncate(cap);
                added = true;
            }
        }
        (list, added)
    }

    /// Returns (kind, ids, the entry to link, the entry to catch up).
    fn lookup(&mut self, q: &[f32], k: usize) -> (HitKind, Vec<u64>, Option<usize>, Option<u64>) {
        self.replace_next = false;
        // An entry answers every k' <= its k; asked for more, it is a miss (the
        // representative's own query: replaced by the admission).
        if let Some(i) = self.reps.iter().position(|r| r.q == q) {
            if k > self.reps[i].k {
                self.replace_next = true;
                return (HitKind::Miss, vec![], None, None);
            }
            if self.behind(i) {
                // At the entry's own k the miss's answer replaces it; below, a catch-up.
                if k == self.reps[i].k {
                    self.replace_next = true;
                    return (HitKind::Miss, vec![], None, None);
                }
                return (HitKind::Miss, vec![], None, Some(self.reps[i].id));
            }
            if self.p.proximity.is_none() {
                let cap = self.min_gap(&self.reps[i]);
                let r = &mut self.reps[i];
                r.tau = (r.tau * 1.1).min(cap);
            }
            let ids = self.with_recent(i).0[..k].iter().map(|x| x.0).collect();
            return (HitKind::Exact, ids, None, self.catch_up_of(i));
        }
        if let Some(i) = self
            .reps
            .iter()
            .position(|r| r.aliases.iter().any(|a| a == q))
        {
            if k > self.reps[i].k {
                return (HitKind::Miss, vec![], None, None);
            }
            if self.behind(i) {
                return (HitKind::Miss, vec![], None, Some(self.reps[i].id));
            }
            return (
                HitKind::Alias,
                self.rerank(i, q, k),
                None,
                self.catch_up_of(i),
            );
        }
        let mut cands: Vec<(f32, u64, usize, f32)> = self
            .reps
            .iter()
            .enumerate()
            .filter(|(_, r)| r.k >= k)
            .map(|(i, r)| {
                let (d, gap) = self.lookup_distance(q, r);
                (d, r.id, i, gap)
            })
            .collect();
        cands.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let mut skipped = None;
        for &(_, _, i, gap) in cands.iter().take(self.p.candidates) {
            if gap < self.threshold(&self.reps[i]) {
                if self.behind(i) {
                    skipped = skipped.or(Some(self.reps[i].id));
                    continue;
                }
                if self.p.proximity.is_none() {
                    self.reps[i].tau *= 0.25;
                }
                let catch_up = self.catch_up_of(i);
                return (
                    HitKind::Approximate,
                    self.rerank(i, q, k),
                    Some(i),
                    catch_up,
                );
            }
        }
        (HitKind::Miss, vec![], None, skipped)
    }

    /// A hit on `i` asks for a catch-up when it added an insert, or when the entry is
    /// 64 records behind (`CATCH_UP_BEHIND`).
    fn catch_up_of(&self, i: usize) -> Option<u64> {
        let behind = self.last_seq - self.reps[i].cursor;
        (self.with_recent(i).1 || behind >= 64).then_some(self.reps[i].id)
    }

    /// `Cache::catch_up`: a slow-path scan of `rid` from its cursor to the last record
    /// (the engine's cap, 2^24 / dim records, is never reached here).
    fn catch_up(&mut self, rid: u64) {
        let Some(i) = self.reps.iter().position(|r| r.id == rid) else {
            return;
        };
        let from = self.reps[i].cursor;
        if from < self.last_seq {
            self.scan(rid, from, self.last_seq);
        }
    }

    fn rerank(&self, i: usize, q: &[f32], k: usize) -> Vec<u64> {
        let mut v: Vec<(f32, u64)> = self.with_recent(i).0[..k]
            .iter()
            .map(|x| (self.dist(q, &x.2), x.0))
            .collect();
        v.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        v.into_iter().map(|x| x.1).collect()
    }

    fn link(&mut self, i: usize, q: &[f32]) {
        if self.p.proximity.is_none() && self.reps[i].aliases.len() < 256 {
            self.reps[i].aliases.push(q.to_vec());
        }
    }

    fn admit(
        &mut self,
        q: &[f32],
        k: usize,
        answer: Vec<(u64, f32, Vec<f32>)>,
        seq: u64,
        del_seq: u64,
    ) -> Admission {
        if seq + 1 < self.head {
            return Admission::Stale;
        }
        let deleted: Vec<u64> = self
            .deletes
            .iter()
            .filter(|d| d.0 > del_seq)
            .map(|d| d.1)
            .collect();
        let mut list: Vec<(u64, f32, Vec<f32>)> = answer
            .into_iter()
            .filter(|c| !deleted.contains(&c.0))
            .collect();
        list.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
        list.dedup_by_key(|c| c.0);
        list.truncate(k + self.p.delta);
        if list.len() < k {
            return Admission::TooFew;
        }
        let replace = std::mem::take(&mut self.replace_next);
        if let Some(r) = self.reps.iter().find(|r| r.q == q) {
            if !replace {
                return Admission::Duplicate(r.id);
            }
            let id = r.id;
            self.remove(id);
        }
        for r in self.reps.iter_mut() {
            r.aliases.retain(|a| a != q);
        }
        while self.objects() + list.len() > self.p.capacity && !self.reps.is_empty() {
            let oldest = self.reps[0].id;
            self.remove(oldest);
        }
        if self.objects() + list.len() > self.p.capacity {
            return Admission::TooLarge;
        }
        let id = self.next_id;
        self.next_id += 1;
        let cursor = seq.min(self.last_seq);
        let mut rep = MRep {
            id,
            q: q.to_vec(),
            k,
            list,
            tau: 0.0,
            cursor,
            aliases: vec![],
        };
        rep.tau = self.p.proximity.unwrap_or(self.min_gap(&rep) / 4.0);
        self.reps.push(rep);
        Admission::Admitted(id)
    }

    fn merge(&mut self, i: usize, id: u64, d: f32, v: &[f32]) {
        let r = &mut self.reps[i];
        if r.list.iter().any(|x| x.0 == id) {
            return;
        }
        let at = r
            .list
            .iter()
            .position(|x| before((d, id), (x.1, x.0)))
            .unwrap_or(r.list.len());
        r.list.insert(at, (id, d, v.to_vec()));
        r.list.truncate(r.k + self.p.delta);
        while self.objects() > self.p.capacity {
            let oldest = self.reps[0].id;
            self.remove(oldest);
        }
    }

    fn risk(&self) -> f64 {
        let n = self.reps.len();
        let oldest = self
            .reps
            .iter()
            .map(|r| r.cursor)
            .min()
            .unwrap_or(self.last_seq);
        let w = (self.last_seq - oldest) as usize;
        if n == 0 || w == 0 {
            return 0.0;
        }
        // r in fixed point, units of 2^-32 (the engine sums it exactly that way); on
        // ip, distances are measured from -|RQ| · the longest result (Cauchy-Schwarz)
        let zero = |r: &MRep| match self.p.metric {
            Metric::InnerProduct => {
                let longest = r.list.iter().map(|x| norm(&x.2)).fold(0.0f32, f32::max);
                let d1 = r.list[0].1 as f64;
                if longest > 0.0 {
                    (-(norm(&r.q) as f64) * longest as f64).min(d1)
                } else {
                    d1 - d1.abs()
                }
            }
            _ => 0.0,
        };
        let sum_r: u64 = self
            .reps
            .iter()
            .map(|r| {
                let f = if r.list.len() <= r.k {
                    1.0
                } else {
                    let last = r.list.last().unwrap().1 as f64 - zero(r);
                    if last <= 0.0 {
                        1.0
                    } else {
                        ((r.list[r.k - 1].1 as f64 - zero(r)) / last).clamp(0.0, 1.0)
                    }
                };
                (f * 4_294_967_296.0).round() as u64
            })
            .sum();
        let unchecked: u64 = self.reps.iter().map(|r| self.last_seq - r.cursor).sum();
        (sum_r as f64 / 4_294_967_296.0) * unchecked as f64 / ((n * n) as f64 * w as f64)
    }

    fn slow_path(&mut self) {
        for _ in 0..self.p.max_steps {
            if self.risk() < self.p.risk_threshold {
                break;
            }
            let mut order: Vec<u64> = self.reps.iter().map(|r| r.id).collect();
            order.sort_unstable();
            let pick = order
                .iter()
                .filter(|&&id| id > self.rr_last)
                .chain(order.iter().filter(|&&id| id <= self.rr_last))
                .copied()
                .find(|&id| self.reps.iter().find(|r| r.id == id).unwrap().cursor < self.last_seq);
            let Some(rid) = pick else { break };
            self.rr_last = rid;
            let from = self.reps.iter().find(|r| r.id == rid).unwrap().cursor;
            let to = (from + self.p.batch).min(self.last_seq);
            self.scan(rid, from, to);
        }
    }

    /// Merges the live records `from + 1 ..= to` that `rid` takes, then moves its cursor.
    fn scan(&mut self, rid: u64, from: u64, to: u64) {
        let records: Vec<_> = self
            .log
            .iter()
            .filter(|r| r.0 > from && r.0 <= to)
            .cloned()
            .collect();
        for (_, id, v) in records {
            let Some(v) = v else { continue };
            let Some(i) = self.reps.iter().position(|r| r.id == rid) else {
                break;
            };
            let d = self.dist(&v, &self.reps[i].q);
            if d < self.reps[i].list.last().unwrap().1 {
                self.merge(i, id, d, &v);
            }
        }
        if let Some(i) = self.reps.iter().position(|r| r.id == rid) {
            self.reps[i].cursor = to;
        }
        self.trim();
    }

    fn delete(&mut self, id: u64) {
        let seq = self.deletes.last().map_or(1, |d| d.0 + 1);
        self.deletes.push((seq, id));
        for r in self.log.iter_mut().filter(|r| r.1 == id) {
            r.2 = None;
        }
        let mut gone = vec![];
        for r in self.reps.iter_mut() {
            r.list.retain(|x| x.0 != id);
            if r.list.len() < r.k {
                gone.push(r.id);
            }
        }
        for g in gone {
            self.remove(g);
        }
    }

    fn insert(&mut self, id: u64, v: &[f32]) {
        let cached = self.reps.iter().any(|r| r.list.iter().any(|x| x.0 == id));
        if cached || self.log.iter().any(|r| r.1 == id && r.2.is_some()) {
            self.delete(id);
        }
        self.last_seq += 1;
        self.log.push((self.last_seq, id, Some(v.to_vec())));
        if self.log.len() > self.p.log_cap {
            let new_head = self.last_seq + 1 - self.p.log_cap as u64;
            loop {
                let mut behind: Vec<(u64, u64)> = self
                    .reps
                    .iter()
                    .filter(|r| r.cursor + 1 < new_head)
                    .map(|r| (r.cursor, r.id))
                    .collect();
                behind.sort_unstable();
                let Some(&(_, rid)) = behind.first() else {
                    break;
                };
                self.remove(rid);
            }
            self.head = self.head.max(new_head);
            let head = self.head;
            self.log.retain(|r| r.0 >= head);
        }
        self.nearest_fast_path(id, v);
        self.slow_path();
        self.trim();
    }
}

// ----------------------------------------------------------------------- the run

#[derive(Clone, Debug)]
enum Op {
    Search {
        q: usize,
        k: usize,
    },
    Insert {
        id: u64,
        v: (u8, u8),
    },
    Delete {
        id: u64,
    },
    Evict,
    /// A miss whose backend answer comes back after `id` was deleted.
    MissDuringDelete {
        q: usize,
        k: usize,
        id: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..40usize, 1..=3usize).prop_map(|(q, k)| Op::Search { q, k }),
        2 => (0..60u64, (0u8..16, 0u8..16)).prop_map(|(id, v)| Op::Insert { id, v }),
        2 => (0..60u64).prop_map(|id| Op::Delete { id }),
        1 => Just(Op::Evict),
        1 => (0..40usize, 1..=3usize, 0..60u64).prop_map(|(q, k, id)| Op::MissDuringDelete { q, k, id }),
    ]
}

fn params() -> impl Strategy<Value = Params> {
    (
        0..3usize,
        3..30usize,
        1..3usize,
        1..5u64,
        1..6usize,
        prop_oneof![Just(0.1), Just(0.3), Just(0.7)],
        2..12usize,
        proptest::option::weighted(0.25, 2.0f32..20.0),
        prop_oneof![
            Just(Metric::L2Sq),
            Just(Metric::Cosine),
            Just(Metric::InnerProduct)
        ],
        1..8u64,
    )
        .prop_map(
            |(
                delta,
                capacity,
                candidates,
                batch,
                max_steps,
                risk_threshold,
                log_cap,
                proximity,
                metric,
                window,
            )| Params {
                delta,
                capacity,
                candidates,
                batch,
                max_steps,
                risk_threshold,
                log_cap,
                // Proximity+'s threshold is a gap: on cosine and ip, at most 2.
                proximity: proximity.map(|t| match metric {
                    Metric::L2Sq => t,
                    _ => t / 40.0,
                }),
                metric,
                window,
            },
        )
}

/// Query pool. Squared L2: grid points and points between them, quarter units, so
/// repeats and near misses are both common and every distance is exact in f32. Cosine
/// and ip: 20 directions off any grid, each with a twin slightly turned and stretched
/// (twins: near misses; no two directions tie by symmetry, which floats would break
/// differently in the model and the engine's filter).
fn queries(metric: Metric) -> Vec<Vec<f32>> {
    if metric == Metric::L2Sq {
        return (0..40)
            .map(|i| {
                vec![
                    (i / 2 % 5) as f32 * 2.75 + (i % 2) as f32 * 0.25,
                    (i / 10) as f32 * 2.5,
                ]
            })
            .collect();
    }
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (x >> 40) as f32 / (1u64 << 24) as f32
    };
    (0..20)
        .flat_map(|_| {
            let (a, r) = (next() * 2.2 - 0.3, 1.0 + next() * 12.0);
            let (turn, stretch) = (0.01 + next() * 0.08, 0.7 + next() * 0.6);
            let base = vec![r * a.cos(), r * a.sin()];
            let twin = vec![
                r * stretch * (a + turn).cos(),
                r * stretch * (a + turn).sin(),
            ];
            [base, twin]
        })
        .collect()
}

fn run(p: Params, ops: Vec<Op>) -> Result<shards::CacheStats, TestCaseError> {
    let cfg = CacheConfig {
        delta: p.delta,
        capacity: Capacity::Objects(p.capacity),
        filter: FilterKind::BruteForce,
        filter_candidates: p.candidates,
        slow_path_batch: p.batch as usize,
        slow_path_max_steps: p.max_steps,
        risk_threshold: p.risk_threshold,
        insert_log_cap: p.log_cap,
        k_max: 3,
        hit_check_records_max: p.window as usize,
        ..CacheConfig::new(2, p.metric)
    };
    let policy = match p.proximity {
        Some(t) => PolicyConfig::Proximity { threshold: t },
        None => PolicyConfig::default(),
    };
    let mut cache = Cache::new(cfg, policy.build()).unwrap();
    let mut model = Model::new(p.clone());
    let mut db = ExactStore::new(2, p.metric);
    for id in 0..40u64 {
        db.insert(id, &[(id % 7) as f32 * 2.0, (id / 7) as f32 * 2.0])
            .unwrap();
    }
    let qs = queries(p.metric);
    let mut deleted_ids: Vec<u64> = vec![];
    let to_model = |a: &[shards::Candidate]| -> Vec<(u64, f32, Vec<f32>)> {
        a.iter()
            .map(|c| (c.id, c.distance, c.vector.as_ref().unwrap().to_vec()))
            .collect()
    };

    for (step, op) in ops.into_iter().enumerate() {
        match op {
            Op::Search { q, k } => {
                let q = &qs[q];
                let got = cache.search(&db, q, k).unwrap();
                let (kind, mut ids, link, catch_up) = model.lookup(q, k);
                match kind {
                    HitKind::Miss => {
                        // `Cache::resolve_miss`: the catch-up, then the backend.
                        if let Some(r) = catch_up {
                            model.catch_up(r);
                        }
                        let ans = db.search(q, k + p.delta).unwrap();
                        ids = ans.iter().take(k).map(|c| c.id).collect();
                        let seq = model.last_seq;
                        let del = model.deletes.last().map_or(0, |d| d.0);
                        model.admit(q, k, to_model(&ans), seq, del);
                    }
                    _ => {
                        if let Some(i) = link {
                            model.link(i, q);
                        }
                        if let Some(r) = catch_up {
                            model.catch_up(r);
                        }
                    }
                }
                model.slow_path();
                let got_ids: Vec<u64> = got.results.iter().map(|n| n.id).collect();
                prop_assert_eq!(got.kind, kind, "step {}: kind", step);
                prop_assert_eq!(&got_ids, &ids, "step {}: ids", step);
                prop_assert!(
                    got.results.len() == k || got.kind == HitKind::Miss && db.len() < k + 1
                );
                prop_assert!(
                    got.results
                        .windows(2)
                        .all(|w| w[0].distance <= w[1].distance),
                    "step {step}: order"
                );
                for id in &got_ids {
                    prop_assert!(
                        !deleted_ids.contains(id),
                        "step {}: deleted id {} returned",
                        step,
                        id
                    );
                }
            }
            Op::Insert { id, v } => {
                let v = [v.0 as f32 * 0.75, v.1 as f32 * 0.75];
                db.insert(id, &v).unwrap();
                deleted_ids.retain(|&d| d != id);
                cache.insert(id, &v).unwrap();
                model.insert(id, &v);
            }
            Op::Delete { id } => {
                db.delete(id).unwrap();
                deleted_ids.push(id);
                cache.delete(id);
                model.delete(id);
            }
            Op::Evict => {
                cache.evict_oldest();
                if let Some(r) = model.reps.first().map(|r| r.id) {
                    model.remove(r);
                }
            }
            Op::MissDuringDelete { q, k, id } => {
                let q = &qs[q];
                let ticket = match cache.lookup(q, k).unwrap() {
                    Lookup::Miss(t) => t,
                    Lookup::Hit(h) => {
                        // A hit: both apply the same effects as a plain search, less the slow path.
                        let (kind, ids, link, catch_up) = model.lookup(q, k);
                        prop_assert_eq!(h.kind, kind, "step {}: kind", step);
                        prop_assert_eq!(h.results.iter().map(|n| n.id).collect::<Vec<_>>(), ids);
                        prop_assert_eq!(h.catch_up, catch_up, "step {}: catch-up", step);
                        if let Some(key) = h.link {
                            cache.link_alias(key, h.rep);
                        }
                        if let Some(r) = h.catch_up {
                            cache.catch_up(r);
                        }
                        if let Some(i) = link {
                            model.link(i, q);
                        }
                        if let Some(r) = catch_up {
                            model.catch_up(r);
                        }
                        continue;
                    }
                };
                let (kind, _, _, catch_up) = model.lookup(q, k);
                prop_assert_eq!(kind, HitKind::Miss, "step {}", step);
                prop_assert_eq!(ticket.catch_up, catch_up, "step {}: catch-up", step);
                if let Some(r) = ticket.catch_up {
                    cache.catch_up(r);
                    model.catch_up(r);
                }
                let (seq, del) = (model.last_seq, model.deletes.last().map_or(0, |d| d.0));
                let ans = db.search(q, k + p.delta).unwrap();
                db.delete(id).unwrap();
                deleted_ids.push(id);
                cache.delete(id);
                model.delete(id);
                let a = cache.admit(ticket, ans.clone()).unwrap();
                let b = model.admit(q, k, to_model(&ans), seq, del);
                prop_assert_eq!(a, b, "step {}: admission", step);
            }
        }
        if std::env::var("DEBUG_MODEL").is_ok() {
            let e: Vec<_> = cache
                .representatives()
                .map(|r| (r.id, r.cursor, r.nrl.ids.clone()))
                .collect();
            let m: Vec<_> = model
                .reps
                .iter()
                .map(|r| {
                    (
                        r.id,
                        r.cursor,
                        r.list.iter().map(|x| x.0).collect::<Vec<_>>(),
                    )
                })
                .collect();
            eprintln!(
                "step {step}: risk {} vs {} engine {e:?} log {} | model {m:?} log {:?} head {}",
                cache.risk(),
                model.risk(),
                cache.insert_log_len(),
                model.log.iter().map(|r| r.0).collect::<Vec<_>>(),
                model.head
            );
        }
        if let Err(e) = cache.check_invariants() {
            return Err(TestCaseError::fail(format!("step {step}: {e}")));
        }
        prop_assert_eq!(cache.objects(), model.objects(), "step {}: objects", step);
        prop_assert!(cache.objects() <= p.capacity);
        prop_assert_eq!(cache.len(), model.reps.len(), "step {}: entries", step);
        prop_assert_eq!(
            cache.insert_log_len(),
            model.log.len(),
            "step {}: log",
            step
        );
        for r in &model.reps {
            let e = cache.representative(r.id);
            prop_assert!(e.is_some(), "step {}: rep {} missing", step, r.id);
            let e = e.unwrap();
            let ids: Vec<u64> = r.list.iter().map(|x| x.0).collect();
            prop_assert_eq!(&e.nrl.ids, &ids, "step {}: rep {} list", step, r.id);
            prop_assert_eq!(e.cursor, r.cursor, "step {}: rep {} cursor", step, r.id);
            prop_assert_eq!(
                e.aliases.len(),
                r.aliases.len(),
                "step {}: rep {} aliases",
                step,
                r.id
            );
            for x in &r.list {
                prop_assert!(
                    !deleted_ids.contains(&x.0),
                    "step {}: deleted id {} cached",
                    step,
                    x.0
                );
            }
        }
    }
    Ok(cache.stats())
}

proptest! {
    // PROPTEST_CASES overrides the count for longer runs.
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(256)
    ))]

    #[test]
    fn engine_agrees_with_model(p in params(), ops in proptest::collection::vec(op(), 1..120)) {
        run(p, ops)?;
    }
}

/// One long fixed run per metric, to show the random runs reach every mechanism.
#[test]
fn a_long_run_reaches_every_mechanism() {
    for metric in [Metric::L2Sq, Metric::Cosine, Metric::InnerProduct] {
        long_run(metric);
    }
}

fn long_run(metric: Metric) {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
    let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &[7; 32]);
    let mut runner = TestRunner::new_with_rng(Config::default(), rng);
    let ops: Vec<Op> = (0..4000)
        .map(|_| op().new_tree(&mut runner).unwrap().current())
        .collect();
    let p = Params {
        delta: 1,
        capacity: 60,
        candidates: 2,
        batch: 1,
        max_steps: 1,
        risk_threshold: 0.3,
        log_cap: 6,
        proximity: None,
        metric,
        window: 4,
    };
    let st = run(p, ops).unwrap();
    assert!(
        st.exact_hits > 0 && st.alias_hits > 0 && st.approximate_hits > 0 && st.misses > 0,
        "{metric}: {st:?}"
    );
    assert!(
        st.evictions > 0 && st.invalidations > 0 && st.delete_repairs > 0,
        "{metric}: {st:?}"
    );
    assert!(
        st.fast_path_updates > 0 && st.slow_path_steps > 0 && st.log_cap_invalidations > 0,
        "{metric}: {st:?}"
    );
    assert!(st.slow_path_merges > 0, "{metric}: {st:?}");
    // The window of 4 is passed: hits add inserts themselves, ask for catch-ups, and
    // entries further behind answer as misses.
    assert!(
        st.hits_with_recent > 0 && st.catch_ups > 0 && st.hits_behind > 0,
        "{metric}: {st:?}"
    );
    assert!(st.filter.rotations > 0, "{metric}: {st:?}");
}
