//! The LockService actions end to end on the cluster tier: requested with one `kubectl annotate`
//! line, executed by the operator binary (the chart's args and RBAC), against a real lock-server
//! process over a real lockdb (and real paydbs), each step visible in status.
//!
//! lock-server runs as a local process standing in for its Deployment's pod (the Deployment's own
//! command, args and env, Secrets resolved — its admin token included); the operator reaches it at
//! its Service URL through `HTTP_PROXY` (see `dlock_e2e::proxy`).

use std::time::Duration;

use serde_json::{Value, json};

use dlock_e2e::kubelet::Kubelet;
use dlock_e2e::lockapi::LockApi;
use dlock_e2e::operator::Operator;
use dlock_e2e::proxy::Proxy;
use dlock_e2e::rbac::Identity;
use dlock_e2e::wait::eventually_or;
use dlock_e2e::{Cluster, crds, env, helm, objects, rbac};
use dlock_testkit::{History, TestDb};

const TIMEOUT: Duration = Duration::from_secs(120);
const LS: &str = "locks";

struct Ctx {
    c: Cluster,
    ns: String,
    id: Identity,
    helm: std::path::PathBuf,
    op: Operator,
    proxy: Proxy,
    kubelet: Kubelet,
    scratch: env::Scratch,
    /// Extra environment of the operator process (kept across restarts).
    op_env: Vec<(String, String)>,
}

impl Ctx {
    async fn start(test: &str, histories: &[History]) -> Option<Ctx> {
        Ctx::start_with(test, histories, &[]).await
    }

    async fn start_with(test: &str, histories: &[History], op_env: &[(&str, &str)]) -> Option<Ctx> {
        let op_env: Vec<(String, String)> = op_env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let c = dlock_e2e::cluster(test)?;
        let Some(helm_bin) = helm::helm(test) else {
            panic!("DLOCK_E2E=1 but helm is missing: run scripts/cluster-tools.sh");
        };
        crds::install(&c.kubectl);
        let ns = env::unique_name("act");
        let scratch = env::Scratch::new(test);
        let id = rbac::install(&c, &helm_bin, &ns, &ns, scratch.path());
        let proxy = Proxy::start();
        let op = start_operator(&c, &helm_bin, &id, &scratch, &proxy, &op_env);
        let mut kubelet = Kubelet::new(&c.kubectl, &ns, histories).await;
        kubelet.proxy = Some(proxy.clone());
        kubelet.serve_deployment(
            &format!("{LS}-lock-server"),
            &format!("{LS}-lock-server.{ns}.svc:8080"),
            History::Lockdb,
        );
        Some(Ctx {
            c,
            ns,
            id,
            helm: helm_bin,
            op,
            proxy,
            kubelet,
            scratch,
            op_env,
        })
    }

    fn k(&self) -> &dlock_e2e::Kubectl {
        &self.c.kubectl
    }

    fn must_get(&self, resource: &str, name: &str) -> Value {
        self.k()
            .get(Some(&self.ns), resource, name)
            .unwrap_or_else(|| panic!("{resource}/{name} does not exist in {}", self.ns))
    }

    fn wait<T>(&mut self, what: &str, mut probe: impl FnMut(&Ctx) -> Result<T, String>) -> T {
        let log = self.op.log.clone();
        eventually_or(
            what,
            TIMEOUT,
            || {
                self.kubelet.step();
                probe(self).map_err(|e| {
                    let failed: Vec<String> = self
                        .kubelet
                        .runs
                        .iter()
                        .filter(|r| !r.succeeded())
                        .map(|r| format!("{}: {}", r.job, r.stdout.lines().last().unwrap_or_default()))
                        .collect();
                    format!("{e}; {} Job runs, failed: {failed:?}", self.kubelet.runs.len())
                })
            },
            || format!("operator log:\n{}", dlock_e2e::operator::tail(&log, 80)),
        )
    }

    fn lock_api(&self) -> LockApi {
        LockApi {
            port: self
                .kubelet
                .served_port(&format!("{LS}-lock-server"))
                .unwrap_or_else(|| panic!("lock-server is not running")),
        }
    }

    fn lockdb(&self) -> TestDb {
        self.kubelet.databases[&History::Lockdb].clone()
    }

    /// One `kubectl annotate` line: the user's entry point.
    fn annotate(&self, key: &str, value: &Value) {
        self.k()
            .run(&[
                "annotate",
                "lockservice",
                LS,
                "-n",
                &self.ns,
                "--overwrite",
                &format!("{key}={value}"),
            ])
            .ok();
    }

    /// Waits until `status.actions[id]` satisfies `done`.
    fn wait_action(&mut self, id: &str, mut done: impl FnMut(&Value) -> bool) -> Value {
        let id = id.to_owned();
        self.wait(&format!("action {id}"), |cx| {
            let ls = cx.must_get("lockservice", LS);
            match action(&ls, &id) {
                Some(a) if done(&a) => Ok(a),
                other => Err(format!("action: {other:?}; status: {}", ls["status"])),
            }
        })
    }

    fn restart_operator(&mut self) {
        self.op = start_operator(
            &self.c,
            &self.helm,
            &self.id,
            &self.scratch,
            &self.proxy,
            &self.op_env,
        );
    }

    fn event_reasons(&self) -> Vec<String> {
        self.k()
            .list(&self.ns, "events.events.k8s.io")
            .iter()
            .filter(|e| e["regarding"]["name"] == LS)
            .filter_map(|e| e["reason"].as_str().map(str::to_owned))
            .collect()
    }
}

fn start_operator(
    c: &Cluster,
    helm: &std::path::Path,
    id: &Identity,
    scratch: &env::Scratch,
    proxy: &Proxy,
    extra: &[(String, String)],
) -> Operator {
    let url = proxy.url();
    let mut vars: Vec<(&str, &str)> = vec![
        ("HTTP_PROXY", &url),
        ("http_proxy", &url),
        ("NO_PROXY", "127.0.0.1,localhost"),
    ];
    vars.extend(extra.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    Operator::start_with_env(c, &helm.to_path_buf(), id, scratch.path(), &vars)
}

fn action(ls: &Value, id: &str) -> Option<Value> {
    ls["status"]["actions"]
        .as_array()?
        .iter()
        .find(|a| a["id"] == id)
        .cloned()
}

fn lockservice() -> Value {
    json!({
        "apiVersion": "dlock.dev/v1alpha1",
        "kind": "LockService",
        "metadata": {"name": LS},
        "spec": {"database": {"managed": {}}, "lockServer": {"replicas": 1}},
    })
}

fn revoke(id: &str, key: &str) -> Value {
    json!({"id": id, "key": key, "reason": "stuck worker", "requestedBy": "alice"})
}

async fn revocations(db: &TestDb, key: &str) -> Vec<(i64, String, String)> {
    sqlx::query_as(
        "SELECT prev_token, prev_owner, operator FROM lock_revocation WHERE lock_key = $1 ORDER BY id",
    )
    .bind(key)
    .fetch_all(&db.admin_pool().await)
    .await
    .unwrap_or_else(|e| panic!("read lock_revocation: {e}"))
}

async fn holder(db: &TestDb, key: &str) -> Option<(String, i64)> {
    sqlx::query_as("SELECT owner_id, fencing_token FROM lock_entry WHERE lock_key = $1")
        .bind(key)
        .fetch_optional(&db.admin_pool().await)
        .await
        .unwrap_or_else(|e| panic!("read lock_entry: {e}"))
}

fn ready_at_generation(ctx: &mut Ctx) -> Value {
    ctx.wait("LockService Ready at its generation", |cx| {
        let ls = cx.must_get("lockservice", LS);
        if objects::condition_is(&ls, "Ready", "True") && objects::observed_current(&ls) {
            Ok(ls)
        } else {
            Err(format!("status: {}", ls["status"]))
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoke_by_annotation_is_pinned_to_the_recorded_token_across_retries_and_crashes() {
    let Some(mut ctx) = Ctx::start(
        "revoke_by_annotation_is_pinned_to_the_recorded_token_across_retries_and_crashes",
        &[History::Lockdb],
    )
    .await
    else {
        return;
    };
    ctx.k().apply(&ctx.ns, &lockservice()).ok();
    let ready = ready_at_generation(&mut ctx);
    let generation = ready["metadata"]["generation"].clone();
    let api = ctx.lock_api();
    let db = ctx.lockdb();
    let key = "account:e2e-stuck";

    // 1. A worker holds the key; the operator is asked to revoke it.
    let a = api.acquire("worker-a", key, 600_000);
    ctx.annotate("dlock.dev/revoke", &revoke("r-1", key));
    let done = ctx.wait_action("r-1", |a| a["phase"] == "Succeeded" || a["phase"] == "Failed");
    assert_eq!(done["phase"], "Succeeded", "{done}");
    assert_eq!(done["outcome"], "REVOKED", "{done}");
    assert_eq!(done["targetToken"], a.token, "{done}");
    assert_eq!(done["previousToken"], a.token, "{done}");
    assert_eq!(done["previousOwner"], "worker-a", "{done}");
    assert_eq!(done["requestedBy"], "alice");
    assert_eq!(holder(&db, key).await, None, "the grant is gone");
    assert_eq!(
        revocations(&db, key).await,
        vec![(a.token, "worker-a".to_owned(), "alice".to_owned())],
        "audited once, in lock_revocation"
    );
    assert_eq!(api.get(key)["state"], "FREE");
    let reasons = ctx.event_reasons();
    for r in ["RevokeTargetRecorded", "RevokeSucceeded"] {
        assert!(reasons.iter().any(|x| x == r), "no {r} Event among {reasons:?}");
    }

    // 2. A finished id is never executed again: a newer holder survives the same request.
    let c = api.acquire("worker-c", key, 600_000);
    assert!(c.token > a.token);
    let before = reconciles(&ctx);
    ctx.annotate("dlock.dev/revoke", &revoke("r-1", key));
    ctx.annotate("dlock.dev/nudge", &json!("1"));
    ctx.wait("the operator to reconcile the re-sent request", |cx| {
        let n = reconciles(cx);
        if n > before {
            Ok(())
        } else {
            Err(format!("{n} reconciles, {before} before"))
        }
    });
    assert_eq!(holder(&db, key).await, Some(("worker-c".to_owned(), c.token)));
    assert_eq!(revocations(&db, key).await.len(), 1, "nothing new revoked");
    let ls = ctx.must_get("lockservice", LS);
    assert_eq!(
        action(&ls, "r-1").as_ref(),
        Some(&done),
        "the finished entry is unchanged"
    );

    // 3. Crash between Running and the revoke: the operator records the target (c's token), the
    //    revoke cannot reach lock-server, the operator is killed; meanwhile c releases and d takes
    //    the key. The restarted operator revokes exactly the recorded token: d is left alone.
    ctx.proxy.block("/v1/admin/");
    ctx.annotate("dlock.dev/revoke", &revoke("r-2", key));
    let running = ctx.wait_action("r-2", |a| a["phase"] == "Running");
    assert_eq!(running["targetToken"], c.token, "{running}");
    assert_eq!(running["step"], "Revoke");
    ctx.wait("the operator to try the blocked revoke", |cx| {
        let seen = cx.proxy.seen();
        if seen.iter().any(|s| s.starts_with("POST /v1/admin/")) {
            Ok(())
        } else {
            Err(format!("{seen:?}"))
        }
    });
    ctx.op.kill();
    api.release(&c);
    let d = api.acquire("worker-d", key, 600_000);
    assert!(d.token > c.token);
    ctx.proxy.unblock();
    ctx.restart_operator();
    let after = ctx.wait_action("r-2", |a| a["phase"] == "Succeeded" || a["phase"] == "Failed");
    assert_eq!(after["outcome"], "HELD_BY_OTHER_TOKEN", "{after}");
    assert_eq!(after["phase"], "Failed", "{after}");
    assert_eq!(after["currentToken"], d.token, "{after}");
    assert_eq!(after["targetToken"], c.token, "{after}");
    assert_eq!(
        holder(&db, key).await,
        Some(("worker-d".to_owned(), d.token)),
        "the newer holder keeps the lock"
    );
    assert_eq!(
        revocations(&db, key).await.len(),
        1,
        "nothing newer revoked or audited"
    );

    // 4. None of this touched the spec: the generation did not move, so dependents waiting on
    //    observedGeneration never saw the LockService as behind.
    let ls = ctx.must_get("lockservice", LS);
    assert_eq!(ls["metadata"]["generation"], generation);
    assert!(objects::condition_is(&ls, "Ready", "True"), "{}", ls["status"]);
    assert_eq!(ls["status"]["lastAction"], "r-2 Failed");
    ctx.op.assert_healthy();
}

/// `dlock_operator_reconciliations_total{kind="LockService"}` from the operator's metrics.
fn reconciles(ctx: &Ctx) -> u64 {
    ctx.op
        .get("/metrics")
        .lines()
        .filter(|l| l.starts_with("dlock_operator_reconciliations_total") && l.contains("LockService"))
        .filter_map(|l| l.split_whitespace().last()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

fn paymentstack(name: &str) -> Value {
    json!({
        "apiVersion": "dlock.dev/v1alpha1",
        "kind": "PaymentStack",
        "metadata": {"name": name},
        "spec": {
            "lockServiceRef": {"name": LS},
            "database": {"managed": {}},
            // The tests write high-water marks for the seeded accounts.
            "demoData": true,
            "paymentResource": {"replicas": 1},
            "railProxy": {"replicas": 1},
            "payoutExecutor": {"replicas": 1, "workers": 1},
            "railStub": {"enabled": true},
        },
    })
}

async fn exec(db: &TestDb, sql: &str) {
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(&db.admin_pool().await)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// On the server's maintenance database (CREATE / DROP DATABASE).
async fn exec_server(db: &TestDb, sql: &str) {
    let url = format!("postgres://postgres@127.0.0.1:{}/postgres", db.port);
    let mut c = <sqlx::PgConnection as sqlx::Connection>::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("connect {url}: {e}"));
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(&mut c)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

async fn sequence(db: &TestDb) -> i64 {
    sqlx::query_scalar(
        "SELECT (CASE WHEN is_called THEN last_value ELSE last_value - 1 END)::BIGINT FROM fencing_token_seq",
    )
    .fetch_one(&db.admin_pool().await)
    .await
    .unwrap_or_else(|e| panic!("read the sequence: {e}"))
}

const A1: &str = "00000000-0000-4000-8000-000000000001";
const A2: &str = "00000000-0000-4000-8000-000000000002";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restore_fast_forward_gates_reads_every_paydb_advances_and_resumes() {
    let test = "restore_fast_forward_gates_reads_every_paydb_advances_and_resumes";
    let Some(mut ctx) = Ctx::start(test, &[History::Lockdb, History::Paydb]).await else {
        return;
    };
    // Each PaymentStack's paydb is its own local database, by the host in its URL.
    let (pay_a, pay_b) = (
        dlock_testkit::blank(History::Paydb).await,
        dlock_testkit::blank(History::Paydb).await,
    );
    let ns = ctx.ns.clone();
    ctx.kubelet
        .use_database_for_host(&format!("pay-a-paydb.{ns}.svc"), pay_a.clone());
    ctx.kubelet
        .use_database_for_host(&format!("pay-b-paydb.{ns}.svc"), pay_b.clone());
    ctx.k().apply(&ns, &lockservice()).ok();
    ctx.k().apply(&ns, &paymentstack("pay-a")).ok();
    ctx.k().apply(&ns, &paymentstack("pay-b")).ok();
    let lockdb = ctx.lockdb();

    // 1. The backup: lockdb right after its migration, before any grant (a file-level copy of the
    //    database, taken while nothing is connected).
    let log = ctx.op.log.clone();
    eventually_or(
        "the lockdb migration to run",
        TIMEOUT,
        || {
            ctx.kubelet.run_pending_jobs();
            ctx.kubelet.workloads_ready();
            if ctx
                .kubelet
                .runs
                .iter()
                .any(|r| r.history == History::Lockdb && r.succeeded())
            {
                Ok(())
            } else {
                Err(format!("{} runs", ctx.kubelet.runs.len()))
            }
        },
        || dlock_e2e::operator::tail(&log, 60),
    );
    let backup = format!("{}_backup", lockdb.name);
    exec_server(
        &lockdb,
        &format!("CREATE DATABASE {backup} TEMPLATE {}", lockdb.name),
    )
    .await;
    ready_at_generation(&mut ctx);
    for ps in ["pay-a", "pay-b"] {
        ctx.wait(&format!("PaymentStack {ps} Ready"), |cx| {
            let o = cx.must_get("paymentstack", ps);
            if objects::condition_is(&o, "Ready", "True") {
                Ok(())
            } else {
                Err(o["status"].to_string())
            }
        });
    }

    // 2. Grants happen and the resources see their tokens: pay-a up to 6, pay-b up to 4.
    let api = ctx.lock_api();
    let mut tokens = Vec::new();
    for i in 0..6 {
        let g = api.acquire("worker", &format!("account:{i}"), 600_000);
        tokens.push(g.token);
        api.release(&g);
    }
    assert_eq!(tokens, vec![1, 2, 3, 4, 5, 6]);
    exec(
        &pay_a,
        &format!("INSERT INTO rail_high_water (account_id, highest_token) VALUES ('{A2}', 6)"),
    )
    .await;
    exec(
        &pay_a,
        &format!("UPDATE account SET fence = 5 WHERE account_id = '{A1}'"),
    )
    .await;
    exec(
        &pay_b,
        &format!("UPDATE account SET fence = 4 WHERE account_id = '{A1}'"),
    )
    .await;
    exec(
        &pay_b,
        &format!(
            "INSERT INTO payout (payout_id, account_id, amount_minor, currency, state, claimed_by, claim_token, idempotency_key)
             VALUES ('10000000-0000-4000-8000-000000000001', '{A1}', 100, 'EUR', 'CLAIMED', 'w', 3, 'e2e-1')"
        ),
    )
    .await;

    // 3. lockdb is restored from the backup: the sequence rewinds, new grants reuse seen tokens.
    exec_server(&lockdb, &format!("DROP DATABASE {} WITH (FORCE)", lockdb.name)).await;
    exec_server(
        &lockdb,
        &format!("CREATE DATABASE {} TEMPLATE {backup}", lockdb.name),
    )
    .await;
    ctx.wait("lock-server to grant from the restored lockdb", |cx| {
        let (st, body) = cx.lock_api().call("GET", "/readyz", None, &[]);
        if st == 200 {
            Ok(())
        } else {
            Err(format!("{st} {body}"))
        }
    });
    let stale = api.acquire("worker", "account:after-restore", 600_000);
    assert!(
        stale.token <= 6,
        "the sequence rewound: token {} was already seen",
        stale.token
    );
    api.release(&stale);

    let before = sequence(&lockdb).await;
    let starts = ctx.kubelet.served_starts(&format!("{LS}-lock-server"));

    // 4. The fast-forward, from one annotate line.
    ctx.annotate("dlock.dev/restore", &json!({"id": "ff-1", "margin": 100}));
    let done = ctx.wait_action("ff-1", |a| a["phase"] == "Succeeded" || a["phase"] == "Failed");
    assert_eq!(done["phase"], "Succeeded", "{done}");
    let stacks = done["stacks"].as_array().cloned().unwrap_or_default();
    let by_name = |n: &str| {
        stacks
            .iter()
            .find(|s| s["name"] == n)
            .cloned()
            .unwrap_or_default()
    };
    assert_eq!(by_name("pay-a")["highest"], 6, "{done}");
    assert_eq!(by_name("pay-a")["railHighWater"], 6, "{done}");
    assert_eq!(by_name("pay-b")["highest"], 4, "{done}");
    assert_eq!(by_name("pay-b")["claimToken"], 3, "{done}");
    assert_eq!(done["sequenceBefore"], before, "{done}");
    assert_eq!(done["targetSequence"], 106, "{done}");
    assert_eq!(done["sequenceAfter"], 106, "{done}");
    assert_eq!(by_name("pay-b")["sequenceAfter"], 106, "{done}");
    // The gate really closed (lock-server's pod went away and came back) and is open again. Counted
    // once the LockService is ready again: `Succeeded` is written when the operator scales
    // lock-server back up, before the test kubelet has necessarily started the new process.
    let ls = ready_at_generation(&mut ctx);
    assert_eq!(
        ctx.kubelet.served_starts(&format!("{LS}-lock-server")),
        starts + 1,
        "lock-server restarted once"
    );
    assert!(
        ls["status"].get("gate").is_none(),
        "gate still closed: {}",
        ls["status"]
    );
    // No grant was issued while gated: the sequence is exactly where the advance left it, and the
    // next grant is above every token both paydbs have seen.
    assert_eq!(sequence(&lockdb).await, 106);
    let api = ctx.lock_api();
    let fresh = api.acquire("worker", "account:resumed", 600_000);
    assert_eq!(fresh.token, 107);
    let reasons = ctx.event_reasons();
    for r in [
        "RestoreGateClosing",
        "RestoreGateClosed",
        "RestoreHighWaterRead",
        "RestoreSequenceAdvanced",
        "RestoreSucceeded",
    ] {
        assert!(reasons.iter().any(|x| x == r), "no {r} Event among {reasons:?}");
    }

    // 5. An unreadable paydb fails the action and keeps the gate closed, naming the stack.
    exec(
        &pay_b,
        "ALTER TABLE rail_high_water RENAME TO rail_high_water_moved",
    )
    .await;
    ctx.annotate("dlock.dev/restore", &json!({"id": "ff-2"}));
    let failed = ctx.wait_action("ff-2", |a| a["phase"] == "Succeeded" || a["phase"] == "Failed");
    assert_eq!(failed["phase"], "Failed", "{failed}");
    let msg = failed["message"].as_str().unwrap_or_default().to_owned();
    assert!(msg.contains("pay-b") && msg.contains("rail_high_water"), "{msg}");
    let ls = ctx.must_get("lockservice", LS);
    assert_eq!(ls["status"]["gate"]["actionId"], "ff-2", "{}", ls["status"]);
    assert!(objects::condition_is(&ls, "Degraded", "True"), "{}", ls["status"]);
    assert_eq!(
        objects::condition(&ls, "Degraded").map(|c| c["reason"].clone()),
        Some(json!("RestoreFailed"))
    );
    let dep = ctx.must_get("deployment", &format!("{LS}-lock-server"));
    assert_eq!(objects::replicas(&dep), 0, "lock-server stays at zero");
    ctx.kubelet.step();
    assert_eq!(
        ctx.kubelet.served_port(&format!("{LS}-lock-server")),
        None,
        "no lock-server runs"
    );
    assert_eq!(sequence(&lockdb).await, 107, "the sequence was not touched");

    // 6. Fixed, a new request succeeds and opens the gate.
    exec(
        &pay_b,
        "ALTER TABLE rail_high_water_moved RENAME TO rail_high_water",
    )
    .await;
    ctx.annotate("dlock.dev/restore", &json!({"id": "ff-3", "margin": 10}));
    let done = ctx.wait_action("ff-3", |a| a["phase"] == "Succeeded" || a["phase"] == "Failed");
    assert_eq!(done["phase"], "Succeeded", "{done}");
    // Never lower: the target (6 + 10) is below the sequence, which stays at 107.
    assert_eq!(done["sequenceAfter"], 107, "{done}");
    let ls = ready_at_generation(&mut ctx);
    assert!(ls["status"].get("gate").is_none(), "{}", ls["status"]);
    let later = ctx.lock_api().acquire("worker", "account:later", 600_000);
    assert_eq!(later.token, 108);
    ctx.op.assert_healthy();
}

/// The operator's gauge for this LockService (`None` until it is exported).
fn behind_gauge(ctx: &Ctx) -> Option<u64> {
    let labels = format!("namespace=\"{}\",name=\"{LS}\"", ctx.ns);
    ctx.op
        .get("/metrics")
        .lines()
        .filter(|l| l.starts_with("dlock_operator_fencing_sequence_behind{") && l.contains(&labels))
        .find_map(|l| l.split_whitespace().last()?.parse::<f64>().ok())
        .map(|v| v as u64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sequence_rewound_outside_dlock_is_detected_and_clears_after_the_fast_forward() {
    let test = "a_sequence_rewound_outside_dlock_is_detected_and_clears_after_the_fast_forward";
    // A one-second check interval: each check is a real `dlock-fastforward read` Job.
    let Some(mut ctx) = Ctx::start_with(
        test,
        &[History::Lockdb, History::Paydb],
        &[("DLOCK_OPERATOR_FENCING_CHECK_SECS", "1")],
    )
    .await
    else {
        return;
    };
    let pay = dlock_testkit::blank(History::Paydb).await;
    let ns = ctx.ns.clone();
    ctx.kubelet
        .use_database_for_host(&format!("pay-a-paydb.{ns}.svc"), pay.clone());
    ctx.k().apply(&ns, &lockservice()).ok();
    ctx.k().apply(&ns, &paymentstack("pay-a")).ok();
    ready_at_generation(&mut ctx);
    ctx.wait("PaymentStack pay-a Ready", |cx| {
        let o = cx.must_get("paymentstack", "pay-a");
        if objects::condition_is(&o, "Ready", "True") {
            Ok(())
        } else {
            Err(o["status"].to_string())
        }
    });

    // 1. Grants and resources agree: a check runs, finds nothing behind, the gauge says 0.
    let api = ctx.lock_api();
    for i in 0..3 {
        let g = api.acquire("worker", &format!("account:{i}"), 600_000);
        api.release(&g);
    }
    exec(
        &pay,
        &format!("INSERT INTO rail_high_water (account_id, highest_token) VALUES ('{A1}', 3)"),
    )
    .await;
    let fencing = ctx.wait("a fencing check that saw high-water 3", |cx| {
        let ls = cx.must_get("lockservice", LS);
        let f = ls["status"]["fencing"].clone();
        if f["highWater"] == 3 && f["sequence"] == 3 && behind_gauge(cx) == Some(0) {
            Ok(f)
        } else {
            Err(format!("fencing: {f}, gauge {:?}", behind_gauge(cx)))
        }
    });
    assert_eq!(fencing["highWaterStack"], "pay-a", "{fencing}");
    let ls = ctx.must_get("lockservice", LS);
    assert!(
        objects::condition_is(&ls, "Degraded", "False"),
        "{}",
        ls["status"]
    );

    // 2. Behind our back (a restore of lockdb done outside dlock, or a resource that saw tokens of
    //    another lockdb): the paydb has seen token 500, the sequence is at 3. Nobody asks for a
    //    check; the next periodic one notices.
    exec(
        &pay,
        &format!("UPDATE rail_high_water SET highest_token = 500 WHERE account_id = '{A1}'"),
    )
    .await;
    let ls = ctx.wait("Degraded/FencingSequenceBehind", |cx| {
        let ls = cx.must_get("lockservice", LS);
        let reason = objects::condition(&ls, "Degraded").map(|c| c["reason"].clone());
        if objects::condition_is(&ls, "Degraded", "True")
            && reason == Some(json!("FencingSequenceBehind"))
            && behind_gauge(cx) == Some(1)
        {
            Ok(ls)
        } else {
            Err(format!("status: {}, gauge {:?}", ls["status"], behind_gauge(cx)))
        }
    });
    let message = objects::condition(&ls, "Degraded")
        .and_then(|c| c["message"].as_str().map(str::to_owned))
        .unwrap_or_default();
    assert!(
        message.contains("at 3") && message.contains("500") && message.contains("pay-a"),
        "both numbers and the stack in the message: {message}"
    );
    assert_eq!(ls["status"]["fencing"]["sequence"], 3, "{}", ls["status"]);
    assert_eq!(ls["status"]["fencing"]["highWater"], 500, "{}", ls["status"]);
    assert!(ctx.event_reasons().iter().any(|r| r == "FencingSequenceBehind"));
    // Detection changes nothing by itself: no gate, lock-server keeps serving, the sequence is
    // where it was.
    assert!(ls["status"].get("gate").is_none(), "{}", ls["status"]);
    assert_eq!(sequence(&ctx.lockdb()).await, 3);

    // 3. The fast-forward clears it, and the next check agrees (the gauge returns to 0).
    ctx.annotate("dlock.dev/restore", &json!({"id": "ff-detected", "margin": 10}));
    let done = ctx.wait_action("ff-detected", |a| {
        a["phase"] == "Succeeded" || a["phase"] == "Failed"
    });
    assert_eq!(done["phase"], "Succeeded", "{done}");
    assert_eq!(done["sequenceAfter"], 510, "{done}");
    ctx.wait("the next check to see the sequence caught up", |cx| {
        let ls = cx.must_get("lockservice", LS);
        let f = &ls["status"]["fencing"];
        if f["sequence"] == 510
            && objects::condition_is(&ls, "Degraded", "False")
            && behind_gauge(cx) == Some(0)
        {
            Ok(())
        } else {
            Err(format!("status: {}, gauge {:?}", ls["status"], behind_gauge(cx)))
        }
    });
    assert!(ctx.event_reasons().iter().any(|r| r == "FencingSequenceCaughtUp"));
    ctx.op.assert_healthy();
}
