//! Every variable the operator sets on a container is one that container's binary reads. The names a
//! binary reads come from its own command line (clap's `Command` of the service's `Cli`, every
//! subcommand included), plus the few it reads outside clap, listed below with where they are read.
//! A variable nobody reads is a setting that silently does nothing (as `spec.lease` once was, set
//! as `DLOCK_LEASE_TTL_MS` on pods whose binaries read other names).

use std::collections::BTreeSet;

use clap::CommandFactory;
use k8s_openapi::api::core::v1::{Container, PodSpec};

use super::*;
use crate::actions::StackRef;
use crate::actions::jobs::{self, RestoreJobs};
use crate::crd::SecretKeyRef;

/// Read by every dlock binary outside clap: the log filter and format of
/// `dlock_common::telemetry::init`, which each binary runs at start-up (the servers through
/// `dlock_common::serve::main`).
const TELEMETRY: [&str; 2] = ["RUST_LOG", "DLOCK_LOG_FORMAT"];

/// Containers of other projects' images: their env is those images' settings (the postgres image's
/// `POSTGRES_*` and `PGDATA`, etcd's `ETCD_*` and the `POD_NAME` its arguments expand), checked where
/// they are built (tests/postgres.rs, tests/etcd_members.rs, tests/tls.rs for the postgres image's
/// certificate reloader).
const NOT_DLOCK: [&str; 3] = ["postgres", "etcd", crate::builders::tls::PG_RELOADER];

/// Every `env` name of a clap command, its subcommands' included.
fn clap_env_names(cmd: &clap::Command) -> BTreeSet<String> {
    let mut names: BTreeSet<String> = cmd
        .get_arguments()
        .filter_map(|a| a.get_env())
        .map(|n| n.to_string_lossy().into_owned())
        .collect();
    for sub in cmd.get_subcommands() {
        names.extend(clap_env_names(sub));
    }
    names
}

/// A credential read by `dlock_common::auth::Credential::from_env`: the variable or a file named by
/// `<NAME>_FILE`.
fn credential(name: &str) -> [String; 2] {
    [name.to_owned(), format!("{name}_FILE")]
}

/// The tokens `dlock_common::auth::Credentials::from_env(prefix, roles)` reads: `<PREFIX>_<ROLE>_TOKEN`.
fn role_tokens(prefix: &str, roles: &[&str]) -> Vec<String> {
    roles
        .iter()
        .flat_map(|r| credential(&format!("{prefix}_{r}_TOKEN")))
        .collect()
}

/// The value after `flag` in `args`, wherever it occurs.
fn values_of<'a>(args: &'a [String], flag: &str) -> Vec<&'a str> {
    args.windows(2)
        .filter(|w| w[0] == flag)
        .map(|w| w[1].as_str())
        .collect()
}

/// What the dlock binary `binary` reads from its environment when run with `args` (the variables
/// some flags name, e.g. `dlock-migrate --app-password-env NAME`), or `None` for a binary unknown
/// here.
fn reads(binary: &str, args: &[String]) -> Option<BTreeSet<String>> {
    let mut names: BTreeSet<String> = TELEMETRY.iter().map(|n| (*n).to_owned()).collect();
    match binary {
        "lock-server" => {
            names.extend(clap_env_names(&lock_server::Cli::command()));
            // main.rs reads the admin token itself (never a flag); the signing key is a credential.
            names.insert(lock_server::config::ADMIN_TOKEN_ENV.to_owned());
            names.extend(credential(dlock_common::grant::SIGNING_KEY_ENV));
        }
        "payment-resource" => {
            names.extend(clap_env_names(&payment_resource::config::Cli::command()));
            assert_eq!(payment_resource::config::ROLES.len(), 3);
            names.extend(role_tokens(
                payment_resource::config::CREDENTIALS_PREFIX,
                &["ADMIN", "EXECUTOR", "CLIENT"],
            ));
        }
        "rail-proxy" => {
            names.extend(clap_env_names(&rail_proxy::config::Cli::command()));
            assert_eq!(rail_proxy::config::ROLES.len(), 1);
            names.extend(role_tokens(rail_proxy::config::CREDENTIALS_PREFIX, &["EXECUTOR"]));
        }
        "rail-stub" => names.extend(clap_env_names(&rail_stub::config::Cli::command())),
        "payout-executor" => {
            names.extend(clap_env_names(&payout_executor::Cli::command()));
            names.extend(credential(payout_executor::config::PAYMENT_CREDENTIAL_ENV));
            names.extend(credential(payout_executor::config::RAIL_CREDENTIAL_ENV));
            // config.rs reads the lock client token itself (never a flag).
            names.insert(payout_executor::config::LOCK_TOKEN_ENV.to_owned());
        }
        // The clap definitions of these two are private to their main.rs, so their one fixed name
        // is listed here and checked against that source (see `fixed_names_are_in_the_source`).
        "dlock-migrate" => {
            names.insert(MIGRATE_FIXED.0.to_owned());
            names.extend(
                values_of(args, "--app-password-env")
                    .into_iter()
                    .map(str::to_owned),
            );
        }
        "dlock-fastforward" => {
            names.insert(FASTFORWARD_FIXED.0.to_owned());
            // `--paydb NAME=ENV`: the paydb URL of stack NAME is in variable ENV.
            names.extend(
                values_of(args, "--paydb")
                    .into_iter()
                    .filter_map(|v| v.split_once('=').map(|(_, var)| var.to_owned())),
            );
        }
        _ => return None,
    }
    Some(names)
}

/// `(name, how its main.rs reads it)` for the binaries whose clap definition is not reachable.
const MIGRATE_FIXED: (&str, &str) = ("DATABASE_URL", r#"env = "DATABASE_URL""#);
const FASTFORWARD_FIXED: (&str, &str) = ("DATABASE_URL", r#"std::env::var("DATABASE_URL")"#);

/// What is wrong with the env of one container: each variable its binary does not read, each
/// `envFrom` (whose names nobody can check), and a container whose binary is unknown.
fn unread(container: &Container) -> Vec<String> {
    if NOT_DLOCK.contains(&container.name.as_str()) {
        return Vec::new();
    }
    // The binary is the command (Jobs put their flags there too) or, without one, nothing known.
    let mut argv: Vec<String> = container.command.clone().unwrap_or_default();
    argv.extend(container.args.clone().unwrap_or_default());
    let Some(binary) = argv.first() else {
        return vec![format!("{}: no command, so no known binary", container.name)];
    };
    let Some(names) = reads(binary, &argv[1..]) else {
        return vec![format!("{}: unknown binary {binary}", container.name)];
    };
    // A variable another one expands (`$(NAME)` in a later value, as the kubelet does) is read by
    // the kubelet, for that one: e.g. the pod's name in payout-executor's owner id.
    let expanded: BTreeSet<&str> = container
        .env
        .iter()
        .flatten()
        .filter_map(|e| e.value.as_deref())
        .flat_map(|v| {
            v.split("$(")
                .skip(1)
                .filter_map(|rest| rest.split_once(')').map(|(n, _)| n))
        })
        .collect();
    let mut problems: Vec<String> = container
        .env
        .iter()
        .flatten()
        .filter(|e| !names.contains(&e.name) && !expanded.contains(e.name.as_str()))
        .map(|e| format!("{}: {binary} does not read {}", container.name, e.name))
        .collect();
    if container.env_from.as_ref().is_some_and(|f| !f.is_empty()) {
        problems.push(format!("{}: envFrom sets names nobody checks", container.name));
    }
    problems
}

/// Every container and init container of a pod.
fn pod_containers(pod: &PodSpec) -> impl Iterator<Item = &Container> {
    pod.init_containers.iter().flatten().chain(&pod.containers)
}

fn pod_spec(child: &Child) -> Option<&PodSpec> {
    match child {
        Child::StatefulSet(s) => s.spec.as_ref()?.template.spec.as_ref(),
        Child::Job(j) => j.spec.as_ref()?.template.spec.as_ref(),
        Child::Deployment(d) => d.spec.as_ref()?.template.spec.as_ref(),
        Child::Service(_)
        | Child::NetworkPolicy(_)
        | Child::PodDisruptionBudget(_)
        | Child::PostgresCluster(_)
        | Child::Secret(_) => None,
    }
}

/// Every pod the operator builds for a representative set of objects: a LockService on lockdb, one
/// on a managed etcd and one on an external etcd; a PaymentStack on it (every workload, the stub
/// included) and its demo-seeded migration; the restore and check Jobs of the actions.
fn every_pod() -> Vec<(String, PodSpec)> {
    let mut desired = Vec::new();
    // With HTTPS on, so the certificate and CA variables are checked too.
    let wiring = crate::builders::tls::TlsWiring {
        https: true,
        bundle: Some("bundle".into()),
    };
    let https = |obj_owner: Option<Owner>| Owner {
        https: true,
        ..obj_owner.unwrap()
    };
    let ls = managed_ls();
    let owner = https(Owner::of(&ls));
    desired.push(
        lockservice::children::desired(&ls, &owner, &ls_inputs(&JobState::Succeeded))
            .unwrap()
            .with_tls(&owner, &wiring),
    );
    for etcd in [
        json!({"managed": {"replicas": 3}}),
        json!({"external": {"secretRef": {"name": "etcd-endpoints"}}}),
    ] {
        let ls = etcd_ls(etcd);
        let owner = Owner::of(&ls).unwrap();
        desired.push(lockservice::children::desired(&ls, &owner, &etcd_inputs(true)).unwrap());
    }
    let ps = default_stack();
    let ps_owner = https(Owner::of(&ps));
    let view = ready_lock_service();
    desired.push(
        paymentstack::children::desired(&ps, &ps_owner, &ps_inputs(&JobState::Succeeded, Some(&view)))
            .unwrap()
            .with_tls(&ps_owner, &wiring),
    );

    let mut children: Vec<Child> = desired.into_iter().flat_map(|d| d.apply).collect();
    let mut demo = ps.clone();
    demo.spec.demo_data = true;
    children.push(Child::Job(
        paymentstack::children::migration_job(&demo, &ps_owner, IMAGE).unwrap(),
    ));
    let admin_url = SecretKeyRef {
        name: "locks-lockdb-conn".into(),
        key: "admin-url".into(),
    };
    let restore = RestoreJobs {
        owner: &owner,
        image: IMAGE,
        lockdb_admin_url: &admin_url,
    };
    let stacks = [StackRef {
        name: "shop".into(),
        connection_ready: true,
        migrated: true,
    }];
    children.push(Child::Job(jobs::read_job(
        &restore,
        "locks-ff-read".into(),
        jobs::RESTORE_COMPONENT,
        &stacks,
    )));
    children.push(Child::Job(jobs::advance_job(
        &restore,
        "locks-ff-advance".into(),
        42,
    )));
    children
        .iter()
        .filter_map(|c| Some((c.name().to_owned(), pod_spec(c)?.clone())))
        .collect()
}

#[test]
fn every_variable_the_operator_sets_is_read_by_the_binary_it_runs() {
    let mut problems = Vec::new();
    let mut binaries = BTreeSet::new();
    let mut checked = 0;
    for (pod, spec) in every_pod() {
        for c in pod_containers(&spec) {
            problems.extend(unread(c).into_iter().map(|p| format!("{pod}/{p}")));
            if let Some(b) = c.command.as_ref().and_then(|c| c.first()) {
                binaries.insert(b.clone());
            }
            checked += c.env.iter().flatten().count();
        }
    }
    assert!(problems.is_empty(), "{problems:#?}");
    // The objects above run every binary the operator deploys, and set plenty to check.
    assert_eq!(
        binaries,
        BTreeSet::from(
            [
                "dlock-fastforward",
                "dlock-migrate",
                "etcd",
                "lock-server",
                "payment-resource",
                "payout-executor",
                "rail-proxy",
                "rail-stub",
                // The managed PostgreSQL's certificate reloader, a shell script.
                "sh",
            ]
            .map(String::from)
        )
    );
    assert!(checked > 30, "{checked}");
}

/// The lease of the LockService reaches the executor as its command line reads it: each plain
/// variable of the container handed to clap as the flag of the argument that reads that variable,
/// the result checked by the executor's own validation.
#[test]
fn the_lock_services_lease_reaches_the_executors_config() {
    let ps = default_stack();
    let owner = Owner::of(&ps).unwrap();
    // Neither value is the executor's default (5 s leases, 15 s sessions): only the spec can set them.
    let view = LockServiceView {
        lease: LeaseSpec {
            default_ttl_ms: 4_000,
            session_ttl_ms: 12_000,
        },
        ..ready_lock_service()
    };
    let p =
        paymentstack::children::desired(&ps, &owner, &ps_inputs(&JobState::Succeeded, Some(&view))).unwrap();
    let c = containers(&Child::Deployment(deployment(&p, "shop-payout-executor").clone()))[0].clone();
    let cmd = payout_executor::Cli::command();
    let mut argv = vec!["payout-executor".to_owned()];
    argv.extend(c.args.clone().unwrap_or_default());
    let mut handed = Vec::new();
    for e in c.env.iter().flatten() {
        // Secrets are not plain values: the credentials are checked by name above.
        let Some(value) = &e.value else { continue };
        let long = cmd
            .get_arguments()
            .find(|a| a.get_env() == Some(std::ffi::OsStr::new(&e.name)))
            .and_then(|a| a.get_long())
            .unwrap_or_else(|| panic!("no argument of payout-executor reads {}", e.name));
        argv.extend([format!("--{long}"), value.clone()]);
        handed.push(e.name.clone());
    }
    assert_eq!(
        handed,
        [
            "PAYOUT_EXECUTOR_LEASE_TTL_MS",
            "PAYOUT_EXECUTOR_SESSION_TTL_MS",
            // Its lock client's owner id (`$(POD_NAME)` is the kubelet's to expand).
            "PAYOUT_EXECUTOR_OWNER_ID"
        ]
    );
    let cli = <payout_executor::Cli as clap::Parser>::try_parse_from(&argv).unwrap();
    let config = cli.into_config().unwrap();
    assert_eq!(config.lease_ttl, std::time::Duration::from_millis(4_000));
    assert_eq!(config.session_ttl, std::time::Duration::from_millis(12_000));
}

/// Negative control of the check: the lease names the operator used to set, on the containers they
/// were set on, are reported; so are a variable from the pod's own metadata that the binary does not
/// read, an `envFrom`, and a binary the check does not know.
#[test]
fn the_check_reports_what_a_binary_does_not_read() {
    let container = |command: &str, env: Vec<k8s_openapi::api::core::v1::EnvVar>| Container {
        name: "c".into(),
        command: Some(vec![command.into()]),
        env: Some(env),
        ..Container::default()
    };
    let old_lease = || {
        vec![
            crate::builders::env("DLOCK_LEASE_TTL_MS", "10000"),
            crate::builders::env("DLOCK_SESSION_TTL_MS", "30000"),
        ]
    };
    for binary in ["payout-executor", "lock-server"] {
        assert_eq!(
            unread(&container(binary, old_lease())),
            [
                format!("c: {binary} does not read DLOCK_LEASE_TTL_MS"),
                format!("c: {binary} does not read DLOCK_SESSION_TTL_MS"),
            ]
        );
    }
    // The names it reads pass, and so does the log filter.
    assert_eq!(
        unread(&container(
            "payout-executor",
            vec![
                crate::builders::env("PAYOUT_EXECUTOR_LEASE_TTL_MS", "10000"),
                crate::builders::env("PAYOUT_EXECUTOR_SESSION_TTL_MS", "30000"),
                crate::builders::env("RUST_LOG", "info"),
            ]
        )),
        Vec::<String>::new()
    );
    let pod_name = k8s_openapi::api::core::v1::EnvVar {
        name: "POD_NAME".into(),
        value: None,
        value_from: Some(k8s_openapi::api::core::v1::EnvVarSource {
            field_ref: Some(k8s_openapi::api::core::v1::ObjectFieldSelector {
                field_path: "metadata.name".into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
    };
    assert_eq!(
        unread(&container("rail-stub", vec![pod_name])),
        ["c: rail-stub does not read POD_NAME"]
    );
    let mut from = container("rail-stub", Vec::new());
    from.env_from = Some(vec![Default::default()]);
    assert_eq!(unread(&from), ["c: envFrom sets names nobody checks"]);
    assert_eq!(unread(&container("sh", Vec::new())), ["c: unknown binary sh"]);
    // A name a flag hands over is read only when the flag names it.
    let mut migrate = container("dlock-migrate", vec![crate::builders::env("APP_PASSWORD", "x")]);
    assert_eq!(unread(&migrate), ["c: dlock-migrate does not read APP_PASSWORD"]);
    migrate.args = Some(vec!["--app-password-env".into(), "APP_PASSWORD".into()]);
    assert!(unread(&migrate).is_empty());
}

/// The names listed for the two binaries whose clap definition is private to their main.rs are
/// read there, as stated.
#[test]
fn fixed_names_are_in_the_source() {
    let migrate = include_str!("../../../../services/migrator/src/main.rs");
    let fastforward = include_str!("../../../../services/fastforward/src/main.rs");
    assert!(migrate.contains(MIGRATE_FIXED.1), "{MIGRATE_FIXED:?}");
    assert!(fastforward.contains(FASTFORWARD_FIXED.1), "{FASTFORWARD_FIXED:?}");
    assert!(migrate.contains("app_password_env") && fastforward.contains("NAME=ENV"));
}

/// What the CRD accepts for `spec.lease` the executor accepts too: the bounds of the schema, each
/// parsed and checked by payout-executor's own command line.
#[test]
fn the_crds_lease_bounds_are_accepted_by_the_executor() {
    let crd = serde_json::to_value(<LockService as kube::CustomResourceExt>::crd()).unwrap();
    let lease = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
        ["lease"]["properties"];
    let mut bounds = Vec::new();
    for field in ["defaultTtlMs", "sessionTtlMs"] {
        for bound in ["minimum", "maximum"] {
            // schemars writes the bounds as JSON numbers with a fraction (`100.0`).
            let v = lease[field][bound]
                .as_f64()
                .unwrap_or_else(|| panic!("{field} has no {bound}: {lease}"));
            assert_eq!(v.fract(), 0.0, "{field} {bound}");
            bounds.push(v as i64);
        }
    }
    for ms in bounds {
        let ms = ms.to_string();
        let cli = <payout_executor::Cli as clap::Parser>::try_parse_from([
            "payout-executor",
            "--lock-server-url",
            "http://127.0.0.1:1",
            "--payment-resource-url",
            "http://127.0.0.1:2",
            "--rail-proxy-url",
            "http://127.0.0.1:3",
            "--lease-ttl-ms",
            &ms,
            "--session-ttl-ms",
            &ms,
        ])
        .unwrap();
        assert!(cli.into_config().is_ok(), "{ms}");
    }
}
