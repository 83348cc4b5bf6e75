//! The kind tier's checks (steps 7–14 of `e2e/kind/run.sh`, which sets up the cluster, the operator
//! and the stack, then runs this test): one test, because the steps run in order against one
//! cluster and each builds on the state the previous one left. (A second test, which needs no
//! cluster, checks run.sh's rule for a machine without Docker.)
//!
//! - 6b, restricted: the stack's namespace enforces the Pod Security Standard "restricted", every pod
//!   of the stack was admitted; negative control: a pod without the settings is refused (and, after
//!   every step, no Event says a pod was refused)
//! - 7, batch: payouts through payment-resource's API; the in-cluster executors post them; every
//!   payout POSTED once, legs balanced, the rail-stub's ground truth without a duplicate
//! - 7b, clients: lock-server runs with the clients file the operator made: a request without a
//!   token is refused (401, `POST /v1/sessions`), the stack's token opens sessions only for owner
//!   ids under `<stack>/` (403 for another owner), while step 7's payouts all posted through the
//!   executors, which present that token
//! - 7c, renewal: every certificate of the stack renewed on request (`dlock.dev/renew-certificates`)
//!   while a batch is paid: each server's pod presents its new certificate without restarting, the
//!   executors go on calling, every payout of the batch posted once; an invalid request renews
//!   nothing (Warning Event)
//! - 8, chaos: a second batch while a lock-server pod and an executor pod are killed
//! - 9, failover: delete the operator leader's pod: another replica takes the Lease and reconciles
//! - 10, actions: a revoke of a held lock by annotation (REVOKED, pinned to its token) and a restore
//!   fast-forward (gate, read and advance Jobs, resume); a third batch is paid
//! - 10b, plugin: `kubectl-dlock locks` with no kubectl on PATH, through its own port-forward (the
//!   API server's pods/portforward) and HTTPS: the key held for the check is listed
//! - 11, etcd: the LockService with backend etcd: two grants whose tokens are the etcd revisions of
//!   their keys, read back from etcd itself, strictly increasing
//! - 11b, ha: a LockService and a PaymentStack whose lockdb and paydb run on CloudNativePG (two
//!   instances each, synchronous): while payouts flow, the lockdb primary's pod killed, the paydb
//!   primary's, then a switchover of each; every payout POSTED once, the fences of every account
//!   strictly increasing across the four events, lock-server's grants above its jump on each new
//!   timeline, each event in status and Events, the time without grants and postings measured;
//!   negative control: asynchronous, the standby held behind, the jump off, and the check fails
//! - 12, netpol: the NetworkPolicies as packet filters (kube-router enforces them): TCP connections
//!   from a pod without the stack's labels, from an executor, rail-proxy, the operator and the etcd
//!   LockService's lock-server to each policed Service, each let through or refused as the policies
//!   say; the policed pods Ready all along (the kubelet's probes pass). Negative control: with the
//!   operator stopped and the policies deleted, the same check fails; restored, it passes again
//! - 13, upgrade: `helm upgrade` of the operator to a second image (a version bump with one more
//!   paydb migration) while payouts are created and posted: the new migration applied by its Job
//!   before any pod of the new version starts, the old version's pods serving on the new schema
//!   without a failure, every Deployment on the new image, every payout posted once
//! - 14, negative control: a payout paid twice straight at the rail makes the checks of step 7 fail
//!
//! Outside a kind run (no `DLOCK_KIND_KUBECONFIG`) it says so and returns.

use base64::Engine as _;
use dlock_e2e::k8s;
use dlock_e2e::kind::ha::{self, Cnpg};
use dlock_e2e::kind::netpol::{self, Expect, Source, Target};
use dlock_e2e::kind::renewal;
use dlock_e2e::kind::upgrade;
use dlock_e2e::kind::{
    Forward, KindEnv, Payments, Steps, ca_bundle, client, deployment_rolled_out, forward_api, forward_tls,
    kind_env, log, poll, statefulset_rolled_out, wait_until,
};
use dlock_e2e::lockapi::{Grant, LockApi};
use dlock_operator::builders::etcd_members::ETCD;
use dlock_operator::builders::lock_clients;
use dlock_operator::builders::network_policies::OPERATOR_POD_NAME;
use dlock_operator::builders::postgres::History;
use dlock_operator::builders::{
    LABEL_COMPONENT, LABEL_INSTANCE, LABEL_NAME, LOCK_SERVER, PAYMENT_RESOURCE, PAYOUT_EXECUTOR, RAIL_PROXY,
    RAIL_STUB,
};
use dlock_operator::crd::actions::{ANNOTATION_RESTORE, ANNOTATION_REVOKE, RestoreRequest, RevokeRequest};
use dlock_operator::crd::sequence::{JumpCause, SequenceJump};
use dlock_operator::crd::{ActionStatus, LockService, PaymentStack, Phase};
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{DeleteParams, ListParams, LogParams, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use std::sync::atomic::{AtomicU32, Ordering};
use tokio::sync::watch;

/// The cluster's objects the steps touch, typed.
struct Cluster {
    env: KindEnv,
    client: Client,
    lsvcs: Api<LockService>,
    pstacks: Api<PaymentStack>,
    deployments: Api<Deployment>,
    pods: Api<Pod>,
}

impl Cluster {
    /// A port-forward to lock-server of `lsvc` and its API over HTTPS, verified against the
    /// namespace's CA for the Service's name.
    async fn lock_api(&self, lsvc: &str) -> (Forward, LockApi) {
        self.lock_api_of(&format!("{lsvc}-lock-server")).await
    }

    /// The same for the Service (or Deployment: same name) `service`.
    async fn lock_api_of(&self, service: &str) -> (Forward, LockApi) {
        let fwd = forward_api(&self.env, service).await;
        let ca = ca_bundle(&self.client, &self.env.ns).await;
        let api = fwd.lock_api(&ca);
        (fwd, api)
    }

    async fn rolled_out(&self, name: &str) {
        wait_until(
            &self.deployments,
            name,
            &format!("deploy/{name} to roll out"),
            self.env.timeout,
            deployment_rolled_out,
        )
        .await;
    }

    async fn lsvc_ready(&self, name: &str) -> LockService {
        wait_until(
            &self.lsvcs,
            name,
            &format!("lsvc/{name} to be Ready"),
            self.env.timeout,
            |o: Option<&LockService>| o.and_then(|l| l.status.as_ref()).is_some_and(|s| s.is_ready()),
        )
        .await
    }

    /// The name of the first running pod labelled with `instance` and `component` that is not being
    /// deleted.
    async fn pod_of(&self, instance: &str, component: &str) -> String {
        let lp = ListParams::default().labels(&format!(
            "app.kubernetes.io/instance={instance},app.kubernetes.io/component={component}"
        ));
        find_name(&self.pods, &lp, |p: &Pod| {
            p.metadata.deletion_timestamp.is_none()
                && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        })
        .await
        .unwrap_or_else(|| panic!("no running {component} pod of {instance}"))
    }

    /// Sets one annotation on the LockService of the stack (what `kubectl annotate --overwrite` does).
    async fn annotate(&self, key: &str, value: String) {
        k8s::annotate(&self.lsvcs, &self.env.lsvc, key, &value).await;
    }

    /// Waits until the action `id` of the LockService of the stack is final (Succeeded or Failed) and returns it.
    async fn finished(&self, id: &str) -> ActionStatus {
        let action = |o: Option<&LockService>| -> Option<ActionStatus> {
            o?.status.as_ref()?.actions.iter().find(|a| a.id == id).cloned()
        };
        let lsvc = wait_until(
            &self.lsvcs,
            &self.env.lsvc,
            &format!("action {id} to finish"),
            self.env.timeout,
            |o: Option<&LockService>| action(o).is_some_and(|a| a.phase.is_final()),
        )
        .await;
        action(Some(&lsvc)).expect("the action is in the status it was awaited in")
    }
}

/// The name of the first object `api` lists under `lp` for which `pred` holds.
async fn find_name<K>(api: &Api<K>, lp: &ListParams, pred: impl Fn(&K) -> bool) -> Option<String>
where
    K: Clone + std::fmt::Debug + serde::de::DeserializeOwned + kube::Resource<DynamicType = ()>,
{
    api.list(lp)
        .await
        .unwrap_or_else(|e| panic!("list {}: {e}", K::kind(&())))
        .items
        .into_iter()
        .find(|o| pred(o))
        .and_then(|o| o.meta().name.clone())
}

fn run_name(suffix: &str) -> String {
    format!("kind-{}-{suffix}", chrono::Utc::now().timestamp())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kind_tier_steps() {
    let Some(env) = kind_env("kind_tier_steps") else {
        return;
    };
    let client = client(&env.kubeconfig).await;
    let c = Cluster {
        lsvcs: Api::namespaced(client.clone(), &env.ns),
        pstacks: Api::namespaced(client.clone(), &env.ns),
        deployments: Api::namespaced(client.clone(), &env.ns),
        pods: Api::namespaced(client.clone(), &env.ns),
        client,
        env,
    };
    let mut steps = Steps::default();
    let pay = Payments::connect(&c.env, &c.client, &c.env.pstack).await;
    let runs = |name: &str| {
        let run = c.env.runs(name);
        if !run {
            log(format!("---- {name}: not in DLOCK_KIND_STEPS, left out"));
        }
        run
    };

    if runs("restricted") {
        steps.step("restricted");
        restricted(&c).await;
    }
    let mut run1 = None;
    if runs("batch") {
        steps.step("batch");
        run1 = Some(batch(&c, &pay).await);
    }
    if runs("clients") {
        steps.step("clients");
        lock_clients(&c).await;
    }
    if runs("renewal") {
        steps.step("renewal");
        renewal::renew_while_paying(&c.env, &c.client, &pay, &run_name("r")).await;
    }
    if runs("chaos") {
        steps.step("chaos");
        chaos(&c, &pay).await;
    }
    if runs("failover") {
        steps.step("failover");
        failover(&c).await;
    }
    if runs("actions") {
        steps.step("actions");
        actions(&c, &pay).await;
    }
    if runs("plugin") {
        steps.step("plugin");
        plugin_without_kubectl(&c).await;
    }
    if runs("etcd") {
        steps.step("etcd");
        etcd(&c).await;
    }
    if runs("ha") {
        steps.step("ha");
        ha(&c).await;
    }
    if runs("netpol") {
        steps.step("netpol");
        netpol(&c).await;
    }
    if runs("upgrade") {
        steps.step("upgrade");
        upgrade(&c, &pay).await;
    }
    // Whatever ran, no pod was refused by the namespace's "restricted" admission.
    if runs("restricted") {
        steps.step("restricted-after");
        nothing_refused(&c).await;
    }
    // The negative control spoils a batch of step 7's.
    if let Some(run1) = run1.filter(|_| runs("negative-control")) {
        steps.step("negative-control");
        negative_control(&pay, &run1).await;
    }
    steps.close();
}

/// What the API server says when the Pod Security admission refuses a pod.
const POD_SECURITY_REFUSAL: &str = "violates PodSecurity \"restricted";

/// Step 6b: the stack's namespace enforces the Pod Security Standard "restricted" (run.sh labels
/// it before the stack is applied), and every pod of the stack was admitted: the operator's
/// Deployments, Jobs and StatefulSets, run and Ready by now. Negative control: a pod without the
/// standard's settings is refused there, by the API server's own admission.
async fn restricted(c: &Cluster) {
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(c.client.clone());
    let ns = namespaces.get(&c.env.ns).await.expect("the stack's namespace");
    let enforce = ns
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get("pod-security.kubernetes.io/enforce"))
        .cloned();
    assert_eq!(enforce.as_deref(), Some("restricted"), "namespace {}", c.env.ns);
    let bare = Pod {
        metadata: kube::api::ObjectMeta {
            name: Some("unrestricted".into()),
            ..Default::default()
        },
        spec: Some(k8s_openapi::api::core::v1::PodSpec {
            containers: vec![k8s_openapi::api::core::v1::Container {
                name: "c".into(),
                image: Some(c.env.image.clone()),
                image_pull_policy: Some("Never".into()),
                command: Some(vec!["sleep".into(), "60".into()]),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Pod::default()
    };
    match c.pods.create(&kube::api::PostParams::default(), &bare).await {
        Err(kube::Error::Api(e)) if e.code == 403 && e.message.contains(POD_SECURITY_REFUSAL) => {
            log(format!(
                "negative control: a pod without the standard's settings is refused: {}",
                e.message
            ));
        }
        Ok(_) => {
            let _ = c
                .pods
                .delete("unrestricted", &DeleteParams::default().grace_period(0))
                .await;
            panic!(
                "a pod without securityContext was admitted to namespace {}: nothing enforces \"restricted\"",
                c.env.ns
            );
        }
        Err(e) => panic!("creating the unrestricted pod failed otherwise: {e}"),
    }
    nothing_refused(c).await;
    let pods = c.pods.list(&ListParams::default()).await.expect("list pods");
    log(format!(
        "{} pods of the stack admitted under \"restricted\"",
        pods.items.len()
    ));
}

/// No Event of the namespace says a pod was refused by the "restricted" admission (a ReplicaSet,
/// a StatefulSet or a Job records `FailedCreate` with the API server's words).
async fn nothing_refused(c: &Cluster) {
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(c.client.clone(), &c.env.ns);
    let refused: Vec<String> = events
        .list(&ListParams::default())
        .await
        .expect("list events")
        .items
        .into_iter()
        .filter(|e| {
            e.message
                .as_deref()
                .is_some_and(|m| m.contains(POD_SECURITY_REFUSAL))
        })
        .map(|e| format!("{:?}: {}", e.involved_object.name, e.message.unwrap_or_default()))
        .collect();
    assert!(
        refused.is_empty(),
        "pods refused by the restricted admission:\n{}",
        refused.join("\n")
    );
}

/// Step 7: A payout batch, posted by the in-cluster executors, checked in the ledger and at the rail.
async fn batch(c: &Cluster, pay: &Payments) -> String {
    let run1 = run_name("a");
    let n = c.env.payouts;
    log(format!("creating {n} payouts through payment-resource ({run1})"));
    pay.create_batch(&run1, 1, n).await;
    pay.await_posted(&run1, n, c.env.timeout).await;
    pay.check_batch(&run1).await.unwrap_or_else(|e| panic!("{e}"));
    // TLS on the database hop too (the stack's paydb is a managed StatefulSet with HTTPS on).
    let tls = pay.check_database_tls().await.unwrap_or_else(|e| panic!("{e}"));
    log(tls);
    run1
}

/// Step 7b: lock-server's clients file, made by the operator, through the same port-forward the
/// other steps use. The executors are clients of it (step 7's payouts posted, each under a grant
/// their token got); nobody without a token is.
async fn lock_clients(c: &Cluster) {
    let (lsvc, pstack) = (&c.env.lsvc, &c.env.pstack);
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(c.client.clone(), &c.env.ns);
    let data = |s: Option<k8s_openapi::api::core::v1::Secret>, key: &str| {
        s.and_then(|s| s.data?.remove(key))
            .map(|v| String::from_utf8_lossy(&v.0).into_owned())
            .unwrap_or_else(|| panic!("no {key} in the Secret"))
    };
    let token = data(
        secrets
            .get_opt(&format!("{pstack}-lock-client"))
            .await
            .expect("read the stack's lock client Secret"),
        "token",
    );
    let file = data(
        secrets
            .get_opt(&format!("{lsvc}-lock-clients"))
            .await
            .expect("read lock-server's clients Secret"),
        "clients.json",
    );
    let file: Value = serde_json::from_str(&file).expect("the clients file is JSON");
    let names: Vec<&str> = file["clients"]
        .as_array()
        .map(|l| l.iter().filter_map(|c| c["name"].as_str()).collect())
        .unwrap_or_default();
    assert!(
        names.contains(&format!("paymentstack-{pstack}").as_str()),
        "{names:?}"
    );

    let (_fwd, locks) = c.lock_api(lsvc).await;
    let session = |owner: &str| json!({"ownerId": owner, "ttlMs": 60_000});
    // No token: refused before anything is read, as every lock route is.
    let (code, body) = tokio::task::block_in_place(|| {
        locks
            .anonymous()
            .call("POST", "/v1/sessions", Some(&session("kind-anonymous")), &[])
    });
    assert_eq!(code, 401, "POST /v1/sessions without a token: {body}");
    // The stack's token: its own owner ids only.
    let bearer = format!("Bearer {token}");
    let as_stack = [("Authorization", bearer.as_str())];
    let (code, body) = tokio::task::block_in_place(|| {
        locks.call(
            "POST",
            "/v1/sessions",
            Some(&session("kind-not-the-stack")),
            &as_stack,
        )
    });
    assert_eq!(code, 403, "another owner under the stack's token: {body}");
    let (code, body) = tokio::task::block_in_place(|| {
        locks.call(
            "POST",
            "/v1/sessions",
            Some(&session(&format!("{pstack}/kind-clients-check"))),
            &as_stack,
        )
    });
    assert_eq!(code, 201, "the stack's own owner id: {body}");
    let id = body["sessionId"].as_str().unwrap_or_default().to_owned();
    let (code, body) =
        tokio::task::block_in_place(|| locks.call("DELETE", &format!("/v1/sessions/{id}"), None, &as_stack));
    assert!(code < 300, "close the check's session: {code} {body}");
    log(format!(
        "lock clients: {} client(s) in {lsvc}-lock-clients, 401 without a token, 403 for another owner",
        names.len()
    ));
}

/// Step 8: Pods deleted mid-batch.
async fn chaos(c: &Cluster, pay: &Payments) {
    let lsvc = c.env.lsvc.as_str();
    let pstack = c.env.pstack.as_str();
    let run2 = run_name("b");
    let n2 = c.env.payouts * 2;
    let ls_pod = c.pod_of(lsvc, "lock-server").await;
    let ex_pod = c.pod_of(pstack, "payout-executor").await;
    // A few payouts are created, and while the executors work on them both pods are killed (no
    // grace: the processes die as in a crash, and the API forgets the pods at once, so their
    // replacements may start before they are gone); the rest of the batch is created while the
    // replacements start.
    let first = 5;
    pay.create_batch(&run2, 1, first).await;
    log(format!(
        "mid-batch: killing lock-server pod {ls_pod} and executor pod {ex_pod}"
    ));
    let now = DeleteParams::default().grace_period(0);
    for pod in [&ls_pod, &ex_pod] {
        c.pods
            .delete(pod, &now)
            .await
            .unwrap_or_else(|e| panic!("delete pod {pod}: {e}"));
    }
    match pay.counts(&run2).await {
        Ok(counts) => log(format!("at the kill: {counts}")),
        Err(e) => log(format!("at the kill: {e}")),
    }
    pay.create_batch(&run2, first + 1, n2).await;
    pay.await_posted(&run2, n2, c.env.timeout).await;
    pay.check_batch(&run2).await.unwrap_or_else(|e| panic!("{e}"));
    c.rolled_out(&format!("{lsvc}-lock-server")).await;
    c.rolled_out(&format!("{pstack}-payout-executor")).await;
}

/// Step 9: Operator failover: the leader's pod deleted, another replica takes the Lease and reconciles.
async fn failover(c: &Cluster) {
    let lsvc = c.env.lsvc.as_str();
    let op_ns = &c.env.op_ns;
    let leases: Api<Lease> = Api::namespaced(c.client.clone(), op_ns);
    let all = ListParams::default();
    let lease = find_name(&leases, &all, |l: &Lease| {
        l.metadata
            .name
            .as_deref()
            .is_some_and(|n| n.contains("dlock-operator"))
    })
    .await
    .unwrap_or_else(|| panic!("no operator Lease in {op_ns}"));
    let holder = |l: &Lease| -> String {
        l.spec
            .as_ref()
            .and_then(|s| s.holder_identity.clone())
            .unwrap_or_default()
    };
    let leader = holder(&leases.get(&lease).await.expect("get the operator Lease"));
    let op_pods: Api<Pod> = Api::namespaced(c.client.clone(), op_ns);
    let leader_pod = find_name(&op_pods, &all, |p: &Pod| {
        p.metadata.name.as_deref().is_some_and(|n| leader.contains(n))
    })
    .await
    .unwrap_or_else(|| panic!("Lease holder \"{leader}\" is none of the operator pods"));
    log(format!("leader {leader} (pod {leader_pod}): deleting it"));
    op_pods
        .delete(&leader_pod, &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("delete pod {leader_pod}: {e}"));
    let taken = wait_until(
        &leases,
        &lease,
        "another operator replica to take the Lease",
        c.env.timeout,
        |l: Option<&Lease>| {
            l.map(holder)
                .is_some_and(|h| !h.is_empty() && !h.contains(leader_pod.as_str()))
        },
    )
    .await;
    log(format!("new leader: {}", holder(&taken)));
    // The new leader carries on: a spec change is reconciled into the Deployment and rolled out.
    let patch = json!({"spec": {"lockServer": {"replicas": 3}}});
    c.lsvcs
        .patch(lsvc, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap_or_else(|e| panic!("scale lsvc/{lsvc}: {e}"));
    wait_until(
        &c.deployments,
        &format!("{lsvc}-lock-server"),
        "the new leader to scale lock-server to 3 ready replicas",
        c.env.timeout,
        |d: Option<&Deployment>| d.and_then(|d| d.status.as_ref()?.ready_replicas) == Some(3),
    )
    .await;
    c.lsvc_ready(lsvc).await;
}

/// Step 10: Both operator actions, one annotation each, executed by the operator in the cluster: a
/// pinned force-revoke of a lock held through lock-server's API, then a restore fast-forward (gate
/// -> read Job over the paydb -> advance Job -> resume), after which payouts flow again.
async fn actions(c: &Cluster, pay: &Payments) {
    let lsvc = c.env.lsvc.as_str();
    let pstack = c.env.pstack.as_str();
    let (fwd, locks) = c.lock_api(lsvc).await;
    let held = tokio::task::block_in_place(|| locks.acquire("kind-stuck-worker", "kind:stuck", 600_000));
    log(format!(
        "revoke: kind:stuck is held with token {}; requesting its revoke",
        held.token
    ));
    let revoke = RevokeRequest {
        id: "kind-r-1".into(),
        key: "kind:stuck".into(),
        reason: "kind tier".into(),
        requested_by: "e2e".into(),
    };
    c.annotate(
        ANNOTATION_REVOKE,
        serde_json::to_string(&revoke).expect("a revoke request serializes"),
    )
    .await;
    let revoked = c.finished("kind-r-1").await;
    log(format!(
        "revoke: {}",
        serde_json::to_string(&revoked).unwrap_or_default()
    ));
    assert!(
        revoked.phase == dlock_operator::crd::status::ActionPhase::Succeeded
            && revoked.outcome.as_deref() == Some("REVOKED")
            && revoked.previous_token == Some(held.token)
            && revoked.target_token == Some(held.token),
        "revoke kind-r-1 did not revoke token {}",
        held.token
    );
    let state = tokio::task::block_in_place(|| locks.get("kind:stuck"))["state"].clone();
    assert_eq!(state, "FREE", "kind:stuck is {state} after the revoke");

    log("restore: requesting a fast-forward");
    let restore = RestoreRequest {
        id: "kind-ff-1".into(),
        margin: Some(100),
    };
    c.annotate(
        ANNOTATION_RESTORE,
        serde_json::to_string(&restore).expect("a restore request serializes"),
    )
    .await;
    let restored = c.finished("kind-ff-1").await;
    let stacks: Vec<Value> = restored
        .stacks
        .iter()
        .map(|s| json!({"name": s.name, "highest": s.highest}))
        .collect();
    log(format!(
        "restore: {}",
        json!({"phase": restored.phase, "sequenceBefore": restored.sequence_before,
               "targetSequence": restored.target_sequence, "sequenceAfter": restored.sequence_after,
               "stacks": stacks})
    ));
    let high_water = restored.stacks.iter().map(|s| s.highest).max();
    let past_high_water = match (restored.target_sequence, restored.sequence_after) {
        (Some(target), Some(after)) => after >= target && high_water.is_none_or(|h| target > h),
        _ => false,
    };
    assert!(
        restored.phase == dlock_operator::crd::status::ActionPhase::Succeeded && past_high_water,
        "restore kind-ff-1 did not move the sequence past the high-water"
    );
    drop(fwd);
    c.rolled_out(&format!("{lsvc}-lock-server")).await;
    let lsvc = c.lsvc_ready(lsvc).await;
    let gate = lsvc.status.as_ref().and_then(|s| s.gate.as_ref());
    assert!(gate.is_none(), "the gate is still closed: {gate:?}");

    // Lock traffic resumed: a third batch is paid in full, with the same checks.
    let run3 = run_name("c");
    pay.create_batch(&run3, 1, c.env.payouts).await;
    pay.await_posted(&run3, c.env.payouts, c.env.timeout).await;
    pay.check_batch(&run3).await.unwrap_or_else(|e| panic!("{e}"));
    let stack = c.pstacks.get(pstack).await.expect("get the PaymentStack");
    let pactions = stack.status.map(|s| s.actions).unwrap_or_default();
    assert!(
        pactions.is_empty(),
        "pstack/{pstack} reports actions nobody requested: {pactions:?}"
    );
}

// ---- plugin: `kubectl dlock locks` with no kubectl on PATH --------------------------------------

/// Step 10b, plugin: `kubectl-dlock locks` without `--lock-server-url`, run as kubectl runs a plugin
/// but with a PATH that holds no kubectl: the plugin port-forwards through the API server itself
/// (pods/portforward over a WebSocket, to a Ready lock-server pod) and reads lock-server over HTTPS,
/// verified against the namespace's CA for the Service's name. A key held for the check is listed,
/// with its token, in `-o json`.
async fn plugin_without_kubectl(c: &Cluster) {
    let lsvc = c.env.lsvc.as_str();
    let (fwd, locks) = c.lock_api(lsvc).await;
    let held =
        tokio::task::block_in_place(|| locks.acquire("kind-plugin-check", "kind:plugin-check", 600_000));
    // run.sh builds only this test; the plugin is built here, and run from where cargo says it is.
    let manifest = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let built = tokio::process::Command::new(cargo)
        .args([
            "build",
            "-q",
            "-p",
            "kubectl-dlock",
            "--message-format=json",
            "--manifest-path",
        ])
        .arg(&manifest)
        .stderr(std::process::Stdio::inherit())
        .output()
        .await
        .unwrap_or_else(|e| panic!("cargo build -p kubectl-dlock: {e}"));
    assert!(
        built.status.success(),
        "cargo build -p kubectl-dlock: {}",
        built.status
    );
    let plugin = String::from_utf8_lossy(&built.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == "kubectl-dlock")
        .find_map(|m| m["executable"].as_str().map(std::path::PathBuf::from))
        .expect("cargo names the kubectl-dlock executable it built");
    let scratch = dlock_e2e::env::Scratch::new("path-without-kubectl");
    assert!(!scratch.path().join("kubectl").exists());
    let out = tokio::process::Command::new(&plugin)
        .args([
            "-n",
            &c.env.ns,
            "locks",
            lsvc,
            "--prefix",
            "kind:plugin-",
            "-o",
            "json",
        ])
        .env_clear()
        .env("KUBECONFIG", &c.env.kubeconfig)
        .env("PATH", scratch.path())
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(c.env.timeout, out)
        .await
        .unwrap_or_else(|_| panic!("kubectl-dlock locks did not end within {:?}", c.env.timeout))
        .unwrap_or_else(|e| panic!("run {}: {e}", plugin.display()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    log(format!("plugin: kubectl-dlock locks -o json: {}", stdout.trim()));
    assert!(
        out.status.success(),
        "kubectl-dlock locks without kubectl on PATH failed ({}):\n{stderr}\n{stdout}",
        out.status
    );
    let doc: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    let items = doc["items"].as_array().cloned().unwrap_or_default();
    assert_eq!(items.len(), 1, "one key under kind:plugin-: {doc}");
    assert_eq!(items[0]["lockKey"], "kind:plugin-check", "{doc}");
    assert_eq!(items[0]["ownerId"], "kind-plugin-check", "{doc}");
    assert_eq!(items[0]["fencingToken"], held.token, "{doc}");
    tokio::task::block_in_place(|| locks.release(&held));
    drop(fwd);
}
// ---- end of plugin -----------------------------------------------------------------------------

/// `mod_revision` of lock-server's grant key of `lock_key` (0 when absent) and the cluster's revision,
/// from etcd's own JSON gateway.
async fn etcd_key(http: &reqwest::Client, etcd: &Forward, lock_key: &str) -> (i64, i64) {
    let key = base64::engine::general_purpose::STANDARD.encode(format!("/dlock/l/{lock_key}"));
    let body: Value = http
        .post(etcd.url("/v3/kv/range"))
        .json(&json!({"key": key}))
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .unwrap_or_else(|e| panic!("read {lock_key} from etcd: {e}"))
        .json()
        .await
        .unwrap_or_else(|e| panic!("read {lock_key} from etcd: {e}"));
    // etcd's gateway writes 64-bit numbers as strings.
    let number = |v: &Value| v.as_str().and_then(|s| s.parse().ok()).or_else(|| v.as_i64());
    let m = number(&body["kvs"][0]["mod_revision"]).unwrap_or(0);
    let rev = number(&body["header"]["revision"]).unwrap_or_else(|| panic!("no revision in {body}"));
    (m, rev)
}

/// Step 11: Backend etcd, from CR to grant: the operator ran three members and lock-server on them; a
/// grant's token is the etcd revision of its key (read back from etcd's own API through the client
/// Service), and a second grant's is strictly greater.
async fn etcd(c: &Cluster) {
    let elsvc = c.env.elsvc.as_str();
    c.lsvc_ready(elsvc).await;
    let sts: Api<StatefulSet> = Api::namespaced(c.client.clone(), &c.env.ns);
    wait_until(
        &sts,
        &format!("{elsvc}-etcd"),
        &format!("sts/{elsvc}-etcd to roll out"),
        c.env.timeout,
        statefulset_rolled_out,
    )
    .await;
    c.rolled_out(&format!("{elsvc}-lock-server")).await;
    let etcd_lsvc = c.lsvcs.get(elsvc).await.expect("get the etcd LockService");
    // How long the etcd LockService took from creation to Ready: it comes up alongside the stack,
    // so most of it is hidden behind the stack step.
    let status = etcd_lsvc.status.clone().unwrap_or_default();
    if let (Some(ready), Some(created)) = (status.condition("Ready"), &etcd_lsvc.metadata.creation_timestamp)
    {
        log(format!(
            "lsvc/{elsvc} was Ready {}s after its creation",
            ready.last_transition_time.0.as_second() - created.0.as_second()
        ));
    }
    let summary = json!({"phase": status.phase, "etcd": status.etcd, "migration": status.migration});
    log(format!("etcd LockService: {summary}"));
    assert!(
        status.phase == Phase::Ready
            && status.etcd.as_ref().is_some_and(|e| e.ready == "3/3")
            && status.migration.is_none(),
        "lsvc/{elsvc} is not Ready on 3/3 etcd members without a migration: {summary}"
    );
    let jobs: Api<Job> = Api::namespaced(c.client.clone(), &c.env.ns);
    let elsvc_jobs = jobs
        .list(&ListParams::default().labels(&format!("app.kubernetes.io/instance={elsvc}")))
        .await
        .expect("list Jobs");
    assert!(elsvc_jobs.items.is_empty(), "an etcd LockService ran a Job");

    let (_ls, locks) = c.lock_api(elsvc).await;
    // The managed etcd serves its clients HTTPS with the operator's certificate for its members
    // and its client Service: read through the forward, verified against the namespace's CA.
    let etcd_fwd = forward_tls(&c.env, &format!("{elsvc}-etcd-client"), 2379).await;
    let http = dlock_e2e::kind::api_client(&c.client, &c.env.ns).await;
    let owner = "kind-etcd-worker";
    let (_, session) = tokio::task::block_in_place(|| {
        locks.call(
            "POST",
            "/v1/sessions",
            Some(&json!({"ownerId": owner, "ttlMs": 60_000})),
            &[],
        )
    });
    let session_id = session["sessionId"].as_str().unwrap_or_default().to_owned();
    assert!(
        session_id.len() == 36 && session_id.chars().all(|ch| ch.is_ascii_hexdigit() || ch == '-'),
        "no session from lock-server on etcd: {session}"
    );
    let mut grants: Vec<Grant> = Vec::new();
    for key in ["kind:etcd:a", "kind:etcd:b"] {
        let (_, g) = tokio::task::block_in_place(|| {
            locks.call(
                "POST",
                &format!("/v1/locks/{key}/acquire"),
                Some(&json!({"sessionId": session_id, "ownerId": owner, "ttlMs": 60_000})),
                &[],
            )
        });
        let token = g["fencingToken"]
            .as_i64()
            .unwrap_or_else(|| panic!("no grant of {key} on etcd: {g}"));
        let (m, rev) = etcd_key(&http, &etcd_fwd, key).await;
        log(format!(
            "etcd: {key} granted with token {token}; etcd has the key at mod_revision {m} (cluster revision {rev})"
        ));
        assert!(
            m == token && rev >= token,
            "the token of {key} ({token}) is not the etcd revision of its key: mod {m}, rev {rev}"
        );
        grants.push(Grant {
            key: key.to_owned(),
            owner: owner.to_owned(),
            session: session_id.clone(),
            token,
        });
    }
    let tokens: Vec<i64> = grants.iter().map(|g| g.token).collect();
    assert!(
        tokens[1] > tokens[0],
        "etcd tokens not strictly increasing: {tokens:?}"
    );
    // Released by its token, the key is gone from etcd (the grant was really there, nowhere else).
    tokio::task::block_in_place(|| locks.release(&grants[1]));
    let (m, _) = etcd_key(&http, &etcd_fwd, "kind:etcd:b").await;
    assert_eq!(m, 0, "kind:etcd:b is still in etcd after its release");
    log(format!(
        "etcd: tokens {tokens:?} are etcd revisions, strictly increasing; the release removed the key"
    ));
}

/// One acquire, its failure returned rather than asserted (a failover is under way).
fn try_acquire(locks: &LockApi, session: &str, owner: &str, key: &str) -> Result<Grant, String> {
    let (status, body) = locks.call(
        "POST",
        &format!("/v1/locks/{key}/acquire"),
        Some(&json!({"sessionId": session, "ownerId": owner, "ttlMs": 600_000})),
        &[],
    );
    match (status, body["fencingToken"].as_i64()) {
        (200, Some(token)) => Ok(Grant {
            key: key.to_owned(),
            owner: owner.to_owned(),
            session: session.to_owned(),
            token,
        }),
        _ => Err(format!("{status}: {body}")),
    }
}

/// The LockService and the PaymentStack of step 11b: lockdb and paydb on CloudNativePG, each a
/// primary and one synchronous standby.
const HA_LSVC: &str = "ha-locks";
const HA_PSTACK: &str = "ha-payments";

/// `database.managed` of the step's two objects: two instances, synchronous or not.
fn ha_database(synchronous: bool) -> Value {
    let image =
        std::env::var("DLOCK_KIND_CNPG_PG_IMAGE").unwrap_or_else(|_| "dlock-local/postgres:16.15".to_owned());
    let mut managed =
        json!({"engine": "CloudNativePG", "instances": 2, "storageSize": "1Gi", "image": image});
    if synchronous {
        managed["synchronous"] = json!({"number": 1, "dataDurability": "Required"});
    }
    json!({"managed": managed})
}

async fn apply_ha_lsvc(c: &Cluster, synchronous: bool) {
    let ls: LockService = serde_json::from_value(json!({
        "apiVersion": "dlock.dev/v1alpha1", "kind": "LockService",
        "metadata": {"name": HA_LSVC, "namespace": c.env.ns},
        "spec": {"backend": "postgres", "database": ha_database(synchronous),
                 "lockServer": {"replicas": 1, "clientsSecretRef": {"name": dlock_e2e::lockapi::TEST_CLIENTS_SECRET}}},
    }))
    .expect("a LockService");
    c.lsvcs
        .patch(
            HA_LSVC,
            &PatchParams::apply("kind-tier").force(),
            &Patch::Apply(&ls),
        )
        .await
        .expect("apply the HA LockService");
}

/// Lock grants taken by the step itself, one session, every token kept in the order granted.
struct Grants {
    locks: LockApi,
    session: String,
    owner: &'static str,
    /// Keys are `PREFIX:N`: each session's own, so none waits on another's.
    prefix: &'static str,
    n: u32,
}

impl Grants {
    fn open(locks: LockApi, prefix: &'static str) -> Self {
        let owner = "kind-ha-worker";
        let (st, session) = tokio::task::block_in_place(|| {
            locks.call(
                "POST",
                "/v1/sessions",
                Some(&json!({"ownerId": owner, "ttlMs": 600_000})),
                &[],
            )
        });
        assert_eq!(st, 201, "session: {session}");
        Grants {
            locks,
            session: session["sessionId"].as_str().unwrap_or_default().to_owned(),
            owner,
            prefix,
            n: 0,
        }
    }

    fn try_one(&mut self) -> Result<i64, String> {
        self.n += 1;
        let key = format!("{}:{}", self.prefix, self.n);
        tokio::task::block_in_place(|| try_acquire(&self.locks, &self.session, self.owner, &key))
            .map(|g| g.token)
    }

    fn take(&mut self, count: u32) -> Vec<i64> {
        (0..count)
            .map(|_| self.try_one().unwrap_or_else(|e| panic!("grant {}: {e}", self.n)))
            .collect()
    }

    /// Acquires on, through a change of lockdb's primary, until a grant lands on a timeline above
    /// `timeline` (lock-server's last jump says which): the tokens granted meanwhile (the dying
    /// primary may grant for a moment: its container outlives the pod object), and that jump.
    async fn across(&mut self, timeline: i64, timeout: std::time::Duration) -> (Vec<i64>, SequenceJump) {
        let mut tokens = Vec::new();
        let jump = poll(
            "a grant on the promoted standby's timeline",
            timeout,
            async || {
                tokens.push(self.try_one()?);
                let jump = tokio::task::block_in_place(|| self.locks.last_jump());
                if jump.timeline > timeline {
                    Ok(jump)
                } else {
                    Err(format!("granted, still on timeline {}", jump.timeline))
                }
            },
        )
        .await;
        (tokens, jump)
    }
}

/// Which database an event of step 11b hits, and how.
#[derive(Clone, Copy, PartialEq)]
enum Db {
    Lockdb,
    Paydb,
}

#[derive(Clone, Copy, PartialEq)]
enum Move {
    /// The primary's pod deleted without grace, as a node lost.
    Kill,
    /// A planned switchover to the standby.
    Switchover,
}

/// The step's state across its four events.
struct Ha<'a> {
    c: &'a Cluster,
    cnpg: Cnpg,
    grants: Grants,
    /// Every token the step was granted, in order.
    tokens: Vec<i64>,
    events: Vec<ha::Event>,
    /// Per event: (what, time without grants or postings as the holders saw it, seconds until the
    /// operator recorded it).
    measured: Vec<String>,
}

impl Ha<'_> {
    fn owner(db: Db) -> (&'static str, String, &'static str) {
        match db {
            Db::Lockdb => (HA_LSVC, format!("{HA_LSVC}-lockdb"), "lockdb"),
            Db::Paydb => (HA_PSTACK, format!("{HA_PSTACK}-paydb"), "paydb"),
        }
    }

    /// `status.database` of the LockService or PaymentStack that owns `db`, once `ok` holds of it.
    async fn database_until(
        &self,
        db: Db,
        what: &str,
        ok: impl Fn(&dlock_operator::crd::status::DatabaseStatus) -> bool,
    ) -> dlock_operator::crd::status::DatabaseStatus {
        let (owner, _, _) = Self::owner(db);
        let found = |s: Option<&dlock_operator::crd::status::DlockStatus>| {
            s.and_then(|s| s.database.clone()).filter(|d| ok(d))
        };
        let status = match db {
            Db::Lockdb => {
                wait_until(
                    &self.c.lsvcs,
                    owner,
                    what,
                    self.c.env.timeout,
                    |o: Option<&LockService>| found(o.and_then(|l| l.status.as_ref())).is_some(),
                )
                .await
                .status
            }
            Db::Paydb => {
                wait_until(
                    &self.c.pstacks,
                    owner,
                    what,
                    self.c.env.timeout,
                    |o: Option<&PaymentStack>| found(o.and_then(|p| p.status.as_ref())).is_some(),
                )
                .await
                .status
            }
        };
        found(status.as_ref()).expect("the status it was awaited in")
    }

    /// One event: `mv` on `db`'s primary while payouts flow and the step keeps taking grants.
    async fn event(&mut self, db: Db, mv: Move) {
        let (owner, cluster, _) = Self::owner(db);
        let kind = if mv == Move::Kill {
            "Failover"
        } else {
            "Switchover"
        };
        let what = format!(
            "{} of {cluster}",
            if mv == Move::Kill {
                "the primary's kill"
            } else {
                "a switchover"
            }
        );
        // Both instances ready first: the synchronous standby is the one promoted, and commits
        // wait while it is missing.
        let ready = self
            .database_until(db, &format!("{cluster} 2/2 ready before {what}"), |d| {
                d.ready == "2/2"
            })
            .await;
        let old = ready.primary.clone().expect("a primary");
        let timeline = ready.timeline.unwrap_or(1);
        let lock_timeline = tokio::task::block_in_place(|| self.grants.locks.last_jump()).timeline;
        self.tokens.extend(self.grants.take(5));
        let at = chrono::Utc::now();
        let started = std::time::Instant::now();
        match mv {
            Move::Kill => {
                log(format!("{what}: deleting pod {old} without grace"));
                self.c
                    .pods
                    .delete(&old, &DeleteParams::default().grace_period(0))
                    .await
                    .unwrap_or_else(|e| panic!("delete pod {old}: {e}"));
            }
            Move::Switchover => {
                let to = self.cnpg.standby(&cluster).await;
                log(format!(
                    "{what}: {old} to {to}, as `kubectl cnpg promote {cluster} {to}` asks"
                ));
                self.cnpg.switchover(&cluster, &to).await;
            }
        }
        let over = match db {
            // lock-server's next connection finds the new timeline and jumps before it grants.
            Db::Lockdb => {
                let (tokens, jump) = self.grants.across(lock_timeline, self.c.env.timeout).await;
                let first = *tokens.last().expect("the grant the poll ended on");
                assert_eq!(jump.cause, JumpCause::NewTimeline, "{jump:?}");
                assert!(
                    first > jump.jumped_to,
                    "the first grant on the new timeline ({first}) is not above the jump ({})",
                    jump.jumped_to
                );
                self.measured.push(format!(
                    "{what}: {} grants on the dying primary, first grant on timeline {} {:.1}s after it (jump found {}, set {})",
                    tokens.len() - 1,
                    jump.timeline,
                    started.elapsed().as_secs_f64(),
                    jump.found,
                    jump.jumped_to
                ));
                self.tokens.extend(tokens);
                chrono::Utc::now()
            }
            // Tokens do not come from paydb: the holders are over it once its new primary serves.
            Db::Paydb => {
                self.database_until(db, &format!("{cluster}'s new primary"), |d| {
                    d.primary.as_deref().is_some_and(|p| p != old) && d.ready != "0/2"
                })
                .await;
                chrono::Utc::now()
            }
        };
        // The operator's record: the change, on a later timeline, and its Event.
        let recorded = self
            .database_until(
                db,
                &format!("status.database of {owner} to record the {kind}"),
                |d| {
                    d.last_primary_change.as_ref().is_some_and(|ch| {
                        ch.kind == kind && ch.from == old && ch.timeline.is_some_and(|t| t > timeline)
                    })
                },
            )
            .await;
        let recorded_after = started.elapsed().as_secs_f64();
        self.event_published(owner, &format!("Database{kind}"), at).await;
        log(format!(
            "{what}: recorded {recorded_after:.0}s after it: {}",
            json!(recorded)
        ));
        self.measured.push(format!(
            "{what}: the {kind} recorded in status {recorded_after:.0}s after it"
        ));
        self.events.push(ha::Event { what, at, over });
        self.tokens.extend(self.grants.take(5));
    }

    /// Waits for the Event `reason` about `owner`, published at or after `at`.
    async fn event_published(&self, owner: &str, reason: &str, at: chrono::DateTime<chrono::Utc>) {
        let events: Api<k8s_openapi::api::events::v1::Event> =
            Api::namespaced(self.c.client.clone(), &self.c.env.ns);
        poll(
            &format!("the {reason} Event of {owner}"),
            self.c.env.timeout,
            async || {
                let list = events
                    .list(&ListParams::default())
                    .await
                    .map_err(|e| e.to_string())?;
                list.items
                    .iter()
                    .find(|e| {
                        let when = e
                            .series
                            .as_ref()
                            .map(|s| s.last_observed_time.0)
                            .or(e.event_time.as_ref().map(|t| t.0))
                            .or(e.deprecated_last_timestamp.as_ref().map(|t| t.0));
                        e.reason.as_deref() == Some(reason)
                            && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(owner)
                            && when.is_some_and(|w| w.as_second() >= at.timestamp())
                    })
                    .map(|e| log(format!("Event {reason}: {}", e.note.clone().unwrap_or_default())))
                    .ok_or_else(|| "not yet".to_owned())
            },
        )
        .await;
    }
}

/// Step 11b: lockdb and paydb highly available on CloudNativePG (installed by run.sh), failed over
/// and switched over in real pods while payouts flow. The operator writes both Clusters (two
/// instances, synchronous `any 1`, `required`); their status shows the primary, 2/2 ready and
/// timeline 1. Payouts are created at a steady pace through payment-resource while, in turn, the
/// lockdb primary's pod is killed, the paydb primary's pod is killed, and each database is switched
/// over to its standby. At each lockdb event lock-server's next connection finds the new timeline
/// and jumps the sequence before it grants again; each event is recorded by the operator in status
/// with its Event. Checked from the record at the end: every payout POSTED once (the ledger and the
/// rail's ground truth), the fences each account accepted strictly increasing across every event,
/// every token the step was granted above the one before it; the time without grants and without
/// postings is measured and printed. Then the negative control ([`ha_negative_control`]).
async fn ha(c: &Cluster) {
    let paydb_cluster = format!("{HA_PSTACK}-paydb");
    // A cluster kept from an earlier run (DLOCK_KIND_KEEP=1) may still hold the step's objects.
    if c.pstacks.get_opt(HA_PSTACK).await.ok().flatten().is_some() {
        delete_and_wait(&c.pstacks, HA_PSTACK, c.env.timeout).await;
    }
    if c.lsvcs.get_opt(HA_LSVC).await.ok().flatten().is_some() {
        delete_and_wait(&c.lsvcs, HA_LSVC, c.env.timeout).await;
    }
    apply_ha_lsvc(c, true).await;
    let ps: PaymentStack = serde_json::from_value(json!({
        "apiVersion": "dlock.dev/v1alpha1", "kind": "PaymentStack",
        "metadata": {"name": HA_PSTACK, "namespace": c.env.ns},
        "spec": {
            "lockServiceRef": {"name": HA_LSVC},
            "demoData": true,
            "database": ha_database(true),
            "payoutExecutor": {"replicas": 2, "workers": 2},
            "railStub": {"enabled": true, "mode": "ack", "image": c.env.image},
        }
    }))
    .expect("a PaymentStack");
    c.pstacks
        .patch(
            HA_PSTACK,
            &PatchParams::apply("kind-tier").force(),
            &Patch::Apply(&ps),
        )
        .await
        .expect("apply the HA PaymentStack");
    let created = std::time::Instant::now();
    let ready = c.lsvc_ready(HA_LSVC).await;
    log(format!(
        "lsvc/{HA_LSVC} Ready in {}s on CloudNativePG: {}",
        created.elapsed().as_secs(),
        json!(ready.status.as_ref().and_then(|s| s.database.as_ref()))
    ));
    let pstack = wait_until(
        &c.pstacks,
        HA_PSTACK,
        &format!("paymentstack/{HA_PSTACK} to be Ready"),
        c.env.timeout,
        |o: Option<&PaymentStack>| o.and_then(|p| p.status.as_ref()).is_some_and(|s| s.is_ready()),
    )
    .await;
    log(format!(
        "paymentstack/{HA_PSTACK} Ready in {}s on CloudNativePG: {}",
        created.elapsed().as_secs(),
        json!(pstack.status.as_ref().and_then(|s| s.database.as_ref()))
    ));
    for (status, cluster) in [
        (ready.status, format!("{HA_LSVC}-lockdb")),
        (pstack.status, paydb_cluster.clone()),
    ] {
        let db = status
            .and_then(|s| s.database)
            .expect("status.database of a CloudNativePG database");
        assert_eq!(db.cluster, cluster);
        assert!(db.primary.is_some(), "{db:?}");
        assert_eq!(
            (db.ready.as_str(), db.synchronous.as_str(), db.timeline),
            ("2/2", "any 1 (required)", Some(1)),
            "{db:?}"
        );
    }
    c.rolled_out(&format!("{HA_LSVC}-lock-server")).await;
    c.rolled_out(&format!("{HA_PSTACK}-payout-executor")).await;

    let (_fwd, locks) = c.lock_api(HA_LSVC).await;
    let mut grants = Grants::open(locks, "kind:ha");
    let tokens = grants.take(20);
    let pay = std::sync::Arc::new(Payments::connect_cnpg(&c.env, &c.client, HA_PSTACK, &paydb_cluster).await);
    let run = run_name("ha");
    let started = chrono::Utc::now();
    let producer = ha::Producer::start(pay.clone(), run.clone(), std::time::Duration::from_millis(200));
    poll(
        &format!("the first payouts of {run} posted"),
        c.env.timeout,
        async || {
            let n = pay.counts(&run).await?;
            if n.posted >= 5 { Ok(()) } else { Err(n.to_string()) }
        },
    )
    .await;

    let mut h = Ha {
        c,
        cnpg: Cnpg::new(&c.env, &c.client),
        grants,
        tokens,
        events: Vec::new(),
        measured: Vec::new(),
    };
    h.event(Db::Lockdb, Move::Kill).await;
    h.event(Db::Paydb, Move::Kill).await;
    h.event(Db::Lockdb, Move::Switchover).await;
    h.event(Db::Paydb, Move::Switchover).await;
    let created_n = producer.stop().await;
    let ended = chrono::Utc::now();
    log(format!("{created_n} payouts created through the four events"));

    // The record. paydb's forward reached its first primary: a new one reaches the current.
    drop(pay);
    let pay = Payments::connect_cnpg(&c.env, &c.client, HA_PSTACK, &paydb_cluster).await;
    pay.await_posted(&run, created_n, c.env.timeout).await;
    pay.check_batch(&run).await.unwrap_or_else(|e| panic!("{e}"));
    ha::tokens_increase(&h.tokens, &[]).unwrap_or_else(|e| panic!("the step's grants: {e}"));
    let fenced = ha::fences(&pay, &run).await.unwrap_or_else(|e| panic!("{e}"));
    let across = ha::fences_across(&fenced, &h.events).unwrap_or_else(|e| panic!("{e}"));
    log(format!("{run}: {across}"));
    let postings: Vec<chrono::DateTime<chrono::Utc>> = fenced.iter().map(|f| f.at).collect();
    let mut edges: Vec<_> = h.events.iter().map(|e| e.at).collect();
    edges.push(ended);
    for (e, next) in h.events.iter().zip(edges.iter().skip(1)) {
        h.measured.push(format!(
            "{}: the longest time without a posting from it to the next event {:.1}s (holders over it {:.1}s after it)",
            e.what,
            ha::longest_pause(&postings, e.at, *next).as_secs_f64(),
            (e.over - e.at).to_std().unwrap_or_default().as_secs_f64()
        ));
    }
    log(format!(
        "measured, {} payouts from {} to {}:\n  {}",
        created_n,
        started.format("%H:%M:%S"),
        ended.format("%H:%M:%S"),
        h.measured.join("\n  ")
    ));

    delete_and_wait(&c.pstacks, HA_PSTACK, c.env.timeout).await;
    ha_negative_control(c, &h.cnpg).await;
    delete_and_wait(&c.lsvcs, HA_LSVC, c.env.timeout).await;
    // The garbage collector removes the children after their owner: the step ends with their pods
    // gone, as run.sh's last check finds every remaining pod Running.
    for selector in [
        format!("{LABEL_INSTANCE} in ({HA_LSVC},{HA_PSTACK})"),
        format!("cnpg.io/cluster in ({HA_LSVC}-lockdb,{paydb_cluster})"),
    ] {
        let lp = ListParams::default().labels(&selector);
        poll(
            &format!("the pods of {selector} to be gone"),
            c.env.timeout,
            async || {
                let left = c.pods.list(&lp).await.map_err(|e| e.to_string())?.items.len();
                if left == 0 {
                    Ok(())
                } else {
                    Err(format!("{left} left"))
                }
            },
        )
        .await;
    }
}

/// Step 11b's negative control, in the same shape: lockdb's replication made asynchronous, its
/// standby held behind the primary (the replication role refused, as a lagging link would leave
/// it), lock-server's jump switched off (its negative-control flag, set on the Deployment beside
/// the operator's fields), grants on the primary alone, the primary killed: the promoted standby
/// hands out tokens again, and the check of the step ([`ha::tokens_increase`]) must fail.
async fn ha_negative_control(c: &Cluster, cnpg: &Cnpg) {
    let cluster = format!("{HA_LSVC}-lockdb");
    apply_ha_lsvc(c, false).await;
    let primary = cnpg.primary(&cluster).await;
    poll(
        &format!("{primary} to replicate asynchronously"),
        c.env.timeout,
        async || {
            let names = cnpg
                .psql(&primary, "lockdb", "SHOW synchronous_standby_names")
                .await?;
            if names.is_empty() {
                Ok(())
            } else {
                Err(format!("synchronous_standby_names = {names}"))
            }
        },
    )
    .await;
    let deployment = format!("{HA_LSVC}-lock-server");
    let unsafe_env = json!({"spec": {"template": {"spec": {"containers": [
        {"name": LOCK_SERVER, "env": [{"name": "DLOCK_UNSAFE_NO_SEQUENCE_JUMP", "value": "true"}]}
    ]}}}});
    c.deployments
        .patch(
            &deployment,
            &PatchParams::default(),
            &Patch::Strategic(&unsafe_env),
        )
        .await
        .expect("switch lock-server's jump off");
    c.rolled_out(&deployment).await;
    let (_fwd, locks) = c.lock_api_of(&deployment).await;
    let view = tokio::task::block_in_place(|| locks.sequence());
    assert!(!view.jumps_enabled, "lock-server still jumps: {view:?}");
    let mut grants = Grants::open(locks, "kind:ha:control");
    let mut before = grants.take(5);
    cnpg.hold_standby_behind(&cluster, "lockdb").await;
    // More grants than the 32 sequence values a WAL record covers, on the primary alone.
    before.extend(grants.take(100));
    let lag = cnpg
        .lag_bytes(&cluster, "lockdb")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    log(format!(
        "negative control: standby held {lag} bytes of WAL behind; {} grants, highest token {}; killing {primary}",
        before.len(),
        before.last().copied().unwrap_or_default()
    ));
    assert!(lag > 0, "the standby is not behind");
    c.pods
        .delete(&primary, &DeleteParams::default().grace_period(0))
        .await
        .unwrap_or_else(|e| panic!("delete pod {primary}: {e}"));
    poll("the standby's promotion", c.env.timeout, async || {
        let now = cnpg.status(&cluster).await;
        match now["currentPrimary"].as_str() {
            Some(p) if p != primary => Ok(()),
            _ => Err(format!("the primary is still {primary}")),
        }
    })
    .await;
    // The killed primary shuts down smartly: for a while it goes on serving the connections
    // lock-server already holds, and a grant there continues its own history (it happened once,
    // and the control could not fail). Grants on connections opened after the promotion — a
    // restarted lock-server's, through the -rw Service — come from the promoted standby.
    drop((grants, _fwd));
    let restarted = json!({"spec": {"template": {"metadata": {"annotations": {
        "dlock.dev/restarted-at": chrono::Utc::now().to_rfc3339()
    }}}}});
    c.deployments
        .patch(
            &deployment,
            &PatchParams::default(),
            &Patch::Strategic(&restarted),
        )
        .await
        .expect("restart lock-server");
    c.rolled_out(&deployment).await;
    let (_fwd, locks) = c.lock_api_of(&deployment).await;
    let mut grants = Grants::open(locks, "kind:ha:after");
    let after = poll("a grant on the promoted standby", c.env.timeout, async || {
        grants.try_one()
    })
    .await;
    let after = [after, grants.take(1)[0]];
    match ha::tokens_increase(&before, &after) {
        Err(e) => log(format!("negative control: the check fails as it must: {e}")),
        Ok(()) => panic!(
            "negative control: tokens {after:?} after an asynchronous failover without the jump are above every \
             token before it (highest {:?}): the standby was not behind, or the check cannot fail",
            before.last()
        ),
    }
}

/// Deletes `name` and waits until it is gone (its children, the Clusters and their volumes, go with
/// it by owner reference).
async fn delete_and_wait<K>(api: &Api<K>, name: &str, timeout: std::time::Duration)
where
    K: Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + kube::Resource<DynamicType = ()>
        + Send
        + 'static,
{
    let uid = api
        .get(name)
        .await
        .unwrap_or_else(|e| panic!("get {name}: {e}"))
        .meta()
        .uid
        .clone()
        .unwrap_or_default();
    api.delete(name, &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("delete {name}: {e}"));
    let gone = kube::runtime::wait::await_condition(
        api.clone(),
        name,
        kube::runtime::wait::conditions::is_deleted(&uid),
    );
    match tokio::time::timeout(timeout, gone).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => panic!("watching {name} go: {e}"),
        Err(_) => panic!("{name} still there {}s after its deletion", timeout.as_secs()),
    }
}

/// The Services the NetworkPolicies guard, the connections expected of each source, and where the
/// negative control looks.
const POLICED: [&str; 4] = ["payment-resource", "rail-proxy", "rail-stub", "lock-server"];

/// Step 12: The NetworkPolicies as packet filters. kube-router (e2e/kind/kube-router.yaml) enforces
/// them in this cluster; each connection below is opened from inside a pod to a Service's cluster IP
/// (as the stack's own calls go) and must be let through or refused as the policies say. A pod
/// without the stack's labels reaches none of the policed Services, while its own network works
/// (paydb, which no policy selects, answers it); the executors reach what they call, not the rail;
/// rail-proxy reaches the rail and nothing of the stack; the operator reaches lock-server (its
/// force-revoke calls) through its own chart policy. Every policed pod is Ready, with no restart:
/// the kubelet's probes pass the filter. Negative control: with the operator stopped (it would put
/// them back) and the stack's policies deleted, the same check fails — the outsider gets through;
/// with the operator back, the policies return and the check passes again.
async fn netpol(c: &Cluster) {
    let env = &c.env;
    let (ns, pstack, lsvc, elsvc) = (
        env.ns.as_str(),
        env.pstack.as_str(),
        env.lsvc.as_str(),
        env.elsvc.as_str(),
    );
    let outsider = netpol::start_outsider(&c.pods, "netpol-outsider", &env.image, env.timeout).await;
    let op_pods: Api<Pod> = Api::namespaced(c.client.clone(), &env.op_ns);
    let operator_pods = &ListParams::default().labels(&format!("{LABEL_NAME}={OPERATOR_POD_NAME}"));
    let source = |label: &str, pods: &Api<Pod>, pod: String| Source {
        label: label.to_owned(),
        pods: pods.clone(),
        pod,
    };
    let operator = |pod: String| source("operator", &op_pods, pod);
    let executor = source(
        "payout-executor",
        &c.pods,
        c.pod_of(pstack, PAYOUT_EXECUTOR).await,
    );
    let rail_proxy = source("rail-proxy", &c.pods, c.pod_of(pstack, RAIL_PROXY).await);
    let etcd_client = source("etcd lock-server", &c.pods, c.pod_of(elsvc, LOCK_SERVER).await);
    let service = |label: &str, name: String, port: u16| Target::service(label, &name, ns, port);
    let [pr, rp, rs, ls] = [
        service(POLICED[0], format!("{pstack}-{PAYMENT_RESOURCE}"), 8080),
        service(POLICED[1], format!("{pstack}-{RAIL_PROXY}"), 8080),
        service(POLICED[2], format!("{pstack}-{RAIL_STUB}"), 8080),
        service(POLICED[3], format!("{lsvc}-{LOCK_SERVER}"), 8080),
    ];
    let etcd = service("etcd", format!("{elsvc}-etcd-client"), 2379);
    let paydb = service("paydb", format!("{pstack}-paydb"), 5432);
    let expect = |from: &Source, to: &Target, allowed: bool| Expect {
        from: from.clone(),
        to: to.clone(),
        allowed,
    };
    let expected = vec![
        expect(&outsider, &pr, false),
        expect(&outsider, &rp, false),
        expect(&outsider, &rs, false),
        expect(&outsider, &ls, false),
        expect(&outsider, &etcd, false),
        expect(&outsider, &paydb, true),
        expect(&executor, &pr, true),
        expect(&executor, &rp, true),
        expect(&executor, &ls, true),
        expect(&executor, &rs, false),
        expect(&rail_proxy, &rs, true),
        expect(&rail_proxy, &pr, false),
        expect(&rail_proxy, &ls, false),
        expect(&etcd_client, &etcd, true),
    ];
    // The operator's pods come and go below: these are tried with whichever runs.
    let with_operator = |operator: Source| {
        let mut all = expected.clone();
        all.extend([
            expect(&operator, &ls, true),
            expect(&operator, &pr, false),
            expect(&operator, &rs, false),
        ]);
        all
    };
    let checked = netpol::check(&with_operator(operator(running_operator(c).await))).await;
    assert!(
        checked.passed(),
        "the NetworkPolicies do not filter as they say:\n{checked}"
    );
    log(format!("every connection as the policies say:{}", checked.table));
    probes_pass(c).await;

    // Negative control. The operator would put deleted policies back at once: stopped first.
    let op_deployments: Api<Deployment> = Api::namespaced(c.client.clone(), &env.op_ns);
    let op_deployment = find_name(
        &op_deployments,
        &ListParams::default().labels(&format!("{LABEL_NAME}={OPERATOR_POD_NAME}")),
        |_: &Deployment| true,
    )
    .await
    .expect("the operator's Deployment");
    let replicas = op_deployments
        .get(&op_deployment)
        .await
        .expect("get the operator's Deployment")
        .spec
        .and_then(|s| s.replicas)
        .unwrap_or(1);
    scale(&op_deployments, &op_deployment, 0).await;
    let op_pods = &op_pods;
    poll("the operator's pods to be gone", env.timeout, async || {
        let left = op_pods.list(operator_pods).await.map_err(|e| e.to_string())?;
        match left.items.len() {
            0 => Ok(()),
            n => Err(format!("{n} left")),
        }
    })
    .await;
    let policies: Api<NetworkPolicy> = Api::namespaced(c.client.clone(), ns);
    let names = policy_names(&policies).await;
    for name in &names {
        policies
            .delete(name, &DeleteParams::default())
            .await
            .unwrap_or_else(|e| panic!("delete NetworkPolicy {name}: {e}"));
    }
    log(format!("operator stopped, NetworkPolicies deleted: {names:?}"));
    // The plugin drops its rules when it sees the deletions; the check must then fail, the outsider
    // getting through to every policed Service.
    let expected = &expected;
    let broken = poll(
        "the same check to fail with the policies deleted (else it does not measure the policies)",
        env.timeout,
        async || {
            let checked = netpol::check(expected).await;
            if POLICED.iter().all(|to| checked.let_through("outsider", to)) {
                Ok(checked)
            } else {
                Err(checked.to_string())
            }
        },
    )
    .await;
    log(format!(
        "negative control: without the policies the check fails as it must:\n{broken}"
    ));
    scale(&op_deployments, &op_deployment, replicas).await;
    wait_until(
        &op_deployments,
        &op_deployment,
        "the operator to be back",
        env.timeout,
        deployment_rolled_out,
    )
    .await;
    let (policies, names) = (&policies, &names);
    poll(
        "the operator to put the NetworkPolicies back",
        env.timeout,
        async || {
            let now = policy_names(policies).await;
            if names.iter().all(|n| now.contains(n)) {
                Ok(())
            } else {
                Err(format!("{now:?}"))
            }
        },
    )
    .await;
    let all = &with_operator(operator(running_operator(c).await));
    let restored = poll(
        "the check to pass again with the policies back",
        env.timeout,
        async || {
            let checked = netpol::check(all).await;
            if checked.passed() {
                Ok(checked)
            } else {
                Err(checked.to_string())
            }
        },
    )
    .await;
    log(format!(
        "policies back, every connection as they say again:{}",
        restored.table
    ));
    netpol::delete_outsider(&outsider).await;
}

/// A running operator pod's name.
async fn running_operator(c: &Cluster) -> String {
    let op_pods: Api<Pod> = Api::namespaced(c.client.clone(), &c.env.op_ns);
    let lp = ListParams::default().labels(&format!("{LABEL_NAME}={OPERATOR_POD_NAME}"));
    find_name(&op_pods, &lp, |p: &Pod| {
        p.metadata.deletion_timestamp.is_none()
            && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
    })
    .await
    .unwrap_or_else(|| panic!("no running operator pod in {}", c.env.op_ns))
}

/// Names of the NetworkPolicies `api` lists.
async fn policy_names(api: &Api<NetworkPolicy>) -> Vec<String> {
    api.list(&ListParams::default())
        .await
        .expect("list NetworkPolicies")
        .items
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect()
}

/// Sets `spec.replicas` of a Deployment.
async fn scale(api: &Api<Deployment>, name: &str, replicas: i32) {
    k8s::patch(api, name, &json!({"spec": {"replicas": replicas}}))
        .await
        .unwrap_or_else(|e| panic!("scale deploy/{name} to {replicas}: {e}"));
}

/// Every pod a NetworkPolicy guards is Ready and has never restarted: the kubelet's readiness and
/// liveness probes get through the filter that refuses the outsider.
async fn probes_pass(c: &Cluster) {
    let env = &c.env;
    let guarded = [
        (env.pstack.as_str(), PAYMENT_RESOURCE),
        (env.pstack.as_str(), RAIL_PROXY),
        (env.pstack.as_str(), RAIL_STUB),
        (env.lsvc.as_str(), LOCK_SERVER),
        (env.elsvc.as_str(), LOCK_SERVER),
        (env.elsvc.as_str(), ETCD),
    ];
    let now = chrono::Utc::now().timestamp();
    let mut youngest = i64::MAX;
    for (instance, component) in guarded {
        let lp = ListParams::default().labels(&format!(
            "{LABEL_INSTANCE}={instance},{LABEL_COMPONENT}={component}"
        ));
        let pods = c.pods.list(&lp).await.expect("list pods").items;
        assert!(!pods.is_empty(), "no {component} pod of {instance}");
        for p in pods.iter().filter(|p| p.metadata.deletion_timestamp.is_none()) {
            let name = p.metadata.name.clone().unwrap_or_default();
            let status = p.status.clone().unwrap_or_default();
            let ready = status
                .conditions
                .iter()
                .flatten()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            let restarts: i32 = status
                .container_statuses
                .iter()
                .flatten()
                .map(|s| s.restart_count)
                .sum();
            assert!(
                ready && restarts == 0,
                "pod {name} (policed) is {}ready with {restarts} restarts: its probes do not pass the filter",
                if ready { "" } else { "not " }
            );
            if let Some(created) = &p.metadata.creation_timestamp {
                youngest = youngest.min(now - created.0.as_second());
            }
        }
    }
    log(format!(
        "every policed pod Ready without a restart (the youngest is {youngest}s old): the probes pass"
    ));
}

/// Step 13: A rolling upgrade under load. `helm upgrade` moves the operator to the upgrade image (a
/// version bump carrying one more, additive, paydb migration: e2e/kind/upgrade/); the stacks use the
/// operator's default image, so each of them follows: a new migration Job per database, then the
/// Deployments. Payouts are created all along (through whichever payment-resource pod is there) and
/// posted by whichever executors are there.
///
/// payment-resource and rail-proxy, the two that use paydb, are held (`spec.paused`, a field the
/// operator does not apply) until their old pods have posted payouts on the new schema — the window
/// every rolling upgrade has, held open long enough to be checked rather than left to chance — and
/// then released. The executors and lock-servers roll freely. Checked: the new migration applied by
/// its Job (its report and paydb's history) before any pod of the new version was created; no pod of
/// the old version restarted, failed or lost Ready while it served; every Deployment on the new image
/// (the rail-stub, standing for the bank, keeps its pinned image and its memory); payouts posted by
/// the new version; and every payout of the run posted once (the checks of step 7).
async fn upgrade(c: &Cluster, pay: &Payments) {
    let env = &c.env;
    let (pstack, lsvc, elsvc) = (env.pstack.as_str(), env.lsvc.as_str(), env.elsvc.as_str());
    let (old, new) = (env.image.as_str(), env.upgrade_image.as_str());
    let jobs: Api<Job> = Api::namespaced(c.client.clone(), &env.ns);
    let fixture = upgrade::fixture_applied(&pay.db)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        fixture, None,
        "paydb has the upgrade's migration before the upgrade"
    );
    let held = [
        format!("{pstack}-{PAYMENT_RESOURCE}"),
        format!("{pstack}-{RAIL_PROXY}"),
    ];
    let rolling: Vec<String> = held
        .iter()
        .cloned()
        .chain([
            format!("{pstack}-{PAYOUT_EXECUTOR}"),
            format!("{lsvc}-{LOCK_SERVER}"),
            format!("{elsvc}-{LOCK_SERVER}"),
        ])
        .collect();
    for d in &rolling {
        let image = template_image(&c.deployments.get(d).await.expect("get a Deployment"));
        assert_eq!(image.as_deref(), Some(old), "deploy/{d} before the upgrade");
    }
    let rail_stub = c.pod_of(pstack, RAIL_STUB).await;
    for d in &held {
        pause(&c.deployments, d, true).await;
    }
    log(format!("held the rollout of {held:?} (spec.paused)"));

    let run = run_name("u");
    let created = AtomicU32::new(0);
    let (stop, stopped) = watch::channel(false);
    let observer = upgrade::watch_old_pods(c.pods.clone(), old.to_owned(), stopped.clone());
    let load = async {
        let mut stopped = stopped.clone();
        let mut i = 0;
        while !*stopped.borrow() {
            i += 1;
            pay.create_payout(&format!("{run}-{i}"), 1 + i % 10, 100 + i64::from(i))
                .await;
            created.store(i, Ordering::SeqCst);
            // Pacing a steady trickle of payouts, not waiting for anything.
            tokio::select! {
                () = tokio::time::sleep(upgrade::LOAD_PACE) => {}
                _ = stopped.wait_for(|s| *s) => {}
            }
        }
    };
    let drive = async {
        let created = &created;
        poll("the batch to be under way", env.timeout, async || {
            match created.load(Ordering::SeqCst) {
                n if n >= 5 => Ok(()),
                n => Err(format!("{n} created")),
            }
        })
        .await;
        log(format!("{run} under way; helm upgrade {} to {new}", env.release));
        upgrade::helm_upgrade(env, new).await;
        check_operator_image(c, new).await;

        // The new migration, applied by its Job.
        let paydb_job = migration_job_done(c, &jobs, pstack, History::Paydb, new).await;
        let job_name = paydb_job.metadata.name.clone().unwrap_or_default();
        let job_done = upgrade::completed_at(&paydb_job).expect("the Job has completed");
        let report = job_report(c, &job_name).await;
        assert!(
            report["applied"].as_array().is_some_and(|a| a
                .iter()
                .any(|s| s.as_str().is_some_and(|s| s.ends_with(upgrade::FIXTURE_SCRIPT)))),
            "Job {job_name} did not apply the upgrade's migration: {report}"
        );
        let fixture = upgrade::fixture_applied(&pay.db)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            matches!(&fixture, Some((_, true))),
            "paydb's history after Job {job_name}: {fixture:?}"
        );
        log(format!(
            "Job {job_name} applied {report}; paydb's history has {fixture:?}"
        ));

        // The old version serves on the new schema: the held Deployments carry the new image now,
        // their pods are all of the old one, and payouts are posted through them.
        for d in &held {
            wait_until(
                &c.deployments,
                d,
                &format!("the operator to give deploy/{d} the new image"),
                env.timeout,
                |o: Option<&Deployment>| o.and_then(template_image).as_deref() == Some(new),
            )
            .await;
        }
        let k = 5;
        let (db, run) = (&pay.db, run.as_str());
        let on_new_schema = poll(
            &format!("{k} payouts posted on the new schema by the old version"),
            env.timeout,
            async || match upgrade::posted_after_fixture(db, run).await? {
                n if n >= k => Ok(n),
                n => Err(format!("{n} so far")),
            },
        )
        .await;
        for component in [PAYMENT_RESOURCE, RAIL_PROXY] {
            let images = pod_images(c, pstack, component).await;
            assert!(
                !images.is_empty() && images.iter().all(|(_, i)| i == old),
                "{component} is not all of the old version while held: {images:?}"
            );
        }
        log(format!(
            "{on_new_schema} payouts posted after the migration through payment-resource and \
             rail-proxy pods of the old version"
        ));
        for d in &held {
            pause(&c.deployments, d, false).await;
        }
        for d in &rolling {
            wait_until(
                &c.deployments,
                d,
                &format!("deploy/{d} to roll out on the new image"),
                env.timeout,
                |o: Option<&Deployment>| {
                    deployment_rolled_out(o) && o.and_then(template_image).as_deref() == Some(new)
                },
            )
            .await;
        }
        c.lsvc_ready(lsvc).await;
        c.lsvc_ready(elsvc).await;

        // No pod of the new version before its schema.
        let lockdb_job = migration_job_done(c, &jobs, lsvc, History::Lockdb, new).await;
        let lockdb_done = upgrade::completed_at(&lockdb_job).expect("the Job has completed");
        for (instance, component, done) in [
            (pstack, PAYMENT_RESOURCE, &job_done),
            (pstack, RAIL_PROXY, &job_done),
            (pstack, PAYOUT_EXECUTOR, &job_done),
            (lsvc, LOCK_SERVER, &lockdb_done),
        ] {
            let pods = c
                .pods
                .list(&component_pods(instance, component))
                .await
                .expect("list pods");
            for p in pods
                .items
                .iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
            {
                let created = p.metadata.creation_timestamp.clone().expect("a creation time");
                let after = upgrade::seconds_between(done, &created);
                assert!(
                    upgrade::pod_image(p) == Some(new) && after >= 0,
                    "pod {:?} ({component}) of image {:?} was created {after}s after its migration Job completed",
                    p.metadata.name,
                    upgrade::pod_image(p)
                );
            }
        }
        // The new version posts.
        let executors: Vec<String> = pod_images(c, pstack, PAYOUT_EXECUTOR)
            .await
            .into_iter()
            .map(|(name, _)| name)
            .collect();
        let executors = &executors;
        // Their workers' owner ids: `<stack>/<pod name>-w<n>` (the stack's lock client prefix).
        let owner_prefix = lock_clients::owner_prefix(pstack);
        let by_new = poll(
            &format!("{k} payouts posted by the new version's executors"),
            env.timeout,
            async || {
                let by = upgrade::posted_by(db, run).await?;
                let n = by
                    .iter()
                    .filter(|w| {
                        executors
                            .iter()
                            .any(|e| w.starts_with(&format!("{owner_prefix}{e}-")))
                    })
                    .count();
                if i64::try_from(n).is_ok_and(|n| n >= k) {
                    Ok(n)
                } else {
                    Err(format!("{n} so far"))
                }
            },
        )
        .await;
        log(format!(
            "{by_new} payouts posted by the executors of the new version {executors:?}"
        ));
        stop.send_replace(true);
    };
    let (failures, (), ()) = tokio::join!(observer, load, drive);
    assert!(
        failures.is_empty(),
        "pods of the old version failed during the upgrade: {failures:?}"
    );
    let n = created.load(Ordering::SeqCst);
    log(format!("{n} payouts created through the upgrade"));
    pay.await_posted(&run, n, env.timeout).await;
    pay.check_batch(&run).await.unwrap_or_else(|e| panic!("{e}"));
    // The rail stands for the bank: not upgraded with dlock, and its record of every payment intact.
    let rail_stub_now = c.pod_of(pstack, RAIL_STUB).await;
    assert_eq!(
        rail_stub_now, rail_stub,
        "the rail-stub was restarted by the upgrade"
    );
}

fn template_image(d: &Deployment) -> Option<String> {
    d.spec
        .as_ref()?
        .template
        .spec
        .as_ref()?
        .containers
        .first()?
        .image
        .clone()
}

fn component_pods(instance: &str, component: &str) -> ListParams {
    ListParams::default().labels(&format!(
        "{LABEL_INSTANCE}={instance},{LABEL_COMPONENT}={component}"
    ))
}

/// `(name, image)` of the pods of one component that are not being deleted.
async fn pod_images(c: &Cluster, instance: &str, component: &str) -> Vec<(String, String)> {
    c.pods
        .list(&component_pods(instance, component))
        .await
        .expect("list pods")
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| {
            let image = upgrade::pod_image(&p).unwrap_or_default().to_owned();
            (p.metadata.name.unwrap_or_default(), image)
        })
        .collect()
}

/// Sets or clears `spec.paused` of a Deployment (`kubectl rollout pause|resume`).
async fn pause(api: &Api<Deployment>, name: &str, paused: bool) {
    let patch = json!({"spec": {"paused": if paused { Value::Bool(true) } else { Value::Null }}});
    k8s::patch(api, name, &patch)
        .await
        .unwrap_or_else(|e| panic!("set deploy/{name} paused={paused}: {e}"));
}

/// Every operator pod runs `image` (helm's --wait saw the rollout).
async fn check_operator_image(c: &Cluster, image: &str) {
    let op_pods: Api<Pod> = Api::namespaced(c.client.clone(), &c.env.op_ns);
    let lp = ListParams::default().labels(&format!("{LABEL_NAME}={OPERATOR_POD_NAME}"));
    let pods = op_pods.list(&lp).await.expect("list operator pods").items;
    let images: Vec<_> = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| upgrade::pod_image(p).unwrap_or_default())
        .collect();
    assert!(
        !images.is_empty() && images.iter().all(|i| *i == image),
        "the operator's pods after helm upgrade: {images:?}"
    );
}

/// The migration Job of `history` for `instance` running `image`, once it has succeeded.
async fn migration_job_done(
    c: &Cluster,
    jobs: &Api<Job>,
    instance: &str,
    history: History,
    image: &str,
) -> Job {
    poll(
        &format!(
            "the {} migration Job of {instance} with {image} to succeed",
            history.name()
        ),
        c.env.timeout,
        async || match upgrade::migration_job(jobs, instance, history, image).await {
            Some(j) if upgrade::completed_at(&j).is_some() => Ok(j),
            Some(j) => Err(format!(
                "Job {} has not succeeded",
                j.metadata.name.unwrap_or_default()
            )),
            None => Err("no such Job yet".to_owned()),
        },
    )
    .await
}

/// The JSON report `dlock-migrate` printed in the succeeded pod of Job `job`.
async fn job_report(c: &Cluster, job: &str) -> Value {
    let lp = ListParams::default().labels(&format!("job-name={job}"));
    let pod = find_name(&c.pods, &lp, |p: &Pod| {
        p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Succeeded")
    })
    .await
    .unwrap_or_else(|| panic!("no succeeded pod of Job {job}"));
    let logs = c
        .pods
        .logs(&pod, &LogParams::default())
        .await
        .unwrap_or_else(|e| panic!("logs of pod {pod}: {e}"));
    logs.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v.get("applied").is_some())
        .unwrap_or_else(|| panic!("no report in the log of pod {pod}:\n{logs}"))
}

/// Step 14: Negative control: the checks can fail. One posted payout of the first batch paid a second
/// time straight at the rail (under a new idempotency key, bypassing rail-proxy's fence, as an
/// unfenced stale holder would), and the ground-truth check of step 7 must now refuse that batch.
async fn negative_control(pay: &Payments, run1: &str) {
    let victim = pay.payout(&format!("{run1}-1")).await;
    pay.pay_at_rail(&format!("negative-control-{run1}"), &victim)
        .await;
    match pay.check_batch(run1).await {
        Ok(()) => panic!("the checks accepted a payout the rail paid twice"),
        Err(e) if e.contains("payouts twice") => log(format!(
            "negative control: a second payment of {} at the rail is caught ({e})",
            victim.payout_id
        )),
        Err(e) => panic!("the checks failed for another reason than the double payment: {e}"),
    }
}

/// `e2e/kind/run.sh` where Docker cannot run: it says so and "skipped" (exit 0) for a local run, and
/// fails the run where `CI` is set, so that CI never passes a tier it did not run. Run on a copy of
/// the script beside the real `scripts/lib.sh` and a `scripts/docker-up.sh` that reports, as the
/// real one does on such a machine, that no daemon can start (exit 3). Needs no Docker.
#[test]
fn without_docker_ci_fails_where_a_local_run_skips() {
    let root = dlock_e2e::env::repo_root();
    let tree = std::env::temp_dir().join(format!("dlock-kind-ci-{}", std::process::id()));
    std::fs::create_dir_all(tree.join("e2e/kind")).expect("create a scratch tree");
    std::fs::create_dir_all(tree.join("scripts")).expect("create a scratch tree");
    for file in ["e2e/kind/run.sh", "scripts/lib.sh"] {
        std::fs::copy(root.join(file), tree.join(file)).unwrap_or_else(|e| panic!("copy {file}: {e}"));
    }
    let stub = tree.join("scripts/docker-up.sh");
    std::fs::write(
        &stub,
        "#!/usr/bin/env bash\necho '[docker-up] cannot start Docker: (stub) no daemon here' >&2\nexit 3\n",
    )
    .expect("write the docker-up stub");
    std::fs::set_permissions(&stub, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("make the docker-up stub executable");
    let run = |ci: Option<&str>| {
        let mut cmd = std::process::Command::new("bash");
        cmd.arg(tree.join("e2e/kind/run.sh"))
            .env("DLOCK_TOOLS_DIR", tree.join("tools"))
            .env_remove("CI");
        if let Some(v) = ci {
            cmd.env("CI", v);
        }
        let out = cmd.output().expect("run e2e/kind/run.sh");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let local = run(None);
    let ci_false = run(Some("false"));
    let ci = run(Some("true"));
    let _ = std::fs::remove_dir_all(&tree);
    for (what, (code, stdout, stderr)) in [("without CI", &local), ("with CI=false", &ci_false)] {
        assert!(
            *code == Some(0) && stdout.trim() == "skipped" && stderr.contains("(stub) no daemon here"),
            "{what}: exit {code:?}, stdout {stdout:?}, stderr {stderr}"
        );
    }
    let (code, stdout, stderr) = &ci;
    assert!(
        *code == Some(1)
            && !stdout.contains("skipped")
            && stderr.contains("(stub) no daemon here")
            && stderr.contains("CI is set"),
        "with CI=true: exit {code:?}, stdout {stdout:?}, stderr {stderr}"
    );
}
