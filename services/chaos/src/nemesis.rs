//! The nemeses and the schedule of faults, which follows from the seed alone: the same seed, the
//! same options, the same schedule (printed at the start of every run so that it can be replayed).
//! Faults run one after another with a gap between them, each healed before the next begins and
//! all of them before the end of the fault window.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The kinds of fault (`--nemesis`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, clap::ValueEnum)]
pub enum Nemesis {
    /// SIGSTOP/SIGCONT of an executor past its lease, or of lock-server, payment-resource, rail-proxy.
    Pause,
    /// SIGKILL and restart of a service process, also while a post or a rail submission is in flight.
    Kill,
    /// An immediate stop and restart of paydb or lockdb; on etcd, kill and restart of the leader or a
    /// follower.
    Database,
    /// An executor cut off from the lock service or from the resources, both ways or one way.
    Partition,
    /// An executor restarted with its clock minutes ahead or behind (libfaketime).
    Clock,
    /// The rail times out, answers slowly, rejects, answers "unknown", or pays without answering.
    Rail,
    /// lockdb on PostgreSQL (or paydb, `--failover-on`, on either backend) runs as a primary with a
    /// streaming standby; the primary is killed, the standby promoted, the clients follow it, and a
    /// new standby is built from the new primary. With asynchronous replication the standby is first
    /// held behind, so acknowledged transactions are lost.
    Failover,
}

impl Nemesis {
    pub const ALL: [Nemesis; 7] = [
        Nemesis::Pause,
        Nemesis::Kill,
        Nemesis::Database,
        Nemesis::Partition,
        Nemesis::Clock,
        Nemesis::Rail,
        Nemesis::Failover,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Nemesis::Pause => "pause",
            Nemesis::Kill => "kill",
            Nemesis::Database => "database",
            Nemesis::Partition => "partition",
            Nemesis::Clock => "clock",
            Nemesis::Rail => "rail",
            Nemesis::Failover => "failover",
        }
    }
}

/// How a replicated database's standby follows its primary (`--replication`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Replication {
    /// `synchronous_commit=on` and `synchronous_standby_names` naming the standby: a commit is
    /// acknowledged once the standby has it.
    #[default]
    Sync,
    /// The standby streams without the primary waiting for it; the failover nemesis holds it
    /// behind (it stops receiving WAL) before it kills the primary.
    Async,
}

impl Replication {
    pub fn name(self) -> &'static str {
        match self {
            Replication::Sync => "sync",
            Replication::Async => "async",
        }
    }
}

impl std::fmt::Display for Replication {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Which PostgreSQL databases the failover nemesis fails over (`--failover-on`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum FailoverOn {
    /// lockdb (postgres backend).
    #[default]
    Lockdb,
    /// paydb (either backend).
    Paydb,
    /// Either, half of the failovers each.
    Both,
}

impl FailoverOn {
    pub fn lockdb(self) -> bool {
        matches!(self, FailoverOn::Lockdb | FailoverOn::Both)
    }

    pub fn paydb(self) -> bool {
        matches!(self, FailoverOn::Paydb | FailoverOn::Both)
    }

    pub fn name(self) -> &'static str {
        match self {
            FailoverOn::Lockdb => "lockdb",
            FailoverOn::Paydb => "paydb",
            FailoverOn::Both => "both",
        }
    }
}

/// A service process a fault can hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Process {
    Executor(usize),
    LockServer(usize),
    PaymentResource,
    RailProxy,
}

impl std::fmt::Display for Process {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Process::Executor(i) => write!(f, "executor-{i}"),
            Process::LockServer(i) => write!(f, "lock-server-{i}"),
            Process::PaymentResource => f.write_str("payment-resource"),
            Process::RailProxy => f.write_str("rail-proxy"),
        }
    }
}

/// Which links of an executor a partition cuts, and how.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut {
    /// Lock service unreachable (requests dropped); resources reachable.
    LockService,
    /// Resources unreachable (requests dropped); lock service reachable.
    Resources,
    /// One way: requests to the lock service arrive, answers are lost.
    LockServiceAnswers,
    /// One way: requests to the resources arrive, answers are lost.
    ResourceAnswers,
    /// Every connection of the executor reset.
    Reset,
    /// Requests to the resources arrive late: held past the lease, then delivered (a slow link).
    Delay,
}

/// What the rail does during a rail fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RailFault {
    /// rail-stub's `timeout` mode: the money moves, the answer never comes.
    Timeout,
    /// Slow acks (latency in ms), longer than rail-proxy's timeout now and then.
    Slow(u64),
    /// Every order rejected.
    Reject,
    /// `503` from the rail without it seeing the order.
    Unknown,
    /// The rail pays, its answer is lost on the way back.
    LostAnswer,
}

/// Which database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Db {
    Paydb,
    /// lockdb (postgres backend).
    Lockdb,
    /// An etcd member: the leader (`true`) or a follower.
    EtcdMember {
        leader: bool,
    },
}

/// Where an executor stops itself for an in-gap pause: after its last lock check, right before the
/// write (payout-executor's `--pause-at`, a build with fault injection). A SIGSTOP from outside
/// almost never lands in that gap — the client checks its lease before every write — so the gap
/// is where the resources' fences are really put to the test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gap {
    BeforeClaim,
    BeforeRailSubmit,
    BeforePost,
}

impl Gap {
    pub fn flag(self) -> &'static str {
        match self {
            Gap::BeforeClaim => "before_claim",
            Gap::BeforeRailSubmit => "before_rail_submit",
            Gap::BeforePost => "before_post",
        }
    }
}

/// One scheduled fault.
#[derive(Debug, Clone, PartialEq)]
pub enum Fault {
    /// `gap`: the executor stops itself between its lock check and a write (in-gap pause).
    Pause {
        target: Process,
        hold: Duration,
        gap: Option<Gap>,
    },
    Kill {
        target: Process,
        down: Duration,
        in_flight: bool,
    },
    Database {
        db: Db,
        down: Duration,
    },
    Partition {
        executor: usize,
        cut: Cut,
        hold: Duration,
    },
    Clock {
        executor: usize,
        offset_secs: i64,
        hold: Duration,
    },
    Rail {
        fault: RailFault,
        hold: Duration,
    },
    /// Kill `db`'s primary, promote its standby, point the clients at it `down` after the kill
    /// (longer than a lease), build a new standby. `lag`: asynchronous replication — the standby is
    /// held behind this long (and until the record shows writes it lacks) before the kill.
    Failover {
        db: Db,
        lag: Option<Duration>,
        down: Duration,
    },
}

/// What the schedule allows for building a new standby after a failover (pg_basebackup of a small
/// database on loopback); the run waits for the real thing, the schedule only spaces faults.
pub const REBUILD_ALLOWANCE: Duration = Duration::from_secs(3);

/// What the schedule allows, beyond `lag`, for an asynchronous failover's wait on the record (until
/// it shows writes the held standby lacks: some 64 grants on lockdb).
pub const RECORD_ALLOWANCE: Duration = Duration::from_secs(6);

impl Fault {
    pub fn nemesis(&self) -> Nemesis {
        match self {
            Fault::Pause { .. } => Nemesis::Pause,
            Fault::Kill { .. } => Nemesis::Kill,
            Fault::Database { .. } => Nemesis::Database,
            Fault::Partition { .. } => Nemesis::Partition,
            Fault::Clock { .. } => Nemesis::Clock,
            Fault::Rail { .. } => Nemesis::Rail,
            Fault::Failover { .. } => Nemesis::Failover,
        }
    }

    /// How long the fault is held (or the process stays down).
    pub fn hold(&self) -> Duration {
        match self {
            Fault::Pause { hold, .. }
            | Fault::Partition { hold, .. }
            | Fault::Clock { hold, .. }
            | Fault::Rail { hold, .. } => *hold,
            Fault::Kill { down, .. } | Fault::Database { down, .. } => *down,
            Fault::Failover { lag, down, .. } => {
                lag.map_or(Duration::ZERO, |l| l + RECORD_ALLOWANCE) + *down + REBUILD_ALLOWANCE
            }
        }
    }

    pub fn target(&self) -> String {
        match self {
            Fault::Pause { target, .. } | Fault::Kill { target, .. } => target.to_string(),
            Fault::Database { db, .. } | Fault::Failover { db, .. } => match db {
                Db::Paydb => "paydb".into(),
                Db::Lockdb => "lockdb".into(),
                Db::EtcdMember { leader: true } => "etcd leader".into(),
                Db::EtcdMember { leader: false } => "etcd follower".into(),
            },
            Fault::Partition { executor, .. } | Fault::Clock { executor, .. } => {
                format!("executor-{executor}")
            }
            Fault::Rail { .. } => "rail".into(),
        }
    }
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let secs = self.hold().as_secs_f64();
        match self {
            Fault::Pause {
                target, gap: None, ..
            } => write!(f, "pause {target} (SIGSTOP) for {secs:.1} s"),
            Fault::Pause {
                target, gap: Some(g), ..
            } => write!(
                f,
                "pause {target} in the gap {} (it stops itself after its lock check) for {secs:.1} s",
                g.flag()
            ),
            Fault::Kill {
                target, in_flight, ..
            } => write!(
                f,
                "kill {target} (SIGKILL){}, restart after {secs:.1} s",
                if *in_flight { " with a write in flight" } else { "" }
            ),
            Fault::Database { .. } => write!(
                f,
                "crash {} (immediate stop), restart after {secs:.1} s",
                self.target()
            ),
            Fault::Partition { executor, cut, .. } => {
                let what = match cut {
                    Cut::LockService => "cut off from the lock service",
                    Cut::Resources => "cut off from the resources",
                    Cut::LockServiceAnswers => "hears no answers from the lock service (one way)",
                    Cut::ResourceAnswers => "hears no answers from the resources (one way)",
                    Cut::Reset => "has every connection reset",
                    Cut::Delay => "has its requests to the resources delivered late",
                };
                write!(f, "executor-{executor} {what} for {secs:.1} s")
            }
            Fault::Clock {
                executor,
                offset_secs,
                ..
            } => write!(
                f,
                "executor-{executor} restarted with its clock {}{} s for {secs:.1} s",
                if *offset_secs >= 0 { "+" } else { "" },
                offset_secs
            ),
            Fault::Rail { fault, .. } => {
                let what = match fault {
                    RailFault::Timeout => "times out (pays, never answers)".to_owned(),
                    RailFault::Slow(ms) => format!("answers after {ms} ms"),
                    RailFault::Reject => "rejects every order".to_owned(),
                    RailFault::Unknown => "answers 503 (unknown) without seeing the order".to_owned(),
                    RailFault::LostAnswer => "pays, its answers are lost".to_owned(),
                };
                write!(f, "the rail {what} for {secs:.1} s")
            }
            Fault::Failover { lag, down, .. } => {
                let db = self.target();
                match lag {
                    None => write!(f, "fail {db} over to its synchronous standby"),
                    Some(l) => write!(
                        f,
                        "hold {db}'s asynchronous standby behind for {:.1} s (and until the record shows writes it lacks), then fail over to it",
                        l.as_secs_f64()
                    ),
                }?;
                write!(
                    f,
                    ": kill the primary, promote the standby, clients follow {:.1} s after the kill, a new standby",
                    down.as_secs_f64()
                )
            }
        }
    }
}

/// A fault and when it starts, from the beginning of the fault window.
#[derive(Debug, Clone, PartialEq)]
pub struct Scheduled {
    pub at: Duration,
    pub fault: Fault,
}

/// What the schedule needs to know of the stack.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub executors: usize,
    pub lock_servers: usize,
    pub etcd: bool,
    /// The executors' lease: a pause of an executor lasts longer than this.
    pub lease: Duration,
    /// The executors' session TTL: some pauses outlast the session too.
    pub session: Duration,
    /// The replicated databases' mode (the failover nemesis).
    pub replication: Replication,
    /// What the failover nemesis fails over; on etcd only paydb can be.
    pub failover_on: FailoverOn,
}

impl Shape {
    /// The databases the failover nemesis can fail over in this stack.
    pub fn failover_targets(&self) -> Vec<Db> {
        let mut out = Vec::new();
        if self.failover_on.lockdb() && !self.etcd {
            out.push(Db::Lockdb);
        }
        if self.failover_on.paydb() {
            out.push(Db::Paydb);
        }
        out
    }
}

fn ms(rng: &mut StdRng, lo: u64, hi: u64) -> Duration {
    Duration::from_millis(rng.random_range(lo..=hi))
}

/// The faults of one run: from `window` (the fault window's length), the enabled nemeses, the
/// stack's shape and the seed. The last fault is healed at least two seconds before the window ends.
pub fn schedule(seed: u64, window: Duration, nemeses: &[Nemesis], shape: Shape) -> Vec<Scheduled> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = Vec::new();
    // No database to fail over (etcd holds the locks and paydb is not chosen): the failover
    // nemesis sits out, and the others' schedule is the one they would have without it.
    let nemeses: Vec<Nemesis> = nemeses
        .iter()
        .copied()
        .filter(|n| *n != Nemesis::Failover || !shape.failover_targets().is_empty())
        .collect();
    if nemeses.is_empty() {
        return out;
    }
    let end = window.saturating_sub(Duration::from_secs(2));
    // A quiet start: the stack is warm and payouts are flowing before the first fault.
    let mut at = ms(&mut rng, 1_000, 2_000);
    loop {
        let nemesis = nemeses[rng.random_range(0..nemeses.len())];
        let fault = pick(&mut rng, nemesis, shape);
        if at + fault.hold() > end {
            break;
        }
        let hold = fault.hold();
        out.push(Scheduled { at, fault });
        at += hold + ms(&mut rng, 300, 1_500);
    }
    out
}

fn pick(rng: &mut StdRng, nemesis: Nemesis, s: Shape) -> Fault {
    let executor = rng.random_range(0..s.executors);
    let lease = u64::try_from(s.lease.as_millis()).unwrap_or(u64::MAX);
    let session = u64::try_from(s.session.as_millis()).unwrap_or(u64::MAX);
    match nemesis {
        Nemesis::Pause => {
            let target = match rng.random_range(0..10) {
                0..=5 => Process::Executor(executor),
                6 => Process::LockServer(rng.random_range(0..s.lock_servers)),
                7 => Process::PaymentResource,
                _ => Process::RailProxy,
            };
            let hold = match target {
                // Past the lease, and now and then past the session: the classic fencing case.
                Process::Executor(_) => ms(rng, lease + lease / 2, session + lease),
                _ => ms(rng, 200, 1_500),
            };
            let gap = match target {
                Process::Executor(_) if rng.random_bool(0.6) => Some(match rng.random_range(0..3) {
                    0 => Gap::BeforeClaim,
                    1 => Gap::BeforeRailSubmit,
                    _ => Gap::BeforePost,
                }),
                _ => None,
            };
            Fault::Pause { target, hold, gap }
        }
        Nemesis::Kill => {
            let target = match rng.random_range(0..10) {
                0..=3 => Process::Executor(executor),
                4..=5 => Process::LockServer(rng.random_range(0..s.lock_servers)),
                6..=7 => Process::PaymentResource,
                _ => Process::RailProxy,
            };
            let in_flight =
                matches!(target, Process::PaymentResource | Process::RailProxy) && rng.random_bool(0.7);
            Fault::Kill {
                target,
                down: ms(rng, 100, 1_500),
                in_flight,
            }
        }
        Nemesis::Database => {
            let db = if rng.random_bool(0.5) {
                Db::Paydb
            } else if s.etcd {
                Db::EtcdMember {
                    leader: rng.random_bool(0.5),
                }
            } else {
                Db::Lockdb
            };
            Fault::Database {
                db,
                down: ms(rng, 100, 1_500),
            }
        }
        Nemesis::Partition => {
            let cut = match rng.random_range(0..6) {
                0 => Cut::LockService,
                1 => Cut::Resources,
                2 => Cut::LockServiceAnswers,
                3 => Cut::ResourceAnswers,
                4 => Cut::Delay,
                _ => Cut::Reset,
            };
            Fault::Partition {
                executor,
                cut,
                hold: ms(rng, 500, lease * 3),
            }
        }
        Nemesis::Clock => {
            let minutes = rng.random_range(2..=10i64);
            let offset_secs = if rng.random_bool(0.5) {
                60 * minutes
            } else {
                -60 * minutes
            };
            Fault::Clock {
                executor,
                offset_secs,
                hold: ms(rng, 2_000, 5_000),
            }
        }
        Nemesis::Rail => {
            let fault = match rng.random_range(0..5) {
                0 => RailFault::Timeout,
                1 => RailFault::Slow(rng.random_range(200..=1_500)),
                2 => RailFault::Reject,
                3 => RailFault::Unknown,
                _ => RailFault::LostAnswer,
            };
            Fault::Rail {
                fault,
                hold: ms(rng, 500, 2_500),
            }
        }
        Nemesis::Failover => {
            // Not empty: `schedule` leaves the nemesis out when there is nothing to fail over.
            let targets = s.failover_targets();
            let db = targets[rng.random_range(0..targets.len())];
            let lag = match s.replication {
                Replication::Sync => None,
                Replication::Async => Some(ms(rng, 500, 2_000)),
            };
            // The clients reach the new primary only after a lease has run out: a failover takes
            // longer than that in practice (detection, promotion), and a grant the promoted
            // standby never saw must have lapsed before its key can be granted again.
            Fault::Failover {
                db,
                lag,
                down: ms(rng, lease + 500, lease + 2_000),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> Shape {
        Shape {
            executors: 3,
            lock_servers: 2,
            etcd: false,
            lease: Duration::from_secs(1),
            session: Duration::from_secs(3),
            replication: Replication::Sync,
            failover_on: FailoverOn::Lockdb,
        }
    }

    #[test]
    fn the_seed_decides_the_schedule() {
        let w = Duration::from_secs(60);
        let a = schedule(7, w, &Nemesis::ALL, shape());
        assert_eq!(a, schedule(7, w, &Nemesis::ALL, shape()));
        assert_ne!(a, schedule(8, w, &Nemesis::ALL, shape()));
        assert!(a.len() > 10, "{}", a.len());
    }

    #[test]
    fn every_fault_heals_inside_the_window_and_they_do_not_overlap() {
        let w = Duration::from_secs(45);
        for seed in 0..50 {
            let s = schedule(seed, w, &Nemesis::ALL, shape());
            let mut free_at = Duration::ZERO;
            for f in &s {
                assert!(f.at >= free_at, "seed {seed}: overlap at {:?}", f.at);
                free_at = f.at + f.fault.hold();
                assert!(free_at + Duration::from_secs(2) <= w, "seed {seed}");
            }
        }
    }

    #[test]
    fn on_etcd_without_paydb_failover_sits_out_and_changes_nothing() {
        let etcd = Shape {
            etcd: true,
            ..shape()
        };
        let w = Duration::from_secs(60);
        let without: Vec<Nemesis> = Nemesis::ALL
            .iter()
            .copied()
            .filter(|n| *n != Nemesis::Failover)
            .collect();
        assert_eq!(
            schedule(5, w, &Nemesis::ALL, etcd),
            schedule(5, w, &without, etcd)
        );
        assert!(schedule(5, w, &[Nemesis::Failover], etcd).is_empty());
        let paydb = Shape {
            failover_on: FailoverOn::Paydb,
            ..etcd
        };
        assert!(!schedule(5, w, &[Nemesis::Failover], paydb).is_empty());
    }

    #[test]
    fn failovers_outlast_a_lease_and_lag_only_when_asynchronous() {
        let w = Duration::from_secs(120);
        for replication in [Replication::Sync, Replication::Async] {
            let s = schedule(
                11,
                w,
                &[Nemesis::Failover],
                Shape {
                    replication,
                    ..shape()
                },
            );
            assert!(s.len() > 3, "{}", s.len());
            for f in &s {
                let Fault::Failover { db, lag, down } = f.fault else {
                    panic!("{:?}", f.fault)
                };
                assert_eq!(db, Db::Lockdb);
                assert!(down > Duration::from_secs(1), "{down:?}");
                assert_eq!(lag.is_some(), replication == Replication::Async);
            }
        }
    }

    #[test]
    fn only_the_named_nemeses_run_and_executor_pauses_outlast_the_lease() {
        let s = schedule(3, Duration::from_secs(120), &[Nemesis::Pause], shape());
        assert!(!s.is_empty());
        for f in &s {
            assert_eq!(f.fault.nemesis(), Nemesis::Pause);
            if let Fault::Pause {
                target: Process::Executor(_),
                hold,
                ..
            } = f.fault
            {
                assert!(hold > Duration::from_secs(1));
            }
        }
    }
}
