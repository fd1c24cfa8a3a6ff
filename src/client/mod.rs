//! Clients over `std::net::TcpStream`.
//!
//! - [`Client`]: blocking, one request at a time, typed helpers (`search`, `insert`, ...).
//! - [`Pipeline`]: many requests in flight (a bounded window), replies in any order,
//!   matched by request id.
//! - [`Cluster`]: a tier of nodes (protocol version 6): each search to its centroid's
//!   owner, retries on the next node, positions carried across nodes.
//!
//! Both use overall I/O timeouts ([`ClientOptions::io_timeout`]). A read timeout keeps the
//! bytes read so far, so a slow reply can still be collected by a later call; a failed or
//! timed-out write, lost framing or a closed socket makes the client [`ClientError::Broken`].
//! Request ids start at 1: id 0 is what the server uses for connection-level replies.
//!
//! With [`ClientOptions::secret`], HELLO also authenticates when the server asks for it
//! (protocol version 3, `crate::auth`), and checks the server's own proof.
//!
//! The README's example (kept compiling here):
//!
//! ```no_run
//! # fn main() -> Result<(), aker::client::ClientError> {
//! use aker::client::Client;
//!
//! let mut c = Client::connect("127.0.0.1:7700")?;
//! let dim = c.hello()?.dim as usize;                     // the server's dimension
//! c.insert(1_000_000, &vec![0.5; dim])?;                  // acknowledged once every shard knows
//! let r = c.search(10, &vec![0.5; dim])?;                 // 10 nearest
//! println!("{:?}: {:?}", r.hit, r.neighbors.first());     // Miss, then Exact / Approximate
//! assert!(c.delete(1_000_000)?);                           // never served again
//! # Ok(())
//! # }
//! ```
//!
//! **Read-your-writes by position** (protocol version 5). A write's reply carries its
//! position (pgvector: the WAL position after its COMMIT; 0 where every acknowledged
//! write is already in the cache); a search AT_POSITION is answered from a state that
//! holds every change up to it, the cache's once the change stream has applied it, else
//! the database's. The position can come from another client's write too, or from
//! `SELECT pg_current_wal_insert_lsn()` after one's own COMMIT in SQL:
//!
//! ```no_run
//! # fn main() -> Result<(), aker::client::ClientError> {
//! use aker::client::Client;
//! use aker::protocol::SearchRequest;
//!
//! let mut c = Client::connect("127.0.0.1:7700")?;
//! let dim = c.hello()?.dim as usize;
//! let q = vec![0.5; dim];
//! let gone = c.delete_with_position(1_000_000)?;           // Deleted { existed, position }
//! let r = c.search_with(SearchRequest {
//!     at_position: Some(gone.position),                     // never the deleted id
//!     ..SearchRequest::new(10, q)
//! })?;
//! # Ok(())
//! # }
//! ```

mod blocking;
mod cluster;
mod conn;
mod pipeline;
mod tls;

pub use blocking::{Client, Deleted};
pub use cluster::{Cluster, ClusterCounters, ClusterRouting, ATTEMPTS_MAX};
pub use pipeline::Pipeline;
pub use tls::{ClientTls, SplitRead, SplitWrite, TlsReadHalf, TlsWriteHalf};

use std::time::Duration;

use crate::auth::Secret;
use crate::protocol::{AuthRequest, HelloReply};

use crate::protocol::{DecodeError, EncodeError, Reply, Status};

/// Connection settings.
#[derive(Clone, Debug)]
pub struct ClientOptions {
    pub connect_timeout: Duration,
    /// Bound on one call's writing, and on one reply's reading; `None` blocks forever.
    pub io_timeout: Option<Duration>,
    /// Largest reply frame accepted.
    pub max_frame_bytes: usize,
    pub nodelay: bool,
    /// The protocol version requests are sent in (`protocol::VERSION`, the newest, by
    /// default; HELLO lowers it to what the server speaks).
    pub version: u8,
    /// The shared secret: HELLO authenticates with it, and fails with
    /// [`ClientError::ServerNotAuthentic`] against a server that does not ask for AUTH
    /// (version 3) or cannot prove it knows the secret.
    pub secret: Option<Secret>,
    /// TLS to a server with `[tls]`: the CA to trust, the name to check, a client
    /// certificate for mutual TLS. `None`: plaintext.
    pub tls: Option<ClientTls>,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            connect_timeout: Duration::from_secs(5),
            io_timeout: Some(Duration::from_secs(10)),
            max_frame_bytes: 64 << 20,
            nodelay: true,
            version: crate::protocol::VERSION,
            secret: None,
            tls: None,
        }
    }
}

/// Everything a client call can fail with.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("timed out")]
    Timeout,
    #[error("connection closed")]
    Closed,
    #[error("connection is unusable after an earlier error")]
    Broken,
    /// An error reply. `request_id` 0: a connection-level reply (the server then closes).
    #[error("server replied {status} to request {request_id}: {message}")]
    Server {
        request_id: u64,
        status: Status,
        message: String,
    },
    #[error("request of {len} bytes is over the server's frame limit of {max}")]
    TooLarge { len: usize, max: usize },
    #[error("undecodable reply: {0}")]
    Decode(#[from] DecodeError),
    #[error("cannot encode request: {0}")]
    Encode(EncodeError),
    /// The request needs a newer protocol version than this connection speaks (the
    /// server's newest, after HELLO, or [`ClientOptions::version`]): e.g. AT_POSITION
    /// (version 5) to a version 4 server. Nothing was sent.
    #[error(
        "{what} needs protocol version {since}; this connection speaks version {version} \
         (the server's newest, or ClientOptions::version): nothing was sent"
    )]
    NotInVersion {
        what: &'static str,
        since: u8,
        version: u8,
    },
    #[error("protocol: {0}")]
    Protocol(String),
    /// A write sent to a cluster node whose connection then failed (timed out, reset,
    /// closed): it may or may not have committed there, so it was not sent to another
    /// node ([`Cluster`]). Read the id back, or write it again knowing that.
    #[error("the write's outcome is unknown: node {node} failed after it was sent ({cause})")]
    WriteInDoubt {
        node: String,
        cause: Box<ClientError>,
    },
    /// TLS refused or broken: the server's certificate not trusted or not for this
    /// name, expired, the client's certificate refused (mutual TLS), a TLS client
    /// against a plaintext port, a bad record.
    #[error("TLS: {0}")]
    Tls(String),
    #[error(
        "the server requires authentication (protocol version 3 AUTH) and no secret was given"
    )]
    AuthRequired,
    /// With a secret: the server did not ask for AUTH (or asked in a version below 3), or
    /// its proof did not hold.
    #[error("the server does not prove it knows the secret (no AUTH challenge, or a wrong proof)")]
    ServerNotAuthentic,
}

impl ClientError {
    /// The server's status for an error reply.
    pub fn status(&self) -> Option<Status> {
        match self {
            ClientError::Server { status, .. } => Some(*status),
            _ => None,
        }
    }
}

impl From<EncodeError> for ClientError {
    fn from(e: EncodeError) -> Self {
        match e {
            EncodeError::NotInVersion {
                what,
                since,
                version,
            } => ClientError::NotInVersion {
                what,
                since,
                version,
            },
            e => ClientError::Encode(e),
        }
    }
}

pub type Result<T, E = ClientError> = std::result::Result<T, E>;

/// What HELLO led to: nothing more to do, or an AUTH to send (with the nonce its
/// reply's proof is checked against).
enum AuthStep {
    Done,
    Send {
        request: AuthRequest,
        challenge: [u8; crate::auth::NONCE_LEN],
    },
}

/// With a secret, the server must ask for AUTH: one that does not (an impostor, or a
/// version below 3 forced by answering BAD_VERSION) cannot prove it knows the secret,
/// and this client's requests would go to it unauthenticated.
fn auth_step(h: &HelloReply, secret: Option<&Secret>) -> Result<AuthStep> {
    let Some(challenge) = h.auth_challenge else {
        return match secret {
            Some(_) => Err(ClientError::ServerNotAuthentic),
            None => Ok(AuthStep::Done),
        };
    };
    let secret = secret.ok_or(ClientError::AuthRequired)?;
    let nonce = crate::auth::random_nonce();
    Ok(AuthStep::Send {
        request: AuthRequest {
            nonce,
            proof: secret.client_proof(&challenge, &nonce),
        },
        challenge,
    })
}

/// Checks the reply to the AUTH of `step`.
fn auth_done(
    request_id: u64,
    reply: crate::protocol::Reply,
    secret: Option<&Secret>,
    request: &AuthRequest,
    challenge: &[u8; crate::auth::NONCE_LEN],
) -> Result<()> {
    match reply {
        crate::protocol::Reply::Authenticated { server_proof } => {
            let secret = secret.ok_or(ClientError::AuthRequired)?;
            if secret.verify_server(challenge, &request.nonce, &server_proof) {
                Ok(())
            } else {
                Err(ClientError::ServerNotAuthentic)
            }
        }
        other => Err(server_error(request_id, other)),
    }
}

/// Turns an error reply into `ClientError::Server`.
fn server_error(request_id: u64, reply: Reply) -> ClientError {
    match reply {
        Reply::Error {
            status, message, ..
        } => ClientError::Server {
            request_id,
            status,
            message,
        },
        other => ClientError::Protocol(format!(
            "unexpected reply to request {request_id}: {other:?}"
        )),
    }
}
