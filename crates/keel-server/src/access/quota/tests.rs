use std::time::Instant;

use keel_types::coordination::{Acquirer, CoordinationOp};
use keel_types::{BatchOp, limits};

use super::*;

fn keys(keys: u64) -> Amount {
    Amount { keys, bytes: 0 }
}

const KEYS_50: Limits = Limits {
    keys: Some(50),
    bytes: None,
};

/// One range: (live, reserved, growth) -> admitted.
#[test]
fn a_namespace_of_one_range_is_held_to_its_quota_with_reservations() {
    let cases = [
        (0, 0, 1, true),
        (49, 0, 1, true),
        (50, 0, 1, false),
        (49, 1, 1, false),
        (0, 0, 50, true),
        (0, 0, 51, false),
        (0, 0, 128, false),
        (20, 29, 1, true),
        (20, 30, 1, false),
        // Adding nothing (a delete) passes even over the quota.
        (60, 5, 0, true),
    ];
    for (live, reserved, growth, admitted) in cases {
        let standing = Standing {
            live: keys(live),
            reserved: keys(reserved),
            ..Standing::default()
        };
        let judged = judge(&standing, keys(growth), KEYS_50);
        assert_eq!(
            judged.is_ok(),
            admitted,
            "live {live} reserved {reserved} growth {growth}: {judged:?}"
        );
        if let Err(refusal) = judged {
            assert_eq!(
                refusal,
                Refusal {
                    quota: "keys",
                    limit: 50
                }
            );
        }
    }
}

/// Several ranges: (reported here, others, other ranges, live, growth) -> admitted.
#[test]
fn a_namespace_of_several_ranges_shares_the_room_the_table_leaves() {
    let cases = [
        // Two empty ranges: 25 each.
        (Some(0), 0, 1, 24, 1, true),
        (Some(0), 0, 1, 25, 1, false),
        // 10 here and 30 there: 10 left, 5 each.
        (Some(10), 30, 1, 14, 1, true),
        (Some(10), 30, 1, 15, 1, false),
        // Rounded up: 1 left over 2 ranges lets each add 1.
        (Some(25), 24, 1, 25, 1, true),
        (Some(25), 24, 1, 26, 1, false),
        // A range the table does not know yet counts as empty, one more range.
        (None, 20, 1, 14, 1, true),
        (None, 20, 1, 15, 1, false),
        // The others are full: nothing more here, whatever the live count.
        (Some(0), 50, 2, 0, 1, false),
    ];
    for (reported, others, other_ranges, live, growth, admitted) in cases {
        let standing = Standing {
            live: keys(live),
            reported: reported.map(keys),
            others: keys(others),
            other_ranges,
            ..Standing::default()
        };
        let judged = judge(&standing, keys(growth), KEYS_50);
        assert_eq!(
            judged.is_ok(),
            admitted,
            "{standing:?} + {growth}: {judged:?}"
        );
    }
}

/// Whatever each of `k` ranges judging by the same table admits, their sum stays within
/// the quota plus `k - 1`.
#[test]
fn ranges_judging_by_one_table_stay_within_the_quota_plus_one_per_extra_range() {
    for k in 1..=5u64 {
        for filled in [0u64, 7, 30, 49, 50] {
            let per_range = filled / k;
            let mut total = 0;
            for _ in 0..k {
                let mut live = per_range;
                let standing = |live| Standing {
                    live: keys(live),
                    reported: Some(keys(per_range)),
                    others: keys(per_range * (k - 1)),
                    other_ranges: k - 1,
                    ..Standing::default()
                };
                while judge(&standing(live), keys(1), KEYS_50).is_ok() {
                    live += 1;
                }
                total += live;
            }
            assert!(total < 50 + k, "{k} ranges, {filled} filled: {total}");
        }
    }
}

#[test]
fn bytes_are_judged_apart_from_keys() {
    let limits = Limits {
        keys: Some(50),
        bytes: Some(1000),
    };
    let standing = Standing {
        live: Amount {
            keys: 1,
            bytes: 900,
        },
        reserved: Amount { keys: 0, bytes: 50 },
        ..Standing::default()
    };
    let fits = Amount { keys: 1, bytes: 50 };
    assert_eq!(judge(&standing, fits, limits), Ok(()));
    let over = Amount { keys: 1, bytes: 51 };
    let refusal = Refusal {
        quota: "bytes",
        limit: 1000,
    };
    assert_eq!(judge(&standing, over, limits), Err(refusal));
    let unlimited = Limits::default();
    assert_eq!(judge(&standing, keys(u64::MAX), unlimited), Ok(()));
}

fn put(key: &str, value: &str) -> BatchOp {
    BatchOp::Put {
        key: key.as_bytes().to_vec(),
        value: value.as_bytes().to_vec(),
        condition: None,
        return_previous: false,
        ttl_ms: None,
    }
}

#[test]
fn every_op_of_a_batch_counts() {
    let delete = BatchOp::Delete {
        key: b"gone".to_vec(),
        condition: None,
        return_previous: false,
    };
    let increment = BatchOp::Increment {
        key: b"n".to_vec(),
        delta: 1,
    };
    let ops = vec![put("a", "xy"), delete, increment, put("bb", "")];
    let expected = Amount {
        keys: 3,
        bytes: 3 + (1 + limits::COUNTER_VALUE_BYTES_MAX as u64) + 2,
    };
    assert_eq!(mutation_growth(&ops, None), expected);
    let batch: Vec<BatchOp> = (0..128).map(|i| put(&format!("k{i:03}"), "v")).collect();
    assert_eq!(mutation_growth(&batch, None).keys, 128);
    let fenced = mutation_growth(&[put("a", "xy")], Some(b"lock"));
    let fence_bytes = (1 + 4 + limits::QUOTA_ROW_OVERHEAD_BYTES) as u64;
    assert_eq!(
        fenced,
        Amount {
            keys: 2,
            bytes: 3 + fence_bytes
        }
    );
}

#[test]
fn locks_and_idempotency_records_count_with_their_results() {
    let overhead = limits::QUOTA_ROW_OVERHEAD_BYTES as u64;
    let acquire = CoordinationOp::Acquire {
        name: b"job".to_vec(),
        acquirer: Acquirer {
            owner: b"w1".to_vec(),
            ttl_ms: 1000,
            lock_delay_ms: 0,
        },
    };
    assert_eq!(
        coordination_growth(&acquire),
        Amount {
            keys: 1,
            bytes: 5 + overhead
        }
    );
    let begin = CoordinationOp::Begin {
        key: b"scope\0id".to_vec(),
        owner: b"me".to_vec(),
        ttl_ms: 1000,
    };
    assert_eq!(coordination_growth(&begin).keys, 1);
    let complete = CoordinationOp::Complete {
        key: b"scope\0id".to_vec(),
        token: 3,
        result: vec![7; limits::IDEMPOTENCY_RESULT_BYTES_MAX],
        result_ttl_ms: 1000,
    };
    let result_bytes = limits::IDEMPOTENCY_RESULT_BYTES_MAX as u64;
    assert_eq!(
        coordination_growth(&complete),
        Amount {
            keys: 0,
            bytes: result_bytes
        }
    );
    let renew = CoordinationOp::Renew {
        name: b"job".to_vec(),
        token: 3,
        ttl_ms: 1000,
    };
    assert!(coordination_growth(&renew).is_zero());
}

/// (tokens drawn, seconds since the start) -> what the draw found, at 50 per second.
#[test]
fn a_bucket_draws_a_token_per_op_and_refuses_what_it_can_never_hold() {
    let mut bucket = TokenBucket::new(Some(50));
    let start = Instant::now();
    let at = |secs: f64| start + std::time::Duration::from_secs_f64(secs);
    let steps = [
        (128, 0.0, Draw::TooLarge),
        (51, 0.0, Draw::TooLarge),
        (50, 0.0, Draw::Taken),
        (1, 0.0, Draw::Empty),
        (10, 0.1, Draw::Empty),
        (5, 0.1, Draw::Taken),
        (50, 10.0, Draw::Taken),
        // A clock read out of order refills nothing.
        (1, 9.0, Draw::Empty),
    ];
    for (tokens, secs, expected) in steps {
        assert_eq!(
            bucket.take(tokens, at(secs)),
            expected,
            "{tokens} at {secs}"
        );
    }
    let mut unlimited = TokenBucket::new(None);
    assert_eq!(unlimited.take(u32::MAX, start), Draw::Taken);
}
