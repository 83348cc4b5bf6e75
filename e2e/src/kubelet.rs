//! Stand-in for the parts of Kubernetes the cluster tier does not run (kubelet, Job and Deployment
//! controllers). It does the least that makes the operator's gating observable and real:
//!
//! - a migration Job is run by executing **the Job's own container command, args and env** as read
//!   from the API server (Secret and ConfigMap references resolved), with the binary from this
//!   workspace and `/migrations/...` mapped to the repository's `migrations/`. Its database URL is
//!   mapped to a local PostgreSQL 16 database from `dlock_testkit` (host, port, database and user;
//!   the local server trusts loopback). The Job's status is then written through the status
//!   subresource from that process's real exit code.
//! - Deployments and StatefulSets get the status their controllers and kubelets would write once
//!   every replica runs (observedGeneration, replicas, readyReplicas, ...).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::time::Duration;

use dlock_testkit::{History, TestDb};
use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentCondition, DeploymentStatus, StatefulSet, StatefulSetStatus,
};
use k8s_openapi::api::batch::v1::{Job, JobCondition, JobStatus, UncountedTerminatedPods};
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, ContainerState, ContainerStateTerminated, ContainerStatus, Pod, PodSpec, PodStatus,
    Secret, ServiceAccount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};

use crate::k8s::{self, Kind};
use crate::proxy::Proxy;
use crate::{env, operator};

/// One executed Job.
#[derive(Debug, Clone)]
pub struct JobRun {
    pub job: String,
    pub history: History,
    pub database: TestDb,
    pub exit_code: Option<i32>,
    pub argv: Vec<String>,
    pub stdout: String,
    pub stderr: String,
}

impl JobRun {
    pub fn succeeded(&self) -> bool {
        self.exit_code == Some(0)
    }
}

/// The stand-in, for one namespace.
pub struct Kubelet {
    client: Client,
    ns: String,
    /// The local database each history maps to (created empty on first use; the Job migrates it).
    pub databases: HashMap<History, TestDb>,
    /// Jobs (by uid) already run, so each runs once, as a Job with backoffLimit 0 would.
    ran: HashSet<String>,
    pub runs: Vec<JobRun>,
    /// Database URL hosts (e.g. `pay-a-paydb.<ns>.svc`) mapped to a local database of their own,
    /// so that several PaymentStacks each get their paydb.
    hosts: HashMap<String, TestDb>,
    /// Deployments whose pods run as local processes (by Deployment name), and the Service
    /// authority the proxy routes to them.
    served: HashMap<String, Served>,
    pub proxy: Option<Proxy>,
    scratch: std::path::PathBuf,
    /// Probes the served processes' `/readyz`, as their readiness probes would.
    http: reqwest::Client,
}

/// A Deployment whose one pod runs here.
struct Served {
    authority: String,
    history: History,
    process: Option<std::process::Child>,
    port: u16,
    log: std::path::PathBuf,
    /// How many times its process was started.
    starts: usize,
    /// The pod template its process was started from: a changed template is a rollout.
    template: Option<serde_json::Value>,
}

impl Kubelet {
    /// A stand-in for namespace `ns`, with a fresh, empty local database for each of `histories`
    /// (the migration Jobs fill them).
    pub async fn new(client: &Client, ns: &str, histories: &[History]) -> Self {
        let mut databases = HashMap::new();
        for h in histories {
            databases.insert(*h, dlock_testkit::blank(*h).await);
        }
        Kubelet {
            client: client.clone(),
            ns: ns.to_owned(),
            databases,
            ran: HashSet::new(),
            runs: Vec::new(),
            hosts: HashMap::new(),
            served: HashMap::new(),
            proxy: None,
            scratch: std::env::temp_dir().join(format!(
                "dlock-e2e-kubelet-{}-{}",
                std::process::id(),
                crate::env::unique_name("k")
            )),
            http: reqwest::Client::builder()
                .no_proxy()
                .timeout(Duration::from_secs(2))
                .build()
                .expect("an HTTP client"),
        }
    }

    fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>,
    {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// Database URLs whose host is `host` map to `db` (instead of the history's default database).
    pub fn use_database_for_host(&mut self, host: &str, db: TestDb) {
        self.hosts.insert(host.to_owned(), db);
    }

    /// Runs Deployment `name`'s pod as a local process whenever it asks for replicas (one process
    /// stands for all of them), routed by the proxy from `authority` (the Service's `host:port`).
    /// Its database URLs map to `history`'s local database (or a host mapping).
    pub fn serve_deployment(&mut self, name: &str, authority: &str, history: History) {
        self.served.insert(
            name.to_owned(),
            Served {
                authority: authority.to_owned(),
                history,
                process: None,
                port: 0,
                log: self.scratch.join(format!("{name}.log")),
                starts: 0,
                template: None,
            },
        );
    }

    /// How many times a served Deployment's process was started.
    pub fn served_starts(&self, name: &str) -> usize {
        self.served.get(name).map_or(0, |s| s.starts)
    }

    /// The local port of a served Deployment's process, when it runs.
    pub fn served_port(&self, name: &str) -> Option<u16> {
        self.served
            .get(name)
            .filter(|s| s.process.is_some())
            .map(|s| s.port)
    }

    /// Starts or stops the processes of the served Deployments to match their replicas, with a Pod
    /// object for each running one (what the operator counts before it opens a gate) and the proxy
    /// route to it.
    pub async fn sync_served(&mut self) {
        let names: Vec<String> = self.served.keys().cloned().collect();
        for name in names {
            let dep = k8s::get(&self.api::<Deployment>(), &name).await;
            let running = self.served.get(&name).is_some_and(|s| s.process.is_some());
            match dep {
                Some(dep) if k8s::replicas(&dep) > 0 && !running => self.start_served(&name, &dep).await,
                // A changed pod template rolls the pod: the old process stops, one on the new
                // template starts (one process stands for every replica, so not surge by surge).
                Some(dep) if k8s::replicas(&dep) > 0 && self.template_changed(&name, &dep) => {
                    self.stop_served(&name).await;
                    self.start_served(&name, &dep).await;
                }
                Some(dep) if k8s::replicas(&dep) == 0 && running => self.stop_served(&name).await,
                None if running => self.stop_served(&name).await,
                _ => {}
            }
        }
    }

    fn template_changed(&self, name: &str, dep: &Deployment) -> bool {
        let now = dep
            .spec
            .as_ref()
            .and_then(|s| serde_json::to_value(&s.template).ok());
        self.served
            .get(name)
            .is_some_and(|s| s.process.is_some() && s.template != now)
    }

    /// The namespace's `default` ServiceAccount, which the controller-manager would create and pod
    /// admission requires.
    async fn ensure_default_service_account(&self) {
        let api = self.api::<ServiceAccount>();
        if k8s::get(&api, "default").await.is_none() {
            let sa = ServiceAccount {
                metadata: named("default"),
                ..ServiceAccount::default()
            };
            // Another pass may have created it meanwhile: AlreadyExists is as good.
            let _ = api.create(&PostParams::default(), &sa).await;
        }
    }

    async fn start_served(&mut self, name: &str, dep: &Deployment) {
        let template = &dep.spec.as_ref().expect("a Deployment has a spec").template;
        let c = k8s::container(template, &format!("Deployment {name}"));
        let argv = k8s::argv(c);
        // One process stands for every replica: one pod name for the downward API.
        let env = self.container_env(c, &format!("{name}-0")).await;
        // Secret volumes are written as files here, and every path under a mount is mapped to them
        // (lock-server's clients file).
        let mounts = self.secret_mounts(name, template, c).await;
        let env: BTreeMap<String, String> = env
            .into_iter()
            .map(|(k, v)| {
                let mapped = mounts
                    .iter()
                    .find_map(|(at, local)| v.strip_prefix(at.as_str()).map(|rest| format!("{local}{rest}")));
                (k, mapped.unwrap_or(v))
            })
            .collect();
        let history = self.served[name].history;
        let default_db = self.databases.get(&history).cloned();
        let port = dlock_testkit::procs::free_port().unwrap_or_else(|e| panic!("free port: {e}"));
        let program = Path::new(&argv[0])
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut cmd = std::process::Command::new(env::workspace_bin(&program));
        cmd.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default());
        // Service URLs (`http://<name>.<ns>.svc:8080`) do not resolve here: the process reaches the
        // other served pods through the proxy, as the operator does.
        if let Some(proxy) = &self.proxy {
            cmd.env("HTTP_PROXY", proxy.url())
                .env("NO_PROXY", "127.0.0.1,localhost");
        }
        for (k, v) in &env {
            match self.map_url(v, default_db.as_ref()) {
                Some(local) => cmd.env(k, local),
                None => cmd.env(k, v),
            };
        }
        // The pod listens on all interfaces; here, loopback only.
        let args: Vec<String> = argv[1..]
            .iter()
            .map(|a| {
                if a.starts_with("0.0.0.0:") {
                    format!("127.0.0.1:{port}")
                } else {
                    a.clone()
                }
            })
            .collect();
        std::fs::create_dir_all(&self.scratch).ok();
        let log = self.served[name].log.clone();
        let file = std::fs::File::create(&log).unwrap_or_else(|e| panic!("create {}: {e}", log.display()));
        let err = file.try_clone().unwrap_or_else(|e| panic!("dup log: {e}"));
        cmd.args(&args)
            .stdin(std::process::Stdio::null())
            .stdout(file)
            .stderr(err);
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("start {program} for {name}: {e}"));
        // Ready when /readyz answers 200, as the readiness probe would see it; a container without
        // a readiness probe (payout-executor serves nothing) is ready once it runs.
        let probed = c.readiness_probe.is_some();
        let ready =
            dlock_testkit::wait::poll(Duration::from_secs(60), Duration::from_millis(50), async || {
                if let Ok(Some(status)) = child.try_wait() {
                    panic!(
                        "{program} for {name} exited ({status}):\n{}",
                        operator::tail(&log, 40)
                    );
                }
                if !probed {
                    return Ok(());
                }
                match self
                    .http
                    .get(format!("http://127.0.0.1:{port}/readyz"))
                    .send()
                    .await
                {
                    Ok(r) if r.status().as_u16() == 200 => Ok(()),
                    Ok(r) => Err(format!("status {}", r.status())),
                    Err(e) => Err(e.to_string()),
                }
            })
            .await;
        if let Err(last) = ready {
            panic!(
                "{program} for {name} not ready within 60 s ({last}):\n{}",
                operator::tail(&log, 40)
            );
        }
        self.ensure_default_service_account().await;
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some(format!("{name}-local")),
                labels: template.metadata.as_ref().and_then(|m| m.labels.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(pod_spec(c, None)),
            ..Pod::default()
        };
        k8s::apply(&self.api::<Pod>(), &pod).await;
        let served = self
            .served
            .get_mut(name)
            .unwrap_or_else(|| panic!("{name} is not served"));
        if let Some(proxy) = &self.proxy {
            proxy.route(&served.authority, port);
        }
        served.process = Some(child);
        served.port = port;
        served.starts += 1;
        served.template = serde_json::to_value(template).ok();
    }

    async fn stop_served(&mut self, name: &str) {
        let Some(served) = self.served.get_mut(name) else {
            return;
        };
        if let Some(proxy) = &self.proxy {
            proxy.unroute(&served.authority);
        }
        if let Some(mut child) = served.process.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        // The pod is gone only once its process is: delete its object afterwards (at once, as
        // `kubectl delete --grace-period=0 --force` would; not waiting for it to go).
        let pod = format!("{name}-local");
        match self
            .api::<Pod>()
            .delete(&pod, &DeleteParams::default().grace_period(0))
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => panic!("delete Pod {pod}: {e}"),
        }
    }

    /// A database URL mapped to its local database: by host first, else `default`.
    fn map_url(&self, value: &str, default: Option<&TestDb>) -> Option<String> {
        let url = url::Url::parse(value).ok()?;
        let host = url.host_str().unwrap_or_default();
        // By host first; else by the database the operator's Service name says it is
        // (`<owner>-lockdb.…` / `<owner>-paydb.…`); else `default`.
        let by_name = if host.contains("-paydb.") {
            self.databases.get(&History::Paydb)
        } else if host.contains("-lockdb.") {
            self.databases.get(&History::Lockdb)
        } else {
            None
        };
        let db = self.hosts.get(host).or(by_name).or(default)?;
        map_database_url(value, db)
    }

    /// Uses `db` for `history` instead of a fresh blank database (e.g. one prepared to fail).
    pub fn use_database(&mut self, history: History, db: TestDb) {
        self.databases.insert(history, db);
    }

    /// Marks every Deployment and StatefulSet in the namespace as fully rolled out.
    pub async fn workloads_ready(&self) {
        for d in k8s::list(&self.api::<Deployment>()).await {
            // A served Deployment whose process is not running has no ready pod yet: its status
            // waits for the next pass, after `sync_served` started it, as a readiness probe would.
            let unstarted = self
                .served
                .get(&d.name_any())
                .is_some_and(|s| s.process.is_none() && k8s::replicas(&d) > 0);
            let n = k8s::replicas(&d);
            let st = d.status.as_ref();
            let rolled_out = observed_current(&d, st.and_then(|s| s.observed_generation))
                && st.and_then(|s| s.ready_replicas).unwrap_or(0) == n;
            if !rolled_out && !unstarted {
                let status = Deployment {
                    status: Some(deployment_status(&d)),
                    ..Deployment::default()
                };
                write_status(&self.api(), &d.name_any(), &status).await;
            }
        }
        for s in k8s::list(&self.api::<StatefulSet>()).await {
            let n = k8s::sts_replicas(&s);
            let st = s.status.as_ref();
            let rolled_out = observed_current(&s, st.and_then(|s| s.observed_generation))
                && st.and_then(|s| s.ready_replicas).unwrap_or(0) == n;
            if !rolled_out {
                self.statefulset_ready(&s.name_any(), n).await;
            }
        }
    }

    /// Writes StatefulSet `name`'s status as its controller would with `ready` of its pods ready.
    pub async fn statefulset_ready(&self, name: &str, ready: i32) {
        let api = self.api::<StatefulSet>();
        let s = k8s::must_get(&api, name).await;
        let n = k8s::sts_replicas(&s);
        let status = StatefulSet {
            status: Some(StatefulSetStatus {
                observed_generation: s.metadata.generation,
                replicas: n,
                ready_replicas: Some(ready),
                current_replicas: Some(n),
                updated_replicas: Some(n),
                available_replicas: Some(ready),
                ..StatefulSetStatus::default()
            }),
            ..StatefulSet::default()
        };
        write_status(&api, name, &status).await;
    }

    /// Runs every Job in the namespace that has not run yet and has no terminal status; returns
    /// the runs of this call.
    pub async fn run_pending_jobs(&mut self) -> Vec<JobRun> {
        let mut done = Vec::new();
        for job in k8s::list(&self.api::<Job>()).await {
            let uid = job.uid().unwrap_or_default();
            if self.ran.contains(&uid) || job_finished(&job) {
                continue;
            }
            let run = self.run_job(&job).await;
            self.ran.insert(uid);
            self.write_job_status(&job, run.succeeded()).await;
            self.runs.push(run.clone());
            done.push(run);
        }
        done
    }

    /// One pass of everything: jobs, served processes, then workload status.
    pub async fn step(&mut self) -> Vec<JobRun> {
        let runs = self.run_pending_jobs().await;
        self.sync_served().await;
        self.workloads_ready().await;
        runs
    }

    /// Executes the Job's container the way its pod would run it.
    pub async fn run_job(&mut self, job: &Job) -> JobRun {
        let name = job.name_any();
        let template = &job.spec.as_ref().expect("a Job has a spec").template;
        let c = k8s::container(template, &format!("Job {name}"));
        let argv = k8s::argv(c);
        assert!(
            !argv.is_empty(),
            "Job {name} has no command: the image's entrypoint is the operator, so a migration Job must name dlock-migrate"
        );
        let env = self.container_env(c, &format!("{name}-run")).await;
        let migrations = dlock_testkit::migrations_root();
        let argv: Vec<String> = argv.iter().map(|a| map_migrations_path(a, &migrations)).collect();
        let program_name = Path::new(&argv[0])
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        // dlock-fastforward's DATABASE_URL is lockdb; its paydb URLs map by host.
        let history = history_of(&argv)
            .or_else(|| (program_name == "dlock-fastforward").then_some(History::Lockdb))
            .unwrap_or_else(|| {
                panic!("Job {name}: cannot tell lockdb from paydb in its args {argv:?} (expected a /migrations/<history> dir)")
            });
        let db = self.databases.get(&history).cloned().unwrap_or_else(|| {
            panic!(
                "Job {name} migrates {}, but the stand-in has no local database for it",
                history.name()
            )
        });

        let program = Path::new(&argv[0])
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let binary = env::workspace_bin(&program);
        let mut cmd = tokio::process::Command::new(&binary);
        cmd.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default());
        let mut mapped_url = false;
        for (k, v) in &env {
            if let Some(local) = self.map_url(v, Some(&db)) {
                cmd.env(k, local);
                mapped_url = true;
            } else {
                cmd.env(k, v);
            }
        }
        let args: Vec<String> = argv[1..]
            .iter()
            .map(|a| match map_database_url(a, &db) {
                Some(local) => {
                    mapped_url = true;
                    local
                }
                None => match a.split_once('=') {
                    Some((flag, v)) if flag.starts_with("--") => match map_database_url(v, &db) {
                        Some(local) => {
                            mapped_url = true;
                            format!("{flag}={local}")
                        }
                        None => a.clone(),
                    },
                    _ => a.clone(),
                },
            })
            .collect();
        assert!(
            mapped_url,
            "Job {name}: no postgres:// URL in its env or args (env names: {:?})",
            env.keys().collect::<Vec<_>>()
        );
        // The termination-message file the kubelet would provide, if the container writes one.
        // (The API server defaults terminationMessagePath for every container; only a container
        // that names it in its args writes a report there.)
        let termination_path = c
            .termination_message_path
            .clone()
            .filter(|p| args.iter().any(|a| a == p));
        let report_file = self.scratch.join(format!("{name}.termination-log"));
        let args: Vec<String> = args
            .into_iter()
            .map(|a| match &termination_path {
                Some(p) if *p == a => report_file.to_string_lossy().into_owned(),
                _ => a,
            })
            .collect();
        if termination_path.is_some() {
            std::fs::create_dir_all(&self.scratch).ok();
        }
        cmd.args(&args);
        let out = cmd
            .output()
            .await
            .unwrap_or_else(|e| panic!("run {} for Job {name}: {e}", binary.display()));
        if termination_path.is_some() {
            let message = std::fs::read_to_string(&report_file).unwrap_or_default();
            self.write_job_pod(job, c, out.status.code(), &message).await;
        }
        JobRun {
            job: name,
            history,
            database: db,
            exit_code: out.status.code(),
            argv,
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// The container's Secret volume mounts, each written to a directory of its own under the
    /// scratch directory as the kubelet would project it (the `items` named, else every key):
    /// `(mount path, local directory)`. Other volumes are not mounted.
    async fn secret_mounts(
        &self,
        name: &str,
        template: &k8s_openapi::api::core::v1::PodTemplateSpec,
        c: &Container,
    ) -> Vec<(String, String)> {
        let volumes = template
            .spec
            .as_ref()
            .and_then(|p| p.volumes.clone())
            .unwrap_or_default();
        let mut out = Vec::new();
        for m in c.volume_mounts.iter().flatten() {
            let Some(source) = volumes
                .iter()
                .find(|v| v.name == m.name)
                .and_then(|v| v.secret.as_ref())
            else {
                continue;
            };
            let secret = source.secret_name.clone().unwrap_or_default();
            // An optional Secret that does not exist is an empty volume (e.g. a database CA the
            // spec does not name); a missing required one keeps the pod from starting.
            if source.optional == Some(true) && k8s::get(&self.api::<Secret>(), &secret).await.is_none() {
                continue;
            }
            let data = self.secret_data(&secret).await;
            let dir = self.scratch.join(format!("{name}-volumes")).join(&m.name);
            std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
            let files: Vec<(String, String)> = match &source.items {
                Some(items) => items.iter().map(|i| (i.key.clone(), i.path.clone())).collect(),
                None => data.keys().map(|k| (k.clone(), k.clone())).collect(),
            };
            for (key, path) in files {
                let value = data.get(&key).unwrap_or_else(|| {
                    panic!(
                        "volume {}: Secret {secret} has no key {key} (the pod would not start)",
                        m.name
                    )
                });
                let file = dir.join(&path);
                std::fs::write(&file, value).unwrap_or_else(|e| panic!("write {}: {e}", file.display()));
            }
            out.push((
                m.mount_path.trim_end_matches('/').to_owned(),
                dir.to_string_lossy().into_owned(),
            ));
        }
        out
    }

    /// The container's environment as the kubelet would build it: `env` values (with `$(NAME)` of
    /// a variable defined before expanded, `$$` for a `$`), Secret and ConfigMap key references, the
    /// pod's name and namespace from the downward API (`pod` is the name), and `envFrom`.
    async fn container_env(&self, c: &Container, pod: &str) -> BTreeMap<String, String> {
        let mut env = BTreeMap::new();
        for from in c.env_from.iter().flatten() {
            let prefix = from.prefix.as_deref().unwrap_or_default();
            if let Some(r) = &from.secret_ref {
                for (k, v) in self.secret_data(&r.name).await {
                    env.insert(format!("{prefix}{k}"), v);
                }
            }
            if let Some(r) = &from.config_map_ref {
                for (k, v) in self.configmap_data(&r.name).await {
                    env.insert(format!("{prefix}{k}"), v);
                }
            }
        }
        for e in c.env.iter().flatten() {
            let key = e.name.clone();
            let from = e.value_from.as_ref();
            if let Some(v) = &e.value {
                let expanded = expand(v, &env);
                env.insert(key, expanded);
            } else if let Some(f) = from.and_then(|f| f.field_ref.as_ref()) {
                match f.field_path.as_str() {
                    "metadata.name" => env.insert(key, pod.to_owned()),
                    "metadata.namespace" => env.insert(key, self.ns.clone()),
                    other => panic!("env {key}: the stand-in gives no {other}"),
                };
            } else if let Some(r) = from.and_then(|f| f.secret_key_ref.as_ref()) {
                match self.secret_data(&r.name).await.remove(&r.key) {
                    Some(v) => {
                        env.insert(key, v);
                    }
                    None if r.optional == Some(true) => {}
                    None => panic!(
                        "env {key}: Secret {} has no key {} (the pod would not start)",
                        r.name, r.key
                    ),
                }
            } else if let Some(r) = from.and_then(|f| f.config_map_key_ref.as_ref())
                && let Some(v) = self.configmap_data(&r.name).await.remove(&r.key)
            {
                env.insert(key, v);
            }
        }
        env
    }

    async fn secret_data(&self, name: &str) -> BTreeMap<String, String> {
        let secret = k8s::get(&self.api::<Secret>(), name).await.unwrap_or_else(|| {
            panic!(
                "Secret {}/{name} does not exist (the pod would not start)",
                self.ns
            )
        });
        secret
            .data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
            .collect()
    }

    async fn configmap_data(&self, name: &str) -> BTreeMap<String, String> {
        let cm = k8s::get(&self.api::<ConfigMap>(), name).await.unwrap_or_else(|| {
            panic!(
                "ConfigMap {}/{name} does not exist (the pod would not start)",
                self.ns
            )
        });
        cm.data.unwrap_or_default()
    }

    /// The Job's ended pod, as the Job controller and kubelet leave it: labelled with the Job's name,
    /// its container terminated with the exit code and the termination message.
    async fn write_job_pod(&self, job: &Job, c: &Container, exit_code: Option<i32>, message: &str) {
        self.ensure_default_service_account().await;
        let name = job.name_any();
        let pod_name = format!("{name}-run");
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some(pod_name.clone()),
                labels: Some(BTreeMap::from([
                    ("batch.kubernetes.io/job-name".to_owned(), name.clone()),
                    ("job-name".to_owned(), name.clone()),
                ])),
                ..ObjectMeta::default()
            },
            spec: Some(pod_spec(c, Some("Never"))),
            ..Pod::default()
        };
        let api = self.api::<Pod>();
        k8s::apply(&api, &pod).await;
        let now = now();
        let code = exit_code.unwrap_or(137);
        let status = Pod {
            status: Some(PodStatus {
                phase: Some(if code == 0 { "Succeeded" } else { "Failed" }.to_owned()),
                container_statuses: Some(vec![ContainerStatus {
                    name: c.name.clone(),
                    image: c.image.clone().unwrap_or_default(),
                    image_id: String::new(),
                    ready: false,
                    restart_count: 0,
                    state: Some(ContainerState {
                        terminated: Some(ContainerStateTerminated {
                            exit_code: code,
                            reason: Some(if code == 0 { "Completed" } else { "Error" }.to_owned()),
                            message: Some(message.to_owned()),
                            started_at: Some(now.clone()),
                            finished_at: Some(now),
                            ..ContainerStateTerminated::default()
                        }),
                        ..ContainerState::default()
                    }),
                    ..ContainerStatus::default()
                }]),
                ..PodStatus::default()
            }),
            ..Pod::default()
        };
        write_status(&api, &pod_name, &status).await;
    }

    /// Writes the terminal status the Job controller writes after one pod exited with `succeeded`.
    pub async fn write_job_status(&self, job: &Job, succeeded: bool) {
        let status = Job {
            status: Some(job_status(succeeded)),
            ..Job::default()
        };
        write_status(&self.api(), &job.name_any(), &status).await;
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        for s in self.served.values_mut() {
            if let Some(mut c) = s.process.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

/// Metadata with only a name.
fn named(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        ..ObjectMeta::default()
    }
}

/// The pod spec of a stand-in pod: the container's name and image (what the operator looks at).
fn pod_spec(c: &Container, restart_policy: Option<&str>) -> PodSpec {
    PodSpec {
        containers: vec![Container {
            name: c.name.clone(),
            image: c.image.clone(),
            ..Container::default()
        }],
        restart_policy: restart_policy.map(str::to_owned),
        ..PodSpec::default()
    }
}

/// A merge patch of `obj`'s status through the status subresource, as a controller (or the kubelet)
/// writes it.
async fn write_status<K: Kind>(api: &Api<K>, name: &str, obj: &K) {
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(obj))
        .await
        .unwrap_or_else(|e| panic!("write the status of {}/{name}: {e}", K::kind(&())));
}

/// `metadata.generation` and `status.observedGeneration` agree (the controller has seen the latest
/// spec).
fn observed_current<K: Kind>(obj: &K, observed: Option<i64>) -> bool {
    obj.meta().generation.is_some() && observed == obj.meta().generation
}

/// `/migrations/lockdb` (the image's path) → `<repo>/migrations/lockdb`, also inside `--dir=...`.
fn map_migrations_path(arg: &str, root: &Path) -> String {
    let root = root.to_string_lossy();
    if let Some(rest) = arg.strip_prefix("/migrations/") {
        return format!("{root}/{rest}");
    }
    if let Some((flag, v)) = arg.split_once('=')
        && let Some(rest) = v.strip_prefix("/migrations/")
    {
        return format!("{flag}={root}/{rest}");
    }
    arg.to_owned()
}

/// Which history the Job migrates, from the migrations dir in its args.
fn history_of(argv: &[String]) -> Option<History> {
    argv.iter().find_map(|a| {
        let a = a.trim_end_matches('/');
        if a.ends_with("migrations/lockdb") {
            Some(History::Lockdb)
        } else if a.ends_with("migrations/paydb") {
            Some(History::Paydb)
        } else {
            None
        }
    })
}

/// A `postgres://` URL pointed at the local test database instead (superuser `postgres`, which
/// the local server trusts); `None` for anything that is not such a URL. The password, if any, is
/// dropped: the cluster's generated one means nothing to the local server. So is what the URL asks
/// of TLS (`sslmode`, `sslrootcert`: a managed database with HTTPS on is verified against the
/// namespace's CA): the local server speaks none, and the kind tier checks TLS on a real one.
pub fn map_database_url(value: &str, db: &TestDb) -> Option<String> {
    let url = url::Url::parse(value).ok()?;
    if !matches!(url.scheme(), "postgres" | "postgresql") {
        return None;
    }
    let mut local = url.clone();
    let kept: Vec<(String, String)> = url
        .query_pairs()
        .filter(|(k, _)| k != "sslmode" && k != "sslrootcert")
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    local.set_query(None);
    if !kept.is_empty() {
        local.query_pairs_mut().extend_pairs(kept);
    }
    local.set_host(Some("127.0.0.1")).ok()?;
    local.set_port(Some(db.port)).ok()?;
    local.set_username("postgres").ok()?;
    local.set_password(None).ok()?;
    local.set_path(&format!("/{}", db.name));
    Some(local.to_string())
}

fn job_finished(job: &Job) -> bool {
    job.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")
}

/// The status the Job controller writes when its one pod ended. The API server (1.34) validates
/// the terminal transition: startTime, completionTime on success, and the SuccessCriteriaMet /
/// FailureTarget interim condition before Complete / Failed.
pub fn job_status(succeeded: bool) -> JobStatus {
    let now = now();
    let condition = |type_: &str, reason: &str, message: &str| JobCondition {
        type_: type_.to_owned(),
        status: "True".to_owned(),
        reason: Some(reason.to_owned()),
        message: Some(message.to_owned()),
        last_probe_time: Some(now.clone()),
        last_transition_time: Some(now.clone()),
    };
    let counts = JobStatus {
        start_time: Some(now.clone()),
        active: Some(0),
        ready: Some(0),
        terminating: Some(0),
        uncounted_terminated_pods: Some(UncountedTerminatedPods::default()),
        ..JobStatus::default()
    };
    if succeeded {
        const DONE: &str = "Reached expected number of succeeded pods";
        JobStatus {
            completion_time: Some(now.clone()),
            succeeded: Some(1),
            failed: Some(0),
            conditions: Some(vec![
                condition("SuccessCriteriaMet", "CompletionsReached", DONE),
                condition("Complete", "CompletionsReached", DONE),
            ]),
            ..counts
        }
    } else {
        const FAILED: &str = "Job has reached the specified backoff limit";
        JobStatus {
            succeeded: Some(0),
            failed: Some(1),
            conditions: Some(vec![
                condition("FailureTarget", "BackoffLimitExceeded", FAILED),
                condition("Failed", "BackoffLimitExceeded", FAILED),
            ]),
            ..counts
        }
    }
}

/// The status the Deployment controller writes once every replica is available.
fn deployment_status(d: &Deployment) -> DeploymentStatus {
    let n = k8s::replicas(d);
    let now = now();
    let condition = |type_: &str, reason: &str, message: &str| DeploymentCondition {
        type_: type_.to_owned(),
        status: "True".to_owned(),
        reason: Some(reason.to_owned()),
        message: Some(message.to_owned()),
        last_update_time: Some(now.clone()),
        last_transition_time: Some(now.clone()),
    };
    DeploymentStatus {
        observed_generation: d.metadata.generation,
        replicas: Some(n),
        updated_replicas: Some(n),
        ready_replicas: Some(n),
        available_replicas: Some(n),
        conditions: Some(vec![
            condition(
                "Available",
                "MinimumReplicasAvailable",
                "Deployment has minimum availability.",
            ),
            condition(
                "Progressing",
                "NewReplicaSetAvailable",
                "ReplicaSet has successfully progressed.",
            ),
        ]),
        ..DeploymentStatus::default()
    }
}

/// Now, as the API server stores times (seconds precision, UTC: `2024-01-01T00:00:00Z`).
fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

/// The kubelet's expansion of an env value: `$(NAME)` of a variable in `defined` is replaced by its
/// value, `$$` by `$`; anything else is left as it is (as the kubelet leaves an unknown `$(NAME)`).
fn expand(value: &str, defined: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    let mut rest = value;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some((name, tail)) = after.strip_prefix('(').and_then(|a| a.split_once(')'))
            && let Some(v) = defined.get(name)
        {
            out.push_str(v);
            rest = tail;
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_values_expand_variables_defined_before_as_the_kubelet_does() {
        let defined = BTreeMap::from([("POD_NAME".to_owned(), "shop-payout-executor-0".to_owned())]);
        assert_eq!(
            expand("shop/$(POD_NAME)", &defined),
            "shop/shop-payout-executor-0"
        );
        assert_eq!(
            expand("$$(POD_NAME) $(OTHER) $", &defined),
            "$(POD_NAME) $(OTHER) $"
        );
        assert_eq!(expand("a$(POD_NAME", &defined), "a$(POD_NAME");
    }

    #[test]
    fn timestamps_are_rfc3339_in_seconds_and_utc() {
        let now = serde_json::to_value(now()).expect("a Time serializes");
        let now = now.as_str().expect("as a string");
        assert_eq!(now.len(), "2024-01-01T00:00:00Z".len(), "{now}");
        assert!(now.ends_with('Z'), "{now}");
        assert!(chrono::DateTime::parse_from_rfc3339(now).is_ok(), "{now}");
    }

    #[test]
    fn migrations_paths_map_to_the_repository() {
        let root = Path::new("/repo/migrations");
        assert_eq!(
            map_migrations_path("/migrations/lockdb", root),
            "/repo/migrations/lockdb"
        );
        assert_eq!(
            map_migrations_path("--dir=/migrations/paydb", root),
            "--dir=/repo/migrations/paydb"
        );
        assert_eq!(map_migrations_path("--info", root), "--info");
    }

    #[test]
    fn database_urls_map_to_the_local_database() {
        let db = TestDb {
            name: "lockdb_1_2".into(),
            port: 5999,
            history: History::Lockdb,
        };
        assert_eq!(
            map_database_url(
                "postgres://admin:s3cret@lockdb.ns.svc:5432/lockdb?sslmode=disable",
                &db
            )
            .as_deref(),
            Some("postgres://postgres@127.0.0.1:5999/lockdb_1_2")
        );
        // What the URL asks of TLS is dropped (the local server has none); the rest is kept.
        assert_eq!(
            map_database_url(
                "postgres://a:b@x-lockdb.ns.svc:5432/lockdb?sslmode=verify-full&sslrootcert=%2Fetc%2Fca.crt&application_name=m",
                &db
            )
            .as_deref(),
            Some("postgres://postgres@127.0.0.1:5999/lockdb_1_2?application_name=m")
        );
        assert_eq!(map_database_url("lockapp", &db), None);
        assert_eq!(map_database_url("http://x/y", &db), None);
    }
}
