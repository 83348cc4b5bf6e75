//! `dlock lock KEY -- command` end to end, on both backends from one source: the built `dlock`
//! binary against a real lock-server (on a real lockdb, or a real etcd) and the real payment-resource
//! on a real paydb, the fenced resource the command's token is presented to.
//!
//! - the command runs with DLOCK_LOCK_KEY and DLOCK_FENCING_TOKEN, `dlock lock` exits with its
//!   status and the lock is free afterwards;
//! - when the grant is revoked the command is stopped at once (SIGTERM; SIGKILL after the grace when
//!   it ignores SIGTERM), `dlock lock` exits 3 saying why, and the command's token is refused by the
//!   fenced resource once the next holder has written.
//!
//! The service binaries come from the workspace build: `cargo test --workspace` builds them; for this
//! crate alone first run `cargo build --workspace --bins`.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use dlock_client::LockClient;
use dlock_testkit::etcd::EtcdCluster;
use dlock_testkit::stack::{LockBackend, Stack, StackOptions};
use dlock_testkit::wait::{wait_until, within};
use dlock_testkit::{TestDb, lockdb, paydb};
use lock_server::{Config, RunningServer};
use reqwest::StatusCode;
use serde_json::json;
use tokio::process::{Child, Command};
use uuid::Uuid;

const ADMIN: &str = "lock-command-admin-token-5f1e";

struct Env {
    lock: RunningServer,
    stack: Stack,
    dir: PathBuf,
    // Kept for their Drop (the processes).
    _lockdb: Option<TestDb>,
    _etcd: Option<EtcdCluster>,
    _paydb: TestDb,
}

async fn env(backend: LockBackend, name: &str) -> Env {
    let dir = std::env::temp_dir().join(format!(
        "dlock-lock-command-{}-{name}-{backend}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let pay = paydb().await;
    let mut opts = StackOptions::new(&dir);
    opts.lock_backend = backend;
    // This lock-server signs with the run's key, which the stack's resources verify.
    let signing = Some(opts.grant_key.clone());
    let (lock, lockdb, etcd) = match backend {
        LockBackend::Postgres => {
            let db = lockdb().await;
            let config = Config::new(db.app_url())
                .with_admin_token(ADMIN)
                .with_signing_key(signing);
            (lock_server::spawn(config).await.unwrap(), Some(db), None)
        }
        LockBackend::Etcd => {
            let c = EtcdCluster::single().expect("etcd starts (scripts/cluster-tools.sh etcd installs it)");
            let config = Config::etcd(c.endpoints(), "/dlock/")
                .with_admin_token(ADMIN)
                .with_signing_key(signing);
            (lock_server::spawn(config).await.unwrap(), None, Some(c))
        }
    };
    opts.lock_server_url = Some(lock.base_url());
    let stack = Stack::start("", &pay.app_url(), &opts).await.unwrap();
    Env {
        lock,
        stack,
        dir,
        _lockdb: lockdb,
        _etcd: etcd,
        _paydb: pay,
    }
}

/// A running `dlock lock` in a process group of its own, with the command it runs: a test that fails
/// before [`finish`] kills the whole group (the command may ignore SIGTERM), so nothing outlives it.
struct Running {
    child: Option<Child>,
    group: i32,
    /// `dlock lock` exited and was waited for: its group is no longer ours to signal.
    ended: bool,
}

impl Drop for Running {
    fn drop(&mut self) {
        if !self.ended {
            // The whole group: `dlock lock` and the command it started.
            let _ = std::process::Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", self.group)])
                .status();
        }
    }
}

fn dlock_lock(env: &Env, key: &str, extra: &[&str], command: &[&str]) -> Running {
    let child = Command::new(env!("CARGO_BIN_EXE_dlock"))
        .args(["lock", key, "--lock-server-url", &env.lock.base_url()])
        .args(extra)
        .arg("--")
        .args(command)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let group = child.id().and_then(|id| i32::try_from(id).ok()).unwrap();
    Running {
        child: Some(child),
        group,
        ended: false,
    }
}

async fn finish(mut running: Running) -> (Option<i32>, String) {
    let child = running.child.take().unwrap();
    let out = within("dlock lock to exit", child.wait_with_output())
        .await
        .unwrap();
    running.ended = true;
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `payout` claimed by `owner` with `token`, as the executor's first fenced write does.
/// A fenced claim with `token` inside its signed `grant`, as the holder presents them.
async fn claim(
    env: &Env,
    payout: Uuid,
    owner: &str,
    token: i64,
    grant: &str,
) -> (StatusCode, serde_json::Value) {
    let r = reqwest::Client::new()
        .post(format!("{}/v1/payouts/{payout}/claim", env.stack.payment.url()))
        .bearer_auth(&env.stack.credentials.executor)
        .header("X-Fencing-Token", token.to_string())
        .header("X-Fencing-Grant", grant)
        .json(&json!({"ownerId": owner}))
        .send()
        .await
        .unwrap();
    (r.status(), r.json().await.unwrap_or_default())
}

async fn runs_the_command_and_exits_with_its_status(backend: LockBackend) {
    let env = env(backend, "status").await;
    let child = dlock_lock(
        &env,
        "job:status",
        &[],
        &[
            "sh",
            "-c",
            r#"test "$DLOCK_LOCK_KEY" = job:status && test "$DLOCK_FENCING_TOKEN" -gt 0 && exit 7"#,
        ],
    );
    let (code, stderr) = finish(child).await;
    assert_eq!(code, Some(7), "the command's status: {stderr}");
    let view = env.stack.lock_status("job:status").await.unwrap();
    assert_eq!(
        view.state,
        dlock_client::LockState::Free,
        "released after the command"
    );
    env.lock.shutdown().await.unwrap();
}

/// The command writes its token and pid to `file`, then runs `body` (which keeps it alive).
fn holder(file: &std::path::Path, body: &str) -> Vec<String> {
    vec![
        "sh".into(),
        "-c".into(),
        format!(
            r#"echo "$DLOCK_FENCING_TOKEN $$ $DLOCK_FENCING_GRANT" > "$0.tmp" && mv "$0.tmp" "$0"; {body}"#
        ),
        file.display().to_string(),
    ]
}

/// What the command was given and is: its token, its process id and its signed grant.
async fn token_pid_and_grant(file: &std::path::Path) -> (i64, u32, String) {
    wait_until("the command to start", || async move { file.is_file() }).await;
    let text = std::fs::read_to_string(file).unwrap();
    let mut parts = text.split_whitespace();
    (
        parts.next().unwrap().parse().unwrap(),
        parts.next().unwrap().parse().unwrap(),
        parts.next().expect("the command was given its grant").to_owned(),
    )
}

async fn revoke(env: &Env, key: &str, token: i64) {
    let r = reqwest::Client::new()
        .post(format!("{}/v1/admin/locks/{key}/revoke", env.lock.base_url()))
        .bearer_auth(ADMIN)
        .json(&json!({"operator": "test", "reason": "stuck job", "fencingToken": token}))
        .send()
        .await
        .unwrap();
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["outcome"], "REVOKED", "{body}");
}

async fn revoked_grant_stops_the_command_and_its_token_is_fenced(backend: LockBackend, ignores_term: bool) {
    let env = env(backend, if ignores_term { "kill" } else { "term" }).await;
    let account = env.stack.create_account("EUR", 10_000).await.unwrap();
    let payout = env.stack.create_payout(account, 100, "EUR").await.unwrap();
    let key = format!("account:{account}");
    let file = env.dir.join(format!("holder-{ignores_term}"));
    // Renewals 200 s apart: only the watch can tell `dlock lock` of the revocation this soon.
    let body = if ignores_term {
        "trap '' TERM; while true; do sleep 0.1; done"
    } else {
        "exec sleep 600"
    };
    let command = holder(&file, body);
    let command: Vec<&str> = command.iter().map(String::as_str).collect();
    let child = dlock_lock(&env, &key, &["--ttl-ms", "600000", "--grace-ms", "300"], &command);
    let (t1, pid, g1) = token_pid_and_grant(&file).await;
    // The command's fenced write.
    let (status, body) = claim(&env, payout.payout_id, "job-1", t1, &g1).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let base = env.lock.base_url();
    wait_until("dlock lock's watch open", || {
        let base = base.clone();
        async move {
            let text = dlock_testkit::metrics::scrape(&base).await.unwrap();
            dlock_testkit::metrics::sample(&text, "lock_watchers") == Some(1.0)
        }
    })
    .await;

    revoke(&env, &key, t1).await;
    let (code, stderr) = finish(child).await;
    assert_eq!(
        code,
        Some(3),
        "dlock lock exits 3 when the lock is lost: {stderr}"
    );
    assert!(
        stderr.contains("lost the lock") && stderr.contains("revoked"),
        "says why: {stderr}"
    );
    if ignores_term {
        assert!(stderr.contains("SIGKILL"), "{stderr}");
    }
    assert_eq!(
        dlock_testkit::stack::process_state(pid),
        None,
        "the command is gone"
    );

    // The next holder writes; the stopped command's token is refused from then on.
    let client = LockClient::new(&env.lock.base_url()).unwrap();
    let session = client
        .open_session("job-2", Duration::from_secs(60))
        .await
        .unwrap();
    let lock = session
        .acquire(&key, Duration::from_secs(60), Duration::from_secs(10))
        .await
        .unwrap();
    assert!(lock.token().get() > t1);
    let g2 = lock.grant().expect("lock-server signs");
    let (status, body) = claim(&env, payout.payout_id, "job-2", lock.token().get(), &g2).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = claim(&env, payout.payout_id, "job-1", t1, &g1).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["code"], "FENCED_OUT", "{body}");
    lock.release().await.unwrap();
    session.close().await.unwrap();
    env.lock.shutdown().await.unwrap();
}

mod postgres {
    use super::*;

    #[tokio::test]
    async fn runs_the_command_and_exits_with_its_status() {
        super::runs_the_command_and_exits_with_its_status(LockBackend::Postgres).await;
    }

    #[tokio::test]
    async fn a_revoked_grant_terminates_the_command_and_its_token_is_fenced() {
        revoked_grant_stops_the_command_and_its_token_is_fenced(LockBackend::Postgres, false).await;
    }

    #[tokio::test]
    async fn a_command_ignoring_sigterm_is_killed_after_the_grace() {
        revoked_grant_stops_the_command_and_its_token_is_fenced(LockBackend::Postgres, true).await;
    }
}

mod etcd {
    use super::*;

    #[tokio::test]
    async fn runs_the_command_and_exits_with_its_status() {
        super::runs_the_command_and_exits_with_its_status(LockBackend::Etcd).await;
    }

    #[tokio::test]
    async fn a_revoked_grant_terminates_the_command_and_its_token_is_fenced() {
        revoked_grant_stops_the_command_and_its_token_is_fenced(LockBackend::Etcd, false).await;
    }

    #[tokio::test]
    async fn a_command_ignoring_sigterm_is_killed_after_the_grace() {
        revoked_grant_stops_the_command_and_its_token_is_fenced(LockBackend::Etcd, true).await;
    }
}
