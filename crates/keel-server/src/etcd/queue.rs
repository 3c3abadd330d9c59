//! The waiting line behind etcd's `Lock` and `Election` services, as etcd's own client
//! recipes build it: each contender puts `name/LEASE` (hex) attached to its lease, and the
//! contender whose key was created first holds the lock or leads; the others each wait for
//! the deletion of the key created just before theirs (by an unlock, a resignation or the
//! lease's end), then look again. Every step is an etcd call on this node's etcd `KV`
//! service (`EtcdKv`) or a Keel watch (`KvService`), with the caller's metadata, so tenancy
//! and routing are those of the calls it makes. Knows nothing of gRPC streams.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;

use keel_proto::etcd::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use keel_proto::etcd::etcdserverpb::kv_server::Kv as _;
use keel_proto::etcd::etcdserverpb::range_request::{SortOrder, SortTarget};
use keel_proto::etcd::etcdserverpb::request_op::Request as Op;
use keel_proto::etcd::etcdserverpb::response_op::Response as Answer;
use keel_proto::etcd::etcdserverpb::{
    Compare, DeleteRangeRequest, PutRequest, RangeRequest, RequestOp, ResponseHeader, TxnRequest,
};
use keel_proto::etcd::mvccpb;
use keel_proto::v1;
use keel_proto::v1::kv_server::Kv as _;
use tonic::metadata::MetadataMap;
use tonic::{Code, Request, Status};

use super::convert;
use super::kv::EtcdKv;
use crate::api::kv::KvService;

/// How long a contender waits before looking again when this node cannot watch the
/// namespace (it holds no replica of its range: Keel never forwards a watch).
const POLL_WITHOUT_WATCH: Duration = Duration::from_millis(200);

/// The etcd calls of one caller.
#[derive(Clone)]
pub(crate) struct Queue {
    pub etcd: Arc<EtcdKv>,
    pub keel: Arc<KvService>,
    pub metadata: MetadataMap,
}

/// A contender's place: its key and that key's create revision.
#[derive(Debug, Clone)]
pub(crate) struct Place {
    pub key: Vec<u8>,
    pub created: i64,
}

/// The key a contender with `lease` puts under `name`: `name/LEASE`, the lease in hex.
pub(crate) fn contender_key(name: &[u8], lease: i64) -> Vec<u8> {
    let mut key = prefix(name);
    key.extend_from_slice(format!("{lease:x}").as_bytes());
    key
}

/// The prefix of every contender's key under `name`.
pub(crate) fn prefix(name: &[u8]) -> Vec<u8> {
    let mut prefix = name.to_vec();
    prefix.push(b'/');
    prefix
}

/// The end of the span of keys that start with `prefix` (etcd's prefix end).
pub(crate) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

fn compare_created(key: &[u8], created: i64) -> Compare {
    Compare {
        result: CompareResult::Equal as i32,
        target: CompareTarget::Create as i32,
        key: key.to_vec(),
        range_end: Vec::new(),
        target_union: Some(TargetUnion::CreateRevision(created)),
    }
}

fn put_op(key: &[u8], value: &[u8], lease: i64) -> RequestOp {
    RequestOp {
        request: Some(Op::RequestPut(PutRequest {
            key: key.to_vec(),
            value: value.to_vec(),
            lease,
            ..PutRequest::default()
        })),
    }
}

impl Queue {
    fn request<T>(&self, message: T) -> Request<T> {
        let mut request = Request::new(message);
        *request.metadata_mut() = self.metadata.clone();
        request
    }

    async fn txn(&self, txn: TxnRequest) -> Result<(bool, Vec<Answer>, ResponseHeader), Status> {
        let answer = self.etcd.txn(self.request(txn)).await?.into_inner();
        let answers = answer.responses.into_iter().filter_map(|r| r.response);
        Ok((
            answer.succeeded,
            answers.collect(),
            answer.header.unwrap_or_default(),
        ))
    }

    async fn range(&self, range: RangeRequest) -> Result<(Vec<mvccpb::KeyValue>, i64), Status> {
        let answer = self.etcd.range(self.request(range)).await?.into_inner();
        Ok((answer.kvs, answer.header.unwrap_or_default().revision))
    }

    /// Puts `key` with `value` attached to `lease` unless it exists; a contender whose key
    /// exists (its session's, from an earlier call) keeps its place, with `value` put if it
    /// holds another. Its place.
    pub async fn join(&self, key: &[u8], value: &[u8], lease: i64) -> Result<Place, Status> {
        let read = RequestOp {
            request: Some(Op::RequestRange(RangeRequest {
                key: key.to_vec(),
                ..RangeRequest::default()
            })),
        };
        let txn = TxnRequest {
            compare: vec![compare_created(key, 0)],
            success: vec![put_op(key, value, lease)],
            failure: vec![read],
        };
        let (created, answers, header) = self.txn(txn).await?;
        if created {
            let place = Place {
                key: key.to_vec(),
                created: header.revision,
            };
            return Ok(place);
        }
        let existing = match answers.into_iter().next() {
            Some(Answer::ResponseRange(range)) => range.kvs.into_iter().next(),
            _ => None,
        };
        let Some(existing) = existing else {
            return Err(Status::aborted(
                "etcdserver: the contender's key went while it joined; try again",
            ));
        };
        let place = Place {
            key: key.to_vec(),
            created: existing.create_revision,
        };
        if existing.value != value {
            self.proclaim(&place, lease, value).await?;
        }
        Ok(place)
    }

    /// Puts `value` in the contender's key if it is still the one created at
    /// `place.created`; `FailedPrecondition` "election: not leader" otherwise.
    pub async fn proclaim(&self, place: &Place, lease: i64, value: &[u8]) -> Result<(), Status> {
        let txn = TxnRequest {
            compare: vec![compare_created(&place.key, place.created)],
            success: vec![put_op(&place.key, value, lease)],
            failure: Vec::new(),
        };
        match self.txn(txn).await? {
            (true, _, _) => Ok(()),
            (false, _, _) => Err(Status::failed_precondition(
                "etcdserver: election: not leader",
            )),
        }
    }

    /// Deletes the contender's key if it is still the one created at `created` (a key of
    /// a later session under the same lease is not this contender's).
    pub async fn leave(&self, key: &[u8], created: Option<i64>) -> Result<ResponseHeader, Status> {
        let delete = RequestOp {
            request: Some(Op::RequestDeleteRange(DeleteRangeRequest {
                key: key.to_vec(),
                ..DeleteRangeRequest::default()
            })),
        };
        let txn = TxnRequest {
            compare: created
                .map(|created| compare_created(key, created))
                .into_iter()
                .collect(),
            success: vec![delete],
            failure: Vec::new(),
        };
        Ok(self.txn(txn).await?.2)
    }

    /// The oldest contender under `name` (the holder or leader), and the revision read.
    pub async fn first(&self, name: &[u8]) -> Result<(Option<mvccpb::KeyValue>, i64), Status> {
        let prefix = prefix(name);
        let read = RangeRequest {
            range_end: prefix_end(&prefix),
            key: prefix,
            limit: 1,
            sort_order: SortOrder::Ascend as i32,
            sort_target: SortTarget::Create as i32,
            ..RangeRequest::default()
        };
        let (kvs, revision) = self.range(read).await?;
        Ok((kvs.into_iter().next(), revision))
    }

    /// Waits until no key under `name` was created before `place`: each time, for the
    /// deletion of the newest one that was.
    pub async fn wait_turn(&self, name: &[u8], place: &Place) -> Result<(), Status> {
        // Nothing is created before revision 1 (and etcd reads a bound of 0 as none).
        if place.created <= 1 {
            return Ok(());
        }
        let prefix = prefix(name);
        loop {
            let before = RangeRequest {
                range_end: prefix_end(&prefix),
                key: prefix.clone(),
                limit: 1,
                sort_order: SortOrder::Descend as i32,
                sort_target: SortTarget::Create as i32,
                max_create_revision: place.created - 1,
                ..RangeRequest::default()
            };
            let (kvs, revision) = self.range(before).await?;
            let Some(ahead) = kvs.into_iter().next() else {
                return Ok(());
            };
            self.changed(&ahead.key, None, revision + 1, true).await?;
        }
    }

    /// Waits for the first change of `key` (of every key from it to `end`, when given) from
    /// `from` on: a deletion only, when `deletes_only`. Without a replica here to watch,
    /// waits a moment instead, for the caller to look again.
    pub async fn changed(
        &self,
        key: &[u8],
        end: Option<Vec<u8>>,
        from: i64,
        deletes_only: bool,
    ) -> Result<(), Status> {
        let start = convert::key(key);
        let end = match end {
            Some(end) => convert::key(&end),
            None => [start.as_slice(), &[0]].concat(),
        };
        let watch = v1::WatchRequest {
            start,
            end,
            start_revision: u64::try_from(from).unwrap_or(0),
            no_put: deletes_only,
            ..v1::WatchRequest::default()
        };
        let mut stream = match self.keel.watch(self.request(watch)).await {
            Ok(stream) => stream.into_inner(),
            Err(status) if status.code() == Code::Unavailable => {
                tokio::time::sleep(POLL_WITHOUT_WATCH).await;
                return Ok(());
            }
            Err(status) => return Err(convert::status(status)),
        };
        loop {
            match stream.next().await {
                Some(Ok(message)) if !message.events.is_empty() => return Ok(()),
                Some(Ok(_)) => {}
                // The stream ended (a split, its replica went): look again.
                None => return Ok(()),
                Some(Err(status)) if status.code() == Code::Unavailable => return Ok(()),
                Some(Err(status)) => return Err(convert::status(status)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contenders_keys_are_the_name_and_the_lease_in_hex() {
        assert_eq!(contender_key(b"lock", 0x694d), b"lock/694d".to_vec());
        assert_eq!(prefix_end(b"lock/"), b"lock0".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b"\xff"), vec![0]);
    }
}
