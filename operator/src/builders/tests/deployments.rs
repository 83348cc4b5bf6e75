//! The Deployments and Services of the dlock binaries (builders/deployments.rs).

use super::*;

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
    // lock-server reads no lease setting: the LockService's lease goes to its clients only.
    assert!(
        c.env.iter().flatten().all(|e| !e.name.contains("TTL")),
        "{:?}",
        c.env
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
        env_of(&ex, "PAYOUT_EXECUTOR_LEASE_TTL_MS")
            .unwrap()
            .value
            .as_deref(),
        Some("5000")
    );
    assert_eq!(
        env_of(&ex, "PAYOUT_EXECUTOR_SESSION_TTL_MS")
            .unwrap()
            .value
            .as_deref(),
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
