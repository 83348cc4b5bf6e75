//! The checker's controls: one small run that passes every check, and doctored copies of it that
//! must each fail exactly the intended check (positive controls) — or must not be flagged at all
//! (the legitimate hand-overs a sound checker has to accept).

use std::collections::BTreeMap;

use chrono::{DateTime, Duration, TimeZone, Utc};
use dlock_chaos::check::{Verdict, check, check_files, read_history};
use dlock_chaos::history::{Event, F, Type, Value};
use dlock_chaos::state::{
    AccountRow, FinalState, HighWaterRow, LedgerRow, PayoutRow, RailSubmissionRow, ReceivedReport, RunInfo,
};
use dlock_wire::stub::{KeyCount, PayoutCount, Received};
use uuid::Uuid;

const MS: u64 = 1_000_000;

fn id(n: u128) -> Uuid {
    Uuid::from_u128(n)
}

const ACCOUNT: u128 = 0xA;
const SETTLEMENT: u128 = 0x5E;
const P1: u128 = 1;
const P2: u128 = 2;
const P3: u128 = 3;
const S1: u128 = 0x51;
const S2: u128 = 0x52;

fn key() -> String {
    format!("account:{}", id(ACCOUNT))
}

/// The lock service's clock: the run began at T0.
fn srv(ms: i64) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0)
        .single()
        .expect("a valid date")
        + Duration::milliseconds(ms)
}

/// A history under construction: each operation an invoke and (optionally) a completion.
#[derive(Default)]
struct History {
    events: Vec<Event>,
    op: u64,
}

impl History {
    #[allow(clippy::too_many_arguments)]
    fn op(&mut self, process: &str, f: F, at: u64, done: Option<(u64, Type)>, asked: Value, answer: Value) {
        self.op += 1;
        self.events.push(Event {
            index: 0,
            time_ns: at * MS,
            process: process.to_owned(),
            kind: Type::Invoke,
            f,
            op: self.op,
            value: asked,
        });
        if let Some((t, kind)) = done {
            self.events.push(Event {
                index: 0,
                time_ns: t * MS,
                process: process.to_owned(),
                kind,
                f,
                op: self.op,
                value: answer,
            });
        }
    }

    /// An ok operation answered 1 ms after it was asked.
    fn ok(&mut self, process: &str, f: F, at: u64, asked: Value, answer: Value) {
        self.op(process, f, at, Some((at + 1, Type::Ok)), asked, answer);
    }

    fn create(&mut self, at: u64, k: &str, payout: u128) {
        self.ok(
            "client",
            F::Create,
            at,
            Value {
                idempotency_key: Some(k.to_owned()),
                account: Some(id(ACCOUNT)),
                ..Value::default()
            },
            Value {
                payout: Some(id(payout)),
                idempotency_key: Some(k.to_owned()),
                status: Some(201),
                ..Value::default()
            },
        );
    }

    fn open_session(&mut self, process: &str, at: u64, session: u128, expires: i64) {
        self.ok(
            process,
            F::OpenSession,
            at,
            Value {
                owner: Some(process.to_owned()),
                ..Value::default()
            },
            Value {
                session: Some(id(session)),
                expires_at: Some(srv(expires)),
                ..Value::default()
            },
        );
    }

    fn acquire(&mut self, process: &str, at: u64, session: u128, token: i64, acquired: i64, expires: i64) {
        self.acquire_on(process, &key(), at, session, token, acquired, expires);
    }

    #[allow(clippy::too_many_arguments)]
    fn acquire_on(
        &mut self,
        process: &str,
        k: &str,
        at: u64,
        session: u128,
        token: i64,
        acquired: i64,
        expires: i64,
    ) {
        self.ok(
            process,
            F::Acquire,
            at,
            Value {
                key: Some(k.to_owned()),
                session: Some(id(session)),
                owner: Some(process.to_owned()),
                ..Value::default()
            },
            Value {
                key: Some(k.to_owned()),
                token: Some(token),
                session: Some(id(session)),
                owner: Some(process.to_owned()),
                acquired_at: Some(srv(acquired)),
                expires_at: Some(srv(expires)),
                status: Some(200),
                ..Value::default()
            },
        );
    }

    fn release(&mut self, process: &str, at: u64, token: i64) {
        let v = Value {
            key: Some(key()),
            token: Some(token),
            ..Value::default()
        };
        self.ok(
            process,
            F::Release,
            at,
            v.clone(),
            Value {
                released: Some(true),
                stale: Some(false),
                ..v
            },
        );
    }

    /// A fenced write (claim/transition/post/submit) on a payout, answered ok.
    fn write(&mut self, process: &str, f: F, at: u64, payout: u128, token: i64, extra: Value) {
        self.ok(
            process,
            f,
            at,
            Value {
                payout: Some(id(payout)),
                token: Some(token),
                from: extra.from.clone(),
                to: extra.to.clone(),
                ..Value::default()
            },
            Value {
                payout: Some(id(payout)),
                token: Some(token),
                status: Some(200),
                ..extra
            },
        );
    }

    /// The events in time order, numbered.
    fn done(mut self) -> Vec<Event> {
        self.events.sort_by_key(|e| e.time_ns);
        for (i, e) in self.events.iter_mut().enumerate() {
            e.index = i as u64;
        }
        self.events
    }
}

fn to(from: &str, to: &str) -> Value {
    Value {
        from: Some(from.to_owned()),
        to: Some(to.to_owned()),
        account: Some(id(ACCOUNT)),
        state: Some(to.to_owned()),
        ..Value::default()
    }
}

fn on_account() -> Value {
    Value {
        account: Some(id(ACCOUNT)),
        ..Value::default()
    }
}

fn outcome(o: &str) -> Value {
    Value {
        outcome: Some(o.to_owned()),
        ..Value::default()
    }
}

/// Three payouts of one account: P1 posted under token 10 (executor-1), P2 rejected by the rail
/// under 12 and P3 posted under 14 (executor-2), a stale submit refused, a heartbeat lost.
fn history() -> History {
    let mut h = History::default();
    h.create(1, "k1", P1);
    h.create(3, "k2", P2);
    h.create(5, "k3", P3);
    h.create(7, "k1", P1); // a retry: the same payout again

    h.open_session("executor-1", 10, S1, 30_000);
    h.acquire("executor-1", 12, S1, 10, 12, 10_012);
    h.write("executor-1", F::Claim, 14, P1, 10, on_account());
    h.write(
        "executor-1",
        F::Transition,
        16,
        P1,
        10,
        to("CLAIMED", "RAIL_SUBMITTED"),
    );
    h.write("executor-1", F::Submit, 18, P1, 10, outcome("ACKED"));
    h.write(
        "executor-1",
        F::Transition,
        20,
        P1,
        10,
        to("RAIL_SUBMITTED", "RAIL_ACKED"),
    );
    h.write("executor-1", F::Post, 22, P1, 10, on_account());
    h.release("executor-1", 24, 10);

    h.open_session("executor-2", 30, S2, 30_000);
    h.acquire("executor-2", 32, S2, 12, 32, 10_032);
    h.write("executor-2", F::Claim, 34, P2, 12, on_account());
    h.write(
        "executor-2",
        F::Transition,
        36,
        P2,
        12,
        to("CLAIMED", "RAIL_SUBMITTED"),
    );
    h.write("executor-2", F::Submit, 38, P2, 12, outcome("REJECTED"));
    h.write(
        "executor-2",
        F::Transition,
        40,
        P2,
        12,
        to("RAIL_SUBMITTED", "FAILED"),
    );
    h.release("executor-2", 42, 12);
    h.acquire("executor-2", 44, S2, 14, 44, 10_044);
    h.write("executor-2", F::Claim, 46, P3, 14, on_account());
    h.write(
        "executor-2",
        F::Transition,
        48,
        P3,
        14,
        to("CLAIMED", "RAIL_SUBMITTED"),
    );
    h.write("executor-2", F::Submit, 50, P3, 14, outcome("ACKED"));
    h.write(
        "executor-2",
        F::Transition,
        52,
        P3,
        14,
        to("RAIL_SUBMITTED", "RAIL_ACKED"),
    );
    h.write("executor-2", F::Post, 54, P3, 14, on_account());
    h.release("executor-2", 56, 14);

    // A stale submit, refused by (d); a heartbeat that never heard back.
    h.op(
        "executor-1",
        F::Submit,
        60,
        Some((61, Type::Fail)),
        Value {
            payout: Some(id(P3)),
            token: Some(10),
            ..Value::default()
        },
        Value {
            status: Some(409),
            code: Some("FENCED_OUT".to_owned()),
            resource: Some("rail".to_owned()),
            highest: Some(14),
            ..Value::default()
        },
    );
    h.op(
        "executor-1",
        F::Heartbeat,
        62,
        Some((63, Type::Info)),
        Value {
            session: Some(id(S1)),
            ..Value::default()
        },
        Value {
            error: Some("timeout".to_owned()),
            ..Value::default()
        },
    );
    h
}

fn payout(n: u128, amount: i64, state: &str, claim: i64, k: &str) -> PayoutRow {
    PayoutRow {
        payout_id: id(n),
        account_id: id(ACCOUNT),
        amount_minor: amount,
        currency: "EUR".to_owned(),
        state: state.to_owned(),
        claim_token: Some(claim),
        reserved_minor: 0,
        reserved_token: Some(claim),
        failure_reason: (state == "FAILED").then(|| "RAIL_REJECTED".to_owned()),
        idempotency_key: k.to_owned(),
        created_at: srv(0),
        updated_at: srv(60),
    }
}

fn leg(n: u128, payout: u128, account: u128, direction: &str, amount: i64, fence: i64) -> LedgerRow {
    LedgerRow {
        entry_id: id(0x1000 + n),
        payout_id: id(payout),
        account_id: id(account),
        direction: direction.to_owned(),
        amount_minor: amount,
        fence,
        created_at: srv(60),
    }
}

fn submission(n: u128, payout: u128, token: i64, outcome: &str) -> RailSubmissionRow {
    RailSubmissionRow {
        submission_id: id(0x2000 + n),
        payout_id: id(payout),
        account_id: id(ACCOUNT),
        presented_token: token,
        outcome: Some(outcome.to_owned()),
        submitted_at: srv(40),
        resolved_at: Some(srv(41)),
        abandoned_at: None,
    }
}

fn rail() -> ReceivedReport {
    let mut per_key = BTreeMap::new();
    let mut per_payout = BTreeMap::new();
    let mut requests = Vec::new();
    for (seq, (p, k, amount, paid)) in [(P1, "k1", 100, 1), (P2, "k2", 50, 0), (P3, "k3", 30, 1)]
        .into_iter()
        .enumerate()
    {
        requests.push(Received {
            seq: seq as u64,
            idempotency_key: k.to_owned(),
            payout_id: id(p),
            account_id: id(ACCOUNT),
            amount_minor: amount,
            presented_at: srv(20),
        });
        per_key.insert(
            k.to_owned(),
            KeyCount {
                payout_id: id(p),
                received: 1,
                paid,
            },
        );
        per_payout.insert(
            id(p),
            PayoutCount {
                received: 1,
                paid,
                keys: vec![k.to_owned()],
            },
        );
    }
    ReceivedReport {
        requests,
        per_key,
        per_payout,
        paid_twice: Vec::new(),
    }
}

fn state() -> FinalState {
    FinalState {
        run: RunInfo {
            seed: 1,
            backend: "postgres".to_owned(),
            nemeses: vec!["pause".to_owned()],
            faults: Vec::new(),
            last_heal_ns: 0,
            ended_ns: 100 * MS,
            settle_bound_ns: 10_000 * MS,
            payment_fencing: true,
            rail_fencing: true,
            replicated: Vec::new(),
            replication: None,
            sequence_jump: true,
            tls: true,
        },
        accounts: vec![
            AccountRow {
                account_id: id(ACCOUNT),
                kind: "CUSTOMER".to_owned(),
                currency: "EUR".to_owned(),
                opening_balance_minor: 1000,
                balance_minor: 870,
                reserved_minor: 0,
                fence: 14,
            },
            AccountRow {
                account_id: id(SETTLEMENT),
                kind: "SETTLEMENT".to_owned(),
                currency: "EUR".to_owned(),
                opening_balance_minor: 0,
                balance_minor: 0,
                reserved_minor: 0,
                fence: 0,
            },
        ],
        payouts: vec![
            payout(P1, 100, "POSTED", 10, "k1"),
            payout(P2, 50, "FAILED", 12, "k2"),
            payout(P3, 30, "POSTED", 14, "k3"),
        ],
        ledger: vec![
            leg(1, P1, ACCOUNT, "DEBIT", 100, 10),
            leg(2, P1, SETTLEMENT, "CREDIT", 100, 10),
            leg(3, P3, ACCOUNT, "DEBIT", 30, 14),
            leg(4, P3, SETTLEMENT, "CREDIT", 30, 14),
        ],
        rail_submissions: vec![
            submission(1, P1, 10, "ACKED"),
            submission(2, P2, 12, "REJECTED"),
            submission(3, P3, 14, "ACKED"),
            submission(4, P3, 10, "FENCED"),
        ],
        rail_high_water: vec![HighWaterRow {
            account_id: id(ACCOUNT),
            highest_token: 14,
        }],
        rail: rail(),
        reconciliation: serde_json::json!({
            "clean": true, "accountsChecked": 2, "payoutsChecked": 3, "accounts": [], "payouts": []
        }),
        lock_sequence: Some(15),
    }
}

/// Asserts that exactly `name` failed, and that one of its violations is of kind `kind`.
fn only_fails(v: &Verdict, name: &str, kind: &str) {
    assert_eq!(v.failed(), vec![name], "\n{v}");
    assert!(!v.ok());
    let c = v.check(name).expect("the check exists");
    assert!(
        c.violations.iter().any(|x| x.kind == kind),
        "no {kind} among the violations of {name}:\n{v}"
    );
}

fn passes(v: &Verdict) {
    assert!(v.ok(), "\n{v}");
}

fn without(mut events: Vec<Event>, drop: impl Fn(&Event) -> bool) -> Vec<Event> {
    let ops: Vec<u64> = events.iter().filter(|e| drop(e)).map(|e| e.op).collect();
    events.retain(|e| !ops.contains(&e.op));
    events
}

fn is_release_of(e: &Event, token: i64) -> bool {
    e.f == F::Release && e.value.token == Some(token)
}

/// Moves a grant's `acquiredAt` / `expiresAt` (lock-service clock, ms after T0).
fn regrant(events: &mut [Event], token: i64, acquired: i64, expires: i64) {
    for e in events
        .iter_mut()
        .filter(|e| e.f == F::Acquire && e.kind == Type::Ok && e.value.token == Some(token))
    {
        e.value.acquired_at = Some(srv(acquired));
        e.value.expires_at = Some(srv(expires));
    }
}

// ---------------------------------------------------------------------------------------------
// The clean run

#[test]
fn the_clean_run_passes_every_check_and_is_summarised() {
    let v = check(&history().done(), &state());
    passes(&v);
    assert_eq!(v.checks.len(), 7);
    let s = &v.summary;
    assert_eq!(
        (
            s.payouts_posted,
            s.payouts_failed,
            s.payouts_abandoned,
            s.payouts_in_flight
        ),
        (2, 1, 0, 0)
    );
    assert_eq!(s.fenced_out_by_resource.get("rail"), Some(&1));
    assert_eq!(s.rail_fenced_submissions, 1);
    assert_eq!(s.operations.fail, 1);
    assert_eq!(s.operations.info, 1);
    assert_eq!(s.operations_by_f["submit"].ok, 3);
    assert_eq!(s.operations_by_f["create"].ok, 4);
    assert!(s.reconciliation_clean);
    assert_eq!(
        (
            s.double_payments,
            s.ledger_breaks,
            s.non_monotone_tokens,
            s.stuck_payouts
        ),
        (0, 0, 0, 0)
    );
    let table = v.to_string();
    assert_eq!(table.matches("PASS ").count(), 7, "{table}");
    assert!(table.contains("verdict: PASS"), "{table}");
}

// ---------------------------------------------------------------------------------------------
// 1. rail

#[test]
fn a_duplicated_rail_payment_fails_the_rail_check() {
    let mut s = state();
    s.rail.per_payout.get_mut(&id(P1)).expect("P1 was paid").paid = 2;
    s.rail.paid_twice.push(id(P1));
    let v = check(&history().done(), &s);
    only_fails(&v, "rail", "PAID_TWICE");
    assert_eq!(v.summary.double_payments, 1);
    assert!(v.to_string().contains("FAIL  rail"), "{v}");
}

#[test]
fn paid_twice_is_caught_by_either_record() {
    let mut by_count = state();
    by_count
        .rail
        .per_payout
        .get_mut(&id(P3))
        .expect("P3 was paid")
        .paid = 2;
    only_fails(&check(&history().done(), &by_count), "rail", "PAID_TWICE");

    let mut by_list = state();
    by_list.rail.paid_twice.push(id(P3));
    only_fails(&check(&history().done(), &by_list), "rail", "PAID_TWICE");
}

#[test]
fn a_posted_payout_the_rail_never_paid_fails_the_rail_check() {
    let mut s = state();
    s.rail.per_payout.get_mut(&id(P3)).expect("P3 is listed").paid = 0;
    only_fails(&check(&history().done(), &s), "rail", "RECORDED_NOT_PAID");
}

#[test]
fn a_paid_payout_that_ended_failed_fails_the_rail_check() {
    let mut s = state();
    s.rail.per_payout.get_mut(&id(P2)).expect("P2 is listed").paid = 1;
    only_fails(&check(&history().done(), &s), "rail", "PAID_NOT_RECORDED");
}

// ---------------------------------------------------------------------------------------------
// 2. books

#[test]
fn a_balance_off_by_one_payout_fails_the_books() {
    let mut s = state();
    s.accounts[0].balance_minor += 30; // P3 never debited
    let v = check(&history().done(), &s);
    only_fails(&v, "books", "BALANCE_MISMATCH");
    only_fails(&v, "books", "POSTED_MISMATCH");
    assert!(v.summary.ledger_breaks >= 2);
}

#[test]
fn a_second_debit_leg_is_a_double_posting() {
    let mut s = state();
    s.ledger.push(leg(5, P1, ACCOUNT, "DEBIT", 100, 9));
    s.accounts[0].balance_minor -= 100; // the money went too: the legs add up, the payouts do not
    let v = check(&history().done(), &s);
    only_fails(&v, "books", "DOUBLE_POSTING");
    only_fails(&v, "books", "POSTED_MISMATCH");
}

#[test]
fn legs_for_a_payout_that_is_not_posted_are_a_break() {
    let mut s = state();
    s.ledger.push(leg(5, P2, ACCOUNT, "DEBIT", 50, 12));
    s.ledger.push(leg(6, P2, SETTLEMENT, "CREDIT", 50, 12));
    s.accounts[0].balance_minor -= 50;
    s.accounts[0].fence = 14;
    only_fails(&check(&history().done(), &s), "books", "UNEXPECTED_LEGS");
}

#[test]
fn a_reservation_left_on_a_failed_payout_fails_the_books() {
    let mut s = state();
    s.payouts[1].reserved_minor = 50;
    only_fails(&check(&history().done(), &s), "books", "RESERVATION_LEFT");
}

#[test]
fn an_account_reservation_nobody_holds_fails_the_books() {
    let mut s = state();
    s.accounts[0].reserved_minor = 30;
    only_fails(&check(&history().done(), &s), "books", "RESERVATION_MISMATCH");
}

// ---------------------------------------------------------------------------------------------
// 3. tokens

#[test]
fn a_stale_post_accepted_after_a_higher_token_fails_the_tokens_check() {
    let mut h = history();
    h.write(
        "executor-1",
        F::Post,
        70,
        P1,
        10,
        Value {
            idempotent: Some(false),
            ..on_account()
        },
    );
    let v = check(&h.done(), &state());
    only_fails(&v, "tokens", "STALE_WRITE_ACCEPTED");
    assert_eq!(v.summary.non_monotone_tokens, 1);
    let x = &v.check("tokens").expect("tokens").violations[0];
    assert_eq!(x.tokens, vec![10, 14]);
    assert_eq!(x.account, Some(id(ACCOUNT)));
    assert_eq!(x.payout, Some(id(P1)));
}

#[test]
fn an_idempotent_answer_to_a_stale_post_is_not_a_write() {
    // Said so by the answer …
    let mut h = history();
    h.write(
        "executor-1",
        F::Post,
        70,
        P1,
        10,
        Value {
            idempotent: Some(true),
            ..on_account()
        },
    );
    passes(&check(&h.done(), &state()));
    // … or told by the ledger: P3's legs carry 14, so a post of P3 with 10 wrote nothing.
    let mut h = history();
    h.write("executor-1", F::Post, 70, P3, 10, on_account());
    passes(&check(&h.done(), &state()));
}

#[test]
fn a_stale_claim_accepted_on_a_payout_fails_the_tokens_check() {
    let mut h = history();
    h.write("executor-3", F::Claim, 70, P3, 12, on_account());
    only_fails(&check(&h.done(), &state()), "tokens", "STALE_WRITE_ACCEPTED");
}

#[test]
fn a_rail_token_not_increasing_fails_the_tokens_check() {
    // P3 submitted with 12, the token P2 had already submitted with.
    let mut events = history().done();
    for e in events
        .iter_mut()
        .filter(|e| e.f == F::Submit && e.value.payout == Some(id(P3)) && e.value.token == Some(14))
    {
        e.value.token = Some(12);
    }
    only_fails(&check(&events, &state()), "tokens", "TOKEN_NOT_INCREASING");
}

#[test]
fn a_rail_token_reused_in_the_attempts_fails_the_tokens_check() {
    let mut s = state();
    s.rail_submissions[2].presented_token = 12;
    only_fails(&check(&history().done(), &s), "tokens", "RAIL_TOKEN_REUSED");
}

#[test]
fn an_attempt_above_the_high_water_mark_fails_the_tokens_check() {
    let mut s = state();
    s.rail_high_water[0].highest_token = 12;
    only_fails(&check(&history().done(), &s), "tokens", "RAIL_ABOVE_HIGH_WATER");
}

#[test]
fn a_regressed_fence_fails_the_tokens_check() {
    let mut s = state();
    s.accounts[0].fence = 10;
    only_fails(&check(&history().done(), &s), "tokens", "FENCE_REGRESSED");
}

#[test]
fn two_debits_under_one_grant_fail_the_tokens_check() {
    let mut s = state();
    for l in s.ledger.iter_mut().filter(|l| l.payout_id == id(P3)) {
        l.fence = 10;
    }
    s.accounts[0].fence = 10;
    only_fails(&check(&history().done(), &s), "tokens", "DUPLICATE_GRANT");
}

// ---------------------------------------------------------------------------------------------
// 4. grants

#[test]
fn two_overlapping_grants_on_one_key_fail_the_grants_check() {
    // executor-1 never releases 10; executor-2 is granted 12 at 32 ms, inside 10's lease (10 s)
    // and session (30 s).
    let events = without(history().done(), |e| is_release_of(e, 10));
    let v = check(&events, &state());
    only_fails(&v, "grants", "OVERLAPPING_GRANTS");
    let x = &v.check("grants").expect("grants").violations[0];
    assert_eq!(x.tokens, vec![10, 12]);
    assert_eq!(x.key.as_deref(), Some(key().as_str()));
}

#[test]
fn a_release_sent_only_after_the_next_grant_does_not_excuse_it() {
    let mut h = history();
    h.release("executor-1", 80, 10);
    let events = without(h.done(), |e| is_release_of(e, 10) && e.time_ns < 30 * MS);
    only_fails(&check(&events, &state()), "grants", "OVERLAPPING_GRANTS");
}

#[test]
fn a_grant_after_the_previous_holders_release_was_sent_is_legitimate() {
    // The clean run is exactly this: 12 is granted inside 10's lease, after 10's release was sent.
    let v = check(&history().done(), &state());
    passes(&v);
    // Even when the release never heard back.
    let mut h = history();
    h.op(
        "executor-1",
        F::Release,
        25,
        Some((29, Type::Info)),
        Value {
            key: Some(key()),
            token: Some(10),
            ..Value::default()
        },
        Value::default(),
    );
    let events = without(h.done(), |e| is_release_of(e, 10) && e.time_ns == 24 * MS);
    passes(&check(&events, &state()));
}

#[test]
fn a_grant_after_the_previous_lease_expired_is_legitimate() {
    let mut events = without(history().done(), |e| is_release_of(e, 10));
    regrant(&mut events, 12, 10_012, 20_012); // exactly at 10's expiry: not before it
    regrant(&mut events, 14, 10_044, 20_044);
    passes(&check(&events, &state()));
}

#[test]
fn a_seen_renewal_extends_the_lease_the_next_grant_must_wait_for() {
    let mut h = history();
    h.ok(
        "executor-1",
        F::Renew,
        26,
        Value {
            key: Some(key()),
            token: Some(10),
            ..Value::default()
        },
        Value {
            key: Some(key()),
            token: Some(10),
            expires_at: Some(srv(12_000)),
            ..Value::default()
        },
    );
    let mut events = without(h.done(), |e| is_release_of(e, 10));
    regrant(&mut events, 12, 10_012, 20_012);
    regrant(&mut events, 14, 10_044, 20_044);
    only_fails(&check(&events, &state()), "grants", "OVERLAPPING_GRANTS");
}

#[test]
fn a_grant_after_the_previous_session_ended_is_legitimate() {
    // executor-1's session was known to last only until 5 s; 12 is granted at 6 s.
    let mut events = without(history().done(), |e| is_release_of(e, 10));
    for e in events
        .iter_mut()
        .filter(|e| e.f == F::OpenSession && e.kind == Type::Ok && e.value.session == Some(id(S1)))
    {
        e.value.expires_at = Some(srv(5_000));
    }
    regrant(&mut events, 12, 6_000, 16_000);
    regrant(&mut events, 14, 6_100, 16_100);
    passes(&check(&events, &state()));
}

#[test]
fn an_unknown_session_end_is_undecidable_not_a_violation() {
    let events = without(history().done(), |e| {
        is_release_of(e, 10) || (e.f == F::OpenSession && e.process == "executor-1")
    });
    let v = check(&events, &state());
    passes(&v);
    assert_eq!(v.check("grants").expect("grants").counts["undecidable_pairs"], 1);
}

#[test]
fn closing_the_session_ends_its_grants() {
    let mut h = history();
    h.ok(
        "executor-1",
        F::CloseSession,
        26,
        Value {
            session: Some(id(S1)),
            ..Value::default()
        },
        Value::default(),
    );
    passes(&check(&without(h.done(), |e| is_release_of(e, 10)), &state()));
}

#[test]
fn a_token_granted_below_an_earlier_grant_fails_the_grants_check() {
    // A rewound sequence: another key is granted 11 after 14 was granted.
    let mut h = history();
    h.open_session("executor-3", 88, 0x53, 30_000);
    h.acquire_on("executor-3", "account:other", 90, 0x53, 11, 90, 10_090);
    only_fails(&check(&h.done(), &state()), "grants", "TOKEN_NOT_INCREASING");
}

#[test]
fn a_token_granted_twice_fails_the_grants_check() {
    let mut h = history();
    h.open_session("executor-3", 88, 0x53, 30_000);
    h.acquire_on("executor-3", "account:other", 90, 0x53, 12, 90, 10_090);
    only_fails(&check(&h.done(), &state()), "grants", "TOKEN_REISSUED");
}

#[test]
fn a_sequence_jump_after_a_failover_is_legitimate() {
    // lock-server on a promoted standby jumps fencing_token_seq 2^32 above what it finds: a gap,
    // never a reuse. The next grant, far above, passes every check.
    let jumped = (1_i64 << 32) + 13;
    let mut h = history();
    h.open_session("executor-3", 88, 0x53, 30_000);
    h.acquire_on("executor-3", "account:other", 90, 0x53, jumped, 90, 10_090);
    let mut s = state();
    s.lock_sequence = Some(jumped);
    passes(&check(&h.done(), &s));
}

#[test]
fn a_sequence_behind_the_resources_fails_the_grants_check() {
    let mut s = state();
    s.lock_sequence = Some(13);
    only_fails(&check(&history().done(), &s), "grants", "SEQUENCE_BEHIND");
}

// ---------------------------------------------------------------------------------------------
// 5. ends

#[test]
fn a_payout_left_rail_submitted_fails_the_ends_check() {
    let mut s = state();
    s.payouts[1].state = "RAIL_SUBMITTED".to_owned();
    s.payouts[1].failure_reason = None;
    s.payouts[1].reserved_minor = 50;
    s.accounts[0].reserved_minor = 50;
    let v = check(&history().done(), &s);
    only_fails(&v, "ends", "STUCK");
    assert_eq!(v.summary.stuck_payouts, 1);
    assert_eq!(v.summary.payouts_in_flight, 1);
}

#[test]
fn a_reconciliation_that_is_not_clean_fails_the_ends_check() {
    let mut s = state();
    s.reconciliation = serde_json::json!({
        "clean": false,
        "breakCounts": {"BALANCE_MISMATCH": 1},
        "accounts": [{"accountId": id(ACCOUNT), "breaks": ["BALANCE_MISMATCH"]}],
        "payouts": []
    });
    let v = check(&history().done(), &s);
    only_fails(&v, "ends", "RECONCILIATION_NOT_CLEAN");
    assert!(!v.summary.reconciliation_clean);
    assert!(v.to_string().contains("BALANCE_MISMATCH"), "{v}");
}

#[test]
fn a_payout_ending_past_the_settle_bound_fails_the_ends_check() {
    let mut s = state();
    s.run.settle_bound_ns = 30 * MS; // P3's post at 55 ms is past 5 ms + 30 ms
    let v = check(&history().done(), &s);
    only_fails(&v, "ends", "SLOW_TO_END");
    assert_eq!(v.summary.slow_payouts, 2); // P2 (41 ms > 33 ms) and P3
}

// ---------------------------------------------------------------------------------------------
// 6. creates

#[test]
fn a_retried_create_answering_another_payout_fails_the_creates_check() {
    let mut events = history().done();
    for e in events
        .iter_mut()
        .filter(|e| e.f == F::Create && e.kind == Type::Ok && e.time_ns == 8 * MS)
    {
        e.value.payout = Some(id(0x99));
    }
    only_fails(&check(&events, &state()), "creates", "RETRY_NEW_PAYOUT");
}

#[test]
fn two_payouts_with_one_key_fail_the_creates_check() {
    let mut s = state();
    s.payouts[1].idempotency_key = "k1".to_owned();
    only_fails(&check(&history().done(), &s), "creates", "DUPLICATE_KEY");
}

// ---------------------------------------------------------------------------------------------
// Files and the table

#[test]
fn the_checker_reads_its_files_and_names_a_bad_line() {
    let dir = std::env::temp_dir().join(format!("dlock-chaos-check-{}", Uuid::new_v4()));
    std::fs::create_dir_all(&dir).expect("a temp dir");
    let events = history().done();
    let lines: Vec<String> = events
        .iter()
        .map(|e| serde_json::to_string(e).expect("an event serialises"))
        .collect();
    let hist = dir.join("history.jsonl");
    std::fs::write(&hist, lines.join("\n") + "\n\n").expect("write the history");
    let st = dir.join("state.json");
    std::fs::write(&st, serde_json::to_vec(&state()).expect("the state serialises"))
        .expect("write the state");
    assert_eq!(read_history(&hist).expect("reads"), events);
    passes(&check_files(&hist, &st).expect("both files read"));

    std::fs::write(&hist, format!("{}\nnot json\n", lines[0])).expect("write");
    let err = format!("{:#}", read_history(&hist).expect_err("a bad line"));
    assert!(err.contains("history.jsonl:2"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_table_shows_the_first_violations_and_counts_the_rest() {
    let mut s = state();
    for n in 0..5u128 {
        let p = id(0x700 + n);
        s.rail.per_payout.insert(
            p,
            PayoutCount {
                received: 1,
                paid: 1,
                keys: vec![format!("x{n}")],
            },
        );
    }
    let v = check(&history().done(), &s);
    only_fails(&v, "rail", "PAID_NOT_RECORDED");
    let t = v.table(2);
    assert!(t.contains("… and 3 more"), "{t}");
    assert!(t.contains("verdict: FAIL"), "{t}");
    assert_eq!(v.check("rail").expect("rail").counts["violations"], 5);
    // And it serialises for the report.
    let json = serde_json::to_value(&v).expect("the verdict serialises");
    assert_eq!(json["checks"][0]["name"], "rail");
}

// ---------------------------------------------------------------------------------------------
// fences: a stale write is refused by the fence, not by something else

/// A late rail submission of P2 with token 10, after the account's rail had accepted 14.
fn stale_submit(code: &str) -> Vec<Event> {
    let mut h = history();
    h.op(
        "executor-1",
        F::Submit,
        60,
        Some((61, Type::Fail)),
        Value {
            payout: Some(id(P2)),
            token: Some(10),
            ..Value::default()
        },
        Value {
            payout: Some(id(P2)),
            token: Some(10),
            status: Some(409),
            code: Some(code.to_owned()),
            resource: (code == "FENCED_OUT").then(|| "rail".to_owned()),
            ..Value::default()
        },
    );
    h.done()
}

#[test]
fn a_stale_submission_refused_by_the_fence_passes() {
    let v = check(&stale_submit("FENCED_OUT"), &state());
    passes(&v);
    let fences = v.check("fences").map(|c| c.counts.clone()).unwrap_or_default();
    // The baseline's own stale submission, and this one.
    assert_eq!(fences.get("stale_writes"), Some(&2));
    assert_eq!(fences.get("refused_by_fence"), Some(&2));
}

#[test]
fn a_stale_submission_stopped_only_by_the_unique_index_fails_the_fences_check() {
    // The kill switch off: (d) did not run; C1's one-attempt index stopped it instead.
    only_fails(
        &check(&stale_submit("DUPLICATE_ATTEMPT"), &state()),
        "fences",
        "STALE_NOT_FENCED",
    );
}

#[test]
fn no_high_water_mark_is_expected_with_the_rail_kill_switch_off() {
    let mut s = state();
    s.rail_high_water.clear();
    only_fails(&check(&history().done(), &s), "tokens", "RAIL_ABOVE_HIGH_WATER");
    s.run.rail_fencing = false;
    passes(&check(&history().done(), &s));
}

#[test]
fn a_grant_asked_for_after_the_previous_one_with_an_earlier_acquired_at_fails() {
    // 12 was asked for after 10 was answered, so its transaction began after 10's committed: an
    // acquiredAt before 10's is the lock service's clock going backwards.
    let mut events = history().done();
    regrant(&mut events, 12, 5, 10_005);
    only_fails(&check(&events, &state()), "grants", "ACQUIRED_AT_OUT_OF_ORDER");
}

#[test]
fn a_batched_grant_that_waited_inside_its_transaction_may_report_an_earlier_acquired_at() {
    // 12 asked for at 11 ms, before 10 was answered (13 ms): its transaction began first (now() =
    // 11), waited, and was granted after 10's release. C1's acquired_at is that now().
    let mut h = history();
    h.op(
        "executor-2",
        F::Acquire,
        11,
        Some((26, Type::Ok)),
        Value {
            key: Some(key()),
            session: Some(id(S2)),
            owner: Some("executor-2".into()),
            ..Value::default()
        },
        Value {
            key: Some(key()),
            token: Some(11),
            session: Some(id(S2)),
            owner: Some("executor-2".into()),
            acquired_at: Some(srv(11)),
            expires_at: Some(srv(1_011)),
            status: Some(200),
            ..Value::default()
        },
    );
    let v = check(&h.done(), &state());
    assert!(v.check("grants").is_some_and(|c| c.passed), "{}", v.table(5));
}
