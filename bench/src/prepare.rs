//! Everything a recall experiment needs before its first request: the collection, the
//! held-out group bases, the simZipf groups, and the exact neighbours of every group
//! member (brute force on every core, cached on disk), so that each skew's stream and
//! the exact backend look their answers up instead of scanning again.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use aker_formats::data::{self, Dataset};
use shards::{Candidate, Metric};

use crate::groundtruth;
use crate::workload::{Groups, Workload, GROUP_SIZE};

/// Group bases held out of every collection (§5.1: the query set).
pub const HELD_OUT: usize = 1_000;

/// Where the vectors come from.
#[derive(Clone, Debug, PartialEq)]
pub enum Source {
    /// GloVe 6B 50-d as `ops/get-glove.sh` stores it.
    Glove,
    /// [`data::synthetic`] with these parameters.
    Synthetic {
        n: usize,
        dim: usize,
        clusters: usize,
    },
    /// A user's `.npy` or `.fvecs` file.
    File(PathBuf),
}

/// The synthetic set of the full report: 200,000 vectors after the hold-out, 16-d, 1,000
/// clusters whose populations differ 1,000-fold and spreads 30-fold. (At 32-d and 100
/// clusters the interpolated requests fall into the voids between tight clusters, where
/// every point of the nearest cluster is almost equally far: the top-10 is then
/// ill-conditioned and HNSW reached only 0.78 recall@10 at ef = 512.)
pub const SYNTHETIC: Source = Source::Synthetic {
    n: 201_000,
    dim: 16,
    clusters: 1_000,
};

/// The `--quick` smoke set.
pub const SYNTHETIC_QUICK: Source = Source::Synthetic {
    n: 21_000,
    dim: 16,
    clusters: 100,
};

/// `glove`, `synthetic` (the report's set), `synthetic:N:DIM:CLUSTERS`, or a file path.
impl FromStr for Source {
    type Err = String;
    fn from_str(s: &str) -> Result<Source, String> {
        if let Some(spec) = s.strip_prefix("synthetic:") {
            let parts: Vec<usize> = spec
                .split(':')
                .map(str::parse)
                .collect::<Result<_, _>>()
                .map_err(|e| format!("'{s}': {e} (expected synthetic:N:DIM:CLUSTERS)"))?;
            return match parts[..] {
                [n, dim, clusters] if dim > 0 && clusters > 0 => {
                    Ok(Source::Synthetic { n, dim, clusters })
                }
                _ => Err(format!(
                    "'{s}': expected synthetic:N:DIM:CLUSTERS, all positive"
                )),
            };
        }
        Ok(match s {
            "glove" => Source::Glove,
            "synthetic" => SYNTHETIC,
            path => Source::File(PathBuf::from(path)),
        })
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Glove => write!(f, "glove"),
            s if *s == SYNTHETIC => write!(f, "synthetic"),
            Source::Synthetic { n, dim, clusters } => {
                write!(f, "synthetic-{n}x{dim}x{clusters}")
            }
            Source::File(p) => write!(
                f,
                "{}",
                p.file_stem().map_or("file".into(), |s| s.to_string_lossy())
            ),
        }
    }
}

impl Source {
    /// Reads or generates the vectors; `data_dir` holds GloVe.
    pub fn load(&self, data_dir: &Path, seed: u64) -> Result<Dataset, String> {
        match self {
            Source::Glove => {
                let path = data_dir.join("glove-6b-50d.npy");
                if !path.exists() {
                    return Err(format!(
                        "{} is missing: run `bash ops/get-glove.sh` first",
                        path.display()
                    ));
                }
                data::load(&path).map_err(|e| e.to_string())
            }
            Source::Synthetic { n, dim, clusters } => {
                Ok(data::synthetic(*n, *dim, *clusters, seed))
            }
            Source::File(path) => data::load(path).map_err(|e| e.to_string()),
        }
    }

    /// A human description for the report.
    pub fn describe(&self) -> String {
        match self {
            Source::Glove => "GloVe 6B 50-d (data/glove-6b-50d.npy)".into(),
            Source::Synthetic { n, dim, clusters } => format!(
                "synthetic: {n} x {dim}-d, {clusters} Gaussian clusters with standard normal \
                 centres (populations ∝ 1/rank, spreads 0.02-0.6, the most populous the \
                 tightest)"
            ),
            Source::File(p) => p.display().to_string(),
        }
    }
}

/// The name a data set's rows carry in reports and results.csv: the source's, with
/// `/unit` appended when its vectors were unit-normalised (`--normalize`), so raw and
/// normalised rows never mix.
pub fn dataset_name(source: &Source, normalized: bool) -> String {
    if normalized {
        format!("{source}/unit")
    } else {
        source.to_string()
    }
}

/// `name` as a file-name part (figures): `glove/unit` -> `glove-unit`.
pub fn file_stem(name: &str) -> String {
    name.replace(['/', '\\'], "-")
}

/// Seeds of every random choice, derived from one base seed so a run is reproduced by it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seeds {
    pub synthetic: u64,
    pub split: u64,
    pub groups: u64,
    pub stream: u64,
    pub threshold: u64,
    pub potluck: u64,
    pub ef_sample: u64,
}

impl Seeds {
    pub fn from_base(base: u64) -> Seeds {
        Seeds {
            synthetic: base,
            split: base + 1,
            groups: base + 2,
            stream: base + 3,
            threshold: base + 4,
            potluck: base + 5,
            ef_sample: base + 6,
        }
    }
}

impl fmt::Display for Seeds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "synthetic {}, split {}, groups {}, stream {}, threshold pairs {}, potluck {}, ef sample {}",
            self.synthetic,
            self.split,
            self.groups,
            self.stream,
            self.threshold,
            self.potluck,
            self.ef_sample
        )
    }
}

/// A collection with its simZipf groups and every member's exact neighbours.
pub struct Prepared {
    pub name: String,
    pub metric: Metric,
    /// The collection (ids are its row numbers).
    pub base: Dataset,
    pub groups: Groups,
    /// Per group member, its exact top `depth` in `base`.
    pub member_truth: Vec<Vec<Candidate>>,
    pub depth: usize,
    pub truth_path: PathBuf,
    pub truth_loaded: bool,
}

impl Prepared {
    /// Splits off [`HELD_OUT`] bases, builds groups whose partners are the bases
    /// themselves (§5.1), and finds each member's exact top `depth` (cached in
    /// `cache_dir`). `unit_requests`: members are unit-normalised too, as an embedding
    /// pipeline that normalises its vectors normalises its queries (`--normalize`).
    /// `progress` counts members scanned.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        name: String,
        all: &Dataset,
        metric: Metric,
        depth: usize,
        unit_requests: bool,
        seeds: Seeds,
        cache_dir: &Path,
        progress: &(dyn Fn(usize) + Sync),
    ) -> Result<Prepared, String> {
        if all.n <= HELD_OUT + depth {
            return Err(format!(
                "{name}: {} vectors is too few to hold out {HELD_OUT} and keep {depth} neighbours",
                all.n
            ));
        }
        let (base, bases) = data::split_queries(all, HELD_OUT, seeds.split);
        let mut groups = Groups::build(&bases, &bases, GROUP_SIZE, seeds.groups);
        if unit_requests {
            groups.normalize_members();
        }
        let gt = groundtruth::exact_top_n_cached(
            &base,
            &groups.members,
            metric,
            depth,
            cache_dir,
            progress,
        )
        .map_err(|e| format!("ground truth cache in {}: {e}", cache_dir.display()))?;
        Ok(Prepared {
            name,
            metric,
            base,
            groups,
            member_truth: gt.lists,
            depth,
            truth_path: gt.path,
            truth_loaded: gt.loaded,
        })
    }

    pub fn members(&self) -> usize {
        self.member_truth.len()
    }

    /// Per distinct vector of `w`, its exact top-`k` ids.
    pub fn truth_ids(&self, w: &Workload, k: usize) -> Vec<Vec<u64>> {
        w.members
            .iter()
            .map(|&m| {
                self.member_truth[m as usize]
                    .iter()
                    .take(k)
                    .map(|c| c.id)
                    .collect()
            })
            .collect()
    }

    /// Per distinct vector of `w`, its exact top-`depth` list (for a trace's ground truth).
    pub fn truth_lists(&self, w: &Workload) -> Vec<Vec<Candidate>> {
        w.members
            .iter()
            .map(|&m| self.member_truth[m as usize].clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_parse_and_name_themselves() {
        assert_eq!("glove".parse::<Source>().unwrap(), Source::Glove);
        assert_eq!("synthetic".parse::<Source>().unwrap(), SYNTHETIC);
        assert_eq!(SYNTHETIC.to_string(), "synthetic");
        let s: Source = "synthetic:5000:8:10".parse().unwrap();
        assert_eq!(
            s,
            Source::Synthetic {
                n: 5000,
                dim: 8,
                clusters: 10
            }
        );
        assert_eq!(s.to_string(), "synthetic-5000x8x10");
        assert!("synthetic:5000:8".parse::<Source>().is_err());
        assert!("synthetic:5000:0:10".parse::<Source>().is_err());
        let f: Source = "/data/sift.fvecs".parse().unwrap();
        assert_eq!(f, Source::File("/data/sift.fvecs".into()));
        assert_eq!(f.to_string(), "sift");
    }

    #[test]
    fn normalised_sets_have_their_own_name_and_ground_truth_file() {
        assert_eq!(dataset_name(&Source::Glove, false), "glove");
        assert_eq!(dataset_name(&Source::Glove, true), "glove/unit");
        assert_eq!(file_stem("glove/unit"), "glove-unit");
        let dir = tempfile::tempdir().unwrap();
        let raw = data::synthetic(1_200, 8, 5, 1);
        let unit = raw.normalized();
        let prep = |all: &Dataset, name: &str| {
            Prepared::new(
                name.into(),
                all,
                Metric::L2Sq,
                5,
                false,
                Seeds::from_base(1),
                dir.path(),
                &|_| {},
            )
            .unwrap()
        };
        let (a, b) = (prep(&raw, "x"), prep(&unit, "x/unit"));
        assert!(
            !a.truth_loaded && !b.truth_loaded,
            "neither reuses the other's file"
        );
        assert_ne!(a.truth_path, b.truth_path);
        let again = prep(&unit, "x/unit");
        assert!(again.truth_loaded);
        assert_eq!(again.truth_path, b.truth_path);
        assert_eq!(again.member_truth, b.member_truth);
    }

    #[test]
    fn prepared_members_know_their_exact_neighbours() {
        let dir = tempfile::tempdir().unwrap();
        let all = data::synthetic(1_300, 8, 5, 1);
        let err = Prepared::new(
            "x".into(),
            &all,
            Metric::L2Sq,
            400,
            false,
            Seeds::from_base(1),
            dir.path(),
            &|_| {},
        );
        assert!(
            err.is_err(),
            "1,300 vectors cannot hold out 1,000 and keep 400"
        );
        let p = Prepared::new(
            "x".into(),
            &all,
            Metric::L2Sq,
            5,
            false,
            Seeds::from_base(1),
            dir.path(),
            &|_| {},
        )
        .unwrap();
        assert_eq!(p.base.n, 300);
        assert_eq!(p.members(), HELD_OUT * GROUP_SIZE);
        let w = crate::workload::sim_zipf(&p.groups, 500, 0.99, 3);
        let ids = p.truth_ids(&w, 3);
        let lists = p.truth_lists(&w);
        assert_eq!((ids.len(), lists.len()), (w.n_vectors(), w.n_vectors()));
        for (i, (ids, list)) in ids.iter().zip(&lists).enumerate() {
            let want = groundtruth::exact_top_n(&p.base, w.vector(i as u32), Metric::L2Sq, 5);
            assert_eq!(list, &want[0]);
            assert_eq!(
                ids[..],
                want[0].iter().take(3).map(|c| c.id).collect::<Vec<_>>()[..]
            );
        }
    }
}
