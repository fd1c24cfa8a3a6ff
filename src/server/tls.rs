//! TLS to clients: the certificate files, the handshake, and what a plaintext client on
//! the TLS port is told.
//!
//! ```text
//!  accept ─► handshake token (rate bound, per executor) ─► first bytes
//!              │                                            ├─ "AK" (the protocol's magic): one
//!              │                                            │   plaintext error frame, close
//!              └─ none within the handshake timeout: close  └─ else rustls handshake ─► Io::tls
//! ```
//!
//! The files are read at start and on `reload` (SIGHUP): a reload that fails keeps the
//! configuration in force and says why; connections already open keep their sessions.

use std::cell::Cell;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use futures_lite::{future, AsyncReadExt, AsyncWriteExt};
use glommio::net::TcpStream;
use glommio::timer::Timer;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig, ServerConnection};

use super::transport::TlsStream;
use crate::protocol::MAGIC;

/// `[tls]` as the server uses it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM: the server's certificate, then its chain.
    pub cert_file: PathBuf,
    /// PEM: the certificate's private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
    /// PEM: with it, every client must present a certificate that chains to one of
    /// these (mutual TLS).
    pub client_ca_file: Option<PathBuf>,
}

/// The server side's TLS: the configuration in force, swapped whole on reload.
pub struct TlsAcceptor {
    files: TlsFiles,
    config: RwLock<Arc<ServerConfig>>,
    /// Longest a handshake (from accept to its end) may take.
    pub(crate) handshake_timeout: Duration,
    /// New handshakes per second per executor, at most.
    pub(crate) handshakes_per_s_max: u32,
}

impl std::fmt::Debug for TlsAcceptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsAcceptor")
            .field("files", &self.files)
            .field("handshake_timeout", &self.handshake_timeout)
            .field("handshakes_per_s_max", &self.handshakes_per_s_max)
            .finish()
    }
}

/// rustls with its `ring` provider (aws-lc-rs needs cmake and builds slowly): its
/// classical key exchanges (X25519, P-256, P-384), no post-quantum hybrid. Every TLS
/// akerd speaks uses it: the client port, the clients, PostgreSQL.
pub(crate) fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    #[allow(deprecated)] // the note says: no post-quantum key exchange with ring
    Arc::new(rustls::crypto::ring::default_provider())
}

/// TLS 1.3 and 1.2, everywhere akerd speaks TLS.
pub(crate) const VERSIONS: &[&rustls::SupportedProtocolVersion] =
    &[&rustls::version::TLS13, &rustls::version::TLS12];

fn read_err(path: &Path, what: &str, e: impl std::fmt::Display) -> String {
    format!("{what} {}: {e}", path.display())
}

/// Every certificate in a PEM file (at least one).
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| read_err(path, "cannot read certificates from", e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| read_err(path, "bad certificate PEM in", e))?;
    if certs.is_empty() {
        return Err(format!("no certificate in {}", path.display()));
    }
    Ok(certs)
}

/// The first private key in a PEM file.
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| read_err(path, "no usable private key in", e))
}

/// A root store of every certificate in a PEM file.
pub fn load_roots(path: &Path) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    for c in load_certs(path)? {
        roots
            .add(c)
            .map_err(|e| read_err(path, "unusable CA certificate in", e))?;
    }
    Ok(roots)
}

impl TlsFiles {
    /// Reads the files into a rustls configuration (TLS 1.2 and 1.3).
    pub fn load(&self) -> Result<ServerConfig, String> {
        let certs = load_certs(&self.cert_file)?;
        let key = load_key(&self.key_file)?;
        let builder = ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(VERSIONS)
            .map_err(|e| format!("TLS versions: {e}"))?;
        let builder = match &self.client_ca_file {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                let verifier = WebPkiClientVerifier::builder_with_provider(
                    Arc::new(load_roots(ca)?),
                    provider(),
                )
                .build()
                .map_err(|e| read_err(ca, "client CA", e))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        builder.with_single_cert(certs, key).map_err(|e| {
            format!(
                "{} with {}: {e}",
                self.cert_file.display(),
                self.key_file.display()
            )
        })
    }
}

impl TlsAcceptor {
    /// Reads the files now: a start with a bad certificate or key fails here.
    pub fn new(
        files: TlsFiles,
        handshake_timeout: Duration,
        handshakes_per_s_max: u32,
    ) -> Result<TlsAcceptor, String> {
        let config = files.load()?;
        Ok(TlsAcceptor {
            files,
            config: RwLock::new(Arc::new(config)),
            handshake_timeout,
            handshakes_per_s_max,
        })
    }

    /// Reads the files again; on success new handshakes use them, on failure the old
    /// ones stay and the error says why. Open connections are not touched.
    pub fn reload(&self) -> Result<(), String> {
        let config = self.files.load()?;
        *self.config.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(config);
        Ok(())
    }

    /// Mutual TLS: every client presents a certificate.
    pub fn requires_client_certificates(&self) -> bool {
        self.files.client_ca_file.is_some()
    }

    pub(crate) fn config(&self) -> Arc<ServerConfig> {
        self.config
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// Per executor: when the next handshake may start. Each waiter reserves its own slot
/// (a generic cell rate: slots `1 / rate` apart, up to one second's worth at once after
/// a quiet spell), so waiters start in arrival order with one timer wake each, and one
/// whose slot falls past its deadline takes none.
#[derive(Debug)]
pub(crate) struct HandshakeTokens {
    interval: Duration,
    /// The next free slot; at most `BURST` in the past.
    next: Cell<Instant>,
}

/// How far behind `now` the next slot may fall: a second's worth of handshakes may
/// start at once after a quiet spell.
const BURST: Duration = Duration::from_secs(1);

impl HandshakeTokens {
    pub(crate) fn new(per_s: u32) -> HandshakeTokens {
        let interval = Duration::from_secs(1) / per_s.max(1);
        let t = HandshakeTokens {
            interval,
            next: Cell::new(Instant::now()),
        };
        t.next.set(t.floor(Instant::now()));
        t
    }

    /// The earliest the next slot may be: `per_s` slots at or before `now`.
    fn floor(&self, now: Instant) -> Instant {
        now.checked_sub(BURST.saturating_sub(self.interval))
            .unwrap_or(now)
    }

    /// The slot a handshake arriving at `now` gets, or `None` when it would fall after
    /// `deadline` (nothing reserved then).
    fn reserve(&self, now: Instant, deadline: Instant) -> Option<Instant> {
        let floor = self.floor(now);
        let slot = self.next.get().max(floor);
        if slot > deadline {
            return None;
        }
        self.next.set(slot + self.interval);
        Some(slot)
    }

    /// Waits for this handshake's slot; false when none is free before `deadline`.
    async fn take(&self, deadline: Instant) -> bool {
        let now = Instant::now();
        match self.reserve(now, deadline) {
            None => false,
            Some(slot) => {
                if slot > now {
                    Timer::new(slot - now).await;
                }
                true
            }
        }
    }
}

/// How a TLS accept ended.
pub(crate) enum Accepted {
    Tls(Box<TlsStream>),
    /// The peer spoke this protocol in clear: told so in one plaintext frame, closed.
    Plaintext,
    /// The peer closed before sending anything (a health check, a port scan).
    Closed,
    /// No handshake slot or no handshake within the timeout.
    TimedOut,
    Failed(io::Error),
}

/// `f`, unless `deadline` comes first.
async fn within<T>(deadline: Instant, f: impl std::future::Future<Output = T>) -> Option<T> {
    future::or(async { Some(f.await) }, async {
        Timer::new(deadline.saturating_duration_since(Instant::now())).await;
        None
    })
    .await
}

/// The first two bytes: a TLS record starts 0x16 0x03, this protocol's frames "AK".
async fn first_bytes(tcp: &mut TcpStream) -> io::Result<[u8; 2]> {
    let mut first = [0u8; 2];
    let mut got = 0;
    while got < first.len() {
        match tcp.read(&mut first[got..]).await? {
            0 => return Err(io::ErrorKind::UnexpectedEof.into()),
            n => got += n,
        }
    }
    Ok(first)
}

/// The handshake of one accepted connection, bounded by the acceptor's timeout. The
/// first bytes are read before a handshake slot is taken: a connection that sends
/// nothing, or speaks in clear, spends none.
pub(crate) async fn accept(
    acceptor: &TlsAcceptor,
    tokens: &HandshakeTokens,
    mut tcp: TcpStream,
) -> Accepted {
    let deadline = Instant::now() + acceptor.handshake_timeout;
    let first = match within(deadline, first_bytes(&mut tcp)).await {
        None => return Accepted::TimedOut,
        Some(Err(e)) if e.kind() == io::ErrorKind::UnexpectedEof => return Accepted::Closed,
        Some(Err(e)) => return Accepted::Failed(e),
        Some(Ok(first)) => first,
    };
    if first == MAGIC.to_le_bytes() {
        // Its own bounds (the socket's write timeout, a 500 ms linger), outside the
        // handshake's: the frame should not be cut off by a deadline nearly spent.
        tell_plaintext_client(&mut tcp).await;
        return Accepted::Plaintext;
    }
    if !tokens.take(deadline).await {
        return Accepted::TimedOut;
    }
    let mut session = match ServerConnection::new(acceptor.config()) {
        Ok(s) => s,
        Err(e) => return Accepted::Failed(io::Error::other(e)),
    };
    if let Err(e) = session.read_tls(&mut &first[..]) {
        return Accepted::Failed(e);
    }
    match within(deadline, drive_handshake(&mut tcp, &mut session)).await {
        None => Accepted::TimedOut,
        Some(Ok(())) => Accepted::Tls(Box::new(TlsStream::new(tcp, session))),
        Some(Err(e)) => Accepted::Failed(e),
    }
}

/// Reads and writes until the handshake is done (one task owns the socket here).
async fn drive_handshake(tcp: &mut TcpStream, session: &mut ServerConnection) -> io::Result<()> {
    let mut buf = vec![0u8; 16 * 1024];
    // Bounded: every pass reads or writes bytes, and the caller's timeout ends it.
    loop {
        let processed = session.process_new_packets();
        // What the session has to send (the next flight, or the alert of a failure).
        while session.wants_write() {
            let mut out = Vec::new();
            session.write_tls(&mut out)?;
            tcp.write_all(&out).await?;
        }
        if let Err(e) = processed {
            return Err(io::Error::new(io::ErrorKind::InvalidData, e));
        }
        if !session.is_handshaking() {
            return Ok(());
        }
        let n = tcp.read(&mut buf).await?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let mut chunk = &buf[..n];
        while !chunk.is_empty() {
            if session.read_tls(&mut chunk)? == 0 {
                break;
            }
            if let Err(e) = session.process_new_packets() {
                // Send the alert before giving up.
                let mut out = Vec::new();
                let _ = session.write_tls(&mut out);
                let _ = tcp.write_all(&out).await;
                return Err(io::Error::new(io::ErrorKind::InvalidData, e));
            }
        }
    }
}

/// One plaintext error frame (request id 0) that says the port speaks TLS, then close.
async fn tell_plaintext_client(tcp: &mut TcpStream) {
    use crate::protocol::{encode_reply, Reply, ReplyFrame, Status, CONNECTION_OP, VERSION_MIN};
    let frame = ReplyFrame {
        request_id: 0,
        version: VERSION_MIN,
        reply: Reply::error(
            CONNECTION_OP,
            Status::BadRequest,
            "this port requires TLS: connect with TLS (the server has [tls] set)",
        ),
    };
    let mut bytes = Vec::new();
    if encode_reply(&frame, &mut bytes).is_ok() {
        let _ = tcp.write_all(&bytes).await;
        let _ = tcp.flush().await;
    }
    // Read what the client already sent (bounded) so the close is a FIN, not a reset
    // that could drop the frame before the client reads it.
    let _ = tcp.shutdown(std::net::Shutdown::Write).await;
    let mut sink = [0u8; 4096];
    let mut left = 64 * 1024usize;
    let _ = future::or(
        async {
            while left > 0 {
                match tcp.read(&mut sink).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => left = left.saturating_sub(n),
                }
            }
        },
        async {
            Timer::new(Duration::from_millis(500)).await;
        },
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A second's worth at once after a quiet spell, then one slot per interval, in
    /// order; a slot past the deadline is refused and reserves nothing.
    #[test]
    fn handshake_slots_are_spaced_by_the_rate_and_a_refusal_takes_none() {
        let t = HandshakeTokens::new(10);
        let now = Instant::now() + Duration::from_secs(5);
        let far = now + Duration::from_secs(60);
        for _ in 0..10 {
            assert!(
                t.reserve(now, far).unwrap() <= now,
                "the burst starts at once"
            );
        }
        let s11 = t.reserve(now, far).unwrap();
        assert!(
            s11 > now && s11 <= now + Duration::from_millis(100),
            "{:?}",
            s11 - now
        );
        let s12 = t.reserve(now, far).unwrap();
        assert_eq!(s12 - s11, Duration::from_millis(100));
        // A deadline before the next slot: refused, and the slot stays free.
        assert!(t.reserve(now, now).is_none());
        assert_eq!(
            t.reserve(now, far).unwrap() - s12,
            Duration::from_millis(100)
        );
        // After a quiet spell the burst is back, but no more than a second's worth.
        let later = now + Duration::from_secs(30);
        let burst = (0..50)
            .take_while(|_| t.reserve(later, far).unwrap() <= later)
            .count();
        assert_eq!(burst, 10);
        // (take_while consumed the 11th, the first in the future.)
    }
}
