//! Restoring an etcd snapshot rewinds the revision, and on the etcd backend the revision is the
//! fencing token. On a real single-member etcd with lock-server (`--backend etcd`) on it: grants,
//! a snapshot, more grants whose tokens a real paydb records (`rail_high_water`, `account.fence`),
//! then the member is stopped and the snapshot restored into a new data directory twice:
//!
//! - without a bump (the negative control): the next grant's token is at or below the high-water —
//!   a token the resources have already seen is handed out again, so the rewind is real;
//! - with the bump `dlock-fastforward etcd-bump` computes from that paydb, by running the very
//!   `etcdutl snapshot restore … --bump-revision B --mark-compacted` command it prints: the next grant
//!   is above high-water + margin − 1, later ones keep increasing, and reads below the bumped
//!   revision answer "compacted".
//!
//! Needs etcdutl (etcd >= 3.5; `scripts/cluster-tools.sh etcdutl`, which `scripts/setup.sh` runs, so
//! the test command always has it). Elsewhere the test says why and skips, unless
//! `DLOCK_REQUIRE_ETCDUTL=1`.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use dlock_testkit::etcd::{EtcdCluster, etcdutl_bin};
use lock_server::RunningServer;
use serde_json::{Value, json};

const FASTFORWARD: &str = env!("CARGO_BIN_EXE_dlock-fastforward");
const MARGIN: i64 = 1000;
const KEY: &str = "payout-runner";
/// Seeded settlement accounts of the test paydb.
const A1: &str = "00000000-0000-4000-8000-000000000001";
const A2: &str = "00000000-0000-4000-8000-000000000002";
const WAIT_LIMIT: Duration = Duration::from_secs(60);

/// Runs a command to completion within [`WAIT_LIMIT`]; its stdout, or a panic with its stderr.
fn run(cmd: &mut Command, what: &str) -> String {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: cannot start: {e}"));
    let (mut out, mut err) = (String::new(), String::new());
    // Both pipes are read on threads, so a chatty child never blocks on a full pipe.
    let mut so = child.stdout.take().expect("piped stdout");
    let mut se = child.stderr.take().expect("piped stderr");
    let t_out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = so.read_to_string(&mut s);
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = se.read_to_string(&mut s);
        s
    });
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for child") {
            break status;
        }
        if started.elapsed() > WAIT_LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what}: did not finish within {}s", WAIT_LIMIT.as_secs());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    out.push_str(&t_out.join().unwrap_or_default());
    err.push_str(&t_err.join().unwrap_or_default());
    assert!(status.success(), "{what}: {status}\nstdout: {out}\nstderr: {err}");
    out
}

/// lock-server on the etcd backend, with one session of its own.
struct Locks {
    server: RunningServer,
    http: reqwest::Client,
    session: String,
}

impl Locks {
    async fn start(endpoint: String) -> Self {
        let cfg = lock_server::Config::etcd(vec![endpoint], "/dlock/").with_reaper_interval(None);
        let server = lock_server::spawn(cfg).await.expect("lock-server starts");
        let http = reqwest::Client::new();
        // The etcd channel dials on first use: retry the first request until etcd answers it.
        let started = Instant::now();
        let session = loop {
            let r = http
                .post(format!("{}/v1/sessions", server.base_url()))
                .json(&json!({"ownerId": "runner", "ttlMs": 600_000}))
                .send()
                .await;
            if let Ok(r) = r
                && r.status() == reqwest::StatusCode::CREATED
                && let Ok(v) = r.json::<Value>().await
                && let Some(id) = v["sessionId"].as_str()
            {
                break id.to_owned();
            }
            assert!(started.elapsed() < WAIT_LIMIT, "no session within {WAIT_LIMIT:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        Self {
            server,
            http,
            session,
        }
    }

    /// Acquires [`KEY`] and releases it again; the token it was granted.
    async fn grant(&self) -> i64 {
        let base = self.server.base_url();
        let r = self
            .http
            .post(format!("{base}/v1/locks/{KEY}/acquire"))
            .json(&json!({"sessionId": self.session, "ownerId": "runner", "ttlMs": 600_000}))
            .send()
            .await
            .expect("acquire answered");
        assert_eq!(r.status(), reqwest::StatusCode::OK, "acquire");
        let body: Value = r.json().await.expect("acquire body");
        let token = body["fencingToken"].as_i64().expect("fencingToken");
        let r = self
            .http
            .post(format!("{base}/v1/locks/{KEY}/release"))
            .header("X-Fencing-Token", token.to_string())
            .send()
            .await
            .expect("release answered");
        let body: Value = r.json().await.expect("release body");
        assert_eq!(body["released"], true, "release of {token}: {body}");
        token
    }

    async fn stop(self) {
        self.server.shutdown().await.expect("lock-server stops");
    }
}

/// A snapshot of the member at `endpoint` (the Maintenance API, as `etcdctl snapshot save` takes it).
async fn save_snapshot(endpoint: &str, path: &Path) {
    let mut c = etcd_client::Client::connect([endpoint], None)
        .await
        .expect("etcd client");
    let mut stream = tokio::time::timeout(WAIT_LIMIT, c.snapshot())
        .await
        .expect("snapshot starts in time")
        .expect("snapshot starts");
    let mut bytes = Vec::new();
    while let Some(chunk) = tokio::time::timeout(WAIT_LIMIT, stream.message())
        .await
        .expect("snapshot chunk in time")
        .expect("snapshot chunk")
    {
        bytes.extend_from_slice(chunk.blob());
    }
    std::fs::write(path, &bytes).expect("write snapshot");
}

/// Records `token` as the rail's high-water for `account` (rail-proxy's record of what it forwarded).
async fn record_rail(pool: &sqlx::PgPool, account: &str, token: i64) {
    sqlx::query(
        "INSERT INTO rail_high_water (account_id, highest_token) VALUES ($1::uuid, $2)
         ON CONFLICT (account_id) DO UPDATE SET highest_token = GREATEST(rail_high_water.highest_token, $2)",
    )
    .bind(account)
    .bind(token)
    .execute(pool)
    .await
    .expect("record rail high-water");
}

/// Records `token` as the account's fence (payment-resource's record of the last writer).
async fn record_fence(pool: &sqlx::PgPool, account: &str, token: i64) {
    sqlx::query("UPDATE account SET fence = GREATEST(fence, $2) WHERE account_id = $1::uuid")
        .bind(account)
        .bind(token)
        .execute(pool)
        .await
        .expect("record account fence");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restoring_an_etcd_snapshot_rewinds_the_token_and_the_bump_moves_it_past_the_high_water() {
    let Some(etcdutl) = etcdutl_bin() else {
        let why = "etcdutl (etcd >= 3.5) not found: run scripts/cluster-tools.sh etcdutl";
        assert!(
            std::env::var("DLOCK_REQUIRE_ETCDUTL").as_deref() != Ok("1"),
            "{why}"
        );
        eprintln!("SKIPPED: {why}");
        return;
    };
    let paydb = dlock_testkit::paydb().await;
    let pay = paydb.admin_pool().await;
    let mut etcd = EtcdCluster::single().expect("etcd starts");
    let dir: PathBuf = etcd.dir().to_path_buf();
    let snapshot = dir.join("snapshot.db");

    // Before the snapshot: grants the paydb sees too.
    let locks = Locks::start(etcd.endpoint(0)).await;
    let mut tokens = Vec::new();
    for _ in 0..3 {
        let t = locks.grant().await;
        record_fence(&pay, A1, t).await;
        tokens.push(t);
    }
    save_snapshot(&etcd.endpoint(0), &snapshot).await;
    let status: Value = serde_json::from_str(&run(
        Command::new(&etcdutl)
            .args(["snapshot", "status", "-w", "json"])
            .arg(&snapshot),
        "etcdutl snapshot status",
    ))
    .expect("snapshot status is JSON");
    let snapshot_revision = status["revision"].as_i64().expect("snapshot revision");
    assert!(snapshot_revision >= tokens[2], "{status}");

    // After the snapshot: the grants the restore will forget, but the paydb has seen.
    for i in 0..5 {
        let t = locks.grant().await;
        // Every token reaches the rail; the last one never posted to the account, so the highest
        // is only in rail_high_water and the read must take the maximum over both.
        record_rail(&pay, A2, t).await;
        if i < 4 {
            record_fence(&pay, A1, t).await;
        }
        tokens.push(t);
    }
    let high_water = tokens[tokens.len() - 1];
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens before the restore increase: {tokens:?}"
    );
    assert!(high_water > snapshot_revision);
    locks.stop().await;
    etcd.stop(0);

    // (a) Negative control: a plain restore. The revision goes back to the snapshot's, and the next
    // grant gets a token the resources have already accepted.
    let plain = dir.join("restored-plain");
    run(
        Command::new(&etcdutl)
            .args(["snapshot", "restore"])
            .arg(&snapshot)
            .arg("--data-dir")
            .arg(&plain)
            .args(etcd.restore_flags(0)),
        "etcdutl snapshot restore (no bump)",
    );
    etcd.restart_on(0, &plain)
        .expect("etcd starts on the plain restore");
    let locks = Locks::start(etcd.endpoint(0)).await;
    let rewound = locks.grant().await;
    eprintln!(
        "negative control: snapshot revision {snapshot_revision}, high-water {high_water}, \
         first token after a plain restore {rewound}"
    );
    assert!(
        rewound <= high_water,
        "a plain restore must rewind: token {rewound}, high-water {high_water}"
    );
    locks.stop().await;
    etcd.stop(0);

    // (b) The fast-forward: the bump from the same paydb, applied by the command it prints.
    let report = run(
        Command::new(FASTFORWARD)
            .args(["etcd-bump", "--snapshot-revision"])
            .arg(snapshot_revision.to_string())
            .args(["--margin", &MARGIN.to_string(), "--paydb", "payments=PAYDB_URL"])
            .arg("--snapshot")
            .arg(&snapshot)
            .arg("--data-dir")
            .arg(dir.join("restored-bumped"))
            .arg("--")
            .args(etcd.restore_flags(0))
            .env("PAYDB_URL", paydb.admin_url()),
        "dlock-fastforward etcd-bump",
    );
    let report: Value = serde_json::from_str(report.trim()).expect("etcd-bump prints JSON");
    assert_eq!(report["highWater"], high_water, "{report}");
    assert_eq!(report["stacks"][0]["railHighWater"], high_water, "{report}");
    let bump = report["bump"].as_i64().expect("bump");
    assert_eq!(bump, high_water + MARGIN - snapshot_revision, "{report}");
    let argv: Vec<String> = serde_json::from_value(report["argv"].clone()).expect("argv");
    assert_eq!(argv[0], "etcdutl");
    assert!(
        report["command"]
            .as_str()
            .is_some_and(|c| c.contains(&format!("--bump-revision {bump} --mark-compacted"))),
        "{report}"
    );
    run(
        Command::new(&etcdutl).args(&argv[1..]),
        "the printed etcdutl snapshot restore",
    );
    etcd.restart_on(0, dir.join("restored-bumped"))
        .expect("etcd starts on the bumped restore");
    let locks = Locks::start(etcd.endpoint(0)).await;
    let first = locks.grant().await;
    let second = locks.grant().await;
    eprintln!(
        "fast-forward: bump {bump}, first tokens after the bumped restore {first}, {second} \
         (high-water {high_water} + margin {MARGIN})"
    );
    assert!(
        first > high_water + MARGIN - 1,
        "first token {first} not above high-water {high_water} + margin {MARGIN} - 1"
    );
    let restored = report["restoredRevision"].as_i64().expect("restoredRevision");
    assert_eq!(restored, high_water + MARGIN, "{report}");
    assert!(
        first > restored,
        "first token {first}, restored revision {restored}"
    );
    assert!(second > first, "tokens keep increasing: {first}, {second}");
    locks.stop().await;

    // --mark-compacted: history between the snapshot and the bump is reported as gone, not empty,
    // so a watcher resuming from a revision it remembers re-reads instead of waiting forever.
    let mut c = etcd_client::Client::connect([etcd.endpoint(0)], None)
        .await
        .expect("etcd client");
    let old = c
        .get(
            format!("/dlock/l/{KEY}"),
            Some(etcd_client::GetOptions::new().with_revision(snapshot_revision)),
        )
        .await;
    let err = old.expect_err("a read below the bumped revision is refused");
    assert!(err.to_string().contains("compacted"), "{err}");
}
