//! The LockService actions end to end on the cluster tier: requested with one `kubectl annotate`
//! line, executed by the operator binary (the chart's args and RBAC), against a real lock-server
//! process over a real lockdb (and real paydbs), each step visible in status.
//!
//! lock-server runs as a local process standing in for its Deployment's pod (the Deployment's own
//! command, args and env, Secrets resolved — its admin token included); the operator reaches it at
//! its Service URL through `HTTP_PROXY` (see `dlock_e2e::proxy`).

use dlock_e2e::k8s;
use dlock_e2e::lockapi::{JUMP, LockApi};
use dlock_e2e::lockdb::{holder, revocations, sequence};
use dlock_e2e::specs::{lockservice, paymentstack, stack_spec};
use dlock_e2e::stage::{Options, Stage};
use dlock_operator::crd::actions::{ANNOTATION_RESTORE, ANNOTATION_REVOKE, RestoreRequest, RevokeRequest};
use dlock_operator::crd::actions::{ActionType, DEFAULT_MARGIN};
use dlock_operator::crd::sequence::{JumpCause, SequenceJump};
use dlock_operator::crd::status::{ActionPhase, ActionStep};
use dlock_operator::crd::{ActionStatus, DatabaseSpec, LockService, PaymentStack};
use dlock_testkit::{History, TestDb};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use serde_json::json;

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
    st.wait_events(LS, &["RevokeTargetRecorded", "RevokeSucceeded"])
        .await;

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

/// How far above every token lock-server granted in a test its paydbs' high-water marks are put:
/// 2^40, far beyond anything lock-server's own jumps reach in a test's lifetime (a jump moves the
/// sequence `JUMP` = 2^32 past what it finds, or to a floor that rises by 2^10 tokens per
/// millisecond: 2^40 is twelve days of it). Only the restore fast-forward can move the sequence
/// past them, so each fast-forward below really advances, to a target known exactly.
const BEYOND: i64 = 1 << 40;

/// How many `SequenceJumped` Events were published about the LockService: an Event counts once,
/// or as many times as its series says when the recorder folded repeats into it.
async fn jumps_told(st: &Stage) -> i32 {
    st.events(LS)
        .await
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("SequenceJumped"))
        .map(|e| e.series.map_or(1, |s| s.count))
        .sum()
}

/// lock-server after a restart (the fast-forward's gate stopped its process, resume started a new
/// one) jumped once, at its start, and granted `next` right after: `found` is one above `seq`, so
/// nothing took a token between the advance (or the last grant) and the jump — no grant while gated
/// — and `next` is the jump's first token.
fn jumped_once_from(api: &LockApi, seq: i64, next: i64) -> SequenceJump {
    let j = api.last_jump();
    assert_eq!(j.cause, JumpCause::Start, "{j:?}");
    assert_eq!(
        j.found,
        seq + 1,
        "the restarted lock-server found the sequence where it was left ({seq}): {j:?}"
    );
    assert!(j.jumped_to >= j.found + JUMP, "{j:?}");
    assert_eq!(next, j.jumped_to + 1, "the first grant after the jump: {j:?}");
    j
}

/// lockdb dropped and created again from `backup` (a new database oid), while lock-server runs;
/// returns once lock-server is ready on it again.
async fn restore_lockdb(st: &mut Stage, backup: &str) {
    let lockdb = st.lockdb();
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
}

/// Waits (driving the stand-in) until a restore the operator started itself after a promotion
/// (`promotion-<hash>`), other than those in `seen`, is finished.
async fn own_fast_forward(st: &mut Stage, seen: &[&str]) -> ActionStatus {
    st.wait("the operator's own fast-forward to finish", true, async |st| {
        let s = st.lsvc(LS).await.status.unwrap_or_default();
        let a = s
            .actions
            .iter()
            .find(|a| a.id.starts_with("promotion-") && !seen.contains(&a.id.as_str()));
        match a {
            Some(a) if a.phase.is_final() => Ok(a.clone()),
            _ => Err(format!("status: {s:?}")),
        }
    })
    .await
}

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
        st.wait_ready::<PaymentStack>(ps).await;
    }
    // The first periodic fencing check (due at once, then every 5 minutes) has run and found
    // nothing behind: the only check that can find the sequence behind below is the one the jump
    // asks for.
    st.wait("the first periodic fencing check", true, async |st| {
        let f = st.lsvc(LS).await.status.and_then(|s| s.fencing);
        match f {
            Some(f) if f.job_name.is_some() && !f.is_behind() => Ok(()),
            f => Err(format!("fencing: {f:?}")),
        }
    })
    .await;

    // 2. Grants happen, after lock-server's own start jump: consecutive tokens from its first.
    let api = lock_api(&st);
    let mut tokens = Vec::new();
    for i in 0..6 {
        let g = api.acquire("worker", &format!("account:{i}"), 600_000);
        tokens.push(g.token);
        api.release(&g);
    }
    let start = api.last_jump();
    assert_eq!(start.cause, JumpCause::Start, "{start:?}");
    assert_eq!(
        tokens,
        (start.jumped_to + 1..start.jumped_to + 7).collect::<Vec<_>>(),
        "one jump at the start, then one token per grant: {start:?}"
    );
    let top = tokens[5];
    // The resources have seen tokens far ahead of this lockdb — of a lockdb history it knows
    // nothing of, further than any jump reaches (a logical restore into a fresh cluster is one:
    // docs/design.md, "What it does not cover"). pay-a: rail-proxy's high-water H, an account
    // fenced at H - 1; pay-b: an account fenced at H - 2, a payout claimed with H - 3.
    let high = top + BEYOND;
    exec(
        &pay_a,
        &format!("INSERT INTO rail_high_water (account_id, highest_token) VALUES ('{A2}', {high})"),
    )
    .await;
    exec(
        &pay_a,
        &format!(
            "UPDATE account SET fence = {} WHERE account_id = '{A1}'",
            high - 1
        ),
    )
    .await;
    exec(
        &pay_b,
        &format!(
            "UPDATE account SET fence = {} WHERE account_id = '{A1}'",
            high - 2
        ),
    )
    .await;
    exec(
        &pay_b,
        &format!(
            "INSERT INTO payout (payout_id, account_id, amount_minor, currency, state, claimed_by, claim_token, idempotency_key)
             VALUES ('10000000-0000-4000-8000-000000000001', '{A1}', 100, 'EUR', 'CLAIMED', 'w', {}, 'e2e-1')",
            high - 3
        ),
    )
    .await;

    // The operator shows lock-server's start jump (the first it records: it asks for no check) and
    // has told it by an Event.
    k8s::annotate(&st.api::<LockService>(), LS, "dlock.dev/nudge", "granted").await;
    let told_before = st
        .wait("status.sequence to show the start jump", false, async |st| {
            let s = st.lsvc(LS).await.status.and_then(|s| s.sequence);
            let told = jumps_told(st).await;
            match s {
                Some(s) if s.last_jump.as_ref() == Some(&start) && s.fencing_check.is_none() && told >= 1 => {
                    Ok(told)
                }
                s => Err(format!(
                    "sequence: {s:?}, {told} Events; lock-server's jump: {start:?}"
                )),
            }
        })
        .await;

    // 3. lockdb is restored from the backup: the sequence rewinds to before every grant. The
    //    restored database is a new database (a new oid), so lock-server cannot vouch for it and
    //    jumps before its next grant (`new_system`): no token is handed out twice.
    restore_lockdb(&mut st, &backup).await;
    let restored = api.acquire("worker", "account:after-restore", 600_000);
    api.release(&restored);
    let jump = api.last_jump();
    assert_eq!(jump.cause, JumpCause::NewSystem, "{jump:?}");
    assert!(
        jump.found <= tokens[0],
        "the restored sequence had rewound to the backup's (found {}, first token granted {})",
        jump.found,
        tokens[0]
    );
    assert!(jump.jumped_to >= jump.found + JUMP, "{jump:?}");
    assert_eq!(restored.token, jump.jumped_to + 1, "{jump:?}");
    assert!(
        restored.token > top,
        "the first grant on the restored lockdb ({}) is above every token granted before ({tokens:?})",
        restored.token
    );
    assert!(
        restored.token < high,
        "premise: the jump does not reach the paydbs' high-water ({} vs {high})",
        restored.token
    );

    // The operator reads the jump at its next reconcile (at the latest 5 minutes on, when all is
    // well); a nudge makes that now. Not driving the stand-in meanwhile, so nothing it runs moves
    // on (no Job, lock-server not stopped) and status shows this jump.
    let starts = st.kubelet.served_starts(&format!("{LS}-lock-server"));
    k8s::annotate(&st.api::<LockService>(), LS, "dlock.dev/nudge", "restored").await;
    let seq = st
        .wait("status.sequence to show the new_system jump", false, async |st| {
            let s = st.lsvc(LS).await.status.and_then(|s| s.sequence);
            match s {
                Some(s) if s.last_jump.as_ref() == Some(&jump) => Ok(s),
                s => Err(format!("sequence: {s:?}; lock-server's jump: {jump:?}")),
            }
        })
        .await;
    assert!(seq.jumps_enabled, "{seq:?}");
    // Told by a SequenceJumped Event: one more than before the restore. The Event recorder
    // (kube-runtime's) folds Events of one reason about one object into a series whose note stays
    // the first one's, so it is counted here; the cause is in status.sequence above.
    st.wait(
        "the SequenceJumped Event of the new_system jump",
        false,
        async |st| {
            let told = jumps_told(st).await;
            if told == told_before + 1 {
                Ok(())
            } else {
                Err(format!(
                    "{told} SequenceJumped Events, {told_before} before the restore"
                ))
            }
        },
    )
    .await;

    // 4. The new history asks for the fencing check at once (the periodic one is not due for 5
    //    minutes); it finds the sequence behind the paydbs, and the operator starts the restore
    //    fast-forward itself (`status.sequence.restore`, request id `promotion-<hash>`), run as a
    //    requested one: gate, read every paydb, advance to the high-water + the default margin,
    //    reopen.
    let auto = own_fast_forward(&mut st, &[]).await;
    assert_eq!(auto.phase, ActionPhase::Succeeded, "{auto:?}");
    assert_eq!(auto.type_, ActionType::Restore, "{auto:?}");
    assert_eq!(auto.margin, Some(DEFAULT_MARGIN), "{auto:?}");
    let by_name =
        |a: &ActionStatus, n: &str| a.stacks.iter().find(|s| s.name == n).cloned().unwrap_or_default();
    assert_eq!(by_name(&auto, "pay-a").highest, high, "{auto:?}");
    assert_eq!(by_name(&auto, "pay-a").rail_high_water, high, "{auto:?}");
    assert_eq!(by_name(&auto, "pay-a").account_fence, high - 1, "{auto:?}");
    assert_eq!(by_name(&auto, "pay-b").highest, high - 2, "{auto:?}");
    assert_eq!(by_name(&auto, "pay-b").account_fence, high - 2, "{auto:?}");
    assert_eq!(by_name(&auto, "pay-b").claim_token, high - 3, "{auto:?}");
    let target = high + DEFAULT_MARGIN;
    assert_eq!(
        auto.sequence_before,
        Some(restored.token),
        "no grant since: {auto:?}"
    );
    assert_eq!(auto.target_sequence, Some(target), "{auto:?}");
    assert_eq!(auto.sequence_after, Some(target), "{auto:?}");
    assert_eq!(by_name(&auto, "pay-b").sequence_after, Some(target), "{auto:?}");
    // The gate really closed (lock-server's pod went away and came back) and is open again. Counted
    // once the LockService is ready again: `Succeeded` is written when the operator scales
    // lock-server back up, before the test kubelet has necessarily started the new process.
    let ls = ready(&mut st).await;
    assert_eq!(
        st.kubelet.served_starts(&format!("{LS}-lock-server")),
        starts + 1,
        "lock-server restarted once"
    );
    let s = ls.status.clone().unwrap_or_default();
    assert!(s.gate.is_none(), "gate still closed: {s:?}");
    assert!(condition_is(&ls, "Degraded", "False"), "{s:?}");
    // No grant was issued while gated: the new lock-server's start jump found the sequence exactly
    // where the advance left it, and the next grant is above every token both paydbs have seen.
    let api = lock_api(&st);
    let fresh = api.acquire("worker", "account:resumed", 600_000);
    let resumed = jumped_once_from(&api, target, fresh.token);
    assert!(fresh.token > high, "{} above the high-water {high}", fresh.token);
    st.wait_events(
        LS,
        &[
            "FencingSequenceBehind",
            "RestoreGateClosing",
            "RestoreGateClosed",
            "RestoreHighWaterRead",
            "RestoreSequenceAdvanced",
            "RestoreSucceeded",
            "FencingSequenceCaughtUp",
        ],
    )
    .await;
    // A start on the history already recorded is shown, and asks for no check (nor restore); the
    // finished fast-forward is forgotten from status.sequence.
    k8s::annotate(&st.api::<LockService>(), LS, "dlock.dev/nudge", "resumed").await;
    st.wait("status.sequence to show the start jump", false, async |st| {
        let s = st.lsvc(LS).await.status.and_then(|s| s.sequence);
        match s {
            Some(s)
                if s.last_jump.as_ref() == Some(&resumed)
                    && s.fencing_check.is_none()
                    && s.restore.is_none() =>
            {
                Ok(())
            }
            s => Err(format!("sequence: {s:?}, lock-server's jump: {resumed:?}")),
        }
    })
    .await;

    // 5. A requested fast-forward, from one annotate line. pay-a's rail-proxy has since seen a
    //    token far above the sequence again (H2); pay-b is where it was.
    let high2 = fresh.token + BEYOND;
    exec(
        &pay_a,
        &format!("UPDATE rail_high_water SET highest_token = {high2} WHERE account_id = '{A2}'"),
    )
    .await;
    let before = sequence(&lockdb).await;
    assert_eq!(before, fresh.token, "no grant since");
    let starts = st.kubelet.served_starts(&format!("{LS}-lock-server"));
    request_restore(&st, "ff-1", Some(100)).await;
    let done = finished(&mut st, "ff-1").await;
    assert_eq!(done.phase, ActionPhase::Succeeded, "{done:?}");
    assert_eq!(by_name(&done, "pay-a").highest, high2, "{done:?}");
    assert_eq!(by_name(&done, "pay-a").rail_high_water, high2, "{done:?}");
    assert_eq!(by_name(&done, "pay-a").account_fence, high - 1, "{done:?}");
    assert_eq!(by_name(&done, "pay-b").highest, high - 2, "{done:?}");
    assert_eq!(by_name(&done, "pay-b").claim_token, high - 3, "{done:?}");
    assert_eq!(done.sequence_before, Some(before), "{done:?}");
    assert_eq!(done.target_sequence, Some(high2 + 100), "{done:?}");
    assert_eq!(done.sequence_after, Some(high2 + 100), "{done:?}");
    assert_eq!(
        by_name(&done, "pay-b").sequence_after,
        Some(high2 + 100),
        "{done:?}"
    );
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
    let api = lock_api(&st);
    let next = api.acquire("worker", "account:resumed-again", 600_000);
    jumped_once_from(&api, high2 + 100, next.token);
    assert!(next.token > high2, "{} above the high-water {high2}", next.token);

    // 6. An unreadable paydb fails the action and keeps the gate closed, naming the stack.
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
    assert_eq!(
        sequence(&lockdb).await,
        next.token,
        "the sequence was not touched"
    );

    // 7. Fixed, a new request succeeds and opens the gate.
    exec(
        &pay_b,
        "ALTER TABLE rail_high_water_moved RENAME TO rail_high_water",
    )
    .await;
    request_restore(&st, "ff-3", Some(10)).await;
    let done = finished(&mut st, "ff-3").await;
    assert_eq!(done.phase, ActionPhase::Succeeded, "{done:?}");
    // Never lower: the target (the high-water + 10) is below the sequence, which stays at the last
    // token granted.
    assert_eq!(done.target_sequence, Some(high2 + 10), "{done:?}");
    assert_eq!(done.sequence_before, Some(next.token), "{done:?}");
    assert_eq!(done.sequence_after, Some(next.token), "{done:?}");
    let ls = ready(&mut st).await;
    assert!(
        ls.status.as_ref().is_some_and(|s| s.gate.is_none()),
        "{:?}",
        ls.status
    );
    let api = lock_api(&st);
    let later = api.acquire("worker", "account:later", 600_000);
    jumped_once_from(&api, next.token, later.token);

    // 8. lockdb restored from the same backup again, with the requested restores' annotation still
    //    on the LockService (ff-3, finished: never run again). The backup lacks the fast-forwards
    //    since, which no jump's floor reaches (docs/design.md, "What it does not cover"): the jump's
    //    check finds the sequence behind pay-a's H2, and the operator's own fast-forward runs again.
    let starts = st.kubelet.served_starts(&format!("{LS}-lock-server"));
    restore_lockdb(&mut st, &backup).await;
    let again = api.acquire("worker", "account:after-second-restore", 600_000);
    api.release(&again);
    let jump = api.last_jump();
    assert_eq!(jump.cause, JumpCause::NewSystem, "{jump:?}");
    assert_eq!(again.token, jump.jumped_to + 1, "{jump:?}");
    assert!(
        again.token < high2,
        "premise: the jump does not reach H2 ({} vs {high2})",
        again.token
    );
    k8s::annotate(&st.api::<LockService>(), LS, "dlock.dev/nudge", "restored-again").await;
    let auto2 = own_fast_forward(&mut st, &[auto.id.as_str()]).await;
    assert_eq!(auto2.phase, ActionPhase::Succeeded, "{auto2:?}");
    let target = high2 + DEFAULT_MARGIN;
    assert_eq!(by_name(&auto2, "pay-a").highest, high2, "{auto2:?}");
    assert_eq!(auto2.sequence_before, Some(again.token), "{auto2:?}");
    assert_eq!(auto2.target_sequence, Some(target), "{auto2:?}");
    assert_eq!(auto2.sequence_after, Some(target), "{auto2:?}");
    let ls = ready(&mut st).await;
    assert_eq!(
        st.kubelet.served_starts(&format!("{LS}-lock-server")),
        starts + 1,
        "lock-server restarted once"
    );
    assert!(
        ls.status.as_ref().is_some_and(|s| s.gate.is_none()),
        "{:?}",
        ls.status
    );
    let api = lock_api(&st);
    let last = api.acquire("worker", "account:last", 600_000);
    jumped_once_from(&api, target, last.token);
    assert!(last.token > high2, "{} above the high-water {high2}", last.token);
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
    st.wait_ready::<PaymentStack>("pay-a").await;

    // 1. Grants and resources agree: a check runs, finds nothing behind, the gauge says 0. The
    //    resource has seen the last token granted.
    let api = lock_api(&st);
    let mut last = 0;
    for i in 0..3 {
        let g = api.acquire("worker", &format!("account:{i}"), 600_000);
        api.release(&g);
        last = g.token;
    }
    exec(
        &pay,
        &format!("INSERT INTO rail_high_water (account_id, highest_token) VALUES ('{A1}', {last})"),
    )
    .await;
    let fencing = st
        .wait(
            &format!("a fencing check that saw high-water {last}"),
            true,
            async |st| {
                let ls = st.lsvc(LS).await;
                let f = ls.status.and_then(|s| s.fencing);
                let gauge = behind_gauge(st).await;
                match f {
                    Some(f) if f.high_water == last && f.sequence == last && gauge == Some(0) => Ok(f),
                    f => Err(format!("fencing: {f:?}, gauge {gauge:?}")),
                }
            },
        )
        .await;
    assert_eq!(fencing.high_water_stack.as_deref(), Some("pay-a"), "{fencing:?}");
    let ls = st.lsvc(LS).await;
    assert!(condition_is(&ls, "Degraded", "False"), "{:?}", ls.status);

    // 2. Behind our back (a restore of lockdb done outside dlock that no jump reached, or a
    //    resource that saw tokens of another lockdb): the paydb has seen a token far above the
    //    sequence. Nobody asks for a check; the next periodic one notices.
    let high = last + BEYOND;
    exec(
        &pay,
        &format!("UPDATE rail_high_water SET highest_token = {high} WHERE account_id = '{A1}'"),
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
        message.contains(&format!("at {last},"))
            && message.contains(&format!("({high},"))
            && message.contains("pay-a"),
        "both numbers and the stack in the message: {message}"
    );
    let s = ls.status.clone().unwrap_or_default();
    let f = s.fencing.clone().expect("a fencing status");
    assert_eq!(f.sequence, last, "{s:?}");
    assert_eq!(f.high_water, high, "{s:?}");
    st.wait_events(LS, &["FencingSequenceBehind"]).await;
    // Detection changes nothing by itself: no gate, lock-server keeps serving, the sequence is
    // where it was.
    assert!(s.gate.is_none(), "{s:?}");
    assert_eq!(sequence(&st.lockdb()).await, last);

    // 3. The fast-forward clears it, and the checks agree (the gauge returns to 0): the first check
    //    after lock-server came back sees the sequence its start jump left, above the target.
    request_restore(&st, "ff-detected", Some(10)).await;
    let done = finished(&mut st, "ff-detected").await;
    assert_eq!(done.phase, ActionPhase::Succeeded, "{done:?}");
    assert_eq!(done.sequence_before, Some(last), "{done:?}");
    assert_eq!(done.target_sequence, Some(high + 10), "{done:?}");
    assert_eq!(done.sequence_after, Some(high + 10), "{done:?}");
    ready(&mut st).await;
    let api = lock_api(&st);
    let j = api.last_jump();
    assert_eq!(j.cause, JumpCause::Start, "{j:?}");
    assert_eq!(j.found, high + 11, "found where the advance left it: {j:?}");
    st.wait("the next check to see the sequence caught up", true, async |st| {
        let ls = st.lsvc(LS).await;
        let f = ls.status.as_ref().and_then(|s| s.fencing.as_ref());
        let gauge = behind_gauge(st).await;
        if f.is_some_and(|f| f.sequence == j.jumped_to && f.job_name.is_some())
            && condition_is(&ls, "Degraded", "False")
            && gauge == Some(0)
        {
            Ok(())
        } else {
            Err(format!("status: {:?}, gauge {gauge:?}", ls.status))
        }
    })
    .await;
    st.wait_events(LS, &["FencingSequenceCaughtUp"]).await;
    st.op.assert_healthy();
}

/// lock-server as the operator runs it has a clients file: its own PaymentStack's token opens
/// sessions only for owner ids under `<stack>/` and locks only `account:` keys, an unknown caller is
/// refused (401), and the stand-in's lock-server rolls when a stack's client is added. The
/// operator's own read of a holder (the revoke's) uses the admin token, which stays admitted (the
/// revoke test above runs with the clients file in place).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_server_serves_the_lock_clients_the_operator_made_and_nobody_else() {
    let Some(mut st) = stage(
        "lock_server_serves_the_lock_clients_the_operator_made_and_nobody_else",
        &[History::Lockdb, History::Paydb],
        &[],
    )
    .await
    else {
        return;
    };
    st.apply(&managed_lockservice()).await;
    ready(&mut st).await;
    let starts = st.kubelet.served_starts(&format!("{LS}-lock-server"));
    st.apply(&payments("pay")).await;

    // The stack's token, once its Secret exists, and lock-server rolled onto a file that lists it.
    let token = st
        .wait("pay's lock client served by lock-server", true, async |st| {
            let secret: Option<k8s_openapi::api::core::v1::Secret> = st.get("pay-lock-client").await;
            let token = secret
                .and_then(|s| s.data?.remove("token"))
                .map(|v| String::from_utf8_lossy(&v.0).into_owned())
                .ok_or("no pay-lock-client Secret yet")?;
            let file: Option<k8s_openapi::api::core::v1::Secret> = st.get("locks-lock-clients").await;
            let text = file
                .and_then(|s| s.data?.remove("clients.json"))
                .map(|v| String::from_utf8_lossy(&v.0).into_owned())
                .unwrap_or_default();
            if !text.contains("paymentstack-pay") || !text.contains(&token) {
                return Err("the clients file does not list pay yet".into());
            }
            let restarted = st.kubelet.served_starts(&format!("{LS}-lock-server")) > starts;
            match st.kubelet.served_port(&format!("{LS}-lock-server")) {
                Some(_) if restarted => Ok(token),
                _ => Err("lock-server has not rolled yet".into()),
            }
        })
        .await;
    let api = lock_api(&st);
    let bearer = format!("Bearer {token}");
    let as_pay = [("Authorization", bearer.as_str())];
    let session = |owner: &str| json!({"ownerId": owner, "ttlMs": 60_000});

    // Nobody's token: refused before anything is read.
    let (code, body) = api
        .anonymous()
        .call("POST", "/v1/sessions", Some(&session("pay/x")), &[]);
    assert_eq!(code, 401, "{body}");
    // The stack's token, under its owner prefix: a session, and an account lock.
    let (code, body) = api.call(
        "POST",
        "/v1/sessions",
        Some(&session("pay/pay-payout-executor-1")),
        &as_pay,
    );
    assert_eq!(code, 201, "{body}");
    let id = body["sessionId"].as_str().unwrap_or_default().to_owned();
    let acquire = |key: &str| {
        api.call(
            "POST",
            &format!("/v1/locks/{key}/acquire"),
            Some(&json!({"sessionId": id, "ownerId": "pay/pay-payout-executor-1", "ttlMs": 60_000})),
            &as_pay,
        )
    };
    let (code, body) = acquire("account:e2e-clients");
    assert_eq!(code, 200, "{body}");
    // Another key space, another stack's owner ids, another operation: refused.
    assert_eq!(acquire("job:nightly").0, 403);
    for owner in ["pay-x/p", "worker-z", "pa"] {
        let (code, body) = api.call("POST", "/v1/sessions", Some(&session(owner)), &as_pay);
        assert_eq!(code, 403, "{owner}: {body}");
    }
    let (code, _) = api.call("GET", "/v1/locks/account:e2e-clients", None, &as_pay);
    assert_eq!(code, 403, "the executors' client reads nothing");
    // The tests' own client (the LockService's clientsSecretRef) still holds its keys.
    let g = api.acquire("worker-clients", "account:e2e-own", 60_000);
    api.release(&g);
    st.op.assert_healthy();
}
