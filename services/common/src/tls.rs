//! TLS for the services' HTTP APIs: the certificate and key files ([`TlsFiles`]), checked when they
//! are loaded (missing, not PEM, a key that does not match the certificate, an expired
//! certificate), and the server side ([`ServerTls`]) that [`crate::serve`] terminates TLS with.
//!
//! The files are re-read when they change, so that a certificate renewed in place (a mounted
//! Kubernetes Secret, cert-manager, a cron job) is served without a restart: every handshake
//! compares the files' metadata with what was loaded; on a change the pair is loaded again and, if
//! it is good, used from that handshake on (`tls_certificate_reloaded`). A pair that fails to load
//! (half written, mismatched, expired) is logged once per change (`tls_certificate_reload_failed`)
//! and the last good pair keeps being served.
//!
//! rustls with the ring provider (the one the database connections use; aws-lc would need cmake),
//! TLS 1.2 and 1.3, ALPN `h2` and `http/1.1`.

use std::fmt;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

/// The environment variable that may name the certificate file (as `--tls-cert-file` does).
pub const TLS_CERT_FILE_ENV: &str = "DLOCK_TLS_CERT_FILE";
/// The environment variable that may name the private key file (as `--tls-key-file` does).
pub const TLS_KEY_FILE_ENV: &str = "DLOCK_TLS_KEY_FILE";

/// The environment variable that may say `--plaintext`.
pub const PLAINTEXT_ENV: &str = "DLOCK_PLAINTEXT";

/// The ALPN protocols the servers offer, preferred first.
pub const ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// The HTTPS flags of every dlock server, flattened into its command line.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct TlsArgs {
    /// The server certificate (PEM, leaf first, then any intermediates) of HTTPS. With
    /// `--tls-key-file` the listen address serves HTTPS only (TLS 1.2 and 1.3); the files are
    /// re-read when they change. Without both, the server starts only with `--plaintext`.
    #[arg(long, env = TLS_CERT_FILE_ENV)]
    pub tls_cert_file: Option<PathBuf>,
    /// The private key (PEM) of `--tls-cert-file`.
    #[arg(long, env = TLS_KEY_FILE_ENV)]
    pub tls_key_file: Option<PathBuf>,
    /// Serve plain HTTP, without TLS: credentials and grants then cross the network in
    /// cleartext, and the server says so at start-up (`plaintext_http`, WARN). Must be asked for:
    /// without it, a server given no certificate refuses to start.
    #[arg(long, env = PLAINTEXT_ENV, conflicts_with_all = ["tls_cert_file", "tls_key_file"],
          value_parser = clap::builder::FalseyValueParser::new())]
    pub plaintext: bool,
}

impl TlsArgs {
    /// Both files, and a pair that can be served, or `--plaintext` (`None`): checked when the
    /// configuration is read, so that a bad file, or no choice at all, stops the binary before it
    /// starts anything, naming the file and the reason.
    pub fn into_files(self) -> Result<Option<TlsFiles>, TlsError> {
        let files = TlsFiles::from_options(self.tls_cert_file, self.tls_key_file)?;
        match (&files, self.plaintext) {
            (Some(files), false) => files.check()?,
            (None, true) => {}
            (None, false) => return Err(TlsError::NoChoice),
            // clap refuses both on the command line; a caller building `TlsArgs` itself may not.
            (Some(_), true) => return Err(TlsError::Both),
        }
        Ok(files)
    }
}

/// A CA file as a TLS client will trust it: readable, PEM, at least one certificate, each usable as
/// a root. On failure, the reason (the caller's error names the file): `cannot read it: …`,
/// `not PEM: …`, `not a usable CA certificate: …`.
pub fn check_ca_file(path: &Path) -> Result<(), String> {
    let pem = fs::read(path).map_err(|e| format!("cannot read it: {e}"))?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|e| format!("not PEM: {e}"))?;
        roots
            .add(cert)
            .map_err(|e| format!("not a usable CA certificate: {e}"))?;
    }
    if roots.is_empty() {
        return Err("not PEM: it holds no certificate (no -----BEGIN CERTIFICATE----- block)".into());
    }
    Ok(())
}

/// A server's certificate chain (PEM, leaf first) and its private key (PEM: PKCS#8, PKCS#1 or
/// SEC1), as two files. The paths are not secret; the key's content never leaves [`ServerTls`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl TlsFiles {
    /// Both or neither: one without the other is a configuration error.
    pub fn from_options(cert: Option<PathBuf>, key: Option<PathBuf>) -> Result<Option<Self>, TlsError> {
        match (cert, key) {
            (Some(cert), Some(key)) => Ok(Some(Self { cert, key })),
            (None, None) => Ok(None),
            (Some(_), None) => Err(TlsError::Half {
                given: "certificate",
                missing: "key",
            }),
            (None, Some(_)) => Err(TlsError::Half {
                given: "key",
                missing: "certificate",
            }),
        }
    }

    /// Loads and checks the pair as a server would serve it, and throws it away: the start-up
    /// check that lets a binary refuse a bad pair before it starts anything.
    pub fn check(&self) -> Result<(), TlsError> {
        load(self, &provider()).map(|_| ())
    }
}

/// Why a certificate / key pair cannot be served. Each names the file and what is wrong with it.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error(
        "TLS needs both a certificate file and a key file: the {given} file is given, the {missing} file is not (--tls-cert-file / {TLS_CERT_FILE_ENV} and --tls-key-file / {TLS_KEY_FILE_ENV})"
    )]
    Half {
        given: &'static str,
        missing: &'static str,
    },
    #[error("the TLS {what} file {path}: cannot read it: {source}")]
    Read {
        what: &'static str,
        path: String,
        source: std::io::Error,
    },
    #[error("the TLS {what} file {path}: not PEM: {reason}")]
    NotPem {
        what: &'static str,
        path: String,
        reason: String,
    },
    #[error("the TLS certificate file {path}: not a usable certificate: {reason}")]
    BadCertificate { path: String, reason: String },
    #[error("the TLS key file {path}: not a usable private key: {reason}")]
    BadKey { path: String, reason: String },
    #[error("the TLS key file {key} does not match the certificate in {cert}")]
    KeyMismatch { cert: String, key: String },
    #[error("the TLS certificate file {path}: the certificate expired at {not_after} (UTC)")]
    Expired { path: String, not_after: String },
    #[error("the TLS certificate file {path}: the certificate is not valid before {not_before} (UTC)")]
    NotYetValid { path: String, not_before: String },
    #[error("TLS set-up: {0}")]
    Setup(String),
    #[error(
        "no TLS certificate: give --tls-cert-file / {TLS_CERT_FILE_ENV} and --tls-key-file / {TLS_KEY_FILE_ENV} to serve HTTPS, or --plaintext / {PLAINTEXT_ENV}=true to serve plain HTTP (credentials and grants then cross the network in cleartext)"
    )]
    NoChoice,
    #[error("--plaintext / {PLAINTEXT_ENV} and a TLS certificate were both given: choose one")]
    Both,
}

/// The crypto provider of every TLS endpoint here: ring.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Reads, parses and checks one pair.
fn load(files: &TlsFiles, provider: &CryptoProvider) -> Result<Arc<CertifiedKey>, TlsError> {
    let cert_path = files.cert.display().to_string();
    let key_path = files.key.display().to_string();
    let read = |what: &'static str, path: &Path| {
        fs::read(path).map_err(|source| TlsError::Read {
            what,
            path: path.display().to_string(),
            source,
        })
    };
    let cert_pem = read("certificate", &files.cert)?;
    let key_pem = read("key", &files.key)?;

    let chain = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::NotPem {
            what: "certificate",
            path: cert_path.clone(),
            reason: e.to_string(),
        })?;
    let Some(leaf) = chain.first() else {
        return Err(TlsError::NotPem {
            what: "certificate",
            path: cert_path,
            reason: "no -----BEGIN CERTIFICATE----- block".into(),
        });
    };
    let (not_before, not_after) = validity(leaf).ok_or_else(|| TlsError::BadCertificate {
        path: cert_path.clone(),
        reason: "cannot read its validity period".into(),
    })?;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or_default();
    if now > not_after {
        return Err(TlsError::Expired {
            path: cert_path,
            not_after: format_utc(not_after),
        });
    }
    if now < not_before {
        return Err(TlsError::NotYetValid {
            path: cert_path,
            not_before: format_utc(not_before),
        });
    }

    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| TlsError::NotPem {
        what: "key",
        path: key_path.clone(),
        reason: match e {
            rustls::pki_types::pem::Error::NoItemsFound => {
                "no -----BEGIN PRIVATE KEY----- (or RSA / EC PRIVATE KEY) block".into()
            }
            other => other.to_string(),
        },
    })?;
    let signing_key = provider
        .key_provider
        .load_private_key(key)
        .map_err(|e| TlsError::BadKey {
            path: key_path.clone(),
            reason: e.to_string(),
        })?;
    let certified = CertifiedKey::new(chain, signing_key);
    match certified.keys_match() {
        Ok(()) => Ok(Arc::new(certified)),
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) => {
            Err(TlsError::KeyMismatch {
                cert: cert_path,
                key: key_path,
            })
        }
        // A key whose public half rustls cannot derive cannot be compared; rustls itself serves
        // such pairs (`CertifiedKey::from_der`), and a real mismatch still fails every handshake.
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => Ok(Arc::new(certified)),
        Err(e) => Err(TlsError::BadCertificate {
            path: cert_path,
            reason: e.to_string(),
        }),
    }
}

/// What identifies one version of a file: a file replaced in place (a new inode through a rename, or
/// a Secret's symlink swap, which `fs::metadata` follows) or rewritten (mtime, length) differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: i64,
    mtime_nsec: i64,
}

fn stamp(path: &Path) -> Option<Stamp> {
    fs::metadata(path).ok().map(|m| Stamp {
        dev: m.dev(),
        ino: m.ino(),
        len: m.len(),
        mtime: m.mtime(),
        mtime_nsec: m.mtime_nsec(),
    })
}

type Stamps = (Option<Stamp>, Option<Stamp>);

fn stamps(files: &TlsFiles) -> Stamps {
    (stamp(&files.cert), stamp(&files.key))
}

/// The pair being served and the file versions it (or the last failed attempt) came from.
struct Current {
    key: Arc<CertifiedKey>,
    /// The files' stamps at the last load attempt, good or bad: no new attempt until they change.
    seen: Stamps,
}

/// The server side of TLS: the rustls configuration with a certificate resolver that follows the
/// files. Cheap to clone.
#[derive(Clone)]
pub struct ServerTls {
    config: Arc<rustls::ServerConfig>,
    resolver: Arc<FileResolver>,
}

impl fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerTls")
            .field("files", &self.resolver.files)
            .finish_non_exhaustive()
    }
}

impl ServerTls {
    /// Loads and checks the pair (an error names the file and what is wrong), and builds the
    /// server configuration: TLS 1.3 and 1.2, no client certificates, ALPN h2 then http/1.1.
    pub fn load(files: TlsFiles) -> Result<Self, TlsError> {
        let provider = provider();
        let seen = stamps(&files);
        let key = load(&files, &provider)?;
        let resolver = Arc::new(FileResolver {
            files,
            provider: provider.clone(),
            current: Mutex::new(Current { key, seen }),
        });
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .map_err(|e| TlsError::Setup(e.to_string()))?
            .with_no_client_auth()
            .with_cert_resolver(resolver.clone());
        config.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
        Ok(Self {
            config: Arc::new(config),
            resolver,
        })
    }

    /// At a service's start-up: the pair loaded (a bad one is a configuration error naming the
    /// file), and how the API is served said once: `tls_enabled` (INFO), or without files (the
    /// `--plaintext` the configuration insisted on) `plaintext_http` (WARN) naming what then
    /// crosses the network in cleartext (`cleartext`).
    pub fn start(files: Option<&TlsFiles>, cleartext: &str) -> Result<Option<Self>, TlsError> {
        let Some(files) = files else {
            tracing::warn!(
                event = "plaintext_http",
                setting = PLAINTEXT_ENV,
                "--plaintext: the API is served in plain HTTP, so {cleartext} cross the network in cleartext"
            );
            return Ok(None);
        };
        let tls = Self::load(files.clone())?;
        tracing::info!(
            event = "tls_enabled",
            cert_file = %files.cert.display(),
            key_file = %files.key.display(),
            "serving HTTPS only (TLS 1.2 and 1.3); the certificate files are re-read when they change"
        );
        Ok(Some(tls))
    }

    /// The files this serves.
    pub fn files(&self) -> &TlsFiles {
        &self.resolver.files
    }

    /// The acceptor for one listener.
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.config.clone())
    }

    /// The leaf certificate (DER) new handshakes get now, after looking at the files.
    pub fn current_certificate(&self) -> Option<CertificateDer<'static>> {
        let key = self.resolver.current();
        key.end_entity_cert().ok().map(|c| c.clone().into_owned())
    }
}

struct FileResolver {
    files: TlsFiles,
    provider: Arc<CryptoProvider>,
    current: Mutex<Current>,
}

impl fmt::Debug for FileResolver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FileResolver")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

impl FileResolver {
    /// The pair to serve: the loaded one, or the files' new version when they changed and it
    /// loads. Two `stat`s per handshake, and a read of two small files only when they changed: cheap
    /// next to the handshake itself, and it needs no timer task that every service would have to
    /// start and stop.
    fn current(&self) -> Arc<CertifiedKey> {
        let now = stamps(&self.files);
        // A poisoned lock still holds a pair that was good when it was stored.
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if now != current.seen {
            current.seen = now;
            match load(&self.files, &self.provider) {
                Ok(key) => {
                    current.key = key;
                    tracing::info!(
                        event = "tls_certificate_reloaded",
                        cert_file = %self.files.cert.display(),
                        key_file = %self.files.key.display(),
                        "the TLS certificate files changed; new connections get the new certificate"
                    );
                }
                Err(e) => tracing::error!(
                    event = "tls_certificate_reload_failed",
                    cert_file = %self.files.cert.display(),
                    key_file = %self.files.key.display(),
                    error = %e,
                    "the TLS certificate files changed but cannot be served; keeping the last good certificate"
                ),
            }
        }
        current.key.clone()
    }
}

impl ResolvesServerCert for FileResolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

// ---- the validity period of a certificate ------------------------------------------------------
//
// rustls does not expose a certificate's dates, and a whole X.509 parser (with its own dependency
// tree) for two fields is more than this needs: the walk below reads the DER of
// `Certificate ::= SEQUENCE { tbsCertificate SEQUENCE { [0] version OPTIONAL, serialNumber,
// signature, issuer, validity SEQUENCE { notBefore Time, notAfter Time }, ... }, ... }` (RFC 5280
// 4.1). Anything it does not understand is `None`, which the caller refuses.

/// One DER element: (tag, contents, the rest after it).
fn der_element(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
        (len, &rest[n..])
    };
    if rest.len() < len {
        return None;
    }
    Some((tag, &rest[..len], &rest[len..]))
}

const SEQUENCE: u8 = 0x30;
const UTC_TIME: u8 = 0x17;
const GENERALIZED_TIME: u8 = 0x18;

/// (notBefore, notAfter) of a certificate, as Unix seconds.
pub fn validity(cert: &[u8]) -> Option<(i64, i64)> {
    let (tag, certificate, _) = der_element(cert)?;
    if tag != SEQUENCE {
        return None;
    }
    let (tag, mut tbs, _) = der_element(certificate)?;
    if tag != SEQUENCE {
        return None;
    }
    // [0] EXPLICIT version, when present.
    if tbs.first() == Some(&0xa0) {
        tbs = der_element(tbs)?.2;
    }
    // serialNumber, signature, issuer.
    for _ in 0..3 {
        tbs = der_element(tbs)?.2;
    }
    let (tag, validity, _) = der_element(tbs)?;
    if tag != SEQUENCE {
        return None;
    }
    let (tag_before, before, rest) = der_element(validity)?;
    let (tag_after, after, _) = der_element(rest)?;
    Some((der_time(tag_before, before)?, der_time(tag_after, after)?))
}

/// UTCTime `YYMMDDHHMMSSZ` (years 1950..2049) or GeneralizedTime `YYYYMMDDHHMMSSZ`, as Unix seconds.
fn der_time(tag: u8, text: &[u8]) -> Option<i64> {
    let text = std::str::from_utf8(text).ok()?;
    let digits = text.strip_suffix('Z')?;
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let num = |s: &str| s.parse::<i64>().ok();
    let (year, rest) = match (tag, digits.len()) {
        (UTC_TIME, 12) => {
            let yy = num(&digits[..2])?;
            (if yy < 50 { 2000 + yy } else { 1900 + yy }, &digits[2..])
        }
        (GENERALIZED_TIME, 14) => (num(&digits[..4])?, &digits[4..]),
        _ => return None,
    };
    let field = |i: usize| num(&rest[i..i + 2]);
    let (month, day, hour, minute, second) = (field(0)?, field(2)?, field(4)?, field(6)?, field(8)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    Some(days_from_civil(year, month, day) * 86_400 + hour * 3_600 + minute * 60 + second)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's `days_from_civil`).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// `YYYY-MM-DD HH:MM:SS` of Unix seconds (for messages).
fn format_utc(secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // civil_from_days, the inverse of days_from_civil.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}",
        rem / 3_600,
        rem % 3_600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(clap::Parser, Debug)]
    struct Flags {
        #[command(flatten)]
        tls: TlsArgs,
    }

    fn parsed(args: &[&str]) -> Result<TlsArgs, clap::Error> {
        use clap::Parser;
        Flags::try_parse_from(std::iter::once("server").chain(args.iter().copied())).map(|f| f.tls)
    }

    #[test]
    fn plain_http_must_be_asked_for() {
        // Neither a certificate nor --plaintext: refused, naming both ways out.
        let none = parsed(&[]).expect("parses").into_files();
        let message = none.expect_err("no choice is refused").to_string();
        assert!(
            message.contains("--tls-cert-file") && message.contains("--plaintext"),
            "{message}"
        );

        // --plaintext alone: plain HTTP.
        assert!(
            parsed(&["--plaintext"])
                .expect("parses")
                .into_files()
                .expect("plain")
                .is_none()
        );

        // Both: clap refuses the command line, and a TlsArgs built by hand is refused too.
        assert!(
            parsed(&[
                "--plaintext",
                "--tls-cert-file",
                "c.pem",
                "--tls-key-file",
                "k.pem"
            ])
            .is_err()
        );
        let both = TlsArgs {
            tls_cert_file: Some("c.pem".into()),
            tls_key_file: Some("k.pem".into()),
            plaintext: true,
        };
        assert!(matches!(both.into_files(), Err(TlsError::Both)));
    }

    #[test]
    fn dates_round_trip_and_known_points() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(der_time(UTC_TIME, b"700101000000Z"), Some(0));
        assert_eq!(
            der_time(GENERALIZED_TIME, b"20380119031408Z"),
            Some(2_147_483_648)
        );
        assert_eq!(
            der_time(UTC_TIME, b"491231235959Z"),
            der_time(GENERALIZED_TIME, b"20491231235959Z")
        );
        assert_eq!(format_utc(2_147_483_648), "2038-01-19 03:14:08");
        assert_eq!(format_utc(0), "1970-01-01 00:00:00");
        for bad in [
            &b"700101000000"[..],
            b"7001010000Z",
            b"701301000000Z",
            b"70010100000xZ",
        ] {
            assert_eq!(der_time(UTC_TIME, bad), None, "{bad:?}");
        }
    }

    #[test]
    fn half_a_pair_is_refused_naming_the_missing_file() {
        let e = TlsFiles::from_options(Some("c.pem".into()), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("the key file is not"), "{e}");
        let e = TlsFiles::from_options(None, Some("k.pem".into()))
            .unwrap_err()
            .to_string();
        assert!(e.contains("the certificate file is not"), "{e}");
        assert_eq!(TlsFiles::from_options(None, None).unwrap(), None);
    }

    #[test]
    fn garbage_is_not_a_validity() {
        assert_eq!(validity(b""), None);
        assert_eq!(validity(&[0x30, 0x03, 0x02, 0x01, 0x01]), None);
        assert_eq!(validity(&[0x30, 0x85, 0, 0, 0, 0, 0]), None);
    }
}
