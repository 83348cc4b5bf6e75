//! The payments half of the demo: a batch of payouts across the seeded synthetic accounts, two
//! executor processes, one of them stopped (SIGSTOP) with a token in hand right before it writes to
//! the rail; the other takes over; the stopped one resumes with its stale token. Run once with
//! fencing on and once with both kill switches off, then compare. The locks live in lockdb or, with
//! `--backend etcd`, in a single-member etcd the stack starts; paydb is PostgreSQL either way. After
//! the batch, two fenced writes with a bad grant: one signed by a key the resources do not trust,
//! one a real grant of lock-server's for another account — both must be refused (403), the payout
//! untouched.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use dlock_client::{Fence, FencingToken, LockClient};
use dlock_common::grant::account_key;
use dlock_grant::{Claims, KeyId, SigningKey};
use dlock_testkit::History;
use dlock_testkit::stack::{LockBackend, Stack, StackOptions, log_events, process_state};
use dlock_testkit::wait::eventually;
use serde_json::Value;
use uuid::Uuid;

use crate::stack::{Database, step};

/// Seeded customer accounts used by the demo (R__seed_synthetic_accounts.sql: …0001 to …0020).
const ACCOUNTS: u32 = 8;
const PAYOUTS_PER_ACCOUNT: i64 = 4;
const LEASE_MS: &str = "1000";
const LIMIT: Duration = Duration::from_secs(60);

/// What one run measured.
#[derive(Debug, Default)]
pub struct Verdict {
    pub label: &'static str,
    pub payouts: usize,
    pub posted: usize,
    pub rail_received: u64,
    pub payouts_received_twice: usize,
    pub payouts_paid_twice: usize,
    pub fenced_at_rail: f64,
    pub fenced_at_payment: f64,
    pub duplicate_attempts: f64,
    pub stale_token: i64,
    pub takeover_token: Option<i64>,
    pub stale_outcome: String,
    pub reconciliation_clean: bool,
    pub balance_error_minor: i64,
    /// What payment-resource answered a claim whose grant was signed by a key it does not trust.
    pub forged_grant: String,
    /// What it answered a claim with lock-server's real grant for another account.
    pub cross_account_grant: String,
    /// The probed payout is still PENDING and unclaimed afterwards.
    pub probe_untouched: bool,
    pub grant_refusals: f64,
    pub secs: f64,
}

impl Verdict {
    /// Both bad grants refused with their codes, and the payout they aimed at untouched.
    pub fn grants_held(&self) -> bool {
        self.forged_grant == "403 GRANT_UNKNOWN_SIGNER"
            && self.cross_account_grant == "403 GRANT_WRONG_RESOURCE"
            && self.probe_untouched
    }
}

fn seeded_account(n: u32) -> Result<Uuid> {
    Ok(format!("00000000-0000-4000-8000-{n:012}").parse()?)
}

async fn count_in(http: &reqwest::Client, base: &str, state: &str) -> Result<usize> {
    let v: Value = http
        .get(format!("{base}/v1/payouts?state={state}&limit=500"))
        .send()
        .await?
        .json()
        .await?;
    Ok(v["items"].as_array().map_or(0, Vec::len))
}

async fn progress(http: &reqwest::Client, stack: &Stack, total: usize) -> Result<String> {
    let base = stack.payment.url();
    let pending = count_in(http, &base, "PENDING").await?;
    let mut in_flight = 0;
    for s in ["CLAIMED", "RAIL_SUBMITTED", "RAIL_ACKED", "RAIL_AMBIGUOUS"] {
        in_flight += count_in(http, &base, s).await?;
    }
    Ok(format!(
        "{:>3} pending  {:>3} in flight  {:>3} done of {total}",
        pending,
        in_flight,
        total - pending - in_flight
    ))
}

pub async fn run(fencing: bool, run_dir: &Path, backend: LockBackend) -> Result<Verdict> {
    let started = Instant::now();
    let label = if fencing {
        "fencing on"
    } else {
        "kill switches off"
    };
    let mut verdict = Verdict {
        label,
        ..Verdict::default()
    };
    // On etcd the stack starts the etcd member itself; lockdb is not needed at all.
    let lockdb = match backend {
        LockBackend::Postgres => Some(Database::start(History::Lockdb).await?),
        LockBackend::Etcd => None,
    };
    let paydb = Database::start(History::Paydb).await?;
    let mut opts = StackOptions::new(run_dir.join(if fencing { "fenced" } else { "unfenced" }));
    opts.rail_fencing = fencing;
    opts.payment_fencing = fencing;
    opts.lock_backend = backend;
    let lockdb_url = lockdb.as_ref().map(Database::app_url).unwrap_or_default();
    let stack = Stack::start(&lockdb_url, &paydb.app_url(), &opts).await?;
    if let Some(etcd) = &stack.etcd {
        step(format!(
            "etcd: one member on {}, holding the locks",
            etcd.endpoint(0)
        ));
    }
    step(format!(
        "lock-server {} (backend {backend}), payment-resource {}, rail-proxy {}, rail-stub {}{}",
        stack.lock_url,
        stack.payment.url(),
        stack.rail_proxy.url(),
        stack.rail_stub.url(),
        if fencing {
            ""
        } else {
            "  — payment.fencing.enabled=false, rail.proxy.fencing.enabled=false"
        }
    ));

    // A batch across the seeded synthetic accounts.
    let mut opening = BTreeMap::new();
    let mut payouts = Vec::new();
    for n in 1..=ACCOUNTS {
        let id = seeded_account(n)?;
        let account = stack
            .account(id)
            .await
            .with_context(|| format!("seeded account {id}"))?;
        opening.insert(id, account.balance_minor);
        for k in 0..PAYOUTS_PER_ACCOUNT {
            payouts.push(
                stack
                    .create_payout(id, 1_000 + 250 * k, &account.currency)
                    .await?,
            );
        }
    }
    verdict.payouts = payouts.len();
    step(format!(
        "{} payouts created PENDING across {ACCOUNTS} seeded accounts",
        payouts.len()
    ));

    // E1 will stop itself right before its first rail submission; E2 works normally.
    let e1_spec = stack
        .executor_spec("executor-1")?
        .args([
            "--workers",
            "1",
            "--lease-ttl-ms",
            LEASE_MS,
            "--enable-fault-injection",
            "--pause-at",
            "before_rail_submit",
        ])
        .no_wait();
    let mut e1 = stack.start_executor(e1_spec).await?;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()?;
    let stopped = eventually(
        "executor-1 to stop itself at before_rail_submit",
        LIMIT,
        || async { (process_state(e1.pid()) == Some('T')).then_some(()) },
    )
    .await;
    stopped?;
    let pause = log_events(&e1.log, "fault_pause")
        .into_iter()
        .next()
        .context("fault_pause event")?;
    let paused_payout: Uuid = serde_json::from_value(pause["payout_id"].clone()).context("payout_id")?;
    verdict.stale_token = pause["fencing_token"].as_i64().context("fencing_token")?;
    step(format!(
        "executor-1 is STOPPED (SIGSTOP) holding token {} for payout {paused_payout}, right before the rail",
        verdict.stale_token
    ));

    let e2_spec = stack
        .executor_spec("executor-2")?
        .args(["--workers", "2", "--lease-ttl-ms", LEASE_MS])
        .no_wait();
    let mut e2 = stack.start_executor(e2_spec).await?;
    step("executor-2 started: it works the batch and takes over executor-1's account once its lease lapses");
    let mut last = String::new();
    let deadline = Instant::now() + LIMIT;
    loop {
        let p = progress(&http, &stack, payouts.len()).await?;
        if p != last {
            step(&p);
            last = p;
        }
        let posted = stack.payout(paused_payout).await?.state.as_str() == "POSTED";
        let e2_done = e2.wait_exit(Duration::from_millis(200)).await.is_some();
        if posted && last.contains(&format!("{0} done of {0}", payouts.len())) {
            break;
        }
        if e2_done && !posted {
            // E2 went idle before the paused holder's lease lapsed: a fresh executor finishes it.
            step("executor-3 started to finish the paused payout after its lease lapses");
            let spec = stack
                .executor_spec("executor-3")?
                .args([
                    "--workers",
                    "1",
                    "--lease-ttl-ms",
                    LEASE_MS,
                    "--payout-id",
                    &paused_payout.to_string(),
                ])
                .no_wait();
            e2 = stack.start_executor(spec).await?;
        }
        if Instant::now() > deadline {
            bail!("the batch did not finish within {}s", LIMIT.as_secs());
        }
    }
    let p = stack.payout(paused_payout).await?;
    verdict.takeover_token = p.claim_token;
    step(format!(
        "payout {paused_payout} was taken over and POSTED with token {}",
        p.claim_token.map_or("?".into(), |t| t.to_string())
    ));

    step(format!(
        "executor-1 resumes (SIGCONT) and carries on with token {}",
        verdict.stale_token
    ));
    e1.resume()?;
    let log = e1.log.clone();
    verdict.stale_outcome = eventually("executor-1's answer for the stale payout", LIMIT, || {
        let log = log.clone();
        async move { stale_outcome(&log, paused_payout) }
    })
    .await?;
    // Batch mode ends it when it is idle; otherwise a SIGTERM does.
    if e1.wait_exit(Duration::from_secs(10)).await.is_none() {
        e1.stop();
    }
    e2.stop();
    step(format!("executor-1: {}", verdict.stale_outcome));

    // The verdict, from the ground truth of each party.
    let received = stack.rail_received().await?;
    let mut posted = 0;
    let mut spent: BTreeMap<Uuid, i64> = BTreeMap::new();
    for p in &payouts {
        let now = stack.payout(p.payout_id).await?;
        if now.state.as_str() == "POSTED" {
            posted += 1;
            *spent.entry(p.account_id).or_default() += p.amount_minor;
        }
        verdict.payouts_received_twice += usize::from(received.received(p.payout_id) > 1);
        verdict.payouts_paid_twice += usize::from(received.paid(p.payout_id) > 1);
    }
    verdict.posted = posted;
    verdict.rail_received = payouts.iter().map(|p| received.received(p.payout_id)).sum();
    for (id, before) in &opening {
        let after = stack.account(*id).await?.balance_minor;
        verdict.balance_error_minor += (before - spent.get(id).copied().unwrap_or(0)) - after;
    }
    let rail = stack.rail_proxy.url();
    let pay = stack.payment.url();
    verdict.fenced_at_rail = stack
        .metric(&rail, "lock_fenced_out_total", &[("resource", "rail")])
        .await?;
    verdict.duplicate_attempts = stack.metric(&rail, "rail_duplicate_attempted_total", &[]).await?;
    for r in ["account", "ledger", "payout"] {
        verdict.fenced_at_payment += stack
            .metric(&pay, "lock_fenced_out_total", &[("resource", r)])
            .await?;
    }
    verdict.reconciliation_clean = stack.reconciliation().await?["clean"] == true;
    grant_probes(&stack, &mut verdict).await?;
    // Summed over the codes.
    verdict.grant_refusals =
        dlock_testkit::metrics::metric_sum(&stack.metrics(&pay).await?, "grant_refused_total", &[]);
    verdict.secs = started.elapsed().as_secs_f64();
    Ok(verdict)
}

/// Claims `payout` at payment-resource with `fence`, as an executor would; `<status> <code>`.
async fn claim_with(stack: &Stack, payout: Uuid, fence: &Fence) -> Result<String> {
    let request = reqwest::Client::new()
        .post(format!("{}/v1/payouts/{payout}/claim", stack.payment.url()))
        .bearer_auth(&stack.credentials.executor)
        .json(&serde_json::json!({"ownerId": "grant-probe"}));
    let response = fence.apply(request).send().await?;
    let status = response.status().as_u16();
    let body: Value = response.json().await.unwrap_or(Value::Null);
    Ok(format!("{status} {}", body["code"].as_str().unwrap_or(""))
        .trim()
        .to_owned())
}

/// The two bad grants, against a fresh PENDING payout of seeded account 1 (after the batch, with no
/// executor running): a grant signed by a key nobody configured (any token, any account: what an
/// attacker can mint), and the grant lock-server really signed for seeded account 2.
async fn grant_probes(stack: &Stack, verdict: &mut Verdict) -> Result<()> {
    let (a, b) = (seeded_account(1)?, seeded_account(2)?);
    let currency = stack.account(a).await?.currency;
    let target = stack.create_payout(a, 100, &currency).await?;
    step(format!(
        "signed grants: two claims of a fresh payout of {} with a bad grant",
        account_key(a)
    ));

    let forger = SigningKey::generate(KeyId::new("forged").context("key id")?);
    let token = FencingToken::new(i64::MAX / 2)?;
    let forged = forger.sign(&Claims {
        lock_service: "not-the-lock-service",
        lock_key: &account_key(a),
        token: token.get(),
        owner_id: "forger",
        session_id: Uuid::new_v4(),
    })?;
    verdict.forged_grant = claim_with(
        stack,
        target.payout_id,
        &Fence {
            token,
            grant: Some(forged),
        },
    )
    .await?;
    step(format!(
        "a grant signed by an unknown key, token {token} → {}",
        verdict.forged_grant
    ));

    let session = LockClient::new(&stack.lock_url)?
        .open_session("grant-probe", Duration::from_secs(30))
        .await?;
    let lock = session
        .acquire(&account_key(b), Duration::from_secs(30), Duration::from_secs(5))
        .await?;
    verdict.cross_account_grant = claim_with(stack, target.payout_id, &lock.fence()).await?;
    step(format!(
        "lock-server's own grant for {}, token {} → {}",
        account_key(b),
        lock.token(),
        verdict.cross_account_grant
    ));
    lock.release().await?;
    session.close().await?;

    let after = stack.payout(target.payout_id).await?;
    verdict.probe_untouched = after.state.as_str() == "PENDING" && after.claim_token.is_none();
    Ok(())
}

/// What the resumed stale holder got back for `payout`: its first event about it after resuming.
fn stale_outcome(log: &Path, payout: Uuid) -> Option<String> {
    let text = std::fs::read_to_string(log).ok()?;
    let id = payout.to_string();
    let events: Vec<Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .collect();
    let resumed = events.iter().position(|v| v["event"] == "fault_resumed")?;
    let v = events[resumed + 1..]
        .iter()
        .find(|v| v["payout_id"].as_str() == Some(id.as_str()))?;
    Some(if v["event"] == "fenced_out" {
        format!(
            "FENCED OUT by {} (presented {}, it had seen {})",
            v["resource"].as_str().unwrap_or("?"),
            v["presented"],
            v["stored"]
        )
    } else {
        format!(
            "NOT fenced: {} {}",
            v["event"].as_str().unwrap_or("?"),
            v["message"].as_str().unwrap_or("")
        )
    })
}

pub fn print(verdicts: &[Verdict]) {
    println!();
    print!("{:<44}", "");
    for v in verdicts {
        print!("{:>26}", v.label);
    }
    println!();
    let row = |name: &str, f: &dyn Fn(&Verdict) -> String| {
        print!("{name:<44}");
        for v in verdicts {
            print!("{:>26}", f(v));
        }
        println!();
    };
    row("payouts in the batch", &|v| v.payouts.to_string());
    row("payouts POSTED", &|v| v.posted.to_string());
    row("submissions the rail received", &|v| v.rail_received.to_string());
    row("payouts the rail received twice", &|v| {
        v.payouts_received_twice.to_string()
    });
    row("payouts the rail paid twice", &|v| {
        v.payouts_paid_twice.to_string()
    });
    row("stale token → takeover token", &|v| {
        format!(
            "{} → {}",
            v.stale_token,
            v.takeover_token.map_or("?".into(), |t| t.to_string())
        )
    });
    row("fenced at rail-proxy (d)", &|v| v.fenced_at_rail.to_string());
    row("fenced at payment-resource (a)(b)(c)/claim", &|v| {
        v.fenced_at_payment.to_string()
    });
    row("rail.duplicate.attempted", &|v| v.duplicate_attempts.to_string());
    row("balance error (minor units)", &|v| {
        v.balance_error_minor.to_string()
    });
    row("forged grant refused", &|v| v.forged_grant.clone());
    row("another account's grant refused", &|v| {
        v.cross_account_grant.clone()
    });
    row("grant_refused_total (payment-resource)", &|v| {
        v.grant_refusals.to_string()
    });
    row("payout aimed at untouched", &|v| {
        if v.probe_untouched {
            "yes".into()
        } else {
            "NO".into()
        }
    });
    row("reconciliation", &|v| {
        if v.reconciliation_clean {
            "clean".into()
        } else {
            "BREAKS".into()
        }
    });
    row("run time", &|v| format!("{:.1} s", v.secs));
    println!();
    for v in verdicts {
        println!("  {}: the stale holder was {}", v.label, v.stale_outcome);
    }
    if verdicts.iter().any(|v| v.label == "kill switches off") {
        println!();
        println!(
            "  With the kill switches off no resource refused the stale token any more (0 fenced). What still stood\n  \
             between it and a second payment is not fencing but C1's one-forwardable-attempt-per-payout index\n  \
             (rail_submission_attempt_uidx) and its one-leg-per-payout constraint (ledger_leg_uq): a payout nobody\n  \
             has submitted yet, or a write they do not cover, has only the fence. See docs/design.md."
        );
    }
}
