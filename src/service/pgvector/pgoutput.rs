//! A pure decoder of PostgreSQL's logical replication `pgoutput` messages (protocol
//! version 1), one message per row as `pg_logical_slot_peek_binary_changes(slot, NULL,
//! n, 'proto_version', '1', 'publication_names', pub)` returns them in its `data` column.
//!
//! ```text
//!  'B' Begin ─► 'R' Relation (before a table's first change in the session)
//!            ─► 'I' Insert │ 'U' Update │ 'D' Delete │ 'T' Truncate ... ─► 'C' Commit
//!  'Y' Type, 'O' Origin, 'M' Message: nothing to apply (Other)
//! ```
//!
//! Column values stay in PostgreSQL's text form: the slot is polled through SQL, and
//! pgoutput's binary mode (`'binary', 'true'`) is not asked for, so a `'b'` value is an
//! error here. `parse_vector` and `parse_i64` read the text forms the cache needs.
//!
//! Every read is bounded: a truncated or malicious message is an error, never a panic,
//! and a count that the remaining bytes cannot hold is refused before anything of that
//! size is allocated. Integers are big-endian (network order).

/// A log sequence number (pg_lsn), as a byte position in the WAL.
pub(crate) type Lsn = u64;

/// One decoded pgoutput message; values borrow from the message's bytes.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Message<'a> {
    Begin {
        final_lsn: Lsn,
        /// Microseconds since 2000-01-01 00:00:00 UTC.
        commit_ts_us: i64,
        xid: u32,
    },
    Commit {
        commit_lsn: Lsn,
        end_lsn: Lsn,
        /// Microseconds since 2000-01-01 00:00:00 UTC.
        commit_ts_us: i64,
    },
    Relation(Relation),
    Insert {
        relid: u32,
        new: Tuple<'a>,
    },
    Update {
        relid: u32,
        /// The old row's key columns ('K') or whole old row ('O'), when sent.
        old: Option<Tuple<'a>>,
        old_is_key: bool,
        new: Tuple<'a>,
    },
    Delete {
        relid: u32,
        old: Tuple<'a>,
        old_is_key: bool,
    },
    Truncate {
        relids: Vec<u32>,
        cascade: bool,
        restart_identity: bool,
    },
    /// 'Y' type, 'O' origin, 'M' logical message: nothing to apply.
    Other(u8),
}

/// A table's description, sent before its first change in a decoding session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Relation {
    pub relid: u32,
    pub namespace: String,
    pub name: String,
    /// `relreplident`: 'd' default, 'n' nothing, 'f' full, 'i' index.
    pub replica_identity: u8,
    pub columns: Vec<Column>,
}

/// One column of a `Relation`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Column {
    /// Part of the replica identity (flags & 1).
    pub key: bool,
    pub name: String,
    pub type_oid: u32,
    pub type_modifier: i32,
}

/// One column's value in a tuple.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Value<'a> {
    Null,
    /// A TOASTed value the change did not touch: not sent.
    UnchangedToast,
    /// The value's text form.
    Text(&'a [u8]),
}

/// A row's values, in the relation's column order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Tuple<'a> {
    pub values: Vec<Value<'a>>,
}

/// Why a message (or a value's text) could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum DecodeError {
    #[error("pgoutput message truncated while reading {what}")]
    Truncated { what: &'static str },
    #[error("unknown pgoutput message tag 0x{0:02x}")]
    UnknownTag(u8),
    #[error("unknown pgoutput tuple column kind 0x{0:02x}")]
    BadTupleKind(u8),
    #[error("binary column value in pgoutput tuple (binary mode was not asked for)")]
    BinaryValue,
    #[error("expected {expected} in pgoutput message, found byte 0x{found:02x}")]
    Unexpected { expected: &'static str, found: u8 },
    #[error("pgoutput {what} count {count} does not fit the message")]
    BadCount { what: &'static str, count: i64 },
    #[error("pgoutput commit flags 0x{0:02x} (expected 0)")]
    CommitFlags(u8),
    #[error("pgoutput {what} is not valid UTF-8")]
    BadUtf8 { what: &'static str },
    #[error("{0} trailing bytes after a complete pgoutput message")]
    Trailing(usize),
    #[error("not a vector's text form (\"[1,2.5,-3e-2]\")")]
    BadVector,
    #[error("not a bigint's text form")]
    BadInteger,
}

/// A bounded cursor over a message's bytes.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn bytes(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], DecodeError> {
        if n > self.remaining() {
            return Err(DecodeError::Truncated { what });
        }
        let out = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], DecodeError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.bytes(N, what)?);
        Ok(out)
    }

    fn u8(&mut self, what: &'static str) -> Result<u8, DecodeError> {
        Ok(self.array::<1>(what)?[0])
    }

    fn u16(&mut self, what: &'static str) -> Result<u16, DecodeError> {
        self.array(what).map(u16::from_be_bytes)
    }

    fn i16(&mut self, what: &'static str) -> Result<i16, DecodeError> {
        self.u16(what).map(|v| v as i16)
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, DecodeError> {
        self.array(what).map(u32::from_be_bytes)
    }

    fn i32(&mut self, what: &'static str) -> Result<i32, DecodeError> {
        self.array(what).map(i32::from_be_bytes)
    }

    fn u64(&mut self, what: &'static str) -> Result<u64, DecodeError> {
        self.array(what).map(u64::from_be_bytes)
    }

    fn i64(&mut self, what: &'static str) -> Result<i64, DecodeError> {
        self.array(what).map(i64::from_be_bytes)
    }

    /// A NUL-terminated UTF-8 string (the NUL is consumed, not returned).
    fn cstr(&mut self, what: &'static str) -> Result<String, DecodeError> {
        let rest = &self.buf[self.pos..];
        let len = rest
            .iter()
            .position(|&b| b == 0)
            .ok_or(DecodeError::Truncated { what })?;
        let s = std::str::from_utf8(&rest[..len]).map_err(|_| DecodeError::BadUtf8 { what })?;
        self.pos += len + 1;
        Ok(s.to_owned())
    }

    /// A count (i16 or u32 on the wire) of items at least `min_size` bytes each:
    /// refused when negative or when the remaining bytes cannot hold that many.
    fn count(&self, n: i64, min_size: usize, what: &'static str) -> Result<usize, DecodeError> {
        let bad = DecodeError::BadCount { what, count: n };
        let n = usize::try_from(n).map_err(|_| bad.clone())?;
        match n.checked_mul(min_size) {
            Some(need) if need <= self.remaining() => Ok(n),
            _ => Err(bad),
        }
    }

    fn finish(&self) -> Result<(), DecodeError> {
        match self.remaining() {
            0 => Ok(()),
            n => Err(DecodeError::Trailing(n)),
        }
    }
}

/// Decodes one pgoutput message (protocol version 1).
pub(crate) fn decode(data: &[u8]) -> Result<Message<'_>, DecodeError> {
    let mut r = Reader::new(data);
    let msg = match r.u8("message tag")? {
        b'B' => begin(&mut r)?,
        b'C' => commit(&mut r)?,
        b'R' => Message::Relation(relation(&mut r)?),
        b'I' => insert(&mut r)?,
        b'U' => update(&mut r)?,
        b'D' => delete(&mut r)?,
        b'T' => truncate(&mut r)?,
        b'Y' => skip_type(&mut r)?,
        b'O' => skip_origin(&mut r)?,
        b'M' => skip_message(&mut r)?,
        tag => return Err(DecodeError::UnknownTag(tag)),
    };
    r.finish()?;
    Ok(msg)
}

fn begin<'a>(r: &mut Reader<'a>) -> Result<Message<'a>, DecodeError> {
    Ok(Message::Begin {
        final_lsn: r.u64("begin final LSN")?,
        commit_ts_us: r.i64("begin commit timestamp")?,
        xid: r.u32("begin xid")?,
    })
}

fn commit<'a>(r: &mut Reader<'a>) -> Result<Message<'a>, DecodeError> {
    let flags = r.u8("commit flags")?;
    if flags != 0 {
        return Err(DecodeError::CommitFlags(flags));
    }
    Ok(Message::Commit {
        commit_lsn: r.u64("commit LSN")?,
        end_lsn: r.u64("commit end LSN")?,
        commit_ts_us: r.i64("commit timestamp")?,
    })
}

/// Smallest column description: flags, an empty name's NUL, type oid, typmod.
const COLUMN_MIN: usize = 1 + 1 + 4 + 4;

fn relation(r: &mut Reader<'_>) -> Result<Relation, DecodeError> {
    let relid = r.u32("relation id")?;
    let namespace = r.cstr("relation namespace")?;
    let name = r.cstr("relation name")?;
    let replica_identity = r.u8("relation replica identity")?;
    let n = r.i16("relation column count")?;
    let n = r.count(n.into(), COLUMN_MIN, "relation column")?;
    let columns = (0..n).map(|_| column(r)).collect::<Result<_, _>>()?;
    Ok(Relation {
        relid,
        namespace,
        name,
        replica_identity,
        columns,
    })
}

fn column(r: &mut Reader<'_>) -> Result<Column, DecodeError> {
    Ok(Column {
        key: r.u8("column flags")? & 1 != 0,
        name: r.cstr("column name")?,
        type_oid: r.u32("column type oid")?,
        type_modifier: r.i32("column type modifier")?,
    })
}

fn insert<'a>(r: &mut Reader<'a>) -> Result<Message<'a>, DecodeError> {
    let relid = r.u32("insert relation id")?;
    expect(r, b'N', "'N' (new tuple)")?;
    Ok(Message::Insert {
        relid,
        new: tuple(r)?,
    })
}

fn update<'a>(r: &mut Reader<'a>) -> Result<Message<'a>, DecodeError> {
    let relid = r.u32("update relation id")?;
    let (old, old_is_key) = match r.u8("update tuple kind")? {
        b'N' => (None, false),
        kind @ (b'K' | b'O') => {
            let old = tuple(r)?;
            expect(r, b'N', "'N' (new tuple)")?;
            (Some(old), kind == b'K')
        }
        found => {
            return Err(DecodeError::Unexpected {
                expected: "'K', 'O' or 'N' (update tuple)",
                found,
            })
        }
    };
    Ok(Message::Update {
        relid,
        old,
        old_is_key,
        new: tuple(r)?,
    })
}

fn delete<'a>(r: &mut Reader<'a>) -> Result<Message<'a>, DecodeError> {
    let relid = r.u32("delete relation id")?;
    let old_is_key = match r.u8("delete tuple kind")? {
        b'K' => true,
        b'O' => false,
        found => {
            return Err(DecodeError::Unexpected {
                expected: "'K' or 'O' (old tuple)",
                found,
            })
        }
    };
    Ok(Message::Delete {
        relid,
        old: tuple(r)?,
        old_is_key,
    })
}

fn truncate<'a>(r: &mut Reader<'a>) -> Result<Message<'a>, DecodeError> {
    let n = r.u32("truncate relation count")?;
    let options = r.u8("truncate options")?;
    let n = r.count(n.into(), 4, "truncate relation")?;
    let relids = (0..n)
        .map(|_| r.u32("truncate relation id"))
        .collect::<Result<_, _>>()?;
    Ok(Message::Truncate {
        relids,
        cascade: options & 1 != 0,
        restart_identity: options & 2 != 0,
    })
}

/// 'Y': type oid, namespace, name. Checked for shape only.
fn skip_type<'a>(r: &mut Reader<'a>) -> Result<Message<'a>, DecodeError> {
    r.u32("type oid")?;
    r.cstr("type namespace")?;
    r.cstr("type name")?;
    Ok(Message::Other(b'Y'))
}

/// 'O': the origin's commit LSN and name. Checked for shape only.
fn skip_origin<'a>(r: &mut Reader<'a>) -> Result<Message<'a>, DecodeError> {
    r.u64("origin LSN")?;
    r.cstr("origin name")?;
    Ok(Message::Other(b'O'))
}

/// 'M': flags, LSN, prefix, content length and content. Checked for shape only.
fn skip_message<'a>(r: &mut Reader<'a>) -> Result<Message<'a>, DecodeError> {
    r.u8("logical message flags")?;
    r.u64("logical message LSN")?;
    r.cstr("logical message prefix")?;
    let len = r.u32("logical message length")?;
    let len = r.count(len.into(), 1, "logical message byte")?;
    r.bytes(len, "logical message content")?;
    Ok(Message::Other(b'M'))
}

fn expect(r: &mut Reader<'_>, want: u8, expected: &'static str) -> Result<(), DecodeError> {
    match r.u8(expected)? {
        found if found == want => Ok(()),
        found => Err(DecodeError::Unexpected { expected, found }),
    }
}

fn tuple<'a>(r: &mut Reader<'a>) -> Result<Tuple<'a>, DecodeError> {
    let n = r.i16("tuple column count")?;
    let n = r.count(n.into(), 1, "tuple column")?;
    let values = (0..n).map(|_| value(r)).collect::<Result<_, _>>()?;
    Ok(Tuple { values })
}

fn value<'a>(r: &mut Reader<'a>) -> Result<Value<'a>, DecodeError> {
    match r.u8("tuple column kind")? {
        b'n' => Ok(Value::Null),
        b'u' => Ok(Value::UnchangedToast),
        b't' => {
            let len = r.i32("text value length")?;
            let len = r.count(len.into(), 1, "text value byte")?;
            Ok(Value::Text(r.bytes(len, "text value")?))
        }
        b'b' => Err(DecodeError::BinaryValue),
        kind => Err(DecodeError::BadTupleKind(kind)),
    }
}

/// Parses a vector column's text form "[1,2.5,-3e-2]" into f32s; "[]" is empty.
/// Elements must be finite (pgvector stores no NaN or infinity).
pub(crate) fn parse_vector(text: &[u8]) -> Result<Vec<f32>, DecodeError> {
    let inner = text
        .strip_prefix(b"[")
        .and_then(|t| t.strip_suffix(b"]"))
        .ok_or(DecodeError::BadVector)?;
    if inner.is_empty() {
        return Ok(Vec::new());
    }
    inner.split(|&b| b == b',').map(parse_element).collect()
}

fn parse_element(text: &[u8]) -> Result<f32, DecodeError> {
    let s = std::str::from_utf8(text).map_err(|_| DecodeError::BadVector)?;
    match s.parse::<f32>() {
        Ok(v) if v.is_finite() => Ok(v),
        _ => Err(DecodeError::BadVector),
    }
}

/// Parses a bigint column's text form ("-12", "42") into i64.
pub(crate) fn parse_i64(text: &[u8]) -> Result<i64, DecodeError> {
    std::str::from_utf8(text)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or(DecodeError::BadInteger)
}

/// Formats an Lsn the way PostgreSQL prints it: "0/186BBA0" (hex high / low 32 bits,
/// upper case, no padding).
pub(crate) fn lsn_text(lsn: Lsn) -> String {
    format!("{:X}/{:X}", lsn >> 32, lsn as u32)
}

#[cfg(test)]
/// Parses an Lsn's text form ("16/B374D848", either case) back; None when malformed.
pub(crate) fn parse_lsn(s: &str) -> Option<Lsn> {
    let (hi, lo) = s.split_once('/')?;
    Some((u64::from(hex_u32(hi)?) << 32) | u64::from(hex_u32(lo)?))
}

#[cfg(test)]
fn hex_u32(s: &str) -> Option<u32> {
    let ok = (1..=8).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_hexdigit());
    ok.then(|| u32::from_str_radix(s, 16).ok()).flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const BEGIN: &str = "42000000000186bd30000304ecba4d2516000002f5";
    const TYPE: &str = "59000040017075626c696300766563746f7200";
    const RELATION: &str = "52000041527075626c69630074006400030169640000000014ffffffff00656d62656464696e67000000400100000003006e6f74650000000019ffffffff";
    const INSERT_1: &str = "49000041524e000374000000013174000000075b312c322c335d740000000161";
    const INSERT_2: &str = "49000041524e000374000000013274000000075b342c352c365d740000000162";
    const COMMIT: &str = "4300000000000186bd30000000000186bd60000304ecba4d2516";
    const UPDATE: &str = "55000041524e000374000000013174000000075b312c322c335d740000000178";
    const UPDATE_KEY: &str =
        "55000041524b00037400000001326e6e4e000374000000013574000000075b342c352c365d740000000162";
    const DELETE: &str = "44000041524b00037400000001316e6e";
    const TRUNCATE: &str = "54000000010000004152";

    const ALL: [&str; 10] = [
        BEGIN, TYPE, RELATION, INSERT_1, INSERT_2, COMMIT, UPDATE, UPDATE_KEY, DELETE, TRUNCATE,
    ];

    const RELID: u32 = 0x4152;
    const TS: i64 = 0x0003_04ec_ba4d_2516;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    fn text(s: &str) -> Value<'_> {
        Value::Text(s.as_bytes())
    }

    fn row<'a>(values: Vec<Value<'a>>) -> Tuple<'a> {
        Tuple { values }
    }

    #[test]
    fn begin() {
        let m = hex(BEGIN);
        let want = Message::Begin {
            final_lsn: 0x186BD30,
            commit_ts_us: TS,
            xid: 757,
        };
        assert_eq!(decode(&m).unwrap(), want);
    }

    #[test]
    fn commit() {
        let m = hex(COMMIT);
        let want = Message::Commit {
            commit_lsn: 0x186BD30,
            end_lsn: 0x186BD60,
            commit_ts_us: TS,
        };
        assert_eq!(decode(&m).unwrap(), want);
        assert_eq!(lsn_text(0x186BD60), "0/186BD60");
    }

    #[test]
    fn commit_flags_must_be_zero() {
        let mut m = hex(COMMIT);
        m[1] = 1;
        assert_eq!(decode(&m), Err(DecodeError::CommitFlags(1)));
    }

    #[test]
    fn type_is_other() {
        assert_eq!(decode(&hex(TYPE)).unwrap(), Message::Other(b'Y'));
        let origin = b"O\0\0\0\0\0\0\0\x01node\0";
        assert_eq!(decode(origin).unwrap(), Message::Other(b'O'));
        let message = b"M\x01\0\0\0\0\0\0\0\x01pfx\0\0\0\0\x02hi";
        assert_eq!(decode(message).unwrap(), Message::Other(b'M'));
        assert!(decode(&message[..message.len() - 1]).is_err());
    }

    #[test]
    fn relation() {
        let m = hex(RELATION);
        let col = |key, name: &str, type_oid, type_modifier| Column {
            key,
            name: name.to_owned(),
            type_oid,
            type_modifier,
        };
        let want = Message::Relation(Relation {
            relid: RELID,
            namespace: "public".to_owned(),
            name: "t".to_owned(),
            replica_identity: b'd',
            columns: vec![
                col(true, "id", 20, -1),
                col(false, "embedding", 16385, 3),
                col(false, "note", 25, -1),
            ],
        });
        assert_eq!(decode(&m).unwrap(), want);
    }

    #[test]
    fn inserts() {
        let (m1, m2) = (hex(INSERT_1), hex(INSERT_2));
        let want1 = Message::Insert {
            relid: RELID,
            new: row(vec![text("1"), text("[1,2,3]"), text("a")]),
        };
        let want2 = Message::Insert {
            relid: RELID,
            new: row(vec![text("2"), text("[4,5,6]"), text("b")]),
        };
        assert_eq!(decode(&m1).unwrap(), want1);
        assert_eq!(decode(&m2).unwrap(), want2);
    }

    #[test]
    fn update_without_old() {
        let m = hex(UPDATE);
        let want = Message::Update {
            relid: RELID,
            old: None,
            old_is_key: false,
            new: row(vec![text("1"), text("[1,2,3]"), text("x")]),
        };
        assert_eq!(decode(&m).unwrap(), want);
    }

    #[test]
    fn update_with_old_key() {
        let m = hex(UPDATE_KEY);
        let want = Message::Update {
            relid: RELID,
            old: Some(row(vec![text("2"), Value::Null, Value::Null])),
            old_is_key: true,
            new: row(vec![text("5"), text("[4,5,6]"), text("b")]),
        };
        assert_eq!(decode(&m).unwrap(), want);
    }

    #[test]
    fn update_with_old_row() {
        let mut m = hex(UPDATE_KEY);
        m[5] = b'O';
        match decode(&m).unwrap() {
            Message::Update {
                old: Some(_),
                old_is_key: false,
                ..
            } => {}
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn delete() {
        let m = hex(DELETE);
        let want = Message::Delete {
            relid: RELID,
            old: row(vec![text("1"), Value::Null, Value::Null]),
            old_is_key: true,
        };
        assert_eq!(decode(&m).unwrap(), want);
    }

    #[test]
    fn truncate() {
        let m = hex(TRUNCATE);
        let want = Message::Truncate {
            relids: vec![RELID],
            cascade: false,
            restart_identity: false,
        };
        assert_eq!(decode(&m).unwrap(), want);
        let mut m = m;
        m[5] = 3;
        let want = Message::Truncate {
            relids: vec![RELID],
            cascade: true,
            restart_identity: true,
        };
        assert_eq!(decode(&m).unwrap(), want);
    }

    #[test]
    fn unchanged_toast() {
        // DELETE's old tuple with its last column 'u' instead of 'n'.
        let mut m = hex(DELETE);
        *m.last_mut().unwrap() = b'u';
        match decode(&m).unwrap() {
            Message::Delete { old, .. } => assert_eq!(old.values[2], Value::UnchangedToast),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn every_strict_prefix_is_an_error() {
        for msg in ALL {
            let m = hex(msg);
            for len in 0..m.len() {
                assert!(decode(&m[..len]).is_err(), "{msg} cut at {len}");
            }
        }
        assert!(decode(&[]).is_err());
    }

    #[test]
    fn trailing_bytes_are_an_error() {
        for msg in ALL {
            let mut m = hex(msg);
            m.push(0);
            assert_eq!(decode(&m), Err(DecodeError::Trailing(1)), "{msg}");
        }
    }

    #[test]
    fn binary_value_is_an_error() {
        let mut m = hex(DELETE);
        m[8] = b'b';
        assert_eq!(decode(&m), Err(DecodeError::BinaryValue));
    }

    #[test]
    fn bad_tuple_kind_is_an_error() {
        let mut m = hex(DELETE);
        m[8] = b'z';
        assert_eq!(decode(&m), Err(DecodeError::BadTupleKind(b'z')));
    }

    #[test]
    fn unknown_tag_is_an_error() {
        assert_eq!(decode(b"Z"), Err(DecodeError::UnknownTag(b'Z')));
    }

    #[test]
    fn huge_or_negative_counts_are_errors() {
        // Insert tuple column count 0x7fff, then too few bytes.
        let mut m = hex(INSERT_1);
        m[6..8].copy_from_slice(&0x7fffu16.to_be_bytes());
        assert!(matches!(decode(&m), Err(DecodeError::BadCount { .. })));
        m[6..8].copy_from_slice(&(-1i16).to_be_bytes());
        assert!(matches!(decode(&m), Err(DecodeError::BadCount { .. })));
        // Text length beyond the message, and negative.
        let mut m = hex(DELETE);
        m[9..13].copy_from_slice(&i32::MAX.to_be_bytes());
        assert!(matches!(decode(&m), Err(DecodeError::BadCount { .. })));
        m[9..13].copy_from_slice(&(-1i32).to_be_bytes());
        assert!(matches!(decode(&m), Err(DecodeError::BadCount { .. })));
        // Relation column count and truncate relation count.
        let mut m = hex(RELATION);
        m[15..17].copy_from_slice(&0x7fffu16.to_be_bytes());
        assert!(matches!(decode(&m), Err(DecodeError::BadCount { .. })));
        let mut m = hex(TRUNCATE);
        m[1..5].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(matches!(decode(&m), Err(DecodeError::BadCount { .. })));
    }

    #[test]
    fn bad_utf8_name_is_an_error() {
        let mut m = hex(RELATION);
        m[5] = 0xff;
        assert!(matches!(decode(&m), Err(DecodeError::BadUtf8 { .. })));
    }

    #[test]
    fn vectors() {
        assert_eq!(parse_vector(b"[1,2,3]").unwrap(), vec![1.0, 2.0, 3.0]);
        assert_eq!(
            parse_vector(b"[1,2.5,-3e-2]").unwrap(),
            vec![1.0, 2.5, -0.03]
        );
        assert_eq!(parse_vector(b"[]").unwrap(), Vec::<f32>::new());
        for bad in [
            &b"[1,2"[..],
            b"[a]",
            b"1,2",
            b"[1,,2]",
            b"[1,2,]",
            b"[,]",
            b"[",
            b"",
            b"[NaN]",
            b"[inf]",
            b"[1, 2]",
            b"[\xff]",
        ] {
            assert_eq!(parse_vector(bad), Err(DecodeError::BadVector), "{bad:?}");
        }
    }

    #[test]
    fn bigints() {
        assert_eq!(parse_i64(b"42").unwrap(), 42);
        assert_eq!(parse_i64(b"-12").unwrap(), -12);
        assert_eq!(parse_i64(b"-9223372036854775808").unwrap(), i64::MIN);
        for bad in [&b""[..], b"1.5", b"x", b"9223372036854775808", b" 1"] {
            assert_eq!(parse_i64(bad), Err(DecodeError::BadInteger), "{bad:?}");
        }
    }

    #[test]
    fn lsns() {
        assert_eq!(lsn_text(0x186BBA0), "0/186BBA0");
        assert_eq!(lsn_text(0x16_B374_D848), "16/B374D848");
        assert_eq!(lsn_text(0), "0/0");
        assert_eq!(parse_lsn("0/186BBA0"), Some(0x186BBA0));
        assert_eq!(parse_lsn("16/B374D848"), Some(0x16_B374_D848));
        assert_eq!(parse_lsn("16/b374d848"), Some(0x16_B374_D848));
        for lsn in [0, 1, 0x186BBA0, 0x16_B374_D848, u64::MAX] {
            assert_eq!(parse_lsn(&lsn_text(lsn)), Some(lsn));
        }
        for bad in [
            "",
            "0",
            "/1",
            "1/",
            "1/2/3",
            "+1/2",
            "1/123456789",
            "g/1",
            " 0/1",
        ] {
            assert_eq!(parse_lsn(bad), None, "{bad:?}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode(&data);
        }

        /// Captured messages with a few bytes changed: reaches deeper than random bytes.
        #[test]
        fn mutated_messages_never_panic(
            which in 0usize..ALL.len(),
            flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..4),
        ) {
            let mut m = hex(ALL[which]);
            for (at, val) in flips {
                let i = at % m.len();
                m[i] = val;
            }
            let _ = decode(&m);
        }

        #[test]
        fn lsn_round_trip(lsn in any::<u64>()) {
            prop_assert_eq!(parse_lsn(&lsn_text(lsn)), Some(lsn));
        }
    }
}
