//! The operator under test: the built `dlock-operator` binary as a process, started with the command,
//! args and env of the chart's own Deployment (so chart and binary cannot drift apart unnoticed),
//! authenticated as the chart's ServiceAccount.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;

use crate::rbac::Identity;
use crate::{env, helm, k8s};

pub struct Operator {
    child: Child,
    http: reqwest::Client,
    pub log: PathBuf,
    pub metrics: SocketAddr,
    /// The argv it was started with (for messages).
    pub argv: Vec<String>,
}

impl Operator {
    /// Renders the chart's Deployment for `identity` (watchNamespace = its namespace, metrics on a
    /// free loopback port), starts the binary with that container's command/args/env and the
    /// identity's kubeconfig, and waits for `/readyz`.
    pub async fn start(helm_bin: &Path, identity: &Identity, dir: &Path) -> Operator {
        Operator::start_with_env(helm_bin, identity, dir, &[]).await
    }

    /// As [`Operator::start`], plus `extra` environment variables (e.g. `HTTP_PROXY` for the
    /// stand-in of Service DNS, see [`crate::proxy`]). The log is appended to, so a restarted
    /// operator keeps the earlier lines.
    pub async fn start_with_env(
        helm_bin: &Path,
        identity: &Identity,
        dir: &Path,
        extra: &[(&str, &str)],
    ) -> Operator {
        let port = dlock_testkit::procs::free_port().unwrap_or_else(|e| panic!("a free port: {e}"));
        let port_s = port.to_string();
        let yaml = helm::template(
            helm_bin,
            &identity.release,
            &identity.namespace,
            &[("watchNamespace", &identity.namespace), ("metrics.port", &port_s)],
            &["--show-only", "templates/deployment.yaml"],
        );
        let deps = helm::rendered::<Deployment>(&yaml);
        assert_eq!(deps.len(), 1, "the chart renders one Deployment");
        let template = deps[0]
            .spec
            .as_ref()
            .map(|s| &s.template)
            .expect("a Deployment has a spec");
        let c = k8s::container(template, "the chart's Deployment");

        let argv = k8s::argv(c);
        assert!(!argv.is_empty(), "the chart's container has no command");
        // The pod binds all interfaces; on a shared test machine, loopback only.
        let argv: Vec<String> = argv.iter().map(|a| a.replace("0.0.0.0:", "127.0.0.1:")).collect();
        let program = Path::new(&argv[0])
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let binary = env::workspace_bin(&program);

        let pod_name = env::unique_name("dlock-operator");
        let log = dir.join("operator.log");
        let log_file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap_or_else(|e| panic!("create {}: {e}", log.display()));
        let mut cmd = Command::new(&binary);
        cmd.args(&argv[1..])
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("KUBECONFIG", &identity.kubeconfig)
            .stdin(Stdio::null())
            .stdout(Stdio::from(
                log_file.try_clone().unwrap_or_else(|e| panic!("dup log: {e}")),
            ))
            .stderr(Stdio::from(log_file));
        for e in c.env.iter().flatten() {
            let name = e.name.as_str();
            if let Some(v) = &e.value {
                cmd.env(name, v);
            } else if let Some(path) = e
                .value_from
                .as_ref()
                .and_then(|f| f.field_ref.as_ref())
                .map(|f| f.field_path.as_str())
            {
                // The downward API, as the kubelet would fill it in.
                match path {
                    "metadata.name" => cmd.env(name, &pod_name),
                    "metadata.namespace" => cmd.env(name, &identity.namespace),
                    other => panic!(
                        "the chart's env {name} uses fieldRef {other}, which the e2e tier does not emulate"
                    ),
                };
            }
        }
        for (k, v) in extra {
            cmd.env(k, v);
        }
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", binary.display()));
        let mut op = Operator {
            child,
            http: reqwest::Client::builder()
                .no_proxy()
                .timeout(Duration::from_secs(5))
                .build()
                .expect("an HTTP client"),
            log,
            metrics: SocketAddr::from(([127, 0, 0, 1], port)),
            argv,
        };
        op.wait_ready().await;
        op
    }

    async fn wait_ready(&mut self) {
        let ready =
            dlock_testkit::wait::poll(Duration::from_secs(60), Duration::from_millis(250), async || {
                if let Ok(Some(status)) = self.child.try_wait() {
                    panic!(
                        "the operator exited ({status}) before becoming ready:\n{}",
                        tail(&self.log, 60)
                    );
                }
                match self.http_get("/readyz").await {
                    Ok((200, _)) => Ok(()),
                    Ok((s, _)) => Err(format!("status {s}")),
                    Err(e) => Err(e),
                }
            })
            .await;
        if let Err(last) = ready {
            panic!(
                "timed out after 60s waiting for the operator's /readyz to answer 200; last: {last}\n\
                 argv: {}\noperator log:\n{}",
                self.argv.join(" "),
                tail(&self.log, 60)
            );
        }
    }

    /// The last lines of the operator's log, for failure messages.
    pub fn log_tail(&self) -> String {
        format!("operator log ({}):\n{}", self.log.display(), tail(&self.log, 80))
    }

    /// SIGKILL, as a crashed or evicted pod: no shutdown path runs.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Still running?
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Still running, and never refused by the API server: a `forbidden` in its log means the chart's
    /// RBAC lacks something the operator does (some calls are best effort and would not otherwise
    /// fail a test).
    pub fn assert_healthy(&mut self) {
        assert!(self.alive(), "the operator exited\n{}", self.log_tail());
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let denied: Vec<&str> = log
            .lines()
            .filter(|l| l.to_ascii_lowercase().contains("forbidden"))
            .take(5)
            .collect();
        assert!(
            denied.is_empty(),
            "the API server refused the operator (chart RBAC too narrow?):\n{}",
            denied.join("\n")
        );
    }

    /// GET `path` on the metrics port; the body.
    pub async fn get(&self, path: &str) -> String {
        self.http_get(path)
            .await
            .unwrap_or_else(|e| panic!("GET {path}: {e}"))
            .1
    }

    /// `(status, body)` of a GET on the metrics port.
    async fn http_get(&self, path: &str) -> Result<(u16, String), String> {
        let resp = self
            .http
            .get(format!("http://{}{path}", self.metrics))
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let status = resp.status().as_u16();
        let body = resp.text().await.map_err(|e| e.to_string())?;
        Ok((status, body))
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
