//! Service configuration. Everything arrives explicitly (CLI flags / env via clap in `main.rs`, or a
//! struct literal in tests); nothing is read from globals later.

use std::net::SocketAddr;
use std::time::Duration;

use dlock_common::auth::{Credentials, Role};

/// Env prefix of this service's credentials: `PAYMENT_RESOURCE_{ADMIN,EXECUTOR,CLIENT}_TOKEN`
/// (or `…_TOKEN_FILE`).
pub const CREDENTIALS_PREFIX: &str = "PAYMENT_RESOURCE";
/// The roles this service admits (docs/security.md).
pub const ROLES: &[Role] = &[Role::Admin, Role::Executor, Role::Client];

/// `payment.fencing.enabled` (env `PAYMENT_FENCING_ENABLED`). Selects the statement variant of
/// (a)(b)(c) at the repository boundary; it is never expressed as a sentinel token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fencing {
    #[default]
    Enabled,
    /// The kill switch: the demo's evidence that without fencing a stale holder corrupts balances.
    Disabled,
}

impl Fencing {
    pub fn from_enabled(enabled: bool) -> Self {
        if enabled {
            Fencing::Enabled
        } else {
            Fencing::Disabled
        }
    }

    pub fn is_enabled(self) -> bool {
        self == Fencing::Enabled
    }
}

#[derive(Debug, Clone)]
pub struct Config {
    /// paydb, as role `payapp`.
    pub database_url: String,
    /// Where to listen; port 0 picks a free port (tests, the demo).
    pub listen: SocketAddr,
    pub fencing: Fencing,
    pub max_connections: u32,
    /// How long a request waits for a pooled connection before answering 503.
    pub acquire_timeout: Duration,
    /// Bearer credentials per role; a role without one admits nobody. Redacted in `Debug`.
    pub credentials: Credentials,
}

impl Config {
    /// Defaults for everything but the database.
    pub fn new(database_url: impl Into<String>) -> Self {
        Self {
            database_url: database_url.into(),
            listen: SocketAddr::from(([127, 0, 0, 1], 8081)),
            fencing: Fencing::Enabled,
            max_connections: 16,
            acquire_timeout: Duration::from_secs(5),
            credentials: Credentials::new(),
        }
    }

    /// Same, on an ephemeral loopback port.
    pub fn ephemeral(database_url: impl Into<String>) -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            ..Self::new(database_url)
        }
    }

    pub fn with_credentials(mut self, credentials: Credentials) -> Self {
        self.credentials = credentials;
        self
    }

    pub fn with_fencing(mut self, fencing: Fencing) -> Self {
        self.fencing = fencing;
        self
    }
}

/// Parses a boolean config value strictly: `true` or `false` (any case). Anything else is an error
/// rather than a silent default, so a typo cannot switch fencing off.
pub fn parse_bool(value: &str) -> Result<bool, String> {
    match value.trim().to_ascii_lowercase().as_str() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(format!("expected true or false, got {value:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fencing_defaults_on() {
        assert_eq!(Fencing::default(), Fencing::Enabled);
        assert_eq!(Config::new("postgres://x").fencing, Fencing::Enabled);
    }

    #[test]
    fn bools_are_strict() {
        assert_eq!(parse_bool("true"), Ok(true));
        assert_eq!(parse_bool("FALSE"), Ok(false));
        for bad in ["", "0", "no", "off", "yes", "ture"] {
            assert!(parse_bool(bad).is_err(), "{bad:?}");
        }
    }
}
