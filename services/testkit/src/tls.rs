//! Certificates for tests that need TLS (to PostgreSQL, and lock-server's HTTPS): a throw-away CA
//! ([`TestCa`]) and server certificates it signs for given host names and addresses — valid ones,
//! and expired ones ([`TestCa::issue_expired`]). A certificate for another name is
//! [`TestCa::issue`] with that name; a client-side wrong CA is another [`TestCa`].
//!
//! They are made with the `openssl` command rather than a certificate crate: the tests already
//! need openssl (the cluster tier), a crate such as rcgen would add a crypto backend to compile
//! (aws-lc by default, which needs cmake), and these are the commands an operator runs by hand
//! for a private CA (docs/operations.md, "TLS to PostgreSQL"), so the tests exercise certificates
//! made the way deployments make theirs.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::PgError;

/// An HTTP client that trusts the CA certificate(s) in `ca` and nothing else (no built-in
/// roots), as every dlock client of an `https://` URL does.
pub fn client_trusting(ca: &Path, timeout: std::time::Duration) -> anyhow::Result<reqwest::Client> {
    Ok(client_builder_trusting(ca)?.timeout(timeout).build()?)
}

/// [`client_trusting`] before it is built, for a client that needs more settings (a pool's idle
/// timeout, …): trusts the CA certificate(s) in `ca` and nothing else.
pub fn client_builder_trusting(ca: &Path) -> anyhow::Result<reqwest::ClientBuilder> {
    use anyhow::Context;
    let pem = fs::read(ca).with_context(|| format!("read the CA file {}", ca.display()))?;
    let mut builder = reqwest::Client::builder().tls_built_in_root_certs(false);
    for cert in reqwest::Certificate::from_pem_bundle(&pem)? {
        builder = builder.add_root_certificate(cert);
    }
    Ok(builder)
}

/// A CA for one test's servers: `ca.crt` (the file a client names in `sslrootcert`) and its key,
/// in a folder of their own. Two `TestCa`s never trust each other's certificates.
#[derive(Debug)]
pub struct TestCa {
    dir: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

/// A server certificate and its private key (PEM files), signed by a [`TestCa`].
#[derive(Debug, Clone)]
pub struct ServerCert {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// A minimal openssl configuration, so that the system's openssl.cnf (its default extensions and
/// policies, which differ between distributions) plays no part in what the certificates hold.
const REQ_CONFIG: &str = "[req]\ndistinguished_name = dn\nprompt = no\n[dn]\n";

impl TestCa {
    /// A new CA (EC P-256, valid for two days) in a fresh folder under the temp dir, removed when
    /// the process exits. `label` names the folder and the CA's common name.
    pub fn new(label: &str) -> Result<Self, PgError> {
        let dir = super::scratch_dir(&format!("ca-{label}"))?;
        write(
            &dir.join("req.cnf"),
            &format!(
                "{REQ_CONFIG}[ca_ext]\n\
                 basicConstraints = critical, CA:TRUE\n\
                 keyUsage = critical, keyCertSign, cRLSign\n\
                 subjectKeyIdentifier = hash\n"
            ),
        )?;
        let cert = dir.join("ca.crt");
        let key = dir.join("ca.key");
        let mut req = Command::new("openssl");
        req.args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
        ])
        .args(["-nodes", "-days", "2", "-subj"])
        .arg(format!("/CN=dlock test CA {label}"))
        .arg("-config")
        .arg(dir.join("req.cnf"))
        .args(["-extensions", "ca_ext", "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&cert);
        openssl(req)?;
        Ok(Self { dir, cert, key })
    }

    /// The CA certificate (PEM): what `sslrootcert=` names.
    pub fn cert(&self) -> &Path {
        &self.cert
    }

    /// A server certificate signed by this CA, valid for `names` (host names, or IP addresses such
    /// as `127.0.0.1`, which go into the subjectAltName as IP entries: TLS clients check those,
    /// not the common name), written as `<file_stem>.crt` / `<file_stem>.key` in this CA's folder.
    pub fn issue(&self, file_stem: &str, names: &[&str]) -> Result<ServerCert, PgError> {
        self.issue_with(file_stem, names, None, "2", "serverAuth")
    }

    /// [`issue`](Self::issue), but valid from a day ago (signed as of then, for three days): for
    /// clients whose wall clock may run behind (a clock-skew fault), which would find a
    /// certificate issued a moment ago not valid yet. The CA itself is a trust anchor, whose dates
    /// TLS clients do not check. Needs libfaketime, as [`issue_expired`](Self::issue_expired) does.
    pub fn issue_backdated(&self, file_stem: &str, names: &[&str]) -> Result<ServerCert, PgError> {
        self.issue_with(file_stem, names, Some("-1d"), "3", "serverAuth")
    }

    /// A client certificate signed by this CA (extended key usage `clientAuth`, which servers that
    /// verify client certificates, etcd's `--client-cert-auth` among them, require), for `name`.
    pub fn issue_client(&self, file_stem: &str, name: &str) -> Result<ServerCert, PgError> {
        self.issue_with(file_stem, &[name], None, "2", "clientAuth")
    }

    /// [`issue`](Self::issue), but expired: signed as of three days ago, valid for one day (so it
    /// expired two days ago), by this CA, which is valid now. The clock is moved for the one openssl
    /// command with libfaketime (openssl 3.0 has no option to set the dates of `x509 -req`).
    pub fn issue_expired(&self, file_stem: &str, names: &[&str]) -> Result<ServerCert, PgError> {
        self.issue_with(file_stem, names, Some("-3d"), "1", "serverAuth")
    }

    fn issue_with(
        &self,
        file_stem: &str,
        names: &[&str],
        signed_at: Option<&str>,
        days: &str,
        usage: &str,
    ) -> Result<ServerCert, PgError> {
        let Some(first) = names.first() else {
            return Err(PgError::State(
                "a server certificate needs at least one name".into(),
            ));
        };
        let san: Vec<String> = names
            .iter()
            .map(|n| match n.parse::<std::net::IpAddr>() {
                Ok(_) => format!("IP:{n}"),
                Err(_) => format!("DNS:{n}"),
            })
            .collect();
        let config = self.dir.join("req.cnf");
        let ext = self.dir.join(format!("{file_stem}.ext"));
        write(
            &ext,
            &format!(
                "basicConstraints = critical, CA:FALSE\n\
                 keyUsage = critical, digitalSignature, keyEncipherment\n\
                 extendedKeyUsage = {usage}\n\
                 subjectKeyIdentifier = hash\n\
                 authorityKeyIdentifier = keyid\n\
                 subjectAltName = {}\n",
                san.join(", "),
            ),
        )?;
        let csr = self.dir.join(format!("{file_stem}.csr"));
        let cert = self.dir.join(format!("{file_stem}.crt"));
        let key = self.dir.join(format!("{file_stem}.key"));
        let mut req = Command::new("openssl");
        req.args([
            "req",
            "-new",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
        ])
        .args(["-nodes", "-subj"])
        .arg(format!("/CN={first}"))
        .arg("-config")
        .arg(&config)
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&csr);
        openssl(req)?;
        let mut sign = Command::new("openssl");
        if let Some(offset) = signed_at {
            // libfaketime preloaded into the one command, as the campaign's clock nemesis does; not
            // the `faketime` wrapper, whose semaphore and shared memory are named by its pid and
            // outlive a wrapper that was killed, so a later one given the same pid fails
            // ("sem_open: File exists").
            let lib = libfaketime().ok_or_else(|| PgError::Tool {
                tool: "libfaketime".into(),
                status: "not installed".into(),
                stderr: "a backdated or expired certificate needs libfaketime (Debian: faketime; scripts/setup.sh installs it)".into(),
            })?;
            sign.env("LD_PRELOAD", lib)
                .env("FAKETIME", offset)
                .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
        }
        sign.args(["x509", "-req", "-days", days, "-in"])
            .arg(&csr)
            .arg("-CA")
            .arg(&self.cert)
            .arg("-CAkey")
            .arg(&self.key)
            // A serial of its own for each certificate, without a serial file shared between calls.
            .args(["-set_serial", &format!("{}", serial())])
            .arg("-extfile")
            .arg(&ext)
            .arg("-out")
            .arg(&cert);
        openssl(sign)?;
        Ok(ServerCert { cert, key })
    }
}

/// libfaketime (Debian's `faketime` package, which scripts/setup.sh installs), if installed: the
/// library a command is started with (`LD_PRELOAD`, `FAKETIME=<offset>`) to see another time.
pub fn libfaketime() -> Option<PathBuf> {
    [
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/faketime/libfaketime.so.1",
    ]
    .iter()
    .map(PathBuf::from)
    .find(|p| p.is_file())
}

fn serial() -> u128 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(1);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    (nanos << 16) | u128::from(N.fetch_add(1, Ordering::Relaxed) & 0xffff)
}

fn write(path: &Path, text: &str) -> Result<(), PgError> {
    fs::write(path, text).map_err(io_err(path))
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> PgError {
    let what = format!("write {}", path.display());
    move |source| PgError::Io { what, source }
}

/// Runs one openssl command (with libfaketime or not) to its end; [`PgError::Tool`] with its stderr when it fails.
fn openssl(mut cmd: Command) -> Result<(), PgError> {
    let out = cmd.stdin(Stdio::null()).output().map_err(|source| PgError::Io {
        what: "run openssl (install it, and libfaketime for expired certificates: the TLS tests make their certificates with them)".into(),
        source,
    })?;
    if !out.status.success() {
        return Err(PgError::Tool {
            tool: "openssl".into(),
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(())
}
