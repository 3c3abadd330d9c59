//! The exactly-once decision for a mutation that carries a request id: given the client's
//! session in the range (if any) and the range's session facts, refuse it, answer it from
//! its record, or apply it. Pure: no I/O beyond the record counts it is handed a way to ask
//! for. Knows nothing about redb, threads or openraft.
//!
//! A request is `Asked`: its id, its *owner* (the digest of the tenant prefix its keys lie
//! under, empty for the raw keyspace: the door moves a tenant's names into its namespace, so
//! only that tenant, or an admin, can send a request owned by it) and the digest of what it
//! asks (`request_digest`). Rules, in order (the range clock is `clock_ms`):
//! 1. No session: a client that started at or before the session horizon is refused with
//!    `RequestIdExpired` (its session was dropped, or it may have been); a range at its
//!    session limit refuses with `TooManySessions`; else a session owned by the request's
//!    owner is created. Neither refusal stores anything.
//! 2. A session of another owner or another client start refuses with `RequestIdReused`
//!    and is left as it is. A session written before format 6 has no owner recorded: the
//!    request's owner takes it.
//! 3. A sequence below the session's `completed_below` is refused with `RequestIdExpired`.
//! 4. A request whose sequence has a record of a different request (another digest) is
//!    refused with `RequestIdReused`, and the session is left as it is. (A record written
//!    before format 6 has no digest and is not compared.)
//! 5. The id's `completed_below` (capped at its own sequence) raises the session's, dropping
//!    the records below it.
//! 6. A request with a record is answered from it (`Replay`).
//! 7. A session at its record limit refuses with `TooManyInFlight`.
//! 8. Otherwise the request is applied and its outcome recorded.
//!
//! Whenever a session exists afterwards, its `last_active_ms` is raised to the clock.
//!
//! Why it is sound: a session is dropped only when idle, and dropping it raises the horizon
//! to at least its `last_active_ms`, which is at least its `started_ms`; so a late copy of
//! any request of a dropped session finds `started_ms <= horizon` and is refused. No
//! request changes or reads a session that is not its owner's, so one tenant can neither
//! read another's results nor drop its records.

use std::ops::RangeInclusive;

use keel_types::tenant::namespace_prefix_len;
use keel_types::{Command, CoordinationOp, Rejection, RequestId, limits};
use serde_bytes::Bytes;

use crate::codec::Digest;
use crate::error::StorageError;
use crate::tables::Session;

/// A request as the decision sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Asked<'a> {
    pub id: &'a RequestId,
    /// `owner_of` its first key.
    pub owner: Digest,
    /// `request_digest` of its command.
    pub digest: Digest,
}

/// The owner of a request whose first key (or lock name, or idempotency key) is `key`: the
/// digest of the tenant prefix it starts with (empty for the raw keyspace).
pub(crate) fn owner_of(key: &[u8]) -> Digest {
    Digest::of(Bytes::new(&key[..namespace_prefix_len(key)]))
}

/// What a client command asks, as the parts the client chose: its ops (and fence), or its
/// lock or idempotency operation. Not the leader's clock, nor the successor a release hands
/// the lock to (the queue picks it, and may pick another when the release is retried).
/// Stable across builds: a record keeps the digest its request had when it was applied.
pub(crate) fn request_digest(command: &Command) -> Digest {
    match command {
        Command::Mutate(mutation) => Digest::of(&("mutate", &mutation.ops)),
        Command::FencedMutate { fence, mutation } => Digest::of(&("fenced", fence, &mutation.ops)),
        Command::Coordinate(coordination) => match &coordination.op {
            CoordinationOp::Release { name, token, .. } => {
                Digest::of(&("release", Bytes::new(name), token))
            }
            op => Digest::of(&("coordinate", op)),
        },
        Command::Txn(mutation) => Digest::of(&("txn", &mutation.txn)),
        // The digest its records of format 11 hold.
        Command::TxnV11(mutation) => Digest::of(&("txn", &mutation.txn)),
        Command::Lease(lease) => Digest::of(&("lease", &lease.op)),
        Command::Write { .. }
        | Command::Cleanup(_)
        | Command::ExpireLeases(_)
        | Command::Reclaim(_)
        | Command::ReclaimUnrecorded(_)
        | Command::Split(_)
        | Command::Check(_)
        | Command::Hold(_)
        | Command::Meta(_) => Digest::of("internal"),
    }
}

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

/// Decides a request. `recorded` is the record of its sequence, if the session has one: the
/// digest of the request it holds (`None`: a record written before format 6).
/// `records(sequences)` counts the session's stored records with a sequence in `sequences`.
pub(crate) fn plan_request(
    asked: Asked,
    clock_ms: u64,
    stored: Option<Session>,
    recorded: Option<Option<Digest>>,
    range: RangeSessions,
    limits: SessionLimits,
    mut records: impl FnMut(RangeInclusive<u64>) -> Result<u64, StorageError>,
) -> Result<RequestPlan, StorageError> {
    let id = asked.id;
    let expired = Rejection::RequestIdExpired {
        client_id: id.client_id,
        sequence: id.sequence,
    };
    let refuse = |rejection| RequestPlan {
        verdict: Verdict::Reject(rejection),
        session: None,
        prune_below: None,
    };
    let reused = || {
        refuse(Rejection::RequestIdReused {
            client_id: id.client_id,
            sequence: id.sequence,
        })
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
            owner: Some(asked.owner),
            started_ms: id.client_started_ms,
            last_active_ms: id.client_started_ms,
            completed_below: 0,
            records: 0,
        },
    };
    let owned = session.owner.is_none_or(|owner| owner == asked.owner);
    if !owned || session.started_ms != id.client_started_ms {
        return Ok(reused());
    }
    session.owner = Some(asked.owner);
    session.last_active_ms = session.last_active_ms.max(clock_ms);
    let plan = |verdict, session, prune_below| RequestPlan {
        verdict,
        session: Some(session),
        prune_below,
    };
    if id.sequence < session.completed_below {
        return Ok(plan(Verdict::Reject(expired), session, None));
    }
    if let Some(Some(digest)) = recorded
        && digest != asked.digest
    {
        return Ok(reused());
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
    if recorded.is_some() {
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

    use keel_types::{BatchOp, Coordination, Mutation};

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

    fn owner() -> Digest {
        owner_of(b"\xffTalice\x01k")
    }

    fn digest() -> Digest {
        Digest::of("the request")
    }

    fn session(completed_below: u64, records: u64) -> Session {
        Session {
            owner: Some(owner()),
            started_ms: 100,
            last_active_ms: 150,
            completed_below,
            records,
        }
    }

    /// `(verdict, session after, prune_below)`.
    type Expected = (Verdict, Option<Session>, Option<u64>);

    /// Decides `id` from `owner()` asking `digest()` at clock 200 in a range with horizon 100
    /// and `sessions` sessions, where the stored session holds records for `recorded`, all
    /// of `digest()`.
    fn check(
        id: RequestId,
        stored: Option<Session>,
        sessions: u64,
        recorded: &[u64],
        expected: Expected,
    ) {
        let asked = Asked {
            id: &id,
            owner: owner(),
            digest: digest(),
        };
        let record = recorded.contains(&id.sequence).then_some(Some(digest()));
        check_asked(asked, stored, sessions, recorded, record, expected);
    }

    fn check_asked(
        asked: Asked,
        stored: Option<Session>,
        sessions: u64,
        recorded: &[u64],
        record: Option<Option<Digest>>,
        expected: Expected,
    ) {
        let recorded: BTreeSet<u64> = recorded.iter().copied().collect();
        let range = RangeSessions {
            session_horizon_ms: 100,
            sessions,
        };
        let plan = plan_request(asked, 200, stored, record, range, LIMITS, |sequences| {
            Ok(recorded.range(sequences).count() as u64)
        })
        .unwrap();
        let (verdict, session, prune_below) = expected;
        let expected = RequestPlan {
            verdict,
            session,
            prune_below,
        };
        assert_eq!(plan, expected, "{asked:?} against {stored:?}");
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
        // After the horizon: a new session of the request's owner, unless the range is full.
        let created = Session {
            owner: Some(owner()),
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

    #[test]
    fn a_request_id_answers_only_its_owner_its_client_start_and_its_request() {
        let reused = |sequence| {
            Verdict::Reject(Rejection::RequestIdReused {
                client_id: 7,
                sequence,
            })
        };
        let stored = Some(session(1, 2));
        let mallory = owner_of(b"\xffTmallory\x01k");
        let raw = owner_of(b"k");
        let other = Digest::of("another request");
        // (owner, client start, sequence, completed_below, record of that sequence, verdict)
        let cases = [
            // Another tenant (or the raw keyspace) sends the id of a recorded request, with or
            // without a claim that everything is complete: refused, nothing changes.
            (mallory, 100, 2, 0, Some(Some(digest())), reused(2)),
            (mallory, 100, 2, 99, Some(Some(digest())), reused(2)),
            (raw, 100, 2, 0, Some(Some(digest())), reused(2)),
            // ... or a new sequence of the session: refused too.
            (mallory, 100, 4, 3, None, reused(4)),
            // Another start of the client.
            (owner(), 101, 2, 0, Some(Some(digest())), reused(2)),
            // The owner reuses a recorded sequence for another request.
            (owner(), 100, 2, 0, Some(Some(other)), reused(2)),
            (owner(), 100, 2, 2, Some(Some(other)), reused(2)),
        ];
        for (who, started, sequence, completed_below, record, verdict) in cases {
            let id = id(started, sequence, completed_below);
            let asked = Asked {
                id: &id,
                owner: who,
                digest: digest(),
            };
            check_asked(asked, stored, 1, &[1, 2], record, (verdict, None, None));
        }
    }

    #[test]
    fn a_session_and_record_of_an_older_format_are_taken_by_their_next_request() {
        let legacy = Session {
            owner: None,
            ..session(0, 1)
        };
        let taken = Session {
            last_active_ms: 200,
            ..session(0, 1)
        };
        // A record without a digest is replayed to the request that takes the session.
        let id = id(100, 1, 0);
        let asked = Asked {
            id: &id,
            owner: owner(),
            digest: digest(),
        };
        let expected = (Verdict::Replay, Some(taken), None);
        check_asked(asked, Some(legacy), 1, &[1], Some(None), expected);
        // Once taken, it refuses another owner.
        let mallory = Asked {
            owner: owner_of(b"\xffTmallory\x01k"),
            ..asked
        };
        let reused = Verdict::Reject(Rejection::RequestIdReused {
            client_id: 7,
            sequence: 1,
        });
        check_asked(
            mallory,
            Some(taken),
            1,
            &[1],
            Some(None),
            (reused, None, None),
        );
    }

    fn mutation(ops: Vec<BatchOp>, now_ms: u64) -> Mutation {
        Mutation {
            request: None,
            now_ms,
            ops,
        }
    }

    #[test]
    fn request_digests_cover_what_the_client_asked_and_nothing_else() {
        let put = |value: &[u8]| BatchOp::Put {
            key: b"k".to_vec(),
            value: value.to_vec(),
            condition: None,
            return_previous: true,
            ttl_ms: None,
        };
        let delete = BatchOp::Delete {
            key: b"k".to_vec(),
            condition: None,
            return_previous: true,
        };
        let increment = BatchOp::Increment {
            key: b"k".to_vec(),
            delta: 1,
        };
        let release = |successor: Option<&[u8]>, token| {
            Command::Coordinate(Coordination {
                request: None,
                now_ms: 5,
                op: CoordinationOp::Release {
                    name: b"k".to_vec(),
                    token,
                    successor: successor.map(|owner| keel_types::Acquirer {
                        owner: owner.to_vec(),
                        ttl_ms: 1,
                        lock_delay_ms: 0,
                    }),
                },
            })
        };
        let digest = request_digest;
        // The leader's clock and a release's successor are not the client's.
        assert_eq!(
            digest(&Command::Mutate(mutation(vec![put(b"v")], 1))),
            digest(&Command::Mutate(mutation(vec![put(b"v")], 2)))
        );
        assert_eq!(digest(&release(None, 4)), digest(&release(Some(b"w"), 4)));
        // Everything else is.
        let distinct = [
            digest(&Command::Mutate(mutation(vec![put(b"v")], 1))),
            digest(&Command::Mutate(mutation(vec![put(b"w")], 1))),
            digest(&Command::Mutate(mutation(vec![delete.clone()], 1))),
            digest(&Command::Mutate(mutation(vec![increment], 1))),
            digest(&Command::Mutate(mutation(vec![put(b"v"), delete], 1))),
            digest(&Command::FencedMutate {
                fence: keel_types::Fence {
                    lock: b"l".to_vec(),
                    token: 3,
                },
                mutation: mutation(vec![put(b"v")], 1),
            }),
            digest(&release(None, 4)),
            digest(&release(None, 5)),
        ];
        let unique: std::collections::HashSet<_> = distinct.iter().collect();
        assert_eq!(unique.len(), distinct.len(), "{distinct:?}");
        // Owners are the tenant prefixes.
        assert_eq!(owner_of(b"\xffTa\x01x"), owner_of(b"\xffTa\x01y"));
        assert_ne!(owner_of(b"\xffTa\x01x"), owner_of(b"\xffTb\x01x"));
        assert_eq!(owner_of(b"x"), owner_of(b""));
    }
}
