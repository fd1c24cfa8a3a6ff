//! The insert fast path's exact index: every representative that could take a vector.
//!
//! A representative `e` takes `v` when `d(v, RQ_e) < maxD_e` (in the filter's unit,
//! `Gauge::filter_max_d`). The query filter is an approximate graph: asked for the
//! nearest taker it sometimes misses one, and it never returns the second of two
//! near-duplicate entries, so entries it did not find waited for the slow path while
//! their hits (exact ones included) left the new vector out (issue #25). This index
//! cannot miss: representatives are grouped in cells around a leader's point, each cell
//! keeps an upper bound on how far from its centre a vector can be and still be taken
//! by one of its members, and a search skips a cell only when the triangle inequality
//! proves that none of its members takes `v`. What it returns is a superset of the
//! takers; the caller applies the exact test to each.
//!
//! Geometry, per metric (the index space is where the triangle inequality holds):
//! - `l2sq`: points are `RQ`; `e` takes `v` iff `|v − RQ| < R_e = sqrt(maxD_e)`.
//! - `cosine`: points are `RQ / |RQ|`; `1 − cos < maxD` iff the chord between the unit
//!   vectors is below `R_e = sqrt(2 · maxD_e)`.
//! - `ip`: points are `u_e = RQ / |RQ|`, the filter's distance is `−dot(v, u_e)` against
//!   `maxD_e / |RQ_e|`; not a ball, but `−dot(v, u_e) ≥ −dot(v, c) − |v| · |u_e − c|`
//!   (Cauchy–Schwarz), so a cell is skipped when that lower bound, with the cell's
//!   largest `|u_e − c|`, is not below the cell's largest `maxD / |RQ|`.
//!
//! Bounds only grow while a cell lives (a list's `maxD` falling leaves its cell's bound
//! where it was: loose costs a scan, never a taker); a member leaving recomputes them.
//! Cells are leaders: a new representative joins the nearest cell whose centre is within
//! its own radius, or starts one. There is no cap on cells: a first version capped them
//! at `64 + 4 · sqrt(n)` and past the cap joined the nearest cell however far; filling
//! up, the cache reached the cap long before it had seen every cluster, the early cells
//! took members from everywhere, their bounds covered every vector, and an insert
//! tested thousands of candidates (1.5 ms at d = 128 in the engine bench).
//!
//! Within a cell that cannot be ruled out, each member is tested by its own bound first
//! (`|d(v, c) − rho_e| < R_e` on the balls, the same Cauchy–Schwarz bound with the
//! member's own `rho` on `ip`), and only then by its exact distance; a member carries its
//! query and `maxD`, so that neither test touches the cache's maps (on GloVe, 50-d, the
//! cells alone left ~60% of the entries standing, and their B-tree lookups were most of
//! an insert). What `Takers::takers` returns are the takers, with their filter distances.
//! Costs: an insert scans every centre (one distance each) and, in the cells it cannot
//! rule out, one comparison per member and one distance per member its bound keeps;
//! an admission scans the centres once. Cells number at most the entries (radii tiny
//! next to the spread of queries), then a scan is a linear one.

use std::sync::Arc;

use crate::entry::RepId;
use crate::gap::{self, Gauge};
use crate::hash::HashMap;
use crate::metric::Metric;

/// What the cosine radius allows for the metric's own rounding (`Takers::radius`).
const COSINE_SLACK: f32 = 1e-3;

/// The chord radius of a cell on `ip`, where a list's `maxD` gives no radius.
const IP_LEADER_CHORD: f32 = 0.5;

struct Member {
    rep: RepId,
    /// `|p_e − c|` in the index space.
    rho: f32,
    /// `maxD` in the filter's unit (`Gauge::filter_max_d`).
    max_d: f32,
    /// `RQ` and `|RQ|`, for the exact test without a lookup in the cache's maps.
    query: Arc<[f32]>,
    query_norm: f32,
}

struct Cell {
    centre: Box<[f32]>,
    members: Vec<Member>,
    /// Ball metrics: the largest `rho + R_e`; `ip`: the largest `rho`.
    reach: f32,
    /// `ip`: the largest `maxD` in the filter's unit.
    max_d: f32,
}

/// The cell of a representative in `Takers::always`.
const ALWAYS: usize = usize::MAX;

#[derive(Default)]
pub(crate) struct Takers {
    cells: Vec<Cell>,
    /// `cosine` / `ip` representatives whose `RQ` is zero: they have no direction, and
    /// the metric's distance from them is no chord, so every search tests them.
    always: Vec<Member>,
    /// Representative -> (its cell, its place among the cell's members).
    place: HashMap<RepId, (usize, usize)>,
}

/// Slack for float rounding in the bounds (relative and absolute): a bound that is a
/// little too loose costs a test; one too tight could drop a taker at its boundary.
fn slack(x: f32) -> f32 {
    x + 1e-4 * x.abs() + 1e-6
}

fn euclid(a: &[f32], b: &[f32]) -> f32 {
    Metric::L2Sq.distance(a, b).max(0.0).sqrt()
}

impl Member {
    /// The filter's distance from `v` when this member takes it.
    fn takes(&self, gauge: Gauge, v: &[f32]) -> Option<f32> {
        let df = gauge.filter_distance(v, &self.query, self.query_norm);
        (df < self.max_d).then_some(df)
    }
}

impl Takers {
    /// The point `RQ` has in the index space.
    fn point(gauge: Gauge, rq: &[f32]) -> Vec<f32> {
        match gauge.0 {
            Metric::L2Sq => rq.to_vec(),
            Metric::Cosine | Metric::InnerProduct => gap::unit(rq),
        }
    }

    /// `R_e` for a list ending at `max_d` (filter unit); `ip`'s leader radius.
    fn radius(gauge: Gauge, max_d: f32) -> f32 {
        match gauge.0 {
            Metric::L2Sq => max_d.max(0.0).sqrt(),
            // The metric's cosine (simsimd) is not the chord's exact `1 − cos`: its
            // error is covered by an absolute 1e-3 on `maxD` (the model test found it).
            Metric::Cosine => (2.0 * (max_d + COSINE_SLACK)).max(0.0).sqrt(),
            Metric::InnerProduct => IP_LEADER_CHORD,
        }
    }

    pub(crate) fn cells(&self) -> usize {
        self.cells.len()
    }

    pub(crate) fn len(&self) -> usize {
        self.place.len()
    }

    fn member(&self, rep: RepId) -> Option<&Member> {
        let &(at, i) = self.place.get(&rep)?;
        Some(if at == ALWAYS {
            &self.always[i]
        } else {
            &self.cells[at].members[i]
        })
    }

    /// Adds representative `rep` at query `rq` (norm `rq_norm`), its list ending at
    /// `max_d` (filter unit).
    pub(crate) fn add(
        &mut self,
        gauge: Gauge,
        rep: RepId,
        rq: &Arc<[f32]>,
        rq_norm: f32,
        max_d: f32,
    ) {
        debug_assert!(!self.place.contains_key(&rep));
        let member = |rho| Member {
            rep,
            rho,
            max_d,
            query: rq.clone(),
            query_norm: rq_norm,
        };
        if gauge.0 != Metric::L2Sq && gap::norm(rq) == 0.0 {
            self.place.insert(rep, (ALWAYS, self.always.len()));
            self.always.push(member(0.0));
            return;
        }
        let p = Self::point(gauge, rq);
        let radius = Self::radius(gauge, max_d);
        let nearest = self
            .cells
            .iter()
            .enumerate()
            .map(|(i, c)| (i, euclid(&p, &c.centre)))
            .min_by(|a, b| a.1.total_cmp(&b.1));
        let (at, rho) = match nearest {
            Some((i, d)) if d <= radius => (i, d),
            _ => {
                self.cells.push(Cell {
                    centre: p.into_boxed_slice(),
                    members: Vec::new(),
                    reach: 0.0,
                    max_d: f32::NEG_INFINITY,
                });
                (self.cells.len() - 1, 0.0)
            }
        };
        let cell = &mut self.cells[at];
        self.place.insert(rep, (at, cell.members.len()));
        cell.members.push(member(rho));
        Self::widen(gauge, cell, rho, max_d);
    }

    /// Grows `cell`'s bounds to cover a member at `rho` whose list ends at `max_d`.
    fn widen(gauge: Gauge, cell: &mut Cell, rho: f32, max_d: f32) {
        if gauge.angular() {
            cell.reach = cell.reach.max(rho);
            cell.max_d = cell.max_d.max(max_d);
        } else {
            cell.reach = cell.reach.max(rho + Self::radius(gauge, max_d));
        }
    }

    /// `rep`'s list now ends at `max_d`: its cell's bounds grow if it did (never shrink).
    pub(crate) fn update(&mut self, gauge: Gauge, rep: RepId, max_d: f32) {
        let Some(&(at, i)) = self.place.get(&rep) else {
            return;
        };
        if at == ALWAYS {
            self.always[i].max_d = max_d;
            return;
        }
        let cell = &mut self.cells[at];
        cell.members[i].max_d = max_d;
        let rho = cell.members[i].rho;
        Self::widen(gauge, cell, rho, max_d);
    }

    /// Removes `rep`; its cell's bounds are recomputed from the members left, and an
    /// empty cell goes.
    pub(crate) fn remove(&mut self, gauge: Gauge, rep: RepId) {
        let Some((at, i)) = self.place.remove(&rep) else {
            return;
        };
        let members = if at == ALWAYS {
            &mut self.always
        } else {
            &mut self.cells[at].members
        };
        members.swap_remove(i);
        if let Some(moved) = members.get(i) {
            self.place.insert(moved.rep, (at, i));
        }
        if at == ALWAYS {
            return;
        }
        let cell = &mut self.cells[at];
        if !cell.members.is_empty() {
            cell.reach = 0.0;
            cell.max_d = f32::NEG_INFINITY;
            for i in 0..cell.members.len() {
                let (rho, max_d) = (cell.members[i].rho, cell.members[i].max_d);
                Self::widen(gauge, cell, rho, max_d);
            }
            return;
        }
        self.cells.swap_remove(at);
        if let Some(moved) = self.cells.get(at) {
            for (j, m) in moved.members.iter().enumerate() {
                self.place.insert(m.rep, (at, j));
            }
        }
    }

    /// Every representative that takes `v` (`d(v, RQ) < maxD` in the filter's unit),
    /// with that distance, pushed to `out`: the members of each cell the bounds cannot
    /// rule out, each tested by its own bound, then exactly.
    pub(crate) fn takers(&self, gauge: Gauge, v: &[f32], out: &mut Vec<(RepId, f32)>) {
        let test = |m: &Member| m.takes(gauge, v).map(|d| (m.rep, d));
        out.extend(self.always.iter().filter_map(test));
        // A zero vector has no direction either: on cosine, test everything.
        if gauge.0 == Metric::Cosine && gap::norm(v) == 0.0 {
            out.extend(
                self.cells
                    .iter()
                    .flat_map(|c| c.members.iter().filter_map(test)),
            );
            return;
        }
        match gauge.0 {
            Metric::L2Sq => self.balls(gauge, v, v, out),
            Metric::Cosine => self.balls(gauge, &gap::unit(v), v, out),
            Metric::InnerProduct => self.halfspaces(gauge, v, out),
        }
    }

    /// Ball metrics, `x` being `v` in the index space: a cell is skipped when
    /// `d(x, c) ≥ reach`, a member when `|d(x, c) − rho| ≥ R_e` (the triangle
    /// inequality: then `d(x, p_e) ≥ R_e`).
    fn balls(&self, gauge: Gauge, x: &[f32], v: &[f32], out: &mut Vec<(RepId, f32)>) {
        for c in &self.cells {
            let dc = euclid(x, &c.centre);
            if dc >= slack(c.reach) {
                continue;
            }
            for m in &c.members {
                let low = (dc - m.rho).abs();
                let tol = 1e-4 * (dc + m.rho) + 1e-6;
                if low < slack(Self::radius(gauge, m.max_d)) + tol {
                    out.extend(m.takes(gauge, v).map(|d| (m.rep, d)));
                }
            }
        }
    }

    /// `ip`: a cell is skipped when `−dot(v, c) − |v| · reach ≥ max_d`, a member when
    /// the same bound with its own `rho` is not below its own `maxD` (module docs).
    fn halfspaces(&self, gauge: Gauge, v: &[f32], out: &mut Vec<(RepId, f32)>) {
        let len = gap::norm(v);
        let below = |score: f32, rho: f32, max_d: f32| {
            let margin = len * rho;
            // `score` and the exact test's `−dot(v, RQ) / |RQ|` round apart by about
            // ε·|v|·sqrt(d) even where `rho` is 0: the last term covers that.
            let tol = 1e-4 * (score.abs() + margin + max_d.abs()) + 1e-6 + 1e-5 * len;
            score - margin < max_d + tol
        };
        for c in &self.cells {
            let score = Metric::InnerProduct.distance(v, &c.centre);
            if !below(score, c.reach, c.max_d) {
                continue;
            }
            for m in &c.members {
                if below(score, m.rho, m.max_d) {
                    out.extend(m.takes(gauge, v).map(|d| (m.rep, d)));
                }
            }
        }
    }

    /// Tests and `Cache::check_invariants`: `rep`'s place and bounds are consistent
    /// with `rq` and `max_d`.
    pub(crate) fn check(&self, gauge: Gauge, rep: RepId, rq: &Arc<[f32]>, max_d: f32) -> bool {
        let Some(&(at, i)) = self.place.get(&rep) else {
            return false;
        };
        let Some(m) = self.member(rep) else {
            return false;
        };
        let same = m.rep == rep && m.max_d == max_d && Arc::ptr_eq(&m.query, rq);
        if at == ALWAYS {
            return same && i < self.always.len();
        }
        let c = &self.cells[at];
        let rho = euclid(&Self::point(gauge, rq), &c.centre);
        // `rho` as kept was computed from the same point and centre.
        let rho_holds = slack(m.rho) >= rho && slack(rho) >= m.rho;
        let covered = if gauge.angular() {
            slack(c.reach) >= rho && c.max_d >= max_d
        } else {
            slack(c.reach) >= rho + Self::radius(gauge, max_d)
        };
        same && rho_holds && covered
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    /// Random representatives (some zero, some near-duplicates), random lists' ends, then
    /// random vectors (some zero, some at an entry): `takers` returns exactly the entries
    /// a brute-force test over all of them finds, on every metric, after adds, updates
    /// and removes.
    #[test]
    fn takers_are_exactly_the_brute_force_takers() {
        for metric in [Metric::L2Sq, Metric::Cosine, Metric::InnerProduct] {
            let gauge = Gauge(metric);
            let mut rng = StdRng::seed_from_u64(25);
            let dim = 8;
            let mut t = Takers::default();
            let mut live: Vec<(RepId, Arc<[f32]>, f32)> = Vec::new();
            let random = |rng: &mut StdRng| -> Vec<f32> {
                let c = rng.gen_range(0..4) as f32;
                (0..dim).map(|_| c + rng.gen_range(-0.3f32..0.3)).collect()
            };
            for rep in 1..=300u64 {
                let q: Arc<[f32]> = match rep % 50 {
                    0 => Arc::from(vec![0.0; dim]),
                    1 if !live.is_empty() => {
                        let base = &live[rng.gen_range(0..live.len())].1;
                        base.iter().map(|x| x + 1e-4).collect()
                    }
                    _ => Arc::from(random(&mut rng)),
                };
                let max_d = match metric {
                    Metric::L2Sq => rng.gen_range(0.01f32..2.0),
                    _ => rng.gen_range(-1.0f32..0.5),
                };
                t.add(gauge, rep, &q, gap::norm(&q), max_d);
                live.push((rep, q, max_d));
                if rep % 7 == 0 {
                    let i = rng.gen_range(0..live.len());
                    live[i].2 += 0.1;
                    t.update(gauge, live[i].0, live[i].2);
                }
                if rep % 5 == 0 {
                    let i = rng.gen_range(0..live.len());
                    let (gone, _, _) = live.swap_remove(i);
                    t.remove(gauge, gone);
                }
            }
            for (rep, q, max_d) in &live {
                assert!(t.check(gauge, *rep, q, *max_d), "{metric} {rep}");
            }
            for i in 0..2000 {
                let v: Vec<f32> = match i % 100 {
                    0 => vec![0.0; dim],
                    1..=20 => {
                        let q = &live[rng.gen_range(0..live.len())].1;
                        q.iter()
                            .map(|x| x + rng.gen_range(-0.05f32..0.05))
                            .collect()
                    }
                    _ => random(&mut rng),
                };
                let mut got = Vec::new();
                t.takers(gauge, &v, &mut got);
                let mut got: Vec<RepId> = got.into_iter().map(|x| x.0).collect();
                got.sort_unstable();
                let mut want: Vec<RepId> = live
                    .iter()
                    .filter(|(_, q, max_d)| gauge.filter_distance(&v, q, gap::norm(q)) < *max_d)
                    .map(|x| x.0)
                    .collect();
                want.sort_unstable();
                assert_eq!(got, want, "{metric}: vector {i}");
            }
        }
    }
}
