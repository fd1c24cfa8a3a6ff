//! The property the `frame_decode` fuzz target checks, kept here so that the unit tests
//! run the same check on random input without cargo-fuzz. Panics when the property fails.

use super::*;

/// Limits the property decodes under: one small, one roomy, so that both the length check
/// and the body parsers see arbitrary input.
const MAX_FRAMES: [usize; 2] = [64, 1 << 20];

/// Walks `data` the way a connection does, with both decoders, and checks for every frame
/// that decodes: `encode(decode(bytes)) == bytes` byte for byte, the bounds on `consumed`,
/// and that validation does not panic. Error results must be self-consistent.
pub fn frame_decode(data: &[u8]) {
    let limits = Limits { dim: 4, k_max: 16 };
    for max in MAX_FRAMES {
        walk(
            data,
            max,
            |buf| decode_request(buf, max),
            |f, out| {
                let _ = validate(&f.request, &limits);
                encode_request(f, out)
            },
        );
        walk(data, max, |buf| decode_reply(buf, max), encode_reply);
    }
}

fn walk<F>(
    data: &[u8],
    max: usize,
    decode: impl Fn(&[u8]) -> Result<Option<(F, usize)>, DecodeError>,
    encode: impl Fn(&F, &mut Vec<u8>) -> Result<usize, EncodeError>,
) {
    let mut pos = 0;
    // Each step consumes at least HEADER_LEN bytes, so this ends.
    while pos < data.len() {
        let buf = &data[pos..];
        match decode(buf) {
            Ok(None) => break,
            Ok(Some((frame, consumed))) => {
                assert!((HEADER_LEN..=buf.len().min(max)).contains(&consumed));
                let mut out = Vec::new();
                let n = encode(&frame, &mut out).expect("a decoded frame must re-encode");
                assert_eq!(n, out.len());
                assert_eq!(&out[..], &buf[..consumed], "re-encoding changed the bytes");
                pos += consumed;
            }
            Err(e) => {
                assert_ne!(e.status(), Status::Ok);
                // The error reply itself must encode.
                let mut out = Vec::new();
                encode_reply(&e.error_reply(), &mut out).expect("error reply must encode");
                match e.consumed() {
                    None => {
                        assert!(matches!(e.status(), Status::BadFrame | Status::TooLarge));
                        break;
                    }
                    Some(consumed) => {
                        assert!((HEADER_LEN..=buf.len().min(max)).contains(&consumed));
                        pos += consumed;
                    }
                }
            }
        }
    }
}
