//! The idempotency checker's rules one by one, on small histories written inline (times in
//! ms), with and without clock faults. The fixtures under `jepsen/fixtures/idempotency/`
//! cover whole histories.

use super::*;
use crate::checker::Verdict;
use crate::checker::lease::test_support::{self, clock_fault};

/// Checks `lines` with `faults`; the verdict must be `expected` and the compact details must
/// contain `needle`.
fn check_case(lines: &[&str], faults: &[FaultEvent], expected: Verdict, needle: &str) {
    test_support::check_case(check, lines, faults, expected, needle);
}

/// `begin` by `owner` at `call`..`ret` answered started with `token`, TTL 1000 ms.
fn started(owner: &str, token: u64, call: u64, ret: u64) -> String {
    format!(
        r#"{{"client":1,"op":"begin","key":"i","ok":true,"call":{call},"return":{ret},"owner":"{owner}","ttl_ms":1000,"state":"started","token":{token}}}"#
    )
}

/// A `complete` of `token` by `owner` sending `{owner}-t{token}`; `ok` is true, false or null
/// (null: no return), `answer` the result an ok one was answered.
fn complete(owner: &str, token: u64, ok: &str, call: u64, answer: &str) -> String {
    let ret = if ok == "null" {
        "null".to_string()
    } else {
        (call + 5).to_string()
    };
    let result = match ok {
        "true" => format!(r#","result":"{answer}""#),
        "false" => r#","error":"record-not-owned""#.to_string(),
        _ => String::new(),
    };
    format!(
        r#"{{"client":1,"op":"complete","key":"i","value":"{owner}-t{token}","ok":{ok},"call":{call},"return":{ret},"owner":"{owner}","token":{token},"result_ttl_ms":86400000{result}}}"#
    )
}

fn abort(owner: &str, token: u64, ok: &str, call: u64) -> String {
    let ret = if ok == "null" {
        "null".to_string()
    } else {
        (call + 5).to_string()
    };
    format!(
        r#"{{"client":1,"op":"abort","key":"i","ok":{ok},"call":{call},"return":{ret},"owner":"{owner}","token":{token}}}"#
    )
}

/// A final `get` at `call` that saw `result` (null: absent).
fn get(result: Option<&str>, call: u64) -> String {
    let (state, fields) = match result {
        Some(result) => (
            "completed",
            format!(r#","output":"{result}","result":"{result}""#),
        ),
        None => ("absent", String::new()),
    };
    format!(
        r#"{{"client":9,"op":"get","key":"i","ok":true,"call":{call},"return":{}{fields},"state":"{state}"}}"#,
        call + 2
    )
}

#[test]
fn a_takeover_after_the_ttl_with_the_stale_complete_refused_is_valid() {
    let lines = [
        started("a", 5, 0, 10),
        started("b", 8, 1_200, 1_210),
        complete("b", 8, "true", 1_300, "b-t8"),
        complete("a", 5, "false", 1_500, ""),
        get(Some("b-t8"), 2_000),
    ];
    let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
    check_case(
        &lines,
        &[],
        Verdict::Valid,
        "1 ids with one result each (1 completed)",
    );
}

#[test]
fn two_results_for_one_record_are_caught() {
    // The stale owner's complete was accepted over the taker's result.
    let lines = [
        started("a", 5, 0, 10),
        started("b", 8, 1_200, 1_210),
        complete("b", 8, "true", 1_300, "b-t8"),
        complete("a", 5, "true", 1_500, "a-t5"),
    ];
    let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
    check_case(
        &lines,
        &[],
        Verdict::Invalid,
        r#"record \"i\" has two results"#,
    );
    // An indeterminate stale complete may explain a read, but the read must agree with the
    // acknowledged result.
    let read_other = [
        started("a", 5, 0, 10),
        started("b", 8, 1_200, 1_210),
        complete("b", 8, "true", 1_300, "b-t8"),
        complete("a", 5, "null", 1_500, ""),
        get(Some("a-t5"), 2_000),
    ];
    let read_other: Vec<&str> = read_other.iter().map(String::as_str).collect();
    check_case(&read_other, &[], Verdict::Invalid, "two results");
}

#[test]
fn an_indeterminate_complete_may_explain_the_result() {
    let lines = [
        started("a", 5, 0, 10),
        complete("a", 5, "null", 100, ""),
        get(Some("a-t5"), 2_000),
    ];
    let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
    check_case(&lines, &[], Verdict::Valid, "1 completed");
    // A result nobody sent, or one sent by a complete that failed, is not.
    let phantom = [started("a", 5, 0, 10), get(Some("z-t1"), 2_000)];
    let phantom: Vec<&str> = phantom.iter().map(String::as_str).collect();
    check_case(&phantom, &[], Verdict::Invalid, "which no complete of it");
    let refused = [
        started("a", 5, 0, 10),
        complete("a", 5, "false", 100, ""),
        get(Some("a-t5"), 2_000),
    ];
    let refused: Vec<&str> = refused.iter().map(String::as_str).collect();
    check_case(&refused, &[], Verdict::Invalid, "which no complete of it");
}

#[test]
fn a_record_started_again_after_it_was_completed_is_caught() {
    let lines = [
        started("a", 5, 0, 10),
        complete("a", 5, "true", 100, "a-t5"),
        started("b", 9, 5_000, 5_010),
    ];
    let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
    check_case(&lines, &[], Verdict::Invalid, "started again (token 9, b)");
    // After an abort (even an indeterminate one) a new start is fine, and so is its result.
    let aborted = [
        started("a", 5, 0, 10),
        abort("a", 5, "null", 100),
        started("b", 9, 200, 210),
        complete("b", 9, "true", 300, "b-t9"),
        get(Some("b-t9"), 2_000),
    ];
    let aborted: Vec<&str> = aborted.iter().map(String::as_str).collect();
    check_case(&aborted, &[], Verdict::Valid, "1 restarts");
}

#[test]
fn a_complete_with_a_token_never_started_for_its_owner_is_caught() {
    let lines = [
        started("a", 5, 0, 10),
        complete("a", 6, "true", 100, "a-t6"),
    ];
    let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
    check_case(
        &lines,
        &[],
        Verdict::Invalid,
        "no begin started the record for a",
    );
}

#[test]
fn tokens_that_go_back_are_caught() {
    let lines = [
        started("a", 9, 0, 10),
        abort("a", 9, "true", 20),
        started("b", 7, 30, 40),
    ];
    let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
    check_case(&lines, &[], Verdict::Invalid, "b was started with token 7");
    // Concurrent starts are not ordered by (c).
    let concurrent = [
        started("a", 9, 0, 50),
        abort("a", 9, "true", 60),
        started("b", 7, 30, 40),
        abort("b", 7, "true", 41),
    ];
    let concurrent: Vec<&str> = concurrent.iter().map(String::as_str).collect();
    check_case(&concurrent, &[], Verdict::Valid, "");
}

#[test]
fn a_second_owner_inside_the_ttl_is_caught_unless_excused() {
    let two = [started("a", 5, 0, 10), started("b", 8, 100, 500)];
    let two: Vec<&str> = two.iter().map(String::as_str).collect();
    check_case(&two, &[], Verdict::Invalid, r#"record \"i\" started twice"#);
    // An abort or complete of A's token called before B returned ends A's hold, whether it is
    // known to have happened or not; a failed one does not.
    for (ok, expected) in [
        ("true", Verdict::Valid),
        ("null", Verdict::Valid),
        ("false", Verdict::Invalid),
    ] {
        let lines = [
            started("a", 5, 0, 10),
            abort("a", 5, ok, 50),
            started("b", 8, 100, 500),
        ];
        let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
        check_case(&lines, &[], expected, "");
    }
    // Past the TTL less its margins (985 ms for 1000) the takeover is fine.
    let late = [started("a", 5, 0, 10), started("b", 8, 900, 990)];
    let late: Vec<&str> = late.iter().map(String::as_str).collect();
    check_case(&late, &[], Verdict::Valid, "");
    // A clock fault over the pair excuses it; one long before does not.
    check_case(
        &two,
        &[clock_fault(200, 300)],
        Verdict::Valid,
        "\"pairs_excused_by_clock_faults\":1",
    );
    check_case(&two, &[clock_fault(0, 1)], Verdict::Valid, "");
    let far = clock_fault(0, 1);
    let later: Vec<String> = [
        started("a", 5, 10_000, 10_010),
        started("b", 8, 10_100, 10_500),
    ]
    .into();
    let later: Vec<&str> = later.iter().map(String::as_str).collect();
    check_case(&later, &[far], Verdict::Invalid, "started twice");
}

#[test]
fn results_that_may_expire_within_the_run_make_the_id_unknown() {
    let short = complete("a", 5, "true", 100, "a-t5").replace("86400000", "1000");
    let lines = [started("a", 5, 0, 10), short, get(Some("a-t5"), 5_000)];
    let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
    check_case(
        &lines,
        &[],
        Verdict::Unknown,
        "needs results to outlive the run",
    );
}

#[test]
fn ops_missing_a_field_make_the_id_unknown_and_other_ops_are_foreign() {
    let no_token = started("a", 5, 0, 10).replace(r#","token":5"#, "");
    check_case(
        &[&no_token],
        &[],
        Verdict::Unknown,
        "lacks the integer field \\\"token\\\"",
    );
    let foreign = r#"{"client":1,"op":"put","key":"i","value":1,"ok":true,"call":0,"return":1}"#;
    check_case(&[foreign], &[], Verdict::Unknown, "does not model");
}
