//! What processes cost, read from `/proc` (Linux), for the benchmarks' breakdowns: the CPU time of a
//! process (all its threads), of a process and everything it started (PostgreSQL's postmaster and its
//! backends), how busy the machine was, and the load average.

use std::collections::HashMap;
use std::fs;

/// Clock ticks per second, the unit of `/proc/<pid>/stat`'s times.
fn ticks_per_sec() -> f64 {
    // SAFETY: sysconf has no preconditions; it only reads a configuration value.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as f64 } else { 100.0 }
}

/// The fields of `/proc/<pid>/stat` after the command name (which may hold spaces and parentheses):
/// index 0 is the state, 1 the parent pid, 11 and 12 user and system time in ticks.
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &text[text.rfind(')')? + 1..];
    Some(rest.split_whitespace().map(str::to_owned).collect())
}

fn ticks(fields: &[String]) -> Option<u64> {
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

/// What the process's children that exited and were reaped cost (fields 13 and 14: the kernel adds
/// a child's time to its parent's when the parent reaps it).
fn reaped_ticks(fields: &[String]) -> Option<u64> {
    Some(fields.get(13)?.parse::<u64>().ok()? + fields.get(14)?.parse::<u64>().ok()?)
}

/// CPU-seconds (user + system, every thread) the process has used so far; `None` once it is gone.
pub fn process_secs(pid: u32) -> Option<f64> {
    Some(ticks(&stat_fields(pid)?)? as f64 / ticks_per_sec())
}

/// CPU-seconds used so far by `root` and every process descended from it: the live ones, and those
/// that exited and were reaped by a live one (for PostgreSQL's postmaster, which reaps every backend
/// and autovacuum worker, the work of connections that lived only inside a measurement — pgbench's
/// — counts as well as that of pooled ones).
pub fn tree_secs(root: u32) -> f64 {
    let mut parent_of: HashMap<u32, (u32, u64)> = HashMap::new();
    if let Ok(dir) = fs::read_dir("/proc") {
        for entry in dir.flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            if let Some(f) = stat_fields(pid)
                && let (Some(ppid), Some(t), Some(reaped)) =
                    (f.get(1).and_then(|p| p.parse().ok()), ticks(&f), reaped_ticks(&f))
            {
                parent_of.insert(pid, (ppid, t + reaped));
            }
        }
    }
    let in_tree = |mut pid: u32| {
        // Bounded: a pid's ancestry ends at 1 (or 0) within the process table's size.
        for _ in 0..parent_of.len() + 1 {
            if pid == root {
                return true;
            }
            match parent_of.get(&pid) {
                Some((ppid, _)) if *ppid != pid && *ppid != 0 => pid = *ppid,
                _ => return false,
            }
        }
        false
    };
    let total: u64 = parent_of
        .iter()
        .filter(|(pid, _)| in_tree(**pid))
        .map(|(_, (_, t))| t)
        .sum();
    total as f64 / ticks_per_sec()
}

/// The whole machine's CPU time so far, in ticks: (busy, all), from `/proc/stat`'s first line
/// (busy is all but idle and iowait).
pub fn machine_ticks() -> Option<(u64, u64)> {
    let text = fs::read_to_string("/proc/stat").ok()?;
    let line = text.lines().next()?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let all: u64 = v.iter().sum();
    let idle = v.get(3)? + v.get(4).copied().unwrap_or(0);
    Some((all - idle, all))
}

/// `/proc/loadavg`'s 1, 5 and 15 minute load averages, as written there.
pub fn load_average() -> String {
    fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|t| t.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|| "unknown".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_costs_something_and_is_its_own_tree() {
        let me = std::process::id();
        let start = process_secs(me).expect("this process's stat");
        // Spin until the clock moves a few ticks.
        let mut x = 0u64;
        while process_secs(me).unwrap_or(0.0) < start + 0.05 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        assert!(tree_secs(me) >= start + 0.05);
        let (busy, all) = machine_ticks().expect("/proc/stat");
        assert!(busy > 0 && all >= busy);
        assert_eq!(load_average().split(' ').count(), 3);
    }

    /// A child that spun and was reaped is gone from the tree, and still counted with the exited.
    #[test]
    fn a_reaped_child_still_counts_with_the_exited() {
        let me = std::process::id();
        let reaped = || stat_fields(me).and_then(|f| reaped_ticks(&f)).unwrap_or(0) as f64 / ticks_per_sec();
        let before = reaped();
        let mut child = std::process::Command::new("sh")
            .args(["-c", "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done"])
            .spawn()
            .expect("spawn sh");
        let pid = child.id();
        child.wait().expect("wait");
        assert_eq!(process_secs(pid), None);
        assert!(reaped() >= before + 0.05);
        assert!(tree_secs(me) >= reaped());
    }

    #[test]
    fn a_gone_process_has_no_time() {
        let mut child = std::process::Command::new("true").spawn().expect("spawn true");
        let pid = child.id();
        child.wait().expect("wait");
        assert_eq!(process_secs(pid), None);
    }
}
