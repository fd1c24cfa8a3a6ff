//! Vector collections: an in-memory row-major `Dataset`, readers for `.npy` and `.fvecs`,
//! an `.fvecs` writer, seeded generators (unevenly populated Gaussian clusters, plain
//! standard-normal vectors), and the deterministic split of a collection into base
//! vectors and held-out queries.

use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use rand::distributions::{Distribution, WeightedIndex};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::StandardNormal;

use crate::binio;

/// `n` vectors of `dim` floats, stored row after row; row `i` has id `i`. `data` holds
/// exactly `n * dim` floats.
#[derive(Clone, Debug, PartialEq)]
pub struct Dataset {
    pub dim: usize,
    pub n: usize,
    pub data: Vec<f32>,
}

#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{}: {msg}", path.display())]
    Format { path: PathBuf, msg: String },
}

impl Dataset {
    /// A dataset over `data`, which must hold a whole number of `dim`-float rows, every
    /// float finite. (The file readers take values as they are; see
    /// [`Dataset::check_finite`].)
    pub fn new(dim: usize, data: Vec<f32>) -> Result<Dataset, String> {
        if dim == 0 {
            return Err("dimension must be positive".into());
        }
        if data.len() % dim != 0 {
            return Err(format!(
                "{} floats is not a whole number of {dim}-d rows",
                data.len()
            ));
        }
        let ds = Dataset {
            dim,
            n: data.len() / dim,
            data,
        };
        ds.check_finite()?;
        Ok(ds)
    }

    /// An error naming the first component that is NaN or infinite, if any.
    pub fn check_finite(&self) -> Result<(), String> {
        match self.data.iter().position(|x| !x.is_finite()) {
            Some(i) => Err(format!(
                "row {} component {} is not finite",
                i / self.dim,
                i % self.dim
            )),
            None => Ok(()),
        }
    }

    /// The number of rows, `n`.
    pub fn len(&self) -> usize {
        self.n
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    pub fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.dim..(i + 1) * self.dim]
    }

    pub fn rows(&self) -> impl ExactSizeIterator<Item = &[f32]> + '_ {
        self.data.chunks_exact(self.dim)
    }

    /// At most `max` rows, evenly strided, row-major (the daemon's router trains its
    /// k-means on this sample).
    pub fn sample(&self, max: usize) -> Vec<f32> {
        let n = self.n;
        if n <= max {
            return self.data.clone();
        }
        let mut out = Vec::with_capacity(max * self.dim);
        for j in 0..max {
            out.extend_from_slice(self.row(j * n / max));
        }
        out
    }

    /// Keeps the first `n` rows (all of them when there are fewer).
    pub fn truncate(&mut self, n: usize) {
        self.n = self.n.min(n);
        self.data.truncate(self.n * self.dim);
    }

    /// Scales every row to unit L2 norm in place (the norm summed in f64); a zero row
    /// stays zero.
    pub fn normalize_rows(&mut self) {
        normalize_rows(&mut self.data, self.dim);
    }

    /// A copy with every row scaled to unit L2 norm ([`Dataset::normalize_rows`]).
    pub fn normalized(&self) -> Dataset {
        let mut out = self.clone();
        out.normalize_rows();
        out
    }
}

/// Reads a `.npy` or `.fvecs` file, chosen by extension (in any case).
pub fn load(path: &Path) -> Result<Dataset, DataError> {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or("")
        .to_ascii_lowercase();
    match ext.as_str() {
        "npy" => read_npy(path),
        "fvecs" => read_fvecs(path),
        _ => Err(DataError::Format {
            path: path.to_owned(),
            msg: format!("unknown extension '{ext}' (expected .npy or .fvecs)"),
        }),
    }
}

/// Why a parse failed, before the path is attached.
enum Fail {
    Io(io::Error),
    Format(String),
}

impl Fail {
    fn at(self, path: &Path) -> DataError {
        match self {
            Fail::Io(source) => DataError::Io {
                path: path.to_owned(),
                source,
            },
            Fail::Format(msg) => DataError::Format {
                path: path.to_owned(),
                msg,
            },
        }
    }
}

/// Maps a short read to a format error that says what was cut off; other I/O errors
/// stay I/O errors.
fn truncated(what: &'static str) -> impl FnOnce(io::Error) -> Fail {
    move |e| match e.kind() {
        io::ErrorKind::UnexpectedEof => {
            Fail::Format(format!("truncated file: {what} is incomplete"))
        }
        io::ErrorKind::InvalidData => Fail::Format(e.to_string()),
        _ => Fail::Io(e),
    }
}

fn open(path: &Path) -> Result<BufReader<File>, DataError> {
    File::open(path)
        .map(|f| BufReader::with_capacity(1 << 20, f))
        .map_err(|source| DataError::Io {
            path: path.to_owned(),
            source,
        })
}

// ---------------------------------------------------------------------------- .npy

/// Reads a 2-D float32 or float16 little-endian `.npy` array (format versions 1–3;
/// native byte order, `=`, counts as little-endian on a little-endian host).
///
/// Fortran-ordered arrays are accepted and transposed into rows: the GloVe array that
/// `ops/get-glove.sh` fetches is stored that way.
pub fn read_npy(path: &Path) -> Result<Dataset, DataError> {
    parse_npy(&mut open(path)?).map_err(|f| f.at(path))
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum NpyType {
    F32,
    F16,
}

#[derive(Debug, PartialEq)]
struct NpyHeader {
    dtype: NpyType,
    fortran_order: bool,
    rows: usize,
    cols: usize,
}

fn parse_npy(r: &mut impl Read) -> Result<Dataset, Fail> {
    let magic: [u8; 6] = binio::read_array(r).map_err(truncated("the magic string"))?;
    if &magic != b"\x93NUMPY" {
        return Err(Fail::Format("not a .npy file (bad magic string)".into()));
    }
    let [major, _minor] = binio::read_array(r).map_err(truncated("the version"))?;
    let header_len = match major {
        1 => binio::read_u16(r).map(usize::from),
        2 | 3 => binio::read_u32(r).map(|l| l as usize),
        v => return Err(Fail::Format(format!("unsupported .npy format version {v}"))),
    }
    .map_err(truncated("the header length"))?;
    // A real header is a short dict padded to 64 bytes; anything huge is corruption.
    if header_len > 1 << 20 {
        return Err(Fail::Format(format!(
            "header length {header_len} is implausible"
        )));
    }
    let mut raw = vec![0u8; header_len];
    r.read_exact(&mut raw).map_err(truncated("the header"))?;
    // Version 3 allows UTF-8 in the header; versions 1 and 2 are latin-1, whose
    // non-ASCII bytes cannot occur in a float array's header anyway.
    let text = std::str::from_utf8(&raw).map_err(|_| Fail::Format("header is not text".into()))?;
    let header =
        parse_npy_header(text).map_err(|m| Fail::Format(format!("header {text:?}: {m}")))?;

    let count = header
        .rows
        .checked_mul(header.cols)
        .ok_or_else(|| Fail::Format("shape overflows".into()))?;
    let mut data = Vec::new();
    match header.dtype {
        NpyType::F32 => binio::read_f32s(r, count, &mut data),
        NpyType::F16 => read_f16s(r, count, &mut data),
    }
    .map_err(truncated("the array data"))?;
    binio::expect_eof(r, "the array data").map_err(truncated("the array data"))?;

    if header.fortran_order {
        data = transpose(&data, header.rows, header.cols);
    }
    Ok(Dataset {
        dim: header.cols,
        n: header.rows,
        data,
    })
}

/// Column-major `rows x cols` to row-major.
fn transpose(col_major: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0f32; col_major.len()];
    for (j, column) in col_major.chunks_exact(rows.max(1)).enumerate().take(cols) {
        for (i, &v) in column.iter().enumerate() {
            out[i * cols + j] = v;
        }
    }
    out
}

fn read_f16s(r: &mut impl Read, count: usize, out: &mut Vec<f32>) -> io::Result<()> {
    const CHUNK: usize = 1 << 16;
    let mut buf = vec![0u8; CHUNK.min(count) * 2];
    let mut left = count;
    while left > 0 {
        let take = left.min(CHUNK);
        let bytes = &mut buf[..take * 2];
        r.read_exact(bytes)?;
        out.extend(
            bytes
                .chunks_exact(2)
                .map(|b| half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32()),
        );
        left -= take;
    }
    Ok(())
}

/// A value in the header's Python literal.
#[derive(Debug, PartialEq)]
enum PyValue {
    Str(String),
    Bool(bool),
    Int(u64),
    Tuple(Vec<PyValue>),
    /// A list: structured dtypes describe their fields with one.
    List,
}

/// Parses the header dict (`{'descr': '<f4', 'fortran_order': False, 'shape': (n, d), }`)
/// and checks that it describes a 2-D little-endian float32/float16 array.
fn parse_npy_header(text: &str) -> Result<NpyHeader, String> {
    let mut p = PyParser {
        s: text.as_bytes(),
        i: 0,
    };
    let entries = p.dict()?;
    p.skip_ws();
    if p.i != p.s.len() {
        return Err("unexpected text after the dict".into());
    }
    let get = |key: &str| {
        entries
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v)
            .ok_or_else(|| format!("missing key '{key}'"))
    };
    let dtype = match get("descr")? {
        PyValue::Str(d) => match d.as_str() {
            "<f4" => NpyType::F32,
            "<f2" => NpyType::F16,
            "=f4" if cfg!(target_endian = "little") => NpyType::F32,
            "=f2" if cfg!(target_endian = "little") => NpyType::F16,
            ">f4" | ">f2" => return Err(format!("big-endian dtype '{d}' is not supported")),
            other => {
                return Err(format!(
                    "unsupported dtype '{other}' (expected '<f4' or '<f2')"
                ))
            }
        },
        PyValue::List => return Err("structured dtypes are not supported".into()),
        _ => return Err("'descr' is not a string".into()),
    };
    let fortran_order = match get("fortran_order")? {
        PyValue::Bool(b) => *b,
        _ => return Err("'fortran_order' is not a bool".into()),
    };
    let (rows, cols) = match get("shape")? {
        PyValue::Tuple(dims) => match dims.as_slice() {
            [PyValue::Int(r), PyValue::Int(c)] => (*r as usize, *c as usize),
            _ => {
                return Err(format!(
                    "expected a 2-D shape, got {} dimensions",
                    dims.len()
                ))
            }
        },
        _ => return Err("'shape' is not a tuple".into()),
    };
    if cols == 0 {
        return Err("rows of dimension 0".into());
    }
    Ok(NpyHeader {
        dtype,
        fortran_order,
        rows,
        cols,
    })
}

/// Just enough of a Python literal parser for `.npy` headers.
struct PyParser<'a> {
    s: &'a [u8],
    i: usize,
}

impl PyParser<'_> {
    fn skip_ws(&mut self) {
        while self.i < self.s.len() && self.s[self.i].is_ascii_whitespace() {
            self.i += 1;
        }
    }

    fn peek(&mut self) -> Option<u8> {
        self.skip_ws();
        self.s.get(self.i).copied()
    }

    fn expect(&mut self, c: u8) -> Result<(), String> {
        match self.peek() {
            Some(x) if x == c => {
                self.i += 1;
                Ok(())
            }
            Some(x) => Err(format!(
                "expected '{}' at byte {}, found '{}'",
                c as char, self.i, x as char
            )),
            None => Err(format!("expected '{}', found the end", c as char)),
        }
    }

    /// Parses `open item (, item)* [,] close`, calling `item` for each element.
    fn sequence(
        &mut self,
        open: u8,
        close: u8,
        mut item: impl FnMut(&mut Self) -> Result<(), String>,
    ) -> Result<(), String> {
        self.expect(open)?;
        loop {
            if self.peek() == Some(close) {
                self.i += 1;
                return Ok(());
            }
            item(self)?;
            match self.peek() {
                Some(b',') => self.i += 1,
                Some(c) if c == close => {}
                _ => {
                    return Err(format!(
                        "expected ',' or '{}' at byte {}",
                        close as char, self.i
                    ))
                }
            }
        }
    }

    fn dict(&mut self) -> Result<Vec<(String, PyValue)>, String> {
        let mut entries = Vec::new();
        self.sequence(b'{', b'}', |p| {
            let key = match p.value()? {
                PyValue::Str(k) => k,
                other => return Err(format!("dict key {other:?} is not a string")),
            };
            p.expect(b':')?;
            let value = p.value()?;
            entries.push((key, value));
            Ok(())
        })?;
        Ok(entries)
    }

    fn value(&mut self) -> Result<PyValue, String> {
        match self.peek() {
            Some(q @ (b'\'' | b'"')) => {
                let start = self.i + 1;
                let len = self.s[start..]
                    .iter()
                    .position(|&c| c == q)
                    .ok_or("unterminated string")?;
                self.i = start + len + 1;
                Ok(PyValue::Str(
                    String::from_utf8_lossy(&self.s[start..start + len]).into_owned(),
                ))
            }
            Some(b'(') => {
                let mut items = Vec::new();
                self.sequence(b'(', b')', |p| {
                    items.push(p.value()?);
                    Ok(())
                })?;
                Ok(PyValue::Tuple(items))
            }
            Some(b'[') => {
                self.sequence(b'[', b']', |p| p.value().map(drop))?;
                Ok(PyValue::List)
            }
            Some(c) if c.is_ascii_digit() => {
                let start = self.i;
                while self.i < self.s.len() && self.s[self.i].is_ascii_digit() {
                    self.i += 1;
                }
                let digits = std::str::from_utf8(&self.s[start..self.i]).expect("ASCII digits");
                // Python 2 era writers append 'L' to long integers.
                if self.s.get(self.i) == Some(&b'L') {
                    self.i += 1;
                }
                digits
                    .parse()
                    .map(PyValue::Int)
                    .map_err(|_| format!("integer {digits} is too large"))
            }
            Some(_) => {
                for (word, v) in [("True", true), ("False", false)] {
                    if self.s[self.i..].starts_with(word.as_bytes()) {
                        self.i += word.len();
                        return Ok(PyValue::Bool(v));
                    }
                }
                Err(format!("unexpected text at byte {}", self.i))
            }
            None => Err("unexpected end of header".into()),
        }
    }
}

// --------------------------------------------------------------------------- .fvecs

/// Reads an `.fvecs` file: each vector is a little-endian i32 dimension followed by that
/// many f32. Every vector must have the same dimension.
pub fn read_fvecs(path: &Path) -> Result<Dataset, DataError> {
    parse_fvecs(&mut open(path)?).map_err(|f| f.at(path))
}

/// Larger than any embedding in use; a larger leading word means the file is not fvecs.
const MAX_FVECS_DIM: usize = 1 << 20;

fn parse_fvecs(r: &mut impl Read) -> Result<Dataset, Fail> {
    let mut dim = None;
    let mut data = Vec::new();
    let mut n = 0usize;
    while let Some(d) = read_dim_or_eof(r)? {
        let d = usize::try_from(d)
            .ok()
            .filter(|&d| (1..=MAX_FVECS_DIM).contains(&d))
            .ok_or_else(|| Fail::Format(format!("vector {n}: invalid dimension {d}")))?;
        match dim {
            None => dim = Some(d),
            Some(first) if first != d => {
                return Err(Fail::Format(format!(
                    "vector {n} has dimension {d}, the first has {first}"
                )))
            }
            Some(_) => {}
        }
        binio::read_f32s(r, d, &mut data).map_err(truncated("the last vector"))?;
        n += 1;
    }
    let dim = dim.ok_or_else(|| Fail::Format("empty file: no vectors".into()))?;
    Ok(Dataset { dim, n, data })
}

/// The next record's dimension word, or `None` at a clean end of file.
fn read_dim_or_eof(r: &mut impl Read) -> Result<Option<i32>, Fail> {
    let mut b = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match r.read(&mut b[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => {
                return Err(Fail::Format(
                    "truncated file: a dimension word is incomplete".into(),
                ))
            }
            Ok(k) => got += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Fail::Io(e)),
        }
    }
    Ok(Some(i32::from_le_bytes(b)))
}

/// Writes `ds` as `.fvecs`.
pub fn write_fvecs(path: &Path, ds: &Dataset) -> Result<(), DataError> {
    let io_err = |source| DataError::Io {
        path: path.to_owned(),
        source,
    };
    let dim = i32::try_from(ds.dim).map_err(|_| DataError::Format {
        path: path.to_owned(),
        msg: format!("dimension {} does not fit fvecs", ds.dim),
    })?;
    let mut w = BufWriter::new(File::create(path).map_err(io_err)?);
    for row in ds.rows() {
        w.write_all(&dim.to_le_bytes()).map_err(io_err)?;
        binio::write_f32s(&mut w, row).map_err(io_err)?;
    }
    w.flush().map_err(io_err)
}

// ------------------------------------------------------------------------ synthetic

/// `n` points in `dim` dimensions drawn from `clusters` Gaussian clusters whose
/// population and spread both vary strongly: cluster `c` gets a share proportional to
/// `1 / (c + 1)`, and the more populous a cluster the tighter it is (standard deviation
/// from 0.02 for the largest to 0.6 for the smallest, jittered), so the set mixes dense
/// tight clusters with sparse wide ones. Centres are standard normal. Deterministic in
/// `seed`.
pub fn synthetic(n: usize, dim: usize, clusters: usize, seed: u64) -> Dataset {
    synthetic_labelled(n, dim, clusters, seed).0
}

/// The generator behind [`synthetic`], also returning each point's cluster.
fn synthetic_labelled(n: usize, dim: usize, clusters: usize, seed: u64) -> (Dataset, Vec<usize>) {
    assert!(
        dim > 0 && clusters > 0,
        "synthetic data needs dim > 0 and clusters > 0"
    );
    const TIGHTEST: f64 = 0.02;
    const WIDEST: f64 = 0.6;
    let mut rng = StdRng::seed_from_u64(seed);
    let centres: Vec<f32> = (0..clusters * dim)
        .map(|_| rng.sample(StandardNormal))
        .collect();
    let spreads: Vec<f32> = (0..clusters)
        .map(|c| {
            let rank = if clusters == 1 {
                0.0
            } else {
                c as f64 / (clusters - 1) as f64
            };
            let jitter: f64 = rng.gen_range(0.8..1.25);
            (TIGHTEST * (WIDEST / TIGHTEST).powf(rank) * jitter) as f32
        })
        .collect();
    let weights =
        WeightedIndex::new((0..clusters).map(|c| 1.0 / (c + 1) as f64)).expect("positive weights");

    let mut data = Vec::with_capacity(n * dim);
    let mut labels = Vec::with_capacity(n);
    for _ in 0..n {
        let c = weights.sample(&mut rng);
        let centre = &centres[c * dim..(c + 1) * dim];
        data.extend(
            centre
                .iter()
                .map(|&m| m + spreads[c] * rng.sample::<f32, _>(StandardNormal)),
        );
        labels.push(c);
    }
    (Dataset { dim, n, data }, labels)
}

/// `n` standard-normal vectors of `dim` components, deterministic in `seed` (the
/// daemon's routing sample when it has no collection).
pub fn gaussian(n: usize, dim: usize, seed: u64) -> Dataset {
    let mut rng = StdRng::seed_from_u64(seed);
    let data = (0..n * dim).map(|_| rng.sample(StandardNormal)).collect();
    Dataset { dim, n, data }
}

// ---------------------------------------------------------------------------- split

/// Splits `ds` into `(base, queries)`: `n_queries` distinct rows chosen uniformly with
/// `seed` become the queries (in the order drawn); the rest, in their original order,
/// form the base collection, whose row indices are the ids ground truth refers to.
pub fn split_queries(ds: &Dataset, n_queries: usize, seed: u64) -> (Dataset, Dataset) {
    assert!(
        n_queries <= ds.n,
        "cannot hold out {n_queries} queries from {} vectors",
        ds.n
    );
    let mut rng = StdRng::seed_from_u64(seed);
    let picked = rand::seq::index::sample(&mut rng, ds.n, n_queries).into_vec();
    let mut is_query = vec![false; ds.n];
    let mut queries = Vec::with_capacity(n_queries * ds.dim);
    for &i in &picked {
        is_query[i] = true;
        queries.extend_from_slice(ds.row(i));
    }
    let mut base = Vec::with_capacity((ds.n - n_queries) * ds.dim);
    for (row, _) in ds.rows().zip(&is_query).filter(|(_, &q)| !q) {
        base.extend_from_slice(row);
    }
    (
        Dataset {
            dim: ds.dim,
            n: ds.n - n_queries,
            data: base,
        },
        Dataset {
            dim: ds.dim,
            n: n_queries,
            data: queries,
        },
    )
}

/// Scales every `dim`-float row of `rows` to unit L2 norm (a zero row stays zero).
pub fn normalize_rows(rows: &mut [f32], dim: usize) {
    for row in rows.chunks_exact_mut(dim) {
        let norm = row
            .iter()
            .map(|&x| f64::from(x) * f64::from(x))
            .sum::<f64>()
            .sqrt();
        if norm > 0.0 {
            row.iter_mut()
                .for_each(|x| *x = (f64::from(*x) / norm) as f32);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `.npy` file's bytes: version 1 header padded to 64 bytes, then `payload`.
    fn npy_bytes(dict: &str, payload: &[u8]) -> Vec<u8> {
        let mut header = dict.to_string();
        while (10 + header.len() + 1) % 64 != 0 {
            header.push(' ');
        }
        header.push('\n');
        let mut out = b"\x93NUMPY\x01\x00".to_vec();
        out.extend((header.len() as u16).to_le_bytes());
        out.extend(header.as_bytes());
        out.extend(payload);
        out
    }

    fn f32_payload(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    }

    #[test]
    fn normalized_rows_have_unit_norm_and_zero_rows_stay_zero() {
        let ds = Dataset::new(3, vec![3.0, 0.0, 4.0, 0.0, 0.0, 0.0, -1e-20, 2e-20, 0.0]).unwrap();
        let unit = ds.normalized();
        assert_eq!((unit.n, unit.dim), (3, 3));
        assert_eq!(unit.row(0), &[0.6, 0.0, 0.8]);
        assert_eq!(unit.row(1), &[0.0, 0.0, 0.0], "a zero row stays zero");
        // Tiny components: the f64 norm does not underflow.
        let r = unit.row(2);
        assert!((r[0] + 1.0 / 5f32.sqrt()).abs() < 1e-6 && (r[1] - 2.0 / 5f32.sqrt()).abs() < 1e-6);
        let many = synthetic(500, 16, 5, 3).normalized();
        for row in many.rows() {
            let norm: f64 = row.iter().map(|&x| f64::from(x) * f64::from(x)).sum();
            assert!((norm.sqrt() - 1.0).abs() < 1e-6, "{norm}");
        }
        // Directions are kept: a row's normalised form is a positive multiple of it.
        let raw = synthetic(500, 16, 5, 3);
        let (a, b) = (raw.row(7), many.row(7));
        let scale = b[0] / a[0];
        assert!(scale > 0.0);
        assert!(a.iter().zip(b).all(|(x, y)| (x * scale - y).abs() < 1e-5));
        let mut again = many.clone();
        again.normalize_rows();
        assert!(again
            .data
            .iter()
            .zip(&many.data)
            .all(|(x, y)| (x - y).abs() < 1e-6));
    }

    fn format_error(r: Result<Dataset, DataError>) -> String {
        match r {
            Err(DataError::Format { msg, .. }) => msg,
            other => panic!("expected a format error, got {other:?}"),
        }
    }

    #[test]
    fn npy_f32_c_order() {
        let dir = tempfile::tempdir().unwrap();
        let vals = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        let p = write(
            dir.path(),
            "a.npy",
            &npy_bytes(
                "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }",
                &f32_payload(&vals),
            ),
        );
        let ds = load(&p).unwrap();
        assert_eq!((ds.n, ds.dim), (2, 3));
        assert_eq!(ds.row(1), &[4.0, 5.0, 6.0]);
    }

    #[test]
    fn npy_fortran_order_is_transposed() {
        let dir = tempfile::tempdir().unwrap();
        // Rows [1,2,3] and [4,5,6], stored column by column.
        let cols = [1.0, 4.0, 2.0, 5.0, 3.0, 6.0];
        let p = write(
            dir.path(),
            "f.npy",
            &npy_bytes(
                "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }",
                &f32_payload(&cols),
            ),
        );
        let ds = read_npy(&p).unwrap();
        assert_eq!(ds.data, vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    }

    #[test]
    fn npy_f16_and_version_2_header() {
        // 1.0, -2.0, 0.5, 65504 (f16 max) and a subnormal (2^-24).
        let bits: [u16; 6] = [0x3C00, 0xC000, 0x3800, 0x7BFF, 0x0001, 0x0000];
        let payload: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
        let dict = "{\"descr\":\"<f2\",\"fortran_order\":False,\"shape\":(3,2)}\n";
        let mut bytes = b"\x93NUMPY\x02\x00".to_vec();
        bytes.extend((dict.len() as u32).to_le_bytes());
        bytes.extend(dict.as_bytes());
        bytes.extend(payload);
        let dir = tempfile::tempdir().unwrap();
        let ds = read_npy(&write(dir.path(), "h.npy", &bytes)).unwrap();
        assert_eq!((ds.n, ds.dim), (3, 2));
        assert_eq!(ds.data, vec![1.0, -2.0, 0.5, 65504.0, 2f32.powi(-24), 0.0]);
    }

    #[test]
    fn npy_rejects_what_it_cannot_read() {
        let dir = tempfile::tempdir().unwrap();
        let cases = [
            (
                "{'descr': '<f8', 'fortran_order': False, 'shape': (1, 1), }",
                "unsupported dtype '<f8'",
            ),
            (
                "{'descr': '<i4', 'fortran_order': False, 'shape': (1, 1), }",
                "unsupported dtype '<i4'",
            ),
            (
                "{'descr': '>f4', 'fortran_order': False, 'shape': (1, 1), }",
                "big-endian",
            ),
            (
                "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,), }",
                "structured",
            ),
            (
                "{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }",
                "2-D shape, got 1",
            ),
            (
                "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1, 4), }",
                "2-D shape, got 3",
            ),
            (
                "{'descr': '<f4', 'shape': (1, 1), }",
                "missing key 'fortran_order'",
            ),
            (
                "{'descr': '<f4', 'fortran_order': Maybe, 'shape': (1, 1), }",
                "unexpected text",
            ),
        ];
        for (dict, want) in cases {
            let p = write(dir.path(), "bad.npy", &npy_bytes(dict, &[0u8; 16]));
            let msg = format_error(read_npy(&p));
            assert!(msg.contains(want), "{dict}: {msg}");
        }
    }

    #[test]
    fn npy_truncated_or_padded_data_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }";
        let short = write(dir.path(), "s.npy", &npy_bytes(dict, &[0u8; 12]));
        assert!(format_error(read_npy(&short)).contains("truncated"));
        let long = write(dir.path(), "l.npy", &npy_bytes(dict, &[0u8; 20]));
        assert!(format_error(read_npy(&long)).contains("trailing"));
        let not_npy = write(dir.path(), "x.npy", b"PK\x03\x04 a zip file");
        assert!(format_error(read_npy(&not_npy)).contains("magic"));
        let missing = read_npy(&dir.path().join("absent.npy")).unwrap_err();
        assert!(matches!(missing, DataError::Io { .. }));
        assert!(missing.to_string().contains("absent.npy"));
    }

    #[test]
    fn fvecs_round_trip_and_errors() {
        let dir = tempfile::tempdir().unwrap();
        let ds = synthetic(37, 5, 3, 1);
        let p = dir.path().join("x.fvecs");
        write_fvecs(&p, &ds).unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 37 * (4 + 5 * 4));
        assert_eq!(load(&p).unwrap(), ds);

        let bytes = std::fs::read(&p).unwrap();
        let cut = write(dir.path(), "cut.fvecs", &bytes[..bytes.len() - 3]);
        assert!(format_error(read_fvecs(&cut)).contains("truncated"));
        let cut_word = write(dir.path(), "cutw.fvecs", &bytes[..24 + 2]);
        assert!(format_error(read_fvecs(&cut_word)).contains("truncated"));
        let mut mixed = bytes[..24].to_vec();
        mixed.extend(4i32.to_le_bytes());
        mixed.extend([0u8; 16]);
        let mixed = write(dir.path(), "mixed.fvecs", &mixed);
        assert!(format_error(read_fvecs(&mixed)).contains("dimension 4, the first has 5"));
        let negative = write(dir.path(), "neg.fvecs", &(-3i32).to_le_bytes());
        assert!(format_error(read_fvecs(&negative)).contains("invalid dimension -3"));
        let empty = write(dir.path(), "empty.fvecs", b"");
        assert!(format_error(read_fvecs(&empty)).contains("empty"));
    }

    #[test]
    fn synthetic_is_deterministic_and_uneven() {
        let (a, labels) = synthetic_labelled(20_000, 16, 20, 7);
        assert_eq!((a.n, a.dim, a.data.len()), (20_000, 16, 20_000 * 16));
        assert_eq!(synthetic(20_000, 16, 20, 7), a);
        assert_ne!(synthetic(20_000, 16, 20, 8).data, a.data);

        let mut count = vec![0usize; 20];
        let mut sum = vec![vec![0f64; 16]; 20];
        for (row, &c) in a.rows().zip(&labels) {
            count[c] += 1;
            sum[c]
                .iter_mut()
                .zip(row)
                .for_each(|(s, &x)| *s += x as f64);
        }
        // Mean squared distance to the cluster's own mean, per cluster.
        let mut spread = vec![0f64; 20];
        for (row, &c) in a.rows().zip(&labels) {
            let mean = sum[c].iter().map(|s| s / count[c] as f64);
            spread[c] += row
                .iter()
                .zip(mean)
                .map(|(&x, m)| (x as f64 - m).powi(2))
                .sum::<f64>();
        }
        spread
            .iter_mut()
            .zip(&count)
            .for_each(|(s, &n)| *s /= n as f64);

        assert!(count[0] > 10 * count[19], "populations {count:?}");
        // The dense cluster is tight and the sparse one wide: squared spread ratio
        // (0.6/0.02)^2 = 900 before jitter.
        assert!(spread[19] > 200.0 * spread[0], "spreads {spread:?}");
    }

    #[test]
    fn split_is_a_deterministic_partition() {
        let ds = synthetic(500, 4, 5, 3);
        let (base, queries) = split_queries(&ds, 50, 11);
        assert_eq!((base.n, queries.n), (450, 50));
        assert_eq!(split_queries(&ds, 50, 11), (base.clone(), queries.clone()));
        assert_ne!(split_queries(&ds, 50, 12).1, queries);

        // Every original row lands in exactly one part (rows are distinct floats).
        let key = |r: &[f32]| r.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let mut all: Vec<_> = base.rows().chain(queries.rows()).map(key).collect();
        let mut orig: Vec<_> = ds.rows().map(key).collect();
        all.sort();
        orig.sort();
        assert_eq!(all, orig);
        // The base keeps the original order.
        let positions: Vec<usize> = base
            .rows()
            .map(|r| ds.rows().position(|o| o == r).unwrap())
            .collect();
        assert!(positions.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn dataset_new_checks_shape() {
        assert!(Dataset::new(3, vec![0.0; 7]).is_err());
        assert!(Dataset::new(0, vec![]).is_err());
        let ds = Dataset::new(2, vec![1.0, 2.0, 3.0, 4.0]).unwrap();
        assert_eq!(ds.n, 2);
        assert_eq!(ds.len(), 2);
        assert_eq!(ds.row(1), &[3.0, 4.0]);
        assert!(!ds.is_empty());
    }

    #[test]
    fn dataset_new_rejects_non_finite_values_the_readers_keep() {
        let err = Dataset::new(2, vec![1.0, 2.0, 3.0, f32::NAN]).unwrap_err();
        assert_eq!(err, "row 1 component 1 is not finite");
        assert!(Dataset::new(1, vec![f32::INFINITY]).is_err());

        let dir = tempfile::tempdir().unwrap();
        let p = write(
            dir.path(),
            "nan.npy",
            &npy_bytes(
                "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2), }",
                &f32_payload(&[0.5, f32::NAN]),
            ),
        );
        let ds = read_npy(&p).unwrap();
        assert!(ds.data[1].is_nan());
        assert_eq!(
            ds.check_finite().unwrap_err(),
            "row 0 component 1 is not finite"
        );
    }

    #[test]
    fn sample_strides_and_truncate_keeps_a_prefix() {
        let a = synthetic(500, 8, 4, 3);
        assert_eq!(a, synthetic(500, 8, 4, 3));
        assert_eq!(a.len(), 500);
        let s = a.sample(100);
        assert_eq!(s.len(), 100 * 8);
        assert_eq!(&s[8..16], a.row(5));
        assert_eq!(a.sample(1000), a.data);

        let mut t = a.clone();
        t.truncate(10);
        assert_eq!((t.n, t.data.len()), (10, 80));
        assert_eq!(t.row(9), a.row(9));
        t.truncate(50);
        assert_eq!(t.n, 10);
        t.truncate(0);
        assert!(t.is_empty());
    }

    #[test]
    fn gaussian_is_standard_normal_and_seeded() {
        let g = gaussian(2_000, 4, 9);
        assert_eq!((g.n, g.dim, g.data.len()), (2_000, 4, 8_000));
        assert_eq!(gaussian(2_000, 4, 9), g);
        assert_ne!(gaussian(2_000, 4, 10), g);
        let mean = g.data.iter().map(|&x| x as f64).sum::<f64>() / 8_000.0;
        let var = g
            .data
            .iter()
            .map(|&x| (x as f64 - mean).powi(2))
            .sum::<f64>()
            / 8_000.0;
        assert!(mean.abs() < 0.05 && (var - 1.0).abs() < 0.1, "{mean} {var}");
    }

    /// Reads `.npy` bytes from memory, as a file at `mem.npy` would be read.
    fn npy_from(bytes: &[u8]) -> Result<Dataset, DataError> {
        parse_npy(&mut &bytes[..]).map_err(|f| f.at(Path::new("mem.npy")))
    }

    fn fvecs_from(bytes: &[u8]) -> Result<Dataset, DataError> {
        parse_fvecs(&mut &bytes[..]).map_err(|f| f.at(Path::new("mem.fvecs")))
    }

    #[test]
    fn npy_c_and_fortran_order_and_f16_from_a_stream() {
        let c = npy_bytes(
            "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }",
            &f32_payload(&[1., 2., 3., 4., 5., 6.]),
        );
        let ds = npy_from(&c).unwrap();
        assert_eq!((ds.dim, ds.len()), (3, 2));
        assert_eq!(ds.row(1), &[4., 5., 6.]);
        let f = npy_bytes(
            "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }",
            &f32_payload(&[1., 4., 2., 5., 3., 6.]),
        );
        assert_eq!(npy_from(&f).unwrap(), ds);
        let halves: Vec<u8> = [0x3c00u16, 0xc000, 0x3800, 0x0000]
            .iter()
            .flat_map(|h| h.to_le_bytes())
            .collect();
        let h = npy_bytes(
            "{'descr': '<f2', 'fortran_order': False, 'shape': (2, 2), }",
            &halves,
        );
        assert_eq!(npy_from(&h).unwrap().data, vec![1.0, -2.0, 0.5, 0.0]);
        let short = npy_bytes(
            "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }",
            &f32_payload(&[1., 2.]),
        );
        assert!(npy_from(&short).is_err());
        let i8s = npy_bytes(
            "{'descr': '|i1', 'fortran_order': False, 'shape': (1, 1), }",
            &[1],
        );
        assert!(npy_from(&i8s).is_err());
    }

    #[test]
    fn npy_native_byte_order_and_extension_case() {
        let native = npy_bytes(
            "{'descr': '=f4', 'fortran_order': False, 'shape': (1, 2), }",
            &f32_payload(&[1.5, -2.0]),
        );
        let halves: Vec<u8> = [0x3c00u16, 0x3800]
            .iter()
            .flat_map(|h| h.to_le_bytes())
            .collect();
        let native_f16 = npy_bytes(
            "{'descr': '=f2', 'fortran_order': False, 'shape': (2, 1), }",
            &halves,
        );
        if cfg!(target_endian = "little") {
            assert_eq!(npy_from(&native).unwrap().data, vec![1.5, -2.0]);
            assert_eq!(npy_from(&native_f16).unwrap().data, vec![1.0, 0.5]);
        }

        let dir = tempfile::tempdir().unwrap();
        let upper = write(
            dir.path(),
            "A.NPY",
            &npy_bytes(
                "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2), }",
                &f32_payload(&[3.0, 4.0]),
            ),
        );
        assert_eq!(load(&upper).unwrap().data, vec![3.0, 4.0]);
        let ds = synthetic(3, 2, 1, 0);
        let fv = dir.path().join("b.FVecs");
        write_fvecs(&fv, &ds).unwrap();
        assert_eq!(load(&fv).unwrap(), ds);
        let other = write(dir.path(), "c.bin", b"");
        assert!(format_error(load(&other)).contains("unknown extension 'bin'"));
    }

    #[test]
    fn fvecs_from_a_stream_and_a_dangling_dimension_word() {
        let mut b = Vec::new();
        for row in [[1f32, 2.], [3., 4.]] {
            b.extend_from_slice(&2i32.to_le_bytes());
            b.extend_from_slice(&f32_payload(&row));
        }
        let ds = fvecs_from(&b).unwrap();
        assert_eq!(ds.data, vec![1., 2., 3., 4.]);
        b.extend_from_slice(&3i32.to_le_bytes());
        assert!(fvecs_from(&b).is_err());
    }
}
