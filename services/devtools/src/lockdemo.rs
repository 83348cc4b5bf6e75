//! The lock half of the demo, over lock-server's HTTP API as any client sees it: acquire, contend,
//! expire, take over, and what the stale holder gets back. On either lock backend: the scenes and
//! their checks are the same; what decides the expiry (lockdb's clock or etcd's lease) is said where
//! it happens.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use dlock_testkit::stack::{LockBackend, StackTls};
use reqwest::StatusCode;
use serde_json::Value;

use crate::lockapi::Api;
use crate::stack::{LockStore, RunDir, lock_server_on, run_key, step};

const KEY: &str = "account:demo";
const LEASE_MS: i64 = 1500;

fn token(body: &Value) -> Result<i64> {
    body["fencingToken"]
        .as_i64()
        .ok_or_else(|| anyhow!("no fencingToken in {body}"))
}

/// Runs the lock scenes on `backend`; returns whether every expectation held.
pub async fn run(run_dir: &RunDir, payments: bool, backend: LockBackend) -> Result<bool> {
    let started = Instant::now();
    println!("dlock-dev demo — fencing tokens from the lock service (lock backend: {backend})");
    println!();
    let store_name = match backend {
        LockBackend::Postgres => "lockdb",
        LockBackend::Etcd => "etcd",
    };
    println!("Starting {store_name} and lock-server (--backend {backend}) on loopback:");
    let store = LockStore::start(backend).await?;
    let key = run_key("demo")?;
    // HTTPS, as everywhere the operator deploys it: the scenes' client trusts the run's CA alone.
    let tls = StackTls::new()?;
    let ls = lock_server_on(&store, run_dir.path(), &[], Some(&key), Some(&tls)).await?;
    let trusted = dlock_grant::PublicKeys::new(vec![key.public_key()])?;
    let api = Api::new(ls.url(), Some(tls.ca_file()))?;
    let mut ok = true;
    let mut check = |what: &str, held: bool| {
        println!("    {} {what}", if held { "✔" } else { "✘" });
        ok &= held;
    };

    println!();
    println!("1. Two workers open sessions; W1 acquires {KEY} with a {LEASE_MS} ms lease.");
    let s1 = api.session("worker-1").await?;
    let s2 = api.session("worker-2").await?;
    let (st, g1) = api.acquire(KEY, &s1, "worker-1", LEASE_MS).await?;
    let t1 = token(&g1).with_context(|| format!("W1 acquire answered {st}"))?;
    step(format!("W1 granted, fencing token {t1}"));
    let signed = g1["grant"].as_str().map(|wire| trusted.verify(wire));
    step(match &signed {
        Some(Ok(g)) => format!(
            "W1's grant is signed by lock-server's key {}: {} at token {} to {}",
            g.key_id, g.lock_key, g.token, g.owner_id
        ),
        Some(Err(e)) => format!("W1's grant does not verify: {e}"),
        None => "W1's answer carries no signed grant".to_owned(),
    });
    check(
        "the grant is signed for exactly this key, token and holder (a resource can check it offline)",
        matches!(&signed, Some(Ok(g)) if g.lock_key == KEY && g.token == t1 && g.owner_id == "worker-1"),
    );
    if backend == LockBackend::Etcd {
        step(format!(
            "(etcd leases are whole seconds: the lease is rounded up to {} s, never shortened)",
            (LEASE_MS + 999) / 1000
        ));
    }

    println!("2. W2 asks for the same key while W1's lease is live.");
    let (st, body) = api.acquire(KEY, &s2, "worker-2", LEASE_MS).await?;
    step(format!(
        "W2 → {} {}",
        st.as_u16(),
        body["code"].as_str().unwrap_or("")
    ));
    check("W2 is refused (409 CONTENDED)", st == StatusCode::CONFLICT);

    println!("3. W1 pauses (a GC pause, SIGSTOP, a slow disk): it stops renewing.");
    // What decides the expiry differs: lockdb keeps the row and its clock (`now()`) marks it
    // EXPIRED; etcd's lease clock revokes the lease, and the grant's key goes with it (FREE).
    let lapsed = match backend {
        LockBackend::Postgres => "EXPIRED",
        LockBackend::Etcd => "FREE",
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let state = api.read(KEY).await?;
        if state["state"] == lapsed {
            step(match backend {
                LockBackend::Postgres => format!(
                    "lockdb's clock says the lease expired at {}",
                    state["expiresAt"].as_str().unwrap_or("?")
                ),
                LockBackend::Etcd => {
                    "etcd's lease clock ran out: the lease lapsed and took W1's grant key with it \
                                      (the key reads FREE)"
                        .to_owned()
                }
            });
            break;
        }
        if Instant::now() > deadline {
            bail!("the lease did not expire: {state}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    println!("4. W2 takes over the expired lease.");
    let (_, g2) = api.acquire(KEY, &s2, "worker-2", 30_000).await?;
    let t2 = token(&g2)?;
    step(format!("W2 granted, fencing token {t2}"));
    check(
        &format!("the takeover token is strictly higher ({t2} > {t1})"),
        t2 > t1,
    );
    step(match backend {
        LockBackend::Postgres => {
            "(gaps are expected: a refused acquire still consumes a value of the global sequence)"
        }
        LockBackend::Etcd => {
            "(gaps are expected: the token is etcd's cluster-wide revision, which every write raises — sessions too)"
        }
    });

    println!("5. W1 wakes up and carries on with token {t1}.");
    let (st, body) = api.renew(KEY, t1, LEASE_MS).await?;
    step(format!(
        "W1 renew → {} {}",
        st.as_u16(),
        body["code"].as_str().unwrap_or("")
    ));
    check(
        "W1's renew fails: its lease is gone (410 LEASE_EXPIRED)",
        st == StatusCode::GONE,
    );
    let (st, body) = api.release(KEY, t1).await?;
    step(format!("W1 release → {} stale={}", st.as_u16(), body["stale"]));
    check("W1's release is stale and changes nothing", body["stale"] == true);
    let state = api.read(KEY).await?;
    check(
        &format!("W2 still holds the lock with token {}", state["fencingToken"]),
        state["state"] == "HELD" && state["fencingToken"].as_i64() == Some(t2),
    );

    println!("6. W2 releases; W1 acquires again.");
    let (_, body) = api.release(KEY, t2).await?;
    check("W2's release removes its grant", body["released"] == true);
    let (_, g3) = api.acquire(KEY, &s1, "worker-1", LEASE_MS).await?;
    let t3 = token(&g3)?;
    step(format!("W1 granted, fencing token {t3}"));
    check(
        &format!("tokens strictly increase across release and re-acquire ({t1} < {t2} < {t3})"),
        t1 < t2 && t2 < t3,
    );
    let lost = api.metric("lock_session_lost_total").await?;
    step(format!("lock_session_lost_total = {lost} (W1's failed renew)"));
    check("the lost lease was counted", lost >= 1.0);

    println!();
    println!(
        "A lock alone cannot stop W1: had it written to a resource in step 5, only the resource's own check of \
         token {t1} against the {t2} it has already seen could refuse it."
    );
    println!();
    println!(
        "Lock scenes: {} (lock backend: {backend}, {:.1} s)",
        if ok { "PASS" } else { "FAIL" },
        started.elapsed().as_secs_f64()
    );
    drop(ls);
    drop(store);
    if !payments {
        return Ok(ok);
    }

    println!();
    println!(
        "dlock-dev demo — the payments stack: fencing enforced by the resources themselves (lock backend: {backend})"
    );
    let mut verdicts = Vec::new();
    for fencing in [true, false] {
        println!();
        let stores = match backend {
            LockBackend::Postgres => "Two databases",
            LockBackend::Etcd => "paydb on PostgreSQL, the locks on etcd",
        };
        if fencing {
            println!("Run 1: fencing on. {stores}, five services, two executors, one injected pause:");
        } else {
            println!(
                "Run 2: the same scenario with both kill switches off (payment.fencing.enabled, rail.proxy.fencing.enabled):"
            );
        }
        verdicts.push(crate::paydemo::run(fencing, run_dir.path(), backend).await?);
    }
    crate::paydemo::print(&verdicts);
    let fenced = &verdicts[0];
    let proof = fenced.clean()
        && fenced.fenced_at_rail + fenced.fenced_at_payment >= 1.0
        && verdicts.iter().all(crate::paydemo::Verdict::grants_held);

    // The failover is lockdb's: on etcd there is no lockdb to fail over.
    let failover = match backend {
        LockBackend::Postgres => {
            println!();
            println!(
                "dlock-dev demo — a lockdb failover: a promoted standby that lags must never hand out a token again"
            );
            let mut runs = Vec::new();
            for jump in [true, false] {
                println!();
                if jump {
                    println!(
                        "Run 3: lockdb as a primary and an asynchronous standby held behind; the primary crashes, the \
                         standby is promoted; lock-server's sequence jump on:"
                    );
                } else {
                    println!(
                        "Run 4: the same failover with lock-server's sequence jump switched off \
                         (DLOCK_UNSAFE_NO_SEQUENCE_JUMP=true):"
                    );
                }
                runs.push(crate::failover_demo::run(jump, run_dir.path()).await?);
            }
            crate::failover_demo::print(&runs);
            Some(runs[0].clean())
        }
        LockBackend::Etcd => None,
    };
    println!();
    println!(
        "Verdict: {} — with fencing on, every payout was paid and posted exactly once, the paused holder was refused by \
         the resource itself, a forged grant and another account's grant were refused, and the books reconcile{}. \
         (lock backend: {backend}; {:.0} s in all)",
        if ok && proof && failover != Some(false) {
            "PASS"
        } else {
            "FAIL"
        },
        match failover {
            Some(false) =>
                "; but the lockdb failover with the sequence jump did not come out clean (run 3 above)",
            Some(true) =>
                "; after a lockdb failover to a lagging standby, lock-server's tokens stayed above every token \
                        handed out before it and the paused holder was refused again",
            None => " (the lockdb failover runs only with --backend postgres)",
        },
        started.elapsed().as_secs_f64()
    );
    Ok(ok && proof && failover != Some(false))
}
