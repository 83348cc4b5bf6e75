//! `dlock-fastforward`: the restore fast-forward's two steps, as the operator's Jobs run them.
//!
//! ```text
//! dlock-fastforward read --paydb payments=PAYDB_URL_0 [--paydb NAME=ENV ...] [--report PATH]
//!     DATABASE_URL (lockdb, optional): also report the sequence
//! dlock-fastforward advance --at-least N [--report PATH]
//!     DATABASE_URL (lockdb owner role): setval(GREATEST(N, current)), never lower
//! ```
//!
//! URLs come from environment variables only (the Job maps them from Secrets), never from flags.
//! The result is one JSON line on stdout and, with `--report`, in that file — the container's
//! termination message, which the operator reads from the pod status.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
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
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    dlock_common::telemetry::init("dlock-fastforward");
    let args = Args::parse();
    let (ok, report) = match args.command {
        Cmd::Read { paydbs } => read(&paydbs).await,
        Cmd::Advance { at_least } => advance(at_least).await,
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

async fn read(paydbs: &[String]) -> (bool, Value) {
    let mut stacks = Vec::new();
    for spec in paydbs {
        let Some((name, var)) = spec.split_once('=') else {
            return (
                false,
                json!({"error": format!("--paydb {spec:?} is not NAME=ENV")}),
            );
        };
        let what = format!("paydb of PaymentStack {name}");
        let url = match env_url(var) {
            Ok(u) => u,
            Err(e) => return (false, json!({"error": format!("{what}: {e}")})),
        };
        tracing::info!(event = "reading_high_water", stack = name);
        match dlock_fastforward::read_high_water(&what, &url).await {
            Ok(hw) => {
                let mut v = serde_json::to_value(hw).unwrap_or_default();
                v["name"] = json!(name);
                stacks.push(v);
            }
            Err(e) => {
                tracing::error!(event = "high_water_unreadable", stack = name, error = %e);
                return (false, json!({"error": e.to_string(), "stacks": stacks}));
            }
        }
    }
    let sequence = match std::env::var("DATABASE_URL").ok().filter(|v| !v.is_empty()) {
        None => None,
        Some(url) => match dlock_fastforward::read_sequence(&url).await {
            Ok(v) => Some(v),
            Err(e) => return (false, json!({"error": e.to_string(), "stacks": stacks})),
        },
    };
    (true, json!({"sequence": sequence, "stacks": stacks}))
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
