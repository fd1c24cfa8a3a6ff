//! The daemon's one TOML file (`ops/akerd.toml` is the commented example). Every table
//! and key is optional (defaults below); an unknown key is an error, so a typo does not
//! silently fall back to a default. A crate of its own: the experiment runner reads
//! akerd's file with these functions without linking the daemon (`aker` re-exports it
//! as `aker::config`; the checks that need the daemon, reading the secret and parsing
//! the pgvector url with its driver, are there).
//!
//! ```toml
//! [server]    # connection layer: listen, executors, cpus, limits (ServerConfig)
//! [cache]     # the engine: metric, k_max, delta, capacity, filter, policy, log bounds
//! [sharding]  # shards (0 = 2 x executors), centroids, rebalance period
//! [backend]   # embedded (in-process HNSW / exact store over a collection), pgvector
//!             # (a PostgreSQL table: [backend.pgvector]) or cache_aside
//! [admin]     # Prometheus text endpoint (GET /metrics), 127.0.0.1 by default
//! [auth]      # where protocol version 3's shared secret comes from
//! [tls]       # TLS on the client port: certificate, key, client CA (mutual TLS)
//! [cluster]   # a tier of nodes coordinated through PostgreSQL: name, advertise, lease
//! ```
//!
//! Errors are a [`ConfigError`]; keys renamed since (`keys::RENAMED`) still load, each
//! with a [`Deprecation`] note that [`Config::parse`] and [`Config::read`] return.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

mod backend;
mod cache;
mod cluster;
mod error;
pub mod keys;
mod server;

pub use backend::{
    check_instance_name, redact_password, url_has_password, BackendKind, BackendSection,
    ChangesMode, DataSource, IndexKind, IterativeScan, PgvectorSection, INSTANCE_LEN_MAX,
};
pub use cache::{
    daemon_defaults, CacheSection, HugePages, DEFAULT_CAPACITY_BYTES, HUGE_PAGES_AUTO_BYTES,
};
pub use cluster::{cluster_fingerprint, Balance, ClusterSection, CLUSTER_NAME_LEN_MAX};
pub use error::{ConfigError, Deprecation};
pub use server::{ServerConfig, FRAME_BYTES_MIN};

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub server: ServerConfig,
    pub cache: CacheSection,
    pub sharding: ShardingSection,
    pub backend: BackendSection,
    pub admin: AdminSection,
    pub auth: AuthSection,
    pub tls: TlsSection,
    pub cluster: ClusterSection,
}

/// TLS on the client port: with `cert_file` and `key_file` set, it speaks TLS (1.2 and
/// 1.3) only; with `client_ca_file` too, every client presents a certificate that chains
/// to it (mutual TLS). Files are PEM, read at start and again on SIGHUP.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsSection {
    /// The server's certificate, then its chain (relative to the config file's folder).
    pub cert_file: Option<PathBuf>,
    /// Its private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: Option<PathBuf>,
    /// CA certificates a client's certificate must chain to (mutual TLS).
    pub client_ca_file: Option<PathBuf>,
    /// A connection not through its handshake by then (from accept) is closed.
    pub handshake_timeout_ms: u64,
    /// New handshakes per second per executor; more wait (within the timeout). A full
    /// handshake is CPU on the executor that serves hits.
    pub handshakes_per_s_max: u32,
}

impl Default for TlsSection {
    fn default() -> Self {
        TlsSection {
            cert_file: None,
            key_file: None,
            client_ca_file: None,
            handshake_timeout_ms: 10_000,
            handshakes_per_s_max: 250,
        }
    }
}

impl TlsSection {
    /// The client port speaks TLS.
    pub fn enabled(&self) -> bool {
        self.cert_file.is_some()
    }

    /// Every client presents a certificate.
    pub fn mutual(&self) -> bool {
        self.enabled() && self.client_ca_file.is_some()
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: &str| Err(ConfigError::invalid("tls", m));
        if self.cert_file.is_some() != self.key_file.is_some() {
            return bad("set cert_file and key_file together");
        }
        if self.client_ca_file.is_some() && !self.enabled() {
            return bad("client_ca_file needs cert_file and key_file (the server's own)");
        }
        if self.handshake_timeout_ms == 0 || self.handshakes_per_s_max == 0 {
            return bad("handshake_timeout_ms and handshakes_per_s_max must be at least 1");
        }
        Ok(())
    }
}

/// Where the shared secret of protocol version 3's AUTH comes from (`crate::auth`). Only
/// where: the secret itself is never part of the configuration, so `--print-config`
/// and the logs cannot show it. Neither set: no authentication.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthSection {
    /// A file whose first line is the secret (relative to the config file's folder).
    pub secret_file: Option<PathBuf>,
    /// An environment variable holding the secret.
    pub secret_env: Option<String>,
}

impl AuthSection {
    pub fn enabled(&self) -> bool {
        self.secret_file.is_some() || self.secret_env.is_some()
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ShardingSection {
    /// Cache shards; 0 = 2 x executors. Shard s is owned by executor s % executors.
    pub shards: usize,
    /// Coarse centroids (k-means on a sample of the collection), assigned to shards by
    /// measured load.
    pub centroids: usize,
    /// Most rows the k-means sample takes (evenly strided over the collection).
    pub sample_rows: usize,
    /// Period of the load-based centroid reassignment and pool-share rebalance (0 = never).
    pub rebalance_ms: u64,
    pub seed: u64,
}

impl Default for ShardingSection {
    fn default() -> Self {
        ShardingSection {
            shards: 0,
            centroids: 64,
            sample_rows: 20_000,
            rebalance_ms: 1_000,
            seed: 0x5eed,
        }
    }
}

impl ShardingSection {
    pub fn shard_count(&self, executors: usize) -> usize {
        if self.shards == 0 {
            2 * executors.max(1)
        } else {
            self.shards
        }
    }

    /// The engine's sharding for `shards` shards (akerd rebalances on a timer, so the
    /// engine's search-count period is unused).
    pub fn engine(&self, shards: usize) -> shards::sharded::ShardingConfig {
        shards::sharded::ShardingConfig {
            shards,
            centroids: self.centroids,
            rebalance_every: u64::MAX,
            seed: self.seed,
        }
    }
}
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdminSection {
    pub enabled: bool,
    /// Loopback unless configured otherwise: the endpoint has no authentication.
    pub listen: SocketAddr,
    /// Scrapes served at once; more wait in the kernel's backlog. (`max_connections`
    /// before.)
    #[serde(rename = "connections_max", alias = "max_connections")]
    pub max_connections: usize,
}

impl Default for AdminSection {
    fn default() -> Self {
        AdminSection {
            enabled: true,
            listen: SocketAddr::from(([127, 0, 0, 1], 7701)),
            max_connections: 4,
        }
    }
}
impl Config {
    /// Parses a config file's text, with a note for each old key name it uses (an old
    /// and a new name of one key together are an error). An error names the line and
    /// column but does not quote the line: a secret pasted into the file by mistake
    /// (`[auth] secret = ...`) must not reach stderr or the journal.
    pub fn parse(text: &str) -> Result<(Config, Vec<Deprecation>), ConfigError> {
        let doc: toml::Table = toml::from_str(text).map_err(|e| parse_error(text, e))?;
        let notes = keys::deprecations(&doc)?;
        let cfg = toml::from_str(text).map_err(|e| parse_error(text, e))?;
        Ok((cfg, notes))
    }

    /// [`Config::parse`] without the deprecation notes (tests, fuzzing; akerd and the
    /// runner read files with [`Config::read`] and show the notes).
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text).map(|(cfg, _)| cfg)
    }

    /// Reads `path`, with its deprecation notes; a relative data path is made relative
    /// to the file's folder.
    pub fn read(path: &Path) -> Result<(Config, Vec<Deprecation>), ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|error| ConfigError::Io {
            path: path.to_path_buf(),
            error,
        })?;
        let (mut cfg, notes) = Config::parse(&text).map_err(|e| ConfigError::InFile {
            path: path.to_path_buf(),
            error: Box::new(e),
        })?;
        let relative = |p: &mut PathBuf| {
            if p.is_relative() {
                if let Some(dir) = path.parent() {
                    *p = dir.join(&*p);
                }
            }
        };
        if let DataSource::File { path: p, .. } = &mut cfg.backend.data {
            relative(p);
        }
        if let Some(p) = &mut cfg.backend.data_dir {
            relative(p);
        }
        if let Some(p) = &mut cfg.auth.secret_file {
            relative(p);
        }
        for p in [
            &mut cfg.tls.cert_file,
            &mut cfg.tls.key_file,
            &mut cfg.tls.client_ca_file,
        ]
        .into_iter()
        .flatten()
        {
            relative(p);
        }
        Ok((cfg, notes))
    }

    /// [`Config::read`] without the deprecation notes.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        Config::read(path).map(|(cfg, _)| cfg)
    }

    /// Protected mode (`server.protected_mode`, on by default): no listening beyond
    /// loopback without authentication, and the admin endpoint (which has none) on
    /// loopback only.
    fn protected_mode(&self) -> Result<(), ConfigError> {
        if self.auth.secret_file.is_some() && self.auth.secret_env.is_some() {
            return Err(ConfigError::invalid(
                "auth",
                "set secret_file or secret_env, not both",
            ));
        }
        if !self.server.protected_mode {
            return Ok(());
        }
        let listen = self.server.listen.ip().to_canonical();
        if !listen.is_loopback() && !self.auth.enabled() && !self.tls.mutual() {
            return Err(ConfigError::ProtectedMode(format!(
                "refusing to listen on {listen} without authentication; set \
                 [auth] secret_file or secret_env, or [tls] client_ca_file (mutual TLS), \
                 or server.protected_mode = false"
            )));
        }
        let admin = self.admin.listen.ip().to_canonical();
        if self.admin.enabled && !admin.is_loopback() {
            return Err(ConfigError::ProtectedMode(format!(
                "the admin endpoint has no authentication and may listen on \
                 loopback only, not {admin}; or set server.protected_mode = false"
            )));
        }
        Ok(())
    }

    /// The configuration as TOML (`--print-config`), with any password written into the
    /// pgvector url (refused by `validate`, but printed before it runs) masked. Keys
    /// are printed under their current names.
    pub fn to_toml(&self) -> String {
        let mut shown = self.clone();
        if let Some(pg) = &mut shown.backend.pgvector {
            pg.url = redact_password(&pg.url);
            for u in &mut pg.replica_urls {
                *u = redact_password(u);
            }
        }
        toml::to_string_pretty(&shown).unwrap_or_else(|e| format!("# cannot render: {e}\n"))
    }

    /// Checks what can be checked before loading data.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.server.validate()?;
        self.tls.validate()?;
        self.cluster.validate()?;
        if self.cluster.enabled() && !matches!(self.backend.kind, BackendKind::Pgvector) {
            return Err(ConfigError::invalid(
                "cluster",
                "needs backend.kind = \"pgvector\": PostgreSQL holds the routing state \
                 and the membership",
            ));
        }
        self.protected_mode()?;
        // The dimension is not known yet; 1 stands in to check the rest.
        self.cache.engine_config(1)?;
        self.backend.validate(self.cache.k_max, self.cache.delta)?;
        let s = &self.sharding;
        if s.centroids == 0 || s.sample_rows == 0 {
            return Err(ConfigError::invalid(
                "sharding",
                "centroids and sample_rows must be positive",
            ));
        }
        if s.shard_count(self.server.executors) > 4096 {
            return Err(ConfigError::invalid(
                "sharding.shards",
                "at most 4096 shards",
            ));
        }
        if self.admin.enabled && self.admin.max_connections == 0 {
            return Err(ConfigError::invalid(
                "admin.connections_max",
                "must be at least 1",
            ));
        }
        Ok(())
    }
}

/// A `toml` error as a [`ConfigError`]: the line and column of its span in `text`, the
/// message without the quoted line; an unknown key as a kind of its own.
fn parse_error(text: &str, e: toml::de::Error) -> ConfigError {
    let at = e.span().map(|s| s.start).unwrap_or(0).min(text.len());
    let before = &text[..at];
    let line = before.matches('\n').count() + 1;
    let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
    let message = e.message().trim_end().to_string();
    // serde's words for a field no struct has (`de::Error::unknown_field`).
    match message
        .strip_prefix("unknown field `")
        .and_then(|rest| rest.split_once('`'))
    {
        Some((key, _)) => ConfigError::UnknownKey {
            key: key.to_string(),
            line,
            column,
            message,
        },
        None => ConfigError::Parse {
            line,
            column,
            message,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shards::{Capacity, Eviction, FilterKind};

    #[test]
    fn empty_file_is_the_default_and_unknown_keys_are_refused() {
        assert_eq!(Config::from_toml("").unwrap(), Config::default());
        Config::default().validate().unwrap();
        assert!(Config::from_toml("[cache]\nno_such = 1").is_err());
        assert!(Config::from_toml("[nope]").is_err());
        assert!(Config::from_toml("[backend.data]\nkind = \"synthetic\"\nn = 1\ndim = 2\nclusters = 1\nseed = 0\nextra = 1").is_err());
    }

    #[test]
    fn sections_parse_and_round_trip() {
        let text = r#"
            [server]
            listen = "127.0.0.1:0"
            executors = 3
            cpus = [2, 3, 4]
            [cache]
            capacity_objects = 5000
            delta = 4
            filter = { kind = "brute_force" }
            policy = { kind = "proximity", threshold = 0.5 }
            [sharding]
            shards = 0
            [backend]
            kind = "cache_aside"
            data = { kind = "none", dim = 50 }
            [admin]
            enabled = false
        "#;
        let cfg = Config::from_toml(text).unwrap();
        cfg.validate().unwrap();
        assert_eq!(cfg.server.executors, 3);
        assert_eq!(cfg.server.cpus, vec![2, 3, 4]);
        assert_eq!(cfg.sharding.shard_count(3), 6);
        let e = cfg.cache.engine_config(50).unwrap();
        assert_eq!(e.capacity, Capacity::Objects(5000));
        assert_eq!(e.filter, FilterKind::BruteForce);
        assert_eq!(cfg.backend.data, DataSource::None { dim: 50 });
        assert_eq!(Config::from_toml(&cfg.to_toml()).unwrap(), cfg);
    }

    #[test]
    fn contradictions_are_refused() {
        let both = "[cache]\ncapacity_bytes = 1\ncapacity_objects = 1";
        assert!(Config::from_toml(both).unwrap().validate().is_err());
        let no_data = "[backend]\ndata = { kind = \"none\", dim = 4 }";
        assert!(Config::from_toml(no_data).unwrap().validate().is_err());
        let k0 = "[cache]\nk_max = 0";
        assert!(Config::from_toml(k0).unwrap().validate().is_err());
        let nice = "[backend]\nnice = 20";
        assert!(Config::from_toml(nice).unwrap().validate().is_err());
        let m1 =
            "[cache]\nfilter = { kind = \"hnsw\", m = 1, ef_construction = 8, ef_search = 16 }";
        assert!(Config::from_toml(m1).unwrap().validate().is_err());
    }

    #[test]
    fn both_graph_filters_parse() {
        let text =
            "[cache]\nfilter = { kind = \"hnsw_rs\", m = 4, ef_construction = 8, ef_search = 16 }";
        let cfg = Config::from_toml(text).unwrap();
        cfg.validate().unwrap();
        assert_eq!(
            cfg.cache.engine_config(8).unwrap().filter,
            FilterKind::HnswRs {
                m: 4,
                ef_construction: 8,
                ef_search: 16
            }
        );
        assert_eq!(Config::default().cache.filter, FilterKind::default());
        assert!(matches!(FilterKind::default(), FilterKind::Hnsw { .. }));
    }

    #[test]
    fn the_shipped_example_states_exactly_the_effective_defaults() {
        let text = include_str!("../../ops/akerd.toml");
        let mut effective = Config::default();
        // Unset by default, with their effect stated in the file: the metric of the
        // example's (embedded) backend, the byte budget and its backend threads' nice.
        effective.cache.metric = Some(effective.cache.metric_or_default());
        effective.cache.capacity_bytes = Some(DEFAULT_CAPACITY_BYTES);
        effective.backend.nice = Some(effective.backend.nice());
        // Every value as the default (compared as the config's own types: f32 stays f32)…
        assert_eq!(Config::from_toml(text).unwrap(), effective);
        // …and every key stated, none left to its default silently.
        let keys = |v: &toml::Value| -> Vec<String> {
            let mut out = Vec::new();
            for (table, t) in v.as_table().expect("a table") {
                match t.as_table() {
                    Some(t) => out.extend(t.keys().map(|k| format!("{table}.{k}"))),
                    None => out.push(table.clone()),
                }
            }
            out.sort();
            out
        };
        let shipped: toml::Value = toml::from_str(text).unwrap();
        let want = toml::Value::try_from(&effective).unwrap();
        assert_eq!(keys(&shipped), keys(&want));
    }

    /// Unset, the backend threads' nice value follows the kind: the embedded store's
    /// searches hold a core, a pgvector thread waits on its socket.
    #[test]
    fn the_backend_nice_follows_the_kind_unless_set() {
        let kind = |k: &str| Config::from_toml(&format!("[backend]\nkind = \"{k}\"")).unwrap();
        assert_eq!(kind("embedded").backend.nice(), 10);
        assert_eq!(kind("pgvector").backend.nice(), 0);
        let set = "[backend]\nkind = \"pgvector\"\nnice = 5";
        assert_eq!(Config::from_toml(set).unwrap().backend.nice(), 5);
    }

    #[test]
    fn a_config_error_does_not_quote_the_line() {
        // The natural mistake: the secret itself in the file.
        let e = Config::from_toml("[server]\n[auth]\nsecret = \"supersecret-value-1234\"\n")
            .unwrap_err()
            .to_string();
        assert!(!e.contains("supersecret"), "{e}");
        assert!(e.contains("line 3") && e.contains("unknown field"), "{e}");
    }

    #[test]
    fn the_shipped_examples_parse() {
        let text = include_str!("../../ops/akerd.toml");
        let cfg = Config::from_toml(text).unwrap();
        cfg.validate().unwrap();
        let cfg = Config::from_toml(include_str!("../../ops/akerd-pgvector.toml")).unwrap();
        cfg.validate().unwrap();
        assert_eq!(cfg.backend.kind, BackendKind::Pgvector);
        assert_eq!(cfg.cache.metric, None, "the metric comes from the index");
    }

    #[test]
    fn the_guarded_policy_and_second_chance_eviction_reach_the_engine() {
        let cfg = Config::from_toml(
            "[cache]\neviction = \"second_chance\"\n\
             policy = { kind = \"guarded\", alpha_l = 1.1, alpha_t = 0.25, tau_init_divisor = 4.0 }\n",
        )
        .unwrap();
        let engine = cfg.cache.engine_config(8).unwrap();
        assert_eq!(engine.eviction, Eviction::SecondChance);
        assert!(cfg.cache.policy.build().promotes_aliases());
        let bad = "[cache]\npolicy = { kind = \"guarded\", alpha_l = 1.1, alpha_t = 0.25, \
                   tau_init_divisor = 4.0, spread = -1.0 }\n";
        assert!(Config::from_toml(bad).unwrap().validate().is_err());
    }

    #[test]
    fn pgvector_settings_are_checked() {
        let base = include_str!("../../ops/akerd-pgvector.toml");
        let with = |extra: &str| -> Result<(), String> {
            let cfg = Config::from_toml(&format!("{base}\n{extra}")).map_err(|e| e.to_string())?;
            cfg.validate().map_err(|e| e.to_string())
        };
        // the url is printed by --print-config: a password in it is refused
        let e = Config::from_toml(&base.replace("aker@", "aker:hunter2@"))
            .unwrap()
            .validate()
            .unwrap_err()
            .to_string();
        assert!(e.contains("password_file") && !e.contains("hunter2"), "{e}");
        // ef_search below k_max + delta without an iterative scan returns short answers
        assert!(with("ef_search = 50")
            .unwrap_err()
            .contains("below k_max + delta"));
        let relaxed = base
            .replace(
                "iterative_scan = \"off\"",
                "iterative_scan = \"relaxed_order\"",
            )
            .replace("# ef_search = 110", "ef_search = 50");
        Config::from_toml(&relaxed).unwrap().validate().unwrap();
        assert!(with("password_env = \"X\"")
            .unwrap_err()
            .contains("not both"));
        // a pgvector section needs the pgvector kind, and the other way round
        let embedded = base.replace("kind = \"pgvector\"", "kind = \"embedded\"");
        assert!(Config::from_toml(&embedded).unwrap().validate().is_err());
        let bare = "[backend]\nkind = \"pgvector\"";
        assert!(Config::from_toml(bare).unwrap().validate().is_err());
        let pg = Config::from_toml(base).unwrap();
        assert_eq!(
            pg.backend.pgvector.unwrap().effective_ef_search(100, 10),
            110
        );
        // --print-config prints before validating: a password in the url is masked
        let leaky = Config::from_toml(&base.replace("aker@", "aker:hunter2@")).unwrap();
        let shown = leaky.to_toml();
        assert!(
            !shown.contains("hunter2") && shown.contains("aker:***@127.0.0.1"),
            "{shown}"
        );
        assert_eq!(redact_password("postgresql://a@h/d"), "postgresql://a@h/d");
        assert_eq!(
            redact_password("postgresql://a:p@ss@h/d"),
            "postgresql://a:***@h/d"
        );
        assert_eq!(
            redact_password("postgresql://a@h/d?password=x&sslmode=disable"),
            "postgresql://a@h/d?password=***&sslmode=disable"
        );
        assert_eq!(
            redact_password("host=db user=a password=x dbname=d"),
            "host=db user=a password=*** dbname=d"
        );
        assert_eq!(
            redact_password("host=h password = 'a b' user=u"),
            "host=h password = *** user=u"
        );
    }

    #[test]
    fn an_old_key_loads_with_a_note_and_prints_under_its_new_name() {
        let (cfg, notes) =
            Config::parse("[server]\nmax_inflight = 7\n[cache]\ninsert_log_cap = 99").unwrap();
        assert_eq!((cfg.server.max_inflight, cfg.cache.insert_log_cap), (7, 99));
        assert_eq!(
            notes,
            [
                Deprecation::Renamed {
                    section: "server",
                    old: "max_inflight",
                    new: "inflight_max"
                },
                Deprecation::Renamed {
                    section: "cache",
                    old: "insert_log_cap",
                    new: "insert_log_entries_max"
                },
            ]
        );
        assert!(
            notes[0]
                .to_string()
                .contains("server.max_inflight is deprecated"),
            "{}",
            notes[0]
        );
        let printed = cfg.to_toml();
        assert!(
            printed.contains("inflight_max = 7") && !printed.contains("max_inflight"),
            "{printed}"
        );
        // The new name alone: no note.
        let (same, none) =
            Config::parse("[server]\ninflight_max = 7\n[cache]\ninsert_log_entries_max = 99")
                .unwrap();
        assert_eq!((same, none.len()), (cfg, 0));
    }

    /// Every row of `keys::RENAMED` loads under its old name (its field carries the
    /// alias), with its note, to the same value as under its new name.
    #[test]
    fn every_renamed_key_loads_under_either_name() {
        for &(section, old, new) in keys::RENAMED {
            let with = |key: &str| {
                let text = format!("[{section}]\n{key} = 1234\n");
                Config::parse(&text).unwrap_or_else(|e| panic!("{section}.{key}: {e}"))
            };
            let (by_old, notes) = with(old);
            let (by_new, none) = with(new);
            assert_eq!(by_old, by_new, "{section}.{old}");
            assert_ne!(
                by_new,
                Config::parse(&format!("[{section}]\n")).unwrap().0,
                "{section}.{new} is read"
            );
            assert_eq!(notes, [Deprecation::Renamed { section, old, new }]);
            assert!(none.is_empty());
        }
    }

    #[test]
    fn both_names_of_a_key_are_refused() {
        let e = Config::parse("[admin]\nmax_connections = 2\nconnections_max = 3").unwrap_err();
        assert!(
            matches!(
                e,
                ConfigError::BothKeys {
                    section: "admin",
                    old: "max_connections",
                    new: "connections_max"
                }
            ),
            "{e:?}"
        );
        assert!(e.to_string().contains("both"), "{e}");
    }

    #[test]
    fn a_retired_key_loads_ignored_with_a_note() {
        let (cfg, notes) = Config::parse("[cache]\ncomplete_fast_path = true\n").unwrap();
        let mut plain = Config::parse("").unwrap().0;
        plain.cache.complete_fast_path = Some(true);
        assert_eq!(cfg, plain);
        assert!(matches!(
            notes[..],
            [Deprecation::Retired {
                section: "cache",
                key: "complete_fast_path",
                ..
            }]
        ));
        assert!(notes[0].to_string().contains("retired and ignored"));
        assert_eq!(
            cfg.cache.engine_config(4).unwrap(),
            Config::parse("").unwrap().0.cache.engine_config(4).unwrap(),
            "nothing reaches the engine"
        );
    }

    #[test]
    fn errors_are_typed() {
        let e = Config::from_toml("[cache]\nno_such = 1").unwrap_err();
        assert!(
            matches!(&e, ConfigError::UnknownKey { key, line: 2, .. } if key == "no_such"),
            "{e:?}"
        );
        let e = Config::from_toml("[cache]\nk_max = \"ten\"").unwrap_err();
        assert!(matches!(e, ConfigError::Parse { line: 2, .. }), "{e:?}");
        let e = Config::from_toml("[server]\nframe_bytes_max = 10")
            .unwrap()
            .validate()
            .unwrap_err();
        assert!(
            matches!(&e, ConfigError::Invalid { key, .. } if key == "server.frame_bytes_max"),
            "{e:?}"
        );
        assert!(
            e.to_string()
                .starts_with("server.frame_bytes_max: 10 is below"),
            "{e}"
        );
        let missing = Path::new("/nonexistent/akerd.toml");
        assert!(matches!(Config::load(missing), Err(ConfigError::Io { .. })));
        let dir = std::env::temp_dir().join(format!("aker-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("akerd.toml");
        std::fs::write(&file, "[nope]\n").unwrap();
        let e = Config::load(&file).unwrap_err();
        assert!(matches!(e.kind(), ConfigError::UnknownKey { .. }), "{e:?}");
        assert!(
            e.to_string()
                .starts_with(&format!("{}: line 1", file.display())),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
