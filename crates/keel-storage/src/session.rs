//! The exactly-once decision for a mutation that carries a request id: given the client's
//! session in the range (if any) and the range's session facts, refuse it, answer it from
//! its record, or apply it. Pure: no I/O beyond the record counts it is handed a way to ask
//! for. Knows nothing about redb, threads or openraft.
//!
//! Rules, in order (the range clock is `clock_ms`):
//! 1. No session: a client that started at or before the session horizon is refused with
//!    `RequestIdExpired` (its session was dropped, or it may have been); a range at its
//!    session limit refuses with `TooManySessions`; else a session is created. Neither
//!    refusal stores anything.
//! 2. A sequence below the session's `completed_below` is refused with `RequestIdExpired`.
//! 3. The id's `completed_below` (capped at its own sequence) raises the session's, dropping
//!    the records below it.
//! 4. A request with a record is answered from it (`Replay`).
//! 5. A session at its record limit refuses with `TooManyInFlight`.
//! 6. Otherwise the request is applied and its outcome recorded.
//!
//! Whenever a session exists afterwards, its `last_active_ms` is raised to the clock.
//!
//! Why it is sound: a session is dropped only when idle, and dropping it raises the horizon
//! to at least its `last_active_ms`, which is at least its `started_ms`; so a late copy of
//! any request of a dropped session finds `started_ms <= horizon` and is refused.

use std::ops::RangeInclusive;

use keel_types::{Rejection, RequestId, limits};

use crate::error::StorageError;
use crate::tables::Session;

/// The limits the decision enforces; `limits::*` in production, smaller in tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SessionLimits {
    pub sessions_max: u64,
    pub requests_max: u64,
}

impl Default for SessionLimits {
    fn default() -> SessionLimits {
        SessionLimits {
            sessions_max: limits::SESSIONS_PER_RANGE_MAX,
            requests_max: limits::REQUESTS_PER_SESSION_MAX,
        }
    }
}

/// The range-wide facts the decision reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RangeSessions {
    pub session_horizon_ms: u64,
    pub sessions: u64,
}

/// What to do with the request's ops.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    Reject(Rejection),
    /// Answer with the stored outcome of the request.
    Replay,
    /// Apply the ops and record their outcome under the request's sequence.
    Apply,
}

/// The decision and the session state to store with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RequestPlan {
    pub verdict: Verdict,
    /// The session to store; `None`: there was none and none is created. Its `records`
    /// already counts the record an `Apply` stores and the records `prune_below` drops.
    pub session: Option<Session>,
    /// Drop the session's records with a sequence below this.
    pub prune_below: Option<u64>,
}

/// Decides a request. `records(sequences)` counts the session's stored records with a
/// sequence in `sequences`.
pub(crate) fn plan_request(
    id: &RequestId,
    clock_ms: u64,
    stored: Option<Session>,
    range: RangeSessions,
    limits: SessionLimits,
    mut records: impl FnMut(RangeInclusive<u64>) -> Result<u64, StorageError>,
) -> Result<RequestPlan, StorageError> {
    let expired = Rejection::RequestIdExpired {
        client_id: id.client_id,
        sequence: id.sequence,
    };
    let refuse = |rejection| RequestPlan {
        verdict: Verdict::Reject(rejection),
        session: None,
        prune_below: None,
    };
    let mut session = match stored {
        Some(session) => session,
        None if id.client_started_ms <= range.session_horizon_ms => return Ok(refuse(expired)),
        None if range.sessions >= limits.sessions_max => {
            return Ok(refuse(Rejection::TooManySessions {
                limit: limits.sessions_max,
            }));
        }
        None => Session {
            started_ms: id.client_started_ms,
            last_active_ms: id.client_started_ms,
            completed_below: 0,
            records: 0,
        },
    };
    session.last_active_ms = session.last_active_ms.max(clock_ms);
    let plan = |verdict, session, prune_below| RequestPlan {
        verdict,
        session: Some(session),
        prune_below,
    };
    if id.sequence < session.completed_below {
        return Ok(plan(Verdict::Reject(expired), session, None));
    }
    // A request never drops its own record, even if its id claims more is complete.
    let completed_below = id.completed_below.min(id.sequence);
    let mut prune_below = None;
    if completed_below > session.completed_below {
        let pruned = records(0..=completed_below - 1)?;
        session.records = session
            .records
            .checked_sub(pruned)
            .expect("a session's record count covers its records");
        session.completed_below = completed_below;
        prune_below = Some(completed_below);
    }
    if records(id.sequence..=id.sequence)? > 0 {
        return Ok(plan(Verdict::Replay, session, prune_below));
    }
    if session.records >= limits.requests_max {
        let rejection = Rejection::TooManyInFlight {
            client_id: id.client_id,
            limit: limits.requests_max,
        };
        return Ok(plan(Verdict::Reject(rejection), session, prune_below));
    }
    session.records += 1;
    Ok(plan(Verdict::Apply, session, prune_below))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    const LIMITS: SessionLimits = SessionLimits {
        sessions_max: 2,
        requests_max: 3,
    };

    fn id(started: u64, sequence: u64, completed_below: u64) -> RequestId {
        RequestId {
            client_id: 7,
            client_started_ms: started,
            sequence,
            completed_below,
        }
    }

    fn session(completed_below: u64, records: u64) -> Session {
        Session {
            started_ms: 100,
            last_active_ms: 150,
            completed_below,
            records,
        }
    }

    /// `(verdict, session after, prune_below)`.
    type Expected = (Verdict, Option<Session>, Option<u64>);

    /// Decides `id` at clock 200 in a range with horizon 100 and `sessions` sessions, where
    /// the stored session holds records for `recorded`.
    fn check(
        id: RequestId,
        stored: Option<Session>,
        sessions: u64,
        recorded: &[u64],
        expected: Expected,
    ) {
        let recorded: BTreeSet<u64> = recorded.iter().copied().collect();
        let range = RangeSessions {
            session_horizon_ms: 100,
            sessions,
        };
        let plan = plan_request(&id, 200, stored, range, LIMITS, |sequences| {
            Ok(recorded.range(sequences).count() as u64)
        })
        .unwrap();
        let (verdict, session, prune_below) = expected;
        let expected = RequestPlan {
            verdict,
            session,
            prune_below,
        };
        assert_eq!(plan, expected, "{id:?} against {stored:?}");
    }

    #[test]
    fn request_decisions() {
        let expired = Verdict::Reject(Rejection::RequestIdExpired {
            client_id: 7,
            sequence: 1,
        });
        let active = |completed_below, records| Session {
            last_active_ms: 200,
            ..session(completed_below, records)
        };
        // A client that started at or before the horizon has no session to come back to.
        check(id(100, 1, 0), None, 0, &[], (expired.clone(), None, None));
        check(id(50, 1, 0), None, 0, &[], (expired.clone(), None, None));
        // After the horizon: a new session, unless the range is full.
        let created = Session {
            started_ms: 101,
            last_active_ms: 200,
            completed_below: 0,
            records: 1,
        };
        check(
            id(101, 1, 0),
            None,
            1,
            &[],
            (Verdict::Apply, Some(created), None),
        );
        let full = Verdict::Reject(Rejection::TooManySessions { limit: 2 });
        check(id(101, 1, 0), None, 2, &[], (full, None, None));
        // A session outlives the horizon it started before.
        check(
            id(100, 1, 0),
            Some(session(0, 0)),
            2,
            &[],
            (Verdict::Apply, Some(active(0, 1)), None),
        );
        // Recorded: replayed. Below completed_below: expired, session still touched.
        check(
            id(100, 1, 0),
            Some(session(0, 1)),
            1,
            &[1],
            (Verdict::Replay, Some(active(0, 1)), None),
        );
        check(
            id(100, 1, 0),
            Some(session(2, 1)),
            1,
            &[2],
            (expired, Some(active(2, 1)), None),
        );
        // completed_below drops records below it, capped at the request's own sequence.
        check(
            id(100, 4, 3),
            Some(session(0, 3)),
            1,
            &[1, 2, 3],
            (Verdict::Apply, Some(active(3, 2)), Some(3)),
        );
        check(
            id(100, 3, 9),
            Some(session(0, 3)),
            1,
            &[1, 2, 3],
            (Verdict::Replay, Some(active(3, 1)), Some(3)),
        );
        // A full session refuses new requests but still replays and prunes.
        let in_flight = Verdict::Reject(Rejection::TooManyInFlight {
            client_id: 7,
            limit: 3,
        });
        check(
            id(100, 4, 1),
            Some(session(1, 3)),
            1,
            &[1, 2, 3],
            (in_flight, Some(active(1, 3)), None),
        );
        check(
            id(100, 4, 2),
            Some(session(1, 3)),
            1,
            &[1, 2, 3],
            (Verdict::Apply, Some(active(2, 3)), Some(2)),
        );
        check(
            id(100, 2, 1),
            Some(session(1, 3)),
            1,
            &[1, 2, 3],
            (Verdict::Replay, Some(active(1, 3)), None),
        );
    }
}
