//! What a decoded change means for the cache: `pgoutput` messages of akerd's table
//! turned into upserts, deletes and flushes, the table's shape checked on the way. The
//! follower (`follow.rs`) queues them to the owners; a warm start (`catch_up.rs`) replays
//! them into the restored shards.

use super::super::pgoutput::{self, Message, Relation, Tuple, Value};

/// One change to the cache.
#[derive(Debug, PartialEq)]
pub(crate) enum Change {
    /// The row `id` now has `vector` (it may have had another: delete it first).
    Upsert {
        id: u64,
        vector: Vec<f32>,
    },
    Delete {
        id: u64,
    },
    /// TRUNCATE: nothing of the table is left.
    Flush,
}

/// Which message a change came from, for the counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Insert,
    Update,
    /// An update of the id whose vector came unchanged (TOAST): the old id only stripped.
    PartialUpdate,
    Delete,
    Truncate,
}

/// The id and vector columns' places in the table's tuples.
#[derive(Clone, Copy, Debug)]
struct Columns {
    id: usize,
    vector: usize,
}

/// Decodes the changes of one table (`relid`) of `dim`-d vectors.
pub(crate) struct Decoder {
    pub relid: u32,
    dim: usize,
    id_column: String,
    vector_column: String,
    columns: Option<Columns>,
}

impl Decoder {
    pub(crate) fn new(relid: u32, dim: usize, id_column: &str, vector_column: &str) -> Decoder {
        Decoder {
            relid,
            dim,
            id_column: id_column.into(),
            vector_column: vector_column.into(),
            columns: None,
        }
    }

    /// A table's description: it must still be akerd's table, as it started; `Err`
    /// says how it changed.
    pub(crate) fn relation(&mut self, r: &Relation) -> Result<(), String> {
        if r.relid != self.relid {
            return Ok(());
        }
        let find = |name: &str| r.columns.iter().position(|c| c.name == name);
        let (Some(id), Some(vector)) = (find(&self.id_column), find(&self.vector_column)) else {
            return Err(format!(
                "the table no longer has columns {} and {}",
                self.id_column, self.vector_column
            ));
        };
        // A delete or an id change says which id only through the replica identity.
        if !r.columns[id].key && r.replica_identity != b'f' {
            return Err(format!(
                "the replica identity no longer contains {}: deletes would not say which id",
                self.id_column
            ));
        }
        let dim = r.columns[vector].type_modifier;
        if dim != self.dim as i32 {
            return Err(format!(
                "column {} is now vector({dim}), not vector({})",
                self.vector_column, self.dim
            ));
        }
        self.columns = Some(Columns { id, vector });
        Ok(())
    }

    /// The changes `m` makes to the cache, appended to `out`; which kind it was (`None`:
    /// not a row change of this table). `Err`: a change akerd cannot apply.
    pub(crate) fn changes(
        &self,
        m: &Message<'_>,
        out: &mut Vec<Change>,
    ) -> Result<Option<Kind>, String> {
        match m {
            Message::Insert { relid, new } if *relid == self.relid => {
                let c = self.columns()?;
                if let Some(id) = id_of(new, c.id)? {
                    out.push(self.upsert(id, new, c)?);
                }
                Ok(Some(Kind::Insert))
            }
            Message::Update {
                relid, old, new, ..
            } if *relid == self.relid => self.update(old.as_ref(), new, out),
            Message::Delete { relid, old, .. } if *relid == self.relid => {
                let c = self.columns()?;
                if let Some(id) = id_of(old, c.id)? {
                    out.push(Change::Delete { id });
                }
                Ok(Some(Kind::Delete))
            }
            Message::Truncate { relids, .. } if relids.contains(&self.relid) => {
                out.push(Change::Flush);
                Ok(Some(Kind::Truncate))
            }
            _ => Ok(None),
        }
    }

    /// An update: a new id is a delete of the old one; a vector that came with it (the
    /// old one is not in the stream) replaces the row; one left unchanged (TOAST) does not.
    fn update(
        &self,
        old: Option<&Tuple<'_>>,
        new: &Tuple<'_>,
        out: &mut Vec<Change>,
    ) -> Result<Option<Kind>, String> {
        let c = self.columns()?;
        let new_id = id_of(new, c.id)?;
        let old_id = match old {
            Some(t) => id_of(t, c.id)?,
            None => new_id,
        };
        if old_id != new_id {
            if let Some(id) = old_id {
                out.push(Change::Delete { id });
            }
        }
        let Some(id) = new_id else {
            return Ok(Some(Kind::Update));
        };
        match new.values.get(c.vector) {
            Some(Value::UnchangedToast) if old_id == new_id => Ok(Some(Kind::Update)),
            Some(Value::UnchangedToast) => Ok(Some(Kind::PartialUpdate)),
            _ => {
                out.push(self.upsert(id, new, c)?);
                Ok(Some(Kind::Update))
            }
        }
    }

    fn columns(&self) -> Result<Columns, String> {
        self.columns
            .ok_or_else(|| "a change before its table's description".to_string())
    }

    /// An inserted or updated row (a NULL vector: only out of the cache).
    fn upsert(&self, id: u64, t: &Tuple<'_>, c: Columns) -> Result<Change, String> {
        let vector = match t.values.get(c.vector) {
            Some(Value::Text(v)) => {
                pgoutput::parse_vector(v).map_err(|e| format!("id {id}'s vector: {e}"))?
            }
            _ => return Ok(Change::Delete { id }),
        };
        if vector.len() != self.dim {
            return Err(format!(
                "id {id} has a {}-d vector, akerd serves {}-d",
                vector.len(),
                self.dim
            ));
        }
        Ok(Change::Upsert { id, vector })
    }
}

/// A tuple's id (`None`: a NULL or negative id, which the cache never holds).
fn id_of(t: &Tuple<'_>, at: usize) -> Result<Option<u64>, String> {
    match t.values.get(at) {
        Some(Value::Text(s)) => {
            let id = pgoutput::parse_i64(s).map_err(|e| format!("an id akerd cannot read: {e}"))?;
            Ok(u64::try_from(id).ok())
        }
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::pgvector::pgoutput::decode;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// Captured from PostgreSQL 18.6: t(id bigint primary key, embedding vector(3), note text).
    const RELATION: &str = "52000041527075626c69630074006400030169640000000014ffffffff00656d62656464696e67000000400100000003006e6f74650000000019ffffffff";

    fn decoder() -> Decoder {
        let mut d = Decoder::new(0x4152, 3, "id", "embedding");
        let rel = hex(RELATION);
        let Message::Relation(r) = decode(&rel).unwrap() else {
            panic!()
        };
        d.relation(&r).unwrap();
        d
    }

    fn changes(d: &Decoder, msg: &str) -> (Option<Kind>, Vec<Change>) {
        let bytes = hex(msg);
        let mut out = Vec::new();
        let k = d.changes(&decode(&bytes).unwrap(), &mut out).unwrap();
        (k, out)
    }

    #[test]
    fn each_kind_of_change_means_what_akerds_own_writes_mean() {
        let d = decoder();
        let (k, c) = changes(
            &d,
            "49000041524e000374000000013174000000075b312c322c335d740000000161",
        );
        assert_eq!(k, Some(Kind::Insert));
        assert_eq!(
            c,
            vec![Change::Upsert {
                id: 1,
                vector: vec![1.0, 2.0, 3.0]
            }]
        );
        // UPDATE of another column, the (inline) vector sent along: replaced.
        let (k, c) = changes(
            &d,
            "55000041524e000374000000013174000000075b312c322c335d740000000178",
        );
        assert_eq!(k, Some(Kind::Update));
        assert_eq!(
            c,
            vec![Change::Upsert {
                id: 1,
                vector: vec![1.0, 2.0, 3.0]
            }]
        );
        // UPDATE of the id 2 -> 5: the old id out, the new one in.
        let (_, c) = changes(&d, "55000041524b00037400000001326e6e4e000374000000013574000000075b342c352c365d740000000162");
        assert_eq!(
            c,
            vec![
                Change::Delete { id: 2 },
                Change::Upsert {
                    id: 5,
                    vector: vec![4.0, 5.0, 6.0]
                }
            ]
        );
        let (k, c) = changes(&d, "44000041524b00037400000001316e6e");
        assert_eq!((k, c), (Some(Kind::Delete), vec![Change::Delete { id: 1 }]));
        let (k, c) = changes(&d, "54000000010000004152");
        assert_eq!((k, c), (Some(Kind::Truncate), vec![Change::Flush]));
    }

    #[test]
    fn an_unchanged_toasted_vector_changes_nothing() {
        let d = decoder();
        // UPDATE t SET note = 'x' WHERE id = 1 with the vector TOASTed ('u').
        let (k, c) = changes(&d, "55000041524e000374000000013175740000000178");
        assert_eq!((k, c), (Some(Kind::Update), vec![]));
        // The id changed with it: only the old id out.
        let (k, c) = changes(
            &d,
            "55000041524b00037400000001326e6e4e000374000000013575740000000178",
        );
        assert_eq!(
            (k, c),
            (Some(Kind::PartialUpdate), vec![Change::Delete { id: 2 }])
        );
    }

    #[test]
    fn a_table_that_changed_is_said() {
        let mut d = Decoder::new(0x4152, 4, "id", "embedding");
        let rel = hex(RELATION);
        let Message::Relation(r) = decode(&rel).unwrap() else {
            panic!()
        };
        assert!(d
            .relation(&r)
            .unwrap_err()
            .contains("vector(3), not vector(4)"));
        let mut d = Decoder::new(0x4152, 3, "id", "vec");
        assert!(d.relation(&r).unwrap_err().contains("no longer has"));
        // Before any description: refused, not guessed.
        let d = Decoder::new(0x4152, 3, "id", "embedding");
        let bytes = hex("44000041524b00037400000001316e6e");
        assert!(d
            .changes(&decode(&bytes).unwrap(), &mut Vec::new())
            .is_err());
    }
}
