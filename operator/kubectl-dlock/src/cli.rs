//! The command line. kubectl hands a plugin everything after `kubectl dlock` as it was typed, so
//! the namespace and context flags are the plugin's own (the same names as kubectl's).

use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// How long `--wait` waits by default: a revoke is a few seconds, a restore runs two Jobs.
pub const DEFAULT_WAIT: &str = "10m";

#[derive(Debug, Parser)]
#[command(
    name = "kubectl-dlock",
    bin_name = "kubectl dlock",
    version,
    about = "dlock's operator actions and status, for kubectl (docs/operations.md)"
)]
pub struct Cli {
    /// Namespace of the LockService / PaymentStack; the context's namespace when absent.
    #[arg(short = 'n', long, global = true)]
    pub namespace: Option<String>,
    /// kubeconfig context to use; the current one when absent.
    #[arg(long, global = true)]
    pub context: Option<String>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Force-revoke the grant that holds KEY now, pinned to its fencing token (annotation
    /// dlock.dev/revoke); a newer holder is never touched.
    Revoke(RevokeArgs),
    /// Restore fast-forward after lockdb was restored from a backup (annotation
    /// dlock.dev/restore): gate lock traffic, read every paydb's high-water, advance the
    /// sequence past it, resume.
    Restore(RestoreArgs),
    /// Conditions, the last actions and the fencing sequence against the paydbs' high-water of a
    /// LockService or a PaymentStack (NAME, or lsvc/NAME, pstack/NAME when both kinds have it).
    Status(StatusArgs),
    /// The locks held under a LockService (lock-server's `GET /v1/locks?prefix=`).
    Locks(LocksArgs),
    /// A completion script for the shell, for `kubectl-dlock` typed as one word (for
    /// `kubectl dlock`, install `kubectl_complete-dlock`, see operator/README.md).
    Completion(CompletionArgs),
}

impl Command {
    /// Whether the command works without a cluster (no kubeconfig is read for it).
    pub fn is_local(&self) -> bool {
        matches!(self, Command::Completion(_))
    }
}

/// How `status` and `locks` print.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum Output {
    /// Lines for people.
    #[default]
    Table,
    /// One JSON document with camelCase fields (the CRD status's and lock-server's names).
    Json,
}

/// What every action command shares.
#[derive(Debug, Args)]
pub struct ActionArgs {
    /// The request id (status.actions is keyed by it); generated when absent. An id that has
    /// finished is never executed again: use a new one to ask again.
    #[arg(long)]
    pub id: Option<String>,
    /// Wait until the action ends, print its outcome, exit non-zero when it failed.
    #[arg(long)]
    pub wait: bool,
    /// How long --wait waits (e.g. 90s, 10m, 1h).
    #[arg(long, default_value = DEFAULT_WAIT, value_parser = parse_duration)]
    pub timeout: Duration,
}

#[derive(Debug, Args)]
pub struct RevokeArgs {
    /// The LockService.
    pub lock_service: String,
    /// The lock key, e.g. account:00000000-0000-4000-8000-000000000007.
    pub key: String,
    /// Why (kept in the audit row lock_revocation).
    #[arg(long)]
    pub reason: String,
    /// Who asks; $USER when absent.
    #[arg(long)]
    pub requested_by: Option<String>,
    #[command(flatten)]
    pub action: ActionArgs,
}

#[derive(Debug, Args)]
pub struct RestoreArgs {
    /// The LockService.
    pub lock_service: String,
    /// How far past the highest token any paydb has seen the sequence is moved (1 - 10^12;
    /// the operator's default, 1000, when absent).
    #[arg(long)]
    pub margin: Option<i64>,
    #[command(flatten)]
    pub action: ActionArgs,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// NAME, lsvc/NAME or pstack/NAME.
    pub name: String,
    /// table, or json (machine-readable).
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

#[derive(Debug, Args)]
pub struct LocksArgs {
    /// The LockService.
    pub lock_service: String,
    /// Only keys starting with this.
    #[arg(long, default_value = "")]
    pub prefix: String,
    /// lock-server's URL when it is reachable already; by default the plugin port-forwards to a
    /// ready pod of Service NAME-lock-server through the API server (as `kubectl port-forward`
    /// does, without needing kubectl) for the call.
    #[arg(long)]
    pub lock_server_url: Option<String>,
    /// table, or json (machine-readable).
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

#[derive(Debug, Args)]
pub struct CompletionArgs {
    /// bash, zsh, fish, elvish or powershell.
    pub shell: clap_complete::Shell,
}

/// `90s`, `10m`, `1h`, `1h30m`, or plain seconds.
pub fn parse_duration(raw: &str) -> Result<Duration, String> {
    let bad = || format!("{raw:?} is not a duration such as 90s, 10m or 1h30m");
    if let Ok(secs) = raw.parse::<u64>() {
        return (secs > 0).then(|| Duration::from_secs(secs)).ok_or_else(bad);
    }
    let mut total = 0u64;
    let mut number = String::new();
    for c in raw.chars() {
        if c.is_ascii_digit() {
            number.push(c);
            continue;
        }
        let unit = match c {
            'h' => 3600,
            'm' => 60,
            's' => 1,
            _ => return Err(bad()),
        };
        let n: u64 = number.parse().map_err(|_| bad())?;
        total = n
            .checked_mul(unit)
            .and_then(|v| total.checked_add(v))
            .ok_or_else(bad)?;
        number.clear();
    }
    if !number.is_empty() || total == 0 {
        return Err(bad());
    }
    Ok(Duration::from_secs(total))
}

/// `lsvc/NAME`, `pstack/NAME` (also the long and plural kind names) or a bare NAME.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    LockService(String),
    PaymentStack(String),
    Either(String),
}

impl Target {
    pub fn parse(raw: &str) -> Result<Target, String> {
        let target = match raw.split_once('/') {
            None => Target::Either(raw.to_owned()),
            Some((kind, name)) => match kind.to_ascii_lowercase().as_str() {
                "lsvc" | "lockservice" | "lockservices" | "lockservice.dlock.dev" => {
                    Target::LockService(name.to_owned())
                }
                "pstack" | "paymentstack" | "paymentstacks" | "paymentstack.dlock.dev" => {
                    Target::PaymentStack(name.to_owned())
                }
                _ => return Err(format!("{kind:?} is not lsvc or pstack")),
            },
        };
        match &target {
            Target::LockService(n) | Target::PaymentStack(n) | Target::Either(n) if n.is_empty() => {
                Err(format!("{raw:?} names no object"))
            }
            _ => Ok(target),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("kubectl-dlock").chain(args.iter().copied()))
    }

    #[test]
    fn revoke_parses_with_the_flags_anywhere() {
        let cli = parse(&[
            "-n",
            "pay",
            "revoke",
            "payments-locks",
            "account:7",
            "--reason",
            "stuck worker",
            "--wait",
            "--timeout",
            "90s",
        ])
        .unwrap();
        assert_eq!(cli.namespace.as_deref(), Some("pay"));
        let Command::Revoke(r) = cli.command else {
            panic!("not revoke")
        };
        assert_eq!(
            (r.lock_service.as_str(), r.key.as_str()),
            ("payments-locks", "account:7")
        );
        assert_eq!(r.reason, "stuck worker");
        assert!(r.action.wait);
        assert_eq!(r.action.timeout, Duration::from_secs(90));
        assert_eq!(r.action.id, None);
        // The namespace flag after the subcommand, as kubectl users type it.
        let cli = parse(&["revoke", "l", "k", "--reason", "x", "--namespace", "other"]).unwrap();
        assert_eq!(cli.namespace.as_deref(), Some("other"));
    }

    #[test]
    fn revoke_needs_a_key_and_a_reason() {
        assert!(parse(&["revoke", "payments-locks", "--reason", "x"]).is_err());
        assert!(parse(&["revoke", "payments-locks", "account:7"]).is_err());
    }

    #[test]
    fn restore_status_and_locks_parse() {
        let Command::Restore(r) = parse(&["restore", "l", "--margin", "5000", "--id", "ff-1"])
            .unwrap()
            .command
        else {
            panic!("not restore")
        };
        assert_eq!(
            (r.margin, r.action.id.as_deref(), r.action.wait),
            (Some(5000), Some("ff-1"), false)
        );
        assert_eq!(r.action.timeout, Duration::from_secs(600));
        assert!(parse(&["restore", "l", "--margin", "lots"]).is_err());
        let Command::Status(s) = parse(&["status", "pstack/shop"]).unwrap().command else {
            panic!("not status")
        };
        assert_eq!(Target::parse(&s.name), Ok(Target::PaymentStack("shop".into())));
        let Command::Locks(l) = parse(&["locks", "l", "--prefix", "account:"]).unwrap().command else {
            panic!("not locks")
        };
        assert_eq!((l.prefix.as_str(), l.lock_server_url), ("account:", None));
        assert!(parse(&["unknown"]).is_err());
    }

    #[test]
    fn durations_and_targets() {
        assert_eq!(parse_duration("45"), Ok(Duration::from_secs(45)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("2m5s"), Ok(Duration::from_secs(125)));
        for bad in ["", "0s", "0", "m", "1d", "10x", "1m5"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
        assert_eq!(Target::parse("locks"), Ok(Target::Either("locks".into())));
        assert_eq!(
            Target::parse("lsvc/locks"),
            Ok(Target::LockService("locks".into()))
        );
        assert_eq!(
            Target::parse("LockService/locks"),
            Ok(Target::LockService("locks".into()))
        );
        assert!(Target::parse("deploy/x").is_err());
        assert!(Target::parse("pstack/").is_err());
    }
}
