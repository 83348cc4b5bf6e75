//! The Jobs of the actions (`dlock-fastforward read|advance` of a restore, the periodic check's
//! `read`), and the one reader of what such a Job reports: its termination message, parsed into the
//! report type once the Job ended.

use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{Container, EnvVar, PodSpec, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;
use serde::de::DeserializeOwned;

use super::StackRef;
use crate::builders::postgres::{History, KEY_URL, mount_database_cas, names};
use crate::builders::{Owner, env, secret_env, short_hash};
use crate::crd::SecretKeyRef;
use crate::crd::actions::StackHighWater;

/// The binary (in the dlock image) that reads high-water marks and advances the sequence.
pub const FASTFORWARD_BINARY: &str = "dlock-fastforward";
/// Component label of the restore Jobs (orphans are found by it).
pub const RESTORE_COMPONENT: &str = "fencing-restore";
/// Component label of the periodic check Jobs.
pub const CHECK_COMPONENT: &str = "fencing-check";
/// Where the Jobs write their one-line JSON report: the container's termination message, which the
/// operator reads from the pod status (no log access, no database credentials in the operator).
pub const REPORT_PATH: &str = "/dev/termination-log";

/// Where a Job of a restore stands, with its report once it ended.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum JobRun {
    #[default]
    Absent,
    Running,
    /// Ended; `report` is the termination message (None if it could not be read).
    Succeeded(Option<String>),
    Failed(Option<String>),
}

/// Inputs of the restore Jobs' pod templates.
#[derive(Debug, Clone)]
pub struct RestoreJobs<'a> {
    pub owner: &'a Owner,
    pub image: &'a str,
    /// The lockdb owner-role URL (setval needs more than the app role's USAGE).
    pub lockdb_admin_url: &'a SecretKeyRef,
}

/// `<owner>-ff-<hash of id>-<suffix>`: deterministic, so a re-run after a crash finds the same Job.
pub fn restore_job_name(owner: &Owner, id: &str, suffix: &str) -> String {
    owner.child(&format!("ff-{}-{suffix}", short_hash(id.as_bytes())))
}

/// The read Job: `dlock-fastforward read`, one `--paydb NAME=ENV` per PaymentStack.
pub fn read_job(j: &RestoreJobs<'_>, name: String, component: &str, stacks: &[StackRef]) -> Job {
    let mut args = vec!["read".to_owned(), "--report".to_owned(), REPORT_PATH.to_owned()];
    let mut envs = vec![secret_env(
        "DATABASE_URL",
        &j.lockdb_admin_url.name,
        &j.lockdb_admin_url.key,
    )];
    for (i, s) in stacks.iter().enumerate() {
        let var = format!("PAYDB_URL_{i}");
        let paydb = names(
            &Owner {
                name: s.name.clone(),
                ..j.owner.clone()
            },
            History::Paydb,
        );
        envs.push(secret_env(&var, &paydb.connection_secret, KEY_URL));
        args.push("--paydb".into());
        args.push(format!("{}={var}", s.name));
    }
    job(j, name, component, args, envs)
}

/// The advance Job: `dlock-fastforward advance --at-least N` against lockdb.
pub fn advance_job(j: &RestoreJobs<'_>, name: String, at_least: i64) -> Job {
    let args = vec![
        "advance".to_owned(),
        "--at-least".to_owned(),
        at_least.to_string(),
        "--report".to_owned(),
        REPORT_PATH.to_owned(),
    ];
    let envs = vec![secret_env(
        "DATABASE_URL",
        &j.lockdb_admin_url.name,
        &j.lockdb_admin_url.key,
    )];
    job(j, name, RESTORE_COMPONENT, args, envs)
}

fn job(j: &RestoreJobs<'_>, name: String, component: &str, args: Vec<String>, mut envs: Vec<EnvVar>) -> Job {
    envs.push(env("RUST_LOG", "info"));
    let container = Container {
        name: "fastforward".into(),
        image: Some(j.image.into()),
        command: Some(vec![FASTFORWARD_BINARY.into()]),
        args: Some(args),
        env: Some(envs),
        termination_message_path: Some(REPORT_PATH.into()),
        ..Container::default()
    };
    let mut pod = PodSpec {
        containers: vec![container],
        restart_policy: Some("Never".into()),
        ..PodSpec::default()
    };
    // Each database's CA where its URL names it (lockdb's and every paydb's).
    mount_database_cas(&mut pod);
    crate::builders::security::restrict(&mut pod);
    Job {
        metadata: j.owner.meta(name, component),
        spec: Some(JobSpec {
            // A failed read must fail the action (and keep the gate closed), not be retried blindly.
            backoff_limit: Some(0),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(j.owner.labels(component)),
                    ..ObjectMeta::default()
                }),
                spec: Some(pod),
            },
            ..JobSpec::default()
        }),
        ..Job::default()
    }
}

/// The read Job's report.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReadReport {
    #[serde(default)]
    pub sequence: Option<i64>,
    #[serde(default)]
    pub stacks: Vec<StackHighWater>,
    /// Set when a database could not be read: which one, and why.
    #[serde(default)]
    pub error: Option<String>,
}

/// The advance Job's report.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdvanceReport {
    #[serde(default)]
    pub before: Option<i64>,
    #[serde(default)]
    pub after: Option<i64>,
    #[serde(default)]
    pub error: Option<String>,
}

/// A Job's report: what it says when the Job could not do its work.
pub trait Report: DeserializeOwned {
    /// Why the Job failed, as it said itself.
    fn error(&self) -> Option<&str>;
    /// The report carries what a succeeded Job must report.
    fn complete(&self) -> bool {
        self.error().is_none()
    }
}

impl Report for ReadReport {
    fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }
}

impl Report for AdvanceReport {
    fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }

    fn complete(&self) -> bool {
        self.error.is_none() && self.after.is_some()
    }
}

/// Where a Job stands, read through its report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reported<R> {
    Absent,
    Running,
    /// Failed: why (the report's error, else its raw text, else that there was none).
    Failed(String),
    /// Succeeded without a complete report (missing, unreadable, or naming an error).
    Unreadable,
    Succeeded(R),
}

/// Reads the report of the Job `name` (`read`, `advance`: how messages call it).
pub fn reported<R: Report>(run: &JobRun, name: &str) -> Reported<R> {
    let parse = |report: &Option<String>| report.as_deref().and_then(|t| serde_json::from_str::<R>(t).ok());
    match run {
        JobRun::Absent => Reported::Absent,
        JobRun::Running => Reported::Running,
        JobRun::Failed(report) => Reported::Failed(
            parse(report)
                .and_then(|r| r.error().map(str::to_owned))
                .or_else(|| report.clone())
                .unwrap_or_else(|| format!("the {name} Job failed without a report")),
        ),
        JobRun::Succeeded(report) => match parse(report).filter(R::complete) {
            Some(r) => Reported::Succeeded(r),
            None => Reported::Unreadable,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_is_read_once_the_job_ended() {
        let failed =
            |report: Option<&str>| reported::<ReadReport>(&JobRun::Failed(report.map(str::to_owned)), "read");
        assert_eq!(
            failed(Some(r#"{"error":"paydb of PaymentStack pay-b: down"}"#)),
            Reported::Failed("paydb of PaymentStack pay-b: down".into())
        );
        assert_eq!(
            failed(Some("BackoffLimitExceeded")),
            Reported::Failed("BackoffLimitExceeded".into())
        );
        assert_eq!(
            failed(None),
            Reported::Failed("the read Job failed without a report".into())
        );
        let done = |report: &str| JobRun::Succeeded(Some(report.into()));
        assert_eq!(
            reported::<AdvanceReport>(&done(r#"{"before":3}"#), "advance"),
            Reported::Unreadable,
            "an advance must say where the sequence is now"
        );
        assert_eq!(
            reported::<AdvanceReport>(&done(r#"{"before":3,"after":9}"#), "advance"),
            Reported::Succeeded(AdvanceReport {
                before: Some(3),
                after: Some(9),
                error: None
            })
        );
        assert_eq!(
            reported::<ReadReport>(&done(r#"{"error":"x"}"#), "read"),
            Reported::Unreadable
        );
        assert_eq!(
            reported::<ReadReport>(&JobRun::Running, "read"),
            Reported::Running
        );
    }
}
