//! The operator under test: the built `dlock-operator` binary as a process, started with the command,
//! args and env of the chart's own Deployment (so chart and binary cannot drift apart unnoticed),
//! authenticated as the chart's ServiceAccount.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::rbac::Identity;
use crate::{Cluster, env, helm, wait};

pub struct Operator {
    child: Child,
    pub log: PathBuf,
    pub metrics: SocketAddr,
    /// The argv it was started with (for messages).
    pub argv: Vec<String>,
}

impl Operator {
    /// Renders the chart's Deployment for `identity` (watchNamespace = its namespace, metrics on a
    /// free loopback port), starts the binary with that container's command/args/env and the
    /// identity's kubeconfig, and waits for `/readyz`.
    pub fn start(cluster: &Cluster, helm_bin: &PathBuf, identity: &Identity, dir: &Path) -> Operator {
        Operator::start_with_env(cluster, helm_bin, identity, dir, &[])
    }

    /// As [`Operator::start`], plus `extra` environment variables (e.g. `HTTP_PROXY` for the
    /// stand-in of Service DNS, see [`crate::proxy`]). The log is appended to, so a restarted
    /// operator keeps the earlier lines.
    pub fn start_with_env(
        cluster: &Cluster,
        helm_bin: &PathBuf,
        identity: &Identity,
        dir: &Path,
        extra: &[(&str, &str)],
    ) -> Operator {
        let port = free_port();
        let port_s = port.to_string();
        let yaml = helm::template(
            helm_bin,
            &identity.release,
            &identity.namespace,
            &[("watchNamespace", &identity.namespace), ("metrics.port", &port_s)],
            &["--show-only", "templates/deployment.yaml"],
        );
        let deps = helm::rendered_of_kind(&cluster.kubectl, &yaml, "Deployment");
        assert_eq!(deps.len(), 1, "the chart renders one Deployment");
        let c = &deps[0]["spec"]["template"]["spec"]["containers"][0];

        let mut argv: Vec<String> = strings(&c["command"]);
        argv.extend(strings(&c["args"]));
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
        for e in c["env"].as_array().into_iter().flatten() {
            let name = e["name"].as_str().unwrap_or_default();
            if let Some(v) = e["value"].as_str() {
                cmd.env(name, v);
            } else if let Some(path) = e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
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
            log,
            metrics: SocketAddr::from(([127, 0, 0, 1], port)),
            argv,
        };
        op.wait_ready();
        op
    }

    fn wait_ready(&mut self) {
        let addr = self.metrics;
        let log = self.log.clone();
        let argv = self.argv.join(" ");
        wait::eventually_or(
            "the operator's /readyz to answer 200",
            Duration::from_secs(60),
            || {
                if let Ok(Some(status)) = self.child.try_wait() {
                    panic!(
                        "the operator exited ({status}) before becoming ready:\n{}",
                        tail(&log, 60)
                    );
                }
                match http_status(addr, "/readyz") {
                    Ok(200) => Ok(()),
                    Ok(s) => Err(format!("status {s}")),
                    Err(e) => Err(e),
                }
            },
            || format!("argv: {argv}\noperator log:\n{}", tail(&log, 60)),
        );
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
    pub fn get(&self, path: &str) -> String {
        http_get(self.metrics, path)
            .unwrap_or_else(|e| panic!("GET {path}: {e}"))
            .1
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_str().map(str::to_owned))
        .collect()
}

pub fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("bind a probe port: {e}"));
    l.local_addr()
        .unwrap_or_else(|e| panic!("probe port: {e}"))
        .port()
}

fn http_status(addr: SocketAddr, path: &str) -> Result<u16, String> {
    http_get(addr, path).map(|(s, _)| s)
}

/// A minimal HTTP/1.0 GET (no client library needed for two probe endpoints).
fn http_get(addr: SocketAddr, path: &str) -> Result<(u16, String), String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").map_err(|e| e.to_string())?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).map_err(|e| e.to_string())?;
    let status = buf
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("not HTTP: {buf:?}"))?;
    let body = buf
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}
