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
//! tested thousands of candidates (1.5 ms at d = 128 in the engine bench). Costs: an
//! insert scans every centre (one distance each) and the members of the cells it cannot
//! rule out; an admission scans the centres once. Cells number at most the entries
//! (radii tiny next to the spread of queries), then a scan is a linear one.

use std::sync::Arc;

use crate::entry::RepId;
use crate::gap::{self, Gauge};
use crate::hash::HashMap;
use crate::metric::Metric;

/// What the cosine radius allows for the metric's own rounding (`Takers::radius`).
const COSINE_SLACK: f32 = 1e-3;

/// The chord radius of a cell on `ip`, where a list's `maxD` gives no radius.
const IP_LEADER_CHORD: f32 = 0.5;

struct Cell {
    centre: Box<[f32]>,
    members: Vec<RepId>,
    /// Ball metrics: the largest `rho + R_e`; `ip`: the largest `rho`.
    reach: f32,
    /// `ip`: the largest `maxD` in the filter's unit.
    max_d: f32,
}

/// `cell_of` for a representative in `Takers::always`.
const ALWAYS: usize = usize::MAX;

#[derive(Default)]
pub(crate) struct Takers {
    cells: Vec<Cell>,
    /// `cosine` / `ip` representatives whose `RQ` is zero: they have no direction, and
    /// the metric's distance from them is no chord, so every search tests them.
    always: Vec<RepId>,
    /// Representative -> its cell and `rho`, `|p_e − c|` in the index space (a member's
    /// `maxD` is the cache's `max_d_by_rep`: one copy, and a merge's `update` finds its
    /// member in one probe instead of a scan of its cell).
    cell_of: HashMap<RepId, (usize, f32)>,
}

/// Slack for float rounding in the bounds (relative and absolute): a bound that is a
/// little too loose costs a scan; one too tight could drop a taker at its boundary.
fn slack(x: f32) -> f32 {
    x + 1e-4 * x.abs() + 1e-6
}

fn euclid(a: &[f32], b: &[f32]) -> f32 {
    Metric::L2Sq.distance(a, b).max(0.0).sqrt()
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

    pub fn cells(&self) -> usize {
        self.cells.len()
    }

    pub fn len(&self) -> usize {
        self.cell_of.len()
    }

    /// Adds representative `rep` at query `rq`, its list ending at `max_d` (filter unit).
    pub fn add(&mut self, gauge: Gauge, rep: RepId, rq: &[f32], max_d: f32) {
        debug_assert!(!self.cell_of.contains_key(&rep));
        if gauge.0 != Metric::L2Sq && gap::norm(rq) == 0.0 {
            self.always.push(rep);
            self.cell_of.insert(rep, (ALWAYS, 0.0));
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
        cell.members.push(rep);
        Self::widen(gauge, cell, rho, max_d);
        self.cell_of.insert(rep, (at, rho));
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

    /// `rep`'s list now ends at `max_d`: the bounds grow if it did (never shrink).
    pub fn update(&mut self, gauge: Gauge, rep: RepId, max_d: f32) {
        let Some(&(at, rho)) = self.cell_of.get(&rep).filter(|&&(at, _)| at != ALWAYS) else {
            return;
        };
        Self::widen(gauge, &mut self.cells[at], rho, max_d);
    }

    /// Removes `rep`; its cell's bounds are recomputed from the members left (their
    /// `maxD` from `max_ds`, the live representatives'), and an empty cell goes.
    pub fn remove(&mut self, gauge: Gauge, rep: RepId, max_ds: &HashMap<RepId, f32>) {
        let Some((at, _)) = self.cell_of.remove(&rep) else {
            return;
        };
        if at == ALWAYS {
            self.always.retain(|&r| r != rep);
            return;
        }
        let cell = &mut self.cells[at];
        cell.members.retain(|&m| m != rep);
        if !cell.members.is_empty() {
            cell.reach = 0.0;
            cell.max_d = f32::NEG_INFINITY;
            for i in 0..cell.members.len() {
                let m = cell.members[i];
                let rho = self.cell_of[&m].1;
                Self::widen(gauge, cell, rho, max_ds[&m]);
            }
            return;
        }
        self.cells.swap_remove(at);
        if let Some(moved) = self.cells.get(at) {
            for m in &moved.members {
                self.cell_of.get_mut(m).expect("a member has its cell").0 = at;
            }
        }
    }

    /// Every representative that may take `v` (a superset of those that do), pushed to
    /// `out`: the members of each cell the bounds cannot rule out.
    pub fn candidates(&self, gauge: Gauge, v: &[f32], out: &mut Vec<RepId>) {
        out.extend_from_slice(&self.always);
        // A zero vector has no direction either: on cosine, test everything.
        if gauge.0 == Metric::Cosine && gap::norm(v) == 0.0 {
            out.extend(self.cells.iter().flat_map(|c| c.members.iter().copied()));
            return;
        }
        match gauge.0 {
            Metric::L2Sq => self.balls(v, out),
            Metric::Cosine => self.balls(&gap::unit(v), out),
            Metric::InnerProduct => self.halfspaces(v, out),
        }
    }

    fn balls(&self, x: &[f32], out: &mut Vec<RepId>) {
        for c in &self.cells {
            if euclid(x, &c.centre) < slack(c.reach) {
                out.extend_from_slice(&c.members);
            }
        }
    }

    /// `ip`: skip a cell when `−dot(v, c) − |v| · reach ≥ max_d` (module docs).
    fn halfspaces(&self, v: &[f32], out: &mut Vec<RepId>) {
        let len = gap::norm(v);
        for c in &self.cells {
            let score = Metric::InnerProduct.distance(v, &c.centre);
            let margin = len * c.reach;
            let low = score - margin;
            let tol = 1e-4 * (score.abs() + margin + c.max_d.abs()) + 1e-6;
            if low < c.max_d + tol {
                out.extend_from_slice(&c.members);
            }
        }
    }

    /// Tests and `Cache::check_invariants`: `rep`'s place and bounds are consistent
    /// with `rq` and `max_d`.
    pub fn check(&self, gauge: Gauge, rep: RepId, rq: &Arc<[f32]>, max_d: f32) -> bool {
        let Some(&(at, rho_kept)) = self.cell_of.get(&rep) else {
            return false;
        };
        if at == ALWAYS {
            return self.always.contains(&rep);
        }
        let c = &self.cells[at];
        let rho = euclid(&Self::point(gauge, rq), &c.centre);
        let covered = if gauge.angular() {
            slack(c.reach) >= rho && c.max_d >= max_d
        } else {
            slack(c.reach) >= rho + Self::radius(gauge, max_d)
        };
        // `rho` as kept is what it was computed from the same point and centre.
        let rho_kept_holds = slack(rho_kept) >= rho && slack(rho) >= rho_kept;
        covered && rho_kept_holds && c.members.contains(&rep)
    }
}
