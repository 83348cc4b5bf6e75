//! The stub's counters. `rail_stub_payments_paid_total` minus the number of distinct payouts is the
//! number of double payments, which must be zero.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, Default)]
pub struct Metrics {
    /// Every well-formed payment request, repeats included.
    pub received: Counter,
    /// Every payment that moved money (ACK, or TIMEOUT: paid but unanswered).
    pub paid: Counter,
}

impl Metrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "rail_stub_payments_received",
            "Payment requests the rail stub received (repeats included)",
            m.received.clone(),
        );
        registry.register(
            "rail_stub_payments_paid",
            "Payments the rail stub actually made (first request per idempotency key, ACK or TIMEOUT)",
            m.paid.clone(),
        );
        m
    }
}
