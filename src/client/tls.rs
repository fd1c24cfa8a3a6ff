//! TLS for the clients: which servers to trust, the name to check, and an optional
//! client certificate (mutual TLS); and the stream the clients read and write, plain or
//! TLS over `std::net::TcpStream`.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};

use super::{ClientError, Result};
use crate::server::tls::{load_certs, load_key, load_roots};

/// TLS to a server with `[tls]` ([`super::ClientOptions::tls`]).
///
/// ```no_run
/// # fn main() -> Result<(), aker::client::ClientError> {
/// use aker::client::{Client, ClientOptions, ClientTls};
///
/// let tls = ClientTls::with_ca_file("ca.crt".as_ref(), "aker.example.com")?;
/// // Mutual TLS: .identity("client.crt".as_ref(), "client.key".as_ref())?
/// let opts = ClientOptions { tls: Some(tls), ..ClientOptions::default() };
/// let mut c = Client::connect_with("aker.example.com:7700", opts)?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct ClientTls {
    /// `None` for a caller's own configuration (`from_config`).
    roots: Option<Arc<RootCertStore>>,
    identity: Option<Arc<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>>,
    server_name: ServerName<'static>,
    config: Arc<ClientConfig>,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field("roots", &self.roots.as_ref().map(|r| r.len()))
            .field("client_certificate", &self.identity.is_some())
            .field("server_name", &self.server_name)
            .finish()
    }
}

fn tls_err(e: impl std::fmt::Display) -> ClientError {
    ClientError::Tls(e.to_string())
}

impl ClientTls {
    /// Trusts the CA certificates in a PEM file, and checks the server's certificate
    /// against `server_name` (a DNS name or an IP address in its subject alternative
    /// names).
    pub fn with_ca_file(ca_file: &Path, server_name: &str) -> Result<ClientTls> {
        let roots = load_roots(ca_file).map_err(ClientError::Tls)?;
        ClientTls::with_roots(roots, server_name)
    }

    /// The host part of a `HOST:PORT` target (an IPv6 literal's brackets dropped): the
    /// name the tools check the certificate against when none is given.
    pub fn host_of(target: &str) -> &str {
        let host = target.rsplit_once(':').map_or(target, |(h, _)| h);
        host.trim_start_matches('[').trim_end_matches(']')
    }

    /// What the tools' flags give (`--tls-ca`, a server name, `--tls-cert` / `--tls-key`).
    pub fn from_files(
        ca_file: &Path,
        server_name: &str,
        identity: Option<(&Path, &Path)>,
    ) -> Result<ClientTls> {
        let tls = ClientTls::with_ca_file(ca_file, server_name)?;
        match identity {
            Some((cert, key)) => tls.identity(cert, key),
            None => Ok(tls),
        }
    }

    /// Trusts `roots`.
    pub fn with_roots(roots: RootCertStore, server_name: &str) -> Result<ClientTls> {
        let server_name = ServerName::try_from(server_name.to_string()).map_err(tls_err)?;
        let roots = Arc::new(roots);
        let config = build(&roots, None)?;
        Ok(ClientTls {
            roots: Some(roots),
            identity: None,
            server_name,
            config,
        })
    }

    /// Presents this certificate (then its chain) and key: for a server with
    /// `tls.client_ca_file` (mutual TLS). Not for a configuration of the caller's own
    /// (`from_config`): its client certificate belongs in it.
    pub fn identity(mut self, cert_file: &Path, key_file: &Path) -> Result<ClientTls> {
        let Some(roots) = &self.roots else {
            return Err(ClientError::Tls(
                "identity() on a ClientTls::from_config: put the client certificate in that \
                 rustls ClientConfig (with_client_auth_cert)"
                    .into(),
            ));
        };
        let certs = load_certs(cert_file).map_err(ClientError::Tls)?;
        let key = load_key(key_file).map_err(ClientError::Tls)?;
        let identity = Arc::new((certs, key));
        self.config = build(roots, Some(&identity))?;
        self.identity = Some(identity);
        Ok(self)
    }

    /// A rustls configuration of the caller's own (its own verifier, resumption, ...).
    pub fn from_config(config: Arc<ClientConfig>, server_name: &str) -> Result<ClientTls> {
        let server_name = ServerName::try_from(server_name.to_string()).map_err(tls_err)?;
        Ok(ClientTls {
            roots: None,
            identity: None,
            server_name,
            config,
        })
    }

    /// Starts TLS over `tcp` and completes the handshake within `timeout`.
    pub(crate) fn connect(&self, tcp: TcpStream, timeout: Duration) -> Result<Stream> {
        let conn = ClientConnection::new(self.config.clone(), self.server_name.clone())
            .map_err(tls_err)?;
        let mut s = StreamOwned::new(conn, tcp);
        let deadline = Instant::now() + timeout;
        // Bounded by the deadline: each pass moves handshake bytes or times out.
        while s.conn.is_handshaking() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(ClientError::Timeout);
            }
            s.sock.set_read_timeout(Some(left))?;
            s.sock.set_write_timeout(Some(left))?;
            match s.conn.complete_io(&mut s.sock) {
                Ok((0, 0)) if s.conn.is_handshaking() => return Err(ClientError::Closed),
                Ok(_) => {}
                Err(e) => return Err(io_or_tls(e)),
            }
        }
        Ok(Stream::Tls(Box::new(s)))
    }
}

fn build(
    roots: &Arc<RootCertStore>,
    identity: Option<&Arc<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>>,
) -> Result<Arc<ClientConfig>> {
    let builder = ClientConfig::builder_with_provider(crate::server::tls::provider())
        .with_protocol_versions(crate::server::tls::VERSIONS)
        .map_err(tls_err)?
        .with_root_certificates(roots.clone());
    let config = match identity {
        None => builder.with_no_client_auth(),
        Some(id) => builder
            .with_client_auth_cert(id.0.clone(), id.1.clone_key())
            .map_err(tls_err)?,
    };
    Ok(Arc::new(config))
}

/// A TLS failure (a certificate refused, an alert) reads as [`ClientError::Tls`], a
/// socket's as the I/O error it is.
pub(crate) fn io_or_tls(e: io::Error) -> ClientError {
    let tls = e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        .map(|t| t.to_string());
    match tls {
        Some(t) => ClientError::Tls(t),
        None if matches!(
            e.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
        ) =>
        {
            ClientError::Timeout
        }
        None => ClientError::Io(e),
    }
}

/// What a client reads and writes.
pub(crate) enum Stream {
    Plain(TcpStream),
    Tls(Box<StreamOwned<ClientConnection, TcpStream>>),
}

impl Stream {
    /// The socket under it (timeouts, addresses).
    pub(crate) fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) => s,
            Stream::Tls(s) => &s.sock,
        }
    }

    pub(crate) fn is_tls(&self) -> bool {
        matches!(self, Stream::Tls(_))
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            Stream::Tls(s) => match s.read(buf) {
                // TCP closed without close_notify: the end all the same (framing
                // notices a cut frame).
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(0),
                r => r,
            },
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(buf),
            Stream::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Plain(s) => s.flush(),
            Stream::Tls(s) => s.flush(),
        }
    }
}

/// A connection split for a thread that reads and a thread that writes (the load
/// generator's shape), each on its own clone of the socket ([`super::Client::into_split`]).
/// With TLS both halves share the one session behind a mutex; socket reads happen outside
/// it, and only the writing half ever writes the socket (what the reading half's records
/// produce to send waits for the next write), so neither half blocks on the socket while
/// holding the session.
pub enum SplitRead {
    Plain(TcpStream),
    Tls(TlsReadHalf),
}

/// The writing half (see [`SplitRead`]).
pub enum SplitWrite {
    Plain(TcpStream),
    Tls(TlsWriteHalf),
}

type SharedSession = Arc<std::sync::Mutex<ClientConnection>>;

fn session(s: &SharedSession) -> std::sync::MutexGuard<'_, ClientConnection> {
    s.lock().unwrap_or_else(|p| p.into_inner())
}

pub struct TlsReadHalf {
    tcp: TcpStream,
    session: SharedSession,
    /// Bytes read off the socket; `raw[pos..len]` not yet taken by the session.
    raw: Vec<u8>,
    pos: usize,
    len: usize,
}

pub struct TlsWriteHalf {
    tcp: TcpStream,
    session: SharedSession,
    out: Vec<u8>,
    /// A write failed part way: the session is ahead of the socket, so every later
    /// write fails too.
    poisoned: bool,
}

/// Splits a connected stream (nothing buffered in the client): the halves and a clone of
/// the socket for timeouts and shutdown.
pub(crate) fn split(stream: Stream) -> io::Result<(SplitRead, SplitWrite, TcpStream)> {
    match stream {
        Stream::Plain(s) => Ok((
            SplitRead::Plain(s.try_clone()?),
            SplitWrite::Plain(s.try_clone()?),
            s,
        )),
        Stream::Tls(owned) => {
            let StreamOwned { mut conn, sock } = *owned;
            // The writing half drains every record it makes at once: no limit needed,
            // and a full buffer would turn a large write into a partial one.
            conn.set_buffer_limit(None);
            let shared = Arc::new(std::sync::Mutex::new(conn));
            Ok((
                SplitRead::Tls(TlsReadHalf {
                    tcp: sock.try_clone()?,
                    session: shared.clone(),
                    raw: vec![0; 16 * 1024],
                    pos: 0,
                    len: 0,
                }),
                SplitWrite::Tls(TlsWriteHalf {
                    tcp: sock.try_clone()?,
                    session: shared,
                    out: Vec::new(),
                    poisoned: false,
                }),
                sock,
            ))
        }
    }
}

impl Read for TlsReadHalf {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        // Bounded: each pass returns plaintext, feeds the session bytes it has not
        // taken yet, or reads the socket (whose read timeout and end of stream end the
        // wait).
        loop {
            match session(&self.session).reader().read(buf) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(0),
                Err(e) => return Err(e),
            }
            if self.pos < self.len {
                // Only with no plaintext waiting: rustls refuses more bytes once 16 KiB
                // of plaintext are unread, so what it does not take stays here.
                let mut s = session(&self.session);
                let mut chunk = &self.raw[self.pos..self.len];
                let before = chunk.len();
                match s.read_tls(&mut chunk)? {
                    // close_notify came: nothing after it counts.
                    0 => self.pos = self.len,
                    _ => self.pos += before - chunk.len(),
                }
                s.process_new_packets()
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                continue;
            }
            let n = self.tcp.read(&mut self.raw)?;
            if n == 0 {
                return Ok(0);
            }
            (self.pos, self.len) = (0, n);
        }
    }
}

impl Write for TlsWriteHalf {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.poisoned {
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "an earlier write failed part way: the TLS session is unusable",
            ));
        }
        self.out.clear();
        {
            let mut s = session(&self.session);
            s.writer().write_all(buf)?;
            while s.wants_write() {
                s.write_tls(&mut self.out)?;
            }
        }
        // Outside the session: the reading half is never held up by a full socket.
        // (Records the reading half's processing produced, an alert say, go out here
        // too, in order: they were queued under the same lock.)
        if let Err(e) = self.tcp.write_all(&self.out) {
            self.poisoned = true;
            return Err(e);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl SplitRead {
    /// Shuts the socket down both ways (wakes a blocked reader or writer).
    pub fn shutdown(&self) -> io::Result<()> {
        match self {
            SplitRead::Plain(s) => s.shutdown(std::net::Shutdown::Both),
            SplitRead::Tls(t) => t.tcp.shutdown(std::net::Shutdown::Both),
        }
    }
}

impl SplitWrite {
    /// Shuts the socket down both ways (wakes a blocked reader or writer).
    pub fn shutdown(&self) -> io::Result<()> {
        match self {
            SplitWrite::Plain(s) => s.shutdown(std::net::Shutdown::Both),
            SplitWrite::Tls(t) => t.tcp.shutdown(std::net::Shutdown::Both),
        }
    }
}

impl Read for SplitRead {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            SplitRead::Plain(s) => s.read(buf),
            SplitRead::Tls(t) => t.read(buf),
        }
    }
}

impl Write for SplitWrite {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            SplitWrite::Plain(s) => s.write(buf),
            SplitWrite::Tls(t) => t.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            SplitWrite::Plain(s) => s.flush(),
            SplitWrite::Tls(t) => t.flush(),
        }
    }
}
