//! Reading the apiserver's Prometheus metrics, to count the requests an operator makes.
//!
//! `apiserver_request_total{verb,resource,code,...}` counts every request the apiserver
//! served, so the difference between two readings taken around a test tells how many
//! writes a controller made, by verb and resource. On a shared cluster other tests add to
//! the counts; measure in a test binary of its own.

use std::collections::BTreeMap;

use kube::Client;

use crate::error::{Error, Result};

/// The apiserver's `/metrics` text (Prometheus exposition format).
pub async fn metrics_text(client: &Client) -> Result<String> {
    let request = http::Request::get("/metrics")
        .body(Vec::new())
        .expect("a static request");
    client
        .request_text(request)
        .await
        .map_err(|e| Error::kube("reading the apiserver's /metrics", e))
}

/// One sample of a metric: its labels and value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The labels, e.g. `verb` → `POST`.
    pub labels: BTreeMap<String, String>,
    /// The value.
    pub value: f64,
}

/// The samples of metric `name` in `text`, e.g. `apiserver_request_total`.
pub fn samples(text: &str, name: &str) -> Vec<Sample> {
    text.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix(name)?;
            let (labels, value) = match rest.strip_prefix('{') {
                Some(rest) => {
                    let (labels, value) = rest.split_once("} ")?;
                    (parse_labels(labels), value)
                }
                None => (BTreeMap::new(), rest.strip_prefix(' ')?),
            };
            let value = value.split_whitespace().next()?.parse().ok()?;
            Some(Sample { labels, value })
        })
        .collect()
}

/// The sum of `apiserver_request_total` over the samples matching `verb` (e.g. `POST`,
/// `PATCH`, `LIST`, `WATCH`) and `resource` (e.g. `pods`); `None` matches any.
pub fn request_count(text: &str, verb: Option<&str>, resource: Option<&str>) -> f64 {
    let matches = |sample: &Sample, key: &str, want: Option<&str>| {
        want.is_none_or(|want| sample.labels.get(key).map(String::as_str) == Some(want))
    };
    samples(text, "apiserver_request_total")
        .iter()
        .filter(|s| matches(s, "verb", verb) && matches(s, "resource", resource))
        .map(|s| s.value)
        .sum()
}

/// Parses `a="1",b="x\"y"` (label values may hold escaped quotes, backslashes, newlines).
fn parse_labels(text: &str) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    let mut rest = text;
    while let Some((key, after)) = rest.split_once("=\"") {
        let mut value = String::new();
        let mut chars = after.char_indices();
        let mut end = after.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, other)) => value.push(other),
                    None => {}
                },
                '"' => {
                    end = i + 1;
                    break;
                }
                c => value.push(c),
            }
        }
        labels.insert(key.trim_start_matches(',').trim().to_owned(), value);
        rest = &after[end..];
    }
    labels
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"# HELP apiserver_request_total [STABLE] Counter of apiserver requests
# TYPE apiserver_request_total counter
apiserver_request_total{code="201",component="apiserver",group="apps",resource="deployments",verb="POST",version="v1"} 3
apiserver_request_total{code="200",component="apiserver",group="",resource="pods",verb="LIST",version="v1"} 7
apiserver_request_total{code="201",component="apiserver",group="",resource="pods",verb="POST",version="v1"} 2
apiserver_request_total_other{verb="POST"} 100
apiserver_request_duration_seconds_count{verb="POST"} 9
process_start_time_seconds 1.7e+09
"#;

    #[test]
    fn parses_labels_and_values() {
        let all = samples(TEXT, "apiserver_request_total");
        assert_eq!(all.len(), 3);
        assert_eq!(all[0].labels["resource"], "deployments");
        assert_eq!(all[0].labels["group"], "apps");
        assert_eq!(all[1].labels["group"], "");
        assert_eq!(all[0].value, 3.0);
        assert_eq!(samples(TEXT, "process_start_time_seconds")[0].value, 1.7e9);
    }

    #[test]
    fn counts_requests_by_verb_and_resource() {
        assert_eq!(request_count(TEXT, Some("POST"), None), 5.0);
        assert_eq!(request_count(TEXT, Some("POST"), Some("pods")), 2.0);
        assert_eq!(request_count(TEXT, None, Some("pods")), 9.0);
        assert_eq!(request_count(TEXT, Some("DELETE"), None), 0.0);
    }

    #[test]
    fn unescapes_label_values() {
        let labels = parse_labels(r#"a="x\"y",b="line\nbreak",c="back\\slash""#);
        assert_eq!(labels["a"], "x\"y");
        assert_eq!(labels["b"], "line\nbreak");
        assert_eq!(labels["c"], "back\\slash");
    }
}
