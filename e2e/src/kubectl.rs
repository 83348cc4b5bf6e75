//! `kubectl`, for the checks whose point is that a user's own command line works: the runbook's
//! `kubectl annotate` requests, `kubectl apply -f config/samples/`, the printer columns and short
//! names of `kubectl get`, `helm template | kubectl apply --dry-run=server`. Everything else reads
//! and writes typed objects through [`crate::k8s`].

use std::path::{Path, PathBuf};
use std::process::Stdio;

use tokio::io::AsyncWriteExt;
use tokio::process::Command;

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
}

impl Kubectl {
    pub fn new(kubeconfig: &Path) -> Self {
        Kubectl {
            kubeconfig: kubeconfig.to_path_buf(),
        }
    }

    pub async fn run(&self, args: &[&str]) -> Out {
        self.exec(args, None).await
    }

    pub async fn run_stdin(&self, args: &[&str], stdin: &str) -> Out {
        self.exec(args, Some(stdin)).await
    }

    async fn exec(&self, args: &[&str], stdin: Option<&str>) -> Out {
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
                .await
                .unwrap_or_else(|e| panic!("write stdin of `{command}`: {e}"));
        }
        let out = child
            .wait_with_output()
            .await
            .unwrap_or_else(|e| panic!("wait `{command}`: {e}"));
        Out {
            success: out.status.success(),
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            command,
        }
    }

    /// `kubectl annotate RESOURCE NAME -n NS --overwrite KEY=VALUE`: the runbook's one line per
    /// operator action (docs/operations.md).
    pub async fn annotate(&self, ns: &str, resource: &str, name: &str, key: &str, value: &str) -> Out {
        self.run(&[
            "annotate",
            resource,
            name,
            "-n",
            ns,
            "--overwrite",
            &format!("{key}={value}"),
        ])
        .await
    }
}
