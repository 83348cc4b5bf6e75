//! The payments half of the demo: a batch of payouts across the seeded synthetic accounts, two
//! executor processes, one of them stopped (SIGSTOP) with a token in hand right before it posts a
//! payout the rail has already paid; the other takes that account over and pays the batch's other
//! payouts, advancing the account's fence; the stopped one resumes and posts with its stale token.
//! Only the fence covers that write: it is a payout nobody else has posted, so none of C1's unique
//! indexes applies. Run once with fencing on and once with both kill switches off, then compare,
//! every figure read back from paydb and the rail. The locks live in lockdb or, with `--backend
//! etcd`, in a single-member etcd the stack starts; paydb is PostgreSQL either way. After the
//! batch, two fenced writes with a bad grant: one signed by a key the resources do not trust, one a
//! real grant of lock-server's for another account — both must be refused (403), the payout
//! untouched.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use dlock_client::{Fence, FencingToken, LockClient};
use dlock_common::grant::account_key;
use dlock_grant::{Claims, KeyId, SigningKey};
use dlock_testkit::History;
use dlock_testkit::stack::{LockBackend, Stack, StackOptions, StackTls, log_events, process_state};
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
    /// The payout executor-1 was about to post when it stopped, and its amount.
    pub stale_payout: Option<Uuid>,
    pub stale_amount: i64,
    pub stale_token: i64,
    /// The fence of the paused payout's account once executor-2 had paid its other payouts: the
    /// newest grant that wrote the account before the stale holder returned.
    pub newer_token: Option<i64>,
    pub stale_outcome: String,
    /// The stale holder's post landed: its payout is POSTED under its own, stale claim (nobody took
    /// it over), read back from paydb.
    pub stale_post_landed: bool,
    /// The account's fence at the end of the run.
    pub fence_after: Option<i64>,
    /// Reconciliation's FENCE_REGRESSED breaks, and what the first names: the stale grant, the
    /// grants that wrote legs on the account, the payouts the stale grant wrote.
    pub fence_regressed: u64,
    pub regressed: Option<Regressed>,
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
    /// The stale post refused, every payout paid and posted exactly once, the books reconcile.
    pub fn clean(&self) -> bool {
        !self.stale_post_landed
            && self.posted == self.payouts
            && self.payouts_received_twice == 0
            && self.payouts_paid_twice == 0
            && self.balance_error_minor == 0
            && self.fence_regressed == 0
            && self.reconciliation_clean
    }

    /// The stale holder's post landed and paydb's record shows it: the account's fence went back
    /// and reconciliation names the stale grant.
    pub fn corrupted(&self) -> bool {
        self.stale_post_landed
            && self.fence_regressed > 0
            && self.regressed.as_ref().is_some_and(|r| {
                r.stale_fence == self.stale_token && self.stale_payout.is_some_and(|p| r.payouts.contains(&p))
            })
    }

    /// One line on what the databases and the rail show for this run.
    pub fn what_the_record_shows(&self) -> String {
        let payout = self.stale_payout.map_or("?".into(), |p| p.to_string());
        let newer = self.newer_token.map_or("?".into(), |t| t.to_string());
        if self.clean() {
            return format!(
                "{}: CLEAN — the stale holder's post was refused; payout {payout} was then posted once with a fresh \
                 grant, every payout was paid and posted exactly once, balance error 0, reconciliation clean.",
                self.label
            );
        }
        if self.corrupted() {
            let fences = self
                .regressed
                .as_ref()
                .map_or(String::new(), |r| format!("{:?}", r.fences));
            return format!(
                "{}: CORRUPTED — the stale holder's post LANDED: payout {payout} ({}) was debited from its account \
                 with token {} after token {newer} had written there.\n    The account's fence went back from {newer} \
                 to {} and reconciliation reports FENCE_REGRESSED (ledger legs by grants {fences}: the stale one wrote \
                 last).\n    Only the fence covers this write: a payout nobody else had posted, so no unique index \
                 applies. The payout state machine and C1's unique constraints still kept every payout paid and \
                 booked once\n    ({} paid twice, balance error {}); what broke is what fencing alone guarantees: once a \
                 newer grant has written, an older one's writes are refused.",
                self.label,
                self.stale_amount,
                self.stale_token,
                self.fence_after.map_or("?".into(), |t| t.to_string()),
                self.payouts_paid_twice,
                self.balance_error_minor,
            );
        }
        format!(
            "{}: neither clean nor the corruption the kill switches allow — stale post {}, {} of {} POSTED, {} paid \
             twice, balance error {}, FENCE_REGRESSED {}, reconciliation {}.",
            self.label,
            if self.stale_post_landed {
                "LANDED"
            } else {
                "refused"
            },
            self.posted,
            self.payouts,
            self.payouts_paid_twice,
            self.balance_error_minor,
            self.fence_regressed,
            if self.reconciliation_clean {
                "clean"
            } else {
                "BREAKS"
            }
        )
    }

    /// Both bad grants refused with their codes, and the payout they aimed at untouched.
    pub fn grants_held(&self) -> bool {
        self.forged_grant == "403 GRANT_UNKNOWN_SIGNER"
            && self.cross_account_grant == "403 GRANT_WRONG_RESOURCE"
            && self.probe_untouched
    }
}

/// A FENCE_REGRESSED break as reconciliation reports it.
#[derive(Debug, Clone)]
pub struct Regressed {
    pub stale_fence: i64,
    pub fences: Vec<i64>,
    pub payouts: Vec<Uuid>,
}

impl Regressed {
    fn from_report(report: &Value) -> Option<Self> {
        let brk = report["accounts"]
            .as_array()?
            .iter()
            .flat_map(|a| a["breaks"].as_array().into_iter().flatten())
            .find(|b| b["kind"] == "FENCE_REGRESSED")?;
        Some(Self {
            stale_fence: brk["staleFence"].as_i64()?,
            fences: serde_json::from_value(brk["fences"].clone()).ok()?,
            payouts: serde_json::from_value(brk["payoutIds"].clone()).ok()?,
        })
    }
}

pub(crate) fn seeded_account(n: u32) -> Result<Uuid> {
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
    // HTTPS on every hop, as a deployment made by the operator has it: a CA made for the run,
    // a certificate per server, every client trusting that CA alone.
    opts.tls = Some(StackTls::new()?);
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

    if let Some(ca) = stack.ca_file() {
        step(format!(
            "HTTPS on every API: each server's certificate is signed by the run's CA {}, the only root \
             its clients trust",
            ca.display()
        ));
    }

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

    // E1 stops itself right before it posts its first payout (claimed, reserved, paid by the rail).
    let e1_spec = stack
        .executor_spec("executor-1")?
        .args([
            "--workers",
            "1",
            "--lease-ttl-ms",
            LEASE_MS,
            "--enable-fault-injection",
            "--pause-at",
            "before_post",
        ])
        .no_wait();
    let mut e1 = stack.start_executor(e1_spec).await?;
    let http = stack.http_client();
    let stopped = eventually("executor-1 to stop itself at before_post", LIMIT, || async {
        (process_state(e1.pid()) == Some('T')).then_some(())
    })
    .await;
    stopped?;
    let pause = log_events(&e1.log, "fault_pause")
        .into_iter()
        .next()
        .context("fault_pause event")?;
    let paused_payout: Uuid = serde_json::from_value(pause["payout_id"].clone()).context("payout_id")?;
    verdict.stale_token = pause["fencing_token"].as_i64().context("fencing_token")?;
    let paused = stack.payout(paused_payout).await?;
    let account_id = paused.account_id;
    verdict.stale_payout = Some(paused_payout);
    verdict.stale_amount = paused.amount_minor;
    step(format!(
        "executor-1 is STOPPED (SIGSTOP) holding token {} for payout {paused_payout} ({}, {}): the rail has paid it, \
         executor-1 was about to post it",
        verdict.stale_token,
        paused.amount_minor,
        paused.state.as_str()
    ));

    // E2 works every other payout of the batch, the paused one's account included.
    let others: Vec<String> = payouts
        .iter()
        .filter(|p| p.payout_id != paused_payout)
        .map(|p| p.payout_id.to_string())
        .collect();
    let e2_spec = stack
        .executor_spec("executor-2")?
        .args(["--workers", "2", "--lease-ttl-ms", LEASE_MS])
        .args(["--payout-id".to_owned(), others.join(",")])
        .no_wait();
    let mut e2 = stack.start_executor(e2_spec).await?;
    step(format!(
        "executor-2 started on the batch's other {} payouts: it takes account {account_id} over once executor-1's \
         lease lapses",
        others.len()
    ));
    let mut last = String::new();
    let deadline = Instant::now() + LIMIT;
    loop {
        let p = progress(&http, &stack, payouts.len()).await?;
        if p != last {
            step(&p);
            last = p;
        }
        let e2_done = e2.wait_exit(Duration::from_millis(200)).await.is_some();
        let mut others_posted = true;
        for p in payouts.iter().filter(|p| p.payout_id != paused_payout) {
            others_posted &= stack.payout(p.payout_id).await?.state.as_str() == "POSTED";
        }
        if others_posted || e2_done {
            break;
        }
        if Instant::now() > deadline {
            bail!("the batch did not finish within {}s", LIMIT.as_secs());
        }
    }
    let before = stack.account(account_id).await?;
    verdict.newer_token = Some(before.fence);
    step(format!(
        "account {account_id}: executor-2 posted its other payouts; the last grant that wrote it, its fence, is token {}",
        before.fence
    ));

    step(format!(
        "executor-1 resumes (SIGCONT) and posts payout {paused_payout} with token {}",
        verdict.stale_token
    ));
    e1.resume()?;
    let log = e1.log.clone();
    verdict.stale_outcome = eventually("executor-1's answer for the stale payout", LIMIT, || {
        let log = log.clone();
        async move { stale_outcome(&log, paused_payout) }
    })
    .await?;
    step(format!("executor-1: {}", verdict.stale_outcome));
    // Refused, executor-1 drops the stale grant and finishes the payout with a fresh one in a later
    // pass; batch mode then ends it when it is idle. Otherwise a SIGTERM does.
    if e1.wait_exit(Duration::from_secs(10)).await.is_none() {
        e1.stop();
    }
    e2.stop();
    if stack.payout(paused_payout).await?.state.as_str() != "POSTED" {
        step("executor-3 started to finish the paused payout with a fresh grant");
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
        let mut e3 = stack.start_executor(spec).await?;
        if e3.wait_exit(LIMIT).await.is_none() {
            e3.stop();
        }
    }
    let p = stack.payout(paused_payout).await?;
    verdict.stale_post_landed = p.state.as_str() == "POSTED" && p.claim_token == Some(verdict.stale_token);
    step(format!(
        "payout {paused_payout} is {}, under the claim of token {}",
        p.state.as_str(),
        p.claim_token.map_or("?".into(), |t| t.to_string())
    ));
    verdict.fence_after = Some(stack.account(account_id).await?.fence);

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
    let report = stack.reconciliation().await?;
    verdict.reconciliation_clean = report["clean"] == true;
    verdict.fence_regressed = report["breakCounts"]["FENCE_REGRESSED"].as_u64().unwrap_or(0);
    verdict.regressed = Regressed::from_report(&report);
    grant_probes(&stack, &mut verdict).await?;
    // Summed over the codes.
    verdict.grant_refusals =
        dlock_testkit::metrics::metric_sum(&stack.metrics(&pay).await?, "grant_refused_total", &[]);
    verdict.secs = started.elapsed().as_secs_f64();
    Ok(verdict)
}

/// Claims `payout` at payment-resource with `fence`, as an executor would; `<status> <code>`.
async fn claim_with(stack: &Stack, payout: Uuid, fence: &Fence) -> Result<String> {
    let request = stack
        .http_client()
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

    let session = LockClient::with_config(&stack.lock_url, stack.lock_client_config())?
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
pub(crate) fn stale_outcome(log: &Path, payout: Uuid) -> Option<String> {
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
        let what = match v["event"].as_str().unwrap_or("?") {
            "payout_posted" => format!(
                "payout POSTED with it (balance now {}, the account's fence now {})",
                v["balance_minor"], v["fence"]
            ),
            "rail_submitted" => format!(
                "sent to the rail, which answered {}",
                v["outcome"]
                    .as_str()
                    .unwrap_or("?")
                    .trim_start_matches("Some(")
                    .trim_end_matches(')')
            ),
            other => format!("{other} {}", v["message"].as_str().unwrap_or(""))
                .trim()
                .to_owned(),
        };
        format!("NOT fenced: {what}")
    })
}

pub fn print(verdicts: &[Verdict]) {
    println!();
    print!("{:<44}", "");
    for v in verdicts {
        print!("{:>30}", v.label);
    }
    println!();
    let row = |name: &str, f: &dyn Fn(&Verdict) -> String| {
        print!("{name:<44}");
        for v in verdicts {
            print!("{:>30}", f(v));
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
    row("the stale holder's token", &|v| v.stale_token.to_string());
    row("the newer grant on its account (the fence)", &|v| {
        v.newer_token.map_or("?".into(), |t| t.to_string())
    });
    row("the stale holder's post", &|v| {
        if v.stale_post_landed {
            "LANDED".into()
        } else {
            "refused".into()
        }
    });
    row(
        "the account's fence at the end",
        &|v| match (v.fence_after, v.newer_token) {
            (Some(after), Some(newer)) if after < newer => format!("{after} (went back)"),
            (Some(after), _) => after.to_string(),
            (None, _) => "?".into(),
        },
    );
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
    row("FENCE_REGRESSED breaks", &|v| v.fence_regressed.to_string());
    row("run time", &|v| format!("{:.1} s", v.secs));
    println!();
    for v in verdicts {
        println!("  {}: the stale holder was {}", v.label, v.stale_outcome);
    }
    for v in verdicts {
        println!("  {}", v.what_the_record_shows());
    }
}
