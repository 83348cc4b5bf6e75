//! What the stub does when nobody says otherwise, and the bounds on it.

use std::net::SocketAddr;
use std::time::Duration;

use dlock_common::tls::{TlsError, TlsFiles};

use serde::{Deserialize, Serialize};

/// Longest added latency accepted from a flag, a header or the admin endpoint (10 minutes).
pub const MAX_LATENCY_MS: u64 = 600_000;
/// Longest a TIMEOUT answer may hang (1 hour): long past any caller's timeout, never forever.
pub const MAX_TIMEOUT_HANG_MS: u64 = 3_600_000;

/// The outcome a first request for an idempotency key gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Pay and answer 200 ACKED.
    Ack,
    /// Do not pay; answer 422 REJECTED.
    Reject,
    /// Pay, then hang past the caller's timeout: the ambiguous case.
    Timeout,
}

impl Mode {
    /// Case-insensitive `ack|reject|timeout` (header values and admin bodies).
    pub fn parse(text: &str) -> Option<Self> {
        match text.to_ascii_lowercase().as_str() {
            "ack" => Some(Mode::Ack),
            "reject" => Some(Mode::Reject),
            "timeout" => Some(Mode::Timeout),
            _ => None,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Config {
    /// Port 0 picks a free port; [`crate::RunningServer::addr`] reports it.
    pub listen: SocketAddr,
    /// Default outcome for a first request.
    pub mode: Mode,
    /// Default latency added before every answer.
    pub latency_ms: u64,
    /// How long a TIMEOUT answer hangs (it also ends at shutdown).
    pub timeout_hang_ms: u64,
    /// Allows per-request outcome headers and `PUT /v1/admin/behaviour`. Never on in production.
    pub test_mode: bool,
    /// The certificate and key files of HTTPS (`--tls-cert-file`, `--tls-key-file`). `Some`: the
    /// listen address serves HTTPS only; `None`: plain HTTP, with a WARN at start-up.
    pub tls: Option<TlsFiles>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("latency must be at most {MAX_LATENCY_MS} ms, got {0}")]
    Latency(u64),
    #[error("timeout hang must be between 1 and {MAX_TIMEOUT_HANG_MS} ms, got {0}")]
    TimeoutHang(u64),
    #[error("{0}")]
    Tls(#[from] TlsError),
}

impl Config {
    /// Loopback, free port, ACK, no latency, test mode on, a 30 s hang for TIMEOUT.
    pub fn for_tests() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            mode: Mode::Ack,
            latency_ms: 0,
            timeout_hang_ms: 30_000,
            test_mode: true,
            tls: None,
        }
    }

    /// Serves HTTPS with the certificate and key in `files`.
    pub fn with_tls(mut self, files: TlsFiles) -> Self {
        self.tls = Some(files);
        self
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.latency_ms > MAX_LATENCY_MS {
            return Err(ConfigError::Latency(self.latency_ms));
        }
        if self.timeout_hang_ms == 0 || self.timeout_hang_ms > MAX_TIMEOUT_HANG_MS {
            return Err(ConfigError::TimeoutHang(self.timeout_hang_ms));
        }
        Ok(())
    }

    pub fn timeout_hang(&self) -> Duration {
        Duration::from_millis(self.timeout_hang_ms)
    }
}

#[derive(Debug, clap::Parser)]
#[command(name = "rail-stub", about = "A stand-in external payment rail for dlock")]
pub struct Cli {
    /// Address to listen on.
    #[arg(long, env = "RAIL_STUB_LISTEN", default_value = "127.0.0.1:8090")]
    pub listen: SocketAddr,
    /// Default outcome of a first request for an idempotency key.
    #[arg(long, env = "RAIL_STUB_MODE", value_enum, default_value_t = Mode::Ack)]
    pub mode: Mode,
    /// Latency added before every answer, in milliseconds.
    #[arg(long, env = "RAIL_STUB_LATENCY_MS", default_value_t = 0)]
    pub latency_ms: u64,
    /// How long a TIMEOUT answer hangs (after paying), in milliseconds; ends early at shutdown.
    #[arg(long, env = "RAIL_STUB_TIMEOUT_HANG_MS", default_value_t = 30_000)]
    pub timeout_hang_ms: u64,
    /// Enables the X-Rail-Stub-* request headers and PUT /v1/admin/behaviour. Tests and demos only.
    #[arg(long, env = "RAIL_STUB_TEST_MODE")]
    pub test_mode: bool,
    /// HTTPS: `--tls-cert-file`, `--tls-key-file` (the same flags in every server).
    #[command(flatten)]
    pub tls: dlock_common::tls::TlsArgs,
}

impl Cli {
    /// The [`Config`]; its bounds are checked by `spawn` ([`Config::validate`]), which the server
    /// kit reports as a configuration error (exit 2). The TLS files are checked here, so that a bad
    /// pair stops the binary before it starts anything, naming the file and the reason.
    pub fn into_config(self) -> Result<Config, ConfigError> {
        let tls = self.tls.into_files()?;
        Ok(Config {
            listen: self.listen,
            mode: self.mode,
            latency_ms: self.latency_ms,
            timeout_hang_ms: self.timeout_hang_ms,
            test_mode: self.test_mode,
            tls,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The command line as given, with `--plaintext` unless it names a TLS file: these tests are
    /// about other flags.
    fn parse<I: IntoIterator<Item = S>, S: Into<String>>(args: I) -> Result<Cli, clap::Error> {
        use clap::Parser;
        Cli::try_parse_from(dlock_testkit::procs::plaintext_unless_tls(args))
    }

    fn cli(args: &[&str]) -> Cli {
        let mut all = vec!["rail-stub"];
        all.extend_from_slice(args);
        parse(all).expect("parses")
    }

    #[test]
    fn tls_files_come_in_pairs_and_are_checked_at_start_up() {
        assert_eq!(cli(&[]).into_config().unwrap().tls, None);
        let e = cli(&["--tls-cert-file", "/nonexistent/tls.crt"])
            .into_config()
            .unwrap_err();
        assert!(
            matches!(e, ConfigError::Tls(TlsError::Half { missing: "key", .. })),
            "{e:?}"
        );
        let e = cli(&["--tls-key-file", "/nonexistent/tls.key"])
            .into_config()
            .unwrap_err();
        assert!(
            matches!(
                e,
                ConfigError::Tls(TlsError::Half {
                    missing: "certificate",
                    ..
                })
            ),
            "{e:?}"
        );
        // Both given but unreadable: refused naming the file, not served later.
        let e = cli(&[
            "--tls-cert-file",
            "/nonexistent/tls.crt",
            "--tls-key-file",
            "/nonexistent/tls.key",
        ])
        .into_config()
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("/nonexistent/tls.crt") && e.contains("cannot read"),
            "{e}"
        );
    }
}
