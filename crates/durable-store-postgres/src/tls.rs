//! TLS for [`PostgresStore::connect`](crate::PostgresStore::connect), chosen by the URL's
//! `sslmode` as libpq chooses it:
//!
//! | `sslmode` | encrypted | the server's certificate |
//! |---|---|---|
//! | absent, `disable`, `prefer` | no (plain TCP or a Unix socket) | — |
//! | `require` | yes | not checked — unless `sslrootcert=<file>` is given, then as `verify-ca` |
//! | `verify-ca` | yes | signed by a CA of the PEM file `sslrootcert=<path>` names |
//! | `verify-full` | yes | signed by a trusted CA, and issued for the host connected to |
//!
//! `verify-full`'s trusted CAs are those of `sslrootcert=<path>`, or the system's
//! (`sslrootcert=system`, or no `sslrootcert`; `sslrootcert=system` alone means
//! `verify-full`, as in libpq 16). `verify-ca` or `require` with the system's CAs is refused:
//! any publicly trusted certificate of any host would pass. So is `sslrootcert` without a
//! mode that uses it. TLS runs on rustls with the `ring` provider. `prefer` stays plain (libpq
//! would try TLS first): what a URL without `sslmode` does is unchanged.
//!
//! `tokio-postgres` knows only `disable`, `prefer` and `require`, and no `sslrootcert`: the
//! URL is read here first, those parameters are taken out of it, and the rest goes to it.

use std::fmt;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect};

use crate::error::{Error, Result};

/// How the URL asks to check the server's certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verify {
    /// `sslmode=require` without `sslrootcert`: encrypted, not authenticated.
    Nothing,
    /// `verify-ca` (or `require` with `sslrootcert`): a trusted CA signed it.
    Ca,
    /// `verify-full`: a trusted CA signed it for the host.
    Full,
}

/// The TLS parameters of a URL, taken out of it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct TlsParams {
    /// `None`: no TLS (`sslmode` absent, `disable` or `prefer`).
    pub(crate) verify: Option<Verify>,
    /// `sslrootcert`: a PEM file, or `system`.
    pub(crate) root_cert: Option<String>,
}

/// Splits `url` into what `tokio-postgres` parses (`sslmode=verify-*` made `require`,
/// `sslrootcert` removed) and the TLS parameters. Both URL forms: `postgres://…?k=v&…` (read
/// as tokio-postgres reads it: the credentials up to the first `@`, the query from the first
/// `?` after them) and libpq's `k=v k='v'`. A string without `sslmode` or `sslrootcert` goes
/// on unchanged.
///
/// # Errors
/// [`Error::InvalidUrl`] for a string of neither form (another scheme, no `=`), and for a
/// combination that would not check what it seems to:
/// `sslrootcert` with no `sslmode` or `prefer` (nothing would use it), and `verify-ca` or
/// `require` with the system's CAs (any publicly trusted certificate of any host would pass:
/// use `verify-full`, as libpq 16 demands).
pub(crate) fn split_url(url: &str) -> Result<(String, TlsParams)> {
    let is_url = url.starts_with("postgres://") || url.starts_with("postgresql://");
    if !is_url {
        // What tokio-postgres would call "unexpected EOF": say what is wrong with the form.
        let scheme = url.split_once("://").map(|(scheme, _)| scheme).filter(|scheme| {
            !scheme.is_empty() && scheme.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
        });
        if let Some(scheme) = scheme {
            return Err(Error::InvalidUrl {
                reason: format!("the scheme is {scheme}://; a PostgreSQL URL starts with postgres:// or postgresql://"),
            });
        }
        if !url.trim().is_empty() && !url.contains('=') {
            return Err(Error::InvalidUrl {
                reason: "it is neither a postgres:// URL nor key=value settings (host=… dbname=…)".into(),
            });
        }
    }
    let pairs = if is_url { url_params(url) } else { conninfo_params(url) };
    let mut mode: Option<String> = None;
    let mut root_cert = None;
    let mut taken = Vec::new();
    for (key, value, span) in pairs {
        match key.as_str() {
            "sslmode" => mode = Some(value),
            "sslrootcert" => root_cert = Some(value),
            _ => continue,
        }
        taken.push(span);
    }
    if taken.is_empty() {
        return Ok((url.to_string(), TlsParams::default()));
    }
    let system = root_cert.as_deref() == Some("system");
    let verify = match (mode.as_deref(), &root_cert) {
        // libpq 16: `sslrootcert=system` alone means verify-full.
        (None, Some(_)) if system => Some(Verify::Full),
        (None | Some("prefer"), Some(_)) => {
            return Err(Error::InvalidUrl {
                reason: "sslrootcert is given, but sslmode does not ask to verify the server's certificate; add \
                         sslmode=verify-full (or verify-ca)"
                    .into(),
            });
        }
        (Some("require" | "verify-ca"), _)
            if system || (root_cert.is_none() && mode.as_deref() == Some("verify-ca")) =>
        {
            return Err(Error::InvalidUrl {
                reason: "sslmode=require or verify-ca with the system's CAs would accept any publicly trusted \
                         certificate of any host: use sslmode=verify-full, or name your CA's PEM file with \
                         sslrootcert=<path>"
                    .into(),
            });
        }
        (Some("require"), Some(_)) => Some(Verify::Ca),
        (Some("require"), None) => Some(Verify::Nothing),
        (Some("verify-ca"), _) => Some(Verify::Ca),
        (Some("verify-full"), _) => Some(Verify::Full),
        (None | Some("disable" | "prefer"), _) => None,
        (Some("allow"), _) => {
            return Err(Error::InvalidUrl {
                reason: "sslmode=allow (plain first, TLS only if the server insists) is not supported: use \
                         sslmode=prefer, or require to insist on TLS"
                    .into(),
            });
        }
        (Some(other), _) => {
            return Err(Error::InvalidUrl {
                reason: format!(
                    "sslmode={} is not a mode: use disable, prefer, require, verify-ca or verify-full (lower case)",
                    other.chars().take(40).collect::<String>()
                ),
            });
        }
    };
    // The rest, without the pairs taken out (from the last, so the spans stay right).
    let mut rest = url.to_string();
    for span in taken.iter().rev() {
        rest.replace_range(span.clone(), "");
    }
    // A URL's query without the empty pairs left (only the query: a password may hold `&&`).
    let rest = match query_start(&rest).filter(|_| is_url) {
        Some(q) => {
            let pairs: Vec<&str> = rest[q + 1..].split('&').filter(|p| !p.is_empty()).collect();
            if pairs.is_empty() { rest[..q].to_string() } else { format!("{}?{}", &rest[..q], pairs.join("&")) }
        }
        None => rest,
    };
    // What tokio-postgres gets: `require` for every TLS mode; `disable`/`prefer` (or a value it
    // will refuse, by name) as given.
    let mode = if verify.is_some() { Some("require".to_string()) } else { mode };
    let rest = match mode {
        None => rest,
        Some(m) if is_url => format!("{rest}{}sslmode={m}", if query_start(&rest).is_some() { '&' } else { '?' }),
        Some(m) => format!("{} sslmode={m}", rest.trim_end()),
    };
    Ok((rest, TlsParams { verify, root_cert }))
}

/// Where a URL's query starts (its `?`), read as tokio-postgres reads it.
fn query_start(url: &str) -> Option<usize> {
    let after = url.find("://")? + 3;
    let host = url[after..].find('@').map_or(after, |at| after + at + 1);
    url[host..].find('?').map(|q| host + q)
}

/// A URL's query parameters: (decoded key, decoded value, byte span of `k=v` with one of its
/// `&` separators).
fn url_params(url: &str) -> Vec<(String, String, std::ops::Range<usize>)> {
    let Some(q) = query_start(url) else { return Vec::new() };
    let mut out = Vec::new();
    let mut at = q + 1;
    for pair in url[q + 1..].split('&') {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let end = (at + pair.len() + 1).min(url.len());
        out.push((percent_decode(k), percent_decode(v), at..end));
        at += pair.len() + 1;
    }
    out
}

/// libpq's `key = value` settings, read as tokio-postgres reads them (spaces around `=`,
/// single-quoted values with backslash escapes): (key, value, byte span of the pair). Empty
/// when the string does not parse (tokio-postgres will say why).
fn conninfo_params(s: &str) -> Vec<(String, String, std::ops::Range<usize>)> {
    let bytes = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    let skip_ws = |mut i: usize| {
        while i < bytes.len() && bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        i
    };
    loop {
        i = skip_ws(i);
        if i >= bytes.len() {
            return out;
        }
        let start = i;
        while i < bytes.len() && !bytes[i].is_ascii_whitespace() && bytes[i] != b'=' {
            i += 1;
        }
        let key = s[start..i].to_string();
        i = skip_ws(i);
        if bytes.get(i) != Some(&b'=') {
            return Vec::new();
        }
        i = skip_ws(i + 1);
        let mut value = String::new();
        if bytes.get(i) == Some(&b'\'') {
            i += 1;
            loop {
                match s[i..].chars().next() {
                    None => return Vec::new(),
                    Some('\'') => {
                        i += 1;
                        break;
                    }
                    Some('\\') => match s[i + 1..].chars().next() {
                        None => return Vec::new(),
                        Some(c) => {
                            value.push(c);
                            i += 1 + c.len_utf8();
                        }
                    },
                    Some(c) => {
                        value.push(c);
                        i += c.len_utf8();
                    }
                }
            }
        } else {
            while let Some(c) = s[i..].chars().next().filter(|c| !c.is_ascii_whitespace()) {
                if c == '\\' {
                    match s[i + 1..].chars().next() {
                        None => return Vec::new(),
                        Some(e) => {
                            value.push(e);
                            i += 1 + e.len_utf8();
                        }
                    }
                } else {
                    value.push(c);
                    i += c.len_utf8();
                }
            }
        }
        out.push((key, value, start..i));
    }
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (bytes[i], bytes.get(i + 1).copied().and_then(hex), bytes.get(i + 2).copied().and_then(hex)) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The connector for [`tokio_postgres`]: rustls with the URL's verification.
#[derive(Clone)]
pub(crate) struct MakeRustls {
    config: Arc<ClientConfig>,
}

impl fmt::Debug for MakeRustls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MakeRustls").finish_non_exhaustive()
    }
}

impl MakeRustls {
    /// The connector `params` ask for; `None` without TLS.
    ///
    /// # Errors
    /// [`Error::InvalidUrl`]: the `sslrootcert` file cannot be read or holds no certificate,
    /// or no system certificate could be loaded.
    pub(crate) fn new(params: &TlsParams) -> Result<Option<MakeRustls>> {
        let Some(verify) = params.verify else { return Ok(None) };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::InvalidOptions { reason: format!("TLS: {e}") })?;
        let chain = match verify {
            Verify::Nothing => None,
            Verify::Ca | Verify::Full => {
                let roots = Arc::new(roots(params.root_cert.as_deref())?);
                let webpki = rustls::client::WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
                    .build()
                    .map_err(|e| Error::InvalidUrl { reason: format!("sslrootcert: {e}") })?;
                Some(webpki)
            }
        };
        let verifier = Arc::new(Verifier { provider, chain, host: verify == Verify::Full });
        let config = builder.dangerous().with_custom_certificate_verifier(verifier).with_no_client_auth();
        Ok(Some(MakeRustls { config: Arc::new(config) }))
    }
}

/// The CAs to trust: the PEM file `root_cert` names, or the system's.
fn roots(root_cert: Option<&str>) -> Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    match root_cert {
        Some(path) if path != "system" => {
            let bad = |why: String| Error::InvalidUrl { reason: format!("sslrootcert={path}: {why}") };
            let certs = CertificateDer::pem_file_iter(path)
                .map_err(|e| bad(e.to_string()))?
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|e| bad(e.to_string()))?;
            let (added, _) = roots.add_parsable_certificates(certs);
            if added == 0 {
                return Err(bad("the file holds no certificate rustls can use (a PEM file is expected)".into()));
            }
        }
        _ => {
            let found = rustls_native_certs::load_native_certs();
            let (added, _) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                return Err(Error::InvalidUrl {
                    reason: format!(
                        "sslmode asks to verify the server's certificate, and no system CA certificate could be \
                         loaded ({} errors); name the CA's PEM file with sslrootcert=<path>",
                        found.errors.len()
                    ),
                });
            }
        }
    }
    Ok(roots)
}

/// Checks the server's certificate as the URL asks: not at all (`require`: encrypted, not
/// authenticated, as libpq's), or the WebPKI check (`chain`), without the host name for
/// `verify-ca`. The handshake's signatures are checked against the certificate either way.
#[derive(Debug)]
struct Verifier {
    provider: Arc<CryptoProvider>,
    chain: Option<Arc<rustls::client::WebPkiServerVerifier>>,
    host: bool,
}

impl ServerCertVerifier for Verifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        let Some(webpki) = &self.chain else { return Ok(ServerCertVerified::assertion()) };
        match webpki.verify_server_cert(end_entity, intermediates, server_name, ocsp, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) if !self.host => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

impl<S> MakeTlsConnect<S> for MakeRustls
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type TlsConnect = RustlsConnect;
    type Error = rustls::pki_types::InvalidDnsNameError;

    fn make_tls_connect(&mut self, domain: &str) -> std::result::Result<RustlsConnect, Self::Error> {
        let name = ServerName::try_from(domain.to_string())?;
        Ok(RustlsConnect { config: self.config.clone(), name })
    }
}

/// One connection's TLS handshake.
#[derive(Debug)]
pub(crate) struct RustlsConnect {
    config: Arc<ClientConfig>,
    name: ServerName<'static>,
}

impl<S> TlsConnect<S> for RustlsConnect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<RustlsStream<S>>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        Box::pin(async move {
            let connector = tokio_rustls::TlsConnector::from(self.config);
            Ok(RustlsStream(connector.connect(self.name, stream).await?))
        })
    }
}

/// An encrypted connection.
#[derive(Debug)]
pub(crate) struct RustlsStream<S>(tokio_rustls::client::TlsStream<S>);

impl<S: AsyncRead + AsyncWrite + Unpin> tokio_postgres::tls::TlsStream for RustlsStream<S> {
    fn channel_binding(&self) -> ChannelBinding {
        ChannelBinding::none()
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for RustlsStream<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for RustlsStream<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// How to open a connection of the store's own (a `LISTEN` connection): the driver's
/// configuration and the URL's TLS.
#[derive(Debug, Clone)]
pub(crate) struct Dial {
    pub(crate) cfg: tokio_postgres::Config,
    pub(crate) tls: Option<MakeRustls>,
}

impl Dial {
    /// Connects, and spawns the task that drives the connection, handing each notification's
    /// payload to `heard` until it returns `false` or the connection ends (the task ends then).
    pub(crate) async fn connect_listening(
        &self,
        heard: impl FnMut(&str) -> bool + Send + 'static,
    ) -> std::result::Result<(tokio_postgres::Client, tokio::task::JoinHandle<()>), tokio_postgres::Error> {
        Ok(match &self.tls {
            None => {
                let (client, connection) = self.cfg.connect(tokio_postgres::NoTls).await?;
                (client, tokio::spawn(drive(connection, heard)))
            }
            Some(tls) => {
                let (client, connection) = self.cfg.connect(tls.clone()).await?;
                (client, tokio::spawn(drive(connection, heard)))
            }
        })
    }
}

async fn drive<S, T>(mut connection: tokio_postgres::Connection<S, T>, mut heard: impl FnMut(&str) -> bool)
where
    S: AsyncRead + AsyncWrite + Unpin,
    T: AsyncRead + AsyncWrite + Unpin,
{
    loop {
        match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            Some(Ok(tokio_postgres::AsyncMessage::Notification(n))) => {
                if !heard(n.payload()) {
                    break;
                }
            }
            Some(Ok(_)) => {}
            Some(Err(_)) | None => break,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tls_parameters_are_taken_out_of_both_url_forms() {
        let split = |url: &str| split_url(url).expect(url);
        let tls = |verify, root: Option<&str>| TlsParams { verify: Some(verify), root_cert: root.map(String::from) };
        let none = TlsParams::default();
        assert_eq!(split("postgres://u@h/db"), ("postgres://u@h/db".into(), none.clone()));
        assert_eq!(
            split("postgres://u@h/db?sslmode=prefer"),
            ("postgres://u@h/db?sslmode=prefer".into(), none.clone())
        );
        assert_eq!(
            split("postgres://u@h/db?application_name=x&sslmode=verify-full"),
            ("postgres://u@h/db?application_name=x&sslmode=require".into(), tls(Verify::Full, None))
        );
        assert_eq!(
            split("postgresql://u@h/db?sslrootcert=%2Fetc%2Fca%20b.pem&sslmode=require&connect_timeout=5"),
            ("postgresql://u@h/db?connect_timeout=5&sslmode=require".into(), tls(Verify::Ca, Some("/etc/ca b.pem")))
        );
        assert_eq!(
            split("postgres://u@h/db?sslmode=require"),
            ("postgres://u@h/db?sslmode=require".into(), tls(Verify::Nothing, None))
        );
        // A `?`, `&` or `=` in the password (up to the first `@`) is not the query.
        assert_eq!(
            split("postgres://u:p?a&&sslmode=x@h/db?sslmode=verify-full"),
            ("postgres://u:p?a&&sslmode=x@h/db?sslmode=require".into(), tls(Verify::Full, None))
        );
        // libpq's form: quotes, escapes and spaces around `=`; the rest kept as written.
        assert_eq!(
            split("host=h password='a  b' sslmode = verify-ca sslrootcert='/my ca/\\'x.pem'"),
            ("host=h password='a  b' sslmode=require".into(), tls(Verify::Ca, Some("/my ca/'x.pem")))
        );
        assert_eq!(split("host=h  password='a  b'").0, "host=h  password='a  b'", "no TLS setting: unchanged");
        assert_eq!(split("host=h application_name=http://svc").0, "host=h application_name=http://svc");
        // libpq 16: the system's CAs alone mean verify-full.
        assert_eq!(
            split("postgres://h/db?sslrootcert=system"),
            ("postgres://h/db?sslmode=require".into(), tls(Verify::Full, Some("system")))
        );
        assert_eq!(percent_decode("a%2Fb%zz%4"), "a/b%zz%4");
    }

    #[test]
    fn strings_of_neither_form_and_settings_that_check_less_than_they_seem_are_refused() {
        for url in [
            "postgres://h/db?sslmode=verify-ca",
            "postgres://h/db?sslmode=verify-ca&sslrootcert=system",
            "postgres://h/db?sslmode=require&sslrootcert=system",
            "postgres://h/db?sslrootcert=/ca.pem",
            "postgres://h/db?sslmode=prefer&sslrootcert=/ca.pem",
            "host=h sslrootcert=/ca.pem",
            // Neither form.
            "mysql://u@h/d",
            "notaurl",
        ] {
            let e = split_url(url).expect_err(url);
            assert!(matches!(e, Error::InvalidUrl { .. }), "{url}: {e:?}");
        }
    }

    #[test]
    fn an_sslmode_that_is_no_mode_is_refused_naming_the_modes() {
        for (url, says) in [
            ("postgres://h/db?sslmode=bogus", "sslmode=bogus is not a mode: use disable, prefer, require"),
            ("host=h sslmode=VERIFY-FULL", "sslmode=VERIFY-FULL is not a mode"),
            ("postgres://h/db?sslmode=allow", "sslmode=allow (plain first, TLS only if the server insists)"),
        ] {
            let e = split_url(url).expect_err(url);
            assert!(matches!(&e, Error::InvalidUrl { reason } if reason.contains(says)), "{url}: {e:?}");
        }
        for mode in ["disable", "prefer"] {
            let url = format!("postgres://h/db?sslmode={mode}");
            assert_eq!(split_url(&url).expect(&url), (url.clone(), TlsParams::default()), "{mode}");
        }
    }
}
