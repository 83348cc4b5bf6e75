//! What the actions' tests share: an owner, its restore Jobs' inputs, and requests to plan.

use k8s_openapi::api::batch::v1::Job;

use super::jobs::RestoreJobs;
use super::*;
use crate::builders::Owner;
use crate::crd::SecretKeyRef;
use crate::crd::actions::{ActionStep, parse_restore, parse_revoke};

pub fn owner() -> Owner {
    Owner {
        name: "locks".into(),
        namespace: "pay".into(),
        kind: "LockService".into(),
        owner_ref: Default::default(),
        https: false,
    }
}
pub fn secret() -> SecretKeyRef {
    SecretKeyRef {
        name: "locks-lockdb-conn".into(),
        key: "admin-url".into(),
    }
}

pub fn revoke_inputs() -> ActionInputs {
    ActionInputs {
        revoke: Some(Request::Valid(
            parse_revoke(r#"{"id":"r-1","key":"account:1","reason":"stuck","requestedBy":"alice"}"#).unwrap(),
        )),
        lock_server_available: true,
        now: "2026-01-01T00:00:00Z".into(),
        ..ActionInputs::default()
    }
}

pub fn held(token: i64) -> LockView {
    LockView {
        state: "HELD".into(),
        fencing_token: Some(token),
        owner_id: Some("worker-a".into()),
    }
}

pub fn run(inputs: &ActionInputs) -> ActionPlan {
    let o = owner();
    let s = secret();
    plan(
        inputs,
        &RestoreJobs {
            owner: &o,
            image: "dlock:1",
            lockdb_admin_url: &s,
        },
    )
}

pub fn restore_inputs() -> ActionInputs {
    ActionInputs {
        restore: Some(Request::Valid(
            parse_restore(r#"{"id":"ff-1","margin":100}"#).unwrap(),
        )),
        lock_server_available: true,
        lock_server_pods: 1,
        lock_server_replicas: 1,
        stacks: vec![
            StackRef {
                name: "pay-a".into(),
                connection_ready: true,
                migrated: true,
            },
            StackRef {
                name: "pay-b".into(),
                connection_ready: true,
                migrated: true,
            },
        ],
        now: "t".into(),
        ..ActionInputs::default()
    }
}

pub fn then(prev: &ActionPlan, mut next: ActionInputs) -> ActionInputs {
    next.actions = prev.actions.clone();
    next.gate = prev.gate.clone();
    next
}

pub fn step(p: &ActionPlan) -> (ActionPhase, Option<ActionStep>) {
    (p.actions[0].phase, p.actions[0].step)
}

/// The arguments of a Job's container.
pub fn container_args(job: &Job) -> Vec<String> {
    let pod = job.spec.as_ref().and_then(|s| s.template.spec.as_ref());
    pod.and_then(|p| p.containers.first()?.args.clone())
        .expect("a container with arguments")
}
