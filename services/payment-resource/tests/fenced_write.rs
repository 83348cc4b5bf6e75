//! T-021 FencedWriteIT: the fenced write path (a) → (b) DEBIT → (b) CREDIT → (c) against real
//! PostgreSQL 16, one test per contract case, plus the mandatory negative controls: the same scenario
//! run with a deliberately broken statement (defined here, in test code only) must violate the
//! invariant the positive test asserts.

mod common;

use std::sync::{Arc, Mutex};

use common::{EUR_SETTLEMENT, Fixture, fixture, tok};
use dlock_common::fencing::FencedOutDetails;
use dlock_common::metrics::Resource;
use futures::future::BoxFuture;
use payment_resource::PaymentError;
use payment_resource::config::Fencing;
use payment_resource::model::PayoutState;
use payment_resource::posting::{PostingHook, Stage};
use payment_resource::reconcile::{self, AccountBreakKind};
use payment_resource::sql::Statements;
use sqlx::{Connection, PgConnection};
use uuid::Uuid;

/// `return Err(..)` unless the condition holds: scenarios report a violated invariant as a value, so
/// a negative control can assert that the broken variant violates it.
macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(format!($($msg)+));
        }
    };
}

// Broken statements for the negative controls. Test code only; production runs Statements::FENCED.

/// (a) with `<=`: "looks safer", silently readmits the previous holder's token.
const BROKEN_A_LE: &str = "
UPDATE account
   SET balance_minor = balance_minor - $3,
       fence         = $4,
       updated_at    = now()
 WHERE account_id    = $1
   AND currency      = $2
   AND fence         <= $4
   AND balance_minor >= $3
RETURNING balance_minor, fence";

/// (b) with `<`: rejects every legitimate posting, because (a) has just stamped our own token.
const BROKEN_B_LT: &str = "
INSERT INTO ledger_entry (entry_id, payout_id, account_id, direction, amount_minor, fence)
SELECT $1, $2, $3, $4, $5, $6
  FROM account a
 WHERE a.account_id = $7
   AND a.fence      < $6
RETURNING entry_id";

fn fenced_out(r: &Result<payment_resource::posting::Posted, PaymentError>) -> Option<&FencedOutDetails> {
    match r {
        Err(PaymentError::FencedOut(d)) => Some(d),
        _ => None,
    }
}

// ---------------------------------------------------------------------------------------------
// 1. happy path

async fn happy_path(statements: Statements) -> Result<(), String> {
    let f = fixture().await;
    let acct = f.customer(10_000).await;
    let p = f.acked(acct, 2_500, 7).await;

    let posted = f
        .posting(statements)
        .post(p.payout_id, tok(7))
        .await
        .map_err(|e| format!("posting failed: {e}"))?;
    ensure!(
        posted.balance_minor == 7_500 && posted.fence == 7 && !posted.idempotent,
        "unexpected result {posted:?}"
    );
    ensure!(
        posted.payout.state == PayoutState::Posted,
        "payout not POSTED: {posted:?}"
    );

    let legs = f.legs(p.payout_id).await;
    ensure!(legs.len() == 2, "expected two legs, got {legs:?}");
    let (debit, credit) = (&legs[0], &legs[1]);
    ensure!(
        debit.direction == "DEBIT"
            && debit.account_id == acct
            && debit.amount_minor == 2_500
            && debit.fence == 7,
        "bad DEBIT leg {debit:?}"
    );
    ensure!(
        credit.direction == "CREDIT"
            && credit.account_id == EUR_SETTLEMENT
            && credit.amount_minor == 2_500
            && credit.fence == 7,
        "bad CREDIT leg {credit:?}"
    );

    // balance = opening − Σ DEBIT + Σ CREDIT, recomputed from the ledger.
    let row = f.account(acct).await;
    let view = f.accounts.get(acct).await.map_err(|e| e.to_string())?;
    ensure!(
        row.balance_minor == row.opening_balance_minor - view.ledger_debit_minor + view.ledger_credit_minor,
        "balance {} != Σ entries ({view:?})",
        row.balance_minor
    );
    ensure!(view.consistent && row.fence == 7, "account view {view:?}");
    let settlement = f.accounts.get(EUR_SETTLEMENT).await.map_err(|e| e.to_string())?;
    ensure!(settlement.consistent, "settlement inconsistent: {settlement:?}");
    let report = reconcile::run(&f.pool).await.map_err(|e| e.to_string())?;
    ensure!(report.clean, "reconciliation not clean: {report:?}");
    ensure!(
        f.metrics.fenced_out_count(Resource::account) + f.metrics.fenced_out_count(Resource::ledger) == 0,
        "a legitimate posting counted as fenced out"
    );
    Ok(())
}

#[tokio::test]
async fn happy_path_posts_two_balanced_legs_and_balance_equals_sum_of_entries() {
    happy_path(Statements::FENCED).await.unwrap();
}

#[tokio::test]
async fn negative_control_lt_in_b_rejects_every_legitimate_posting() {
    let broken = Statements {
        ledger_leg: BROKEN_B_LT,
        ..Statements::FENCED
    };
    let violation = happy_path(broken)
        .await
        .expect_err("the happy-path test must fail when (b) uses `<`");
    assert!(
        violation.contains("posting failed: fenced out at ledger"),
        "{violation}"
    );
}

// ---------------------------------------------------------------------------------------------
// 2. a lower token is fenced out at (a) and mutates nothing

#[tokio::test]
async fn lower_token_is_fenced_out_at_a_and_mutates_nothing() {
    let f = fixture().await;
    let acct = f.customer(10_000).await;
    let stale = f.acked(acct, 700, 15).await;
    let newer = f.acked(acct, 1_200, 20).await;
    f.posting(Statements::FENCED)
        .post(newer.payout_id, tok(20))
        .await
        .unwrap();

    let before = f.snapshot().await;
    let r = f.posting(Statements::FENCED).post(stale.payout_id, tok(15)).await;
    assert_eq!(
        fenced_out(&r),
        Some(&FencedOutDetails {
            presented: 15,
            highest: 20,
            resource_type: "account".into(),
            resource_id: acct.to_string(),
            owner_id: "worker-15".into(),
        }),
        "{r:?}"
    );
    assert_eq!(
        f.snapshot().await,
        before,
        "a fenced-out posting changed something"
    );
    assert_eq!(f.payout_state(stale.payout_id).await, "RAIL_ACKED");
    assert!(f.legs(stale.payout_id).await.is_empty());
    assert_eq!(f.metrics.fenced_out_count(Resource::account), 1);
}

// ---------------------------------------------------------------------------------------------
// 3. an equal token is fenced out at (a)

async fn equal_token(statements: Statements) -> Result<(), String> {
    let f = fixture().await;
    let acct = f.customer(10_000).await;
    // One grant (token 10) posts a payout, so the account's fence is 10 ...
    let first = f.acked(acct, 1_000, 10).await;
    f.posting(Statements::FENCED)
        .post(first.payout_id, tok(10))
        .await
        .map_err(|e| format!("setup posting failed: {e}"))?;
    // ... and the same token then presents a second payout: equality must lose.
    let second = f.acked(acct, 2_000, 10).await;
    let before = f.snapshot().await;
    let r = f.posting(statements).post(second.payout_id, tok(10)).await;
    let expected = FencedOutDetails {
        presented: 10,
        highest: 10,
        resource_type: "account".into(),
        resource_id: acct.to_string(),
        owner_id: "worker-10".into(),
    };
    ensure!(
        fenced_out(&r) == Some(&expected),
        "equal token was not fenced out at (a): {r:?}"
    );
    ensure!(
        f.snapshot().await == before,
        "equal-token posting changed the database"
    );
    ensure!(
        f.metrics.fenced_out_count(Resource::account) == 1,
        "fenced-out counter not incremented"
    );
    Ok(())
}

#[tokio::test]
async fn equal_token_is_fenced_out_at_a() {
    equal_token(Statements::FENCED).await.unwrap();
}

#[tokio::test]
async fn negative_control_le_in_a_readmits_the_equal_token() {
    let broken = Statements {
        account_debit: BROKEN_A_LE,
        ..Statements::FENCED
    };
    let violation = equal_token(broken)
        .await
        .expect_err("the equal-token test must fail when (a) uses `<=`");
    // The same grant debited the account a second time.
    assert!(
        violation.contains("equal token was not fenced out at (a): Ok("),
        "{violation}"
    );
}

// ---------------------------------------------------------------------------------------------
// 4. insufficient funds with a winning token: a funds rejection, not fenced

#[tokio::test]
async fn insufficient_funds_with_a_winning_token_is_a_funds_rejection_not_fenced_out() {
    let f = fixture().await;
    let acct = f.customer(1_000).await;
    let p = f.acked_unreserved(acct, 5_000, 3).await;
    let before = f.account(acct).await;

    let r = f.posting(Statements::FENCED).post(p.payout_id, tok(3)).await;
    match &r {
        Err(PaymentError::InsufficientFunds {
            balance_minor,
            amount_minor,
            payout_state,
            ..
        }) => {
            assert_eq!((*balance_minor, *amount_minor), (1_000, 5_000));
            assert_eq!(*payout_state, PayoutState::Failed);
        }
        other => panic!("expected a funds rejection, got {other:?}"),
    }
    assert_eq!(f.payout_state(p.payout_id).await, "FAILED");
    assert_eq!(f.account(acct).await, before, "balance or fence moved");
    assert_eq!(f.ledger_rows().await, 0);
    for resource in [Resource::account, Resource::ledger, Resource::payout] {
        assert_eq!(
            f.metrics.fenced_out_count(resource),
            0,
            "a funds rejection must not count as fenced out"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// 5. a fence advanced between (a) and (b) rolls back with zero ledger rows persisted

/// Moves the account's fence past the posting's token at one [`Stage`] of the posting transaction.
///
/// Why not simply from another connection: (a) row-locks the account until the transaction ends, so a
/// concurrent `UPDATE account SET fence = …` cannot commit between (a) and (b) — it waits. That lock is
/// exactly why (a)(b)(c) share one transaction, and the hook proves it first: another (admin)
/// connection tries the UPDATE with a short `lock_timeout` and must fail with `lock_not_available`.
/// The fence can then only move past our token, before (b) reads it, through the transaction's own
/// connection — the stand-in for a competing grant's write becoming visible to (b) (what (b)'s
/// `a.fence <= :token` exists to catch if the lock were ever lost). It is executed there, so (b) runs
/// against a fence above its token for real.
struct AdvanceFence {
    stage: Stage,
    admin_url: String,
    account: Uuid,
    to: i64,
    /// The competing connection's outcome: the SQLSTATE it failed with.
    competitor: Mutex<Option<String>>,
}

impl PostingHook for AdvanceFence {
    fn at<'a>(&'a self, stage: Stage, tx: &'a mut PgConnection) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            if stage != self.stage {
                return;
            }
            let mut other = PgConnection::connect(&self.admin_url).await.unwrap();
            sqlx::query("SET lock_timeout = '200ms'")
                .execute(&mut other)
                .await
                .unwrap();
            let outcome = sqlx::query("UPDATE account SET fence = $1 WHERE account_id = $2")
                .bind(self.to)
                .bind(self.account)
                .execute(&mut other)
                .await;
            let code = match outcome {
                Ok(_) => "committed".to_owned(),
                Err(e) => e
                    .as_database_error()
                    .and_then(|d| d.code())
                    .map_or_else(|| e.to_string(), |c| c.into_owned()),
            };
            *self.competitor.lock().unwrap() = Some(code);
            sqlx::query("UPDATE account SET fence = $1 WHERE account_id = $2")
                .bind(self.to)
                .bind(self.account)
                .execute(&mut *tx)
                .await
                .unwrap();
        })
    }
}

async fn fence_moves_mid_posting(statements: Statements, stage: Stage) -> Result<(), String> {
    let f = fixture().await;
    let acct = f.customer(10_000).await;
    let p = f.acked(acct, 2_500, 7).await;
    let before = f.snapshot().await;
    let hook = Arc::new(AdvanceFence {
        stage,
        admin_url: f.db.admin_url(),
        account: acct,
        to: 8,
        competitor: Mutex::new(None),
    });
    let r = f
        .posting(statements)
        .with_hook(hook.clone())
        .post(p.payout_id, tok(7))
        .await;

    let competitor = hook.competitor.lock().unwrap().clone();
    ensure!(
        competitor.as_deref() == Some("55P03"),
        "another connection was not blocked by (a)'s row lock: {competitor:?}"
    );
    let expected = FencedOutDetails {
        presented: 7,
        highest: 8,
        resource_type: "ledger".into(),
        resource_id: acct.to_string(),
        owner_id: "worker-7".into(),
    };
    ensure!(
        fenced_out(&r) == Some(&expected),
        "expected FencedOut at ledger, got {r:?}"
    );
    ensure!(f.ledger_rows().await == 0, "ledger rows were persisted");
    ensure!(
        f.snapshot().await == before,
        "the rolled-back posting left changes behind"
    );
    ensure!(
        f.metrics.fenced_out_count(Resource::ledger) == 1,
        "lock_fenced_out{{resource=ledger}} not counted"
    );
    Ok(())
}

#[tokio::test]
async fn fence_advanced_between_a_and_b_rolls_back_with_zero_ledger_rows() {
    fence_moves_mid_posting(Statements::FENCED, Stage::BetweenAAndB)
        .await
        .unwrap();
}

#[tokio::test]
async fn fence_advanced_between_the_two_legs_never_commits_a_partial_leg_set() {
    fence_moves_mid_posting(Statements::FENCED, Stage::BetweenLegs)
        .await
        .unwrap();
}

#[tokio::test]
async fn negative_control_b_without_its_fence_commits_legs_after_the_fence_moved() {
    let broken = Statements {
        ledger_leg: Statements::UNFENCED.ledger_leg,
        ..Statements::FENCED
    };
    let violation = fence_moves_mid_posting(broken, Stage::BetweenAAndB)
        .await
        .expect_err("the race test must fail when (b) has no fence predicate");
    assert!(
        violation.contains("expected FencedOut at ledger, got Ok("),
        "{violation}"
    );
}

// ---------------------------------------------------------------------------------------------
// 6. (c) against an already-POSTED payout succeeds without a third ledger row

#[tokio::test]
async fn c_against_an_already_posted_payout_succeeds_without_a_third_ledger_row() {
    let f = fixture().await;
    let acct = f.customer(10_000).await;
    let p = f.acked(acct, 2_500, 7).await;
    let posting = f.posting(Statements::FENCED);
    let first = posting.post(p.payout_id, tok(7)).await.unwrap();
    assert!(!first.idempotent);
    let after_first = f.snapshot().await;

    // The same grant retrying (a lost response), a newer holder finishing, a stale one: all succeed
    // idempotently, and nothing is posted again.
    for t in [7, 9, 3] {
        let again = posting.post(p.payout_id, tok(t)).await.unwrap();
        assert!(again.idempotent, "token {t}: {again:?}");
        assert_eq!(again.payout.state, PayoutState::Posted);
        assert_eq!((again.balance_minor, again.fence), (7_500, 7));
    }
    assert_eq!(f.legs(p.payout_id).await.len(), 2);
    assert_eq!(f.ledger_rows().await, 2, "a third ledger row was written");
    assert_eq!(f.snapshot().await, after_first);
    assert_eq!(f.metrics.fenced_out_count(Resource::account), 0);
}

#[tokio::test]
async fn c_refuses_a_claim_superseded_by_a_newer_holder_and_rolls_back_a_and_b() {
    let f = fixture().await;
    let acct = f.customer(10_000).await;
    let p = f.acked(acct, 2_500, 5).await;
    // A newer holder adopts the in-flight payout; the account's fence has not moved yet, so the
    // stale holder passes (a) and (b) — and (c)'s claim_token <= :token must stop it.
    let adopted = f.payouts.claim(p.payout_id, "worker-8", tok(8)).await.unwrap();
    assert!(adopted.adopted);
    let before = f.snapshot().await;

    let r = f.posting(Statements::FENCED).post(p.payout_id, tok(5)).await;
    assert_eq!(
        fenced_out(&r),
        Some(&FencedOutDetails {
            presented: 5,
            highest: 8,
            resource_type: "payout".into(),
            resource_id: p.payout_id.to_string(),
            owner_id: "worker-8".into(),
        }),
        "{r:?}"
    );
    assert_eq!(f.snapshot().await, before, "(a) or (b) survived a refused (c)");
    assert_eq!(f.metrics.fenced_out_count(Resource::payout), 1);

    let done = f
        .posting(Statements::FENCED)
        .post(p.payout_id, tok(8))
        .await
        .unwrap();
    assert_eq!((done.balance_minor, done.fence), (7_500, 8));
}

// ---------------------------------------------------------------------------------------------
// 7. the counter increments exactly once per fenced-out call

#[tokio::test]
async fn fenced_out_counter_increments_exactly_once_per_fenced_out_call() {
    let f = fixture().await;
    let acct = f.customer(100_000).await;
    let a = f.acked(acct, 100, 4).await;
    let b = f.acked(acct, 100, 6).await;
    let c = f.acked(acct, 100, 6).await;
    let posting = f.posting(Statements::FENCED);
    posting.post(b.payout_id, tok(6)).await.unwrap();
    assert_eq!(
        f.metrics.fenced_out_count(Resource::account),
        0,
        "success counted"
    );

    assert!(fenced_out(&posting.post(a.payout_id, tok(4)).await).is_some());
    assert_eq!(f.metrics.fenced_out_count(Resource::account), 1);
    assert!(fenced_out(&posting.post(c.payout_id, tok(6)).await).is_some());
    assert_eq!(f.metrics.fenced_out_count(Resource::account), 2);
    assert!(fenced_out(&posting.post(a.payout_id, tok(4)).await).is_some());
    assert_eq!(f.metrics.fenced_out_count(Resource::account), 3);

    // Neither a funds rejection nor an idempotent repeat counts.
    let poor = f.customer(10).await;
    let unfunded = f.acked_unreserved(poor, 500, 2).await;
    assert!(matches!(
        posting.post(unfunded.payout_id, tok(2)).await,
        Err(PaymentError::InsufficientFunds { .. })
    ));
    assert!(posting.post(b.payout_id, tok(6)).await.unwrap().idempotent);
    assert_eq!(f.metrics.fenced_out_count(Resource::account), 3);
    assert_eq!(f.metrics.fenced_out_count(Resource::ledger), 0);
    assert_eq!(f.metrics.fenced_out_count(Resource::payout), 0);
}

// ---------------------------------------------------------------------------------------------
// 8. kill switch off: the stale token succeeds and the balance corrupts by exactly one payout

struct StaleRun {
    fixture: Fixture,
    account: Uuid,
    stale_payout: Uuid,
    stale_amount: i64,
    stale_result: Result<payment_resource::posting::Posted, PaymentError>,
}

/// Holder t1 claims P1 and is paused; holder t2 > t1 (the lock's next grant) posts P2; t1 returns
/// and posts P1.
async fn stale_holder_returns(fencing: Fencing) -> StaleRun {
    let f = fixture().await;
    let acct = f.customer(10_000).await;
    let p1 = f.acked(acct, 700, 5).await;
    let p2 = f.acked(acct, 1_200, 9).await;
    let posting = f.posting(Statements::for_fencing(fencing));
    posting.post(p2.payout_id, tok(9)).await.unwrap();
    let stale_result = posting.post(p1.payout_id, tok(5)).await;
    StaleRun {
        fixture: f,
        account: acct,
        stale_payout: p1.payout_id,
        stale_amount: p1.amount_minor,
        stale_result,
    }
}

#[tokio::test]
async fn kill_switch_off_stale_token_succeeds_and_balance_corrupts_by_exactly_one_payout() {
    let fenced = stale_holder_returns(Fencing::Enabled).await;
    let unfenced = stale_holder_returns(Fencing::Disabled).await;

    // With fencing: refused, balance reflects P2 only, books clean.
    assert!(
        fenced_out(&fenced.stale_result).is_some(),
        "{:?}",
        fenced.stale_result
    );
    let fenced_balance = fenced.fixture.account(fenced.account).await.balance_minor;
    assert_eq!(fenced_balance, 10_000 - 1_200);
    assert!(reconcile::run(&fenced.fixture.pool).await.unwrap().clean);

    // Without: the stale holder's write lands.
    let posted = unfenced
        .stale_result
        .as_ref()
        .expect("stale token accepted with fencing off");
    assert!(!posted.idempotent);
    let row = unfenced.fixture.account(unfenced.account).await;
    assert_eq!(
        fenced_balance - row.balance_minor,
        unfenced.stale_amount,
        "the corruption is exactly one payout"
    );
    assert_eq!(row.fence, 5, "the stale grant dragged the fence back");
    assert_eq!(unfenced.fixture.metrics.fenced_out_count(Resource::account), 0);

    // Reconciliation attributes it to the stale grant.
    let report = reconcile::run(&unfenced.fixture.pool).await.unwrap();
    assert!(!report.clean);
    let acct = report
        .accounts
        .iter()
        .find(|a| a.account_id == unfenced.account)
        .expect("the corrupted account is reported");
    let brk = acct
        .breaks
        .iter()
        .find(|b| b.kind == AccountBreakKind::FenceRegressed)
        .expect("FENCE_REGRESSED");
    assert_eq!(brk.stale_fence, Some(5));
    assert_eq!(brk.fences, vec![5, 9]);
    assert_eq!(brk.payout_ids, vec![unfenced.stale_payout]);
    let legs = unfenced.fixture.legs(unfenced.stale_payout).await;
    assert!(legs.iter().all(|l| l.fence == 5), "{legs:?}");
}
