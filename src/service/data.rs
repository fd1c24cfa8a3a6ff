//! The collection the embedded backend serves: an [`aker_formats::data::Dataset`] read
//! from a `.npy` / `.fvecs` file (finite values only) or generated, and the routing
//! sample when there is no collection.

use std::path::Path;

use aker_formats::data::gaussian;
pub use aker_formats::data::Dataset;

/// Reads `.npy` (float32 or float16, C or Fortran order, 2-D) or `.fvecs` by extension,
/// refusing NaN and infinite components.
pub(crate) fn load(path: &Path) -> Result<Dataset, String> {
    let ds = aker_formats::data::load(path).map_err(|e| e.to_string())?;
    ds.check_finite()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(ds)
}

/// The routing sample when there are no vectors to train on (cache-aside without data,
/// an empty pgvector table): random centroids still route a query and its near
/// duplicates to the same shards.
pub(crate) fn random_routing_sample(dim: usize, centroids: usize, seed: u64) -> Dataset {
    gaussian(centroids.max(1) * 16, dim, seed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_refuses_non_finite_values() {
        let dir = std::env::temp_dir().join(format!("aker-data-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("nan.fvecs");
        let mut b = Vec::new();
        for row in [[1f32, 2.], [3., f32::INFINITY]] {
            b.extend_from_slice(&2i32.to_le_bytes());
            row.iter()
                .for_each(|x| b.extend_from_slice(&x.to_le_bytes()));
        }
        std::fs::write(&p, &b).unwrap();
        let err = load(&p).unwrap_err();
        assert!(
            err.contains("nan.fvecs") && err.contains("row 1 component 1 is not finite"),
            "{err}"
        );
        b.truncate(b.len() - 4);
        b.extend_from_slice(&4f32.to_le_bytes());
        std::fs::write(&p, &b).unwrap();
        assert_eq!(load(&p).unwrap().data, vec![1., 2., 3., 4.]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn routing_sample_without_data() {
        let s = random_routing_sample(8, 4, 1);
        assert_eq!((s.dim, s.len()), (8, 64));
        assert_eq!(random_routing_sample(8, 0, 1).len(), 16);
        assert_eq!(s, random_routing_sample(8, 4, 1));
    }
}
