//! Funds before the rail (docs/accounting.md, "Reservations"), against real PostgreSQL 16: entering
//! RAIL_SUBMITTED holds the amount only if the account covers it and no newer grant has written it;
//! FAILED and ABANDONED give the hold back; posting turns it into the debit. Reconciliation checks
//! the holds and compares the rail's acknowledgements with the payouts. Negative control: the
//! reservation without its funds predicate over-commits the account.

mod common;

use common::{Fixture, fixture, tok};
use dlock_common::metrics::Resource;
use payment_resource::PaymentError;
use payment_resource::model::PayoutState;
use payment_resource::payouts::Payouts;
use payment_resource::reconcile::{self, AccountBreakKind, Options, PayoutBreakKind};
use payment_resource::sql::Statements;
use uuid::Uuid;

/// (r) without its funds predicate: every payout is "covered". Test code only.
const BROKEN_R_NO_FUNDS_CHECK: &str = "
UPDATE account
   SET updated_at = now()
 WHERE account_id = $1
   AND currency   = $2
   AND fence     <= $4
   AND $3 > 0
RETURNING balance_minor, reserved_minor, fence";

async fn reserved_minor(f: &Fixture, account: Uuid) -> i64 {
    sqlx::query_scalar("SELECT reserved_minor FROM account WHERE account_id = $1")
        .bind(account)
        .fetch_one(&f.admin)
        .await
        .expect("account row")
}

/// Three payouts of 400 against 1,000: claim and reserve each with its own grant, as the executor
/// does. Returns which reservations succeeded, or the violated invariant.
async fn overcommit(statements: Statements) -> Result<(Fixture, Uuid, Vec<bool>), String> {
    let f = fixture().await;
    let payouts = Payouts::new(f.pool.clone(), f.metrics.clone()).with_statements(statements);
    let acct = f.customer(1_000).await;
    let mut covered = Vec::new();
    for (i, token) in [3i64, 4, 5].into_iter().enumerate() {
        let p = f.pending(acct, 400).await;
        payouts
            .claim(p.payout_id, &format!("w{i}"), tok(token))
            .await
            .map_err(|e| format!("claim: {e}"))?;
        match payouts
            .transition(
                p.payout_id,
                PayoutState::Claimed,
                PayoutState::RailSubmitted,
                tok(token),
            )
            .await
        {
            Ok(t) => {
                if t.payout.reserved_minor != 400 || t.payout.reserved_token != Some(token) {
                    return Err(format!(
                        "reserved payout does not hold its amount: {:?}",
                        t.payout
                    ));
                }
                covered.push(true);
            }
            Err(PaymentError::Unfunded {
                available_minor,
                payout_state,
                ..
            }) => {
                if (available_minor, payout_state) != (200, PayoutState::Failed) {
                    return Err(format!(
                        "refusal reports {available_minor} available, payout {payout_state}"
                    ));
                }
                let now = payouts.get(p.payout_id).await.map_err(|e| e.to_string())?;
                if now.failure_reason.as_deref() != Some("INSUFFICIENT_FUNDS") || now.reserved_minor != 0 {
                    return Err(format!("refused payout not failed with its reason: {now:?}"));
                }
                covered.push(false);
            }
            Err(e) => return Err(format!("unexpected: {e}")),
        }
    }
    if covered != [true, true, false] {
        return Err(format!(
            "the account covered {covered:?}, expected [true, true, false]"
        ));
    }
    if reserved_minor(&f, acct).await != 800 {
        return Err("the account does not hold the two reservations".into());
    }
    Ok((f, acct, covered))
}

#[tokio::test]
async fn reservations_never_exceed_what_the_account_covers() {
    let (f, acct, _) = overcommit(Statements::FENCED).await.unwrap();
    assert_eq!(f.metrics.funds_rejected_count(), 1);
    // The books are clean: holds match, nothing paid that is not recorded.
    let report = reconcile::run(&f.pool).await.unwrap();
    assert!(report.clean, "{report:?}");
    assert_eq!(
        f.account(acct).await.balance_minor,
        1_000,
        "reserving moves no money"
    );
}

#[tokio::test]
async fn negative_control_reservation_without_its_funds_check_overcommits_the_account() {
    let broken = Statements {
        account_reserve: BROKEN_R_NO_FUNDS_CHECK,
        ..Statements::FENCED
    };
    let violation = overcommit(broken)
        .await
        .err()
        .expect("without the funds predicate the account must be over-committed");
    assert!(violation.contains("expected [true, true, false]"), "{violation}");
}

#[tokio::test]
async fn a_superseded_grant_cannot_reserve_and_nothing_changes() {
    let f = fixture().await;
    let acct = f.customer(10_000).await;
    // Grant 9 posts, so the account's fence is 9.
    let newer = f.acked(acct, 1_000, 9).await;
    f.posting(Statements::FENCED)
        .post(newer.payout_id, tok(9))
        .await
        .unwrap();
    let p = f.pending(acct, 500).await;
    f.payouts.claim(p.payout_id, "stale", tok(5)).await.unwrap();
    let before = f.snapshot().await;
    let r = f
        .payouts
        .transition(
            p.payout_id,
            PayoutState::Claimed,
            PayoutState::RailSubmitted,
            tok(5),
        )
        .await;
    match r {
        Err(PaymentError::FencedOut(d)) => {
            assert_eq!(
                (d.presented, d.highest, d.resource_type.as_str()),
                (5, 9, "account")
            );
        }
        other => panic!("expected FENCED_OUT at the reservation, got {other:?}"),
    }
    assert_eq!(f.snapshot().await, before);
    assert_eq!(f.payout_state(p.payout_id).await, "CLAIMED");
    assert_eq!(reserved_minor(&f, acct).await, 0);
    assert_eq!(f.metrics.fenced_out_count(Resource::account), 1);
    // The grant that posted may still reserve (the reservation does not advance the fence).
    let q = f.pending(acct, 500).await;
    f.payouts.claim(q.payout_id, "w9", tok(9)).await.unwrap();
    f.payouts
        .transition(
            q.payout_id,
            PayoutState::Claimed,
            PayoutState::RailSubmitted,
            tok(9),
        )
        .await
        .unwrap();
    assert_eq!(reserved_minor(&f, acct).await, 500);
}

#[tokio::test]
async fn failing_abandoning_and_posting_give_the_hold_back_exactly_once() {
    let f = fixture().await;
    let acct = f.customer(10_000).await;
    let reserve = |amount: i64, token: i64| {
        let f = &f;
        async move {
            let p = f.pending(acct, amount).await;
            f.payouts.claim(p.payout_id, "w", tok(token)).await.unwrap();
            f.payouts
                .transition(
                    p.payout_id,
                    PayoutState::Claimed,
                    PayoutState::RailSubmitted,
                    tok(token),
                )
                .await
                .unwrap();
            p
        }
    };
    let rejected = reserve(1_000, 3).await;
    let ambiguous = reserve(2_000, 4).await;
    let acked = f.acked(acct, 3_000, 5).await;
    assert_eq!(reserved_minor(&f, acct).await, 6_000);

    let failed = f
        .payouts
        .transition_with_reason(
            rejected.payout_id,
            PayoutState::RailSubmitted,
            PayoutState::Failed,
            tok(3),
            Some("RAIL_REJECTED"),
        )
        .await
        .unwrap();
    assert_eq!(failed.payout.failure_reason.as_deref(), Some("RAIL_REJECTED"));
    assert_eq!(reserved_minor(&f, acct).await, 5_000);
    // Repeating it changes nothing (idempotent), and releases nothing twice.
    let again = f
        .payouts
        .transition_with_reason(
            rejected.payout_id,
            PayoutState::RailSubmitted,
            PayoutState::Failed,
            tok(3),
            Some("RAIL_REJECTED"),
        )
        .await
        .unwrap();
    assert!(again.idempotent);
    assert_eq!(reserved_minor(&f, acct).await, 5_000);

    f.payouts
        .transition(
            ambiguous.payout_id,
            PayoutState::RailSubmitted,
            PayoutState::RailAmbiguous,
            tok(4),
        )
        .await
        .unwrap();
    // While its rail attempt is live (it may have been paid) it cannot be abandoned …
    sqlx::query(
        "INSERT INTO rail_submission (submission_id, payout_id, idempotency_key, presented_token)
         SELECT $1, payout_id, idempotency_key, 4 FROM payout WHERE payout_id = $2",
    )
    .bind(Uuid::new_v4())
    .bind(ambiguous.payout_id)
    .execute(&f.admin)
    .await
    .unwrap();
    let refused = f
        .payouts
        .transition_with_reason(
            ambiguous.payout_id,
            PayoutState::RailAmbiguous,
            PayoutState::Abandoned,
            tok(4),
            Some("RAIL_NEVER_RECEIVED"),
        )
        .await;
    assert!(
        matches!(refused, Err(PaymentError::AttemptNotAbandoned(_))),
        "{refused:?}"
    );
    assert_eq!(reserved_minor(&f, acct).await, 5_000);
    // … once rail-proxy has abandoned it (the rail never received it, past the deadline), it can.
    sqlx::query(
        "UPDATE rail_submission SET outcome = 'TIMEOUT', resolved_at = now(), abandoned_at = now()
          WHERE payout_id = $1",
    )
    .bind(ambiguous.payout_id)
    .execute(&f.admin)
    .await
    .unwrap();
    let abandoned = f
        .payouts
        .transition_with_reason(
            ambiguous.payout_id,
            PayoutState::RailAmbiguous,
            PayoutState::Abandoned,
            tok(4),
            Some("RAIL_NEVER_RECEIVED"),
        )
        .await
        .unwrap();
    assert_eq!(abandoned.payout.state, PayoutState::Abandoned);
    assert_eq!(reserved_minor(&f, acct).await, 3_000);

    let posted = f
        .posting(Statements::FENCED)
        .post(acked.payout_id, tok(5))
        .await
        .unwrap();
    assert_eq!((posted.balance_minor, posted.payout.reserved_minor), (7_000, 0));
    assert_eq!(reserved_minor(&f, acct).await, 0);
    let report = reconcile::run(&f.pool).await.unwrap();
    assert!(report.clean, "{report:?}");

    // A reason must be a code.
    let bad = f
        .payouts
        .transition_with_reason(
            acked.payout_id,
            PayoutState::RailSubmitted,
            PayoutState::Failed,
            tok(5),
            Some("not a code"),
        )
        .await;
    assert!(
        matches!(
            bad,
            Err(PaymentError::Invalid {
                code: "INVALID_REASON",
                ..
            })
        ),
        "{bad:?}"
    );
}

#[tokio::test]
async fn reconciliation_compares_the_rail_with_the_payouts_page_by_page() {
    let f = fixture().await;
    let acct = f.customer(100_000).await;
    let posting = f.posting(Statements::FENCED);
    // Clean postings, more than one page at pageSize 2.
    for t in 10..15 {
        let p = f.acked(acct, 100, t).await;
        posting.post(p.payout_id, tok(t)).await.unwrap();
    }
    let clean = reconcile::run_with(
        &f.pool,
        &Options {
            page_size: 2,
            ..Options::default()
        },
    )
    .await
    .unwrap();
    assert!(clean.clean, "{clean:?}");
    assert_eq!(clean.payouts_checked, 5);

    // 1. The bug: the rail paid, then the account could not cover it at (a): FAILED with
    //    no ledger entry — money left that the books do not record.
    let poor = f.customer(10).await;
    let paid = f.acked_unreserved(poor, 500, 20).await;
    f.rail_acked(&paid, 20).await;
    assert!(matches!(
        posting.post(paid.payout_id, tok(20)).await,
        Err(PaymentError::InsufficientFunds { .. })
    ));
    // 2. POSTED without the rail's acknowledgement (a posting the rail never paid), by tampering.
    let unpaid = f.acked(acct, 100, 21).await;
    posting.post(unpaid.payout_id, tok(21)).await.unwrap();
    sqlx::query("UPDATE rail_submission SET outcome = 'REJECTED' WHERE payout_id = $1")
        .bind(unpaid.payout_id)
        .execute(&f.admin)
        .await
        .unwrap();
    // 3. A hold that does not match the account's payouts, by tampering.
    sqlx::query("UPDATE account SET reserved_minor = 7 WHERE account_id = $1")
        .bind(poor)
        .execute(&f.admin)
        .await
        .unwrap();
    // 4. A payout left in flight.
    let stuck = f.pending(acct, 100).await;
    f.payouts.claim(stuck.payout_id, "gone", tok(30)).await.unwrap();
    sqlx::query("UPDATE payout SET updated_at = now() - interval '1 hour' WHERE payout_id = $1")
        .bind(stuck.payout_id)
        .execute(&f.admin)
        .await
        .unwrap();

    let small = reconcile::run_with(
        &f.pool,
        &Options {
            page_size: 2,
            stuck_after_seconds: 600,
        },
    )
    .await
    .unwrap();
    let large = reconcile::run_with(
        &f.pool,
        &Options {
            page_size: 1_000,
            stuck_after_seconds: 600,
        },
    )
    .await
    .unwrap();
    assert_eq!(small.break_counts, large.break_counts, "paging changes nothing");
    assert!(!small.clean);
    for (kind, n) in [
        ("RAIL_PAID_NOT_POSTED", 1),
        ("POSTED_WITHOUT_RAIL_ACK", 1),
        ("RESERVATION_MISMATCH", 1),
        ("STUCK", 1),
    ] {
        assert_eq!(small.break_count(kind), n, "{kind}: {:?}", small.break_counts);
    }
    let find = |kind: PayoutBreakKind| {
        small
            .payouts
            .iter()
            .find(|b| b.kind == kind)
            .unwrap_or_else(|| panic!("{kind:?} in {:?}", small.payouts))
    };
    let b = find(PayoutBreakKind::RailPaidNotPosted);
    assert_eq!((b.payout_id, b.fences.clone()), (paid.payout_id, vec![20]));
    let b = find(PayoutBreakKind::PostedWithoutRailAck);
    assert_eq!((b.payout_id, b.fences.clone()), (unpaid.payout_id, vec![21]));
    let b = find(PayoutBreakKind::Stuck);
    assert_eq!((b.payout_id, b.fences.clone()), (stuck.payout_id, vec![30]));
    let a = small
        .accounts
        .iter()
        .find(|a| a.account_id == poor)
        .expect("the tampered account");
    assert!(
        a.breaks
            .iter()
            .any(|b| b.kind == AccountBreakKind::ReservationMismatch)
    );

    // The stuck threshold is the caller's.
    let lenient = reconcile::run_with(
        &f.pool,
        &Options {
            page_size: 500,
            stuck_after_seconds: 7_200,
        },
    )
    .await
    .unwrap();
    assert_eq!(lenient.break_count("STUCK"), 0);
    assert!(Options::checked(Some(0), None).is_err());
    assert!(Options::checked(None, Some(0)).is_err());
}
