//! A managed or external PostgreSQL (builders/postgres.rs): the StatefulSet and Service, the
//! credentials and connection Secrets, and no password outside them.

use super::*;
use crate::builders::postgres;
use crate::crd::DatabaseEngine;

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
fn no_password_appears_outside_secrets() {
    let ls = managed_ls();
    let owner = Owner::of(&ls).unwrap();
    let creds = Credentials::generate(true);
    let urls = postgres::managed_urls(&owner, History::Lockdb, DatabaseEngine::StatefulSet, &creds);
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
        Child::PostgresCluster(o) => serde_json::to_value(o),
        Child::Secret(o) => serde_json::to_value(&o.0),
    }
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
    let urls = postgres::managed_urls(&owner, History::Lockdb, DatabaseEngine::StatefulSet, &creds);
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
    // With HTTPS on, the StatefulSet engine's server is TLS only: verified in full against the
    // bundle the operator writes to `<owner>-<db>-ca`, where the pods mount it.
    let https = Owner {
        https: true,
        ..owner.clone()
    };
    let tls = postgres::managed_urls(&https, History::Lockdb, DatabaseEngine::StatefulSet, &creds);
    let tail = "?sslmode=verify-full&sslrootcert=/etc/dlock/tls/locks-lockdb/ca.crt";
    assert_eq!(
        tls.app_url,
        format!("postgres://lockapp:APPPW@locks-lockdb.pay.svc:5432/lockdb{tail}")
    );
    assert!(tls.admin_url.unwrap().ends_with(tail));

    let ext = postgres::external_urls(
        "postgresql://admin:s3cret@10.1.2.3:6432/paydb?sslmode=require",
        History::Paydb,
        &creds,
        None,
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
        let err = postgres::external_urls(bad, History::Paydb, &creds, None).unwrap_err();
        assert!(!err.to_string().contains("user=x"));
    }
}

#[test]
fn an_external_ca_is_named_in_both_urls_and_verified_against() {
    let creds = Credentials {
        postgres_password: None,
        app_password: "APPPW".into(),
    };
    let ca = "/etc/dlock/tls/pay-paydb/ca.crt";
    // No sslmode: verify-full, the server's name checked too.
    let urls = postgres::external_urls(
        "postgres://admin:s3cret@db.example.com:5432/paydb",
        History::Paydb,
        &creds,
        Some(ca),
    )
    .unwrap();
    let tail = "sslmode=verify-full&sslrootcert=%2Fetc%2Fdlock%2Ftls%2Fpay-paydb%2Fca.crt";
    assert_eq!(
        urls.app_url,
        format!("postgres://payapp:APPPW@db.example.com:5432/paydb?{tail}")
    );
    // The owner URL is handed out too, with the CA, for the Jobs (which then get it mounted).
    assert_eq!(
        urls.admin_url.as_deref(),
        Some(format!("postgres://admin:s3cret@db.example.com:5432/paydb?{tail}").as_str())
    );
    // verify-ca is the user's choice (a server whose certificate names no usable host).
    let urls = postgres::external_urls(
        "postgres://admin:pw@10.0.0.9/paydb?sslmode=verify-ca&connect_timeout=5",
        History::Paydb,
        &creds,
        Some(ca),
    )
    .unwrap();
    assert!(
        urls.app_url.ends_with(
            "?sslmode=verify-ca&connect_timeout=5&sslrootcert=%2Fetc%2Fdlock%2Ftls%2Fpay-paydb%2Fca.crt"
        ),
        "{}",
        urls.app_url
    );
    // A mode that checks no certificate, or a second CA, is refused, and the message carries no URL.
    for (url, says) in [
        ("postgres://admin:pw@h/paydb?sslmode=require", "sslmode=require"),
        ("postgres://admin:pw@h/paydb?sslmode=disable", "sslmode=disable"),
        ("postgres://admin:pw@h/paydb?sslrootcert=/x.pem", "sslrootcert"),
    ] {
        let err = postgres::external_urls(url, History::Paydb, &creds, Some(ca)).unwrap_err();
        let text = err.to_string();
        assert!(text.contains(says) && !text.contains("pw@"), "{text}");
    }
    // Without a CA the URL is the user's to make: sslmode=require stays as it is.
    assert!(
        postgres::external_urls(
            "postgres://a:pw@h/paydb?sslmode=require",
            History::Paydb,
            &creds,
            None
        )
        .is_ok()
    );
}

#[test]
fn with_an_external_ca_the_jobs_read_the_owner_url_beside_its_mounted_ca() {
    let ls = lock_service(json!({"database": {"external": {
        "secretRef": {"name": "cloudsql", "key": "dsn"},
        "caSecretRef": {"name": "cloudsql-ca"}}}}));
    let owner = Owner::of(&ls).unwrap();
    let d = lockservice::children::desired(&ls, &owner, &ls_inputs(&JobState::Succeeded)).unwrap();
    let job = d.find(ChildKind::Job, &d.migration_job).unwrap();
    let c = &containers(job)[0];
    assert_eq!(
        secret_ref(env_of(c, "DATABASE_URL").unwrap()),
        ("locks-lockdb-conn".into(), "admin-url".into())
    );
    for child in [job, d.find(ChildKind::Deployment, "locks-lock-server").unwrap()] {
        let c = &containers(child)[0];
        let mount = c
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| m.mount_path == "/etc/dlock/tls/locks-lockdb")
            .unwrap_or_else(|| panic!("no CA mount in {}", child.name()));
        let pod = pod_spec(child).unwrap();
        let volume = pod
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == mount.name)
            .unwrap();
        assert_eq!(
            volume.secret.as_ref().and_then(|s| s.secret_name.as_deref()),
            Some("locks-lockdb-ca")
        );
    }
    let secret = postgres::database_ca_secret(
        &owner,
        History::Lockdb,
        "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
    );
    assert_eq!(secret.metadata.name.as_deref(), Some("locks-lockdb-ca"));
    assert!(secret.data.unwrap().contains_key("ca.crt"));
    assert!(postgres::is_pem_certificate(
        "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----"
    ));
    assert!(!postgres::is_pem_certificate("not a certificate"));
}
