//! What the client's requests return, and their conversion from wire responses. Knows nothing
//! of endpoints or retries.

use keel_proto::v1;
use keel_types::{KeyValue, KvError, NodeId, OpResult, Revision};

/// A read of one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GetResult {
    /// `None` when the key is absent.
    pub kv: Option<KeyValue>,
    /// The range's applied revision the read reflects.
    pub revision: Revision,
    /// The node that served the read.
    pub served_by: NodeId,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PutResult {
    /// The revision of the write.
    pub revision: Revision,
    /// The key's state before the put, when asked for and present.
    pub previous: Option<KeyValue>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeleteResult {
    /// The revision of the write.
    pub revision: Revision,
    /// Whether the key existed.
    pub deleted: bool,
    /// The key's state before the delete, when asked for and present.
    pub previous: Option<KeyValue>,
}

/// One page of a scan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanResult {
    pub kvs: Vec<KeyValue>,
    /// The range's applied revision the page reflects.
    pub revision: Revision,
    /// `Some` when more rows follow: scan again from this key.
    pub next_start: Option<Vec<u8>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchResult {
    /// The revision all ops were applied at.
    pub revision: Revision,
    /// One result per op, in request order.
    pub results: Vec<OpResult>,
}

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
    Ok(GetResult {
        kv: response.kv.map(Into::into),
        revision: header.revision,
        served_by: header.served_by,
    })
}

pub(crate) fn put(response: v1::PutResponse) -> Result<PutResult, KvError> {
    let header = header(response.header, true)?;
    Ok(PutResult {
        revision: header.revision,
        previous: response.previous.map(Into::into),
    })
}

pub(crate) fn delete(response: v1::DeleteResponse) -> Result<DeleteResult, KvError> {
    let header = header(response.header, true)?;
    Ok(DeleteResult {
        revision: header.revision,
        deleted: response.deleted,
        previous: response.previous.map(Into::into),
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
        })
        .collect();
    Ok(BatchResult {
        revision: header.revision,
        results,
    })
}
