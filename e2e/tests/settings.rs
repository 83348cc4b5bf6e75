//! A LockService's settings reach the binaries that act on them, end to end: the operator binary (the
//! chart's args and RBAC) deploys a LockService whose `spec.lease` is 4 s leases and 12 s sessions
//! (neither is payout-executor's own default, 5 s and 15 s) and a PaymentStack on it; every
//! Deployment runs as a local process standing in for its pod, with the pod's own command, args and
//! env; payouts flow; and every grant and session the executors take at lock-server carries the
//! spec's TTL, as lockdb records it.

use dlock_e2e::specs::{lockservice, paymentstack, stack_spec};
use dlock_e2e::stage::{Options, Stage};
use dlock_operator::crd::{DatabaseSpec, LeaseSpec, LockService, PaymentStack};
use dlock_testkit::History;
use sqlx::PgPool;

const LS: &str = "locks";
const PS: &str = "shop";
const LEASE_MS: i64 = 4_000;
const SESSION_MS: i64 = 12_000;
/// Payouts the executors pay under the spec's lease.
const PAYOUTS: u32 = 6;

/// Every Deployment of the LockService and the PaymentStack, with the database its URLs map to.
const SERVED: [(&str, History); 5] = [
    ("locks-lock-server", History::Lockdb),
    ("shop-payment-resource", History::Paydb),
    ("shop-rail-proxy", History::Paydb),
    ("shop-rail-stub", History::Paydb),
    ("shop-payout-executor", History::Paydb),
];

/// Records, for every grant and session lock-server writes to lockdb, the TTL it was written with:
/// lock-server computes every end as `now() + make_interval(secs => ttl)` (its sql.rs, the database
/// clock only), so within the writing transaction `expires_at - now()` is exactly the TTL the client
/// asked for. Row-level, so the upsert of an acquire counts whichever way it goes. SECURITY DEFINER:
/// lock-server writes as lockapp, which has no rights on the record.
const OBSERVE: [&str; 4] = [
    "CREATE TABLE ttl_seen (tbl TEXT NOT NULL, owner_id TEXT NOT NULL, ttl_ms BIGINT NOT NULL)",
    "CREATE FUNCTION ttl_seen() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER AS $$
     BEGIN
         INSERT INTO ttl_seen VALUES (TG_TABLE_NAME, NEW.owner_id,
             round(extract(epoch FROM NEW.expires_at - now()) * 1000)::bigint);
         RETURN NULL;
     END $$",
    "CREATE TRIGGER ttl_seen AFTER INSERT OR UPDATE ON lock_entry FOR EACH ROW EXECUTE FUNCTION ttl_seen()",
    "CREATE TRIGGER ttl_seen AFTER INSERT OR UPDATE ON lock_session FOR EACH ROW EXECUTE FUNCTION ttl_seen()",
];

/// `(writes, distinct TTLs in ms)` recorded for `table`.
async fn seen(lockdb: &PgPool, table: &str) -> (i64, Vec<i64>) {
    let (writes,): (i64,) = sqlx::query_as("SELECT count(*) FROM ttl_seen WHERE tbl = $1")
        .bind(table)
        .fetch_one(lockdb)
        .await
        .unwrap_or_else(|e| panic!("count the {table} writes: {e}"));
    let ttls: Vec<(i64,)> = sqlx::query_as("SELECT DISTINCT ttl_ms FROM ttl_seen WHERE tbl = $1 ORDER BY 1")
        .bind(table)
        .fetch_all(lockdb)
        .await
        .unwrap_or_else(|e| panic!("read the {table} TTLs: {e}"));
    (writes, ttls.into_iter().map(|(t,)| t).collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lockservices_lease_governs_the_executors_grants_and_sessions_at_lock_server() {
    let test = "the_lockservices_lease_governs_the_executors_grants_and_sessions_at_lock_server";
    let options = Options {
        proxy: true,
        env: Vec::new(),
    };
    let Some(mut st) = Stage::start(test, "set", &[History::Lockdb, History::Paydb], options).await else {
        return;
    };
    let ns = st.ns.clone();
    for (name, history) in SERVED {
        st.kubelet
            .serve_deployment(name, &format!("{name}.{ns}.svc:8080"), history);
    }

    let mut ls = lockservice(LS, DatabaseSpec::managed(), 1);
    ls.spec.lease = LeaseSpec {
        default_ttl_ms: LEASE_MS,
        session_ttl_ms: SESSION_MS,
    };
    st.apply(&ls).await;
    let mut spec = stack_spec(LS);
    // Funded accounts for the payouts to draw on.
    spec.demo_data = true;
    st.apply(&paymentstack(PS, spec)).await;
    st.wait_ready::<LockService>(LS).await;
    st.wait_ready::<PaymentStack>(PS).await;

    // From here on every write of a grant or a session is recorded (the executors' session opened
    // before this is seen at its next heartbeat).
    let lockdb = st.lockdb().admin_pool().await;
    for statement in OBSERVE {
        sqlx::query(statement)
            .execute(&lockdb)
            .await
            .unwrap_or_else(|e| panic!("{statement}: {e}"));
    }

    let (http, token, payments) = dlock_e2e::payouts::stack_client(&st, PS).await;
    let url = format!("{payments}/v1/payouts");
    let run = "lease";
    for i in 1..=PAYOUTS {
        dlock_e2e::payouts::create_payout(&http, &url, &token, run, i).await;
    }
    let paydb = st.kubelet.databases[&History::Paydb].admin_pool().await;
    st.wait(&format!("the {PAYOUTS} payouts posted"), true, async |_| {
        let (posted,): (i64,) =
            sqlx::query_as("SELECT count(*) FROM payout WHERE idempotency_key LIKE $1 AND state = 'POSTED'")
                .bind(format!("{run}-%"))
                .fetch_one(&paydb)
                .await
                .map_err(|e| e.to_string())?;
        if posted == i64::from(PAYOUTS) {
            Ok(())
        } else {
            Err(format!("{posted} of {PAYOUTS} posted"))
        }
    })
    .await;
    // Heartbeats come every third of the session TTL: wait for one, not for a time.
    st.wait("a heartbeat of the executors' session", true, async |_| {
        let (writes, _) = seen(&lockdb, "lock_session").await;
        if writes > 0 {
            Ok(())
        } else {
            Err("no session write yet".to_owned())
        }
    })
    .await;

    // Each payout took its account's lock at least once; every grant and every renewal asked for
    // the spec's lease, every session write for the spec's session TTL (the executor's defaults,
    // 5000 and 15000, would show here if the spec did not reach it).
    let (grants, lease_ttls) = seen(&lockdb, "lock_entry").await;
    assert!(
        grants >= i64::from(PAYOUTS),
        "{grants} grant writes for {PAYOUTS} payouts"
    );
    assert_eq!(lease_ttls, [LEASE_MS], "the TTLs of the executors' grants");
    let (_, session_ttls) = seen(&lockdb, "lock_session").await;
    assert_eq!(session_ttls, [SESSION_MS], "the TTLs of the executors' sessions");
    // Every session and grant is the executors' stack's lock client's: owner ids under `shop/`
    // (the pod's name expanded into PAYOUT_EXECUTOR_OWNER_ID), which lock-server admitted with the
    // stack's token from its clients file.
    let owners: Vec<(String,)> = sqlx::query_as("SELECT DISTINCT owner_id FROM ttl_seen ORDER BY 1")
        .fetch_all(&lockdb)
        .await
        .unwrap_or_else(|e| panic!("read the owners: {e}"));
    assert!(!owners.is_empty());
    for (owner,) in &owners {
        assert!(
            owner.starts_with("shop/shop-payout-executor-") && !owner.contains("$("),
            "{owner}"
        );
    }
}
