//! Reading Prometheus/OpenMetrics text, one rule for every test: a sample matches by its exact
//! metric name and by containing all the wanted labels (extra labels are fine, order is not
//! significant). Counters absent from the text are the caller's decision (`unwrap_or(0.0)` where a
//! counter that never moved is not exported yet, `expect` where it must exist).

/// The value of sample `name` whose labels include all of `labels`.
pub fn metric_value(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    matching(text, name, labels).next()
}

/// The sum of every sample named `name` whose labels include all of `labels` (a counter across the
/// label values it is split by).
pub fn metric_sum(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    matching(text, name, labels).sum()
}

/// The values of the samples that match — the one rule.
fn matching<'a>(
    text: &'a str,
    name: &'a str,
    labels: &'a [(&'a str, &'a str)],
) -> impl Iterator<Item = f64> + 'a {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(move |line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (series_name, have) = parse_series(series)?;
            (series_name == name && labels.iter().all(|want| have.contains(want)))
                .then(|| value.trim().parse::<f64>().ok())
                .flatten()
        })
}

/// The same rule, with the sample written as in the exposition: `name` or `name{k="v",…}`.
pub fn sample(text: &str, series: &str) -> Option<f64> {
    let (name, labels) = parse_series(series)?;
    metric_value(text, name, &labels)
}

/// A counter's value as an integer (counters are integral in these services; a fractional or
/// negative value is a test failure, not something to round).
pub fn counter(text: &str, series: &str) -> Option<u64> {
    let v = sample(text, series)?;
    assert!(
        v >= 0.0 && v.fract() == 0.0,
        "{series} is not a counter value: {v}"
    );
    Some(v as u64)
}

/// GET `<base_url>/metrics`.
pub async fn scrape(base_url: &str) -> Result<String, reqwest::Error> {
    reqwest::get(format!("{base_url}/metrics"))
        .await?
        .error_for_status()?
        .text()
        .await
}

/// `name{k="v",…}` → (`name`, [(k, v)…]).
fn parse_series(series: &str) -> Option<(&str, Vec<(&str, &str)>)> {
    let (name, label_text) = match series.split_once('{') {
        Some((n, rest)) => (n, rest.strip_suffix('}')?),
        None => (series, ""),
    };
    let labels = label_text
        .split(',')
        .filter(|p| !p.is_empty())
        .filter_map(|p| {
            let (k, v) = p.split_once('=')?;
            Some((k.trim(), v.trim().trim_matches('"')))
        })
        .collect();
    Some((name.trim(), labels))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# HELP lock_fenced_out Writes refused\n\
# TYPE lock_fenced_out counter\n\
lock_fenced_out_total{resource=\"account\"} 0\n\
lock_fenced_out_total{resource=\"rail\"} 3\n\
rail_duplicate_attempted_total 2\n\
payouts_processed_total{outcome=\"posted\",worker=\"x\"} 5\n\
# EOF\n";

    #[test]
    fn reads_samples_by_name_and_labels() {
        assert_eq!(
            metric_value(TEXT, "lock_fenced_out_total", &[("resource", "rail")]),
            Some(3.0)
        );
        assert_eq!(
            metric_value(TEXT, "lock_fenced_out_total", &[("resource", "account")]),
            Some(0.0)
        );
        assert_eq!(
            metric_value(TEXT, "lock_fenced_out_total", &[("resource", "payout")]),
            None
        );
        assert_eq!(
            metric_value(TEXT, "rail_duplicate_attempted_total", &[]),
            Some(2.0)
        );
        assert_eq!(
            metric_value(TEXT, "payouts_processed_total", &[("outcome", "posted")]),
            Some(5.0)
        );
        assert_eq!(metric_value(TEXT, "rail_duplicate_attempted", &[]), None);
    }

    #[test]
    fn reads_samples_written_as_in_the_exposition() {
        assert_eq!(
            sample(TEXT, "lock_fenced_out_total{resource=\"rail\"}"),
            Some(3.0)
        );
        assert_eq!(
            sample(TEXT, "payouts_processed_total{outcome=\"posted\"}"),
            Some(5.0)
        );
        assert_eq!(counter(TEXT, "rail_duplicate_attempted_total"), Some(2));
        // A prefix of a name is not the name.
        assert_eq!(sample(TEXT, "lock_fenced_out"), None);
        assert_eq!(metric_sum(TEXT, "lock_fenced_out_total", &[]), 3.0);
        assert_eq!(metric_sum(TEXT, "lock_fenced_out", &[]), 0.0);
        assert_eq!(sample(TEXT, "lock_fenced_out_total{resource=\"payout\"}"), None);
    }
}
