//! The retry policy as pure functions: given what went wrong with an attempt, retry (and
//! where) or give up (and with which error). Knows nothing of channels, clocks or tonic.
//!
//! The rule: a request is retried only when it is certain that it was not applied, or when it
//! is a read (reads change nothing). A write whose outcome is unknown is never retried.

use std::time::Duration;

use keel_types::{KvError, NodeAddr, limits};

use crate::attempt::AttemptError;
use crate::endpoints;

/// Where the next attempt goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// The leader a replica named; it may be missing from the endpoint list.
    Hinted(NodeAddr),
    /// The next endpoint of the list, in rotation.
    Next,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Retry { target: Target },
    GiveUp(KvError),
}

/// Decides after attempt number `attempt` (1 for the first) failed with `error`.
pub fn decide(error: &AttemptError, is_write: bool, attempt: u32) -> Decision {
    match retry_target(error, is_write) {
        None => Decision::GiveUp(final_error(error, is_write)),
        Some(_) if attempt >= limits::CLIENT_READ_ATTEMPTS_MAX => {
            Decision::GiveUp(exhausted(error, is_write, &format!("{attempt} attempts")))
        }
        Some(target) => Decision::Retry { target },
    }
}

/// The error to return when the request deadline passes before a retry the policy wanted.
pub fn deadline_passed(error: &AttemptError, is_write: bool, timeout: Duration) -> KvError {
    match retry_target(error, is_write) {
        None => final_error(error, is_write),
        Some(_) => exhausted(error, is_write, &format!("{} ms", timeout.as_millis())),
    }
}

/// Pause before attempt `attempt + 1`, given the error of attempt `attempt`, where the next
/// attempt goes, and the time left before the deadline:
///
/// - none when following a hint to a leader;
/// - while the range has no leader (`NotLeader` without a usable hint, `Unavailable`), the
///   time left spread evenly over the attempts left, within 100 ms..1 s: elections take
///   seconds, and attempts spent early would be missing when the new leader is up;
/// - after a connection failure, doubling from 50 ms up to 1 s, so another endpoint is tried
///   soon.
pub fn backoff(
    error: &AttemptError,
    target: &Target,
    attempt: u32,
    remaining: Duration,
) -> Duration {
    if let Target::Hinted(_) = target {
        return Duration::ZERO;
    }
    match error {
        AttemptError::Server(KvError::NotLeader { .. } | KvError::Unavailable { .. }) => {
            // One share more than attempts left, so the last attempt has time to run too.
            let shares = limits::CLIENT_READ_ATTEMPTS_MAX.saturating_sub(attempt) + 1;
            (remaining / shares).clamp(Duration::from_millis(100), Duration::from_secs(1))
        }
        _ => Duration::from_millis((50u64 << attempt.saturating_sub(1).min(5)).min(1_000)),
    }
}

/// A hint naming an endpoint that could not be reached during this request is stale (replicas
/// name a crashed leader until they elect a new one): rotate instead. `unreachable` holds
/// normalized URIs.
pub fn skip_stale_hint(target: Target, unreachable: &[String]) -> Target {
    match &target {
        Target::Hinted(addr) => match endpoints::normalize(&addr.addr) {
            Ok(uri) if !unreachable.contains(&uri) => target,
            _ => Target::Next,
        },
        Target::Next => target,
    }
}

/// Where to retry, or `None` when the error must not be retried.
fn retry_target(error: &AttemptError, is_write: bool) -> Option<Target> {
    match error {
        AttemptError::Server(KvError::NotLeader {
            leader: Some((_, addr)),
            ..
        }) if !addr.addr.is_empty() => Some(Target::Hinted(addr.clone())),
        // Definitely not applied: safe for writes too.
        AttemptError::Server(KvError::NotLeader { .. } | KvError::Unavailable { .. })
        | AttemptError::NotSent(_) => Some(Target::Next),
        // Maybe applied: only reads go again.
        AttemptError::Server(
            KvError::Timeout { .. } | KvError::Fatal { .. } | KvError::OutcomeUnknown { .. },
        )
        | AttemptError::Lost(_)
        | AttemptError::TimedOut(_) => (!is_write).then_some(Target::Next),
        AttemptError::Server(KvError::InvalidArgument { .. } | KvError::ConditionFailed(_)) => None,
    }
}

/// The error returned for an attempt error that is not retried.
pub fn final_error(error: &AttemptError, is_write: bool) -> KvError {
    match error {
        AttemptError::Server(
            KvError::Timeout { .. } | KvError::Fatal { .. } | KvError::OutcomeUnknown { .. },
        )
        | AttemptError::Lost(_)
        | AttemptError::TimedOut(_)
            if is_write =>
        {
            KvError::OutcomeUnknown {
                message: format!("{error}; the write may or may not have been applied"),
            }
        }
        AttemptError::Server(error) => error.clone(),
        AttemptError::NotSent(_) | AttemptError::Lost(_) => KvError::unavailable(error.to_string()),
        AttemptError::TimedOut(_) => KvError::Timeout {
            message: error.to_string(),
        },
    }
}

/// The error returned when a retryable error is still there after `spent` (attempts or time).
fn exhausted(error: &AttemptError, is_write: bool, spent: &str) -> KvError {
    let message = format!("gave up after {spent}; last error: {error}");
    match error {
        AttemptError::TimedOut(_) | AttemptError::Server(KvError::Timeout { .. }) if !is_write => {
            KvError::Timeout { message }
        }
        _ => KvError::Unavailable { message },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_types::{ConditionFailed, RangeId};

    #[derive(Debug, PartialEq)]
    enum Want {
        Hinted,
        Next,
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
        }
    }

    fn check(error: AttemptError, is_write: bool, attempt: u32, want: Want) {
        let got = match decide(&error, is_write, attempt) {
            Decision::Retry {
                target: Target::Hinted(_),
            } => Want::Hinted,
            Decision::Retry {
                target: Target::Next,
            } => Want::Next,
            Decision::GiveUp(error) => Want::Gives(kind(&error)),
        };
        assert_eq!(got, want, "{error:?} write={is_write} attempt={attempt}");
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

    #[test]
    fn policy_table() {
        let max = limits::CLIENT_READ_ATTEMPTS_MAX;
        let timeout = || {
            server(KvError::Timeout {
                message: "t".into(),
            })
        };
        let unknown = || {
            server(KvError::OutcomeUnknown {
                message: "u".into(),
            })
        };
        let failed = || {
            server(KvError::ConditionFailed(ConditionFailed {
                op_index: 0,
                key: b"k".to_vec(),
                current: None,
                revision: 3,
            }))
        };
        use Want::*;
        let cases: Vec<(AttemptError, bool, u32, Want)> = vec![
            // Definitely not applied: reads and writes retry.
            (not_leader(Some("127.0.0.1:7002")), true, 1, Hinted),
            (not_leader(Some("127.0.0.1:7002")), false, 1, Hinted),
            (not_leader(Some("")), true, 1, Next),
            (not_leader(None), true, 1, Next),
            (server(KvError::unavailable("no quorum")), true, 1, Next),
            (AttemptError::NotSent("refused".into()), true, 1, Next),
            (AttemptError::NotSent("refused".into()), false, 1, Next),
            // Maybe applied: writes give up with OutcomeUnknown, reads retry.
            (
                AttemptError::Lost("reset".into()),
                true,
                1,
                Gives("outcome unknown"),
            ),
            (AttemptError::Lost("reset".into()), false, 1, Next),
            (
                AttemptError::TimedOut("5 s".into()),
                true,
                1,
                Gives("outcome unknown"),
            ),
            (AttemptError::TimedOut("5 s".into()), false, 1, Next),
            (timeout(), true, 1, Gives("outcome unknown")),
            (timeout(), false, 1, Next),
            (unknown(), true, 1, Gives("outcome unknown")),
            (
                server(KvError::fatal("disk")),
                true,
                1,
                Gives("outcome unknown"),
            ),
            (server(KvError::fatal("disk")), false, 1, Next),
            // Answers that retrying cannot change.
            (
                server(KvError::invalid("key is empty")),
                true,
                1,
                Gives("invalid"),
            ),
            (
                server(KvError::invalid("key is empty")),
                false,
                1,
                Gives("invalid"),
            ),
            (failed(), true, 1, Gives("condition failed")),
            // Attempts are bounded.
            (not_leader(Some("127.0.0.1:7002")), true, max - 1, Hinted),
            (
                not_leader(Some("127.0.0.1:7002")),
                true,
                max,
                Gives("unavailable"),
            ),
            (
                AttemptError::NotSent("refused".into()),
                false,
                max,
                Gives("unavailable"),
            ),
            (
                AttemptError::TimedOut("t".into()),
                false,
                max,
                Gives("timeout"),
            ),
            (
                AttemptError::Lost("reset".into()),
                false,
                max,
                Gives("unavailable"),
            ),
        ];
        for (error, is_write, attempt, want) in cases {
            check(error, is_write, attempt, want);
        }
    }

    #[test]
    fn deadline_never_turns_an_unknown_write_into_a_failure() {
        let second = Duration::from_secs(1);
        let lost = AttemptError::Lost("reset".into());
        assert!(matches!(
            deadline_passed(&lost, true, second),
            KvError::OutcomeUnknown { .. }
        ));
        assert!(matches!(
            deadline_passed(&AttemptError::NotSent("x".into()), true, second),
            KvError::Unavailable { .. }
        ));
        assert!(matches!(
            deadline_passed(&AttemptError::TimedOut("x".into()), false, second),
            KvError::Timeout { .. }
        ));
    }

    #[test]
    fn backoff_is_bounded_and_skipped_for_hints() {
        let hint = Target::Hinted(NodeAddr::new("a:1"));
        let refused = AttemptError::NotSent("refused".into());
        let leaderless = not_leader(None);
        let second = Duration::from_secs(1);
        let ms = Duration::from_millis;
        let cases = [
            (&leaderless, &hint, 3, 5 * second, Duration::ZERO),
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
                backoff(error, target, attempt, remaining),
                expected,
                "{error:?} {target:?} {attempt} {remaining:?}"
            );
        }
    }

    #[test]
    fn hints_naming_unreachable_endpoints_are_skipped() {
        let hint = || Target::Hinted(NodeAddr::new("127.0.0.1:7001"));
        let dead = vec!["http://127.0.0.1:7001".to_string()];
        assert_eq!(skip_stale_hint(hint(), &dead), Target::Next);
        assert_eq!(skip_stale_hint(hint(), &[]), hint());
        let garbage = Target::Hinted(NodeAddr::new("not an address"));
        assert_eq!(skip_stale_hint(garbage, &[]), Target::Next);
    }
}
