//! Shared set-up for the integration tests: a fresh migrated paydb per test (real PostgreSQL 16),
//! accounts with fresh ids, payouts driven to RAIL_ACKED through the library, and snapshots of
//! everything a write could touch.
#![allow(dead_code)] // each test binary uses a different subset

use std::sync::{Arc, LazyLock};

use dlock_common::FencingToken;
use dlock_common::grant::{GrantPolicy, account_key};
use dlock_grant::{Claims, KeyId, PublicKeys, SigningKey};
use dlock_testkit::TestDb;
use payment_resource::accounts::{Accounts, NewAccount};
use payment_resource::metrics::Metrics;
use payment_resource::model::{AccountKind, Payout, PayoutState};
use payment_resource::payouts::{NewPayout, Payouts};
use payment_resource::posting::Posting;
use payment_resource::sql::Statements;
use sqlx::PgPool;
use uuid::Uuid;

/// The seeded EUR settlement account (R__seed_synthetic_accounts.sql).
pub const EUR_SETTLEMENT: Uuid = Uuid::from_u128(0x0000_0000_0000_4000_8000_0000_0000_0901);

/// The test servers' credentials, one per role.
pub const ADMIN_TOKEN: &str = "test-admin-credential-0001";
pub const EXECUTOR_TOKEN: &str = "test-executor-credential-0002";
pub const CLIENT_TOKEN: &str = "test-client-credential-0003";

pub fn credentials() -> dlock_common::auth::Credentials {
    use dlock_common::auth::{Credential, Credentials, Role};
    let c = |v: &str| Credential::new("test", v).expect("test credential");
    Credentials::new()
        .with(Role::Admin, c(ADMIN_TOKEN))
        .with(Role::Executor, c(EXECUTOR_TOKEN))
        .with(Role::Client, c(CLIENT_TOKEN))
}

/// The credential a test client presents for `method path`: the one the route admits, so that
/// tests exercise the route itself (the auth tests send the others on purpose).
pub fn token_for(method: &str, path: &str) -> Option<&'static str> {
    use dlock_common::auth::Role;
    let path = path.split('?').next().unwrap_or(path);
    let segments: Vec<&str> = path.split('/').collect();
    payment_resource::api::PROTECTED
        .iter()
        .find(|(m, template, _)| {
            let t: Vec<&str> = template.split('/').collect();
            *m == method
                && t.len() == segments.len()
                && t.iter()
                    .zip(&segments)
                    .all(|(a, b)| a == b || (a.starts_with('{') && a.ends_with('}')))
        })
        .map(|(_, _, roles)| match roles.first() {
            Some(Role::Admin) => ADMIN_TOKEN,
            Some(Role::Executor) => EXECUTOR_TOKEN,
            _ => CLIENT_TOKEN,
        })
}

/// The test servers trust this key: what lock-server would sign with (a fresh one per test binary).
pub static GRANT_KEY: LazyLock<SigningKey> =
    LazyLock::new(|| SigningKey::generate(KeyId::new("test-k1").expect("key id")));

/// Grant verification with [`GRANT_KEY`], as a deployment's default.
pub fn grants() -> GrantPolicy {
    let keys = PublicKeys::new(vec![GRANT_KEY.public_key()]).expect("one key");
    GrantPolicy::new(true, keys, "TEST_GRANT_VERIFICATION_ENABLED").expect("keys given")
}

/// The grant lock-server would sign for `token` on `lock_key`, signed by `key`.
pub fn grant_by(key: &SigningKey, lock_key: &str, token: i64) -> String {
    key.sign(&Claims {
        lock_service: "tests",
        lock_key,
        token,
        owner_id: "test-holder",
        session_id: Uuid::nil(),
    })
    .expect("sign")
}

/// The grant of `token` on `account:<account>`, by [`GRANT_KEY`].
pub fn grant(account: Uuid, token: i64) -> String {
    grant_by(&GRANT_KEY, &account_key(account), token)
}

pub struct Fixture {
    pub db: TestDb,
    /// As payapp, like the service.
    pub pool: PgPool,
    /// As postgres, for inspection and for competing writes.
    pub admin: PgPool,
    pub metrics: Arc<Metrics>,
    pub accounts: Accounts,
    pub payouts: Payouts,
}

pub async fn fixture() -> Fixture {
    let db = dlock_testkit::paydb().await;
    let pool = db.app_pool().await;
    let admin = db.admin_pool().await;
    let (metrics, _registry) = Metrics::new();
    let metrics = Arc::new(metrics);
    Fixture {
        accounts: Accounts::new(pool.clone()),
        payouts: Payouts::new(pool.clone(), metrics.clone()),
        db,
        pool,
        admin,
        metrics,
    }
}

pub fn tok(t: i64) -> FencingToken {
    FencingToken::new(t).expect("test tokens are > 0")
}

impl Fixture {
    pub fn posting(&self, statements: Statements) -> Posting {
        Posting::new(self.pool.clone(), statements, self.metrics.clone())
    }

    /// A fresh EUR customer account.
    pub async fn customer(&self, opening: i64) -> Uuid {
        self.accounts
            .create(NewAccount {
                account_id: None,
                currency: "EUR".into(),
                opening_balance_minor: opening,
                kind: AccountKind::Customer,
            })
            .await
            .expect("create account")
            .account_id
    }

    pub async fn pending(&self, account: Uuid, amount: i64) -> Payout {
        self.payouts
            .create(NewPayout {
                account_id: account,
                amount_minor: amount,
                currency: "EUR".into(),
                idempotency_key: format!("key-{}", Uuid::new_v4()),
            })
            .await
            .expect("create payout")
            .0
    }

    /// Records what rail-proxy would after the rail acknowledged the payout: its one ACKED attempt
    /// (reconciliation compares POSTED payouts with the rail's acknowledgements).
    pub async fn rail_acked(&self, payout: &Payout, token: i64) {
        sqlx::query(
            "INSERT INTO rail_submission (submission_id, payout_id, idempotency_key, presented_token,
                                          outcome, rail_reference, resolved_at)
             VALUES ($1, $2, $3, $4, 'ACKED', $5, now())",
        )
        .bind(Uuid::new_v4())
        .bind(payout.payout_id)
        .bind(&payout.idempotency_key)
        .bind(token)
        .bind(format!("rail-{}", payout.payout_id.simple()))
        .execute(&self.admin)
        .await
        .expect("record the rail's acknowledgement");
    }

    /// A payout in RAIL_ACKED that holds **no** reservation, as a payout in flight before V4 could:
    /// the only way left for statement (a) to meet an account that cannot cover a payout, which is
    /// what its funds-rejection branch is for. Written directly (as postgres); the rail's answer is
    /// not recorded.
    pub async fn acked_unreserved(&self, account: Uuid, amount: i64, token: i64) -> Payout {
        let p = self.pending(account, amount).await;
        sqlx::query(
            "UPDATE payout SET state = 'RAIL_ACKED', claimed_by = $2, claim_token = $3, attempt_count = 1
              WHERE payout_id = $1",
        )
        .bind(p.payout_id)
        .bind(format!("worker-{token}"))
        .bind(token)
        .execute(&self.admin)
        .await
        .expect("unreserved RAIL_ACKED payout");
        // No rail acknowledgement is recorded: were one, a funds rejection at (a) would leave money
        // paid that the ledger does not record, and reconciliation reports exactly that
        // (RAIL_PAID_NOT_POSTED, see tests/funds.rs).
        self.payouts.get(p.payout_id).await.expect("read back")
    }

    /// A payout claimed with `token` and walked to RAIL_ACKED, as the executor would (entering
    /// RAIL_SUBMITTED reserves its amount), with the rail's acknowledgement recorded.
    pub async fn acked(&self, account: Uuid, amount: i64, token: i64) -> Payout {
        let p = self.pending(account, amount).await;
        self.payouts
            .claim(p.payout_id, &format!("worker-{token}"), tok(token))
            .await
            .expect("claim");
        self.payouts
            .transition(
                p.payout_id,
                PayoutState::Claimed,
                PayoutState::RailSubmitted,
                tok(token),
            )
            .await
            .expect("submit");
        self.payouts
            .transition(
                p.payout_id,
                PayoutState::RailSubmitted,
                PayoutState::RailAcked,
                tok(token),
            )
            .await
            .expect("ack");
        self.rail_acked(&p, token).await;
        self.payouts.get(p.payout_id).await.expect("read back")
    }

    pub async fn account(&self, id: Uuid) -> AccountRow {
        sqlx::query_as::<_, AccountRow>(
            "SELECT balance_minor, fence, opening_balance_minor FROM account WHERE account_id = $1",
        )
        .bind(id)
        .fetch_one(&self.admin)
        .await
        .expect("account row")
    }

    pub async fn payout_state(&self, id: Uuid) -> String {
        sqlx::query_scalar::<_, String>("SELECT state FROM payout WHERE payout_id = $1")
            .bind(id)
            .fetch_one(&self.admin)
            .await
            .expect("payout row")
    }

    pub async fn legs(&self, payout: Uuid) -> Vec<LegRow> {
        sqlx::query_as::<_, LegRow>(
            "SELECT account_id, direction, amount_minor, fence FROM ledger_entry
              WHERE payout_id = $1 ORDER BY direction DESC",
        )
        .bind(payout)
        .fetch_all(&self.admin)
        .await
        .expect("legs")
    }

    pub async fn ledger_rows(&self) -> i64 {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM ledger_entry")
            .fetch_one(&self.admin)
            .await
            .expect("count")
    }

    /// Everything a write could have changed, in one comparable value.
    pub async fn snapshot(&self) -> Snapshot {
        sqlx::query_as::<_, Snapshot>(
            "SELECT (SELECT count(*) FROM account) AS accounts,
                    (SELECT count(*) FROM payout) AS payouts,
                    (SELECT count(*) FROM ledger_entry) AS ledger_entries,
                    (SELECT count(*) FROM rail_submission) AS rail_submissions,
                    (SELECT COALESCE(string_agg(account_id::text || ':' || balance_minor || ':' || fence
                                                || ':' || opening_balance_minor || ':' || kind, ','
                                                ORDER BY account_id), '') FROM account) AS account_rows,
                    (SELECT COALESCE(string_agg(payout_id::text || ':' || state || ':'
                                                || COALESCE(claim_token::text, '-') || ':'
                                                || COALESCE(claimed_by, '-') || ':' || attempt_count
                                                || ':' || amount_minor, ',' ORDER BY payout_id), '')
                       FROM payout) AS payout_rows",
        )
        .fetch_one(&self.admin)
        .await
        .expect("snapshot")
    }
}

#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct AccountRow {
    pub balance_minor: i64,
    pub fence: i64,
    pub opening_balance_minor: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct LegRow {
    pub account_id: Uuid,
    pub direction: String,
    pub amount_minor: i64,
    pub fence: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Snapshot {
    pub accounts: i64,
    pub payouts: i64,
    pub ledger_entries: i64,
    pub rail_submissions: i64,
    pub account_rows: String,
    pub payout_rows: String,
}
