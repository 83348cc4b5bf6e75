//! `kubectl` as a library: every call is one process, JSON in and out. The tests use the same
//! commands an operator of dlock would type (`kubectl apply`, `kubectl patch`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

#[derive(Debug, Clone)]
pub struct Kubectl {
    kubeconfig: PathBuf,
}

/// What one kubectl call returned.
#[derive(Debug, Clone)]
pub struct Out {
    pub success: bool,
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub command: String,
}

impl Out {
    /// Panics with the command and its stderr unless it succeeded.
    pub fn ok(self) -> Self {
        assert!(
            self.success,
            "`{}` failed ({:?}):\n{}\n{}",
            self.command, self.code, self.stderr, self.stdout
        );
        self
    }

    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("`{}` printed no JSON ({e}):\n{}", self.command, self.stdout))
    }
}

impl Kubectl {
    pub fn new(kubeconfig: &Path) -> Self {
        Kubectl {
            kubeconfig: kubeconfig.to_path_buf(),
        }
    }

    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    pub fn run(&self, args: &[&str]) -> Out {
        self.exec(args, None)
    }

    pub fn run_stdin(&self, args: &[&str], stdin: &str) -> Out {
        self.exec(args, Some(stdin))
    }

    fn exec(&self, args: &[&str], stdin: Option<&str>) -> Out {
        let command = format!("kubectl {}", args.join(" "));
        let mut cmd = Command::new("kubectl");
        cmd.args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn `{command}`: {e}"));
        if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
            pipe.write_all(input.as_bytes())
                .unwrap_or_else(|e| panic!("write stdin of `{command}`: {e}"));
        }
        let out = child
            .wait_with_output()
            .unwrap_or_else(|e| panic!("wait `{command}`: {e}"));
        Out {
            success: out.status.success(),
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            command,
        }
    }

    /// `kubectl apply -n NS -f -` with one object (client-side apply, as a user would).
    pub fn apply(&self, ns: &str, obj: &Value) -> Out {
        self.run_stdin(&["apply", "-n", ns, "-f", "-"], &obj.to_string())
    }

    /// `kubectl create -n NS -f -` with one object.
    pub fn create(&self, ns: &str, obj: &Value) -> Out {
        self.run_stdin(&["create", "-n", ns, "-f", "-"], &obj.to_string())
    }

    /// One object, or `None` when it does not exist. `ns` is `None` for cluster-scoped kinds.
    pub fn get(&self, ns: Option<&str>, resource: &str, name: &str) -> Option<Value> {
        let mut args = vec!["get", resource, name, "-o", "json", "--ignore-not-found"];
        if let Some(ns) = ns {
            args.extend(["-n", ns]);
        }
        let out = self.run(&args).ok();
        if out.stdout.trim().is_empty() {
            None
        } else {
            Some(out.json())
        }
    }

    /// Every object of a kind in a namespace.
    pub fn list(&self, ns: &str, resource: &str) -> Vec<Value> {
        let out = self.run(&["get", resource, "-n", ns, "-o", "json"]).ok();
        match out.json().get("items") {
            Some(Value::Array(items)) => items.clone(),
            _ => Vec::new(),
        }
    }

    /// A JSON merge patch on the main resource (`kubectl patch --type merge`).
    pub fn patch(&self, ns: &str, resource: &str, name: &str, patch: &Value) -> Out {
        self.run(&[
            "patch",
            resource,
            name,
            "-n",
            ns,
            "--type",
            "merge",
            "-p",
            &patch.to_string(),
        ])
    }

    /// A JSON merge patch on the status subresource, as a controller (or the kubelet) writes it.
    pub fn patch_status(&self, ns: &str, resource: &str, name: &str, patch: &Value) -> Out {
        self.run(&[
            "patch",
            resource,
            name,
            "-n",
            ns,
            "--subresource",
            "status",
            "--type",
            "merge",
            "-p",
            &patch.to_string(),
        ])
    }

    /// Creates a namespace (idempotent).
    pub fn namespace(&self, name: &str) {
        let ns = serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}});
        self.run_stdin(&["apply", "-f", "-"], &ns.to_string()).ok();
    }

    /// `kubectl auth can-i VERB RESOURCE [-n NS] --as USER`: `true` for "yes". RESOURCE may be
    /// `type/name`; a subresource is written `type#sub` (e.g. `lockservices.dlock.dev#status`).
    pub fn can_i(&self, user: &str, verb: &str, resource: &str, ns: Option<&str>) -> bool {
        let (resource, sub) = match resource.split_once('#') {
            Some((r, s)) => (r, Some(s)),
            None => (resource, None),
        };
        let mut args = vec!["auth", "can-i", verb, resource, "--as", user];
        if let Some(sub) = sub {
            args.extend(["--subresource", sub]);
        }
        if let Some(ns) = ns {
            args.extend(["-n", ns]);
        }
        // Exit code 1 with "no" is the negative answer, not an error.
        let out = self.run(&args);
        match out.stdout.trim() {
            "yes" => true,
            "no" => false,
            _ => panic!(
                "`{}`: unexpected answer {:?} / {:?}",
                out.command, out.stdout, out.stderr
            ),
        }
    }
}
