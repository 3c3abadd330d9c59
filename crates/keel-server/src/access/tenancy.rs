//! A tenant's requests and answers, rewritten at the door (`access/mod.rs` says who the caller
//! is): every key, lock name, fence and idempotency scope of a request is moved into the
//! tenant's namespace (`Confine`), and every key, range and error of the answer is shown as
//! the tenant named it (`Reveal`), relayed answers of a leader included. Past the door the
//! node serves stored names only, so routing, forwarding, splits and storage know nothing
//! of tenants. Knows nothing of who may call what.

use keel_proto::v1::{
    AbortRequest, AbortResponse, AcquireRequest, AcquireResponse, BatchRequest, BatchResponse,
    BeginRequest, BeginResponse, CompleteRequest, CompleteResponse, DeleteRequest, DeleteResponse,
    Event, Fence, GetRequest, GetResponse, HistoryRequest, HistoryResponse, IdempotencyGetRequest,
    IdempotencyGetResponse, IncrementRequest, IncrementResponse, InspectRequest, InspectResponse,
    KeyValue, LeaderRequest, LeaderResponse, LeaseRequest, LeaseResponse, MembersResponse,
    OpenSessionResponse, PutRequest, PutResponse, RangesResponse, ReleaseRequest, ReleaseResponse,
    RenewRequest, RenewResponse, ScanRequest, ScanResponse, Txn, TxnRequest, TxnResponse,
    TxnResult, TxnSpan, WatchRequest, WatchResponse, batch_op, lease_response, txn_op,
    txn_op_result,
};
use keel_types::tenant::Namespace;
use keel_types::{ConditionFailed, KvError, RangeDescriptor};
use tonic::{Response, Status};

use crate::access::Caller;
use crate::status::{kv_error, to_status};

/// A request whose names move into a namespace.
pub(crate) trait Confine {
    fn confine(&mut self, namespace: &Namespace);
}

/// An answer whose names are shown as the namespace's tenant named them.
pub(crate) trait Reveal {
    fn reveal(&mut self, namespace: &Namespace);
}

impl Caller {
    /// `request` in the caller's namespace (unchanged for the raw keyspace).
    pub fn confine<R: Confine>(&self, mut request: R) -> R {
        if let Some(namespace) = self.namespace() {
            request.confine(namespace);
        }
        request
    }

    /// `answer` as the caller may see it: its names, and the error's, without the prefix.
    pub fn reveal<T: Reveal>(
        &self,
        answer: Result<Response<T>, Status>,
    ) -> Result<Response<T>, Status> {
        let Some(namespace) = self.namespace() else {
            return answer;
        };
        match answer {
            Ok(mut response) => {
                response.get_mut().reveal(namespace);
                Ok(response)
            }
            Err(status) => Err(reveal_status(status, namespace)),
        }
    }

    /// An error status as the caller may see it.
    pub fn reveal_status(&self, status: Status) -> Status {
        match self.namespace() {
            Some(namespace) => reveal_status(status, namespace),
            None => status,
        }
    }

    /// One message of a stream as the caller may see it (`reveal` for each message).
    pub fn reveal_message<T: Reveal>(&self, message: Result<T, Status>) -> Result<T, Status> {
        let Some(namespace) = self.namespace() else {
            return message;
        };
        match message {
            Ok(mut message) => {
                message.reveal(namespace);
                Ok(message)
            }
            Err(status) => Err(reveal_status(status, namespace)),
        }
    }
}

fn confine_name(name: &mut Vec<u8>, namespace: &Namespace) {
    *name = namespace.confine(name);
}

fn confine_fence(fence: &mut Option<Fence>, namespace: &Namespace) {
    if let Some(fence) = fence {
        confine_name(&mut fence.lock, namespace);
    }
}

fn reveal_name(name: &mut Vec<u8>, namespace: &Namespace) {
    *name = namespace.reveal(name).unwrap_or_default();
}

fn reveal_kv(kv: &mut Option<KeyValue>, namespace: &Namespace) {
    if let Some(kv) = kv {
        reveal_name(&mut kv.key, namespace);
    }
}

fn reveal_event(event: &mut Event, namespace: &Namespace) {
    reveal_name(&mut event.key, namespace);
    reveal_kv(&mut event.kv, namespace);
    reveal_kv(&mut event.prev_kv, namespace);
}

/// A range named in an error, as the tenant sees it; one holding none of the namespace shows
/// as an empty span (`[.., "")`), which holds no key of the tenant's either.
fn reveal_range(range: &RangeDescriptor, namespace: &Namespace) -> RangeDescriptor {
    namespace
        .reveal_range(range)
        .unwrap_or_else(|| RangeDescriptor {
            start: Vec::new(),
            end: Some(Vec::new()),
            ..range.clone()
        })
}

/// An error status as the tenant may see it: the typed error's names revealed, and the
/// message made again from it. A status without a detail (the transport's) is kept.
fn reveal_status(status: Status, namespace: &Namespace) -> Status {
    match kv_error(&status) {
        Some(error) => to_status(&reveal_error(error, namespace)),
        None => status,
    }
}

fn reveal_error(error: KvError, namespace: &Namespace) -> KvError {
    let reveal = |name: Vec<u8>| namespace.reveal(&name).unwrap_or_default();
    match error {
        KvError::ConditionFailed(failed) => KvError::from(ConditionFailed {
            key: reveal(failed.key),
            current: failed.current.map(|mut kv| {
                kv.key = reveal(kv.key);
                kv
            }),
            ..*failed
        }),
        KvError::NotACounter { key } => KvError::NotACounter { key: reveal(key) },
        KvError::Overflow {
            key,
            current,
            delta,
        } => KvError::Overflow {
            key: reveal(key),
            current,
            delta,
        },
        KvError::FencedOut {
            key,
            lock,
            current_token,
        } => KvError::FencedOut {
            key: reveal(key),
            lock: reveal(lock),
            current_token,
        },
        KvError::LockNotHeld {
            name,
            token,
            current_token,
        } => KvError::LockNotHeld {
            name: reveal(name),
            token,
            current_token,
        },
        KvError::RecordNotOwned {
            scope,
            id,
            token,
            current_token,
        } => KvError::RecordNotOwned {
            scope: reveal(scope),
            id,
            token,
            current_token,
        },
        KvError::KeyOutOfRange { key, range } => KvError::KeyOutOfRange {
            key: reveal(key),
            range: Box::new(reveal_range(&range, namespace)),
        },
        KvError::EpochMismatch {
            expected_epoch,
            range,
        } => KvError::EpochMismatch {
            expected_epoch,
            range: Box::new(reveal_range(&range, namespace)),
        },
        other => other,
    }
}

macro_rules! confine_field {
    ($($request:ty => $field:ident),* $(,)?) => {$(
        impl Confine for $request {
            fn confine(&mut self, namespace: &Namespace) {
                confine_name(&mut self.$field, namespace);
            }
        }
    )*};
}

confine_field!(
    GetRequest => key,
    HistoryRequest => key,
    LeaderRequest => key,
    IncrementRequest => key,
    AcquireRequest => name,
    RenewRequest => name,
    ReleaseRequest => name,
    InspectRequest => name,
    BeginRequest => scope,
    CompleteRequest => scope,
    AbortRequest => scope,
    IdempotencyGetRequest => scope,
    LeaseRequest => namespace,
);

impl Confine for PutRequest {
    fn confine(&mut self, namespace: &Namespace) {
        confine_name(&mut self.key, namespace);
        confine_fence(&mut self.fence, namespace);
    }
}

impl Confine for DeleteRequest {
    fn confine(&mut self, namespace: &Namespace) {
        confine_name(&mut self.key, namespace);
        confine_fence(&mut self.fence, namespace);
    }
}

impl Confine for BatchRequest {
    fn confine(&mut self, namespace: &Namespace) {
        for op in &mut self.ops {
            match &mut op.op {
                Some(batch_op::Op::Put(put)) => confine_name(&mut put.key, namespace),
                Some(batch_op::Op::Delete(delete)) => confine_name(&mut delete.key, namespace),
                Some(batch_op::Op::Increment(increment)) => {
                    confine_name(&mut increment.key, namespace)
                }
                None => {}
            }
        }
        confine_fence(&mut self.fence, namespace);
    }
}

impl Confine for ScanRequest {
    /// `[start, end)` of the tenant's names: from its namespace's start (an empty start) to
    /// its end (an empty end).
    fn confine(&mut self, namespace: &Namespace) {
        self.end = namespace.confine_end(&self.end);
        confine_name(&mut self.start, namespace);
    }
}

impl Confine for WatchRequest {
    /// As a scan: `[start, end)` of the tenant's names.
    fn confine(&mut self, namespace: &Namespace) {
        self.end = namespace.confine_end(&self.end);
        confine_name(&mut self.start, namespace);
        if !self.resume_key.is_empty() {
            confine_name(&mut self.resume_key, namespace);
        }
    }
}

/// Answers that name nothing of the keyspace.
macro_rules! nothing_to_reveal {
    ($($response:ty),* $(,)?) => {$(
        impl Reveal for $response {
            fn reveal(&mut self, _namespace: &Namespace) {}
        }
    )*};
}

nothing_to_reveal!(
    IncrementResponse,
    AcquireResponse,
    RenewResponse,
    ReleaseResponse,
    InspectResponse,
    BeginResponse,
    CompleteResponse,
    AbortResponse,
    IdempotencyGetResponse,
    OpenSessionResponse,
    MembersResponse,
    LeaderResponse,
);

impl Reveal for LeaseResponse {
    /// The keys a time-to-live lists.
    fn reveal(&mut self, namespace: &Namespace) {
        if let Some(lease_response::Result::Info(info)) = &mut self.result {
            for key in &mut info.keys {
                reveal_name(key, namespace);
            }
        }
    }
}

impl Reveal for GetResponse {
    fn reveal(&mut self, namespace: &Namespace) {
        reveal_kv(&mut self.kv, namespace);
    }
}

impl Reveal for HistoryResponse {
    fn reveal(&mut self, namespace: &Namespace) {
        for event in &mut self.events {
            reveal_event(event, namespace);
        }
    }
}

impl Reveal for WatchResponse {
    /// The covered span in the tenant's names: an end at the namespace's end is unbounded.
    fn reveal(&mut self, namespace: &Namespace) {
        if let Some(started) = &mut self.started {
            reveal_name(&mut started.start, namespace);
            reveal_name(&mut started.end, namespace);
        }
        for event in &mut self.events {
            reveal_event(event, namespace);
        }
    }
}

impl Reveal for PutResponse {
    fn reveal(&mut self, namespace: &Namespace) {
        reveal_kv(&mut self.previous, namespace);
    }
}

impl Reveal for DeleteResponse {
    fn reveal(&mut self, namespace: &Namespace) {
        reveal_kv(&mut self.previous, namespace);
    }
}

impl Reveal for BatchResponse {
    fn reveal(&mut self, namespace: &Namespace) {
        for result in &mut self.results {
            reveal_kv(&mut result.previous, namespace);
        }
    }
}

impl Reveal for ScanResponse {
    /// A page ends inside the namespace (its scan did); were it to end past it, the scan
    /// would be over for the tenant.
    fn reveal(&mut self, namespace: &Namespace) {
        for kv in &mut self.kvs {
            reveal_name(&mut kv.key, namespace);
        }
        if self.more {
            match namespace.reveal(&self.next_start) {
                Some(next) => self.next_start = next,
                None => {
                    self.more = false;
                    self.next_start.clear();
                }
            }
        }
    }
}

impl Reveal for RangesResponse {
    /// Only the ranges holding part of the namespace, cut to it. The size and load of a range
    /// that also holds others' keys (before it splits at the namespace's bounds) are not
    /// shown.
    fn reveal(&mut self, namespace: &Namespace) {
        self.ranges.retain_mut(|info| {
            let Some(descriptor) = info.descriptor.take() else {
                return false;
            };
            let range = RangeDescriptor::from(descriptor);
            let Some(seen) = namespace.reveal_range(&range) else {
                return false;
            };
            if !namespace.holds(&range) {
                info.size_bytes = 0;
                info.keys = 0;
                info.requests_per_sec = 0.0;
            }
            info.descriptor = Some(seen.into());
            true
        });
    }
}

#[cfg(test)]
mod tests;

impl Confine for TxnRequest {
    /// Every key and span end of the transaction, nested ones included, in the namespace: an
    /// empty span end (every key from the key on) ends at the namespace's end.
    fn confine(&mut self, namespace: &Namespace) {
        if let Some(txn) = &mut self.txn {
            confine_txn(txn, namespace);
        }
    }
}

fn confine_txn(txn: &mut Txn, namespace: &Namespace) {
    let span = |span: &mut Option<TxnSpan>| {
        if let Some(span) = span {
            span.end = span.end.as_ref().map(|end| namespace.confine_end(end));
            confine_name(&mut span.key, namespace);
        }
    };
    for compare in &mut txn.compares {
        span(&mut compare.span);
    }
    for op in txn.success.iter_mut().chain(&mut txn.failure) {
        match &mut op.op {
            Some(txn_op::Op::Read(read)) => span(&mut read.span),
            Some(txn_op::Op::Put(put)) => confine_name(&mut put.key, namespace),
            Some(txn_op::Op::Delete(delete)) => span(&mut delete.span),
            Some(txn_op::Op::Txn(nested)) => confine_txn(nested, namespace),
            None => {}
        }
    }
}

impl Reveal for TxnResponse {
    fn reveal(&mut self, namespace: &Namespace) {
        if let Some(result) = &mut self.result {
            reveal_txn(result, namespace);
        }
    }
}

fn reveal_txn(result: &mut TxnResult, namespace: &Namespace) {
    for result in &mut result.results {
        match &mut result.result {
            Some(txn_op_result::Result::Read(read)) => {
                for kv in &mut read.kvs {
                    reveal_name(&mut kv.key, namespace);
                }
            }
            Some(txn_op_result::Result::Put(put)) => reveal_kv(&mut put.previous, namespace),
            Some(txn_op_result::Result::Delete(delete)) => {
                for kv in &mut delete.previous {
                    reveal_name(&mut kv.key, namespace);
                }
            }
            Some(txn_op_result::Result::Txn(nested)) => reveal_txn(nested, namespace),
            None => {}
        }
    }
}
