//! Percentiles and their rendering as JSON and as a table.

use std::time::Duration;

use super::*;
use crate::config::{Args, Config};
use crate::failure::Failure;
use crate::mover::MoveCounts;
use clap::Parser;

fn config() -> Config {
    let args = Args::try_parse_from([
        "keel-bench",
        "--clients",
        "4",
        "--duration",
        "2s",
        "--zipf",
        "0.99",
    ])
    .unwrap();
    Config::from_args(args).unwrap()
}

/// 1,000 latencies of 1..=1000 µs, with 3 errors and 2 conflicts.
fn tally() -> Tally {
    let mut tally = Tally::new();
    for micros in 1..=1_000 {
        tally.record(Duration::from_micros(micros));
    }
    tally.record_error(Failure::new("UNAVAILABLE/not_leader", "first"));
    tally.record_error(Failure::new("bench_timeout", "second"));
    let mut other = Tally::new();
    other.record_error(Failure::new("UNAVAILABLE/not_leader", "third"));
    other.conflicts = 2;
    tally.merge(other);
    tally
}

#[test]
fn percentiles_and_rate() {
    let summary = Summary::new(&config(), &tally());
    assert_eq!(summary.ops, 1_000);
    assert_eq!(summary.ops_per_sec, 500.0);
    assert_eq!((summary.errors, summary.conflicts), (3, 2));
    assert_eq!(
        summary.first_error.as_deref(),
        Some("UNAVAILABLE/not_leader: first")
    );
    let by_code: Vec<(&str, u64)> = summary
        .errors_by_code
        .iter()
        .map(|(code, count)| (code.as_str(), *count))
        .collect();
    assert_eq!(
        by_code,
        [("UNAVAILABLE/not_leader", 2), ("bench_timeout", 1)]
    );
    // HdrHistogram with 3 significant digits: exact at this scale.
    assert_eq!(
        (summary.p50_us, summary.p99_us, summary.p999_us),
        (500, 990, 999)
    );
    assert_eq!(summary.max_us, 1_000);
    assert!((summary.mean_us - 500.5).abs() < 1.0);
}

#[test]
fn empty_run_reports_zeros() {
    let summary = Summary::new(&config(), &Tally::new());
    assert_eq!((summary.ops, summary.p50_us, summary.max_us), (0, 0, 0));
    assert_eq!(summary.ops_per_sec, 0.0);
}

#[test]
fn latencies_are_clamped_into_the_histogram() {
    let mut tally = Tally::new();
    tally.record(Duration::ZERO);
    tally.record(Duration::from_secs(3_600));
    assert_eq!(tally.latencies_us.len(), 2);
    assert_eq!(tally.latencies_us.min(), 1);
    assert!(tally.latencies_us.max() >= limits::LATENCY_US_MAX);
}

#[test]
fn json_has_the_fields_scripts_read() {
    let json: serde_json::Value =
        serde_json::from_str(&Summary::new(&config(), &tally()).to_json()).unwrap();
    assert_eq!(json["target"], "keel");
    assert_eq!(json["op"], "put");
    assert_eq!(json["clients"], 4);
    assert_eq!(json["distribution"], "zipf:0.99");
    assert_eq!(json["ops_per_sec"], 500.0);
    assert_eq!(json["errors"], 3);
    assert_eq!(json["route"], "leader");
    assert_eq!(json["errors_by_code"]["UNAVAILABLE/not_leader"], 2);
    for field in [
        "p50_us",
        "p99_us",
        "p999_us",
        "max_us",
        "value_bytes",
        "keyspace",
    ] {
        assert!(json[field].is_u64(), "{field}");
    }
}

#[test]
fn table_aligns_header_and_row() {
    let table = Summary::new(&config(), &tally()).to_table();
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 2);
    assert!(lines[0].starts_with("target route       op"));
    assert!(lines[1].starts_with("keel   leader      put"));
    // Every column but the last (the errors by code) is aligned.
    let start = |line: &str, column: &str| line.chars().count() - column.chars().count();
    let codes = "UNAVAILABLE/not_leader=2,bench_timeout=1";
    assert!(lines[1].ends_with(codes), "{}", lines[1]);
    assert_eq!(
        start(lines[0], "errors by code"),
        start(lines[1], codes),
        "{table}"
    );
    assert!(lines[1].contains(" 500.0 "));
}

#[test]
fn errors_by_code_most_frequent_first() {
    let mut summary = Summary::new(&config(), &Tally::new());
    assert_eq!(summary.errors_by_code_text(), "-");
    summary.errors_by_code = [("b", 1), ("a", 1), ("c", 5)]
        .into_iter()
        .map(|(code, count)| (code.to_string(), count))
        .collect();
    assert_eq!(summary.errors_by_code_text(), "c=5,a=1,b=1");
}

#[test]
fn route_is_named() {
    let spread =
        Config::from_args(Args::try_parse_from(["keel-bench", "--route", "spread"]).unwrap())
            .unwrap();
    assert_eq!(Summary::new(&spread, &Tally::new()).route, "spread");
}

#[test]
fn moves_get_a_table_of_their_own_and_a_json_object() {
    let mut summary = Summary::new(&config(), &tally());
    assert!(summary.to_json().contains("\"moves\": null"));
    let mut after = Tally::new();
    after.record(Duration::from_millis(300));
    after.record_error(Failure::new("UNAVAILABLE/not_leader", "moved"));
    let counts = MoveCounts {
        done: 7,
        refused: 1,
        first_refusal: Some("range 2 to node 3: timed out".to_string()),
    };
    summary.moves = Some(MoveReport::new(
        Duration::from_secs(3),
        counts,
        &after,
        &tally(),
    ));
    let table = summary.to_table();
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 6, "{table}");
    assert!(lines[2].starts_with("leader moves every 3s: 7 done, 1 refused"));
    assert!(
        lines[4].starts_with("  after move           1       1"),
        "{}",
        lines[4]
    );
    assert!(
        lines[4].ends_with("UNAVAILABLE/not_leader=1"),
        "{}",
        lines[4]
    );
    assert!(
        lines[5].starts_with("  steady            1000       3"),
        "{}",
        lines[5]
    );
    let json: serde_json::Value = serde_json::from_str(&summary.to_json()).unwrap();
    assert_eq!(json["moves"]["done"], 7);
    assert_eq!(json["moves"]["after_move"]["errors"], 1);
    assert!(json["moves"]["after_move"]["max_us"].as_u64().unwrap() >= 299_000);
    assert_eq!(json["moves"]["steady"]["ops"], 1000);
}
