//! The chart's monitoring: its alerting rules (`templates/prometheusrule.yaml`), its Grafana
//! dashboard (`dashboards/dlock.json`), `promtool` over both, and the metric names their queries
//! read — for `tests/monitoring.rs` (no cluster) and the cluster tier's check against the running
//! operator.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::core::v1::ConfigMap;
use serde_json::Value;

use crate::{env, helm};

/// Set by `scripts/test.sh`: promtool and helm must be there, the checks must run.
pub const REQUIRE_ENV: &str = "DLOCK_REQUIRE_PROMTOOL";

/// `tool` from the tools dir or PATH; `None` (with the reason printed) when it is missing and the
/// run does not require it. Required ([`REQUIRE_ENV`]=1) and missing: a test failure.
pub fn required_tool(test: &str, tool: &str) -> Option<PathBuf> {
    if let Some(path) = env::tool(tool) {
        return Some(path);
    }
    let how = "scripts/cluster-tools.sh promtool helm builds them (scripts/setup.sh runs it)";
    if std::env::var(REQUIRE_ENV).as_deref() == Ok("1") {
        panic!("{test}: {tool} is missing and {REQUIRE_ENV}=1: {how}");
    }
    eprintln!("skipped {test}: {tool} is not installed ({how})");
    None
}

/// What the chart renders for monitoring, with everything switched on and the default values.
pub struct Rendered {
    /// The PrometheusRule's `spec` (`groups: …`): a Prometheus rule file as it is.
    pub rules: serde_yaml::Value,
    /// The dashboard, from its ConfigMap.
    pub dashboard: Value,
    /// The PodMonitor.
    pub pod_monitor: serde_yaml::Value,
}

/// `helm template` with the PodMonitor, the rules and the dashboard on.
pub fn render(helm_bin: &Path) -> Rendered {
    let yaml = helm::template(
        helm_bin,
        "dlock",
        "dlock-system",
        &[
            ("podMonitor.enabled", "true"),
            ("prometheusRule.enabled", "true"),
            ("grafanaDashboard.enabled", "true"),
        ],
        &[],
    );
    let one = |kind: &str| {
        let mut found = helm::rendered_yaml(&yaml, kind);
        assert_eq!(
            found.len(),
            1,
            "one {kind} expected, the chart rendered {}",
            found.len()
        );
        found.remove(0)
    };
    let dashboard_text = helm::rendered::<ConfigMap>(&yaml)
        .into_iter()
        .find_map(|c| c.data?.remove("dlock.json"))
        .unwrap_or_else(|| panic!("no dashboard ConfigMap rendered"));
    let dashboard = serde_json::from_str(&dashboard_text)
        .unwrap_or_else(|e| panic!("the dashboard ConfigMap holds no JSON: {e}"));
    Rendered {
        rules: one("PrometheusRule")["spec"].clone(),
        dashboard,
        pod_monitor: one("PodMonitor"),
    }
}

/// One alerting rule: name, expression, labels and annotations as rendered.
#[derive(Debug, Clone)]
pub struct Alert {
    pub name: String,
    pub expr: String,
    pub runbook_url: Option<String>,
    pub severity: Option<String>,
}

/// Every alerting rule of a rule file.
pub fn alerts(rules: &serde_yaml::Value) -> Vec<Alert> {
    rules["groups"]
        .as_sequence()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_sequence().cloned().unwrap_or_default())
        .filter_map(|r| {
            Some(Alert {
                name: r["alert"].as_str()?.to_owned(),
                expr: r["expr"].as_str()?.to_owned(),
                runbook_url: r["annotations"]["runbook_url"].as_str().map(str::to_owned),
                severity: r["labels"]["severity"].as_str().map(str::to_owned),
            })
        })
        .collect()
}

/// A dashboard query: where it is, and its PromQL.
#[derive(Debug, Clone)]
pub struct PanelQuery {
    pub panel: String,
    pub expr: String,
}

/// Every panel target's expression (rows and nested panels included).
pub fn panel_queries(dashboard: &Value) -> Vec<PanelQuery> {
    fn walk(panels: &Value, out: &mut Vec<PanelQuery>) {
        for p in panels.as_array().into_iter().flatten() {
            let title = p["title"].as_str().unwrap_or("?").to_owned();
            for t in p["targets"].as_array().into_iter().flatten() {
                if let Some(expr) = t["expr"].as_str() {
                    out.push(PanelQuery {
                        panel: format!("{title} ({})", t["refId"].as_str().unwrap_or("?")),
                        expr: expr.to_owned(),
                    });
                }
            }
            walk(&p["panels"], out);
        }
    }
    let mut out = Vec::new();
    walk(&dashboard["panels"], &mut out);
    out
}

/// The metric named by each `label_values(metric, label)` variable query of the dashboard.
pub fn variable_metrics(dashboard: &Value) -> BTreeSet<String> {
    dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| {
            let q = v["query"]["query"].as_str().or_else(|| v["query"].as_str())?;
            let inner = q.strip_prefix("label_values(")?.strip_suffix(')')?;
            let (metric, _label) = inner.split_once(',')?;
            Some(metric.trim().to_owned())
        })
        .collect()
}

/// Grafana's built-in range variables become a plain duration, so that promtool parses the query
/// as Prometheus will once Grafana has substituted them. Nothing else is rewritten: `$namespace`
/// appears only inside label-matcher strings.
pub fn as_promql(grafana_expr: &str) -> String {
    grafana_expr
        .replace("$__rate_interval", "5m")
        .replace("$__interval", "1m")
        .replace("$__range", "1h")
}

/// The dashboard's queries as a recording-rule file (one rule per query), for `promtool check rules`.
pub fn recording_rules(queries: &[PanelQuery]) -> String {
    let rules: Vec<serde_yaml::Value> = queries
        .iter()
        .enumerate()
        .map(|(i, q)| {
            let mut m = serde_yaml::Mapping::new();
            m.insert("record".into(), format!("dashboard:query_{i}").into());
            m.insert("expr".into(), as_promql(&q.expr).into());
            serde_yaml::Value::Mapping(m)
        })
        .collect();
    let mut group = serde_yaml::Mapping::new();
    group.insert("name".into(), "dashboard".into());
    group.insert("rules".into(), serde_yaml::Value::Sequence(rules));
    let mut file = serde_yaml::Mapping::new();
    file.insert(
        "groups".into(),
        serde_yaml::Value::Sequence(vec![serde_yaml::Value::Mapping(group)]),
    );
    serde_yaml::to_string(&file).unwrap_or_else(|e| panic!("serialise the recording rules: {e}"))
}

/// Runs promtool in `dir`; (success, stdout + stderr).
pub fn promtool(bin: &Path, dir: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(bin)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("spawn promtool {}: {e}", args.join(" ")));
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// PromQL's words that look like metric names but are not: the binary and modifier keywords, and
/// the aggregation operators (which may stand before their parentheses: `sum by (x) (…)`).
const KEYWORDS: &[&str] = &[
    "and",
    "or",
    "unless",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "offset",
    "atan2",
    "inf",
    "nan",
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
];
/// Keywords followed by a parenthesised list of label names (never metric names).
const LABEL_LISTS: &[&str] = &["by", "without", "on", "ignoring", "group_left", "group_right"];

/// The metric names a PromQL expression reads: every identifier that is not a function or
/// aggregation (followed by `(`), not a keyword, not inside a label matcher `{…}`, a range `[…]`, a
/// string or a label list (`by (…)`, `on (…)`, …). Numbers and durations are skipped.
pub fn metric_names(expr: &str) -> BTreeSet<String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut names = BTreeSet::new();
    let mut i = 0;
    let next_non_space = |from: usize| chars[from..].iter().copied().find(|c| !c.is_whitespace());
    while i < chars.len() {
        let c = chars[i];
        match c {
            '"' | '\'' | '`' => i = skip_string(&chars, i),
            '{' => i = skip_to(&chars, i, '}'),
            '[' => i = skip_to(&chars, i, ']'),
            c if c.is_ascii_digit() || (c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit)) => {
                // A number or a duration (5m, 1h30m, 1e3).
                while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                    i += 1;
                }
            }
            c if c.is_ascii_alphabetic() || c == '_' || c == ':' => {
                let start = i;
                while i < chars.len()
                    && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':')
                {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                let lower = word.to_ascii_lowercase();
                let followed_by_paren = next_non_space(i) == Some('(');
                if LABEL_LISTS.contains(&lower.as_str()) {
                    if followed_by_paren {
                        let open = i + chars[i..].iter().position(|c| *c == '(').unwrap_or(0);
                        i = skip_to(&chars, open, ')');
                    }
                } else if !followed_by_paren && !KEYWORDS.contains(&lower.as_str()) {
                    names.insert(word);
                }
            }
            _ => i += 1,
        }
    }
    names
}

/// Index after the string starting at `start` (escapes honoured).
fn skip_string(chars: &[char], start: usize) -> usize {
    let quote = chars[start];
    let mut i = start + 1;
    while i < chars.len() {
        match chars[i] {
            '\\' if quote != '`' => i += 2,
            c if c == quote => return i + 1,
            _ => i += 1,
        }
    }
    i
}

/// Index after the `close` that ends the bracket opened at `start` (strings inside skipped).
fn skip_to(chars: &[char], start: usize, close: char) -> usize {
    let open = chars[start];
    let mut depth = 0;
    let mut i = start;
    while i < chars.len() {
        match chars[i] {
            '"' | '\'' | '`' => {
                i = skip_string(chars, i);
                continue;
            }
            c if c == open => depth += 1,
            c if c == close => {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    i
}

/// The sample names of a Prometheus/OpenMetrics exposition (series that exist, not just `# HELP`
/// or `# TYPE` lines of families without a series).
pub fn exposed_names(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let end = l.find(['{', ' ']).unwrap_or(l.len());
            (end > 0).then(|| l[..end].to_owned())
        })
        .collect()
}

/// GitHub's anchor of a Markdown heading: lower case, spaces to `-`, punctuation other than `-`
/// and `_` dropped.
pub fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of every heading of a Markdown file (fenced code skipped).
pub fn anchors(markdown: &str) -> BTreeSet<String> {
    let mut fenced = false;
    markdown
        .lines()
        .filter(|l| {
            if l.trim_start().starts_with("```") {
                fenced = !fenced;
                return false;
            }
            !fenced
        })
        .filter_map(|l| {
            let title = l.trim_start_matches('#');
            (l.starts_with('#') && title.starts_with(' ')).then(|| anchor(title))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(expr: &str) -> Vec<String> {
        metric_names(expr).into_iter().collect()
    }

    #[test]
    fn metric_names_are_found_and_nothing_else() {
        assert_eq!(
            names(r#"max by (namespace, kind) (payment_reconciliation_breaks{kind!~"A|B", x="y{z}"}) > 0"#),
            ["payment_reconciliation_breaks"]
        );
        assert_eq!(
            names("sum by (ns) (increase(lock_fenced_out_total[10m])) > 10"),
            ["lock_fenced_out_total"]
        );
        assert_eq!(
            names("time() - max(x_seconds offset 5m) > 1800 and on(a, b) group_left(c) y_total unless z"),
            ["x_seconds", "y_total", "z"]
        );
        assert_eq!(
            names(
                "histogram_quantile(0.99, sum by (le) (rate(payout_duration_seconds_bucket{namespace=~\"$namespace\"}[5m])))"
            ),
            ["payout_duration_seconds_bucket"]
        );
        assert_eq!(
            names("max(a{c=\"1\"} == 0 and b > 0) without (pod) + 1e3 * 0.5"),
            ["a", "b"]
        );
        assert_eq!(
            names("sum(rate(foo:bar_total[$__rate_interval]))"),
            ["foo:bar_total"]
        );
        assert_eq!(
            names("sum by (a) (x_total) / ignoring (b) count without (c) (y)"),
            ["x_total", "y"]
        );
        assert!(names("vector(1) + 2").is_empty());
    }

    #[test]
    fn exposed_names_are_samples_not_descriptors() {
        let text = "# HELP a_total A.\n# TYPE a_total counter\na_total{x=\"1\"} 3\n# HELP empty Nothing yet.\n# TYPE empty gauge\nb 1\n# EOF\n";
        assert_eq!(
            exposed_names(text).into_iter().collect::<Vec<_>>(),
            ["a_total", "b"]
        );
    }

    #[test]
    fn anchors_are_github_slugs() {
        assert_eq!(anchor(" DlockLedgerBreak"), "dlockledgerbreak");
        assert_eq!(anchor("Restore fast-forward"), "restore-fast-forward");
        assert_eq!(anchor("`kubectl get lsvc`"), "kubectl-get-lsvc");
        let md = "# A b\n```sh\n# not a heading\n```\n## C: d\n";
        assert_eq!(anchors(md).into_iter().collect::<Vec<_>>(), ["a-b", "c-d"]);
    }

    #[test]
    fn grafana_variables_become_promql() {
        assert_eq!(
            as_promql("rate(x[$__rate_interval]) and on() y{n=~\"$namespace\"}"),
            "rate(x[5m]) and on() y{n=~\"$namespace\"}"
        );
    }
}
