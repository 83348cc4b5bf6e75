//! The Helm chart: its CRDs are the generated ones, it lints, it renders into objects a real API
//! server accepts, and its RBAC grants what the operator needs and nothing else.

use std::collections::BTreeMap;

use dlock_e2e::{crds, env, helm, k8s, rbac, require_cluster};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// Runs without a cluster: the chart's copy of the CRDs must be byte-identical to `crds/`.
#[test]
fn chart_crds_match_generated() {
    let generated = crds::yaml_files(&crds::generated_dir());
    let chart = crds::yaml_files(&crds::chart_dir());
    assert!(
        !generated.is_empty(),
        "crds/ is empty: run cargo run -p dlock-operator --bin crdgen"
    );
    let problems = crds::diff(&generated, &chart);
    assert!(
        problems.is_empty(),
        "the chart's CRDs are stale (run charts/sync-crds.sh): {problems:?}"
    );
}

/// Negative control for the check above: a one-byte edit, a missing file and an extra file are each
/// reported.
#[test]
fn crd_diff_detects_drift() {
    let generated = crds::yaml_files(&crds::generated_dir());
    let Some((first, bytes)) = generated.iter().next() else {
        panic!("crds/ is empty: run cargo run -p dlock-operator --bin crdgen");
    };
    assert!(crds::diff(&generated, &generated.clone()).is_empty());

    let mut edited = generated.clone();
    let mut changed = bytes.clone();
    changed.push(b'\n');
    edited.insert(first.clone(), changed);
    assert_eq!(
        crds::diff(&generated, &edited).len(),
        1,
        "an edited copy is reported"
    );

    let mut missing = generated.clone();
    missing.remove(first);
    assert_eq!(
        crds::diff(&generated, &missing).len(),
        1,
        "a missing copy is reported"
    );

    let mut extra: BTreeMap<String, Vec<u8>> = generated.clone();
    extra.insert("stale.yaml".into(), b"kind: CustomResourceDefinition\n".to_vec());
    assert_eq!(
        crds::diff(&generated, &extra).len(),
        1,
        "an extra file is reported"
    );
}

/// `helm lint --strict`, with the defaults and with every optional part switched on.
#[test]
fn helm_lint() {
    let Some(helm_bin) = helm::helm("helm_lint") else {
        return;
    };
    let chart = helm::chart_dir();
    let chart = chart.to_string_lossy();
    for sets in [
        vec![],
        vec![
            "--set",
            "networkPolicy.enabled=true",
            "--set",
            "serviceMonitor.enabled=true",
            "--set",
            "watchNamespace=payments",
        ],
        vec!["--set", "replicaCount=1", "--set", "leaderElection.enabled=false"],
    ] {
        let mut args = vec!["lint", "--strict", &chart];
        args.extend(sets.iter().copied());
        let (ok, stdout, stderr) = helm::run(&helm_bin, &args);
        assert!(ok, "helm {}:\n{stdout}\n{stderr}", args.join(" "));
    }
}

/// Negative control for the chart's own guard: two replicas without leader election must not render.
#[test]
fn chart_refuses_two_active_replicas() {
    let Some(helm_bin) = helm::helm("chart_refuses_two_active_replicas") else {
        return;
    };
    let chart = helm::chart_dir();
    let (ok, _, stderr) = helm::run(
        &helm_bin,
        &[
            "template",
            "x",
            &chart.to_string_lossy(),
            "--set",
            "replicaCount=2",
            "--set",
            "leaderElection.enabled=false",
        ],
    );
    assert!(!ok, "rendering must fail");
    assert!(stderr.contains("two active reconcilers"), "{stderr}");
}

/// `helm lint --strict` of the chart with `values` (YAML text) as a values file: (passed, the
/// output, stdout and stderr together).
fn lint_with_values(helm_bin: &std::path::Path, values: &str) -> (bool, String) {
    let scratch = env::Scratch::new("values");
    let file = scratch.path().join("values.yaml");
    std::fs::write(&file, values).unwrap_or_else(|e| panic!("write {}: {e}", file.display()));
    let chart = helm::chart_dir();
    let (ok, stdout, stderr) = helm::run(
        helm_bin,
        &[
            "lint",
            "--strict",
            &chart.to_string_lossy(),
            "-f",
            &file.to_string_lossy(),
        ],
    );
    (ok, format!("{stdout}\n{stderr}"))
}

/// values.schema.json refuses a misspelt key, at the top level and inside an object, and names it;
/// the same files with the key spelt right pass (so the failure is the typo, not the file).
#[test]
fn values_schema_refuses_misspelt_keys() {
    let Some(helm_bin) = helm::helm("values_schema_refuses_misspelt_keys") else {
        return;
    };
    for (typo, key, right) in [
        ("replicaCont: 3\n", "replicaCont", "replicaCount: 3\n"),
        (
            "image:\n  tagg: \"1.2.3\"\n",
            "tagg",
            "image:\n  tag: \"1.2.3\"\n",
        ),
        (
            "podDisruptionBudget:\n  enable: false\n",
            "enable",
            "podDisruptionBudget:\n  enabled: false\n",
        ),
        (
            "networkPolicy:\n  egress:\n    apiServerPort: [443]\n",
            "apiServerPort",
            "networkPolicy:\n  egress:\n    apiServerPorts: [443]\n",
        ),
    ] {
        let (ok, out) = lint_with_values(&helm_bin, typo);
        assert!(!ok, "a values file with {key:?} must fail helm lint:\n{out}");
        assert!(
            out.contains(&format!("'{key}' not allowed")),
            "the error names {key:?}:\n{out}"
        );
        let (ok, out) = lint_with_values(&helm_bin, right);
        assert!(ok, "the same file spelt right must pass:\n{right}\n{out}");
    }
}

/// values.schema.json checks types, enums and bounds; the default values (an empty values file)
/// pass.
#[test]
fn values_schema_refuses_wrong_types_and_bounds() {
    let Some(helm_bin) = helm::helm("values_schema_refuses_wrong_types_and_bounds") else {
        return;
    };
    let (ok, out) = lint_with_values(&helm_bin, "");
    assert!(ok, "the default values must pass:\n{out}");
    for (bad, at) in [
        ("replicaCount: \"two\"\n", "/replicaCount"),
        ("replicaCount: 0\n", "/replicaCount"),
        ("image:\n  pullPolicy: Sometimes\n", "/image/pullPolicy"),
        ("image:\n  digest: \"@sha256:abc\"\n", "/image/digest"),
        ("metrics:\n  port: 70000\n", "/metrics/port"),
        (
            "serviceAccount:\n  tokenExpirationSeconds: 60\n",
            "/serviceAccount/tokenExpirationSeconds",
        ),
        (
            "podDisruptionBudget:\n  enabled: \"yes\"\n",
            "/podDisruptionBudget/enabled",
        ),
    ] {
        let (ok, out) = lint_with_values(&helm_bin, bad);
        assert!(!ok, "{bad:?} must fail helm lint:\n{out}");
        assert!(
            out.contains(&format!("at '{at}'")),
            "the error points at {at}:\n{out}"
        );
    }
}

/// The PodDisruptionBudget: rendered for two replicas (one may be evicted at a time, selecting the
/// operator pods), not for one (it would block every drain of the node), not when switched off.
#[test]
fn chart_renders_pdb_only_for_several_replicas() {
    let Some(helm_bin) = helm::helm("chart_renders_pdb_only_for_several_replicas") else {
        return;
    };
    let pdbs = |sets: &[(&str, &str)]| {
        let yaml = helm::template(&helm_bin, "dlock-operator", "dlock-system", sets, &[]);
        helm::rendered::<PodDisruptionBudget>(&yaml)
    };
    let two = pdbs(&[("replicaCount", "2")]);
    assert_eq!(two.len(), 1, "replicaCount 2 renders one PodDisruptionBudget");
    let spec = two[0].spec.as_ref().expect("the PodDisruptionBudget has a spec");
    assert_eq!(spec.max_unavailable, Some(IntOrString::Int(1)));
    assert_eq!(spec.min_available, None);
    let selected = spec
        .selector
        .as_ref()
        .and_then(|s| s.match_labels.clone())
        .unwrap_or_default();
    let deployment = helm::template(
        &helm_bin,
        "dlock-operator",
        "dlock-system",
        &[],
        &["--show-only", "templates/deployment.yaml"],
    );
    let deps = helm::rendered::<Deployment>(&deployment);
    let pod_labels = deps
        .first()
        .and_then(|d| d.spec.as_ref())
        .and_then(|s| s.template.metadata.as_ref())
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    assert!(!selected.is_empty(), "the budget selects by labels");
    for (k, v) in &selected {
        assert_eq!(pod_labels.get(k), Some(v), "the operator pods carry {k}={v}");
    }

    assert!(
        pdbs(&[("replicaCount", "1")]).is_empty(),
        "no budget for one replica"
    );
    assert!(
        pdbs(&[("replicaCount", "3"), ("podDisruptionBudget.enabled", "false")]).is_empty(),
        "no budget when switched off"
    );
}

/// The operator container by default: CPU and memory requests and limits, no automounted token
/// but a projected one with a bounded lifetime at the path the in-cluster client reads, and the
/// image by tag, or by digest when one is given.
#[test]
fn chart_deployment_is_hardened_by_default() {
    let Some(helm_bin) = helm::helm("chart_deployment_is_hardened_by_default") else {
        return;
    };
    let deployment = |sets: &[(&str, &str)]| {
        let yaml = helm::template(
            &helm_bin,
            "dlock-operator",
            "dlock-system",
            sets,
            &["--show-only", "templates/deployment.yaml"],
        );
        let mut deps = helm::rendered::<Deployment>(&yaml);
        assert_eq!(deps.len(), 1, "the chart renders one Deployment");
        deps.remove(0)
    };
    let dep = deployment(&[]);
    let template = &dep.spec.as_ref().expect("the Deployment has a spec").template;
    let c = k8s::container(template, "the chart's Deployment");
    let resources = c.resources.as_ref().expect("the container has resources");
    for (what, map) in [("requests", &resources.requests), ("limits", &resources.limits)] {
        let map = map.clone().unwrap_or_default();
        for r in ["cpu", "memory"] {
            assert!(map.contains_key(r), "no {r} in {what}: {resources:?}");
        }
    }

    let pod = template.spec.as_ref().expect("the pod template has a spec");
    assert_eq!(pod.automount_service_account_token, Some(false));
    let mount = c
        .volume_mounts
        .as_deref()
        .unwrap_or_default()
        .iter()
        .find(|m| m.mount_path == "/var/run/secrets/kubernetes.io/serviceaccount")
        .expect("the API credentials are mounted where the in-cluster client reads them");
    let volume = pod
        .volumes
        .as_deref()
        .unwrap_or_default()
        .iter()
        .find(|v| v.name == mount.name)
        .expect("the mounted volume exists");
    let sources = volume
        .projected
        .as_ref()
        .and_then(|p| p.sources.clone())
        .unwrap_or_default();
    let token = sources
        .iter()
        .find_map(|s| s.service_account_token.as_ref())
        .expect("a projected service account token");
    assert_eq!(token.path, "token");
    assert_eq!(token.expiration_seconds, Some(3600));
    assert!(
        sources.iter().any(|s| s
            .config_map
            .as_ref()
            .is_some_and(|m| m.name == "kube-root-ca.crt")),
        "the cluster CA is projected next to the token"
    );
    assert!(
        sources.iter().any(|s| s.downward_api.is_some()),
        "the namespace file is projected"
    );

    // By tag, the chart's appVersion by default; by digest when one is given, for the children too.
    let chart_yaml = std::fs::read_to_string(helm::chart_dir().join("Chart.yaml"))
        .unwrap_or_else(|e| panic!("read Chart.yaml: {e}"));
    let chart_yaml: serde_yaml::Value =
        serde_yaml::from_str(&chart_yaml).unwrap_or_else(|e| panic!("parse Chart.yaml: {e}"));
    let app_version = chart_yaml
        .get("appVersion")
        .and_then(serde_yaml::Value::as_str)
        .expect("Chart.yaml has an appVersion");
    assert_eq!(
        c.image.as_deref(),
        Some(format!("ghcr.io/dlock-dev/dlock:{app_version}").as_str())
    );
    let digest = format!("sha256:{}", "ab".repeat(32));
    let pinned = deployment(&[("image.digest", &digest), ("image.tag", "ignored")]);
    let c = k8s::container(
        &pinned.spec.as_ref().expect("a spec").template,
        "the chart's Deployment",
    );
    let expected = format!("ghcr.io/dlock-dev/dlock@{digest}");
    assert_eq!(c.image.as_deref(), Some(expected.as_str()));
    let args = c.args.clone().unwrap_or_default();
    assert!(args.contains(&format!("--image={expected}")), "{args:?}");
}

/// The rendered chart (CRDs included) passes the API server's own validation and admission with
/// `kubectl apply --dry-run=server`, for the default values and for the all-options variant.
/// (kubectl: `helm template | kubectl apply` is how the chart reaches a cluster without helm.)
#[tokio::test]
async fn rendered_chart_applies_with_server_dry_run() {
    let c = require_cluster!("rendered_chart_applies_with_server_dry_run");
    let Some(helm_bin) = helm::helm("rendered_chart_applies_with_server_dry_run") else {
        panic!("DLOCK_E2E=1 but helm is missing: run scripts/cluster-tools.sh");
    };
    let k = &c.kubectl;
    let ns = env::unique_name("chart");
    k8s::namespace(&c.client, &ns).await;
    for sets in [
        vec![],
        vec![("watchNamespace", ns.as_str()), ("networkPolicy.enabled", "true")],
    ] {
        let yaml = helm::template(&helm_bin, "dlock-operator", &ns, &sets, &["--include-crds"]);
        let out = k
            .run_stdin(&["apply", "--dry-run=server", "-n", &ns, "-f", "-"], &yaml)
            .await
            .ok();
        for kind in [
            "customresourcedefinition",
            "serviceaccount",
            "clusterrole",
            "deployment",
            "service",
            // Two replicas by default, so the PodDisruptionBudget is rendered and validated too.
            "poddisruptionbudget",
        ] {
            assert!(
                out.stdout.contains(&format!("{kind}.")) || out.stdout.contains(&format!("{kind}/")),
                "no {kind} in the dry-run output (values {sets:?}):\n{}",
                out.stdout
            );
        }
        assert!(out.stdout.contains("(server dry run)"), "{}", out.stdout);
    }
    // The Deployment as documented: two leader-elected replicas, non-root, read-only root
    // filesystem, probes on /healthz and /readyz of the metrics port.
    let yaml = helm::template(
        &helm_bin,
        "dlock-operator",
        &ns,
        &[],
        &["--show-only", "templates/deployment.yaml"],
    );
    let deps = helm::rendered::<Deployment>(&yaml);
    assert_eq!(deps.len(), 1, "the chart renders one Deployment");
    let spec = deps[0].spec.as_ref().expect("the Deployment has a spec");
    assert_eq!(spec.replicas, Some(2));
    let pod = spec.template.spec.as_ref().expect("the pod template has a spec");
    let pod_security = pod.security_context.as_ref().expect("a pod securityContext");
    assert_eq!(pod_security.run_as_non_root, Some(true));
    assert_eq!(pod_security.run_as_user, Some(65532));
    let c = k8s::container(&spec.template, "the chart's Deployment");
    let security = c.security_context.as_ref().expect("a container securityContext");
    assert_eq!(security.read_only_root_filesystem, Some(true));
    assert_eq!(security.allow_privilege_escalation, Some(false));
    let dropped = security.capabilities.as_ref().and_then(|c| c.drop.as_ref());
    assert_eq!(dropped.and_then(|d| d.first()).map(String::as_str), Some("ALL"));
    let path = |p: Option<&k8s_openapi::api::core::v1::Probe>| {
        p.and_then(|p| p.http_get.as_ref()).and_then(|h| h.path.clone())
    };
    assert_eq!(path(c.liveness_probe.as_ref()).as_deref(), Some("/healthz"));
    assert_eq!(path(c.readiness_probe.as_ref()).as_deref(), Some("/readyz"));
    let ports = c.ports.as_deref().unwrap_or_default();
    assert_eq!(ports.first().map(|p| p.container_port), Some(8080));
    let args = c.args.clone().unwrap_or_default();
    assert!(
        args.iter().any(|a| a.contains("--leader-election=true")),
        "{args:?}"
    );
    assert!(
        !args.iter().any(|a| a.contains("--namespace=")),
        "all namespaces by default: {args:?}"
    );

    // Negative control: the same check rejects a broken object, so a pass above means something.
    let broken = helm::template(
        &helm_bin,
        "dlock-operator",
        &ns,
        &[],
        &["--show-only", "templates/deployment.yaml"],
    )
    .replace("containerPort:", "containerPort: -1 #");
    let out = k
        .run_stdin(&["apply", "--dry-run=server", "-n", &ns, "-f", "-"], &broken)
        .await;
    assert!(
        !out.success,
        "a Deployment with containerPort -1 must be rejected: {}",
        out.stdout
    );
}

/// The chart's RBAC, applied for real and probed with access reviews (what `kubectl auth can-i`
/// asks) as the operator's ServiceAccount: everything the operator needs in its namespace, nothing
/// outside it, and nothing it has no business doing anywhere.
#[tokio::test]
async fn chart_rbac_is_least_privilege() {
    let c = require_cluster!("chart_rbac_is_least_privilege");
    let Some(helm_bin) = helm::helm("chart_rbac_is_least_privilege") else {
        panic!("DLOCK_E2E=1 but helm is missing: run scripts/cluster-tools.sh");
    };
    // The operator's own resources exist, as they would where the chart is installed.
    crds::install(&c.client).await;
    let ns = env::unique_name("rbac");
    let other = env::unique_name("rbac-other");
    k8s::namespace(&c.client, &other).await;
    let scratch = env::Scratch::new("rbac");
    let id = rbac::install(&c, &helm_bin, &ns, &ns, scratch.path()).await;
    let user = id.user.as_str();
    let subject = id.subject();
    let can =
        async |verb: &str, res: &str, ns: Option<&str>| rbac::can_i(&c.client, &subject, verb, res, ns).await;

    // What reconciling needs, in the watched namespace.
    for (verb, res) in [
        ("watch", "lockservices.dlock.dev"),
        ("patch", "paymentstacks.dlock.dev"),
        ("patch", "lockservices.dlock.dev#status"),
        ("update", "paymentstacks.dlock.dev#status"),
        ("create", "deployments.apps"),
        ("patch", "statefulsets.apps"),
        ("delete", "deployments.apps"),
        ("create", "jobs.batch"),
        ("delete", "jobs.batch"),
        ("create", "services"),
        ("create", "networkpolicies.networking.k8s.io"),
        ("delete", "networkpolicies.networking.k8s.io"),
        ("watch", "networkpolicies.networking.k8s.io"),
        ("create", "poddisruptionbudgets.policy"),
        ("delete", "poddisruptionbudgets.policy"),
        ("watch", "poddisruptionbudgets.policy"),
        // CloudNativePG Clusters (database.managed.engine: CloudNativePG).
        ("create", "clusters.postgresql.cnpg.io"),
        ("patch", "clusters.postgresql.cnpg.io"),
        ("watch", "clusters.postgresql.cnpg.io"),
        ("create", "secrets"),
        ("get", "secrets"),
        ("patch", "secrets"),
        // The grant public keys of each LockService (a ConfigMap it creates, patches on a
        // rotation and watches, read by the PaymentStacks that verify with them).
        ("create", "configmaps"),
        ("get", "configmaps"),
        ("patch", "configmaps"),
        ("watch", "configmaps"),
        ("list", "pods"),
        ("get", "pods#log"),
        ("create", "events"),
        ("create", "events.events.k8s.io"),
        ("create", "leases.coordination.k8s.io"),
    ] {
        assert!(
            can(verb, res, Some(&ns)).await,
            "{user} cannot {verb} {res} in {ns}"
        );
    }
    // Only its own Lease can be read or renewed.
    let lease = format!("leases.coordination.k8s.io/{}-dlock-operator", ns);
    assert!(can("update", &lease, Some(&ns)).await, "cannot renew {lease}");
    assert!(!can("update", "leases.coordination.k8s.io/kube-scheduler", Some(&ns)).await);
    // CRDs: read-only, cluster-wide.
    assert!(can("get", "customresourcedefinitions.apiextensions.k8s.io", None).await);
    assert!(!can("delete", "customresourcedefinitions.apiextensions.k8s.io", None).await);
    assert!(!can("create", "customresourcedefinitions.apiextensions.k8s.io", None).await);

    // Never: outside the watched namespace, pods (nothing runs them but controllers), cluster objects,
    // creating or deleting its own custom resources, RBAC escalation.
    for (verb, res, where_) in [
        ("create", "deployments.apps", Some(other.as_str())),
        ("get", "secrets", Some(other.as_str())),
        ("list", "lockservices.dlock.dev", Some(other.as_str())),
        ("create", "pods", Some(ns.as_str())),
        ("delete", "pods", Some(ns.as_str())),
        ("list", "secrets", Some(ns.as_str())),
        ("watch", "secrets", Some(ns.as_str())),
        ("delete", "secrets", Some(ns.as_str())),
        ("delete", "configmaps", Some(ns.as_str())),
        ("create", "persistentvolumeclaims", Some(ns.as_str())),
        // A CloudNativePG Cluster goes with its owner (garbage collection), never by the operator.
        ("delete", "clusters.postgresql.cnpg.io", Some(ns.as_str())),
        ("update", "clusters.postgresql.cnpg.io#status", Some(ns.as_str())),
        ("create", "pods#exec", Some(ns.as_str())),
        ("update", "deployments.apps#status", Some(ns.as_str())),
        ("create", "lockservices.dlock.dev", Some(ns.as_str())),
        ("delete", "paymentstacks.dlock.dev", Some(ns.as_str())),
        ("list", "leases.coordination.k8s.io", Some(ns.as_str())),
        ("delete", "leases.coordination.k8s.io", Some(ns.as_str())),
        ("create", "roles.rbac.authorization.k8s.io", Some(ns.as_str())),
        ("create", "clusterrolebindings.rbac.authorization.k8s.io", None),
        ("get", "nodes", None),
        ("delete", "namespaces", None),
    ] {
        assert!(
            !can(verb, res, where_).await,
            "{user} must not {verb} {res} in {where_:?}"
        );
    }

    // Negative control: the probe does answer yes outside the grant, for an admin.
    let admin = rbac::Subject {
        user: "dlock-e2e-admin".to_owned(),
        groups: vec!["system:masters".to_owned()],
    };
    assert!(rbac::can_i(&c.client, &admin, "get", "nodes", None).await);

    // Every rule in the rendered ClusterRole carries a comment (the chart documents each grant).
    let text = std::fs::read_to_string(helm::chart_dir().join("templates/clusterrole.yaml"))
        .unwrap_or_else(|e| panic!("read clusterrole.yaml: {e}"));
    let lines: Vec<&str> = text.lines().collect();
    for (i, l) in lines.iter().enumerate() {
        if l.trim_start().starts_with("- apiGroups:") {
            assert!(
                i > 0 && lines[i - 1].trim_start().starts_with('#'),
                "clusterrole.yaml line {}: rule without a comment above it",
                i + 1
            );
        }
    }
}
