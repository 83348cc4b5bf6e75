//! The builders as pure functions: a resource in, the children it asks for out.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Container, EnvVar, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::json;

use super::deployments::{PAYMENT_FENCING_ENV, RAIL_PROXY_FENCING_ENV};
use super::postgres::{self, Credentials, History};
use super::{Child, ChildKind, Desired, Owner, credentials, migration_job, short_hash};
use crate::controller::paymentstack::children::LockServiceView;
use crate::controller::{lockservice, paymentstack};
use crate::crd::{LeaseSpec, LockService, LockServiceSpec, PaymentStack, PaymentStackSpec};
use crate::health::JobState;

const IMAGE: &str = "registry.example/dlock:1.2.3";

fn meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: Some("pay".into()),
        uid: Some(format!("uid-{name}")),
        generation: Some(1),
        ..ObjectMeta::default()
    }
}

fn lock_service(spec: serde_json::Value) -> LockService {
    let spec: LockServiceSpec = serde_json::from_value(spec).unwrap();
    LockService {
        metadata: meta("locks"),
        spec,
        status: None,
    }
}

fn stack(spec: serde_json::Value) -> PaymentStack {
    let spec: PaymentStackSpec = serde_json::from_value(spec).unwrap();
    PaymentStack {
        metadata: meta("shop"),
        spec,
        status: None,
    }
}

fn managed_ls() -> LockService {
    lock_service(
        json!({"database": {"managed": {"storageClassName": "fast"}}, "lockServer": {"replicas": 3}}),
    )
}

fn default_stack() -> PaymentStack {
    stack(json!({
        "lockServiceRef": {"name": "locks"},
        "database": {"managed": {}},
        "railStub": {"enabled": true, "mode": "timeout"},
        "payoutExecutor": {"replicas": 1, "workers": 7},
    }))
}

fn ls_inputs<'a>(migration: &'a JobState) -> lockservice::children::Inputs<'a> {
    lockservice::children::Inputs {
        default_image: IMAGE,
        database_ready: true,
        migration,
        db_secret_version: Some("42"),
        gated: false,
        signing_key: Some("k1"),
        scraper: None,
    }
}

fn ready_lock_service() -> LockServiceView {
    LockServiceView {
        ready: true,
        endpoint: Some("http://locks-lock-server.pay.svc:8080".into()),
        lease: LeaseSpec {
            default_ttl_ms: 5000,
            session_ttl_ms: 20000,
        },
        grant_keys: Some(PUBLISHED_KEYS.to_text()),
    }
}

/// A published key set, as the LockService's ConfigMap holds it.
static PUBLISHED_KEYS: std::sync::LazyLock<dlock_grant::PublicKeys> = std::sync::LazyLock::new(|| {
    let k1 = dlock_grant::SigningKey::generate(dlock_grant::KeyId::new("k1").unwrap());
    dlock_grant::PublicKeys::new(vec![k1.public_key()]).unwrap()
});

fn ps_inputs<'a>(
    migration: &'a JobState,
    ls: Option<&'a LockServiceView>,
) -> paymentstack::children::Inputs<'a> {
    paymentstack::children::Inputs {
        default_image: IMAGE,
        database_ready: true,
        migration,
        db_secret_version: Some("7"),
        lock_service: ls,
        scraper: None,
    }
}

fn containers(child: &Child) -> Vec<Container> {
    let spec = match child {
        Child::StatefulSet(s) => s.spec.as_ref().map(|s| &s.template),
        Child::Job(j) => j.spec.as_ref().map(|s| &s.template),
        Child::Deployment(d) => d.spec.as_ref().map(|s| &s.template),
        Child::Service(_) | Child::NetworkPolicy(_) | Child::PodDisruptionBudget(_) => None,
    };
    spec.and_then(|t| t.spec.as_ref())
        .map(|p| p.containers.clone())
        .unwrap_or_default()
}

fn env_of<'a>(c: &'a Container, name: &str) -> Option<&'a EnvVar> {
    c.env.iter().flatten().find(|e| e.name == name)
}

fn secret_ref(e: &EnvVar) -> (String, String) {
    let r = e
        .value_from
        .as_ref()
        .and_then(|v| v.secret_key_ref.as_ref())
        .unwrap_or_else(|| panic!("{} is not read from a Secret", e.name));
    assert!(e.value.is_none(), "{} has a plain value too", e.name);
    (r.name.clone(), r.key.clone())
}

fn deployment<'a>(d: &'a Desired, name: &str) -> &'a Deployment {
    match d.find(ChildKind::Deployment, name) {
        Some(Child::Deployment(dep)) => dep,
        _ => panic!(
            "no Deployment {name} in {:?}",
            d.apply.iter().map(Child::name).collect::<Vec<_>>()
        ),
    }
}

fn all_children(d: &Desired) -> impl Iterator<Item = (&str, ObjectMeta)> {
    d.apply.iter().map(|c| {
        let m = match c {
            Child::Service(o) => o.metadata.clone(),
            Child::StatefulSet(o) => o.metadata.clone(),
            Child::Job(o) => o.metadata.clone(),
            Child::Deployment(o) => o.metadata.clone(),
            Child::NetworkPolicy(o) => o.metadata.clone(),
            Child::PodDisruptionBudget(o) => o.metadata.clone(),
        };
        (c.name(), m)
    })
}

#[test]
fn every_child_has_a_controller_owner_reference_and_the_standard_labels() {
    let ls = managed_ls();
    let owner = Owner::of(&ls).unwrap();
    let d = lockservice::children::desired(&ls, &owner, &ls_inputs(&JobState::Succeeded)).unwrap();
    let ps = default_stack();
    let ps_owner = Owner::of(&ps).unwrap();
    let view = ready_lock_service();
    let p = paymentstack::children::desired(&ps, &ps_owner, &ps_inputs(&JobState::Succeeded, Some(&view)))
        .unwrap();
    let creds = Credentials::generate(true);
    let secrets: Vec<(String, ObjectMeta)> = [
        postgres::credentials_secret(&owner, History::Lockdb, &creds),
        postgres::connection_secret(
            &owner,
            History::Lockdb,
            &postgres::managed_urls(&owner, History::Lockdb, &creds),
        ),
    ]
    .into_iter()
    .map(|s: Secret| (s.metadata.name.clone().unwrap(), s.metadata))
    .collect();

    let mut checked = 0;
    for (owner, (name, m)) in all_children(&d)
        .map(|(n, m)| (("LockService", "locks"), (n.to_owned(), m)))
        .chain(all_children(&p).map(|(n, m)| (("PaymentStack", "shop"), (n.to_owned(), m))))
        .chain(secrets.into_iter().map(|s| (("LockService", "locks"), s)))
    {
        let refs = m.owner_references.unwrap_or_default();
        assert_eq!(refs.len(), 1, "{name}");
        let r = &refs[0];
        assert_eq!((r.kind.as_str(), r.name.as_str()), owner, "{name}");
        assert_eq!(r.api_version, "dlock.dev/v1alpha1");
        assert_eq!(r.uid, format!("uid-{}", owner.1));
        assert_eq!(r.controller, Some(true), "{name}");
        assert_eq!(m.namespace.as_deref(), Some("pay"));
        let labels = m.labels.unwrap_or_default();
        assert_eq!(labels["app.kubernetes.io/managed-by"], "dlock-operator", "{name}");
        assert_eq!(labels["app.kubernetes.io/instance"], owner.1, "{name}");
        assert_eq!(labels["dlock.dev/owner-kind"], owner.0, "{name}");
        assert!(labels.contains_key("app.kubernetes.io/name"), "{name}");
        assert!(labels.contains_key("app.kubernetes.io/component"), "{name}");
        assert!(
            name.starts_with(&format!("{}-", owner.1)) && name.len() <= 63,
            "{name}"
        );
        checked += 1;
    }
    // lockdb svc+sts, Job, lock-server dep+svc+policy, 2 Secrets; paydb svc+sts, Job, rail-stub
    // dep+svc+policy, payment-resource dep+svc+policy, rail-proxy dep+svc+policy, payout-executor dep.
    assert_eq!(checked, 6 + 2 + 13);
}

#[test]
fn managed_database_is_a_postgres_statefulset_behind_a_headless_service() {
    let ls = managed_ls();
    let owner = Owner::of(&ls).unwrap();
    let d = lockservice::children::desired(&ls, &owner, &ls_inputs(&JobState::Absent)).unwrap();
    let Some(Child::Service(svc)) = d.find(ChildKind::Service, "locks-lockdb") else {
        panic!("no lockdb Service")
    };
    assert_eq!(svc.spec.as_ref().unwrap().cluster_ip.as_deref(), Some("None"));
    let Some(Child::StatefulSet(sts)) = d.find(ChildKind::StatefulSet, "locks-lockdb") else {
        panic!("no lockdb StatefulSet")
    };
    let spec = sts.spec.as_ref().unwrap();
    assert_eq!(spec.replicas, Some(1));
    assert_eq!(spec.service_name.as_deref(), Some("locks-lockdb"));
    let claim = &spec.volume_claim_templates.as_ref().unwrap()[0];
    let claim_spec = claim.spec.as_ref().unwrap();
    assert_eq!(claim_spec.storage_class_name.as_deref(), Some("fast"));
    assert_eq!(
        claim_spec.resources.as_ref().unwrap().requests.as_ref().unwrap()["storage"].0,
        "1Gi"
    );
    let c = &containers(&Child::StatefulSet(sts.clone()))[0];
    assert_eq!(c.image.as_deref(), Some("postgres:16"));
    assert_eq!(env_of(c, "POSTGRES_DB").unwrap().value.as_deref(), Some("lockdb"));
    assert_eq!(
        secret_ref(env_of(c, "POSTGRES_PASSWORD").unwrap()),
        ("locks-lockdb-credentials".into(), "postgres-password".into())
    );
    // Selectors match the pod labels.
    let selector = spec.selector.match_labels.as_ref().unwrap();
    let pod_labels = spec.template.metadata.as_ref().unwrap().labels.as_ref().unwrap();
    assert!(selector.iter().all(|(k, v)| pod_labels.get(k) == Some(v)));
    assert_eq!(svc.spec.as_ref().unwrap().selector.as_ref(), Some(selector));
}

#[test]
fn external_database_has_no_server_and_deletes_one_left_over() {
    let ls =
        lock_service(json!({"database": {"external": {"secretRef": {"name": "cloudsql", "key": "dsn"}}}}));
    let owner = Owner::of(&ls).unwrap();
    let d = lockservice::children::desired(&ls, &owner, &ls_inputs(&JobState::Absent)).unwrap();
    assert!(d.apply.iter().all(|c| c.kind() != ChildKind::StatefulSet));
    // A managed server left from before is neither applied nor held: the sweep deletes it.
    assert!(!d.wants(ChildKind::StatefulSet, "locks-lockdb"));
    assert!(!d.wants(ChildKind::Service, "locks-lockdb"));
    // The migration reads the owner URL from the referenced Secret key.
    let job = d.find(ChildKind::Job, &d.migration_job).unwrap();
    let c = &containers(job)[0];
    assert_eq!(
        secret_ref(env_of(c, "DATABASE_URL").unwrap()),
        ("cloudsql".into(), "dsn".into())
    );
}

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
fn payment_services_get_their_credentials_from_the_generated_secret_only() {
    let ps = default_stack();
    let owner = Owner::of(&ps).unwrap();
    let ls = ready_lock_service();
    let d =
        paymentstack::children::desired(&ps, &owner, &ps_inputs(&JobState::Succeeded, Some(&ls))).unwrap();
    let secret = credentials::credentials_secret_name(&owner);
    let wants: [(&str, &[(&str, &str)]); 3] = [
        (
            "payment-resource",
            &[
                ("PAYMENT_RESOURCE_ADMIN_TOKEN", credentials::KEY_ADMIN),
                ("PAYMENT_RESOURCE_EXECUTOR_TOKEN", credentials::KEY_EXECUTOR),
                ("PAYMENT_RESOURCE_CLIENT_TOKEN", credentials::KEY_CLIENT),
            ],
        ),
        (
            "rail-proxy",
            &[("RAIL_PROXY_EXECUTOR_TOKEN", credentials::KEY_RAIL_PROXY_EXECUTOR)],
        ),
        (
            "payout-executor",
            &[
                (
                    "PAYOUT_EXECUTOR_PAYMENT_RESOURCE_TOKEN",
                    credentials::KEY_EXECUTOR,
                ),
                (
                    "PAYOUT_EXECUTOR_RAIL_PROXY_TOKEN",
                    credentials::KEY_RAIL_PROXY_EXECUTOR,
                ),
            ],
        ),
    ];
    for (component, envs) in wants {
        let dep = deployment(&d, &owner.child(component));
        let c = &dep
            .spec
            .as_ref()
            .unwrap()
            .template
            .spec
            .as_ref()
            .unwrap()
            .containers[0];
        for (name, key) in envs {
            let e = env_of(c, name).unwrap_or_else(|| panic!("{component}: no {name}"));
            assert!(e.value.is_none(), "{component}: {name} is a plain value");
            assert_eq!(
                secret_ref(e),
                (secret.clone(), (*key).to_owned()),
                "{component}: {name}"
            );
        }
        // No credential travels as an argument.
        let args = c.args.clone().unwrap_or_default().join(" ");
        assert!(
            !args.contains("TOKEN") && !args.contains("token"),
            "{component}: {args}"
        );
    }
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
fn deployments_are_absent_until_the_migration_job_succeeded() {
    let ls = managed_ls();
    let owner = Owner::of(&ls).unwrap();
    let ps = default_stack();
    let ps_owner = Owner::of(&ps).unwrap();
    let view = ready_lock_service();
    for state in [
        JobState::Absent,
        JobState::Running,
        JobState::Failed("BackoffLimitExceeded".into()),
    ] {
        let d = lockservice::children::desired(&ls, &owner, &ls_inputs(&state)).unwrap();
        assert_eq!(d.deployments().count(), 0, "{state:?}");
        assert!(d.endpoints.is_empty());
        let p = paymentstack::children::desired(&ps, &ps_owner, &ps_inputs(&state, Some(&view))).unwrap();
        // Only the rail-stub, which needs no schema.
        let names: Vec<_> = p
            .deployments()
            .map(|d| d.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(names, ["shop-rail-stub"], "{state:?}");
    }
    let d = lockservice::children::desired(&ls, &owner, &ls_inputs(&JobState::Succeeded)).unwrap();
    let dep = deployment(&d, "locks-lock-server");
    assert_eq!(dep.spec.as_ref().unwrap().replicas, Some(3));
    assert!(d.find(ChildKind::Service, "locks-lock-server").is_some());
    assert_eq!(d.endpoints["lockServer"], "http://locks-lock-server.pay.svc:8080");
    // Ordering: database, then the Job, then the Deployment.
    let kinds: Vec<ChildKind> = d.apply.iter().map(Child::kind).collect();
    let pos = |k| kinds.iter().position(|x| *x == k).unwrap();
    assert!(
        pos(ChildKind::StatefulSet) < pos(ChildKind::Job) && pos(ChildKind::Job) < pos(ChildKind::Deployment)
    );
}

#[test]
fn a_stack_waits_for_a_ready_lock_service() {
    let ps = default_stack();
    let owner = Owner::of(&ps).unwrap();
    let mut not_ready = ready_lock_service();
    not_ready.ready = false;
    for ls in [None, Some(&not_ready)] {
        let p = paymentstack::children::desired(&ps, &owner, &ps_inputs(&JobState::Succeeded, ls)).unwrap();
        assert_eq!(p.deployments().count(), 1, "only the rail-stub: {ls:?}");
    }
    let view = ready_lock_service();
    let p =
        paymentstack::children::desired(&ps, &owner, &ps_inputs(&JobState::Succeeded, Some(&view))).unwrap();
    assert_eq!(p.deployments().count(), 4);
    assert_eq!(p.endpoints["lockServer"], "http://locks-lock-server.pay.svc:8080");
}

#[test]
fn workloads_run_their_binary_with_the_documented_flags() {
    let ls = managed_ls();
    let owner = Owner::of(&ls).unwrap();
    let d = lockservice::children::desired(&ls, &owner, &ls_inputs(&JobState::Succeeded)).unwrap();
    let c = &containers(&Child::Deployment(deployment(&d, "locks-lock-server").clone()))[0];
    assert_eq!(c.image.as_deref(), Some(IMAGE));
    assert_eq!(c.command.clone().unwrap(), ["lock-server"]);
    assert_eq!(c.args.clone().unwrap(), ["--listen", "0.0.0.0:8080"]);
    assert_eq!(
        env_of(c, "DLOCK_LEASE_TTL_MS").unwrap().value.as_deref(),
        Some("10000")
    );
    assert!(c.readiness_probe.is_some() && c.liveness_probe.is_some());

    let ps = default_stack();
    let owner = Owner::of(&ps).unwrap();
    let view = ready_lock_service();
    let p =
        paymentstack::children::desired(&ps, &owner, &ps_inputs(&JobState::Succeeded, Some(&view))).unwrap();
    let get = |name: &str| containers(&Child::Deployment(deployment(&p, name).clone()))[0].clone();

    let pr = get("shop-payment-resource");
    assert_eq!(pr.command.clone().unwrap(), ["payment-resource"]);
    assert_eq!(pr.args.clone().unwrap(), ["serve", "--listen", "0.0.0.0:8080"]);

    let rp = get("shop-rail-proxy");
    assert_eq!(
        rp.args.clone().unwrap(),
        [
            "--listen",
            "0.0.0.0:8080",
            "--rail-url",
            "http://shop-rail-stub.pay.svc:8080"
        ]
    );

    let stub = get("shop-rail-stub");
    assert_eq!(
        stub.args.clone().unwrap(),
        ["--listen", "0.0.0.0:8080", "--mode", "timeout"]
    );
    assert!(env_of(&stub, "DATABASE_URL").is_none());

    let ex = get("shop-payout-executor");
    assert_eq!(
        ex.args.clone().unwrap(),
        [
            "--lock-server-url",
            "http://locks-lock-server.pay.svc:8080",
            "--payment-resource-url",
            "http://shop-payment-resource.pay.svc:8080",
            "--rail-proxy-url",
            "http://shop-rail-proxy.pay.svc:8080",
            "--workers",
            "7",
            "--listen",
            "0.0.0.0:8080"
        ]
    );
    // It serves /metrics on the named port (what the PodMonitor scrapes), and nothing to probe.
    let port = &ex.ports.clone().unwrap()[0];
    assert_eq!((port.name.as_deref(), port.container_port), (Some("http"), 8080));
    assert!(ex.readiness_probe.is_none() && ex.liveness_probe.is_none());
    // No database credentials at all, and the lease defaults of its LockService.
    assert!(env_of(&ex, "DATABASE_URL").is_none());
    assert_eq!(
        env_of(&ex, "DLOCK_LEASE_TTL_MS").unwrap().value.as_deref(),
        Some("5000")
    );
    assert_eq!(
        env_of(&ex, "DLOCK_SESSION_TTL_MS").unwrap().value.as_deref(),
        Some("20000")
    );
    assert!(p.find(ChildKind::Service, "shop-payout-executor").is_none());
    assert_eq!(
        deployment(&p, "shop-payout-executor")
            .spec
            .as_ref()
            .unwrap()
            .replicas,
        Some(1)
    );

    // An explicit rail URL wins over the stub.
    let mut explicit = ps.clone();
    explicit.spec.rail_proxy.rail_url = Some("https://rail.example/v1".into());
    let p = paymentstack::children::desired(&explicit, &owner, &ps_inputs(&JobState::Succeeded, Some(&view)))
        .unwrap();
    let rp = containers(&Child::Deployment(deployment(&p, "shop-rail-proxy").clone()))[0].clone();
    assert_eq!(rp.args.unwrap()[3], "https://rail.example/v1");
}

#[test]
fn services_read_database_url_from_the_connection_secret() {
    let ls = managed_ls();
    let owner = Owner::of(&ls).unwrap();
    let d = lockservice::children::desired(&ls, &owner, &ls_inputs(&JobState::Succeeded)).unwrap();
    let dep = deployment(&d, "locks-lock-server");
    let c = &containers(&Child::Deployment(dep.clone()))[0];
    assert_eq!(
        secret_ref(env_of(c, "DATABASE_URL").unwrap()),
        ("locks-lockdb-conn".into(), "url".into())
    );
    // Pods restart when the connection Secret changes.
    let annotations = dep
        .spec
        .as_ref()
        .unwrap()
        .template
        .metadata
        .as_ref()
        .unwrap()
        .annotations
        .clone();
    assert_eq!(annotations.unwrap()["dlock.dev/database-secret-version"], "42");

    let ps = default_stack();
    let owner = Owner::of(&ps).unwrap();
    let view = ready_lock_service();
    let p =
        paymentstack::children::desired(&ps, &owner, &ps_inputs(&JobState::Succeeded, Some(&view))).unwrap();
    for name in ["shop-payment-resource", "shop-rail-proxy"] {
        let c = &containers(&Child::Deployment(deployment(&p, name).clone()))[0];
        assert_eq!(
            secret_ref(env_of(c, "DATABASE_URL").unwrap()),
            ("shop-paydb-conn".into(), "url".into()),
            "{name}"
        );
    }
}

#[test]
fn no_password_appears_outside_secrets() {
    let ls = managed_ls();
    let owner = Owner::of(&ls).unwrap();
    let creds = Credentials::generate(true);
    let urls = postgres::managed_urls(&owner, History::Lockdb, &creds);
    let d = lockservice::children::desired(&ls, &owner, &ls_inputs(&JobState::Succeeded)).unwrap();
    let ps = default_stack();
    let ps_owner = Owner::of(&ps).unwrap();
    let view = ready_lock_service();
    let p = paymentstack::children::desired(&ps, &ps_owner, &ps_inputs(&JobState::Succeeded, Some(&view)))
        .unwrap();

    let secrets = [
        serde_json::to_string(&postgres::credentials_secret(&owner, History::Lockdb, &creds)).unwrap(),
        serde_json::to_string(&postgres::connection_secret(&owner, History::Lockdb, &urls)).unwrap(),
    ];
    let pw = creds.postgres_password.clone().unwrap();
    // Secrets carry them base64-encoded, never in clear.
    assert!(
        secrets
            .iter()
            .all(|s| !s.contains(&pw) && !s.contains(&creds.app_password))
    );

    let mut env_vars = 0;
    for child in d.apply.iter().chain(&p.apply) {
        let text = serde_json::to_string(child_json(child).as_ref().unwrap()).unwrap();
        assert!(
            !text.contains(&pw) && !text.contains(&creds.app_password),
            "{}",
            child.name()
        );
        assert!(!text.contains("postgres://"), "a URL in {}", child.name());
        for c in containers(child) {
            for e in c.env.iter().flatten() {
                env_vars += 1;
                if e.name.contains("PASSWORD") || e.name == "DATABASE_URL" {
                    secret_ref(e);
                }
                let value = e.value.as_deref().unwrap_or_default();
                assert!(!value.contains("://") || e.name.ends_with("_URL") && !value.contains('@'));
            }
        }
    }
    assert!(env_vars > 10);
    assert!(format!("{creds:?} {urls:?}").contains("redacted"));
    assert!(!format!("{creds:?} {urls:?}").contains(&pw));
}

fn child_json(child: &Child) -> serde_json::Result<serde_json::Value> {
    match child {
        Child::Service(o) => serde_json::to_value(o),
        Child::StatefulSet(o) => serde_json::to_value(o),
        Child::Job(o) => serde_json::to_value(o),
        Child::Deployment(o) => serde_json::to_value(o),
        Child::NetworkPolicy(o) => serde_json::to_value(o),
        Child::PodDisruptionBudget(o) => serde_json::to_value(o),
    }
}

#[test]
fn kill_switches_become_env_vars() {
    let view = ready_lock_service();
    for (payment, rail) in [(true, true), (false, true), (true, false), (false, false)] {
        let mut ps = default_stack();
        ps.spec.kill_switches.payment_fencing_enabled = payment;
        ps.spec.kill_switches.rail_proxy_fencing_enabled = rail;
        let owner = Owner::of(&ps).unwrap();
        let p = paymentstack::children::desired(&ps, &owner, &ps_inputs(&JobState::Succeeded, Some(&view)))
            .unwrap();
        let pr = &containers(&Child::Deployment(
            deployment(&p, "shop-payment-resource").clone(),
        ))[0];
        let rp = &containers(&Child::Deployment(deployment(&p, "shop-rail-proxy").clone()))[0];
        let payment_value = payment.to_string();
        let rail_value = rail.to_string();
        assert_eq!(
            env_of(pr, PAYMENT_FENCING_ENV).unwrap().value.as_deref(),
            Some(payment_value.as_str())
        );
        assert_eq!(
            env_of(rp, RAIL_PROXY_FENCING_ENV).unwrap().value.as_deref(),
            Some(rail_value.as_str())
        );
        // Each switch reaches only its own enforcement point.
        assert!(env_of(pr, RAIL_PROXY_FENCING_ENV).is_none() && env_of(rp, PAYMENT_FENCING_ENV).is_none());
    }
}

#[test]
fn children_the_spec_drops_are_orphans_and_gated_ones_are_held() {
    let mut ps = default_stack();
    ps.spec.rail_proxy.rail_url = Some("https://rail.example".into());
    let owner = Owner::of(&ps).unwrap();
    let view = ready_lock_service();
    let with_stub =
        paymentstack::children::desired(&ps, &owner, &ps_inputs(&JobState::Succeeded, Some(&view))).unwrap();
    assert!(with_stub.find(ChildKind::Deployment, "shop-rail-stub").is_some());
    assert!(with_stub.find(ChildKind::Service, "shop-rail-stub").is_some());
    assert!(
        with_stub
            .find(ChildKind::NetworkPolicy, "shop-rail-stub")
            .is_some()
    );
    assert!(with_stub.endpoints.contains_key("railStub"));

    ps.spec.rail_stub.enabled = false;
    let without =
        paymentstack::children::desired(&ps, &owner, &ps_inputs(&JobState::Succeeded, Some(&view))).unwrap();
    for kind in [
        ChildKind::Deployment,
        ChildKind::Service,
        ChildKind::NetworkPolicy,
    ] {
        assert!(
            !without.wants(kind, "shop-rail-stub"),
            "{kind:?} of the stub is still wanted"
        );
    }
    assert!(!without.endpoints.contains_key("railStub"));
    // The dropped stub is an orphan even while the schema gate holds everything else back ...
    let gated =
        paymentstack::children::desired(&ps, &owner, &ps_inputs(&JobState::Running, Some(&view))).unwrap();
    assert!(!gated.wants(ChildKind::Deployment, "shop-rail-stub"));
    // ... and what the gate holds back is kept as it is: held, not applied, not an orphan.
    for component in ["payment-resource", "rail-proxy", "payout-executor"] {
        let name = format!("shop-{component}");
        assert!(
            gated.find(ChildKind::Deployment, &name).is_none(),
            "{name} applied behind the gate"
        );
        assert!(
            gated.wants(ChildKind::Deployment, &name),
            "{name} would be swept behind the gate"
        );
    }
    // Nothing is both applied and held.
    for r in &gated.hold {
        assert!(gated.find(r.kind, &r.name).is_none(), "{r:?}");
    }
}

#[test]
fn specs_that_bypassed_cel_are_refused_not_guessed() {
    let mut ls = managed_ls();
    ls.spec.database.as_mut().unwrap().external = Some(crate::crd::ExternalDatabase {
        secret_ref: crate::crd::SecretKeyRef {
            name: "x".into(),
            key: "url".into(),
        },
    });
    let owner = Owner::of(&ls).unwrap();
    assert_eq!(
        lockservice::children::desired(&ls, &owner, &ls_inputs(&JobState::Absent)),
        Err(super::SpecError::DatabaseMode)
    );
    let mut ps = default_stack();
    ps.spec.rail_stub.enabled = false;
    let owner = Owner::of(&ps).unwrap();
    assert_eq!(
        paymentstack::children::desired(&ps, &owner, &ps_inputs(&JobState::Absent, None)),
        Err(super::SpecError::RailUrl)
    );
}

#[test]
fn credentials_round_trip_and_are_random() {
    let ls = managed_ls();
    let owner = Owner::of(&ls).unwrap();
    let a = Credentials::generate(true);
    let b = Credentials::generate(true);
    assert_ne!(a.app_password, b.app_password);
    assert_eq!(a.app_password.len(), 32);
    assert!(a.app_password.chars().all(|c| c.is_ascii_alphanumeric()));
    let secret = postgres::credentials_secret(&owner, History::Lockdb, &a);
    assert_eq!(secret.metadata.name.as_deref(), Some("locks-lockdb-credentials"));
    assert_eq!(Credentials::from_secret(&secret, true), Some(a.clone()));
    // An external database has no superuser password to keep.
    let ext = Credentials::generate(false);
    assert!(ext.postgres_password.is_none());
    let secret = postgres::credentials_secret(&owner, History::Lockdb, &ext);
    assert!(!secret.data.as_ref().unwrap().contains_key("postgres-password"));
    // A managed database whose Secret lost its superuser password is refused, not regenerated.
    assert_eq!(Credentials::from_secret(&secret, true), None);
}

#[test]
fn connection_urls() {
    let ls = managed_ls();
    let owner = Owner::of(&ls).unwrap();
    let creds = Credentials {
        app_password: "APPPW".into(),
        postgres_password: Some("SUPERPW".into()),
    };
    let urls = postgres::managed_urls(&owner, History::Lockdb, &creds);
    assert_eq!(
        urls.app_url,
        "postgres://lockapp:APPPW@locks-lockdb.pay.svc:5432/lockdb"
    );
    assert_eq!(
        urls.admin_url.as_deref(),
        Some("postgres://postgres:SUPERPW@locks-lockdb.pay.svc:5432/lockdb")
    );
    let secret = postgres::connection_secret(&owner, History::Lockdb, &urls);
    let data = secret.data.unwrap();
    assert_eq!(data["url"].0, urls.app_url.as_bytes());
    assert_eq!(data["admin-url"].0, urls.admin_url.unwrap().as_bytes());

    let ext = postgres::external_app_url(
        "postgresql://admin:s3cret@10.1.2.3:6432/paydb?sslmode=require",
        History::Paydb,
        &creds,
    )
    .unwrap();
    assert_eq!(
        ext.app_url,
        "postgresql://payapp:APPPW@10.1.2.3:6432/paydb?sslmode=require"
    );
    assert_eq!(ext.admin_url, None);
    for bad in [
        "host=db user=x",
        "mysql://u:p@h/db",
        "postgres:///socket-only",
        "",
    ] {
        let err = postgres::external_app_url(bad, History::Paydb, &creds).unwrap_err();
        assert!(!err.to_string().contains("user=x"));
    }
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

#[test]
fn short_hash_is_stable() {
    // Pinned: a change here renames every migration Job and re-runs the migrations.
    assert_eq!(short_hash(b""), "4fd0bfc1"); // FNV-1a offset basis, folded
    assert_eq!(short_hash(b"dlock"), short_hash(b"dlock"));
    assert_ne!(short_hash(b"dlock:1"), short_hash(b"dlock:2"));
    assert_eq!(short_hash(b"anything").len(), 8);
}

// ------------------------------------------------------------------ NetworkPolicies

/// `matchLabels` semantics (the only form the builders use): every listed label present and equal.
fn selects(
    sel: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
    labels: &std::collections::BTreeMap<String, String>,
) -> bool {
    assert!(
        sel.match_expressions.is_none(),
        "only matchLabels is evaluated here"
    );
    sel.match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v))
}

/// A pod: its namespace and labels.
type Pod = (&'static str, std::collections::BTreeMap<String, String>);

/// Whether `policy` (in namespace "pay") admits a connection from `from` to port 8080.
fn admits(policy: &k8s_openapi::api::networking::v1::NetworkPolicy, from: &Pod) -> bool {
    admits_on(policy, from, 8080)
}

/// Whether `policy` (in namespace "pay") admits a connection from `from` to `port`. A namespace
/// carries the label Kubernetes gives every namespace, `kubernetes.io/metadata.name`.
fn admits_on(policy: &k8s_openapi::api::networking::v1::NetworkPolicy, from: &Pod, port: i32) -> bool {
    let spec = policy.spec.as_ref().unwrap();
    spec.ingress.iter().flatten().any(|rule| {
        let port_ok = rule.ports.iter().flatten().any(|p| {
            p.port
                == Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(
                    port,
                ))
        });
        let peer_ok = rule.from.iter().flatten().any(|peer| {
            assert!(peer.ip_block.is_none());
            // No namespaceSelector: the policy's own namespace only; `{}`: any namespace.
            let ns_ok = match &peer.namespace_selector {
                None => from.0 == "pay",
                Some(sel) => selects(
                    sel,
                    &[("kubernetes.io/metadata.name".to_owned(), from.0.to_owned())].into(),
                ),
            };
            ns_ok && peer.pod_selector.as_ref().is_none_or(|sel| selects(sel, &from.1))
        });
        port_ok && peer_ok
    })
}

fn policies(d: &Desired) -> Vec<&k8s_openapi::api::networking::v1::NetworkPolicy> {
    d.apply
        .iter()
        .filter_map(|c| match c {
            Child::NetworkPolicy(p) => Some(p),
            _ => None,
        })
        .collect()
}

fn pod_labels(d: &Desired, name: &str) -> std::collections::BTreeMap<String, String> {
    deployment(d, name)
        .spec
        .as_ref()
        .unwrap()
        .template
        .metadata
        .as_ref()
        .unwrap()
        .labels
        .clone()
        .unwrap()
}

#[test]
fn network_policies_admit_only_the_callers_each_service_needs() {
    let ls = managed_ls();
    let ls_owner = Owner::of(&ls).unwrap();
    let locks = lockservice::children::desired(&ls, &ls_owner, &ls_inputs(&JobState::Succeeded)).unwrap();
    let shop = default_stack();
    let shop_owner = Owner::of(&shop).unwrap();
    let view = ready_lock_service();
    let stack =
        paymentstack::children::desired(&shop, &shop_owner, &ps_inputs(&JobState::Succeeded, Some(&view)))
            .unwrap();
    // Another stack in the namespace that takes its locks from another LockService.
    let mut other = stack_named("other", "locks-2");
    other.spec.rail_stub.enabled = true;
    let other_owner = Owner::of(&other).unwrap();
    let other_d = paymentstack::children::desired(
        &other,
        &other_owner,
        &ps_inputs(&JobState::Succeeded, Some(&view)),
    )
    .unwrap();

    let executor: Pod = ("pay", pod_labels(&stack, "shop-payout-executor"));
    let rail_proxy: Pod = ("pay", pod_labels(&stack, "shop-rail-proxy"));
    let payment_resource: Pod = ("pay", pod_labels(&stack, "shop-payment-resource"));
    let rail_stub: Pod = ("pay", pod_labels(&stack, "shop-rail-stub"));
    let lock_server: Pod = ("pay", pod_labels(&locks, "locks-lock-server"));
    let other_executor: Pod = ("pay", pod_labels(&other_d, "other-payout-executor"));
    let other_rail_proxy: Pod = ("pay", pod_labels(&other_d, "other-rail-proxy"));
    let operator: Pod = (
        "dlock-system",
        [("app.kubernetes.io/name".to_owned(), "dlock-operator".to_owned())].into(),
    );
    let stranger: Pod = ("pay", [("app".to_owned(), "curl".to_owned())].into());
    let stranger_elsewhere: Pod = ("other-ns", executor.1.clone());
    let everyone = [
        ("executor", &executor),
        ("rail-proxy", &rail_proxy),
        ("payment-resource", &payment_resource),
        ("rail-stub", &rail_stub),
        ("lock-server", &lock_server),
        ("other-executor", &other_executor),
        ("other-rail-proxy", &other_rail_proxy),
        ("operator", &operator),
        ("stranger", &stranger),
        ("executor-labels-in-another-namespace", &stranger_elsewhere),
    ];

    // Who may connect to whom: exactly these, nobody else.
    let expected: [(&str, &Desired, &Pod, &[&str]); 4] = [
        ("shop-payment-resource", &stack, &payment_resource, &["executor"]),
        ("shop-rail-proxy", &stack, &rail_proxy, &["executor"]),
        ("shop-rail-stub", &stack, &rail_stub, &["rail-proxy"]),
        (
            "locks-lock-server",
            &locks,
            &lock_server,
            &["executor", "operator"],
        ),
    ];
    for (policy_name, desired, target, allowed) in expected {
        let policy = policies(desired)
            .into_iter()
            .find(|p| p.metadata.name.as_deref() == Some(policy_name))
            .unwrap_or_else(|| panic!("no NetworkPolicy {policy_name}"));
        let spec = policy.spec.as_ref().unwrap();
        assert_eq!(spec.policy_types.as_deref(), Some(&["Ingress".to_owned()][..]));
        assert!(
            selects(spec.pod_selector.as_ref().unwrap(), &target.1),
            "{policy_name} does not select its own pods"
        );
        // It selects no other pod of the namespace.
        for (who, pod) in everyone {
            if !std::ptr::eq(pod, target) && pod.0 == "pay" {
                assert!(
                    !selects(spec.pod_selector.as_ref().unwrap(), &pod.1),
                    "{policy_name} selects {who}"
                );
            }
        }
        let admitted: Vec<&str> = everyone
            .iter()
            .filter(|(_, pod)| admits(policy, pod))
            .map(|(who, _)| *who)
            .collect();
        assert_eq!(admitted, allowed, "{policy_name} admits {admitted:?}");
    }
}

#[test]
fn network_policies_exist_before_the_pods_they_protect() {
    // Behind the schema gate no Deployment is applied, but the policies are.
    let shop = default_stack();
    let owner = Owner::of(&shop).unwrap();
    let gated = paymentstack::children::desired(&shop, &owner, &ps_inputs(&JobState::Running, None)).unwrap();
    let names: Vec<&str> = policies(&gated)
        .iter()
        .filter_map(|p| p.metadata.name.as_deref())
        .collect();
    assert_eq!(
        names,
        ["shop-payment-resource", "shop-rail-proxy", "shop-rail-stub"]
    );
    assert!(
        gated
            .deployments()
            .all(|d| d.metadata.name.as_deref() == Some("shop-rail-stub"))
    );
    let ls = managed_ls();
    let ls_owner = Owner::of(&ls).unwrap();
    let locks = lockservice::children::desired(&ls, &ls_owner, &ls_inputs(&JobState::Running)).unwrap();
    assert_eq!(policies(&locks).len(), 1);
    assert_eq!(locks.deployments().count(), 0);
}

fn stack_named(name: &str, lock_service: &str) -> PaymentStack {
    let mut ps = stack(json!({
        "lockServiceRef": {"name": lock_service},
        "database": {"managed": {}},
        "railStub": {"enabled": true},
    }));
    ps.metadata = meta(name);
    ps
}

// ---------------------------------------------------------------- backend etcd

fn etcd_ls(etcd: serde_json::Value) -> LockService {
    lock_service(json!({"backend": "etcd", "etcd": etcd, "lockServer": {"replicas": 2}}))
}

fn etcd_inputs(quorum: bool) -> lockservice::children::Inputs<'static> {
    lockservice::children::Inputs {
        default_image: IMAGE,
        database_ready: quorum,
        migration: &JobState::Succeeded,
        db_secret_version: None,
        gated: false,
        signing_key: Some("k1"),
        scraper: None,
    }
}

fn arg_after<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
}

fn statefulset<'a>(d: &'a Desired, name: &str) -> &'a k8s_openapi::api::apps::v1::StatefulSet {
    match d.find(ChildKind::StatefulSet, name) {
        Some(Child::StatefulSet(s)) => s,
        _ => panic!("no StatefulSet {name}"),
    }
}

#[test]
fn managed_etcd_is_three_members_with_stable_peer_names_and_lock_server_on_them() {
    let ls = etcd_ls(json!({"managed": {}}));
    let owner = Owner::of(&ls).unwrap();
    let d = lockservice::children::desired(&ls, &owner, &etcd_inputs(true)).unwrap();
    let kinds: Vec<(ChildKind, &str)> = d.apply.iter().map(|c| (c.kind(), c.name())).collect();
    for want in [
        (ChildKind::Service, "locks-etcd"),
        (ChildKind::Service, "locks-etcd-client"),
        (ChildKind::StatefulSet, "locks-etcd"),
        (ChildKind::PodDisruptionBudget, "locks-etcd"),
        (ChildKind::NetworkPolicy, "locks-etcd"),
        (ChildKind::NetworkPolicy, "locks-lock-server"),
        (ChildKind::Deployment, "locks-lock-server"),
        (ChildKind::Service, "locks-lock-server"),
    ] {
        assert!(kinds.contains(&want), "{want:?} missing from {kinds:?}");
    }
    // No lockdb, no migration Job: etcd has no schema.
    assert_eq!(kinds.len(), 8, "{kinds:?}");
    assert!(d.migration_job.is_empty());
    assert!(
        kinds
            .iter()
            .all(|(k, n)| *k != ChildKind::Job && !n.contains("lockdb"))
    );
    for (name, m) in all_children(&d) {
        assert_eq!(
            m.owner_references.as_ref().map(Vec::len),
            Some(1),
            "{name} is not owned by the LockService"
        );
        let labels = m.labels.unwrap_or_default();
        assert_eq!(
            labels.get(super::LABEL_INSTANCE).map(String::as_str),
            Some("locks")
        );
        assert_eq!(
            labels.get(super::LABEL_MANAGED_BY).map(String::as_str),
            Some("dlock-operator")
        );
    }

    // The members: 3, started together, each bootstrapping the one cluster named by their DNS names.
    let sts = statefulset(&d, "locks-etcd");
    let spec = sts.spec.as_ref().unwrap();
    assert_eq!(spec.replicas, Some(3));
    assert_eq!(spec.service_name.as_deref(), Some("locks-etcd"));
    assert_eq!(spec.pod_management_policy.as_deref(), Some("Parallel"));
    let c = &containers(&Child::StatefulSet(sts.clone()))[0];
    assert_eq!(c.image.as_deref(), Some("registry.k8s.io/etcd:3.6.5-0"));
    let args = c.args.clone().unwrap();
    let flag = |name: &str| {
        args.iter()
            .find_map(|a| a.strip_prefix(&format!("--{name}=")))
            .unwrap_or_else(|| panic!("--{name} missing from {args:?}"))
            .to_owned()
    };
    assert_eq!(
        flag("initial-cluster"),
        "locks-etcd-0=http://locks-etcd-0.locks-etcd.pay.svc:2380,\
         locks-etcd-1=http://locks-etcd-1.locks-etcd.pay.svc:2380,\
         locks-etcd-2=http://locks-etcd-2.locks-etcd.pay.svc:2380"
    );
    assert_eq!(flag("initial-cluster-state"), "new");
    assert_eq!(flag("name"), "$(POD_NAME)");
    assert_eq!(
        flag("initial-advertise-peer-urls"),
        "http://$(POD_NAME).locks-etcd.pay.svc:2380"
    );
    assert_eq!(flag("initial-cluster-token"), "locks-etcd-uid-locks");
    let pod_name = env_of(c, "POD_NAME").unwrap();
    assert_eq!(
        pod_name
            .value_from
            .as_ref()
            .and_then(|v| v.field_ref.as_ref())
            .map(|f| f.field_path.as_str()),
        Some("metadata.name")
    );
    // The data directory is on the member's own volume (a claim template, 1Gi by default).
    let mount = &c.volume_mounts.as_ref().unwrap()[0];
    assert!(flag("data-dir").starts_with(&format!("{}/", mount.mount_path)));
    let claims = spec.volume_claim_templates.as_ref().unwrap();
    assert_eq!(claims[0].metadata.name.as_deref(), Some(mount.name.as_str()));
    assert_eq!(
        claims[0]
            .spec
            .as_ref()
            .unwrap()
            .resources
            .as_ref()
            .unwrap()
            .requests
            .as_ref()
            .unwrap()["storage"]
            .0,
        "1Gi"
    );
    let readiness = c.readiness_probe.as_ref().unwrap().http_get.as_ref().unwrap();
    assert_eq!(readiness.path.as_deref(), Some("/readyz"));
    assert!(
        flag("listen-metrics-urls").ends_with(":2381"),
        "the probe's port is served"
    );

    // Peer names resolve before any member is ready (it needs its peers to become ready).
    let Some(Child::Service(peer)) = d.find(ChildKind::Service, "locks-etcd") else {
        panic!()
    };
    let peer = peer.spec.as_ref().unwrap();
    assert_eq!(peer.cluster_ip.as_deref(), Some("None"));
    assert_eq!(peer.publish_not_ready_addresses, Some(true));
    let Some(Child::PodDisruptionBudget(pdb)) = d.find(ChildKind::PodDisruptionBudget, "locks-etcd") else {
        panic!()
    };
    assert_eq!(
        pdb.spec.as_ref().unwrap().min_available,
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(2))
    );

    // lock-server: --backend etcd over every member's client URL; no database anywhere.
    let dep = deployment(&d, "locks-lock-server");
    let ls_c = &containers(&Child::Deployment(dep.clone()))[0];
    let ls_args = ls_c.args.clone().unwrap();
    assert_eq!(arg_after(&ls_args, "--backend"), Some("etcd"));
    assert_eq!(
        arg_after(&ls_args, "--etcd-endpoints"),
        Some(
            "http://locks-etcd-0.locks-etcd.pay.svc:2379,http://locks-etcd-1.locks-etcd.pay.svc:2379,\
             http://locks-etcd-2.locks-etcd.pay.svc:2379"
        )
    );
    assert_eq!(arg_after(&ls_args, "--etcd-prefix"), Some("/dlock/"));
    assert!(env_of(ls_c, "DATABASE_URL").is_none());
    assert_eq!(
        secret_ref(env_of(ls_c, "DLOCK_ADMIN_TOKEN").unwrap()),
        ("locks-lock-server-admin".into(), "token".into())
    );
    assert_eq!(dep.spec.as_ref().unwrap().replicas, Some(2));
    assert_eq!(
        d.endpoints.get("etcd").map(String::as_str),
        Some("http://locks-etcd-client.pay.svc:2379")
    );
}

#[test]
fn lock_server_waits_for_a_quorum_of_members() {
    let ls = etcd_ls(json!({"managed": {}}));
    let owner = Owner::of(&ls).unwrap();
    let d = lockservice::children::desired(&ls, &owner, &etcd_inputs(false)).unwrap();
    assert!(d.find(ChildKind::Deployment, "locks-lock-server").is_none());
    assert!(d.find(ChildKind::StatefulSet, "locks-etcd").is_some());
    // Held, not swept: an existing lock-server stays as it is through a lost quorum.
    assert!(d.wants(ChildKind::Deployment, "locks-lock-server"));
    assert!(d.wants(ChildKind::Service, "locks-lock-server"));
    assert!(!d.endpoints.contains_key("lockServer"));
}

#[test]
fn managed_etcd_storage_and_size_follow_the_spec() {
    let ls = etcd_ls(json!({"managed": {"replicas": 5, "image": "etcd:custom",
        "storage": {"size": "2Gi", "storageClassName": "fast"}}, "keyPrefix": "/team-a/"}));
    let owner = Owner::of(&ls).unwrap();
    let d = lockservice::children::desired(&ls, &owner, &etcd_inputs(true)).unwrap();
    let sts = statefulset(&d, "locks-etcd");
    let spec = sts.spec.as_ref().unwrap();
    assert_eq!(spec.replicas, Some(5));
    let claim = spec.volume_claim_templates.as_ref().unwrap()[0]
        .spec
        .clone()
        .unwrap();
    assert_eq!(claim.storage_class_name.as_deref(), Some("fast"));
    assert_eq!(claim.resources.unwrap().requests.unwrap()["storage"].0, "2Gi");
    let c = &containers(&Child::StatefulSet(sts.clone()))[0];
    assert_eq!(c.image.as_deref(), Some("etcd:custom"));
    let cluster = c
        .args
        .iter()
        .flatten()
        .find(|a| a.starts_with("--initial-cluster="))
        .unwrap();
    assert_eq!(cluster.matches("=http://").count(), 5);
    let Some(Child::PodDisruptionBudget(pdb)) = d.find(ChildKind::PodDisruptionBudget, "locks-etcd") else {
        panic!()
    };
    assert_eq!(
        pdb.spec.as_ref().unwrap().min_available,
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(3))
    );
    let dep = deployment(&d, "locks-lock-server");
    let args = containers(&Child::Deployment(dep.clone()))[0]
        .args
        .clone()
        .unwrap();
    assert_eq!(
        arg_after(&args, "--etcd-endpoints").unwrap().split(',').count(),
        5
    );
    assert_eq!(arg_after(&args, "--etcd-prefix"), Some("/team-a/"));

    // One member: no PodDisruptionBudget (it would block every drain, and protects no quorum).
    let single = etcd_ls(json!({"managed": {"replicas": 1}}));
    let d = lockservice::children::desired(&single, &owner, &etcd_inputs(true)).unwrap();
    assert!(!d.wants(ChildKind::PodDisruptionBudget, "locks-etcd"));
    assert_eq!(
        statefulset(&d, "locks-etcd").spec.as_ref().unwrap().replicas,
        Some(1)
    );

    // emptyDir: a pod volume instead of a claim template.
    let ls = etcd_ls(json!({"managed": {"storage": {"emptyDir": true, "size": "256Mi"}}}));
    let d = lockservice::children::desired(&ls, &owner, &etcd_inputs(true)).unwrap();
    let spec = statefulset(&d, "locks-etcd").spec.clone().unwrap();
    assert!(spec.volume_claim_templates.is_none());
    let volumes = spec.template.spec.unwrap().volumes.unwrap();
    let dir = volumes[0].empty_dir.as_ref().unwrap();
    assert_eq!(volumes[0].name, "data");
    assert_eq!(dir.size_limit.as_ref().map(|q| q.0.as_str()), Some("256Mi"));
}

#[test]
fn external_etcd_endpoints_come_from_the_secret_and_no_member_is_run() {
    let ls = etcd_ls(json!({"external": {"secretRef": {"name": "prod-etcd"}}}));
    let owner = Owner::of(&ls).unwrap();
    let mut inputs = etcd_inputs(true);
    inputs.db_secret_version = Some("99");
    let d = lockservice::children::desired(&ls, &owner, &inputs).unwrap();
    let kinds: Vec<(ChildKind, &str)> = d.apply.iter().map(|c| (c.kind(), c.name())).collect();
    assert_eq!(
        kinds,
        vec![
            (ChildKind::NetworkPolicy, "locks-lock-server"),
            (ChildKind::Deployment, "locks-lock-server"),
            (ChildKind::Service, "locks-lock-server"),
        ]
    );
    // A managed cluster's children (from an earlier spec) are orphans.
    assert!(!d.wants(ChildKind::StatefulSet, "locks-etcd"));
    let dep = deployment(&d, "locks-lock-server");
    let c = &containers(&Child::Deployment(dep.clone()))[0];
    let args = c.args.clone().unwrap();
    assert_eq!(arg_after(&args, "--backend"), Some("etcd"));
    assert!(arg_after(&args, "--etcd-endpoints").is_none(), "{args:?}");
    assert_eq!(
        secret_ref(env_of(c, "DLOCK_ETCD_ENDPOINTS").unwrap()),
        ("prod-etcd".into(), "endpoints".into())
    );
    assert!(env_of(c, "DATABASE_URL").is_none());
    let annotations = dep
        .spec
        .as_ref()
        .unwrap()
        .template
        .metadata
        .as_ref()
        .unwrap()
        .annotations
        .clone();
    assert_eq!(
        annotations
            .unwrap_or_default()
            .get("dlock.dev/etcd-secret-version")
            .map(String::as_str),
        Some("99"),
        "a changed Secret restarts lock-server"
    );
    assert!(!d.endpoints.contains_key("etcd"));
}

#[test]
fn only_this_lock_services_lock_server_and_the_members_reach_etcd() {
    let ls = etcd_ls(json!({"managed": {}}));
    let owner = Owner::of(&ls).unwrap();
    let d = lockservice::children::desired(&ls, &owner, &etcd_inputs(true)).unwrap();
    let Some(Child::NetworkPolicy(np)) = d.find(ChildKind::NetworkPolicy, "locks-etcd") else {
        panic!()
    };
    let spec = np.spec.clone().unwrap();
    let pods = |sel: &Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector>| {
        sel.as_ref()
            .and_then(|s| s.match_labels.clone())
            .unwrap_or_default()
    };
    // It selects exactly the members' pods.
    let member_labels = statefulset(&d, "locks-etcd")
        .spec
        .as_ref()
        .unwrap()
        .template
        .metadata
        .clone()
        .unwrap()
        .labels
        .unwrap();
    let selected = pods(&spec.pod_selector);
    assert!(selected.iter().all(|(k, v)| member_labels.get(k) == Some(v)));
    assert_eq!(spec.policy_types, Some(vec!["Ingress".to_owned()]));
    let rules = spec.ingress.unwrap();
    assert_eq!(rules.len(), 2);
    let lock_server_pods = deployment(&d, "locks-lock-server")
        .spec
        .as_ref()
        .unwrap()
        .template
        .metadata
        .clone()
        .unwrap()
        .labels
        .unwrap();
    let ports = |r: &k8s_openapi::api::networking::v1::NetworkPolicyIngressRule| -> Vec<String> {
        r.ports
            .iter()
            .flatten()
            .map(|p| format!("{:?}", p.port))
            .collect()
    };
    for r in &rules {
        let from = r.from.clone().unwrap();
        assert_eq!(from.len(), 1);
        assert!(from[0].namespace_selector.is_none(), "this namespace only");
        let want = pods(&from[0].pod_selector);
        let matches_lock_server = want.iter().all(|(k, v)| lock_server_pods.get(k) == Some(v));
        let matches_members = want.iter().all(|(k, v)| member_labels.get(k) == Some(v));
        assert!(matches_lock_server != matches_members, "{want:?}");
        assert_eq!(want.get(super::LABEL_INSTANCE).map(String::as_str), Some("locks"));
        if matches_lock_server {
            assert_eq!(ports(r), vec!["Some(Int(2379))"]);
        } else {
            assert_eq!(ports(r), vec!["Some(Int(2379))", "Some(Int(2380))"]);
        }
    }
    // Another LockService's lock-server does not match.
    let mut other = lock_server_pods.clone();
    other.insert(super::LABEL_INSTANCE.into(), "other".into());
    let rule_selector = pods(&rules[0].from.as_ref().unwrap()[0].pod_selector);
    assert!(!rule_selector.iter().all(|(k, v)| other.get(k) == Some(v)));
}

#[test]
fn etcd_specs_that_bypassed_cel_are_refused() {
    let owner = Owner::of(&managed_ls()).unwrap();
    let no_block = lock_service(json!({"backend": "etcd"}));
    assert_eq!(
        lockservice::children::desired(&no_block, &owner, &etcd_inputs(true)),
        Err(super::SpecError::StoreMissing)
    );
    let both = etcd_ls(json!({"managed": {}, "external": {"secretRef": {"name": "x"}}}));
    assert_eq!(
        lockservice::children::desired(&both, &owner, &etcd_inputs(true)),
        Err(super::SpecError::EtcdMode)
    );
    // An etcd LockService has no migration Job to build.
    assert_eq!(
        lockservice::children::migration_job(&etcd_ls(json!({"managed": {}})), &owner, IMAGE).unwrap_err(),
        super::SpecError::StoreMissing
    );
}

#[test]
fn external_endpoints_are_checked_as_lock_server_reads_them() {
    use super::etcd_members::{EndpointsError, parse_endpoints};
    assert_eq!(
        parse_endpoints("http://a:2379,http://10.0.0.2:2379").unwrap(),
        vec!["http://a:2379".to_owned(), "http://10.0.0.2:2379".to_owned()]
    );
    assert_eq!(parse_endpoints("http://etcd.example").unwrap().len(), 1);
    assert_eq!(parse_endpoints(""), Err(EndpointsError::Empty));
    assert_eq!(
        parse_endpoints("http://a:2379\n"),
        Err(EndpointsError::Whitespace)
    );
    assert_eq!(
        parse_endpoints("http://a:2379, http://b:2379"),
        Err(EndpointsError::Whitespace)
    );
    assert_eq!(parse_endpoints("https://a:2379"), Err(EndpointsError::NotHttp(1)));
    assert_eq!(
        parse_endpoints("http://a:2379,b:2379"),
        Err(EndpointsError::NotHttp(2))
    );
    assert_eq!(parse_endpoints("http://a:2379,"), Err(EndpointsError::NotHttp(2)));
    assert_eq!(
        parse_endpoints("http://user:pw@a:2379"),
        Err(EndpointsError::NotHttp(1))
    );
    // The message never carries the entry itself.
    assert!(!EndpointsError::NotHttp(1).to_string().contains("pw"));
}

// ---------------------------------------------------------------- signed grants

fn configmap_ref(e: &EnvVar) -> (String, String) {
    let r = e
        .value_from
        .as_ref()
        .and_then(|v| v.config_map_key_ref.as_ref())
        .unwrap_or_else(|| panic!("{} is not read from a ConfigMap", e.name));
    (r.name.clone(), r.key.clone())
}

fn template_annotation(d: &Deployment, key: &str) -> Option<String> {
    d.spec
        .as_ref()?
        .template
        .metadata
        .as_ref()?
        .annotations
        .as_ref()?
        .get(key)
        .cloned()
}

/// lock-server alone gets the private key (one, by id, from the Secret); payment-resource and
/// rail-proxy get the public key set from the ConfigMap, with verification on; nothing else
/// references either.
#[test]
fn the_signing_key_goes_to_lock_server_only_and_the_public_keys_to_the_resources() {
    use super::deployments::{GRANT_PUBLIC_KEYS_ENV, GRANT_SIGNING_KEY_ENV, LOCK_SERVICE_ID_ENV};
    use super::grant_keys::{PUBLIC_KEYS_ANNOTATION, SIGNING_KEY_ANNOTATION};
    let ls = managed_ls();
    let owner = Owner::of(&ls).unwrap();
    let d = lockservice::children::desired(&ls, &owner, &ls_inputs(&JobState::Succeeded)).unwrap();
    let lock_server = deployment(&d, "locks-lock-server");
    let c = &containers(&Child::Deployment(lock_server.clone()))[0];
    assert_eq!(
        secret_ref(env_of(c, GRANT_SIGNING_KEY_ENV).expect("signing key env")),
        ("locks-grant-signing-keys".to_owned(), "k1".to_owned())
    );
    assert_eq!(
        env_of(c, LOCK_SERVICE_ID_ENV).and_then(|e| e.value.as_deref()),
        Some("pay/locks")
    );
    assert_eq!(
        template_annotation(lock_server, SIGNING_KEY_ANNOTATION).as_deref(),
        Some("k1")
    );
    assert!(env_of(c, GRANT_PUBLIC_KEYS_ENV).is_none());

    let ps = default_stack();
    let ps_owner = Owner::of(&ps).unwrap();
    let view = ready_lock_service();
    let p = paymentstack::children::desired(&ps, &ps_owner, &ps_inputs(&JobState::Succeeded, Some(&view)))
        .unwrap();
    for (name, switch) in [
        ("shop-payment-resource", "PAYMENT_GRANT_VERIFICATION_ENABLED"),
        ("shop-rail-proxy", "RAIL_PROXY_GRANT_VERIFICATION_ENABLED"),
    ] {
        let dep = deployment(&p, name);
        let c = &containers(&Child::Deployment(dep.clone()))[0];
        assert_eq!(
            configmap_ref(env_of(c, GRANT_PUBLIC_KEYS_ENV).expect("public keys env")),
            ("locks-grant-public-keys".to_owned(), "keys".to_owned()),
            "{name}"
        );
        assert_eq!(
            env_of(c, switch).and_then(|e| e.value.as_deref()),
            Some("true"),
            "{name}"
        );
        assert_eq!(
            template_annotation(dep, PUBLIC_KEYS_ANNOTATION),
            Some(super::grant_keys::checksum(&PUBLISHED_KEYS.to_text())),
            "{name}"
        );
        assert!(env_of(c, GRANT_SIGNING_KEY_ENV).is_none(), "{name}");
    }
    // Nothing but lock-server references the signing-key Secret; the executor gets no key at all.
    for child in p.apply.iter().chain(d.apply.iter()) {
        for c in containers(child) {
            for e in c.env.iter().flatten() {
                let secret = e.value_from.as_ref().and_then(|v| v.secret_key_ref.as_ref());
                if secret.is_some_and(|s| s.name == "locks-grant-signing-keys") {
                    assert_eq!(
                        child.name(),
                        "locks-lock-server",
                        "{} reads the signing key",
                        child.name()
                    );
                }
            }
        }
    }
    let executor = deployment(&p, "shop-payout-executor");
    let c = &containers(&Child::Deployment(executor.clone()))[0];
    assert!(env_of(c, GRANT_PUBLIC_KEYS_ENV).is_none() && env_of(c, GRANT_SIGNING_KEY_ENV).is_none());
}

/// A new key set rolls the resources (their template changes), not lock-server; a new signer rolls
/// lock-server, not the resources: resources first, signer after, each by its own annotation.
#[test]
fn a_changed_key_set_rolls_the_resources_and_a_new_signer_rolls_lock_server() {
    let ps = default_stack();
    let owner = Owner::of(&ps).unwrap();
    let before = ready_lock_service();
    let k2 = dlock_grant::SigningKey::generate(dlock_grant::KeyId::new("k2").unwrap());
    let after = LockServiceView {
        grant_keys: Some(PUBLISHED_KEYS.clone().with(k2.public_key()).unwrap().to_text()),
        ..ready_lock_service()
    };
    let template = |view: &LockServiceView, name: &str| {
        let p = paymentstack::children::desired(&ps, &owner, &ps_inputs(&JobState::Succeeded, Some(view)))
            .unwrap();
        serde_json::to_value(&deployment(&p, name).spec.as_ref().unwrap().template).unwrap()
    };
    for name in ["shop-payment-resource", "shop-rail-proxy"] {
        assert_ne!(
            template(&before, name),
            template(&after, name),
            "{name} does not roll"
        );
    }
    assert_eq!(
        template(&before, "shop-payout-executor"),
        template(&after, "shop-payout-executor")
    );

    let ls = managed_ls();
    let ls_owner = Owner::of(&ls).unwrap();
    let lock_template = |key: &str| {
        let mut inputs = ls_inputs(&JobState::Succeeded);
        inputs.signing_key = Some(key);
        let d = lockservice::children::desired(&ls, &ls_owner, &inputs).unwrap();
        serde_json::to_value(
            &deployment(&d, "locks-lock-server")
                .spec
                .as_ref()
                .unwrap()
                .template,
        )
        .unwrap()
    };
    assert_eq!(lock_template("k1"), lock_template("k1"));
    assert_ne!(lock_template("k1"), lock_template("k2"));
}

/// Before its first key exists lock-server is held (an existing one left as it is); before the
/// LockService publishes its keys the resources are held.
#[test]
fn lock_server_waits_for_its_key_and_the_resources_for_the_public_keys() {
    let ls = managed_ls();
    let owner = Owner::of(&ls).unwrap();
    let mut inputs = ls_inputs(&JobState::Succeeded);
    inputs.signing_key = None;
    let d = lockservice::children::desired(&ls, &owner, &inputs).unwrap();
    assert!(d.find(ChildKind::Deployment, "locks-lock-server").is_none());
    assert!(
        d.wants(ChildKind::Deployment, "locks-lock-server"),
        "held, not deleted"
    );

    let ps = default_stack();
    let ps_owner = Owner::of(&ps).unwrap();
    let unpublished = LockServiceView {
        grant_keys: None,
        ..ready_lock_service()
    };
    let p = paymentstack::children::desired(
        &ps,
        &ps_owner,
        &ps_inputs(&JobState::Succeeded, Some(&unpublished)),
    )
    .unwrap();
    for name in ["shop-payment-resource", "shop-rail-proxy", "shop-payout-executor"] {
        assert!(p.find(ChildKind::Deployment, name).is_none(), "{name}");
        assert!(p.wants(ChildKind::Deployment, name), "{name} held, not deleted");
    }
}

/// `killSwitches.grantVerificationEnabled: false` (a rolling migration): the resources are told so
/// and get no keys.
#[test]
fn grant_verification_can_be_switched_off_per_stack() {
    let ps = stack(json!({
        "lockServiceRef": {"name": "locks"},
        "database": {"managed": {}},
        "railStub": {"enabled": true},
        "killSwitches": {"grantVerificationEnabled": false},
    }));
    let owner = Owner::of(&ps).unwrap();
    let view = ready_lock_service();
    let p =
        paymentstack::children::desired(&ps, &owner, &ps_inputs(&JobState::Succeeded, Some(&view))).unwrap();
    for (name, switch) in [
        ("shop-payment-resource", "PAYMENT_GRANT_VERIFICATION_ENABLED"),
        ("shop-rail-proxy", "RAIL_PROXY_GRANT_VERIFICATION_ENABLED"),
    ] {
        let c = &containers(&Child::Deployment(deployment(&p, name).clone()))[0];
        assert_eq!(
            env_of(c, switch).and_then(|e| e.value.as_deref()),
            Some("false"),
            "{name}"
        );
        assert!(
            env_of(c, super::deployments::GRANT_PUBLIC_KEYS_ENV).is_none(),
            "{name}"
        );
    }
}

// ---------------------------------------------------------------- the scraper (Prometheus)

fn prometheus() -> super::network_policies::Scraper {
    super::network_policies::Scraper::new(
        Some("kubernetes.io/metadata.name=monitoring"),
        Some("app.kubernetes.io/name=prometheus"),
    )
    .unwrap()
    .unwrap()
}

/// Every NetworkPolicy the operator builds (both kinds, etcd members included), each with the port
/// its pods serve `/metrics` on.
fn every_policy(scraper: Option<&super::network_policies::Scraper>) -> Vec<(String, i32, Desired)> {
    let ls = managed_ls();
    let ls_owner = Owner::of(&ls).unwrap();
    let locks = lockservice::children::desired(
        &ls,
        &ls_owner,
        &lockservice::children::Inputs {
            scraper,
            ..ls_inputs(&JobState::Succeeded)
        },
    )
    .unwrap();
    let etcd = etcd_ls(json!({"managed": {"replicas": 3}}));
    let etcd_owner = Owner::of(&etcd).unwrap();
    let etcd_d = lockservice::children::desired(
        &etcd,
        &etcd_owner,
        &lockservice::children::Inputs {
            scraper,
            ..etcd_inputs(true)
        },
    )
    .unwrap();
    let shop = default_stack();
    let shop_owner = Owner::of(&shop).unwrap();
    let view = ready_lock_service();
    let stack = paymentstack::children::desired(
        &shop,
        &shop_owner,
        &paymentstack::children::Inputs {
            scraper,
            ..ps_inputs(&JobState::Succeeded, Some(&view))
        },
    )
    .unwrap();
    let mut out = Vec::new();
    for d in [locks, etcd_d, stack] {
        for p in policies(&d) {
            let name = p.metadata.name.clone().unwrap();
            let port = if name.ends_with("-etcd") {
                super::etcd_members::METRICS_PORT
            } else {
                8080
            };
            out.push((name, port, d.clone()));
        }
    }
    out
}

#[test]
fn network_policies_admit_the_named_prometheus_to_the_metrics_port_only() {
    let scraper = prometheus();
    let with = every_policy(Some(&scraper));
    let names: Vec<&str> = with.iter().map(|(n, _, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "locks-lock-server",
            "locks-etcd",
            "locks-lock-server",
            "shop-payment-resource",
            "shop-rail-proxy",
            "shop-rail-stub"
        ]
    );
    let prometheus: Pod = (
        "monitoring",
        [("app.kubernetes.io/name".to_owned(), "prometheus".to_owned())].into(),
    );
    let grafana_beside_it: Pod = (
        "monitoring",
        [("app.kubernetes.io/name".to_owned(), "grafana".to_owned())].into(),
    );
    let prometheus_elsewhere: Pod = ("pay", prometheus.1.clone());
    for (name, metrics_port, d) in &with {
        let policy = policies(d)
            .into_iter()
            .find(|p| p.metadata.name.as_deref() == Some(name.as_str()))
            .unwrap();
        assert!(admits_on(policy, &prometheus, *metrics_port), "{name}");
        assert!(
            !admits_on(policy, &grafana_beside_it, *metrics_port),
            "{name} admits grafana"
        );
        assert!(
            !admits_on(policy, &prometheus_elsewhere, *metrics_port),
            "{name} admits a prometheus-labelled pod of another namespace"
        );
        // Any other port of the pods stays closed to it (etcd's client and peer ports).
        for port in [2379, 2380, 5432, 8080, 2381] {
            if port != *metrics_port {
                assert!(
                    !admits_on(policy, &prometheus, port),
                    "{name} admits it on {port}"
                );
            }
        }
        // Exactly one rule for it, naming one port.
        let rules = policy.spec.as_ref().unwrap().ingress.clone().unwrap();
        let scrape_rules: Vec<_> = rules
            .iter()
            .filter(|r| {
                r.from.iter().flatten().any(|p| {
                    p.namespace_selector
                        .as_ref()
                        .and_then(|s| s.match_labels.as_ref())
                        .is_some_and(|l| l.contains_key("kubernetes.io/metadata.name"))
                })
            })
            .collect();
        assert_eq!(scrape_rules.len(), 1, "{name}: {rules:?}");
        assert_eq!(scrape_rules[0].ports.as_ref().unwrap().len(), 1, "{name}");
    }
    // Negative control: without a scraper named, the same pod is refused everywhere.
    for (name, metrics_port, d) in every_policy(None) {
        let policy = policies(&d)
            .into_iter()
            .find(|p| p.metadata.name.as_deref() == Some(name.as_str()))
            .unwrap();
        assert!(
            !admits_on(policy, &prometheus, metrics_port),
            "{name} admits an unnamed scraper"
        );
    }
}

#[test]
fn every_workload_serves_metrics_on_the_named_port() {
    let shop = default_stack();
    let owner = Owner::of(&shop).unwrap();
    let view = ready_lock_service();
    let p = paymentstack::children::desired(&shop, &owner, &ps_inputs(&JobState::Succeeded, Some(&view)))
        .unwrap();
    let ls = managed_ls();
    let ls_owner = Owner::of(&ls).unwrap();
    let l = lockservice::children::desired(&ls, &ls_owner, &ls_inputs(&JobState::Succeeded)).unwrap();
    let mut seen = Vec::new();
    for d in p.deployments().chain(l.deployments()) {
        let c = containers(&Child::Deployment(d.clone()))[0].clone();
        let ports = c.ports.clone().unwrap();
        assert_eq!(ports.len(), 1, "{:?}", d.metadata.name);
        assert_eq!(
            (ports[0].name.as_deref(), ports[0].container_port),
            (Some("http"), 8080)
        );
        assert_eq!(
            arg_after(c.args.as_deref().unwrap(), "--listen"),
            Some("0.0.0.0:8080"),
            "{:?}",
            d.metadata.name
        );
        seen.push(d.metadata.name.clone().unwrap());
    }
    seen.sort();
    assert_eq!(
        seen,
        [
            "locks-lock-server",
            "shop-payment-resource",
            "shop-payout-executor",
            "shop-rail-proxy",
            "shop-rail-stub"
        ]
    );
}

#[test]
fn prometheus_selectors_are_checked_like_kubernetes_labels() {
    use super::network_policies::{Scraper, ScraperError};
    assert_eq!(Scraper::new(None, None), Ok(None));
    assert_eq!(Scraper::new(Some(""), Some(" ")), Ok(None));
    assert!(
        Scraper::new(Some("team=obs, kubernetes.io/metadata.name=monitoring"), None)
            .unwrap()
            .is_some()
    );
    assert!(
        Scraper::new(None, Some("app.kubernetes.io/name=prometheus,empty="))
            .unwrap()
            .is_some()
    );
    for (ns, pods, want) in [
        (Some("monitoring"), None, "not key=value"),
        (Some("-bad=x"), None, "label key"),
        (Some("Bad.Prefix/name=x"), None, "label key"),
        (None, Some("app=-x"), "label value"),
        (None, Some(&*format!("app={}", "a".repeat(64))), "label value"),
        (None, Some("app=a,app=b"), "twice"),
    ] {
        let e: ScraperError = Scraper::new(ns, pods).unwrap_err();
        assert!(e.to_string().contains(want), "{ns:?} {pods:?}: {e}");
    }
    let e = Scraper::new(None, Some("app=a,app=b")).unwrap_err().to_string();
    assert!(e.starts_with("--prometheus-pod-selector"), "{e}");
}
