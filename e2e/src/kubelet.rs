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
        }
    }

    /// Uses `db` for `history` instead of a fresh blank database (e.g. one prepared to fail).
    pub fn use_database(&mut self, history: History, db: TestDb) {
        self.databases.insert(history, db);
    }

    /// Marks every Deployment and StatefulSet in the namespace as fully rolled out.
    pub fn workloads_ready(&self) {
        for d in self.kubectl.list(&self.ns, "deployments") {
            if !rolled_out(&d) {
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

    /// One pass of everything: jobs, then workload status.
    pub fn step(&mut self) -> Vec<JobRun> {
        let runs = self.run_pending_jobs();
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
        let history = history_of(&argv).unwrap_or_else(|| {
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
            if let Some(local) = map_database_url(v, &db) {
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
        cmd.args(&args);
        let out = cmd
            .output()
            .unwrap_or_else(|e| panic!("run {} for Job {name}: {e}", binary.display()));
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

    /// Writes the terminal status the Job controller writes after one pod exited with `succeeded`.
    pub fn write_job_status(&self, job: &Value, succeeded: bool) {
        self.kubectl
            .patch_status(&self.ns, "job", objects::name(job), &job_status(succeeded))
            .ok();
    }
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

/// Seconds-precision UTC time, as the API server stores it (no chrono needed for one format).
fn now_rfc3339() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Days since 1970-01-01 → (year, month, day), proleptic Gregorian (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_723), (2024, 1, 1));
        assert_eq!(civil_from_days(19_782), (2024, 2, 29));
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
