//! HNSW store on hnsw_rs with the SIMD distance. hnsw_rs cannot delete, so deletes and
//! replaced vectors are tombstones that searches filter out.
//!
//! A store saves itself whole ([`HnswStore::save`]): hnsw_rs's own dump of the graph
//! (`<basename>.hnsw.graph`, the topology with every point's data id and the entry
//! point; `<basename>.hnsw.data`, every point's vector, dead ones included) plus an
//! [`HnswSaved`] of what the store keeps beside it (ids per internal point, tombstones,
//! params), which the caller persists (the durable store: an rkyv manifest with the
//! files' checksums). [`HnswStore::load`] takes both back. hnsw_rs trusts its files
//! (it asserts, panics or exits the process on bad bytes): callers verify checksums
//! before `load`; `load` still catches panics and checks what it can.

use std::collections::{HashMap, HashSet};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::Arc;

use hnsw_rs::api::AnnT;
use hnsw_rs::hnsw::Hnsw;
use hnsw_rs::hnswio::HnswIo;

use crate::backend::{sort_candidates, Backend, Candidate};
use crate::error::{validate_vector, Error, Result};
use crate::filter::SimdDistance;
use crate::metric::Metric;

pub struct HnswStore {
    dim: usize,
    metric: Metric,
    graph: Hnsw<'static, f32, SimdDistance>,
    /// Search breadth; the runner tunes it for a target recall.
    pub ef_search: usize,
    /// Internal point number -> (external id, vector).
    points: Vec<(u64, Arc<[f32]>)>,
    /// External id -> its live internal point.
    live: HashMap<u64, usize>,
    dead: HashSet<usize>,
}

impl HnswStore {
    /// Layers the graph may have: hnsw_rs's maximum, which its dump requires.
    pub const MAX_LAYER: usize = 16;

    pub fn new(
        dim: usize,
        metric: Metric,
        m: usize,
        ef_construction: usize,
        ef_search: usize,
        capacity_hint: usize,
    ) -> Self {
        HnswStore {
            dim,
            metric,
            graph: Hnsw::new(
                m,
                capacity_hint.max(16),
                Self::MAX_LAYER,
                ef_construction,
                SimdDistance(metric),
            ),
            ef_search,
            points: Vec::new(),
            live: HashMap::new(),
            dead: HashSet::new(),
        }
    }

    /// Builds from a row-major matrix (ids `0..n`) with hnsw_rs's parallel insert.
    pub fn build(
        dim: usize,
        metric: Metric,
        data: &[f32],
        m: usize,
        ef_construction: usize,
        ef_search: usize,
    ) -> Result<Self> {
        let ids: Vec<u64> = (0..(data.len() / dim.max(1)) as u64).collect();
        HnswStore::build_with_ids(dim, metric, &ids, data, m, ef_construction, ef_search)
    }

    /// `build` with the rows' ids (a recovered store); a repeated id keeps its last row.
    pub fn build_with_ids(
        dim: usize,
        metric: Metric,
        ids: &[u64],
        data: &[f32],
        m: usize,
        ef_construction: usize,
        ef_search: usize,
    ) -> Result<Self> {
        let n = data.len() / dim.max(1);
        let mut s = HnswStore::new(dim, metric, m, ef_construction, ef_search, n);
        for (i, (&id, row)) in ids.iter().zip(data.chunks_exact(dim.max(1))).enumerate() {
            validate_vector(row, dim)?;
            s.points.push((id, Arc::from(row)));
            if let Some(old) = s.live.insert(id, i) {
                s.dead.insert(old);
            }
        }
        let rows: Vec<(&[f32], usize)> = s
            .points
            .iter()
            .enumerate()
            .map(|(i, (_, v))| (&v[..], i))
            .collect();
        s.graph.parallel_insert_slice(&rows);
        Ok(s)
    }
}

/// The graph's build parameters and the collection's shape: a saved graph is loaded
/// only where they match the configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HnswParams {
    pub dim: usize,
    pub metric: Metric,
    /// Links per point (hnsw_rs's `max_nb_connection`).
    pub m: usize,
    pub ef_construction: usize,
    /// Layers allowed (hnsw_rs's `max_layer`; 16 here, its dump requires it).
    pub max_layer: usize,
}

/// What an [`HnswStore`] keeps beside its hnsw_rs graph, for a save. The live map is
/// not in it: it is every point not in `dead`, by its id.
#[derive(Debug, Clone, PartialEq)]
pub struct HnswSaved {
    pub params: HnswParams,
    /// Internal point number (the graph's data id) -> external id, for every point the
    /// graph holds, dead ones included (the graph still links through them).
    pub ids: Vec<u64>,
    /// Tombstoned internal points, ascending.
    pub dead: Vec<u64>,
}

impl HnswStore {
    /// The graph's parameters.
    pub fn params(&self) -> HnswParams {
        HnswParams {
            dim: self.dim,
            metric: self.metric,
            m: self.graph.get_max_nb_connection() as usize,
            ef_construction: self.graph.get_ef_construction(),
            max_layer: self.graph.get_max_level(),
        }
    }

    /// Dumps the graph into `dir` as `<basename>.hnsw.{graph,data}` (hnsw_rs's format,
    /// overwritten if there) and returns the rest of the store. Takes `&self`: the
    /// caller keeps writers out for the dump to be consistent; searches may run.
    pub fn save(&self, dir: &Path, basename: &str) -> Result<HnswSaved> {
        if self.points.is_empty() {
            return Err(Error::Backend("an empty graph has no dump".into()));
        }
        // hnsw_rs panics when it cannot create its files: an error here, not a crash.
        let dumped = catch_unwind(AssertUnwindSafe(|| self.graph.file_dump(dir, basename)));
        match dumped {
            Ok(Ok(name)) if name == basename => {}
            Ok(Ok(name)) => return Err(Error::Io(format!("hnsw_rs dumped as {name}"))),
            Ok(Err(e)) => return Err(Error::Io(format!("hnsw_rs dump: {e}"))),
            Err(_) => return Err(Error::Io("hnsw_rs dump panicked".into())),
        }
        let mut dead: Vec<u64> = self.dead.iter().map(|&p| p as u64).collect();
        dead.sort_unstable();
        Ok(HnswSaved {
            params: self.params(),
            ids: self.points.iter().map(|(id, _)| *id).collect(),
            dead,
        })
    }

    /// Loads what [`save`](Self::save) wrote. The files must be the ones `saved` came
    /// with, already verified (hnsw_rs exits the process on some bad bytes); what is
    /// checked here: hnsw_rs's own errors and panics, and that the graph holds exactly
    /// the points `saved` names, with `saved`'s params.
    pub fn load(dir: &Path, basename: &str, saved: &HnswSaved, ef_search: usize) -> Result<Self> {
        let p = saved.params;
        let mut graph = load_graph(dir, basename, p.metric)?;
        // Hnsw::new's default; hnsw_rs's reload turns it on. Only later inserts see it.
        graph.set_extend_candidates(false);
        let got = (
            graph.get_max_nb_connection() as usize,
            graph.get_ef_construction(),
            graph.get_max_level(),
        );
        if got != (p.m, p.ef_construction, p.max_layer) {
            return Err(bad(format!("graph params {got:?}, saved with {p:?}")));
        }
        let points = graph_points(&graph, &saved.ids, p.dim)?;
        let (live, dead) = live_and_dead(&points, &saved.dead)?;
        Ok(HnswStore {
            dim: p.dim,
            metric: p.metric,
            graph,
            ef_search,
            points,
            live,
            dead,
        })
    }
}

fn bad(why: String) -> Error {
    Error::Backend(format!("saved graph: {why}"))
}

/// hnsw_rs's reload, with our distance (it has no `Default`: `load_hnsw_with_dist`).
fn load_graph(
    dir: &Path,
    basename: &str,
    metric: Metric,
) -> Result<Hnsw<'static, f32, SimdDistance>> {
    // The reloaded `Hnsw<'b>` borrows its `HnswIo` ('a: 'b), which would hold mmapped
    // data had we asked for it; we do not, so nothing of it is used after the load, but
    // the store holds a `Hnsw<'static>`: the reader is leaked (a few hundred bytes, once
    // per load, i.e. per process start) to give it that lifetime.
    let io: &'static HnswIo = Box::leak(Box::new(HnswIo::new(dir, basename)));
    match catch_unwind(AssertUnwindSafe(|| {
        io.load_hnsw_with_dist(SimdDistance(metric))
    })) {
        Ok(Ok(g)) => Ok(g),
        Ok(Err(e)) => Err(bad(format!("hnsw_rs reload: {e}"))),
        Err(_) => Err(bad("hnsw_rs reload panicked".into())),
    }
}

/// Every point of `graph` by its data id, with `ids`' external id and the graph's copy
/// of its vector; each of `0..ids.len()` exactly once.
fn graph_points(
    graph: &Hnsw<'static, f32, SimdDistance>,
    ids: &[u64],
    dim: usize,
) -> Result<Vec<(u64, Arc<[f32]>)>> {
    if graph.get_nb_point() != ids.len() {
        return Err(bad(format!(
            "{} points, {} ids",
            graph.get_nb_point(),
            ids.len()
        )));
    }
    let mut slots: Vec<Option<Arc<[f32]>>> = vec![None; ids.len()];
    for point in graph.get_point_indexation() {
        let d = point.get_origin_id();
        let v = point.get_v();
        if v.len() != dim {
            return Err(bad(format!("point {d} is {}-d, not {dim}", v.len())));
        }
        match slots.get_mut(d) {
            Some(slot @ None) => *slot = Some(Arc::from(v)),
            Some(Some(_)) => return Err(bad(format!("data id {d} twice"))),
            None => return Err(bad(format!("data id {d} past {} ids", ids.len()))),
        }
    }
    ids.iter()
        .zip(slots)
        .enumerate()
        .map(|(d, (&id, v))| {
            v.map(|v| (id, v))
                .ok_or_else(|| bad(format!("no point {d}")))
        })
        .collect()
}

/// The live map (every point not dead, by id) and the tombstone set.
fn live_and_dead(
    points: &[(u64, Arc<[f32]>)],
    dead: &[u64],
) -> Result<(HashMap<u64, usize>, HashSet<usize>)> {
    let dead: HashSet<usize> = dead.iter().map(|&p| p as usize).collect();
    if let Some(p) = dead.iter().find(|&&p| p >= points.len()) {
        return Err(bad(format!("dead point {p} past {} points", points.len())));
    }
    let mut live = HashMap::with_capacity(points.len() - dead.len());
    for (p, (id, _)) in points.iter().enumerate() {
        if !dead.contains(&p) && live.insert(*id, p).is_some() {
            return Err(bad(format!("id {id} live twice")));
        }
    }
    Ok((live, dead))
}

impl Backend for HnswStore {
    fn dim(&self) -> usize {
        self.dim
    }
    fn metric(&self) -> Metric {
        self.metric
    }
    fn search(&self, q: &[f32], n: usize) -> Result<Vec<Candidate>> {
        validate_vector(q, self.dim)?;
        if self.live.is_empty() {
            return Ok(Vec::new());
        }
        // Post-filter the tombstones (hnsw_rs's filtered search loses its early exit);
        // ask for as many extra as there are dead points, within reason.
        let want = (n + self.dead.len()).min(n * 4 + 16);
        let found = self
            .graph
            .search_filter(q, want, self.ef_search.max(want), None);
        let mut out: Vec<Candidate> = found
            .into_iter()
            .filter(|nb| !self.dead.contains(&nb.d_id))
            .take(n)
            .map(|nb| {
                let (id, v) = &self.points[nb.d_id];
                Candidate {
                    id: *id,
                    distance: self.metric.distance(q, v),
                    vector: Some(v.clone()),
                }
            })
            .collect();
        sort_candidates(&mut out);
        Ok(out)
    }
    fn insert(&mut self, id: u64, v: &[f32]) -> Result<()> {
        validate_vector(v, self.dim)?;
        if let Some(old) = self.live.remove(&id) {
            self.dead.insert(old);
        }
        let p = self.points.len();
        self.points.push((id, Arc::from(v)));
        self.graph.insert_slice((v, p));
        self.live.insert(id, p);
        Ok(())
    }
    fn delete(&mut self, id: u64) -> Result<bool> {
        match self.live.remove(&id) {
            Some(p) => {
                self.dead.insert(p);
                Ok(true)
            }
            None => Ok(false),
        }
    }
    fn len(&self) -> usize {
        self.live.len()
    }
    fn export(&self) -> Option<Vec<(u64, Arc<[f32]>)>> {
        let mut live: Vec<(usize, u64)> = self.live.iter().map(|(&id, &p)| (p, id)).collect();
        live.sort_unstable();
        Some(
            live.into_iter()
                .map(|(p, id)| (id, self.points[p].1.clone()))
                .collect(),
        )
    }
    fn contains(&self, id: u64) -> Option<bool> {
        Some(self.live.contains_key(&id))
    }
    fn name(&self) -> &'static str {
        "hnsw"
    }
    fn as_hnsw(&self) -> Option<&HnswStore> {
        Some(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::ExactStore;

    #[test]
    fn hnsw_store_finds_neighbours_and_honours_deletes() {
        let dim = 8;
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let data: Vec<f32> = (0..2000 * dim).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let mut h = HnswStore::build(dim, Metric::L2Sq, &data, 16, 100, 64).unwrap();
        let e = ExactStore::from_rows(dim, Metric::L2Sq, &data).unwrap();
        let q = &data[5 * dim..6 * dim];
        let got: Vec<u64> = h.search(q, 10).unwrap().iter().map(|c| c.id).collect();
        let want: Vec<u64> = e.search(q, 10).unwrap().iter().map(|c| c.id).collect();
        let overlap = got.iter().filter(|x| want.contains(x)).count();
        assert!(overlap >= 8, "recall {overlap}/10");
        assert!(got.contains(&5));
        h.delete(5).unwrap();
        assert!(h.search(q, 10).unwrap().iter().all(|c| c.id != 5));
        h.insert(5, q).unwrap();
        assert_eq!(h.search(q, 1).unwrap()[0].id, 5);
        assert_eq!(h.len(), 2000);
    }

    fn temp_dir(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("aker-hnsw-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// A store with every kind of history: repeated ids at build, deletes, replaced and
    /// new ids after it.
    fn used_store(dim: usize) -> (HnswStore, Vec<f32>) {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let data: Vec<f32> = (0..1500 * dim).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let ids: Vec<u64> = (0..1500u64)
            .map(|i| if i % 100 == 7 { i - 1 } else { i })
            .collect();
        let mut h = HnswStore::build_with_ids(dim, Metric::L2Sq, &ids, &data, 12, 80, 64).unwrap();
        for id in (0..1500).step_by(13) {
            h.delete(id).unwrap();
        }
        for id in (3..1500).step_by(17) {
            let v: Vec<f32> = (0..dim).map(|_| rng.gen_range(-1.0..1.0)).collect();
            h.insert(id, &v).unwrap();
        }
        h.insert(99_999, &data[..dim]).unwrap();
        (h, data)
    }

    fn answers(h: &HnswStore, data: &[f32], dim: usize) -> Vec<Vec<(u64, u32)>> {
        data.chunks_exact(dim)
            .step_by(37)
            .map(|q| {
                let c = h.search(q, 10).unwrap();
                c.iter().map(|c| (c.id, c.distance.to_bits())).collect()
            })
            .collect()
    }

    #[test]
    fn a_saved_store_loads_back_the_same() {
        let dim = 8;
        let (h, data) = used_store(dim);
        let d = temp_dir("save");
        let saved = h.save(&d, "g").unwrap();
        assert!(d.join("g.hnsw.graph").exists() && d.join("g.hnsw.data").exists());
        assert_eq!(saved.ids.len(), h.points.len());
        assert!(!saved.dead.is_empty());
        let mut l = HnswStore::load(&d, "g", &saved, 64).unwrap();
        assert_eq!(l.params(), h.params());
        assert_eq!(
            (l.len(), l.dead.len(), l.points.len()),
            (h.len(), h.dead.len(), h.points.len())
        );
        assert_eq!(l.live, h.live);
        assert_eq!(l.export(), h.export());
        for id in [0, 6, 7, 13, 20, 99_999, 123_456] {
            assert_eq!(l.contains(id), h.contains(id), "id {id}");
        }
        // Same data ids, same entry point, same links: the same answers, to the bit.
        assert_eq!(answers(&l, &data, dim), answers(&h, &data, dim));
        assert_eq!(layers(&l), layers(&h));
        // A loaded store keeps taking writes.
        l.insert(5, &data[..dim]).unwrap();
        l.delete(6).unwrap();
        assert_eq!(l.search(&data[..dim], 1).unwrap()[0].distance, 0.0);
        assert_eq!(l.contains(6), Some(false));
        assert_eq!(l.len(), h.len() - 1);
    }

    /// Each layer's data ids in order, and the top layer reached. (hnsw_rs does not
    /// expose the entry point; its dump names it by (layer, rank), which these fix, and
    /// every search starts there: the bit-equal answers check it.)
    fn layers(h: &HnswStore) -> (u8, Vec<Vec<usize>>) {
        let pi = h.graph.get_point_indexation();
        let layers = (0..16)
            .map(|l| {
                pi.get_layer_iterator(l)
                    .map(|p| p.get_origin_id())
                    .collect()
            })
            .collect();
        (h.graph.get_max_level_observed(), layers)
    }

    #[test]
    fn a_load_that_does_not_fit_its_state_is_an_error() {
        let dim = 4;
        let (h, _) = used_store(dim);
        let d = temp_dir("misfit");
        let saved = h.save(&d, "g").unwrap();
        let mut fewer = saved.clone();
        fewer.ids.pop();
        assert!(HnswStore::load(&d, "g", &fewer, 64).is_err());
        let mut twice = saved.clone();
        twice.dead.retain(|&p| p != 0);
        twice.dead.push(saved.ids.len() as u64 + 3);
        assert!(HnswStore::load(&d, "g", &twice, 64).is_err());
        let mut other = saved.clone();
        other.params.m += 1;
        assert!(HnswStore::load(&d, "g", &other, 64).is_err());
        // A truncated graph file: hnsw_rs's read fails, an error here.
        let g = d.join("g.hnsw.graph");
        let bytes = std::fs::read(&g).unwrap();
        std::fs::write(&g, &bytes[..bytes.len() / 2]).unwrap();
        assert!(HnswStore::load(&d, "g", &saved, 64).is_err());
        assert!(HnswStore::load(&d, "missing", &saved, 64).is_err());
        let empty = HnswStore::new(dim, Metric::L2Sq, 8, 50, 50, 0);
        assert!(empty.save(&d, "e").is_err());
    }
}
