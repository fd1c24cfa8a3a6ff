//! The bytes under a connection: plain TCP, or TLS over it (rustls).
//!
//! ```text
//!   reader task ──poll_read──►  Io  ◄──poll_write / poll_flush── writer task
//!                               │
//!                 Plain(TcpStream) | Tls(TcpStream + one rustls session)
//! ```
//!
//! The reader and the writer share the stream through a `RefCell` (a poll never yields
//! while borrowed). glommio keeps separate poll sources for the two directions, and each
//! task must only ever register its own waker on its own direction: a waker left on the
//! other direction's source could replace that task's and lose its wake-up. Plain TCP
//! gives that for free. A TLS session is one state machine whose reading can produce
//! records to send (alerts, key updates); so with TLS the reader never writes to the
//! socket: what its reading produced stays in the session, `output_pending` says so, and
//! the connection wakes its writer to send it (`poll_flush`).

use std::cell::RefCell;
use std::io::{self, Read, Write};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use futures_lite::{AsyncRead, AsyncWrite};
use glommio::net::TcpStream;
use rustls::ServerConnection;

/// The stream shared by a connection's reader and writer tasks.
#[derive(Clone)]
pub(crate) struct Io(Rc<RefCell<Transport>>);

enum Transport {
    Plain(TcpStream),
    Tls(Box<TlsStream>),
}

/// A TCP stream and the TLS session over it, its handshake done.
pub(crate) struct TlsStream {
    tcp: TcpStream,
    session: ServerConnection,
    /// The peer closed its side of TCP: nothing more will come.
    tcp_eof: bool,
    /// `close_notify` queued (once).
    closing: bool,
}

impl Io {
    pub(crate) fn new(stream: TcpStream) -> Io {
        Io(Rc::new(RefCell::new(Transport::Plain(stream))))
    }

    pub(crate) fn tls(stream: Box<TlsStream>) -> Io {
        Io(Rc::new(RefCell::new(Transport::Tls(stream))))
    }

    /// TLS records are waiting to be sent that no write is sending (the reader's doing):
    /// the writer should `flush`.
    pub(crate) fn output_pending(&self) -> bool {
        match &*self.0.borrow() {
            Transport::Plain(_) => false,
            Transport::Tls(t) => t.session.wants_write(),
        }
    }
}

impl TlsStream {
    pub(crate) fn new(tcp: TcpStream, session: ServerConnection) -> TlsStream {
        TlsStream {
            tcp,
            session,
            tcp_eof: false,
            closing: false,
        }
    }

    fn poll_read(&mut self, cx: &mut Context<'_>, buf: &mut [u8]) -> Poll<io::Result<usize>> {
        // Bounded: each pass either returns or takes bytes off the socket; the socket
        // read returns Pending once it has none.
        loop {
            match self.session.reader().read(buf) {
                // 0: the peer's close_notify.
                Ok(n) => return Poll::Ready(Ok(n)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                // TCP closed without close_notify: an end all the same (nothing of a
                // frame can be forged by truncation that the framing would not refuse).
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Poll::Ready(Ok(0)),
                Err(e) => return Poll::Ready(Err(e)),
            }
            if self.tcp_eof {
                return Poll::Ready(Ok(0));
            }
            let mut sock = SyncIo {
                tcp: &mut self.tcp,
                cx,
            };
            match self.session.read_tls(&mut sock) {
                Ok(0) => self.tcp_eof = true,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Poll::Pending,
                Err(e) => return Poll::Ready(Err(e)),
            }
            if let Err(e) = self.session.process_new_packets() {
                return Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, e)));
            }
        }
    }

    /// Sends queued TLS records until none are left or the socket would block.
    fn poll_send(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.session.wants_write() {
            let mut sock = SyncIo {
                tcp: &mut self.tcp,
                cx,
            };
            match self.session.write_tls(&mut sock) {
                Ok(0) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Poll::Pending,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
        Poll::Ready(Ok(()))
    }

    fn poll_write(&mut self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        // What is queued goes first, so the session's buffer stays bounded (rustls takes
        // at most its buffer limit of plaintext, 64 KiB by default).
        let sent = self.poll_send(cx);
        if let Poll::Ready(Err(e)) = sent {
            return Poll::Ready(Err(e));
        }
        let n = self.session.writer().write(buf)?;
        if n == 0 && !buf.is_empty() {
            // The session is full and the socket is not taking more: wait for it.
            return match sent {
                Poll::Pending => Poll::Pending,
                // Sent everything yet took nothing: cannot happen with a buffer limit
                // above zero; refuse rather than spin.
                Poll::Ready(_) => Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
            };
        }
        // Start sending it; whatever the socket does not take now, `poll_flush` sends.
        if let Poll::Ready(Err(e)) = self.poll_send(cx) {
            return Poll::Ready(Err(e));
        }
        Poll::Ready(Ok(n))
    }

    fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.poll_send(cx) {
            Poll::Ready(Ok(())) => Pin::new(&mut self.tcp).poll_flush(cx),
            other => other,
        }
    }

    fn poll_close(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if !self.closing {
            self.closing = true;
            self.session.send_close_notify();
        }
        match self.poll_send(cx) {
            Poll::Ready(Ok(())) => Pin::new(&mut self.tcp).poll_close(cx),
            other => other,
        }
    }
}

/// The socket as `std::io` for rustls: a poll that would wait reads as `WouldBlock`
/// (the waker stays registered with the socket's source for that direction).
struct SyncIo<'a, 'b> {
    tcp: &'a mut TcpStream,
    cx: &'a mut Context<'b>,
}

impl Read for SyncIo<'_, '_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match Pin::new(&mut *self.tcp).poll_read(self.cx, buf) {
            Poll::Ready(r) => r,
            Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
        }
    }
}

impl Write for SyncIo<'_, '_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match Pin::new(&mut *self.tcp).poll_write(self.cx, buf) {
            Poll::Ready(r) => r,
            Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match Pin::new(&mut *self.tcp).poll_flush(self.cx) {
            Poll::Ready(r) => r,
            Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
        }
    }
}

impl AsyncRead for Io {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        match &mut *self.0.borrow_mut() {
            Transport::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Transport::Tls(t) => t.poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Io {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match &mut *self.0.borrow_mut() {
            Transport::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Transport::Tls(t) => t.poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut *self.0.borrow_mut() {
            Transport::Plain(s) => Pin::new(s).poll_flush(cx),
            Transport::Tls(t) => t.poll_flush(cx),
        }
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut *self.0.borrow_mut() {
            Transport::Plain(s) => Pin::new(s).poll_close(cx),
            Transport::Tls(t) => t.poll_close(cx),
        }
    }
}
