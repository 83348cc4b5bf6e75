//! The reconcilers against a fake apiserver: an in-memory object store behind kube's `Client`
//! (namespaced GET / LIST / POST / server-side-apply and JSON merge PATCH / DELETE, status
//! subresource), so each
//! test drives a resource through its lifecycle by setting child statuses as the cluster would.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use http::{Method, Request, Response, StatusCode};
use kube::Client;
use kube::client::Body;
use serde_json::{Value, json};

use super::{Context, Settings, backoff, pipeline};
use crate::crd::{LockService, PaymentStack, Phase};
use crate::metrics::Metrics;

mod lock_clients;

const NS: &str = "pay";
const IMAGE: &str = "registry.example/dlock:1.2.3";

#[derive(Default)]
struct Store {
    objects: BTreeMap<String, Value>,
    /// `METHOD path` of every request, in order.
    log: Vec<String>,
    version: u64,
}

#[derive(Clone, Default)]
struct FakeApi(Arc<Mutex<Store>>);

fn status_body(code: u16, reason: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "code": code, "message": reason})
}

/// `/api/v1/namespaces/NS/RESOURCE` or `/apis/GROUP/VERSION/namespaces/NS/RESOURCE`.
fn is_collection(path: &str) -> bool {
    let segments = path.split('/').filter(|s| !s.is_empty()).count();
    if path.starts_with("/api/") {
        segments == 5
    } else {
        segments == 6
    }
}

/// RFC 7386 JSON merge patch: objects merge key by key, `null` removes, anything else replaces.
fn merge_patch(target: &mut Value, patch: &Value) {
    match (target.as_object_mut(), patch.as_object()) {
        (Some(t), Some(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        _ => {
            *target = patch.clone();
            if let Some(t) = target.as_object_mut() {
                t.retain(|_, v| !v.is_null());
            }
        }
    }
}

fn labels_match(obj: &Value, selector: &str) -> bool {
    selector.split(',').filter(|s| !s.is_empty()).all(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        obj["metadata"]["labels"][k].as_str() == Some(v)
    })
}

impl FakeApi {
    fn client(&self) -> Client {
        let api = self.clone();
        let svc = tower::service_fn(move |req: Request<Body>| {
            let api = api.clone();
            async move { Ok::<_, std::convert::Infallible>(api.handle(req).await) }
        });
        Client::new(svc, NS)
    }

    async fn handle(&self, req: Request<Body>) -> Response<Body> {
        let method = req.method().clone();
        let path = req.uri().path().to_owned();
        let query = req.uri().query().unwrap_or_default().to_owned();
        // A metadata-only read (`get_metadata`) is logged apart from a read of the whole object.
        let (merge, metadata_only) = {
            let header = |name: &str, part: &str| {
                req.headers()
                    .get(name)
                    .and_then(|v| v.to_str().ok())
                    .is_some_and(|v| v.contains(part))
            };
            (
                header("content-type", "merge-patch"),
                header("accept", "PartialObjectMetadata"),
            )
        };

        let body = req.into_body().collect_bytes().await.unwrap();
        let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let (code, out) = self.route(&method, &path, &query, body, merge);
        if metadata_only && let Some(last) = self.0.lock().unwrap().log.last_mut() {
            *last = format!("GET(metadata) {path}");
        }
        Response::builder()
            .status(StatusCode::from_u16(code).unwrap())
            .header("content-type", "application/json")
            .body(Body::from(match out {
                // Pod logs are plain text.
                Value::String(text) => text.into_bytes(),
                other => serde_json::to_vec(&other).unwrap(),
            }))
            .unwrap()
    }

    fn route(&self, method: &Method, path: &str, query: &str, body: Value, merge: bool) -> (u16, Value) {
        let mut s = self.0.lock().unwrap();
        s.log.push(format!("{method} {path}"));
        let (key, status_sub) = match path.strip_suffix("/status") {
            Some(k) => (k.to_owned(), true),
            None => (path.to_owned(), false),
        };
        if path.ends_with("/events") {
            return (201, body);
        }
        match *method {
            Method::GET if s.objects.contains_key(&key) => (200, s.objects[&key].clone()),
            Method::GET if path.ends_with("/log") => match s.objects.get(path) {
                Some(log) => (200, log.clone()),
                None => (404, status_body(404, "NotFound")),
            },
            Method::GET if !is_collection(path) => (404, status_body(404, "NotFound")),
            Method::GET => {
                let prefix = format!("{key}/");
                let selector = query
                    .split('&')
                    .find_map(|kv| kv.strip_prefix("labelSelector="))
                    .map(|s| s.replace("%3D", "=").replace("%2C", ",").replace("%2F", "/"));
                let items: Vec<Value> = s
                    .objects
                    .iter()
                    .filter(|(k, _)| k.starts_with(&prefix) && !k[prefix.len()..].contains('/'))
                    .map(|(_, v)| v.clone())
                    .filter(|v| selector.as_deref().is_none_or(|sel| labels_match(v, sel)))
                    .collect();
                (
                    200,
                    json!({"apiVersion": "v1", "kind": "List", "metadata": {}, "items": items}),
                )
            }
            Method::POST => {
                let name = body["metadata"]["name"].as_str().unwrap_or_default().to_owned();
                let key = format!("{key}/{name}");
                if s.objects.contains_key(&key) {
                    return (409, status_body(409, "AlreadyExists"));
                }
                s.version += 1;
                let mut obj = body;
                obj["metadata"]["resourceVersion"] = json!(s.version.to_string());
                s.objects.insert(key, obj.clone());
                (201, obj)
            }
            Method::PATCH if status_sub => match s.objects.get_mut(&key) {
                Some(obj) => {
                    obj["status"] = body["status"].clone();
                    (200, obj.clone())
                }
                None => (404, status_body(404, "NotFound")),
            },
            Method::PATCH if merge => {
                s.version += 1;
                let version = s.version.to_string();
                match s.objects.get_mut(&key) {
                    Some(obj) => {
                        merge_patch(obj, &body);
                        obj["metadata"]["resourceVersion"] = json!(version);
                        (200, obj.clone())
                    }
                    None => (404, status_body(404, "NotFound")),
                }
            }
            Method::PATCH => {
                s.version += 1;
                let version = s.version.to_string();
                let previous = s.objects.get(&key).cloned();
                let mut obj = body;
                // Server-side apply keeps what other managers own: here, the status.
                if let Some(st) = previous.as_ref().and_then(|p| p.get("status")) {
                    obj["status"] = st.clone();
                }
                let unchanged = previous.as_ref().is_some_and(|p| {
                    let strip = |v: &Value| {
                        let mut v = v.clone();
                        v["metadata"]["resourceVersion"] = Value::Null;
                        v
                    };
                    strip(p) == strip(&obj)
                });
                obj["metadata"]["resourceVersion"] = match (unchanged, previous) {
                    (true, Some(p)) => p["metadata"]["resourceVersion"].clone(),
                    _ => json!(version),
                };
                s.objects.insert(key, obj.clone());
                (200, obj)
            }
            Method::DELETE => match s.objects.remove(&key) {
                Some(obj) => (200, obj),
                None => (404, status_body(404, "NotFound")),
            },
            _ => (405, status_body(405, "MethodNotAllowed")),
        }
    }

    fn put(&self, key: &str, obj: Value) {
        self.0.lock().unwrap().objects.insert(key.to_owned(), obj);
    }

    fn get(&self, key: &str) -> Option<Value> {
        self.0.lock().unwrap().objects.get(key).cloned()
    }

    fn set_status(&self, key: &str, status: Value) {
        let mut s = self.0.lock().unwrap();
        let obj = s
            .objects
            .get_mut(key)
            .unwrap_or_else(|| panic!("{key} not stored"));
        obj["status"] = status;
    }

    fn keys(&self, prefix: &str) -> Vec<String> {
        let s = self.0.lock().unwrap();
        s.objects
            .keys()
            .filter(|k| k.starts_with(prefix))
            .cloned()
            .collect()
    }

    fn take_log(&self) -> Vec<String> {
        std::mem::take(&mut self.0.lock().unwrap().log)
    }
}

const LS_KEY: &str = "/apis/dlock.dev/v1alpha1/namespaces/pay/lockservices/locks";
const PS_KEY: &str = "/apis/dlock.dev/v1alpha1/namespaces/pay/paymentstacks/shop";
const SECRETS: &str = "/api/v1/namespaces/pay/secrets/";
const DEPLOYMENTS: &str = "/apis/apps/v1/namespaces/pay/deployments/";
const STATEFULSETS: &str = "/apis/apps/v1/namespaces/pay/statefulsets/";
const JOBS: &str = "/apis/batch/v1/namespaces/pay/jobs/";
const CONFIGMAPS: &str = "/api/v1/namespaces/pay/configmaps/";

/// What the LockService `locks` publishes as its grant public keys (one key, `k1`).
fn publish_grant_keys(api: &FakeApi) {
    let k1 = dlock_grant::SigningKey::generate(dlock_grant::KeyId::new("k1").unwrap());
    api.put(
        &format!("{CONFIGMAPS}locks-grant-public-keys"),
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": "locks-grant-public-keys", "namespace": NS},
               "data": {"keys": k1.public_key().to_text()}}),
    );
}

fn context(api: &FakeApi) -> Context {
    let mut registry = prometheus_client::registry::Registry::default();
    let settings = Settings {
        default_image: IMAGE.into(),
        namespace: None,
        fencing_check_interval: None,
        ca_overlap: std::time::Duration::ZERO,
        scraper: None,
    };
    Context::new(api.client(), Metrics::register(&mut registry), settings, None)
}

/// A Secret as the API server would answer it: `data` base64-encoded, `name` in the test namespace,
/// with a resourceVersion when one is given.
fn secret_json(name: &str, version: Option<&str>, data: &[(&str, &str)]) -> Value {
    let mut s = serde_json::to_value(k8s_openapi::api::core::v1::Secret {
        data: Some(
            data.iter()
                .map(|(k, v)| ((*k).to_owned(), k8s_openapi::ByteString(v.as_bytes().to_vec())))
                .collect(),
        ),
        ..Default::default()
    })
    .unwrap();
    s["apiVersion"] = json!("v1");
    s["kind"] = json!("Secret");
    s["metadata"] = json!({"name": name, "namespace": NS});
    if let Some(v) = version {
        s["metadata"]["resourceVersion"] = json!(v);
    }
    s
}

fn store_lock_service(api: &FakeApi, spec: Value) {
    api.put(
        LS_KEY,
        json!({
            "apiVersion": "dlock.dev/v1alpha1", "kind": "LockService",
            "metadata": {"name": "locks", "namespace": NS, "uid": "uid-locks", "generation": 1},
            "spec": spec,
        }),
    );
}

fn load_ls(api: &FakeApi) -> LockService {
    serde_json::from_value(api.get(LS_KEY).unwrap()).unwrap()
}

fn load_ps(api: &FakeApi) -> PaymentStack {
    serde_json::from_value(api.get(PS_KEY).unwrap()).unwrap()
}

async fn reconcile_ls(api: &FakeApi, ctx: &Context) -> LockService {
    pipeline::reconcile(&load_ls(api), ctx).await.unwrap();
    load_ls(api)
}

async fn reconcile_ps(api: &FakeApi, ctx: &Context) -> PaymentStack {
    pipeline::reconcile(&load_ps(api), ctx).await.unwrap();
    load_ps(api)
}

fn phase_and_reason<S: AsRef<crate::crd::DlockStatus>>(status: Option<S>) -> (Phase, String) {
    let status = status.expect("status written");
    let s = status.as_ref();
    let ready = s.condition("Ready").expect("Ready condition");
    (s.phase, ready.reason.clone())
}

impl AsRef<crate::crd::DlockStatus> for crate::crd::DlockStatus {
    fn as_ref(&self) -> &crate::crd::DlockStatus {
        self
    }
}

fn the_job(api: &FakeApi) -> String {
    let jobs = api.keys(JOBS);
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    jobs[0].clone()
}

/// Drives a managed LockService from nothing to Ready, one cluster change at a time.
#[tokio::test]
async fn lock_service_converges_through_the_migration_gate() {
    let api = FakeApi::default();
    let ctx = context(&api);
    store_lock_service(
        &api,
        json!({"database": {"managed": {}}, "lockServer": {"replicas": 2}}),
    );

    // 1. Database objects and Secrets; no Job while the database is not ready; no Deployment.
    let ls = reconcile_ls(&api, &ctx).await;
    assert_eq!(
        phase_and_reason(ls.status),
        (Phase::Pending, "WaitingForDatabase".into())
    );
    assert!(api.get(&format!("{SECRETS}locks-lockdb-credentials")).is_some());
    assert!(api.get(&format!("{SECRETS}locks-lockdb-conn")).is_some());
    assert!(api.get(&format!("{STATEFULSETS}locks-lockdb")).is_some());
    assert!(api.keys(JOBS).is_empty());
    assert!(api.keys(DEPLOYMENTS).is_empty());
    let credentials = api.get(&format!("{SECRETS}locks-lockdb-credentials")).unwrap();

    // 2. The database is up: the migration Job is created; Deployments still held back.
    api.set_status(
        &format!("{STATEFULSETS}locks-lockdb"),
        json!({"replicas": 1, "readyReplicas": 1}),
    );
    let ls = reconcile_ls(&api, &ctx).await;
    assert_eq!(
        phase_and_reason(ls.status.clone()),
        (Phase::Migrating, "Migrating".into())
    );
    let job = the_job(&api);
    assert!(api.keys(DEPLOYMENTS).is_empty());
    assert_eq!(ls.status.unwrap().migration.unwrap().history, "lockdb");

    // 3. Still running: nothing more.
    let ls = reconcile_ls(&api, &ctx).await;
    assert_eq!(
        phase_and_reason(ls.status),
        (Phase::Migrating, "Migrating".into())
    );
    assert!(api.keys(DEPLOYMENTS).is_empty());

    // 4. The Job succeeded: lock-server is created and rolls out; the version comes from its log.
    api.set_status(&job, json!({"succeeded": 1}));
    let job_name = job.rsplit('/').next().unwrap();
    api.put(
        "/api/v1/namespaces/pay/pods/migrate-pod",
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "migrate-pod", "namespace": NS, "labels": {"batch.kubernetes.io/job-name": job_name}},
               "status": {"phase": "Succeeded"}}),
    );
    api.put(
        "/api/v1/namespaces/pay/pods/migrate-pod/log",
        json!("{\"event\":\"service_starting\"}\n{\"applied\":[\"V1__a.sql\",\"V2__b.sql\"],\"current_version\":2}\n"),
    );
    let ls = reconcile_ls(&api, &ctx).await;
    assert_eq!(
        phase_and_reason(ls.status.clone()),
        (Phase::Pending, "RollingOut".into())
    );
    let dep_key = format!("{DEPLOYMENTS}locks-lock-server");
    let dep = api.get(&dep_key).expect("lock-server Deployment");
    assert_eq!(dep["spec"]["replicas"], json!(2));
    let status = ls.status.unwrap();
    assert_eq!(
        status.endpoints["lockServer"],
        "https://locks-lock-server.pay.svc:8080"
    );
    // HTTPS by default: the namespace's CA, its public bundle and lock-server's certificate are
    // written before the Deployment that mounts the certificate.
    for key in [
        "/api/v1/namespaces/pay/secrets/dlock-ca",
        "/api/v1/namespaces/pay/configmaps/dlock-ca-bundle",
        "/api/v1/namespaces/pay/secrets/locks-lock-server-tls",
    ] {
        assert!(api.get(key).is_some(), "{key} was not written");
    }
    let tls = status.tls.as_ref().expect("status.tls");
    assert_eq!(tls.certificates[0].component, "lock-server");
    assert_eq!(tls.certificates[0].secret, "locks-lock-server-tls");
    let volumes = dep["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        volumes
            .iter()
            .any(|v| v["secret"]["secretName"] == "locks-lock-server-tls"),
        "{volumes:?}"
    );
    assert!(status.migration.as_ref().unwrap().succeeded);
    assert_eq!(status.migration.as_ref().unwrap().applied_version, Some(2));

    // 5. Available: Ready.
    api.set_status(
        &dep_key,
        json!({"observedGeneration": 1, "replicas": 2, "updatedReplicas": 2, "availableReplicas": 2}),
    );
    let ls = reconcile_ls(&api, &ctx).await;
    let status = ls.status.clone().unwrap();
    assert_eq!(phase_and_reason(ls.status), (Phase::Ready, "Ready".into()));
    assert_eq!(status.observed_generation, Some(1));
    assert_eq!(status.condition("Degraded").unwrap().status, "False");

    // The generated passwords were never rewritten.
    assert_eq!(
        api.get(&format!("{SECRETS}locks-lockdb-credentials")).unwrap(),
        credentials
    );

    // 6. Steady state: one more reconcile writes no status and creates nothing new.
    api.take_log();
    let _ = reconcile_ls(&api, &ctx).await;
    let log = api.take_log();
    assert!(!log.iter().any(|l| l.ends_with("/status")), "{log:?}");
    assert!(
        !log.iter()
            .any(|l| l.starts_with("POST") && !l.ends_with("/events")),
        "{log:?}"
    );
}

#[tokio::test]
async fn a_failed_migration_degrades_and_keeps_deployments_away() {
    let api = FakeApi::default();
    let ctx = context(&api);
    store_lock_service(&api, json!({"database": {"managed": {}}}));
    reconcile_ls(&api, &ctx).await;
    api.set_status(
        &format!("{STATEFULSETS}locks-lockdb"),
        json!({"readyReplicas": 1}),
    );
    reconcile_ls(&api, &ctx).await;
    let job = the_job(&api);
    api.set_status(
        &job,
        json!({"failed": 5, "conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "Job has reached the specified backoff limit"}]}),
    );
    let ls = reconcile_ls(&api, &ctx).await;
    let status = ls.status.clone().unwrap();
    assert_eq!(
        phase_and_reason(ls.status),
        (Phase::Degraded, "MigrationFailed".into())
    );
    assert_eq!(status.condition("Degraded").unwrap().status, "True");
    assert!(
        status
            .condition("Ready")
            .unwrap()
            .message
            .contains("backoff limit")
    );
    assert!(api.keys(DEPLOYMENTS).is_empty());
    // A Warning Event explained it.
    let log = api.take_log();
    assert!(
        log.iter()
            .any(|l| l.starts_with("POST") && l.ends_with("/events"))
    );
}

#[tokio::test]
async fn an_external_database_without_its_secret_is_degraded_not_retried_blindly() {
    let api = FakeApi::default();
    let ctx = context(&api);
    store_lock_service(
        &api,
        json!({"database": {"external": {"secretRef": {"name": "cloudsql"}}}}),
    );
    let ls = reconcile_ls(&api, &ctx).await;
    assert_eq!(
        phase_and_reason(ls.status),
        (Phase::Degraded, "ExternalSecretMissing".into())
    );
    assert!(api.keys(JOBS).is_empty());
    assert!(api.keys(STATEFULSETS).is_empty());

    // A URL that is not a postgres URL: still degraded, and the message does not echo it.
    api.put(
        &format!("{SECRETS}cloudsql"),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "cloudsql", "namespace": NS},
               "data": {"url": "aG9zdD1kYiBwYXNzd29yZD1odW50ZXIy"}}), // "host=db password=hunter2"
    );
    let ls = reconcile_ls(&api, &ctx).await;
    let status = ls.status.clone().unwrap();
    assert_eq!(
        phase_and_reason(ls.status),
        (Phase::Degraded, "ExternalUrlInvalid".into())
    );
    assert!(!serde_json::to_string(&status).unwrap().contains("hunter2"));

    // A proper URL: the app-role URL is derived into the connection Secret; the Job runs at once
    // (an external database is assumed up) and reads the owner URL from the user's Secret.
    api.put(
        &format!("{SECRETS}cloudsql"),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "cloudsql", "namespace": NS},
               "data": {"url": "cG9zdGdyZXM6Ly9hZG1pbjpodW50ZXIyQGRiLmV4YW1wbGU6NTQzMi9sb2NrZGI="}}), // postgres://admin:hunter2@db.example:5432/lockdb
    );
    let ls = reconcile_ls(&api, &ctx).await;
    assert_eq!(
        phase_and_reason(ls.status),
        (Phase::Migrating, "Migrating".into())
    );
    let job = api.get(&the_job(&api)).unwrap();
    let env = &job["spec"]["template"]["spec"]["containers"][0]["env"];
    assert_eq!(env[0]["valueFrom"]["secretKeyRef"]["name"], "cloudsql");
    let conn = api.get(&format!("{SECRETS}locks-lockdb-conn")).unwrap();
    let url: k8s_openapi::ByteString = serde_json::from_value(conn["data"]["url"].clone()).unwrap();
    let url = String::from_utf8(url.0).unwrap();
    assert!(
        url.starts_with("postgres://lockapp:") && url.ends_with("@db.example:5432/lockdb"),
        "{url}"
    );
    assert!(!url.contains("hunter2"));
}

#[tokio::test]
async fn a_stack_waits_for_its_lock_service_then_drops_the_stub_when_asked() {
    let api = FakeApi::default();
    let ctx = context(&api);
    api.put(
        PS_KEY,
        json!({
            "apiVersion": "dlock.dev/v1alpha1", "kind": "PaymentStack",
            "metadata": {"name": "shop", "namespace": NS, "uid": "uid-shop", "generation": 1},
            "spec": {"lockServiceRef": {"name": "locks"}, "database": {"managed": {}},
                     "railStub": {"enabled": true},
                     "killSwitches": {"paymentFencingEnabled": false, "railProxyFencingEnabled": true}},
        }),
    );
    // Database up, migration done, but no LockService: nothing that needs it is created.
    reconcile_ps(&api, &ctx).await;
    api.set_status(&format!("{STATEFULSETS}shop-paydb"), json!({"readyReplicas": 1}));
    reconcile_ps(&api, &ctx).await;
    api.set_status(&the_job(&api), json!({"succeeded": 1}));
    let ps = reconcile_ps(&api, &ctx).await;
    assert_eq!(
        phase_and_reason(ps.status),
        (Phase::Pending, "LockServiceNotFound".into())
    );
    let deployments = api.keys(DEPLOYMENTS);
    assert_eq!(deployments, [format!("{DEPLOYMENTS}shop-rail-stub")]);

    // The LockService exists but is not Ready.
    store_lock_service(
        &api,
        json!({"database": {"managed": {}}, "lease": {"defaultTtlMs": 4000}}),
    );
    let ps = reconcile_ps(&api, &ctx).await;
    assert_eq!(
        phase_and_reason(ps.status),
        (Phase::Pending, "WaitingForLockService".into())
    );

    // Ready, with an endpoint, but no grant public keys published yet: still waiting.
    api.set_status(
        LS_KEY,
        json!({"observedGeneration": 1, "phase": "Ready",
               "conditions": [{"type": "Ready", "status": "True", "reason": "Ready", "message": "", "lastTransitionTime": "2025-01-01T00:00:00Z"}],
               "endpoints": {"lockServer": "http://locks-lock-server.pay.svc:8080"}}),
    );
    let ps = reconcile_ps(&api, &ctx).await;
    let status = ps.status.clone().unwrap();
    assert_eq!(
        phase_and_reason(ps.status),
        (Phase::Pending, "WaitingForLockService".into())
    );
    assert!(
        status
            .condition("Ready")
            .unwrap()
            .message
            .contains("grant public keys"),
        "{status:?}"
    );

    // Published: the stack's Deployments appear, wired to it.
    publish_grant_keys(&api);
    let ps = reconcile_ps(&api, &ctx).await;
    assert_eq!(phase_and_reason(ps.status), (Phase::Pending, "RollingOut".into()));
    assert_eq!(api.keys(DEPLOYMENTS).len(), 4);
    let executor = api.get(&format!("{DEPLOYMENTS}shop-payout-executor")).unwrap();
    let c = &executor["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["args"][1], "http://locks-lock-server.pay.svc:8080");
    assert!(
        c["env"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["name"] == "PAYOUT_EXECUTOR_LEASE_TTL_MS" && e["value"] == "4000")
    );
    let pr = api.get(&format!("{DEPLOYMENTS}shop-payment-resource")).unwrap();
    let env = &pr["spec"]["template"]["spec"]["containers"][0]["env"];
    assert!(
        env.as_array()
            .unwrap()
            .iter()
            .any(|e| e["name"] == "PAYMENT_FENCING_ENABLED" && e["value"] == "false")
    );

    // The spec drops the stub (and names a real rail): its Deployment and Service are deleted.
    let mut obj = api.get(PS_KEY).unwrap();
    obj["spec"]["railStub"]["enabled"] = json!(false);
    obj["spec"]["railProxy"] = json!({"railUrl": "https://rail.example"});
    obj["metadata"]["generation"] = json!(2);
    api.put(PS_KEY, obj);
    api.take_log();
    reconcile_ps(&api, &ctx).await;
    assert!(api.get(&format!("{DEPLOYMENTS}shop-rail-stub")).is_none());
    assert!(
        api.get("/api/v1/namespaces/pay/services/shop-rail-stub")
            .is_none()
    );
    let log = api.take_log();
    assert!(
        log.contains(&format!("DELETE {DEPLOYMENTS}shop-rail-stub")),
        "{log:?}"
    );
    let rp = api.get(&format!("{DEPLOYMENTS}shop-rail-proxy")).unwrap();
    assert_eq!(
        rp["spec"]["template"]["spec"]["containers"][0]["args"][3],
        "https://rail.example"
    );
}

#[tokio::test]
async fn a_new_image_runs_a_new_job_and_removes_the_old_one() {
    let api = FakeApi::default();
    let ctx = context(&api);
    store_lock_service(&api, json!({"database": {"managed": {}}}));
    reconcile_ls(&api, &ctx).await;
    api.set_status(
        &format!("{STATEFULSETS}locks-lockdb"),
        json!({"readyReplicas": 1}),
    );
    reconcile_ls(&api, &ctx).await;
    let old = the_job(&api);
    api.set_status(&old, json!({"succeeded": 1}));
    reconcile_ls(&api, &ctx).await;
    let dep_key = format!("{DEPLOYMENTS}locks-lock-server");
    let before = api.get(&dep_key).unwrap();

    let mut obj = api.get(LS_KEY).unwrap();
    obj["spec"]["lockServer"] = json!({"image": "registry.example/dlock:2.0.0"});
    api.put(LS_KEY, obj);
    let ls = reconcile_ls(&api, &ctx).await;
    let new = the_job(&api);
    assert_ne!(new, old);
    assert_eq!(
        phase_and_reason(ls.status),
        (Phase::Migrating, "Migrating".into())
    );
    // The running lock-server is left alone until the new history is applied.
    assert_eq!(api.get(&dep_key).unwrap()["spec"], before["spec"]);
    api.set_status(&new, json!({"succeeded": 1}));
    reconcile_ls(&api, &ctx).await;
    let after = api.get(&dep_key).unwrap();
    assert_eq!(
        after["spec"]["template"]["spec"]["containers"][0]["image"],
        "registry.example/dlock:2.0.0"
    );
}

#[test]
fn backoff_grows_and_is_capped() {
    let secs: Vec<u64> = (1..=10).map(|n| backoff(n).as_secs()).collect();
    assert_eq!(secs, [2, 4, 8, 16, 32, 64, 128, 256, 300, 300]);
    assert_eq!(backoff(u32::MAX).as_secs(), 300);
}

const PDBS: &str = "/apis/policy/v1/namespaces/pay/poddisruptionbudgets/";
const SERVICES: &str = "/api/v1/namespaces/pay/services/";

/// A managed-etcd LockService from nothing to Ready: members first, lock-server at a quorum, Ready
/// once every member is; no lockdb, no migration Job, no migration status.
#[tokio::test]
async fn an_etcd_lock_service_waits_for_a_quorum_then_runs_lock_server() {
    let api = FakeApi::default();
    let ctx = context(&api);
    store_lock_service(
        &api,
        json!({"backend": "etcd", "etcd": {"managed": {"replicas": 3}}, "lockServer": {"replicas": 2}}),
    );
    let sts_key = format!("{STATEFULSETS}locks-etcd");
    let ls = reconcile_ls(&api, &ctx).await;
    assert_eq!(
        phase_and_reason(ls.status.clone()),
        (Phase::Pending, "WaitingForEtcd".into())
    );
    let status = ls.status.unwrap();
    assert_eq!(status.etcd.as_ref().unwrap().ready, "0/3");
    assert!(status.migration.is_none());
    assert!(api.get(&sts_key).is_some());
    assert!(api.get(&format!("{PDBS}locks-etcd")).is_some());
    assert!(api.get(&format!("{SERVICES}locks-etcd-client")).is_some());
    assert!(api.keys(DEPLOYMENTS).is_empty());
    assert!(api.keys(JOBS).is_empty());
    assert!(api.keys(&format!("{SECRETS}locks-lockdb")).is_empty());

    // One member is not a quorum of three.
    api.set_status(&sts_key, json!({"replicas": 3, "readyReplicas": 1}));
    let ls = reconcile_ls(&api, &ctx).await;
    assert_eq!(
        phase_and_reason(ls.status),
        (Phase::Pending, "WaitingForEtcd".into())
    );
    assert!(api.keys(DEPLOYMENTS).is_empty());

    // Two are: lock-server is created, on --backend etcd.
    api.set_status(&sts_key, json!({"replicas": 3, "readyReplicas": 2}));
    let ls = reconcile_ls(&api, &ctx).await;
    assert_eq!(
        phase_and_reason(ls.status.clone()),
        (Phase::Pending, "RollingOut".into())
    );
    let dep_key = format!("{DEPLOYMENTS}locks-lock-server");
    let dep = api.get(&dep_key).expect("lock-server Deployment");
    let args = dep["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
    assert!(args.contains("\"--backend\",\"etcd\""), "{args}");
    assert_eq!(ls.status.unwrap().etcd.unwrap().ready, "2/3");

    // lock-server available, one member still not ready: not Ready yet, and it says why.
    api.set_status(
        &dep_key,
        json!({"observedGeneration": 1, "replicas": 2, "updatedReplicas": 2, "availableReplicas": 2}),
    );
    let ls = reconcile_ls(&api, &ctx).await;
    let status = ls.status.clone().unwrap();
    assert_eq!(
        phase_and_reason(ls.status),
        (Phase::Pending, "WaitingForEtcd".into())
    );
    assert!(status.condition("Ready").unwrap().message.contains("2/3"));

    api.set_status(&sts_key, json!({"replicas": 3, "readyReplicas": 3}));
    let ls = reconcile_ls(&api, &ctx).await;
    let status = ls.status.clone().unwrap();
    assert_eq!(phase_and_reason(ls.status), (Phase::Ready, "Ready".into()));
    assert_eq!(
        (
            status.etcd.as_ref().unwrap().ready.as_str(),
            status.etcd.as_ref().unwrap().ready_members
        ),
        ("3/3", Some(3))
    );
    assert_eq!(status.endpoints["etcd"], "https://locks-etcd-client.pay.svc:2379");
    assert!(status.migration.is_none());

    // A restore request is refused at once, with the runbook, and lock-server keeps serving.
    let mut obj = api.get(LS_KEY).unwrap();
    obj["metadata"]["annotations"] = json!({"dlock.dev/restore": "{\"id\":\"ff-etcd\",\"margin\":100}"});
    api.put(LS_KEY, obj);
    let ls = reconcile_ls(&api, &ctx).await;
    let status = ls.status.clone().unwrap();
    let action = status
        .actions
        .iter()
        .find(|a| a.id == "ff-etcd")
        .expect("recorded");
    assert_eq!(action.phase, crate::crd::actions::ActionPhase::Failed);
    assert!(action.message.as_deref().unwrap().contains("etcd-bump"));
    assert!(status.gate.is_none());
    assert_eq!(phase_and_reason(ls.status), (Phase::Ready, "Ready".into()));
    assert_eq!(api.get(&dep_key).unwrap()["spec"]["replicas"], json!(2));
    assert!(api.keys(JOBS).is_empty(), "no restore Job");
}

/// An external etcd: no member is run; its Secret is checked before lock-server is started.
#[tokio::test]
async fn an_external_etcd_needs_a_secret_with_usable_client_urls() {
    let api = FakeApi::default();
    let ctx = context(&api);
    store_lock_service(
        &api,
        json!({"backend": "etcd", "etcd": {"external": {"secretRef": {"name": "prod-etcd"}}}}),
    );
    let ls = reconcile_ls(&api, &ctx).await;
    assert_eq!(
        phase_and_reason(ls.status),
        (Phase::Degraded, "ExternalSecretMissing".into())
    );
    assert!(api.keys(DEPLOYMENTS).is_empty());

    let secret = |value: &str| secret_json("prod-etcd", Some("5"), &[("endpoints", value)]);
    api.put(
        &format!("{SECRETS}prod-etcd"),
        secret("https://etcd.example:2379"),
    );
    let ls = reconcile_ls(&api, &ctx).await;
    let status = ls.status.clone().unwrap();
    assert_eq!(
        phase_and_reason(ls.status),
        (Phase::Degraded, "EtcdEndpointsInvalid".into())
    );
    // https:// URLs need the cluster's CA, which this spec does not name.
    assert!(status.condition("Ready").unwrap().message.contains("caSecretRef"));
    assert!(api.keys(DEPLOYMENTS).is_empty());

    api.put(
        &format!("{SECRETS}prod-etcd"),
        secret("http://etcd-a.example:2379,http://etcd-b.example:2379"),
    );
    // The first reconcile that gets this far generates the grant signing key; lock-server waits for it.
    reconcile_ls(&api, &ctx).await;
    assert!(api.get(&format!("{DEPLOYMENTS}locks-lock-server")).is_none());
    assert!(api.get(&format!("{CONFIGMAPS}locks-grant-public-keys")).is_some());
    let ls = reconcile_ls(&api, &ctx).await;
    let status = ls.status.clone().unwrap();
    assert_eq!(phase_and_reason(ls.status), (Phase::Pending, "RollingOut".into()));
    assert_eq!(status.etcd.unwrap().ready, "external");
    let dep = api
        .get(&format!("{DEPLOYMENTS}locks-lock-server"))
        .expect("lock-server Deployment");
    let pod = &dep["spec"]["template"];
    assert_eq!(
        pod["spec"]["containers"][0]["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == "DLOCK_ETCD_ENDPOINTS")
            .unwrap()["valueFrom"]["secretKeyRef"],
        json!({"name": "prod-etcd", "key": "endpoints", "optional": false})
    );
    assert_eq!(
        pod["metadata"]["annotations"]["dlock.dev/etcd-secret-version"],
        "5"
    );
    assert!(api.keys(STATEFULSETS).is_empty());
}

/// The grant keys of a LockService through a whole rotation, against the fake apiserver: the first
/// key before lock-server starts, an added key published (the signer unchanged until the stack's
/// resources run with it), the switch, a retire that waits for lock-server to roll and then removes
/// the old key from the Secret and the ConfigMap; the signing-key Secret is never read.
#[tokio::test]
async fn grant_keys_rotate_resources_first_signer_after_and_the_secret_is_never_read() {
    let api = FakeApi::default();
    let ctx = context(&api);
    store_lock_service(
        &api,
        json!({"backend": "etcd", "etcd": {"external": {"secretRef": {"name": "prod-etcd"}}}}),
    );
    let mut etcd_secret = serde_json::to_value(k8s_openapi::api::core::v1::Secret {
        data: Some(BTreeMap::from([(
            "endpoints".to_owned(),
            k8s_openapi::ByteString(b"http://etcd.example:2379".to_vec()),
        )])),
        ..Default::default()
    })
    .unwrap();
    etcd_secret["apiVersion"] = json!("v1");
    etcd_secret["kind"] = json!("Secret");
    etcd_secret["metadata"] = json!({"name": "prod-etcd", "namespace": NS, "resourceVersion": "5"});
    api.put(&format!("{SECRETS}prod-etcd"), etcd_secret);
    let secret_key = format!("{SECRETS}locks-grant-signing-keys");
    let cm_key = format!("{CONFIGMAPS}locks-grant-public-keys");
    let secret_ids = |api: &FakeApi| -> Vec<String> {
        api.get(&secret_key).unwrap()["data"]
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect()
    };
    let published = |api: &FakeApi| -> Vec<String> {
        let keys = api.get(&cm_key).unwrap()["data"]["keys"]
            .as_str()
            .unwrap()
            .to_owned();
        dlock_grant::PublicKeys::parse(&keys)
            .unwrap()
            .ids()
            .map(ToString::to_string)
            .collect()
    };
    let signs_with = |api: &FakeApi| -> (String, String) {
        let dep = api.get(&format!("{DEPLOYMENTS}locks-lock-server")).unwrap();
        let pod = &dep["spec"]["template"];
        let env = pod["spec"]["containers"][0]["env"].as_array().unwrap().clone();
        let key = env
            .iter()
            .find(|e| e["name"] == "DLOCK_GRANT_SIGNING_KEY")
            .unwrap();
        (
            key["valueFrom"]["secretKeyRef"]["key"]
                .as_str()
                .unwrap()
                .to_owned(),
            pod["metadata"]["annotations"]["dlock.dev/grant-signing-key"]
                .as_str()
                .unwrap()
                .to_owned(),
        )
    };
    let roll_lock_server = |api: &FakeApi| {
        api.set_status(
            &format!("{DEPLOYMENTS}locks-lock-server"),
            json!({"replicas": 2, "availableReplicas": 2, "updatedReplicas": 2, "readyReplicas": 2}),
        );
    };
    let stack_runs_with = |api: &FakeApi, ids: &[&str]| {
        api.put(
            PS_KEY,
            json!({
                "apiVersion": "dlock.dev/v1alpha1", "kind": "PaymentStack",
                "metadata": {"name": "shop", "namespace": NS, "uid": "uid-shop", "generation": 1},
                "spec": {"lockServiceRef": {"name": "locks"}, "database": {"managed": {}},
                         "railStub": {"enabled": true}},
                "status": {"grants": {"keyIds": ids}},
            }),
        );
    };
    let request = |api: &FakeApi, raw: &str| {
        let mut ls = api.get(LS_KEY).unwrap();
        ls["metadata"]["annotations"] = json!({"dlock.dev/grant-keys": raw});
        api.put(LS_KEY, ls);
    };

    // The first key, before lock-server.
    reconcile_ls(&api, &ctx).await;
    assert_eq!(
        (secret_ids(&api), published(&api)),
        (vec!["k1".into()], vec!["k1".into()])
    );
    assert!(api.get(&format!("{DEPLOYMENTS}locks-lock-server")).is_none());
    let ls = reconcile_ls(&api, &ctx).await;
    assert_eq!(signs_with(&api), ("k1".into(), "k1".into()));
    let grants = ls.status.unwrap().grants.unwrap();
    assert_eq!(
        (grants.key_ids, grants.signing_key_id.as_deref()),
        (vec!["k1".into()], Some("k1"))
    );
    roll_lock_server(&api);
    stack_runs_with(&api, &["k1"]);

    // Add: k2 is generated and published; lock-server keeps signing with k1.
    request(&api, r#"{"id":"rot-1","action":"add"}"#);
    let ls = reconcile_ls(&api, &ctx).await;
    assert_eq!(secret_ids(&api), ["k1", "k2"]);
    assert_eq!(published(&api), ["k1", "k2"]);
    let grants = ls.status.unwrap().grants.unwrap();
    assert_eq!(grants.last_outcome.as_deref(), Some("added k2"));
    reconcile_ls(&api, &ctx).await;
    assert_eq!(
        signs_with(&api).0,
        "k1",
        "the stack's resources do not verify k2 yet"
    );
    assert_eq!(secret_ids(&api), ["k1", "k2"], "the request is handled once");

    // The stack's resources run with both keys: lock-server switches to k2.
    stack_runs_with(&api, &["k1", "k2"]);
    let ls = reconcile_ls(&api, &ctx).await;
    assert_eq!(signs_with(&api), ("k2".into(), "k2".into()));
    assert_eq!(
        ls.status.unwrap().grants.unwrap().signing_key_id.as_deref(),
        Some("k2")
    );

    // Retire k1: it waits while lock-server has not rolled out with k2 …
    request(&api, r#"{"id":"ret-1","action":"retire","keyId":"k1"}"#);
    let mut dep = api.get(&format!("{DEPLOYMENTS}locks-lock-server")).unwrap();
    dep["status"] = json!({"replicas": 2, "availableReplicas": 2, "updatedReplicas": 1});
    api.put(&format!("{DEPLOYMENTS}locks-lock-server"), dep);
    let ls = reconcile_ls(&api, &ctx).await;
    assert_eq!(secret_ids(&api), ["k1", "k2"]);
    assert!(
        ls.status
            .unwrap()
            .grants
            .unwrap()
            .message
            .unwrap()
            .contains("waiting"),
        "the retire waits for lock-server"
    );
    // … and then removes k1 from both.
    roll_lock_server(&api);
    let ls = reconcile_ls(&api, &ctx).await;
    assert_eq!(
        (secret_ids(&api), published(&api)),
        (vec!["k2".into()], vec!["k2".into()])
    );
    assert_eq!(
        ls.status.unwrap().grants.unwrap().last_outcome.as_deref(),
        Some("retired k1")
    );
    assert_eq!(signs_with(&api).0, "k2");

    // Retiring the key lock-server signs with is refused, and changes nothing.
    request(&api, r#"{"id":"ret-2","action":"retire","keyId":"k2"}"#);
    let ls = reconcile_ls(&api, &ctx).await;
    assert_eq!(secret_ids(&api), ["k2"]);
    assert!(
        ls.status
            .unwrap()
            .grants
            .unwrap()
            .last_outcome
            .unwrap()
            .starts_with("refused"),
    );

    let log = api.take_log();
    assert!(
        !log.iter().any(|l| l == &format!("GET {secret_key}")),
        "the signing-key Secret was read: {log:?}"
    );
    assert!(log.iter().any(|l| l == &format!("GET(metadata) {secret_key}")));
}

/// An external etcd over TLS: its CA Secret and its client certificate Secret are checked, one
/// at a time, before lock-server is started; then lock-server reads them from files and rolls
/// when any of the three Secrets changes. A CA for http:// URLs is refused.
#[tokio::test]
async fn an_external_etcd_over_https_needs_its_ca_and_client_certificate() {
    let api = FakeApi::default();
    let ctx = context(&api);
    store_lock_service(
        &api,
        json!({"backend": "etcd", "etcd": {"external": {
            "secretRef": {"name": "prod-etcd"},
            "caSecretRef": {"name": "etcd-ca"},
            "clientCertificateSecretRef": {"name": "etcd-client"}
        }}}),
    );
    let put_secret = |name: &str, version: &str, data: &[(&str, &str)]| {
        api.put(
            &format!("{SECRETS}{name}"),
            secret_json(name, Some(version), data),
        );
    };
    let degraded = async |reason: &str, says: &str| {
        let ls = reconcile_ls(&api, &ctx).await;
        let status = ls.status.clone().unwrap();
        assert_eq!(phase_and_reason(ls.status), (Phase::Degraded, reason.into()));
        let message = status.condition("Ready").unwrap().message.clone();
        assert!(message.contains(says), "{message}");
        assert!(api.keys(DEPLOYMENTS).is_empty());
    };
    const PEM: &str = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
    const KEY: &str = "-----BEGIN PRIVATE KEY-----\nMC4C\n-----END PRIVATE KEY-----\n";

    put_secret("prod-etcd", "5", &[("endpoints", "http://etcd.example:2379")]);
    degraded("EtcdEndpointsInvalid", "https://").await;
    put_secret("prod-etcd", "5", &[("endpoints", "https://etcd.example:2379")]);
    degraded("ExternalSecretMissing", "etcd-ca").await;
    put_secret("etcd-ca", "6", &[("ca.crt", "not a certificate")]);
    degraded("ExternalSecretInvalid", "etcd-ca").await;
    put_secret("etcd-ca", "6", &[("ca.crt", PEM)]);
    degraded("ExternalSecretMissing", "etcd-client").await;
    put_secret("etcd-client", "7", &[("tls.crt", PEM)]);
    degraded("ExternalSecretInvalid", "tls.key").await;
    put_secret("etcd-client", "7", &[("tls.crt", PEM), ("tls.key", KEY)]);

    // The first reconcile that gets this far generates the grant signing key; lock-server waits for it.
    reconcile_ls(&api, &ctx).await;
    let ls = reconcile_ls(&api, &ctx).await;
    assert_eq!(phase_and_reason(ls.status), (Phase::Pending, "RollingOut".into()));
    let dep = api
        .get(&format!("{DEPLOYMENTS}locks-lock-server"))
        .expect("lock-server Deployment");
    let pod = &dep["spec"]["template"];
    let env = pod["spec"]["containers"][0]["env"].as_array().unwrap();
    let value = |name: &str| env.iter().find(|e| e["name"] == name).map(|e| e["value"].clone());
    assert_eq!(
        value("DLOCK_ETCD_CA_FILE"),
        Some(json!("/etc/dlock/etcd-ca/ca.crt"))
    );
    assert_eq!(
        value("DLOCK_ETCD_CERT_FILE"),
        Some(json!("/etc/dlock/etcd-client/tls.crt"))
    );
    assert_eq!(
        value("DLOCK_ETCD_KEY_FILE"),
        Some(json!("/etc/dlock/etcd-client/tls.key"))
    );
    // The three Secrets' versions: a renewed client certificate or CA restarts lock-server.
    assert_eq!(
        pod["metadata"]["annotations"]["dlock.dev/etcd-secret-version"],
        "5,6,7"
    );
    // No key's content anywhere in the Deployment.
    assert!(!dep.to_string().contains("MC4C"));
}
