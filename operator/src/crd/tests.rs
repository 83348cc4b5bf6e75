//! The CRDs as the apiserver will see them: committed files fresh, names and columns, defaults, and
//! every CEL rule evaluated (with kube's client-side CEL evaluator) on objects it must accept and
//! objects it must reject.

use kube::CustomResourceExt;
use kube::core::cel::Validator;
use serde_json::{Value, json};

use super::*;

fn schema<K: CustomResourceExt>() -> Value {
    let crd = K::crd();
    serde_json::to_value(
        crd.spec.versions[0]
            .schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .unwrap(),
    )
    .unwrap()
}

/// Removes every `x-kubernetes-validations` (the negative control: the same objects then pass).
fn strip_rules(v: &mut Value) {
    match v {
        Value::Object(map) => {
            map.remove("x-kubernetes-validations");
            map.values_mut().for_each(strip_rules);
        }
        Value::Array(items) => items.iter_mut().for_each(strip_rules),
        _ => {}
    }
}

fn check(schema: &Value, obj: &Value, old: Option<&Value>) -> Result<(), String> {
    Validator::new()
        .validate(schema, obj, old)
        .map_err(|e| e.to_string())
}

fn lock_service(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "dlock.dev/v1alpha1", "kind": "LockService", "metadata": {"name": name}, "spec": spec})
}

fn payment_stack(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "dlock.dev/v1alpha1", "kind": "PaymentStack", "metadata": {"name": name}, "spec": spec})
}

fn stack_spec() -> Value {
    json!({"lockServiceRef": {"name": "locks"}, "database": {"managed": {}}, "railStub": {"enabled": true}})
}

fn rejects(schema: &Value, obj: &Value, old: Option<&Value>, needle: &str) {
    match check(schema, obj, old) {
        Ok(()) => panic!("accepted an object the CRD must reject ({needle}): {obj}"),
        Err(e) => assert!(e.contains(needle), "rejected for another reason: {e}"),
    }
    // Negative control: without the CEL rules the same object passes, so the rule did the rejecting.
    let mut bare = schema.clone();
    strip_rules(&mut bare);
    check(&bare, obj, old).unwrap();
}

#[test]
fn committed_crd_files_match_the_types() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../crds");
    for (file, crd) in all() {
        let want = to_yaml(&crd).unwrap();
        let have = std::fs::read_to_string(dir.join(file)).unwrap_or_default();
        assert!(
            have == want,
            "crds/{file} is stale: run `cargo run -p dlock-operator --bin crdgen` and commit the result"
        );
    }
}

#[test]
fn names_scope_subresource_and_columns() {
    let ls = LockService::crd();
    assert_eq!(ls.metadata.name.as_deref(), Some("lockservices.dlock.dev"));
    assert_eq!(ls.spec.scope, "Namespaced");
    assert_eq!(ls.spec.names.short_names, Some(vec!["lsvc".to_owned()]));
    let ps = PaymentStack::crd();
    assert_eq!(ps.metadata.name.as_deref(), Some("paymentstacks.dlock.dev"));
    assert_eq!(ps.spec.scope, "Namespaced");
    assert_eq!(ps.spec.names.short_names, Some(vec!["pstack".to_owned()]));
    for crd in [&ls, &ps] {
        let v = &crd.spec.versions[0];
        assert_eq!(v.name, "v1alpha1");
        assert!(v.subresources.as_ref().and_then(|s| s.status.as_ref()).is_some());
        let columns: Vec<&str> = v
            .additional_printer_columns
            .iter()
            .flatten()
            .map(|c| c.name.as_str())
            .collect();
        for want in ["Phase", "Ready", "Age"] {
            assert!(columns.contains(&want), "{want} missing from {columns:?}");
        }
    }
    let ls_columns = serde_json::to_string(&ls.spec.versions[0].additional_printer_columns).unwrap();
    assert!(ls_columns.contains(".status.endpoints.lockServer"));
    for path in [
        ".status.lastAction",
        ".status.fencing.sequence",
        ".status.fencing.highWater",
        ".status.sequence.lastJump.timeline",
        ".status.sequence.lastJump.cause",
    ] {
        assert!(ls_columns.contains(path), "{path} missing from {ls_columns}");
    }
}

#[test]
fn minimal_objects_get_the_documented_defaults() {
    let ls: LockServiceSpec = serde_json::from_value(json!({"database": {"managed": {}}})).unwrap();
    let managed = ls.database.as_ref().unwrap().managed.as_ref().unwrap();
    assert_eq!(managed.image, "postgres:16");
    assert_eq!(managed.storage_size, "1Gi");
    assert_eq!(ls.backend, Backend::Postgres);
    assert_eq!(ls.lock_server.replicas, 2);
    assert_eq!(ls.lock_server.image, None);
    assert_eq!(
        (ls.lease.default_ttl_ms, ls.lease.session_ttl_ms),
        (10_000, 30_000)
    );

    let ps: PaymentStackSpec = serde_json::from_value(json!({
        "lockServiceRef": {"name": "locks"},
        "database": {"external": {"secretRef": {"name": "paydb-url"}}},
        "railProxy": {"railUrl": "https://rail.example"}
    }))
    .unwrap();
    assert_eq!(ps.database.external.as_ref().unwrap().secret_ref.key, "url");
    assert!(ps.kill_switches.payment_fencing_enabled);
    assert!(ps.kill_switches.rail_proxy_fencing_enabled);
    assert!(!ps.rail_stub.enabled);
    assert_eq!(ps.payout_executor.workers, 4);

    // The schema carries the same defaults, so `kubectl get -o yaml` shows them.
    let s = schema::<PaymentStack>();
    let kill = &s["properties"]["spec"]["properties"]["killSwitches"]["properties"];
    assert_eq!(kill["paymentFencingEnabled"]["default"], json!(true));
    assert_eq!(kill["railProxyFencingEnabled"]["default"], json!(true));
}

#[test]
fn valid_objects_pass_every_rule() {
    let ls = schema::<LockService>();
    check(
        &ls,
        &lock_service("locks", json!({"database": {"managed": {}}})),
        None,
    )
    .unwrap();
    check(
        &ls,
        &lock_service(
            "locks",
            json!({"database": {"external": {"secretRef": {"name": "cloudsql"}}}, "backend": "postgres"}),
        ),
        None,
    )
    .unwrap();
    let ps = schema::<PaymentStack>();
    check(&ps, &payment_stack("pay", stack_spec()), None).unwrap();
    let mut external_rail = stack_spec();
    external_rail["railStub"] = json!({"enabled": false});
    external_rail["railProxy"] = json!({"railUrl": "https://rail.example"});
    check(&ps, &payment_stack("pay", external_rail), None).unwrap();
}

#[test]
fn database_must_be_exactly_one_of_managed_or_external() {
    let s = schema::<LockService>();
    let both = json!({"database": {"managed": {}, "external": {"secretRef": {"name": "x"}}}});
    rejects(&s, &lock_service("locks", both), None, "exactly one");
    rejects(
        &s,
        &lock_service("locks", json!({"database": {}})),
        None,
        "exactly one",
    );
    let ps = schema::<PaymentStack>();
    let mut spec = stack_spec();
    spec["database"] = json!({});
    rejects(&ps, &payment_stack("pay", spec), None, "exactly one");
}

#[test]
fn database_mode_is_immutable() {
    let s = schema::<LockService>();
    let managed = lock_service("locks", json!({"database": {"managed": {}}}));
    let external = lock_service(
        "locks",
        json!({"database": {"external": {"secretRef": {"name": "x"}}}}),
    );
    rejects(&s, &external, Some(&managed), "immutable");
    rejects(&s, &managed, Some(&external), "immutable");
    // Changing something else in the same mode is fine.
    let new_image = lock_service(
        "locks",
        json!({"database": {"managed": {"image": "postgres:16.4"}}}),
    );
    check(&s, &new_image, Some(&managed)).unwrap();
}

#[test]
fn managed_volume_is_immutable_and_a_quantity() {
    let s = schema::<LockService>();
    let small = lock_service("locks", json!({"database": {"managed": {"storageSize": "1Gi"}}}));
    let big = lock_service("locks", json!({"database": {"managed": {"storageSize": "5Gi"}}}));
    rejects(&s, &big, Some(&small), "immutable");
    let classed = lock_service(
        "locks",
        json!({"database": {"managed": {"storageSize": "1Gi", "storageClassName": "fast"}}}),
    );
    rejects(&s, &classed, Some(&small), "immutable");
    let junk = lock_service("locks", json!({"database": {"managed": {"storageSize": "lots"}}}));
    rejects(&s, &junk, None, "quantity");
}

#[test]
fn highly_available_databases_need_the_engine_and_standbys_for_their_synchronous_settings() {
    let s = schema::<LockService>();
    let managed = |m: Value| lock_service("locks", json!({"database": {"managed": m}}));
    let ha = managed(json!({"engine": "CloudNativePG", "instances": 3, "synchronous": {"number": 2}}));
    check(&s, &ha, None).unwrap();
    check(&s, &managed(json!({"engine": "CloudNativePG"})), None).unwrap();
    check(
        &s,
        &managed(json!({"engine": "CloudNativePG", "instances": 2, "synchronous": {}})),
        None,
    )
    .unwrap();
    check(
        &s,
        &managed(json!({"engine": "CloudNativePG", "instances": 2, "synchronous": {"dataDurability": "Preferred"}})),
        None,
    )
    .unwrap();
    // Scaling the instances is a change of the field.
    let two = managed(json!({"engine": "CloudNativePG", "instances": 2, "synchronous": {"number": 1}}));
    check(&s, &ha, Some(&two)).unwrap();

    rejects(
        &s,
        &managed(json!({"instances": 2})),
        None,
        "needs engine: CloudNativePG",
    );
    rejects(
        &s,
        &managed(json!({"engine": "StatefulSet", "instances": 3})),
        None,
        "needs engine: CloudNativePG",
    );
    rejects(
        &s,
        &managed(json!({"synchronous": {"number": 1}})),
        None,
        "synchronous needs engine: CloudNativePG",
    );
    // More synchronous standbys than there are standbys: no commit could ever return.
    for (instances, number) in [(1, 1), (2, 2), (3, 5)] {
        rejects(
            &s,
            &managed(
                json!({"engine": "CloudNativePG", "instances": instances, "synchronous": {"number": number}}),
            ),
            None,
            "must be below instances",
        );
    }
    rejects(
        &s,
        &managed(json!({"engine": "CloudNativePG", "synchronous": {}})),
        None,
        "must be below instances",
    );
    // No change of engine after creation, either way (the default counts as StatefulSet).
    let plain = managed(json!({}));
    rejects(
        &s,
        &managed(json!({"engine": "CloudNativePG"})),
        Some(&plain),
        "engine is immutable",
    );
    rejects(
        &s,
        &managed(json!({})),
        Some(&managed(json!({"engine": "CloudNativePG"}))),
        "engine is immutable",
    );
    check(&s, &managed(json!({"engine": "StatefulSet"})), Some(&plain)).unwrap();
    // Bounds of the schema itself (instances >= 1, the enums) are the API server's to enforce:
    // e2e/tests/crds.rs checks them on a real one.
    // The same rules guard a PaymentStack's paydb.
    let p = schema::<PaymentStack>();
    let stack = json!({"lockServiceRef": {"name": "locks"}, "railStub": {"enabled": true},
        "database": {"managed": {"instances": 2}}});
    rejects(
        &p,
        &payment_stack("pay", stack),
        None,
        "needs engine: CloudNativePG",
    );
}

#[test]
fn external_secret_ref_needs_a_name() {
    let s = schema::<LockService>();
    let empty = lock_service(
        "locks",
        json!({"database": {"external": {"secretRef": {"name": ""}}}}),
    );
    rejects(&s, &empty, None, "secretRef.name");
}

fn etcd(block: Value) -> Value {
    lock_service("locks", json!({"backend": "etcd", "etcd": block}))
}

#[test]
fn etcd_backend_is_accepted_managed_or_external() {
    let s = schema::<LockService>();
    for ok in [
        json!({"managed": {}}),
        json!({"managed": {"replicas": 1}}),
        json!({"managed": {"replicas": 5, "image": "etcd:3.6", "storage": {"size": "2Gi", "storageClassName": "fast"}}}),
        json!({"managed": {"storage": {"emptyDir": true, "size": "256Mi"}}, "keyPrefix": "/team-a/"}),
        json!({"external": {"secretRef": {"name": "prod-etcd"}}}),
        json!({"external": {"secretRef": {"name": "prod-etcd", "key": "urls"}}}),
        json!({"external": {"secretRef": {"name": "prod-etcd"}, "caSecretRef": {"name": "etcd-ca"}}}),
        json!({"external": {"secretRef": {"name": "prod-etcd"}, "caSecretRef": {"name": "etcd-ca"},
                            "clientCertificateSecretRef": {"name": "etcd-client"}}}),
    ] {
        check(&s, &etcd(ok.clone()), None).unwrap_or_else(|e| panic!("{ok}: {e}"));
    }
    // A client certificate is presented over TLS, which needs the CA to trust.
    let cert_without_ca = json!({"external": {"secretRef": {"name": "prod-etcd"},
                                              "clientCertificateSecretRef": {"name": "etcd-client"}}});
    rejects(
        &s,
        &etcd(cert_without_ca),
        None,
        "needs etcd.external.caSecretRef",
    );
    // The defaults: three members on 1Gi claims, the kubeadm etcd image, prefix /dlock/, key `endpoints`.
    let spec: LockServiceSpec =
        serde_json::from_value(json!({"backend": "etcd", "etcd": {"managed": {}}})).unwrap();
    let e = spec.etcd.as_ref().unwrap();
    let m = e.managed.as_ref().unwrap();
    assert_eq!(
        (m.replicas, m.storage.size.as_str(), m.storage.empty_dir),
        (3, "1Gi", false)
    );
    assert_eq!(m.image, "registry.k8s.io/etcd:3.6.5-0");
    assert_eq!(e.key_prefix, "/dlock/");
    assert!(spec.database.is_none());
    assert!(matches!(spec.store(), Some(LockStore::Etcd(_))));
    let ext: EtcdSpec = serde_json::from_value(json!({"external": {"secretRef": {"name": "x"}}})).unwrap();
    assert_eq!(ext.external.unwrap().secret_ref.key, "endpoints");
}

#[test]
fn the_store_block_must_match_the_backend() {
    let s = schema::<LockService>();
    // etcd without its block, or with lockdb's.
    rejects(
        &s,
        &lock_service("locks", json!({"backend": "etcd"})),
        None,
        "spec.etcd is required with backend etcd",
    );
    rejects(
        &s,
        &lock_service(
            "locks",
            json!({"backend": "etcd", "etcd": {"managed": {}}, "database": {"managed": {}}}),
        ),
        None,
        "not allowed with backend etcd",
    );
    // postgres (explicit or by default) with an etcd block, or without lockdb.
    rejects(
        &s,
        &lock_service(
            "locks",
            json!({"database": {"managed": {}}, "etcd": {"managed": {}}}),
        ),
        None,
        "not allowed with backend postgres",
    );
    rejects(
        &s,
        &lock_service("locks", json!({"backend": "postgres"})),
        None,
        "spec.database is required with backend postgres",
    );
}

#[test]
fn etcd_is_exactly_one_of_managed_or_external() {
    let s = schema::<LockService>();
    rejects(&s, &etcd(json!({})), None, "exactly one of etcd.managed");
    rejects(
        &s,
        &etcd(json!({"managed": {}, "external": {"secretRef": {"name": "x"}}})),
        None,
        "exactly one of etcd.managed",
    );
    rejects(
        &s,
        &etcd(json!({"external": {"secretRef": {"name": ""}}})),
        None,
        "etcd.external.secretRef.name",
    );
}

#[test]
fn managed_etcd_members_are_odd_and_fixed_with_their_volumes() {
    let s = schema::<LockService>();
    for even in [2, 4, 6] {
        rejects(
            &s,
            &etcd(json!({"managed": {"replicas": even}})),
            None,
            "must be odd",
        );
    }
    let three = etcd(json!({"managed": {"replicas": 3, "storage": {"size": "1Gi"}}}));
    let five = etcd(json!({"managed": {"replicas": 5, "storage": {"size": "1Gi"}}}));
    rejects(&s, &five, Some(&three), "replicas is immutable");
    let bigger = etcd(json!({"managed": {"replicas": 3, "storage": {"size": "5Gi"}}}));
    rejects(&s, &bigger, Some(&three), "storage is immutable");
    // Another image (an etcd upgrade, rolled member by member) is fine.
    let upgraded =
        etcd(json!({"managed": {"replicas": 3, "storage": {"size": "1Gi"}, "image": "etcd:3.6.6"}}));
    check(&s, &upgraded, Some(&three)).unwrap();
    rejects(
        &s,
        &etcd(json!({"managed": {"storage": {"emptyDir": true, "storageClassName": "fast"}}})),
        None,
        "emptyDir takes no storageClassName",
    );
    rejects(
        &s,
        &etcd(json!({"managed": {"storage": {"size": "lots"}}})),
        None,
        "quantity",
    );
    rejects(
        &s,
        &etcd(json!({"managed": {}, "keyPrefix": "dlock"})),
        None,
        "keyPrefix",
    );
}

#[test]
fn backend_and_etcd_mode_are_immutable() {
    let s = schema::<LockService>();
    let postgres = lock_service(
        "locks",
        json!({"backend": "postgres", "database": {"managed": {}}}),
    );
    let managed = etcd(json!({"managed": {}}));
    let external = etcd(json!({"external": {"secretRef": {"name": "x"}}}));
    rejects(&s, &managed, Some(&postgres), "backend is immutable");
    rejects(&s, &postgres, Some(&managed), "backend is immutable");
    rejects(
        &s,
        &external,
        Some(&managed),
        "etcd mode (managed vs external) is immutable",
    );
    rejects(
        &s,
        &managed,
        Some(&external),
        "etcd mode (managed vs external) is immutable",
    );
    // Same mode, another Secret: allowed (lock-server restarts on it).
    check(
        &s,
        &etcd(json!({"external": {"secretRef": {"name": "y"}}})),
        Some(&external),
    )
    .unwrap();
}

#[test]
fn names_longer_than_child_names_allow_are_rejected() {
    let long = "a".repeat(37);
    rejects(
        &schema::<LockService>(),
        &lock_service(&long, json!({"database": {"managed": {}}})),
        None,
        "36",
    );
    rejects(
        &schema::<PaymentStack>(),
        &payment_stack(&long, stack_spec()),
        None,
        "36",
    );
    check(
        &schema::<LockService>(),
        &lock_service(&"a".repeat(36), json!({"database": {"managed": {}}})),
        None,
    )
    .unwrap();
}

#[test]
fn a_stack_must_name_its_lock_service_and_keep_it() {
    let s = schema::<PaymentStack>();
    let mut spec = stack_spec();
    spec["lockServiceRef"] = json!({"name": ""});
    rejects(&s, &payment_stack("pay", spec), None, "must name a LockService");

    let mut other = stack_spec();
    other["lockServiceRef"] = json!({"name": "other-locks"});
    let old = payment_stack("pay", stack_spec());
    rejects(&s, &payment_stack("pay", other), Some(&old), "immutable");
}

#[test]
fn rail_url_is_required_without_the_stub() {
    let s = schema::<PaymentStack>();
    let mut spec = stack_spec();
    spec["railStub"] = json!({"enabled": false});
    rejects(
        &s,
        &payment_stack("pay", spec.clone()),
        None,
        "railUrl is required",
    );
    spec.as_object_mut().unwrap().remove("railStub");
    rejects(&s, &payment_stack("pay", spec), None, "railUrl is required");
}

/// `minimum`/`maximum` of an integer property (OpenAPI keeps them as numbers; schemars writes `20.0`).
#[allow(clippy::cast_possible_truncation)]
fn bounds(prop: &Value) -> (i64, i64) {
    let n = |k: &str| prop[k].as_f64().unwrap_or_else(|| panic!("no {k} in {prop}")) as i64;
    (n("minimum"), n("maximum"))
}

/// Bounds the CEL evaluator does not check (plain OpenAPI), asserted on the schema itself.
#[test]
fn replica_worker_and_ttl_bounds() {
    let ls = schema::<LockService>();
    let spec = &ls["properties"]["spec"]["properties"];
    let replicas = &spec["lockServer"]["properties"]["replicas"];
    assert_eq!(bounds(replicas), (0, 20));
    for ttl in ["defaultTtlMs", "sessionTtlMs"] {
        let t = &spec["lease"]["properties"][ttl];
        let (min, max) = bounds(t);
        assert_eq!(
            (min, max),
            (lockservice::MIN_LEASE_TTL_MS, lockservice::MAX_LEASE_TTL_MS)
        );
        // Never a TTL the lock API would refuse.
        assert!(min >= dlock_common::validate::MIN_TTL_MS && max <= dlock_common::validate::MAX_TTL_MS);
    }
    let ps = schema::<PaymentStack>();
    let spec = &ps["properties"]["spec"]["properties"];
    for component in ["paymentResource", "railProxy", "payoutExecutor"] {
        let r = &spec[component]["properties"]["replicas"];
        assert_eq!(bounds(r), (0, 20), "{component}");
    }
    let w = &spec["payoutExecutor"]["properties"]["workers"];
    assert_eq!(bounds(w), (1, 64));
    assert_eq!(lockservice::MAX_REPLICAS, 20);
}

#[test]
fn status_has_room_for_actions_and_standard_conditions() {
    for s in [schema::<LockService>(), schema::<PaymentStack>()] {
        let status = &s["properties"]["status"]["properties"];
        for field in [
            "observedGeneration",
            "phase",
            "conditions",
            "endpoints",
            "migration",
            "actions",
        ] {
            assert!(status.get(field).is_some(), "status.{field} missing");
        }
        // Keyed by id: one entry per request, merged by id.
        assert_eq!(status["actions"]["x-kubernetes-list-type"], "map");
        assert_eq!(status["actions"]["x-kubernetes-list-map-keys"], json!(["id"]));
        let phases = status["phase"]["enum"].as_array().unwrap();
        assert_eq!(phases.len(), 4);
        let condition = &status["conditions"]["items"]["properties"];
        for field in ["type", "status", "reason", "message", "lastTransitionTime"] {
            assert!(condition.get(field).is_some(), "condition.{field} missing");
        }
    }
}

/// The documented examples are valid objects: they parse into the types and pass every CEL rule.
#[test]
fn examples_are_valid() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut seen = 0;
    for (file, schema) in [
        ("lockservice.yaml", schema::<LockService>()),
        ("paymentstack.yaml", schema::<PaymentStack>()),
    ] {
        let text = std::fs::read_to_string(dir.join(file)).unwrap();
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let obj: Value = serde::Deserialize::deserialize(doc).unwrap();
            check(&schema, &obj, None).unwrap_or_else(|e| panic!("{file}: {e}"));
            match obj["kind"].as_str() {
                Some("LockService") => drop(serde_json::from_value::<LockService>(obj).unwrap()),
                Some("PaymentStack") => drop(serde_json::from_value::<PaymentStack>(obj).unwrap()),
                other => panic!("{file}: unexpected kind {other:?}"),
            }
            seen += 1;
        }
    }
    assert_eq!(seen, 3);
}
