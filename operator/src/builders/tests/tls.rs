//! HTTPS in the pods: each server mounts its certificate Secret and is probed over HTTPS, each client
//! of an `https://` URL trusts the namespace's bundle (and restarts when it changes), nothing else.

use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::*;
use crate::builders::tls::{CA_BUNDLE, CA_BUNDLE_ANNOTATION, TlsWiring};

fn template<'a>(d: &'a Desired, name: &str) -> &'a PodTemplateSpec {
    &deployment(d, name).spec.as_ref().unwrap().template
}

fn plain_env(c: &Container, name: &str) -> Option<String> {
    env_of(c, name).and_then(|e| e.value.clone())
}

fn stack_desired(https: bool, wiring: &TlsWiring, spec: Option<serde_json::Value>) -> Desired {
    let ps = spec.map_or_else(default_stack, stack);
    let owner = Owner {
        https,
        ..Owner::of(&ps).unwrap()
    };
    let view = ready_lock_service();
    paymentstack::children::desired(&ps, &owner, &ps_inputs(&JobState::Succeeded, Some(&view)))
        .unwrap()
        .with_tls(&owner, wiring)
}

#[test]
fn each_server_mounts_its_certificate_and_is_probed_over_https() {
    let wiring = TlsWiring {
        https: true,
        bundle: Some("b1".into()),
    };
    let d = stack_desired(true, &wiring, None);
    for component in ["payment-resource", "rail-proxy", "rail-stub"] {
        let t = template(&d, &format!("shop-{component}"));
        let pod = t.spec.as_ref().unwrap();
        let volume = pod
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == "tls")
            .unwrap_or_else(|| panic!("{component} has no tls volume"));
        let secret = volume.secret.as_ref().unwrap();
        assert_eq!(
            secret.secret_name.as_deref(),
            Some(format!("shop-{component}-tls").as_str())
        );
        assert_eq!(secret.default_mode, Some(0o440));
        let fs_group = pod.security_context.as_ref().and_then(|s| s.fs_group);
        assert_eq!(
            fs_group,
            Some(crate::builders::security::NONROOT_UID),
            "{component}"
        );
        let c = &pod.containers[0];
        let mount = c
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| m.name == "tls")
            .unwrap();
        assert_eq!(mount.mount_path, "/etc/dlock/tls");
        assert_eq!(mount.read_only, Some(true));
        assert_eq!(
            plain_env(c, "DLOCK_TLS_CERT_FILE").as_deref(),
            Some("/etc/dlock/tls/tls.crt")
        );
        assert_eq!(
            plain_env(c, "DLOCK_TLS_KEY_FILE").as_deref(),
            Some("/etc/dlock/tls/tls.key")
        );
        assert!(
            plain_env(c, "DLOCK_PLAINTEXT").is_none(),
            "HTTPS, not --plaintext"
        );
        // The port is named `https`, so that the chart's PodMonitor scrapes it over HTTPS, and the
        // probes name it.
        let ports: Vec<_> = c
            .ports
            .iter()
            .flatten()
            .map(|p| (p.name.as_deref(), p.container_port))
            .collect();
        assert_eq!(ports, [(Some("https"), 8080)], "{component}");
        for probe in [&c.readiness_probe, &c.liveness_probe] {
            let get = probe.as_ref().and_then(|p| p.http_get.as_ref()).unwrap();
            assert_eq!(get.scheme.as_deref(), Some("HTTPS"), "{component}");
            assert_eq!(get.port, IntOrString::String("https".into()), "{component}");
        }
        // The Service reaches it by number, whichever its name.
        let Some(Child::Service(svc)) = d.find(ChildKind::Service, &format!("shop-{component}")) else {
            panic!("{component} has no Service");
        };
        let port = &svc.spec.as_ref().unwrap().ports.as_ref().unwrap()[0];
        assert_eq!(port.target_port, Some(IntOrString::Int(8080)), "{component}");
    }
    // The executor serves nothing but its probes and metrics: no certificate, plain `http`.
    let executor = template(&d, "shop-payout-executor").spec.as_ref().unwrap();
    assert!(env_of(&executor.containers[0], "DLOCK_TLS_CERT_FILE").is_none());
    let ports: Vec<_> = executor.containers[0]
        .ports
        .iter()
        .flatten()
        .map(|p| p.name.as_deref())
        .collect();
    assert_eq!(ports, [Some("http")]);
}

#[test]
fn clients_of_https_trust_the_bundle_and_roll_when_it_changes() {
    let wiring = TlsWiring {
        https: true,
        bundle: Some("b1".into()),
    };
    let d = stack_desired(true, &wiring, None);
    let args = |name: &str| {
        template(&d, name).spec.as_ref().unwrap().containers[0]
            .args
            .clone()
            .unwrap()
    };
    // Its own servers' URLs are https (the lock-server URL is the LockService's endpoint).
    let exec_args = args("shop-payout-executor");
    assert_eq!(
        arg_after(&exec_args, "--payment-resource-url"),
        Some("https://shop-payment-resource.pay.svc:8080")
    );
    assert_eq!(
        arg_after(&args("shop-rail-proxy"), "--rail-url"),
        Some("https://shop-rail-stub.pay.svc:8080")
    );
    assert_eq!(
        d.endpoints.get("paymentResource").map(String::as_str),
        Some("https://shop-payment-resource.pay.svc:8080")
    );
    for (name, var) in [
        ("shop-payout-executor", "DLOCK_CA_FILE"),
        ("shop-rail-proxy", "DLOCK_RAIL_CA_FILE"),
    ] {
        let t = template(&d, name);
        let pod = t.spec.as_ref().unwrap();
        let ca = pod.volumes.iter().flatten().find(|v| v.name == "ca").unwrap();
        assert_eq!(ca.config_map.as_ref().unwrap().name, CA_BUNDLE);
        assert_eq!(
            plain_env(&pod.containers[0], var).as_deref(),
            Some("/etc/dlock/ca/ca.crt"),
            "{name}"
        );
        let annotations = t.metadata.as_ref().unwrap().annotations.as_ref().unwrap();
        assert_eq!(
            annotations.get(CA_BUNDLE_ANNOTATION),
            Some(&crate::builders::short_hash(b"b1"))
        );
    }
    // payment-resource calls nothing: no bundle.
    let pr = template(&d, "shop-payment-resource").spec.as_ref().unwrap();
    assert!(!pr.volumes.iter().flatten().any(|v| v.name == "ca"));
}

#[test]
fn a_real_rail_is_checked_against_the_public_roots_not_the_bundle() {
    let wiring = TlsWiring {
        https: true,
        bundle: Some("b1".into()),
    };
    let d = stack_desired(
        true,
        &wiring,
        Some(json!({
            "lockServiceRef": {"name": "locks"},
            "database": {"managed": {}},
            "railProxy": {"railUrl": "https://rail.example.com"},
        })),
    );
    let pod = template(&d, "shop-rail-proxy").spec.as_ref().unwrap();
    assert!(env_of(&pod.containers[0], "DLOCK_RAIL_CA_FILE").is_none());
    assert!(!pod.volumes.iter().flatten().any(|v| v.name == "ca"));
}

#[test]
fn plain_http_mounts_no_certificate_and_keeps_http_urls() {
    let d = stack_desired(false, &TlsWiring::default(), None);
    for (name, _) in all_children(&d) {
        if let Some(Child::Deployment(dep)) = d.find(ChildKind::Deployment, name) {
            let pod = dep.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
            assert!(
                !pod.volumes
                    .iter()
                    .flatten()
                    .any(|v| v.name == "tls" || v.name == "ca"),
                "{name}"
            );
            let c = &pod.containers[0];
            assert!(env_of(c, "DLOCK_TLS_CERT_FILE").is_none(), "{name}");
            // A server is told plain HTTP explicitly (it refuses to start without either); the
            // executor serves no API and has no such flag.
            let served = crate::builders::tls::SERVED.iter().any(|s| {
                dep.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(crate::builders::LABEL_COMPONENT))
                    == Some(&(*s).to_owned())
            });
            assert_eq!(plain_env(c, "DLOCK_PLAINTEXT").is_some(), served, "{name}");
            assert!(
                c.ports
                    .iter()
                    .flatten()
                    .all(|p| p.name.as_deref() == Some("http")),
                "{name}"
            );
            assert!(
                c.args.iter().flatten().all(|a| !a.starts_with("https://")),
                "{name}"
            );
        }
    }
}

/// A stack on plain HTTP whose LockService serves HTTPS: its executor still trusts the bundle.
#[test]
fn a_plain_stack_still_trusts_the_bundle_for_an_https_lock_server() {
    let wiring = TlsWiring {
        https: false,
        bundle: Some("b2".into()),
    };
    let d = stack_desired(false, &wiring, None);
    let pod = template(&d, "shop-payout-executor").spec.as_ref().unwrap();
    assert_eq!(
        plain_env(&pod.containers[0], "DLOCK_CA_FILE").as_deref(),
        Some("/etc/dlock/ca/ca.crt")
    );
    // Its rail-stub is plain, so rail-proxy needs no CA.
    let rp = template(&d, "shop-rail-proxy").spec.as_ref().unwrap();
    assert!(env_of(&rp.containers[0], "DLOCK_RAIL_CA_FILE").is_none());
}

#[test]
fn served_components_are_those_with_a_service() {
    let d = stack_desired(true, &TlsWiring::default(), None);
    // A managed database on the StatefulSet engine gets one too (it serves TLS with HTTPS on).
    assert_eq!(
        d.served_components(),
        vec!["payment-resource", "rail-proxy", "rail-stub", "paydb"]
    );
    let ls = managed_ls();
    let owner = Owner::of(&ls).unwrap();
    let d = lockservice::children::desired(&ls, &owner, &ls_inputs(&JobState::Succeeded)).unwrap();
    assert_eq!(d.served_components(), vec!["lock-server", "lockdb"]);
}

/// A managed PostgreSQL with HTTPS on serves TLS only: its certificate and pg_hba.conf (hostssl
/// only) mounted and named by `-c` settings, the certificate's hash in its pod template (a renewed
/// one restarts it); its clients' URLs verify it in full against the bundle, written to
/// `<owner>-paydb-ca` before anything that mounts it, and the Deployments that read it carry the
/// bundle's hash. With HTTPS off, none of it.
#[test]
fn a_managed_postgres_serves_tls_only_and_its_clients_verify_it_against_the_bundle() {
    use crate::builders::postgres::PG_HBA;
    use crate::builders::tls::PG_RELOADER;
    use k8s_openapi::api::apps::v1::StatefulSet;
    let wiring = TlsWiring {
        https: true,
        bundle: Some("PEM".into()),
    };
    let d = stack_desired(true, &wiring, None);
    let Some(Child::StatefulSet(sts)) = d.find(crate::builders::ChildKind::StatefulSet, "shop-paydb") else {
        panic!("no paydb StatefulSet");
    };
    let sts: &StatefulSet = sts;
    let t = &sts.spec.as_ref().unwrap().template;
    let pod = t.spec.as_ref().unwrap();
    let c = &pod.containers[0];
    let args = c.args.clone().unwrap_or_default();
    assert_eq!(args[0], "postgres");
    for setting in [
        "ssl=on",
        "ssl_cert_file=/etc/dlock/pg-tls/tls.crt",
        "ssl_key_file=/etc/dlock/pg-tls/tls.key",
        "hba_file=/etc/dlock/pg-hba/pg_hba.conf",
    ] {
        assert!(
            args.windows(2).any(|w| w[0] == "-c" && w[1] == setting),
            "{setting}: {args:?}"
        );
    }
    let secret_of = |volume: &str| {
        pod.volumes
            .iter()
            .flatten()
            .find(|v| v.name == volume)
            .and_then(|v| v.secret.as_ref())
            .and_then(|s| s.secret_name.clone())
    };
    assert_eq!(secret_of("pg-tls").as_deref(), Some("shop-paydb-tls"));
    assert_eq!(secret_of("pg-hba").as_deref(), Some("shop-paydb-hba"));
    // The key's file: root's, the postgres group's (fsGroup), 0440, which PostgreSQL accepts.
    let mode = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "pg-tls")
        .and_then(|v| v.secret.as_ref())
        .and_then(|s| s.default_mode);
    assert_eq!(mode, Some(0o440));
    assert_eq!(
        pod.security_context.as_ref().and_then(|s| s.fs_group),
        Some(crate::builders::postgres::POSTGRES_UID)
    );
    // A renewed certificate is reloaded, not restarted: a sidecar of the same image, in the pod's
    // shared process namespace, runs `pg_ctl reload` on the data directory when the files change.
    assert_eq!(pod.share_process_namespace, Some(true));
    let reloader = pod
        .containers
        .iter()
        .find(|c| c.name == PG_RELOADER)
        .expect("the reloader");
    assert_eq!(reloader.image, c.image);
    let script = reloader.command.clone().unwrap_or_default().join(" ");
    assert!(
        script.contains("pg_ctl reload -D \"$PGDATA\"") && script.contains("/etc/dlock/pg-tls/tls.crt"),
        "{script}"
    );
    assert!(reloader.env.iter().flatten().any(|e| e.name == "PGDATA"));
    let mounts: Vec<(&str, Option<bool>)> = reloader
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| (m.name.as_str(), m.read_only))
        .filter(|(n, _)| *n != "tmp")
        .collect();
    assert_eq!(mounts, [("data", Some(true)), ("pg-tls", Some(true))]);
    assert_eq!(crate::builders::security::violations(pod), Vec::<String>::new());
    // The Secrets come first: the CA bundle for the clients, the pg_hba.conf.
    let first: Vec<(String, Vec<u8>)> = d.apply[..2]
        .iter()
        .map(|c| match c {
            Child::Secret(s) => {
                let data = s.0.data.clone().unwrap_or_default();
                let (_, v) = data.into_iter().next().unwrap();
                (s.0.metadata.name.clone().unwrap(), v.0)
            }
            other => panic!("not a Secret first: {other:?}"),
        })
        .collect();
    assert_eq!(
        first,
        vec![
            ("shop-paydb-ca".to_owned(), b"PEM".to_vec()),
            ("shop-paydb-hba".to_owned(), PG_HBA.as_bytes().to_vec()),
        ]
    );
    assert!(PG_HBA.contains("hostssl all all all scram-sha-256"));
    assert!(
        !PG_HBA.lines().any(|l| l.starts_with("host ")),
        "a plain TCP line: {PG_HBA}"
    );
    // The clients that read paydb's connection Secret carry the bundle's hash.
    for client in ["shop-payment-resource", "shop-rail-proxy"] {
        let t = template(&d, client);
        let a = t
            .metadata
            .as_ref()
            .and_then(|m| m.annotations.clone())
            .unwrap_or_default();
        assert_eq!(
            a.get(CA_BUNDLE_ANNOTATION),
            Some(&crate::builders::short_hash(b"PEM")),
            "{client}"
        );
    }

    // HTTPS off: a plain server, as before.
    let plain = stack_desired(false, &TlsWiring::default(), None);
    let Some(Child::StatefulSet(sts)) = plain.find(crate::builders::ChildKind::StatefulSet, "shop-paydb")
    else {
        panic!("no paydb StatefulSet");
    };
    let pod = sts.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    assert!(pod.containers[0].args.is_none());
    assert!(!plain.apply.iter().any(|c| matches!(c, Child::Secret(_))));
}

/// A managed etcd with HTTPS: its members serve their client URLs with the operator's certificate
/// (peers stay plain), lock-server reaches them over https:// and trusts the bundle for them.
#[test]
fn a_managed_etcd_serves_its_clients_over_https_and_lock_server_trusts_the_bundle() {
    let ls = etcd_ls(json!({"managed": {"replicas": 3}}));
    let owner = Owner {
        https: true,
        ..Owner::of(&ls).unwrap()
    };
    let wiring = TlsWiring {
        https: true,
        bundle: Some("b3".into()),
    };
    let d = lockservice::children::desired(&ls, &owner, &etcd_inputs(true))
        .unwrap()
        .with_tls(&owner, &wiring);
    assert_eq!(d.served_components(), vec!["lock-server", "etcd"]);
    let Some(Child::StatefulSet(sts)) = d.find(ChildKind::StatefulSet, "locks-etcd") else {
        panic!("no etcd StatefulSet");
    };
    let pod = sts.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    let args = pod.containers[0].args.clone().unwrap();
    for want in [
        "--listen-client-urls=https://0.0.0.0:2379",
        "--advertise-client-urls=https://$(POD_NAME).locks-etcd.pay.svc:2379",
        "--listen-peer-urls=http://0.0.0.0:2380",
        "--cert-file=/etc/etcd/tls/tls.crt",
        "--key-file=/etc/etcd/tls/tls.key",
    ] {
        assert!(args.iter().any(|a| a == want), "{want} not in {args:?}");
    }
    let tls = pod.volumes.iter().flatten().find(|v| v.name == "tls").unwrap();
    assert_eq!(
        tls.secret.as_ref().unwrap().secret_name.as_deref(),
        Some("locks-etcd-tls")
    );
    assert_eq!(d.endpoints["etcd"], "https://locks-etcd-client.pay.svc:2379");

    let lock_server = template(&d, "locks-lock-server").spec.as_ref().unwrap();
    let c = &lock_server.containers[0];
    let endpoints = arg_after(c.args.as_deref().unwrap(), "--etcd-endpoints").unwrap();
    assert!(
        endpoints.split(',').all(|e| e.starts_with("https://")),
        "{endpoints}"
    );
    assert_eq!(
        plain_env(c, "DLOCK_ETCD_CA_FILE").as_deref(),
        Some("/etc/dlock/ca/ca.crt")
    );
    // The members' certificate covers each member and the client Service.
    let names = crate::builders::tls::dns_names(&owner, "etcd");
    assert!(names.contains(&"*.locks-etcd.pay.svc".to_owned()), "{names:?}");
    assert!(
        names.contains(&"locks-etcd-client.pay.svc".to_owned()),
        "{names:?}"
    );

    // Plain HTTP: no certificate, no CA, http:// everywhere.
    let plain = Owner::of(&ls).unwrap();
    let d = lockservice::children::desired(&ls, &plain, &etcd_inputs(true))
        .unwrap()
        .with_tls(&plain, &TlsWiring::default());
    let Some(Child::StatefulSet(sts)) = d.find(ChildKind::StatefulSet, "locks-etcd") else {
        panic!("no etcd StatefulSet");
    };
    let args = sts
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
        .containers[0]
        .args
        .clone()
        .unwrap();
    assert!(
        args.iter()
            .all(|a| !a.contains("https") && !a.starts_with("--cert-file")),
        "{args:?}"
    );
}

/// An external etcd over TLS: lock-server mounts the user's CA Secret key (under the name its
/// variable gives) and, when named, the client certificate's pair, read-only; the Secrets stay the
/// user's. Without a CA (http:// URLs) nothing is mounted, and the namespace's bundle is never
/// offered for an etcd it did not sign.
#[test]
fn an_external_etcd_over_tls_mounts_its_ca_and_client_certificate_into_lock_server() {
    let ls = etcd_ls(json!({"external": {
        "secretRef": {"name": "prod-etcd"},
        "caSecretRef": {"name": "etcd-ca", "key": "root.pem"},
        "clientCertificateSecretRef": {"name": "etcd-client"}
    }}));
    let owner = Owner {
        https: true,
        ..Owner::of(&ls).unwrap()
    };
    let wiring = TlsWiring {
        https: true,
        bundle: Some("b3".into()),
    };
    let d = lockservice::children::desired(&ls, &owner, &etcd_inputs(true))
        .unwrap()
        .with_tls(&owner, &wiring);
    let pod = template(&d, "locks-lock-server").spec.as_ref().unwrap();
    let c = &pod.containers[0];
    assert_eq!(
        plain_env(c, "DLOCK_ETCD_CA_FILE").as_deref(),
        Some("/etc/dlock/etcd-ca/ca.crt")
    );
    assert_eq!(
        plain_env(c, "DLOCK_ETCD_CERT_FILE").as_deref(),
        Some("/etc/dlock/etcd-client/tls.crt")
    );
    assert_eq!(
        plain_env(c, "DLOCK_ETCD_KEY_FILE").as_deref(),
        Some("/etc/dlock/etcd-client/tls.key")
    );
    let ca_vars = c
        .env
        .iter()
        .flatten()
        .filter(|e| e.name == "DLOCK_ETCD_CA_FILE")
        .count();
    assert_eq!(ca_vars, 1, "one CA, the user's: {:?}", c.env);
    let volume = |name: &str| {
        pod.volumes
            .iter()
            .flatten()
            .find(|v| v.name == name)
            .and_then(|v| v.secret.clone())
            .unwrap_or_else(|| panic!("no Secret volume {name}: {:?}", pod.volumes))
    };
    let ca = volume("etcd-ca");
    assert_eq!(ca.secret_name.as_deref(), Some("etcd-ca"));
    let items = ca.items.unwrap();
    assert_eq!(
        (items[0].key.as_str(), items[0].path.as_str()),
        ("root.pem", "ca.crt")
    );
    let pair = volume("etcd-client-cert");
    assert_eq!(pair.secret_name.as_deref(), Some("etcd-client"));
    assert_eq!(pair.default_mode, Some(0o440));
    let mounts: Vec<(&str, &str, Option<bool>)> = c
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| (m.name.as_str(), m.mount_path.as_str(), m.read_only))
        .collect();
    assert!(
        mounts.contains(&("etcd-ca", "/etc/dlock/etcd-ca", Some(true))),
        "{mounts:?}"
    );
    assert!(
        mounts.contains(&("etcd-client-cert", "/etc/dlock/etcd-client", Some(true))),
        "{mounts:?}"
    );
    assert!(pod.security_context.as_ref().unwrap().fs_group.is_some());
    // The endpoints still come from the user's Secret.
    assert!(c.env.iter().flatten().any(|e| e.name == "DLOCK_ETCD_ENDPOINTS"));

    // A CA without a client certificate: only the CA.
    let ls = etcd_ls(json!({"external": {
        "secretRef": {"name": "prod-etcd"},
        "caSecretRef": {"name": "etcd-ca"}
    }}));
    let d = lockservice::children::desired(&ls, &owner, &etcd_inputs(true)).unwrap();
    let c = &template(&d, "locks-lock-server")
        .spec
        .as_ref()
        .unwrap()
        .containers[0];
    assert!(plain_env(c, "DLOCK_ETCD_CA_FILE").is_some());
    assert!(plain_env(c, "DLOCK_ETCD_CERT_FILE").is_none());

    // Plain http:// URLs: nothing to mount, and no CA variable at all.
    let ls = etcd_ls(json!({"external": {"secretRef": {"name": "prod-etcd"}}}));
    let d = lockservice::children::desired(&ls, &owner, &etcd_inputs(true))
        .unwrap()
        .with_tls(&owner, &wiring);
    let pod = template(&d, "locks-lock-server").spec.as_ref().unwrap();
    assert!(plain_env(&pod.containers[0], "DLOCK_ETCD_CA_FILE").is_none());
    assert!(
        !pod.volumes.iter().flatten().any(|v| v.name.starts_with("etcd-")),
        "{:?}",
        pod.volumes
    );
}
