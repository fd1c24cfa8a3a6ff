//! The akerd a long-running check drives (`aker-soak`, `aker-overload`): started by the
//! tool from a binary and a config file, and stopped when it ends, or attached by
//! address and pid. Its resident memory comes from `/proc/<pid>/status`.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use aker::auth::Secret;
use aker::client::{Client, ClientError, ClientOptions};

/// How often a starting daemon is tried.
const READY_POLL: Duration = Duration::from_millis(100);
/// How long a stopping daemon gets after SIGTERM before it is killed (it writes its
/// cache snapshot on the way out when it has a data directory).
const STOP_GRACE: Duration = Duration::from_secs(30);

pub struct Daemon {
    pub target: SocketAddr,
    /// For the RSS samples; `None` when attached without one.
    pub pid: Option<u32>,
    child: Option<Child>,
}

impl Daemon {
    /// Starts `bin --config config --listen target --admin-listen off` and waits until
    /// it answers a HELLO (at most `ready_within`: a debug build generating its
    /// collection takes a while). With `cpus` (a `taskset` list) every thread of it,
    /// backend threads included, runs on those CPUs only.
    pub fn spawn(
        bin: &Path,
        config: &Path,
        target: SocketAddr,
        ready_within: Duration,
        cpus: Option<&str>,
    ) -> Result<Daemon, String> {
        // taskset execs the daemon, so the pid is the daemon's.
        let mut cmd = match cpus {
            Some(list) => {
                let mut c = Command::new("taskset");
                c.arg("-c").arg(list).arg(bin);
                c
            }
            None => Command::new(bin),
        };
        let child = cmd
            .arg("--config")
            .arg(config)
            .arg("--listen")
            .arg(target.to_string())
            .arg("--admin-listen")
            .arg("off")
            .stdin(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
        let mut d = Daemon {
            target,
            pid: Some(child.id()),
            child: Some(child),
        };
        let deadline = Instant::now() + ready_within;
        loop {
            if let Some(status) = d.exited() {
                return Err(format!("akerd exited during start: {status}"));
            }
            // Answering HELLO is ready (asking for AUTH too: the tool brings a secret; a
            // TLS port's plaintext refusal too: the tool brings its TLS).
            match connect(target, Duration::from_secs(2), None, None) {
                Ok(_) | Err(ClientError::AuthRequired) => return Ok(d),
                Err(ClientError::Server {
                    request_id: 0,
                    status: aker::protocol::Status::BadRequest,
                    message,
                }) if message.contains("requires TLS") => return Ok(d),
                Err(_) => {}
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "akerd did not answer on {target} within {ready_within:?}"
                ));
            }
            std::thread::sleep(READY_POLL);
        }
    }

    /// A daemon someone else runs.
    pub fn attach(target: SocketAddr, pid: Option<u32>) -> Daemon {
        Daemon {
            target,
            pid,
            child: None,
        }
    }

    /// The exit status when a daemon this tool started has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// Resident set size in bytes (`VmRSS`); `None` without a pid or once it is gone.
    pub fn rss_bytes(&self) -> Option<u64> {
        proc_status_kib(self.pid?, "VmRSS:").map(|kib| kib * 1024)
    }

    /// Peak resident set size in bytes (`VmHWM`).
    pub fn rss_peak_bytes(&self) -> Option<u64> {
        proc_status_kib(self.pid?, "VmHWM:").map(|kib| kib * 1024)
    }

    /// SIGTERM, then a wait of at most [`STOP_GRACE`], then SIGKILL. Attached: nothing.
    pub fn stop(mut self) -> Result<Option<ExitStatus>, String> {
        let Some(mut child) = self.child.take() else {
            return Ok(None);
        };
        // SAFETY: kill(2) on our own child's pid; no memory is involved.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + STOP_GRACE;
        loop {
            match child.try_wait() {
                Ok(Some(s)) => return Ok(Some(s)),
                Ok(None) if Instant::now() < deadline => std::thread::sleep(READY_POLL),
                _ => {
                    let _ = child.kill();
                    let s = child.wait().map_err(|e| e.to_string())?;
                    return Err(format!("akerd ignored SIGTERM for {STOP_GRACE:?}: {s}"));
                }
            }
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The command-line options `aker-soak` and `aker-overload` share: the akerd to start
/// or attach to, and the secret to authenticate with.
#[derive(clap::Args, Debug)]
pub struct DaemonArgs {
    /// Start this akerd binary (with --config) and stop it at the end.
    #[arg(long, requires = "config", conflicts_with = "pid")]
    pub akerd: Option<std::path::PathBuf>,
    /// Its configuration (ops/soak.toml, ops/overload.toml).
    #[arg(long)]
    pub config: Option<std::path::PathBuf>,
    /// Attached to a running akerd: its pid, for the RSS samples.
    #[arg(long)]
    pub pid: Option<u32>,
    /// The shared secret for a server that requires AUTH: this file's first line
    /// (otherwise $AKER_SECRET when set).
    #[arg(long, value_name = "FILE")]
    pub secret_file: Option<std::path::PathBuf>,
    /// TLS to an akerd with [tls]: trust the CA certificates in this PEM file.
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<std::path::PathBuf>,
    /// The name the server's certificate must carry (default: the target's address).
    #[arg(long, value_name = "NAME", requires = "tls_ca")]
    pub tls_server_name: Option<String>,
    /// Mutual TLS: this client certificate (PEM, then its chain) ...
    #[arg(long, value_name = "FILE", requires_all = ["tls_ca", "tls_key"])]
    pub tls_cert: Option<std::path::PathBuf>,
    /// ... and its private key.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<std::path::PathBuf>,
    /// How long a started akerd may take to answer.
    #[arg(long, value_parser = crate::parse_duration, default_value = "120s")]
    pub ready_within: Duration,
    /// Run the started akerd on these CPUs only (a taskset list: 0 or 0,2-3).
    #[arg(long, requires = "akerd")]
    pub akerd_cpus: Option<String>,
}

impl DaemonArgs {
    /// The akerd on `target`: started (`--akerd`) or attached.
    pub fn start(&self, target: SocketAddr) -> Result<Daemon, String> {
        match &self.akerd {
            Some(bin) => Daemon::spawn(
                bin,
                self.config.as_deref().expect("clap requires it"),
                target,
                self.ready_within,
                self.akerd_cpus.as_deref(),
            ),
            None => Ok(Daemon::attach(target, self.pid)),
        }
    }

    pub fn secret(&self) -> Result<Option<Secret>, String> {
        crate::load_secret(self.secret_file.as_deref())
    }

    /// `--tls-*` as the connections' TLS (None without `--tls-ca`).
    pub fn tls(&self, target: SocketAddr) -> Result<Option<aker::client::ClientTls>, String> {
        let Some(ca) = &self.tls_ca else {
            return Ok(None);
        };
        let name = self
            .tls_server_name
            .clone()
            .unwrap_or_else(|| target.ip().to_string());
        let identity = self.tls_cert.as_deref().zip(self.tls_key.as_deref());
        aker::client::ClientTls::from_files(ca, &name, identity)
            .map(Some)
            .map_err(|e| e.to_string())
    }
}

/// A connected client that has said HELLO (and AUTH, when the server requires it), over
/// TLS with `tls`.
pub fn connect(
    target: SocketAddr,
    io_timeout: Duration,
    secret: Option<&Secret>,
    tls: Option<&aker::client::ClientTls>,
) -> aker::client::Result<Client> {
    let mut c = Client::connect_with(
        target,
        ClientOptions {
            connect_timeout: io_timeout,
            io_timeout: Some(io_timeout),
            secret: secret.cloned(),
            tls: tls.cloned(),
            ..Default::default()
        },
    )?;
    c.hello()?;
    Ok(c)
}

/// One `kB` field of `/proc/<pid>/status`.
fn proc_status_kib(pid: u32, field: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = text.lines().find(|l| l.starts_with(field))?;
    line[field.len()..].split_whitespace().next()?.parse().ok()
}

/// A numeric field of the STATS text (`name value` lines).
pub fn stat(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        let mut it = l.split_whitespace();
        (it.next()? == name).then(|| it.next()?.parse().ok())?
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_rss_is_read_and_stats_fields_parse() {
        let me = Daemon::attach("127.0.0.1:1".parse().unwrap(), Some(std::process::id()));
        let rss = me.rss_bytes().expect("own VmRSS");
        assert!(rss > 1 << 20, "{rss}");
        assert!(me.rss_peak_bytes().unwrap() >= rss);
        assert_eq!(Daemon::attach(me.target, None).rss_bytes(), None);
        let text = "cache_entries 12\nserver_connections_current 3\nname text\n";
        assert_eq!(stat(text, "server_connections_current"), Some(3.0));
        assert_eq!(stat(text, "cache_entries"), Some(12.0));
        assert_eq!(stat(text, "name"), None);
        assert_eq!(stat(text, "cache"), None);
    }
}
