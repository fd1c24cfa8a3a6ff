//! The collection the embedded backend serves: a row-major `f32` matrix read from a
//! `.npy` / `.fvecs` file or generated (clustered synthetic data). Kept small on purpose:
//! the experiment runner (`bench`) has the full-featured readers; the daemon only needs
//! to load a collection at start.

use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::Path;

use rand::distributions::{Distribution, WeightedIndex};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::StandardNormal;

/// `n` vectors of `dim` components, row-major; row `i` has id `i`.
#[derive(Clone, Debug, PartialEq)]
pub struct Dataset {
    pub dim: usize,
    pub data: Vec<f32>,
}

impl Dataset {
    pub fn new(dim: usize, data: Vec<f32>) -> Result<Dataset, String> {
        if dim == 0 || !data.chunks_exact(dim).remainder().is_empty() {
            return Err(format!(
                "{} values do not make rows of dimension {dim}",
                data.len()
            ));
        }
        if let Some(i) = data.iter().position(|x| !x.is_finite()) {
            return Err(format!(
                "row {} component {} is not finite",
                i / dim,
                i % dim
            ));
        }
        Ok(Dataset { dim, data })
    }

    pub fn len(&self) -> usize {
        self.data.len() / self.dim
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    pub fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.dim..(i + 1) * self.dim]
    }

    /// At most `max` rows, evenly strided (the router's k-means sample).
    pub fn sample(&self, max: usize) -> Vec<f32> {
        let n = self.len();
        if n <= max {
            return self.data.clone();
        }
        let mut out = Vec::with_capacity(max * self.dim);
        for j in 0..max {
            out.extend_from_slice(self.row(j * n / max));
        }
        out
    }

    /// Keeps the first `n` rows.
    pub fn truncate(&mut self, n: usize) {
        self.data.truncate(n * self.dim);
    }
}

/// Clustered synthetic data, deterministic in `seed`: `clusters` standard-normal centres;
/// cluster `c` draws a share proportional to `1 / (c + 1)` of the points, and the more
/// populous a cluster the tighter it is (spread 0.02 .. 0.6), so dense and sparse regions
/// mix (the shape of `bench`'s generator).
pub fn synthetic(n: usize, dim: usize, clusters: usize, seed: u64) -> Dataset {
    assert!(
        dim > 0 && clusters > 0,
        "synthetic data needs dim, clusters > 0"
    );
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
            (0.02 * 30f64.powf(rank) * rng.gen_range(0.8..1.25)) as f32
        })
        .collect();
    let weights =
        WeightedIndex::new((0..clusters).map(|c| 1.0 / (c + 1) as f64)).expect("positive weights");
    let mut data = Vec::with_capacity(n * dim);
    for _ in 0..n {
        let c = weights.sample(&mut rng);
        for t in 0..dim {
            let z: f32 = rng.sample(StandardNormal);
            data.push(centres[c * dim + t] + spreads[c] * z);
        }
    }
    Dataset { dim, data }
}

/// The routing sample when there are no vectors to train on (cache-aside without data,
/// an empty pgvector table): random centroids still route a query and its near
/// duplicates to the same shards.
pub fn random_routing_sample(dim: usize, centroids: usize, seed: u64) -> Dataset {
    gaussian(centroids.max(1) * 16, dim, seed)
}

/// `n` standard-normal vectors: a routing sample when there is no collection.
pub fn gaussian(n: usize, dim: usize, seed: u64) -> Dataset {
    let mut rng = StdRng::seed_from_u64(seed);
    let data = (0..n * dim).map(|_| rng.sample(StandardNormal)).collect();
    Dataset { dim, data }
}

/// Reads `.npy` (float32 or float16, C or Fortran order, 2-D) or `.fvecs` by extension.
pub fn load(path: &Path) -> Result<Dataset, String> {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or("")
        .to_ascii_lowercase();
    let file = File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut r = BufReader::with_capacity(1 << 20, file);
    let ds = match ext.as_str() {
        "npy" => read_npy(&mut r),
        "fvecs" => read_fvecs(&mut r),
        _ => Err(format!("unknown extension '{ext}' (want .npy or .fvecs)")),
    };
    ds.map_err(|e| format!("{}: {e}", path.display()))
}

fn read_exact<const N: usize>(r: &mut impl Read) -> io::Result<[u8; N]> {
    let mut b = [0u8; N];
    r.read_exact(&mut b)?;
    Ok(b)
}

/// Reads `count` little-endian values of `width` bytes in bounded chunks, so a lying
/// header costs an error, not a huge allocation up front.
fn read_values(
    r: &mut impl Read,
    count: usize,
    width: usize,
    conv: impl Fn(&[u8]) -> f32,
) -> Result<Vec<f32>, String> {
    const CHUNK: usize = 1 << 16;
    let mut out = Vec::new();
    let mut buf = vec![0u8; CHUNK * width];
    let mut left = count;
    while left > 0 {
        let n = left.min(CHUNK);
        r.read_exact(&mut buf[..n * width])
            .map_err(|e| format!("data ends early ({e})"))?;
        out.extend(buf[..n * width].chunks_exact(width).map(&conv));
        left -= n;
    }
    Ok(out)
}

fn read_npy(r: &mut impl Read) -> Result<Dataset, String> {
    let magic = read_exact::<6>(r).map_err(|e| e.to_string())?;
    if &magic != b"\x93NUMPY" {
        return Err("not an .npy file".into());
    }
    let [major, _minor] = read_exact::<2>(r).map_err(|e| e.to_string())?;
    let header_len = match major {
        1 => u16::from_le_bytes(read_exact::<2>(r).map_err(|e| e.to_string())?) as usize,
        2 | 3 => u32::from_le_bytes(read_exact::<4>(r).map_err(|e| e.to_string())?) as usize,
        v => return Err(format!("npy version {v} is not supported")),
    };
    if header_len > 1 << 16 {
        return Err("npy header too long".into());
    }
    let mut header = vec![0u8; header_len];
    r.read_exact(&mut header).map_err(|e| e.to_string())?;
    let header = String::from_utf8_lossy(&header);
    let descr = dict_value(&header, "descr").ok_or("npy header without 'descr'")?;
    let fortran =
        dict_value(&header, "fortran_order").ok_or("npy header without 'fortran_order'")?;
    let shape = dict_value(&header, "shape").ok_or("npy header without 'shape'")?;
    let dims: Vec<usize> = shape
        .trim_matches(|c| c == '(' || c == ')')
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<usize>().map_err(|_| format!("bad shape {shape}")))
        .collect::<Result<_, _>>()?;
    let [rows, cols] = dims[..] else {
        return Err(format!("need a 2-D array, shape is {shape}"));
    };
    let count = rows.checked_mul(cols).ok_or("shape overflows")?;
    let values = match descr.trim_matches(|c| c == '\'' || c == '"') {
        "<f4" | "=f4" => read_values(r, count, 4, |b| {
            f32::from_le_bytes([b[0], b[1], b[2], b[3]])
        })?,
        "<f2" | "=f2" => read_values(r, count, 2, |b| {
            f16_to_f32(u16::from_le_bytes([b[0], b[1]]))
        })?,
        d => return Err(format!("dtype {d} is not supported (float32 or float16)")),
    };
    let data = match fortran {
        "False" => values,
        "True" => {
            // Column-major: element (i, j) is at j * rows + i.
            let mut out = vec![0f32; count];
            for j in 0..cols {
                for i in 0..rows {
                    out[i * cols + j] = values[j * rows + i];
                }
            }
            out
        }
        f => return Err(format!("bad fortran_order {f}")),
    };
    Dataset::new(cols, data)
}

/// The value text of `key` in a Python dict literal (enough for npy headers).
fn dict_value<'a>(header: &'a str, key: &str) -> Option<&'a str> {
    let at = header
        .find(&format!("'{key}'"))
        .or_else(|| header.find(&format!("\"{key}\"")))?;
    let rest = header[at + key.len() + 2..].trim_start();
    let rest = rest.strip_prefix(':')?.trim_start();
    let end = if rest.starts_with('(') {
        rest.find(')')? + 1
    } else {
        rest.find([',', '}']).unwrap_or(rest.len())
    };
    Some(rest[..end].trim())
}

fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h >> 15) as u32) << 31;
    let exp = ((h >> 10) & 0x1f) as u32;
    let man = (h & 0x3ff) as u32;
    let bits = match (exp, man) {
        (0, 0) => sign,
        (0, m) => {
            // Subnormal: normalise.
            let shift = m.leading_zeros() - 21;
            let m = (m << shift) & 0x3ff;
            sign | ((127 - 15 + 1 - shift) << 23) | (m << 13)
        }
        (0x1f, m) => sign | 0x7f80_0000 | (m << 13),
        (e, m) => sign | ((e + 127 - 15) << 23) | (m << 13),
    };
    f32::from_bits(bits)
}

fn read_fvecs(r: &mut impl Read) -> Result<Dataset, String> {
    let mut dim = 0usize;
    let mut data = Vec::new();
    loop {
        let mut d = [0u8; 4];
        match r.read(&mut d[..1]) {
            Ok(0) => break,
            Ok(_) => r
                .read_exact(&mut d[1..])
                .map_err(|e| format!("truncated record ({e})"))?,
            Err(e) => return Err(e.to_string()),
        }
        let d = i32::from_le_bytes(d);
        if d <= 0 || d > 65_536 {
            return Err(format!("bad dimension {d}"));
        }
        if dim == 0 {
            dim = d as usize;
        } else if d as usize != dim {
            return Err(format!("dimension changes from {dim} to {d}"));
        }
        data.extend(read_values(r, dim, 4, |b| {
            f32::from_le_bytes([b[0], b[1], b[2], b[3]])
        })?);
    }
    if dim == 0 {
        return Err("empty .fvecs file".into());
    }
    Dataset::new(dim, data)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn npy(header: &str, payload: &[u8]) -> Vec<u8> {
        let mut h = header.to_string();
        // Pad so that magic, version, length, header and newline fill 64 bytes.
        let pad = (64 - (11 + h.len()) % 64) % 64;
        h.push_str(&" ".repeat(pad));
        h.push('\n');
        let mut out = b"\x93NUMPY\x01\x00".to_vec();
        out.extend_from_slice(&(h.len() as u16).to_le_bytes());
        out.extend_from_slice(h.as_bytes());
        out.extend_from_slice(payload);
        out
    }

    fn f32s(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn npy_c_and_fortran_order_and_f16() {
        let c = npy(
            "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }",
            &f32s(&[1., 2., 3., 4., 5., 6.]),
        );
        let ds = read_npy(&mut &c[..]).unwrap();
        assert_eq!((ds.dim, ds.len()), (3, 2));
        assert_eq!(ds.row(1), &[4., 5., 6.]);
        let f = npy(
            "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }",
            &f32s(&[1., 4., 2., 5., 3., 6.]),
        );
        assert_eq!(read_npy(&mut &f[..]).unwrap(), ds);
        let halves: Vec<u8> = [0x3c00u16, 0xc000, 0x3800, 0x0000]
            .iter()
            .flat_map(|h| h.to_le_bytes())
            .collect();
        let h = npy(
            "{'descr': '<f2', 'fortran_order': False, 'shape': (2, 2), }",
            &halves,
        );
        assert_eq!(
            read_npy(&mut &h[..]).unwrap().data,
            vec![1.0, -2.0, 0.5, 0.0]
        );
        let short = npy(
            "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }",
            &f32s(&[1., 2.]),
        );
        assert!(read_npy(&mut &short[..]).is_err());
        let i8s = npy(
            "{'descr': '|i1', 'fortran_order': False, 'shape': (1, 1), }",
            &[1],
        );
        assert!(read_npy(&mut &i8s[..]).is_err());
    }

    #[test]
    fn fvecs_round_trip_and_errors() {
        let mut b = Vec::new();
        for row in [[1f32, 2.], [3., 4.]] {
            b.extend_from_slice(&2i32.to_le_bytes());
            b.extend_from_slice(&f32s(&row));
        }
        let ds = read_fvecs(&mut &b[..]).unwrap();
        assert_eq!(ds.data, vec![1., 2., 3., 4.]);
        b.extend_from_slice(&3i32.to_le_bytes());
        assert!(read_fvecs(&mut &b[..]).is_err());
    }

    #[test]
    fn synthetic_is_deterministic_and_sampled() {
        let a = synthetic(500, 8, 4, 3);
        assert_eq!(a, synthetic(500, 8, 4, 3));
        assert_eq!(a.len(), 500);
        assert_eq!(a.sample(100).len(), 100 * 8);
        assert_eq!(a.sample(1000).len(), 500 * 8);
    }
}
