//! The migration Job (builders/migration_job.rs) and the states that gate it.

use super::*;
use crate::builders::migration_job;

#[test]
fn migration_job_runs_dlock_migrate_with_secrets_only() {
    let ls = managed_ls();
    let owner = Owner::of(&ls).unwrap();
    let job = lockservice::children::migration_job(&ls, &owner, IMAGE).unwrap();
    let name = job.metadata.name.clone().unwrap();
    assert!(name.starts_with("locks-lockdb-migrate-"), "{name}");
    let spec = job.spec.as_ref().unwrap();
    let pod = spec.template.spec.as_ref().unwrap();
    assert_eq!(pod.restart_policy.as_deref(), Some("Never"));
    let c = &pod.containers[0];
    assert_eq!(c.image.as_deref(), Some(IMAGE));
    assert_eq!(
        c.command.clone().unwrap(),
        [
            "dlock-migrate",
            "--dir",
            "/migrations/lockdb",
            "--app-role",
            "lockapp",
            "--app-password-env",
            "APP_PASSWORD"
        ]
    );
    assert_eq!(
        secret_ref(env_of(c, "DATABASE_URL").unwrap()),
        ("locks-lockdb-conn".into(), "admin-url".into())
    );
    assert_eq!(
        secret_ref(env_of(c, "APP_PASSWORD").unwrap()),
        ("locks-lockdb-credentials".into(), "app-password".into())
    );

    // Same inputs, same Job; a new image (a new history) means a new Job; migrationImage wins.
    assert_eq!(
        lockservice::children::migration_job(&ls, &owner, IMAGE).unwrap(),
        job
    );
    let other = lockservice::children::migration_job(&ls, &owner, "registry.example/dlock:1.2.4").unwrap();
    assert_ne!(other.metadata.name, job.metadata.name);
    let mut pinned = ls.clone();
    pinned.spec.migration_image = Some("registry.example/migrate:9".into());
    let pinned_job = lockservice::children::migration_job(&pinned, &owner, IMAGE).unwrap();
    let pinned_pod = pinned_job.spec.unwrap().template.spec.unwrap();
    assert_eq!(
        pinned_pod.containers[0].image.as_deref(),
        Some("registry.example/migrate:9")
    );

    let ps = default_stack();
    let ps_owner = Owner::of(&ps).unwrap();
    let pay_job = paymentstack::children::migration_job(&ps, &ps_owner, IMAGE).unwrap();
    let c = &pay_job.spec.unwrap().template.spec.unwrap().containers[0];
    let cmd = c.command.clone().unwrap();
    assert_eq!(cmd[2], "/migrations/paydb");
    assert_eq!(cmd[4], "payapp");
}

#[test]
fn the_demo_seed_is_applied_only_when_the_spec_asks_for_it() {
    let ps = default_stack();
    let owner = Owner::of(&ps).unwrap();
    let cmd = |ps: &PaymentStack| {
        let job = paymentstack::children::migration_job(ps, &owner, "dlock:test").unwrap();
        let c = job.spec.unwrap().template.spec.unwrap().containers[0].clone();
        c.command.unwrap()
    };
    let plain = cmd(&ps);
    assert!(!plain.iter().any(|a| a.contains("paydb-seed")), "{plain:?}");
    let mut demo = ps.clone();
    demo.spec.demo_data = true;
    let seeded = cmd(&demo);
    let at = seeded
        .iter()
        .position(|a| a == paymentstack::children::DEMO_SEED_DIR)
        .expect("seed dir");
    assert_eq!(seeded[at - 1], "--dir");
    // A different Job (the spec of a Job is immutable): its name changes with the command.
    let name = |ps: &PaymentStack| {
        paymentstack::children::migration_job(ps, &owner, "dlock:test")
            .unwrap()
            .metadata
            .name
    };
    assert_ne!(name(&ps), name(&demo));
}

#[test]
fn no_job_before_the_database_is_ready() {
    let ls = managed_ls();
    let owner = Owner::of(&ls).unwrap();
    let mut inputs = ls_inputs(&JobState::Absent);
    inputs.database_ready = false;
    let d = lockservice::children::desired(&ls, &owner, &inputs).unwrap();
    assert!(d.apply.iter().all(|c| c.kind() != ChildKind::Job));
    assert!(d.migration_job.starts_with("locks-lockdb-migrate-"));
    inputs.database_ready = true;
    let d = lockservice::children::desired(&ls, &owner, &inputs).unwrap();
    assert!(d.find(ChildKind::Job, &d.migration_job).is_some());
}

#[test]
fn job_states() {
    use k8s_openapi::api::batch::v1::{Job, JobCondition, JobStatus};
    let job = |status: JobStatus| Job {
        status: Some(status),
        ..Job::default()
    };
    assert_eq!(JobState::of(None), JobState::Absent);
    assert_eq!(JobState::of(Some(&job(JobStatus::default()))), JobState::Running);
    assert_eq!(
        JobState::of(Some(&job(JobStatus {
            succeeded: Some(1),
            ..JobStatus::default()
        }))),
        JobState::Succeeded
    );
    let failed = job(JobStatus {
        failed: Some(5),
        conditions: Some(vec![JobCondition {
            type_: "Failed".into(),
            status: "True".into(),
            reason: Some("BackoffLimitExceeded".into()),
            message: Some("Job has reached the specified backoff limit".into()),
            ..JobCondition::default()
        }]),
        ..JobStatus::default()
    });
    assert_eq!(
        JobState::of(Some(&failed)),
        JobState::Failed("Job has reached the specified backoff limit".into())
    );
    // Failed pods that are still being retried are not a failed Job.
    let retrying = job(JobStatus {
        failed: Some(2),
        ..JobStatus::default()
    });
    assert_eq!(JobState::of(Some(&retrying)), JobState::Running);
    let _ = migration_job::APP_PASSWORD_ENV;
}
