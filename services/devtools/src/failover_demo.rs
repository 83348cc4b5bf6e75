//! The demo's lockdb failover: lockdb as a primary and a streaming standby on loopback, the standby
//! held behind (an asynchronous standby that lags), a holder stopped with a token from the primary,
//! the primary crashed, the standby promoted, and lock-server reaching the new primary through the
//! one address it was given (a link that forwards to the primary, as a Kubernetes Service does).
//! Run twice: with lock-server's sequence jump (the product: every promotion is a restore,
//! docs/design.md) and with the jump switched off (`DLOCK_UNSAFE_NO_SEQUENCE_JUMP=true`, the negative
//! control). The verdict is read back from paydb, rail-proxy's record and the rail, not assumed.
//!
//! The scene, on seeded account 1 (`account:…01`), the resources' fences all on:
//! 1. executor-1 takes the account with token t from the primary, claims and reserves payout P1 and
//!    stops (SIGSTOP) right before sending it to the rail. Its grant is in WAL the standby never got.
//! 2. The primary crashes, the standby is promoted, the link forwards to it.
//! 3. executor-2 takes the account (token b) and pays P2 to the end: claim, reservation, rail, post.
//! 4. executor-1 resumes and sends P1 to the rail with token t.
//! 5. executor-3 takes the account to finish P1.
//!
//! With the jump, b is above every token the old primary handed out: rail-proxy refuses
//! executor-1's P1 (its mark is b > t) and executor-3 takes P1 over and pays it once. Without it, b
//! is not above t: the resources take the stale holder for the newest one, its P1 is paid, and the
//! next holder cannot take P1 over (P1's claim t is above its token), so the rail has paid money the
//! ledger does not show, until lock-server's sequence passes t.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use dlock_chaos::tcp::TcpLink;
use dlock_common::grant::account_key;
use dlock_fastforward::read_sequence;
use dlock_testkit::procs::{Service, Spec};
use dlock_testkit::stack::{Stack, StackOptions, StackTls, log_events, process_state};
use dlock_testkit::wait::eventually;
use dlock_testkit::{History, PgServer};
use dlock_wire::rail::{RailOutcome, SubmissionList};
use payout_executor::model::Payout;
use serde_json::Value;
use sqlx::Connection;
use uuid::Uuid;

use crate::lockapi::Api;
use crate::paydemo::{seeded_account, stale_outcome};
use crate::stack::{Database, lock_server_env, step};

/// lock-server's switch for the negative control.
const NO_JUMP_ENV: &str = "DLOCK_UNSAFE_NO_SEQUENCE_JUMP";
/// Grants on other keys after the standby stopped receiving WAL: the lock traffic the rest of the
/// system makes meanwhile. Well above the 32 values `nextval` logs ahead, so the promoted standby's
/// sequence is behind the tokens the old primary handed out.
const OTHER_GRANTS: usize = 200;
const P1_MINOR: i64 = 1_000;
const P2_MINOR: i64 = 1_250;
const LEASE_MS: u64 = 1_000;
const LIMIT: Duration = Duration::from_secs(60);

/// What one run measured.
#[derive(Debug, Default)]
pub struct Verdict {
    pub label: &'static str,
    /// executor-1's token, from the old primary.
    pub stale_token: i64,
    /// The primary's sequence and the standby's copy of it when the primary crashed.
    pub primary_issued: i64,
    pub standby_sequence: i64,
    /// WAL the standby had not replayed when the primary crashed, in bytes.
    pub standby_behind_bytes: i64,
    /// The account's lock on the promoted standby, as lock-server reads it (`FREE` expected).
    pub lock_after_failover: String,
    /// What `GET /v1/sequence` says of the last jump.
    pub sequence_jump: String,
    /// lock-server's first token on the new primary.
    pub first_token_after: i64,
    /// executor-2's token (P2's claim in paydb), and whether the old primary had handed out the
    /// same token already (to the lock traffic or to executor-1, as lock-server answered them).
    pub new_token: i64,
    pub new_token_reissued: bool,
    /// executor-1's first answer after it resumed, from its log.
    pub stale_outcome: String,
    /// rail-proxy's record of executor-1's submission of P1: refused by (d), or forwarded.
    pub stale_refused: bool,
    pub stale_landed: bool,
    /// The mark rail-proxy had when it refused it.
    pub seen_by_rail: Option<i64>,
    /// executor-3 taking P1 over: its token, and whether a resource refused it.
    pub next_token: Option<i64>,
    pub next_refused: bool,
    pub next_outcome: String,
    /// Of P1 and P2: paid by the rail, paid twice, POSTED.
    pub rail_paid: u64,
    pub rail_paid_twice: usize,
    pub posted: usize,
    /// What the rail paid for the account minus what the ledger debited it.
    pub unbooked_minor: i64,
    pub p1_state: String,
    pub reconciliation_clean: bool,
    pub secs: f64,
}

impl Verdict {
    /// The product's column: after the failover every token is new, the stale submission is refused
    /// by rail-proxy, both payouts are paid once and posted, the books reconcile.
    pub fn clean(&self) -> bool {
        self.new_token > self.stale_token
            && self.stale_refused
            && !self.stale_landed
            && self.rail_paid == 2
            && self.rail_paid_twice == 0
            && self.posted == 2
            && self.unbooked_minor == 0
            && self.reconciliation_clean
    }

    /// The negative control's harm, from the record: a token not above the stale one was handed
    /// out after the failover, the stale holder's write landed, and the rail paid money the ledger
    /// does not show.
    pub fn harmed(&self) -> bool {
        self.new_token <= self.stale_token && self.stale_landed && self.unbooked_minor > 0
    }

    /// One line (wrapped) on what the record shows for this run.
    pub fn what_the_record_shows(&self) -> String {
        let (t, b) = (self.stale_token, self.new_token);
        if self.clean() {
            return format!(
                "{}: CLEAN — after the failover lock-server's tokens start above every token of the old primary \
                 ({b} > {t}):\n    rail-proxy refused executor-1's stale P1 (FENCED: presented {t}, it had seen {}); \
                 executor-3 took P1 over with token {} and paid it once;\n    both payouts paid once and POSTED, \
                 nothing paid that the ledger does not show, reconciliation clean.",
                self.label,
                self.seen_by_rail.map_or("?".into(), |s| s.to_string()),
                self.next_token.map_or("?".into(), |s| s.to_string()),
            );
        }
        if self.harmed() {
            let next = match (self.next_refused, self.next_token) {
                (true, Some(e)) => format!(
                    "; the next holder of the account (executor-3, token {e}) was refused taking P1 over ({}), \
                     so P1 stays {}",
                    self.next_outcome, self.p1_state
                ),
                _ => format!("; P1 is {}", self.p1_state),
            };
            return format!(
                "{}: HARM — after the failover lock-server handed executor-2 token {b}{}, not above executor-1's {t} \
                 from the lost history, so the resources took the stale holder for the newest one:\n    its P1 \
                 LANDED after executor-2 had paid P2, and the rail paid {P1_MINOR} on a grant lockdb no longer \
                 has{next}.\n    The rail has paid {} for the account that its ledger does not show (a balance off \
                 by one payout), until lock-server's sequence passes {t}{}.",
                self.label,
                if self.new_token_reissued {
                    " (a token the old primary had already handed out)"
                } else {
                    ""
                },
                self.unbooked_minor,
                if self.reconciliation_clean {
                    " (paydb's books agree with themselves — P1 reads as in flight — only the rail's record shows the \
                     money gone)"
                } else {
                    ""
                }
            );
        }
        format!(
            "{}: neither clean nor harmed — executor-2's token {b} vs executor-1's {t}; stale P1 {}; the rail paid \
             {} of 2 ({} twice); {} of 2 POSTED; {} paid but not in the ledger; reconciliation {}.",
            self.label,
            if self.stale_landed {
                "LANDED"
            } else if self.stale_refused {
                "refused"
            } else {
                "not seen at rail-proxy"
            },
            self.rail_paid,
            self.rail_paid_twice,
            self.posted,
            self.unbooked_minor,
            if self.reconciliation_clean {
                "clean"
            } else {
                "BREAKS"
            }
        )
    }
}

/// The blocking PostgreSQL steps (initdb, pg_basebackup, pg_ctl) off the async runtime's hands.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// Runs the failover scene once, the sequence jump on or off.
pub async fn run(jump: bool, run_dir: &Path) -> Result<Verdict> {
    let started = Instant::now();
    let mut v = Verdict {
        label: if jump { "jump on" } else { "jump off" },
        ..Verdict::default()
    };
    let mut primary = Database::start(History::Lockdb).await?;
    let standby = blocking(|| PgServer::start_standby(&primary.server, "demo-lockdb-standby", &[]))
        .context("start lockdb's standby")?;
    step(format!(
        "lockdb standby: PostgreSQL 16 on 127.0.0.1:{} (pid {}), a base backup of the primary streaming its WAL, \
         asynchronous",
        standby.port, standby.pid
    ));
    let link = TcpLink::start("lockdb", primary.server.port).await?;
    let lockdb_url = format!(
        "postgres://{}@127.0.0.1:{}/{}",
        History::Lockdb.app_role(),
        link.port,
        History::Lockdb.name()
    );
    step(format!(
        "lockdb's one address: 127.0.0.1:{}, a link that forwards to the primary (as a Kubernetes Service does)",
        link.port
    ));
    let paydb = Database::start(History::Paydb).await?;
    let dir = run_dir.join(if jump {
        "failover-jump-on"
    } else {
        "failover-jump-off"
    });
    let mut opts = StackOptions::new(dir.clone());
    // HTTPS on every API, lock-server's included: one CA for the run, trusted alone.
    let tls = StackTls::new()?;
    opts.tls = Some(tls.clone());
    let spec = Spec::new("lock-server", "lock-server")?.args([
        "--database-url",
        lockdb_url.as_str(),
        "--listen",
        "127.0.0.1:{port}",
    ]);
    let mut spec = lock_server_env(spec, Some(&opts.grant_key));
    if !jump {
        spec = spec.env(NO_JUMP_ENV, "true");
    }
    let lock_server = Service::start(tls.serve_lock_server(spec), &dir).await?;
    opts.lock_server_url = Some(lock_server.url());
    let stack = Stack::start(&lockdb_url, &paydb.app_url(), &opts).await?;
    step(format!(
        "lock-server {} ({}), payment-resource {}, rail-proxy {}, rail-stub {}",
        lock_server.url(),
        if jump {
            "sequence jump on"
        } else {
            "DLOCK_UNSAFE_NO_SEQUENCE_JUMP=true: no jump"
        },
        stack.payment.url(),
        stack.rail_proxy.url(),
        stack.rail_stub.url()
    ));

    let account = seeded_account(1)?;
    let key = account_key(account);
    let currency = stack.account(account).await?.currency;
    let p1 = stack.create_payout(account, P1_MINOR, &currency).await?;
    let p2 = stack.create_payout(account, P2_MINOR, &currency).await?;
    step(format!(
        "two payouts of {key} created PENDING: P1 {} ({P1_MINOR}) and P2 {} ({P2_MINOR})",
        p1.payout_id, p2.payout_id
    ));

    println!("  1. The standby stops receiving WAL; lock traffic goes on; executor-1 stops holding a token.");
    let primary_admin = primary.server.url("postgres", History::Lockdb.name());
    let standby_admin = standby.url("postgres", History::Lockdb.name());
    let lsn = caught_up(&primary_admin, &standby_admin).await?;
    blocking(|| standby.hold_behind()).context("hold the standby behind")?;
    step(format!(
        "the standby has replayed the primary's WAL up to {lsn}; from here on it receives nothing (held behind)"
    ));
    let mut handed_out = other_traffic(&lock_server.url(), tls.ca_file()).await?;
    step(format!(
        "the primary goes on: {OTHER_GRANTS} grants on other keys, tokens {} to {}",
        handed_out.first().copied().unwrap_or_default(),
        handed_out.last().copied().unwrap_or_default()
    ));
    let e1_spec = one_payout(&stack, "executor-1", &p1)?.args([
        "--enable-fault-injection",
        "--pause-at",
        "before_rail_submit",
    ]);
    let mut e1 = stack.start_executor(e1_spec).await?;
    eventually(
        "executor-1 to stop itself at before_rail_submit",
        LIMIT,
        || async { (process_state(e1.pid()) == Some('T')).then_some(()) },
    )
    .await?;
    let pause = log_events(&e1.log, "fault_pause")
        .into_iter()
        .next()
        .context("executor-1's fault_pause event")?;
    let stopped_at = Instant::now();
    v.stale_token = pause["fencing_token"].as_i64().context("fencing_token")?;
    handed_out.push(v.stale_token);
    step(format!(
        "executor-1 takes {key} with token {}, claims and reserves P1, and is STOPPED (SIGSTOP) right before \
         sending it to the rail",
        v.stale_token
    ));
    v.primary_issued = read_sequence(&primary_admin).await?;
    v.standby_sequence = read_sequence(&standby_admin).await?;
    v.standby_behind_bytes = wal_behind(&primary_admin, &standby_admin).await?;
    step(format!(
        "the primary has handed out tokens up to {}; the standby is {} bytes of WAL behind, its copy of the \
         sequence at {}",
        v.primary_issued, v.standby_behind_bytes, v.standby_sequence
    ));

    println!("  2. The primary crashes; the standby is promoted; lockdb's address now leads to it.");
    primary.server.crash();
    step("the primary is gone (immediate shutdown: SIGQUIT to its postmaster)");
    blocking(|| standby.promote()).context("promote the standby")?;
    link.repoint(standby.port);
    step(format!(
        "the standby is promoted (pg_ctl promote) and the link forwards to it (127.0.0.1:{}); every connection \
         to the old primary is cut",
        standby.port
    ));
    let api = Api::new(lock_server.url(), Some(tls.ca_file()))?;
    v.first_token_after = first_grant(&api).await?;
    v.lock_after_failover = api.read(&key).await?["state"].as_str().unwrap_or("?").to_owned();
    v.sequence_jump = sequence_jump(&stack.http_client(), &lock_server.url()).await;
    step(format!(
        "lock-server reconnected: {key} reads {} (executor-1's grant was in the WAL the standby never got); its \
         first grant on the new primary: token {}",
        v.lock_after_failover, v.first_token_after
    ));
    step(&v.sequence_jump);

    println!("  3. executor-2 takes {key} and pays P2.");
    let e2_spec = one_payout(&stack, "executor-2", &p2)?;
    let mut e2 = stack.start_executor(e2_spec).await?;
    if e2.wait_exit(LIMIT).await.is_none() {
        e2.stop();
    }
    let p2_now = stack.payout(p2.payout_id).await?;
    v.new_token = p2_now.claim_token.context("P2 was never claimed")?;
    v.new_token_reissued = handed_out.contains(&v.new_token);
    step(format!(
        "executor-2 held {key} with token {} ({} executor-1's {}{}): P2 is {}",
        v.new_token,
        if v.new_token > v.stale_token {
            "above"
        } else {
            "NOT above"
        },
        v.stale_token,
        if v.new_token_reissued {
            "; the old primary had handed out the same token before the failover"
        } else {
            ""
        },
        p2_now.state.as_str()
    ));

    // A holder paused past its lease: by its own clock too, so the one write it had decided is all
    // it sends (its next check finds the lease over).
    let lease = Duration::from_millis(LEASE_MS);
    if let Some(rest) = (lease * 3).checked_sub(stopped_at.elapsed()) {
        tokio::time::sleep(rest).await;
    }
    println!(
        "  4. executor-1, stopped for {:.1} s (its lease: {LEASE_MS} ms), resumes (SIGCONT) and sends P1 to the rail \
         with token {}.",
        stopped_at.elapsed().as_secs_f64(),
        v.stale_token
    );
    e1.resume()?;
    let log = e1.log.clone();
    let p1_uuid = p1.payout_id;
    v.stale_outcome = eventually("executor-1's answer for P1", LIMIT, || {
        let log = log.clone();
        async move { stale_outcome(&log, p1_uuid) }
    })
    .await?;
    // It only had the one write it decided before it stopped: nothing more is asked of it.
    e1.stop();
    step(format!("executor-1: {}", v.stale_outcome));
    let submissions: SubmissionList = serde_json::from_value(stack.rail_submissions(p1.payout_id).await?)
        .context("rail-proxy's record of P1")?;
    for s in submissions
        .submissions
        .iter()
        .filter(|s| s.presented_token == v.stale_token)
    {
        if s.outcome == Some(RailOutcome::Fenced) {
            v.stale_refused = true;
        } else {
            v.stale_landed = true;
        }
    }
    v.seen_by_rail = rail_mark(&e1.log, p1_uuid);
    step(format!(
        "rail-proxy's record of P1 by token {}: {}",
        v.stale_token,
        describe_submissions(&submissions, v.stale_token)
    ));

    println!("  5. executor-3 takes {key} to finish P1.");
    let e3_spec = one_payout(&stack, "executor-3", &p1)?;
    let mut e3 = stack.start_executor(e3_spec).await?;
    let log = e3.log.clone();
    let ended = eventually("executor-3 to post P1 or be refused", LIMIT, || {
        let log = log.clone();
        let stack = &stack;
        async move { takeover(stack, &log, p1_uuid).await }
    })
    .await?;
    // Refused, it would try again with a fresh grant in its next pass: one answer is the record.
    e3.stop();
    match ended {
        Takeover::Posted(token) => {
            v.next_token = token;
            v.next_outcome = "adopted P1 and posted it".into();
        }
        Takeover::Refused { token, outcome } => {
            v.next_token = token;
            v.next_refused = true;
            v.next_outcome = outcome;
        }
    }
    step(format!(
        "executor-3 with token {}: {}",
        v.next_token.map_or("?".into(), |t| t.to_string()),
        v.next_outcome
    ));

    // The ground truth: the rail, paydb's payouts, the account against both, reconciliation.
    let received = stack.rail_received().await?;
    let mut paid_minor = 0;
    for p in [&p1, &p2] {
        let paid = received.paid(p.payout_id);
        v.rail_paid += paid;
        v.rail_paid_twice += usize::from(paid > 1);
        paid_minor += p.amount_minor * i64::try_from(paid).unwrap_or(i64::MAX);
        v.posted += usize::from(stack.payout(p.payout_id).await?.state.as_str() == "POSTED");
    }
    v.p1_state = stack.payout(p1.payout_id).await?.state.as_str().to_owned();
    let now = stack.account(account).await?;
    v.unbooked_minor = paid_minor - (now.opening_balance_minor - now.balance_minor);
    v.reconciliation_clean = stack.reconciliation().await?["clean"] == true;
    step(format!(
        "the rail paid {} of the two payouts ({paid_minor}); {} POSTED; the account's balance {} of {} opening: {} \
         paid that the ledger does not show",
        v.rail_paid, v.posted, now.balance_minor, now.opening_balance_minor, v.unbooked_minor
    ));
    v.secs = started.elapsed().as_secs_f64();
    drop(stack);
    drop(lock_server);
    drop(link);
    drop(standby);
    drop(primary);
    drop(paydb);
    Ok(v)
}

/// How executor-3's attempt on P1 ended.
enum Takeover {
    Posted(Option<i64>),
    Refused { token: Option<i64>, outcome: String },
}

async fn takeover(stack: &Stack, log: &Path, payout: Uuid) -> Option<Takeover> {
    let id = payout.to_string();
    if let Some(e) = log_events(log, "fenced_out")
        .into_iter()
        .find(|e| e["payout_id"].as_str() == Some(id.as_str()))
    {
        return Some(Takeover::Refused {
            token: e["presented"].as_i64(),
            outcome: format!(
                "FENCED OUT by {} (P1's claim is token {})",
                e["resource"].as_str().unwrap_or("?"),
                e["stored"]
            ),
        });
    }
    let p: Payout = stack.payout(payout).await.ok()?;
    (p.state.as_str() == "POSTED").then_some(Takeover::Posted(p.claim_token))
}

/// The mark rail-proxy refused the stale submission with, from executor-1's `fenced_out` event.
fn rail_mark(log: &Path, payout: Uuid) -> Option<i64> {
    let id = payout.to_string();
    log_events(log, "fenced_out")
        .into_iter()
        .find(|e| e["payout_id"].as_str() == Some(id.as_str()) && e["resource"] == "rail")
        .and_then(|e| e["stored"].as_i64())
}

fn describe_submissions(list: &SubmissionList, token: i64) -> String {
    let mine: Vec<String> = list
        .submissions
        .iter()
        .filter(|s| s.presented_token == token)
        .map(|s| match s.outcome {
            Some(RailOutcome::Fenced) => {
                "FENCED (refused by the high-water mark, never forwarded)".to_owned()
            }
            Some(o) => format!("forwarded, the rail answered {}", o.as_str()),
            None => "forwarded, no answer recorded".to_owned(),
        })
        .collect();
    if mine.is_empty() {
        "none".into()
    } else {
        mine.join("; ")
    }
}

/// Waits until the standby has replayed everything the primary has written so far; returns that LSN.
async fn caught_up(primary: &str, standby: &str) -> Result<String> {
    let mut p = sqlx::PgConnection::connect(primary).await?;
    let lsn: String = sqlx::query_scalar("SELECT pg_current_wal_lsn()::text")
        .fetch_one(&mut p)
        .await?;
    let _ = p.close().await;
    let mut s = sqlx::PgConnection::connect(standby).await?;
    let deadline = Instant::now() + LIMIT;
    loop {
        let done: bool = sqlx::query_scalar("SELECT COALESCE(pg_last_wal_replay_lsn() >= $1::pg_lsn, false)")
            .bind(&lsn)
            .fetch_one(&mut s)
            .await?;
        if done {
            let _ = s.close().await;
            return Ok(lsn);
        }
        if Instant::now() > deadline {
            bail!(
                "the standby did not replay the primary's WAL up to {lsn} within {}s",
                LIMIT.as_secs()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Bytes of WAL the primary has written beyond what the standby has replayed.
async fn wal_behind(primary: &str, standby: &str) -> Result<i64> {
    let mut s = sqlx::PgConnection::connect(standby).await?;
    let replayed: Option<String> = sqlx::query_scalar("SELECT pg_last_wal_replay_lsn()::text")
        .fetch_one(&mut s)
        .await?;
    let _ = s.close().await;
    let replayed = replayed.context("the standby reports no replayed WAL")?;
    let mut p = sqlx::PgConnection::connect(primary).await?;
    let behind: i64 = sqlx::query_scalar("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::bigint")
        .bind(&replayed)
        .fetch_one(&mut p)
        .await?;
    let _ = p.close().await;
    Ok(behind)
}

/// Grants and releases on keys no payout uses, one after the other; returns their tokens in order.
async fn other_traffic(lock_url: &str, ca: &Path) -> Result<Vec<i64>> {
    let api = Api::new(lock_url.to_owned(), Some(ca))?;
    let owner = "other-traffic";
    let session = api.session(owner).await?;
    let mut tokens = Vec::with_capacity(OTHER_GRANTS);
    for i in 0..OTHER_GRANTS {
        let key = format!("other:{}", i % 8);
        let (status, body) = api.acquire(&key, &session, owner, 10_000).await?;
        let Some(token) = body["fencingToken"].as_i64() else {
            bail!("acquire {key}: {status} {body}");
        };
        tokens.push(token);
        let (status, body) = api.release(&key, token).await?;
        if body["released"] != true {
            bail!("release {key}: {status} {body}");
        }
    }
    Ok(tokens)
}

/// The first grant lock-server makes once it reaches the new primary (its pool reconnects through
/// the link); retried until then. Returns its token.
async fn first_grant(api: &Api) -> Result<i64> {
    let key = "failover:probe";
    eventually("lock-server to grant on the new primary", LIMIT, || async {
        let session = api.session("failover-probe").await.ok()?;
        let (_, body) = api.acquire(key, &session, "failover-probe", 10_000).await.ok()?;
        let token = body["fencingToken"].as_i64()?;
        api.release(key, token).await.ok()?;
        Some(token)
    })
    .await
}

/// What lock-server says of its last sequence jump (`GET /v1/sequence`).
async fn sequence_jump(http: &reqwest::Client, lock_url: &str) -> String {
    let view: Option<Value> = async {
        http.get(format!("{lock_url}/v1/sequence"))
            .send()
            .await
            .ok()?
            .error_for_status()
            .ok()?
            .json()
            .await
            .ok()
    }
    .await;
    let Some(view) = view else {
        return "lock-server does not say whether it jumped the sequence (GET /v1/sequence unavailable)"
            .into();
    };
    if view["jumpsEnabled"] == false {
        return "the jump is switched off: the sequence goes on from where the promoted standby had it"
            .into();
    }
    let j = &view["lastJump"];
    if j.is_null() {
        return "lock-server reports no jump of the sequence".into();
    }
    format!(
        "lock-server found a history it could not vouch for ({}, timeline {}) and jumped the sequence before \
         granting: nextval found {}, set to {}",
        j["cause"].as_str().unwrap_or("?"),
        j["timeline"],
        j["found"],
        j["jumpedTo"]
    )
}

/// The two runs side by side, then what the record shows for each.
pub fn print(verdicts: &[Verdict]) {
    println!();
    print!("{:<48}", "");
    for v in verdicts {
        print!("{:>30}", v.label);
    }
    println!();
    let row = |name: &str, f: &dyn Fn(&Verdict) -> String| {
        print!("{name:<48}");
        for v in verdicts {
            print!("{:>30}", f(v));
        }
        println!();
    };
    row("WAL the standby lacked at the crash (bytes)", &|v| {
        v.standby_behind_bytes.to_string()
    });
    row("primary's sequence at the crash", &|v| {
        v.primary_issued.to_string()
    });
    row("the standby's copy of it", &|v| v.standby_sequence.to_string());
    row("executor-1's token (old primary)", &|v| v.stale_token.to_string());
    row("first token after the failover", &|v| {
        v.first_token_after.to_string()
    });
    row("executor-2's token (new primary)", &|v| v.new_token.to_string());
    row("executor-2's token above executor-1's", &|v| {
        either(v.new_token > v.stale_token, "yes", "NO")
    });
    row("... and handed out before the failover too", &|v| {
        either(v.new_token_reissued, "YES", "no")
    });
    row("executor-1's stale P1 at rail-proxy", &|v| {
        if v.stale_landed {
            "LANDED".into()
        } else if v.stale_refused {
            "FENCED".into()
        } else {
            "?".into()
        }
    });
    row("executor-3 taking P1 over", &|v| {
        either(v.next_refused, "refused", "posted it")
    });
    row("payouts the rail paid (of 2)", &|v| v.rail_paid.to_string());
    row("payouts the rail paid twice", &|v| v.rail_paid_twice.to_string());
    row("payouts POSTED (of 2)", &|v| v.posted.to_string());
    row("paid by the rail, not in the ledger (minor)", &|v| {
        v.unbooked_minor.to_string()
    });
    row("reconciliation", &|v| {
        either(v.reconciliation_clean, "clean", "BREAKS")
    });
    row("run time", &|v| format!("{:.1} s", v.secs));
    println!();
    for v in verdicts {
        println!("  {}", v.what_the_record_shows());
    }
}

/// A table cell that says which of two things is so.
fn either(so: bool, yes: &str, no: &str) -> String {
    if so { yes } else { no }.to_owned()
}

/// An executor that works on `payout` alone, with one worker and the scene's lease.
fn one_payout(stack: &Stack, name: &str, payout: &Payout) -> Result<Spec> {
    Ok(stack.executor_spec(name)?.args([
        "--payout-id".to_owned(),
        payout.payout_id.to_string(),
        "--workers".to_owned(),
        "1".to_owned(),
        "--lease-ttl-ms".to_owned(),
        LEASE_MS.to_string(),
    ]))
}
