//! The parts of the rolling upgrade (step upgrade of `tests/kind.rs`): `helm upgrade` of the operator
//! to the upgrade image, the migration Jobs of a history, the upgrade image's own paydb migration
//! in the ledger, and a watch on the old version's pods that records every way one of them failed.

use std::collections::BTreeMap;
use std::time::Duration;

use dlock_operator::builders::postgres::{History, migration_component};
use dlock_operator::builders::{LABEL_COMPONENT, LABEL_INSTANCE, LABEL_MANAGED_BY, MANAGED_BY};
use futures::{StreamExt, pin_mut};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Api;
use kube::api::ListParams;
use kube::runtime::{WatchStreamExt, watcher};
use sqlx::PgPool;
use tokio::process::Command;
use tokio::sync::watch;

use super::{KindEnv, log};

/// The upgrade image's extra paydb migration is found by the file name it was built from
/// (`e2e/kind/upgrade/`; `e2e/kind/build-image.sh --paydb-migration` makes it `V<n>__` + this).
pub const FIXTURE_SCRIPT: &str = "kind_upgrade_payout_note.sql";

/// The upgrade as docs/operations.md tells it: the chart's CRDs applied first (`helm upgrade`
/// never updates `crds/`), then `helm upgrade` of the operator's release to `image` (repository
/// and tag), the values given at install kept on the new chart's defaults
/// (`--reset-then-reuse-values`), `--wait`: returns once the operator's Deployment has rolled out.
pub async fn helm_upgrade(env: &KindEnv, image: &str) {
    let (repository, tag) = image
        .rsplit_once(':')
        .unwrap_or_else(|| panic!("image {image} has no tag"));
    let kubectl = crate::env::tool("kubectl").expect("kubectl on PATH or in the tools dir");
    let out = Command::new(kubectl)
        .arg("--kubeconfig")
        .arg(&env.kubeconfig)
        .args(["apply", "--server-side", "--force-conflicts", "-f"])
        .arg(env.chart.join("crds"))
        .output()
        .await
        .unwrap_or_else(|e| panic!("start kubectl apply of the CRDs: {e}"));
    assert!(
        out.status.success(),
        "kubectl apply --server-side of the chart's CRDs failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let helm = crate::env::tool("helm").expect("helm on PATH or in the tools dir");
    let out = Command::new(helm)
        .arg("--kubeconfig")
        .arg(&env.kubeconfig)
        .args(["upgrade", &env.release])
        .arg(&env.chart)
        .args(["--namespace", &env.op_ns, "--reset-then-reuse-values"])
        .args(["--set", &format!("image.repository={repository}")])
        .args(["--set", &format!("image.tag={tag}")])
        .args(["--wait", "--timeout", &format!("{}s", env.timeout.as_secs())])
        .output()
        .await
        .unwrap_or_else(|e| panic!("start helm upgrade: {e}"));
    assert!(
        out.status.success(),
        "helm upgrade {} to {image} failed: {}",
        env.release,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The first container's image of a pod (every dlock pod has one container).
pub fn pod_image(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref()?.containers.first()?.image.as_deref()
}

/// The migration Job of `history` for the owner `instance` that runs `image`, once it exists.
pub async fn migration_job(jobs: &Api<Job>, instance: &str, history: History, image: &str) -> Option<Job> {
    let lp = ListParams::default().labels(&format!(
        "{LABEL_INSTANCE}={instance},{LABEL_COMPONENT}={},{LABEL_MANAGED_BY}={MANAGED_BY}",
        migration_component(history)
    ));
    let list = jobs.list(&lp).await.ok()?;
    list.items.into_iter().find(|j| {
        j.spec
            .as_ref()
            .and_then(|s| s.template.spec.as_ref()?.containers.first()?.image.as_deref())
            == Some(image)
    })
}

/// When a Job succeeded (`status.completionTime`), if it did.
pub fn completed_at(job: &Job) -> Option<Time> {
    let status = job.status.as_ref()?;
    (status.succeeded.unwrap_or(0) > 0)
        .then(|| status.completion_time.clone())
        .flatten()
}

/// The fixture migration's row in paydb's history: `(script, success)`, if it was applied.
pub async fn fixture_applied(db: &PgPool) -> Result<Option<(String, bool)>, String> {
    sqlx::query_as("SELECT script, success FROM flyway_schema_history WHERE script LIKE '%\\_\\_' || $1")
        .bind(FIXTURE_SCRIPT)
        .fetch_optional(db)
        .await
        .map_err(|e| format!("read paydb's flyway_schema_history: {e}"))
}

/// How many payouts of `run` were posted (their ledger legs written) after the fixture migration
/// was installed: postings made on the new schema.
pub async fn posted_after_fixture(db: &PgPool, run: &str) -> Result<i64, String> {
    sqlx::query_scalar(
        "SELECT count(*) FROM payout p
          WHERE p.idempotency_key LIKE $1 AND p.state = 'POSTED'
            AND EXISTS (SELECT 1 FROM ledger_entry l
                         WHERE l.payout_id = p.payout_id
                           AND l.created_at > (SELECT installed_on FROM flyway_schema_history
                                                WHERE script LIKE '%\\_\\_' || $2))",
    )
    .bind(format!("{run}-%"))
    .bind(FIXTURE_SCRIPT)
    .fetch_one(db)
    .await
    .map_err(|e| format!("count the payouts of {run} posted after the fixture migration: {e}"))
}

/// `claimed_by` of every POSTED payout of `run`: the executor worker that posted it
/// (`<pod name>-<pid>-w<n>`).
pub async fn posted_by(db: &PgPool, run: &str) -> Result<Vec<String>, String> {
    sqlx::query_scalar(
        "SELECT claimed_by FROM payout WHERE idempotency_key LIKE $1 AND state = 'POSTED' AND claimed_by IS NOT NULL",
    )
    .bind(format!("{run}-%"))
    .fetch_all(db)
    .await
    .map_err(|e| format!("read who posted the payouts of {run}: {e}"))
}

/// What the watch saw of one old-version pod.
#[derive(Debug, Default)]
struct Seen {
    restarts: BTreeMap<String, i32>,
    ready: bool,
}

/// Watches the operator's pods in `pods` until `stop` turns true and returns every failure of a pod
/// running `old_image`: a container restarted, a container ended with a non-zero exit code, or the
/// pod lost Ready — each while the pod was not being deleted (a rolling update ending a pod is not
/// a failure). Pods of other images are not looked at.
pub async fn watch_old_pods(
    pods: Api<Pod>,
    old_image: String,
    mut stop: watch::Receiver<bool>,
) -> Vec<String> {
    let config = watcher::Config::default().labels(&format!("{LABEL_MANAGED_BY}={MANAGED_BY}"));
    let stream = watcher(pods, config).default_backoff().applied_objects();
    pin_mut!(stream);
    let mut seen: BTreeMap<String, Seen> = BTreeMap::new();
    let mut failures = Vec::new();
    loop {
        let pod = tokio::select! {
            _ = stop.wait_for(|stopped| *stopped) => break,
            next = stream.next() => match next {
                Some(Ok(pod)) => pod,
                Some(Err(e)) => {
                    log(format!("watch of the old version's pods: {e} (it resumes)"));
                    continue;
                }
                None => break,
            },
        };
        if pod_image(&pod) != Some(old_image.as_str()) {
            continue;
        }
        let name = pod.metadata.name.clone().unwrap_or_default();
        let deleting = pod.metadata.deletion_timestamp.is_some();
        let Some(status) = pod.status.as_ref() else {
            continue;
        };
        let entry = seen.entry(name.clone()).or_default();
        for c in status.container_statuses.iter().flatten() {
            let before = *entry.restarts.entry(c.name.clone()).or_insert(c.restart_count);
            if c.restart_count > before {
                failures.push(format!("pod {name}: container {} restarted", c.name));
                entry.restarts.insert(c.name.clone(), c.restart_count);
            }
            let exit = c
                .state
                .as_ref()
                .and_then(|s| s.terminated.as_ref())
                .map(|t| t.exit_code);
            if let Some(code) = exit.filter(|code| *code != 0 && !deleting) {
                failures.push(format!("pod {name}: container {} exited with {code}", c.name));
            }
        }
        let ready = status
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        if entry.ready && !ready && !deleting && status.phase.as_deref() == Some("Running") {
            failures.push(format!("pod {name} lost Ready"));
        }
        entry.ready = ready;
    }
    log(format!(
        "watched {} pods of the old version ({old_image}) through the upgrade",
        seen.len()
    ));
    failures.sort();
    failures.dedup();
    failures
}

/// Seconds between two API timestamps (`b - a`).
pub fn seconds_between(a: &Time, b: &Time) -> i64 {
    b.0.as_second() - a.0.as_second()
}

/// A pause that paces a load generator (never used to wait for a condition).
pub const LOAD_PACE: Duration = Duration::from_millis(300);
