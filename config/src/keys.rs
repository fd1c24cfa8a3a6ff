//! Renamed keys. Bounds are spelled one way, `*_max` with the unit before it
//! (`frame_bytes_max`, `reconnect_ms_max`), where the file once had `max_*`, `*_max` and
//! `*_cap` side by side; [`RENAMED`] lists every key that changed.
//!
//! An old name still loads: the field carries it as a serde `alias` (so an error in the
//! file keeps its line and column, which deserializing an edited `toml::Table` would
//! lose), and [`deprecations`] reads the table to note each old name used and to refuse
//! a section that sets both names. A test holds every row to its alias.

use crate::{ConfigError, Deprecation};

/// `(section, old key, new key)`: every renamed key. The section is a dotted path of
/// tables (`backend.pgvector`).
pub const RENAMED: &[(&str, &str, &str)] = &[
    ("server", "max_connections", "connections_max"),
    (
        "server",
        "max_connections_per_source",
        "connections_per_source_max",
    ),
    ("server", "max_frame_bytes", "frame_bytes_max"),
    ("server", "max_inflight", "inflight_max"),
    ("server", "max_batch", "batch_max"),
    ("admin", "max_connections", "connections_max"),
    ("cache", "max_aliases_per_rep", "aliases_per_rep_max"),
    ("cache", "slow_path_max_steps", "slow_path_steps_max"),
    ("cache", "insert_log_cap", "insert_log_entries_max"),
    ("cache", "delete_log_cap", "delete_log_entries_max"),
    ("backend.pgvector", "reconnect_max_ms", "reconnect_ms_max"),
];

/// `(section, key, why)`: keys that no longer have an effect. Each still loads (its
/// section keeps the field, unread), with a note saying why.
pub const RETIRED: &[(&str, &str, &str)] = &[(
    "cache",
    "complete_fast_path",
    "every hit now checks the inserts its entry has not yet accounted for, so an \
     acknowledged insert is in every hit it belongs in without it (docs/ALGORITHM.md, \
     \"Inserts\")",
)];

/// The table at the dotted `path` in `doc`, if the file has it.
fn section<'a>(doc: &'a toml::Table, path: &str) -> Option<&'a toml::Table> {
    path.split('.')
        .try_fold(doc, |t, name| t.get(name).and_then(toml::Value::as_table))
}

/// One note per old key name the file uses, in [`RENAMED`]'s order; an error where a
/// section sets a key under both names.
pub(crate) fn deprecations(doc: &toml::Table) -> Result<Vec<Deprecation>, ConfigError> {
    let mut notes = Vec::new();
    for &(name, old, new) in RENAMED {
        let Some(table) = section(doc, name) else {
            continue;
        };
        match (table.contains_key(old), table.contains_key(new)) {
            (true, true) => {
                return Err(ConfigError::BothKeys {
                    section: name,
                    old,
                    new,
                })
            }
            (true, false) => notes.push(Deprecation::Renamed {
                section: name,
                old,
                new,
            }),
            _ => {}
        }
    }
    for &(name, key, why) in RETIRED {
        if section(doc, name).is_some_and(|t| t.contains_key(key)) {
            notes.push(Deprecation::Retired {
                section: name,
                key,
                why,
            });
        }
    }
    Ok(notes)
}
