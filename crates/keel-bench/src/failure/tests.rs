//! The classes failures are counted under: by gRPC code and Keel detail for raw calls, by kind
//! for keel-client's errors.

use std::sync::Arc;

use keel_proto::v1;
use keel_types::{NodeAddr, RangeId};
use prost::Message;

use super::*;

fn with_detail(code: Code, error: &KvError) -> Status {
    let bytes = v1::ErrorDetail::from(error).encode_to_vec();
    Status::with_details(code, "detailed", bytes.into())
}

fn lost(code: Code) -> Status {
    let mut status = Status::new(code, "transport");
    status.set_source(Arc::new(std::io::Error::other("connection reset")));
    status
}

#[test]
fn statuses_are_counted_by_code_and_detail() {
    let not_leader = KvError::NotLeader {
        range_id: RangeId(1),
        leader: Some((2, NodeAddr::new("127.0.0.1:7002"))),
    };
    let cases = [
        (
            with_detail(Code::Unavailable, &not_leader),
            "UNAVAILABLE/not_leader",
        ),
        (
            with_detail(Code::Unavailable, &KvError::unavailable("no quorum")),
            "UNAVAILABLE/unavailable",
        ),
        (
            with_detail(
                Code::Unknown,
                &KvError::OutcomeUnknown {
                    message: "leader changed".into(),
                },
            ),
            "UNKNOWN/outcome_unknown",
        ),
        (Status::unavailable("no detail"), "UNAVAILABLE"),
        (Status::deadline_exceeded("slow"), "DEADLINE_EXCEEDED"),
        (lost(Code::Unknown), "UNKNOWN/lost"),
        (lost(Code::Unavailable), "UNAVAILABLE/lost"),
    ];
    for (status, expected) in cases {
        assert_eq!(Failure::from_status(&status).code, expected, "{status:?}");
    }
}

#[test]
fn client_errors_are_counted_by_kind() {
    let error = KvError::OutcomeUnknown {
        message: "deadline".into(),
    };
    let failure = Failure::from_kv(&error);
    assert_eq!(failure.code, "outcome_unknown");
    assert!(failure.message.contains("deadline"), "{failure}");
    assert_eq!(Failure::timed_out(10_000).code, "bench_timeout");
}
