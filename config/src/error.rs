//! What can be wrong with a configuration, as a type: the daemon, the runner and the
//! tests tell a file that cannot be read from one that is not TOML, an unknown key from
//! a value out of range, by the kind and not by the message's text. The messages are
//! the operator's: they name the line (never quoting it: a secret pasted into the file
//! must not reach the journal) or the key at fault.

use std::path::PathBuf;

/// A configuration refused, and why.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{}: {error}", path.display())]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    /// Not TOML, or a value of the wrong type or shape.
    #[error("line {line}, column {column}: {message}")]
    Parse {
        line: usize,
        column: usize,
        message: String,
    },
    /// A key no section has: refused, so that a typo does not fall back to a default.
    #[error("line {line}, column {column}: {message}")]
    UnknownKey {
        /// The key as written.
        key: String,
        line: usize,
        column: usize,
        message: String,
    },
    /// A renamed key set under both its old and its new name (`crate::keys`).
    #[error(
        "{section}: both {old} (its old name) and {new} are set; keep {new} (they mean the same)"
    )]
    BothKeys {
        section: &'static str,
        old: &'static str,
        new: &'static str,
    },
    /// A value out of range, or contradicting another. `key` names it as written in the
    /// file, with its section (`server.frame_bytes_max`); the section alone where the
    /// fault is between several of its keys or the engine's check found it.
    #[error("{key}: {reason}")]
    Invalid { key: String, reason: String },
    /// Protected mode (`server.protected_mode`) refuses the addresses.
    #[error("protected mode: {0}")]
    ProtectedMode(String),
    /// An error in the file at `path` (what [`crate::Config::load`] returns).
    #[error("{}: {error}", path.display())]
    InFile {
        path: PathBuf,
        error: Box<ConfigError>,
    },
}

impl ConfigError {
    /// A value refused: `key` (`section.key`, or the section), and why.
    pub fn invalid(key: impl Into<String>, reason: impl Into<String>) -> ConfigError {
        ConfigError::Invalid {
            key: key.into(),
            reason: reason.into(),
        }
    }

    /// The error itself, without the file it was found in.
    pub fn kind(&self) -> &ConfigError {
        match self {
            ConfigError::InFile { error, .. } => error.kind(),
            other => other,
        }
    }
}

/// An old key name read under its new one (`crate::keys::RENAMED`): the configuration
/// loads, and the daemon logs one line per key so that the file can be updated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Deprecation {
    /// An old name of a key: read as the new one (`keys::RENAMED`).
    Renamed {
        section: &'static str,
        old: &'static str,
        new: &'static str,
    },
    /// A key that no longer has an effect: read and ignored (`keys::RETIRED`).
    Retired {
        section: &'static str,
        key: &'static str,
        why: &'static str,
    },
}

impl std::fmt::Display for Deprecation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Deprecation::Renamed { section, old, new } => write!(
                f,
                "{section}.{old} is deprecated: it is read as {section}.{new}, the name to use"
            ),
            Deprecation::Retired { section, key, why } => {
                write!(f, "{section}.{key} is retired and ignored: {why}")
            }
        }
    }
}
