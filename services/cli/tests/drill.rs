//! `dlock drill restore` end to end: the built `dlock` binary against real PostgreSQL 16 servers and
//! the real service processes, once as shipped and once with the fast-forward skipped (the negative
//! control: the restored sequence alone must not let the payouts resume).
//!
//! The service binaries come from the workspace build: `cargo test --workspace` builds them; for this
//! crate alone first run `cargo build --workspace --bins`.

use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A whole drill takes well under a minute once built; this only bounds a hung run.
const LIMIT: Duration = Duration::from_secs(600);

/// Each drill starts two PostgreSQL servers and a dozen processes: one at a time, so that the two
/// runs do not slow each other into their own timeouts.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

struct Run {
    code: Option<i32>,
    stdout: String,
}

fn drill(extra: &[&str]) -> Run {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let mut child = Command::new(env!("CARGO_BIN_EXE_dlock"))
        .args(["drill", "restore"])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn dlock");
    // The pipes are drained on threads so that a chatty run cannot block on a full pipe.
    let mut out = child.stdout.take().expect("stdout");
    let mut err = child.stderr.take().expect("stderr");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut out, &mut s);
        s
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut err, &mut s);
        s
    });
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for dlock") {
            break status;
        }
        if started.elapsed() > LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "dlock drill restore {extra:?} did not finish within {}s",
                LIMIT.as_secs()
            );
        }
        // Polling a child process: std offers no wait with a timeout.
        std::thread::sleep(Duration::from_millis(100));
    };
    let out = Output {
        status,
        stdout: reader.join().expect("stdout reader").into_bytes(),
        stderr: err_reader.join().expect("stderr reader").into_bytes(),
    };
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    println!("{stdout}");
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    Run {
        code: out.status.code(),
        stdout,
    }
}

/// The check line that starts with `what`, with its mark.
fn check_line<'a>(stdout: &'a str, what: &str) -> &'a str {
    stdout
        .lines()
        .map(str::trim)
        .find(|l| l.get(4..).is_some_and(|rest| rest.starts_with(what)))
        .unwrap_or_else(|| panic!("no check line {what:?} in the drill's output"))
}

fn held(stdout: &str, what: &str) -> bool {
    check_line(stdout, what).starts_with('✔')
}

#[test]
fn restore_drill_rewinds_fences_out_fast_forwards_and_resumes() {
    let run = drill(&[]);
    assert_eq!(run.code, Some(0), "the drill's verdict was not PASS");
    assert!(run.stdout.contains("Verdict: PASS"));
    for what in [
        "batch 1:",
        "batch 2:",
        "the restore rewound the sequence",
        "every new grant is fenced out",
        "batch 3 makes no progress",
        "nothing double-paid",
        "the sequence is past every token",
        "payouts resume",
        "every payout POSTED exactly once",
        "ledger balanced and reconciliation clean",
    ] {
        assert!(held(&run.stdout, what), "check {what:?} did not hold");
    }
}

#[test]
fn without_the_fast_forward_payouts_do_not_resume() {
    let run = drill(&["--skip-fast-forward"]);
    assert_eq!(
        run.code,
        Some(2),
        "skipping the fast-forward must make the drill report failure"
    );
    assert!(run.stdout.contains("Verdict: FAIL"));
    assert!(
        !held(&run.stdout, "payouts resume"),
        "the payouts resumed without the fast-forward"
    );
    // The stall is safe all the same: the resources refused the stale grants and nothing was paid
    // twice — what failed is liveness, not safety.
    for what in [
        "the restore rewound the sequence",
        "every new grant is fenced out",
        "batch 3 makes no progress",
        "nothing double-paid",
    ] {
        assert!(held(&run.stdout, what), "check {what:?} did not hold");
    }
    assert!(
        !run.stdout.contains("the sequence is past every token"),
        "the fast-forward ran although it was skipped"
    );
}
