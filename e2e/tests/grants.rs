//! A grant-key rotation on the cluster tier with payouts flowing: the operator binary (the chart's
//! args and RBAC) rotates the Ed25519 keys of a LockService while a PaymentStack's executors pay
//! a stream of payouts, and nothing is lost, paid twice or refused on the way.
//!
//! Every Deployment of the two objects runs as a local process standing in for its pod (its own
//! command, args and env, the key Secret and ConfigMap resolved), restarted when its pod template
//! changes, as a rollout would; the processes and the test reach each other's Service URLs through
//! the proxy (`dlock_e2e::proxy`). So the order the operator promises is exercised end to end: the
//! resources verify the new key before lock-server signs with it, and a retired key is refused.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use dlock_e2e::specs::{lockservice, paymentstack, stack_spec};
use dlock_e2e::stage::{Options, Stage};
use dlock_grant::{Claims, SigningKey};
use dlock_operator::crd::actions::{ANNOTATION_GRANT_KEYS, GrantKeyAction, GrantKeysRequest};
use dlock_operator::crd::{DatabaseSpec, GrantStatus, LockService, PaymentStack};
use dlock_testkit::History;
use k8s_openapi::api::apps::v1::Deployment;
use serde_json::{Value, json};
use sqlx::PgPool;

const LS: &str = "locks";
const PS: &str = "shop";
/// Payouts are created while both steps of the rotation run, one about every this long.
const CREATE_EVERY: Duration = Duration::from_millis(150);

/// Every Deployment of the LockService and the PaymentStack, with the database its URLs map to.
const SERVED: [(&str, History); 5] = [
    ("locks-lock-server", History::Lockdb),
    ("shop-payment-resource", History::Paydb),
    ("shop-rail-proxy", History::Paydb),
    ("shop-rail-stub", History::Paydb),
    ("shop-payout-executor", History::Paydb),
];

async fn stage(test: &str) -> Option<Stage> {
    let options = Options {
        proxy: true,
        env: Vec::new(),
    };
    let mut st = Stage::start(test, "grk", &[History::Lockdb, History::Paydb], options).await?;
    let ns = st.ns.clone();
    for (name, history) in SERVED {
        st.kubelet
            .serve_deployment(name, &format!("{name}.{ns}.svc:8080"), history);
    }
    Some(st)
}

fn grants(ls: &LockService) -> GrantStatus {
    ls.status
        .as_ref()
        .and_then(|s| s.grants.clone())
        .unwrap_or_default()
}

fn stack_keys(ps: &PaymentStack) -> Vec<String> {
    ps.status
        .as_ref()
        .and_then(|s| s.grants.as_ref())
        .map(|g| g.key_ids.clone())
        .unwrap_or_default()
}

/// The grant-key request, as `kubectl annotate` sets it (the runbook's line).
async fn request(st: &Stage, id: &str, action: GrantKeyAction, key_id: Option<&str>) {
    let request = GrantKeysRequest {
        id: id.to_owned(),
        action,
        key_id: key_id.map(str::to_owned),
    };
    let json = serde_json::to_string(&request).expect("a request serializes");
    st.cluster
        .kubectl
        .annotate(&st.ns, "lockservice", LS, ANNOTATION_GRANT_KEYS, &json)
        .await
        .ok();
}

/// Waits (driving the stand-in) until the LockService signs with `signer`, publishes exactly
/// `published`, has handled `request` (when given) and the stack's resources are rolled out with
/// `published`.
async fn rotated_to(st: &mut Stage, signer: &str, published: &[&str], request: Option<&str>) {
    st.wait(&format!("the signer {signer} over {published:?}"), true, async |st| {
        let g = grants(&st.lsvc(LS).await);
        let stack = stack_keys(&st.pstack(PS).await);
        let template = lock_server_signs_with(st).await;
        let done = g.signing_key_id.as_deref() == Some(signer)
            && g.key_ids == published
            && stack == published
            && template.as_deref() == Some(signer)
            && request.is_none_or(|r| g.last_request.as_deref() == Some(r));
        if done {
            Ok(())
        } else {
            Err(format!("lock service {g:?}; stack verifies {stack:?}; lock-server template signs with {template:?}"))
        }
    })
    .await;
}

/// The key id on lock-server's pod template (the operator rolls lock-server to switch it).
async fn lock_server_signs_with(st: &Stage) -> Option<String> {
    let d: Deployment = st.must_get(&format!("{LS}-lock-server")).await;
    d.spec?
        .template
        .metadata?
        .annotations?
        .get("dlock.dev/grant-signing-key")
        .cloned()
}

/// Creates payouts through payment-resource's Service URL (so through the proxy, to whichever
/// process serves it now) until `stop` is set, counting them in `created`; a creation that meets a
/// rolling pod is retried with the same idempotency key, so each number is one payout.
async fn create_payouts(
    http: &reqwest::Client,
    url: &str,
    token: &str,
    run: &str,
    stop: &AtomicBool,
    created: &AtomicU32,
) {
    let mut i = 0u32;
    while !stop.load(Ordering::SeqCst) {
        i += 1;
        dlock_e2e::payouts::create_payout(http, url, token, run, i).await;
        created.store(i, Ordering::SeqCst);
        tokio::time::sleep(CREATE_EVERY).await;
    }
}

/// `(posted, ended otherwise, total)` of the run's payouts.
async fn counts(db: &PgPool, run: &str) -> (i64, i64, i64) {
    sqlx::query_as(
        "SELECT count(*) FILTER (WHERE state = 'POSTED'),
                count(*) FILTER (WHERE state IN ('FAILED','ABANDONED')), count(*)
           FROM payout WHERE idempotency_key LIKE $1",
    )
    .bind(format!("{run}-%"))
    .fetch_one(db)
    .await
    .unwrap_or_else(|e| panic!("count the payouts: {e}"))
}

/// Payouts of the run without exactly one debit and one credit leg of their amount, and payouts
/// acknowledged by the rail more than once.
async fn ledger_faults(db: &PgPool, run: &str) -> (i64, i64) {
    sqlx::query_as(
        "WITH batch AS (SELECT payout_id, amount_minor FROM payout WHERE idempotency_key LIKE $1)
         SELECT
           (SELECT count(*) FROM batch b WHERE
                (SELECT count(*) FROM ledger_entry l WHERE l.payout_id = b.payout_id AND l.direction = 'DEBIT'
                     AND l.amount_minor = b.amount_minor) <> 1
             OR (SELECT count(*) FROM ledger_entry l WHERE l.payout_id = b.payout_id AND l.direction = 'CREDIT'
                     AND l.amount_minor = b.amount_minor) <> 1
             OR (SELECT count(*) FROM ledger_entry l WHERE l.payout_id = b.payout_id) <> 2),
           (SELECT count(*) FROM (SELECT s.payout_id FROM rail_submission s JOIN batch USING (payout_id)
                                   WHERE s.outcome = 'ACKED' GROUP BY s.payout_id HAVING count(*) > 1) d)",
    )
    .bind(format!("{run}-%"))
    .fetch_one(db)
    .await
    .unwrap_or_else(|e| panic!("read the ledger: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grant_key_rotation_with_payouts_flowing_loses_nothing_and_refuses_the_retired_key() {
    let test = "grant_key_rotation_with_payouts_flowing_loses_nothing_and_refuses_the_retired_key";
    let Some(mut st) = stage(test).await else {
        return;
    };
    st.apply(&lockservice(LS, DatabaseSpec::managed(), 1)).await;
    let mut spec = stack_spec(LS);
    // Funded accounts for the payouts to draw on (the seed the demo and the kind tier use).
    spec.demo_data = true;
    st.apply(&paymentstack(PS, spec)).await;
    st.wait_ready::<LockService>(LS).await;
    st.wait_ready::<PaymentStack>(PS).await;
    rotated_to(&mut st, "k1", &["k1"], None).await;
    let paydb = st.kubelet.databases[&History::Paydb].admin_pool().await;

    let ns = st.ns.clone();
    let (http, token, payments) = dlock_e2e::payouts::stack_client(&st, PS).await;
    let run = "rot";
    let (stop, created) = (AtomicBool::new(false), AtomicU32::new(0));
    let create_url = format!("{payments}/v1/payouts");
    let creating = create_payouts(&http, &create_url, &token, run, &stop, &created);
    let rotating = async {
        st.wait("the first payouts posted under k1", true, async |_| {
            let (posted, _, _) = counts(&paydb, run).await;
            if posted >= 5 {
                Ok(())
            } else {
                Err(format!(
                    "{posted} posted, {} created",
                    created.load(Ordering::SeqCst)
                ))
            }
        })
        .await;

        // 1. Add a key: the resources roll to verify k1 and k2, then lock-server rolls to sign with k2.
        let old = dlock_e2e::payouts::secret_text(&st, &format!("{LS}-grant-signing-keys"), "k1")
            .await
            .expect("k1 in the signing Secret");
        let old = SigningKey::parse(&old).expect("k1 parses");
        let starts = |st: &Stage, name: &str| st.kubelet.served_starts(name);
        let before = [
            starts(&st, "locks-lock-server"),
            starts(&st, "shop-payment-resource"),
            starts(&st, "shop-rail-proxy"),
        ];
        request(&st, "rot-add", GrantKeyAction::Add, None).await;
        rotated_to(&mut st, "k2", &["k1", "k2"], Some("rot-add")).await;
        let after_add = [
            starts(&st, "locks-lock-server"),
            starts(&st, "shop-payment-resource"),
            starts(&st, "shop-rail-proxy"),
        ];
        assert!(
            after_add.iter().zip(before).all(|(a, b)| *a > b),
            "lock-server, payment-resource and rail-proxy each rolled for the new key: {before:?} -> {after_add:?}"
        );
        let mark = created.load(Ordering::SeqCst);
        st.wait(
            "payouts created after the switch posted under k2",
            true,
            async |_| {
                let (posted, _, _) = counts(&paydb, run).await;
                if posted > i64::from(mark) + 3 {
                    Ok(())
                } else {
                    Err(format!(
                        "{posted} posted, {} created",
                        created.load(Ordering::SeqCst)
                    ))
                }
            },
        )
        .await;

        // 2. Retire k1: the resources roll to verify k2 only; lock-server keeps signing with k2.
        request(&st, "rot-retire", GrantKeyAction::Retire, Some("k1")).await;
        rotated_to(&mut st, "k2", &["k2"], Some("rot-retire")).await;
        assert_eq!(
            dlock_e2e::payouts::secret_text(&st, &format!("{LS}-grant-signing-keys"), "k1").await,
            None,
            "the retired private key is gone from the Secret"
        );
        let mark = created.load(Ordering::SeqCst);
        st.wait("payouts created after the retirement posted", true, async |_| {
            let (posted, _, _) = counts(&paydb, run).await;
            if posted > i64::from(mark) + 3 {
                Ok(())
            } else {
                Err(format!(
                    "{posted} posted, {} created",
                    created.load(Ordering::SeqCst)
                ))
            }
        })
        .await;
        stop.store(true, Ordering::SeqCst);
        old
    };
    let ((), old) = tokio::join!(creating, rotating);
    let created = created.load(Ordering::SeqCst);

    // Every payout created across both rolls ends POSTED, paid once, booked once.
    st.wait(&format!("all {created} payouts posted"), true, async |_| {
        let (posted, ended, total) = counts(&paydb, run).await;
        assert_eq!(ended, 0, "payouts ended FAILED/ABANDONED during the rotation");
        if total == i64::from(created) && posted == total {
            Ok(())
        } else {
            Err(format!("{posted} posted of {total} ({created} created)"))
        }
    })
    .await;
    let (unbooked, acked_twice) = ledger_faults(&paydb, run).await;
    assert_eq!(
        unbooked, 0,
        "payouts without exactly one debit and one credit leg"
    );
    assert_eq!(acked_twice, 0, "payouts acknowledged by the rail twice");
    let received: Value = http
        .get(format!("http://{PS}-rail-stub.{ns}.svc:8080/v1/received"))
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .unwrap_or_else(|e| panic!("GET the rail-stub's /v1/received: {e}"))
        .json()
        .await
        .unwrap_or_else(|e| panic!("the rail-stub's /v1/received: {e}"));
    assert_eq!(
        received["paidTwice"].as_array().map_or(0, Vec::len),
        0,
        "the rail paid a payout twice: {received}"
    );
    let ids: Vec<String> =
        sqlx::query_scalar("SELECT payout_id::text FROM payout WHERE idempotency_key LIKE $1")
            .bind(format!("{run}-%"))
            .fetch_all(&paydb)
            .await
            .unwrap_or_else(|e| panic!("read the payout ids: {e}"));
    let unpaid: Vec<&String> = ids
        .iter()
        .filter(|id| received["perPayout"][id.as_str()]["paid"].as_i64() != Some(1))
        .collect();
    assert!(
        unpaid.is_empty(),
        "the rail did not pay these exactly once: {unpaid:?}"
    );

    // 3. The retired key is refused: a grant k1 signs for an account's highest token so far is
    //    GRANT_UNKNOWN_SIGNER at payment-resource, and the payout it names is untouched.
    let (payout, account, fence): (String, String, i64) = sqlx::query_as(
        "SELECT p.payout_id::text, p.account_id::text, a.fence FROM payout p JOIN account a USING (account_id)
          WHERE p.idempotency_key LIKE $1 ORDER BY p.created_at DESC LIMIT 1",
    )
    .bind(format!("{run}-%"))
    .fetch_one(&paydb)
    .await
    .unwrap_or_else(|e| panic!("read a payout: {e}"));
    let token = fence + 1_000;
    let forged = old
        .sign(&Claims {
            lock_service: &format!("{ns}/{LS}"),
            lock_key: &format!("account:{account}"),
            token,
            owner_id: "old-key-holder",
            session_id: uuid::Uuid::new_v4(),
        })
        .expect("k1 signs");
    let executor = dlock_e2e::payouts::secret_text(&st, &format!("{PS}-payment-credentials"), "executor")
        .await
        .expect("the stack's executor credential");
    let resp = http
        .post(format!("{payments}/v1/payouts/{payout}/claim"))
        .bearer_auth(&executor)
        .header("X-Fencing-Token", token.to_string())
        .header("X-Fencing-Grant", forged)
        .json(&json!({"ownerId": "old-key-holder"}))
        .send()
        .await
        .unwrap_or_else(|e| panic!("claim with the retired key's grant: {e}"));
    let status = resp.status().as_u16();
    let body: Value = resp.json().await.unwrap_or(Value::Null);
    assert_eq!(
        (status, body["code"].as_str()),
        (403, Some("GRANT_UNKNOWN_SIGNER")),
        "a grant by the retired key: {body}"
    );
    let (state, fence_after): (String, i64) = sqlx::query_as(
        "SELECT p.state::text, a.fence FROM payout p JOIN account a USING (account_id) WHERE p.payout_id = $1::uuid",
    )
    .bind(&payout)
    .fetch_one(&paydb)
    .await
    .unwrap_or_else(|e| panic!("read the payout back: {e}"));
    assert_eq!(
        (state.as_str(), fence_after),
        ("POSTED", fence),
        "the refused claim changed nothing"
    );
    st.op.assert_healthy();
}
