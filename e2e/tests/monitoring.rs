//! The chart's monitoring, without a cluster: the alerting rules pass `promtool check rules` and the
//! unit tests of `charts/tests/alerts.test.yaml` (every alert fires when it must and stays silent
//! when it must not), each names its severity and a runbook section that exists; every dashboard
//! query parses; and every metric a rule or a panel reads is exported by the real services, started
//! by the test kit and driven until their labelled series exist (the operator's names: by its own
//! metrics code here, by the running operator in the cluster tier, tests/plugin.rs).
//!
//! helm and promtool come from `scripts/cluster-tools.sh`; `scripts/test.sh` sets
//! `DLOCK_REQUIRE_PROMTOOL=1`, so there a missing tool fails instead of skipping.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use dlock_e2e::env::{self, Scratch};
use dlock_e2e::{helm, monitoring};
use dlock_testkit::stack::{Stack, StackOptions};

const RUNBOOK_BASE: &str = "https://github.com/dlock-dev/dlock/blob/main/docs/operations.md";

fn write(dir: &Path, name: &str, text: &str) {
    std::fs::write(dir.join(name), text).unwrap_or_else(|e| panic!("write {name}: {e}"));
}

fn rules_yaml(rules: &serde_yaml::Value) -> String {
    serde_yaml::to_string(rules).expect("serialise the rules")
}

/// The unit tests, as promtool reads them.
fn alert_tests() -> String {
    let path = env::repo_root().join("charts/tests/alerts.test.yaml");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

#[test]
fn alert_rules_pass_promtool_and_every_alert_is_tested_firing_and_silent() {
    let test = "alert_rules_pass_promtool_and_every_alert_is_tested_firing_and_silent";
    let Some(helm_bin) = monitoring::required_tool(test, "helm") else {
        return;
    };
    let Some(promtool) = monitoring::required_tool(test, "promtool") else {
        return;
    };
    let rendered = monitoring::render(&helm_bin);
    let alerts = monitoring::alerts(&rendered.rules);
    let names: BTreeSet<String> = alerts.iter().map(|a| a.name.clone()).collect();
    // The alerts the runbook promises (docs/operations.md, "Alerts").
    for want in [
        "DlockPayoutPaidTwice",
        "DlockLedgerBreak",
        "DlockReconciliationNotRunning",
        "DlockFencingSequenceBehind",
        "DlockFencedOutWritesBurst",
        "DlockSessionLossHigh",
        "DlockPayoutStuck",
        "DlockPayoutAbandoned",
        "DlockPayoutOverErrorBudget",
        "DlockComponentDown",
        "DlockComponentDegraded",
        "DlockMigrationFailed",
    ] {
        assert!(names.contains(want), "no alert {want}: {names:?}");
    }
    assert_eq!(names.len(), alerts.len(), "an alert name is used twice");

    let dir = Scratch::new("alerts");
    write(dir.path(), "rules.yaml", &rules_yaml(&rendered.rules));
    write(dir.path(), "alerts.test.yaml", &alert_tests());
    let (ok, out) = monitoring::promtool(&promtool, dir.path(), &["check", "rules", "rules.yaml"]);
    assert!(ok, "promtool check rules:\n{out}");
    assert!(out.contains(&format!("{} rules found", alerts.len())), "{out}");
    let (ok, out) = monitoring::promtool(&promtool, dir.path(), &["test", "rules", "alerts.test.yaml"]);
    assert!(ok, "promtool test rules:\n{out}");

    // Every alert is tested both ways; no test names an alert that does not exist.
    let tests: serde_yaml::Value = serde_yaml::from_str(&alert_tests()).expect("the test file is YAML");
    let mut fires: BTreeMap<String, usize> = BTreeMap::new();
    let mut silent: BTreeMap<String, usize> = BTreeMap::new();
    for group in tests["tests"].as_sequence().expect("tests") {
        for case in group["alert_rule_test"].as_sequence().into_iter().flatten() {
            let name = case["alertname"].as_str().expect("alertname").to_owned();
            assert!(names.contains(&name), "a test names an unknown alert {name}");
            let expected = case["exp_alerts"].as_sequence().map_or(0, Vec::len);
            *if expected > 0 { &mut fires } else { &mut silent }
                .entry(name)
                .or_default() += 1;
        }
    }
    for name in &names {
        assert!(fires.contains_key(name), "{name} is never tested firing");
        assert!(silent.contains_key(name), "{name} is never tested silent");
    }

    // Negative controls: the unit tests fail for a rule that would stay silent on a break, and
    // `check rules` fails for a rule that does not parse.
    let weakened = rules_yaml(&rendered.rules).replace(
        r#"kind!~"RAIL_PAID_NOT_POSTED|POSTED_WITHOUT_RAIL_ACK|STUCK"}) > 0"#,
        r#"kind!~"RAIL_PAID_NOT_POSTED|POSTED_WITHOUT_RAIL_ACK|STUCK"}) > 5"#,
    );
    assert_ne!(
        weakened,
        rules_yaml(&rendered.rules),
        "the control must change the rule"
    );
    write(dir.path(), "rules.yaml", &weakened);
    let (ok, out) = monitoring::promtool(&promtool, dir.path(), &["test", "rules", "alerts.test.yaml"]);
    assert!(
        !ok && out.contains("DlockLedgerBreak"),
        "a silenced rule passed its tests:\n{out}"
    );
    write(
        dir.path(),
        "rules.yaml",
        &rules_yaml(&rendered.rules).replace("> 0", "> > 0"),
    );
    let (ok, out) = monitoring::promtool(&promtool, dir.path(), &["check", "rules", "rules.yaml"]);
    assert!(!ok, "a broken expression passed check rules:\n{out}");
}

#[test]
fn every_alert_has_a_severity_and_a_runbook_section_that_exists() {
    let test = "every_alert_has_a_severity_and_a_runbook_section_that_exists";
    let Some(helm_bin) = monitoring::required_tool(test, "helm") else {
        return;
    };
    let rendered = monitoring::render(&helm_bin);
    let runbook =
        std::fs::read_to_string(env::repo_root().join("docs/operations.md")).expect("read the runbook");
    let anchors = monitoring::anchors(&runbook);
    let alerts = monitoring::alerts(&rendered.rules);
    assert!(!alerts.is_empty());
    for a in &alerts {
        assert!(
            matches!(a.severity.as_deref(), Some("critical" | "warning")),
            "{}: severity {:?}",
            a.name,
            a.severity
        );
        let url = a
            .runbook_url
            .as_deref()
            .unwrap_or_else(|| panic!("{} has no runbook_url", a.name));
        let (base, anchor) = url
            .split_once('#')
            .unwrap_or_else(|| panic!("{}: {url} names no section", a.name));
        assert_eq!(base, RUNBOOK_BASE, "{}", a.name);
        assert_eq!(
            anchor,
            a.name.to_lowercase(),
            "{}: one section per alert, named after it",
            a.name
        );
        assert!(
            anchors.contains(anchor),
            "{}: docs/operations.md has no section #{anchor}",
            a.name
        );
    }
    // The check sees a missing section (negative control).
    assert!(!anchors.contains("dlocknosuchalert"));
}

#[test]
fn dashboard_queries_parse_with_promtool() {
    let test = "dashboard_queries_parse_with_promtool";
    let Some(helm_bin) = monitoring::required_tool(test, "helm") else {
        return;
    };
    let Some(promtool) = monitoring::required_tool(test, "promtool") else {
        return;
    };
    let rendered = monitoring::render(&helm_bin);
    let queries = monitoring::panel_queries(&rendered.dashboard);
    // What the dashboard is for (issue: grants and contention, fenced-out writes per resource,
    // payouts by state and age, rail submissions and ambiguity, reconciliation breaks, the
    // sequence against the high-water).
    let titles: BTreeSet<String> = queries
        .iter()
        .map(|q| q.panel.split(" (").next().unwrap_or_default().to_owned())
        .collect();
    for want in [
        "Lock grants and contention",
        "Fenced-out writes per resource",
        "Open payouts by state",
        "Oldest open payout by state",
        "Rail submissions by outcome",
        "Ambiguity",
        "Reconciliation breaks by kind",
        "Fencing sequence against the paydbs' high-water",
    ] {
        assert!(titles.contains(want), "no panel {want:?}: {titles:?}");
    }
    let dir = Scratch::new("dashboard");
    write(
        dir.path(),
        "dashboard.yaml",
        &monitoring::recording_rules(&queries),
    );
    let (ok, out) = monitoring::promtool(&promtool, dir.path(), &["check", "rules", "dashboard.yaml"]);
    assert!(ok, "a dashboard query does not parse:\n{out}");
    assert!(out.contains(&format!("{} rules found", queries.len())), "{out}");
    // Negative control: one broken query fails the check.
    let mut broken = queries.clone();
    broken.push(monitoring::PanelQuery {
        panel: "broken".into(),
        expr: "sum by (namespace (lock_acquire_total)".into(),
    });
    write(
        dir.path(),
        "dashboard.yaml",
        &monitoring::recording_rules(&broken),
    );
    let (ok, out) = monitoring::promtool(&promtool, dir.path(), &["check", "rules", "dashboard.yaml"]);
    assert!(!ok, "a broken query passed:\n{out}");
}

#[test]
fn the_pod_monitor_scrapes_the_ports_the_operator_names() {
    let test = "the_pod_monitor_scrapes_the_ports_the_operator_names";
    let Some(helm_bin) = monitoring::required_tool(test, "helm") else {
        return;
    };
    let pm = monitoring::render(&helm_bin).pod_monitor;
    let labels = &pm["spec"]["selector"]["matchLabels"];
    assert_eq!(
        labels["app.kubernetes.io/managed-by"].as_str(),
        Some(dlock_operator::builders::MANAGED_BY)
    );
    let ports: Vec<&str> = pm["spec"]["podMetricsEndpoints"]
        .as_sequence()
        .expect("endpoints")
        .iter()
        .filter_map(|e| e["port"].as_str())
        .collect();
    // The dlock workloads' port (every Deployment the operator builds), the same port of a pod
    // that serves HTTPS (scraped with scheme https), and etcd's metrics port.
    assert_eq!(
        ports,
        [
            dlock_operator::builders::HTTP_PORT_NAME,
            dlock_operator::builders::HTTPS_PORT_NAME,
            "metrics"
        ]
    );
    let https = &pm["spec"]["podMetricsEndpoints"][1];
    assert_eq!(https["scheme"].as_str(), Some("https"));
    assert_eq!(https["tlsConfig"]["insecureSkipVerify"].as_bool(), Some(true));
    assert!(pm["spec"]["podMetricsEndpoints"][0]["scheme"].is_null());
    assert_eq!(pm["spec"]["namespaceSelector"]["any"].as_bool(), Some(true));
}

/// The sample names the five services export once driven: a payout posted through the whole
/// stack (lock-server, payment-resource, rail-proxy, rail-stub, a long-running executor), after
/// payment-resource's first periodic checks.
async fn names_the_services_export() -> BTreeSet<String> {
    let lockdb = dlock_testkit::lockdb().await;
    let paydb = dlock_testkit::paydb().await;
    let logs = Scratch::new("monitoring-stack");
    let stack = Stack::start(
        &lockdb.app_url(),
        &paydb.app_url(),
        &StackOptions::new(logs.path()),
    )
    .await
    .expect("start the stack");
    let executor = stack
        .start_executor(
            stack
                .service_executor_spec("monitoring-executor")
                .expect("executor spec"),
        )
        .await
        .expect("start the executor");
    let account = stack.create_account("EUR", 100_000).await.expect("account");
    let payout = stack.create_payout(account, 1_250, "EUR").await.expect("payout");
    dlock_testkit::wait::wait_until("the payout POSTED", || async {
        stack
            .payout(payout.payout_id)
            .await
            .is_ok_and(|p| p.state.as_str() == "POSTED")
    })
    .await;
    // The periodic checks ran at start; wait until their families are there (never a sleep).
    dlock_testkit::wait::wait_until("payment-resource's periodic checks exported", || async {
        stack.metrics(&stack.payment.url()).await.is_ok_and(|t| {
            let names = monitoring::exposed_names(&t);
            names.contains("payment_reconciliation_breaks") && names.contains("payment_payouts_open")
        })
    })
    .await;
    let mut names = BTreeSet::new();
    let lock_server = stack
        .lock_server
        .as_ref()
        .expect("the stack's own lock-server")
        .url();
    for url in [
        lock_server,
        stack.payment.url(),
        stack.rail_proxy.url(),
        stack.rail_stub.url(),
        executor.url(),
    ] {
        let text = stack
            .metrics(&url)
            .await
            .unwrap_or_else(|e| panic!("scrape {url}: {e}"));
        names.extend(monitoring::exposed_names(&text));
    }
    names
}

/// The operator's sample names, from its own metrics code driven as a reconcile drives it. The
/// cluster tier (tests/plugin.rs) checks the same names against the running operator's /metrics.
fn names_the_operator_code_exports() -> BTreeSet<String> {
    use dlock_operator::health::{DeploymentHealth, JobState};
    use dlock_operator::metrics::{LOCK_SERVICE, Metrics};
    let mut registry = prometheus_client::registry::Registry::default();
    let m = Metrics::register(&mut registry);
    drop(m.reconcile_started(LOCK_SERVICE));
    m.reconcile_failed(LOCK_SERVICE, "api");
    m.workloads_observed(
        &(LOCK_SERVICE, "ns".into(), "locks".into()),
        &[DeploymentHealth {
            name: "locks-lock-server".into(),
            desired: 2,
            available: 2,
            updated: 2,
            observed: true,
        }],
        Some(&JobState::Succeeded),
    );
    m.fencing_observed(
        "ns",
        "locks",
        Some(&dlock_operator::crd::actions::FencingStatus {
            sequence: 2,
            high_water: 1,
            high_water_stack: None,
            checked_at: "2026-01-01T00:00:00Z".into(),
            job_name: None,
        }),
    );
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
    monitoring::exposed_names(&text)
}

/// The names the rules and the dashboard read that are not in `exported`.
fn missing(used: &BTreeMap<String, BTreeSet<String>>, exported: &BTreeSet<String>) -> Vec<String> {
    used.iter()
        .filter(|(name, _)| !exported.contains(*name))
        .map(|(name, whom)| {
            format!(
                "{name} (read by {})",
                whom.iter().cloned().collect::<Vec<_>>().join(", ")
            )
        })
        .collect()
}

#[tokio::test]
async fn every_metric_the_alerts_and_the_dashboard_read_is_exported() {
    let test = "every_metric_the_alerts_and_the_dashboard_read_is_exported";
    let Some(helm_bin) = monitoring::required_tool(test, "helm") else {
        return;
    };
    let rendered = monitoring::render(&helm_bin);
    let mut used: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for a in monitoring::alerts(&rendered.rules) {
        for n in monitoring::metric_names(&a.expr) {
            used.entry(n).or_default().insert(a.name.clone());
        }
    }
    for q in monitoring::panel_queries(&rendered.dashboard) {
        for n in monitoring::metric_names(&monitoring::as_promql(&q.expr)) {
            used.entry(n).or_default().insert(format!("panel {}", q.panel));
        }
    }
    for n in monitoring::variable_metrics(&rendered.dashboard) {
        used.entry(n).or_default().insert("a dashboard variable".into());
    }
    assert!(used.len() >= 15, "too few names found: {used:?}");

    let mut exported = names_the_services_export().await;
    exported.extend(names_the_operator_code_exports());
    let gaps = missing(&used, &exported);
    assert!(
        gaps.is_empty(),
        "read but not exported: {gaps:?}\nexported: {exported:?}"
    );

    // Negative control: a name nobody exports is reported.
    let mut typo = used.clone();
    typo.insert(
        "payment_reconciliation_break".into(),
        ["a typo".to_owned()].into(),
    );
    assert_eq!(missing(&typo, &exported).len(), 1);
}

/// `helm lint --strict` with the monitoring parts on, and the Prometheus named for the policies.
#[test]
fn the_chart_lints_with_monitoring_on() {
    let Some(helm_bin) = monitoring::required_tool("the_chart_lints_with_monitoring_on", "helm") else {
        return;
    };
    let chart = helm::chart_dir();
    let chart = chart.to_string_lossy();
    let (ok, out, err) = helm::run(
        &helm_bin,
        &[
            "lint",
            "--strict",
            &chart,
            "--set",
            "podMonitor.enabled=true",
            "--set",
            "prometheusRule.enabled=true",
            "--set",
            "grafanaDashboard.enabled=true",
            "--set",
            "grafanaDashboard.folder=dlock",
            "--set",
            "watchNamespace=payments",
            "--set-string",
            "prometheus.namespaceSelector.kubernetes\\.io/metadata\\.name=monitoring",
            "--set-string",
            "prometheus.podSelector.app\\.kubernetes\\.io/name=prometheus",
        ],
    );
    assert!(ok, "helm lint:\n{out}\n{err}");
    // The selectors reach the operator as its flags, sorted k=v lists.
    let rendered = helm::template(
        &helm_bin,
        "dlock",
        "dlock-system",
        &[],
        &[
            "--set-string",
            "prometheus.namespaceSelector.kubernetes\\.io/metadata\\.name=monitoring",
            "--set-string",
            "prometheus.podSelector.app\\.kubernetes\\.io/name=prometheus",
            "--set-string",
            "prometheus.podSelector.team=obs",
        ],
    );
    assert!(
        rendered.contains("--prometheus-namespace-selector=kubernetes.io/metadata.name=monitoring"),
        "{rendered}"
    );
    assert!(
        rendered.contains("--prometheus-pod-selector=app.kubernetes.io/name=prometheus,team=obs"),
        "{rendered}"
    );
    // And they are what the operator accepts.
    assert!(
        dlock_operator::builders::network_policies::Scraper::new(
            Some("kubernetes.io/metadata.name=monitoring"),
            Some("app.kubernetes.io/name=prometheus,team=obs")
        )
        .is_ok_and(|s| s.is_some())
    );
    // Without them, no flag: no scraper is admitted.
    let plain = helm::template(&helm_bin, "dlock", "dlock-system", &[], &[]);
    assert!(!plain.contains("--prometheus-"), "{plain}");
}
