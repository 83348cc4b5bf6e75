//! `dlock lock KEY -- command args…` (as `etcdctl lock` and `consul lock`) and `dlock locks list`.
//!
//! `dlock lock` waits for the lock in the key's queue, runs the command with `DLOCK_LOCK_KEY`,
//! `DLOCK_FENCING_TOKEN` and `DLOCK_FENCING_GRANT` (the signed grant, when lock-server signs) in its
//! environment (so that it can present the token, inside its grant, to a fenced resource), renews while it runs (the client library's handle, which also watches the key, so a
//! revocation or a lapse is known at once, not at the next renewal), releases when it ends and exits
//! with its status. When the grant is lost the command gets SIGTERM at once and SIGKILL after
//! `--grace-ms`, and `dlock lock` exits [`EXIT_LOST`] saying why. A fenced resource refuses the
//! command's token from the moment a newer holder has written, whatever the command still does.

use std::process::{ExitCode, ExitStatus, Stdio};
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use dlock_client::{ClientError, LockClient};
use tokio::process::{Child, Command};
use tokio::signal::unix::{SignalKind, signal};

/// The lock could not be had: the wait ended with the key still held, or lock-server refused.
pub const EXIT_NOT_ACQUIRED: u8 = 2;
/// The grant was lost while the command ran; the command was stopped.
pub const EXIT_LOST: u8 = 3;

/// The environment variable that may carry lock-server's admin token for `dlock locks list`.
pub const ADMIN_TOKEN_ENV: &str = "DLOCK_ADMIN_TOKEN";

#[derive(Debug, Args)]
pub struct LockArgs {
    /// The lock key.
    key: String,
    /// lock-server's base URL.
    #[arg(long, env = "DLOCK_LOCK_SERVER_URL", default_value = "http://127.0.0.1:8080")]
    lock_server_url: String,
    /// How long to wait for the lock, in milliseconds (in the key's queue, in arrival order).
    #[arg(long, default_value_t = 60_000, value_parser = clap::value_parser!(u64).range(0..=86_400_000))]
    wait_ms: u64,
    /// The lease of the lock, in milliseconds (renewed every third of it while the command runs).
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(10..=86_400_000))]
    ttl_ms: u64,
    /// The lock session's TTL, in milliseconds (heartbeat every third of it).
    #[arg(long, default_value_t = 15_000, value_parser = clap::value_parser!(u64).range(10..=86_400_000))]
    session_ttl_ms: u64,
    /// The owner id the lock is held under (default: `dlock-lock-<hostname>-<pid>`).
    #[arg(long)]
    owner_id: Option<String>,
    /// After the grant is lost: how long the command has, after SIGTERM, before SIGKILL.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(0..=3_600_000))]
    grace_ms: u64,
    /// The command and its arguments (after `--`).
    #[arg(last = true, required = true, num_args = 1..)]
    command: Vec<String>,
}

#[derive(Debug, Subcommand)]
pub enum LocksCommand {
    /// Who holds what: every held key (optionally under a prefix) with its holder, token, lease end
    /// and queue length. Needs lock-server's admin token in `DLOCK_ADMIN_TOKEN`.
    List(ListArgs),
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// lock-server's base URL.
    #[arg(long, env = "DLOCK_LOCK_SERVER_URL", default_value = "http://127.0.0.1:8080")]
    lock_server_url: String,
    /// Only keys starting with this.
    #[arg(long, default_value = "")]
    prefix: String,
    /// Keys per request (pages are followed to the end).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(i64).range(1..=500))]
    page_size: i64,
}

fn owner_id(given: Option<String>) -> String {
    given.unwrap_or_else(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_else(|_| "localhost".to_owned());
        format!("dlock-lock-{host}-{}", std::process::id())
    })
}

/// `dlock lock`: the exit code is the command's, or [`EXIT_NOT_ACQUIRED`] / [`EXIT_LOST`].
pub async fn lock(args: LockArgs) -> ExitCode {
    match run(args).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("dlock lock: {e:#}");
            ExitCode::from(EXIT_NOT_ACQUIRED)
        }
    }
}

async fn run(args: LockArgs) -> Result<ExitCode> {
    let client = LockClient::new(&args.lock_server_url)?;
    let owner = owner_id(args.owner_id);
    let session = client
        .open_session(&owner, Duration::from_millis(args.session_ttl_ms))
        .await
        .context("open a lock session")?;
    let handle = match session
        .acquire(
            &args.key,
            Duration::from_millis(args.ttl_ms),
            Duration::from_millis(args.wait_ms),
        )
        .await
    {
        Ok(h) => h,
        Err(ClientError::Contended { key }) => {
            eprintln!(
                "dlock lock: {key:?} is still held by another holder after waiting {} ms",
                args.wait_ms
            );
            let _ = session.close().await;
            return Ok(ExitCode::from(EXIT_NOT_ACQUIRED));
        }
        Err(e) => return Err(e).context(format!("acquire {:?}", args.key)),
    };
    // Told at once when the grant goes, not at the next renewal.
    handle.watch_grant();
    let token = handle.token();
    let (program, rest) = args.command.split_first().context("no command given after --")?;
    let mut command = Command::new(program);
    command
        .args(rest)
        .env("DLOCK_LOCK_KEY", &args.key)
        .env("DLOCK_FENCING_TOKEN", token.to_string());
    // The grant as signed at the acquire: it names this token, which no renewal changes, so it
    // stays what a resource verifies for as long as the token is the key's.
    match handle.grant() {
        Some(grant) => command.env("DLOCK_FENCING_GRANT", grant),
        None => command.env_remove("DLOCK_FENCING_GRANT"),
    };
    let mut child = command
        .stdin(Stdio::inherit())
        .spawn()
        .with_context(|| format!("run {program:?}"))?;
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let outcome = loop {
        tokio::select! {
            status = child.wait() => break Ok(status?),
            reason = handle.lost() => break Err(reason),
            // Passed on to the command, whose end ends this.
            _ = term.recv() => send(&child, Signal::Term),
            _ = int.recv() => send(&child, Signal::Int),
        }
    };
    match outcome {
        Ok(status) => {
            if let Err(e) = handle.release().await {
                eprintln!("dlock lock: release {:?}: {e}", args.key);
            }
            let _ = session.close().await;
            Ok(exit_code(status))
        }
        Err(reason) => {
            eprintln!(
                "dlock lock: lost the lock on {:?} (fencing token {token}): {reason}; stopping the command",
                args.key
            );
            stop(&mut child, Duration::from_millis(args.grace_ms)).await?;
            let _ = session.close().await;
            Ok(ExitCode::from(EXIT_LOST))
        }
    }
}

enum Signal {
    Term,
    Int,
}

#[allow(unsafe_code)]
fn send(child: &Child, sig: Signal) {
    if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
        let sig = match sig {
            Signal::Term => libc::SIGTERM,
            Signal::Int => libc::SIGINT,
        };
        // SAFETY: kill(2) on our own child's pid, which stays reserved until we reap it.
        unsafe {
            libc::kill(pid, sig);
        }
    }
}

/// SIGTERM now, SIGKILL after `grace` if it still runs.
async fn stop(child: &mut Child, grace: Duration) -> Result<()> {
    send(child, Signal::Term);
    if tokio::time::timeout(grace, child.wait()).await.is_err() {
        eprintln!(
            "dlock lock: the command did not stop within {} ms of SIGTERM; SIGKILL",
            grace.as_millis()
        );
        child.kill().await?;
    }
    Ok(())
}

/// The command's exit code; killed by a signal: 128 + the signal, as shells report it.
fn exit_code(status: ExitStatus) -> ExitCode {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => ExitCode::from(u8::try_from(c).unwrap_or(1)),
        (None, Some(s)) => ExitCode::from(u8::try_from(128 + s).unwrap_or(255)),
        _ => ExitCode::FAILURE,
    }
}

/// `dlock locks list`.
pub async fn list(args: ListArgs) -> Result<bool> {
    let token = std::env::var(ADMIN_TOKEN_ENV)
        .ok()
        .filter(|t| !t.trim().is_empty())
        .with_context(|| format!("set {ADMIN_TOKEN_ENV} to lock-server's admin token"))?;
    let client = LockClient::new(&args.lock_server_url)?;
    println!(
        "{:<40} {:<8} {:>20} {:<24} {:<30} {:>7}",
        "key", "state", "token", "owner", "expires at", "waiters"
    );
    let mut after: Option<String> = None;
    let mut n = 0usize;
    loop {
        let page = client
            .api()
            .list_locks(&token, &args.prefix, after.as_deref(), args.page_size)
            .await?;
        for i in &page.items {
            println!(
                "{:<40} {:<8} {:>20} {:<24} {:<30} {:>7}",
                i.lock_key,
                format!("{:?}", i.state).to_uppercase(),
                i.fencing_token,
                i.owner_id,
                i.expires_at.to_rfc3339(),
                i.waiters
            );
        }
        n += page.items.len();
        match page.next_cursor {
            Some(next) if after.as_deref() != Some(next.as_str()) => after = Some(next),
            _ => break,
        }
    }
    if n == 0 && !args.prefix.is_empty() {
        println!("(no key starting with {:?} is held)", args.prefix);
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct T {
        #[command(flatten)]
        a: LockArgs,
    }

    #[test]
    fn the_command_follows_the_double_dash() {
        let t = T::try_parse_from(["t", "k", "--wait-ms", "5", "--", "sh", "-c", "exit 3"]).unwrap();
        assert_eq!(t.a.key, "k");
        assert_eq!(t.a.wait_ms, 5);
        assert_eq!(t.a.command, ["sh", "-c", "exit 3"]);
        assert!(T::try_parse_from(["t", "k"]).is_err(), "a command is required");
    }

    #[test]
    fn exit_codes_are_the_commands() {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(exit_code(ExitStatus::from_raw(7 << 8)), ExitCode::from(7));
        // Killed by SIGTERM (15).
        assert_eq!(exit_code(ExitStatus::from_raw(15)), ExitCode::from(143));
    }
}
