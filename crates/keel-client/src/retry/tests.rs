//! Table tests of the retry policy.

use super::*;
use keel_types::{ConditionFailed, RangeDescriptor, RangeId};

#[derive(Debug, PartialEq)]
enum Want {
    Hinted,
    Next,
    Same,
    Refresh,
    Renew,
    Gives(&'static str),
}

fn kind(error: &KvError) -> &'static str {
    match error {
        KvError::InvalidArgument { .. } => "invalid",
        KvError::NotLeader { .. } => "not leader",
        KvError::ConditionFailed(_) => "condition failed",
        KvError::Unavailable { .. } => "unavailable",
        KvError::Timeout { .. } => "timeout",
        KvError::OutcomeUnknown { .. } => "outcome unknown",
        KvError::Fatal { .. } => "fatal",
        KvError::RequestIdExpired { .. } => "expired",
        KvError::NotACounter { .. } => "not a counter",
        KvError::Overflow { .. } => "overflow",
        KvError::Overloaded { .. } => "overloaded",
        KvError::FencedOut { .. } => "fenced out",
        KvError::LockNotHeld { .. } => "lock not held",
        KvError::RecordNotOwned { .. } => "record not owned",
        KvError::KeyOutOfRange { .. } => "key out of range",
        KvError::EpochMismatch { .. } => "epoch mismatch",
        KvError::Unauthenticated { .. } => "unauthenticated",
        KvError::PermissionDenied { .. } => "permission denied",
        KvError::QuotaExceeded { .. } => "quota exceeded",
        KvError::FutureRevision { .. } => "future revision",
        KvError::Compacted { .. } => "compacted",
        KvError::LeaseNotFound { .. } => "lease not found",
    }
}

fn want_target(target: &Target) -> Want {
    match target {
        Target::Hinted(_) => Want::Hinted,
        Target::Next => Want::Next,
        Target::Same => Want::Same,
        Target::Refresh => Want::Refresh,
    }
}

fn server(error: KvError) -> AttemptError {
    AttemptError::Server(error)
}

fn not_leader(addr: Option<&str>) -> AttemptError {
    server(KvError::NotLeader {
        range_id: RangeId(1),
        leader: addr.map(|addr| (2, NodeAddr::new(addr))),
    })
}

fn hinted() -> AttemptError {
    not_leader(Some("127.0.0.1:7002"))
}

fn lost() -> AttemptError {
    AttemptError::Lost("reset".into())
}

fn timed_out() -> AttemptError {
    AttemptError::TimedOut("5 s".into())
}

/// Given up after another replica named a new leader.
fn superseded() -> AttemptError {
    AttemptError::Superseded {
        message: "node 1 quiet; node 3 names node 2".into(),
        leader: NodeAddr::new("127.0.0.1:7002"),
    }
}

fn refused() -> AttemptError {
    AttemptError::NotSent("refused".into())
}

fn timeout() -> AttemptError {
    server(KvError::Timeout {
        message: "t".into(),
    })
}

fn unknown() -> AttemptError {
    server(KvError::OutcomeUnknown {
        message: "u".into(),
    })
}

fn expired() -> AttemptError {
    server(KvError::RequestIdExpired {
        client_id: 7,
        sequence: 3,
    })
}

fn overloaded() -> AttemptError {
    server(KvError::Overloaded {
        message: "sessions".into(),
    })
}

fn failed() -> AttemptError {
    server(KvError::from(ConditionFailed {
        op_index: 0,
        key: b"k".to_vec(),
        current: None,
        revision: 3,
    }))
}

fn not_a_counter() -> AttemptError {
    server(KvError::NotACounter { key: b"n".to_vec() })
}

fn fenced_out() -> AttemptError {
    server(KvError::FencedOut {
        key: b"k".to_vec(),
        lock: b"l".to_vec(),
        current_token: 9,
    })
}

fn lock_not_held() -> AttemptError {
    server(KvError::LockNotHeld {
        name: b"l".to_vec(),
        token: 3,
        current_token: Some(9),
    })
}

fn record_not_owned() -> AttemptError {
    server(KvError::RecordNotOwned {
        scope: b"s".to_vec(),
        id: b"i".to_vec(),
        token: 3,
        current_token: None,
    })
}

/// Range 2 as it is now: `["a", "m")`.
fn range_now() -> Box<RangeDescriptor> {
    Box::new(RangeDescriptor {
        id: RangeId(2),
        start: b"a".to_vec(),
        end: Some(b"m".to_vec()),
        epoch: 4,
        conf_version: 1,
        replicas: vec![1, 2, 3],
    })
}

fn out_of_range() -> AttemptError {
    server(KvError::KeyOutOfRange {
        key: b"q".to_vec(),
        range: range_now(),
    })
}

fn epoch_mismatch() -> AttemptError {
    server(KvError::EpochMismatch {
        expected_epoch: 3,
        range: range_now(),
    })
}

fn overflow() -> AttemptError {
    server(KvError::Overflow {
        key: b"n".to_vec(),
        current: i64::MAX,
        delta: 1,
    })
}

#[test]
fn reads_retry_everything_but_final_answers_within_their_attempts() {
    let max = limits::CLIENT_READ_ATTEMPTS_MAX;
    use Want::*;
    let cases: Vec<(AttemptError, u32, Want)> = vec![
        (hinted(), 1, Hinted),
        (not_leader(Some("")), 1, Next),
        (not_leader(None), 1, Next),
        (server(KvError::unavailable("no quorum")), 1, Next),
        (refused(), 1, Next),
        (lost(), 1, Next),
        (timed_out(), 1, Next),
        (superseded(), 1, Hinted),
        (timeout(), 1, Next),
        (server(KvError::fatal("disk")), 1, Next),
        (overloaded(), 1, Same),
        // The wrong range: refresh the table and route again.
        (out_of_range(), 1, Refresh),
        (epoch_mismatch(), 1, Refresh),
        (out_of_range(), max, Gives("unavailable")),
        (
            server(KvError::invalid("key is empty")),
            1,
            Gives("invalid"),
        ),
        (lock_not_held(), 1, Gives("lock not held")),
        (record_not_owned(), 1, Gives("record not owned")),
        // Asked for a revision the range has not reached, from a replica that caught up.
        (
            server(KvError::FutureRevision {
                requested: 9,
                current: 7,
            }),
            1,
            Gives("future revision"),
        ),
        // Asked for history from a revision the replica no longer keeps.
        (
            server(KvError::Compacted {
                requested: 2,
                compact_revision: 5,
            }),
            1,
            Gives("compacted"),
        ),
        // A lease that is gone stays gone.
        (
            server(KvError::LeaseNotFound { id: 3 }),
            1,
            Gives("lease not found"),
        ),
        (hinted(), max - 1, Hinted),
        (hinted(), max, Gives("unavailable")),
        (refused(), max, Gives("unavailable")),
        (timed_out(), max, Gives("timeout")),
        (superseded(), max, Gives("timeout")),
        (lost(), max, Gives("unavailable")),
        (overloaded(), max, Gives("overloaded")),
    ];
    for (error, attempt, want) in cases {
        let got = match decide_read(&error, attempt) {
            Decision::Retry { target } => want_target(&target),
            Decision::GiveUp(error) => Gives(kind(&error)),
        };
        assert_eq!(got, want, "{error:?} attempt={attempt}");
    }
}

/// Runs `decide_write` for attempt `attempts` from `progress`; returns the decision and
/// whether the write may have been applied afterwards.
fn write(error: &AttemptError, mut progress: WriteProgress) -> (Want, bool) {
    let got = match decide_write(error, &mut progress) {
        WriteDecision::Retry { target } => want_target(&target),
        WriteDecision::Renew => Want::Renew,
        WriteDecision::GiveUp(error) => Want::Gives(kind(&error)),
    };
    (got, progress.maybe_applied)
}

#[test]
fn writes_retry_with_the_same_id_unless_the_answer_is_final() {
    let first = WriteProgress {
        attempts: 1,
        ..WriteProgress::default()
    };
    use Want::*;
    let cases: Vec<(AttemptError, Want, bool)> = vec![
        // Not applied: retry, nothing learned.
        (hinted(), Hinted, false),
        (not_leader(None), Next, false),
        (server(KvError::unavailable("no quorum")), Next, false),
        (refused(), Next, false),
        (overloaded(), Same, false),
        // The wrong range refused before storing a record: same id, after a refresh.
        (out_of_range(), Refresh, false),
        (epoch_mismatch(), Refresh, false),
        // Maybe applied: retry elsewhere, and remember it may have been applied.
        (lost(), Next, true),
        (timed_out(), Next, true),
        // To the leader another replica named, as a write that may have been applied.
        (superseded(), Hinted, true),
        (timeout(), Next, true),
        (unknown(), Next, true),
        (server(KvError::fatal("disk")), Next, true),
        // Final answers are returned as they are.
        (
            server(KvError::invalid("key is empty")),
            Gives("invalid"),
            false,
        ),
        (failed(), Gives("condition failed"), false),
        (not_a_counter(), Gives("not a counter"), false),
        (overflow(), Gives("overflow"), false),
        // A lock or record that moved on does not come back by resending: final too.
        (fenced_out(), Gives("fenced out"), false),
        (lock_not_held(), Gives("lock not held"), false),
        (record_not_owned(), Gives("record not owned"), false),
        // An expired id before anything may have been applied: a new session, once.
        (expired(), Renew, false),
    ];
    for (error, want, maybe_applied) in cases {
        assert_eq!(write(&error, first), (want, maybe_applied), "{error:?}");
    }
}

#[test]
fn an_expired_id_is_renewed_once_and_never_after_a_maybe_applied_attempt() {
    let after_lost = WriteProgress {
        attempts: 2,
        maybe_applied: true,
        renewed: false,
    };
    let after_renew = WriteProgress {
        attempts: 2,
        maybe_applied: false,
        renewed: true,
    };
    let after_refused = WriteProgress {
        attempts: 3,
        ..WriteProgress::default()
    };
    assert_eq!(write(&expired(), after_lost).0, Want::Gives("expired"));
    assert_eq!(write(&expired(), after_renew).0, Want::Gives("expired"));
    assert_eq!(write(&expired(), after_refused).0, Want::Renew);
}

fn over_quota() -> AttemptError {
    server(KvError::QuotaExceeded {
        tenant: "acme".into(),
        quota: "requests_per_sec".into(),
        limit: 10,
    })
}

#[test]
fn a_refusal_at_the_door_is_final_unless_an_earlier_attempt_may_have_been_applied() {
    let first = WriteProgress {
        attempts: 1,
        ..WriteProgress::default()
    };
    let after_lost = WriteProgress {
        attempts: 2,
        maybe_applied: true,
        renewed: false,
    };
    let unknown_token = server(KvError::Unauthenticated {
        message: "unknown token".into(),
    });
    assert_eq!(write(&over_quota(), first).0, Want::Gives("quota exceeded"));
    assert_eq!(
        write(&unknown_token, first).0,
        Want::Gives("unauthenticated")
    );
    assert_eq!(
        write(&over_quota(), after_lost).0,
        Want::Gives("outcome unknown")
    );
    assert!(matches!(
        decide_read(&over_quota(), 1),
        Decision::GiveUp(KvError::QuotaExceeded { .. })
    ));
}

#[test]
fn writes_give_up_after_their_attempts_saying_whether_they_may_have_been_applied() {
    let spent = WriteProgress {
        attempts: limits::CLIENT_WRITE_ATTEMPTS_MAX,
        ..WriteProgress::default()
    };
    let spent_unknown = WriteProgress {
        maybe_applied: true,
        ..spent
    };
    assert_eq!(write(&hinted(), spent).0, Want::Gives("unavailable"));
    assert_eq!(write(&overloaded(), spent).0, Want::Gives("overloaded"));
    assert_eq!(
        write(&refused(), spent_unknown).0,
        Want::Gives("outcome unknown")
    );
    assert_eq!(write(&lost(), spent).0, Want::Gives("outcome unknown"));

    let cases = [
        (refused(), spent, "unavailable"),
        (overloaded(), spent, "overloaded"),
        (refused(), spent_unknown, "outcome unknown"),
        (timed_out(), spent_unknown, "outcome unknown"),
    ];
    for (error, progress, want) in cases {
        let error = write_gave_up(&error, &progress, "30000 ms");
        assert_eq!(kind(&error), want, "{error:?}");
        assert!(error.to_string().contains("30000 ms"), "{error}");
    }
}

#[test]
fn read_deadline_says_timeout_or_unavailable() {
    let second = Duration::from_secs(1);
    assert!(matches!(
        read_deadline_passed(&refused(), second),
        KvError::Unavailable { .. }
    ));
    assert!(matches!(
        read_deadline_passed(&timed_out(), second),
        KvError::Timeout { .. }
    ));
}

#[test]
fn read_backoff_is_bounded_and_skipped_for_a_first_hint() {
    let hint = Target::Hinted(NodeAddr::new("a:1"));
    let refused = refused();
    let leaderless = not_leader(None);
    let second = Duration::from_secs(1);
    let ms = Duration::from_millis;
    let cases = [
        (&leaderless, &hint, 1, 5 * second, Duration::ZERO),
        (&leaderless, &hint, 3, 5 * second, ms(20)),
        (&leaderless, &Target::Refresh, 3, 5 * second, Duration::ZERO),
        (&refused, &Target::Next, 1, 5 * second, ms(50)),
        (&refused, &Target::Next, 2, 5 * second, ms(100)),
        (&refused, &Target::Next, 40, 5 * second, second),
        // 4.2 s left, 6 attempts left: 7 shares.
        (&leaderless, &Target::Next, 2, ms(4_200), ms(600)),
        (&leaderless, &Target::Next, 2, ms(60_000), second),
        (&leaderless, &Target::Next, 7, ms(50), ms(100)),
    ];
    for (error, target, attempt, remaining, expected) in cases {
        assert_eq!(
            read_backoff(error, target, attempt, remaining),
            expected,
            "{error:?} {target:?} {attempt} {remaining:?}"
        );
    }
}

#[test]
fn write_backoff_doubles_to_a_cap_with_jitter_in_the_upper_half() {
    let hint = Target::Hinted(NodeAddr::new("a:1"));
    let ms = Duration::from_millis;
    let cases = [
        (&hint, 1, 0.5, Duration::ZERO),
        (&hint, 3, 0.5, ms(20)),
        (&Target::Refresh, 3, 0.5, Duration::ZERO),
        (&Target::Next, 1, 0.0, ms(25)),
        (&Target::Next, 1, 1.0, ms(50)),
        (&Target::Next, 2, 0.0, ms(50)),
        (&Target::Same, 3, 1.0, ms(200)),
        (&Target::Next, 5, 1.0, ms(800)),
        (&Target::Next, 6, 0.0, ms(500)),
        (&Target::Next, 6, 1.0, ms(1_000)),
        (&Target::Next, 200, 1.0, ms(1_000)),
        // Out-of-range jitter is clamped.
        (&Target::Next, 1, 7.0, ms(50)),
        (&Target::Next, 1, -1.0, ms(25)),
    ];
    for (target, attempt, jitter, expected) in cases {
        assert_eq!(
            write_backoff(target, attempt, jitter),
            expected,
            "{target:?} {attempt} {jitter}"
        );
    }
}

#[test]
fn a_first_hint_is_followed_at_once_and_later_ones_after_a_growing_pause() {
    let ms = Duration::from_millis;
    let pauses: Vec<Duration> = (1..=8).map(hint_backoff).collect();
    assert_eq!(
        pauses,
        [0, 10, 20, 40, 80, 160, 200, 200].map(ms).to_vec(),
        "two replicas naming each other get about half a second to settle within 8 attempts"
    );
    assert_eq!(hint_backoff(u32::MAX), ms(200));
}

#[test]
fn hints_naming_unreachable_endpoints_are_skipped() {
    let hint = || Target::Hinted(NodeAddr::new("127.0.0.1:7001"));
    let dead = vec!["127.0.0.1:7001".to_string()];
    assert_eq!(skip_stale_hint(hint(), &dead), Target::Next);
    assert_eq!(skip_stale_hint(hint(), &[]), hint());
    let garbage = Target::Hinted(NodeAddr::new("not an address"));
    assert_eq!(skip_stale_hint(garbage, &[]), Target::Next);
    assert_eq!(skip_stale_hint(Target::Same, &dead), Target::Same);
    assert_eq!(skip_stale_hint(Target::Refresh, &dead), Target::Refresh);
}

#[test]
fn splits_retry_what_may_have_been_applied_and_epoch_mismatch_is_final() {
    let max = limits::CLIENT_READ_ATTEMPTS_MAX;
    use Want::*;
    let cases: Vec<(AttemptError, u32, Want)> = vec![
        (hinted(), 1, Hinted),
        (not_leader(None), 1, Next),
        (refused(), 1, Next),
        (server(KvError::unavailable("no quorum")), 1, Next),
        (overloaded(), 1, Same),
        (out_of_range(), 1, Refresh),
        (epoch_mismatch(), 1, Gives("epoch mismatch")),
        (
            server(KvError::invalid("key is empty")),
            1,
            Gives("invalid"),
        ),
        // A split already made is answered with its halves: one that may have happened is
        // sent again.
        (lost(), 1, Next),
        (timed_out(), 1, Next),
        (superseded(), 1, Hinted),
        (unknown(), 1, Next),
        (refused(), max, Gives("unavailable")),
        (lost(), max, Gives("unavailable")),
    ];
    for (error, attempt, want) in cases {
        let got = match decide_split(&error, attempt) {
            Decision::Retry { target } => want_target(&target),
            Decision::GiveUp(error) => Gives(kind(&error)),
        };
        assert_eq!(got, want, "{error:?} attempt={attempt}");
    }
}

#[test]
fn a_split_given_up_after_an_attempt_that_may_have_been_applied_is_outcome_unknown() {
    assert!(may_have_applied(&lost()));
    assert!(may_have_applied(&superseded()));
    assert!(!may_have_applied(&refused()));
    assert!(!may_have_applied(&not_leader(None)));
    let given_up = [
        KvError::unavailable("gave up"),
        KvError::Timeout {
            message: "gave up".to_string(),
        },
        KvError::Overloaded {
            message: "gave up".to_string(),
        },
    ];
    for error in given_up {
        let clean = kind(&error);
        assert_eq!(kind(&settled(error.clone(), false)), clean);
        assert_eq!(kind(&settled(error, true)), "outcome unknown");
    }
    // An answer that says what happened stays what it is.
    let invalid = KvError::invalid("key already starts a range");
    assert_eq!(kind(&settled(invalid, true)), "invalid");
}

#[test]
fn a_write_spanning_ranges_is_settled_only_when_no_range_can_have_applied_it() {
    let clean = WriteProgress {
        attempts: 2,
        ..WriteProgress::default()
    };
    let murky = WriteProgress {
        maybe_applied: true,
        ..clean
    };
    let elsewhere = server(KvError::KeyOutOfRange {
        key: b"x".to_vec(),
        range: Box::new(RangeDescriptor {
            start: b"m".to_vec(),
            end: None,
            ..*range_now()
        }),
    });
    // (progress, last error, first key) -> certainly applied nowhere
    let cases = [
        (clean, out_of_range(), b"b".as_slice(), true),
        (clean, hinted(), b"b", true),
        // May have been applied: only the range holding the first key can say it was not.
        (murky, out_of_range(), b"b", true),
        (murky, elsewhere, b"b", false),
        (murky, out_of_range(), b"x", false),
        (murky, hinted(), b"b", false),
    ];
    for (progress, last, first_key, expected) in cases {
        let got = spanning_write_not_applied(&progress, &last, first_key);
        assert_eq!(got, expected, "{progress:?} {last:?} {first_key:?}");
    }
}
