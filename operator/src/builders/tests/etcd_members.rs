//! Backend etcd (builders/etcd_members.rs): the managed members, an external cluster, lock-server on
//! either.

use super::*;

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
    // No lockdb, no migration Job: etcd has no schema. lock-server's clients file is the ninth.
    assert!(kinds.contains(&(ChildKind::Secret, "locks-lock-clients")));
    assert_eq!(kinds.len(), 9, "{kinds:?}");
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
            labels.get(crate::builders::LABEL_INSTANCE).map(String::as_str),
            Some("locks")
        );
        assert_eq!(
            labels.get(crate::builders::LABEL_MANAGED_BY).map(String::as_str),
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
            (ChildKind::Secret, "locks-lock-clients"),
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
        assert_eq!(
            want.get(crate::builders::LABEL_INSTANCE).map(String::as_str),
            Some("locks")
        );
        if matches_lock_server {
            assert_eq!(ports(r), vec!["Some(Int(2379))"]);
        } else {
            assert_eq!(ports(r), vec!["Some(Int(2379))", "Some(Int(2380))"]);
        }
    }
    // Another LockService's lock-server does not match.
    let mut other = lock_server_pods.clone();
    other.insert(crate::builders::LABEL_INSTANCE.into(), "other".into());
    let rule_selector = pods(&rules[0].from.as_ref().unwrap()[0].pod_selector);
    assert!(!rule_selector.iter().all(|(k, v)| other.get(k) == Some(v)));
}

#[test]
fn etcd_specs_that_bypassed_cel_are_refused() {
    let owner = Owner::of(&managed_ls()).unwrap();
    let no_block = lock_service(json!({"backend": "etcd"}));
    assert_eq!(
        lockservice::children::desired(&no_block, &owner, &etcd_inputs(true)),
        Err(crate::builders::SpecError::StoreMissing)
    );
    let both = etcd_ls(json!({"managed": {}, "external": {"secretRef": {"name": "x"}}}));
    assert_eq!(
        lockservice::children::desired(&both, &owner, &etcd_inputs(true)),
        Err(crate::builders::SpecError::EtcdMode)
    );
    // An etcd LockService has no migration Job to build.
    assert_eq!(
        lockservice::children::migration_job(&etcd_ls(json!({"managed": {}})), &owner, IMAGE).unwrap_err(),
        crate::builders::SpecError::StoreMissing
    );
}

#[test]
fn external_endpoints_are_checked_as_lock_server_reads_them() {
    use crate::builders::etcd_members::{Endpoints, EndpointsError, parse_endpoints};
    assert_eq!(
        parse_endpoints("http://a:2379,http://10.0.0.2:2379").unwrap(),
        Endpoints {
            urls: vec!["http://a:2379".to_owned(), "http://10.0.0.2:2379".to_owned()],
            https: false
        }
    );
    assert_eq!(parse_endpoints("http://etcd.example").unwrap().urls.len(), 1);
    assert_eq!(
        parse_endpoints("https://a:2379,https://b:2379").unwrap(),
        Endpoints {
            urls: vec!["https://a:2379".to_owned(), "https://b:2379".to_owned()],
            https: true
        }
    );
    assert_eq!(parse_endpoints(""), Err(EndpointsError::Empty));
    assert_eq!(
        parse_endpoints("http://a:2379\n"),
        Err(EndpointsError::Whitespace)
    );
    assert_eq!(
        parse_endpoints("http://a:2379, http://b:2379"),
        Err(EndpointsError::Whitespace)
    );
    // lock-server refuses a mix: one client, one scheme.
    assert_eq!(
        parse_endpoints("https://a:2379,http://b:2379"),
        Err(EndpointsError::MixedSchemes(2))
    );
    assert_eq!(parse_endpoints("unix://a:2379"), Err(EndpointsError::NotHttp(1)));
    assert_eq!(
        parse_endpoints("http://a:2379,b:2379"),
        Err(EndpointsError::NotHttp(2))
    );
    assert_eq!(parse_endpoints("http://a:2379,"), Err(EndpointsError::NotHttp(2)));
    assert_eq!(
        parse_endpoints("https://user:pw@a:2379"),
        Err(EndpointsError::NotHttp(1))
    );
    // The message never carries the entry itself.
    assert!(!EndpointsError::NotHttp(1).to_string().contains("pw"));
}
