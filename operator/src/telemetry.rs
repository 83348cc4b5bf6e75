//! Logging for the operator: JSON lines through `dlock_common::telemetry` (text with
//! `DLOCK_LOG_FORMAT=text`), level from `RUST_LOG`. Log events carry their name in `event`.

pub const SERVICE: &str = "dlock-operator";

pub fn init() {
    dlock_common::telemetry::init(SERVICE);
}
