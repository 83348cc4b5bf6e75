//! Is the cluster tier on, and where is everything.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use crate::kubectl::Kubectl;

/// The running test cluster (from `scripts/cluster-up.sh`).
#[derive(Clone)]
pub struct Cluster {
    /// Admin kubeconfig (client cert in group system:masters).
    pub kubeconfig: PathBuf,
    /// The admin's client: every read and write of the tests.
    pub client: kube::Client,
    /// The admin's `kubectl`, for the tests whose point is a user's command line.
    pub kubectl: Kubectl,
}

/// `Some` when `DLOCK_E2E=1` (set by `scripts/test-cluster.sh`); otherwise prints why the test is
/// skipped and returns `None`. With `DLOCK_E2E=1` but no usable kubeconfig it panics: a tier that
/// was asked for must not pass by skipping.
pub async fn cluster(test: &str) -> Option<Cluster> {
    if std::env::var("DLOCK_E2E").as_deref() != Ok("1") {
        eprintln!(
            "skipped {test}: the cluster tier is off (DLOCK_E2E is not 1). Run scripts/test-cluster.sh, \
             which installs the tools, starts kube-apiserver + etcd and sets DLOCK_E2E=1."
        );
        return None;
    }
    let kubeconfig = match std::env::var_os("KUBECONFIG") {
        Some(k) if Path::new(&k).is_file() => PathBuf::from(k),
        other => panic!(
            "DLOCK_E2E=1 but KUBECONFIG ({other:?}) is not a file; start the cluster with scripts/cluster-up.sh"
        ),
    };
    let client = crate::k8s::client(&kubeconfig).await;
    let kubectl = Kubectl::new(&kubeconfig);
    Some(Cluster {
        kubeconfig,
        client,
        kubectl,
    })
}

/// The repository root (this crate lives in `e2e/`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from(".."))
}

/// `$DLOCK_TOOLS_DIR/bin` (default `/var/tmp/dlock-tools/bin`), filled by `scripts/cluster-tools.sh`.
pub fn tools_bin() -> PathBuf {
    dlock_testkit::pg::tools_dir().join("bin")
}

/// A tool from the tools dir, else from PATH; `None` when neither has it.
pub fn tool(name: &str) -> Option<PathBuf> {
    let cached = tools_bin().join(name);
    if cached.is_file() {
        return Some(cached);
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(name))
            .find(|p| p.is_file())
    })
}

/// A binary of this workspace (`dlock-operator`, `dlock-migrate`), from `DLOCK_E2E_BIN_DIR` or the
/// profile directory this test executable was built into (`target/<profile>/deps/..`).
pub fn workspace_bin(name: &str) -> PathBuf {
    let dir = std::env::var_os("DLOCK_E2E_BIN_DIR")
        .map(PathBuf::from)
        .or_else(|| {
            let exe = std::env::current_exe().ok()?;
            Some(exe.parent()?.parent()?.to_path_buf())
        })
        .unwrap_or_else(|| PathBuf::from("target/debug"));
    let path = dir.join(name);
    assert!(
        path.is_file(),
        "{} is missing: build it first (cargo build -p dlock-operator -p dlock-migrate; \
         scripts/test-cluster.sh does this), or set DLOCK_E2E_BIN_DIR",
        path.display()
    );
    path
}

/// A scratch directory for one test, removed when dropped.
#[derive(Debug)]
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(label: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("dlock-e2e-{}-{label}-{}", std::process::id(), next()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        Scratch(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::env::var("DLOCK_E2E_KEEP").as_deref() != Ok("1") {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn next() -> u32 {
    static N: AtomicU32 = AtomicU32::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// A DNS-1123 name unique to this test process: `<prefix>-<pid>-<n>`.
pub fn unique_name(prefix: &str) -> String {
    let name = format!("{prefix}-{}-{}", std::process::id(), next());
    assert!(name.len() <= 63, "name {name} is longer than 63 characters");
    name
}
