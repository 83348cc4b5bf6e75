//! Running the built `dlock-dev` binary end to end, for the tests of its long scenes (the demo, the
//! drill): its output drained on threads, a bound on a hung run.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// What one run of `dlock-dev` left: its exit code and what it printed (stdout is echoed, stderr too,
/// for the test's own log).
pub struct Run {
    pub code: Option<i32>,
    pub stdout: String,
}

/// Runs `dlock-dev <args>` to its end, killing it (and failing the test) after `limit`.
pub fn dlock_dev(args: &[&str], limit: Duration) -> Run {
    let mut child = Command::new(env!("CARGO_BIN_EXE_dlock-dev"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn dlock-dev");
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
        if let Some(status) = child.try_wait().expect("wait for dlock-dev") {
            break status;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("dlock-dev {args:?} did not finish within {}s", limit.as_secs());
        }
        // Polling a child process: std offers no wait with a timeout.
        std::thread::sleep(Duration::from_millis(100));
    };
    let stdout = reader.join().expect("stdout reader");
    println!("{stdout}");
    eprintln!("{}", err_reader.join().expect("stderr reader"));
    Run {
        code: status.code(),
        stdout,
    }
}
