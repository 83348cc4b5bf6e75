//! Step 2 of both reconcilers: where the migration Job stands, and which schema version it applied
//! (read from the last line `dlock-migrate` prints, `{"applied":[...],"current_version":N}`).

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, LogParams};

use crate::error::Result;
use crate::health::JobState;

pub async fn observe(client: &kube::Client, namespace: &str, job_name: &str) -> Result<JobState> {
    let jobs: Api<Job> = Api::namespaced(client.clone(), namespace);
    Ok(JobState::of(jobs.get_opt(job_name).await?.as_ref()))
}

/// The `current_version` the Job's succeeded pod reported, if its log is still there. Best effort:
/// the version is informational, so failures are logged and yield `None`.
pub async fn applied_version(client: &kube::Client, namespace: &str, job_name: &str) -> Option<i64> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let selector = format!("batch.kubernetes.io/job-name={job_name}");
    let list = match pods.list(&ListParams::default().labels(&selector)).await {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(event = "migration_version_unknown", job = job_name, error = %e);
            return None;
        }
    };
    let pod = list
        .items
        .iter()
        .find(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Succeeded"))?;
    let name = pod.metadata.name.as_deref()?;
    let params = LogParams {
        tail_lines: Some(50),
        ..LogParams::default()
    };
    match pods.logs(name, &params).await {
        Ok(log) => parse_report_version(&log),
        Err(e) => {
            tracing::warn!(event = "migration_version_unknown", job = job_name, error = %e);
            None
        }
    }
}

/// The `current_version` of the last report line in a `dlock-migrate` log (stdout and stderr mixed).
pub fn parse_report_version(log: &str) -> Option<i64> {
    log.lines().rev().find_map(|line| {
        let v: serde_json::Value = serde_json::from_str(line.trim()).ok()?;
        v.get("applied")?;
        v.get("current_version")?.as_i64()
    })
}

#[cfg(test)]
mod tests {
    use super::parse_report_version;

    #[test]
    fn reads_the_last_report_line() {
        let log = r#"{"timestamp":"2025-01-01T00:00:00Z","level":"INFO","event":"service_starting"}
{"applied":["V1__create.sql","V2__grants.sql"],"current_version":2}
"#;
        assert_eq!(parse_report_version(log), Some(2));
        assert_eq!(
            parse_report_version(r#"{"applied":[],"current_version":5}"#),
            Some(5)
        );
        assert_eq!(
            parse_report_version(r#"{"applied":[],"current_version":null}"#),
            None
        );
        assert_eq!(parse_report_version("dlock-migrate: connection refused"), None);
        assert_eq!(
            parse_report_version(r#"{"current_version":9}"#),
            None,
            "not a report line"
        );
    }
}
