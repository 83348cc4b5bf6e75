//! Structured logs. JSON lines unless `DLOCK_LOG_FORMAT=text`; level from `RUST_LOG` (default info).
//! Contract log events (`fenced_out`, `lease_expired`, ...) carry their name in the `event` field.

use tracing_subscriber::EnvFilter;

pub fn init(service: &'static str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let text = std::env::var("DLOCK_LOG_FORMAT").is_ok_and(|v| v.eq_ignore_ascii_case("text"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    // try_init: tests may initialise more than once in one process.
    let _ = if text {
        builder.with_target(false).try_init()
    } else {
        builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .try_init()
    };
    tracing::info!(
        event = "service_starting",
        service,
        version = env!("CARGO_PKG_VERSION")
    );
}
