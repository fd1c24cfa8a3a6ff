//! TLS to PostgreSQL, as libpq's `sslmode` means it, on rustls (every connection akerd
//! opens: searches, writes, the change stream).
//!
//! ```text
//!  sslmode      TLS                     server certificate checked
//!  disable      never                   -
//!  prefer       if the server offers it  no (libpq's default, and akerd's)
//!  require      always                  no: encrypted, not authenticated
//!  verify-ca    always                  chains to sslrootcert (any host name)
//!  verify-full  always                  chains to sslrootcert and names the host
//! ```
//!
//! tokio-postgres knows only disable / prefer / require and no `sslrootcert`, and rustls
//! always verifies; so `split_url` takes both keys out of the url before the driver
//! parses it, and the verifiers below give `prefer` / `require` and `verify-ca` their
//! libpq meanings. Even unverified, a handshake still proves the server holds the key of
//! the certificate it shows.

use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use crate::server::tls::provider;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, SignatureScheme};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};
use tokio_postgres::Socket;

/// libpq's `sslmode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    fn parse(v: &str) -> Result<SslMode, String> {
        Ok(match v {
            "disable" => SslMode::Disable,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            // libpq's allow: TLS only if the server insists; akerd's nearest is prefer.
            "allow" => return Err("sslmode=allow is not supported: use prefer or disable".into()),
            other => return Err(format!("unknown sslmode {other:?}")),
        })
    }

    /// What tokio-postgres is told (it knows these three).
    fn driver(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            _ => "require",
        }
    }
}

/// A url with its TLS keys taken out.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct SplitUrl {
    /// For the driver: `sslmode` is disable, prefer or require; no `sslrootcert`.
    pub(crate) url: String,
    pub(crate) mode: SslMode,
    pub(crate) root_cert: Option<PathBuf>,
}

/// Takes `sslmode` and `sslrootcert` out of a url (`postgresql://...?sslmode=...&...`)
/// or a key=value string (`host=... sslmode=...`). Unset: `prefer`, as libpq.
pub(crate) fn split_url(url: &str) -> Result<SplitUrl, String> {
    let mut mode = SslMode::Prefer;
    let mut root_cert = None;
    let mut take = |k: &str, v: &str| -> Result<bool, String> {
        match k {
            "sslmode" => mode = SslMode::parse(v)?,
            "sslrootcert" => root_cert = Some(PathBuf::from(v)),
            _ => return Ok(false),
        }
        Ok(true)
    };
    let rebuilt = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let mut kept = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let v = percent_decode(v)?;
            if !take(k, &v)? {
                kept.push(pair.to_string());
            }
        }
        kept.push(format!("sslmode={}", mode.driver()));
        format!("{base}?{}", kept.join("&"))
    } else {
        let mut kept = Vec::new();
        for word in url.split_whitespace() {
            match word.split_once('=') {
                Some((k, v)) if !v.starts_with('\'') => {
                    if !take(k, v)? {
                        kept.push(word.to_string());
                    }
                }
                Some((k, _)) if k == "sslmode" || k == "sslrootcert" => {
                    return Err(format!("{k}: give its value without quotes"))
                }
                _ => kept.push(word.to_string()),
            }
        }
        kept.push(format!("sslmode={}", mode.driver()));
        kept.join(" ")
    };
    if root_cert.is_some() && matches!(mode, SslMode::Disable) {
        return Err("sslrootcert with sslmode=disable: nothing to verify".into());
    }
    Ok(SplitUrl {
        url: rebuilt,
        mode,
        root_cert,
    })
}

/// `%XX` escapes of a url's query value (a path with spaces, say).
fn percent_decode(v: &str) -> Result<String, String> {
    let b = v.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = v
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("bad %-escape in {v:?}"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("{v:?} is not UTF-8 once unescaped"))
}

/// The connector for `mode` (`None`: disable). `verify-*` needs `root_cert` (libpq's
/// default, `~/.postgresql/root.crt`, is used when it exists).
pub(crate) fn connector(mode: SslMode, root_cert: Option<&Path>) -> Result<Option<PgTls>, String> {
    let verifier: Arc<dyn ServerCertVerifier> = match mode {
        SslMode::Disable => return Ok(None),
        SslMode::Prefer | SslMode::Require => Arc::new(NoCheck(provider())),
        SslMode::VerifyCa | SslMode::VerifyFull => {
            let default = std::env::var_os("HOME")
                .map(|h| PathBuf::from(h).join(".postgresql/root.crt"))
                .filter(|p| p.exists());
            let path = root_cert.map(Path::to_path_buf).or(default).ok_or(
                "sslmode=verify-ca / verify-full needs sslrootcert=FILE in the url (PEM CA \
                 certificates)",
            )?;
            let roots = crate::server::tls::load_roots(&path)?;
            let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider())
                .build()
                .map_err(|e| format!("sslrootcert {}: {e}", path.display()))?;
            if mode == SslMode::VerifyCa {
                Arc::new(AnyName(webpki))
            } else {
                webpki
            }
        }
    };
    let config = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(crate::server::tls::VERSIONS)
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    Ok(Some(PgTls {
        config: Arc::new(config),
    }))
}

/// `prefer` / `require`: any certificate (libpq does not check one in these modes); the
/// handshake's signatures are still checked against the certificate shown.
#[derive(Debug)]
struct NoCheck(Arc<CryptoProvider>);

impl ServerCertVerifier for NoCheck {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `verify-ca`: the chain must verify; the host name need not match.
#[derive(Debug)]
struct AnyName(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// tokio-postgres's TLS hook over rustls.
#[derive(Clone)]
pub(crate) struct PgTls {
    config: Arc<ClientConfig>,
}

impl std::fmt::Debug for PgTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PgTls")
    }
}

impl MakeTlsConnect<Socket> for PgTls {
    type Stream = PgTlsStream;
    type TlsConnect = PgTlsConnect;
    type Error = io::Error;

    fn make_tls_connect(&mut self, domain: &str) -> io::Result<PgTlsConnect> {
        let name = ServerName::try_from(domain.to_string())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        Ok(PgTlsConnect {
            connector: tokio_rustls::TlsConnector::from(self.config.clone()),
            name,
        })
    }
}

pub(crate) struct PgTlsConnect {
    connector: tokio_rustls::TlsConnector,
    name: ServerName<'static>,
}

impl TlsConnect<Socket> for PgTlsConnect {
    type Stream = PgTlsStream;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<PgTlsStream>> + Send>>;

    fn connect(self, stream: Socket) -> Self::Future {
        Box::pin(async move {
            let s = self.connector.connect(self.name, stream).await?;
            Ok(PgTlsStream(Box::new(s)))
        })
    }
}

pub(crate) struct PgTlsStream(Box<tokio_rustls::client::TlsStream<Socket>>);

impl AsyncRead for PgTlsStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for PgTlsStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_shutdown(cx)
    }
}

impl TlsStream for PgTlsStream {
    fn channel_binding(&self) -> ChannelBinding {
        // SCRAM's channel binding (tls-server-end-point) is optional for the client.
        ChannelBinding::none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tls_keys_come_out_of_either_url_form() {
        let s = split_url(
            "postgresql://aker@db:5432/postgres?sslmode=verify-full&sslrootcert=%2Fetc%2Fca%20x.crt&application_name=a",
        )
        .unwrap();
        assert_eq!(s.mode, SslMode::VerifyFull);
        assert_eq!(s.root_cert, Some(PathBuf::from("/etc/ca x.crt")));
        assert_eq!(
            s.url,
            "postgresql://aker@db:5432/postgres?application_name=a&sslmode=require"
        );
        let s = split_url("host=db user=aker sslmode=verify-ca sslrootcert=/ca.crt").unwrap();
        assert_eq!(s.mode, SslMode::VerifyCa);
        assert_eq!(s.url, "host=db user=aker sslmode=require");
        let s = split_url("postgresql://aker@db/postgres").unwrap();
        assert_eq!(s.mode, SslMode::Prefer);
        assert_eq!(s.url, "postgresql://aker@db/postgres?sslmode=prefer");
        let s = split_url("host=db sslmode=disable").unwrap();
        assert_eq!(
            (s.mode, s.url.as_str()),
            (SslMode::Disable, "host=db sslmode=disable")
        );
        for bad in [
            "postgresql://db/x?sslmode=verify-everything",
            "postgresql://db/x?sslmode=allow",
            "postgresql://db/x?sslmode=disable&sslrootcert=/ca",
            "postgresql://db/x?sslrootcert=%zz",
            "host=db sslrootcert='/a b'",
        ] {
            assert!(split_url(bad).is_err(), "{bad}");
        }
        // verify-* without a root file (and no ~/.postgresql/root.crt): refused.
        if std::env::var_os("HOME")
            .map(|h| !PathBuf::from(h).join(".postgresql/root.crt").exists())
            .unwrap_or(true)
        {
            let e = connector(SslMode::VerifyFull, None).unwrap_err();
            assert!(e.contains("sslrootcert"), "{e}");
        }
        assert!(connector(SslMode::Disable, None).unwrap().is_none());
        assert!(connector(SslMode::Require, None).unwrap().is_some());
    }
}
