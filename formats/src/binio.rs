//! Little-endian helpers shared by the binary formats (`.npy`, `.fvecs` and the trace
//! here; `bench`'s ground-truth cache). Bulk reads grow their output as bytes arrive
//! instead of trusting a count from a header, so a corrupt count ends in an
//! `UnexpectedEof`, never in a huge allocation.

use std::io::{self, Read, Write};

/// Floats converted per chunk: large enough to amortise the calls, small enough that a
/// bogus count costs at most this much memory before the read fails.
const CHUNK: usize = 1 << 16;

pub fn read_array<const N: usize>(r: &mut impl Read) -> io::Result<[u8; N]> {
    let mut b = [0u8; N];
    r.read_exact(&mut b)?;
    Ok(b)
}

pub fn read_u8(r: &mut impl Read) -> io::Result<u8> {
    Ok(read_array::<1>(r)?[0])
}

pub fn read_u16(r: &mut impl Read) -> io::Result<u16> {
    read_array(r).map(u16::from_le_bytes)
}

pub fn read_u32(r: &mut impl Read) -> io::Result<u32> {
    read_array(r).map(u32::from_le_bytes)
}

pub fn read_u64(r: &mut impl Read) -> io::Result<u64> {
    read_array(r).map(u64::from_le_bytes)
}

pub fn read_f32(r: &mut impl Read) -> io::Result<f32> {
    read_array(r).map(f32::from_le_bytes)
}

/// Appends `count` little-endian f32 values read from `r` to `out`.
pub fn read_f32s(r: &mut impl Read, count: usize, out: &mut Vec<f32>) -> io::Result<()> {
    let mut buf = vec![0u8; CHUNK.min(count) * 4];
    let mut left = count;
    while left > 0 {
        let take = left.min(CHUNK);
        let bytes = &mut buf[..take * 4];
        r.read_exact(bytes)?;
        out.extend(
            bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        );
        left -= take;
    }
    Ok(())
}

/// Writes `values` as little-endian f32.
pub fn write_f32s(w: &mut impl Write, values: &[f32]) -> io::Result<()> {
    let mut buf = Vec::with_capacity(CHUNK.min(values.len()) * 4);
    for chunk in values.chunks(CHUNK) {
        buf.clear();
        buf.extend(chunk.iter().flat_map(|v| v.to_le_bytes()));
        w.write_all(&buf)?;
    }
    Ok(())
}

/// Feeds `values` to `sink` as little-endian bytes, a chunk at a time (for hashing).
pub fn f32_le_chunks(values: &[f32], mut sink: impl FnMut(&[u8])) {
    let mut buf = Vec::with_capacity(CHUNK.min(values.len()) * 4);
    for chunk in values.chunks(CHUNK) {
        buf.clear();
        buf.extend(chunk.iter().flat_map(|v| v.to_le_bytes()));
        sink(&buf);
    }
}

/// `Ok(())` when `r` is at its end, otherwise an `InvalidData` error naming `what`.
pub fn expect_eof(r: &mut impl Read, what: &str) -> io::Result<()> {
    let mut b = [0u8; 1];
    match r.read(&mut b)? {
        0 => Ok(()),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("trailing bytes after {what}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f32_round_trip_across_chunks() {
        let values: Vec<f32> = (0..CHUNK * 2 + 7).map(|i| i as f32 * 0.5 - 3.0).collect();
        let mut bytes = Vec::new();
        write_f32s(&mut bytes, &values).unwrap();
        assert_eq!(bytes.len(), values.len() * 4);
        assert_eq!(&bytes[4..8], &(-2.5f32).to_le_bytes());
        let mut back = Vec::new();
        read_f32s(&mut bytes.as_slice(), values.len(), &mut back).unwrap();
        assert_eq!(back, values);
        let mut hashed = Vec::new();
        f32_le_chunks(&values, |c| hashed.extend_from_slice(c));
        assert_eq!(hashed, bytes);
    }

    #[test]
    fn short_input_is_eof_without_huge_allocation() {
        let bytes = [0u8; 10];
        let mut out = Vec::new();
        let err = read_f32s(&mut bytes.as_slice(), usize::MAX / 8, &mut out).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
        assert!(out.capacity() <= CHUNK);
    }

    #[test]
    fn eof_check() {
        expect_eof(&mut [].as_slice(), "x").unwrap();
        let err = expect_eof(&mut [1u8].as_slice(), "the table").unwrap_err();
        assert!(err.to_string().contains("the table"));
    }
}
