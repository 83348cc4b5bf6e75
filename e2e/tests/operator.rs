//! The operator against a real API server: the built `dlock-operator` binary, started with the chart's
//! own args and authenticated with a token of the chart's ServiceAccount (so it has exactly the
//! chart's RBAC), watching one namespace per test. Nothing runs pods here, so the tests stand in for
//! the kubelet (see `dlock_e2e::kubelet`): migration Jobs run their own command against a local
//! PostgreSQL 16, and workload status is written as the kubelet would once replicas run.

use std::time::Duration;

use serde_json::{Value, json};

use dlock_e2e::kubelet::{JobRun, Kubelet};
use dlock_e2e::operator::Operator;
use dlock_e2e::rbac::Identity;
use dlock_e2e::wait::eventually_or;
use dlock_e2e::{Cluster, crds, env, helm, objects, rbac};
use dlock_testkit::History;

const TIMEOUT: Duration = Duration::from_secs(120);

/// Kinds of children the operator may create, as `kubectl get` resource names.
const CHILD_KINDS: &[&str] = &[
    "deployments.apps",
    "statefulsets.apps",
    "jobs.batch",
    "services",
    "configmaps",
    "secrets",
    "networkpolicies.networking.k8s.io",
    "poddisruptionbudgets.policy",
];

struct Ctx {
    c: Cluster,
    ns: String,
    id: Identity,
    op: Operator,
    kubelet: Kubelet,
    _scratch: env::Scratch,
}

impl Ctx {
    async fn start(test: &str, histories: &[History]) -> Option<Ctx> {
        let c = dlock_e2e::cluster(test)?;
        let Some(helm_bin) = helm::helm(test) else {
            panic!("DLOCK_E2E=1 but helm is missing: run scripts/cluster-tools.sh");
        };
        crds::install(&c.kubectl);
        let ns = env::unique_name("op");
        let scratch = env::Scratch::new(test);
        let id = rbac::install(&c, &helm_bin, &ns, &ns, scratch.path());
        let op = Operator::start(&c, &helm_bin, &id, scratch.path());
        let kubelet = Kubelet::new(&c.kubectl, &ns, histories).await;
        Some(Ctx {
            c,
            ns,
            id,
            op,
            kubelet,
            _scratch: scratch,
        })
    }

    fn k(&self) -> &dlock_e2e::Kubectl {
        &self.c.kubectl
    }

    fn apply(&self, obj: &Value) {
        self.k().apply(&self.ns, obj).ok();
    }

    fn get(&self, resource: &str, name: &str) -> Option<Value> {
        self.k().get(Some(&self.ns), resource, name)
    }

    fn must_get(&self, resource: &str, name: &str) -> Value {
        self.get(resource, name)
            .unwrap_or_else(|| panic!("{resource}/{name} does not exist in {}", self.ns))
    }

    /// Polls `probe`, running the kubelet stand-in before each probe when `drive` is set. Panics on
    /// timeout with the operator's log.
    fn wait<T>(&mut self, what: &str, drive: bool, mut probe: impl FnMut(&Ctx) -> Result<T, String>) -> T {
        let log = self.op.log.clone();
        eventually_or(
            what,
            TIMEOUT,
            || {
                if drive {
                    self.kubelet.step();
                }
                probe(self)
            },
            || format!("operator log:\n{}", dlock_e2e::operator::tail(&log, 80)),
        )
    }

    /// Every child (of the kinds in CHILD_KINDS) in the namespace controlled by `owner`.
    fn children(&self, owner: &Value) -> Vec<Value> {
        CHILD_KINDS
            .iter()
            .flat_map(|kind| self.k().list(&self.ns, kind))
            .filter(|o| objects::controlled_by(o, objects::uid(owner)))
            .collect()
    }

    fn children_of_kind(&self, owner: &Value, resource: &str) -> Vec<Value> {
        self.k()
            .list(&self.ns, resource)
            .into_iter()
            .filter(|o| objects::controlled_by(o, objects::uid(owner)))
            .collect()
    }

    /// Waits for `Ready=True` at the current generation.
    fn wait_ready(&mut self, resource: &str, name: &str) -> Value {
        let (resource, name) = (resource.to_owned(), name.to_owned());
        self.wait(
            &format!("{resource}/{name} Ready at its current generation"),
            true,
            |cx| {
                let o = cx.must_get(&resource, &name);
                if objects::condition_is(&o, "Ready", "True") && objects::observed_current(&o) {
                    Ok(o)
                } else {
                    Err(format!("status: {}", o["status"]))
                }
            },
        )
    }

    fn failed_runs(&self) -> Vec<&JobRun> {
        self.kubelet.runs.iter().filter(|r| !r.succeeded()).collect()
    }
}

fn lockservice(name: &str, database: Value, replicas: i64) -> Value {
    json!({
        "apiVersion": "dlock.dev/v1alpha1",
        "kind": "LockService",
        "metadata": {"name": name},
        "spec": {"database": database, "lockServer": {"replicas": replicas}},
    })
}

fn paymentstack(name: &str, lsvc: &str) -> Value {
    json!({
        "apiVersion": "dlock.dev/v1alpha1",
        "kind": "PaymentStack",
        "metadata": {"name": name},
        "spec": {
            "lockServiceRef": {"name": lsvc},
            "database": {"managed": {}},
            "paymentResource": {"replicas": 2},
            "railProxy": {"replicas": 2},
            "payoutExecutor": {"replicas": 2, "workers": 2},
            "railStub": {"enabled": true},
        },
    })
}

/// Deployments that would run pods: present with replicas > 0.
fn running_deployments(ctx: &Ctx, owner: &Value) -> Vec<String> {
    ctx.children_of_kind(owner, "deployments.apps")
        .iter()
        .filter(|d| objects::replicas(d) > 0)
        .map(|d| objects::name(d).to_owned())
        .collect()
}

/// Every child is controlled by `owner` (the controller reference with its kind, apiVersion and
/// name) and carries the operator's labels naming its instance.
fn assert_owned_and_labelled(children: &[Value], owner: &Value) {
    assert!(
        !children.is_empty(),
        "{} has no children",
        objects::describe(owner)
    );
    for ch in children {
        let r = objects::controller_ref(ch)
            .unwrap_or_else(|| panic!("{} has no controller ref", objects::describe(ch)));
        assert_eq!(r["apiVersion"], "dlock.dev/v1alpha1", "{}", objects::describe(ch));
        assert_eq!(r["kind"], owner["kind"], "{}", objects::describe(ch));
        assert_eq!(r["name"], owner["metadata"]["name"], "{}", objects::describe(ch));
        assert_eq!(r["uid"], owner["metadata"]["uid"], "{}", objects::describe(ch));
        assert_eq!(
            objects::label(ch, "app.kubernetes.io/managed-by"),
            Some("dlock-operator"),
            "{} labels: {}",
            objects::describe(ch),
            ch["metadata"]["labels"]
        );
        assert_eq!(
            objects::label(ch, "app.kubernetes.io/instance"),
            Some(objects::name(owner)),
            "{} labels: {}",
            objects::describe(ch),
            ch["metadata"]["labels"]
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

fn workload_image(ctx: &Ctx) -> String {
    // The chart's default: image.repository:appVersion, handed to the operator as its workload image.
    let args = ctx.op.argv.join(" ");
    args.split_whitespace()
        .find_map(|a| a.strip_prefix("--image="))
        .unwrap_or_else(|| panic!("the chart passes no --image= to the operator: {args}"))
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lockservice_managed_migrates_before_serving_then_follows_spec_changes() {
    let Some(mut ctx) = Ctx::start(
        "lockservice_managed_migrates_before_serving_then_follows_spec_changes",
        &[History::Lockdb],
    )
    .await
    else {
        return;
    };
    let name = "locks";
    ctx.apply(&lockservice(name, json!({"managed": {}}), 2));

    // 1. The database and the migration Job appear; lock-server does not run yet.
    let job = ctx.wait("the lockdb migration Job", false, |cx| {
        cx.kubelet.workloads_ready(); // the managed PostgreSQL StatefulSet comes up; no Job runs
        let ls = cx.must_get("lockservice", name);
        cx.children_of_kind(&ls, "jobs.batch")
            .into_iter()
            .next()
            .ok_or_else(|| format!("no Job yet; status {}", ls["status"]))
    });
    let ls = ctx.must_get("lockservice", name);
    assert_eq!(
        running_deployments(&ctx, &ls),
        Vec::<String>::new(),
        "lock-server must wait for the migration Job"
    );
    assert!(
        !objects::condition_is(&ls, "Ready", "True"),
        "Ready before migrating: {}",
        ls["status"]
    );
    assert_eq!(
        ctx.children_of_kind(&ls, "statefulsets.apps").len(),
        1,
        "one managed lockdb"
    );

    // 2. The Job runs for real (its own command, against a local PostgreSQL 16); then everything
    //    comes up and the LockService is Ready.
    let ls = ctx.wait_ready("lockservice", name);
    let failed: Vec<_> = ctx
        .failed_runs()
        .into_iter()
        .map(|r| (&r.job, &r.stderr))
        .collect();
    assert!(failed.is_empty(), "migration runs failed: {failed:?}");
    let run = ctx
        .kubelet
        .runs
        .iter()
        .find(|r| r.job == objects::name(&job))
        .unwrap_or_else(|| panic!("the Job {} never ran", objects::name(&job)))
        .clone();
    assert!(run.argv[0].ends_with("dlock-migrate"), "{:?}", run.argv);
    let versions = applied_versions(&run).await;
    assert!(versions.len() >= 2, "V1 and V2 applied to lockdb: {versions:?}");

    let deployments = running_deployments(&ctx, &ls);
    assert_eq!(
        deployments.len(),
        1,
        "one lock-server Deployment: {deployments:?}"
    );
    let lock_server = ctx.must_get("deployment", &deployments[0]);
    assert_eq!(objects::replicas(&lock_server), 2);
    assert_eq!(ls["status"]["phase"], "Ready");
    assert_eq!(ls["status"]["migration"]["succeeded"], true, "{}", ls["status"]);
    assert_eq!(ls["status"]["migration"]["history"], "lockdb");
    assert!(
        ls["status"]["endpoints"]["lockServer"]
            .as_str()
            .is_some_and(|e| !e.is_empty()),
        "endpoint: {}",
        ls["status"]
    );

    // 3. Every child is owned and labelled; images come from the chart's workload image.
    let children = ctx.children(&ls);
    assert_owned_and_labelled(&children, &ls);
    let kinds: Vec<&str> = children.iter().map(objects::kind).collect();
    for kind in ["Deployment", "StatefulSet", "Job", "Service", "Secret"] {
        assert!(kinds.contains(&kind), "no {kind} among the children: {kinds:?}");
    }
    let image = workload_image(&ctx);
    assert!(
        objects::images(&lock_server).contains(&image),
        "lock-server image: {:?}",
        objects::images(&lock_server)
    );
    assert!(
        objects::images(&job).contains(&image),
        "migration image: {:?}",
        objects::images(&job)
    );

    // 4. The leader holds the chart's Lease; the operator explains itself with Events.
    let lease = ctx.must_get("lease", &format!("{}-dlock-operator", ctx.id.release));
    assert!(
        lease["spec"]["holderIdentity"]
            .as_str()
            .is_some_and(|h| !h.is_empty()),
        "{lease}"
    );
    let events = ctx.k().list(&ctx.ns, "events");
    assert!(
        events
            .iter()
            .any(|e| e["involvedObject"]["name"] == name || e["regarding"]["name"] == name),
        "no Event about {name}"
    );
    let metrics = ctx.op.get("/metrics");
    assert!(
        metrics.contains("# EOF") || metrics.contains("# TYPE"),
        "metrics: {metrics}"
    );

    // 5. Spec changes: more replicas updates the Deployment; a new lease default reaches lock-server.
    ctx.k()
        .patch(
            &ctx.ns,
            "lockservice",
            name,
            &json!({"spec": {"lockServer": {"replicas": 3}, "lease": {"defaultTtlMs": 4321}}}),
        )
        .ok();
    let dep = deployments[0].clone();
    ctx.wait("lock-server scaled to 3 with the new lease TTL", true, |cx| {
        let d = cx.must_get("deployment", &dep);
        let ls = cx.must_get("lockservice", name);
        let config: String = cx.children(&ls).iter().map(Value::to_string).collect();
        match (objects::replicas(&d), config.contains("4321")) {
            (3, true) => Ok(()),
            (r, has) => Err(format!("replicas {r}, lease TTL visible in children: {has}")),
        }
    });
    ctx.wait_ready("lockservice", name);
    ctx.op.assert_healthy();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paymentstack_comes_up_behind_its_lockservice_and_drops_disabled_children() {
    let Some(mut ctx) = Ctx::start(
        "paymentstack_comes_up_behind_its_lockservice_and_drops_disabled_children",
        &[History::Lockdb, History::Paydb],
    )
    .await
    else {
        return;
    };
    ctx.apply(&lockservice("locks", json!({"managed": {}}), 1));
    ctx.apply(&paymentstack("pay", "locks"));

    ctx.wait_ready("lockservice", "locks");
    let ps = ctx.wait_ready("paymentstack", "pay");
    let failed: Vec<_> = ctx
        .failed_runs()
        .into_iter()
        .map(|r| (&r.job, &r.stderr))
        .collect();
    assert!(failed.is_empty(), "migration runs failed: {failed:?}");
    let histories: Vec<History> = ctx.kubelet.runs.iter().map(|r| r.history).collect();
    assert!(
        histories.contains(&History::Lockdb) && histories.contains(&History::Paydb),
        "{histories:?}"
    );
    let paydb_run = ctx
        .kubelet
        .runs
        .iter()
        .find(|r| r.history == History::Paydb)
        .cloned()
        .unwrap_or_else(|| panic!("no paydb migration ran"));
    assert!(applied_versions(&paydb_run).await.len() >= 2, "paydb migrated");
    assert_eq!(ps["status"]["migration"]["history"], "paydb");

    let children = ctx.children(&ps);
    assert_owned_and_labelled(&children, &ps);
    let deployments = running_deployments(&ctx, &ps);
    for part in ["payment-resource", "rail-proxy", "payout-executor", "rail-stub"] {
        assert!(
            deployments.iter().any(|d| d.contains(part)),
            "no {part} Deployment among {deployments:?}"
        );
    }
    assert_eq!(
        ctx.children_of_kind(&ps, "statefulsets.apps").len(),
        1,
        "one managed paydb"
    );
    // Who may connect: one NetworkPolicy per HTTP workload of the stack, stored by the API server.
    let mut policies: Vec<String> = ctx
        .children_of_kind(&ps, "networkpolicies.networking.k8s.io")
        .iter()
        .map(|p| objects::name(p).to_owned())
        .collect();
    policies.sort();
    assert_eq!(
        policies,
        ["pay-payment-resource", "pay-rail-proxy", "pay-rail-stub"]
    );
    let ls_policies = ctx.children_of_kind(
        &ctx.must_get("lockservice", "locks"),
        "networkpolicies.networking.k8s.io",
    );
    assert_eq!(ls_policies.len(), 1, "lock-server's policy");
    assert_eq!(
        ls_policies[0]["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"]["dlock.dev/lock-service"],
        "locks",
        "{}",
        ls_policies[0]
    );
    // The payments stack is not owned by (or owning) the LockService's children.
    let ls = ctx.must_get("lockservice", "locks");
    assert!(
        ctx.children(&ls)
            .iter()
            .all(|c| !objects::controlled_by(c, objects::uid(&ps)))
    );

    // Spec changes: the rail-stub is switched off (rail-proxy pointed at a real rail instead) and
    // the executor scaled; the rail-stub's Deployment, Service and NetworkPolicy go (found by label),
    // the executor follows.
    ctx.k()
        .patch(
            &ctx.ns,
            "paymentstack",
            "pay",
            &json!({"spec": {
                "railStub": {"enabled": false},
                "railProxy": {"railUrl": "http://rail.example.invalid/v1"},
                "payoutExecutor": {"replicas": 3},
            }}),
        )
        .ok();
    ctx.wait("rail-stub removed and payout-executor at 3 replicas", true, |cx| {
        let ps = cx.must_get("paymentstack", "pay");
        let kids = cx.children(&ps);
        let stub: Vec<String> = kids
            .iter()
            .filter(|o| objects::name(o).contains("rail-stub"))
            .map(objects::describe)
            .collect();
        let executor = kids
            .iter()
            .find(|o| objects::kind(o) == "Deployment" && objects::name(o).contains("payout-executor"))
            .map(objects::replicas);
        let rail_url_seen = kids.iter().any(|o| o.to_string().contains("rail.example.invalid"));
        if stub.is_empty() && executor == Some(3) && rail_url_seen {
            Ok(())
        } else {
            Err(format!("rail-stub children {stub:?}, executor replicas {executor:?}, rail URL wired: {rail_url_seen}"))
        }
    });
    ctx.wait_ready("paymentstack", "pay");
    ctx.op.assert_healthy();
}

/// An external lockdb given by a Secret: no database is run, the Job reads the URL from the user's
/// Secret (which the operator must not take over), and lock-server follows once it succeeded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn external_lockdb_is_migrated_from_the_secret_url() {
    let Some(mut ctx) = Ctx::start(
        "external_lockdb_is_migrated_from_the_secret_url",
        &[History::Lockdb],
    )
    .await
    else {
        return;
    };
    let secret = json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "cloudsql-lockdb"},
        "stringData": {"url": "postgres://dlock_owner:FAKE@10.10.0.3:5432/lockdb"},
    });
    ctx.apply(&secret);
    ctx.apply(&lockservice(
        "ext",
        json!({"external": {"secretRef": {"name": "cloudsql-lockdb", "key": "url"}}}),
        1,
    ));
    let ls = ctx.wait_ready("lockservice", "ext");
    assert!(ctx.failed_runs().is_empty(), "{:?}", ctx.failed_runs());
    assert_eq!(ctx.kubelet.runs.len(), 1, "one migration run");
    assert!(applied_versions(&ctx.kubelet.runs[0]).await.len() >= 2);
    assert!(
        ctx.children_of_kind(&ls, "statefulsets.apps").is_empty(),
        "no database is run for an external lockdb"
    );
    let s = ctx.must_get("secret", "cloudsql-lockdb");
    assert!(
        objects::controller_ref(&s).is_none(),
        "the user's Secret was taken over: {}",
        s["metadata"]
    );
    assert_eq!(running_deployments(&ctx, &ls).len(), 1);
    ctx.op.assert_healthy();
}

/// Negative control for the gating: a migration that really fails (dlock-migrate refuses a database
/// whose applied V1 was edited) leaves lock-server not running and the LockService not Ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_migration_keeps_lock_server_gated() {
    let Some(mut ctx) = Ctx::start("failed_migration_keeps_lock_server_gated", &[]).await else {
        return;
    };
    // A lockdb whose recorded V1 checksum no longer matches the file: the real migrator refuses it.
    let db = dlock_testkit::lockdb().await;
    sqlx::query("UPDATE flyway_schema_history SET checksum = checksum # 1 WHERE version = '1'")
        .execute(&db.admin_pool().await)
        .await
        .unwrap_or_else(|e| panic!("tamper: {e}"));
    ctx.kubelet.use_database(History::Lockdb, db);

    ctx.apply(&json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "lockdb-url"},
        "stringData": {"url": "postgres://owner:FAKE@db.example.invalid:5432/lockdb"},
    }));
    ctx.apply(&lockservice(
        "broken",
        json!({"external": {"secretRef": {"name": "lockdb-url"}}}),
        2,
    ));

    let ls = ctx.wait("the LockService to report the failed migration", true, |cx| {
        let ls = cx.must_get("lockservice", "broken");
        let failed = !cx.kubelet.runs.is_empty() && objects::condition_is(&ls, "Ready", "False");
        let degraded = ls["status"]["phase"] == "Degraded" || objects::condition_is(&ls, "Degraded", "True");
        if failed && degraded && objects::observed_current(&ls) {
            Ok(ls)
        } else {
            Err(format!("runs {}, status {}", cx.kubelet.runs.len(), ls["status"]))
        }
    });
    let run = &ctx.kubelet.runs[0];
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
        running_deployments(&ctx, &ls),
        Vec::<String>::new(),
        "lock-server must not run after a failed migration"
    );
    assert_ne!(ls["status"]["migration"]["succeeded"], true, "{}", ls["status"]);
    ctx.op.assert_healthy();
}

fn etcd_lockservice(name: &str, etcd: Value, replicas: i64) -> Value {
    json!({
        "apiVersion": "dlock.dev/v1alpha1",
        "kind": "LockService",
        "metadata": {"name": name},
        "spec": {"backend": "etcd", "etcd": etcd, "lockServer": {"replicas": replicas}},
    })
}

/// lock-server's container args and env, from its Deployment.
fn lock_server_pod(ctx: &Ctx, name: &str) -> (Vec<String>, Vec<Value>) {
    let d = ctx.must_get("deployment", &format!("{name}-lock-server"));
    let c = objects::container(&d);
    let args = c["args"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| a.as_str().map(str::to_owned))
        .collect();
    (args, c["env"].as_array().cloned().unwrap_or_default())
}

fn arg_after<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    let i = args.iter().position(|a| a == flag)?;
    args.get(i + 1).map(String::as_str)
}

/// The operator may not watch Secrets (the chart grants get, not list/watch), so it sees a changed
/// Secret at its next periodic reconcile, or at once when the LockService itself changes: an
/// annotation stands in for the wait.
fn nudge(ctx: &Ctx, name: &str, n: u32) {
    ctx.k()
        .run(&[
            "annotate",
            "--overwrite",
            "lockservice",
            name,
            "-n",
            &ctx.ns,
            &format!("e2e.dlock.dev/nudge={n}"),
        ])
        .ok();
}

/// Writes a StatefulSet's status as its controller would with `ready` of its pods ready.
fn members_ready(ctx: &Ctx, sts: &str, ready: i64) {
    let s = ctx.must_get("statefulset", sts);
    ctx.k()
        .patch_status(
            &ctx.ns,
            "statefulset",
            sts,
            &json!({"status": {"observedGeneration": s["metadata"]["generation"],
                "replicas": objects::replicas(&s), "readyReplicas": ready, "currentReplicas": objects::replicas(&s),
                "updatedReplicas": objects::replicas(&s), "availableReplicas": ready}}),
        )
        .ok();
}

/// backend etcd, managed: the members, their Services, PodDisruptionBudget and NetworkPolicy; no
/// lockdb and no migration Job; lock-server only at a quorum of ready members, on --backend etcd
/// over their stable names; Ready once every member is; a restore request refused with the runbook.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_lockservice_managed_runs_members_then_lock_server_at_a_quorum() {
    let Some(mut ctx) = Ctx::start(
        "etcd_lockservice_managed_runs_members_then_lock_server_at_a_quorum",
        &[],
    )
    .await
    else {
        return;
    };
    let name = "elocks";
    let ns = ctx.ns.clone();
    ctx.apply(&etcd_lockservice(name, json!({"managed": {"replicas": 3}}), 2));

    // 1. The members and their Services; nobody ready yet, so no lock-server.
    let ls = ctx.wait("the etcd members and WaitingForEtcd", false, |cx| {
        let ls = cx.must_get("lockservice", name);
        let waiting = objects::condition(&ls, "Ready").is_some_and(|c| c["reason"] == "WaitingForEtcd");
        if waiting && cx.get("statefulset", "elocks-etcd").is_some() && ls["status"]["etcd"]["ready"] == "0/3"
        {
            Ok(ls)
        } else {
            Err(format!("status {}", ls["status"]))
        }
    });
    let sts = ctx.must_get("statefulset", "elocks-etcd");
    assert_eq!(objects::replicas(&sts), 3);
    assert_eq!(sts["spec"]["podManagementPolicy"], "Parallel");
    assert_eq!(sts["spec"]["serviceName"], "elocks-etcd");
    let args = objects::container(&sts)["args"].to_string();
    for want in [
        format!(
            "--initial-cluster=elocks-etcd-0=http://elocks-etcd-0.elocks-etcd.{ns}.svc:2380,elocks-etcd-1=http://elocks-etcd-1.elocks-etcd.{ns}.svc:2380,elocks-etcd-2=http://elocks-etcd-2.elocks-etcd.{ns}.svc:2380"
        ),
        "--initial-cluster-state=new".to_owned(),
        "--name=$(POD_NAME)".to_owned(),
    ] {
        assert!(args.contains(&want), "{want} not in {args}");
    }
    let peers = ctx.must_get("service", "elocks-etcd");
    assert_eq!(peers["spec"]["clusterIP"], "None");
    assert_eq!(peers["spec"]["publishNotReadyAddresses"], true);
    assert!(ctx.get("service", "elocks-etcd-client").is_some());
    let pdb = ctx.must_get("poddisruptionbudget", "elocks-etcd");
    assert_eq!(pdb["spec"]["minAvailable"], 2);
    let np = ctx.must_get("networkpolicy", "elocks-etcd");
    let from: Vec<&Value> = np["spec"]["ingress"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|r| r["from"].as_array().into_iter().flatten())
        .collect();
    assert_eq!(from.len(), 2, "lock-server and the peers only: {np}");
    assert!(
        from.iter().all(
            |f| f["podSelector"]["matchLabels"]["app.kubernetes.io/instance"] == name
                && f.get("namespaceSelector").is_none()
        ),
        "{np}"
    );
    assert_eq!(running_deployments(&ctx, &ls), Vec::<String>::new());
    assert!(
        ctx.children_of_kind(&ls, "jobs.batch").is_empty(),
        "no migration Job for etcd"
    );
    assert!(
        ctx.get("secret", "elocks-lockdb-credentials").is_none(),
        "no lockdb"
    );
    assert!(ls["status"]["migration"].is_null(), "{}", ls["status"]);

    // 2. One member of three is no quorum: still no lock-server.
    members_ready(&ctx, "elocks-etcd", 1);
    let ls = ctx.wait("status 1/3", false, |cx| {
        let ls = cx.must_get("lockservice", name);
        if ls["status"]["etcd"]["ready"] == "1/3" {
            Ok(ls)
        } else {
            Err(format!("status {}", ls["status"]))
        }
    });
    assert_eq!(running_deployments(&ctx, &ls), Vec::<String>::new());
    assert!(ctx.get("deployment", "elocks-lock-server").is_none());

    // 3. Two are: lock-server, on --backend etcd over every member's stable client URL.
    members_ready(&ctx, "elocks-etcd", 2);
    ctx.wait("the lock-server Deployment", false, |cx| {
        cx.get("deployment", "elocks-lock-server")
            .ok_or_else(|| "no lock-server yet".to_owned())
    });
    let (args, env) = lock_server_pod(&ctx, name);
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
        env.iter().all(|e| e["name"] != "DATABASE_URL"),
        "no database for an etcd lock-server: {env:?}"
    );

    // 4. Everything up (the stand-in marks every member and replica ready): Ready, 3/3.
    let ls = ctx.wait_ready("lockservice", name);
    assert_eq!(ls["status"]["etcd"]["ready"], "3/3", "{}", ls["status"]);
    assert_eq!(ls["status"]["etcd"]["readyMembers"], 3);
    assert_eq!(
        ls["status"]["endpoints"]["etcd"],
        format!("http://elocks-etcd-client.{ns}.svc:2379")
    );
    assert!(ls["status"]["migration"].is_null(), "{}", ls["status"]);
    let table = ctx.k().run(&["get", "lockservice", name, "-n", &ns]).ok().stdout;
    assert!(table.contains("ETCD-READY") && table.contains("3/3"), "{table}");
    let children = ctx.children(&ls);
    assert_owned_and_labelled(&children, &ls);
    let kinds: Vec<&str> = children.iter().map(objects::kind).collect();
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
    let events: Vec<String> = ctx
        .k()
        .list(&ns, "events")
        .iter()
        .filter(|e| e["involvedObject"]["name"] == name || e["regarding"]["name"] == name)
        .map(|e| {
            format!(
                "{} {}",
                e["reason"].as_str().unwrap_or_default(),
                e["note"].as_str().or(e["message"].as_str()).unwrap_or_default()
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
    ctx.k()
        .run(&[
            "annotate",
            "lockservice",
            name,
            "-n",
            &ns,
            r#"dlock.dev/restore={"id":"ff-etcd-1"}"#,
        ])
        .ok();
    let ls = ctx.wait("the refused restore", true, |cx| {
        let ls = cx.must_get("lockservice", name);
        let a = ls["status"]["actions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|a| a["id"] == "ff-etcd-1")
            .cloned();
        a.filter(|a| a["phase"] == "Failed")
            .map(|_| ls.clone())
            .ok_or_else(|| format!("status {}", ls["status"]))
    });
    let a = &ls["status"]["actions"][0];
    assert!(
        a["message"]
            .as_str()
            .is_some_and(|m| m.contains("dlock-fastforward etcd-bump")),
        "{a}"
    );
    assert!(ls["status"]["gate"].is_null(), "{}", ls["status"]);
    assert!(objects::condition_is(&ls, "Ready", "True"), "{}", ls["status"]);
    assert_eq!(
        objects::replicas(&ctx.must_get("deployment", "elocks-lock-server")),
        2
    );
    assert!(ctx.children_of_kind(&ls, "jobs.batch").is_empty());
    ctx.op.assert_healthy();
}

/// backend etcd, external: no member is run; the Secret is checked first (missing, then unusable
/// URLs: Degraded with the reason), then lock-server reads the URLs from it (secretKeyRef) and
/// restarts when it changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_lockservice_external_reads_the_endpoints_secret() {
    let Some(mut ctx) = Ctx::start("etcd_lockservice_external_reads_the_endpoints_secret", &[]).await else {
        return;
    };
    let name = "xlocks";
    ctx.apply(&etcd_lockservice(
        name,
        json!({"external": {"secretRef": {"name": "prod-etcd"}}, "keyPrefix": "/team-a/"}),
        2,
    ));
    let degraded = |reason: &'static str| {
        move |cx: &Ctx| {
            let ls = cx.must_get("lockservice", name);
            match objects::condition(&ls, "Ready") {
                Some(c) if c["reason"] == reason && ls["status"]["phase"] == "Degraded" => Ok(ls),
                _ => Err(format!("status {}", ls["status"])),
            }
        }
    };
    ctx.wait("ExternalSecretMissing", false, degraded("ExternalSecretMissing"));
    let secret = |endpoints: &str| {
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "prod-etcd"},
               "stringData": {"endpoints": endpoints}})
    };
    ctx.apply(&secret("https://etcd-0.example:2379"));
    nudge(&ctx, name, 1);
    let ls = ctx.wait("EtcdEndpointsInvalid", false, degraded("EtcdEndpointsInvalid"));
    assert!(ctx.get("deployment", "xlocks-lock-server").is_none());
    let message = objects::condition(&ls, "Ready").unwrap()["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        message.contains("entry 1") && !message.contains("etcd-0.example"),
        "{message}"
    );

    ctx.apply(&secret("http://etcd-0.example:2379,http://etcd-1.example:2379"));
    nudge(&ctx, name, 2);
    let ls = ctx.wait_ready("lockservice", name);
    assert_eq!(ls["status"]["etcd"]["ready"], "external");
    assert!(
        ctx.children_of_kind(&ls, "statefulsets.apps").is_empty(),
        "no member is run"
    );
    assert!(
        ctx.children_of_kind(&ls, "poddisruptionbudgets.policy")
            .is_empty()
    );
    let (args, env) = lock_server_pod(&ctx, name);
    assert_eq!(arg_after(&args, "--backend"), Some("etcd"));
    assert_eq!(arg_after(&args, "--etcd-prefix"), Some("/team-a/"));
    assert!(arg_after(&args, "--etcd-endpoints").is_none(), "{args:?}");
    let from_secret = env
        .iter()
        .find(|e| e["name"] == "DLOCK_ETCD_ENDPOINTS")
        .unwrap_or_else(|| panic!("no DLOCK_ETCD_ENDPOINTS: {env:?}"));
    assert_eq!(from_secret["valueFrom"]["secretKeyRef"]["name"], "prod-etcd");
    assert_eq!(from_secret["valueFrom"]["secretKeyRef"]["key"], "endpoints");
    assert!(from_secret.get("value").is_none());
    let s = ctx.must_get("secret", "prod-etcd");
    assert!(
        objects::controller_ref(&s).is_none(),
        "the user's Secret was taken over"
    );

    // A changed Secret rolls lock-server (its resourceVersion is in the pod template).
    let version = |cx: &Ctx| {
        cx.must_get("deployment", "xlocks-lock-server")["spec"]["template"]["metadata"]["annotations"]
            ["dlock.dev/etcd-secret-version"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    let before = version(&ctx);
    assert_eq!(
        before,
        s["metadata"]["resourceVersion"].as_str().unwrap_or_default()
    );
    ctx.apply(&secret("http://etcd-2.example:2379"));
    nudge(&ctx, name, 3);
    ctx.wait("lock-server to follow the Secret", false, |cx| {
        let now = version(cx);
        if now != before {
            Ok(now)
        } else {
            Err(format!("still {now}"))
        }
    });
    ctx.op.assert_healthy();
}
