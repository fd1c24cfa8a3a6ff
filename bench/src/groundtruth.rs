//! Exact nearest neighbours by brute force, the reference that recall is measured
//! against (ALGORITHM.md, "Workload: simZipf"), with an on-disk cache so that repeated
//! experiments over the same collection and queries load it instead of recomputing.

use std::collections::BinaryHeap;
use std::fs::{self, File};
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use aker_formats::binio;
use aker_formats::data::Dataset;
use shards::backend::sort_candidates;
use shards::{Candidate, Metric};
use xxhash_rust::xxh3::Xxh3;

/// Queries scanned together over the base: each base row is then fetched from memory
/// once per block instead of once per query, which is what bounds a scan this size.
const QUERY_BLOCK: usize = 32;

/// The exact top `n` of `base` for each query in `queries` (row-major, `base.dim` floats
/// each), ascending by distance with ties broken by id; ids are base row indices. Lists
/// are shorter than `n` only when the base is. Uses every available core.
pub fn exact_top_n(
    base: &Dataset,
    queries: &[f32],
    metric: Metric,
    n: usize,
) -> Vec<Vec<Candidate>> {
    exact_top_n_with_progress(base, queries, metric, n, &|_| {})
}

/// [`exact_top_n`], calling `progress` (from the worker threads) with the number of
/// queries each finished block held, so a long scan can drive a progress bar.
pub fn exact_top_n_with_progress(
    base: &Dataset,
    queries: &[f32],
    metric: Metric,
    n: usize,
    progress: &(dyn Fn(usize) + Sync),
) -> Vec<Vec<Candidate>> {
    assert_eq!(
        queries.len() % base.dim,
        0,
        "queries are not whole {}-d rows",
        base.dim
    );
    let n_queries = queries.len() / base.dim;
    let threads = std::thread::available_parallelism()
        .map_or(1, |p| p.get())
        .min(n_queries)
        .max(1);
    let per_thread = n_queries.div_ceil(threads).max(1);
    std::thread::scope(|s| {
        let handles: Vec<_> = queries
            .chunks(per_thread * base.dim)
            .map(|chunk| s.spawn(move || scan(base, chunk, metric, n, progress)))
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("ground-truth worker panicked"))
            .collect()
    })
}

/// A heap entry ordered by (distance, id): the heap's top is the worst kept candidate.
#[derive(PartialEq)]
struct Key(f32, u64);

impl Eq for Key {}

impl Ord for Key {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0).then(self.1.cmp(&other.1))
    }
}

impl PartialOrd for Key {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

fn scan(
    base: &Dataset,
    queries: &[f32],
    metric: Metric,
    n: usize,
    progress: &(dyn Fn(usize) + Sync),
) -> Vec<Vec<Candidate>> {
    let dim = base.dim;
    let mut out = Vec::with_capacity(queries.len() / dim);
    for block in queries.chunks(QUERY_BLOCK * dim) {
        let mut heaps: Vec<BinaryHeap<Key>> = (0..block.len() / dim)
            .map(|_| BinaryHeap::with_capacity(n + 1))
            .collect();
        if n > 0 {
            for (id, row) in base.rows().enumerate() {
                for (q, heap) in block.chunks_exact(dim).zip(&mut heaps) {
                    let key = Key(metric.distance(q, row), id as u64);
                    if heap.len() < n {
                        heap.push(key);
                    } else if key < *heap.peek().expect("heap holds n > 0 entries") {
                        heap.pop();
                        heap.push(key);
                    }
                }
            }
        }
        out.extend(heaps.into_iter().map(|h| {
            let mut c: Vec<Candidate> = h
                .into_iter()
                .map(|Key(d, id)| Candidate::new(id, d))
                .collect();
            sort_candidates(&mut c);
            c
        }));
        progress(block.len() / dim);
    }
    out
}

/// Ground truth and where it came from.
#[derive(Debug)]
pub struct CachedGroundTruth {
    pub lists: Vec<Vec<Candidate>>,
    pub path: PathBuf,
    /// True when read from `path`, false when computed (and then written there).
    pub loaded: bool,
}

/// [`exact_top_n`], cached as `cache_dir/gt-<hash>.bin`. The hash covers the base and
/// query bytes, the metric and `n`, so any change to them computes afresh; a cache file
/// that does not read back cleanly is recomputed and replaced. `progress` is as for
/// [`exact_top_n_with_progress`] and is not called on a load.
pub fn exact_top_n_cached(
    base: &Dataset,
    queries: &[f32],
    metric: Metric,
    n: usize,
    cache_dir: &Path,
    progress: &(dyn Fn(usize) + Sync),
) -> io::Result<CachedGroundTruth> {
    let key = cache_key(base, queries, metric, n);
    let path = cache_dir.join(format!("gt-{key:032x}.bin"));
    let n_queries = queries.len() / base.dim;
    let per_query = n.min(base.n);
    if let Ok(lists) = File::open(&path)
        .and_then(|f| read_cache(BufReader::new(f), key, metric, n_queries, per_query))
    {
        return Ok(CachedGroundTruth {
            lists,
            path,
            loaded: true,
        });
    }
    let lists = exact_top_n_with_progress(base, queries, metric, n, progress);
    fs::create_dir_all(cache_dir)?;
    // Write under a temporary name and rename, so a crash never leaves a torn file
    // under the final name.
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    write_cache(
        BufWriter::new(File::create(&tmp)?),
        key,
        metric,
        per_query,
        &lists,
    )?;
    fs::rename(&tmp, &path)?;
    Ok(CachedGroundTruth {
        lists,
        path,
        loaded: false,
    })
}

const CACHE_MAGIC: &[u8; 8] = b"AKERGT\0\0";
const CACHE_VERSION: u32 = 1;

fn cache_key(base: &Dataset, queries: &[f32], metric: Metric, n: usize) -> u128 {
    let mut h = Xxh3::new();
    h.update(CACHE_MAGIC);
    h.update(&CACHE_VERSION.to_le_bytes());
    h.update(&[metric.code()]);
    for v in [n, base.dim, base.n, queries.len()] {
        h.update(&(v as u64).to_le_bytes());
    }
    binio::f32_le_chunks(&base.data, |b| h.update(b));
    binio::f32_le_chunks(queries, |b| h.update(b));
    h.digest128()
}

// Layout (little-endian): magic[8], version u32, metric u8, pad[3], key u128,
// n_queries u64, per_query u32, pad u32, then n_queries x per_query x (id u64, dist f32).

fn write_cache(
    mut w: impl Write,
    key: u128,
    metric: Metric,
    per_query: usize,
    lists: &[Vec<Candidate>],
) -> io::Result<()> {
    w.write_all(CACHE_MAGIC)?;
    w.write_all(&CACHE_VERSION.to_le_bytes())?;
    w.write_all(&[metric.code(), 0, 0, 0])?;
    w.write_all(&key.to_le_bytes())?;
    w.write_all(&(lists.len() as u64).to_le_bytes())?;
    w.write_all(&(per_query as u32).to_le_bytes())?;
    w.write_all(&0u32.to_le_bytes())?;
    for list in lists {
        debug_assert_eq!(list.len(), per_query);
        for c in list {
            w.write_all(&c.id.to_le_bytes())?;
            w.write_all(&c.distance.to_le_bytes())?;
        }
    }
    w.flush()
}

fn read_cache(
    mut r: impl Read,
    key: u128,
    metric: Metric,
    n_queries: usize,
    per_query: usize,
) -> io::Result<Vec<Vec<Candidate>>> {
    let bad = |what: &str| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("ground-truth cache: {what}"),
        )
    };
    let header_ok = binio::read_array::<8>(&mut r)? == *CACHE_MAGIC
        && binio::read_u32(&mut r)? == CACHE_VERSION
        && binio::read_array::<4>(&mut r)? == [metric.code(), 0, 0, 0]
        && u128::from_le_bytes(binio::read_array(&mut r)?) == key
        && binio::read_u64(&mut r)? == n_queries as u64
        && binio::read_u32(&mut r)? as usize == per_query
        && binio::read_u32(&mut r)? == 0;
    if !header_ok {
        return Err(bad("header does not match"));
    }
    let mut lists = Vec::with_capacity(n_queries);
    for _ in 0..n_queries {
        let mut list = Vec::with_capacity(per_query);
        for _ in 0..per_query {
            let id = binio::read_u64(&mut r)?;
            list.push(Candidate::new(id, binio::read_f32(&mut r)?));
        }
        lists.push(list);
    }
    binio::expect_eof(&mut r, "the ground-truth lists")?;
    Ok(lists)
}

#[cfg(test)]
mod tests {
    use super::*;
    use aker_formats::data::synthetic;

    fn naive(base: &Dataset, q: &[f32], metric: Metric, n: usize) -> Vec<(u64, f32)> {
        let mut all: Vec<Candidate> = base
            .rows()
            .enumerate()
            .map(|(i, r)| Candidate::new(i as u64, metric.distance(q, r)))
            .collect();
        sort_candidates(&mut all);
        all.truncate(n);
        all.into_iter().map(|c| (c.id, c.distance)).collect()
    }

    fn pairs(list: &[Candidate]) -> Vec<(u64, f32)> {
        list.iter().map(|c| (c.id, c.distance)).collect()
    }

    #[test]
    fn matches_a_full_sort_for_every_metric() {
        let base = synthetic(3_000, 12, 8, 1);
        let queries = synthetic(77, 12, 8, 2);
        for metric in [Metric::L2Sq, Metric::Cosine, Metric::InnerProduct] {
            let got = exact_top_n(&base, &queries.data, metric, 10);
            assert_eq!(got.len(), 77);
            for (q, list) in queries.rows().zip(&got) {
                assert_eq!(pairs(list), naive(&base, q, metric, 10), "{metric}");
                assert!(list.iter().all(|c| c.vector.is_none()));
            }
        }
    }

    #[test]
    fn ties_break_by_id_and_short_bases_give_short_lists() {
        // Rows 1, 2 and 4 are the same point; row 0 is the query itself.
        let base = Dataset::new(2, vec![0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 5.0, 5.0, 1.0, 1.0]).unwrap();
        let got = exact_top_n(&base, &[0.0, 0.0], Metric::L2Sq, 3);
        assert_eq!(pairs(&got[0]), vec![(0, 0.0), (1, 2.0), (2, 2.0)]);
        let all = exact_top_n(&base, &[0.0, 0.0, 5.0, 5.0], Metric::L2Sq, 100);
        assert_eq!(
            all[0].iter().map(|c| c.id).collect::<Vec<_>>(),
            vec![0, 1, 2, 4, 3]
        );
        assert_eq!(all[1][0].id, 3);
        assert!(exact_top_n(&base, &[0.0, 0.0], Metric::L2Sq, 0)[0].is_empty());
        assert!(exact_top_n(&base, &[], Metric::L2Sq, 3).is_empty());
    }

    #[test]
    fn cache_is_written_then_loaded() {
        let dir = tempfile::tempdir().unwrap();
        let base = synthetic(1_000, 8, 4, 3);
        let queries = synthetic(20, 8, 4, 4).data;

        let first =
            exact_top_n_cached(&base, &queries, Metric::L2Sq, 5, dir.path(), &|_| {}).unwrap();
        assert!(!first.loaded);
        assert_eq!(fs::metadata(&first.path).unwrap().len(), 48 + 20 * 5 * 12);

        // Doctor one stored distance: a load returns it, proving no recomputation.
        let mut bytes = fs::read(&first.path).unwrap();
        bytes[48 + 8..48 + 12].copy_from_slice(&(-1.0f32).to_le_bytes());
        fs::write(&first.path, &bytes).unwrap();
        let second =
            exact_top_n_cached(&base, &queries, Metric::L2Sq, 5, dir.path(), &|_| {}).unwrap();
        assert!(second.loaded);
        assert_eq!(second.path, first.path);
        assert_eq!(second.lists[0][0].distance, -1.0);
        assert_eq!(pairs(&second.lists[1]), pairs(&first.lists[1]));

        // Other inputs, other file.
        let other =
            exact_top_n_cached(&base, &queries, Metric::Cosine, 5, dir.path(), &|_| {}).unwrap();
        assert!(!other.loaded);
        assert_ne!(other.path, first.path);
        let deeper =
            exact_top_n_cached(&base, &queries, Metric::L2Sq, 6, dir.path(), &|_| {}).unwrap();
        assert_ne!(deeper.path, first.path);
    }

    #[test]
    fn damaged_cache_is_recomputed() {
        let dir = tempfile::tempdir().unwrap();
        let base = synthetic(500, 4, 3, 5);
        let queries = synthetic(9, 4, 3, 6).data;
        let first =
            exact_top_n_cached(&base, &queries, Metric::L2Sq, 4, dir.path(), &|_| {}).unwrap();
        let bytes = fs::read(&first.path).unwrap();

        fs::write(&first.path, &bytes[..bytes.len() - 5]).unwrap();
        let again =
            exact_top_n_cached(&base, &queries, Metric::L2Sq, 4, dir.path(), &|_| {}).unwrap();
        assert!(!again.loaded);
        assert_eq!(fs::read(&first.path).unwrap(), bytes);

        let mut wrong_key = bytes.clone();
        wrong_key[20] ^= 1;
        fs::write(&first.path, &wrong_key).unwrap();
        let again =
            exact_top_n_cached(&base, &queries, Metric::L2Sq, 4, dir.path(), &|_| {}).unwrap();
        assert!(!again.loaded);
        assert_eq!(again.lists.len(), 9);
        assert_eq!(pairs(&again.lists[3]), pairs(&first.lists[3]));
    }
}
