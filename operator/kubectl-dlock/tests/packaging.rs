//! What ships with the binary: the krew manifest names the binary this crate builds, and shell
//! completion works from the built binary, for `kubectl-dlock` and through `kubectl_complete-dlock`
//! (what kubectl runs for `kubectl dlock <TAB>`), with nothing but the plugin on PATH.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_kubectl-dlock");

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn bin_name() -> String {
    Path::new(BIN)
        .file_name()
        .and_then(|n| n.to_str())
        .map(str::to_owned)
        .expect("the binary's file name")
}

#[test]
fn the_krew_manifest_installs_the_binary_this_crate_builds() {
    let text = std::fs::read_to_string(crate_dir().join("krew/dlock.yaml")).unwrap();
    let doc: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
    assert_eq!(doc["apiVersion"], "krew.googlecontainertools.github.com/v1alpha2");
    assert_eq!(doc["kind"], "Plugin");
    // kubectl finds `kubectl dlock` as the executable `kubectl-dlock`: the names must agree.
    assert_eq!(bin_name(), "kubectl-dlock");
    assert_eq!(
        doc["metadata"]["name"].as_str(),
        bin_name().strip_prefix("kubectl-")
    );
    let spec = &doc["spec"];
    let version = format!("v{}", env!("CARGO_PKG_VERSION"));
    assert_eq!(spec["version"].as_str(), Some(version.as_str()));
    assert!(spec["shortDescription"].as_str().is_some_and(|d| !d.is_empty()));
    let platforms = spec["platforms"].as_sequence().expect("platforms");
    assert!(!platforms.is_empty());
    let linux_amd64 = platforms
        .iter()
        .find(|p| {
            p["selector"]["matchLabels"]["os"] == "linux" && p["selector"]["matchLabels"]["arch"] == "amd64"
        })
        .expect("a linux/amd64 platform");
    for p in platforms {
        assert_eq!(p["bin"].as_str(), Some(bin_name().as_str()));
        let uri = p["uri"].as_str().expect("uri");
        assert!(uri.starts_with("https://") && uri.ends_with(".tar.gz"), "{uri}");
        assert!(uri.contains(&version), "the archive of this version: {uri}");
        let sha = p["sha256"].as_str().expect("sha256 as a string");
        assert!(
            sha.len() == 64 && sha.bytes().all(|b| b.is_ascii_hexdigit()),
            "{sha}"
        );
        // Every file the archive must hold is one this crate builds or ships, and `bin` is among them.
        let files: Vec<&str> = p["files"]
            .as_sequence()
            .expect("files")
            .iter()
            .map(|f| f["from"].as_str().expect("files[].from"))
            .collect();
        assert!(files.contains(&bin_name().as_str()), "{files:?}");
        for f in files.iter().filter(|f| **f != bin_name()) {
            assert!(
                crate_dir().join(f).is_file(),
                "{f} is shipped from operator/kubectl-dlock/"
            );
        }
    }
    assert_eq!(linux_amd64["bin"], "kubectl-dlock");
}

/// A directory holding only the plugin and its completion script: no kubectl, no shell tools
/// other than `sh` itself.
fn plugin_only_path(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kubectl-dlock-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(BIN, dir.join("kubectl-dlock")).unwrap();
    let script = dir.join("kubectl_complete-dlock");
    std::fs::copy(crate_dir().join("kubectl_complete-dlock"), &script).unwrap();
    // Copied with its mode; checked, since kubectl runs it only when it is executable.
    let mode = std::fs::metadata(&script).unwrap().permissions().mode();
    assert!(
        mode & 0o111 != 0,
        "kubectl_complete-dlock is executable in the repository: {mode:o}"
    );
    dir
}

fn run(dir: &Path, program: &str, args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(program)
        .args(args)
        .env_clear()
        .env("PATH", dir)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn completion_works_from_the_binary_and_through_kubectls_plugin_convention() {
    let dir = plugin_only_path("completion");
    let bin = dir.join("kubectl-dlock");
    let bin = bin.to_str().unwrap();
    // The script for the binary typed as one word; no kubeconfig is read for it.
    let (code, bash, err) = run(&dir, bin, &["completion", "bash"]);
    assert_eq!(code, Some(0), "{err}");
    for sub in ["revoke", "restore", "status", "locks", "completion"] {
        assert!(bash.contains(sub), "{sub} in the bash script");
    }
    // Registered for the command typed as one word (clap names the function `_kubectl__dlock`).
    assert!(
        bash.contains("complete -F _kubectl__dlock") && bash.contains(" kubectl-dlock\n"),
        "{bash}"
    );
    let (code, zsh, _) = run(&dir, bin, &["completion", "zsh"]);
    assert_eq!(code, Some(0));
    assert!(zsh.contains("#compdef kubectl-dlock"), "{zsh}");
    // What kubectl runs for `kubectl dlock -n pay st<TAB>`: the script, finding the plugin on PATH.
    let script = dir.join("kubectl_complete-dlock");
    let (code, out, err) = run(&dir, "/bin/sh", &[script.to_str().unwrap(), "-n", "pay", "st"]);
    assert_eq!((code, out.as_str()), (Some(0), "status\n:4\n"), "{err}");
    let (code, out, _) = run(
        &dir,
        "/bin/sh",
        &[script.to_str().unwrap(), "locks", "l", "-o", ""],
    );
    assert_eq!((code, out.as_str()), (Some(0), "json\ntable\n:4\n"));
    let (_, out, _) = run(&dir, "/bin/sh", &[script.to_str().unwrap(), ""]);
    let words: Vec<&str> = out.lines().collect();
    assert_eq!(
        words,
        ["completion", "locks", "restore", "revoke", "status", ":4"]
    );
    let _ = std::fs::remove_dir_all(&dir);
}
