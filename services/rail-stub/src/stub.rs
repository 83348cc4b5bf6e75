//! The running stub: the ledger behind a mutex, its counters, and pauses that end at shutdown.

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use chrono::Utc;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, Mode};
use crate::ledger::{Behaviour, Decision, Ledger, Payment, PaymentRequest, Receipt, ReceivedReport};
use crate::metrics::Metrics;

#[derive(Debug)]
pub struct Stub {
    ledger: Mutex<Ledger>,
    metrics: Metrics,
    pub test_mode: bool,
    pub timeout_hang: Duration,
    shutdown: CancellationToken,
}

impl Stub {
    pub fn new(config: &Config, metrics: Metrics, shutdown: CancellationToken) -> Self {
        Self {
            ledger: Mutex::new(Ledger::new(Behaviour {
                mode: config.mode,
                latency_ms: config.latency_ms,
            })),
            metrics,
            test_mode: config.test_mode,
            timeout_hang: config.timeout_hang(),
            shutdown,
        }
    }

    /// The ledger is plain data; a panic elsewhere cannot leave it half-updated in a way that
    /// matters more than losing the stub, so a poisoned lock is simply taken over.
    fn ledger(&self) -> MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn receive(&self, req: PaymentRequest, outcome: Option<Mode>, latency_ms: Option<u64>) -> Receipt {
        let receipt = self.ledger().receive(req, outcome, latency_ms, Utc::now());
        self.metrics.received.inc();
        if let Decision::First { payment, answer } = &receipt.decision {
            if answer != &Mode::Reject {
                self.metrics.paid.inc();
            }
            tracing::info!(
                event = "rail_payment_decided",
                idempotency_key = %payment.idempotency_key,
                payout_id = %payment.payout_id,
                account_id = %payment.account_id,
                amount_minor = payment.amount_minor,
                answer = ?answer,
                "first request for this idempotency key"
            );
        }
        receipt
    }

    pub fn payment(&self, idempotency_key: &str) -> Option<Payment> {
        self.ledger().payment(idempotency_key)
    }

    pub fn report(&self) -> ReceivedReport {
        self.ledger().report()
    }

    pub fn behaviour(&self) -> Behaviour {
        self.ledger().behaviour()
    }

    pub fn set_behaviour(&self, behaviour: Behaviour) {
        self.ledger().set_behaviour(behaviour);
        tracing::warn!(
            event = "rail_stub_behaviour_changed",
            mode = ?behaviour.mode,
            latency_ms = behaviour.latency_ms,
            "default behaviour changed at run time"
        );
    }

    /// Sleeps for `duration` or until shutdown, whichever is first, so that a hung TIMEOUT answer
    /// never holds graceful shutdown hostage.
    pub async fn pause(&self, duration: Duration) {
        if duration.is_zero() {
            return;
        }
        tokio::select! {
            _ = tokio::time::sleep(duration) => {}
            _ = self.shutdown.cancelled() => {}
        }
    }
}
