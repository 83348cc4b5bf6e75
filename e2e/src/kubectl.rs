//! `kubectl`, for the checks whose point is that a user's own command line works: the runbook's
//! `kubectl annotate` requests, `kubectl apply -f config/samples/`, the printer columns and short
//! names of `kubectl get`, `helm template | kubectl apply --dry-run=server`, `kubectl dlock` found
//! on PATH as a plugin. Everything else reads and writes typed objects through [`crate::k8s`].

use std::path::{Path, PathBuf};
use std::process::Stdio;

use tokio::io::AsyncWriteExt;
use tokio::process::{Child, Command};

#[derive(Debug, Clone)]
pub struct Kubectl {
    kubeconfig: PathBuf,
    /// Put first on PATH, where kubectl looks for plugins (`kubectl-NAME`).
    plugins: Option<PathBuf>,
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
            plugins: None,
        }
    }

    /// The same kubectl, finding its plugins in `dir` first (as a user's finds them on PATH).
    pub fn with_plugins(mut self, dir: &Path) -> Self {
        self.plugins = Some(dir.to_path_buf());
        self
    }

    pub async fn run(&self, args: &[&str]) -> Out {
        self.exec(args, None).await
    }

    pub async fn run_stdin(&self, args: &[&str], stdin: &str) -> Out {
        self.exec(args, Some(stdin)).await
    }

    /// `kubectl ARGS…` started, for a command that runs while the test does other work (a plugin
    /// waiting for an action that the stand-in kubelet must drive).
    pub fn spawn(&self, args: &[&str]) -> Running {
        let command = format!("kubectl {}", args.join(" "));
        let child = self
            .command(args, false)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn `{command}`: {e}"));
        Running { child, command }
    }

    fn command(&self, args: &[&str], stdin: bool) -> Command {
        let mut cmd = Command::new("kubectl");
        cmd.args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .stdin(if stdin { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if let Some(dir) = &self.plugins {
            let path = std::env::var("PATH").unwrap_or_default();
            cmd.env("PATH", format!("{}:{path}", dir.display()));
        }
        cmd
    }

    async fn exec(&self, args: &[&str], stdin: Option<&str>) -> Out {
        let command = format!("kubectl {}", args.join(" "));
        let mut child = self
            .command(args, stdin.is_some())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn `{command}`: {e}"));
        if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
            pipe.write_all(input.as_bytes())
                .await
                .unwrap_or_else(|e| panic!("write stdin of `{command}`: {e}"));
        }
        Running { child, command }.output().await
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

/// A kubectl started with [`Kubectl::spawn`].
#[derive(Debug)]
pub struct Running {
    child: Child,
    command: String,
}

impl Running {
    /// Whether it has exited (without waiting).
    pub fn exited(&mut self) -> bool {
        self.child
            .try_wait()
            .unwrap_or_else(|e| panic!("wait `{}`: {e}", self.command))
            .is_some()
    }

    /// Its exit and output, once it ends.
    pub async fn output(self) -> Out {
        let Running { child, command } = self;
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
}

/// `PLUGIN ARGS…` (a kubectl plugin's executable) started directly, as kubectl would exec it, with
/// `KUBECONFIG` and a PATH of only `path` (the caller's directory without kubectl): the plugin must
/// need nothing but itself and the kubeconfig.
pub fn spawn_plugin(kubeconfig: &Path, plugin: &Path, path: &Path, args: &[&str]) -> Running {
    let command = format!("{} {}", plugin.display(), args.join(" "));
    let child = Command::new(plugin)
        .args(args)
        .env_clear()
        .env("KUBECONFIG", kubeconfig)
        .env("PATH", path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("spawn `{command}`: {e}"));
    Running { child, command }
}
