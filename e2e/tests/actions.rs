//! The LockService actions end to end on the cluster tier: requested with one `kubectl annotate`
//! line, executed by the operator binary (the chart's args and RBAC), against a real lock-server
//! process over a real lockdb (and real paydbs), each step visible in status.
//!
//! lock-server runs as a local process standing in for its Deployment's pod (the Deployment's own
//! command, args and env, Secrets resolved — its admin token included); the operator reaches it at
//! its Service URL through `HTTP_PROXY` (see `dlock_e2e::proxy`).

use dlock_e2e::k8s;
use dlock_e2e::lockapi::LockApi;
use dlock_e2e::lockdb::{holder, revocations, sequence};
use dlock_e2e::specs::{lockservice, paymentstack, stack_spec};
use dlock_e2e::stage::{Options, Stage};
use dlock_operator::crd::actions::{ANNOTATION_RESTORE, ANNOTATION_REVOKE, RestoreRequest, RevokeRequest};
use dlock_operator::crd::status::{ActionPhase, ActionStep};
use dlock_operator::crd::{ActionStatus, DatabaseSpec, LockService, PaymentStack};
use dlock_testkit::{History, TestDb};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

const LS: &str = "locks";

/// A stage whose operator reaches lock-server through the proxy, and whose stand-in kubelet runs
/// lock-server's pod as a local process.
async fn stage(test: &str, histories: &[History], op_env: &[(&str, &str)]) -> Option<Stage> {
    let options = Options {
        proxy: true,
        env: op_env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    };
    let mut st = Stage::start(test, "act", histories, options).await?;
    st.serve_lock_server(LS);
    Some(st)
}

fn lock_api(st: &Stage) -> LockApi {
    st.lock_api(LS)
}

fn proxy(st: &Stage) -> &dlock_e2e::proxy::Proxy {
    st.proxy()
}

/// One `kubectl annotate` line: the user's entry point (docs/operations.md), so kubectl it is.
async fn annotate(st: &Stage, key: &str, value: &str) {
    st.cluster
        .kubectl
        .annotate(&st.ns, "lockservice", LS, key, value)
        .await
        .ok();
}

async fn request_revoke(st: &Stage, id: &str, key: &str) {
    let request = RevokeRequest {
        id: id.to_owned(),
        key: key.to_owned(),
        reason: "stuck worker".to_owned(),
        requested_by: "alice".to_owned(),
    };
    let json = serde_json::to_string(&request).expect("a request serializes");
    annotate(st, ANNOTATION_REVOKE, &json).await;
}

async fn request_restore(st: &Stage, id: &str, margin: Option<i64>) {
    let request = RestoreRequest {
        id: id.to_owned(),
        margin,
    };
    let json = serde_json::to_string(&request).expect("a request serializes");
    annotate(st, ANNOTATION_RESTORE, &json).await;
}

fn action(ls: &LockService, id: &str) -> Option<ActionStatus> {
    ls.status.as_ref()?.actions.iter().find(|a| a.id == id).cloned()
}

/// Waits (driving the stand-in) until `status.actions[id]` satisfies `done`.
async fn wait_action(st: &mut Stage, id: &str, done: impl Fn(&ActionStatus) -> bool) -> ActionStatus {
    st.wait(&format!("action {id}"), true, async |st| {
        let ls = st.lsvc(LS).await;
        match action(&ls, id) {
            Some(a) if done(&a) => Ok(a),
            other => Err(format!("action: {other:?}; status: {:?}", ls.status)),
        }
    })
    .await
}

/// Waits until action `id` is final (Succeeded or Failed).
async fn finished(st: &mut Stage, id: &str) -> ActionStatus {
    wait_action(st, id, |a| a.phase.is_final()).await
}

fn managed_lockservice() -> LockService {
    lockservice(LS, DatabaseSpec::managed(), 1)
}

/// The LockService Ready at its current generation (driving the stand-in).
async fn ready(st: &mut Stage) -> LockService {
    st.wait_ready(LS).await
}

/// The condition `t` of the LockService, if any.
fn condition(ls: &LockService, t: &str) -> Option<Condition> {
    ls.status.as_ref()?.condition(t).cloned()
}

fn condition_is(ls: &LockService, t: &str, status: &str) -> bool {
    condition(ls, t).is_some_and(|c| c.status == status)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoke_by_annotation_is_pinned_to_the_recorded_token_across_retries_and_crashes() {
    let Some(mut st) = stage(
        "revoke_by_annotation_is_pinned_to_the_recorded_token_across_retries_and_crashes",
        &[History::Lockdb],
        &[],
    )
    .await
    else {
        return;
    };
    st.apply(&managed_lockservice()).await;
    let ready = ready(&mut st).await;
    let generation = ready.metadata.generation;
    let api = lock_api(&st);
    let db = st.lockdb();
    let key = "account:e2e-stuck";

    // 1. A worker holds the key; the operator is asked to revoke it.
    let a = api.acquire("worker-a", key, 600_000);
    request_revoke(&st, "r-1", key).await;
    let done = finished(&mut st, "r-1").await;
    assert_eq!(done.phase, ActionPhase::Succeeded, "{done:?}");
    assert_eq!(done.outcome.as_deref(), Some("REVOKED"), "{done:?}");
    assert_eq!(done.target_token, Some(a.token), "{done:?}");
    assert_eq!(done.previous_token, Some(a.token), "{done:?}");
    assert_eq!(done.previous_owner.as_deref(), Some("worker-a"), "{done:?}");
    assert_eq!(done.requested_by.as_deref(), Some("alice"));
    assert_eq!(holder(&db, key).await, None, "the grant is gone");
    assert_eq!(
        revocations(&db, key).await,
        vec![(a.token, "worker-a".to_owned(), "alice".to_owned())],
        "audited once, in lock_revocation"
    );
    assert_eq!(api.get(key)["state"], "FREE");
    let reasons = st.event_reasons(LS).await;
    for r in ["RevokeTargetRecorded", "RevokeSucceeded"] {
        assert!(reasons.iter().any(|x| x == r), "no {r} Event among {reasons:?}");
    }

    // 2. A finished id is never executed again: a newer holder survives the same request.
    let c = api.acquire("worker-c", key, 600_000);
    assert!(c.token > a.token);
    let before = reconciles(&st).await;
    request_revoke(&st, "r-1", key).await;
    k8s::annotate(&st.api::<LockService>(), LS, "dlock.dev/nudge", "1").await;
    st.wait(
        "the operator to reconcile the re-sent request",
        true,
        async |st| {
            let n = reconciles(st).await;
            if n > before {
                Ok(())
            } else {
                Err(format!("{n} reconciles, {before} before"))
            }
        },
    )
    .await;
    assert_eq!(holder(&db, key).await, Some(("worker-c".to_owned(), c.token)));
    assert_eq!(revocations(&db, key).await.len(), 1, "nothing new revoked");
    let ls = st.lsvc(LS).await;
    assert_eq!(
        action(&ls, "r-1").as_ref(),
        Some(&done),
        "the finished entry is unchanged"
    );

    // 3. Crash between Running and the revoke: the operator records the target (c's token), the
    //    revoke cannot reach lock-server, the operator is killed; meanwhile c releases and d takes
    //    the key. The restarted operator revokes exactly the recorded token: d is left alone.
    proxy(&st).block("/v1/admin/");
    request_revoke(&st, "r-2", key).await;
    let running = wait_action(&mut st, "r-2", |a| a.phase == ActionPhase::Running).await;
    assert_eq!(running.target_token, Some(c.token), "{running:?}");
    assert_eq!(running.step, Some(ActionStep::Revoke));
    st.wait("the operator to try the blocked revoke", true, async |st| {
        let seen = proxy(st).seen();
        if seen.iter().any(|s| s.starts_with("POST /v1/admin/")) {
            Ok(())
        } else {
            Err(format!("{seen:?}"))
        }
    })
    .await;
    st.op.kill();
    api.release(&c);
    let d = api.acquire("worker-d", key, 600_000);
    assert!(d.token > c.token);
    proxy(&st).unblock();
    st.restart_operator().await;
    let after = finished(&mut st, "r-2").await;
    assert_eq!(after.outcome.as_deref(), Some("HELD_BY_OTHER_TOKEN"), "{after:?}");
    assert_eq!(after.phase, ActionPhase::Failed, "{after:?}");
    assert_eq!(after.current_token, Some(d.token), "{after:?}");
    assert_eq!(after.target_token, Some(c.token), "{after:?}");
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
    let ls = st.lsvc(LS).await;
    assert_eq!(ls.metadata.generation, generation);
    assert!(condition_is(&ls, "Ready", "True"), "{:?}", ls.status);
    assert_eq!(
        ls.status.as_ref().and_then(|s| s.last_action.as_deref()),
        Some("r-2 Failed")
    );
    st.op.assert_healthy();
}

/// `dlock_operator_reconciliations_total{kind="LockService"}` from the operator's metrics.
async fn reconciles(st: &Stage) -> u64 {
    st.op
        .get("/metrics")
        .await
        .lines()
        .filter(|l| l.starts_with("dlock_operator_reconciliations_total") && l.contains("LockService"))
        .filter_map(|l| l.split_whitespace().last()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

fn payments(name: &str) -> PaymentStack {
    let mut spec = stack_spec(LS);
    // The tests write high-water marks for the seeded accounts.
    spec.demo_data = true;
    spec.payment_resource.replicas = 1;
    spec.rail_proxy.replicas = 1;
    spec.payout_executor.replicas = 1;
    spec.payout_executor.workers = 1;
    paymentstack(name, spec)
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

const A1: &str = "00000000-0000-4000-8000-000000000001";
const A2: &str = "00000000-0000-4000-8000-000000000002";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restore_fast_forward_gates_reads_every_paydb_advances_and_resumes() {
    let test = "restore_fast_forward_gates_reads_every_paydb_advances_and_resumes";
    let Some(mut st) = stage(test, &[History::Lockdb, History::Paydb], &[]).await else {
        return;
    };
    // Each PaymentStack's paydb is its own local database, by the host in its URL.
    let (pay_a, pay_b) = (
        dlock_testkit::blank(History::Paydb).await,
        dlock_testkit::blank(History::Paydb).await,
    );
    let ns = st.ns.clone();
    st.kubelet
        .use_database_for_host(&format!("pay-a-paydb.{ns}.svc"), pay_a.clone());
    st.kubelet
        .use_database_for_host(&format!("pay-b-paydb.{ns}.svc"), pay_b.clone());
    st.apply(&managed_lockservice()).await;
    st.apply(&payments("pay-a")).await;
    st.apply(&payments("pay-b")).await;
    let lockdb = st.lockdb();

    // 1. The backup: lockdb right after its migration, before any grant (a file-level copy of the
    //    database, taken while nothing is connected).
    st.wait("the lockdb migration to run", false, async |st| {
        st.kubelet.run_pending_jobs().await;
        st.kubelet.workloads_ready().await;
        if st
            .kubelet
            .runs
            .iter()
            .any(|r| r.history == History::Lockdb && r.succeeded())
        {
            Ok(())
        } else {
            Err(format!("{} runs", st.kubelet.runs.len()))
        }
    })
    .await;
    let backup = format!("{}_backup", lockdb.name);
    exec_server(
        &lockdb,
        &format!("CREATE DATABASE {backup} TEMPLATE {}", lockdb.name),
    )
    .await;
    ready(&mut st).await;
    for ps in ["pay-a", "pay-b"] {
        st.wait(&format!("PaymentStack {ps} Ready"), true, async |st| {
            let o = st.pstack(ps).await;
            if o.status.as_ref().is_some_and(|s| s.is_ready()) {
                Ok(())
            } else {
                Err(format!("{:?}", o.status))
            }
        })
        .await;
    }

    // 2. Grants happen and the resources see their tokens: pay-a up to 6, pay-b up to 4.
    let api = lock_api(&st);
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
    st.wait(
        "lock-server to grant from the restored lockdb",
        true,
        async |st| {
            let (code, body) = lock_api(st).call("GET", "/readyz", None, &[]);
            if code == 200 {
                Ok(())
            } else {
                Err(format!("{code} {body}"))
            }
        },
    )
    .await;
    let stale = api.acquire("worker", "account:after-restore", 600_000);
    assert!(
        stale.token <= 6,
        "the sequence rewound: token {} was already seen",
        stale.token
    );
    api.release(&stale);

    let before = sequence(&lockdb).await;
    let starts = st.kubelet.served_starts(&format!("{LS}-lock-server"));

    // 4. The fast-forward, from one annotate line.
    request_restore(&st, "ff-1", Some(100)).await;
    let done = finished(&mut st, "ff-1").await;
    assert_eq!(done.phase, ActionPhase::Succeeded, "{done:?}");
    let by_name = |n: &str| {
        done.stacks
            .iter()
            .find(|s| s.name == n)
            .cloned()
            .unwrap_or_default()
    };
    assert_eq!(by_name("pay-a").highest, 6, "{done:?}");
    assert_eq!(by_name("pay-a").rail_high_water, 6, "{done:?}");
    assert_eq!(by_name("pay-b").highest, 4, "{done:?}");
    assert_eq!(by_name("pay-b").claim_token, 3, "{done:?}");
    assert_eq!(done.sequence_before, Some(before), "{done:?}");
    assert_eq!(done.target_sequence, Some(106), "{done:?}");
    assert_eq!(done.sequence_after, Some(106), "{done:?}");
    assert_eq!(by_name("pay-b").sequence_after, Some(106), "{done:?}");
    // The gate really closed (lock-server's pod went away and came back) and is open again. Counted
    // once the LockService is ready again: `Succeeded` is written when the operator scales
    // lock-server back up, before the test kubelet has necessarily started the new process.
    let ls = ready(&mut st).await;
    assert_eq!(
        st.kubelet.served_starts(&format!("{LS}-lock-server")),
        starts + 1,
        "lock-server restarted once"
    );
    assert!(
        ls.status.as_ref().is_some_and(|s| s.gate.is_none()),
        "gate still closed: {:?}",
        ls.status
    );
    // No grant was issued while gated: the sequence is exactly where the advance left it, and the
    // next grant is above every token both paydbs have seen.
    assert_eq!(sequence(&lockdb).await, 106);
    let api = lock_api(&st);
    let fresh = api.acquire("worker", "account:resumed", 600_000);
    assert_eq!(fresh.token, 107);
    let reasons = st.event_reasons(LS).await;
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
    request_restore(&st, "ff-2", None).await;
    let failed = finished(&mut st, "ff-2").await;
    assert_eq!(failed.phase, ActionPhase::Failed, "{failed:?}");
    let msg = failed.message.clone().unwrap_or_default();
    assert!(msg.contains("pay-b") && msg.contains("rail_high_water"), "{msg}");
    let ls = st.lsvc(LS).await;
    assert_eq!(
        ls.status
            .as_ref()
            .and_then(|s| s.gate.as_ref())
            .map(|g| g.action_id.as_str()),
        Some("ff-2"),
        "{:?}",
        ls.status
    );
    assert!(condition_is(&ls, "Degraded", "True"), "{:?}", ls.status);
    assert_eq!(
        condition(&ls, "Degraded").map(|c| c.reason),
        Some("RestoreFailed".to_owned())
    );
    let dep: Deployment = st.must_get(&format!("{LS}-lock-server")).await;
    assert_eq!(k8s::replicas(&dep), 0, "lock-server stays at zero");
    st.kubelet.step().await;
    assert_eq!(
        st.kubelet.served_port(&format!("{LS}-lock-server")),
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
    request_restore(&st, "ff-3", Some(10)).await;
    let done = finished(&mut st, "ff-3").await;
    assert_eq!(done.phase, ActionPhase::Succeeded, "{done:?}");
    // Never lower: the target (6 + 10) is below the sequence, which stays at 107.
    assert_eq!(done.sequence_after, Some(107), "{done:?}");
    let ls = ready(&mut st).await;
    assert!(
        ls.status.as_ref().is_some_and(|s| s.gate.is_none()),
        "{:?}",
        ls.status
    );
    let later = lock_api(&st).acquire("worker", "account:later", 600_000);
    assert_eq!(later.token, 108);
    st.op.assert_healthy();
}

/// The operator's gauge for this LockService (`None` until it is exported).
async fn behind_gauge(st: &Stage) -> Option<u64> {
    let labels = format!("namespace=\"{}\",name=\"{LS}\"", st.ns);
    st.op
        .get("/metrics")
        .await
        .lines()
        .filter(|l| l.starts_with("dlock_operator_fencing_sequence_behind{") && l.contains(&labels))
        .find_map(|l| l.split_whitespace().last()?.parse::<f64>().ok())
        .map(|v| v as u64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sequence_rewound_outside_dlock_is_detected_and_clears_after_the_fast_forward() {
    let test = "a_sequence_rewound_outside_dlock_is_detected_and_clears_after_the_fast_forward";
    // A one-second check interval: each check is a real `dlock-fastforward read` Job.
    let Some(mut st) = stage(
        test,
        &[History::Lockdb, History::Paydb],
        &[("DLOCK_OPERATOR_FENCING_CHECK_SECS", "1")],
    )
    .await
    else {
        return;
    };
    let pay = dlock_testkit::blank(History::Paydb).await;
    let ns = st.ns.clone();
    st.kubelet
        .use_database_for_host(&format!("pay-a-paydb.{ns}.svc"), pay.clone());
    st.apply(&managed_lockservice()).await;
    st.apply(&payments("pay-a")).await;
    ready(&mut st).await;
    st.wait("PaymentStack pay-a Ready", true, async |st| {
        let o = st.pstack("pay-a").await;
        if o.status.as_ref().is_some_and(|s| s.is_ready()) {
            Ok(())
        } else {
            Err(format!("{:?}", o.status))
        }
    })
    .await;

    // 1. Grants and resources agree: a check runs, finds nothing behind, the gauge says 0.
    let api = lock_api(&st);
    for i in 0..3 {
        let g = api.acquire("worker", &format!("account:{i}"), 600_000);
        api.release(&g);
    }
    exec(
        &pay,
        &format!("INSERT INTO rail_high_water (account_id, highest_token) VALUES ('{A1}', 3)"),
    )
    .await;
    let fencing = st
        .wait("a fencing check that saw high-water 3", true, async |st| {
            let ls = st.lsvc(LS).await;
            let f = ls.status.and_then(|s| s.fencing);
            let gauge = behind_gauge(st).await;
            match f {
                Some(f) if f.high_water == 3 && f.sequence == 3 && gauge == Some(0) => Ok(f),
                f => Err(format!("fencing: {f:?}, gauge {gauge:?}")),
            }
        })
        .await;
    assert_eq!(fencing.high_water_stack.as_deref(), Some("pay-a"), "{fencing:?}");
    let ls = st.lsvc(LS).await;
    assert!(condition_is(&ls, "Degraded", "False"), "{:?}", ls.status);

    // 2. Behind our back (a restore of lockdb done outside dlock, or a resource that saw tokens of
    //    another lockdb): the paydb has seen token 500, the sequence is at 3. Nobody asks for a
    //    check; the next periodic one notices.
    exec(
        &pay,
        &format!("UPDATE rail_high_water SET highest_token = 500 WHERE account_id = '{A1}'"),
    )
    .await;
    let ls = st
        .wait("Degraded/FencingSequenceBehind", true, async |st| {
            let ls = st.lsvc(LS).await;
            let reason = condition(&ls, "Degraded").map(|c| c.reason);
            let gauge = behind_gauge(st).await;
            if condition_is(&ls, "Degraded", "True")
                && reason.as_deref() == Some("FencingSequenceBehind")
                && gauge == Some(1)
            {
                Ok(ls)
            } else {
                Err(format!("status: {:?}, gauge {gauge:?}", ls.status))
            }
        })
        .await;
    let message = condition(&ls, "Degraded").map(|c| c.message).unwrap_or_default();
    assert!(
        message.contains("at 3") && message.contains("500") && message.contains("pay-a"),
        "both numbers and the stack in the message: {message}"
    );
    let s = ls.status.clone().unwrap_or_default();
    let f = s.fencing.clone().expect("a fencing status");
    assert_eq!(f.sequence, 3, "{s:?}");
    assert_eq!(f.high_water, 500, "{s:?}");
    assert!(
        st.event_reasons(LS)
            .await
            .iter()
            .any(|r| r == "FencingSequenceBehind")
    );
    // Detection changes nothing by itself: no gate, lock-server keeps serving, the sequence is
    // where it was.
    assert!(s.gate.is_none(), "{s:?}");
    assert_eq!(sequence(&st.lockdb()).await, 3);

    // 3. The fast-forward clears it, and the next check agrees (the gauge returns to 0).
    request_restore(&st, "ff-detected", Some(10)).await;
    let done = finished(&mut st, "ff-detected").await;
    assert_eq!(done.phase, ActionPhase::Succeeded, "{done:?}");
    assert_eq!(done.sequence_after, Some(510), "{done:?}");
    st.wait("the next check to see the sequence caught up", true, async |st| {
        let ls = st.lsvc(LS).await;
        let sequence = ls
            .status
            .as_ref()
            .and_then(|s| s.fencing.as_ref())
            .map(|f| f.sequence);
        let gauge = behind_gauge(st).await;
        if sequence == Some(510) && condition_is(&ls, "Degraded", "False") && gauge == Some(0) {
            Ok(())
        } else {
            Err(format!("status: {:?}, gauge {gauge:?}", ls.status))
        }
    })
    .await;
    assert!(
        st.event_reasons(LS)
            .await
            .iter()
            .any(|r| r == "FencingSequenceCaughtUp")
    );
    st.op.assert_healthy();
}
