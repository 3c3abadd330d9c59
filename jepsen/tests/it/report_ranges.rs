//! report.html of runs with a ranges.jsonl: markers for the range table's changes, the range
//! of each op, ops per range; and the report of a run without one unchanged.

use std::process::Command;

use keel_jepsen::check::{self, Results};
use keel_jepsen::checker::Verdict;
use keel_jepsen::ranges::{RangeEntry, RangeSnapshot};
use keel_jepsen::report;
use keel_jepsen::synth::{self, Shape, Workload};

use super::cli::{assert_self_contained, fixture, keel_jepsen, run_dir};

const RUN_SPEC: &str = r#"{"workload":"register","nemesis":["split","membership"],"nodes":4,"seed":1,"time_limit_s":60}"#;
const FAULTS: &str = r#"{"fault":"split","target":"r2 at k2","start":15,"stop":16}
{"fault":"membership","target":"r7 n3 -> n4","start":30,"stop":35}
"#;
/// The whole key space in r2; split at k2 at 15 ns; r7's voters and leader change at 35; the
/// final snapshot changes nothing.
const RANGES: &str = r#"{"at":0,"cause":"start","ranges":[{"range":2,"start":"","end":null,"epoch":1,"conf_version":1,"voters":[1,2,3],"leader":1}]}
{"at":15,"cause":"split","ranges":[{"range":2,"start":"","end":"k2","epoch":2,"conf_version":1,"voters":[1,2,3],"leader":1},{"range":7,"start":"k2","end":null,"epoch":2,"conf_version":1,"voters":[1,2,3],"leader":1}]}
{"at":35,"cause":"change","ranges":[{"range":2,"start":"","end":"k2","epoch":2,"conf_version":1,"voters":[1,2,3],"leader":1},{"range":7,"start":"k2","end":null,"epoch":2,"conf_version":3,"voters":[1,2,4],"leader":2}]}
{"at":60,"cause":"final","ranges":[{"range":2,"start":"","end":"k2","epoch":2,"conf_version":1,"voters":[1,2,3],"leader":1},{"range":7,"start":"k2","end":null,"epoch":2,"conf_version":3,"voters":[1,2,4],"leader":2}]}
"#;

fn assert_contains(html: &str, needles: &[&str]) {
    for needle in needles {
        assert!(html.contains(needle), "report.html lacks {needle}");
    }
}

#[test]
fn report_marks_range_changes_and_counts_ops_per_range() {
    let stale: &'static str = fixture("register/bad-stale-read.jsonl").leak();
    let dir = run_dir(&[
        ("run.json", RUN_SPEC),
        ("faults.jsonl", FAULTS),
        ("history.jsonl", stale),
        ("ranges.jsonl", RANGES),
    ]);
    let (code, _) = keel_jepsen(dir.path(), &[]);
    assert_eq!(code, 1, "the stale read is still caught");
    let html = std::fs::read_to_string(dir.path().join("report.html")).unwrap();
    assert_self_contained(&html);
    // The first table and two changes; the final snapshot changes nothing.
    assert_eq!(html.matches("class=\"range-change\"").count(), 3);
    assert_contains(
        &html,
        &[
            "4 range-table snapshots, 2 changes",
            "text-anchor=\"end\">ranges</text>",
            "<title>table at 0.000 s (start)\nr2 [&quot;&quot;, +inf) voters 1,2,3 leader 1</title>",
            "<title>range change at 0.000 s (split)\nsplit r2 at k2 -&gt; r2,r7</title>",
            "\nr7 voters 1,2,3 -&gt; 1,2,4\nr7 leader 1 -&gt; 2</title>",
            // Faults of the new kinds are bands like any other.
            "<title>split on r2 at k2:",
            "<title>membership on r7 n3 -&gt; n4:",
            // Each op's range in its tooltip: k2 was read after the split, from r7.
            "<title>record 4 (range 2): ",
            "<title>record 5 (range 7): ",
            // The stale read quoted by the register checker, with its range.
            "<table class=\"quoted-ops\">",
            "<tr><td>3</td><td>r2</td><td>2</td><td>get</td><td>k1</td>",
            "<table class=\"ops-per-range\">",
            "<tr><td>r2</td><td>[&quot;&quot;, &quot;k2&quot;)</td><td>4</td><td>4</td>\
             <td>0</td><td>0</td><td>2: k1, k2</td></tr>",
            "<tr><td>r7</td><td>[&quot;k2&quot;, +inf)</td><td>1</td><td>1</td><td>0</td>\
             <td>0</td><td>1: k2</td></tr>",
            "<h2>Range changes</h2>",
            "<td>split r2 at k2 -&gt; r2,r7</td>",
            "4 snapshots in ranges.jsonl, 2 of them changing the table.",
        ],
    );
    let again = std::fs::read_to_string(dir.path().join("report.html")).unwrap();
    let run = check::load(dir.path()).unwrap();
    let results: Results =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("results.json")).unwrap())
            .unwrap();
    assert_eq!(
        report::render(&run, &results),
        again,
        "the page is deterministic"
    );
}

#[test]
fn idempotency_records_route_by_scope_and_id() {
    let attempts: &'static str =
        fixture("idempotency/good-takeover-and-stale-complete-refused.jsonl").leak();
    // Split between the stored keys of id0 and id1 (`jepsen\0id0` < `jepsen\0id1`).
    let ranges = r#"{"at":0,"cause":"start","ranges":[{"range":2,"start":"","end":"jepsen\u0000id1","voters":[1,2,3],"leader":1},{"range":5,"start":"jepsen\u0000id1","end":null,"voters":[1,2,3],"leader":null}]}"#;
    let dir = run_dir(&[("history.jsonl", attempts), ("ranges.jsonl", ranges)]);
    let run = check::load(dir.path()).unwrap();
    let results = Results {
        valid: Verdict::Valid,
        clients: None,
        checkers: Default::default(),
        availability: None,
    };
    let html = report::render(&run, &results);
    assert_self_contained(&html);
    assert_contains(
        &html,
        &[
            "<title>table at 0.000 s (start)\nr2 [&quot;&quot;, &quot;jepsen\\0id1&quot;) \
             voters 1,2,3 leader 1\nr5 [&quot;jepsen\\0id1&quot;, +inf) voters 1,2,3 leader \
             none</title>",
            "<tr><td>r2</td><td>[&quot;&quot;, &quot;jepsen\\0id1&quot;)</td><td>7</td><td>6</td>\
             <td>1</td><td>0</td><td>1: jepsen\\0id0</td></tr>",
            "<tr><td>r5</td><td>[&quot;jepsen\\0id1&quot;, +inf)</td><td>6</td><td>6</td>\
             <td>0</td><td>0</td><td>1: jepsen\\0id1</td></tr>",
        ],
    );
    assert!(!html.contains('\0'), "keys are shown escaped");
}

#[test]
fn a_run_without_ranges_gets_todays_report() {
    let good: &'static str = fixture("register/good-sequential.jsonl").leak();
    let files = [
        ("run.json", RUN_SPEC),
        ("faults.jsonl", FAULTS),
        ("history.jsonl", good),
    ];
    let without = run_dir(&files);
    let run = check::load(without.path()).unwrap();
    assert!(run.ranges.is_none());
    let results = Results {
        valid: Verdict::Valid,
        clients: None,
        checkers: Default::default(),
        availability: None,
    };
    let html = report::render(&run, &results);
    for absent in [
        "range-change",
        "Ops per range",
        "Range changes",
        "range-table",
        "(range",
    ] {
        assert!(
            !html.contains(absent),
            "report.html of a run without ranges has {absent}"
        );
    }
    let empty = run_dir(&[files[0], files[1], files[2], ("ranges.jsonl", "")]);
    let run = check::load(empty.path()).unwrap();
    assert_eq!(run.ranges.as_deref(), Some(&[][..]));
    assert_eq!(
        report::render(&run, &results),
        html,
        "no snapshots: nothing to show"
    );
}

#[test]
fn a_malformed_ranges_file_is_an_input_error() {
    let good: &'static str = fixture("register/good-sequential.jsonl").leak();
    let gap = r#"{"at":0,"ranges":[{"range":2,"start":"","end":"a"},{"range":3,"start":"b","end":null}]}"#;
    for ranges in [
        gap,
        "{\"at\":0,",
        RANGES.replace("\"at\":35", "\"at\":5").leak(),
    ] {
        let dir = run_dir(&[
            ("run.json", RUN_SPEC),
            ("history.jsonl", good),
            ("ranges.jsonl", ranges),
        ]);
        let output = Command::new(env!("CARGO_BIN_EXE_keel-jepsen"))
            .arg("check")
            .arg(dir.path())
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(3), "{ranges}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("ranges.jsonl"), "{stderr}");
    }
}

#[test]
fn report_of_a_hundred_thousand_ops_over_many_ranges_stays_small() {
    let shape = Shape {
        ops: 100_000,
        keys: 2_000,
        clients: 100,
        sequential: false,
        info_per_mille: 5,
        seed: 4,
    };
    let history = synth::history(Workload::Register, &shape);
    let end_ns = history.iter().map(|op| op.call_ns).max().unwrap();
    // 600 snapshots, each splitting the last range once more: more changes than are drawn.
    let mut ranges = vec![entry(1, "", None)];
    let snapshots: Vec<RangeSnapshot> = (0..600u64)
        .map(|i| {
            if i > 0 {
                let at = format!("k{:04}", i * 3);
                let last = ranges.last_mut().unwrap();
                last.end = Some(at.clone());
                ranges.push(entry(i + 1, &at, None));
            }
            RangeSnapshot {
                at_ns: end_ns / 600 * i,
                cause: "split".to_string(),
                ranges: ranges.clone(),
            }
        })
        .collect();
    let run = check::RunDir {
        history: Some(history),
        ranges: Some(snapshots),
        ..Default::default()
    };
    let results = Results {
        valid: Verdict::Valid,
        clients: None,
        checkers: Default::default(),
        availability: None,
    };
    let html = report::render(&run, &results);
    assert_self_contained(&html);
    assert!(html.len() < 4 << 20, "report is {} bytes", html.len());
    assert_eq!(html.matches("class=\"range-change\"").count(), 500);
    assert_contains(
        &html,
        &[
            "600 snapshots in ranges.jsonl, 599 of them changing the table. Only the first 500 \
             are marked and listed.",
            "<td>split r499 at k1497 -&gt; r499,r500</td>",
        ],
    );
    assert!(
        !html.contains("split r500 at"),
        "the 501st marker is left out"
    );
}

fn entry(id: u64, start: &str, end: Option<&str>) -> RangeEntry {
    RangeEntry {
        id,
        start: start.to_string(),
        end: end.map(str::to_string),
        epoch: 1,
        conf_version: 1,
        voters: vec![1, 2, 3],
        leader: Some(1),
    }
}
