//! The linearizability search out of budget: too many ops on a key, no time, no memo room.
//! Each must give `unknown` for that key, never `valid`, and an invalid key still wins.

use std::time::Duration;

use keel_jepsen::checker::{Budget, CheckerName, Input, Outcome, Verdict};
use keel_jepsen::history::Op;
use keel_jepsen::synth::{self, Shape, Workload};

/// One key, many clients: a hard search.
const CROWDED: Shape = Shape {
    ops: 150,
    keys: 1,
    clients: 12,
    sequential: false,
    info_per_mille: 100,
    seed: 9,
};

fn run(history: &[Op], budget: &Budget) -> Outcome {
    let input = Input {
        history,
        faults: &[],
        spec: None,
        replicas: None,
    };
    CheckerName::Register.run(input, budget)
}

fn check(history: &[Op], budget: Budget, expected: Verdict, needle: &str) {
    let outcome = run(history, &budget);
    assert_eq!(outcome.result, expected, "{}", outcome.summary());
    assert!(
        outcome.summary().contains(needle),
        "{needle:?} not in {}",
        outcome.summary()
    );
}

#[test]
fn out_of_budget_is_unknown_never_valid() {
    let crowded = synth::history(Workload::Register, &CROWDED);
    let long_key = synth::history(
        Workload::Register,
        &Shape {
            ops: 400,
            ..CROWDED
        },
    );
    let roomy = Budget::default();
    check(&crowded, roomy, Verdict::Valid, "all 1 keys linearizable");
    check(
        &long_key,
        roomy,
        Verdict::Unknown,
        "limit is 200 ops per key",
    );
    let tight_ops = Budget {
        key_ops_max: 10,
        ..roomy
    };
    check(
        &crowded,
        tight_ops,
        Verdict::Unknown,
        "limit is 10 ops per key",
    );
    let no_time = Budget {
        key_time: Duration::ZERO,
        ..roomy
    };
    check(&crowded, no_time, Verdict::Unknown, "time budget spent");
    let no_total = Budget {
        total_time: Duration::ZERO,
        ..roomy
    };
    check(&crowded, no_total, Verdict::Unknown, "time budget spent");
    let no_memo = Budget {
        memo_entries_max: 5,
        ..roomy
    };
    check(&crowded, no_memo, Verdict::Unknown, "limit is 5");
}

#[test]
fn an_invalid_key_outweighs_an_unknown_one() {
    let mut history = synth::history(
        Workload::Register,
        &Shape {
            ops: 400,
            ..CROWDED
        },
    );
    let stale = [
        r#"{"client":1,"op":"put","key":"z","value":"a","ok":true,"call":0,"return":1}"#,
        r#"{"client":1,"op":"get","key":"z","output":null,"ok":true,"call":2,"return":3}"#,
    ];
    history.extend(
        stale
            .iter()
            .map(|line| serde_json::from_str::<Op>(line).unwrap()),
    );
    check(
        &history,
        Budget::default(),
        Verdict::Invalid,
        "1 of 2 keys invalid, 1 unknown",
    );
}
