//! What a phase measured and what it cost: its cycles and acquire latencies ([`Phase`]), and the
//! CPU of each process over the measured window, the machine's busy share and, for lock-server,
//! where an acquire's time went ([`Meter`], [`Cost`]).

use std::time::Instant;

use anyhow::Result;
use dlock_testkit::cpu;
use dlock_testkit::metrics::{metric_sum, scrape};
use dlock_testkit::procs::Service;
use hdrhistogram::Histogram;

/// What one phase measured.
pub(super) struct Phase {
    pub(super) name: String,
    /// Completed cycles (acquire attempt, and release when granted).
    pub(super) cycles: u64,
    pub(super) grants: u64,
    pub(super) secs: f64,
    pub(super) acquire: Histogram<u64>,
    pub(super) cost: Cost,
}

/// The roles a phase's processes play, in the order the cost table prints them.
pub(super) const ROLES: [&str; 4] = ["generator", "lock-server", "postgres", "etcd"];

/// One process whose CPU a phase reads: the process alone, or it and everything it started
/// (PostgreSQL: the postmaster and its backends).
#[derive(Debug, Clone, Copy)]
pub(super) enum Proc {
    One(u32),
    Tree(u32),
}

/// What a phase's cost is read from: its processes by role ([`ROLES`]), and the lock-server whose
/// histograms split an acquire's time.
#[derive(Debug, Clone, Default)]
pub(super) struct Meter {
    pub(super) procs: Vec<(&'static str, Proc)>,
    pub(super) server: Option<String>,
}

/// One reading of a [`Meter`].
struct Reading {
    cpu: Vec<Option<f64>>,
    machine: Option<(u64, u64)>,
    metrics: Option<String>,
}

/// What a phase cost over its measured window.
#[derive(Debug, Default)]
pub(super) struct Cost {
    /// CPU-seconds by role.
    pub(super) cpu: Vec<(&'static str, f64)>,
    /// The machine's busy share (0..1).
    pub(super) busy: Option<f64>,
    /// Where lock-server says an acquire's time went.
    pub(super) latency: Option<String>,
}

impl Meter {
    /// The load generator is this process, lock-server the service at `server` (if any).
    pub(super) fn here(server: Option<&Service>) -> Self {
        let mut m = Meter::default().with("generator", Proc::One(std::process::id()));
        if let Some(s) = server {
            m = m.with("lock-server", Proc::One(s.pid()));
            m.server = Some(s.url());
        }
        m
    }

    pub(super) fn with(mut self, role: &'static str, p: Proc) -> Self {
        self.procs.push((role, p));
        self
    }

    async fn read(&self) -> Reading {
        let cpu = self
            .procs
            .iter()
            .map(|(_, p)| match *p {
                Proc::One(pid) => cpu::process_secs(pid),
                Proc::Tree(pid) => Some(cpu::tree_secs(pid)),
            })
            .collect();
        let metrics = match &self.server {
            Some(url) => scrape(url).await.ok(),
            None => None,
        };
        Reading {
            cpu,
            machine: cpu::machine_ticks(),
            metrics,
        }
    }

    /// Reads at `from` and at `to` (the phase's measured window).
    pub(super) async fn window(self, from: Instant, to: Instant) -> Cost {
        tokio::time::sleep_until(tokio::time::Instant::from_std(from)).await;
        let a = self.read().await;
        tokio::time::sleep_until(tokio::time::Instant::from_std(to)).await;
        let b = self.read().await;
        let cpu = self
            .procs
            .iter()
            .zip(a.cpu.iter().zip(&b.cpu))
            .filter_map(|((role, _), (x, y))| Some((*role, (*y)? - (*x)?)))
            .collect();
        let busy = match (a.machine, b.machine) {
            (Some((b0, a0)), Some((b1, a1))) if a1 > a0 => Some((b1 - b0) as f64 / (a1 - a0) as f64),
            _ => None,
        };
        let latency = match (&a.metrics, &b.metrics) {
            (Some(x), Some(y)) => acquire_breakdown(x, y),
            _ => None,
        };
        Cost { cpu, busy, latency }
    }
}

/// Where lock-server's acquires spent their time between two scrapes (means, µs).
fn acquire_breakdown(before: &str, after: &str) -> Option<String> {
    let d = |name: &str, labels: &[(&str, &str)]| {
        metric_sum(after, name, labels) - metric_sum(before, name, labels)
    };
    let route = [("route", "/v1/locks/{key}/acquire")];
    let n = d("http_request_duration_seconds_count", &route);
    if n <= 0.0 {
        return None;
    }
    let http = d("http_request_duration_seconds_sum", &route) / n * 1e6;
    let acq = [("statement", "acquire")];
    let calls = d("lock_batch_wait_seconds_count", &acq);
    // Calls per statement of each kind (etcd: releases per transaction): what the store's CPU per
    // cycle follows most closely.
    let per = |kind| {
        let labels = [("statement", kind)];
        let statements = d("lock_batch_calls_count", &labels);
        if statements > 0.0 {
            d("lock_batch_calls_sum", &labels) / statements
        } else {
            0.0
        }
    };
    if calls > 0.0 {
        let queue = d("lock_batch_wait_seconds_sum", &acq) / calls * 1e6;
        let lockdb = d("lock_batch_statement_seconds_sum", &acq) / calls * 1e6;
        // Statements sent: each kind's, less those that carried both (counted under each).
        let paired = d("lock_batch_paired_total", &[]);
        let statements = d("lock_batch_calls_count", &acq)
            + d("lock_batch_calls_count", &[("statement", "release")])
            - paired;
        return Some(format!(
            "acquire {http:.0} µs = batch queue {queue:.0} + lockdb {lockdb:.0} + HTTP path {:.0}; {:.1} calls per statement ({:.1} per release statement), {:.0} % of statements carried both",
            http - queue - lockdb,
            per("acquire"),
            per("release"),
            if statements > 0.0 {
                paired / statements * 100.0
            } else {
                0.0
            }
        ));
    }
    let lease = |source| d("lock_etcd_grant_leases_total", &[("source", source)]);
    let (granted, reused) = (lease("granted"), lease("reused"));
    if granted + reused > 0.0 {
        return Some(format!(
            "acquire {http:.0} µs; grant leases {reused:.0} reused, {granted:.0} new; {:.1} releases per transaction",
            per("release")
        ));
    }
    Some(format!("acquire {http:.0} µs"))
}

impl Phase {
    /// CPU-seconds per cycle of one role, or of every process measured (`None`).
    pub(super) fn cpu_per_cycle(&self, role: Option<&str>) -> Option<f64> {
        let secs: Vec<f64> = self
            .cost
            .cpu
            .iter()
            .filter(|(r, _)| role.is_none_or(|want| *r == want))
            .map(|(_, s)| *s)
            .collect();
        (!secs.is_empty() && self.cycles > 0).then(|| secs.iter().sum::<f64>() / self.cycles as f64)
    }

    pub(super) fn per_sec(&self) -> f64 {
        self.cycles as f64 / self.secs
    }

    pub(super) fn ms(&self, q: f64) -> f64 {
        self.acquire.value_at_quantile(q) as f64 / 1000.0
    }

    pub(super) fn longest_ms(&self) -> f64 {
        self.acquire.max() as f64 / 1000.0
    }
}

pub(super) fn histogram() -> Result<Histogram<u64>> {
    Ok(Histogram::new_with_bounds(1, 60_000_000, 3)?)
}
