//! One operator test's stage: its own namespace with the chart's RBAC, the operator binary started
//! as the chart starts it, the stand-in kubelet, and waits that drive the stand-in between probes.

use std::path::PathBuf;
use std::time::Duration;

use dlock_operator::crd::{DlockStatus, LockService, PaymentStack};
use dlock_testkit::{History, TestDb};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::events::v1::Event;
use kube::core::object::HasStatus;
use kube::{Api, Resource};

use crate::k8s::{self, Kind};
use crate::kubelet::Kubelet;
use crate::lockapi::LockApi;
use crate::operator::{self, Operator};
use crate::proxy::Proxy;
use crate::rbac::{self, Identity};
use crate::{Cluster, crds, env, helm};

/// Bound of every wait of a stage.
pub const TIMEOUT: Duration = Duration::from_secs(120);
/// How often a wait drives the stand-in and probes.
pub const POLL: Duration = Duration::from_millis(250);

/// How the operator is started.
#[derive(Debug, Default)]
pub struct Options {
    /// Start it with `HTTP_PROXY` pointing at a [`Proxy`] (Service DNS for lock-server), which the
    /// stand-in kubelet routes to the processes it serves.
    pub proxy: bool,
    /// Extra environment of the operator process (kept across restarts).
    pub env: Vec<(String, String)>,
}

pub struct Stage {
    pub cluster: Cluster,
    pub ns: String,
    pub id: Identity,
    pub op: Operator,
    pub kubelet: Kubelet,
    pub proxy: Option<Proxy>,
    helm: PathBuf,
    options: Options,
    scratch: env::Scratch,
}

impl Stage {
    /// A stage in a fresh namespace named `prefix-…`, with an empty local database for each of
    /// `histories`; `None` (after saying why) when the cluster tier is off.
    pub async fn start(test: &str, prefix: &str, histories: &[History], options: Options) -> Option<Stage> {
        let cluster = crate::cluster(test).await?;
        let Some(helm_bin) = helm::helm(test) else {
            panic!("DLOCK_E2E=1 but helm is missing: run scripts/cluster-tools.sh");
        };
        crds::install(&cluster.client).await;
        let ns = env::unique_name(prefix);
        let scratch = env::Scratch::new(test);
        let id = rbac::install(&cluster, &helm_bin, &ns, &ns, scratch.path()).await;
        let proxy = options.proxy.then(Proxy::start);
        let op = start_operator(&helm_bin, &id, &scratch, proxy.as_ref(), &options.env).await;
        // The tests' own lock client, which every LockService of `crate::specs` names.
        let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(cluster.client.clone(), &ns);
        secrets
            .create(&Default::default(), &crate::specs::test_clients_secret())
            .await
            .unwrap_or_else(|e| panic!("create the tests' lock clients Secret: {e}"));
        let mut kubelet = Kubelet::new(&cluster.client, &ns, histories).await;
        kubelet.proxy = proxy.clone();
        Some(Stage {
            cluster,
            ns,
            id,
            op,
            kubelet,
            proxy,
            helm: helm_bin,
            options,
            scratch,
        })
    }

    /// Runs the pod of LockService `lsvc`'s lock-server Deployment as a local process (the stand-in
    /// kubelet does, once the Deployment exists), reached at its Service authority through the
    /// proxy.
    pub fn serve_lock_server(&mut self, lsvc: &str) {
        let authority = format!("{lsvc}-lock-server.{}.svc:8080", self.ns);
        self.kubelet
            .serve_deployment(&format!("{lsvc}-lock-server"), &authority, History::Lockdb);
    }

    /// lock-server's API of LockService `lsvc`, at the process the stand-in runs for it now.
    pub fn lock_api(&self, lsvc: &str) -> LockApi {
        LockApi::plain(
            self.kubelet
                .served_port(&format!("{lsvc}-lock-server"))
                .unwrap_or_else(|| panic!("lock-server of {lsvc} is not running")),
        )
    }

    /// The local database standing in for lockdb.
    pub fn lockdb(&self) -> TestDb {
        self.kubelet.databases[&History::Lockdb].clone()
    }

    /// The proxy (a stage started with [`Options::proxy`]).
    pub fn proxy(&self) -> &Proxy {
        self.proxy
            .as_ref()
            .unwrap_or_else(|| panic!("this stage was started without the proxy"))
    }

    /// A new operator process in place of the current one (which a test may have killed).
    /// Sets one variable of the operator's environment for its next (re)start.
    pub fn set_operator_env(&mut self, name: &str, value: &str) {
        self.options.env.retain(|(k, _)| k != name);
        self.options.env.push((name.to_owned(), value.to_owned()));
    }

    pub async fn restart_operator(&mut self) {
        self.op = start_operator(
            &self.helm,
            &self.id,
            &self.scratch,
            self.proxy.as_ref(),
            &self.options.env,
        )
        .await;
    }

    /// The stage namespace's `Api<K>`.
    pub fn api<K>(&self) -> Api<K>
    where
        K: Resource<DynamicType = (), Scope = NamespaceResourceScope>,
    {
        Api::namespaced(self.cluster.client.clone(), &self.ns)
    }

    /// One object, or `None`.
    pub async fn get<K>(&self, name: &str) -> Option<K>
    where
        K: Kind + Resource<Scope = NamespaceResourceScope>,
    {
        k8s::get(&self.api(), name).await
    }

    /// One object that must exist.
    pub async fn must_get<K>(&self, name: &str) -> K
    where
        K: Kind + Resource<Scope = NamespaceResourceScope>,
    {
        k8s::must_get(&self.api(), name).await
    }

    pub async fn lsvc(&self, name: &str) -> LockService {
        self.must_get(name).await
    }

    pub async fn pstack(&self, name: &str) -> PaymentStack {
        self.must_get(name).await
    }

    /// Creates or updates `obj` in the stage's namespace (server-side apply).
    pub async fn apply<K>(&self, obj: &K) -> K
    where
        K: Kind + Resource<Scope = NamespaceResourceScope>,
    {
        k8s::apply(&self.api(), obj).await
    }

    /// A merge patch that must be accepted.
    pub async fn patch<K>(&self, name: &str, patch: &serde_json::Value) -> K
    where
        K: Kind + Resource<Scope = NamespaceResourceScope>,
    {
        k8s::patch(&self.api(), name, patch)
            .await
            .unwrap_or_else(|e| panic!("patch {}/{name} with {patch}: {e}", K::kind(&())))
    }

    /// The objects of kind `K` that `owner` controls.
    pub async fn owned<K, O>(&self, owner: &O) -> Vec<K>
    where
        K: Kind + Resource<Scope = NamespaceResourceScope>,
        O: Kind,
    {
        k8s::owned(&self.cluster.client, &self.ns, &uid(owner)).await
    }

    /// Every child (of any kind the operator creates) that `owner` controls.
    pub async fn children<O: Kind>(&self, owner: &O) -> Vec<k8s::Child> {
        k8s::children(&self.cluster.client, &self.ns, &uid(owner)).await
    }

    /// The Events (events.k8s.io) about the object named `name`.
    pub async fn events(&self, name: &str) -> Vec<Event> {
        k8s::list(&self.api::<Event>())
            .await
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
            .collect()
    }

    /// Waits until every one of `reasons` is among the Events about the object named `name`. The
    /// operator publishes a reconcile's Events after it writes that reconcile's status, so a test
    /// that has just seen the status must still wait for them.
    pub async fn wait_events(&mut self, name: &str, reasons: &[&str]) {
        self.wait(&format!("Events {reasons:?} about {name}"), false, async |st| {
            let seen: Vec<String> = st
                .events(name)
                .await
                .into_iter()
                .filter_map(|e| e.reason)
                .collect();
            match reasons.iter().find(|r| !seen.iter().any(|s| s == *r)) {
                None => Ok(()),
                Some(r) => Err(format!("no {r} Event among {seen:?}")),
            }
        })
        .await;
    }

    /// Probes until `probe` returns `Ok` (at most [`TIMEOUT`]), running a pass of the stand-in
    /// kubelet before each probe when `drive` is set. On timeout it panics with the last
    /// observation, the failed Job runs and the operator's log.
    pub async fn wait<T>(
        &mut self,
        what: &str,
        drive: bool,
        mut probe: impl AsyncFnMut(&mut Stage) -> Result<T, String>,
    ) -> T {
        let outcome = dlock_testkit::wait::poll(TIMEOUT, POLL, async || {
            if drive {
                self.kubelet.step().await;
            }
            probe(self).await
        })
        .await;
        outcome.unwrap_or_else(|last| {
            let failed: Vec<String> = self
                .kubelet
                .runs
                .iter()
                .filter(|r| !r.succeeded())
                // The binaries' errors go to stderr: its last line says why the Job failed.
                .map(|r| {
                    format!(
                        "{}: {} | stderr: {}",
                        r.job,
                        r.stdout.lines().last().unwrap_or_default(),
                        r.stderr.lines().last().unwrap_or_default()
                    )
                })
                .collect();
            panic!(
                "timed out after {TIMEOUT:?} waiting for {what}; last observation: {last}\n\
                 {} Job runs, failed: {failed:?}\noperator log:\n{}",
                self.kubelet.runs.len(),
                operator::tail(&self.op.log, 80)
            )
        })
    }

    /// Waits (driving the stand-in) for `Ready=True` at the object's current generation.
    pub async fn wait_ready<K>(&mut self, name: &str) -> K
    where
        K: Kind + Resource<Scope = NamespaceResourceScope> + HasStatus<Status = DlockStatus>,
    {
        let what = format!("{}/{name} Ready at its current generation", K::kind(&()));
        self.wait(&what, true, async |st| {
            let o: K = st.must_get(name).await;
            if ready_at_generation(&o) {
                Ok(o)
            } else {
                Err(format!("status: {:?}", o.status()))
            }
        })
        .await
    }
}

/// `Ready=True`, and the status is of the current spec (`observedGeneration == generation`).
pub fn ready_at_generation<K>(o: &K) -> bool
where
    K: Resource + HasStatus<Status = DlockStatus>,
{
    o.status().is_some_and(|s| {
        s.is_ready() && s.observed_generation.is_some() && s.observed_generation == o.meta().generation
    })
}

fn uid<O: Kind>(owner: &O) -> String {
    owner
        .meta()
        .uid
        .clone()
        .unwrap_or_else(|| panic!("{} has no uid", k8s::describe(owner)))
}

async fn start_operator(
    helm: &std::path::Path,
    id: &Identity,
    scratch: &env::Scratch,
    proxy: Option<&Proxy>,
    extra: &[(String, String)],
) -> Operator {
    let url = proxy.map(Proxy::url);
    let mut vars: Vec<(&str, &str)> = Vec::new();
    if let Some(url) = &url {
        vars.extend([
            ("HTTP_PROXY", url.as_str()),
            ("http_proxy", url.as_str()),
            ("NO_PROXY", "127.0.0.1,localhost"),
        ]);
    }
    vars.extend(extra.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    Operator::start_with_env(helm, id, scratch.path(), &vars).await
}
