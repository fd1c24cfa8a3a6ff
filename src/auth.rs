//! Authentication (protocol version 3): a shared secret, never sent on the wire.
//!
//! ```text
//!  client                                   akerd (auth on)
//!    HELLO (v3)  ───────────────────────►
//!                ◄───────────────────────   HELLO reply: auth required, challenge C (16 random bytes,
//!                                           one per connection)
//!    AUTH N, P   ───────────────────────►   N: 16 random bytes of the client's
//!                                           P = HMAC-SHA256(secret, "aker-auth-v3 client" ‖ C ‖ N)
//!                                           checked in constant time
//!                ◄───────────────────────   AUTH reply: S = HMAC-SHA256(secret, "aker-auth-v3 server" ‖ C ‖ N)
//!    (the client checks S: the server knows the secret too)
//!    a wrong P: UNAUTHENTICATED, then the connection is closed (a new one gets a new C)
//! ```
//!
//! The challenge makes a recorded AUTH useless on another connection. There is no TLS:
//! everything after AUTH (vectors, ids, answers) crosses the network in clear text.

use std::fmt;
use std::path::Path;

use hmac::{KeyInit, Mac};
use rand::RngCore;

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

/// Bytes of the server's challenge and of the client's nonce.
pub const NONCE_LEN: usize = 16;
/// Bytes of a proof (an HMAC-SHA256 tag).
pub const PROOF_LEN: usize = 32;
/// The shortest secret accepted.
pub const SECRET_MIN_BYTES: usize = 16;
/// The longest (a secret file is read no further).
pub const SECRET_MAX_BYTES: usize = 4096;

const CLIENT_LABEL: &[u8] = b"aker-auth-v3 client";
const SERVER_LABEL: &[u8] = b"aker-auth-v3 server";

/// The shared secret. Its `Debug` never shows it, and it has no `==` (a compare that
/// stops at the first differing byte would time it).
#[derive(Clone)]
pub struct Secret(Vec<u8>);

/// The environment variable client tools read the secret from (`Secret::for_tool`).
pub const SECRET_ENV: &str = "AKER_SECRET";

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret(<{} bytes, not shown>)", self.0.len())
    }
}

impl Secret {
    /// A secret of at least [`SECRET_MIN_BYTES`] bytes.
    pub fn new(bytes: impl Into<Vec<u8>>) -> Result<Secret, String> {
        let bytes = bytes.into();
        if bytes.len() < SECRET_MIN_BYTES {
            return Err(format!(
                "the secret is {} bytes; at least {SECRET_MIN_BYTES} are needed",
                bytes.len()
            ));
        }
        if bytes.len() > SECRET_MAX_BYTES {
            return Err(format!("the secret is over {SECRET_MAX_BYTES} bytes"));
        }
        Ok(Secret(bytes))
    }

    /// The first line of `path` (without its line ending); at most
    /// [`SECRET_MAX_BYTES`] are read.
    pub fn from_file(path: &Path) -> Result<Secret, String> {
        use std::io::Read;
        let mut text = Vec::new();
        std::fs::File::open(path)
            .and_then(|f| f.take(SECRET_MAX_BYTES as u64 + 2).read_to_end(&mut text))
            .map_err(|e| format!("cannot read the secret file {}: {e}", path.display()))?;
        let line = text.split(|&b| b == b'\n').next().unwrap_or(&[]);
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        Secret::new(line.to_vec()).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// The value of the environment variable `name`. Errors do not repeat the name: a
    /// secret pasted where its variable's name belongs must not reach the log.
    pub fn from_env(name: &str) -> Result<Secret, String> {
        let v = std::env::var_os(name)
            .ok_or_else(|| "the environment variable secret_env names is not set".to_string())?;
        Secret::new(v.into_encoded_bytes())
            .map_err(|e| format!("the environment variable secret_env names: {e}"))
    }

    /// The daemon's secret as `[auth]` says where it is (read at start); `None`
    /// without authentication.
    pub fn load(
        auth: &crate::config::AuthSection,
    ) -> Result<Option<Secret>, crate::config::ConfigError> {
        match (&auth.secret_file, &auth.secret_env) {
            (Some(_), Some(_)) => Err("set secret_file or secret_env, not both".into()),
            (Some(f), None) => Secret::from_file(f).map(Some),
            (None, Some(v)) => Secret::from_env(v).map(Some),
            (None, None) => Ok(None),
        }
        .map_err(|e| crate::config::ConfigError::invalid("auth", e))
    }

    /// The secret a client tool authenticates with: `file`'s first line, else
    /// `$AKER_SECRET` ([`SECRET_ENV`]) when it is set, else none (aker-cli, the load
    /// generator and its tools share this convention).
    pub fn for_tool(file: Option<&Path>) -> Result<Option<Secret>, String> {
        if let Some(f) = file {
            return Secret::from_file(f).map(Some);
        }
        match std::env::var_os(SECRET_ENV) {
            // The value is never repeated in the message.
            Some(v) => Secret::new(v.into_encoded_bytes())
                .map(Some)
                .map_err(|e| format!("${SECRET_ENV}: {e}")),
            None => Ok(None),
        }
    }

    /// What a client sends for `challenge` and its own `nonce`.
    pub fn client_proof(
        &self,
        challenge: &[u8; NONCE_LEN],
        nonce: &[u8; NONCE_LEN],
    ) -> [u8; PROOF_LEN] {
        self.tag(CLIENT_LABEL, challenge, nonce)
    }

    /// What the server answers once the client's proof holds.
    pub fn server_proof(
        &self,
        challenge: &[u8; NONCE_LEN],
        nonce: &[u8; NONCE_LEN],
    ) -> [u8; PROOF_LEN] {
        self.tag(SERVER_LABEL, challenge, nonce)
    }

    /// Whether `proof` is the client's proof for `challenge` and `nonce`; in constant time.
    pub fn verify_client(
        &self,
        challenge: &[u8; NONCE_LEN],
        nonce: &[u8; NONCE_LEN],
        proof: &[u8],
    ) -> bool {
        self.mac(CLIENT_LABEL, challenge, nonce)
            .verify_slice(proof)
            .is_ok()
    }

    /// Whether `proof` is the server's proof; in constant time.
    pub fn verify_server(
        &self,
        challenge: &[u8; NONCE_LEN],
        nonce: &[u8; NONCE_LEN],
        proof: &[u8],
    ) -> bool {
        self.mac(SERVER_LABEL, challenge, nonce)
            .verify_slice(proof)
            .is_ok()
    }

    fn mac(&self, label: &[u8], challenge: &[u8], nonce: &[u8]) -> HmacSha256 {
        let mut m = <HmacSha256 as KeyInit>::new_from_slice(&self.0)
            .expect("HMAC takes a key of any length");
        m.update(label);
        m.update(challenge);
        m.update(nonce);
        m
    }

    fn tag(&self, label: &[u8], challenge: &[u8], nonce: &[u8]) -> [u8; PROOF_LEN] {
        self.mac(label, challenge, nonce)
            .finalize()
            .into_bytes()
            .into()
    }
}

/// 16 bytes from the operating system's generator (a challenge or a nonce).
pub fn random_nonce() -> [u8; NONCE_LEN] {
    let mut n = [0u8; NONCE_LEN];
    rand::rngs::OsRng.fill_bytes(&mut n);
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret() -> Secret {
        Secret::new(b"correct horse battery staple".to_vec()).unwrap()
    }

    #[test]
    fn a_proof_holds_for_its_challenge_and_nonce_only() {
        let s = secret();
        let (c, n) = (random_nonce(), random_nonce());
        assert_ne!(c, n);
        let p = s.client_proof(&c, &n);
        assert!(s.verify_client(&c, &n, &p));
        // Another challenge (a replay on another connection), nonce, secret or label.
        assert!(!s.verify_client(&random_nonce(), &n, &p));
        assert!(!s.verify_client(&c, &random_nonce(), &p));
        let other = Secret::new(b"correct horse battery stapler".to_vec()).unwrap();
        assert!(!other.verify_client(&c, &n, &p));
        assert!(!s.verify_server(&c, &n, &p));
        assert!(s.verify_server(&c, &n, &s.server_proof(&c, &n)));
    }

    #[test]
    fn the_compare_refuses_every_near_miss() {
        // verify_slice is digest's constant-time compare: it must refuse a tag that
        // differs in its first byte, its last, is short, long or empty.
        let s = secret();
        let (c, n) = (random_nonce(), random_nonce());
        let p = s.client_proof(&c, &n);
        for i in [0, PROOF_LEN / 2, PROOF_LEN - 1] {
            let mut q = p;
            q[i] ^= 1;
            assert!(!s.verify_client(&c, &n, &q), "byte {i}");
        }
        assert!(!s.verify_client(&c, &n, &p[..PROOF_LEN - 1]));
        let mut long = p.to_vec();
        long.push(0);
        assert!(!s.verify_client(&c, &n, &long));
        assert!(!s.verify_client(&c, &n, &[]));
    }

    #[test]
    fn secrets_are_checked_and_never_shown() {
        assert!(Secret::new(b"short".to_vec())
            .unwrap_err()
            .contains("at least 16"));
        assert!(Secret::new(vec![b'x'; SECRET_MAX_BYTES + 1]).is_err());
        let s = secret();
        let shown = format!("{s:?}");
        assert!(!shown.contains("horse"), "{shown}");
        let dir = std::env::temp_dir().join(format!("aker-auth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("secret");
        std::fs::write(&f, b"correct horse battery staple\r\nignored\n").unwrap();
        let (c, n) = (random_nonce(), random_nonce());
        let read = Secret::from_file(&f).unwrap();
        assert_eq!(read.client_proof(&c, &n), s.client_proof(&c, &n));
        std::fs::write(&f, b"tiny\n").unwrap();
        let e = Secret::from_file(&f).unwrap_err();
        assert!(e.contains("at least 16") && !e.contains("tiny"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
        assert!(Secret::from_env("AKER_TEST_SURELY_UNSET_VARIABLE")
            .unwrap_err()
            .contains("not set"));
    }
}
