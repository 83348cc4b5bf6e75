//! `dlock lock KEY -- command args…` (as `etcdctl lock` and `consul lock`) and `dlock locks list`.
//!
//! `dlock lock` waits for the lock in the key's queue, runs the command with `DLOCK_LOCK_KEY`,
//! `DLOCK_FENCING_TOKEN` and `DLOCK_FENCING_GRANT` (the signed grant, when lock-server signs) in its
//! environment (so that it can present the token, inside its grant, to a fenced resource), renews while it runs (the client library's handle, which also watches the key, so a
//! revocation or a lapse is known at once, not at the next renewal), releases when it ends and exits
//! with its status. When the grant is lost the command gets SIGTERM at once and SIGKILL after
//! `--grace-ms`, and `dlock lock` exits [`EXIT_LOST`] saying why. A fenced resource refuses the
//! command's token from the moment a newer holder has written, whatever the command still does.

use std::path::{Path, PathBuf};
use std::process::{ExitCode, ExitStatus, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use dlock_client::{ClientConfig, ClientError, LockClient};
use tokio::process::{Child, Command};
use tokio::signal::unix::{SignalKind, signal};

/// The lock could not be had: the wait ended with the key still held, or lock-server refused.
pub const EXIT_NOT_ACQUIRED: u8 = 2;
/// The grant was lost while the command ran; the command was stopped.
pub const EXIT_LOST: u8 = 3;

/// The environment variable that may carry lock-server's admin token for `dlock locks list`.
pub const ADMIN_TOKEN_ENV: &str = "DLOCK_ADMIN_TOKEN";
/// The environment variable that may carry the lock client token of `dlock lock` (or
/// `--token-file`; never the value as a flag, which a process listing would show).
pub const LOCK_TOKEN_ENV: &str = "DLOCK_LOCK_TOKEN";

/// The environment variable that may name the CA file of an https:// lock-server (as `--ca-file`).
pub const CA_FILE_ENV: &str = "DLOCK_CA_FILE";

/// The client's settings with the CA file, when one is given.
fn with_ca(config: ClientConfig, ca_file: Option<&Path>) -> ClientConfig {
    match ca_file {
        Some(path) => config.with_ca_file(path),
        None => config,
    }
}

#[derive(Debug, Args)]
pub struct LockArgs {
    /// The lock key.
    key: String,
    /// lock-server's base URL.
    #[arg(long, env = "DLOCK_LOCK_SERVER_URL", default_value = "http://127.0.0.1:8080")]
    lock_server_url: String,
    /// The CA certificate file (PEM) that signs an https:// lock-server's certificate: the only CA
    /// trusted. Required for https://.
    #[arg(long, env = CA_FILE_ENV)]
    ca_file: Option<PathBuf>,
    /// How long to wait for the lock, in milliseconds (in the key's queue, in arrival order).
    #[arg(long, default_value_t = 60_000, value_parser = clap::value_parser!(u64).range(0..=86_400_000))]
    wait_ms: u64,
    /// The lease of the lock, in milliseconds (renewed every third of it while the command runs).
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(10..=86_400_000))]
    ttl_ms: u64,
    /// The lock session's TTL, in milliseconds (heartbeat every third of it).
    #[arg(long, default_value_t = 15_000, value_parser = clap::value_parser!(u64).range(10..=86_400_000))]
    session_ttl_ms: u64,
    /// The owner id the lock is held under (default: `dlock-lock-<hostname>-<pid>`). With a lock
    /// client token it must start with one of the client's owner prefixes.
    #[arg(long)]
    owner_id: Option<String>,
    /// A file holding the lock client token, when lock-server has a clients file (surrounding
    /// whitespace is ignored). Or set DLOCK_LOCK_TOKEN; not both.
    #[arg(long)]
    token_file: Option<PathBuf>,
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
    /// The CA certificate file (PEM) that signs an https:// lock-server's certificate.
    #[arg(long, env = CA_FILE_ENV)]
    ca_file: Option<PathBuf>,
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

/// The lock client token: from the file `--token-file` names or from [`LOCK_TOKEN_ENV`] (`env`),
/// one of the two; `None` when neither is given (a lock-server without a clients file).
fn client_token(file: Option<&Path>, env: Option<String>) -> Result<Option<String>> {
    let from_file = match file {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .with_context(|| format!("read the lock client token file {}", path.display()))?
                .trim()
                .to_owned(),
        ),
        None => None,
    };
    let token = match (from_file, env) {
        (Some(_), Some(_)) => {
            bail!("give the lock client token in --token-file or in {LOCK_TOKEN_ENV}, not both")
        }
        (Some(t), None) | (None, Some(t)) => t,
        (None, None) => return Ok(None),
    };
    if token.trim().is_empty() {
        bail!("the lock client token is empty");
    }
    Ok(Some(token))
}

/// What to say when lock-server refused the credentials (401) or the client's rights (403): its
/// code and message, and where the token comes from.
fn refusal(e: &anyhow::Error) -> Option<String> {
    let ClientError::Api {
        status,
        code,
        message,
    } = e.downcast_ref::<ClientError>()?
    else {
        return None;
    };
    match status.as_u16() {
        401 => Some(format!(
            "lock-server refused the credentials ({code}: {message}); give this lock client's token in {LOCK_TOKEN_ENV} or --token-file"
        )),
        403 => Some(format!(
            "lock-server refused this lock client ({code}: {message}); check the key and --owner-id against the client's rights"
        )),
        _ => None,
    }
}

/// `dlock lock`: the exit code is the command's, or [`EXIT_NOT_ACQUIRED`] / [`EXIT_LOST`].
pub async fn lock(args: LockArgs) -> ExitCode {
    match run(args).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("dlock lock: {e:#}");
            if let Some(said) = refusal(&e) {
                eprintln!("dlock lock: {said}");
            }
            ExitCode::from(EXIT_NOT_ACQUIRED)
        }
    }
}

async fn run(args: LockArgs) -> Result<ExitCode> {
    let mut config = with_ca(ClientConfig::default(), args.ca_file.as_deref());
    if let Some(token) = client_token(args.token_file.as_deref(), std::env::var(LOCK_TOKEN_ENV).ok())? {
        config = config.with_token(token);
    }
    let client = LockClient::with_config(&args.lock_server_url, config)?;
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
    let client = LockClient::with_config(
        &args.lock_server_url,
        with_ca(ClientConfig::default(), args.ca_file.as_deref()),
    )?;
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
    fn the_ca_file_is_the_client_s_only_root_for_https() {
        let t = T::try_parse_from(["t", "k", "--ca-file", "/etc/dlock/ca.crt", "--", "true"]).unwrap();
        let config = with_ca(ClientConfig::default(), t.a.ca_file.as_deref());
        assert_eq!(
            config.ca,
            Some(dlock_client::CaCerts::File("/etc/dlock/ca.crt".into()))
        );
        assert_eq!(with_ca(ClientConfig::default(), None).ca, None);
        // An https lock-server without one is refused before anything is sent.
        let e = LockClient::with_config("https://127.0.0.1:1", with_ca(ClientConfig::default(), None))
            .unwrap_err();
        assert!(
            matches!(
                e,
                ClientError::InvalidArgument {
                    code: "CA_REQUIRED",
                    ..
                }
            ),
            "{e:?}"
        );
    }

    #[test]
    fn the_token_comes_from_a_file_or_the_environment_not_both() {
        assert_eq!(client_token(None, None).unwrap(), None);
        assert_eq!(
            client_token(None, Some("from-env".into())).unwrap().as_deref(),
            Some("from-env")
        );
        let path = std::env::temp_dir().join(format!("dlock-lock-token-{}", std::process::id()));
        std::fs::write(&path, "from-file\n").unwrap();
        assert_eq!(
            client_token(Some(&path), None).unwrap().as_deref(),
            Some("from-file")
        );
        let both = client_token(Some(&path), Some("from-env".into()))
            .unwrap_err()
            .to_string();
        assert!(both.contains("not both") && !both.contains("from-"), "{both}");
        std::fs::write(&path, " \n").unwrap();
        assert!(client_token(Some(&path), None).is_err(), "an empty file");
        let _ = std::fs::remove_file(&path);
        assert!(client_token(Some(&path), None).is_err(), "a missing file");
        // It is never a flag.
        assert!(T::try_parse_from(["t", "k", "--token", "x", "--", "true"]).is_err());
    }

    #[test]
    fn a_refusal_says_the_code_and_the_message() {
        use reqwest::StatusCode;
        let api = |status, code: &str| {
            anyhow::Error::new(ClientError::Api {
                status,
                code: code.into(),
                message: "the words of the server".into(),
            })
            .context("open a lock session")
        };
        let said = refusal(&api(StatusCode::UNAUTHORIZED, "UNAUTHORIZED")).unwrap();
        assert!(
            said.contains("UNAUTHORIZED: the words of the server") && said.contains(LOCK_TOKEN_ENV),
            "{said}"
        );
        let said = refusal(&api(StatusCode::FORBIDDEN, "FORBIDDEN")).unwrap();
        assert!(said.contains("FORBIDDEN: the words of the server"), "{said}");
        assert!(refusal(&api(StatusCode::CONFLICT, "CONTENDED")).is_none());
    }

    /// `dlock lock` against a lock-server with a clients file: without a token it is refused with
    /// 401, with the client's token but an owner id outside its owner prefixes with 403 (each error
    /// carries the code and the server's message), and with both right it runs the command.
    #[tokio::test]
    async fn a_lock_client_token_is_presented_and_a_refusal_is_reported() {
        let token = "cli-payments-token-0123456789abcdef012345";
        let db = dlock_testkit::lockdb().await;
        let clients = lock_server::Clients::parse(
            &serde_json::json!({"clients": [{"name": "payments", "token": token,
                "keyPrefixes": ["account:"], "ownerPrefixes": ["payments-"], "operations": ["lock"]}]})
            .to_string(),
        )
        .unwrap();
        let srv = lock_server::spawn(
            lock_server::Config::new(db.app_url())
                .with_reaper_interval(None)
                .with_clients(clients),
        )
        .await
        .unwrap();
        let url = srv.base_url();
        let file = std::env::temp_dir().join(format!("dlock-lock-cli-token-{}", std::process::id()));
        std::fs::write(&file, format!("{token}\n")).unwrap();
        let args = |extra: &[&str]| {
            let mut all = vec!["t", "account:cli", "--lock-server-url", &url, "--wait-ms", "0"];
            all.extend_from_slice(extra);
            all.extend_from_slice(&["--", "true"]);
            T::try_parse_from(all).unwrap().a
        };
        let refused = |e: anyhow::Error| {
            let said = refusal(&e).unwrap_or_else(|| panic!("not a refusal: {e:#}"));
            assert!(
                !said.contains(token) && !format!("{e:#}").contains(token),
                "{said}"
            );
            said
        };

        let said = refused(run(args(&["--owner-id", "payments-1"])).await.unwrap_err());
        assert!(said.contains("UNAUTHORIZED: "), "{said}");
        let file_arg = file.to_str().unwrap();
        let said = refused(
            run(args(&["--owner-id", "batch-1", "--token-file", file_arg]))
                .await
                .unwrap_err(),
        );
        assert!(said.contains("FORBIDDEN: ") && said.contains("batch-1"), "{said}");
        let ran = run(args(&["--owner-id", "payments-1", "--token-file", file_arg]))
            .await
            .unwrap();
        assert_eq!(ran, ExitCode::SUCCESS);
        let _ = std::fs::remove_file(&file);
        srv.shutdown().await.unwrap();
    }

    #[test]
    fn exit_codes_are_the_commands() {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(exit_code(ExitStatus::from_raw(7 << 8)), ExitCode::from(7));
        // Killed by SIGTERM (15).
        assert_eq!(exit_code(ExitStatus::from_raw(15)), ExitCode::from(143));
    }
}
