//! What the client's requests return, and their conversion from wire responses. Knows nothing
//! of endpoints or retries.

use std::time::Duration;

use keel_proto::v1;
use keel_types::{Event, KeyValue, KvError, NodeId, OpResult, Revision};

pub(crate) mod idempotency;
pub(crate) mod lock;
pub(crate) mod ranges;

pub use idempotency::{
    AbortResult, BeginResult, CompleteResult, IdempotencyGetResult, RecordState,
};
pub use lock::{AcquireResult, InspectResult, LockHolder, ReleaseResult, RenewResult};
pub use ranges::RangeInfo;

/// A read of one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GetResult {
    /// `None` when the key is absent.
    pub kv: Option<KeyValue>,
    /// Time the key has left, by the serving replica's clock when it read it; `None` when the
    /// key has no TTL (or is absent). `kv.expires_at_ms` is the absolute expiry, on the clock
    /// of the leader that wrote it.
    pub ttl_remaining: Option<Duration>,
    /// The range's applied revision the read reflects.
    pub revision: Revision,
    /// The node that served the read.
    pub served_by: NodeId,
}

/// A page of one key's history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryResult {
    /// Oldest first.
    pub events: Vec<Event>,
    /// Events at or below this revision may be gone on the serving replica; the page is
    /// complete above it.
    pub compact_revision: Revision,
    /// More events follow: ask again from `next_revision`.
    pub more: bool,
    pub next_revision: Revision,
    /// The range's applied revision the page reflects.
    pub revision: Revision,
    /// The node that served the page.
    pub served_by: NodeId,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PutResult {
    /// The revision of the write.
    pub revision: Revision,
    /// The key's state before the put, when asked for and present.
    pub previous: Option<KeyValue>,
    /// The write had been applied by an earlier attempt; this is that attempt's answer.
    pub replayed: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeleteResult {
    /// The revision of the write.
    pub revision: Revision,
    /// Whether the key existed.
    pub deleted: bool,
    /// The key's state before the delete, when asked for and present.
    pub previous: Option<KeyValue>,
    /// The write had been applied by an earlier attempt; this is that attempt's answer.
    pub replayed: bool,
}

/// An applied increment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IncrementResult {
    /// The key's value after the increment.
    pub value: i64,
    /// The revision of the write.
    pub revision: Revision,
    /// The increment had been applied by an earlier attempt; this is that attempt's answer
    /// (it was applied once).
    pub replayed: bool,
}

/// One page of a scan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanResult {
    pub kvs: Vec<KeyValue>,
    /// The range's applied revision the page reflects. A page that crosses range boundaries
    /// reflects each range at its own revision (revisions are per range); this is the first
    /// range's.
    pub revision: Revision,
    /// `Some` when more rows follow: scan again from this key.
    pub next_start: Option<Vec<u8>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchResult {
    /// The revision all ops were applied at.
    pub revision: Revision,
    /// One result per op, in request order; an increment's has its new value in `counter`.
    pub results: Vec<OpResult>,
    /// The batch had been applied by an earlier attempt; this is that attempt's answer.
    pub replayed: bool,
}

/// What `Client::batch_non_atomic` did. The ops were sent in parts, one per range; each part
/// was applied atomically (all its ops at one revision of its range) or not at all, but the
/// parts are independent: some may be applied and others not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NonAtomicBatchResult {
    /// One per op, in the caller's order: its result if its part was applied, else its
    /// part's error (`OutcomeUnknown`: the part may have been applied; any other error: it
    /// was not).
    pub results: Vec<Result<OpResult, KvError>>,
    /// The parts as last sent, in key order of their ranges.
    pub parts: Vec<BatchPart>,
}

/// One part of a non-atomic batch: the ops of one range, sent as one atomic batch with its
/// own request id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchPart {
    /// Indexes of the caller's ops it carried, ascending.
    pub ops: Vec<usize>,
    /// The revision the part was applied at, or its error.
    pub revision: Result<Revision, KvError>,
    /// The part had been applied by an earlier attempt; this is that attempt's answer.
    pub replayed: bool,
}

impl NonAtomicBatchResult {
    /// Whether every part was applied.
    pub fn applied(&self) -> bool {
        self.parts.iter().all(|part| part.revision.is_ok())
    }

    /// Every op's result in the caller's order if every part was applied; else the error
    /// of the first op (in the caller's order) whose part was not.
    pub fn into_results(self) -> Result<Vec<OpResult>, KvError> {
        self.results.into_iter().collect()
    }
}

/// A response that says which range served it (`ResponseHeader::range_id`; 0 = not said).
pub(crate) trait Served {
    fn range_id(&self) -> u64;
}

macro_rules! served {
    ($($response:ty),*) => {$(
        impl Served for $response {
            fn range_id(&self) -> u64 {
                self.header.as_ref().map_or(0, |header| header.range_id)
            }
        }
    )*};
}

served!(
    v1::GetResponse,
    v1::PutResponse,
    v1::DeleteResponse,
    v1::IncrementResponse,
    v1::ScanResponse,
    v1::HistoryResponse,
    v1::BatchResponse,
    v1::AcquireResponse,
    v1::RenewResponse,
    v1::ReleaseResponse,
    v1::InspectResponse,
    v1::BeginResponse,
    v1::CompleteResponse,
    v1::AbortResponse,
    v1::IdempotencyGetResponse
);

/// Answers that do not say which range served them.
macro_rules! unserved {
    ($($response:ty),*) => {$(
        impl Served for $response {
            fn range_id(&self) -> u64 {
                0
            }
        }
    )*};
}

unserved!(v1::OpenSessionResponse, v1::SplitResponse);

/// The header every successful response must carry. A response without one breaks the
/// protocol; for a write that was answered, the outcome is then unknown.
fn header(
    header: Option<v1::ResponseHeader>,
    is_write: bool,
) -> Result<v1::ResponseHeader, KvError> {
    let message = "the server's response has no header".to_string();
    match header {
        Some(header) => Ok(header),
        None if is_write => Err(KvError::OutcomeUnknown { message }),
        None => Err(KvError::Fatal { message }),
    }
}

pub(crate) fn get(response: v1::GetResponse) -> Result<GetResult, KvError> {
    let header = header(response.header, false)?;
    let ttl_remaining = response
        .kv
        .as_ref()
        .and_then(|kv| kv.ttl_remaining_ms)
        .map(Duration::from_millis);
    Ok(GetResult {
        kv: response.kv.map(Into::into),
        ttl_remaining,
        revision: header.revision,
        served_by: header.served_by,
    })
}

pub(crate) fn history(response: v1::HistoryResponse) -> Result<HistoryResult, KvError> {
    let header = header(response.header, false)?;
    Ok(HistoryResult {
        events: response.events.into_iter().map(Event::from).collect(),
        compact_revision: response.compact_revision,
        more: response.more,
        next_revision: response.next_revision,
        revision: header.revision,
        served_by: header.served_by,
    })
}

pub(crate) fn put(response: v1::PutResponse) -> Result<PutResult, KvError> {
    let header = header(response.header, true)?;
    Ok(PutResult {
        revision: header.revision,
        previous: response.previous.map(Into::into),
        replayed: header.replayed,
    })
}

pub(crate) fn delete(response: v1::DeleteResponse) -> Result<DeleteResult, KvError> {
    let header = header(response.header, true)?;
    Ok(DeleteResult {
        revision: header.revision,
        deleted: response.deleted,
        previous: response.previous.map(Into::into),
        replayed: header.replayed,
    })
}

pub(crate) fn increment(response: v1::IncrementResponse) -> Result<IncrementResult, KvError> {
    let header = header(response.header, true)?;
    Ok(IncrementResult {
        value: response.value,
        revision: header.revision,
        replayed: header.replayed,
    })
}

pub(crate) fn scan(response: v1::ScanResponse) -> Result<ScanResult, KvError> {
    let header = header(response.header, false)?;
    Ok(ScanResult {
        kvs: response.kvs.into_iter().map(Into::into).collect(),
        revision: header.revision,
        next_start: response.more.then_some(response.next_start),
    })
}

pub(crate) fn batch(response: v1::BatchResponse, ops: usize) -> Result<BatchResult, KvError> {
    let header = header(response.header, true)?;
    if response.results.len() != ops {
        return Err(KvError::OutcomeUnknown {
            message: format!(
                "the server answered {} results for {ops} ops",
                response.results.len()
            ),
        });
    }
    let results = response
        .results
        .into_iter()
        .map(|result| OpResult {
            previous: result.previous.map(Into::into),
            existed: result.existed,
            counter: result.counter,
        })
        .collect();
    Ok(BatchResult {
        revision: header.revision,
        results,
        replayed: header.replayed,
    })
}

/// The session a server opened: (`client_id`, `client_started_ms`).
pub(crate) fn session(response: v1::OpenSessionResponse) -> Result<(u64, u64), KvError> {
    if response.client_id == 0 {
        return Err(KvError::fatal(
            "the server opened a client session with id 0; ids are non-zero",
        ));
    }
    Ok((response.client_id, response.client_started_ms))
}
