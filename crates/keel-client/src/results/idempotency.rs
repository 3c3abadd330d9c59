//! What the idempotency calls return, and their conversion from wire responses.

use std::time::Duration;

use keel_proto::v1;
use keel_types::{KvError, NodeId, Revision};

use super::header;

/// The answer to a begin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BeginResult {
    /// The caller owns the record under `token`: do the work, then complete or abort it.
    /// After `ttl_remaining` another caller may take it over.
    Started { token: u64, ttl_remaining: Duration },
    /// Another owner is doing the work; it may be taken over after `ttl_remaining`.
    InProgress {
        owner: Vec<u8>,
        ttl_remaining: Duration,
    },
    /// The work was done; `result` is kept for `ttl_remaining`.
    Completed {
        result: Vec<u8>,
        ttl_remaining: Duration,
    },
}

/// A live idempotency record as a read finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordState {
    InProgress {
        owner: Vec<u8>,
        ttl_remaining: Duration,
    },
    Completed {
        result: Vec<u8>,
        ttl_remaining: Duration,
    },
}

/// A read of an idempotency record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyGetResult {
    /// `None` when there is no live record.
    pub state: Option<RecordState>,
    /// The range's applied revision the read reflects.
    pub revision: Revision,
    pub served_by: NodeId,
}

/// A stored result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompleteResult {
    /// The result as stored (the first one, if the complete was repeated).
    pub result: Vec<u8>,
    /// How long the result is kept.
    pub ttl_remaining: Duration,
    pub revision: Revision,
    pub replayed: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AbortResult {
    pub revision: Revision,
    pub replayed: bool,
}

fn missing(what: &str) -> KvError {
    KvError::OutcomeUnknown {
        message: format!("the server answered a {what} with no record state"),
    }
}

pub(crate) fn begin(response: v1::BeginResponse) -> Result<BeginResult, KvError> {
    header(response.header, true)?;
    use v1::begin_response::State;
    let ms = Duration::from_millis;
    match response.state.ok_or_else(|| missing("begin"))? {
        State::Started(started) => Ok(BeginResult::Started {
            token: started.token,
            ttl_remaining: ms(started.ttl_remaining_ms),
        }),
        State::InProgress(in_progress) => Ok(BeginResult::InProgress {
            owner: in_progress.owner,
            ttl_remaining: ms(in_progress.ttl_remaining_ms),
        }),
        State::Completed(completed) => Ok(BeginResult::Completed {
            result: completed.result,
            ttl_remaining: ms(completed.ttl_remaining_ms),
        }),
    }
}

pub(crate) fn complete(response: v1::CompleteResponse) -> Result<CompleteResult, KvError> {
    let header = header(response.header, true)?;
    let completed = response.completed.ok_or_else(|| missing("complete"))?;
    Ok(CompleteResult {
        result: completed.result,
        ttl_remaining: Duration::from_millis(completed.ttl_remaining_ms),
        revision: header.revision,
        replayed: header.replayed,
    })
}

pub(crate) fn abort(response: v1::AbortResponse) -> Result<AbortResult, KvError> {
    let header = header(response.header, true)?;
    Ok(AbortResult {
        revision: header.revision,
        replayed: header.replayed,
    })
}

pub(crate) fn get(response: v1::IdempotencyGetResponse) -> Result<IdempotencyGetResult, KvError> {
    let header = header(response.header, false)?;
    use v1::idempotency_get_response::State;
    let ms = Duration::from_millis;
    let state = response.state.map(|state| match state {
        State::InProgress(in_progress) => RecordState::InProgress {
            owner: in_progress.owner,
            ttl_remaining: ms(in_progress.ttl_remaining_ms),
        },
        State::Completed(completed) => RecordState::Completed {
            result: completed.result,
            ttl_remaining: ms(completed.ttl_remaining_ms),
        },
    });
    Ok(IdempotencyGetResult {
        state,
        revision: header.revision,
        served_by: header.served_by,
    })
}
