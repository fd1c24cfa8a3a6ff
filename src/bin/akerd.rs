//! akerd: the aker cache server.
//!
//! ```text
//! akerd --demo                         # in-process demo over generated data, then exit
//! akerd --config ops/akerd.toml        # serve until SIGTERM / SIGINT
//! akerd --listen 127.0.0.1:7700 --executors 4 --cpus 0,2,4,6 --admin-listen off
//! ```
//!
//! Shutdown: the first SIGTERM or SIGINT stops accepting, lets in-flight requests answer
//! (`server.shutdown_grace_ms`) and exits 0; a second one exits at once.

// mimalloc, keeping the memory it frees: see allocator/src/lib.rs.
#[global_allocator]
static ALLOCATOR: aker_alloc::MiMalloc = aker_alloc::MiMalloc;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use aker::config::Config;
use aker::service::Daemon;
use clap::Parser;
use tracing_subscriber::EnvFilter;

#[derive(Parser, Debug)]
#[command(
    name = "akerd",
    version,
    about = "Approximate result cache server for vector search"
)]
struct Cli {
    /// TOML configuration (ops/akerd.toml is a commented example); defaults without it.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Override [server] listen (default 127.0.0.1:7700).
    #[arg(long, value_name = "ADDR")]
    listen: Option<SocketAddr>,
    /// Override [server] executors (one per core).
    #[arg(long, value_name = "N")]
    executors: Option<usize>,
    /// Pin executors to these CPUs, e.g. 0,2,4-7 (executor i on the i-th); sets
    /// executors to the count unless --executors is given.
    #[arg(long, value_name = "LIST")]
    cpus: Option<String>,
    /// Override [sharding] shards (0 = 2 x executors).
    #[arg(long, value_name = "N")]
    shards: Option<usize>,
    /// Override [admin] listen; "off" disables the metrics endpoint.
    #[arg(long, value_name = "ADDR|off")]
    admin_listen: Option<String>,
    /// Run the built-in demo (server + client workload in-process) and exit.
    #[arg(long)]
    demo: bool,
    /// Print the effective configuration (defaults filled in) and exit.
    #[arg(long)]
    print_config: bool,
    /// pgvector: drop this akerd's change-stream slot and publication, and exit (an
    /// akerd retired for good; a slot left behind holds WAL).
    #[arg(long)]
    drop_slot: bool,
    /// [cluster]: train new routing centroids on a fresh sample of the table, publish
    /// them as the cluster's next version, and exit (nodes switch while they run).
    #[arg(long)]
    cluster_retrain: bool,
}

fn parse_cpus(s: &str) -> Result<Vec<usize>, String> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let bad = || format!("bad CPU list element '{part}'");
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) =
                    (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
                if a > b {
                    return Err(bad());
                }
                out.extend(a..=b);
            }
            None => out.push(part.parse().map_err(|_| bad())?),
        }
    }
    if out.is_empty() {
        return Err("empty CPU list".into());
    }
    Ok(out)
}

fn apply_overrides(cfg: &mut Config, cli: &Cli) -> Result<(), String> {
    if let Some(l) = cli.listen {
        cfg.server.listen = l;
    }
    if let Some(c) = &cli.cpus {
        cfg.server.cpus = parse_cpus(c)?;
        cfg.server.executors = cfg.server.cpus.len();
    }
    if let Some(e) = cli.executors {
        cfg.server.executors = e;
    }
    if let Some(s) = cli.shards {
        cfg.sharding.shards = s;
    }
    match cli.admin_listen.as_deref() {
        None => {}
        Some("off" | "none" | "") => cfg.admin.enabled = false,
        Some(a) => {
            cfg.admin.listen = a.parse().map_err(|e| format!("--admin-listen {a}: {e}"))?;
            cfg.admin.enabled = true;
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(&cli);
    match run(&cli) {
        Ok(code) | Err(code) => code,
    }
}

/// Prints `akerd: {e}` and gives `code`: the one way a start-up step fails.
fn fail(e: impl std::fmt::Display, code: ExitCode) -> ExitCode {
    eprintln!("akerd: {e}");
    code
}

/// The steps in order; `Err` is a failure already reported.
fn run(cli: &Cli) -> Result<ExitCode, ExitCode> {
    let cfg = load_config(cli)?;
    memory_during_startup(&cfg);
    if cli.print_config {
        print!("{}", cfg.to_toml());
        return Ok(ExitCode::SUCCESS);
    }
    // Executors need io_uring: a refusal (seccomp, an old kernel) said in one line.
    if (cli.demo || !(cli.drop_slot || cli.cluster_retrain)) && !cli.print_config {
        if let Err(why) = aker::server::check_io_uring() {
            eprintln!("akerd: {why}");
            return Err(ExitCode::from(3));
        }
    }
    if cli.demo {
        keep_freed_memory();
        return Ok(run_demo(cli, &cfg));
    }
    if cli.cluster_retrain {
        return match aker::service::cluster_retrain(&cfg) {
            Ok(done) => {
                println!("{done}");
                Ok(ExitCode::SUCCESS)
            }
            Err(e) => Err(fail(e, ExitCode::FAILURE)),
        };
    }
    if cli.drop_slot {
        return match aker::service::drop_change_slot(&cfg) {
            Ok(done) => {
                println!("{done}");
                Ok(ExitCode::SUCCESS)
            }
            Err(e) => Err(fail(e, ExitCode::FAILURE)),
        };
    }
    preflight(&cfg)?;
    huge_pages(&cfg)?;
    // Signals first, so a SIGTERM during the (possibly long) index build is not lost.
    let signals = install_signals()?;
    prefault(&cfg)?;
    let daemon = Daemon::start(&cfg).map_err(|e| {
        tracing::error!("cannot start: {e}");
        fail(e, ExitCode::FAILURE)
    })?;
    keep_freed_memory();
    tracing::info!(
        listen = %daemon.local_addr(),
        admin = ?daemon.admin_addr(),
        "ready"
    );
    while !signals.term.load(Ordering::Acquire) {
        if signals.hup.swap(false, Ordering::AcqRel) {
            reload_tls(&daemon);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    tracing::info!("signal received; shutting down");
    match daemon.stop() {
        Ok(()) => {
            tracing::info!("stopped");
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            tracing::error!("shutdown: {e}");
            Err(ExitCode::FAILURE)
        }
    }
}

fn init_logging(cli: &Cli) {
    // The demo prints a table; keep the logs to warnings unless asked.
    let default_level = if cli.demo { "warn" } else { "info" };
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level)),
        )
        .with_writer(std::io::stderr)
        // Colours only on a terminal: journald and log files get plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

/// The file (or the defaults) with the command line's overrides applied.
fn load_config(cli: &Cli) -> Result<Config, ExitCode> {
    let mut cfg = match &cli.config {
        Some(path) => {
            let (c, deprecated) = Config::read(path).map_err(|e| fail(e, ExitCode::from(2)))?;
            // One line per old key name: the file loads, and says what to rename.
            for d in &deprecated {
                tracing::warn!(file = %path.display(), "{d}");
            }
            c
        }
        None => Config::default(),
    };
    apply_overrides(&mut cfg, cli).map_err(|e| fail(e, ExitCode::from(2)))?;
    Ok(cfg)
}

fn run_demo(cli: &Cli, cfg: &Config) -> ExitCode {
    // Only the topology overrides apply to the demo; it brings its own data.
    let executors = cli
        .executors
        .or(cli.cpus.as_ref().map(|_| cfg.server.executors));
    match aker::demo::run(&aker::demo::DemoOptions {
        executors,
        cpus: cfg.server.cpus.clone(),
        shards: cli.shards,
        ..Default::default()
    }) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("akerd --demo: {e}");
            ExitCode::FAILURE
        }
    }
}

/// What can be refused before the (possibly long) data load: the checks that need the
/// daemon's own parsers, and the secret (read again by the daemon; only whether it
/// loaded is logged).
fn preflight(cfg: &Config) -> Result<(), ExitCode> {
    aker::config::validate(cfg).map_err(|e| fail(e, ExitCode::from(2)))?;
    let secret = aker::auth::Secret::load(&cfg.auth).map_err(|e| fail(e, ExitCode::from(2)))?;
    tracing::info!(authentication = secret.is_some(), "auth");
    Ok(())
}

/// SIGTERM / SIGINT set `term`; a second one while it is set exits at once (code 1).
/// SIGHUP sets `hup` (the TLS files are read again).
struct Signals {
    term: Arc<AtomicBool>,
    hup: Arc<AtomicBool>,
}

fn install_signals() -> Result<Signals, ExitCode> {
    let term = Arc::new(AtomicBool::new(false));
    let hup = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGHUP, hup.clone()).map_err(|e| {
        fail(
            format!("cannot install a signal handler: {e}"),
            ExitCode::FAILURE,
        )
    })?;
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        let _ = signal_hook::flag::register_conditional_shutdown(sig, 1, term.clone());
        signal_hook::flag::register(sig, term.clone()).map_err(|e| {
            fail(
                format!("cannot install a signal handler: {e}"),
                ExitCode::FAILURE,
            )
        })?;
    }
    Ok(Signals { term, hup })
}

/// SIGHUP: the TLS certificate and key read again; a failure keeps the ones in force.
fn reload_tls(daemon: &Daemon) {
    let Some(tls) = daemon.server().tls() else {
        tracing::info!("SIGHUP: no [tls] to reload");
        return;
    };
    match tls.reload() {
        Ok(()) => tracing::info!("SIGHUP: TLS certificate and key reloaded"),
        Err(e) => tracing::error!("SIGHUP: TLS reload failed, the files in force stay: {e}"),
    }
}

/// `cache.huge_pages`: off for a small pool, before the threads start touching memory.
fn huge_pages(cfg: &Config) -> Result<(), ExitCode> {
    let on = cfg
        .cache
        .huge_pages_on()
        .map_err(|e| fail(e, ExitCode::from(2)))?;
    if on {
        return Ok(());
    }
    match aker_alloc::disable_huge_pages() {
        Ok(true) => tracing::info!("transparent huge pages off (cache.huge_pages)"),
        Ok(false) => tracing::info!("MIMALLOC_ALLOW_THP is set: it decides huge pages"),
        // Memory use, not correctness: say so and go on.
        Err(e) => tracing::warn!("cannot turn transparent huge pages off: {e}"),
    }
    Ok(())
}

/// In front of a database (pgvector, cache-aside) start-up's temporaries (a table
/// sample, k-means) go back to the kernel as they are freed: 9.5 MiB of 24 with an empty
/// pool. The embedded store's start is an index build whose churn purging would fault
/// in again (GloVe, 400,000 x 50: 80-81 s to ready keeping, 89-94 s purging, for 95 MB
/// less resident): it keeps from the start. Either way `keep_freed_memory` holds once
/// serving. See allocator/src/lib.rs.
fn memory_during_startup(cfg: &Config) {
    if cfg.backend.kind == aker::config::BackendKind::Embedded {
        keep_freed_memory();
    } else {
        aker_alloc::release_freed_memory();
    }
}

/// From here on the allocator keeps what is freed (an admission's evictions serve the
/// next admission without faults).
fn keep_freed_memory() {
    let purge_delay_ms = aker_alloc::keep_freed_memory();
    tracing::debug!(
        purge_delay_ms,
        "allocator: mimalloc; freed memory returned to the kernel after this delay (-1: never)"
    );
}

/// `cache.prefault_bytes`: refused past the machine's memory, else faulted in now.
fn prefault(cfg: &Config) -> Result<(), ExitCode> {
    let bytes = cfg.cache.prefault_bytes;
    if bytes == 0 {
        return Ok(());
    }
    if let Some(total) = memory_total_bytes().filter(|&total| bytes > total) {
        return Err(fail(
            format!(
                "cache.prefault_bytes = {bytes} is more than this machine's memory \
                 ({total} bytes)"
            ),
            ExitCode::from(2),
        ));
    }
    // What it touches must stay: keep freed memory from here on (start-up's
    // temporaries too, which the cache's growth then reuses).
    keep_freed_memory();
    let took = aker_alloc::prefault(bytes);
    tracing::info!(
        bytes,
        ms = took.as_millis() as u64,
        "memory faulted in and kept for the cache's growth (cache.prefault_bytes)"
    );
    Ok(())
}

/// `MemTotal` of /proc/meminfo, in bytes (None where it cannot be read).
fn memory_total_bytes() -> Option<usize> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpus("0,2,4-6").unwrap(), vec![0, 2, 4, 5, 6]);
        assert!(parse_cpus("3-1").is_err());
        assert!(parse_cpus("x").is_err());
        assert!(parse_cpus("").is_err());
    }

    #[test]
    fn overrides_apply() {
        let cli = Cli::parse_from([
            "akerd",
            "--listen",
            "127.0.0.1:9",
            "--cpus",
            "1-3",
            "--shards",
            "5",
            "--admin-listen",
            "off",
        ]);
        let mut cfg = Config::default();
        apply_overrides(&mut cfg, &cli).unwrap();
        assert_eq!(cfg.server.listen.port(), 9);
        assert_eq!((cfg.server.executors, cfg.server.cpus.len()), (3, 3));
        assert_eq!(cfg.sharding.shards, 5);
        assert!(!cfg.admin.enabled);
    }
}
