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
use std::process::Command;

use base64::Engine;
use dlock_testkit::{History, TestDb};
use serde_json::{Value, json};

use crate::proxy::Proxy;
use crate::{Kubectl, env, objects};

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
    kubectl: Kubectl,
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
}

impl Kubelet {
    /// A stand-in for namespace `ns`, with a fresh, empty local database for each of `histories`
    /// (the migration Jobs fill them).
    pub async fn new(kubectl: &Kubectl, ns: &str, histories: &[History]) -> Self {
        let mut databases = HashMap::new();
        for h in histories {
            databases.insert(*h, dlock_testkit::blank(*h).await);
        }
        Kubelet {
            kubectl: kubectl.clone(),
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
        }
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
    pub fn sync_served(&mut self) {
        let names: Vec<String> = self.served.keys().cloned().collect();
        for name in names {
            let dep = self.kubectl.get(Some(&self.ns), "deployment", &name);
            let want = dep.as_ref().is_some_and(|d| objects::replicas(d) > 0);
            let running = self.served.get(&name).is_some_and(|s| s.process.is_some());
            if want && !running {
                let dep = dep.unwrap_or_default();
                self.start_served(&name, &dep);
            } else if !want && running {
                self.stop_served(&name);
            }
        }
    }

    /// The namespace's `default` ServiceAccount, which the controller-manager would create and pod
    /// admission requires.
    fn ensure_default_service_account(&self) {
        if self
            .kubectl
            .get(Some(&self.ns), "serviceaccount", "default")
            .is_none()
        {
            let sa = json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}});
            let _ = self
                .kubectl
                .run_stdin(&["create", "-n", &self.ns, "-f", "-"], &sa.to_string());
        }
    }

    fn start_served(&mut self, name: &str, dep: &Value) {
        let c = &dep["spec"]["template"]["spec"]["containers"][0];
        let mut argv: Vec<String> = strings(&c["command"]);
        argv.extend(strings(&c["args"]));
        let env = self.container_env(c);
        let history = self.served[name].history;
        let default_db = self.databases.get(&history).cloned();
        let port = dlock_testkit::procs::free_port().unwrap_or_else(|e| panic!("free port: {e}"));
        let program = Path::new(&argv[0])
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut cmd = Command::new(env::workspace_bin(&program));
        cmd.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default());
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
        // Ready when /readyz answers 200, as the readiness probe would see it.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "{program} for {name} exited ({status}):\n{}",
                    crate::operator::tail(&log, 40)
                );
            }
            if http_ready(port) {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{program} for {name} not ready within 60 s:\n{}",
                crate::operator::tail(&log, 40)
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let labels = dep["spec"]["template"]["metadata"]["labels"].clone();
        self.ensure_default_service_account();
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("{name}-local"), "labels": labels},
            "spec": {"containers": [{"name": c["name"], "image": c["image"]}]},
        });
        self.kubectl.apply(&self.ns, &pod).ok();
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
    }

    fn stop_served(&mut self, name: &str) {
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
        // The pod is gone only once its process is: delete its object afterwards.
        self.kubectl
            .run(&[
                "delete",
                "pod",
                &format!("{name}-local"),
                "-n",
                &self.ns,
                "--grace-period=0",
                "--force",
                "--ignore-not-found",
                "--wait=false",
            ])
            .ok();
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
    pub fn workloads_ready(&self) {
        for d in self.kubectl.list(&self.ns, "deployments") {
            // A served Deployment whose process is not running has no ready pod yet: its status
            // waits for the next pass, after `sync_served` started it, as a readiness probe would.
            let unstarted = self
                .served
                .get(objects::name(&d))
                .is_some_and(|s| s.process.is_none() && objects::replicas(&d) > 0);
            if !rolled_out(&d) && !unstarted {
                self.kubectl
                    .patch_status(&self.ns, "deployment", objects::name(&d), &deployment_status(&d))
                    .ok();
            }
        }
        for s in self.kubectl.list(&self.ns, "statefulsets") {
            if !rolled_out(&s) {
                self.kubectl
                    .patch_status(
                        &self.ns,
                        "statefulset",
                        objects::name(&s),
                        &statefulset_status(&s),
                    )
                    .ok();
            }
        }
    }

    /// Runs every Job in the namespace that has not run yet and has no terminal status; returns
    /// the runs of this call.
    pub fn run_pending_jobs(&mut self) -> Vec<JobRun> {
        let mut done = Vec::new();
        for job in self.kubectl.list(&self.ns, "jobs") {
            let uid = objects::uid(&job).to_owned();
            if self.ran.contains(&uid) || job_finished(&job) {
                continue;
            }
            let run = self.run_job(&job);
            self.ran.insert(uid);
            self.write_job_status(&job, run.succeeded());
            self.runs.push(run.clone());
            done.push(run);
        }
        done
    }

    /// One pass of everything: jobs, served processes, then workload status.
    pub fn step(&mut self) -> Vec<JobRun> {
        let runs = self.run_pending_jobs();
        self.sync_served();
        self.workloads_ready();
        runs
    }

    /// Executes the Job's container the way its pod would run it.
    pub fn run_job(&mut self, job: &Value) -> JobRun {
        let name = objects::name(job).to_owned();
        let c = objects::container(job);
        let mut argv: Vec<String> = strings(&c["command"]);
        argv.extend(strings(&c["args"]));
        assert!(
            !argv.is_empty(),
            "Job {name} has no command: the image's entrypoint is the operator, so a migration Job must name dlock-migrate"
        );
        let env = self.container_env(c);

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
        let mut cmd = Command::new(&binary);
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
        let termination_path = c["terminationMessagePath"]
            .as_str()
            .map(str::to_owned)
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
            .unwrap_or_else(|e| panic!("run {} for Job {name}: {e}", binary.display()));
        if termination_path.is_some() {
            let message = std::fs::read_to_string(&report_file).unwrap_or_default();
            self.write_job_pod(job, out.status.code(), &message);
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

    /// The container's environment as the kubelet would build it: `env` values, Secret and
    /// ConfigMap key references, and `envFrom`.
    fn container_env(&self, c: &Value) -> BTreeMap<String, String> {
        let mut env = BTreeMap::new();
        for from in c["envFrom"].as_array().into_iter().flatten() {
            let prefix = from["prefix"].as_str().unwrap_or_default();
            if let Some(name) = from["secretRef"]["name"].as_str() {
                for (k, v) in self.secret_data(name) {
                    env.insert(format!("{prefix}{k}"), v);
                }
            }
            if let Some(name) = from["configMapRef"]["name"].as_str() {
                for (k, v) in self.configmap_data(name) {
                    env.insert(format!("{prefix}{k}"), v);
                }
            }
        }
        for e in c["env"].as_array().into_iter().flatten() {
            let key = e["name"].as_str().unwrap_or_default().to_owned();
            if let Some(v) = e["value"].as_str() {
                env.insert(key, v.to_owned());
            } else if let Some(r) = e["valueFrom"]["secretKeyRef"].as_object() {
                let (name, k) = (
                    r["name"].as_str().unwrap_or_default(),
                    r["key"].as_str().unwrap_or_default(),
                );
                let data = self.secret_data(name);
                match data.get(k) {
                    Some(v) => {
                        env.insert(key, v.clone());
                    }
                    None if r.get("optional").and_then(Value::as_bool) == Some(true) => {}
                    None => panic!("env {key}: Secret {name} has no key {k} (the pod would not start)"),
                }
            } else if let Some(r) = e["valueFrom"]["configMapKeyRef"].as_object() {
                let (name, k) = (
                    r["name"].as_str().unwrap_or_default(),
                    r["key"].as_str().unwrap_or_default(),
                );
                if let Some(v) = self.configmap_data(name).get(k) {
                    env.insert(key, v.clone());
                }
            }
        }
        env
    }

    fn secret_data(&self, name: &str) -> BTreeMap<String, String> {
        let secret = self
            .kubectl
            .get(Some(&self.ns), "secret", name)
            .unwrap_or_else(|| {
                panic!(
                    "Secret {}/{name} does not exist (the pod would not start)",
                    self.ns
                )
            });
        let mut out = BTreeMap::new();
        for (k, v) in secret["data"].as_object().into_iter().flatten() {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(v.as_str().unwrap_or_default())
                .unwrap_or_else(|e| panic!("Secret {name} key {k} is not base64: {e}"));
            out.insert(k.clone(), String::from_utf8_lossy(&bytes).into_owned());
        }
        out
    }

    fn configmap_data(&self, name: &str) -> BTreeMap<String, String> {
        let cm = self
            .kubectl
            .get(Some(&self.ns), "configmap", name)
            .unwrap_or_else(|| {
                panic!(
                    "ConfigMap {}/{name} does not exist (the pod would not start)",
                    self.ns
                )
            });
        cm["data"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
            .collect()
    }

    /// The Job's ended pod, as the Job controller and kubelet leave it: labelled with the Job's name,
    /// its container terminated with the exit code and the termination message.
    fn write_job_pod(&self, job: &Value, exit_code: Option<i32>, message: &str) {
        self.ensure_default_service_account();
        let name = objects::name(job);
        let c = objects::container(job);
        let pod_name = format!("{name}-run");
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod_name, "labels": {
                "batch.kubernetes.io/job-name": name, "job-name": name}},
            "spec": {"restartPolicy": "Never", "containers": [{"name": c["name"], "image": c["image"]}]},
        });
        self.kubectl.apply(&self.ns, &pod).ok();
        let now = now_rfc3339();
        let code = exit_code.unwrap_or(137);
        let status = json!({"status": {
            "phase": if code == 0 { "Succeeded" } else { "Failed" },
            "containerStatuses": [{
                "name": c["name"], "image": c["image"], "imageID": "", "ready": false, "restartCount": 0,
                "state": {"terminated": {
                    "exitCode": code, "reason": if code == 0 { "Completed" } else { "Error" },
                    "message": message, "startedAt": now, "finishedAt": now}},
            }],
        }});
        self.kubectl
            .patch_status(&self.ns, "pod", &pod_name, &status)
            .ok();
    }

    /// Writes the terminal status the Job controller writes after one pod exited with `succeeded`.
    pub fn write_job_status(&self, job: &Value, succeeded: bool) {
        self.kubectl
            .patch_status(&self.ns, "job", objects::name(job), &job_status(succeeded))
            .ok();
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

/// `GET /readyz` answers 200.
fn http_ready(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(std::time::Duration::from_secs(2)));
    if write!(s, "GET /readyz HTTP/1.0\r\nHost: x\r\n\r\n").is_err() {
        return false;
    }
    let mut buf = String::new();
    let _ = s.read_to_string(&mut buf);
    buf.split_whitespace().nth(1) == Some("200")
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_str().map(str::to_owned))
        .collect()
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
/// dropped: the cluster's generated one means nothing to the local server.
pub fn map_database_url(value: &str, db: &TestDb) -> Option<String> {
    let url = url::Url::parse(value).ok()?;
    if !matches!(url.scheme(), "postgres" | "postgresql") {
        return None;
    }
    let mut local = url.clone();
    local.set_host(Some("127.0.0.1")).ok()?;
    local.set_port(Some(db.port)).ok()?;
    local.set_username("postgres").ok()?;
    local.set_password(None).ok()?;
    local.set_path(&format!("/{}", db.name));
    Some(local.to_string())
}

fn job_finished(job: &Value) -> bool {
    objects::condition_is(job, "Complete", "True") || objects::condition_is(job, "Failed", "True")
}

/// The status the Job controller writes when its one pod ended. The API server (1.34) validates
/// the terminal transition: startTime, completionTime on success, and the SuccessCriteriaMet /
/// FailureTarget interim condition before Complete / Failed.
pub fn job_status(succeeded: bool) -> Value {
    let now = now_rfc3339();
    if succeeded {
        json!({"status": {
            "startTime": now, "completionTime": now,
            "active": 0, "succeeded": 1, "failed": 0, "ready": 0, "terminating": 0,
            "uncountedTerminatedPods": {},
            "conditions": [
                {"type": "SuccessCriteriaMet", "status": "True", "reason": "CompletionsReached",
                 "message": "Reached expected number of succeeded pods",
                 "lastProbeTime": now, "lastTransitionTime": now},
                {"type": "Complete", "status": "True", "reason": "CompletionsReached",
                 "message": "Reached expected number of succeeded pods",
                 "lastProbeTime": now, "lastTransitionTime": now},
            ],
        }})
    } else {
        json!({"status": {
            "startTime": now,
            "active": 0, "succeeded": 0, "failed": 1, "ready": 0, "terminating": 0,
            "uncountedTerminatedPods": {},
            "conditions": [
                {"type": "FailureTarget", "status": "True", "reason": "BackoffLimitExceeded",
                 "message": "Job has reached the specified backoff limit",
                 "lastProbeTime": now, "lastTransitionTime": now},
                {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                 "message": "Job has reached the specified backoff limit",
                 "lastProbeTime": now, "lastTransitionTime": now},
            ],
        }})
    }
}

fn rolled_out(obj: &Value) -> bool {
    let s = &obj["status"];
    objects::observed_current(obj) && s["readyReplicas"].as_i64().unwrap_or(0) == objects::replicas(obj)
}

fn deployment_status(d: &Value) -> Value {
    let n = objects::replicas(d);
    let now = now_rfc3339();
    json!({"status": {
        "observedGeneration": d["metadata"]["generation"],
        "replicas": n, "updatedReplicas": n, "readyReplicas": n, "availableReplicas": n,
        "conditions": [
            {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable",
             "message": "Deployment has minimum availability.",
             "lastUpdateTime": now, "lastTransitionTime": now},
            {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable",
             "message": "ReplicaSet has successfully progressed.",
             "lastUpdateTime": now, "lastTransitionTime": now},
        ],
    }})
}

fn statefulset_status(s: &Value) -> Value {
    let n = objects::replicas(s);
    json!({"status": {
        "observedGeneration": s["metadata"]["generation"],
        "replicas": n, "readyReplicas": n, "currentReplicas": n, "updatedReplicas": n,
        "availableReplicas": n,
    }})
}

/// Seconds-precision UTC time, as the API server stores it (`2024-01-01T00:00:00Z`).
fn now_rfc3339() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_rfc3339_in_seconds_and_utc() {
        let now = now_rfc3339();
        assert_eq!(now.len(), "2024-01-01T00:00:00Z".len(), "{now}");
        assert!(now.ends_with('Z'), "{now}");
        assert!(chrono::DateTime::parse_from_rfc3339(&now).is_ok(), "{now}");
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
            Some("postgres://postgres@127.0.0.1:5999/lockdb_1_2?sslmode=disable")
        );
        assert_eq!(map_database_url("lockapp", &db), None);
        assert_eq!(map_database_url("http://x/y", &db), None);
    }
}
