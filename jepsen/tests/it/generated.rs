//! Generated histories, correct by construction (`keel_jepsen::synth`): each checker must
//! find them valid, and invalid once one read is changed.

use keel_jepsen::checker::{Budget, CheckerName, Input, Outcome, Verdict};
use keel_jepsen::history::{Op, OpKind, Status};
use keel_jepsen::synth::{self, Shape, Workload};
use serde_json::{Value, json};

/// The largest shape of these tests: a few thousand ops, at most ~200 per key.
const SEQUENTIAL: Shape = Shape {
    ops: 5_000,
    keys: 40,
    clients: 5,
    sequential: true,
    info_per_mille: 0,
    seed: 1,
};

const CONCURRENT: Shape = Shape {
    ops: 5_000,
    keys: 40,
    clients: 10,
    sequential: false,
    info_per_mille: 20,
    seed: 2,
};

fn run(checker: CheckerName, history: &[Op]) -> Outcome {
    let input = Input {
        history,
        faults: &[],
        spec: None,
        replicas: None,
    };
    checker.run(input, &Budget::default())
}

fn check(checker: CheckerName, history: &[Op], expected: Verdict, needle: &str) {
    let outcome = run(checker, history);
    let details = serde_json::to_string(&outcome.details).unwrap();
    assert_eq!(
        outcome.result,
        expected,
        "{checker:?}: {}",
        outcome.summary()
    );
    assert!(details.contains(needle), "{needle:?} not in {details}");
}

/// The index of a confirmed read of `kind` past the middle of the history.
fn middle_read(history: &[Op], kind: OpKind) -> usize {
    (history.len() / 2..history.len())
        .find(|&i| history[i].op == kind && history[i].status() == Status::Ok)
        .expect("the history has reads")
}

#[test]
fn sequential_register_history_is_valid_and_a_stale_read_is_not() {
    let mut history = synth::history(Workload::Register, &SEQUENTIAL);
    assert_eq!(history.len(), 5_000);
    check(
        CheckerName::Register,
        &history,
        Verdict::Valid,
        "all 40 keys",
    );
    // Change one read to an older value of its key (a stale read).
    let read = middle_read(&history, OpKind::Get);
    let key = history[read].key.clone();
    let older = history[..read]
        .iter()
        .filter(|op| op.key == key && op.op == OpKind::Put && op.value != history[read].output)
        .map(|op| op.value.clone())
        .next_back()
        .expect("an earlier put of another value");
    history[read].output = older;
    let needle = format!(r#""record":{}"#, read + 1);
    check(CheckerName::Register, &history, Verdict::Invalid, &needle);
}

#[test]
fn concurrent_register_history_is_valid_and_a_phantom_read_is_not() {
    let mut history = synth::history(Workload::Register, &CONCURRENT);
    check(
        CheckerName::Register,
        &history,
        Verdict::Valid,
        "all 40 keys",
    );
    let read = middle_read(&history, OpKind::Get);
    history[read].output = json!("never-written");
    let needle = format!(r#""key":"{}""#, history[read].key);
    check(CheckerName::Register, &history, Verdict::Invalid, &needle);
}

#[test]
fn generated_append_history_is_valid_and_a_duplicate_is_not() {
    let mut history = synth::history(Workload::Append, &CONCURRENT);
    check(CheckerName::Append, &history, Verdict::Valid, "all 40 keys");
    let read = (history.len() / 2..history.len())
        .find(|&i| {
            history[i].status() == Status::Ok
                && history[i].output.as_array().is_some_and(|l| !l.is_empty())
        })
        .expect("a non-empty read");
    let Value::Array(list) = &mut history[read].output else {
        unreachable!("the read's output is a list");
    };
    list.push(list[0].clone());
    check(
        CheckerName::Append,
        &history,
        Verdict::Invalid,
        "appears twice",
    );
}

#[test]
fn generated_counter_history_is_valid_and_an_over_count_is_not() {
    let mut history = synth::history(Workload::Counter, &CONCURRENT);
    check(
        CheckerName::Counter,
        &history,
        Verdict::Valid,
        "all 40 keys",
    );
    let read = middle_read(&history, OpKind::Read);
    history[read].output = json!(history[read].output.as_i64().unwrap() + 1_000);
    check(
        CheckerName::Counter,
        &history,
        Verdict::Invalid,
        "over-count",
    );
}

#[test]
fn generated_histories_are_deterministic_per_seed() {
    let first = synth::history(Workload::Register, &CONCURRENT);
    let again = synth::history(Workload::Register, &CONCURRENT);
    let other = synth::history(
        Workload::Register,
        &Shape {
            seed: 3,
            ..CONCURRENT
        },
    );
    assert_eq!(first, again);
    assert_ne!(first, other);
}
