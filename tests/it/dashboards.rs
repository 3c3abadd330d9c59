//! The Grafana dashboard and the Prometheus rules in `deploy/` against what a node exports:
//! every metric name in the PromQL of `deploy/grafana/keel.json` (panel queries and template
//! variables), of `deploy/prometheus/alerts.yml` and of the series its promtool tests feed
//! is one a running cluster serves at `/metrics`, once it has served puts, a failed call, a
//! lock and an idempotency record (some series appear only then). The cluster serves TLS and
//! checks tokens, with a tenant that has keys and bytes quotas and has written: the
//! certificate and tenant series appear only with those. Names come out of PromQL
//! through a small tokenizer; planted bad names show the check failing. Knows nothing of
//! Grafana or Prometheus beyond their file formats and PromQL's words.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use keel_client::{AcquireOptions, Client, ClientOptions, PutOptions};
use keel_server::Access;
use serde_json::Value as Json;
use serde_norway::Value as Yaml;

use crate::harness::Cluster;
use crate::observability::scrape;
use crate::prometheus::{self, Scrape};

/// Series Prometheus makes itself, which the dashboard and the rules may name.
const PROMETHEUS_SERIES: &[&str] = &["up"];

/// The series of a histogram family, after its name.
const HISTOGRAM_SUFFIXES: &[&str] = &["_bucket", "_sum", "_count"];

/// PromQL words that are not metric names: aggregations, the modifiers of aggregations and
/// binary operators, set operators and number words (PromQL reads them in any case).
/// Functions are told apart by the `(` after them.
const KEYWORDS: &[&str] = &[
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
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "atan2",
    "offset",
    "inf",
    "nan",
];

/// The keywords a parenthesised list of label names may follow.
const LABEL_LISTS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

/// How long the series that appear late (heartbeat ages, quorum acknowledgements, a
/// tenant's usage once its namespace is split off and counted) may take.
const SERIES_WAIT: Duration = Duration::from_secs(30);

const ADMIN: &str = "dashboards-admin-0123456789";
const METERED: &str = "dashboards-metered-0123456789";

/// An admin for the harness's clients, and a tenant with keys and bytes quotas (only such
/// a tenant has `keel_tenant_*` series).
const TOKENS: &str = r#"
[[admin]]
name = "ops"
tokens = ["dashboards-admin-0123456789"]

[[tenant]]
name = "metered"
tokens = ["dashboards-metered-0123456789"]
max_keys = 1000
max_bytes = 1048576
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_and_alerts_name_only_exported_metrics() {
    let referenced = referenced_names();
    for expected in [
        "keel_grpc_request_duration_seconds_bucket",
        "keel_storage_healthy",
    ] {
        assert!(referenced.contains_key(expected), "{referenced:?}");
    }
    let access = Access::parse(TOKENS).unwrap();
    let cluster = Cluster::start_authenticated(3, access, ADMIN).await;
    make_lazy_series(&cluster).await;
    let deadline = tokio::time::Instant::now() + SERIES_WAIT;
    let (exported, found) = loop {
        let exported = exported(&cluster).await;
        let found = problems(&referenced, &exported);
        if found.is_empty() || tokio::time::Instant::now() > deadline {
            break (exported, found);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        found.is_empty(),
        "the dashboard or the rules name metrics the nodes do not serve:\n{}",
        found.join("\n")
    );
    // A planted misspelling (`request` for `requests`) is caught against the same scrape.
    let planted = names_of(&[(
        "planted".to_string(),
        "sum(rate(keel_grpc_request_total[5m]))".to_string(),
    )]);
    let caught = problems(&planted, &exported);
    assert_eq!(caught.len(), 1, "{caught:?}");
    assert!(caught[0].starts_with("keel_grpc_request_total is not exported"));
    cluster.shutdown().await;
}

/// Every metric name the dashboard and the rules name, with where.
type Referenced = BTreeMap<String, BTreeSet<String>>;

/// What a cluster's nodes serve, all nodes together.
#[derive(Debug, Default)]
struct Exported {
    /// Names of the samples served (a histogram's `_bucket`, `_sum` and `_count`).
    samples: BTreeSet<String>,
    /// Family name → type, from the `# TYPE` lines.
    types: BTreeMap<String, String>,
}

impl Exported {
    fn add(&mut self, scrape: &Scrape) {
        let names = scrape.samples.keys().map(|(name, _)| name.clone());
        self.samples.extend(names);
        self.types.extend(scrape.types.clone());
    }
}

/// One line per name in `referenced` that the nodes do not serve, saying why and where.
fn problems(referenced: &Referenced, exported: &Exported) -> Vec<String> {
    referenced
        .iter()
        .filter_map(|(name, origins)| {
            let why = why_not_exported(name, exported)?;
            let origins: Vec<&str> = origins.iter().map(String::as_str).collect();
            Some(format!("{why} (named in {})", origins.join("; ")))
        })
        .collect()
}

/// Why `name` is not a series the nodes serve, or `None` when it is.
fn why_not_exported(name: &str, exported: &Exported) -> Option<String> {
    if PROMETHEUS_SERIES.contains(&name) || exported.samples.contains(name) {
        return None;
    }
    let stem = HISTOGRAM_SUFFIXES
        .iter()
        .find_map(|suffix| name.strip_suffix(suffix));
    let kind_of = |family: &str| exported.types.get(family).map(String::as_str);
    let stem = stem.and_then(|stem| Some((stem, kind_of(stem)?)));
    Some(match (kind_of(name), stem) {
        (Some("histogram"), _) => {
            format!("{name} is a histogram: name its _bucket, _sum or _count series")
        }
        (Some(kind), _) => format!("{name}: the nodes declare this {kind} but serve no sample"),
        (None, Some((stem, "histogram"))) => {
            format!("{name}: the nodes declare histogram {stem} but serve no such sample")
        }
        (None, Some((stem, kind))) => format!("{name}: {stem} is a {kind}, not a histogram"),
        (None, None) => format!("{name} is not exported"),
    })
}

/// The names of every expression in the dashboard and the rule files.
fn referenced_names() -> Referenced {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let read = |path: &str| {
        let path = root.join(path);
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    };
    let dashboard: Json = serde_json::from_str(&read("deploy/grafana/keel.json")).unwrap();
    let rules: Yaml = serde_norway::from_str(&read("deploy/prometheus/alerts.yml")).unwrap();
    let tests: Yaml = serde_norway::from_str(&read("deploy/prometheus/alerts_test.yml")).unwrap();
    let mut expressions = dashboard_expressions(&dashboard);
    let from_dashboard = expressions.len();
    assert!(from_dashboard >= 20, "{expressions:?}");
    expressions.extend(rule_expressions(&rules));
    let from_rules = expressions.len() - from_dashboard;
    assert!(from_rules >= 8, "{expressions:?}");
    expressions.extend(test_series(&tests));
    assert!(expressions.len() > from_dashboard + from_rules);
    names_of(&expressions)
}

/// The names of `expressions` ((where, PromQL)); each must name at least one.
fn names_of(expressions: &[(String, String)]) -> Referenced {
    let mut referenced = Referenced::new();
    for (origin, expr) in expressions {
        let names = metric_names(expr).unwrap_or_else(|e| panic!("{origin}: {e} in {expr:?}"));
        assert!(!names.is_empty(), "{origin} names no metric: {expr:?}");
        for name in names {
            referenced.entry(name).or_default().insert(origin.clone());
        }
    }
    referenced
}

/// (where, PromQL) of every panel query (`expr`, at any depth) and template variable.
fn dashboard_expressions(dashboard: &Json) -> Vec<(String, String)> {
    let mut expressions = Vec::new();
    panel_expressions(&dashboard["panels"], "", &mut expressions);
    let variables = dashboard["templating"]["list"]
        .as_array()
        .expect("variables");
    for variable in variables.iter().filter(|v| v["type"] == "query") {
        let query = &variable["query"];
        let query = query.as_str().or(query["query"].as_str()).expect("a query");
        let origin = format!("keel.json variable {}", variable["name"]);
        expressions.push((origin, variable_promql(query).to_string()));
    }
    expressions
}

fn panel_expressions(value: &Json, title: &str, out: &mut Vec<(String, String)>) {
    match value {
        Json::Object(fields) => {
            let title = fields.get("title").and_then(Json::as_str).unwrap_or(title);
            for (key, value) in fields {
                match (key.as_str(), value) {
                    ("expr", Json::String(expr)) => {
                        out.push((format!("keel.json panel {title:?}"), expr.clone()))
                    }
                    _ => panel_expressions(value, title, out),
                }
            }
        }
        Json::Array(items) => {
            for item in items {
                panel_expressions(item, title, out);
            }
        }
        _ => {}
    }
}

/// The PromQL of a Grafana variable query: the series selector of `label_values(selector,
/// label)`, nothing of `label_values(label)`, else the whole query.
fn variable_promql(query: &str) -> &str {
    let arguments = query
        .trim()
        .strip_prefix("label_values(")
        .and_then(|rest| rest.strip_suffix(')'));
    match arguments {
        Some(arguments) => arguments
            .rsplit_once(',')
            .map_or("", |(selector, _)| selector),
        None => query,
    }
}

/// (where, PromQL) of every rule of a rules file.
fn rule_expressions(rules: &Yaml) -> Vec<(String, String)> {
    let mut expressions = Vec::new();
    for group in rules["groups"].as_sequence().expect("groups") {
        for rule in group["rules"].as_sequence().expect("rules") {
            let name = rule["alert"].as_str().or(rule["record"].as_str());
            let expr = rule["expr"].as_str().expect("an expr");
            let origin = format!("alerts.yml rule {}", name.expect("a rule name"));
            expressions.push((origin, expr.to_string()));
        }
    }
    expressions
}

/// (where, selector) of every input series of a promtool test file, and its PromQL tests.
fn test_series(tests: &Yaml) -> Vec<(String, String)> {
    let mut expressions = Vec::new();
    for (i, test) in tests["tests"]
        .as_sequence()
        .expect("tests")
        .iter()
        .enumerate()
    {
        let origin = format!("alerts_test.yml test {}", i + 1);
        let series = test["input_series"].as_sequence().expect("input_series");
        let fields = [(series, "series")];
        let promql = test["promql_expr_test"].as_sequence().map(|t| (t, "expr"));
        for (items, field) in fields.into_iter().chain(promql) {
            for item in items {
                let text = item[field].as_str().expect("a selector or an expression");
                expressions.push((origin.clone(), text.to_string()));
            }
        }
    }
    expressions
}

/// The metric names `expr` (PromQL, perhaps with Grafana's `$variables`) names: identifiers
/// that are not keywords, not called like functions, not label names listed after `by`,
/// `on` and the like, and not inside matchers (`{...}`), ranges (`[...]`), strings or
/// comments.
fn metric_names(expr: &str) -> Result<BTreeSet<String>, String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut names = BTreeSet::new();
    let mut at = 0;
    while at < chars.len() {
        let c = chars[at];
        let number =
            c.is_ascii_digit() || (c == '.' && chars.get(at + 1).is_some_and(char::is_ascii_digit));
        at = match c {
            '"' | '\'' | '`' => skip_string(&chars, at)?,
            '{' => skip_past(&chars, at, '}')?,
            '[' => skip_past(&chars, at, ']')?,
            '#' => skip_while(&chars, at, |c| c != '\n'),
            '$' if chars.get(at + 1) == Some(&'{') => skip_past(&chars, at + 1, '}')?,
            '$' => skip_while(&chars, at + 1, is_name_char),
            _ if number => skip_while(&chars, at, |c| c.is_ascii_alphanumeric() || c == '.'),
            _ if is_name_start(c) => word(&chars, at, &mut names)?,
            _ => at + 1,
        };
    }
    Ok(names)
}

/// Reads the identifier at `start` (a metric name unless a keyword or a function), and a
/// label list after it; returns where reading goes on.
fn word(chars: &[char], start: usize, names: &mut BTreeSet<String>) -> Result<usize, String> {
    let end = skip_while(chars, start, is_name_char);
    let word: String = chars[start..end].iter().collect();
    let lower = word.to_ascii_lowercase();
    let next = skip_while(chars, end, char::is_whitespace);
    let called = chars.get(next) == Some(&'(');
    if called && LABEL_LISTS.contains(&lower.as_str()) {
        return skip_past(chars, next, ')');
    }
    if !called && !KEYWORDS.contains(&lower.as_str()) {
        names.insert(word);
    }
    Ok(end)
}

/// Past the string whose quote is at `start` (backslash escapes, none in backquotes).
fn skip_string(chars: &[char], start: usize) -> Result<usize, String> {
    let quote = chars[start];
    let mut at = start + 1;
    while let Some(&c) = chars.get(at) {
        match c {
            '\\' if quote != '`' => at += 2,
            c if c == quote => return Ok(at + 1),
            _ => at += 1,
        }
    }
    Err(format!("a string opened at {start} is not closed"))
}

/// Past the `close` that ends what opens at `start`, strings inside skipped whole.
fn skip_past(chars: &[char], start: usize, close: char) -> Result<usize, String> {
    let mut at = start + 1;
    while let Some(&c) = chars.get(at) {
        at = match c {
            '"' | '\'' | '`' => skip_string(chars, at)?,
            c if c == close => return Ok(at + 1),
            _ => at + 1,
        };
    }
    Err(format!(
        "{:?} at {start} is not closed by {close:?}",
        chars[start]
    ))
}

fn skip_while(chars: &[char], start: usize, keep: impl Fn(char) -> bool) -> usize {
    let mut at = start;
    while chars.get(at).is_some_and(|c| keep(*c)) {
        at += 1;
    }
    at
}

fn is_name_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == ':'
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// Requests after which every family has samples: puts (three in four to one key, which the
/// 1-in-4 sample then reports hot), a failed call, a lock, an idempotency record and a
/// tenant's put.
async fn make_lazy_series(cluster: &Cluster) {
    let client = cluster.client();
    for i in 0..80 {
        let key = match i % 4 {
            3 => format!("key-{i}"),
            _ => "hot".to_string(),
        };
        let put = client.put(key.as_bytes(), b"v", PutOptions::default());
        put.await.unwrap();
    }
    let failed = client.increment(b"hot", 1).await;
    assert!(failed.is_err(), "\"v\" is no counter: {failed:?}");
    let lock = AcquireOptions {
        owner: Some(b"dashboards".to_vec()),
        ttl: Duration::from_secs(60),
        wait: Duration::ZERO,
        lock_delay: Duration::ZERO,
    };
    assert!(client.acquire(b"dashboards", lock).await.unwrap().acquired);
    let work = || async { Ok::<_, std::io::Error>(b"done".to_vec()) };
    let ttl = Duration::from_secs(60);
    let result = client
        .idempotent(b"dashboards", b"record-1", ttl, work)
        .await;
    assert_eq!(result.unwrap(), b"done");
    let options = ClientOptions {
        token: Some(METERED.to_string()),
        ..cluster.client_options()
    };
    let endpoints = cluster.ids().into_iter().map(|id| cluster.endpoint(id));
    let tenant = Client::new(endpoints.collect(), options).unwrap();
    let put = tenant.put(b"cart", b"1 item", PutOptions::default());
    put.await.unwrap();
}

/// What every node of `cluster` serves now.
async fn exported(cluster: &Cluster) -> Exported {
    let mut exported = Exported::default();
    for id in cluster.running() {
        exported.add(&scrape(cluster, id).await);
    }
    exported
}

#[test]
fn metric_names_are_the_identifiers_promql_reads_as_series() {
    let check = |expr: &str, expected: &[&str]| {
        let names = metric_names(expr).unwrap_or_else(|e| panic!("{expr}: {e}"));
        let expected: BTreeSet<String> = expected.iter().map(|s| s.to_string()).collect();
        assert_eq!(names, expected, "{expr}");
    };
    check("keel_a", &["keel_a"]);
    check("max by (job, range_id) (keel_a) == 0", &["keel_a"]);
    check("sum(keel_a) without (instance)", &["keel_a"]);
    check("SUM BY (le) (keel_a) > BOOL Inf", &["keel_a"]);
    check(
        "histogram_quantile(0.99, sum by (le) (rate(keel_a_bucket{d=\"x\"}[5m]))) > 0.05",
        &["keel_a_bucket"],
    );
    check(
        "a and on (job, node_id) (b > 10) or c unless ignoring(x) d",
        &["a", "b", "c", "d"],
    );
    check("x * on (i) group_left y", &["x", "y"]);
    check("x * on (i) group_right (label) y", &["x", "y"]);
    check("count(m{l=\"a}b\", k=~'[0-9]+'}) or vector(0)", &["m"]);
    check("label_replace(m, \"dst\", \"$1\", \"src\", `(.*)`)", &["m"]);
    check("time() - keel_b{instance=~\"$instance\"}", &["keel_b"]);
    check("rate(m[$__rate_interval] offset 5m) / 1e3", &["m"]);
    check("rate(m[5m:30s] @ start())", &["m"]);
    check("topk(10, m) > ${threshold}", &["m"]);
    check(
        "# keel_not_a_name\nrecording:rule_name + .5",
        &["recording:rule_name"],
    );
    check("vector(1)", &[]);
}

#[test]
fn broken_promql_is_refused() {
    for expr in [
        "m{l=\"a\"",
        "m{l=\"a}",
        "rate(m[5m)",
        "\"open",
        "sum by (a m",
    ] {
        assert!(metric_names(expr).is_err(), "{expr}");
    }
}

#[test]
fn grafana_variable_queries_give_their_series_selector() {
    let cases = [
        ("label_values(keel_a, job)", "keel_a"),
        (
            "label_values(keel_a{job=~\"$job\", x=\"1\"}, instance)",
            "keel_a{job=~\"$job\", x=\"1\"}",
        ),
        ("label_values(job)", ""),
        (
            "query_result(topk(3, keel_a))",
            "query_result(topk(3, keel_a))",
        ),
    ];
    for (query, expected) in cases {
        assert_eq!(variable_promql(query), expected, "{query}");
    }
}

/// The check on a made-up scrape: names it serves pass, planted bad ones are caught.
#[test]
fn a_name_the_nodes_do_not_serve_is_caught() {
    let text = "# TYPE keel_a_total counter\nkeel_a_total 1\n\
                # TYPE keel_h_seconds histogram\nkeel_h_seconds_bucket{le=\"+Inf\"} 1\n\
                keel_h_seconds_sum 0.5\nkeel_h_seconds_count 1\n\
                # TYPE keel_g gauge\n";
    let mut exported = Exported::default();
    exported.add(&prometheus::parse(text).unwrap());
    let cases: &[(&str, Option<&str>)] = &[
        ("keel_a_total", None),
        ("keel_h_seconds_bucket", None),
        ("keel_h_seconds_count", None),
        ("up", None),
        ("keel_b_total", Some("keel_b_total is not exported")),
        ("node_load1", Some("node_load1 is not exported")),
        ("keel_h_seconds", Some("keel_h_seconds is a histogram")),
        (
            "keel_g",
            Some("the nodes declare this gauge but serve no sample"),
        ),
        (
            "keel_a_total_count",
            Some("keel_a_total is a counter, not a histogram"),
        ),
    ];
    for (name, expected) in cases {
        let why = why_not_exported(name, &exported);
        match (expected, &why) {
            (None, None) => {}
            (Some(expected), Some(why)) if why.contains(expected) => {}
            _ => panic!("{name}: expected {expected:?}, got {why:?}"),
        }
    }
    let referenced = names_of(&[(
        "made up".to_string(),
        "rate(keel_a_total[5m]) / keel_b_total".to_string(),
    )]);
    let found = problems(&referenced, &exported);
    assert_eq!(
        found,
        ["keel_b_total is not exported (named in made up)"],
        "the planted keel_b_total is the one problem"
    );
}
