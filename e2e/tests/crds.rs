//! The generated CRDs on a real API server: they install and become Established, the samples in
//! `config/samples/` apply as they are, and invalid objects are refused with the CRDs' own CEL
//! messages (each refusal paired with its valid twin being accepted, so a refusal is known to come
//! from the one field changed).

use dlock_e2e::k8s::{self, Kind};
use dlock_e2e::specs::{etcd_lockservice, lockservice, paymentstack, stack_spec};
use dlock_e2e::{crds, env, require_cluster};
use dlock_operator::crd::{
    Backend, DatabaseEngine, DatabaseSpec, EtcdSpec, EtcdStorage, ExternalDatabase, LockService,
    ManagedDatabase, ManagedEtcd, PaymentStack, Synchronous,
};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::PostParams;
use kube::{Api, Client, Resource};
use serde_json::json;

/// A LockService's default lock-server replicas (what the CRD defaults an absent block to).
const DEFAULT_REPLICAS: i32 = 2;

#[tokio::test]
async fn crds_install_and_become_established() {
    let c = require_cluster!("crds_install_and_become_established");
    let names = crds::install(&c.client).await;
    let api = k8s::cluster_api::<CustomResourceDefinition>(&c.client);
    for expected in ["lockservices.dlock.dev", "paymentstacks.dlock.dev"] {
        assert!(
            names.iter().any(|n| n == expected),
            "{expected} not installed: {names:?}"
        );
        let crd = k8s::must_get(&api, expected).await;
        let condition = |t: &str| {
            crd.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .into_iter()
                .flatten()
                .any(|c| c.type_ == t && c.status == "True")
        };
        assert!(condition("Established"), "{:?}", crd.status);
        assert!(condition("NamesAccepted"), "{:?}", crd.status);
        assert_eq!(crd.spec.group, "dlock.dev");
        let served: Vec<&str> = crd
            .spec
            .versions
            .iter()
            .filter(|v| v.served)
            .map(|v| v.name.as_str())
            .collect();
        assert_eq!(served, ["v1alpha1"], "{expected}");
    }
    // The short names and category work through discovery, as users type them (kubectl: the point
    // is the user's command line).
    let ns = env::unique_name("crds");
    k8s::namespace(&c.client, &ns).await;
    for short in ["lsvc", "pstack", "dlock"] {
        c.kubectl.run(&["get", short, "-n", &ns]).await.ok();
    }
}

#[tokio::test]
async fn samples_apply() {
    let c = require_cluster!("samples_apply");
    crds::install(&c.client).await;
    let k = &c.kubectl;
    let ns = env::unique_name("samples");
    k8s::namespace(&c.client, &ns).await;
    let dir = env::repo_root().join("config").join("samples");
    // The README's own line, with strict server-side field validation: an unknown or misspelt field
    // fails the apply. (kubectl: the point is the user's command line.)
    let out = k
        .run(&[
            "apply",
            "-n",
            &ns,
            "--validate=strict",
            "-f",
            &dir.to_string_lossy(),
        ])
        .await
        .ok();
    let lsvcs = k8s::list(&Api::<LockService>::namespaced(c.client.clone(), &ns)).await;
    let pstacks = k8s::list(&Api::<PaymentStack>::namespaced(c.client.clone(), &ns)).await;
    let secrets_api = Api::<Secret>::namespaced(c.client.clone(), &ns);
    let secrets = k8s::list(&secrets_api).await;
    let mut seen: Vec<String> = lsvcs.iter().map(k8s::describe).collect();
    seen.extend(pstacks.iter().map(k8s::describe));
    seen.extend(secrets.iter().map(k8s::describe));
    for (kind, n) in [
        ("LockService", lsvcs.len()),
        ("PaymentStack", pstacks.len()),
        ("Secret", secrets.len()),
    ] {
        assert!(n > 0, "no {kind} from the samples:\n{}", out.stdout);
    }
    // Both database modes are covered.
    let database = |l: &LockService| l.spec.database.clone();
    assert!(
        lsvcs
            .iter()
            .any(|l| database(l).is_some_and(|d| d.managed.is_some())),
        "{seen:?}"
    );
    assert!(
        lsvcs
            .iter()
            .any(|l| database(l).is_some_and(|d| d.external.is_some())),
        "{seen:?}"
    );
    // A highly available database (engine CloudNativePG) is covered, for both kinds.
    let on_cnpg = |d: Option<&DatabaseSpec>| {
        d.and_then(|d| d.managed.as_ref()).is_some_and(|m| {
            m.engine == DatabaseEngine::CloudNativePg && m.instances > 1 && m.synchronous.is_some()
        })
    };
    assert!(
        lsvcs.iter().any(|l| on_cnpg(l.spec.database.as_ref())),
        "{seen:?}"
    );
    assert!(
        pstacks.iter().any(|p| on_cnpg(Some(&p.spec.database))),
        "{seen:?}"
    );
    // Both etcd modes are covered, and an external etcd's Secret ships with it.
    assert!(
        lsvcs
            .iter()
            .any(|l| l.spec.backend == Backend::Etcd
                && l.spec.etcd.as_ref().is_some_and(|e| e.managed.is_some())),
        "{seen:?}"
    );
    let external_etcd: Vec<&LockService> = lsvcs
        .iter()
        .filter(|l| l.spec.etcd.as_ref().is_some_and(|e| e.external.is_some()))
        .collect();
    assert!(!external_etcd.is_empty(), "{seen:?}");
    for l in external_etcd {
        let r = &l
            .spec
            .etcd
            .as_ref()
            .and_then(|e| e.external.as_ref())
            .expect("filtered")
            .secret_ref;
        let s = k8s::get(&secrets_api, &r.name)
            .await
            .unwrap_or_else(|| panic!("{} references missing Secret {}", k8s::describe(l), r.name));
        assert!(has_key(&s, &r.key), "Secret {} lacks key {}", r.name, r.key);
    }
    // Every external secretRef names a Secret the samples ship.
    let databases = lsvcs
        .iter()
        .filter_map(|l| Some((k8s::describe(l), l.spec.database.clone()?)))
        .chain(
            pstacks
                .iter()
                .map(|p| (k8s::describe(p), p.spec.database.clone())),
        );
    for (owner, database) in databases {
        if let Some(ExternalDatabase {
            secret_ref: r,
            ca_secret_ref,
        }) = database.external
        {
            let refs = std::iter::once((r.name, r.key)).chain(ca_secret_ref.map(|ca| (ca.name, ca.key)));
            for (name, key) in refs {
                let s = k8s::get(&secrets_api, &name)
                    .await
                    .unwrap_or_else(|| panic!("{owner} references missing Secret {name}"));
                assert!(has_key(&s, &key), "Secret {name} lacks key {key}");
            }
        }
    }
    // Every PaymentStack references a LockService the samples ship.
    for p in &pstacks {
        let lsvc = &p.spec.lock_service_ref.name;
        assert!(
            lsvcs.iter().any(|l| l.metadata.name.as_ref() == Some(lsvc)),
            "{} references missing LockService {lsvc}",
            k8s::describe(p)
        );
    }
    // Applying again changes no custom resource: the samples carry no field the API server
    // rewrites. (Secrets are left out: kubectl always re-sends `stringData`, reporting "configured".)
    let again = k
        .run(&["apply", "-n", &ns, "-f", &dir.to_string_lossy()])
        .await
        .ok();
    let dlock: Vec<&str> = again
        .stdout
        .lines()
        .filter(|l| l.contains(".dlock.dev/"))
        .collect();
    assert_eq!(dlock.len(), lsvcs.len() + pstacks.len());
    assert!(
        dlock.iter().all(|l| l.ends_with("unchanged")),
        "second apply changed something:\n{}",
        again.stdout
    );
}

fn has_key(s: &Secret, key: &str) -> bool {
    s.data.as_ref().is_some_and(|d| d.contains_key(key))
}

fn external(secret: &str) -> DatabaseSpec {
    DatabaseSpec::external(secret)
}

fn managed_etcd(managed: ManagedEtcd) -> EtcdSpec {
    EtcdSpec {
        managed: Some(managed),
        ..EtcdSpec::managed()
    }
}

/// `valid` is accepted (server dry run) and `invalid` refused with a message containing `message`.
async fn refused<K>(client: &Client, ns: &str, case: &str, valid: &K, invalid: &K, message: &str)
where
    K: Kind + Resource<Scope = NamespaceResourceScope>,
{
    let api = Api::<K>::namespaced(client.clone(), ns);
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    if let Err(e) = api.create(&dry_run, valid).await {
        panic!("{case}: the valid twin was refused: {e}");
    }
    match api.create(&dry_run, invalid).await {
        Ok(_) => panic!("{case}: accepted {invalid:?}"),
        Err(kube::Error::Api(s)) => assert!(
            s.message.contains(message),
            "{case}: refused, but without the message {message:?}:\n{}",
            s.message
        ),
        Err(e) => panic!("{case}: {e}"),
    }
}

#[tokio::test]
async fn invalid_objects_are_refused_with_cel_messages() {
    let c = require_cluster!("invalid_objects_are_refused_with_cel_messages");
    crds::install(&c.client).await;
    let k = &c.client;
    let ns = env::unique_name("cel");
    k8s::namespace(k, &ns).await;
    let ls = |database: DatabaseSpec| lockservice("ls", database, DEFAULT_REPLICAS);
    let els = |etcd: EtcdSpec| etcd_lockservice("ls", etcd, DEFAULT_REPLICAS);

    let both = DatabaseSpec {
        managed: Some(ManagedDatabase::default()),
        external: external("db").external,
    };
    refused(
        k,
        &ns,
        "both database modes",
        &ls(DatabaseSpec::managed()),
        &ls(both),
        "set exactly one of database.managed or database.external",
    )
    .await;
    refused(
        k,
        &ns,
        "no database mode",
        &ls(external("db")),
        &ls(DatabaseSpec {
            managed: None,
            external: None,
        }),
        "set exactly one of database.managed or database.external",
    )
    .await;
    let sized = |size: &str| DatabaseSpec {
        managed: Some(ManagedDatabase {
            storage_size: size.to_owned(),
            ..ManagedDatabase::default()
        }),
        external: None,
    };
    refused(
        k,
        &ns,
        "storage size",
        &ls(sized("2Gi")),
        &ls(sized("plenty")),
        "storageSize must be a quantity such as 1Gi",
    )
    .await;
    let engine = |engine: DatabaseEngine, instances: i32, number: Option<i32>| DatabaseSpec {
        managed: Some(ManagedDatabase {
            engine,
            instances,
            synchronous: number.map(|number| Synchronous {
                number,
                ..Synchronous::default()
            }),
            ..ManagedDatabase::default()
        }),
        external: None,
    };
    refused(
        k,
        &ns,
        "instances on the StatefulSet engine",
        &ls(engine(DatabaseEngine::CloudNativePg, 2, None)),
        &ls(engine(DatabaseEngine::StatefulSet, 2, None)),
        "database.managed.instances above 1 needs engine: CloudNativePG",
    )
    .await;
    refused(
        k,
        &ns,
        "more synchronous standbys than standbys",
        &ls(engine(DatabaseEngine::CloudNativePg, 3, Some(2))),
        &ls(engine(DatabaseEngine::CloudNativePg, 2, Some(2))),
        "synchronous.number must be below instances",
    )
    .await;
    refused(
        k,
        &ns,
        "no instance",
        &ls(engine(DatabaseEngine::CloudNativePg, 1, None)),
        &ls(engine(DatabaseEngine::CloudNativePg, 0, None)),
        "greater than or equal to 1",
    )
    .await;
    refused(
        k,
        &ns,
        "empty secret name",
        &ls(external("db")),
        &ls(external("")),
        "secretRef.name must not be empty",
    )
    .await;
    refused(
        k,
        &ns,
        "name too long",
        &lockservice(&"l".repeat(36), DatabaseSpec::managed(), DEFAULT_REPLICAS),
        &lockservice(&"l".repeat(37), DatabaseSpec::managed(), DEFAULT_REPLICAS),
        "metadata.name must be at most 36 characters",
    )
    .await;
    // backend etcd: the etcd block instead of lockdb, exactly one of managed or external, odd members.
    let etcd_valid = els(EtcdSpec::managed());
    let mut etcd_with_lockdb = etcd_valid.clone();
    etcd_with_lockdb.spec.database = Some(DatabaseSpec::managed());
    refused(
        k,
        &ns,
        "etcd with a lockdb",
        &etcd_valid,
        &etcd_with_lockdb,
        "spec.database is required with backend postgres (lockdb) and not allowed with backend etcd",
    )
    .await;
    let mut etcd_without_block = etcd_valid.clone();
    etcd_without_block.spec.etcd = None;
    refused(
        k,
        &ns,
        "etcd without its block",
        &etcd_valid,
        &etcd_without_block,
        "spec.etcd is required with backend etcd",
    )
    .await;
    let mut pg_with_etcd = ls(DatabaseSpec::managed());
    pg_with_etcd.spec.etcd = Some(EtcdSpec::managed());
    refused(
        k,
        &ns,
        "postgres with an etcd block",
        &ls(DatabaseSpec::managed()),
        &pg_with_etcd,
        "spec.etcd is required with backend etcd and not allowed with backend postgres",
    )
    .await;
    refused(
        k,
        &ns,
        "both etcd modes",
        &els(EtcdSpec::external("etcd")),
        &els(EtcdSpec {
            managed: Some(ManagedEtcd::default()),
            ..EtcdSpec::external("etcd")
        }),
        "set exactly one of etcd.managed",
    )
    .await;
    let members = |replicas: i32| {
        managed_etcd(ManagedEtcd {
            replicas,
            ..ManagedEtcd::default()
        })
    };
    refused(
        k,
        &ns,
        "even etcd members",
        &els(members(5)),
        &els(members(4)),
        "etcd.managed.replicas must be odd",
    )
    .await;
    let storage = |class: Option<&str>| {
        managed_etcd(ManagedEtcd {
            storage: EtcdStorage {
                empty_dir: true,
                storage_class_name: class.map(str::to_owned),
                ..EtcdStorage::default()
            },
            ..ManagedEtcd::default()
        })
    };
    refused(
        k,
        &ns,
        "emptyDir with a storage class",
        &els(storage(None)),
        &els(storage(Some("fast"))),
        "emptyDir takes no storageClassName",
    )
    .await;
    let prefixed = |prefix: &str| EtcdSpec {
        key_prefix: prefix.to_owned(),
        ..EtcdSpec::managed()
    };
    refused(
        k,
        &ns,
        "etcd key prefix",
        &els(prefixed("/a/")),
        &els(prefixed("a")),
        "etcd.keyPrefix must start and end with '/'",
    )
    .await;
    refused(
        k,
        &ns,
        "replicas bound",
        &lockservice("ls", DatabaseSpec::managed(), 20),
        &lockservice("ls", DatabaseSpec::managed(), 21),
        "less than or equal to 20",
    )
    .await;

    let mut no_rail = stack_spec("ls");
    no_rail.rail_stub.enabled = false;
    refused(
        k,
        &ns,
        "no rail",
        &paymentstack("ps", stack_spec("ls")),
        &paymentstack("ps", no_rail),
        "railProxy.railUrl is required unless railStub.enabled is true",
    )
    .await;
    refused(
        k,
        &ns,
        "empty lockServiceRef",
        &paymentstack("ps", stack_spec("ls")),
        &paymentstack("ps", stack_spec("")),
        "lockServiceRef.name must name a LockService",
    )
    .await;
}

/// A merge patch that must be refused with a message containing `message`.
async fn refused_patch<K: Kind>(
    api: &Api<K>,
    name: &str,
    case: &str,
    patch: serde_json::Value,
    message: &str,
) {
    match k8s::patch(api, name, &patch).await {
        Ok(_) => panic!("{case} was accepted"),
        Err(kube::Error::Api(s)) => assert!(s.message.contains(message), "{case}: {}", s.message),
        Err(e) => panic!("{case}: {e}"),
    }
}

/// Transition rules (`oldSelf`) run on update: the database mode and the LockService reference are
/// fixed at creation. Each refused update is paired with an accepted one on the same object.
#[tokio::test]
async fn immutable_fields_are_refused_on_update() {
    let c = require_cluster!("immutable_fields_are_refused_on_update");
    crds::install(&c.client).await;
    let ns = env::unique_name("cel-upd");
    k8s::namespace(&c.client, &ns).await;
    let lsvcs = Api::<LockService>::namespaced(c.client.clone(), &ns);
    let pstacks = Api::<PaymentStack>::namespaced(c.client.clone(), &ns);

    k8s::apply(
        &lsvcs,
        &lockservice("ls", DatabaseSpec::managed(), DEFAULT_REPLICAS),
    )
    .await;
    if let Err(e) = k8s::patch(&lsvcs, "ls", &json!({"spec": {"lockServer": {"replicas": 3}}})).await {
        panic!("a replicas change is allowed: {e}");
    }
    refused_patch(
        &lsvcs,
        "ls",
        "switching the database mode",
        json!({"spec": {"database": {"managed": null, "external": {"secretRef": {"name": "db"}}}}}),
        "database mode (managed vs external) is immutable after creation",
    )
    .await;
    refused_patch(
        &lsvcs,
        "ls",
        "switching the database engine",
        json!({"spec": {"database": {"managed": {"engine": "CloudNativePG"}}}}),
        "database.managed.engine is immutable after creation",
    )
    .await;
    // On CloudNativePG, instances scale (a change of the field) within what synchronous needs.
    let ha = DatabaseSpec {
        managed: Some(ManagedDatabase {
            engine: DatabaseEngine::CloudNativePg,
            instances: 2,
            synchronous: Some(Synchronous::default()),
            ..ManagedDatabase::default()
        }),
        external: None,
    };
    k8s::apply(&lsvcs, &lockservice("ha", ha, DEFAULT_REPLICAS)).await;
    if let Err(e) = k8s::patch(
        &lsvcs,
        "ha",
        &json!({"spec": {"database": {"managed": {"instances": 3}}}}),
    )
    .await
    {
        panic!("adding an instance is allowed: {e}");
    }
    refused_patch(
        &lsvcs,
        "ha",
        "dropping below the synchronous standbys",
        json!({"spec": {"database": {"managed": {"instances": 1}}}}),
        "synchronous.number must be below instances",
    )
    .await;
    refused_patch(
        &lsvcs,
        "ha",
        "back to the StatefulSet engine",
        json!({"spec": {"database": {"managed": {"engine": "StatefulSet", "instances": 1, "synchronous": null}}}}),
        "database.managed.engine is immutable after creation",
    )
    .await;

    // The backend, the etcd mode and the managed members are fixed too.
    refused_patch(
        &lsvcs,
        "ls",
        "switching the backend",
        json!({"spec": {"backend": "etcd", "database": null, "etcd": {"managed": {}}}}),
        "backend is immutable",
    )
    .await;
    let three = managed_etcd(ManagedEtcd {
        replicas: 3,
        ..ManagedEtcd::default()
    });
    k8s::apply(&lsvcs, &etcd_lockservice("le", three, DEFAULT_REPLICAS)).await;
    let image = json!({"spec": {"etcd": {"managed": {"image": "registry.k8s.io/etcd:3.6.6-0"}}}});
    if let Err(e) = k8s::patch(&lsvcs, "le", &image).await {
        panic!("an etcd image change is allowed: {e}");
    }
    refused_patch(
        &lsvcs,
        "le",
        "growing the managed members",
        json!({"spec": {"etcd": {"managed": {"replicas": 5}}}}),
        "etcd.managed.replicas is immutable",
    )
    .await;
    refused_patch(
        &lsvcs,
        "le",
        "resizing the members' volumes",
        json!({"spec": {"etcd": {"managed": {"storage": {"size": "9Gi"}}}}}),
        "etcd.managed.storage is immutable",
    )
    .await;
    refused_patch(
        &lsvcs,
        "le",
        "switching the etcd mode",
        json!({"spec": {"etcd": {"managed": null, "external": {"secretRef": {"name": "etcd"}}}}}),
        "etcd mode (managed vs external) is immutable",
    )
    .await;
    let le = k8s::must_get(&lsvcs, "le").await;
    let managed = le.spec.etcd.and_then(|e| e.managed).expect("le is managed");
    assert_eq!(managed.replicas, 3);
    assert_eq!(managed.storage.size, "1Gi");

    k8s::apply(&pstacks, &paymentstack("ps", stack_spec("ls"))).await;
    if let Err(e) = k8s::patch(
        &pstacks,
        "ps",
        &json!({"spec": {"payoutExecutor": {"replicas": 1}}}),
    )
    .await
    {
        panic!("a replicas change is allowed: {e}");
    }
    refused_patch(
        &pstacks,
        "ps",
        "re-pointing lockServiceRef",
        json!({"spec": {"lockServiceRef": {"name": "other"}}}),
        "lockServiceRef is immutable",
    )
    .await;
    // Nothing was written by the refused updates.
    let ps = k8s::must_get(&pstacks, "ps").await;
    assert_eq!(ps.spec.lock_service_ref.name, "ls");
    let ls = k8s::must_get(&lsvcs, "ls").await;
    assert!(ls.spec.database.is_some_and(|d| d.managed.is_some()));
}
