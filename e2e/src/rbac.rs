//! The operator's identity in a test: the chart's own RBAC (rendered with `helm template`, applied
//! with kubectl) and a kubeconfig holding a ServiceAccount token from `kubectl create token`. The
//! operator under test therefore has exactly the rights the chart grants, not the admin's.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

use crate::{Cluster, helm, objects};

/// The chart templates that make up the operator's identity and rights.
pub const RBAC_TEMPLATES: &[&str] = &[
    "templates/serviceaccount.yaml",
    "templates/clusterrole.yaml",
    "templates/clusterrolebinding.yaml",
    "templates/role.yaml",
];

#[derive(Debug, Clone)]
pub struct Identity {
    /// The namespace the operator is "installed" in and watches (`watchNamespace`).
    pub namespace: String,
    /// The helm release name the chart was rendered with.
    pub release: String,
    pub service_account: String,
    /// `system:serviceaccount:<ns>:<sa>`, for `kubectl auth can-i --as`.
    pub user: String,
    /// A kubeconfig authenticating with the ServiceAccount's token.
    pub kubeconfig: PathBuf,
}

/// Creates `ns`, applies the chart's RBAC rendered for release `release` with `watchNamespace=ns`,
/// and writes a token kubeconfig into `dir`.
pub fn install(cluster: &Cluster, helm_bin: &PathBuf, ns: &str, release: &str, dir: &Path) -> Identity {
    let k = &cluster.kubectl;
    k.namespace(ns);
    let mut extra = Vec::new();
    for t in RBAC_TEMPLATES {
        extra.extend(["--show-only", *t]);
    }
    let yaml = helm::template(helm_bin, release, ns, &[("watchNamespace", ns)], &extra);
    k.run_stdin(&["apply", "-n", ns, "-f", "-"], &yaml).ok();

    let sa = helm::rendered_of_kind(k, &yaml, "ServiceAccount");
    assert_eq!(sa.len(), 1, "the chart renders one ServiceAccount");
    let service_account = objects::name(&sa[0]).to_owned();
    let token = k
        .run(&["create", "token", &service_account, "-n", ns, "--duration", "2h"])
        .ok()
        .stdout
        .trim()
        .to_owned();
    assert!(!token.is_empty(), "kubectl create token printed nothing");

    // The RBAC authorizer works from a watch cache: wait until the new bindings are in effect.
    let user = format!("system:serviceaccount:{ns}:{service_account}");
    crate::eventually("the chart's RBAC to take effect", Duration::from_secs(30), || {
        let ready = k.can_i(&user, "watch", "lockservices.dlock.dev", Some(ns))
            && k.can_i(
                &user,
                "get",
                "customresourcedefinitions.apiextensions.k8s.io",
                None,
            );
        if ready {
            Ok(())
        } else {
            Err(format!("{user} not yet authorized"))
        }
    });

    let kubeconfig = dir.join("operator.kubeconfig");
    write_token_kubeconfig(cluster, &token, &format!("{ns}-{service_account}"), &kubeconfig);
    Identity {
        namespace: ns.to_owned(),
        release: release.to_owned(),
        user,
        service_account,
        kubeconfig,
    }
}

/// A kubeconfig for the test cluster (server and CA from the admin kubeconfig) with a bearer token.
pub fn write_token_kubeconfig(cluster: &Cluster, token: &str, user: &str, path: &Path) {
    let admin = cluster
        .kubectl
        .run(&["config", "view", "--raw", "--minify", "-o", "json"])
        .ok()
        .json();
    let server = admin["clusters"][0]["cluster"]["server"]
        .as_str()
        .unwrap_or_default();
    let ca = admin["clusters"][0]["cluster"]["certificate-authority-data"]
        .as_str()
        .unwrap_or_default();
    assert!(
        !server.is_empty() && !ca.is_empty(),
        "admin kubeconfig lacks server/CA data"
    );
    // JSON is YAML, and every kubeconfig reader accepts it.
    let config: Value = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "dlock-e2e", "cluster": {"server": server, "certificate-authority-data": ca}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": user, "context": {"cluster": "dlock-e2e", "user": user}}],
        "current-context": user,
    });
    std::fs::write(path, config.to_string()).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}
