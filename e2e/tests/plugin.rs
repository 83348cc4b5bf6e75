//! `kubectl dlock` on the cluster tier: the actions requested and awaited by the plugin — run as
//! kubectl runs a plugin, with a PATH that holds no kubectl (the plugin needs only itself and the
//! kubeconfig; kubectl's own plugin mechanism and its completion convention are checked once, and
//! `locks`' own port-forward as far as the API server) — executed by the operator binary (the
//! chart's args and RBAC) against a real lock-server process over a real lockdb, with the stand-in
//! kubelet running the restore's Jobs: exit 0 when the action succeeded, 1 when it failed (also
//! across an operator restart), 2 for a request that cannot be made, 3 when --wait runs out;
//! `status`; `locks` (lock-server's admin list, with the token from its Secret), also as JSON; and,
//! from the running operator's `/metrics`, every operator metric the chart's alerts and dashboard
//! read.
//!
//! As in tests/actions.rs, lock-server runs as a local process standing in for its Deployment's
//! pod, reached by the operator through `HTTP_PROXY` (`dlock_e2e::proxy`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use dlock_e2e::kubectl::{Out, Running, spawn_plugin};
use dlock_e2e::lockdb::{holder, revocations, sequence};
use dlock_e2e::specs::{lockservice, paymentstack, stack_spec};
use dlock_e2e::stage::{Options, Stage};
use dlock_e2e::{Kubectl, env, helm, monitoring};
use dlock_operator::crd::actions::ANNOTATION_REVOKE;
use dlock_operator::crd::status::ActionPhase;
use dlock_operator::crd::{ActionStatus, DatabaseSpec, LockService, PaymentStack};
use dlock_testkit::{History, TestDb};

const LS: &str = "locks";

/// A stage whose operator reaches lock-server through the proxy, the stand-in kubelet running
/// lock-server's pod as a local process, and a LockService Ready on a managed lockdb.
async fn stage(test: &str) -> Option<Stage> {
    stage_with(test, &[History::Lockdb]).await
}

/// As [`stage`], with a local database for each of `histories`.
async fn stage_with(test: &str, histories: &[History]) -> Option<Stage> {
    let options = Options {
        proxy: true,
        ..Options::default()
    };
    let mut st = Stage::start(test, "plugin", histories, options).await?;
    st.serve_lock_server(LS);
    st.apply(&lockservice(LS, DatabaseSpec::managed(), 1)).await;
    st.wait_ready::<LockService>(LS).await;
    Some(st)
}

/// A directory for PATH that holds no kubectl (nor anything else).
fn no_kubectl_path() -> PathBuf {
    let dir = std::env::temp_dir().join("dlock-e2e-path-without-kubectl");
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
    assert!(
        !dir.join("kubectl").exists(),
        "{} must not hold kubectl",
        dir.display()
    );
    dir
}

/// `kubectl-dlock -n <ns> ARGS…` started as kubectl starts a plugin, with no kubectl on PATH.
fn spawn(st: &Stage, args: &[&str]) -> Running {
    let plugin = env::workspace_bin("kubectl-dlock");
    let mut argv = vec!["-n", st.ns.as_str()];
    argv.extend_from_slice(args);
    spawn_plugin(&st.cluster.kubeconfig, &plugin, &no_kubectl_path(), &argv)
}

/// A directory holding the plugin and its completion script, as a user installs them on PATH.
fn installed_plugin(scratch: &Path) -> PathBuf {
    let dir = scratch.join("plugins");
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../operator/kubectl-dlock/kubectl_complete-dlock");
    for (from, name) in [
        (env::workspace_bin("kubectl-dlock"), "kubectl-dlock"),
        (script, "kubectl_complete-dlock"),
    ] {
        std::os::unix::fs::symlink(&from, dir.join(name))
            .unwrap_or_else(|e| panic!("link {}: {e}", from.display()));
    }
    dir
}

/// Waits for a started `kubectl dlock`, standing in for the kubelet meanwhile when `drive` (the
/// restore's Jobs, lock-server's process going and coming back).
async fn finish(st: &mut Stage, mut child: Running, what: &str, drive: bool) -> Out {
    st.wait(what, drive, async |_| {
        if child.exited() {
            Ok(())
        } else {
            Err("still running".to_owned())
        }
    })
    .await;
    child.output().await
}

/// `kubectl dlock -n <ns> ARGS…` to its end, the stand-in kubelet running meanwhile.
async fn run(st: &mut Stage, args: &[&str]) -> Out {
    let child = spawn(st, args);
    finish(st, child, &format!("kubectl dlock {}", args.join(" ")), true).await
}

fn action(ls: &LockService, id: &str) -> Option<ActionStatus> {
    ls.status.as_ref()?.actions.iter().find(|a| a.id == id).cloned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_dlock_revoke_waits_for_the_outcome_and_exits_by_it() {
    let Some(mut st) = stage("kubectl_dlock_revoke_waits_for_the_outcome_and_exits_by_it").await else {
        return;
    };
    let api = st.lock_api(LS);
    let db = st.lockdb();
    let key = "account:plugin-stuck";

    // 1. A stuck holder, revoked with one command that waits for the end: exit 0, the outcome
    //    printed, the grant gone, the annotation exactly the runbook's request.
    let a = api.acquire("worker-a", key, 600_000);
    let r = run(
        &mut st,
        &[
            "revoke",
            LS,
            key,
            "--reason",
            "stuck worker",
            "--requested-by",
            "alice",
            "--id",
            "r-1",
            "--wait",
            "--timeout",
            "120s",
        ],
    )
    .await;
    assert_eq!(r.code, Some(0), "stdout: {}\nstderr: {}", r.stdout, r.stderr);
    assert!(
        r.stdout.starts_with("r-1 Revoke Succeeded (REVOKED)"),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout.contains(&format!("previous token {}", a.token))
            && r.stdout.contains("previous owner worker-a"),
        "{}",
        r.stdout
    );
    assert_eq!(holder(&db, key).await, None, "the grant is gone");
    assert_eq!(revocations(&db, key).await.len(), 1);
    let annotations = st.lsvc(LS).await.metadata.annotations.unwrap_or_default();
    assert_eq!(
        annotations.get(ANNOTATION_REVOKE).map(String::as_str),
        Some(
            format!(r#"{{"id":"r-1","key":"{key}","reason":"stuck worker","requestedBy":"alice"}}"#).as_str()
        ),
        "the runbook's annotation, byte for byte"
    );

    // 2. A revoke that fails: the target is recorded, the operator is killed before its revoke
    //    reaches lock-server, the key changes hands meanwhile; the plugin keeps watching across the
    //    restart and exits 1 with HELD_BY_OTHER_TOKEN. The newer holder keeps the lock.
    let c = api.acquire("worker-c", key, 600_000);
    st.proxy().block("/v1/admin/");
    let child = spawn(
        &st,
        &[
            "revoke",
            LS,
            key,
            "--reason",
            "stuck again",
            "--requested-by",
            "alice",
            "--id",
            "r-2",
            "--wait",
            "--timeout",
            "120s",
        ],
    );
    st.wait(
        "r-2 Running with its target recorded",
        true,
        async |st| match action(&st.lsvc(LS).await, "r-2") {
            Some(a) if a.phase == ActionPhase::Running && a.target_token == Some(c.token) => Ok(()),
            other => Err(format!("{other:?}")),
        },
    )
    .await;
    st.wait("the operator to try the blocked revoke", true, async |st| {
        let seen = st.proxy().seen();
        if seen.iter().any(|s| s.starts_with("POST /v1/admin/")) {
            Ok(())
        } else {
            Err(format!("{seen:?}"))
        }
    })
    .await;
    st.op.kill();
    api.release(&c);
    let d = api.acquire("worker-d", key, 600_000);
    st.proxy().unblock();
    st.restart_operator().await;
    let r = finish(&mut st, child, "kubectl dlock revoke r-2", true).await;
    assert_eq!(r.code, Some(1), "stdout: {}\nstderr: {}", r.stdout, r.stderr);
    assert!(
        r.stdout.starts_with("r-2 Revoke Failed (HELD_BY_OTHER_TOKEN)"),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout.contains(&format!("current holder's token {}", d.token)),
        "{}",
        r.stdout
    );
    assert!(
        r.stderr.contains("Running at Revoke"),
        "the steps were followed: {}",
        r.stderr
    );
    assert_eq!(holder(&db, key).await, Some(("worker-d".to_owned(), d.token)));

    // 3. A finished id is not executed again: the plugin reports what was recorded (exit 0) and the
    //    newer holder is untouched.
    let r = run(
        &mut st,
        &[
            "revoke",
            LS,
            key,
            "--reason",
            "again",
            "--requested-by",
            "alice",
            "--id",
            "r-1",
            "--wait",
        ],
    )
    .await;
    assert_eq!(r.code, Some(0), "{} {}", r.stdout, r.stderr);
    assert!(
        r.stdout.starts_with("r-1 Revoke Succeeded (REVOKED)"),
        "{}",
        r.stdout
    );
    assert_eq!(holder(&db, key).await, Some(("worker-d".to_owned(), d.token)));
    assert_eq!(revocations(&db, key).await.len(), 1, "nothing new revoked");

    // 4. Without --wait: the generated id is printed at once; the operator executes it.
    let r = run(
        &mut st,
        &[
            "revoke",
            LS,
            "account:nobody",
            "--reason",
            "cleanup",
            "--requested-by",
            "bob",
        ],
    )
    .await;
    assert_eq!(r.code, Some(0), "{} {}", r.stdout, r.stderr);
    let id = r.stdout.trim().to_owned();
    assert!(
        id.len() == 22 && id.starts_with("r-") && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'),
        "{id:?}"
    );
    st.wait(&format!("{id} to end"), true, async |st| {
        match action(&st.lsvc(LS).await, &id) {
            Some(a) if a.phase == ActionPhase::Succeeded && a.outcome.as_deref() == Some("NOT_HELD") => {
                Ok(())
            }
            other => Err(format!("{other:?}")),
        }
    })
    .await;

    // 5. `status` shows it all.
    let r = run(&mut st, &["status", LS]).await;
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    for want in [
        format!("LockService {}/{LS}: Ready", st.ns),
        "Ready        True".to_owned(),
        "r-2 Revoke Failed (HELD_BY_OTHER_TOKEN)".to_owned(),
        format!("{id} Revoke Succeeded (NOT_HELD)"),
        "Endpoint lockServer:".to_owned(),
    ] {
        assert!(r.stdout.contains(&want), "{want:?} in\n{}", r.stdout);
    }

    // 6. `locks`: lock-server's admin list, with the token read from the Secret the operator
    //    generated, here at the stand-in process's URL (the default port-forward needs a kubelet).
    let other = api.acquire("worker-x", "job:nightly", 600_000);
    let url = format!("http://127.0.0.1:{}", api.port);
    let r = run(
        &mut st,
        &["locks", LS, "--prefix", "account:", "--lock-server-url", &url],
    )
    .await;
    assert_eq!(r.code, Some(0), "stdout: {}\nstderr: {}", r.stdout, r.stderr);
    let rows: Vec<&str> = r.stdout.lines().skip(1).collect();
    assert_eq!(rows.len(), 1, "one key held under the prefix: {}", r.stdout);
    let token = d.token.to_string();
    for want in [key, "HELD", token.as_str(), "worker-d"] {
        assert!(rows[0].contains(want), "{want} in {}", rows[0]);
    }
    let r = run(&mut st, &["locks", LS, "--lock-server-url", &url]).await;
    assert_eq!(r.code, Some(0), "stdout: {}\nstderr: {}", r.stdout, r.stderr);
    assert_eq!(
        r.stdout.lines().count(),
        3,
        "both keys without a prefix: {}",
        r.stdout
    );
    assert!(r.stdout.contains("worker-x"), "{}", r.stdout);
    api.release(&other);
    let r = run(&mut st, &["locks", LS, "--lock-server-url", &url]).await;
    assert_eq!(
        r.stdout.lines().count(),
        2,
        "a released key is not listed: {}",
        r.stdout
    );

    // `-o json`: the same list, machine-readable, in lock-server's field names.
    let r = run(
        &mut st,
        &[
            "locks",
            LS,
            "--prefix",
            "account:",
            "--lock-server-url",
            &url,
            "-o",
            "json",
        ],
    )
    .await;
    assert_eq!(r.code, Some(0), "stdout: {}\nstderr: {}", r.stdout, r.stderr);
    let doc: serde_json::Value =
        serde_json::from_str(&r.stdout).unwrap_or_else(|e| panic!("{e}: {}", r.stdout));
    assert_eq!(doc["lockService"], LS);
    assert_eq!(doc["items"].as_array().map(Vec::len), Some(1), "{doc}");
    assert_eq!(doc["items"][0]["lockKey"], key);
    assert_eq!(doc["items"][0]["fencingToken"], d.token);
    assert_eq!(doc["items"][0]["ownerId"], "worker-d");

    // 6b. `locks` without --lock-server-url port-forwards through the API server itself, to a
    //     Running and Ready pod of lock-server's Service. No kubelet serves a port-forward here,
    //     so what is checked is the way there, without kubectl: first no pod to forward to; then
    //     a Ready pod on a node the API server cannot reach, and the API server's own refusal of
    //     that pod's pods/portforward reported with the pod's name (exit 4 both times).
    let r = run(&mut st, &["locks", LS]).await;
    assert_eq!(r.code, Some(4), "stdout: {}\nstderr: {}", r.stdout, r.stderr);
    assert!(
        r.stderr.contains("no Running and Ready pod of Service")
            && r.stderr.contains(&format!("{LS}-lock-server")),
        "{}",
        r.stderr
    );
    let pod = stand_in_lock_server_pod(&st).await;
    let r = run(&mut st, &["locks", LS]).await;
    assert_eq!(r.code, Some(4), "stdout: {}\nstderr: {}", r.stdout, r.stderr);
    assert!(
        r.stderr.contains(&format!("port-forward to pod {pod} port 8080")),
        "the pod and its container port named http: {}",
        r.stderr
    );
    assert!(!r.stderr.contains("kubectl"), "{}", r.stderr);
    st.api::<k8s_openapi::api::core::v1::Pod>()
        .delete(&pod, &Default::default())
        .await
        .unwrap_or_else(|e| panic!("delete pod {pod}: {e}"));

    // 6c. kubectl's own plugin mechanism finds the plugin, and `kubectl dlock <TAB>` completes
    //     through `kubectl_complete-dlock` (kubectl's convention for a plugin's completion).
    let scratch = env::Scratch::new("plugin-install");
    let installed = installed_plugin(scratch.path());
    let kubectl = Kubectl::new(&st.cluster.kubeconfig).with_plugins(&installed);
    let r = kubectl
        .run(&["dlock", "-n", &st.ns, "status", LS, "-o", "json"])
        .await
        .ok();
    let doc: serde_json::Value =
        serde_json::from_str(&r.stdout).unwrap_or_else(|e| panic!("{e}: {}", r.stdout));
    assert_eq!(doc["items"][0]["kind"], "LockService");
    assert_eq!(doc["items"][0]["phase"], "Ready");
    assert_eq!(doc["items"][0]["fencing"]["lockService"], LS);
    let actions = doc["items"][0]["status"]["actions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        actions
            .iter()
            .any(|a| a["id"] == "r-2" && a["phase"] == "Failed" && a["outcome"] == "HELD_BY_OTHER_TOKEN"),
        "{actions:?}"
    );
    let r = kubectl
        .run(&["__complete", "dlock", "-n", &st.ns, "re"])
        .await
        .ok();
    assert_eq!(
        r.stdout.lines().collect::<Vec<_>>(),
        ["restore", "revoke", ":4"],
        "{}",
        r.stderr
    );
    let r = kubectl
        .run(&["__complete", "dlock", "locks", LS, "--out"])
        .await
        .ok();
    assert!(r.stdout.starts_with("--output\n"), "{}", r.stdout);

    // 7. Requests that cannot be made change nothing: exit 2.
    let before = st.lsvc(LS).await.metadata.annotations;
    let bad_id = run(
        &mut st,
        &[
            "revoke",
            LS,
            key,
            "--reason",
            "x",
            "--requested-by",
            "a",
            "--id",
            "Not An Id",
        ],
    )
    .await;
    assert_eq!(bad_id.code, Some(2), "{} {}", bad_id.stdout, bad_id.stderr);
    assert!(bad_id.stderr.contains("id must be"), "{}", bad_id.stderr);
    let missing = run(&mut st, &["restore", "no-such-lsvc", "--wait"]).await;
    assert_eq!(missing.code, Some(2), "{}", missing.stderr);
    assert!(missing.stderr.contains("does not exist"), "{}", missing.stderr);
    assert_eq!(st.lsvc(LS).await.metadata.annotations, before);
    st.op.assert_healthy();
}

/// A pod as lock-server's Deployment would have it (the Service's selector, the container port
/// `http`), Running and Ready, on a node no kubelet serves: the pod the plugin must pick. Its name.
async fn stand_in_lock_server_pod(st: &Stage) -> String {
    use k8s_openapi::api::core::v1::{Pod, Service, ServiceAccount};
    use kube::api::{Patch, PatchParams, PostParams};
    // A pod needs its namespace's default ServiceAccount (the stand-in kubelet made it for the
    // migration Job's pod already; AlreadyExists is as good).
    let sa: ServiceAccount = serde_json::from_value(serde_json::json!({"metadata": {"name": "default"}}))
        .unwrap_or_else(|e| panic!("service account: {e}"));
    let _ = st
        .api::<ServiceAccount>()
        .create(&PostParams::default(), &sa)
        .await;
    let svc: Service = st.must_get(&format!("{LS}-lock-server")).await;
    let selector = svc.spec.and_then(|s| s.selector).expect("the Service's selector");
    let name = format!("{LS}-lock-server-stand-in");
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": selector},
        "spec": {
            "nodeName": "no-kubelet-here",
            "containers": [{"name": "lock-server", "image": "lock-server",
                            "ports": [{"name": "http", "containerPort": 8080}]}],
        },
    }))
    .unwrap_or_else(|e| panic!("pod: {e}"));
    let pods = st.api::<Pod>();
    pods.create(&PostParams::default(), &pod)
        .await
        .unwrap_or_else(|e| panic!("create pod {name}: {e}"));
    let status = serde_json::json!({"status": {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "True"}],
    }});
    pods.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap_or_else(|e| panic!("write the status of pod {name}: {e}"));
    name
}

/// A PaymentStack fenced by the stage's LockService, on a paydb of its own seeded with the demo
/// accounts (so a test can write a high-water mark for one), Ready.
async fn payment_stack(st: &mut Stage, name: &str) -> TestDb {
    let paydb = dlock_testkit::blank(History::Paydb).await;
    let ns = st.ns.clone();
    st.kubelet
        .use_database_for_host(&format!("{name}-paydb.{ns}.svc"), paydb.clone());
    let mut spec = stack_spec(LS);
    spec.demo_data = true;
    st.apply(&paymentstack(name, spec)).await;
    st.wait_ready::<PaymentStack>(name).await;
    paydb
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_dlock_restore_waits_through_gate_read_advance_and_resume() {
    let test = "kubectl_dlock_restore_waits_through_gate_read_advance_and_resume";
    let Some(mut st) = stage_with(test, &[History::Lockdb, History::Paydb]).await else {
        return;
    };
    let paydb = payment_stack(&mut st, "pay-a").await;
    let api = st.lock_api(LS);
    let mut last = 0;
    for i in 0..3 {
        let g = api.acquire("worker", &format!("account:{i}"), 600_000);
        api.release(&g);
        last = g.token;
    }
    // The paydb has seen a token 2^40 above the last grant: more than lock-server's jumps reach
    // meanwhile, so the fast-forward really moves the sequence, to exactly high + the margin.
    let high = last + (1 << 40);
    sqlx::query(
        "INSERT INTO rail_high_water (account_id, highest_token) VALUES ('00000000-0000-4000-8000-000000000001', $1)",
    )
    .bind(high)
    .execute(&paydb.admin_pool().await)
    .await
    .unwrap_or_else(|e| panic!("write the high-water: {e}"));
    let db = st.lockdb();
    let before = sequence(&db).await;
    assert_eq!(before, last, "no grant since");
    let starts = st.kubelet.served_starts(&format!("{LS}-lock-server"));

    // --wait runs out while no kubelet runs the read Job: exit 3, and the action goes on.
    let child = spawn(
        &st,
        &[
            "restore",
            LS,
            "--margin",
            "50",
            "--id",
            "ff-1",
            "--wait",
            "--timeout",
            "3s",
        ],
    );
    let r = finish(&mut st, child, "kubectl dlock restore, timing out", false).await;
    assert_eq!(r.code, Some(3), "stdout: {}\nstderr: {}", r.stdout, r.stderr);
    assert!(r.stderr.contains("ff-1: still running"), "{}", r.stderr);

    // Waiting again on the same id follows it to the end: the gate, the Jobs, the advance, resume.
    let r = run(
        &mut st,
        &[
            "restore",
            LS,
            "--margin",
            "50",
            "--id",
            "ff-1",
            "--wait",
            "--timeout",
            "120s",
        ],
    )
    .await;
    assert_eq!(r.code, Some(0), "stdout: {}\nstderr: {}", r.stdout, r.stderr);
    assert!(r.stdout.starts_with("ff-1 Restore Succeeded"), "{}", r.stdout);
    let done = action(&st.lsvc(LS).await, "ff-1").expect("status.actions[ff-1]");
    let after = high + 50;
    assert_eq!(done.sequence_before, Some(before), "{done:?}");
    assert_eq!(done.sequence_after, Some(after), "{done:?}");
    assert!(
        r.stdout.contains(&format!("{before} -> {after}")),
        "the sequence before and after the advance is printed: {}",
        r.stdout
    );
    assert!(
        r.stdout.contains(&format!("paydb of pay-a: high-water {high}")),
        "the high-water read is printed: {}",
        r.stdout
    );
    st.wait_ready::<LockService>(LS).await;
    assert_eq!(
        st.kubelet.served_starts(&format!("{LS}-lock-server")),
        starts + 1,
        "lock-server was gated (its process stopped) and resumed"
    );
    // The new lock-server process jumped at its start, from exactly where the advance left the
    // sequence (nothing was granted while gated), and its first grant is past it.
    let api = st.lock_api(LS);
    let g = api.acquire("worker", "account:after", 600_000);
    let j = api.last_jump();
    assert_eq!(j.found, after + 1, "{j:?}");
    assert_eq!(g.token, j.jumped_to + 1, "{j:?}");
    assert!(g.token > after, "the next grant is past the advanced sequence");

    // The operator's metrics the chart's alerts and dashboard read, from the running operator: its
    // per-object series exist now (a Deployment applied, a migration run, a fencing comparison
    // recorded by the restore).
    let helm_bin = helm::helm(test).unwrap_or_else(|| panic!("DLOCK_E2E=1 but helm is missing"));
    let rendered = monitoring::render(&helm_bin);
    let mut used = BTreeSet::new();
    for a in monitoring::alerts(&rendered.rules) {
        used.extend(monitoring::metric_names(&a.expr));
    }
    for q in monitoring::panel_queries(&rendered.dashboard) {
        used.extend(monitoring::metric_names(&monitoring::as_promql(&q.expr)));
    }
    let operator_names: BTreeSet<String> = used
        .into_iter()
        .filter(|n| n.starts_with("dlock_operator_"))
        .collect();
    assert!(operator_names.len() >= 5, "{operator_names:?}");
    let exported = monitoring::exposed_names(&st.op.get("/metrics").await);
    let missing: Vec<&String> = operator_names.iter().filter(|n| !exported.contains(*n)).collect();
    assert!(
        missing.is_empty(),
        "read by the chart, not exported by the operator: {missing:?}\n{exported:?}"
    );
    st.op.assert_healthy();
}
