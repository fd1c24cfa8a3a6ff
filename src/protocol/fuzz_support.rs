//! The properties the fuzz targets (`fuzz/fuzz_targets/`) check, kept here so that the
//! unit tests run the same checks on random input without cargo-fuzz. Each panics when
//! its property fails.
//!
//! | target           | input                                   | property              |
//! |------------------|-----------------------------------------|-----------------------|
//! | `frame_decode`   | raw bytes, walked as a connection does  | `frame_decode`        |
//! | `request_body`   | op, version, flags, then a body         | `request_body`        |
//! | `reply_body`     | op, version, status, then a body        | `reply_body`          |
//! | `config`         | a config file's text                    | `config`              |
//!
//! Random bytes seldom make a valid header (magic, version, length), so the body
//! targets wrap theirs in one: every execution reaches an operation's body parser.

use super::*;

/// Limits the property decodes under: one small, one roomy, so that both the length check
/// and the body parsers see arbitrary input.
const MAX_FRAMES: [usize; 2] = [64, 1 << 20];

/// Walks `data` the way a connection does, with both decoders, and checks for every frame
/// that decodes: `encode(decode(bytes)) == bytes` byte for byte, the bounds on `consumed`,
/// and that validation does not panic. Error results must be self-consistent.
pub fn frame_decode(data: &[u8]) {
    let limits = Limits {
        dim: 4,
        k_max: 16,
        max_batch: 8,
        max_frame_bytes: 4096,
    };
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

/// One header of `HEADER_LEN` bytes around `body` (`PROTOCOL.md`'s layout).
fn framed(version: u8, opcode: u8, flags: u16, status: u16, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + body.len());
    out.extend_from_slice(&MAGIC.to_le_bytes());
    out.push(version);
    out.push(opcode);
    out.extend_from_slice(&flags.to_le_bytes());
    out.extend_from_slice(&status.to_le_bytes());
    out.extend_from_slice(&7u64.to_le_bytes());
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(body);
    out
}

/// The version a selector byte picks: 1 to 5 mostly, now and then any (`BAD_VERSION`).
fn version_of(b: u8) -> u8 {
    match b % 10 {
        0..=1 => 1,
        2 => 2,
        3..=4 => 3,
        5 => 4,
        6..=7 => 5,
        8 => 6,
        _ => b,
    }
}

/// `data[0]` picks the operation, `data[1]` the version, `data[2..4]` the flags (mostly
/// masked to the defined ones); the rest is the body. The framed request must satisfy
/// `frame_decode`'s property, and a request that decodes must validate without a panic.
pub fn request_body(data: &[u8]) {
    let [op, version, f0, f1, body @ ..] = data else {
        return;
    };
    let op = Opcode::ALL[*op as usize % Opcode::ALL.len()];
    let raw_flags = u16::from_le_bytes([*f0, *f1]);
    let defined = search_flags(VERSION) | FLAG_FILL_TOKEN;
    let flags = if f1 & 0x80 == 0 {
        raw_flags & defined
    } else {
        raw_flags
    };
    frame_decode(&framed(version_of(*version), op.code(), flags, 0, body));
}

/// `data[0]` picks the operation, `data[1]` the version, `data[2]` the status (OK half
/// the time); the rest is the body. The framed reply must satisfy `frame_decode`'s
/// property.
pub fn reply_body(data: &[u8]) {
    let [op, version, status, body @ ..] = data else {
        return;
    };
    let op = Opcode::ALL[*op as usize % Opcode::ALL.len()];
    let status = if status & 1 == 0 {
        0
    } else {
        u16::from(status >> 1)
    };
    frame_decode(&framed(
        version_of(*version),
        op.code() | REPLY_BIT,
        0,
        status,
        body,
    ));
}

/// A config file's text: parsing must not panic; a file that parses must validate
/// without a panic, and print (`--print-config`) as TOML that parses back to the same
/// configuration.
pub fn config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(cfg) = crate::config::Config::from_toml(text) else {
        return;
    };
    let _ = cfg.validate();
    let printed = cfg.to_toml();
    let back = crate::config::Config::from_toml(&printed)
        .unwrap_or_else(|e| panic!("printed config does not parse: {e}\n{printed}"));
    // A pgvector url's password is masked in print: compare without it.
    let mut shown = cfg.clone();
    if let (Some(a), Some(b)) = (&mut shown.backend.pgvector, &back.backend.pgvector) {
        a.url = b.url.clone();
    }
    assert_eq!(
        shown, back,
        "printed config parses to another one:\n{printed}"
    );
}
