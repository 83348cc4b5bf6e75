//! The migration Job: `dlock-migrate` applies one history (lockdb or paydb) and sets the application
//! role's password. Jobs are immutable, so the name carries a hash of the pod template: a new image (a
//! new history) gets a new Job, and the same inputs always map to the same Job.

use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::postgres::{self, History, KEY_APP_PASSWORD, names};
use super::{Owner, secret_env, short_hash};
use crate::crd::SecretKeyRef;

pub const MIGRATE_BINARY: &str = "dlock-migrate";
/// Env var the Job hands the application role's password in (dlock-migrate reads it by name, so the
/// password is never on a command line).
pub const APP_PASSWORD_ENV: &str = "APP_PASSWORD";
const BACKOFF_LIMIT: i32 = 4;

/// The Job for `history`, reading the owner-role URL from `admin_url` (a Secret key).
/// `extra_dirs`: further migration locations applied after the history's own (the opt-in demo seed).
pub fn job(
    owner: &Owner,
    history: History,
    image: &str,
    admin_url: &SecretKeyRef,
    extra_dirs: &[&str],
) -> Job {
    let component = postgres::migration_component(history);
    let mut command = vec![
        MIGRATE_BINARY.to_owned(),
        "--dir".into(),
        postgres::history_dir(history),
    ];
    for dir in extra_dirs {
        command.extend(["--dir".to_owned(), (*dir).to_owned()]);
    }
    command.extend([
        "--app-role".into(),
        history.app_role().into(),
        "--app-password-env".into(),
        APP_PASSWORD_ENV.into(),
    ]);
    let container = Container {
        name: "migrate".into(),
        image: Some(image.into()),
        // DATABASE_URL comes from the environment (dlock-migrate reads it there): a `--database-url
        // $(DATABASE_URL)` argument would put the password into the process's command line.
        command: Some(command),
        env: Some(vec![
            secret_env("DATABASE_URL", &admin_url.name, &admin_url.key),
            secret_env(
                APP_PASSWORD_ENV,
                &names(owner, history).credentials_secret,
                KEY_APP_PASSWORD,
            ),
        ]),
        ..Container::default()
    };
    let template = PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(owner.labels(&component)),
            ..ObjectMeta::default()
        }),
        spec: Some(PodSpec {
            containers: vec![container],
            restart_policy: Some("Never".into()),
            ..PodSpec::default()
        }),
    };
    // serde_json of k8s-openapi types is deterministic (fields in declaration order, maps sorted).
    let hash = short_hash(serde_json::to_string(&template).unwrap_or_default().as_bytes());
    Job {
        metadata: owner.meta(
            owner.child(&format!("{}-migrate-{hash}", history.name())),
            &component,
        ),
        spec: Some(JobSpec {
            backoff_limit: Some(BACKOFF_LIMIT),
            template,
            ..JobSpec::default()
        }),
        ..Job::default()
    }
}
