//! Proposing a lock or idempotency operation (`Command::Coordinate`, stamped with the node's
//! clock; a client's under its tenant's quota reservation) and reading what it came back with
//! from its `CommandOutcome`: the result and revision, whether it was a replay, or the error
//! a client sees. Knows nothing of gRPC or of the queue.

use keel_raft::RaftGroup;
use keel_types::{
    Clock, Command, CommandOutcome, Coordination, CoordinationOp, CoordinationResult, KvError,
    RequestId, Revision,
};

use crate::access::quota;
use crate::requests::admission;
use crate::shared::Shared;

/// An applied (or replayed) coordination operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Coordinated {
    /// The range's revision after it (the token of a grant or a start).
    pub revision: Revision,
    pub result: CoordinationResult,
    /// The request id had been applied before; this is its first outcome.
    pub replayed: bool,
}

impl Coordinated {
    /// Reads the outcome of a `Command::Coordinate`: rejections become their `KvError`, and an
    /// outcome no coordination produces becomes the error `unexpected` gives.
    pub fn from_outcome(outcome: CommandOutcome) -> Result<Coordinated, KvError> {
        let (outcome, replayed) = match outcome {
            CommandOutcome::Replayed(first) => (*first, true),
            outcome => (outcome, false),
        };
        match outcome {
            CommandOutcome::Coordinated { revision, result } => Ok(Coordinated {
                revision,
                result,
                replayed,
            }),
            CommandOutcome::Rejected(rejection) => Err(rejection.into()),
            CommandOutcome::ConditionFailed(failed) => Err(failed.into()),
            CommandOutcome::Applied { .. }
            | CommandOutcome::Internal
            | CommandOutcome::Replayed(_)
            | CommandOutcome::Split { .. }
            | CommandOutcome::Checked { .. }
            | CommandOutcome::Transacted { .. }
            | CommandOutcome::Leased(_)
            | CommandOutcome::Meta(_) => Err(unexpected(replayed)),
        }
    }
}

/// The command proposing `op` under `request`, stamped with the proposing node's `clock`.
pub(crate) fn command(
    clock: &dyn Clock,
    request: Option<RequestId>,
    op: CoordinationOp,
) -> Command {
    Command::Coordinate(Coordination {
        request,
        now_ms: clock.now_ms(),
        op,
    })
}

/// Proposes a client's `op` on `group`'s replica, which must lead, stamped with the node's
/// clock and holding the tenant's quota reservation for what it may add until it is
/// applied (`admission`), and reads the outcome.
pub(crate) async fn propose(
    shared: &Shared,
    group: &RaftGroup,
    request: Option<RequestId>,
    op: CoordinationOp,
) -> Result<Coordinated, KvError> {
    let growth = quota::coordination_growth(&op);
    let _reserved = admission::reserve(shared, group, op.subject_key(), growth).await?;
    let command = command(shared.clock.as_ref(), request, op);
    Coordinated::from_outcome(group.write(command).await?)
}

/// The error for an outcome (or a result) the proposed command cannot have. A `replayed` one
/// is the record of another request under the same id, kept before records had a digest
/// of their request (`RequestIdReused` refuses the others): nothing was applied now. Any
/// other is a fault of this build: the command's fate is not known from it. The message
/// shows nothing the outcome holds.
pub(crate) fn unexpected(replayed: bool) -> KvError {
    match replayed {
        true => KvError::invalid(
            "the request id's record is of a different request; a retry must repeat its request exactly, and a new request needs a new sequence",
        ),
        false => KvError::OutcomeUnknown {
            message: "the command was answered with an outcome of another kind; it may or may not have been applied".to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use keel_types::{LockHold, Rejection};

    use super::*;

    fn hold() -> LockHold {
        LockHold {
            owner: b"a".to_vec(),
            token: 4,
            expires_at_ms: 10,
            lock_delay_ms: 0,
        }
    }

    #[test]
    fn outcomes_read_as_results_or_errors() {
        let coordinated = CommandOutcome::Coordinated {
            revision: 4,
            result: CoordinationResult::Acquired(hold()),
        };
        let applied = Coordinated {
            revision: 4,
            result: CoordinationResult::Acquired(hold()),
            replayed: false,
        };
        let not_held = Rejection::LockNotHeld {
            name: b"l".to_vec(),
            token: 3,
            current_token: Some(4),
        };
        let cases: Vec<(CommandOutcome, Result<Coordinated, KvError>)> = vec![
            (coordinated.clone(), Ok(applied.clone())),
            (
                CommandOutcome::Replayed(Box::new(coordinated)),
                Ok(Coordinated {
                    replayed: true,
                    ..applied
                }),
            ),
            (
                CommandOutcome::Rejected(not_held.clone()),
                Err(not_held.clone().into()),
            ),
            (
                CommandOutcome::Replayed(Box::new(CommandOutcome::Rejected(not_held.clone()))),
                Err(not_held.into()),
            ),
        ];
        for (outcome, expected) in cases {
            assert_eq!(
                Coordinated::from_outcome(outcome.clone()),
                expected,
                "{outcome:?}"
            );
        }
        let applied = CommandOutcome::Applied {
            revision: 1,
            results: Vec::new(),
        };
        for outcome in [CommandOutcome::Internal, applied.clone()] {
            assert_eq!(Coordinated::from_outcome(outcome), Err(unexpected(false)));
        }
        // A replayed record of another kind of request: refused as such, showing none of it.
        let replayed = CommandOutcome::Replayed(Box::new(applied));
        assert_eq!(Coordinated::from_outcome(replayed), Err(unexpected(true)));
        assert!(matches!(unexpected(true), KvError::InvalidArgument { .. }));
    }
}
