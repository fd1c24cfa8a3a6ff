//! `[backend]` and `[backend.pgvector]`: where misses are answered (an embedded index
//! over a collection, a PostgreSQL table, or none: cache-aside) and the data it loads.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::ConfigError;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackendKind {
    /// An in-process index over the collection in `data`, on backend threads.
    Embedded,
    /// A PostgreSQL table with a pgvector column and its HNSW index (`[backend.pgvector]`):
    /// misses query it, writes go through it.
    Pgvector,
    /// No backend: a miss answers MISS with no neighbours and the client FILLs.
    CacheAside,
}

/// `hnsw.iterative_scan` (pgvector 0.8): whether an index scan that ran out of
/// candidates goes on searching.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IterativeScan {
    #[default]
    Off,
    StrictOrder,
    /// Results may come slightly out of order; akerd re-sorts them.
    RelaxedOrder,
}

impl IterativeScan {
    pub fn as_sql(self) -> &'static str {
        match self {
            IterativeScan::Off => "off",
            IterativeScan::StrictOrder => "strict_order",
            IterativeScan::RelaxedOrder => "relaxed_order",
        }
    }
}

/// `changes`: whether akerd follows the table's committed changes (logical decoding,
/// `pgoutput`), so that writes made straight into PostgreSQL reach the cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChangesMode {
    /// Follow when the server allows it (`wal_level = logical`, the privileges, a usable
    /// replica identity); otherwise start with a warning that writes must go through
    /// akerd.
    #[default]
    Auto,
    /// Follow, or refuse to start.
    Follow,
    /// Only writes through akerd reach the cache.
    Off,
}

impl ChangesMode {
    pub fn as_str(self) -> &'static str {
        match self {
            ChangesMode::Auto => "auto",
            ChangesMode::Follow => "follow",
            ChangesMode::Off => "off",
        }
    }
}

/// `[backend.pgvector]`: the table akerd fronts. The connection pool is
/// `backend.threads` connections, one per backend thread.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PgvectorSection {
    /// `postgresql://user@host:port/dbname` (libpq URL or key=value form), without a
    /// password: that comes from `password_file` or `password_env`, so that neither
    /// `--print-config` nor a log line can show it.
    pub url: String,
    /// A file whose first line is the password (trailing newline ignored).
    pub password_file: Option<PathBuf>,
    /// An environment variable holding the password.
    pub password_env: Option<String>,
    /// The table, optionally schema-qualified (`public.items`).
    pub table: String,
    /// A `bigint` column with a unique index (or the primary key).
    pub id_column: String,
    /// A `vector` or `vector(n)` column with an HNSW index.
    pub vector_column: String,
    /// The dimension clients send, checked against the table at start (unset: the
    /// table's, whatever it is).
    pub dim: Option<usize>,
    /// A `bytea` column for INSERT payloads; unset, an INSERT with a payload is refused
    /// (UNSUPPORTED) rather than dropped silently.
    pub payload_column: Option<String>,
    /// `hnsw.ef_search` for every search (unset: `k_max + delta`, at least pgvector's
    /// default 40). Below `k_max + delta` it is refused unless `iterative_scan` is on:
    /// pgvector would return fewer rows than a miss asks for.
    pub ef_search: Option<usize>,
    pub iterative_scan: IterativeScan,
    /// `statement_timeout`: the longest one statement may run; a request whose deadline
    /// comes sooner has its statement cancelled at that instant.
    pub statement_timeout_ms: u64,
    /// Bound on opening one connection.
    pub connect_timeout_ms: u64,
    /// At start, how long akerd retries (with backoff) a database that cannot be
    /// reached before it gives up and exits; 0: give up at once.
    pub start_wait_ms: u64,
    /// Longest pause between reconnection attempts once running (backoff from 50 ms,
    /// doubling). (`reconnect_max_ms` before.)
    #[serde(rename = "reconnect_ms_max", alias = "reconnect_max_ms")]
    pub reconnect_max_ms: u64,
    /// Whether akerd follows the table's committed changes (docs/PGVECTOR.md).
    pub changes: ChangesMode,
    /// How often the change stream is read when nothing wakes it (a write through
    /// akerd wakes it at once).
    pub changes_poll_ms: u64,
    /// This akerd's name on the database: its slot and publication are `aker_<instance>`.
    /// Unset: the name kept in `backend.data_dir` (made there on the first start), or,
    /// without a data_dir, one made of the host name and the listen port.
    pub instance: Option<String>,
    /// While the change stream is further behind the database than this (ms since the
    /// last read that caught up), searches go to the database instead of the cache.
    /// Unset: hits are served however far behind. While the database cannot be reached,
    /// hits are served whatever this says (docs/PGVECTOR.md).
    pub max_staleness_ms: Option<u64>,
    /// Streaming read replicas of the primary in `url` (same password source and
    /// `sslmode` handling): a miss may be answered by one that has replayed at least
    /// what the cache has applied from the change stream (docs/PGVECTOR.md, "Read
    /// replicas"). Writes, the change stream and in-doubt checks use `url` only.
    pub replica_urls: Vec<String>,
}

impl Default for PgvectorSection {
    fn default() -> Self {
        PgvectorSection {
            url: String::new(),
            password_file: None,
            password_env: None,
            table: String::new(),
            id_column: "id".into(),
            vector_column: "embedding".into(),
            dim: None,
            payload_column: None,
            ef_search: None,
            iterative_scan: IterativeScan::Off,
            statement_timeout_ms: 5_000,
            connect_timeout_ms: 2_000,
            start_wait_ms: 30_000,
            reconnect_max_ms: 2_000,
            changes: ChangesMode::Auto,
            changes_poll_ms: 10,
            instance: None,
            max_staleness_ms: None,
            replica_urls: Vec::new(),
        }
    }
}

/// `url` with any password masked as `***`: in `scheme://user:password@host` (the
/// userinfo ends at the last `@` before the path), in a `password=` query parameter, and
/// in the key=value form (`password=...` or `password = '...'`).
pub fn redact_password(url: &str) -> String {
    if let Some((scheme, rest)) = url.split_once("://") {
        let path_at = rest.find(['/', '?']).unwrap_or(rest.len());
        let mut out = match rest[..path_at].rfind('@') {
            Some(at) => match rest[..at].find(':') {
                Some(colon) => format!("{scheme}://{}:***{}", &rest[..colon], &rest[at..]),
                None => url.to_string(),
            },
            None => url.to_string(),
        };
        if let Some(q) = out.find('?') {
            let (head, query) = out.split_at(q + 1);
            let masked: Vec<String> = query
                .split('&')
                .map(|kv| match kv.split_once('=') {
                    Some((k, _)) if k.eq_ignore_ascii_case("password") => format!("{k}=***"),
                    _ => kv.to_string(),
                })
                .collect();
            out = format!("{head}{}", masked.join("&"));
        }
        return out;
    }
    // key=value form: after "password", the value up to the next unquoted space.
    let lower = url.to_ascii_lowercase();
    let Some(k) = lower.find("password") else {
        return url.to_string();
    };
    let after = &url[k + "password".len()..];
    let Some(eq) = after.find('=').filter(|&e| after[..e].trim().is_empty()) else {
        return url.to_string();
    };
    let value = after[eq + 1..].trim_start();
    let value_start = url.len() - value.len();
    let value_len = if let Some(quoted) = value.strip_prefix('\'') {
        quoted.find('\'').map_or(value.len(), |e| e + 2)
    } else {
        value.find(' ').unwrap_or(value.len())
    };
    format!(
        "{}***{}",
        &url[..value_start],
        &url[value_start + value_len..]
    )
}

/// Whether `url` carries a password in any of the places [`redact_password`] masks.
pub fn url_has_password(url: &str) -> bool {
    redact_password(url) != url
}

impl PgvectorSection {
    /// `hnsw.ef_search` as sent, for a cache that asks for `k_max + delta` rows.
    pub fn effective_ef_search(&self, k_max: usize, delta: usize) -> usize {
        self.ef_search.unwrap_or((k_max + delta).max(40))
    }

    /// What can be checked without a database; `k_max + delta` is what a miss asks for.
    pub(crate) fn validate(&self, k_max: usize, delta: usize) -> Result<(), ConfigError> {
        let bad = |key: &str, m: String| {
            let key = match key {
                "" => "backend.pgvector".to_string(),
                k => format!("backend.pgvector.{k}"),
            };
            Err(ConfigError::invalid(key, m))
        };
        if self.url.is_empty() || self.table.is_empty() {
            return bad("", "url and table must be set".into());
        }
        if self.id_column.is_empty() || self.vector_column.is_empty() {
            return bad("", "id_column and vector_column must be set".into());
        }
        // The url's full syntax is checked where it is parsed (the daemon's driver);
        // a password in it is found here, without that driver.
        if url_has_password(&self.url) {
            return bad(
                "url",
                "holds a password; put it in password_file or password_env instead (the url is printed by --print-config)"
                    .into(),
            );
        }
        if self.password_file.is_some() && self.password_env.is_some() {
            return bad("", "set password_file or password_env, not both".into());
        }
        let ef = self.effective_ef_search(k_max, delta);
        if !(1..=1000).contains(&ef) {
            return bad("ef_search", format!("{ef} is outside pgvector's 1..=1000"));
        }
        if ef < k_max + delta && self.iterative_scan == IterativeScan::Off {
            return bad("ef_search", format!(
                "{ef} is below k_max + delta = {}: pgvector would return fewer rows than a miss asks for; raise it or set iterative_scan",
                k_max + delta
            ));
        }
        if self.statement_timeout_ms == 0 || self.connect_timeout_ms == 0 {
            return bad(
                "",
                "statement_timeout_ms and connect_timeout_ms must be positive".into(),
            );
        }
        if self.reconnect_max_ms < 50 {
            return bad("reconnect_ms_max", "must be at least 50".into());
        }
        if !(1..=10_000).contains(&self.changes_poll_ms) {
            return bad("changes_poll_ms", "must be in 1..=10000".into());
        }
        if self.max_staleness_ms.is_some() && self.changes == ChangesMode::Off {
            return bad(
                "max_staleness_ms",
                "bounds the change stream's lag: it needs changes = \"auto\" or \"follow\"".into(),
            );
        }
        if self.max_staleness_ms == Some(0) {
            return bad(
                "max_staleness_ms",
                "must be positive (unset: no bound)".into(),
            );
        }
        if let Some(name) = &self.instance {
            if let Err(why) = check_instance_name(name) {
                return bad("instance", why);
            }
        }
        self.validate_replicas()
    }

    /// `replica_urls`: each like `url` (no password in it), none the primary's own, and
    /// a change stream to hold them to (a replica may answer only once it has replayed
    /// what the stream has applied).
    fn validate_replicas(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::invalid("backend.pgvector.replica_urls", m));
        if !self.replica_urls.is_empty() && self.changes == ChangesMode::Off {
            return bad(
                "a replica is used only once it has replayed what the change stream has \
                 applied: it needs changes = \"auto\" or \"follow\""
                    .into(),
            );
        }
        for (i, u) in self.replica_urls.iter().enumerate() {
            if u.trim().is_empty() {
                return bad(format!("[{i}] is empty"));
            }
            if url_has_password(u) {
                return bad(format!(
                    "[{i}] holds a password; the replicas use password_file or password_env \
                     (the url is printed by --print-config)"
                ));
            }
            if u.trim() == self.url.trim() {
                return bad(format!("[{i}] is the primary's url"));
            }
        }
        Ok(())
    }
}

/// Longest instance name: `aker_` + it is a slot name, at most 63 bytes.
pub const INSTANCE_LEN_MAX: usize = 58;

/// An instance name becomes a slot name: lower-case letters, digits and `_` only.
pub fn check_instance_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > INSTANCE_LEN_MAX {
        return Err(format!("must be 1..={INSTANCE_LEN_MAX} characters"));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    {
        return Err(format!(
            "{name:?}: only lower-case letters, digits and '_' (it names a replication slot)"
        ));
    }
    Ok(())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IndexKind {
    /// hnsw_rs graph (approximate); the default.
    Hnsw,
    /// Brute force (exact; small collections and tests).
    Exact,
}

/// Where the collection (embedded) or the routing sample (cache-aside) comes from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum DataSource {
    /// Clustered synthetic vectors, ids 0..n.
    Synthetic {
        n: usize,
        dim: usize,
        clusters: usize,
        seed: u64,
    },
    /// A `.npy` (float32/float16, 2-D) or `.fvecs` file; ids are row numbers. `limit`
    /// keeps the first rows only (0 = all). Relative paths are from the config file.
    File {
        path: PathBuf,
        #[serde(default)]
        limit: usize,
    },
    /// No vectors (cache-aside only): the dimension alone; the router's centroids are
    /// then random, which still routes a query and its near duplicates consistently.
    None { dim: usize },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BackendSection {
    pub kind: BackendKind,
    pub data: DataSource,
    pub index: IndexKind,
    /// Backend threads (blocking calls stay off the executors).
    pub threads: usize,
    /// Backend requests queued at most; past it a request gets BUSY.
    pub queue_depth: usize,
    /// Nice value of the backend threads (0..=19; 0 leaves them alone); unset, it
    /// depends on the kind ([`BackendSection::nice`]). The embedded store's index
    /// searches are CPU-bound for a millisecond; at a lower priority they yield the core
    /// the moment an executor wakes to serve a hit, instead of holding it for a time slice.
    /// A pgvector thread only waits on its socket: a lower priority protects no hit and
    /// delays every miss's turn-around (bench/results/miss-parity.md).
    pub nice: Option<i32>,
    /// SCHED_IDLE for the backend threads: they run only on otherwise idle CPU time, so
    /// hits and the network never wait for them; under a hit load that saturates the
    /// cores, misses wait instead (bounded by their deadlines). Off by default.
    pub idle: bool,
    pub hnsw_m: usize,
    pub hnsw_ef_construction: usize,
    pub hnsw_ef_search: usize,
    /// Embedded only: where the store is durable (docs/ARCHITECTURE.md, "Durability").
    /// Unset, the store lives in memory and writes are lost at exit. Set, a write is in
    /// the directory's log, synced, before it is acknowledged; the first start imports
    /// `data` into it, later starts recover from it (and ignore `data`). Relative to the
    /// config file.
    pub data_dir: Option<PathBuf>,
    /// A checkpoint is written when the log's current segment reaches this many bytes
    /// (0: only at start, after a recovery that replayed records).
    pub checkpoint_log_bytes: u64,
    /// `kind = "pgvector"` only.
    pub pgvector: Option<PgvectorSection>,
}

impl Default for BackendSection {
    fn default() -> Self {
        BackendSection {
            kind: BackendKind::Embedded,
            data: DataSource::Synthetic {
                n: 20_000,
                dim: 32,
                clusters: 64,
                seed: 7,
            },
            index: IndexKind::Hnsw,
            threads: 2,
            queue_depth: 1024,
            nice: None,
            idle: false,
            hnsw_m: 16,
            hnsw_ef_construction: 100,
            hnsw_ef_search: 64,
            data_dir: None,
            checkpoint_log_bytes: 64 << 20,
            pgvector: None,
        }
    }
}

impl BackendSection {
    /// The backend threads' nice value: `nice` when set, else 10 for the embedded
    /// store's CPU-bound searches and 0 for pgvector's threads, which wait on a socket.
    pub fn nice(&self) -> i32 {
        self.nice.unwrap_or(match self.kind {
            BackendKind::Pgvector => 0,
            BackendKind::Embedded | BackendKind::CacheAside => 10,
        })
    }

    /// What can be checked before loading data; `k_max + delta` is what a miss asks for.
    pub(crate) fn validate(&self, k_max: usize, delta: usize) -> Result<(), ConfigError> {
        let bad = |key: &str, m: &str| Err(ConfigError::invalid(key, m));
        if self.threads == 0 || self.queue_depth == 0 {
            return bad("backend", "threads and queue_depth must be at least 1");
        }
        if !(0..=19).contains(&self.nice()) {
            return bad("backend.nice", "must be in 0..=19");
        }
        if self.hnsw_m == 0 || self.hnsw_ef_construction == 0 || self.hnsw_ef_search == 0 {
            return bad(
                "backend",
                "hnsw_m, hnsw_ef_construction, hnsw_ef_search must be positive",
            );
        }
        match (&self.kind, &self.pgvector) {
            (BackendKind::Pgvector, None) => {
                return bad(
                    "backend",
                    "kind = \"pgvector\" needs a [backend.pgvector] table",
                )
            }
            (BackendKind::Pgvector, Some(pg)) => pg.validate(k_max, delta)?,
            (_, Some(_)) => return bad("backend", "[backend.pgvector] is for kind = \"pgvector\""),
            (_, None) => {}
        }
        if self.data_dir.is_some() && self.kind == BackendKind::CacheAside {
            return bad(
                "backend.data_dir",
                "is for the embedded store and pgvector (its instance name)",
            );
        }
        if self.kind == BackendKind::Pgvector && self.threads > 64 {
            return bad(
                "backend.threads",
                "a pgvector pool of at most 64 connections (threads)",
            );
        }
        match (&self.kind, &self.data) {
            (BackendKind::Embedded, DataSource::None { .. }) => bad(
                "backend.data",
                "an embedded backend needs data (synthetic or file)",
            ),
            (
                _,
                DataSource::Synthetic {
                    n, dim, clusters, ..
                },
            ) if *n == 0 || *dim == 0 || *clusters == 0 => {
                bad("backend.data", "n, dim and clusters must be positive")
            }
            (_, DataSource::None { dim: 0 }) => bad("backend.data", "dim must be positive"),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_replicas(urls: &[&str]) -> PgvectorSection {
        PgvectorSection {
            url: "postgresql://aker@primary:5432/postgres".into(),
            table: "items".into(),
            replica_urls: urls.iter().map(|u| u.to_string()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn replica_urls_are_checked_like_the_primarys() {
        let ok = with_replicas(&["postgresql://aker@replica:5432/postgres?sslmode=disable"]);
        assert!(ok.validate(10, 10).is_ok());
        let why = |s: PgvectorSection| s.validate(10, 10).unwrap_err().to_string();
        let leaky = why(with_replicas(&["postgresql://aker:pw@replica/postgres"]));
        assert!(
            leaky.contains("replica_urls") && leaky.contains("password"),
            "{leaky}"
        );
        assert!(why(with_replicas(&["host=r password=x"])).contains("password"));
        assert!(why(with_replicas(&[" "])).contains("empty"));
        let same = why(with_replicas(&["postgresql://aker@primary:5432/postgres"]));
        assert!(same.contains("primary"), "{same}");
        let mut off = ok.clone();
        off.changes = ChangesMode::Off;
        assert!(why(off).contains("changes"));
    }

    /// `--print-config` prints before validating: a replica url's password is masked.
    #[test]
    fn print_config_masks_a_password_in_a_replica_url() {
        let text = "[backend]\nkind = \"pgvector\"\n[backend.pgvector]\n\
                    url = \"postgresql://aker@p/postgres\"\ntable = \"t\"\n\
                    replica_urls = [\"postgresql://aker:hunter2@r/postgres\"]\n";
        let shown = crate::Config::from_toml(text).unwrap().to_toml();
        assert!(
            !shown.contains("hunter2") && shown.contains("aker:***@r/postgres"),
            "{shown}"
        );
    }
}
