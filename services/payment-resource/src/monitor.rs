//! The checks payment-resource runs on its own, on an interval, so that what must stay zero can be
//! alerted on (docs/operations.md, "Alerts"): the reconciliation of docs/accounting.md — every
//! ledger invariant and the rail comparison, over one snapshot — and the count and age of the
//! payouts that are not terminal yet. Results go to the metrics ([`crate::metrics`]) and, for a run
//! that found breaks or failed, to the log; nothing is written to paydb.
//!
//! Why here and not in a CronJob: the service already holds a pool on paydb and serves `/metrics`,
//! which the chart's PodMonitor scrapes; a Job would need a Pushgateway (or a second scrape target
//! that outlives it) to export a count, and its absence is harder to tell from a clean ledger. Every
//! replica runs the checks (reads only, bounded by reconciliation's keyset pages), so the numbers
//! survive a replica's loss; alerts take the maximum over replicas.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::PgPool;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::Schedule;
use crate::metrics::Metrics;
use crate::reconcile::{self, Options, Report};
use crate::repo;

/// The running checks; [`Monitor::stop`] ends them.
#[derive(Debug)]
pub struct Monitor {
    stop: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
}

impl Monitor {
    /// Starts each scheduled check: a first run at once, then one per interval.
    pub fn start(pool: PgPool, metrics: Arc<Metrics>, schedule: Schedule) -> Monitor {
        let stop = CancellationToken::new();
        let mut tasks = Vec::new();
        if let Some(every) = schedule.reconcile_every {
            let options = Options {
                stuck_after_seconds: schedule.stuck_after_seconds,
                ..Options::default()
            };
            let (pool, metrics) = (pool.clone(), metrics.clone());
            tasks.push(tokio::spawn(repeat(every, stop.clone(), move || {
                let (pool, metrics) = (pool.clone(), metrics.clone());
                async move {
                    let _ = reconcile_once(&pool, &metrics, &options).await;
                }
            })));
        }
        if let Some(every) = schedule.payout_stats_every {
            tasks.push(tokio::spawn(repeat(every, stop.clone(), move || {
                let (pool, metrics) = (pool.clone(), metrics.clone());
                async move {
                    let _ = payout_stats_once(&pool, &metrics).await;
                }
            })));
        }
        Monitor { stop, tasks }
    }

    /// Stops the checks; a run in progress is dropped (it only reads).
    pub async fn stop(self) {
        self.stop.cancel();
        for t in self.tasks {
            let _ = t.await;
        }
    }
}

/// Runs `check` now and then every `every` until `stop`. A run that outlasts the interval delays
/// the next one; runs never overlap.
async fn repeat<F, Fut>(every: Duration, stop: CancellationToken, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    loop {
        tokio::select! {
            () = check() => {}
            () = stop.cancelled() => return,
        }
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            () = stop.cancelled() => return,
        }
    }
}

/// One reconciliation, recorded in the metrics (and logged when not clean or when it failed).
pub async fn reconcile_once(
    pool: &PgPool,
    metrics: &Metrics,
    options: &Options,
) -> Result<Report, sqlx::Error> {
    let started = Instant::now();
    match reconcile::run_with(pool, options).await {
        Ok(report) => {
            metrics.reconciled(&report);
            let took_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
            if report.clean {
                tracing::info!(
                    event = "reconciliation_clean",
                    accounts = report.accounts_checked,
                    payouts = report.payouts_checked,
                    took_ms,
                );
            } else {
                tracing::error!(
                    event = "reconciliation_breaks",
                    accounts = report.accounts_checked,
                    payouts = report.payouts_checked,
                    breaks = %serde_json::to_string(&report.break_counts).unwrap_or_default(),
                    took_ms,
                    "reconciliation found breaks: GET /v1/reconciliation lists them with the grants involved"
                );
            }
            Ok(report)
        }
        Err(e) => {
            metrics.reconcile_failed();
            tracing::warn!(event = "reconciliation_failed", error = %e);
            Err(e)
        }
    }
}

/// One count of the payouts that are not terminal, per state, into the metrics.
pub async fn payout_stats_once(pool: &PgPool, metrics: &Metrics) -> Result<(), sqlx::Error> {
    match repo::payout::open_stats(pool).await {
        Ok(stats) => {
            metrics.payouts_open(&stats);
            Ok(())
        }
        Err(e) => {
            tracing::warn!(event = "payout_stats_failed", error = %e);
            Err(e)
        }
    }
}
