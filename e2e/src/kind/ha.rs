//! The parts of the kind tier's HA step (`tests/kind.rs`, step `ha`): CloudNativePG Clusters as the
//! step drives them, payouts created at a steady pace while the databases fail over, and the checks
//! on the record.
//!
//! - [`Cnpg`]: a Cluster's primary and standby, a planned switchover made as `kubectl cnpg promote`
//!   makes one (the Cluster's `status.targetPrimary`), psql in a database pod as a DBA runs it
//!   (`kubectl exec`, peer authentication), and a standby held behind its primary for the negative
//!   control.
//! - [`Producer`]: payouts created one after another through payment-resource until stopped.
//! - [`fences_across`], [`tokens_increase`], [`longest_pause`]: the checks, pure, with their unit
//!   tests below.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::{KindEnv, Payments, poll};
use crate::kubectl::Kubectl;

/// CloudNativePG's phase while a requested switchover is under way (what `kubectl cnpg promote`
/// writes; the operator reads the same constant to tell a switchover from a failover).
pub use dlock_operator::builders::cnpg::PHASE_SWITCHOVER;

/// The Clusters of one namespace, as the step reads and drives them.
#[derive(Clone)]
pub struct Cnpg {
    api: Api<DynamicObject>,
    kubectl: Kubectl,
    ns: String,
}

impl Cnpg {
    pub fn new(env: &KindEnv, client: &Client) -> Self {
        let gvk = GroupVersionKind::gvk("postgresql.cnpg.io", "v1", "Cluster");
        let ar = ApiResource::from_gvk_with_plural(&gvk, "clusters");
        Cnpg {
            api: Api::namespaced_with(client.clone(), &env.ns, &ar),
            kubectl: Kubectl::new(&env.kubeconfig),
            ns: env.ns.clone(),
        }
    }

    /// The Cluster's `status`, as CloudNativePG wrote it.
    pub async fn status(&self, cluster: &str) -> Value {
        let obj = self
            .api
            .get(cluster)
            .await
            .unwrap_or_else(|e| panic!("get Cluster {cluster}: {e}"));
        obj.data.get("status").cloned().unwrap_or(Value::Null)
    }

    /// `status.currentPrimary`.
    pub async fn primary(&self, cluster: &str) -> String {
        let status = self.status(cluster).await;
        status["currentPrimary"]
            .as_str()
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| panic!("Cluster {cluster} names no primary: {status}"))
            .to_owned()
    }

    /// An instance other than the primary (the step's Clusters have two).
    pub async fn standby(&self, cluster: &str) -> String {
        let status = self.status(cluster).await;
        let primary = status["currentPrimary"].as_str().unwrap_or_default();
        status["instanceNames"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .find(|n| *n != primary)
            .unwrap_or_else(|| panic!("Cluster {cluster} has no standby: {status}"))
            .to_owned()
    }

    /// A planned switchover to `to`, requested as `kubectl cnpg promote CLUSTER TO` requests it:
    /// the Cluster's status names the new target primary and the switchover phase, and
    /// CloudNativePG shuts the primary down cleanly and promotes `to`.
    pub async fn switchover(&self, cluster: &str, to: &str) {
        let patch = json!({"status": {
            "targetPrimary": to,
            "targetPrimaryTimestamp": Utc::now().format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string(),
            "phase": PHASE_SWITCHOVER,
            "phaseReason": format!("Switching over to {to}"),
        }});
        self.api
            .patch_status(cluster, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap_or_else(|e| panic!("request a switchover of {cluster} to {to}: {e}"));
    }

    /// One statement in database `db` of pod `pod`, through psql in its `postgres` container (peer
    /// authentication as the postgres role, the socket CloudNativePG's PGHOST names): its unaligned
    /// output.
    pub async fn psql(&self, pod: &str, db: &str, sql: &str) -> Result<String, String> {
        let out = self
            .kubectl
            .run(&[
                "-n",
                &self.ns,
                "exec",
                pod,
                "-c",
                "postgres",
                "--",
                "psql",
                "-X",
                "-v",
                "ON_ERROR_STOP=1",
                "-U",
                "postgres",
                "-d",
                db,
                "-Atc",
                sql,
            ])
            .await;
        if out.success {
            Ok(out.stdout.trim().to_owned())
        } else {
            Err(format!(
                "psql in {pod}: {} {}",
                out.stderr.trim(),
                out.stdout.trim()
            ))
        }
    }

    /// Holds the standby of `cluster` behind its primary, as a standby on an asynchronous link with
    /// lag is behind when the primary dies: the replication role may no longer log in, and the
    /// WAL sender is ended. The standby keeps trying to reconnect and is refused; the primary,
    /// with no synchronous standby to wait for, goes on committing alone. Returns once the primary
    /// has no WAL sender left. (CloudNativePG gives the role its login back when an instance starts
    /// as primary, so the promoted standby lets the old primary rejoin.)
    pub async fn hold_standby_behind(&self, cluster: &str, db: &str) {
        let primary = self.primary(cluster).await;
        self.psql(&primary, db, "ALTER ROLE streaming_replica NOLOGIN")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        poll(
            &format!("{primary} to have no WAL sender"),
            Duration::from_secs(60),
            async || {
                let n = self
                    .psql(
                        &primary,
                        db,
                        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_replication",
                    )
                    .await?;
                if n == "0" {
                    Ok(())
                } else {
                    Err(format!("{n} WAL senders ended, looking again"))
                }
            },
        )
        .await;
    }

    /// How far the standby's received WAL is behind the primary's, in bytes.
    pub async fn lag_bytes(&self, cluster: &str, db: &str) -> Result<i64, String> {
        let primary = self.primary(cluster).await;
        let standby = self.standby(cluster).await;
        let received = self
            .psql(&standby, db, "SELECT pg_last_wal_receive_lsn()")
            .await?;
        let lag = self
            .psql(
                &primary,
                db,
                &format!("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '{received}')::bigint"),
            )
            .await?;
        lag.parse().map_err(|e| format!("lag {lag:?} on {primary}: {e}"))
    }
}

/// Payouts `RUN-1`, `RUN-2`, … created one after another through payment-resource, one per
/// `pace`, until [`Producer::stop`]. A creation that meets a failover waits it out
/// ([`Payments::create_payout`] sends the same idempotent request again).
pub struct Producer {
    stop: watch::Sender<bool>,
    task: JoinHandle<u32>,
}

impl Producer {
    pub fn start(pay: Arc<Payments>, run: String, pace: Duration) -> Self {
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn(async move {
            let mut n = 0;
            while !*stopped.borrow() {
                n += 1;
                pay.create_payout(&format!("{run}-{n}"), 1 + n % 10, 100 + i64::from(n))
                    .await;
                // Stop at once when told, else after the pace.
                let _ = tokio::time::timeout(pace, stopped.changed()).await;
            }
            n
        });
        Producer { stop, task }
    }

    /// Stops creating and returns how many were created (a creation under way finishes first).
    pub async fn stop(self) -> u32 {
        let _ = self.stop.send(true);
        match self.task.await {
            Ok(n) => n,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => panic!("the payout producer: {e}"),
        }
    }
}

/// One account's accepted fence, as paydb's ledger records it (the customer's DEBIT leg of a
/// payout carries the token its holder presented).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fenced {
    pub account: String,
    pub at: DateTime<Utc>,
    pub fence: i64,
}

/// The DEBIT legs of `run`'s payouts, by account, oldest first.
pub async fn fences(pay: &Payments, run: &str) -> Result<Vec<Fenced>, String> {
    let rows: Vec<(String, DateTime<Utc>, i64)> = sqlx::query_as(
        "SELECT l.account_id::text, l.created_at, l.fence
           FROM ledger_entry l JOIN payout p USING (payout_id)
          WHERE p.idempotency_key LIKE $1 AND l.direction = 'DEBIT'
          ORDER BY l.account_id, l.created_at, l.fence",
    )
    .bind(format!("{run}-%"))
    .fetch_all(&pay.db)
    .await
    .map_err(|e| format!("read the fences of {run}: {e}"))?;
    Ok(rows
        .into_iter()
        .map(|(account, at, fence)| Fenced { account, at, fence })
        .collect())
}

/// A database event of the step: what happened, when (the test's clock; kind's nodes share the
/// host's), and when it was over for the lock holders (the first grant, or the first posting, on
/// the other side of it).
#[derive(Debug, Clone)]
pub struct Event {
    pub what: String,
    pub at: DateTime<Utc>,
    pub over: DateTime<Utc>,
}

/// The fences each account accepted strictly increase across every event: every fence accepted
/// before the event began is below every fence accepted after it was over (those in between may
/// be holders from before it finishing under their grants), and no account accepted one token
/// twice. `Err` names the account and the two fences.
pub fn fences_across(fenced: &[Fenced], events: &[Event]) -> Result<String, String> {
    let mut by_account: BTreeMap<&str, Vec<&Fenced>> = BTreeMap::new();
    for f in fenced {
        by_account.entry(&f.account).or_default().push(f);
    }
    for (account, legs) in &by_account {
        let mut seen = std::collections::BTreeSet::new();
        if let Some(twice) = legs.iter().find(|l| !seen.insert(l.fence)) {
            return Err(format!("account {account} accepted fence {} twice", twice.fence));
        }
        for e in events {
            let before = legs.iter().filter(|l| l.at < e.at).map(|l| l.fence).max();
            let after = legs.iter().filter(|l| l.at > e.over).map(|l| l.fence).min();
            if let (Some(b), Some(a)) = (before, after)
                && a <= b
            {
                return Err(format!(
                    "account {account}: fence {a} accepted after {} is not above fence {b} accepted before it",
                    e.what
                ));
            }
        }
    }
    Ok(format!(
        "{} fences on {} accounts, strictly increasing across {} events",
        fenced.len(),
        by_account.len(),
        events.len()
    ))
}

/// Every token above the one granted before it, in the order granted, `before` then `after` (the
/// grants on either side of a failover). `Err` names the first token that is not.
pub fn tokens_increase(before: &[i64], after: &[i64]) -> Result<(), String> {
    let all: Vec<i64> = before.iter().chain(after).copied().collect();
    match all.windows(2).position(|w| w[0] >= w[1]) {
        None => Ok(()),
        Some(i) => Err(format!(
            "token {} granted after {} (grant {} of {}; {} before the failover, {} after)",
            all[i + 1],
            all[i],
            i + 2,
            all.len(),
            before.len(),
            after.len()
        )),
    }
}

/// The longest time without a posting from `from` to `to`: between `from` and the first posting
/// after it, between two postings, or between the last one and `to`.
pub fn longest_pause(postings: &[DateTime<Utc>], from: DateTime<Utc>, to: DateTime<Utc>) -> Duration {
    let mut marks: Vec<DateTime<Utc>> = postings
        .iter()
        .copied()
        .filter(|t| *t > from && *t < to)
        .collect();
    marks.sort();
    marks.insert(0, from);
    marks.push(to);
    marks
        .windows(2)
        .map(|w| (w[1] - w[0]).to_std().unwrap_or_default())
        .max()
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + s, 0).expect("a time")
    }

    fn leg(account: &str, at: i64, fence: i64) -> Fenced {
        Fenced {
            account: account.into(),
            at: t(at),
            fence,
        }
    }

    fn event(at: i64, over: i64) -> Event {
        Event {
            what: "the kill".into(),
            at: t(at),
            over: t(over),
        }
    }

    #[test]
    fn fences_above_the_jump_after_a_failover_pass() {
        let legs = [
            leg("a", 1, 10),
            leg("a", 5, 12),
            leg("a", 20, 1 << 33),
            leg("b", 2, 11),
            leg("b", 21, (1 << 33) + 1),
        ];
        assert!(fences_across(&legs, &[event(10, 15)]).is_ok());
    }

    #[test]
    fn a_reused_token_after_a_failover_fails() {
        // The negative control's shape: the promoted standby hands out tokens again.
        let legs = [leg("a", 1, 10), leg("a", 5, 40), leg("a", 20, 12)];
        let e = fences_across(&legs, &[event(10, 15)]).expect_err("a fence below an earlier one");
        assert!(e.contains("fence 12"), "{e}");
    }

    #[test]
    fn a_holder_finishing_inside_the_event_is_not_compared() {
        // Granted before the kill, posted while it was on: neither before nor after.
        let legs = [leg("a", 1, 10), leg("a", 12, 11), leg("a", 20, 1 << 33)];
        assert!(fences_across(&legs, &[event(10, 15)]).is_ok());
    }

    #[test]
    fn a_token_accepted_twice_fails() {
        let legs = [leg("a", 1, 10), leg("a", 2, 10)];
        assert!(fences_across(&legs, &[]).is_err());
    }

    #[test]
    fn tokens_must_rise_in_grant_order() {
        assert!(tokens_increase(&[1, 2, 3], &[1 << 33]).is_ok());
        let e = tokens_increase(&[1, 2, 40], &[3]).expect_err("3 after 40");
        assert!(e.contains("token 3 granted after 40"), "{e}");
        assert!(tokens_increase(&[5], &[5]).is_err());
    }

    #[test]
    fn the_longest_pause_counts_from_the_event_to_the_end() {
        assert_eq!(
            longest_pause(&[t(2), t(9), t(10)], t(0), t(12)),
            Duration::from_secs(7)
        );
        assert_eq!(longest_pause(&[], t(0), t(5)), Duration::from_secs(5));
        assert_eq!(longest_pause(&[t(1)], t(0), t(9)), Duration::from_secs(8));
    }
}
