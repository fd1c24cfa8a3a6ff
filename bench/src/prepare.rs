//! Everything a recall experiment needs before its first request: the collection, the
//! group bases (held out of the data set, or a query file's rows: [`Bases`]), the
//! simZipf groups, and the exact neighbours of every group member (brute force on every
//! core, cached on disk), so that each skew's stream and the exact backend look their
//! answers up instead of scanning again.

use std::borrow::Cow;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use aker_formats::data::{self, Dataset};
use shards::{Candidate, Metric};

use crate::groundtruth;
use crate::workload::{Groups, Workload, GROUP_SIZE};

/// Group bases held out of every collection by default (§5.1: the query set).
pub const HELD_OUT: usize = 1_000;

/// Where the simZipf group bases come from (`--queries`, `--groups`).
#[derive(Clone, Debug, PartialEq)]
pub enum Bases {
    /// This many rows of the data set, drawn with [`Seeds::split`], held out as the
    /// bases; the rest is the collection.
    HeldOut(usize),
    /// The first `n` rows of `rows`, a query file read from `path`; the whole data set is
    /// the collection (nothing held out).
    Queries {
        path: PathBuf,
        rows: Dataset,
        n: usize,
    },
}

impl Bases {
    /// The paper's set-up: [`HELD_OUT`] rows held out.
    pub const PAPER: Bases = Bases::HeldOut(HELD_OUT);

    /// Reads `path` with the loaders `--dataset` files use (`.npy` or `.fvecs`),
    /// unit-normalised with `normalize`; its first `n` rows are the bases.
    pub fn from_file(path: &Path, n: usize, normalize: bool) -> Result<Bases, String> {
        let mut rows = data::load(path).map_err(|e| e.to_string())?;
        if normalize {
            rows.normalize_rows();
        }
        Ok(Bases::Queries {
            path: path.to_path_buf(),
            rows,
            n,
        })
    }

    /// `(collection, bases)` of `all`: the rest of `all` and the held-out rows, or all of
    /// `all` and the query file's first `n` rows. Errors as [`Bases::check`]'s.
    pub fn split(
        &self,
        name: &str,
        all: &Dataset,
        seeds: Seeds,
    ) -> Result<(Dataset, Dataset), String> {
        self.check(name, all)?;
        Ok(match self {
            Bases::HeldOut(n) => data::split_queries(all, *n, seeds.split),
            Bases::Queries { rows, n, .. } => {
                let mut rows = rows.clone();
                rows.truncate(*n);
                (all.clone(), rows)
            }
        })
    }

    /// The collection's size once the bases are taken from `all`; an error (naming the
    /// data set `name`) for no bases, more bases than rows to take them from (held out:
    /// at least one row must stay), or a query file whose dimension is not `all`'s.
    pub fn check(&self, name: &str, all: &Dataset) -> Result<usize, String> {
        if self.count() == 0 {
            return Err(format!("{name}: --groups must be at least 1"));
        }
        match self {
            Bases::HeldOut(n) if *n >= all.n => Err(format!(
                "{name}: --groups {n} cannot be held out of {} vectors (some must stay the \
                 collection)",
                all.n
            )),
            Bases::HeldOut(n) => Ok(all.n - n),
            Bases::Queries { path, rows, .. } if rows.dim != all.dim => Err(format!(
                "{name}: the query file {} is {}-d but the data set is {}-d",
                path.display(),
                rows.dim,
                all.dim
            )),
            Bases::Queries { path, rows, n } if *n > rows.n => Err(format!(
                "{name}: --groups {n} but the query file {} has {} rows",
                path.display(),
                rows.n
            )),
            Bases::Queries { .. } => Ok(all.n),
        }
    }

    /// How many bases (groups).
    pub fn count(&self) -> usize {
        match self {
            Bases::HeldOut(n) | Bases::Queries { n, .. } => *n,
        }
    }

    /// Where the bases came from, for the report.
    pub fn origin(&self) -> BasesOrigin {
        match self {
            Bases::HeldOut(n) => BasesOrigin::HeldOut(*n),
            Bases::Queries { path, n, .. } => BasesOrigin::Queries {
                path: path.clone(),
                n: *n,
            },
        }
    }
}

/// [`Bases`] without the query rows: what the report says about them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BasesOrigin {
    HeldOut(usize),
    Queries { path: PathBuf, n: usize },
}

impl BasesOrigin {
    /// The set-up ALGORITHM.md's reference figures were measured in.
    pub fn is_paper(&self) -> bool {
        *self == BasesOrigin::HeldOut(HELD_OUT)
    }

    /// "1,000 rows held out of the data set (the rest is the collection)", or "the
    /// first N rows of FILE (--queries); the whole data set is the collection".
    pub fn describe(&self) -> String {
        match self {
            BasesOrigin::HeldOut(n) => format!(
                "group bases: {} rows held out of the data set (the rest is the collection)",
                thousands(*n)
            ),
            BasesOrigin::Queries { path, n } => format!(
                "group bases: the first {} rows of {} (--queries); the whole data set is the \
                 collection",
                thousands(*n),
                path.display()
            ),
        }
    }
}

/// `1000` -> `1,000`.
fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

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
    /// Where the group bases came from.
    pub bases: BasesOrigin,
    pub groups: Groups,
    /// Per group member, its exact top `depth` in `base`.
    pub member_truth: Vec<Vec<Candidate>>,
    pub depth: usize,
    pub truth_path: PathBuf,
    pub truth_loaded: bool,
}

impl Prepared {
    /// [`Prepared::with_bases`] with [`Bases::PAPER`]: [`HELD_OUT`] rows of `all` held
    /// out as the bases.
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
        Prepared::build(
            name,
            Cow::Borrowed(all),
            Bases::PAPER,
            metric,
            depth,
            unit_requests,
            seeds,
            cache_dir,
            progress,
        )
    }

    /// Takes the group bases as `bases` says (held out of `all`, or a query file's
    /// first rows with all of `all` the collection), builds groups whose partners are
    /// the bases themselves (§5.1), and finds each member's exact top `depth` (cached in
    /// `cache_dir`; the cache key hashes the collection and the members, so each choice
    /// of bases has its own file). `unit_requests`: members are unit-normalised too, as
    /// an embedding pipeline that normalises its vectors normalises its queries
    /// (`--normalize`; a query file's rows are the caller's to normalise, as
    /// [`Bases::from_file`] does). `progress` counts members scanned. Errors: no bases,
    /// more than there are rows, a query file of another dimension, or a collection no
    /// larger than `depth`.
    #[allow(clippy::too_many_arguments)]
    pub fn with_bases(
        name: String,
        all: Dataset,
        bases: Bases,
        metric: Metric,
        depth: usize,
        unit_requests: bool,
        seeds: Seeds,
        cache_dir: &Path,
        progress: &(dyn Fn(usize) + Sync),
    ) -> Result<Prepared, String> {
        Prepared::build(
            name,
            Cow::Owned(all),
            bases,
            metric,
            depth,
            unit_requests,
            seeds,
            cache_dir,
            progress,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn build(
        name: String,
        all: Cow<'_, Dataset>,
        bases: Bases,
        metric: Metric,
        depth: usize,
        unit_requests: bool,
        seeds: Seeds,
        cache_dir: &Path,
        progress: &(dyn Fn(usize) + Sync),
    ) -> Result<Prepared, String> {
        let origin = bases.origin();
        let collection = bases.check(&name, &all)?;
        if collection <= depth {
            return Err(format!(
                "{name}: {}a collection of {collection} vectors is too few to keep {depth} \
                 neighbours (the truth depth)",
                match bases {
                    Bases::HeldOut(n) => format!("holding out {n} group bases (--groups) leaves "),
                    Bases::Queries { .. } => String::new(),
                }
            ));
        }
        let (base, base_rows) = match bases {
            Bases::HeldOut(n) => data::split_queries(&all, n, seeds.split),
            Bases::Queries { mut rows, n, .. } => {
                rows.truncate(n);
                (all.into_owned(), rows)
            }
        };
        let mut groups = Groups::build(&base_rows, &base_rows, GROUP_SIZE, seeds.groups);
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
            bases: origin,
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

    /// A query file of `rows` x `dim` written to `dir` as .fvecs.
    fn query_file(dir: &Path, rows: usize, dim: usize) -> (PathBuf, Dataset) {
        let q = data::synthetic(rows, dim, 3, 9);
        let path = dir.join("queries.fvecs");
        data::write_fvecs(&path, &q).unwrap();
        (path, q)
    }

    fn with(all: &Dataset, bases: Bases, depth: usize, cache: &Path) -> Result<Prepared, String> {
        Prepared::with_bases(
            "x".into(),
            all.clone(),
            bases,
            Metric::L2Sq,
            depth,
            false,
            Seeds::from_base(1),
            cache,
            &|_| {},
        )
    }

    #[test]
    fn query_file_rows_are_the_bases_and_the_whole_data_set_the_collection() {
        let dir = tempfile::tempdir().unwrap();
        let all = data::synthetic(600, 8, 5, 1);
        let (path, q) = query_file(dir.path(), 40, 8);
        let p = with(
            &all,
            Bases::from_file(&path, 30, false).unwrap(),
            5,
            dir.path(),
        )
        .unwrap();
        assert_eq!(p.base, all, "nothing held out");
        assert_eq!((p.base.n, p.groups.len()), (600, 30));
        assert_eq!(p.members(), 30 * GROUP_SIZE);
        let mut first = q.clone();
        first.truncate(30);
        let seeds = Seeds::from_base(1);
        assert_eq!(
            p.groups,
            Groups::build(&first, &first, GROUP_SIZE, seeds.groups),
            "bases and partners: the file's first 30 rows"
        );
        let origin = BasesOrigin::Queries {
            path: path.clone(),
            n: 30,
        };
        assert_eq!(p.bases, origin);
        assert!(!origin.is_paper());
        let text = origin.describe();
        assert!(text.contains("first 30 rows of") && text.contains("queries.fvecs"));
        assert!(
            text.contains("the whole data set is the collection"),
            "{text}"
        );
        // The member ground truth is against the whole collection.
        let want = groundtruth::exact_top_n(&all, p.groups.member(7, 3), Metric::L2Sq, 5);
        assert_eq!(p.member_truth[7 * GROUP_SIZE + 3], want[0]);
        // Held out instead: another collection, other members, another cache file.
        let h = with(&all, Bases::HeldOut(30), 5, dir.path()).unwrap();
        assert_eq!((h.base.n, h.groups.len()), (570, 30));
        assert_ne!(h.truth_path, p.truth_path);
        assert!(h
            .bases
            .describe()
            .contains("30 rows held out of the data set"));
        assert!(BasesOrigin::HeldOut(HELD_OUT).is_paper());
        assert!(BasesOrigin::HeldOut(HELD_OUT)
            .describe()
            .contains("1,000 rows held out"));
        // The same file again: its cache file.
        let again = with(
            &all,
            Bases::from_file(&path, 30, false).unwrap(),
            5,
            dir.path(),
        )
        .unwrap();
        assert!(again.truth_loaded && again.truth_path == p.truth_path);
        // --normalize: the query rows are normalised too.
        let Bases::Queries { rows, .. } = Bases::from_file(&path, 30, true).unwrap() else {
            unreachable!()
        };
        assert_eq!(rows, q.normalized());
    }

    #[test]
    fn query_files_and_group_counts_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let all = data::synthetic(600, 8, 5, 1);
        let (path, _) = query_file(dir.path(), 40, 16);
        let e = with(
            &all,
            Bases::from_file(&path, 10, false).unwrap(),
            5,
            dir.path(),
        )
        .err()
        .unwrap();
        assert!(
            e.contains("16-d") && e.contains("8-d") && e.contains("queries.fvecs"),
            "{e}"
        );
        let (path, _) = query_file(dir.path(), 40, 8);
        let e = with(
            &all,
            Bases::from_file(&path, 41, false).unwrap(),
            5,
            dir.path(),
        )
        .err()
        .unwrap();
        assert!(e.contains("--groups 41") && e.contains("40 rows"), "{e}");
        assert!(with(
            &all,
            Bases::from_file(&path, 40, false).unwrap(),
            5,
            dir.path()
        )
        .is_ok());
        let e = with(
            &all,
            Bases::from_file(&path, 0, false).unwrap(),
            5,
            dir.path(),
        )
        .err()
        .unwrap();
        assert!(e.contains("at least 1"), "{e}");
        assert!(with(&all, Bases::HeldOut(0), 5, dir.path()).is_err());
        // The collection must stay deeper than the truth.
        assert!(with(
            &all,
            Bases::from_file(&path, 10, false).unwrap(),
            600,
            dir.path()
        )
        .is_err());
        assert!(with(
            &all,
            Bases::from_file(&path, 10, false).unwrap(),
            599,
            dir.path()
        )
        .is_ok());
        let e = with(&all, Bases::HeldOut(596), 5, dir.path())
            .err()
            .unwrap();
        assert!(e.contains("holding out 596"), "{e}");
        assert!(with(&all, Bases::HeldOut(594), 5, dir.path()).is_ok());
        assert!(Bases::from_file(&dir.path().join("missing.npy"), 10, false).is_err());
        // `split`, without a truth depth: at least one row stays the collection.
        let seeds = Seeds::from_base(1);
        assert!(Bases::HeldOut(600).split("x", &all, seeds).is_err());
        let (rest, held) = Bases::HeldOut(599).split("x", &all, seeds).unwrap();
        assert_eq!((rest.n, held.n), (1, 599));
        let (path, q) = query_file(dir.path(), 40, 8);
        let bases = Bases::from_file(&path, 12, false).unwrap();
        let (whole, first) = bases.split("x", &all, seeds).unwrap();
        assert_eq!((whole, first.n), (all.clone(), 12));
        assert_eq!(first.data[..], q.data[..12 * 8]);
        assert!(bases
            .split("x", &data::synthetic(50, 4, 2, 1), seeds)
            .is_err());
    }
}
