//! What the runner writes: history records in the DESIGN §7 format (read back by the
//! checkers' reader), the error contract's table, and `run`'s refusal of a missing binary.

use std::process::Command;

use keel_jepsen::history::{self, OpKind, Status};
use keel_jepsen::run::clock::RunClock;
use keel_jepsen::run::outcome;
use keel_jepsen::run::recorder::Recorder;
use keel_jepsen::run::workload::{called, returned};
use keel_types::command::ConditionFailed;
use keel_types::{KvError, RangeId};
use serde_json::{Value, json};

#[test]
fn recorded_ops_are_design_format_lines() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("history.jsonl");
    let recorder = Recorder::create(&path, 10).unwrap();
    let clock = RunClock::start();
    let get = called(3, OpKind::Get, "r17", Value::Null, Value::Null, &clock);
    recorder.record(&returned(get, Status::Ok, json!(42), &clock));
    let cas = called(4, OpKind::Cas, "r17", json!(43), Value::Null, &clock);
    recorder.record(&returned(cas, Status::Fail, Value::Null, &clock));
    let put = called(5, OpKind::Put, "r17", json!(44), Value::Null, &clock);
    recorder.record(&returned(put, Status::Info, Value::Null, &clock));
    assert_eq!(recorder.finish(), Ok(3));

    let ops = history::read_history(&path).unwrap();
    let statuses: Vec<Status> = ops.iter().map(|op| op.status()).collect();
    assert_eq!(statuses, [Status::Ok, Status::Fail, Status::Info]);
    let text = std::fs::read_to_string(&path).unwrap();
    for (line, op) in text.lines().zip(&ops) {
        let fields: Vec<String> = serde_json::from_str::<serde_json::Map<String, Value>>(line)
            .unwrap()
            .keys()
            .cloned()
            .collect();
        let mut expected = [
            "call", "client", "expect", "key", "ok", "op", "output", "return", "value",
        ]
        .map(String::from)
        .to_vec();
        expected.sort();
        assert_eq!(fields, expected, "{line}");
        assert!(op.return_ns.is_none_or(|r| r >= op.call_ns), "{line}");
    }
    let first: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert_eq!(
        (&first["op"], &first["output"], &first["ok"]),
        (&json!("get"), &json!(42), &json!(true))
    );
    let last: Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    assert_eq!(
        (&last["ok"], &last["return"]),
        (&Value::Null, &Value::Null),
        "indeterminate"
    );
}

#[test]
fn recorder_refuses_records_past_its_limit() {
    let dir = tempfile::tempdir().unwrap();
    let recorder = Recorder::create(&dir.path().join("h.jsonl"), 1).unwrap();
    recorder.record(&json!({"a": 1}));
    recorder.record(&json!({"a": 2}));
    let error = recorder.finish().unwrap_err();
    assert!(error.contains("more than 1 records; limit is 1"), "{error}");
}

#[test]
fn client_errors_map_to_ok_fail_info() {
    let message = || "m".to_string();
    // (error, status of a write that returned it)
    let cases = [
        (
            KvError::InvalidArgument { message: message() },
            Status::Fail,
        ),
        (
            KvError::from(ConditionFailed {
                op_index: 0,
                key: b"k".to_vec(),
                current: None,
                revision: 0,
            }),
            Status::Fail,
        ),
        (
            KvError::NotLeader {
                range_id: RangeId::FIRST,
                leader: None,
            },
            Status::Fail,
        ),
        (KvError::Unavailable { message: message() }, Status::Fail),
        (KvError::Overloaded { message: message() }, Status::Fail),
        (KvError::NotACounter { key: b"k".to_vec() }, Status::Fail),
        (
            KvError::Overflow {
                key: b"k".to_vec(),
                current: i64::MAX,
                delta: 1,
            },
            Status::Fail,
        ),
        (
            KvError::FencedOut {
                key: b"k".to_vec(),
                lock: b"l".to_vec(),
                current_token: 9,
            },
            Status::Fail,
        ),
        (
            KvError::LockNotHeld {
                name: b"l".to_vec(),
                token: 3,
                current_token: None,
            },
            Status::Fail,
        ),
        (
            KvError::RecordNotOwned {
                scope: b"s".to_vec(),
                id: b"i".to_vec(),
                token: 3,
                current_token: Some(4),
            },
            Status::Fail,
        ),
        (KvError::OutcomeUnknown { message: message() }, Status::Info),
        (KvError::Timeout { message: message() }, Status::Info),
        (KvError::Fatal { message: message() }, Status::Info),
        (
            KvError::RequestIdExpired {
                client_id: 1,
                sequence: 2,
            },
            Status::Info,
        ),
    ];
    for (error, status) in &cases {
        assert_eq!(outcome::write_status(error), *status, "write: {error}");
        assert_eq!(outcome::read_status(error), Status::Fail, "read: {error}");
    }
    assert_eq!(
        [Status::Ok, Status::Fail, Status::Info].map(outcome::ok_field),
        [Some(true), Some(false), None]
    );
}

#[test]
fn run_without_a_keel_binary_says_how_to_build_one() {
    let dir = tempfile::tempdir().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_keel-jepsen"))
        .args([
            "run",
            "--workload",
            "register",
            "--nemesis",
            "partition,kill",
            "--time-limit",
            "5",
        ])
        .arg("--out")
        .arg(dir.path())
        .arg("--keel")
        .arg(dir.path().join("no-such-keel"))
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(3));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("cargo build --release --bin keel --features keel-cli/fault-injection,keel-cli/planted-bugs"), "{stderr}");
    let unknown = Command::new(env!("CARGO_BIN_EXE_keel-jepsen"))
        .args([
            "run",
            "--workload",
            "register",
            "--nemesis",
            "partitions",
            "--out",
            "x",
        ])
        .output()
        .unwrap();
    assert_eq!(unknown.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("unknown fault"));
}

/// A run never starts on an earlier run's directory: its nodes would find that run's data.
#[test]
fn run_into_a_directory_of_an_earlier_run_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("n1/data")).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_keel-jepsen"))
        .args(["run", "--workload", "register", "--time-limit", "5"])
        .arg("--out")
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(3));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("is not empty"), "{stderr}");
    assert!(dir.path().join("n1/data").is_dir());
    assert!(
        !dir.path().join("run.json").exists(),
        "nothing of a run was written"
    );
}
