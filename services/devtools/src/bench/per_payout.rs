//! What a payout asks of each process: requests by process, route and status, read from the
//! services' own `http_request_duration_seconds_count` over the batch, and the statements each
//! database ran, by statement, from `pg_stat_statements` (preloaded in the bench's servers, reset
//! when the batch starts). Divided by the payouts of the batch, beside the CPU per payout, they say
//! where a payout's cost comes from.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use dlock_testkit::stack::Stack;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

use crate::stack::Database;

/// `-c` settings that load `pg_stat_statements` (top-level statements only: what the services send).
pub(super) const STATEMENT_SETTINGS: &[(&str, &str)] = &[
    ("shared_preload_libraries", "pg_stat_statements"),
    ("pg_stat_statements.track", "top"),
    ("pg_stat_statements.max", "1000"),
];

/// Requests by (process, "METHOD route", status).
#[derive(Debug, Default, Clone)]
pub(super) struct Requests(BTreeMap<(String, String, u16), f64>);

impl Requests {
    /// Each service's counts now (an executor is a client: it serves no API routes).
    pub(super) async fn scrape(stack: &Stack) -> Result<Self> {
        let mut r = Self::default();
        let mut services = vec![
            ("payment-resource", stack.payment.url()),
            ("rail-proxy", stack.rail_proxy.url()),
        ];
        if let Some(l) = &stack.lock_server {
            services.push(("lock-server", l.url()));
        }
        for (process, url) in services {
            let text = stack
                .metrics(&url)
                .await
                .with_context(|| format!("{process}'s metrics"))?;
            r.add(process, &text);
        }
        Ok(r)
    }

    /// Adds the `http_request_duration_seconds_count` series of one process's metrics text.
    fn add(&mut self, process: &str, text: &str) {
        const NAME: &str = "http_request_duration_seconds_count{";
        for line in text.lines() {
            let Some(rest) = line.strip_prefix(NAME) else {
                continue;
            };
            let Some((labels, value)) = rest.rsplit_once("} ") else {
                continue;
            };
            let Ok(value) = value.trim().parse::<f64>() else {
                continue;
            };
            let label = |name: &str| {
                labels
                    .split(&format!("{name}=\""))
                    .nth(1)
                    .and_then(|r| r.split('"').next())
                    .unwrap_or("")
                    .to_owned()
            };
            if label("route") == "/metrics" {
                continue; // the bench's own scrapes
            }
            let key = (
                process.to_owned(),
                format!("{} {}", label("method"), label("route")),
                label("status").parse().unwrap_or(0),
            );
            *self.0.entry(key).or_default() += value;
        }
    }

    /// What was counted after `before`.
    pub(super) fn since(&self, before: &Self) -> Self {
        Self(
            self.0
                .iter()
                .map(|(k, v)| (k.clone(), v - before.0.get(k).copied().unwrap_or(0.0)))
                .filter(|(_, v)| *v > 0.0)
                .collect(),
        )
    }

    /// Prints requests per payout by process, route and status, and each process's total.
    pub(super) fn print(&self, payouts: u32) {
        let per = |v: f64| v / f64::from(payouts);
        let mut process = "";
        for ((p, route, status), v) in &self.0 {
            if p != process {
                process = p;
                let total: f64 = self
                    .0
                    .iter()
                    .filter(|((q, _, _), _)| q == p)
                    .map(|(_, v)| v)
                    .sum();
                println!("  {p}: {:.2} requests per payout", per(total));
            }
            println!("    {:>7.2}  {route} → {status}", per(*v));
        }
    }
}

/// What one database ran over the batch: (calls, ms of execution, the statement on one line), most
/// called first.
#[derive(Debug, Clone)]
pub(super) struct Ran {
    database: &'static str,
    rows: Vec<(i64, f64, String)>,
}

impl Ran {
    /// Prints statements per payout (the `top` most called, each cut to `width` characters).
    pub(super) fn print(&self, payouts: u32, top: usize, width: usize) {
        let per = |v: f64| v / f64::from(payouts);
        let calls: i64 = self.rows.iter().map(|r| r.0).sum();
        let ms: f64 = self.rows.iter().map(|r| r.1).sum();
        println!(
            "  {}: {:.2} statements per payout, {:.3} ms of execution per payout",
            self.database,
            per(calls as f64),
            per(ms)
        );
        for (c, t, q) in self.rows.iter().take(top) {
            let q: String = q.chars().take(width).collect();
            println!("    {:>7.2}  {:>7.3} ms  {q}", per(*c as f64), per(*t));
        }
    }
}

/// One database's statements over the batch.
pub(super) struct Statements {
    name: &'static str,
    pool: PgPool,
}

impl Statements {
    /// Creates the extension in the history's database (as the superuser) and forgets what ran
    /// before (migrations, seed, payouts created for the batch).
    pub(super) async fn start(db: &Database) -> Result<Self> {
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .connect(&db.server.url("postgres", db.history.name()))
            .await?;
        sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            .execute(&pool)
            .await
            .context("pg_stat_statements (is it preloaded?)")?;
        let s = Self {
            name: db.history.name(),
            pool,
        };
        s.reset().await?;
        Ok(s)
    }

    pub(super) async fn reset(&self) -> Result<()> {
        sqlx::query("SELECT pg_stat_statements_reset()")
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Statements run in this database by the services' roles since the reset: (calls, ms of
    /// execution, the statement on one line), most called first.
    pub(super) async fn read(&self) -> Result<Ran> {
        let rows: Vec<(i64, f64, String)> = sqlx::query_as(
            "SELECT s.calls, s.total_exec_time, regexp_replace(s.query, '\\s+', ' ', 'g')
               FROM pg_stat_statements s
               JOIN pg_roles r ON r.oid = s.userid
              WHERE s.dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
                AND NOT r.rolsuper
              ORDER BY s.calls DESC",
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(Ran {
            database: self.name,
            rows,
        })
    }

    pub(super) async fn close(self) {
        self.pool.close().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_read_by_route_and_status_and_the_scrapes_left_out() {
        let text = "\
# TYPE http_request_duration_seconds histogram
http_request_duration_seconds_sum{method=\"POST\",route=\"/v1/locks/{key}/acquire\",status=\"200\"} 1.5
http_request_duration_seconds_count{method=\"POST\",route=\"/v1/locks/{key}/acquire\",status=\"200\"} 40
http_request_duration_seconds_count{method=\"POST\",route=\"/v1/locks/{key}/acquire\",status=\"409\"} 7
http_request_duration_seconds_count{method=\"GET\",route=\"/metrics\",status=\"200\"} 3
";
        let mut before = Requests::default();
        before.add("lock-server", text);
        let mut after = Requests::default();
        after.add("lock-server", &text.replace("} 40", "} 100"));
        let d = after.since(&before);
        let acquire = |status| {
            d.0.get(&(
                "lock-server".to_owned(),
                "POST /v1/locks/{key}/acquire".to_owned(),
                status,
            ))
            .copied()
        };
        assert_eq!(acquire(200), Some(60.0));
        assert_eq!(acquire(409), None, "unchanged: not counted");
        assert_eq!(d.0.len(), 1, "{:?}", d.0);
        assert!(before.0.keys().all(|(_, r, _)| !r.contains("/metrics")));
    }
}
