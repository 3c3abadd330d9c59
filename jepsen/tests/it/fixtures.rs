//! Every checker on every hand-written fixture under `jepsen/fixtures/<checker>/`: `good-*`
//! must be valid, `bad-*` invalid, and the details must name the culprit.

use std::path::{Path, PathBuf};

use clap::ValueEnum;
use keel_jepsen::check;
use keel_jepsen::checker::{Budget, CheckerName, Input, Outcome, Verdict};
use keel_jepsen::history::read_history;

use Verdict::{Invalid, Unknown, Valid};

/// (fixture under fixtures/, verdict, text the compact details JSON must contain).
const CASES: &[(&str, Verdict, &str)] = &[
    ("register/good-sequential.jsonl", Valid, "all 1 keys"),
    (
        "register/good-concurrent-writes-either-order.jsonl",
        Valid,
        "all 2 keys",
    ),
    (
        "register/good-read-concurrent-with-write.jsonl",
        Valid,
        "linearizable",
    ),
    (
        "register/good-indeterminate-write-explains-read.jsonl",
        Valid,
        "linearizable",
    ),
    (
        "register/good-indeterminate-write-never-applied.jsonl",
        Valid,
        "linearizable",
    ),
    (
        "register/good-failed-and-indeterminate-reads-ignored.jsonl",
        Valid,
        "linearizable",
    ),
    ("register/bad-stale-read.jsonl", Invalid, r#""record":3"#),
    (
        "register/bad-lost-acknowledged-write.jsonl",
        Invalid,
        r#"returned null"#,
    ),
    (
        "register/bad-failed-write-visible.jsonl",
        Invalid,
        r#"returned \"v2\""#,
    ),
    (
        "register/bad-cas-confirmed-against-wrong-value.jsonl",
        Invalid,
        "cas on",
    ),
    (
        "register/bad-read-from-the-future.jsonl",
        Invalid,
        r#""record":1"#,
    ),
    (
        "register/bad-concurrent-writes-seen-in-both-orders.jsonl",
        Invalid,
        r#""record":4"#,
    ),
    (
        "register/bad-unobserved-indeterminate-write-hides-nothing.jsonl",
        Invalid,
        "returned null",
    ),
    ("append/good-basic.jsonl", Valid, "all 2 keys consistent"),
    (
        "append/good-concurrent-appends-either-order.jsonl",
        Valid,
        "consistent",
    ),
    (
        "append/bad-duplicated-append.jsonl",
        Invalid,
        "appears twice",
    ),
    (
        "append/bad-lost-acknowledged-append.jsonl",
        Invalid,
        "the read lacks it",
    ),
    (
        "append/bad-reads-disagree-on-order.jsonl",
        Invalid,
        "disagree at position 0",
    ),
    (
        "append/bad-phantom-value.jsonl",
        Invalid,
        "9 was never appended",
    ),
    (
        "append/bad-failed-append-visible.jsonl",
        Invalid,
        "its append failed",
    ),
    ("append/bad-stale-read.jsonl", Invalid, "stale read"),
    (
        "append/bad-order-against-real-time.jsonl",
        Invalid,
        "is read nowhere",
    ),
    ("counter/good-basic.jsonl", Valid, "within bounds"),
    (
        "counter/good-indeterminate-increment.jsonl",
        Valid,
        "within bounds",
    ),
    (
        "counter/good-read-concurrent-with-increment.jsonl",
        Valid,
        "within bounds",
    ),
    (
        "counter/bad-double-applied-retry.jsonl",
        Invalid,
        "outside [3, 3] (over-count)",
    ),
    (
        "counter/bad-lost-increment.jsonl",
        Invalid,
        "outside [2, 2] (under-count)",
    ),
    (
        "counter/bad-failed-increment-applied.jsonl",
        Invalid,
        "outside [1, 1]",
    ),
    (
        "counter/bad-read-goes-backwards.jsonl",
        Invalid,
        "after an earlier read",
    ),
    (
        "follower-read/good-stale-but-converged.jsonl",
        Valid,
        "converged",
    ),
    (
        "follower-read/bad-phantom-value.jsonl",
        Invalid,
        "returned 2, which no put that did not fail wrote",
    ),
    (
        "follower-read/bad-read-before-put-called.jsonl",
        Invalid,
        "before the put of it was called",
    ),
    (
        "follower-read/bad-follower-read-goes-back.jsonl",
        Invalid,
        "node 3 returned 1 (revision 5) for key \\\"f0\\\" after returning 2 (revision 6)",
    ),
    (
        "follower-read/bad-node-never-converges.jsonl",
        Invalid,
        "node 2 did not converge",
    ),
    (
        "follower-read/good-bounded-reads-stale-within-their-bounds.jsonl",
        Valid,
        "within their bounds",
    ),
    (
        "follower-read/bad-bounded-read-below-its-min-revision.jsonl",
        Invalid,
        "at revision 6 returned 1 (revision 5)",
    ),
    (
        "follower-read/bad-bounded-read-staler-than-its-bound.jsonl",
        Invalid,
        "within 1 ms returned 1 (revision 5), older than a put acknowledged more than 1 ms before it (revision 6)",
    ),
    (
        "fencing/good-holds-handed-over-and-expired.jsonl",
        Valid,
        "1 locks held by one owner at a time with rising tokens, 1 keys fenced; 3 grants, 1 of 1 late writes fenced out",
    ),
    (
        "fencing/good-indeterminate-ops.jsonl",
        Valid,
        "2 locks held by one owner at a time",
    ),
    (
        "fencing/bad-two-holders.jsonl",
        Invalid,
        r#"lock \"lock-fk0\" held twice: c2-h1 was granted token 7 11.0 ms after c1-h0 asked for it (token 5, TTL 2000 ms)"#,
    ),
    (
        "fencing/bad-token-goes-back.jsonl",
        Invalid,
        "c2-h1 was granted token 6 3.0 ms after c1-h0 had been granted token 9",
    ),
    (
        "fencing/bad-fenced-write-goes-back.jsonl",
        Invalid,
        "a write with token 5 of lock",
    ),
    (
        "fencing/bad-final-read-shows-a-lower-token.jsonl",
        Invalid,
        "written with token 5, after a write with token 8",
    ),
    (
        "fencing/bad-final-read-shows-a-refused-write.jsonl",
        Invalid,
        r#"returned \"c1-h0-t5-n1\", whose fput failed"#,
    ),
    (
        "fencing/bad-lost-fenced-write.jsonl",
        Invalid,
        "found the key absent after the fput",
    ),
    (
        "idempotency/good-takeover-and-stale-complete-refused.jsonl",
        Valid,
        "2 ids with one result each (2 completed), one owner at a time with rising tokens; 4 starts (2 restarts), 1 of 1 late completes refused",
    ),
    (
        "idempotency/good-indeterminate-ops.jsonl",
        Valid,
        "2 ids with one result each (1 completed)",
    ),
    (
        "idempotency/bad-two-results.jsonl",
        Invalid,
        r#"record \"id0\" has two results: \"c0-a0-t5\" was answered 98.0 ms after \"c1-a1-t11\" had been"#,
    ),
    (
        "idempotency/bad-started-after-completed.jsonl",
        Invalid,
        r#"record \"id0\" was started again (token 14, c1-a1) 1894.0 ms after it was seen completed"#,
    ),
    (
        "idempotency/bad-complete-with-unstarted-token.jsonl",
        Invalid,
        "a complete by c1-a1 with token 5 was acknowledged, but no begin started the record for c1-a1",
    ),
    (
        "idempotency/bad-token-goes-back.jsonl",
        Invalid,
        "c1-a1 was started with token 6 16.0 ms after c0-a0 had been started with token 9",
    ),
    (
        "idempotency/bad-two-owners.jsonl",
        Invalid,
        r#"record \"id0\" started twice: c1-a1 was started with token 7 11.0 ms after c0-a0 began it (token 5, TTL 2000 ms)"#,
    ),
    (
        "coverage/good-all-healed",
        Valid,
        "all 2 requested fault kinds",
    ),
    ("coverage/good-nothing-requested", Valid, "all 0 requested"),
    (
        "coverage/bad-fault-never-happened",
        Invalid,
        r#"fault \"kill\" never happened"#,
    ),
    ("coverage/bad-fault-never-healed", Invalid, "never healed"),
];

/// A checker given a history of another workload must not pass it.
const FOREIGN: &[(CheckerName, &str)] = &[
    (CheckerName::Register, "append/good-basic.jsonl"),
    (CheckerName::Register, "counter/good-basic.jsonl"),
    (CheckerName::Append, "register/good-sequential.jsonl"),
    (CheckerName::Counter, "append/good-basic.jsonl"),
    (CheckerName::FollowerRead, "counter/good-basic.jsonl"),
    (CheckerName::Fencing, "register/good-sequential.jsonl"),
    (
        CheckerName::Idempotency,
        "fencing/good-holds-handed-over-and-expired.jsonl",
    ),
    (
        CheckerName::Fencing,
        "idempotency/good-takeover-and-stale-complete-refused.jsonl",
    ),
    (
        CheckerName::Register,
        "fencing/good-holds-handed-over-and-expired.jsonl",
    ),
];

fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

/// Runs `checker` on the fixture (a history file, or a run directory for coverage).
fn run(checker: CheckerName, fixture: &str) -> Outcome {
    let path = fixtures_dir().join(fixture);
    if checker == CheckerName::Coverage {
        let run = check::load(&path).unwrap();
        let input = Input {
            history: &[],
            faults: &run.faults,
            spec: run.spec.as_ref(),
            replicas: run.replicas.as_ref(),
        };
        return checker.run(input, &Budget::default());
    }
    let history = read_history(&path).unwrap();
    let input = Input {
        history: &history,
        faults: &[],
        spec: None,
        replicas: None,
    };
    checker.run(input, &Budget::default())
}

fn check(fixture: &str, expected: Verdict, needle: &str) {
    let name = fixture.split('/').next().unwrap();
    let checker = CheckerName::from_str(name, false).unwrap();
    let outcome = run(checker, fixture);
    let details = serde_json::to_string(&outcome.details).unwrap();
    assert_eq!(outcome.result, expected, "{fixture}: {details}");
    assert!(
        details.contains(needle),
        "{fixture}: {needle:?} not in {details}"
    );
}

#[test]
fn every_fixture_gets_its_verdict() {
    for (fixture, expected, needle) in CASES {
        check(fixture, *expected, needle);
    }
}

#[test]
fn every_fixture_on_disk_is_in_the_table() {
    let mut on_disk = Vec::new();
    for checker in std::fs::read_dir(fixtures_dir()).unwrap() {
        let checker = checker.unwrap();
        for fixture in std::fs::read_dir(checker.path()).unwrap() {
            let fixture = fixture.unwrap().file_name().into_string().unwrap();
            on_disk.push(format!(
                "{}/{fixture}",
                checker.file_name().to_str().unwrap()
            ));
        }
    }
    on_disk.sort();
    let mut listed: Vec<String> = CASES.iter().map(|c| c.0.to_string()).collect();
    listed.sort();
    assert_eq!(on_disk, listed);
    let good = CASES
        .iter()
        .filter(|c| c.0.contains("/good-"))
        .all(|c| c.1 == Valid);
    let bad = CASES
        .iter()
        .filter(|c| c.0.contains("/bad-"))
        .all(|c| c.1 == Invalid);
    assert!(good && bad, "good-* fixtures are valid and bad-* invalid");
}

#[test]
fn a_checker_never_passes_another_workloads_history() {
    for (checker, fixture) in FOREIGN {
        let outcome = run(*checker, fixture);
        assert_eq!(outcome.result, Unknown, "{checker:?} on {fixture}");
        assert!(outcome.summary().contains("does not model"), "{outcome:?}");
    }
}
