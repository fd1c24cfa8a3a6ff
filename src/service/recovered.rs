//! The durable embedded store at start: its HNSW graph loaded from the checkpoint when
//! one verifies and fits the configuration (then the log after the checkpoint applied to
//! it), else the store built from the recovered rows; and the start's checkpoint.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use shards::store::{HnswParams, HnswStore};
use shards::Backend;

use super::plan::build_store;
use super::{StartError, Store};
use crate::config::{Config, IndexKind};
use crate::durable::graph::{self, GraphError};
use crate::durable::wal::Op;
use crate::durable::{Durable, Recovered};

/// The store over `r`, and whether its graph was loaded (not built).
pub(super) fn recovered_store(
    cfg: &Config,
    dir: &Path,
    r: &Recovered,
) -> Result<(Store, bool), StartError> {
    match load_graph(cfg, dir, r) {
        Ok(Some(s)) => return Ok((s, true)),
        Ok(None) => {}
        // A first start has no graph yet: nothing is wrong.
        Err(e @ GraphError::Missing(_)) => {
            tracing::info!(why = %e, "HNSW graph built from the rows")
        }
        Err(e) => tracing::warn!(why = %e, "HNSW graph not loaded; building it from the rows"),
    }
    let t = Instant::now();
    let s = build_store(cfg, r.dim, &r.ids, &r.vectors)?;
    tracing::info!(
        rows = r.ids.len(),
        index = ?cfg.backend.index,
        secs = t.elapsed().as_secs_f64(),
        "embedded store built"
    );
    Ok((s, false))
}

/// The checkpoint's graph with the log after it applied; `None` for an exact store.
fn load_graph(cfg: &Config, dir: &Path, r: &Recovered) -> Result<Option<Store>, GraphError> {
    let b = &cfg.backend;
    let (IndexKind::Hnsw, Some(seq)) = (b.index, r.report.checkpoint_seq) else {
        return Ok(None);
    };
    let want = HnswParams {
        dim: r.dim,
        metric: cfg.cache.metric_or_default(),
        m: b.hnsw_m,
        ef_construction: b.hnsw_ef_construction,
        max_layer: HnswStore::MAX_LAYER,
    };
    let t = Instant::now();
    let mut s = graph::load(dir, seq, want, b.hnsw_ef_search)?;
    apply(&mut s, &r.log_tail)?;
    same_rows(&s, r)?;
    tracing::info!(
        checkpoint = seq,
        records_applied = r.log_tail.len(),
        rows = s.len(),
        secs = t.elapsed().as_secs_f64(),
        "HNSW graph loaded from the checkpoint"
    );
    Ok(Some(Box::new(s)))
}

fn apply(s: &mut HnswStore, tail: &[Op]) -> Result<(), GraphError> {
    for op in tail {
        let done = match op {
            Op::Insert { id, vector } => s.insert(*id, vector),
            Op::Delete { id } => s.delete(*id).map(|_| ()),
        };
        done.map_err(|e| GraphError::Load(format!("applying the log: {e}")))?;
    }
    Ok(())
}

/// The loaded store holds exactly the recovered rows (a cheap guard, next to a build's
/// minutes, against a graph that verifies but is of another state).
fn same_rows(s: &HnswStore, r: &Recovered) -> Result<(), GraphError> {
    let differ = |why: String| Err(GraphError::Load(format!("the graph's rows differ: {why}")));
    let rows: HashMap<u64, Arc<[f32]>> = s.export().unwrap_or_default().into_iter().collect();
    if rows.len() != r.ids.len() {
        return differ(format!("{} live, {} recovered", rows.len(), r.ids.len()));
    }
    for (id, v) in r.ids.iter().zip(r.vectors.chunks_exact(r.dim.max(1))) {
        if rows.get(id).map(|x| &x[..]) != Some(v) {
            return differ(format!("id {id}"));
        }
    }
    Ok(())
}

/// The start's checkpoint: after a replay, of the store (with its graph) at a fresh
/// rotation; after a build of an HNSW graph without a replay, its graph beside the
/// checkpoint used (whose state it is), so that the next start loads it.
pub(super) fn checkpoint_at_start(
    dir: &Path,
    durable: &Durable,
    store: &Store,
    r: &Recovered,
    loaded: bool,
) -> Result<(), StartError> {
    durable.graph_loaded.store(loaded, Ordering::Relaxed);
    if r.report.records_replayed > 0 {
        let seq = durable.wal.rotate()?;
        let rows = store.export().unwrap_or_default();
        let graph = durable.dump_graph(seq, &**store);
        crate::durable::write_checkpoint(dir, seq, r.dim, store.metric(), rows, graph)?;
        return Ok(());
    }
    let seq = r.report.checkpoint_seq;
    if let (false, Some(seq)) = (loaded, seq) {
        if let Some(g) = durable.dump_graph(seq, &**store) {
            match graph::commit(dir, g) {
                Ok(p) => tracing::info!(path = %p.display(), "graph saved beside the checkpoint"),
                Err(e) => {
                    tracing::warn!(error = %e, seq, "graph not saved (the next start rebuilds it)")
                }
            }
        }
    }
    Ok(())
}
