//! `bench lock`: the stores and lock-servers asked for, every phase at each client count, then the
//! tables (rates and latencies, cost per 1,000 cycles, where acquires spent their time), the
//! in-process costs and the floors.

use std::time::Duration;

use anyhow::{Context, Result};
use dlock_client::ClientConfig;
use dlock_testkit::History;
use dlock_testkit::cpu;
use dlock_testkit::etcd::{EtcdCluster, etcd_bin};
use dlock_testkit::procs::{Service, Spec};
use dlock_testkit::stack::{StackTls, lock_clients_file};
use uuid::Uuid;

use super::costs::{print_grant_cost, print_json_cost};
use super::floors::{HOP_ROW, floors};
use super::meter::{Meter, Phase, Proc, ROLES};
use super::phases::{Mode, bare_phase, http_phase, mutex_bench_bin, mutex_phase};
use super::{BenchBackend, LockArgs};
use crate::stack::{Database, RunDir, lock_server, lock_server_env, run_key, step};

pub(super) async fn run(args: LockArgs, run_dir: &RunDir) -> Result<bool> {
    let clients_list = args
        .clients
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    println!(
        "dlock-dev bench lock — backends {:?}, clients {clients_list}, {} s per phase",
        args.backend, args.seconds
    );
    println!(
        "load average at the start: {} (/proc/loadavg)",
        cpu::load_average()
    );
    let max_clients = args.clients.iter().copied().max().unwrap_or(1);
    let measure = Duration::from_secs(args.seconds);
    let pg = matches!(args.backend, BenchBackend::Postgres | BenchBackend::All);
    let etcd = matches!(args.backend, BenchBackend::Etcd | BenchBackend::All);

    // A connection per client, as every earlier row of docs/benchmarks.md had (the listener holds
    // one of them); at least two, which lock-server needs on lockdb (the listener's and one more).
    let pool_size = max_clients.max(2).to_string();
    let db = if pg {
        Some(Database::start(History::Lockdb).await?)
    } else {
        None
    };
    // One lock-server per signing setting asked for, over the same store; with `--hardening`, more
    // on lockdb signing as a deployment does: HTTPS, then HTTPS with lock clients authenticated.
    let key = run_key("bench")?;
    let signings = args.grant_signing.settings();
    let mut pg_servers: Vec<LockServerRow> = Vec::new();
    if let Some(db) = &db {
        let pool = ["--db-pool-size", pool_size.as_str()];
        for &(tls, lock_auth) in args.hardening.settings() {
            if !tls && !lock_auth {
                for &signed in signings {
                    let server = lock_server(db, run_dir.path(), &pool, signed.then_some(&key), None).await?;
                    pg_servers.push(LockServerRow {
                        signed,
                        hardening: "",
                        server,
                        config: ClientConfig::default(),
                    });
                }
                continue;
            }
            let signed = signings.first().copied().unwrap_or(true);
            pg_servers
                .push(hardened_lock_server(db, run_dir, &pool, signed.then_some(&key), lock_auth).await?);
        }
    }
    let cluster = if etcd {
        step("etcd (one member, data on tmpfs) …");
        let c = EtcdCluster::single().context("start etcd (scripts/cluster-tools.sh etcd installs it)")?;
        step(format!("etcd {} ({})", c.endpoint(0), etcd_bin().display()));
        Some(c)
    } else {
        None
    };
    let mut etcd_servers = Vec::new();
    if let Some(c) = &cluster {
        for &signed in signings {
            let server = etcd_lock_server(&c.endpoint(0), run_dir.path(), signed.then_some(&key)).await?;
            etcd_servers.push((signed, server));
        }
    }
    // "unsigned" marks the rows of a lock-server without a signing key.
    let name = |store: &str, signed: bool, shape: &str| {
        format!("dlock/{store}{}, {shape}", if signed { "" } else { " unsigned" })
    };
    let plain = ClientConfig::default();
    // Every lock-server row in both stores: distinct keys, one key without waiting, one key queued.
    const SHAPES: [(&str, Mode); 3] = [
        ("distinct", Mode::Distinct),
        ("one key", Mode::OneKey),
        ("one key, blocking", Mode::Blocking),
    ];
    let mutex_bin = if etcd { Some(mutex_bench_bin()?) } else { None };

    let hop = Service::start(
        Spec::new("hop-server", "dlock-dev")?.args(["bench", "hop-server", "--listen", "127.0.0.1:{port}"]),
        run_dir.path(),
    )
    .await?;
    step(format!("the HTTP hop alone on {} (pid {})", hop.url(), hop.pid()));

    let mut rows: Vec<(u32, Phase)> = Vec::new();
    for &clients in &args.clients {
        step(format!("{HOP_ROW}, {clients} clients …"));
        let meter = Meter::here(Some(&hop));
        rows.push((
            clients,
            http_phase(
                HOP_ROW,
                &hop.url(),
                &plain,
                clients,
                Mode::Distinct,
                measure,
                meter,
            )
            .await?,
        ));
        if let Some(db) = &db {
            // The lock-servers of one shape run side by side, each shape starting from the next
            // server, so that each server runs first, second and third once per client count: a
            // fixed order measured the order too (the store's state and the machine's warmth move
            // along a run). The rows are printed server by server, as before.
            let mut measured = Vec::new();
            for (k, (shape, mode)) in SHAPES.into_iter().enumerate() {
                for j in 0..pg_servers.len() {
                    let i = (j + k) % pg_servers.len();
                    let s = &pg_servers[i];
                    let name = name(&format!("postgres{}", s.hardening), s.signed, shape);
                    step(format!("{name}, {clients} clients …"));
                    let meter = Meter::here(Some(&s.server)).with("postgres", Proc::Tree(db.server.pid));
                    let phase =
                        http_phase(name, &s.server.url(), &s.config, clients, mode, measure, meter).await?;
                    measured.push(((i, k), phase));
                }
            }
            measured.sort_by_key(|(order, _)| *order);
            rows.extend(measured.into_iter().map(|(_, phase)| (clients, phase)));
            step(format!("bare C1 statement, {clients} clients …"));
            let meter = Meter::here(None).with("postgres", Proc::Tree(db.server.pid));
            rows.push((clients, bare_phase(&db.app_url(), clients, measure, meter).await?));
        }
        if let (Some(cluster), Some(bin)) = (&cluster, &mutex_bin) {
            for (signed, server) in &etcd_servers {
                for (shape, mode) in SHAPES {
                    let name = name("etcd", *signed, shape);
                    step(format!("{name}, {clients} clients …"));
                    let mut meter = Meter::here(Some(server));
                    if let Some(pid) = cluster.pid(0) {
                        meter = meter.with("etcd", Proc::One(pid));
                    }
                    rows.push((
                        clients,
                        http_phase(name, &server.url(), &plain, clients, mode, measure, meter).await?,
                    ));
                }
            }
            for (name, contended) in [("etcd Mutex, distinct", false), ("etcd Mutex, one key", true)] {
                step(format!("{name}, {clients} clients …"));
                rows.push((
                    clients,
                    mutex_phase(name, bin, cluster, clients, contended, measure).await?,
                ));
            }
        }
    }

    println!();
    println!(
        "{:<54} {:>8} {:>10} {:>10} {:>12} {:>12} {:>12}",
        "phase", "clients", "cycles/s", "grants/s", "acquire p50", "acquire p99", "longest"
    );
    for (clients, p) in &rows {
        println!(
            "{:<54} {:>8} {:>10.0} {:>10.0} {:>9.2} ms {:>9.2} ms {:>9.2} ms",
            p.name,
            clients,
            p.per_sec(),
            p.grants as f64 / p.secs,
            p.ms(0.50),
            p.ms(0.99),
            p.longest_ms()
        );
    }
    println!();
    println!(
        "cost per 1,000 cycles: CPU-seconds of each process over the measured window (/proc), and the machine's busy share"
    );
    print!("{:<54} {:>8}", "phase", "clients");
    for role in ROLES {
        print!(" {role:>11}");
    }
    println!(" {:>11} {:>6}", "all", "busy");
    for (clients, p) in &rows {
        let per_k = |secs: f64| secs / p.cycles.max(1) as f64 * 1000.0;
        print!("{:<54} {:>8}", p.name, clients);
        for role in ROLES {
            match p.cost.cpu.iter().find(|(r, _)| *r == role) {
                Some((_, secs)) => print!(" {:>11.3}", per_k(*secs)),
                None => print!(" {:>11}", "-"),
            }
        }
        let all: f64 = p.cost.cpu.iter().map(|(_, s)| s).sum();
        match p.cost.busy {
            Some(b) => println!(" {:>11.3} {:>5.0}%", per_k(all), b * 100.0),
            None => println!(" {:>11.3} {:>6}", per_k(all), "-"),
        }
    }
    println!();
    println!("where lock-server's acquires spent their time (its own histograms, means over the window)");
    for (clients, p) in &rows {
        if let Some(l) = &p.cost.latency {
            println!("{}, {clients} clients: {l}", p.name);
        }
    }
    println!();
    let (sign_us, _) = print_grant_cost()?;
    print_json_cost()?;
    println!();
    // The floors are for the first signing setting asked for (a deployment's: signed).
    let signed = signings.first().copied().unwrap_or(true);
    let sign_secs = if signed { sign_us * 1e-6 } else { 0.0 };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let dlock_rows = [
        name("postgres", signed, "distinct"),
        name("etcd", signed, "distinct"),
    ];
    println!(
        "floors: the least CPU a dlock cycle on distinct keys can cost on {cores} cores, from parts measured above \
         (needs the Mutex rows: --backend all)"
    );
    for line in floors(&rows, [&dlock_rows[0], &dlock_rows[1]], sign_secs, cores) {
        println!("  {line}");
    }
    println!();
    println!("goal: dlock (either backend) at 16 clients ≥ etcd Mutex cycles/s at 16 clients, p99 no worse");
    Ok(true)
}

/// lock-server as a process with `--backend etcd`, signing grants with `signing` if given.
async fn etcd_lock_server(
    endpoint: &str,
    run_dir: &std::path::Path,
    signing: Option<&dlock_grant::SigningKey>,
) -> Result<Service> {
    let spec = Spec::new("lock-server-etcd", "lock-server")?.args([
        "--backend",
        "etcd",
        "--etcd-endpoints",
        endpoint,
        "--listen",
        "127.0.0.1:{port}",
    ]);
    let spec = lock_server_env(spec, signing);
    let svc = Service::start(spec, run_dir).await?;
    step(format!("lock-server (etcd) on {} (pid {})", svc.url(), svc.pid()));
    Ok(svc)
}

/// A lock-server of the bench on lockdb, and how its clients reach it.
struct LockServerRow {
    signed: bool,
    /// What its row names add after the store: `""`, `" TLS"` or `" TLS + lock clients"`.
    hardening: &'static str,
    server: Service,
    config: ClientConfig,
}

/// lock-server on lockdb serving HTTPS (a CA made for the run, which the clients trust alone) and,
/// with `lock_auth`, a clients file whose one client may lock the bench's keys: its clients present
/// that client's token.
async fn hardened_lock_server(
    db: &Database,
    run_dir: &RunDir,
    extra: &[&str],
    signing: Option<&dlock_grant::SigningKey>,
    lock_auth: bool,
) -> Result<LockServerRow> {
    let tls = StackTls::new()?;
    let mut config = ClientConfig::default().with_ca_file(tls.ca_file());
    let mut args: Vec<String> = extra.iter().map(|a| (*a).to_owned()).collect();
    if lock_auth {
        // Two UUIDs: a lock client token is at least 32 bytes.
        let token = format!("bench-{}{}", Uuid::new_v4().simple(), Uuid::new_v4().simple());
        let dir = run_dir.path().join("lock-clients");
        std::fs::create_dir_all(&dir)?;
        // The clients' keys are `bench:…`, their owner ids `bench-N` (phases.rs).
        let file = lock_clients_file(&dir, "bench:", "bench-", &token)?;
        args.extend(["--clients-file".to_owned(), file.display().to_string()]);
        config = config.with_token(token);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let server = lock_server(db, run_dir.path(), &args, signing, Some(&*tls)).await?;
    Ok(LockServerRow {
        signed: signing.is_some(),
        hardening: if lock_auth { " TLS + lock clients" } else { " TLS" },
        server,
        config,
    })
}
