//! The operator against a real API server: the built `dlock-operator` binary, started with the chart's
//! own args and authenticated with a token of the chart's ServiceAccount (so it has exactly the
//! chart's RBAC), watching one namespace per test. Nothing runs pods here, so the tests stand in for
//! the kubelet (see `dlock_e2e::kubelet`): migration Jobs run their own command against a local
//! PostgreSQL 16, and workload status is written as the kubelet would once replicas run.

use dlock_e2e::k8s::{self, Child, Kind};
use dlock_e2e::kubelet::JobRun;
use dlock_e2e::specs::{etcd_lockservice, lockservice, paymentstack, secret, stack_spec};
use dlock_e2e::stage::{Options, Stage};
use dlock_operator::builders::HTTP_PORT;
use dlock_operator::builders::network_policies::Scraper;
use dlock_operator::crd::status::ActionPhase;
use dlock_operator::crd::{
    CaSecretRef, DatabaseEngine, DatabaseSpec, DlockStatus, EtcdSpec, LockService, ManagedDatabase,
    ManagedEtcd, PaymentStack, Phase, Synchronous, TlsSecretRef,
};
use dlock_testkit::History;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{EnvVar, Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;
use kube::core::object::HasStatus;
use serde_json::json;

async fn stage(test: &str, histories: &[History]) -> Option<Stage> {
    Stage::start(test, "op", histories, Options::default()).await
}

/// The status of a LockService or PaymentStack, for messages.
fn status<K: HasStatus<Status = DlockStatus>>(o: &K) -> String {
    format!("{:?}", o.status())
}

fn condition_is<K: HasStatus<Status = DlockStatus>>(o: &K, t: &str, status: &str) -> bool {
    o.status()
        .and_then(|s| s.condition(t))
        .is_some_and(|c| c.status == status)
}

fn failed_runs(st: &Stage) -> Vec<&JobRun> {
    st.kubelet.runs.iter().filter(|r| !r.succeeded()).collect()
}

/// Deployments that would run pods: present with replicas > 0.
async fn running_deployments<O: Kind>(st: &Stage, owner: &O) -> Vec<String> {
    st.owned::<Deployment, _>(owner)
        .await
        .iter()
        .filter(|d| k8s::replicas(d) > 0)
        .map(ResourceExt::name_any)
        .collect()
}

/// Every child is controlled by `owner` (the controller reference with its kind, apiVersion and
/// name) and carries the operator's labels naming its instance.
fn assert_owned_and_labelled<O: Kind>(children: &[Child], owner: &O) {
    assert!(!children.is_empty(), "{} has no children", k8s::describe(owner));
    for ch in children {
        let r = k8s::controller_ref(&ch.meta)
            .unwrap_or_else(|| panic!("{} has no controller ref", ch.describe()));
        assert_eq!(r.api_version, "dlock.dev/v1alpha1", "{}", ch.describe());
        assert_eq!(r.kind, O::kind(&()), "{}", ch.describe());
        assert_eq!(r.name, owner.name_any(), "{}", ch.describe());
        assert_eq!(Some(&r.uid), owner.meta().uid.as_ref(), "{}", ch.describe());
        let label = |k: &str| ch.meta.labels.as_ref().and_then(|l| l.get(k)).cloned();
        assert_eq!(
            label("app.kubernetes.io/managed-by").as_deref(),
            Some("dlock-operator"),
            "{} labels: {:?}",
            ch.describe(),
            ch.meta.labels
        );
        assert_eq!(
            label("app.kubernetes.io/instance"),
            Some(owner.name_any()),
            "{} labels: {:?}",
            ch.describe(),
            ch.meta.labels
        );
    }
}

/// The versioned migrations recorded in a local database (what the Job really applied).
async fn applied_versions(run: &JobRun) -> Vec<String> {
    let rows: Vec<Option<String>> = sqlx::query_scalar(
        "SELECT version FROM flyway_schema_history WHERE success AND version IS NOT NULL ORDER BY installed_rank",
    )
    .fetch_all(&run.database.admin_pool().await)
    .await
    .unwrap_or_else(|e| panic!("read flyway_schema_history: {e}"));
    rows.into_iter().flatten().collect()
}

fn workload_image(st: &Stage) -> String {
    // The chart's default: image.repository:appVersion, handed to the operator as its workload image.
    let args = st.op.argv.join(" ");
    args.split_whitespace()
        .find_map(|a| a.strip_prefix("--image="))
        .unwrap_or_else(|| panic!("the chart passes no --image= to the operator: {args}"))
        .to_owned()
}

/// Every image of a Deployment's or Job's pod template.
fn images_of_deployment(d: &Deployment) -> Vec<String> {
    d.spec
        .as_ref()
        .map(|s| k8s::images(&s.template))
        .unwrap_or_default()
}

fn images_of_job(j: &Job) -> Vec<String> {
    j.spec
        .as_ref()
        .map(|s| k8s::images(&s.template))
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lockservice_managed_migrates_before_serving_then_follows_spec_changes() {
    let Some(mut st) = stage(
        "lockservice_managed_migrates_before_serving_then_follows_spec_changes",
        &[History::Lockdb],
    )
    .await
    else {
        return;
    };
    let name = "locks";
    st.apply(&lockservice(name, DatabaseSpec::managed(), 2)).await;

    // 1. The database and the migration Job appear; lock-server does not run yet.
    let job = st
        .wait("the lockdb migration Job", false, async |st| {
            st.kubelet.workloads_ready().await; // the managed PostgreSQL StatefulSet comes up; no Job runs
            let ls = st.lsvc(name).await;
            st.owned::<Job, _>(&ls)
                .await
                .into_iter()
                .next()
                .ok_or_else(|| format!("no Job yet; status {}", status(&ls)))
        })
        .await;
    let ls = st.lsvc(name).await;
    assert_eq!(
        running_deployments(&st, &ls).await,
        Vec::<String>::new(),
        "lock-server must wait for the migration Job"
    );
    assert!(
        !condition_is(&ls, "Ready", "True"),
        "Ready before migrating: {}",
        status(&ls)
    );
    assert_eq!(
        st.owned::<StatefulSet, _>(&ls).await.len(),
        1,
        "one managed lockdb"
    );

    // 2. The Job runs for real (its own command, against a local PostgreSQL 16); then everything
    //    comes up and the LockService is Ready.
    let ls: LockService = st.wait_ready(name).await;
    let failed: Vec<_> = failed_runs(&st)
        .into_iter()
        .map(|r| (&r.job, &r.stderr))
        .collect();
    assert!(failed.is_empty(), "migration runs failed: {failed:?}");
    let run = st
        .kubelet
        .runs
        .iter()
        .find(|r| r.job == job.name_any())
        .unwrap_or_else(|| panic!("the Job {} never ran", job.name_any()))
        .clone();
    assert!(run.argv[0].ends_with("dlock-migrate"), "{:?}", run.argv);
    let versions = applied_versions(&run).await;
    assert!(versions.len() >= 2, "V1 and V2 applied to lockdb: {versions:?}");

    let deployments = running_deployments(&st, &ls).await;
    assert_eq!(
        deployments.len(),
        1,
        "one lock-server Deployment: {deployments:?}"
    );
    let lock_server: Deployment = st.must_get(&deployments[0]).await;
    assert_eq!(k8s::replicas(&lock_server), 2);
    let s = ls.status.clone().unwrap_or_default();
    assert_eq!(s.phase, Phase::Ready);
    let migration = s.migration.clone().unwrap_or_default();
    assert!(migration.succeeded, "{s:?}");
    assert_eq!(migration.history, "lockdb");
    assert!(
        s.endpoints.get("lockServer").is_some_and(|e| !e.is_empty()),
        "endpoint: {s:?}"
    );

    // 3. Every child is owned and labelled; images come from the chart's workload image.
    let children = st.children(&ls).await;
    assert_owned_and_labelled(&children, &ls);
    let kinds: Vec<&str> = children.iter().map(|c| c.kind).collect();
    for kind in ["Deployment", "StatefulSet", "Job", "Service", "Secret"] {
        assert!(kinds.contains(&kind), "no {kind} among the children: {kinds:?}");
    }
    let image = workload_image(&st);
    assert!(
        images_of_deployment(&lock_server).contains(&image),
        "lock-server image: {:?}",
        images_of_deployment(&lock_server)
    );
    assert!(
        images_of_job(&job).contains(&image),
        "migration image: {:?}",
        images_of_job(&job)
    );

    // 4. The leader holds the chart's Lease; the operator explains itself with Events.
    let lease: Lease = st.must_get(&format!("{}-dlock-operator", st.id.release)).await;
    assert!(
        lease
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.as_deref())
            .is_some_and(|h| !h.is_empty()),
        "{lease:?}"
    );
    assert!(!st.events(name).await.is_empty(), "no Event about {name}");
    let metrics = st.op.get("/metrics").await;
    assert!(
        metrics.contains("# EOF") || metrics.contains("# TYPE"),
        "metrics: {metrics}"
    );

    // 5. Spec changes: more replicas updates the Deployment. A new lease is not lock-server's
    //    setting (every acquire names its own TTL): it reaches the PaymentStacks' executors
    //    (tests/settings.rs), and nothing of this LockService carries it.
    st.patch::<LockService>(
        name,
        &json!({"spec": {"lockServer": {"replicas": 3}, "lease": {"defaultTtlMs": 4321}}}),
    )
    .await;
    let dep = deployments[0].clone();
    st.wait("lock-server scaled to 3", true, async |st| {
        let d: Deployment = st.must_get(&dep).await;
        match k8s::replicas(&d) {
            3 => Ok(()),
            r => Err(format!("replicas {r}")),
        }
    })
    .await;
    let ls = st.lsvc(name).await;
    let carrying: Vec<String> = st
        .children(&ls)
        .await
        .into_iter()
        .filter(|c| c.text.contains("4321"))
        .map(|c| c.text.chars().take(80).collect())
        .collect();
    assert!(
        carrying.is_empty(),
        "the lease reached children that read none: {carrying:?}"
    );
    st.wait_ready::<LockService>(name).await;
    st.op.assert_healthy();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paymentstack_comes_up_behind_its_lockservice_and_drops_disabled_children() {
    let Some(mut st) = stage(
        "paymentstack_comes_up_behind_its_lockservice_and_drops_disabled_children",
        &[History::Lockdb, History::Paydb],
    )
    .await
    else {
        return;
    };
    st.apply(&lockservice("locks", DatabaseSpec::managed(), 1)).await;
    let mut spec = stack_spec("locks");
    spec.payment_resource.replicas = 2;
    spec.rail_proxy.replicas = 2;
    spec.payout_executor.replicas = 2;
    spec.payout_executor.workers = 2;
    st.apply(&paymentstack("pay", spec)).await;

    st.wait_ready::<LockService>("locks").await;
    let ps: PaymentStack = st.wait_ready("pay").await;
    let failed: Vec<_> = failed_runs(&st)
        .into_iter()
        .map(|r| (&r.job, &r.stderr))
        .collect();
    assert!(failed.is_empty(), "migration runs failed: {failed:?}");
    let histories: Vec<History> = st.kubelet.runs.iter().map(|r| r.history).collect();
    assert!(
        histories.contains(&History::Lockdb) && histories.contains(&History::Paydb),
        "{histories:?}"
    );
    let paydb_run = st
        .kubelet
        .runs
        .iter()
        .find(|r| r.history == History::Paydb)
        .cloned()
        .unwrap_or_else(|| panic!("no paydb migration ran"));
    assert!(applied_versions(&paydb_run).await.len() >= 2, "paydb migrated");
    assert_eq!(
        ps.status
            .as_ref()
            .and_then(|s| s.migration.as_ref())
            .map(|m| m.history.as_str()),
        Some("paydb")
    );

    let children = st.children(&ps).await;
    assert_owned_and_labelled(&children, &ps);
    let deployments = running_deployments(&st, &ps).await;
    for part in ["payment-resource", "rail-proxy", "payout-executor", "rail-stub"] {
        assert!(
            deployments.iter().any(|d| d.contains(part)),
            "no {part} Deployment among {deployments:?}"
        );
    }
    assert_eq!(
        st.owned::<StatefulSet, _>(&ps).await.len(),
        1,
        "one managed paydb"
    );
    // Who may connect: one NetworkPolicy per HTTP workload of the stack, stored by the API server.
    let mut policies: Vec<String> = st
        .owned::<NetworkPolicy, _>(&ps)
        .await
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    policies.sort();
    assert_eq!(
        policies,
        ["pay-payment-resource", "pay-rail-proxy", "pay-rail-stub"]
    );
    let ls = st.lsvc("locks").await;
    let ls_policies = st.owned::<NetworkPolicy, _>(&ls).await;
    assert_eq!(ls_policies.len(), 1, "lock-server's policy");
    let admitted = ls_policies[0]
        .spec
        .as_ref()
        .and_then(|s| {
            s.ingress
                .as_ref()?
                .first()?
                .from
                .as_ref()?
                .first()?
                .pod_selector
                .as_ref()
        })
        .and_then(|s| s.match_labels.as_ref()?.get("dlock.dev/lock-service").cloned());
    assert_eq!(admitted.as_deref(), Some("locks"), "{:?}", ls_policies[0]);
    // Told of no Prometheus (no --prometheus-* flag), no policy admits anyone else: one rule each.
    for np in st.owned::<NetworkPolicy, _>(&ps).await.iter().chain(&ls_policies) {
        let rules = np
            .spec
            .as_ref()
            .and_then(|s| s.ingress.as_ref())
            .map_or(0, Vec::len);
        assert_eq!(rules, 1, "{}: {:?}", np.name_any(), np.spec);
    }
    // The payments stack is not owned by (or owning) the LockService's children.
    let ps_uid = ps.uid().unwrap_or_default();
    assert!(
        st.children(&ls)
            .await
            .iter()
            .all(|c| !k8s::controlled_by(&c.meta, &ps_uid))
    );

    // Lock clients: the stack's token Secret, listed in lock-server's clients file (beside the
    // tests' own client) under the owner prefix `pay/`; lock-server mounts the file and carries its
    // hash; the executors present the token with owner ids under the prefix.
    let client_secret: Secret = st.must_get("pay-lock-client").await;
    let token =
        String::from_utf8_lossy(&client_secret.data.clone().unwrap_or_default()["token"].0).into_owned();
    let (clients_secret, file) = st
        .wait("pay listed in lock-server's clients file", true, async |st| {
            let secret: Secret = st.must_get("locks-lock-clients").await;
            let file: serde_json::Value =
                serde_json::from_slice(&secret.data.clone().unwrap_or_default()["clients.json"].0)
                    .map_err(|e| format!("the clients file is not JSON: {e}"))?;
            let listed = file["clients"]
                .as_array()
                .is_some_and(|l| l.iter().any(|c| c["name"] == "paymentstack-pay"));
            if listed {
                Ok((secret, file))
            } else {
                Err(format!("{}", file["clients"].as_array().map_or(0, Vec::len)))
            }
        })
        .await;
    let pay = file["clients"]
        .as_array()
        .and_then(|l| l.iter().find(|c| c["name"] == "paymentstack-pay"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(pay["token"].as_str(), Some(token.as_str()));
    assert_eq!(pay["ownerPrefixes"], json!(["pay/"]));
    assert_eq!(pay["keyPrefixes"], json!(["account:"]));
    assert!(
        file["clients"]
            .as_array()
            .is_some_and(|l| l.iter().any(|c| c["name"] == "e2e-lock-holders"))
    );
    let lock_server: Deployment = st.must_get("locks-lock-server").await;
    let template = &lock_server.spec.as_ref().expect("a spec").template;
    let hash =
        clients_secret.metadata.annotations.clone().unwrap_or_default()["dlock.dev/lock-clients"].clone();
    assert_eq!(
        template
            .metadata
            .as_ref()
            .and_then(|m| m.annotations.as_ref())
            .and_then(|a| a.get("dlock.dev/lock-clients")),
        Some(&hash)
    );
    let (_, env) = lock_server_pod(&st, "locks").await;
    assert!(env.iter().any(|e| e.name == "DLOCK_CLIENTS_FILE"), "{env:?}");
    let executor: Deployment = st.must_get("pay-payout-executor").await;
    let c = k8s::container(&executor.spec.as_ref().expect("a spec").template, "the executor");
    let env = c.env.clone().unwrap_or_default();
    let token_ref = env
        .iter()
        .find(|e| e.name == "DLOCK_LOCK_TOKEN")
        .and_then(|e| e.value_from.as_ref()?.secret_key_ref.clone())
        .expect("the lock token from its Secret");
    assert_eq!(
        (token_ref.name.as_str(), token_ref.key.as_str()),
        ("pay-lock-client", "token")
    );
    let owner_id = env
        .iter()
        .find(|e| e.name == "PAYOUT_EXECUTOR_OWNER_ID")
        .and_then(|e| e.value.clone());
    assert_eq!(owner_id.as_deref(), Some("pay/$(POD_NAME)"));

    // Spec changes: the rail-stub is switched off (rail-proxy pointed at a real rail instead) and
    // the executor scaled; the rail-stub's Deployment, Service and NetworkPolicy go (found by label),
    // the executor follows.
    st.patch::<PaymentStack>(
        "pay",
        &json!({"spec": {
            "railStub": {"enabled": false},
            "railProxy": {"railUrl": "http://rail.example.invalid/v1"},
            "payoutExecutor": {"replicas": 3},
        }}),
    )
    .await;
    st.wait("rail-stub removed and payout-executor at 3 replicas", true, async |st| {
        let ps = st.pstack("pay").await;
        let kids = st.children(&ps).await;
        let stub: Vec<String> = kids
            .iter()
            .filter(|o| o.name().contains("rail-stub"))
            .map(Child::describe)
            .collect();
        let executor = st
            .owned::<Deployment, _>(&ps)
            .await
            .iter()
            .find(|d| d.name_any().contains("payout-executor"))
            .map(k8s::replicas);
        let rail_url_seen = kids.iter().any(|o| o.text.contains("rail.example.invalid"));
        if stub.is_empty() && executor == Some(3) && rail_url_seen {
            Ok(())
        } else {
            Err(format!("rail-stub children {stub:?}, executor replicas {executor:?}, rail URL wired: {rail_url_seen}"))
        }
    })
    .await;
    st.wait_ready::<PaymentStack>("pay").await;
    st.op.assert_healthy();
}

/// The Prometheus the chart's values name reaches the operator as `--prometheus-namespace-selector`
/// / `--prometheus-pod-selector` (here through their environment variables, the same clap
/// arguments): lock-server's NetworkPolicy, as the API server stores it, admits exactly those pods,
/// to the HTTP port that serves `/metrics`, beside its executors and the operator.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_policies_admit_the_prometheus_the_operator_is_told_of() {
    let (namespaces, pods) = (
        "kubernetes.io/metadata.name=monitoring",
        "app.kubernetes.io/name=prometheus",
    );
    let options = Options {
        env: vec![
            (
                "DLOCK_OPERATOR_PROMETHEUS_NAMESPACE_SELECTOR".into(),
                namespaces.into(),
            ),
            ("DLOCK_OPERATOR_PROMETHEUS_POD_SELECTOR".into(), pods.into()),
        ],
        ..Options::default()
    };
    let Some(mut st) = Stage::start(
        "network_policies_admit_the_prometheus_the_operator_is_told_of",
        "op",
        &[History::Lockdb],
        options,
    )
    .await
    else {
        return;
    };
    st.apply(&lockservice("locks", DatabaseSpec::managed(), 1)).await;
    let ls: LockService = st.wait_ready("locks").await;
    let policies = st.owned::<NetworkPolicy, _>(&ls).await;
    assert_eq!(policies.len(), 1, "lock-server's policy");
    let rules = policies[0]
        .spec
        .as_ref()
        .and_then(|s| s.ingress.clone())
        .unwrap_or_default();
    let scraper = Scraper::new(Some(namespaces), Some(pods))
        .expect("the selectors parse")
        .expect("a scraper is named");
    assert_eq!(rules.len(), 2, "the clients' rule and the scraper's: {rules:?}");
    assert_eq!(
        rules[1],
        scraper.rule(HTTP_PORT),
        "the scraper's pods in its namespaces, on the metrics port only"
    );
    st.op.assert_healthy();
}

/// An external lockdb given by a Secret: no database is run, the Job reads the URL from the user's
/// Secret (which the operator must not take over), and lock-server follows once it succeeded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn external_lockdb_is_migrated_from_the_secret_url() {
    let Some(mut st) = stage(
        "external_lockdb_is_migrated_from_the_secret_url",
        &[History::Lockdb],
    )
    .await
    else {
        return;
    };
    st.apply(&secret(
        "cloudsql-lockdb",
        "url",
        "postgres://dlock_owner:FAKE@10.10.0.3:5432/lockdb",
    ))
    .await;
    st.apply(&lockservice("ext", DatabaseSpec::external("cloudsql-lockdb"), 1))
        .await;
    let ls: LockService = st.wait_ready("ext").await;
    assert!(failed_runs(&st).is_empty(), "{:?}", failed_runs(&st));
    assert_eq!(st.kubelet.runs.len(), 1, "one migration run");
    assert!(applied_versions(&st.kubelet.runs[0]).await.len() >= 2);
    assert!(
        st.owned::<StatefulSet, _>(&ls).await.is_empty(),
        "no database is run for an external lockdb"
    );
    let s: Secret = st.must_get("cloudsql-lockdb").await;
    assert!(
        k8s::controller_ref(&s.metadata).is_none(),
        "the user's Secret was taken over: {:?}",
        s.metadata
    );
    assert_eq!(running_deployments(&st, &ls).await.len(), 1);
    st.op.assert_healthy();
}

/// An external lockdb that requires TLS, its CA given by `caSecretRef`: refused while the CA
/// Secret lacks its key (Degraded, nothing of the CA written); then the operator copies the CA into
/// `<owner>-lockdb-ca`, makes both URLs it hands out verify against the mounted file, and the
/// migration Job reads the owner URL from the connection Secret with the CA mounted beside it. (The
/// binaries' TLS itself, and a refused certificate's message, are tested against a TLS-only
/// PostgreSQL in dlock-migrate's and lock-server's own tests; the Job here runs against the local
/// plain server, so it is not waited for.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn external_lockdb_with_a_ca_secret_is_verified_against_it() {
    let Some(mut st) = stage("external_lockdb_with_a_ca_secret_is_verified_against_it", &[]).await else {
        return;
    };
    let name = "tlsext";
    st.apply(&secret(
        "tls-lockdb",
        "url",
        "postgres://dlock_owner:FAKE@lockdb.example.internal:5432/lockdb",
    ))
    .await;
    st.apply(&secret("tls-lockdb-ca", "wrong-key", "nothing")).await;
    let mut spec = DatabaseSpec::external("tls-lockdb");
    if let Some(external) = spec.external.as_mut() {
        external.ca_secret_ref = Some(CaSecretRef {
            name: "tls-lockdb-ca".into(),
            key: "ca.crt".into(),
        });
    }
    st.apply(&lockservice(name, spec, 1)).await;
    let ls = st
        .wait("ExternalSecretMissing for the CA", false, async |st| {
            let ls = st.lsvc(name).await;
            if ready_reason(&ls).as_deref() == Some("ExternalSecretMissing") {
                Ok(ls)
            } else {
                Err(format!("status {}", status(&ls)))
            }
        })
        .await;
    let message = ready_message(&ls);
    assert!(
        message.contains("caSecretRef") && message.contains("tls-lockdb-ca"),
        "{message}"
    );
    assert!(st.get::<Secret>(&format!("{name}-lockdb-ca")).await.is_none());
    assert!(
        st.owned::<Job, _>(&ls).await.is_empty(),
        "no migration before the CA is usable"
    );

    let pem = "-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n";
    st.apply(&secret("tls-lockdb-ca", "ca.crt", pem)).await;
    nudge(&st, name, 1).await;
    let copy: Secret = st
        .wait("the CA's copy", false, async |st| {
            st.get::<Secret>(&format!("{name}-lockdb-ca"))
                .await
                .ok_or_else(|| "not yet".to_owned())
        })
        .await;
    let data = copy.data.clone().unwrap_or_default();
    assert_eq!(data.get("ca.crt").map(|v| v.0.as_slice()), Some(pem.as_bytes()));
    let conn: Secret = st.must_get(&format!("{name}-lockdb-conn")).await;
    let conn = conn.data.unwrap_or_default();
    let tail = format!("sslmode=verify-full&sslrootcert=%2Fetc%2Fdlock%2Ftls%2F{name}-lockdb%2Fca.crt");
    for key in ["url", "admin-url"] {
        let url =
            String::from_utf8(conn.get(key).map(|v| v.0.clone()).unwrap_or_default()).unwrap_or_default();
        assert!(
            url.ends_with(&tail) && url.contains("@lockdb.example.internal:5432/lockdb"),
            "{key}: {}",
            url.split('@').nth(1).unwrap_or_default()
        );
    }
    let job = st
        .wait("the migration Job", false, async |st| {
            let ls = st.lsvc(name).await;
            st.owned::<Job, _>(&ls)
                .await
                .into_iter()
                .next()
                .ok_or_else(|| format!("no Job yet: {}", status(&ls)))
        })
        .await;
    let pod = job.spec.and_then(|s| s.template.spec).expect("a pod template");
    let c = &pod.containers[0];
    let url = c
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "DATABASE_URL")
        .expect("DATABASE_URL");
    let from = url
        .value_from
        .as_ref()
        .and_then(|v| v.secret_key_ref.as_ref())
        .expect("from a Secret");
    assert_eq!(
        (from.name.as_str(), from.key.as_str()),
        (format!("{name}-lockdb-conn").as_str(), "admin-url")
    );
    let mount = c
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.mount_path == format!("/etc/dlock/tls/{name}-lockdb"))
        .expect("the CA mounted in the Job");
    let volume = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == mount.name)
        .expect("its volume");
    assert_eq!(
        volume.secret.as_ref().and_then(|s| s.secret_name.clone()),
        Some(format!("{name}-lockdb-ca"))
    );
    st.op.assert_healthy();
}

/// Negative control for the gating: a migration that really fails (dlock-migrate refuses a database
/// whose applied V1 was edited) leaves lock-server not running and the LockService not Ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_migration_keeps_lock_server_gated() {
    let Some(mut st) = stage("failed_migration_keeps_lock_server_gated", &[]).await else {
        return;
    };
    // A lockdb whose recorded V1 checksum no longer matches the file: the real migrator refuses it.
    let db = dlock_testkit::lockdb().await;
    sqlx::query("UPDATE flyway_schema_history SET checksum = checksum # 1 WHERE version = '1'")
        .execute(&db.admin_pool().await)
        .await
        .unwrap_or_else(|e| panic!("tamper: {e}"));
    st.kubelet.use_database(History::Lockdb, db);

    st.apply(&secret(
        "lockdb-url",
        "url",
        "postgres://owner:FAKE@db.example.invalid:5432/lockdb",
    ))
    .await;
    st.apply(&lockservice("broken", DatabaseSpec::external("lockdb-url"), 2))
        .await;

    let ls = st
        .wait(
            "the LockService to report the failed migration",
            true,
            async |st| {
                let ls = st.lsvc("broken").await;
                let failed = !st.kubelet.runs.is_empty() && condition_is(&ls, "Ready", "False");
                let degraded = ls.status.as_ref().is_some_and(|s| s.phase == Phase::Degraded)
                    || condition_is(&ls, "Degraded", "True");
                let current = ls.status.as_ref().and_then(|s| s.observed_generation)
                    == ls.metadata.generation
                    && ls.metadata.generation.is_some();
                if failed && degraded && current {
                    Ok(ls)
                } else {
                    Err(format!("runs {}, status {}", st.kubelet.runs.len(), status(&ls)))
                }
            },
        )
        .await;
    let run = &st.kubelet.runs[0];
    assert!(
        !run.succeeded(),
        "the tampered database must make dlock-migrate fail"
    );
    assert!(
        run.stderr.contains("edited after it was applied"),
        "{}",
        run.stderr
    );
    assert_eq!(
        running_deployments(&st, &ls).await,
        Vec::<String>::new(),
        "lock-server must not run after a failed migration"
    );
    assert_ne!(
        ls.status
            .as_ref()
            .and_then(|s| s.migration.as_ref())
            .map(|m| m.succeeded),
        Some(true),
        "{}",
        status(&ls)
    );
    st.op.assert_healthy();
}

/// lock-server's container args and env, from its Deployment.
async fn lock_server_pod(st: &Stage, name: &str) -> (Vec<String>, Vec<EnvVar>) {
    let d: Deployment = st.must_get(&format!("{name}-lock-server")).await;
    let template = &d.spec.as_ref().expect("a Deployment has a spec").template;
    let c = k8s::container(template, "lock-server's Deployment");
    (
        c.args.clone().unwrap_or_default(),
        c.env.clone().unwrap_or_default(),
    )
}

fn arg_after<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    let i = args.iter().position(|a| a == flag)?;
    args.get(i + 1).map(String::as_str)
}

/// The operator may not watch Secrets (the chart grants get, not list/watch), so it sees a changed
/// Secret at its next periodic reconcile, or at once when the LockService itself changes: an
/// annotation stands in for the wait.
async fn nudge(st: &Stage, name: &str, n: u32) {
    k8s::annotate(
        &st.api::<LockService>(),
        name,
        "e2e.dlock.dev/nudge",
        &n.to_string(),
    )
    .await;
}

/// The Ready condition's reason, when there is one.
fn ready_reason(ls: &LockService) -> Option<String> {
    Some(ls.status.as_ref()?.condition("Ready")?.reason.clone())
}

/// The Ready condition's message, or "" without one.
fn ready_message(ls: &LockService) -> String {
    ls.status
        .as_ref()
        .and_then(|s| s.condition("Ready"))
        .map(|c| c.message.clone())
        .unwrap_or_default()
}

/// `status.etcd.ready`.
fn etcd_ready(ls: &LockService) -> Option<String> {
    Some(ls.status.as_ref()?.etcd.as_ref()?.ready.clone())
}

/// backend etcd, managed: the members, their Services, PodDisruptionBudget and NetworkPolicy; no
/// lockdb and no migration Job; lock-server only at a quorum of ready members, on --backend etcd
/// over their stable names; Ready once every member is; a restore request refused with the runbook.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_lockservice_managed_runs_members_then_lock_server_at_a_quorum() {
    let Some(mut st) = stage(
        "etcd_lockservice_managed_runs_members_then_lock_server_at_a_quorum",
        &[],
    )
    .await
    else {
        return;
    };
    let name = "elocks";
    let ns = st.ns.clone();
    let etcd = EtcdSpec {
        managed: Some(ManagedEtcd {
            replicas: 3,
            ..ManagedEtcd::default()
        }),
        ..EtcdSpec::managed()
    };
    st.apply(&etcd_lockservice(name, etcd, 2)).await;

    // 1. The members and their Services; nobody ready yet, so no lock-server.
    let ls = st
        .wait("the etcd members and WaitingForEtcd", false, async |st| {
            let ls = st.lsvc(name).await;
            let waiting = ready_reason(&ls).as_deref() == Some("WaitingForEtcd");
            let members = st.get::<StatefulSet>("elocks-etcd").await.is_some();
            if waiting && members && etcd_ready(&ls).as_deref() == Some("0/3") {
                Ok(ls)
            } else {
                Err(format!("status {}", status(&ls)))
            }
        })
        .await;
    let sts: StatefulSet = st.must_get("elocks-etcd").await;
    assert_eq!(k8s::sts_replicas(&sts), 3);
    let sts_spec = sts.spec.as_ref().expect("a StatefulSet has a spec");
    assert_eq!(sts_spec.pod_management_policy.as_deref(), Some("Parallel"));
    assert_eq!(sts_spec.service_name.as_deref(), Some("elocks-etcd"));
    let args = k8s::container(&sts_spec.template, "the etcd StatefulSet")
        .args
        .clone()
        .unwrap_or_default();
    for want in [
        format!(
            "--initial-cluster=elocks-etcd-0=http://elocks-etcd-0.elocks-etcd.{ns}.svc:2380,elocks-etcd-1=http://elocks-etcd-1.elocks-etcd.{ns}.svc:2380,elocks-etcd-2=http://elocks-etcd-2.elocks-etcd.{ns}.svc:2380"
        ),
        "--initial-cluster-state=new".to_owned(),
        "--name=$(POD_NAME)".to_owned(),
    ] {
        assert!(args.contains(&want), "{want} not in {args:?}");
    }
    let peers: Service = st.must_get("elocks-etcd").await;
    let peers_spec = peers.spec.as_ref().expect("a Service has a spec");
    assert_eq!(peers_spec.cluster_ip.as_deref(), Some("None"));
    assert_eq!(peers_spec.publish_not_ready_addresses, Some(true));
    assert!(st.get::<Service>("elocks-etcd-client").await.is_some());
    let pdb: PodDisruptionBudget = st.must_get("elocks-etcd").await;
    assert_eq!(
        pdb.spec.as_ref().and_then(|s| s.min_available.clone()),
        Some(IntOrString::Int(2))
    );
    let np: NetworkPolicy = st.must_get("elocks-etcd").await;
    let from: Vec<_> = np
        .spec
        .iter()
        .flat_map(|s| s.ingress.iter().flatten())
        .flat_map(|r| r.from.iter().flatten())
        .collect();
    assert_eq!(from.len(), 2, "lock-server and the peers only: {np:?}");
    assert!(
        from.iter().all(|f| {
            let instance = f
                .pod_selector
                .as_ref()
                .and_then(|s| s.match_labels.as_ref()?.get("app.kubernetes.io/instance"));
            instance.map(String::as_str) == Some(name) && f.namespace_selector.is_none()
        }),
        "{np:?}"
    );
    assert_eq!(running_deployments(&st, &ls).await, Vec::<String>::new());
    assert!(
        st.owned::<Job, _>(&ls).await.is_empty(),
        "no migration Job for etcd"
    );
    assert!(
        st.get::<Secret>("elocks-lockdb-credentials").await.is_none(),
        "no lockdb"
    );
    assert!(
        ls.status.as_ref().is_some_and(|s| s.migration.is_none()),
        "{}",
        status(&ls)
    );

    // 2. One member of three is no quorum: still no lock-server.
    st.kubelet.statefulset_ready("elocks-etcd", 1).await;
    let ls = st
        .wait("status 1/3", false, async |st| {
            let ls = st.lsvc(name).await;
            if etcd_ready(&ls).as_deref() == Some("1/3") {
                Ok(ls)
            } else {
                Err(format!("status {}", status(&ls)))
            }
        })
        .await;
    assert_eq!(running_deployments(&st, &ls).await, Vec::<String>::new());
    assert!(st.get::<Deployment>("elocks-lock-server").await.is_none());

    // 3. Two are: lock-server, on --backend etcd over every member's stable client URL.
    st.kubelet.statefulset_ready("elocks-etcd", 2).await;
    st.wait("the lock-server Deployment", false, async |st| {
        st.get::<Deployment>("elocks-lock-server")
            .await
            .ok_or_else(|| "no lock-server yet".to_owned())
    })
    .await;
    let (args, env) = lock_server_pod(&st, name).await;
    assert_eq!(arg_after(&args, "--backend"), Some("etcd"), "{args:?}");
    let urls: Vec<String> = (0..3)
        .map(|i| format!("http://elocks-etcd-{i}.elocks-etcd.{ns}.svc:2379"))
        .collect();
    assert_eq!(
        arg_after(&args, "--etcd-endpoints"),
        Some(urls.join(",").as_str())
    );
    assert_eq!(arg_after(&args, "--etcd-prefix"), Some("/dlock/"));
    assert!(
        env.iter().all(|e| e.name != "DATABASE_URL"),
        "no database for an etcd lock-server: {env:?}"
    );

    // 4. Everything up (the stand-in marks every member and replica ready): Ready, 3/3.
    let ls: LockService = st.wait_ready(name).await;
    let s = ls.status.clone().unwrap_or_default();
    let etcd = s.etcd.clone().unwrap_or_default();
    assert_eq!(etcd.ready, "3/3", "{s:?}");
    assert_eq!(etcd.ready_members, Some(3));
    assert_eq!(
        s.endpoints.get("etcd").map(String::as_str),
        Some(format!("http://elocks-etcd-client.{ns}.svc:2379").as_str())
    );
    assert!(s.migration.is_none(), "{s:?}");
    // The printer columns, as a user reads them (kubectl: the point is the command line's table).
    let table = st
        .cluster
        .kubectl
        .run(&["get", "lockservice", name, "-n", &ns])
        .await
        .ok()
        .stdout;
    assert!(table.contains("ETCD-READY") && table.contains("3/3"), "{table}");
    let children = st.children(&ls).await;
    assert_owned_and_labelled(&children, &ls);
    let kinds: Vec<&str> = children.iter().map(|c| c.kind).collect();
    for kind in [
        "StatefulSet",
        "Service",
        "PodDisruptionBudget",
        "NetworkPolicy",
        "Deployment",
    ] {
        assert!(kinds.contains(&kind), "no {kind} among the children: {kinds:?}");
    }
    assert!(!kinds.contains(&"Job"), "{kinds:?}");
    let events: Vec<String> = st
        .events(name)
        .await
        .iter()
        .map(|e| {
            format!(
                "{} {}",
                e.reason.as_deref().unwrap_or_default(),
                e.note.as_deref().unwrap_or_default()
            )
        })
        .collect();
    // (Events of one reason are aggregated into a series that keeps its first note, so only the
    // reasons are compared.)
    for want in ["WaitingForEtcd", "EtcdMembersReady", "Ready"] {
        assert!(
            events.iter().any(|e| e.starts_with(want)),
            "no Event {want:?}: {events:?}"
        );
    }

    // 5. A restore fast-forward is refused with the runbook: no gate, no Job, lock-server unchanged.
    //    (kubectl: the runbook's own `kubectl annotate` line.)
    st.cluster
        .kubectl
        .annotate(
            &ns,
            "lockservice",
            name,
            "dlock.dev/restore",
            r#"{"id":"ff-etcd-1"}"#,
        )
        .await
        .ok();
    let ls = st
        .wait("the refused restore", true, async |st| {
            let ls = st.lsvc(name).await;
            let failed = ls.status.as_ref().is_some_and(|s| {
                s.actions
                    .iter()
                    .any(|a| a.id == "ff-etcd-1" && a.phase == ActionPhase::Failed)
            });
            if failed {
                Ok(ls)
            } else {
                Err(format!("status {}", status(&ls)))
            }
        })
        .await;
    let s = ls.status.clone().unwrap_or_default();
    let a = &s.actions[0];
    assert!(
        a.message
            .as_deref()
            .is_some_and(|m| m.contains("dlock-fastforward etcd-bump")),
        "{a:?}"
    );
    assert!(s.gate.is_none(), "{s:?}");
    assert!(condition_is(&ls, "Ready", "True"), "{s:?}");
    let lock_server: Deployment = st.must_get("elocks-lock-server").await;
    assert_eq!(k8s::replicas(&lock_server), 2);
    assert!(st.owned::<Job, _>(&ls).await.is_empty());
    st.op.assert_healthy();
}

/// A managed lockdb on engine CloudNativePG where CloudNativePG is not installed (this API server
/// serves no `postgresql.cnpg.io`): Degraded with a reason that says so, and nothing half-applied —
/// no database of the other engine, no Job, no lock-server, no superuser Secret.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloudnativepg_engine_without_cloudnativepg_is_reported_and_nothing_is_created() {
    let Some(mut st) = stage(
        "cloudnativepg_engine_without_cloudnativepg_is_reported_and_nothing_is_created",
        &[],
    )
    .await
    else {
        return;
    };
    let name = "halocks";
    let db = DatabaseSpec {
        managed: Some(ManagedDatabase {
            engine: DatabaseEngine::CloudNativePg,
            instances: 2,
            synchronous: Some(Synchronous::default()),
            ..ManagedDatabase::default()
        }),
        external: None,
    };
    st.apply(&lockservice(name, db, 1)).await;
    let ls = st
        .wait("DatabaseEngineMissing", false, async |st: &mut Stage| {
            let ls = st.lsvc(name).await;
            let is_degraded = ls.status.as_ref().is_some_and(|s| s.phase == Phase::Degraded);
            if ready_reason(&ls).as_deref() == Some("DatabaseEngineMissing") && is_degraded {
                Ok(ls)
            } else {
                Err(format!("status {}", status(&ls)))
            }
        })
        .await;
    let message = ready_message(&ls);
    assert!(message.contains("install CloudNativePG"), "{message}");
    assert!(
        st.owned::<StatefulSet, _>(&ls).await.is_empty(),
        "no StatefulSet instead"
    );
    assert!(st.owned::<Service, _>(&ls).await.is_empty());
    assert!(st.owned::<Job, _>(&ls).await.is_empty(), "no migration Job");
    assert!(
        st.get::<Deployment>(&format!("{name}-lock-server"))
            .await
            .is_none()
    );
    assert!(
        st.get::<Secret>(&format!("{name}-lockdb-superuser"))
            .await
            .is_none(),
        "the superuser Secret is written only where a Cluster can be"
    );
    st.op.assert_healthy();
}

/// backend etcd, external: no member is run; the Secret is checked first (missing, then unusable
/// URLs: Degraded with the reason), then lock-server reads the URLs from it (secretKeyRef) and
/// restarts when it changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_lockservice_external_reads_the_endpoints_secret() {
    let Some(mut st) = stage("etcd_lockservice_external_reads_the_endpoints_secret", &[]).await else {
        return;
    };
    let name = "xlocks";
    let etcd = EtcdSpec {
        key_prefix: "/team-a/".to_owned(),
        ..EtcdSpec::external("prod-etcd")
    };
    st.apply(&etcd_lockservice(name, etcd, 2)).await;
    let degraded = |reason: &'static str| {
        async move |st: &mut Stage| {
            let ls = st.lsvc(name).await;
            let is_degraded = ls.status.as_ref().is_some_and(|s| s.phase == Phase::Degraded);
            if ready_reason(&ls).as_deref() == Some(reason) && is_degraded {
                Ok(ls)
            } else {
                Err(format!("status {}", status(&ls)))
            }
        }
    };
    st.wait("ExternalSecretMissing", false, degraded("ExternalSecretMissing"))
        .await;
    let endpoints = |urls: &str| secret("prod-etcd", "endpoints", urls);
    st.apply(&endpoints("unix://etcd-0.example:2379")).await;
    nudge(&st, name, 1).await;
    let ls = st
        .wait("EtcdEndpointsInvalid", false, degraded("EtcdEndpointsInvalid"))
        .await;
    assert!(st.get::<Deployment>("xlocks-lock-server").await.is_none());
    let message = ready_message(&ls);
    assert!(
        message.contains("entry 1") && !message.contains("etcd-0.example"),
        "{message}"
    );

    st.apply(&endpoints(
        "http://etcd-0.example:2379,http://etcd-1.example:2379",
    ))
    .await;
    nudge(&st, name, 2).await;
    let ls: LockService = st.wait_ready(name).await;
    assert_eq!(etcd_ready(&ls).as_deref(), Some("external"));
    assert!(
        st.owned::<StatefulSet, _>(&ls).await.is_empty(),
        "no member is run"
    );
    assert!(st.owned::<PodDisruptionBudget, _>(&ls).await.is_empty());
    let (args, env) = lock_server_pod(&st, name).await;
    assert_eq!(arg_after(&args, "--backend"), Some("etcd"));
    assert_eq!(arg_after(&args, "--etcd-prefix"), Some("/team-a/"));
    assert!(arg_after(&args, "--etcd-endpoints").is_none(), "{args:?}");
    let from_secret = env
        .iter()
        .find(|e| e.name == "DLOCK_ETCD_ENDPOINTS")
        .unwrap_or_else(|| panic!("no DLOCK_ETCD_ENDPOINTS: {env:?}"));
    let key_ref = from_secret
        .value_from
        .as_ref()
        .and_then(|f| f.secret_key_ref.as_ref())
        .unwrap_or_else(|| panic!("DLOCK_ETCD_ENDPOINTS is not from a Secret: {from_secret:?}"));
    assert_eq!(key_ref.name, "prod-etcd");
    assert_eq!(key_ref.key, "endpoints");
    assert!(from_secret.value.is_none());
    let s: Secret = st.must_get("prod-etcd").await;
    assert!(
        k8s::controller_ref(&s.metadata).is_none(),
        "the user's Secret was taken over"
    );

    // A changed Secret rolls lock-server (its resourceVersion is in the pod template).
    let version = async |st: &Stage| -> String {
        let d: Deployment = st.must_get("xlocks-lock-server").await;
        d.spec
            .and_then(|s| s.template.metadata)
            .and_then(|m| m.annotations)
            .and_then(|a| a.get("dlock.dev/etcd-secret-version").cloned())
            .unwrap_or_default()
    };
    let before = version(&st).await;
    assert_eq!(Some(&before), s.metadata.resource_version.as_ref());
    st.apply(&endpoints("http://etcd-2.example:2379")).await;
    nudge(&st, name, 3).await;
    st.wait("lock-server to follow the Secret", false, async |st| {
        let now = version(st).await;
        if now != before {
            Ok(now)
        } else {
            Err(format!("still {now}"))
        }
    })
    .await;

    // TLS: https:// URLs without the cluster's CA are refused with what to set; with the CA and a
    // client certificate (the user's Secrets, left theirs) lock-server reads both from files and
    // rolls when either changes.
    st.apply(&endpoints("https://etcd-0.example:2379")).await;
    nudge(&st, name, 4).await;
    let ls = st
        .wait(
            "EtcdEndpointsInvalid (no CA)",
            false,
            degraded("EtcdEndpointsInvalid"),
        )
        .await;
    assert!(
        ready_message(&ls).contains("caSecretRef"),
        "{}",
        ready_message(&ls)
    );
    const PEM: &str = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
    st.apply(&secret("etcd-ca", "ca.crt", PEM)).await;
    let mut pair = secret("etcd-client", "tls.crt", PEM);
    pair.type_ = Some("kubernetes.io/tls".into());
    pair.string_data.get_or_insert_default().insert(
        "tls.key".into(),
        "-----BEGIN PRIVATE KEY-----\nMC4C\n-----END PRIVATE KEY-----\n".into(),
    );
    st.apply(&pair).await;
    let mut tls_etcd = EtcdSpec {
        key_prefix: "/team-a/".to_owned(),
        ..EtcdSpec::external("prod-etcd")
    };
    if let Some(external) = tls_etcd.external.as_mut() {
        external.ca_secret_ref = Some(CaSecretRef {
            name: "etcd-ca".into(),
            key: "ca.crt".into(),
        });
        external.client_certificate_secret_ref = Some(TlsSecretRef {
            name: "etcd-client".into(),
        });
    }
    st.apply(&etcd_lockservice(name, tls_etcd, 2)).await;
    let env = st
        .wait(
            "lock-server with the etcd client certificate",
            false,
            async |st| {
                let (_, env) = lock_server_pod(st, name).await;
                if env.iter().any(|e| e.name == "DLOCK_ETCD_CERT_FILE") {
                    Ok(env)
                } else {
                    Err(format!(
                        "env {:?}",
                        env.iter().map(|e| &e.name).collect::<Vec<_>>()
                    ))
                }
            },
        )
        .await;
    let value = |n: &str| env.iter().find(|e| e.name == n).and_then(|e| e.value.clone());
    assert_eq!(
        value("DLOCK_ETCD_CA_FILE").as_deref(),
        Some("/etc/dlock/etcd-ca/ca.crt")
    );
    assert_eq!(
        value("DLOCK_ETCD_KEY_FILE").as_deref(),
        Some("/etc/dlock/etcd-client/tls.key")
    );
    // The three Secrets' versions are in the pod template: a renewed client certificate rolls it.
    assert_eq!(version(&st).await.split(',').count(), 3);
    let s: Secret = st.must_get("etcd-client").await;
    assert!(
        k8s::controller_ref(&s.metadata).is_none(),
        "the user's client certificate Secret was taken over"
    );
    st.op.assert_healthy();
}

/// HTTPS certificates on a real API server (the stand-in kubelet runs no server, so what is
/// checked is the operator's part): an object with `spec.tls` at its default gets its CA, bundle
/// and lock-server certificate; `dlock.dev/renew-certificates` re-issues the certificate into the
/// same Secret once per value and is echoed in `status.tls`; an invalid value renews nothing and
/// says so in a Warning Event. (The kind tier renews them while payouts flow through real pods.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_are_renewed_on_request_once_per_value() {
    use dlock_operator::crd::tls::ANNOTATION_RENEW_CERTIFICATES;
    let Some(mut st) = stage("certificates_are_renewed_on_request_once_per_value", &[]).await else {
        return;
    };
    let name = "tlocks";
    st.apply(&secret("tls-etcd", "endpoints", "http://etcd-0.example:2379"))
        .await;
    let mut ls = etcd_lockservice(name, EtcdSpec::external("tls-etcd"), 1);
    ls.spec.tls = Default::default();
    assert!(ls.spec.tls.https());
    st.apply(&ls).await;
    let cert_secret = format!("{name}-lock-server-tls");
    let certificate = async |st: &Stage| -> Option<Vec<u8>> {
        let s: Secret = st.get(&cert_secret).await?;
        s.data?.remove("tls.crt").map(|b| b.0)
    };
    let handled = |ls: &LockService| {
        ls.status
            .as_ref()
            .and_then(|s| s.tls.as_ref())
            .and_then(|t| t.last_handled_renew_request.clone())
    };
    let first = st
        .wait("lock-server's certificate", false, async |st| {
            certificate(st)
                .await
                .ok_or_else(|| "no certificate yet".to_owned())
        })
        .await;
    assert!(st.get::<Secret>("dlock-ca").await.is_some(), "no namespace CA");

    // An invalid value: a Warning Event, the certificate kept, nothing echoed.
    k8s::annotate(
        &st.api::<LockService>(),
        name,
        ANNOTATION_RENEW_CERTIFICATES,
        "not a token!",
    )
    .await;
    st.wait("RenewRequestInvalid", false, async |st| {
        let events = st.events(name).await;
        events
            .iter()
            .any(|e| e.reason.as_deref() == Some("RenewRequestInvalid"))
            .then_some(())
            .ok_or_else(|| format!("{} Events, none RenewRequestInvalid", events.len()))
    })
    .await;
    assert_eq!(certificate(&st).await.as_ref(), Some(&first));
    assert_eq!(handled(&st.lsvc(name).await), None);

    // A valid value: a new certificate in the same Secret, the value echoed.
    k8s::annotate(
        &st.api::<LockService>(),
        name,
        ANNOTATION_RENEW_CERTIFICATES,
        "drill-1",
    )
    .await;
    let second = st
        .wait("the renewed certificate", false, async |st| {
            let ls = st.lsvc(name).await;
            match (handled(&ls).as_deref(), certificate(st).await) {
                (Some("drill-1"), Some(c)) if c != first => Ok(c),
                (h, _) => Err(format!("lastHandledRenewRequest {h:?}")),
            }
        })
        .await;
    let renewed: Vec<String> = st
        .events(name)
        .await
        .iter()
        .filter(|e| e.reason.as_deref() == Some("CertificateRenewed"))
        .filter_map(|e| e.note.clone())
        .collect();
    assert!(
        renewed.iter().any(|n| n.contains("drill-1")),
        "no CertificateRenewed Event naming the request: {renewed:?}"
    );
    // (That the same value again renews nothing is the plan's unit test: here no status field
    // would show that a reconcile after a touch has happened.)
    assert_ne!(second, first);
    st.op.assert_healthy();
}

/// The namespace's CA rotated on a real API server, with the chart's RBAC, a LockService and a
/// PaymentStack sharing it. A CA 200 days from its end gets a successor, published beside it; with an
/// overlap of a day still to run, the stack's executors (clients) roll to the bundle with both and
/// every certificate stays the old CA's. With the overlap set to 0 (the operator restarted), the
/// certificates move — checked on every poll: a certificate of the successor while the executors
/// trust the old CA alone fails the test — and once both objects report theirs signed by it, the
/// successor is the CA and the bundle holds it alone. The plan's unit tests cover each ordering rule
/// with its broken variant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_namespace_ca_is_rotated_clients_first_a_year_before_it_ends() {
    use dlock_operator::builders::short_hash;
    use dlock_operator::builders::tls::{CA_BUNDLE, CA_BUNDLE_ANNOTATION, CA_SECRET};
    use dlock_operator::controller::tls::{bundle_text, certs};
    use k8s_openapi::api::core::v1::ConfigMap;
    const OVERLAP: &str = "DLOCK_OPERATOR_CA_OVERLAP_SECS";
    let test = "the_namespace_ca_is_rotated_clients_first_a_year_before_it_ends";
    let options = Options {
        env: vec![(OVERLAP.into(), "86400".into())],
        ..Options::default()
    };
    let Some(mut st) = Stage::start(test, "op", &[History::Paydb], options).await else {
        return;
    };
    let now = chrono::Utc::now().timestamp();
    let old = certs::make_ca(&st.ns, now - (certs::CA_DAYS - 200) * 86_400).expect("a CA");
    let mut ca = secret(CA_SECRET, "tls.crt", &old.cert_pem);
    ca.type_ = Some("kubernetes.io/tls".into());
    ca.string_data
        .get_or_insert_default()
        .insert("tls.key".into(), old.key_pem.clone());
    st.apply(&ca).await;

    st.apply(&secret("rot-etcd", "endpoints", "http://etcd-0.example:2379"))
        .await;
    let mut ls = etcd_lockservice("rlocks", EtcdSpec::external("rot-etcd"), 1);
    ls.spec.tls = Default::default();
    st.apply(&ls).await;
    let mut spec = stack_spec("rlocks");
    spec.tls = Default::default();
    st.apply(&paymentstack("rpay", spec)).await;
    st.wait_ready::<LockService>("rlocks").await;
    st.wait_ready::<PaymentStack>("rpay").await;

    let leaves = [
        "rlocks-lock-server-tls",
        "rpay-payment-resource-tls",
        "rpay-rail-proxy-tls",
        "rpay-rail-stub-tls",
    ];
    let text = |s: &Secret, key: &str| {
        s.data
            .as_ref()
            .and_then(|d| d.get(key))
            .map(|b| String::from_utf8_lossy(&b.0).into_owned())
    };
    let executor_bundle = async |st: &Stage| -> Option<String> {
        let d: Deployment = st.get("rpay-payout-executor").await?;
        d.spec?
            .template
            .metadata?
            .annotations?
            .remove(CA_BUNDLE_ANNOTATION)
    };
    let phase = async |st: &Stage| -> Vec<Option<String>> {
        let ls = st.lsvc("rlocks").await;
        let ps: PaymentStack = st.must_get("rpay").await;
        [ls.status.and_then(|s| s.tls), ps.status.and_then(|s| s.tls)]
            .into_iter()
            .map(|t| t.and_then(|t| t.ca_rotation).map(|r| r.phase))
            .collect()
    };

    // 1. Trusting: the successor beside the CA, the executors rolled to both, nothing moved.
    let next = st
        .wait("the successor, trusted by the executors", true, async |st| {
            let s: Secret = st.must_get(CA_SECRET).await;
            let Some(next) = text(&s, "next.crt") else {
                return Err("no successor yet".into());
            };
            let both = short_hash(
                bundle_text(
                    &old,
                    Some(&certs::Pair {
                        cert_pem: next.clone(),
                        key_pem: String::new(),
                    }),
                )
                .as_bytes(),
            );
            let phases = phase(st).await;
            match executor_bundle(st).await {
                Some(h) if h == both && phases.iter().all(|p| p.as_deref() == Some("Trusting")) => Ok(next),
                h => Err(format!("executors' bundle {h:?}, phases {phases:?}")),
            }
        })
        .await;
    assert_eq!(
        text(&st.must_get::<Secret>(CA_SECRET).await, "tls.crt").as_deref(),
        Some(old.cert_pem.as_str())
    );
    let bundle: ConfigMap = st.must_get(CA_BUNDLE).await;
    let published = bundle
        .data
        .and_then(|mut d| d.remove("ca.crt"))
        .unwrap_or_default();
    assert!(
        published.contains(&old.cert_pem) && published.contains(&next),
        "{published}"
    );
    for name in leaves {
        let cert = text(&st.must_get::<Secret>(name).await, "tls.crt").unwrap_or_default();
        assert!(
            certs::signed_by(&cert, &old.cert_pem),
            "{name} moved before the overlap passed"
        );
    }
    let ls = st.lsvc("rlocks").await;
    let waiting = ls
        .status
        .and_then(|s| s.tls)
        .and_then(|t| t.ca_rotation)
        .and_then(|r| r.waiting_for)
        .unwrap_or_default();
    assert!(waiting.contains("overlap"), "{waiting}");

    // 2. The overlap over: the certificates move, then the successor becomes the CA.
    st.set_operator_env(OVERLAP, "0");
    st.restart_operator().await;
    let old_hash = short_hash(old.cert_pem.as_bytes());
    let new_ca = st
        .wait("the successor to replace the CA", true, async |st| {
            let s: Secret = st.must_get(CA_SECRET).await;
            // The ordering, on every poll: a certificate signed by anything but the old CA exists
            // only once the executors trust more than the old CA.
            for name in leaves {
                let Some(cert) = st.get::<Secret>(name).await.and_then(|s| text(&s, "tls.crt")) else {
                    continue;
                };
                if !certs::signed_by(&cert, &old.cert_pem) {
                    let trusted = executor_bundle(st).await;
                    assert_ne!(
                        trusted.as_deref(),
                        Some(old_hash.as_str()),
                        "{name} is signed by the successor while the executors trust the old CA alone"
                    );
                }
            }
            let (crt, pending) = (text(&s, "tls.crt").unwrap_or_default(), text(&s, "next.crt"));
            if crt == old.cert_pem || pending.is_some() {
                return Err(format!("successor still pending: {}", pending.is_some()));
            }
            Ok(crt)
        })
        .await;
    assert_eq!(
        new_ca, next,
        "the CA is not the successor that was published beside the old one"
    );
    // Each certificate is the new CA's; the bundle holds it alone, and the executors roll to it.
    for name in leaves {
        let s: Secret = st.must_get(name).await;
        let cert = text(&s, "tls.crt").unwrap_or_default();
        assert!(
            certs::signed_by(&cert, &new_ca),
            "{name} is not signed by the new CA"
        );
        assert_eq!(
            text(&s, "ca.crt").as_deref(),
            Some(new_ca.as_str()),
            "{name}'s ca.crt"
        );
    }
    let bundle: ConfigMap = st.must_get(CA_BUNDLE).await;
    assert_eq!(
        bundle.data.and_then(|mut d| d.remove("ca.crt")).as_deref(),
        Some(new_ca.as_str())
    );
    let new_hash = short_hash(new_ca.as_bytes());
    st.wait(
        "the executors to trust the new CA alone, and no rotation in status",
        true,
        async |st| {
            let phases = phase(st).await;
            match executor_bundle(st).await {
                Some(h) if h == new_hash && phases.iter().all(Option::is_none) => Ok(()),
                h => Err(format!("bundle annotation {h:?}, phases {phases:?}")),
            }
        },
    )
    .await;
    let mut events = st.events("rlocks").await;
    events.extend(st.events("rpay").await);
    let reasons: Vec<String> = events.into_iter().filter_map(|e| e.reason).collect();
    for want in ["CaRotationStarted", "CaRotated"] {
        assert!(reasons.iter().any(|r| r == want), "no {want} Event: {reasons:?}");
    }
    let ps: PaymentStack = st.must_get("rpay").await;
    assert_eq!(
        ps.status.and_then(|s| s.tls).and_then(|t| t.signed_by),
        Some(new_hash)
    );
    st.op.assert_healthy();
}
