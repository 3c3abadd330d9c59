//! Scripts of events against one `LockQueue`, each step with the decision or answers it must
//! produce.

use keel_types::{RangeId, Rejection};

use super::*;

/// One event of a script and what it must produce.
enum Act {
    /// Enqueue an acquire by this owner; the waiter id it gets.
    Enqueue(&'static str, WaiterId),
    /// A client's release of this token; the release id it gets.
    Release(u64, ReleaseId),
    Kick,
    Tick,
    /// Remove a waiter; whether it was queued.
    Remove(WaiterId, bool),
    /// The lock as read at this node clock.
    Observe(Option<LockHold>, u64),
    /// The decision at this node clock.
    Next(u64, Step),
    /// The outcome of the proposal in flight, and the answers.
    Settle(Result<Coordinated, KvError>, Vec<Answer>),
    IsIdle(bool),
    Drain(Vec<WaiterId>, Vec<ReleaseId>),
}

fn run(name: &str, script: Vec<Act>) {
    let mut queue = LockQueue::new(b"jobs".to_vec());
    for (index, act) in script.into_iter().enumerate() {
        let at = format!("{name}, step {index}");
        match act {
            Act::Enqueue(owner, id) => {
                assert_eq!(queue.enqueue(acquirer(owner)), Ok(id), "{at}")
            }
            Act::Release(token, id) => {
                assert_eq!(queue.release(token, Some(request(id))), Ok(id), "{at}")
            }
            Act::Kick => queue.kick(),
            Act::Tick => queue.tick(),
            Act::Remove(id, queued) => assert_eq!(queue.remove_waiter(id), queued, "{at}"),
            Act::Observe(hold, now_ms) => queue.observe(hold, now_ms),
            Act::Next(now_ms, step) => assert_eq!(queue.step(now_ms), step, "{at}"),
            Act::Settle(outcome, answers) => assert_eq!(queue.settle(outcome), answers, "{at}"),
            Act::IsIdle(idle) => assert_eq!(queue.is_idle(), idle, "{at}"),
            Act::Drain(waiters, releases) => {
                assert_eq!(queue.drain(), (waiters, releases), "{at}")
            }
        }
    }
}

fn acquirer(owner: &str) -> Acquirer {
    Acquirer {
        owner: owner.as_bytes().to_vec(),
        ttl_ms: 1_000,
        lock_delay_ms: 0,
    }
}

fn request(sequence: u64) -> RequestId {
    RequestId {
        client_id: 9,
        client_started_ms: 1,
        sequence,
        completed_below: 1,
    }
}

fn hold(owner: &str, token: u64, expires_at_ms: u64, lock_delay_ms: u64) -> LockHold {
    LockHold {
        owner: owner.as_bytes().to_vec(),
        token,
        expires_at_ms,
        lock_delay_ms,
    }
}

fn result(revision: Revision, result: CoordinationResult) -> Result<Coordinated, KvError> {
    Ok(Coordinated {
        revision,
        result,
        replayed: false,
    })
}

fn acquire(waiter: WaiterId, owner: &str) -> Step {
    Step::Propose(Proposal::Acquire {
        waiter,
        acquirer: acquirer(owner),
    })
}

fn release(release: Option<ReleaseId>, token: u64, successor: Option<(WaiterId, &str)>) -> Step {
    Step::Propose(Proposal::Release {
        release,
        token,
        request: release.map(request),
        successor: successor.map(|(id, owner)| (id, acquirer(owner))),
    })
}

fn granted(waiter: WaiterId, hold: LockHold) -> Answer {
    Answer::Granted {
        waiter,
        grant: Grant {
            revision: hold.token,
            hold,
        },
    }
}

fn released(release: ReleaseId, successor: Option<LockHold>, revision: Revision) -> Answer {
    Answer::Released {
        release,
        done: Ok(ReleaseDone {
            successor,
            revision,
            replayed: false,
        }),
    }
}

const IDLE: Step = Step::Idle { until_ms: None };

fn not_leader() -> KvError {
    KvError::NotLeader {
        range_id: RangeId::FIRST,
        leader: None,
    }
}

#[test]
fn a_free_lock_goes_to_the_first_waiter_after_a_read() {
    use Act::*;
    run(
        "free lock",
        vec![
            Enqueue("a", 1),
            Enqueue("b", 2),
            Next(10, Step::Read),
            Observe(None, 10),
            Next(10, acquire(1, "a")),
            Next(10, IDLE),
            Settle(
                result(7, CoordinationResult::Acquired(hold("a", 7, 1_010, 0))),
                vec![granted(1, hold("a", 7, 1_010, 0))],
            ),
            Next(
                20,
                Step::Idle {
                    until_ms: Some(1_010),
                },
            ),
            IsIdle(false),
        ],
    );
}

#[test]
fn an_expired_lock_is_read_again_when_its_time_passes() {
    use Act::*;
    let held = hold("x", 3, 100, 10);
    run(
        "expiry",
        vec![
            Enqueue("a", 1),
            Next(50, Step::Read),
            Observe(Some(held.clone()), 50),
            Next(
                50,
                Step::Idle {
                    until_ms: Some(110),
                },
            ),
            Next(
                105,
                Step::Idle {
                    until_ms: Some(110),
                },
            ),
            Next(110, Step::Read),
            // Renewed meanwhile: wait for the new time.
            Observe(Some(hold("x", 3, 300, 10)), 110),
            Next(
                110,
                Step::Idle {
                    until_ms: Some(310),
                },
            ),
            Next(310, Step::Read),
            Observe(None, 310),
            Next(310, acquire(1, "a")),
        ],
    );
}

#[test]
fn a_read_of_a_lock_whose_time_passed_counts_as_free() {
    use Act::*;
    run(
        "stale read",
        vec![
            Enqueue("a", 1),
            Next(500, Step::Read),
            Observe(Some(hold("x", 3, 100, 10)), 500),
            Next(500, acquire(1, "a")),
        ],
    );
}

#[test]
fn a_busy_answer_waits_for_the_holders_time() {
    use Act::*;
    run(
        "busy",
        vec![
            Enqueue("a", 1),
            Next(0, Step::Read),
            Observe(None, 0),
            Next(0, acquire(1, "a")),
            Settle(
                result(4, CoordinationResult::Busy(hold("x", 4, 200, 0))),
                vec![],
            ),
            Next(
                10,
                Step::Idle {
                    until_ms: Some(200),
                },
            ),
            // A release served without the queue: look again.
            Kick,
            Next(10, Step::Read),
        ],
    );
}

#[test]
fn a_release_hands_the_lock_to_the_first_waiter_in_one_command() {
    use Act::*;
    let successor = hold("a", 9, 1_050, 0);
    run(
        "hand-over",
        vec![
            Enqueue("a", 1),
            Enqueue("b", 2),
            Release(5, 3),
            Next(50, release(Some(3), 5, Some((1, "a")))),
            Settle(
                result(
                    9,
                    CoordinationResult::Released {
                        successor: Some(successor.clone()),
                    },
                ),
                vec![
                    granted(1, successor.clone()),
                    released(3, Some(successor), 9),
                ],
            ),
            Next(
                60,
                Step::Idle {
                    until_ms: Some(1_050),
                },
            ),
            Remove(1, false),
            Remove(2, true),
            IsIdle(true),
        ],
    );
}

#[test]
fn a_release_with_nobody_waiting_frees_the_lock() {
    use Act::*;
    run(
        "release alone",
        vec![
            Release(5, 1),
            Next(0, release(Some(1), 5, None)),
            IsIdle(false),
            Settle(
                result(6, CoordinationResult::Released { successor: None }),
                vec![released(1, None, 6)],
            ),
            IsIdle(true),
            Next(0, IDLE),
        ],
    );
}

#[test]
fn a_grant_to_a_waiter_that_left_goes_to_the_next() {
    use Act::*;
    let orphan = hold("a", 7, 1_000, 0);
    let next = hold("b", 8, 1_000, 0);
    run(
        "orphan",
        vec![
            Enqueue("a", 1),
            Enqueue("b", 2),
            Next(0, Step::Read),
            Observe(None, 0),
            Next(0, acquire(1, "a")),
            Remove(1, true),
            Settle(result(7, CoordinationResult::Acquired(orphan)), vec![]),
            IsIdle(false),
            Release(99, 3),
            // The orphaned grant is given back before the client's release.
            Next(0, release(None, 7, Some((2, "b")))),
            Settle(
                result(
                    8,
                    CoordinationResult::Released {
                        successor: Some(next.clone()),
                    },
                ),
                vec![granted(2, next)],
            ),
            Next(0, release(Some(3), 99, None)),
        ],
    );
}

#[test]
fn a_replayed_release_grants_nobody() {
    use Act::*;
    let old = hold("z", 4, 500, 0);
    run(
        "replayed release",
        vec![
            Enqueue("a", 1),
            Release(3, 2),
            Next(0, release(Some(2), 3, Some((1, "a")))),
            Settle(
                Ok(Coordinated {
                    revision: 4,
                    result: CoordinationResult::Released {
                        successor: Some(old.clone()),
                    },
                    replayed: true,
                }),
                vec![Answer::Released {
                    release: 2,
                    done: Ok(ReleaseDone {
                        successor: Some(old),
                        revision: 4,
                        replayed: true,
                    }),
                }],
            ),
            Next(0, Step::Read),
            Remove(1, true),
        ],
    );
}

#[test]
fn a_refused_release_keeps_the_waiters() {
    use Act::*;
    let refused: KvError = Rejection::LockNotHeld {
        name: b"jobs".to_vec(),
        token: 3,
        current_token: Some(6),
    }
    .into();
    run(
        "refused release",
        vec![
            Enqueue("a", 1),
            Release(3, 2),
            Next(0, release(Some(2), 3, Some((1, "a")))),
            Settle(
                Err(refused.clone()),
                vec![Answer::Released {
                    release: 2,
                    done: Err(refused),
                }],
            ),
            Next(0, Step::Read),
        ],
    );
}

#[test]
fn without_a_quorum_the_queue_waits_for_a_tick() {
    use Act::*;
    run(
        "backoff",
        vec![
            Enqueue("a", 1),
            Next(0, Step::Read),
            Observe(None, 0),
            Next(0, acquire(1, "a")),
            Settle(Err(KvError::unavailable("no quorum")), vec![]),
            Next(0, IDLE),
            Release(5, 2),
            Next(0, IDLE),
            Tick,
            Next(0, release(Some(2), 5, Some((1, "a")))),
        ],
    );
}

#[test]
fn another_leader_stops_the_queue_and_answers_everyone() {
    use Act::*;
    run(
        "not leader",
        vec![
            Enqueue("a", 1),
            Enqueue("b", 2),
            Release(5, 3),
            Release(6, 4),
            Next(0, release(Some(3), 5, Some((1, "a")))),
            Settle(
                Err(not_leader()),
                vec![
                    Answer::Released {
                        release: 3,
                        done: Err(not_leader()),
                    },
                    Answer::Stop(not_leader()),
                ],
            ),
            Drain(vec![1, 2], vec![4]),
            IsIdle(true),
        ],
    );
}

/// A split moved the lock's name to another range: proposing here can never succeed again,
/// so the queue stops (its callers route again to the range holding the name).
#[test]
fn a_lock_moved_by_a_split_stops_the_queue() {
    use Act::*;
    let moved = KvError::KeyOutOfRange {
        key: b"a".to_vec(),
        range: Box::new(keel_types::RangeDescriptor {
            id: RangeId::FIRST,
            start: Vec::new(),
            end: Some(b"a".to_vec()),
            epoch: 1,
            conf_version: 0,
            replicas: vec![1],
        }),
    };
    run(
        "key out of range",
        vec![
            Enqueue("a", 1),
            Observe(None, 0),
            Next(0, acquire(1, "a")),
            Settle(Err(moved.clone()), vec![Answer::Stop(moved)]),
            Drain(vec![1], vec![]),
            IsIdle(true),
        ],
    );
}

#[test]
fn a_drain_includes_the_release_in_flight() {
    use Act::*;
    run(
        "drain",
        vec![
            Enqueue("a", 1),
            Release(5, 2),
            Next(0, release(Some(2), 5, Some((1, "a")))),
            Drain(vec![1], vec![2]),
            IsIdle(true),
        ],
    );
}

#[test]
fn an_unexpected_result_is_a_failure() {
    use Act::*;
    run(
        "unexpected",
        vec![
            Enqueue("a", 1),
            Next(0, Step::Read),
            Observe(None, 0),
            Next(0, acquire(1, "a")),
            Settle(result(2, CoordinationResult::Aborted), vec![]),
            Next(0, IDLE),
            Tick,
            Next(0, Step::Read),
        ],
    );
}

#[test]
fn queues_are_bounded() {
    let mut queue = LockQueue::new(b"jobs".to_vec());
    for _ in 0..limits::LOCK_WAITERS_MAX {
        queue.enqueue(acquirer("a")).unwrap();
        queue.release(1, None).unwrap();
    }
    assert!(matches!(
        queue.enqueue(acquirer("a")),
        Err(KvError::Overloaded { .. })
    ));
    assert!(matches!(
        queue.release(1, None),
        Err(KvError::Overloaded { .. })
    ));
}

#[test]
fn proposals_name_the_lock_and_the_successor() {
    let cases = vec![
        (
            Proposal::Acquire {
                waiter: 1,
                acquirer: acquirer("a"),
            },
            (
                None,
                CoordinationOp::Acquire {
                    name: b"jobs".to_vec(),
                    acquirer: acquirer("a"),
                },
            ),
        ),
        (
            Proposal::Release {
                release: Some(2),
                token: 5,
                request: Some(request(2)),
                successor: Some((1, acquirer("b"))),
            },
            (
                Some(request(2)),
                CoordinationOp::Release {
                    name: b"jobs".to_vec(),
                    token: 5,
                    successor: Some(acquirer("b")),
                },
            ),
        ),
    ];
    for (proposal, expected) in cases {
        assert_eq!(proposal.op(b"jobs"), expected, "{proposal:?}");
    }
}
