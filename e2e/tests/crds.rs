//! The generated CRDs on a real API server: they install and become Established, the samples in
//! `config/samples/` apply as they are, and invalid objects are refused with the CRDs' own CEL
//! messages (each refusal paired with its valid twin being accepted, so a refusal is known to come
//! from the one field changed).

use serde_json::{Value, json};

use dlock_e2e::{Kubectl, crds, env, objects, require_cluster};

#[test]
fn crds_install_and_become_established() {
    let c = require_cluster!("crds_install_and_become_established");
    let names = crds::install(&c.kubectl);
    for expected in ["lockservices.dlock.dev", "paymentstacks.dlock.dev"] {
        assert!(
            names.iter().any(|n| n == expected),
            "{expected} not installed: {names:?}"
        );
        let crd = c
            .kubectl
            .get(None, "customresourcedefinition", expected)
            .unwrap_or_else(|| panic!("{expected} missing"));
        assert!(objects::condition_is(&crd, "Established", "True"));
        assert!(objects::condition_is(&crd, "NamesAccepted", "True"));
        assert_eq!(crd["spec"]["group"], "dlock.dev");
        let served: Vec<&str> = crd["spec"]["versions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|v| v["served"] == true)
            .filter_map(|v| v["name"].as_str())
            .collect();
        assert_eq!(served, ["v1alpha1"], "{expected}");
    }
    // The short names and category work through discovery, as users type them.
    let ns = env::unique_name("crds");
    c.kubectl.namespace(&ns);
    for short in ["lsvc", "pstack", "dlock"] {
        c.kubectl.run(&["get", short, "-n", &ns]).ok();
    }
}

#[test]
fn samples_apply() {
    let c = require_cluster!("samples_apply");
    crds::install(&c.kubectl);
    let k = &c.kubectl;
    let ns = env::unique_name("samples");
    k.namespace(&ns);
    let dir = env::repo_root().join("config").join("samples");
    // Strict server-side field validation: an unknown or misspelt field fails the apply.
    let out = k
        .run(&[
            "apply",
            "-n",
            &ns,
            "--validate=strict",
            "-f",
            &dir.to_string_lossy(),
        ])
        .ok();
    let mut seen = Vec::new();
    for (kind, resource) in [
        ("LockService", "lockservices.dlock.dev"),
        ("PaymentStack", "paymentstacks.dlock.dev"),
        ("Secret", "secrets"),
    ] {
        let items = k.list(&ns, resource);
        assert!(!items.is_empty(), "no {kind} from the samples:\n{}", out.stdout);
        seen.extend(items.iter().map(objects::describe));
    }
    // Both database modes are covered.
    let lsvcs = k.list(&ns, "lockservices.dlock.dev");
    assert!(
        lsvcs.iter().any(|l| l["spec"]["database"]["managed"].is_object()),
        "{seen:?}"
    );
    assert!(
        lsvcs
            .iter()
            .any(|l| l["spec"]["database"]["external"].is_object()),
        "{seen:?}"
    );
    // Both etcd modes are covered, and an external etcd's Secret ships with it.
    assert!(
        lsvcs
            .iter()
            .any(|l| l["spec"]["backend"] == "etcd" && l["spec"]["etcd"]["managed"].is_object()),
        "{seen:?}"
    );
    let external_etcd: Vec<&Value> = lsvcs
        .iter()
        .filter(|l| l["spec"]["etcd"]["external"].is_object())
        .collect();
    assert!(!external_etcd.is_empty(), "{seen:?}");
    for l in external_etcd {
        let r = &l["spec"]["etcd"]["external"]["secretRef"];
        let (name, key) = (
            r["name"].as_str().unwrap(),
            r["key"].as_str().unwrap_or("endpoints"),
        );
        let s = k
            .get(Some(&ns), "secret", name)
            .unwrap_or_else(|| panic!("{} references missing Secret {name}", objects::describe(l)));
        assert!(s["data"][key].is_string(), "Secret {name} lacks key {key}");
    }
    // Every external secretRef names a Secret the samples ship.
    for o in lsvcs.iter().chain(k.list(&ns, "paymentstacks.dlock.dev").iter()) {
        if let Some(secret) = o["spec"]["database"]["external"]["secretRef"]["name"].as_str() {
            let key = o["spec"]["database"]["external"]["secretRef"]["key"]
                .as_str()
                .unwrap_or("url");
            let s = k
                .get(Some(&ns), "secret", secret)
                .unwrap_or_else(|| panic!("{} references missing Secret {secret}", objects::describe(o)));
            assert!(s["data"][key].is_string(), "Secret {secret} lacks key {key}");
        }
        // Every PaymentStack references a LockService the samples ship.
        if let Some(lsvc) = o["spec"]["lockServiceRef"]["name"].as_str() {
            assert!(
                lsvcs.iter().any(|l| objects::name(l) == lsvc),
                "{} references missing LockService {lsvc}",
                objects::describe(o)
            );
        }
    }
    // Applying again changes no custom resource: the samples carry no field the API server
    // rewrites. (Secrets are left out: kubectl always re-sends `stringData`, reporting "configured".)
    let again = k.run(&["apply", "-n", &ns, "-f", &dir.to_string_lossy()]).ok();
    let dlock: Vec<&str> = again
        .stdout
        .lines()
        .filter(|l| l.contains(".dlock.dev/"))
        .collect();
    assert_eq!(
        dlock.len(),
        lsvcs.len() + k.list(&ns, "paymentstacks.dlock.dev").len()
    );
    assert!(
        dlock.iter().all(|l| l.ends_with("unchanged")),
        "second apply changed something:\n{}",
        again.stdout
    );
}

fn lockservice(name: &str, database: Value) -> Value {
    json!({
        "apiVersion": "dlock.dev/v1alpha1",
        "kind": "LockService",
        "metadata": {"name": name},
        "spec": {"database": database},
    })
}

fn etcd_lockservice(name: &str, etcd: Value) -> Value {
    json!({
        "apiVersion": "dlock.dev/v1alpha1",
        "kind": "LockService",
        "metadata": {"name": name},
        "spec": {"backend": "etcd", "etcd": etcd},
    })
}

fn paymentstack(name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "dlock.dev/v1alpha1",
        "kind": "PaymentStack",
        "metadata": {"name": name},
        "spec": spec,
    })
}

fn managed() -> Value {
    json!({"managed": {}})
}

fn external(secret: &str) -> Value {
    json!({"external": {"secretRef": {"name": secret, "key": "url"}}})
}

/// `valid` is accepted (server dry run) and `invalid` refused with a message containing `message`.
fn refused(k: &Kubectl, ns: &str, case: &str, valid: &Value, invalid: &Value, message: &str) {
    let ok = k.run_stdin(
        &["create", "--dry-run=server", "-n", ns, "-f", "-"],
        &valid.to_string(),
    );
    assert!(ok.success, "{case}: the valid twin was refused: {}", ok.stderr);
    let bad = k.run_stdin(
        &["create", "--dry-run=server", "-n", ns, "-f", "-"],
        &invalid.to_string(),
    );
    assert!(!bad.success, "{case}: accepted {invalid}");
    assert!(
        bad.stderr.contains(message),
        "{case}: refused, but without the message {message:?}:\n{}",
        bad.stderr
    );
}

#[test]
fn invalid_objects_are_refused_with_cel_messages() {
    let c = require_cluster!("invalid_objects_are_refused_with_cel_messages");
    crds::install(&c.kubectl);
    let k = &c.kubectl;
    let ns = env::unique_name("cel");
    k.namespace(&ns);

    let both = json!({"managed": {}, "external": {"secretRef": {"name": "db"}}});
    refused(
        k,
        &ns,
        "both database modes",
        &lockservice("ls", managed()),
        &lockservice("ls", both),
        "set exactly one of database.managed or database.external",
    );
    refused(
        k,
        &ns,
        "no database mode",
        &lockservice("ls", external("db")),
        &lockservice("ls", json!({})),
        "set exactly one of database.managed or database.external",
    );
    refused(
        k,
        &ns,
        "storage size",
        &lockservice("ls", json!({"managed": {"storageSize": "2Gi"}})),
        &lockservice("ls", json!({"managed": {"storageSize": "plenty"}})),
        "storageSize must be a quantity such as 1Gi",
    );
    refused(
        k,
        &ns,
        "empty secret name",
        &lockservice("ls", external("db")),
        &lockservice("ls", external("")),
        "secretRef.name must not be empty",
    );
    let long = "l".repeat(37);
    refused(
        k,
        &ns,
        "name too long",
        &lockservice(&"l".repeat(36), managed()),
        &lockservice(&long, managed()),
        "metadata.name must be at most 36 characters",
    );
    // backend etcd: the etcd block instead of lockdb, exactly one of managed or external, odd members.
    let etcd_valid = etcd_lockservice("ls", json!({"managed": {}}));
    let mut etcd_with_lockdb = etcd_valid.clone();
    etcd_with_lockdb["spec"]["database"] = managed();
    refused(
        k,
        &ns,
        "etcd with a lockdb",
        &etcd_valid,
        &etcd_with_lockdb,
        "spec.database is required with backend postgres (lockdb) and not allowed with backend etcd",
    );
    let mut etcd_without_block = etcd_valid.clone();
    etcd_without_block["spec"]
        .as_object_mut()
        .map(|o| o.remove("etcd"));
    refused(
        k,
        &ns,
        "etcd without its block",
        &etcd_valid,
        &etcd_without_block,
        "spec.etcd is required with backend etcd",
    );
    let mut pg_with_etcd = lockservice("ls", managed());
    pg_with_etcd["spec"]["etcd"] = json!({"managed": {}});
    refused(
        k,
        &ns,
        "postgres with an etcd block",
        &lockservice("ls", managed()),
        &pg_with_etcd,
        "spec.etcd is required with backend etcd and not allowed with backend postgres",
    );
    refused(
        k,
        &ns,
        "both etcd modes",
        &etcd_lockservice("ls", json!({"external": {"secretRef": {"name": "etcd"}}})),
        &etcd_lockservice(
            "ls",
            json!({"managed": {}, "external": {"secretRef": {"name": "etcd"}}}),
        ),
        "set exactly one of etcd.managed",
    );
    refused(
        k,
        &ns,
        "even etcd members",
        &etcd_lockservice("ls", json!({"managed": {"replicas": 5}})),
        &etcd_lockservice("ls", json!({"managed": {"replicas": 4}})),
        "etcd.managed.replicas must be odd",
    );
    refused(
        k,
        &ns,
        "emptyDir with a storage class",
        &etcd_lockservice("ls", json!({"managed": {"storage": {"emptyDir": true}}})),
        &etcd_lockservice(
            "ls",
            json!({"managed": {"storage": {"emptyDir": true, "storageClassName": "fast"}}}),
        ),
        "emptyDir takes no storageClassName",
    );
    refused(
        k,
        &ns,
        "etcd key prefix",
        &etcd_lockservice("ls", json!({"managed": {}, "keyPrefix": "/a/"})),
        &etcd_lockservice("ls", json!({"managed": {}, "keyPrefix": "a"})),
        "etcd.keyPrefix must start and end with '/'",
    );
    let mut too_many = lockservice("ls", managed());
    too_many["spec"]["lockServer"] = json!({"replicas": 21});
    let mut enough = lockservice("ls", managed());
    enough["spec"]["lockServer"] = json!({"replicas": 20});
    refused(
        k,
        &ns,
        "replicas bound",
        &enough,
        &too_many,
        "less than or equal to 20",
    );

    let stub =
        json!({"lockServiceRef": {"name": "ls"}, "database": managed(), "railStub": {"enabled": true}});
    let no_rail = json!({"lockServiceRef": {"name": "ls"}, "database": managed()});
    refused(
        k,
        &ns,
        "no rail",
        &paymentstack("ps", stub.clone()),
        &paymentstack("ps", no_rail),
        "railProxy.railUrl is required unless railStub.enabled is true",
    );
    let mut empty_ref = stub.clone();
    empty_ref["lockServiceRef"]["name"] = json!("");
    refused(
        k,
        &ns,
        "empty lockServiceRef",
        &paymentstack("ps", stub.clone()),
        &paymentstack("ps", empty_ref),
        "lockServiceRef.name must name a LockService",
    );
}

/// Transition rules (`oldSelf`) run on update: the database mode and the LockService reference are
/// fixed at creation. Each refused update is paired with an accepted one on the same object.
#[test]
fn immutable_fields_are_refused_on_update() {
    let c = require_cluster!("immutable_fields_are_refused_on_update");
    crds::install(&c.kubectl);
    let k = &c.kubectl;
    let ns = env::unique_name("cel-upd");
    k.namespace(&ns);

    k.create(&ns, &lockservice("ls", managed())).ok();
    let ok = k.patch(
        &ns,
        "lockservice",
        "ls",
        &json!({"spec": {"lockServer": {"replicas": 3}}}),
    );
    assert!(ok.success, "a replicas change is allowed: {}", ok.stderr);
    let bad = k.patch(
        &ns,
        "lockservice",
        "ls",
        &json!({"spec": {"database": {"managed": null, "external": {"secretRef": {"name": "db"}}}}}),
    );
    assert!(!bad.success, "switching the database mode was accepted");
    assert!(
        bad.stderr
            .contains("database mode (managed vs external) is immutable after creation"),
        "{}",
        bad.stderr
    );

    // The backend, the etcd mode and the managed members are fixed too.
    let bad = k.patch(
        &ns,
        "lockservice",
        "ls",
        &json!({"spec": {"backend": "etcd", "database": null, "etcd": {"managed": {}}}}),
    );
    assert!(!bad.success, "switching the backend was accepted");
    assert!(bad.stderr.contains("backend is immutable"), "{}", bad.stderr);
    k.create(&ns, &etcd_lockservice("le", json!({"managed": {"replicas": 3}})))
        .ok();
    let ok = k.patch(
        &ns,
        "lockservice",
        "le",
        &json!({"spec": {"etcd": {"managed": {"image": "registry.k8s.io/etcd:3.6.6-0"}}}}),
    );
    assert!(ok.success, "an etcd image change is allowed: {}", ok.stderr);
    let bad = k.patch(
        &ns,
        "lockservice",
        "le",
        &json!({"spec": {"etcd": {"managed": {"replicas": 5}}}}),
    );
    assert!(!bad.success, "growing the managed members was accepted");
    assert!(
        bad.stderr.contains("etcd.managed.replicas is immutable"),
        "{}",
        bad.stderr
    );
    let bad = k.patch(
        &ns,
        "lockservice",
        "le",
        &json!({"spec": {"etcd": {"managed": {"storage": {"size": "9Gi"}}}}}),
    );
    assert!(!bad.success, "resizing the members' volumes was accepted");
    assert!(
        bad.stderr.contains("etcd.managed.storage is immutable"),
        "{}",
        bad.stderr
    );
    let bad = k.patch(
        &ns,
        "lockservice",
        "le",
        &json!({"spec": {"etcd": {"managed": null, "external": {"secretRef": {"name": "etcd"}}}}}),
    );
    assert!(!bad.success, "switching the etcd mode was accepted");
    assert!(
        bad.stderr
            .contains("etcd mode (managed vs external) is immutable"),
        "{}",
        bad.stderr
    );
    let le = k
        .get(Some(&ns), "lockservice", "le")
        .unwrap_or_else(|| panic!("le vanished"));
    assert_eq!(le["spec"]["etcd"]["managed"]["replicas"], 3);
    assert_eq!(le["spec"]["etcd"]["managed"]["storage"]["size"], "1Gi");

    let spec =
        json!({"lockServiceRef": {"name": "ls"}, "database": managed(), "railStub": {"enabled": true}});
    k.create(&ns, &paymentstack("ps", spec)).ok();
    let ok = k.patch(
        &ns,
        "paymentstack",
        "ps",
        &json!({"spec": {"payoutExecutor": {"replicas": 1}}}),
    );
    assert!(ok.success, "a replicas change is allowed: {}", ok.stderr);
    let bad = k.patch(
        &ns,
        "paymentstack",
        "ps",
        &json!({"spec": {"lockServiceRef": {"name": "other"}}}),
    );
    assert!(!bad.success, "re-pointing lockServiceRef was accepted");
    assert!(
        bad.stderr.contains("lockServiceRef is immutable"),
        "{}",
        bad.stderr
    );
    // Nothing was written by the refused updates.
    let ps = k
        .get(Some(&ns), "paymentstack", "ps")
        .unwrap_or_else(|| panic!("ps vanished"));
    assert_eq!(ps["spec"]["lockServiceRef"]["name"], "ls");
    let ls = k
        .get(Some(&ns), "lockservice", "ls")
        .unwrap_or_else(|| panic!("ls vanished"));
    assert!(ls["spec"]["database"]["managed"].is_object());
}
