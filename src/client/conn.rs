//! The framed connection both clients share: a TCP stream, a bounded read buffer, a write
//! buffer, and overall timeouts (a per-syscall socket timeout alone would let a server that
//! trickles one byte at a time hold a caller forever).

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use super::tls::{io_or_tls, Stream};
use super::{ClientError, ClientOptions, Result};
use crate::protocol::{self, ReplyFrame, RequestFrame};

/// Read buffer starts this big and grows to the largest frame seen (bounded by
/// `max_frame_bytes`).
const INITIAL_READ: usize = 16 * 1024;

pub(crate) struct Conn {
    stream: Stream,
    rbuf: Vec<u8>,
    start: usize,
    end: usize,
    wbuf: Vec<u8>,
    /// Largest reply frame accepted.
    max_frame: usize,
    /// Largest request frame the server accepts, once known (HELLO).
    server_max_frame: Option<usize>,
    io_timeout: Option<Duration>,
    /// The version requests go out in.
    pub(crate) version: u8,
    /// For a server that requires AUTH.
    pub(crate) secret: Option<crate::auth::Secret>,
    /// Set when the byte stream is no longer in a known state (partial write, lost
    /// framing, closed by the peer): every later call fails fast.
    broken: bool,
}

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
}

impl Conn {
    pub(crate) fn connect<A: ToSocketAddrs>(addr: A, opts: &ClientOptions) -> Result<Conn> {
        let mut last = None;
        for a in addr.to_socket_addrs()? {
            match TcpStream::connect_timeout(&a, opts.connect_timeout) {
                Ok(stream) => return Conn::from_stream(stream, opts),
                Err(e) => last = Some(e),
            }
        }
        Err(match last {
            Some(e) if is_timeout(&e) => ClientError::Timeout,
            Some(e) => ClientError::Io(e),
            None => ClientError::Protocol("address resolved to nothing".into()),
        })
    }

    /// Over `stream`: TLS first (its handshake within the connect timeout) when
    /// [`ClientOptions::tls`] says so.
    pub(crate) fn from_stream(stream: TcpStream, opts: &ClientOptions) -> Result<Conn> {
        stream.set_nodelay(opts.nodelay)?;
        let stream = match &opts.tls {
            None => Stream::Plain(stream),
            Some(tls) => tls.connect(stream, opts.connect_timeout)?,
        };
        Ok(Conn {
            stream,
            rbuf: vec![0; INITIAL_READ.min(opts.max_frame_bytes.max(protocol::HEADER_LEN))],
            start: 0,
            end: 0,
            wbuf: Vec::new(),
            max_frame: opts.max_frame_bytes,
            server_max_frame: None,
            io_timeout: opts.io_timeout,
            version: opts.version,
            secret: opts.secret.clone(),
            broken: false,
        })
    }

    /// The socket, once nothing is buffered either way and the stream is sound; its
    /// timeouts cleared.
    pub(crate) fn into_stream(self) -> Result<TcpStream> {
        if self.broken || self.start != self.end || !self.wbuf.is_empty() {
            return Err(ClientError::Protocol(
                "the connection has buffered bytes or is broken".into(),
            ));
        }
        let stream = match self.stream {
            Stream::Plain(s) => s,
            Stream::Tls(_) => {
                return Err(ClientError::Protocol(
                    "a TLS connection has no plain stream to give back".into(),
                ))
            }
        };
        stream.set_read_timeout(None)?;
        stream.set_write_timeout(None)?;
        Ok(stream)
    }

    /// A reading and a writing half, once nothing is buffered and the stream is sound
    /// (`tls::split`); the socket's timeouts cleared.
    pub(crate) fn into_split(self) -> Result<(super::SplitRead, super::SplitWrite, TcpStream)> {
        if self.broken || self.start != self.end || !self.wbuf.is_empty() {
            return Err(ClientError::Protocol(
                "the connection has buffered bytes or is broken".into(),
            ));
        }
        let (r, w, sock) = super::tls::split(self.stream)?;
        sock.set_read_timeout(None)?;
        sock.set_write_timeout(None)?;
        Ok((r, w, sock))
    }

    pub(crate) fn peer_addr(&self) -> Result<SocketAddr> {
        Ok(self.stream.tcp().peer_addr()?)
    }

    pub(crate) fn set_io_timeout(&mut self, t: Option<Duration>) {
        self.io_timeout = t;
    }

    pub(crate) fn set_server_max_frame(&mut self, max: usize) {
        self.server_max_frame = Some(max);
    }

    pub(crate) fn is_broken(&self) -> bool {
        self.broken
    }

    /// For a connection with nothing in flight, before a request goes on it: false when
    /// it is broken, holds bytes, or its socket has something to read, which on an idle
    /// connection is the server's end of stream (`idle_timeout_ms`, a restart) or bytes
    /// nobody asked for (SHUTTING_DOWN). Over TLS, also when rustls holds what it read
    /// off the socket and nobody asked for (plaintext, close_notify). A connection that
    /// has read nothing yet may hold TLS session tickets: ask after HELLO. Narrows the
    /// window in which a request meets a close; a close landing after the check is
    /// still found only once the request was sent.
    pub(crate) fn idle_usable(&self) -> bool {
        if self.broken || self.start != self.end || !self.wbuf.is_empty() {
            return false;
        }
        if let Stream::Tls(s) = &self.stream {
            if !s.conn.wants_read() {
                return false;
            }
        }
        // One non-blocking peek (MSG_DONTWAIT), the socket's own mode left alone.
        let fd = self.stream.tcp().as_raw_fd();
        let mut byte = 0u8;
        // SAFETY: `fd` is this connection's open socket, borrowed for the call; the
        // buffer is one byte we own.
        let n = unsafe {
            libc::recv(
                fd,
                (&mut byte as *mut u8).cast(),
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        n < 0 && std::io::Error::last_os_error().kind() == ErrorKind::WouldBlock
    }

    fn check(&self) -> Result<()> {
        if self.broken {
            Err(ClientError::Broken)
        } else {
            Ok(())
        }
    }

    /// Encodes `frame` into the write buffer (sent by [`Conn::flush`]). Refuses a frame the
    /// server is known to reject, so the connection survives the mistake.
    pub(crate) fn queue(&mut self, frame: &RequestFrame) -> Result<()> {
        self.check()?;
        let start = self.wbuf.len();
        let len = protocol::encode_request(frame, &mut self.wbuf)?;
        if let Some(max) = self.server_max_frame {
            if len > max {
                self.wbuf.truncate(start);
                return Err(ClientError::TooLarge { len, max });
            }
        }
        Ok(())
    }

    /// Queues bytes as they are (for tests and tools that must send malformed input).
    pub(crate) fn queue_raw(&mut self, bytes: &[u8]) -> Result<()> {
        self.check()?;
        self.wbuf.extend_from_slice(bytes);
        Ok(())
    }

    pub(crate) fn pending_write(&self) -> usize {
        self.wbuf.len()
    }

    /// Writes the whole write buffer within the I/O timeout.
    pub(crate) fn flush(&mut self) -> Result<()> {
        self.check()?;
        let deadline = self.io_timeout.map(|t| Instant::now() + t);
        let mut written = 0;
        let result = loop {
            if written == self.wbuf.len() {
                // TLS: records the socket has not taken yet are still in the session.
                if self.stream.is_tls() {
                    if let Err(e) = self.stream.tcp().set_write_timeout(remaining(deadline)?) {
                        break Err(e.into());
                    }
                    if let Err(e) = self.stream.flush() {
                        break Err(io_or_tls(e));
                    }
                }
                break Ok(());
            }
            if let Err(e) = self.stream.tcp().set_write_timeout(remaining(deadline)?) {
                break Err(e.into());
            }
            match self.stream.write(&self.wbuf[written..]) {
                Ok(0) => break Err(ClientError::Closed),
                Ok(n) => written += n,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if is_timeout(&e) => break Err(ClientError::Timeout),
                Err(e) if is_closed(&e) => break Err(ClientError::Closed),
                Err(e) => break Err(io_or_tls(e)),
            }
        };
        if result.is_err() {
            // Part of a frame may be on the wire: the stream is in an unknown state.
            self.broken = true;
        }
        self.wbuf.clear();
        result
    }

    /// Reads the next reply frame, whatever its id, within the I/O timeout. A timeout keeps
    /// what was read so far, so the call can be repeated.
    pub(crate) fn read_frame(&mut self) -> Result<ReplyFrame> {
        self.check()?;
        let deadline = self.io_timeout.map(|t| Instant::now() + t);
        loop {
            match protocol::decode_reply(&self.rbuf[self.start..self.end], self.max_frame) {
                Ok(Some((frame, n))) => {
                    self.consume(n);
                    return Ok(frame);
                }
                Ok(None) => {}
                Err(e) => {
                    match e.consumed() {
                        Some(n) => self.consume(n),
                        None => self.broken = true,
                    }
                    return Err(ClientError::Decode(e));
                }
            }
            self.fill(deadline)?;
        }
    }

    fn consume(&mut self, n: usize) {
        self.start += n;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
    }

    /// Reads more bytes, making room first: compact, then grow up to `max_frame`.
    fn fill(&mut self, deadline: Option<Instant>) -> Result<()> {
        if self.end == self.rbuf.len() {
            if self.start > 0 {
                self.rbuf.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            } else {
                // The decoder has already refused frames over max_frame, so a full buffer
                // below max_frame only means this frame is big: grow.
                let grown = (self.rbuf.len() * 2).clamp(
                    protocol::HEADER_LEN,
                    self.max_frame.max(protocol::HEADER_LEN),
                );
                if grown <= self.rbuf.len() {
                    self.broken = true;
                    return Err(ClientError::Protocol(
                        "reply does not fit the read buffer".into(),
                    ));
                }
                self.rbuf.resize(grown, 0);
            }
        }
        loop {
            self.stream.tcp().set_read_timeout(remaining(deadline)?)?;
            match self.stream.read(&mut self.rbuf[self.end..]) {
                Ok(0) => {
                    self.broken = true;
                    return Err(ClientError::Closed);
                }
                Ok(n) => {
                    self.end += n;
                    return Ok(());
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if is_timeout(&e) => return Err(ClientError::Timeout),
                Err(e) if is_closed(&e) => {
                    self.broken = true;
                    return Err(ClientError::Closed);
                }
                Err(e) => {
                    // A TLS error (a bad record, an alert) leaves the session unusable.
                    let e = io_or_tls(e);
                    if matches!(e, ClientError::Tls(_)) {
                        self.broken = true;
                    }
                    return Err(e);
                }
            }
        }
    }

    pub(crate) fn mark_broken(&mut self) {
        self.broken = true;
    }
}

fn is_closed(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted | ErrorKind::BrokenPipe
    )
}

/// Time left before `deadline` as a socket timeout (`None` = block); `Timeout` once past.
fn remaining(deadline: Option<Instant>) -> Result<Option<Duration>> {
    match deadline {
        None => Ok(None),
        Some(d) => {
            let left = d.saturating_duration_since(Instant::now());
            if left.is_zero() {
                Err(ClientError::Timeout)
            } else {
                Ok(Some(left))
            }
        }
    }
}
