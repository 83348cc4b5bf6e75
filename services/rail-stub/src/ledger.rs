//! The stub's memory: which idempotency keys it has paid, every request it received, and the
//! current default behaviour. Pure and synchronous; the HTTP layer holds it behind a mutex and never
//! awaits while holding it.

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use crate::config::Mode;

/// A validated `POST /v1/payments` body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PaymentRequest {
    pub idempotency_key: String,
    pub payout_id: Uuid,
    pub account_id: Uuid,
    pub amount_minor: i64,
    pub currency: String,
}

/// The bodies the stub answers with, defined once in the wire crate.
pub use dlock_wire::stub::{KeyCount, Payment, PaymentStatus, PayoutCount, Received, ReceivedReport};

fn same_payment(first: &Payment, req: &PaymentRequest) -> bool {
    first.payout_id == req.payout_id
        && first.account_id == req.account_id
        && first.amount_minor == req.amount_minor
        && first.currency == req.currency
}

/// The default behaviour, changeable at run time in test mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Behaviour {
    pub mode: Mode,
    pub latency_ms: u64,
}

/// How one request was handled.
#[derive(Debug, Clone)]
pub enum Decision {
    /// The first request for its key: `answer` says how to reply (TIMEOUT hangs, yet it paid).
    First { payment: Payment, answer: Mode },
    /// A repeat with the same payment: the recorded outcome again, nothing paid.
    Replay(Payment),
    /// The key was first used for a different payment: refused, nothing paid.
    Conflict(Payment),
}

#[derive(Debug, Clone)]
pub struct Receipt {
    pub decision: Decision,
    pub latency_ms: u64,
}

#[derive(Debug)]
pub struct Ledger {
    behaviour: Behaviour,
    payments: HashMap<String, Payment>,
    requests: Vec<Received>,
    per_key: BTreeMap<String, KeyCount>,
    next_reference: u64,
}

impl Ledger {
    pub fn new(behaviour: Behaviour) -> Self {
        Self {
            behaviour,
            payments: HashMap::new(),
            requests: Vec::new(),
            per_key: BTreeMap::new(),
            next_reference: 1,
        }
    }

    pub fn behaviour(&self) -> Behaviour {
        self.behaviour
    }

    pub fn set_behaviour(&mut self, behaviour: Behaviour) {
        self.behaviour = behaviour;
    }

    /// Records the request and decides its outcome. Overrides come from test-mode headers.
    pub fn receive(
        &mut self,
        req: PaymentRequest,
        outcome: Option<Mode>,
        latency_ms: Option<u64>,
        now: DateTime<Utc>,
    ) -> Receipt {
        let latency_ms = latency_ms.unwrap_or(self.behaviour.latency_ms);
        let seq = self.requests.len() as u64 + 1;
        self.requests.push(Received {
            seq,
            idempotency_key: req.idempotency_key.clone(),
            payout_id: req.payout_id,
            account_id: req.account_id,
            amount_minor: req.amount_minor,
            presented_at: now,
        });
        let count = self
            .per_key
            .entry(req.idempotency_key.clone())
            .or_insert_with(|| KeyCount {
                payout_id: req.payout_id,
                ..KeyCount::default()
            });
        count.received += 1;

        if let Some(existing) = self.payments.get(&req.idempotency_key) {
            let decision = if same_payment(existing, &req) {
                Decision::Replay(existing.clone())
            } else {
                Decision::Conflict(existing.clone())
            };
            return Receipt { decision, latency_ms };
        }

        let answer = outcome.unwrap_or(self.behaviour.mode);
        let (status, rail_reference, reason) = match answer {
            Mode::Ack | Mode::Timeout => {
                let reference = format!("rs-{:08}", self.next_reference);
                self.next_reference += 1;
                count.paid += 1;
                (PaymentStatus::Acked, Some(reference), None)
            }
            Mode::Reject => (
                PaymentStatus::Rejected,
                None,
                Some("rejected by the rail stub's configured behaviour".to_owned()),
            ),
        };
        let payment = Payment {
            idempotency_key: req.idempotency_key.clone(),
            payout_id: req.payout_id,
            account_id: req.account_id,
            amount_minor: req.amount_minor,
            currency: req.currency,
            status,
            rail_reference,
            reason,
            timed_out: answer == Mode::Timeout,
            received_at: now,
        };
        self.payments.insert(req.idempotency_key, payment.clone());
        Receipt {
            decision: Decision::First { payment, answer },
            latency_ms,
        }
    }

    pub fn payment(&self, idempotency_key: &str) -> Option<Payment> {
        self.payments.get(idempotency_key).cloned()
    }

    pub fn report(&self) -> ReceivedReport {
        let mut per_payout: BTreeMap<Uuid, PayoutCount> = BTreeMap::new();
        for r in &self.requests {
            let p = per_payout.entry(r.payout_id).or_default();
            p.received += 1;
            if !p.keys.contains(&r.idempotency_key) {
                p.keys.push(r.idempotency_key.clone());
            }
        }
        for payment in self.payments.values() {
            if payment.status == PaymentStatus::Acked {
                per_payout.entry(payment.payout_id).or_default().paid += 1;
            }
        }
        let paid_twice = per_payout
            .iter()
            .filter(|(_, c)| c.paid > 1)
            .map(|(id, _)| *id)
            .collect();
        ReceivedReport {
            requests: self.requests.clone(),
            per_key: self.per_key.clone(),
            per_payout,
            paid_twice,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(key: &str, payout: Uuid) -> PaymentRequest {
        PaymentRequest {
            idempotency_key: key.to_owned(),
            payout_id: payout,
            account_id: Uuid::nil(),
            amount_minor: 500,
            currency: "EUR".to_owned(),
        }
    }

    fn ledger(mode: Mode) -> Ledger {
        Ledger::new(Behaviour { mode, latency_ms: 0 })
    }

    #[test]
    fn first_request_decides_and_repeats_do_not_pay() {
        let mut l = ledger(Mode::Ack);
        let p = Uuid::new_v4();
        let first = l.receive(req("k1", p), None, None, Utc::now());
        assert!(matches!(
            first.decision,
            Decision::First {
                answer: Mode::Ack,
                ..
            }
        ));
        // A repeat asking for a rejection still gets the recorded ACK and pays nothing.
        let again = l.receive(req("k1", p), Some(Mode::Reject), None, Utc::now());
        match again.decision {
            Decision::Replay(payment) => assert_eq!(payment.status, PaymentStatus::Acked),
            other => panic!("expected a replay, got {other:?}"),
        }
        let report = l.report();
        assert_eq!(report.requests.len(), 2);
        assert_eq!(report.per_key["k1"].received, 2);
        assert_eq!(report.per_key["k1"].paid, 1);
        assert!(report.paid_twice.is_empty());
    }

    #[test]
    fn timeout_pays_and_reject_does_not() {
        let mut l = ledger(Mode::Timeout);
        let r = l.receive(req("t", Uuid::new_v4()), None, None, Utc::now());
        assert!(matches!(
            r.decision,
            Decision::First {
                answer: Mode::Timeout,
                ..
            }
        ));
        let paid = l.payment("t").map(|p| (p.status, p.timed_out));
        assert_eq!(paid, Some((PaymentStatus::Acked, true)));
        l.receive(req("r", Uuid::new_v4()), Some(Mode::Reject), None, Utc::now());
        assert_eq!(l.report().per_key["r"].paid, 0);
        assert_eq!(l.report().per_key["t"].paid, 1);
    }

    #[test]
    fn same_payout_under_two_keys_is_paid_twice() {
        let mut l = ledger(Mode::Ack);
        let p = Uuid::new_v4();
        l.receive(req("a", p), None, None, Utc::now());
        l.receive(req("b", p), None, None, Utc::now());
        let report = l.report();
        assert_eq!(report.paid_twice, vec![p]);
        assert_eq!(report.per_payout[&p].keys, vec!["a".to_owned(), "b".to_owned()]);
    }

    #[test]
    fn reused_key_for_another_payment_is_a_conflict_and_pays_nothing() {
        let mut l = ledger(Mode::Ack);
        l.receive(req("k", Uuid::new_v4()), None, None, Utc::now());
        let other = l.receive(req("k", Uuid::new_v4()), None, None, Utc::now());
        assert!(matches!(other.decision, Decision::Conflict(_)));
        assert_eq!(l.report().per_key["k"].paid, 1);
        assert_eq!(l.report().per_key["k"].received, 2);
    }
}
