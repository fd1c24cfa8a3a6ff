//! `aker-cli`, the operator's command line (`src/bin/aker-cli.rs` is its `main`): the
//! arguments, one function per command, and the errors an operator reads. What the STATS
//! text turns into (the table, JSON, the watch lines) is in [`stats`].
//!
//! Every command connects, says HELLO (authenticating with the secret when one is given),
//! does its work and prints to the writer it is handed; every failure is a [`CliError`],
//! a message for stderr (the binary exits 1 on it).

pub mod stats;

use std::fmt;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand};

use crate::auth::Secret;
use crate::client::{Client, ClientError, ClientOptions};
use crate::protocol::{HelloReply, InsertRequest, SearchRequest, Status};
use stats::Stats;

/// The environment variable the secret is read from without `--secret-file` (the same
/// one the load generator and the soak tools read).
use crate::auth::SECRET_ENV;

#[derive(Parser, Debug)]
#[command(
    name = "aker-cli",
    version,
    about = "Command line for akerd: ping, stats, search, insert, delete, flush, watch"
)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Args, Debug, Clone)]
pub struct Global {
    /// akerd's address.
    #[arg(
        long,
        global = true,
        value_name = "HOST:PORT",
        default_value = "127.0.0.1:7700"
    )]
    pub target: String,
    /// Bound on connecting and on each reply.
    #[arg(long, global = true, value_name = "MS", default_value_t = 5000)]
    pub timeout_ms: u64,
    /// The shared secret for an akerd with [auth]: this file's first line (else
    /// $AKER_SECRET when set).
    #[arg(long, global = true, value_name = "FILE")]
    pub secret_file: Option<PathBuf>,
    /// TLS to an akerd with [tls]: trust the CA certificates in this PEM file.
    #[arg(long, global = true, value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
    /// The name the server's certificate must carry (default: --target's host).
    #[arg(long, global = true, value_name = "NAME", requires = "tls_ca")]
    pub tls_server_name: Option<String>,
    /// Mutual TLS: this client certificate (PEM, then its chain) ...
    #[arg(long, global = true, value_name = "FILE", requires_all = ["tls_ca", "tls_key"])]
    pub tls_cert: Option<PathBuf>,
    /// ... and its private key.
    #[arg(long, global = true, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
}

/// `--tls-*` as the client's TLS settings (None without `--tls-ca`).
fn tls_options(g: &Global) -> Result<Option<crate::client::ClientTls>> {
    let Some(ca) = &g.tls_ca else {
        return Ok(None);
    };
    let host = match &g.tls_server_name {
        Some(n) => n.as_str(),
        None => crate::client::ClientTls::host_of(&g.target),
    };
    let identity = g.tls_cert.as_deref().zip(g.tls_key.as_deref());
    crate::client::ClientTls::from_files(ca, host, identity)
        .map(Some)
        .map_err(|e| msg(e.to_string()))
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Round-trip time of one PING (after HELLO).
    Ping,
    /// The daemon's counters: a table, or every stat as JSON / as sent.
    Stats {
        /// A JSON object of every stat, numbers as numbers.
        #[arg(long, conflicts_with = "raw")]
        json: bool,
        /// The STATS reply as the daemon sent it (`name value` lines).
        #[arg(long)]
        raw: bool,
    },
    /// One SEARCH: the neighbours' ids and distances, and how it was answered.
    Search(SearchArgs),
    /// One INSERT (collection 0, no payload), and the write's position.
    Insert(InsertArgs),
    /// One DELETE (collection 0): whether the id was there, and the write's position.
    Delete {
        /// The id to delete.
        #[arg(long)]
        id: u64,
    },
    /// Drop every cache entry (the backend is untouched).
    Flush,
    /// The cluster this node is in (protocol version 6): its nodes, which are live, how
    /// many centroids each owns, the routing versions.
    Cluster,
    /// STATS every interval: request rate, hit ratios, p99 per hit kind, recall.
    Watch {
        #[arg(long, value_name = "MS", default_value_t = 1000)]
        interval_ms: u64,
        /// Stop after this many lines (default: until interrupted).
        #[arg(long, value_name = "N")]
        count: Option<u64>,
    },
}

/// A vector given on the command line or as a row of a `.npy` file (search, insert).
#[derive(Args, Debug)]
pub struct VectorArg {
    /// The vector, comma-separated: 0.1,0.2,...
    #[arg(
        long,
        value_name = "X,Y,...",
        allow_hyphen_values = true,
        required_unless_present = "npy",
        conflicts_with = "npy"
    )]
    pub vector: Option<String>,
    /// The vector from a 2-D float32 / float16 .npy array ...
    #[arg(long, value_name = "FILE")]
    pub npy: Option<PathBuf>,
    /// ... its row N (from 0).
    #[arg(long, value_name = "N", default_value_t = 0, requires = "npy")]
    pub row: usize,
}

impl VectorArg {
    /// The vector as given (`--vector`), or the `.npy` file's row.
    fn read(&self) -> Result<Vec<f32>> {
        read_vector(self.vector.as_ref(), self.npy.as_ref(), self.row)
    }
}

#[derive(Args, Debug)]
pub struct SearchArgs {
    #[command(flatten)]
    pub vector: VectorArg,
    /// Neighbours wanted.
    #[arg(short, long, default_value_t = 10)]
    pub k: u32,
    /// Answer from the backend; the cache is neither read nor filled (BYPASS_CACHE).
    #[arg(long)]
    pub bypass: bool,
    /// Answer from the backend and replace the cached entry (REFRESH_ENTRY).
    #[arg(long, conflicts_with = "bypass")]
    pub refresh: bool,
    /// Read-your-writes (AT_POSITION, protocol version 5): an answer that holds every
    /// change up to this position, as `insert` / `delete` print it or PostgreSQL's
    /// `pg_current_wal_insert_lsn()` reads it: `16/B374D848` or a number.
    #[arg(long, value_name = "LSN", value_parser = parse_position)]
    pub at_position: Option<u64>,
}

#[derive(Args, Debug)]
pub struct InsertArgs {
    /// The id to insert or replace.
    #[arg(long)]
    pub id: u64,
    #[command(flatten)]
    pub vector: VectorArg,
}

/// What the operator reads on stderr; the binary exits 1 with it.
#[derive(Debug)]
pub enum CliError {
    /// Anything about the request, the connection or the server.
    Message(String),
    /// Writing the output failed (a closed pipe: `aker-cli watch | head`).
    Output(io::Error),
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CliError::Message(m) => f.write_str(m),
            CliError::Output(e) => write!(f, "writing the output: {e}"),
        }
    }
}

impl std::error::Error for CliError {}

impl From<io::Error> for CliError {
    fn from(e: io::Error) -> Self {
        CliError::Output(e)
    }
}

impl CliError {
    /// The reader of the output went away: it has what it wanted, not an error.
    pub fn is_broken_pipe(&self) -> bool {
        matches!(self, CliError::Output(e) if e.kind() == io::ErrorKind::BrokenPipe)
    }
}

pub type Result<T, E = CliError> = std::result::Result<T, E>;

fn msg(m: impl Into<String>) -> CliError {
    CliError::Message(m.into())
}

fn fail<T>(m: impl Into<String>) -> Result<T> {
    Err(msg(m))
}

/// Runs one command, printing to `out`.
pub fn run(cli: &Cli, out: &mut dyn Write) -> Result<()> {
    let g = &cli.global;
    match &cli.command {
        Command::Ping => ping(g, out),
        Command::Stats { json, raw } => stats_cmd(g, *json, *raw, out),
        Command::Search(args) => search(g, args, out),
        Command::Insert(args) => insert(g, args, out),
        Command::Delete { id } => delete(g, *id, out),
        Command::Flush => flush(g, out),
        Command::Cluster => cluster(g, out),
        Command::Watch { interval_ms, count } => {
            watch(g, Duration::from_millis(*interval_ms), *count, out)
        }
    }
}

/// The secret: `file`'s first line, else `$AKER_SECRET` when it is set, else none
/// (`Secret::for_tool`, the load generator's convention too).
pub(crate) fn load_secret(file: Option<&Path>) -> Result<Option<Secret>> {
    Secret::for_tool(file).map_err(CliError::Message)
}

/// A connection that has said HELLO (and authenticated when the server asks).
struct Session {
    client: Client,
    hello: HelloReply,
    target: String,
    timeout: Duration,
}

impl Session {
    fn open(g: &Global) -> Result<Session> {
        let secret = load_secret(g.secret_file.as_deref())?;
        let timeout = Duration::from_millis(g.timeout_ms.max(1));
        let opts = ClientOptions {
            connect_timeout: timeout,
            io_timeout: Some(timeout),
            secret,
            tls: tls_options(g)?,
            ..Default::default()
        };
        let target = g.target.clone();
        let mut client = Client::connect_with(target.as_str(), opts).map_err(|e| {
            msg(format!(
                "cannot connect to {target}: {}",
                describe(&e, timeout)
            ))
        })?;
        let hello = client
            .hello()
            .map_err(|e| call_error(&target, timeout, "HELLO", e))?;
        Ok(Session {
            client,
            hello,
            target,
            timeout,
        })
    }

    fn error(&self, what: &str, e: ClientError) -> CliError {
        call_error(&self.target, self.timeout, what, e)
    }

    fn stats(&mut self) -> Result<Stats> {
        let text = self.client.stats().map_err(|e| self.error("STATS", e))?;
        Ok(Stats::parse(&text))
    }
}

/// A failed call to `t`, for the operator: authentication said plainly.
fn call_error(t: &str, timeout: Duration, what: &str, e: ClientError) -> CliError {
    msg(match e {
        ClientError::AuthRequired => {
            format!("{t} requires authentication: give --secret-file FILE or set ${SECRET_ENV}")
        }
        ClientError::Server {
            status: Status::Unauthenticated,
            message,
            ..
        } => {
            let why = if message.is_empty() {
                String::new()
            } else {
                format!(": {message}")
            };
            format!("authentication failed: {t} refused the secret (UNAUTHENTICATED{why})")
        }
        ClientError::ServerNotAuthentic => format!(
            "{t} does not prove it knows the secret (it asks for no AUTH, or its proof is \
             wrong), so nothing was sent to it; for an akerd without [auth], give no \
             --secret-file and unset ${SECRET_ENV}"
        ),
        e => format!("{what} to {t}: {}", describe(&e, timeout)),
    })
}

/// A client error in words (connection refused and timeouts said plainly).
fn describe(e: &ClientError, timeout: Duration) -> String {
    match e {
        ClientError::Io(io) if io.kind() == io::ErrorKind::ConnectionRefused => {
            "connection refused (is akerd running there?)".into()
        }
        ClientError::Timeout => format!("timed out after {} ms", timeout.as_millis()),
        ClientError::Tls(t) => format!("TLS: {t} (check --tls-ca, --tls-server-name, and --tls-cert / --tls-key for mutual TLS)"),
        ClientError::Server {
            status, message, ..
        } if message.is_empty() => format!("the server answered {status}"),
        ClientError::Server {
            status, message, ..
        } => format!("the server answered {status}: {message}"),
        e => e.to_string(),
    }
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

fn ping(g: &Global, out: &mut dyn Write) -> Result<()> {
    let mut s = Session::open(g)?;
    let t = Instant::now();
    s.client.ping().map_err(|e| s.error("PING", e))?;
    let rtt = t.elapsed();
    writeln!(out, "PONG {} {}", s.target, ms(rtt))?;
    Ok(())
}

fn stats_cmd(g: &Global, json: bool, raw: bool, out: &mut dyn Write) -> Result<()> {
    let mut s = Session::open(g)?;
    let text = s.client.stats().map_err(|e| s.error("STATS", e))?;
    if raw {
        out.write_all(text.as_bytes())?;
    } else if json {
        out.write_all(Stats::parse(&text).to_json().as_bytes())?;
    } else {
        let stats = Stats::parse(&text);
        out.write_all(stats::table(&stats, &s.hello, &s.target).as_bytes())?;
    }
    Ok(())
}

fn cluster(g: &Global, out: &mut dyn Write) -> Result<()> {
    let mut s = Session::open(g)?;
    let c = s.client.cluster().map_err(|e| s.error("CLUSTER", e))?;
    let n = c.centroids.len() / c.dim.max(1) as usize;
    let mut owned = std::collections::HashMap::<u64, usize>::new();
    for j in 0..n as u32 {
        if let Some(o) = crate::cluster::owner(&c, j) {
            *owned.entry(o).or_default() += 1;
        }
    }
    writeln!(
        out,
        "cluster {} (asked {}): {} nodes, {} live; {} centroids (version {}), {} overrides \
         (epoch {}), routing version {:016x}, lease {} ms",
        c.name,
        s.target,
        c.nodes.len(),
        c.nodes.iter().filter(|x| x.live).count(),
        n,
        c.centroids_version,
        c.overrides.len(),
        c.balance_epoch,
        c.routing_version,
        c.lease_ms
    )?;
    writeln!(
        out,
        "{:<18} {:<5} {:>9}  advertise",
        "node", "live", "centroids"
    )?;
    for x in &c.nodes {
        let me = if x.node_id == c.self_id {
            "  (this node)"
        } else {
            ""
        };
        writeln!(
            out,
            "{:016x}   {:<5} {:>9}  {}{me}",
            x.node_id,
            if x.live { "yes" } else { "no" },
            owned.get(&x.node_id).copied().unwrap_or(0),
            x.advertise
        )?;
    }
    Ok(())
}

fn flush(g: &Global, out: &mut dyn Write) -> Result<()> {
    let mut s = Session::open(g)?;
    s.client.flush().map_err(|e| s.error("FLUSH", e))?;
    writeln!(out, "OK: every cache entry of {} dropped", s.target)?;
    Ok(())
}

/// `0.1,0.2,...`: every component a finite number.
pub fn parse_vector(text: &str) -> Result<Vec<f32>> {
    let mut v = Vec::new();
    for (i, part) in text.split(',').enumerate() {
        let part = part.trim();
        let x: f32 = part.parse().map_err(|_| {
            msg(format!(
                "bad --vector: component {} '{part}' is not a number",
                i + 1
            ))
        })?;
        if !x.is_finite() {
            return fail(format!(
                "bad --vector: component {} '{part}' is not finite",
                i + 1
            ));
        }
        v.push(x);
    }
    Ok(v)
}

/// Row `row` of a `.npy` file (`aker_formats::data::read_npy`).
pub(crate) fn npy_row(path: &Path, row: usize) -> Result<Vec<f32>> {
    let ds = aker_formats::data::read_npy(path).map_err(|e| msg(format!("--npy {e}")))?;
    if row >= ds.n {
        return fail(format!(
            "--row {row}: {} has {} rows (0..{})",
            path.display(),
            ds.n,
            ds.n
        ));
    }
    let v = ds.row(row).to_vec();
    if let Some(i) = v.iter().position(|x| !x.is_finite()) {
        return fail(format!(
            "{} row {row}: component {} is not finite",
            path.display(),
            i + 1
        ));
    }
    Ok(v)
}

/// A write's or a search's position: a number, or PostgreSQL's `pg_lsn` text (`X/Y`, two
/// hexadecimal numbers of up to 8 digits: the high and the low 32 bits).
pub fn parse_position(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let bad = || {
        format!(
            "'{text}' is not a position: a number, or a pg_lsn such as 16/B374D848 (what \
             pg_current_wal_insert_lsn() shows)"
        )
    };
    match t.split_once('/') {
        Some((hi, lo)) => {
            let half = |h: &str| {
                let ok = (1..=8).contains(&h.len()) && h.bytes().all(|b| b.is_ascii_hexdigit());
                ok.then(|| u32::from_str_radix(h, 16).ok()).flatten()
            };
            match (half(hi), half(lo)) {
                (Some(hi), Some(lo)) => Ok((u64::from(hi) << 32) | u64::from(lo)),
                _ => Err(bad()),
            }
        }
        None => t.parse().map_err(|_| bad()),
    }
}

/// A position as PostgreSQL shows a pg_lsn (`16/B374D848`).
pub fn position_text(p: u64) -> String {
    format!("{:X}/{:X}", p >> 32, p as u32)
}

/// `position 16/B374D848 (96939890760)`, or what a position of 0 means.
fn position_line(p: u64) -> String {
    if p == 0 {
        "position 0/0 (nothing to wait for: the cache has the write, or the server reports \
         no position)"
            .into()
    } else {
        format!("position {} ({p})", position_text(p))
    }
}

/// The vector of `--vector` or `--npy`/`--row`, read before connecting (a bad one costs
/// no connection).
fn read_vector(text: Option<&String>, npy: Option<&PathBuf>, row: usize) -> Result<Vec<f32>> {
    match (text, npy) {
        (Some(text), _) => parse_vector(text),
        (None, Some(path)) => npy_row(path, row),
        (None, None) => fail("give --vector X,Y,... or --npy FILE [--row N]"),
    }
}

/// The vector against the server's dimension.
fn check_dim(s: &Session, vector: &[f32]) -> Result<()> {
    let dim = s.hello.dim as usize;
    if vector.len() != dim {
        return fail(format!(
            "wrong dimension: the vector has {} components, {} serves dimension {dim}",
            vector.len(),
            s.target
        ));
    }
    Ok(())
}

fn search(g: &Global, args: &SearchArgs, out: &mut dyn Write) -> Result<()> {
    let vector = args.vector.read()?;
    let mut s = Session::open(g)?;
    check_dim(&s, &vector)?;
    let k_max = s.hello.k_max;
    if args.k == 0 || args.k > k_max {
        return fail(format!("-k {}: {} allows 1..={k_max}", args.k, s.target));
    }
    if args.at_position.is_some() && s.client.version() < 5 {
        return fail(format!(
            "--at-position needs protocol version 5; {} speaks up to version {}",
            s.target,
            s.client.version()
        ));
    }
    let req = SearchRequest {
        bypass_cache: args.bypass,
        refresh_entry: args.refresh,
        at_position: args.at_position,
        ..SearchRequest::new(args.k, vector)
    };
    let t = Instant::now();
    let r = s
        .client
        .search_with(req)
        .map_err(|e| s.error("SEARCH", e))?;
    let took = t.elapsed();
    out.write_all(stats::search_reply(&r, args.k, took).as_bytes())?;
    Ok(())
}

fn insert(g: &Global, args: &InsertArgs, out: &mut dyn Write) -> Result<()> {
    let vector = args.vector.read()?;
    let mut s = Session::open(g)?;
    check_dim(&s, &vector)?;
    let position = s
        .client
        .insert_request_with_position(InsertRequest {
            id: args.id,
            vector,
            ..Default::default()
        })
        .map_err(|e| s.error("INSERT", e))?;
    writeln!(
        out,
        "OK: id {} inserted   {}",
        args.id,
        position_line(position)
    )?;
    Ok(())
}

fn delete(g: &Global, id: u64, out: &mut dyn Write) -> Result<()> {
    let mut s = Session::open(g)?;
    let d = s
        .client
        .delete_with_position(id)
        .map_err(|e| s.error("DELETE", e))?;
    let what = if d.existed {
        "deleted"
    } else {
        "was not there"
    };
    writeln!(out, "OK: id {id} {what}   {}", position_line(d.position))?;
    Ok(())
}

/// The first STATS, then one line per interval; `count` lines at most.
fn watch(g: &Global, interval: Duration, count: Option<u64>, out: &mut dyn Write) -> Result<()> {
    if interval.is_zero() {
        return fail("--interval-ms must be above 0");
    }
    let mut s = Session::open(g)?;
    let start = Instant::now();
    let mut prev = (Instant::now(), s.stats()?);
    let with_recall = prev.1.get("recall_estimate").is_some();
    writeln!(out, "{}", stats::watch_header(with_recall))?;
    out.flush()?;
    let mut next = prev.0 + interval;
    let mut lines = 0u64;
    while count.is_none_or(|n| lines < n) {
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
        // A slow STATS moves the schedule on rather than bunching the next lines up.
        next = (next + interval).max(Instant::now());
        let stats = match s.stats() {
            Ok(st) => st,
            // Closed under us (akerd's idle timeout at long intervals, a restart):
            // one new connection, then give up.
            Err(_) => {
                s = Session::open(g)?;
                s.stats()?
            }
        };
        let now = (Instant::now(), stats);
        let line = stats::watch_line(&prev.1, &now.1, now.0 - prev.0, now.0 - start, with_recall);
        writeln!(out, "{line}")?;
        out.flush()?;
        lines += 1;
        prev = now;
    }
    Ok(())
}
