//! The round robin over the members, and what a failed raw call becomes in the history:
//! the same `ok` field keel-client's error would give (`outcome::write_status`).

use std::sync::Arc;

use keel_types::{NodeAddr, RangeId};
use prost::Message;
use tonic::{Code, Status};

use super::*;
use crate::history::Status as Recorded;
use crate::run::outcome;

fn turns(members: &[usize], count: u64) -> Vec<usize> {
    (0..count).map(|turn| round_robin(members, turn)).collect()
}

#[test]
fn round_robin_visits_every_member_once_per_cycle() {
    assert_eq!(turns(&[0, 1, 2], 7), [0, 1, 2, 0, 1, 2, 0]);
    // A drained or replaced node is skipped; spares that joined are visited.
    assert_eq!(turns(&[0, 2, 3], 4), [0, 2, 3, 0]);
    assert_eq!(turns(&[], 2), [0, 0]);
}

#[tokio::test]
async fn clients_start_on_different_members() {
    let members = Arc::new(Members::first(3));
    let firsts: Vec<usize> = (0..4)
        .map(|first| {
            let spread = Spread::new(&endpoints(), members.clone(), first).unwrap();
            spread.next_node()
        })
        .collect();
    assert_eq!(firsts, [0, 1, 2, 0]);
    let spread = Spread::new(&endpoints(), members.clone(), 0).unwrap();
    members.set(&[1, 2]);
    let next: Vec<usize> = (0..3).map(|_| spread.next_node()).collect();
    assert_eq!(next, [1, 2, 1]);
}

fn endpoints() -> Vec<String> {
    (1..=3).map(|i| format!("127.0.0.1:{}", 7000 + i)).collect()
}

fn with_detail(code: Code, error: &KvError) -> Status {
    let bytes = v1::ErrorDetail::from(error).encode_to_vec();
    Status::with_details(code, "detailed", bytes.into())
}

fn lost() -> Status {
    let mut status = Status::unknown("transport");
    status.set_source(Arc::new(std::io::Error::other("connection reset")));
    status
}

/// What a write whose call ended with `status` records: as keel-client's classification.
fn write_of(status: &Status) -> Recorded {
    outcome::write_status(&attempt_error(attempt::from_status(status)))
}

#[test]
fn failed_writes_are_fail_only_when_nothing_was_applied() {
    let not_leader = KvError::NotLeader {
        range_id: RangeId(1),
        leader: Some((2, NodeAddr::new("127.0.0.1:7002"))),
    };
    let unknown = KvError::OutcomeUnknown {
        message: "leader changed after proposing".into(),
    };
    let cases = [
        (with_detail(Code::Unavailable, &not_leader), Recorded::Fail),
        (
            with_detail(Code::Unavailable, &KvError::unavailable("no quorum")),
            Recorded::Fail,
        ),
        (Status::unavailable("a proxy: no upstream"), Recorded::Fail),
        (with_detail(Code::Unknown, &unknown), Recorded::Info),
        (
            with_detail(
                Code::DeadlineExceeded,
                &KvError::Timeout {
                    message: "commit".into(),
                },
            ),
            Recorded::Info,
        ),
        (
            with_detail(Code::Internal, &KvError::fatal("disk")),
            Recorded::Info,
        ),
        (lost(), Recorded::Info),
        (Status::internal("no detail"), Recorded::Info),
    ];
    for (status, expected) in cases {
        assert_eq!(write_of(&status), expected, "{status:?}");
    }
}

#[test]
fn client_side_failures_keep_apart_not_sent_and_maybe_applied() {
    let cases = [
        (AttemptError::NotSent("refused".into()), Recorded::Fail),
        (AttemptError::Lost("reset".into()), Recorded::Info),
        (AttemptError::TimedOut("2000 ms".into()), Recorded::Info),
    ];
    for (error, expected) in cases {
        let mapped = attempt_error(error.clone());
        assert_eq!(outcome::write_status(&mapped), expected, "{error:?}");
        assert_eq!(outcome::read_status(&mapped), Recorded::Fail, "{error:?}");
    }
}

#[test]
fn client_modes_round_trip() {
    for mode in [ClientMode::Routed, ClientMode::Spread, ClientMode::Etcd] {
        assert_eq!(mode.as_str().parse(), Ok(mode));
    }
    assert!(
        "leader"
            .parse::<ClientMode>()
            .unwrap_err()
            .contains("routed, spread, etcd")
    );
}
