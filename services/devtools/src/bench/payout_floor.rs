//! The floor under `bench payouts`: the least CPU one payout can cost, from parts measured in the
//! same run. PostgreSQL's part is pgbench running exactly the statements one payout needs — taken
//! from the services' own statement constants, so the scripts cannot drift from what runs — against
//! a lockdb and a paydb started as the bench's rows start theirs; the HTTP part is the bench hop
//! ([`super::hop`], measured as `bench lock` measures it) times the requests one payout needs.
//!
//! One payout needs, on the happy path:
//! - lockdb: C1's acquire and release, each as a lone call sends it (a batch of one is the
//!   statement as it is);
//! - paydb, payment-resource: the claim; the reservation transaction (the payout row locked, (r),
//!   CLAIMED → RAIL_SUBMITTED); RAIL_SUBMITTED → RAIL_ACKED; the posting transaction (the payout row
//!   locked, the settlement account, the hold given back, (a), (b) twice, (c), the posted row);
//! - paydb, rail-proxy: the payout read, (d) in its own transaction, the attempt, its outcome;
//! - HTTP: lock-server 2 (acquire, release), payment-resource 4 (claim, reserve, ack, post),
//!   rail-proxy 1 (the submission), the rail 1 (rail-proxy's forward).
//!
//! pgbench is run with `-M prepared`, as sqlx sends statements. Each transaction first runs one
//! helper `SELECT … \gset` for the payout's ids (no table read); a second pgbench run of the helper
//! alone measures it, and it is subtracted. Signatures and TLS are left out: the floor only gets
//! lower for what it leaves out, so it still bounds every row from below.

use std::cell::RefCell;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use dlock_client::ClientConfig;
use dlock_testkit::History;
use dlock_testkit::cpu;
use dlock_testkit::pg::tool_path;
use dlock_testkit::procs::{Service, Spec};

use super::floors::HOP_ROW;
use super::meter::Meter;
use super::per_payout::STATEMENT_SETTINGS;
use super::phases::{Mode, http_phase};
use crate::stack::{Database, RunDir, step};

/// The HTTP requests one payout needs, by the process that answers them, and who sends them.
pub(super) const REQUESTS: [(&str, u32, &str); 4] = [
    ("lock-server", 2, "executors"),
    ("payment-resource", 4, "executors"),
    ("rail-proxy", 1, "executors"),
    ("rail-stub", 1, "rail-proxy"),
];

/// What the floor's parts measured, each in CPU-seconds per payout.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Floor {
    pub lockdb: f64,
    pub paydb: f64,
    /// One HTTP request: its client's part and its server's.
    pub request_client: f64,
    pub request_server: f64,
    /// Payouts pgbench ran.
    pub payouts: u32,
}

impl Floor {
    /// The floor of one process of a payout run (its roles as the cost table names them).
    pub(super) fn of(&self, role: &str) -> f64 {
        match role {
            "lockdb" => self.lockdb,
            "paydb" => self.paydb,
            _ => REQUESTS
                .iter()
                .map(|(server, n, client)| {
                    let n = f64::from(*n);
                    let mut secs = 0.0;
                    if *server == role {
                        secs += n * self.request_server;
                    }
                    if *client == role {
                        secs += n * self.request_client;
                    }
                    secs
                })
                .sum(),
        }
    }

    pub(super) fn total(&self, roles: &[&str]) -> f64 {
        roles.iter().map(|r| self.of(r)).sum()
    }
}

/// `stmt` as a pgbench command: each placeholder `$j` becomes the variable `:vars[j-1]` (pgbench
/// sends it as a bind parameter in `-M prepared`), and `end` closes it (`;` or a `\gset`). Fails if
/// `stmt` has a placeholder `vars` does not name, or `vars` names one `stmt` does not use.
pub(super) fn command(stmt: &str, vars: &[&str], end: &str) -> Result<String> {
    let used = RefCell::new(vec![false; vars.len()]);
    let text = lock_server::sql::placeholders(stmt, |j| {
        let var = vars.get(j.checked_sub(1)?)?;
        used.borrow_mut()[j - 1] = true;
        Some(format!(":{var}"))
    })
    .with_context(|| format!("a placeholder has no variable in {stmt:?}"))?;
    if let Some(i) = used.borrow().iter().position(|u| !u) {
        bail!("variable {} names no placeholder of {stmt:?}", vars[i]);
    }
    Ok(format!("{}{end}\n", text.trim()))
}

/// The per-transaction helper of paydb's script: this client's next payout (made by [`PAYDB_SETUP`]),
/// its account and idempotency key, a token above every earlier one on the account, fresh ids.
const PAYDB_HELPER: &str = "SELECT md5('floor-payout-' || (:client_id)::text || '-' || s.i)::uuid AS pid,
       md5('floor-account-' || (:client_id)::text)::uuid AS acct,
       'floor-' || (:client_id)::text || '-' || s.i AS ikey,
       1000000000000 + s.i AS token,
       gen_random_uuid() AS debit_entry, gen_random_uuid() AS credit_entry,
       gen_random_uuid() AS submission
  FROM (SELECT nextval(('dlock_floor_' || (:client_id)::text)::regclass) AS i) s
\\gset
";

/// paydb's setup (as the superuser, before anything is measured): per client an account funded for
/// every payout, its payouts PENDING, and its sequence. `{clients}`, `{each}`.
const PAYDB_SETUP: &str = "
INSERT INTO account (account_id, currency, balance_minor, opening_balance_minor, kind)
SELECT md5('floor-account-' || k)::uuid, 'EUR', 1000000000000, 1000000000000, 'CUSTOMER'
  FROM generate_series(0, {clients} - 1) k;
INSERT INTO payout (payout_id, account_id, amount_minor, currency, idempotency_key)
SELECT md5('floor-payout-' || k || '-' || i)::uuid, md5('floor-account-' || k)::uuid, 100, 'EUR',
       'floor-' || k || '-' || i
  FROM generate_series(0, {clients} - 1) k, generate_series(1, {each}) i;
DO $$ BEGIN
  FOR k IN 0..{clients} - 1 LOOP
    EXECUTE format('CREATE SEQUENCE dlock_floor_%s; GRANT USAGE ON SEQUENCE dlock_floor_%s TO payapp', k, k);
  END LOOP;
END $$;
ANALYZE;";

/// lockdb's helper: a key of its own for every grant.
const LOCKDB_HELPER: &str = "SELECT 'floor:' || nextval('dlock_floor') AS key\n\\gset\n";

const LOCKDB_SETUP: &str = "CREATE SEQUENCE dlock_floor; GRANT USAGE ON SEQUENCE dlock_floor TO lockapp;";

/// paydb's script: one payout, the statements in the order the services run them.
pub(super) fn paydb_script() -> Result<String> {
    use payment_resource::sql as pr;
    use rail_proxy::sql as rp;
    let c1 = pr::Statements::FENCED;
    let mut s = String::from(PAYDB_HELPER);
    // payment-resource: the claim.
    s += &command(
        pr::PAYOUT_CLAIM_FOR_ACCOUNT,
        &["pid", "owner", "token", "acct"],
        ";",
    )?;
    // The reservation.
    s += "BEGIN;\n";
    s += &command(pr::PAYOUT_FOR_UPDATE, &["pid"], ";")?;
    s += &command(c1.account_reserve, &["acct", "currency", "amount", "token"], ";")?;
    s += &command(pr::PAYOUT_MARK_RESERVED, &["pid", "token"], ";")?;
    s += "COMMIT;\n";
    // rail-proxy: the submission.
    s += &command(rp::SELECT_PAYOUT, &["pid"], ";")?;
    s += "BEGIN;\n";
    s += &command(rp::HIGH_WATER, &["acct", "token"], ";")?;
    s += "COMMIT;\n";
    s += &command(rp::INSERT_ATTEMPT, &["submission", "pid", "ikey", "token"], ";")?;
    s += &command(
        rp::RECORD_FORWARD_OUTCOME,
        &["submission", "outcome", "reference"],
        ";",
    )?;
    // payment-resource: the rail's ack, then the posting.
    s += &command(
        pr::PAYOUT_TRANSITION_FOR_ACCOUNT,
        &["pid", "submitted", "acked", "token", "acct"],
        ";",
    )?;
    s += "BEGIN;\n";
    s += &command(pr::PAYOUT_FOR_UPDATE, &["pid"], ";")?;
    s += &command(pr::SETTLEMENT_ACCOUNT_ID, &["currency"], "\n\\gset settlement_")?;
    s += &command(pr::ACCOUNT_RELEASE, &["acct", "amount"], ";")?;
    s += &command(pr::PAYOUT_CLEAR_RESERVATION, &["pid"], ";")?;
    s += &command(c1.account_debit, &["acct", "currency", "amount", "token"], ";")?;
    let leg = [
        "entry",
        "pid",
        "leg_account",
        "direction",
        "amount",
        "token",
        "acct",
    ];
    let debit = leg.map(|v| match v {
        "entry" => "debit_entry",
        "leg_account" => "acct",
        "direction" => "debit",
        v => v,
    });
    let credit = leg.map(|v| match v {
        "entry" => "credit_entry",
        "leg_account" => "settlement_account_id",
        "direction" => "credit",
        v => v,
    });
    s += &command(c1.ledger_leg, &debit, ";")?;
    s += &command(c1.ledger_leg, &credit, ";")?;
    s += &command(c1.payout_post, &["pid", "token"], ";")?;
    s += &command(pr::PAYOUT_BY_ID, &["pid"], ";")?;
    s += "COMMIT;\n";
    Ok(s)
}

/// The constants paydb's script binds (`pgbench -D`).
const PAYDB_VARS: [(&str, &str); 9] = [
    ("owner", "floor-executor"),
    ("currency", "EUR"),
    ("amount", "100"),
    ("submitted", "RAIL_SUBMITTED"),
    ("acked", "RAIL_ACKED"),
    ("outcome", "ACKED"),
    ("reference", "floor"),
    ("debit", "DEBIT"),
    ("credit", "CREDIT"),
];

/// lockdb's script: one grant, acquired and released.
pub(super) fn lockdb_script() -> Result<String> {
    use lock_server::sql;
    let mut s = String::from(LOCKDB_HELPER);
    s += &command(sql::ACQUIRE, &["key", "owner", "session", "ttl"], "\n\\gset")?;
    s += &command(sql::RELEASE, &["key", "fencing_token"], ";")?;
    Ok(s)
}

/// Runs `script` with pgbench against `url`: `clients` connections, `each` transactions apiece,
/// and returns the server's CPU-seconds over the run (its backends included, exited or not).
fn pgbench(
    db: &Database,
    url: &str,
    script: &Path,
    clients: u32,
    each: u32,
    vars: &[(&str, String)],
) -> Result<f64> {
    let mut cmd = Command::new(tool_path("pgbench"));
    cmd.args(["-n", "-M", "prepared", "-j", "2"])
        .args(["-c", &clients.to_string(), "-t", &each.to_string()]);
    for (k, v) in vars {
        cmd.arg("-D").arg(format!("{k}={v}"));
    }
    cmd.arg("-f").arg(script).arg(url);
    let before = cpu::tree_secs(db.server.pid);
    let out = cmd.output().context("run pgbench")?;
    let after = cpu::tree_secs(db.server.pid);
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "pgbench {} failed: {}\n{}",
            script.display(),
            stdout,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(after - before)
}

/// Measures the floor: `clients` pgbench connections (as many as the bench's workers), `each`
/// payouts apiece, on a lockdb and a paydb of their own started as the rows' are; then the hop
/// with `clients` HTTP clients for `hop_secs`.
pub(super) async fn measure(clients: u32, each: u32, hop_secs: u64, run_dir: &RunDir) -> Result<Floor> {
    let dir = run_dir.path().join("floor");
    std::fs::create_dir_all(&dir)?;
    let payouts = clients * each;
    step(format!(
        "the floor: pgbench, {payouts} payouts' statements ({clients} connections), on a lockdb and a paydb of its own"
    ));
    let lockdb = Database::start_with(History::Lockdb, STATEMENT_SETTINGS).await?;
    let paydb = Database::start_with(History::Paydb, STATEMENT_SETTINGS).await?;
    lockdb.server.sql(History::Lockdb.name(), LOCKDB_SETUP)?;
    let session = lockdb.server.sql(
        History::Lockdb.name(),
        // A SELECT around the INSERT: psql prints no command tag for it.
        "WITH s AS (INSERT INTO lock_session (session_id, owner_id, created_at, expires_at)
                    VALUES (gen_random_uuid(), 'floor', now(), now() + interval '1 day')
                    RETURNING session_id)
         SELECT session_id FROM s",
    )?;
    paydb.server.sql(
        History::Paydb.name(),
        &PAYDB_SETUP
            .replace("{clients}", &clients.to_string())
            .replace("{each}", &each.to_string()),
    )?;
    let write = |name: &str, text: &str| -> Result<std::path::PathBuf> {
        let path = dir.join(name);
        std::fs::write(&path, text)?;
        Ok(path)
    };
    let pay_script = write("paydb-payout.sql", &paydb_script()?)?;
    let pay_helper = write("paydb-helper.sql", PAYDB_HELPER)?;
    let lock_script = write("lockdb-grant.sql", &lockdb_script()?)?;
    let lock_helper = write("lockdb-helper.sql", LOCKDB_HELPER)?;
    let pay_vars: Vec<(&str, String)> = PAYDB_VARS.iter().map(|(k, v)| (*k, (*v).to_owned())).collect();
    let lock_vars = vec![
        ("owner", "floor".to_owned()),
        ("session", session.clone()),
        ("ttl", "30".to_owned()),
    ];
    let (pay_url, lock_url) = (paydb.app_url(), lockdb.app_url());
    let pay = pgbench(&paydb, &pay_url, &pay_script, clients, each, &pay_vars)?;
    let pay_helper = pgbench(&paydb, &pay_url, &pay_helper, clients, each, &pay_vars)?;
    let lock = pgbench(&lockdb, &lock_url, &lock_script, clients, each, &lock_vars)?;
    let lock_helper = pgbench(&lockdb, &lock_url, &lock_helper, clients, each, &lock_vars)?;
    // Every transaction was a whole payout: posted, with its two legs and its acked attempt; and
    // every grant was released by the token its acquire returned.
    let done = paydb.server.sql(
        History::Paydb.name(),
        "SELECT (SELECT count(*) FROM payout WHERE idempotency_key LIKE 'floor-%' AND state = 'POSTED')
              || ' ' || (SELECT count(*) FROM ledger_entry l JOIN payout p USING (payout_id)
                          WHERE p.idempotency_key LIKE 'floor-%')
              || ' ' || (SELECT count(*) FROM rail_submission WHERE idempotency_key LIKE 'floor-%'
                          AND outcome = 'ACKED')",
    )?;
    let want = format!("{payouts} {} {payouts}", 2 * payouts);
    if done != want {
        bail!(
            "the floor's paydb script did not make whole payouts: posted, legs, acked = {done} (want {want})"
        );
    }
    let left = lockdb.server.sql(
        History::Lockdb.name(),
        "SELECT count(*) FROM lock_entry WHERE lock_key LIKE 'floor:%'",
    )?;
    if left != "0" {
        bail!("the floor's lockdb script left {left} grants unreleased");
    }
    drop((lockdb, paydb));

    let hop = Service::start(
        Spec::new("hop-server", "dlock-dev")?.args(["bench", "hop-server", "--listen", "127.0.0.1:{port}"]),
        &dir,
    )
    .await?;
    let phase = http_phase(
        HOP_ROW,
        &hop.url(),
        &ClientConfig::default(),
        clients,
        Mode::Distinct,
        Duration::from_secs(hop_secs),
        Meter::here(Some(&hop)),
    )
    .await?;
    // A hop cycle is two requests (acquire, release).
    let per_request = |role| phase.cpu_per_cycle(Some(role)).map(|s| s / 2.0);
    let (Some(request_client), Some(request_server)) = (per_request("generator"), per_request("lock-server"))
    else {
        bail!("the hop's row measured no CPU");
    };
    let n = f64::from(payouts);
    Ok(Floor {
        lockdb: (lock - lock_helper) / n,
        paydb: (pay - pay_helper) / n,
        request_client,
        request_server,
        payouts,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::payouts::COST_ROLES;

    #[test]
    fn a_command_names_each_placeholder_by_its_variable() {
        let ten = ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"];
        let unused = command("SELECT $2 FROM t WHERE a = $1 AND b = $10", &ten, ";").unwrap_err();
        assert!(unused.to_string().contains("variable c names no placeholder"));
        assert_eq!(
            command("UPDATE t SET x = $2 WHERE id = $1 RETURNING x", &["id", "x"], ";").unwrap(),
            "UPDATE t SET x = :x WHERE id = :id RETURNING x;\n"
        );
        assert!(command("SELECT $3", &["a"], ";").is_err());
        assert!(command("SELECT $1", &["a", "b"], ";").is_err());
    }

    /// The scripts are the services' statements, each bound: every placeholder named, the
    /// contract's fenced forms (not the kill switch's), and the transactions closed.
    #[test]
    fn the_scripts_hold_the_services_statements() {
        let pay = paydb_script().unwrap();
        assert!(!pay.contains('$'));
        assert_eq!(pay.matches("BEGIN;").count(), 3);
        assert_eq!(pay.matches("COMMIT;").count(), 3);
        assert!(pay.contains("AND fence         < :token"));
        assert!(pay.contains("AND a.fence     <= :token"));
        assert!(pay.contains("claim_token <= :token"));
        assert!(pay.contains("WHERE rail_high_water.highest_token < EXCLUDED.highest_token"));
        let lock = lockdb_script().unwrap();
        assert!(lock.contains("nextval('fencing_token_seq')"));
        assert!(lock.contains("AND fencing_token = :fencing_token"));
    }

    /// Each process's floor: the stores their own part, the services their requests, served and sent.
    #[test]
    fn each_process_has_its_share_of_the_floor() {
        let f = Floor {
            lockdb: 0.2,
            paydb: 1.0,
            request_client: 0.01,
            request_server: 0.02,
            payouts: 1,
        };
        let close = |a: f64, b: f64| (a - b).abs() < 1e-12;
        assert!(close(f.of("executors"), 7.0 * 0.01));
        assert!(close(f.of("payment-resource"), 4.0 * 0.02));
        assert!(close(f.of("rail-proxy"), 0.02 + 0.01));
        assert!(close(f.of("rail-stub"), 0.02));
        assert!(close(f.of("lock-server"), 2.0 * 0.02));
        assert!(close(f.of("bench"), 0.0));
        assert!(close(f.total(&COST_ROLES), 1.2 + 8.0 * 0.03));
    }
}
