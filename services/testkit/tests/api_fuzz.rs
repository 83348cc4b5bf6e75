//! A bounded property-based run (schemathesis, every check on, every phase: the explicit examples,
//! the coverage phase's boundary values, fuzzing and stateful links) from each service's served
//! OpenAPI document against the real service: lock-server on lockdb, payment-resource and rail-proxy on
//! paydb, rail-proxy forwarding to the real rail-stub. Zero failures, zero 5xx; and a run of only
//! schema-invalid requests leaves every table and sequence of both databases as it was. lock-server
//! signs grants with a key made for the run and the resources verify them (the default), so the
//! fenced routes get random grants (`X-Fencing-Grant` is in their documents): every one refused with
//! a 403, nothing written.
//!
//! schemathesis is installed by scripts/setup.sh into `$DLOCK_TOOLS_DIR/schemathesis-<version>`.
//! Without it the test says so and passes, unless `DLOCK_REQUIRE_SCHEMATHESIS=1` (scripts/test.sh
//! sets it, so the test command never skips it). `DLOCK_FUZZ_ONLY=<service>` runs one service.

use std::path::{Path, PathBuf};
use std::process::Command;

use dlock_common::grant::{PUBLIC_KEYS_ENV, SIGNING_KEY_ENV};
use dlock_grant::{KeyId, SigningKey};
use dlock_testkit::procs::{Service, Spec};
use dlock_testkit::{TestDb, lockdb, paydb};

/// Pinned in scripts/setup.sh too.
const SCHEMATHESIS_VERSION: &str = "4.32.5";
/// Fixed so that a run is reproducible: the same requests every time.
const SEED: &str = "20261201";
const MAX_EXAMPLES: &str = "30";

fn schemathesis() -> Option<PathBuf> {
    let st = dlock_testkit::pg::tools_dir()
        .join(format!("schemathesis-{SCHEMATHESIS_VERSION}"))
        .join("bin/st");
    if st.is_file() {
        return Some(st);
    }
    assert!(
        std::env::var_os("DLOCK_REQUIRE_SCHEMATHESIS").is_none_or(|v| v != "1"),
        "DLOCK_REQUIRE_SCHEMATHESIS=1 but {} is missing: run scripts/setup.sh",
        st.display()
    );
    eprintln!(
        "skipped: {} is missing (scripts/setup.sh installs it)",
        st.display()
    );
    None
}

fn wanted(service: &str) -> bool {
    std::env::var("DLOCK_FUZZ_ONLY").map_or(true, |only| only == service)
}

struct Run<'a> {
    st: &'a Path,
    service: &'a str,
    url: String,
    token: Option<&'a str>,
    /// `--include-…` filters: the operations this credential may call (and the open ones).
    filters: Vec<String>,
    report_dir: PathBuf,
}

impl Run<'_> {
    /// Runs schemathesis; returns whether it passed, with its output for the assertion message.
    fn go(&self, mode: &str) -> (bool, String) {
        let mut cmd = Command::new(self.st);
        cmd.arg("--config-file")
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/schemathesis.toml"));
        cmd.args([
            "run",
            &format!("{}/openapi.yaml", self.url),
            "--url",
            &self.url,
            "--checks",
            "all",
            "--mode",
            mode,
            "--phases",
            "examples,coverage,fuzzing,stateful",
            "--max-examples",
            MAX_EXAMPLES,
            "--seed",
            SEED,
            "--workers",
            "1",
            "--generation-database",
            "none",
            "--request-timeout",
            "10",
            "--no-color",
            "--report",
            "junit",
            "--report-dir",
        ])
        .arg(&self.report_dir)
        .args(&self.filters);
        if let Some(t) = self.token {
            cmd.args(["--header", &format!("Authorization: Bearer {t}")]);
        }
        // schemathesis keeps a run cache in its working directory: the report dir, not the tree.
        std::fs::create_dir_all(&self.report_dir).expect("create the report dir");
        cmd.current_dir(&self.report_dir);
        let out = cmd.output().expect("run schemathesis");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        eprintln!("---- schemathesis {} ({mode}) ----\n{text}", self.service);
        (out.status.success(), text)
    }
}

/// Negative-only first (nothing may change), then every mode.
async fn fuzz(run: &Run<'_>, dbs: &[&TestDb], failures: &mut Vec<String>) {
    let mut before = Vec::new();
    for db in dbs {
        before.push(db.digest().await);
    }
    let (ok, text) = run.go("negative");
    if !ok {
        failures.push(format!("{} (negative): {}", run.service, tail(&text)));
    }
    for (db, before) in dbs.iter().zip(before) {
        let after = db.digest().await;
        let changed: Vec<_> = before
            .iter()
            .zip(&after)
            .filter(|(b, a)| b != a)
            .map(|(b, _)| b.0.clone())
            .collect();
        if !changed.is_empty() || before.len() != after.len() {
            failures.push(format!(
                "{}: rejected requests changed {}: {changed:?}",
                run.service, db.name
            ));
        }
    }
    let (ok, text) = run.go("all");
    if !ok {
        failures.push(format!("{} (all): {}", run.service, tail(&text)));
    }
}

fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(60)..].join("\n")
}

fn filters(pairs: &[(&str, &str)]) -> Vec<String> {
    pairs
        .iter()
        .flat_map(|(k, v)| [format!("--include-{k}"), (*v).to_owned()])
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_service_survives_a_property_based_run_from_its_own_document() {
    let Some(st) = schemathesis() else { return };
    let logs = std::env::temp_dir().join(format!("dlock-api-fuzz-{}", std::process::id()));
    let reports = logs.join("reports");
    let lock_db = lockdb().await;
    let pay_db = paydb().await;
    let admin = "fuzz-lock-admin-token-0123456789";
    let pay_admin = "fuzz-pay-admin-token-0123456789";
    let pay_executor = "fuzz-pay-executor-token-0123456789";
    let pay_client = "fuzz-pay-client-token-0123456789";
    let rail_executor = "fuzz-rail-executor-token-0123456789";
    let grant_key = SigningKey::generate(KeyId::new("fuzz").expect("key id"));
    let public_keys = grant_key.public_key().to_text();

    let lock_server = Service::start(
        Spec::new("lock-server", "lock-server")
            .expect("spec")
            .args([
                "--database-url",
                &lock_db.app_url(),
                "--listen",
                "127.0.0.1:{port}",
                // The long-lived routes (a blocking acquire, a watch stream) end within the run's
                // request timeout: a wait is answered after 200 ms at the latest, a stream closes.
                "--max-wait-ms",
                "200",
                "--watch-max-ms",
                "200",
            ])
            .env("DLOCK_ADMIN_TOKEN", admin)
            .env(SIGNING_KEY_ENV, grant_key.expose_text()),
        &logs,
    )
    .await
    .expect("start lock-server");
    let rail_stub = Service::start(
        Spec::new("rail-stub", "rail-stub").expect("spec").args([
            "--listen",
            "127.0.0.1:{port}",
            "--mode",
            "ack",
        ]),
        &logs,
    )
    .await
    .expect("start rail-stub");
    let rail_proxy = Service::start(
        Spec::new("rail-proxy", "rail-proxy")
            .expect("spec")
            .args([
                "--database-url",
                &pay_db.app_url(),
                "--listen",
                "127.0.0.1:{port}",
                "--rail-url",
                &rail_stub.url(),
                "--rail-timeout-ms",
                "2000",
            ])
            .env("RAIL_PROXY_EXECUTOR_TOKEN", rail_executor)
            .env(PUBLIC_KEYS_ENV, &public_keys),
        &logs,
    )
    .await
    .expect("start rail-proxy");
    let payment = Service::start(
        Spec::new("payment-resource", "payment-resource")
            .expect("spec")
            .args([
                "serve",
                "--database-url",
                &pay_db.app_url(),
                "--listen",
                "127.0.0.1:{port}",
            ])
            .env("PAYMENT_RESOURCE_ADMIN_TOKEN", pay_admin)
            .env("PAYMENT_RESOURCE_EXECUTOR_TOKEN", pay_executor)
            .env("PAYMENT_RESOURCE_CLIENT_TOKEN", pay_client)
            .env(PUBLIC_KEYS_ENV, &public_keys),
        &logs,
    )
    .await
    .expect("start payment-resource");

    let mut failures = Vec::new();
    let mut runs = Vec::new();
    if wanted("lock-server") {
        runs.push((
            Run {
                st: &st,
                service: "lock-server",
                url: lock_server.url(),
                token: Some(admin),
                filters: Vec::new(),
                report_dir: reports.join("lock-server"),
            },
            vec![&lock_db],
        ));
    }
    if wanted("rail-stub") {
        runs.push((
            Run {
                st: &st,
                service: "rail-stub",
                url: rail_stub.url(),
                token: None,
                filters: Vec::new(),
                report_dir: reports.join("rail-stub"),
            },
            vec![],
        ));
    }
    if wanted("rail-proxy") {
        runs.push((
            Run {
                st: &st,
                service: "rail-proxy",
                url: rail_proxy.url(),
                token: Some(rail_executor),
                filters: Vec::new(),
                report_dir: reports.join("rail-proxy"),
            },
            vec![&pay_db],
        ));
    }
    if wanted("payment-resource") {
        // One credential per role: each run covers the operations its role may call plus the open
        // ones (reads, health, the document).
        for (role, token, ops) in [
            (
                "admin",
                pay_admin,
                vec![("method", "GET"), ("path", "/v1/accounts")],
            ),
            ("client", pay_client, vec![("path", "/v1/payouts")]),
            ("executor", pay_executor, vec![("path-regex", "^/v1/payouts/")]),
        ] {
            let _ = ops;
            runs.push((
                Run {
                    st: &st,
                    service: "payment-resource",
                    url: payment.url(),
                    token: Some(token),
                    filters: filters(&match role {
                        "admin" => vec![("tag", "admin"), ("tag", "operations"), ("tag", "accounts")],
                        "client" => vec![("operation-id", "createPayout"), ("operation-id", "listPayouts")],
                        _ => vec![("tag", "executor"), ("operation-id", "getPayout")],
                    }),
                    report_dir: reports.join(format!("payment-resource-{role}")),
                },
                vec![&pay_db],
            ));
        }
    }
    for (run, dbs) in &runs {
        fuzz(run, dbs, &mut failures).await;
    }
    drop((lock_server, rail_proxy, rail_stub, payment));
    assert!(
        failures.is_empty(),
        "schemathesis found {} problem(s) (service logs in {}):\n{}",
        failures.len(),
        logs.display(),
        failures.join("\n\n")
    );
}
