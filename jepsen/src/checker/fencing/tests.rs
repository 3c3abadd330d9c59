//! The fencing checker's rules one by one, on small histories written inline (times in ms),
//! with and without clock faults. The fixtures under `jepsen/fixtures/fencing/` cover whole
//! histories.

use serde_json::{Value, json};

use super::*;
use crate::checker::Verdict;
use crate::checker::lease::lease_ns;
use crate::checker::lease::test_support::{self, clock_fault};

/// Checks `lines` with `faults`; the verdict must be `expected` and the compact details must
/// contain `needle`.
fn check_case(lines: &[&str], faults: &[FaultEvent], expected: Verdict, needle: &str) -> Value {
    test_support::check_case(check, lines, faults, expected, needle)
}

/// A holds lock L (token 5, TTL 1000 ms) from 0 ms; B is granted token 9 at 500 ms.
const A_GRANTED: &str = r#"{"client":1,"op":"acquire","key":"L","ok":true,"call":0,"return":10,"owner":"a","ttl_ms":1000,"token":5}"#;
const B_GRANTED_EARLY: &str = r#"{"client":2,"op":"acquire","key":"L","ok":true,"call":100,"return":500,"owner":"b","ttl_ms":1000,"token":9}"#;

#[test]
fn a_lease_lasts_its_ttl_less_the_margins() {
    assert_eq!(lease_ns(1000), 985_000_000);
    assert_eq!(lease_ns(1), 0);
    assert_eq!(
        lease_ns(u64::MAX),
        u64::MAX - u64::MAX / 1000 * 10 - 5_000_000
    );
}

#[test]
fn a_second_holder_inside_the_lease_is_caught_unless_excused() {
    let release = |ok: &str, call: u64| {
        format!(
            r#"{{"client":1,"op":"release","key":"L","ok":{ok},"call":{call},"return":{},"token":5}}"#,
            if ok == "null" {
                "null".to_string()
            } else {
                (call + 5).to_string()
            }
        )
    };
    let two = [A_GRANTED, B_GRANTED_EARLY];
    check_case(&two, &[], Verdict::Invalid, "lock \\\"L\\\" held twice");
    // A release called before B returned ends the hold, whether it is known to have
    // happened or not; one that failed does not.
    for (ok, expected) in [
        ("true", Verdict::Valid),
        ("null", Verdict::Valid),
        ("false", Verdict::Invalid),
    ] {
        let release = release(ok, 400);
        check_case(&[A_GRANTED, &release, B_GRANTED_EARLY], &[], expected, "");
    }
    // A clock fault over the pair excuses it; one long before does not.
    let details = check_case(&two, &[clock_fault(200, 300)], Verdict::Valid, "");
    assert_eq!(details["stats"]["pairs_excused_by_clock_faults"], json!(1));
    check_case(&two, &[clock_fault(0, 1)], Verdict::Valid, "");
    let never_healed = FaultEvent {
        stop_ns: None,
        ..clock_fault(400, 400)
    };
    check_case(&two, &[never_healed], Verdict::Valid, "");
    let far = clock_fault(10_000, 11_000);
    check_case(&two, &[far], Verdict::Invalid, "held twice");
}

#[test]
fn grants_after_expiry_or_to_the_same_owner_are_fine() {
    let after_expiry = r#"{"client":2,"op":"acquire","key":"L","ok":true,"call":100,"return":990,"owner":"b","ttl_ms":1000,"token":9}"#;
    check_case(
        &[A_GRANTED, after_expiry],
        &[],
        Verdict::Valid,
        "1 locks held",
    );
    let same_owner = r#"{"client":2,"op":"acquire","key":"L","ok":true,"call":100,"return":500,"owner":"a","ttl_ms":1000,"token":5}"#;
    check_case(&[A_GRANTED, same_owner], &[], Verdict::Valid, "2 grants");
    // A re-acquire by A's owner sets a new TTL, which may be shorter: B is not judged
    // against A's first one.
    let again = r#"{"client":1,"op":"acquire","key":"L","ok":null,"call":200,"return":null,"owner":"a","ttl_ms":10}"#;
    check_case(
        &[A_GRANTED, again, B_GRANTED_EARLY],
        &[],
        Verdict::Valid,
        "",
    );
    // An indeterminate acquire holds nothing the checker relies on.
    let unknown = r#"{"client":3,"op":"acquire","key":"L","ok":null,"call":0,"return":null,"owner":"c","ttl_ms":1000}"#;
    check_case(&[unknown, B_GRANTED_EARLY], &[], Verdict::Valid, "");
}

#[test]
fn tokens_must_rise_across_owners_in_real_time() {
    let lower_later = r#"{"client":2,"op":"acquire","key":"L","ok":true,"call":2000,"return":2010,"owner":"b","ttl_ms":1000,"token":4}"#;
    check_case(
        &[A_GRANTED, lower_later],
        &[],
        Verdict::Invalid,
        "b was granted token 4",
    );
    let equal_later = lower_later.replace("\"token\":4", "\"token\":5");
    check_case(
        &[A_GRANTED, &equal_later],
        &[],
        Verdict::Invalid,
        "after a had been granted token 5",
    );
    // Concurrent grants may come in either order (b's short TTL keeps rule (b) out of it).
    let concurrent = r#"{"client":2,"op":"acquire","key":"L","ok":true,"call":5,"return":2010,"owner":"b","ttl_ms":1,"token":4}"#;
    check_case(&[A_GRANTED, concurrent], &[], Verdict::Valid, "");
    // With b's TTL running, b (token 4, so granted first) held the lock when a was granted.
    let holding = concurrent.replace("\"ttl_ms\":1,", "\"ttl_ms\":1000,");
    check_case(
        &[A_GRANTED, &holding],
        &[],
        Verdict::Invalid,
        "a was granted token 5 5.0 ms after b asked",
    );
}

#[test]
fn a_token_never_goes_back_and_is_shared_only_by_its_owner() {
    // Grants of a (tokens 3, then 8) and b (token 6) returned before the last one is asked.
    let grant = |owner: &str, token: u64, call: u64| {
        format!(
            r#"{{"client":1,"op":"acquire","key":"L","ok":true,"call":{call},"return":{},"owner":"{owner}","ttl_ms":1,"token":{token}}}"#,
            call + 1
        )
    };
    let earlier = [grant("a", 3, 0), grant("b", 6, 10), grant("a", 8, 20)];
    let cases = [
        (
            grant("a", 7, 100),
            Verdict::Invalid,
            "a was granted token 7 79.0 ms after a had been granted token 8",
        ),
        (
            grant("c", 8, 100),
            Verdict::Invalid,
            "c was granted token 8",
        ),
        (
            grant("b", 8, 100),
            Verdict::Invalid,
            "b was granted token 8",
        ),
        (grant("a", 8, 100), Verdict::Valid, "4 grants"),
        (grant("c", 9, 100), Verdict::Valid, "4 grants"),
    ];
    for (last, expected, needle) in cases {
        let mut lines: Vec<&str> = earlier.iter().map(String::as_str).collect();
        lines.push(&last);
        check_case(&lines, &[], expected, needle);
    }
}

#[test]
fn fenced_writes_and_final_reads() {
    let put = |value: &str, token: u64, ok: &str, call: u64, ret: &str| {
        format!(
            r#"{{"client":1,"op":"fput","key":"K","value":"{value}","ok":{ok},"call":{call},"return":{ret},"lock":"L","token":{token}}}"#
        )
    };
    let get = |output: &str, call: u64| {
        format!(
            r#"{{"client":9,"op":"get","key":"K","ok":true,"output":{output},"call":{call},"return":{}}}"#,
            call + 1
        )
    };
    let high = put("v9", 9, "true", 0, "10");
    let low = put("v5", 5, "true", 20, "30");
    let low_unknown = put("v5", 5, "null", 20, "null");
    let refused = put("v4", 4, "false", 20, "30");
    let cases: [(&[&str], Verdict, &str); 9] = [
        (
            &[&high, &low],
            Verdict::Invalid,
            "a write with token 5 of lock \\\"L\\\" was acknowledged after one with token 9",
        ),
        (
            &[&high, &low_unknown, &get("\"v5\"", 100)],
            Verdict::Invalid,
            "written with token 5, after a write with token 9",
        ),
        (
            &[&low_unknown, &get("\"v5\"", 100)],
            Verdict::Valid,
            "1 keys fenced",
        ),
        (
            &[&high, &refused, &get("\"v4\"", 100)],
            Verdict::Invalid,
            "whose fput failed",
        ),
        (
            &[&high, &get("\"v7\"", 100)],
            Verdict::Invalid,
            "which no fput of the key wrote",
        ),
        (
            &[&high, &get("null", 100)],
            Verdict::Invalid,
            "found the key absent",
        ),
        (&[&high, &get("null", 5)], Verdict::Valid, ""),
        (&[&high, &get("\"v9\"", 100)], Verdict::Valid, ""),
        (
            &[&put("v9", 9, "null", 50, "null"), &get("\"v9\"", 10)],
            Verdict::Invalid,
            "before the fput of it was called",
        ),
    ];
    for (lines, expected, needle) in cases {
        check_case(lines, &[], expected, needle);
    }
}

#[test]
fn missing_fields_and_repeated_values_make_a_group_unknown() {
    let no_token = r#"{"client":1,"op":"acquire","key":"L","ok":true,"call":0,"return":10,"owner":"a","ttl_ms":1000}"#;
    check_case(
        &[no_token],
        &[],
        Verdict::Unknown,
        "lacks the integer field \\\"token\\\"",
    );
    let put = r#"{"client":1,"op":"fput","key":"K","value":"v","ok":null,"call":0,"return":null,"lock":"L","token":3}"#;
    check_case(&[put, put], &[], Verdict::Unknown, "write the same value");
    let foreign = r#"{"client":1,"op":"renew","key":"L","ok":true,"call":0,"return":10}"#;
    check_case(&[foreign], &[], Verdict::Unknown, "does not model");
}

#[test]
fn late_and_fenced_out_writes_are_counted() {
    let late = r#"{"client":1,"op":"fput","key":"K","value":"v","ok":false,"call":0,"return":3,"lock":"L","token":3,"late":true,"error":"fenced-out"}"#;
    let details = check_case(
        &[late],
        &[],
        Verdict::Valid,
        "1 of 1 late writes fenced out",
    );
    assert_eq!(
        details["stats"]["late_fputs"],
        json!({"ok": 0, "fail": 1, "info": 0})
    );
    assert_eq!(details["stats"]["fputs_fenced_out"], json!(1));
}
