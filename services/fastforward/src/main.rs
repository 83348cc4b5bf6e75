//! `dlock-fastforward`: the restore fast-forward's two steps, as the operator's Jobs run them.
//!
//! ```text
//! dlock-fastforward read --paydb payments=PAYDB_URL_0 [--paydb NAME=ENV ...] [--report PATH]
//!     DATABASE_URL (lockdb, optional): also report the sequence
//! dlock-fastforward advance --at-least N [--report PATH]
//!     DATABASE_URL (lockdb owner role): setval(GREATEST(N, current)), never lower
//! dlock-fastforward etcd-bump --snapshot-revision R --margin M --paydb NAME=ENV [--paydb ...]
//!         [--snapshot PATH] [--data-dir DIR] [-- ETCDUTL_RESTORE_FLAGS...]
//!     the etcd backend: bump = max(0, high-water + M - R), and the `etcdutl snapshot restore`
//!     command that applies it (flags after `--`, e.g. --name and --initial-cluster, are appended)
//! ```
//!
//! URLs come from environment variables only (the Job maps them from Secrets), never from flags.
//! The result is one JSON line on stdout and, with `--report`, in that file — the container's
//! termination message, which the operator reads from the pod status.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use dlock_fastforward::HighWater;
use serde_json::{Value, json};

#[derive(Debug, Parser)]
#[command(
    name = "dlock-fastforward",
    version,
    about = "Restore fast-forward of dlock's fencing sequence (C1 §1.7)"
)]
struct Args {
    #[command(subcommand)]
    command: Cmd,
    /// Also write the JSON result to this file (the Job uses /dev/termination-log).
    #[arg(long, global = true)]
    report: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Read the highest token every paydb has seen (and lockdb's sequence when DATABASE_URL is set).
    Read {
        /// NAME=ENV: read the paydb of PaymentStack NAME from the URL in environment variable ENV.
        #[arg(long = "paydb", value_name = "NAME=ENV")]
        paydbs: Vec<String>,
    },
    /// Advance fencing_token_seq so that it has handed out at least N; never lowers it.
    Advance {
        #[arg(long)]
        at_least: i64,
    },
    /// The etcd backend: read the paydbs' high-water and print the `etcdutl snapshot restore`
    /// command whose --bump-revision puts the next revision above it plus the margin.
    EtcdBump {
        /// The snapshot's revision (`etcdutl snapshot status SNAPSHOT -w json`: "revision").
        #[arg(long)]
        snapshot_revision: i64,
        #[arg(long)]
        margin: i64,
        /// NAME=ENV: the paydb of PaymentStack NAME, URL in environment variable ENV (at least one).
        #[arg(long = "paydb", value_name = "NAME=ENV", required = true)]
        paydbs: Vec<String>,
        /// The snapshot file, as it should appear in the printed command.
        #[arg(long, default_value = "SNAPSHOT")]
        snapshot: String,
        /// The new data directory, as it should appear in the printed command.
        #[arg(long, default_value = "NEW_DATA_DIR")]
        data_dir: String,
        /// Further `etcdutl snapshot restore` flags (--name, --initial-cluster, ...), appended as given.
        #[arg(last = true, value_name = "ETCDUTL_FLAGS")]
        restore_flags: Vec<String>,
    },
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    dlock_common::telemetry::init("dlock-fastforward");
    let args = Args::parse();
    let (ok, report) = match args.command {
        Cmd::Read { paydbs } => read(&paydbs).await,
        Cmd::Advance { at_least } => advance(at_least).await,
        Cmd::EtcdBump {
            snapshot_revision,
            margin,
            paydbs,
            snapshot,
            data_dir,
            restore_flags,
        } => {
            let restore = Restore {
                snapshot,
                data_dir,
                flags: restore_flags,
            };
            etcd_bump(snapshot_revision, margin, &paydbs, &restore).await
        }
    };
    let line = report.to_string();
    println!("{line}");
    if let Some(path) = &args.report
        && let Err(e) = std::fs::write(path, &line)
    {
        eprintln!(
            "dlock-fastforward: cannot write the report to {}: {e}",
            path.display()
        );
        return ExitCode::FAILURE;
    }
    if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

fn env_url(var: &str) -> Result<String, String> {
    std::env::var(var)
        .ok()
        .filter(|v| !v.is_empty())
        .ok_or_else(|| format!("environment variable {var} is not set"))
}

/// Reads every `NAME=ENV` paydb; on failure, the JSON to report (with the stacks read so far).
async fn read_stacks(paydbs: &[String]) -> Result<Vec<(String, HighWater)>, Value> {
    let mut stacks: Vec<(String, HighWater)> = Vec::new();
    let so_far = |stacks: &[(String, HighWater)]| -> Vec<Value> {
        stacks.iter().map(|(n, hw)| stack_json(n, hw)).collect()
    };
    for spec in paydbs {
        let Some((name, var)) = spec.split_once('=') else {
            return Err(json!({"error": format!("--paydb {spec:?} is not NAME=ENV")}));
        };
        let what = format!("paydb of PaymentStack {name}");
        let url = match env_url(var) {
            Ok(u) => u,
            Err(e) => return Err(json!({"error": format!("{what}: {e}")})),
        };
        tracing::info!(event = "reading_high_water", stack = name);
        match dlock_fastforward::read_high_water(&what, &url).await {
            Ok(hw) => stacks.push((name.to_owned(), hw)),
            Err(e) => {
                tracing::error!(event = "high_water_unreadable", stack = name, error = %e);
                return Err(json!({"error": e.to_string(), "stacks": so_far(&stacks)}));
            }
        }
    }
    Ok(stacks)
}

fn stack_json(name: &str, hw: &HighWater) -> Value {
    let mut v = serde_json::to_value(hw).unwrap_or_default();
    v["name"] = json!(name);
    v
}

async fn read(paydbs: &[String]) -> (bool, Value) {
    let stacks = match read_stacks(paydbs).await {
        Ok(s) => s,
        Err(report) => return (false, report),
    };
    let stacks: Vec<Value> = stacks.iter().map(|(n, hw)| stack_json(n, hw)).collect();
    let sequence = match std::env::var("DATABASE_URL").ok().filter(|v| !v.is_empty()) {
        None => None,
        Some(url) => match dlock_fastforward::read_sequence(&url).await {
            Ok(v) => Some(v),
            Err(e) => return (false, json!({"error": e.to_string(), "stacks": stacks})),
        },
    };
    (true, json!({"sequence": sequence, "stacks": stacks}))
}

/// Where the printed `etcdutl snapshot restore` reads and writes, and what else it is given.
struct Restore {
    snapshot: String,
    data_dir: String,
    flags: Vec<String>,
}

impl Restore {
    /// The restore command. `--mark-compacted` goes with every bump: clients that remember a
    /// revision between the snapshot's and the bumped one (watches, cached reads) then get
    /// "compacted" and re-read, instead of waiting on revisions that will never have history.
    /// etcdutl refuses it without a bump, so a bump of 0 is a plain restore.
    fn argv(&self, bump: i64) -> Vec<String> {
        let mut argv: Vec<String> = ["etcdutl", "snapshot", "restore", &self.snapshot]
            .map(String::from)
            .into();
        if bump > 0 {
            argv.extend([
                "--bump-revision".into(),
                bump.to_string(),
                "--mark-compacted".into(),
            ]);
        }
        argv.extend(["--data-dir".into(), self.data_dir.clone()]);
        argv.extend(self.flags.iter().cloned());
        argv
    }
}

/// Quotes one word for a POSIX shell when it needs it, so the printed command can be pasted.
fn shell_word(w: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_./=:,@%+".contains(c);
    if !w.is_empty() && w.chars().all(plain) {
        w.to_owned()
    } else {
        format!("'{}'", w.replace('\'', r"'\''"))
    }
}

async fn etcd_bump(
    snapshot_revision: i64,
    margin: i64,
    paydbs: &[String],
    restore: &Restore,
) -> (bool, Value) {
    // Refuse bad numbers before touching any database.
    if let Err(e) = dlock_fastforward::etcd_bump(snapshot_revision, 0, margin) {
        return (false, json!({"error": e.to_string()}));
    }
    let stacks = match read_stacks(paydbs).await {
        Ok(s) => s,
        Err(report) => return (false, report),
    };
    let high_water = stacks.iter().map(|(_, hw)| hw.highest).max().unwrap_or(0);
    let stacks: Vec<Value> = stacks.iter().map(|(n, hw)| stack_json(n, hw)).collect();
    match dlock_fastforward::etcd_bump(snapshot_revision, high_water, margin) {
        Ok(b) => {
            let argv = restore.argv(b.bump);
            let command = argv.iter().map(|w| shell_word(w)).collect::<Vec<_>>().join(" ");
            tracing::info!(event = "etcd_bump_computed", high_water, bump = b.bump);
            let mut v = serde_json::to_value(b).unwrap_or_default();
            v["stacks"] = json!(stacks);
            v["argv"] = json!(argv);
            v["command"] = json!(command);
            (true, v)
        }
        Err(e) => (false, json!({"error": e.to_string(), "stacks": stacks})),
    }
}

async fn advance(at_least: i64) -> (bool, Value) {
    let url = match env_url("DATABASE_URL") {
        Ok(u) => u,
        Err(e) => return (false, json!({"error": format!("lockdb: {e}")})),
    };
    match dlock_fastforward::advance(&url, at_least).await {
        Ok(a) => {
            tracing::info!(event = "sequence_advanced", before = a.before, after = a.after);
            (true, json!({"before": a.before, "after": a.after}))
        }
        Err(e) => (false, json!({"error": e.to_string()})),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn restore(flags: &[&str]) -> Restore {
        Restore {
            snapshot: "/backups/etcd 01.db".into(),
            data_dir: "/var/lib/etcd-restored".into(),
            flags: flags.iter().map(|f| (*f).to_owned()).collect(),
        }
    }

    #[test]
    fn the_command_carries_the_bump_with_mark_compacted_and_the_extra_flags() {
        let argv = restore(&["--name", "m0"]).argv(1055);
        assert_eq!(
            argv,
            [
                "etcdutl",
                "snapshot",
                "restore",
                "/backups/etcd 01.db",
                "--bump-revision",
                "1055",
                "--mark-compacted",
                "--data-dir",
                "/var/lib/etcd-restored",
                "--name",
                "m0"
            ]
        );
        let line = argv.iter().map(|w| shell_word(w)).collect::<Vec<_>>().join(" ");
        assert!(line.starts_with("etcdutl snapshot restore '/backups/etcd 01.db' --bump-revision 1055"));
    }

    #[test]
    fn no_bump_is_a_plain_restore_because_etcdutl_refuses_mark_compacted_alone() {
        let argv = restore(&[]).argv(0);
        assert!(
            !argv
                .iter()
                .any(|a| a.starts_with("--bump") || a == "--mark-compacted")
        );
    }

    #[test]
    fn shell_words_are_quoted_only_when_needed() {
        assert_eq!(shell_word("m0=http://127.0.0.1:2380"), "m0=http://127.0.0.1:2380");
        assert_eq!(shell_word("a b"), "'a b'");
        assert_eq!(shell_word("it's"), r"'it'\''s'");
        assert_eq!(shell_word(""), "''");
    }
}
