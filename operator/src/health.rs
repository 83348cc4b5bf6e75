//! What the operator reads off the objects it made: a Deployment's availability, a Job's state.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;

/// Availability of one Deployment the controller applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeploymentHealth {
    pub name: String,
    pub desired: i32,
    pub available: i32,
    pub updated: i32,
    /// The Deployment controller has seen the latest spec.
    pub observed: bool,
}

impl DeploymentHealth {
    pub fn of(d: &Deployment) -> DeploymentHealth {
        let status = d.status.as_ref();
        let generation = d.metadata.generation.unwrap_or(0);
        DeploymentHealth {
            name: d.metadata.name.clone().unwrap_or_default(),
            desired: d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1),
            available: status.and_then(|s| s.available_replicas).unwrap_or(0),
            updated: status.and_then(|s| s.updated_replicas).unwrap_or(0),
            observed: status.and_then(|s| s.observed_generation).unwrap_or(0) >= generation,
        }
    }

    pub fn is_available(&self) -> bool {
        self.observed && self.available >= self.desired && self.updated >= self.desired
    }
}

/// Where a migration Job stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobState {
    /// Not created yet (or deleted by a human, to force a re-run).
    Absent,
    Running,
    Succeeded,
    /// Terminally failed; the message is the Job's own condition message.
    Failed(String),
}

impl JobState {
    pub fn of(job: Option<&Job>) -> JobState {
        let Some(job) = job else {
            return JobState::Absent;
        };
        let status = job.status.as_ref();
        if status.and_then(|s| s.succeeded).unwrap_or(0) >= 1 {
            return JobState::Succeeded;
        }
        let failed = status
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == "Failed" && c.status == "True"));
        match failed {
            Some(c) => JobState::Failed(
                c.message
                    .clone()
                    .or_else(|| c.reason.clone())
                    .unwrap_or_else(|| "the migration Job failed".into()),
            ),
            None => JobState::Running,
        }
    }
}
