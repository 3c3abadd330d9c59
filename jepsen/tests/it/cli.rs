//! `keel-jepsen check DIR` end to end: checker choice, results.json, report.html and exit
//! codes (0 valid, 1 invalid, 2 unknown, 3 usage or I/O error).

use std::path::Path;
use std::process::Command;

use keel_jepsen::check::{Results, RunDir};
use keel_jepsen::checker::Verdict;
use keel_jepsen::history::write_json_lines;
use keel_jepsen::report;
use keel_jepsen::synth::{self, Shape, Workload};

const RUN_SPEC: &str = r#"{"workload":"register","nemesis":["partition"],"nodes":3,"seed":1,"time_limit_s":60,"rate_hz":100}"#;
const FAULTS: &str = r#"{"fault":"partition","target":"n1|n2,n3","start":1000000,"stop":4000000}"#;

pub(crate) fn fixture(relative: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(relative);
    std::fs::read_to_string(path).unwrap()
}

/// A run directory with these files (name, contents).
pub(crate) fn run_dir(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (name, contents) in files {
        std::fs::write(dir.path().join(name), contents).unwrap();
    }
    dir
}

/// Runs the binary; returns its exit code and the results.json it wrote, if any.
pub(crate) fn keel_jepsen(dir: &Path, extra: &[&str]) -> (i32, Option<Results>) {
    let output = Command::new(env!("CARGO_BIN_EXE_keel-jepsen"))
        .arg("check")
        .arg(dir)
        .args(extra)
        .output()
        .unwrap();
    let results = std::fs::read_to_string(dir.join("results.json"))
        .ok()
        .map(|text| serde_json::from_str(&text).unwrap());
    (output.status.code().unwrap(), results)
}

fn check(files: &[(&str, &str)], extra: &[&str], code: i32, checkers: &[(&str, Verdict)]) {
    let dir = run_dir(files);
    let (actual, results) = keel_jepsen(dir.path(), extra);
    assert_eq!(actual, code, "{files:?} {extra:?}");
    let Some(results) = results else {
        assert!(checkers.is_empty(), "no results.json for {files:?}");
        return;
    };
    let verdicts: Vec<(&str, Verdict)> = results
        .checkers
        .iter()
        .map(|(name, result)| (name.as_str(), result.result))
        .collect();
    assert_eq!(verdicts, checkers);
    let html = std::fs::read_to_string(dir.path().join("report.html")).unwrap();
    assert_self_contained(&html);
}

pub(crate) fn assert_self_contained(html: &str) {
    assert!(html.starts_with("<!DOCTYPE html>") && html.contains("<svg"));
    for banned in ["<script", "src=", "href=", "@import", "url(", "@font-face"] {
        assert!(!html.contains(banned), "report.html contains {banned}");
    }
}

#[test]
fn check_command_exit_codes_and_files() {
    use Verdict::{Invalid, Unknown, Valid};
    let good: &'static str = fixture("register/good-sequential.jsonl").leak();
    let stale: &'static str = fixture("register/bad-stale-read.jsonl").leak();
    let counter: &'static str = fixture("counter/good-basic.jsonl").leak();
    let spec = ("run.json", RUN_SPEC);
    let faults = ("faults.jsonl", FAULTS);
    let history = |text: &'static str| ("history.jsonl", text);
    let both = [("coverage", Valid), ("register", Valid)];
    check(&[spec, faults, history(good)], &[], 0, &both);
    let bad = [("coverage", Valid), ("register", Invalid)];
    check(&[spec, faults, history(stale)], &[], 1, &bad);
    let uncovered = [("coverage", Invalid), ("register", Valid)];
    check(&[spec, history(good)], &[], 1, &uncovered);
    let limited = ["--key-ops-max", "2"];
    check(
        &[spec, faults, history(good)],
        &limited,
        2,
        &[("coverage", Valid), ("register", Unknown)],
    );
    let forced = ["--checker", "counter"];
    check(&[history(counter)], &forced, 0, &[("counter", Valid)]);
    check(&[history(good)], &[], 3, &[]);
    check(&[spec, faults], &[], 3, &[]);
    check(&[spec, faults, history("{not json")], &[], 3, &[]);
    check(&[spec, history(good)], &["--checker", "nonsense"], 3, &[]);
    let unchecked_spec = RUN_SPEC.replace("register", "bank");
    check(&[("run.json", &unchecked_spec), history(good)], &[], 3, &[]);
    let fencing_spec = RUN_SPEC.replace("register", "fencing");
    let holds: &'static str = fixture("fencing/good-holds-handed-over-and-expired.jsonl").leak();
    let fenced = [("coverage", Valid), ("fencing", Valid)];
    check(
        &[("run.json", &fencing_spec), faults, history(holds)],
        &[],
        0,
        &fenced,
    );
}

#[test]
fn help_exits_zero_and_a_missing_dir_three() {
    let help = Command::new(env!("CARGO_BIN_EXE_keel-jepsen"))
        .args(["check", "--help"])
        .output()
        .unwrap();
    assert_eq!(help.status.code(), Some(0));
    let missing = Path::new("/nonexistent/keel-jepsen-run");
    assert_eq!(keel_jepsen(missing, &[]).0, 3);
}

#[test]
fn report_of_a_hundred_thousand_ops_stays_small_and_says_it_is_bucketed() {
    let shape = Shape {
        ops: 100_000,
        keys: 2_000,
        clients: 100,
        sequential: false,
        info_per_mille: 5,
        seed: 4,
    };
    let history = synth::history(Workload::Register, &shape);
    let dir = tempfile::tempdir().unwrap();
    write_json_lines(&dir.path().join("history.jsonl"), &history).unwrap();
    let run = RunDir {
        history: Some(history),
        faults: vec![serde_json::from_str(FAULTS).unwrap()],
        spec: Some(serde_json::from_str(RUN_SPEC).unwrap()),
        ranges: None,
        replicas: None,
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
    assert!(
        html.contains("buckets of"),
        "the timeline says it is bucketed"
    );
    assert!(
        html.contains("of 100000 ops drawn"),
        "the latency plot says it samples"
    );
    assert!(html.contains("100 clients share 64 lanes"));
}

#[test]
fn the_client_mode_reaches_results_and_report() {
    let good: &'static str = fixture("register/good-sequential.jsonl").leak();
    let spread = RUN_SPEC.replace(r#""nodes""#, r#""clients":"spread","nodes""#);
    let cases = [
        (spread.as_str(), Some("spread")),
        // Runs from before --clients were routed.
        (RUN_SPEC, Some("routed")),
    ];
    for (spec, expected) in cases {
        let dir = run_dir(&[
            ("run.json", spec),
            ("faults.jsonl", FAULTS),
            ("history.jsonl", good),
        ]);
        let (code, results) = keel_jepsen(dir.path(), &[]);
        assert_eq!(code, 0, "{spec}");
        assert_eq!(results.unwrap().clients.as_deref(), expected, "{spec}");
        let html = std::fs::read_to_string(dir.path().join("report.html")).unwrap();
        let words = format!("({} clients)", expected.unwrap());
        assert!(html.contains(&words), "report.html lacks {words}");
    }
    let dir = run_dir(&[("history.jsonl", good)]);
    let (_, results) = keel_jepsen(dir.path(), &["--checker", "register"]);
    assert_eq!(results.unwrap().clients, None);
}

#[test]
fn the_availability_measure_reaches_results_report_and_stdout() {
    // The partition runs from 1 ms to 4 ms; the first read returns at 3 ms, the first
    // write (called after the start) at 3.5 ms. Without run.json the workload ends with the
    // history (at 3.5 ms), and so does the window.
    let history = [
        r#"{"client":1,"op":"put","key":"r1","value":1,"ok":true,"call":0,"return":1500000}"#,
        r#"{"client":1,"op":"get","key":"r1","ok":true,"output":1,"call":2000000,"return":3000000}"#,
        r#"{"client":2,"op":"put","key":"r1","value":2,"ok":true,"call":2500000,"return":3500000}"#,
    ]
    .join("\n");
    let dir = run_dir(&[("faults.jsonl", FAULTS), ("history.jsonl", &history)]);
    let output = Command::new(env!("CARGO_BIN_EXE_keel-jepsen"))
        .arg("check")
        .arg(dir.path())
        .args(["--checker", "register"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0));
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert!(
        stdout.contains("availability: longest gap 0.002 s (partition n1|n2,n3 at 0.001 s)"),
        "{stdout}"
    );
    let text = std::fs::read_to_string(dir.path().join("results.json")).unwrap();
    let results: Results = serde_json::from_str(&text).unwrap();
    let measure = results.availability.unwrap();
    let event = &measure.events[0];
    assert_eq!(
        (event.first_read_ms, event.first_write_ms),
        (Some(2.0), Some(2.5))
    );
    assert_eq!(measure.worst["partition"].gap_ms, 2.0);
    let html = std::fs::read_to_string(dir.path().join("report.html")).unwrap();
    assert_self_contained(&html);
    for words in [
        "<h2>Availability</h2>",
        "longest gap without a success 0.002 s",
    ] {
        assert!(html.contains(words), "report.html lacks {words}");
    }
}
