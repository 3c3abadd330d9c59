//! etcd's requests as Keel's and Keel's answers as etcd's: every etcd key moves under the
//! etcd namespace (`keel_types::pinned::ETCD_PREFIX`) and back, etcd's `range_end`
//! conventions become spans of it, a compare, op or transaction becomes a `keel.v1` one, and
//! an error becomes the status etcd's clients recognise. Knows nothing of serving.

use keel_proto::etcd::etcdserverpb::{
    self as etcd, Compare, DeleteRangeRequest, PutRequest, RangeRequest, RequestOp, TxnRequest,
    compare, range_request, request_op,
};
use keel_proto::etcd::mvccpb;
use keel_proto::v1;
use keel_types::pinned::{ETCD_PREFIX, pinned_span};
use keel_types::txn::ReadResult;
use keel_types::{KeyValue, KvError};
use tonic::{Code, Status};

use crate::status::{kv_error, to_status};

/// The stored form of an etcd key.
pub fn key(key: &[u8]) -> Vec<u8> {
    let mut stored = Vec::with_capacity(ETCD_PREFIX.len() + key.len());
    stored.extend_from_slice(ETCD_PREFIX);
    stored.extend_from_slice(key);
    stored
}

/// The end of the etcd namespace.
fn namespace_end() -> Vec<u8> {
    pinned_span(ETCD_PREFIX)
        .expect("the etcd prefix is pinned")
        .1
}

/// The span of etcd's `(key, range_end)`: the key alone for an empty `range_end`, every key
/// from `key` on for `"\0"`, else `[key, range_end)`; all in the namespace.
pub fn span(key_bytes: &[u8], range_end: &[u8]) -> Result<v1::TxnSpan, Status> {
    if key_bytes.is_empty() {
        return Err(Status::invalid_argument("etcdserver: key is not provided"));
    }
    let end = match range_end {
        [] => None,
        [0] => Some(namespace_end()),
        end => Some(key(end)),
    };
    Ok(v1::TxnSpan {
        key: key(key_bytes),
        end,
    })
}

/// The etcd key of a stored one (every stored key the adapter reads is in the namespace).
pub fn etcd_key(stored: Vec<u8>) -> Vec<u8> {
    match stored.strip_prefix(ETCD_PREFIX) {
        Some(name) => name.to_vec(),
        None => stored,
    }
}

/// A Keel answer's key as etcd's.
pub fn key_value(kv: v1::KeyValue) -> mvccpb::KeyValue {
    stored_key_value(KeyValue::from(kv))
}

/// A stored key as etcd's.
pub fn stored_key_value(kv: KeyValue) -> mvccpb::KeyValue {
    mvccpb::KeyValue {
        key: etcd_key(kv.key),
        create_revision: revision(kv.create_revision),
        mod_revision: revision(kv.mod_revision),
        version: revision(kv.version),
        value: kv.value,
        lease: kv.lease,
    }
}

/// etcd's header of an answer node `member_id` gives at revision `at` and Raft `term` (Keel
/// has no cluster id: 0).
pub fn header(member_id: u64, at: u64, term: u64) -> etcd::ResponseHeader {
    etcd::ResponseHeader {
        cluster_id: 0,
        member_id,
        revision: revision(at),
        raft_term: term,
    }
}

/// A read's result as etcd's range answer.
pub fn range_response(header: etcd::ResponseHeader, result: ReadResult) -> etcd::RangeResponse {
    etcd::RangeResponse {
        header: Some(header),
        kvs: result.kvs.into_iter().map(stored_key_value).collect(),
        more: result.more,
        count: revision(result.count),
    }
}

/// A Keel revision as etcd's signed one.
pub fn revision(revision: u64) -> i64 {
    i64::try_from(revision).unwrap_or(i64::MAX)
}

/// etcd's signed revision, which must not be negative.
pub fn unsigned(what: &str, value: i64) -> Result<u64, Status> {
    u64::try_from(value)
        .map_err(|_| Status::invalid_argument(format!("etcdserver: {what} is negative ({value})")))
}

/// An etcd range read as a transaction read of the same span.
pub fn read(request: &RangeRequest) -> Result<v1::TxnRead, Status> {
    let sort = match range_request::SortTarget::try_from(request.sort_target) {
        Ok(range_request::SortTarget::Key) => v1::SortTarget::SortKey,
        Ok(range_request::SortTarget::Version) => v1::SortTarget::SortVersion,
        Ok(range_request::SortTarget::Create) => v1::SortTarget::SortCreateRevision,
        Ok(range_request::SortTarget::Mod) => v1::SortTarget::SortModRevision,
        Ok(range_request::SortTarget::Value) => v1::SortTarget::SortValue,
        Err(_) => return Err(Status::invalid_argument("etcdserver: invalid sort target")),
    };
    let (sort, descending) = match range_request::SortOrder::try_from(request.sort_order) {
        // etcd sorts by key ascending when no order is given, whatever the target.
        Ok(range_request::SortOrder::None) => (None, false),
        Ok(range_request::SortOrder::Ascend) => (Some(sort), false),
        Ok(range_request::SortOrder::Descend) => (Some(sort), true),
        Err(_) => return Err(Status::invalid_argument("etcdserver: invalid sort order")),
    };
    Ok(v1::TxnRead {
        span: Some(span(&request.key, &request.range_end)?),
        limit: unsigned("limit", request.limit)?,
        sort: sort.map(|sort| sort as i32),
        descending,
        mod_revision_min: unsigned("min_mod_revision", request.min_mod_revision)?,
        mod_revision_max: unsigned("max_mod_revision", request.max_mod_revision)?,
        create_revision_min: unsigned("min_create_revision", request.min_create_revision)?,
        create_revision_max: unsigned("max_create_revision", request.max_create_revision)?,
        keys_only: request.keys_only,
        count_only: request.count_only,
    })
}

/// An etcd put as a transaction put: with its lease (0 detaches the key from any) and
/// etcd's flags that keep the key's value or lease.
pub fn put(request: &PutRequest) -> Result<v1::TxnPut, Status> {
    if request.key.is_empty() {
        return Err(Status::invalid_argument("etcdserver: key is not provided"));
    }
    Ok(v1::TxnPut {
        key: key(&request.key),
        value: request.value.clone(),
        ttl_ms: None,
        return_previous: request.prev_kv,
        lease: request.lease,
        ignore_value: request.ignore_value,
        ignore_lease: request.ignore_lease,
    })
}

pub fn delete(request: &DeleteRangeRequest) -> Result<v1::TxnDelete, Status> {
    Ok(v1::TxnDelete {
        span: Some(span(&request.key, &request.range_end)?),
        return_previous: request.prev_kv,
    })
}

/// An etcd transaction as Keel's. Reads inside it must read the current revision.
pub fn txn(request: &TxnRequest) -> Result<v1::Txn, Status> {
    let ops = |ops: &[RequestOp]| ops.iter().map(op).collect::<Result<Vec<_>, _>>();
    Ok(v1::Txn {
        compares: request
            .compare
            .iter()
            .map(compare)
            .collect::<Result<_, _>>()?,
        success: ops(&request.success)?,
        failure: ops(&request.failure)?,
    })
}

fn op(op: &RequestOp) -> Result<v1::TxnOp, Status> {
    use v1::txn_op::Op;
    let op = match &op.request {
        Some(request_op::Request::RequestRange(range)) => {
            if range.revision != 0 {
                return Err(Status::invalid_argument(
                    "etcdserver: a range inside a transaction reads its revision; revision must be 0 (see docs/ETCD.md)",
                ));
            }
            Op::Read(read(range)?)
        }
        Some(request_op::Request::RequestPut(request)) => Op::Put(put(request)?),
        Some(request_op::Request::RequestDeleteRange(request)) => Op::Delete(delete(request)?),
        Some(request_op::Request::RequestTxn(nested)) => Op::Txn(txn(nested)?),
        None => return Err(Status::invalid_argument("etcdserver: request op is empty")),
    };
    Ok(v1::TxnOp { op: Some(op) })
}

fn compare(request: &Compare) -> Result<v1::Compare, Status> {
    use compare::{CompareResult, CompareTarget, TargetUnion};
    use v1::compare::Target;
    let result = match CompareResult::try_from(request.result) {
        Ok(CompareResult::Equal) => v1::CompareResult::CompareEqual,
        Ok(CompareResult::NotEqual) => v1::CompareResult::CompareNotEqual,
        Ok(CompareResult::Greater) => v1::CompareResult::CompareGreater,
        Ok(CompareResult::Less) => v1::CompareResult::CompareLess,
        Err(_) => {
            return Err(Status::invalid_argument(
                "etcdserver: invalid compare result",
            ));
        }
    };
    let operand = |value: Option<&TargetUnion>| match value {
        Some(
            TargetUnion::Version(number)
            | TargetUnion::CreateRevision(number)
            | TargetUnion::ModRevision(number)
            | TargetUnion::Lease(number),
        ) => *number,
        _ => 0,
    };
    let union = request.target_union.as_ref();
    let number = |what| unsigned(what, operand(union));
    let target = match CompareTarget::try_from(request.target) {
        Ok(CompareTarget::Version) => Target::Version(number("version")?),
        Ok(CompareTarget::Create) => Target::CreateRevision(number("create_revision")?),
        Ok(CompareTarget::Mod) => Target::ModRevision(number("mod_revision")?),
        Ok(CompareTarget::Value) => match union {
            Some(TargetUnion::Value(value)) => Target::Value(value.clone()),
            _ => Target::Value(Vec::new()),
        },
        Ok(CompareTarget::Lease) => Target::Lease(operand(union)),
        Err(_) => {
            return Err(Status::invalid_argument(
                "etcdserver: invalid compare target",
            ));
        }
    };
    Ok(v1::Compare {
        span: Some(span(&request.key, &request.range_end)?),
        result: result as i32,
        target: Some(target),
    })
}

/// A Keel answer to a transaction as etcd's responses, one per op of the branch taken.
pub fn responses(result: v1::TxnResult, header: &etcd::ResponseHeader) -> Vec<etcd::ResponseOp> {
    use etcd::response_op::Response;
    use v1::txn_op_result::Result as Answer;
    let kvs = |kvs: Vec<v1::KeyValue>| kvs.into_iter().map(key_value).collect::<Vec<_>>();
    let wrapped = Some(*header);
    result
        .results
        .into_iter()
        .filter_map(|result| result.result)
        .map(|answer| {
            let response = match answer {
                Answer::Read(read) => Response::ResponseRange(etcd::RangeResponse {
                    header: wrapped,
                    kvs: kvs(read.kvs),
                    more: read.more,
                    count: revision(read.count),
                }),
                Answer::Put(put) => Response::ResponsePut(etcd::PutResponse {
                    header: wrapped,
                    prev_kv: put.previous.map(key_value),
                }),
                Answer::Delete(delete) => {
                    Response::ResponseDeleteRange(etcd::DeleteRangeResponse {
                        header: wrapped,
                        deleted: revision(delete.deleted),
                        prev_kvs: kvs(delete.previous),
                    })
                }
                Answer::Txn(nested) => Response::ResponseTxn(etcd::TxnResponse {
                    header: wrapped,
                    succeeded: nested.succeeded,
                    responses: responses(nested, header),
                }),
            };
            etcd::ResponseOp {
                response: Some(response),
            }
        })
        .collect()
}

/// A Keel error as etcd's clients know it (`status`).
pub fn kv_status(error: &KvError) -> Status {
    status(to_status(error))
}

/// The answer to an etcd call Keel does not serve: what it is, and what to do `instead`.
pub fn unsupported(what: &str, instead: &str) -> Status {
    Status::unimplemented(format!(
        "etcdserver: {what} is not supported by Keel; {instead} (see docs/ETCD.md)"
    ))
}

/// A Keel error status as etcd's clients know it: the errors they act on carry etcd's own
/// messages (its clients match them), the rest keep their code and say what Keel said.
pub fn status(status: Status) -> Status {
    let Some(error) = kv_error(&status) else {
        return status;
    };
    match error {
        KvError::Compacted { .. } => Status::new(
            Code::OutOfRange,
            "etcdserver: mvcc: required revision has been compacted",
        ),
        KvError::FutureRevision { .. } => Status::new(
            Code::OutOfRange,
            "etcdserver: mvcc: required revision is a future revision",
        ),
        KvError::LeaseNotFound { .. } => {
            Status::new(Code::NotFound, "etcdserver: requested lease not found")
        }
        KvError::KeyOutOfRange { .. } => Status::new(
            Code::FailedPrecondition,
            format!(
                "etcdserver: the etcd namespace spans more than one Keel range; keep it in one (see docs/ETCD.md): {}",
                status.message()
            ),
        ),
        _ => Status::new(status.code(), format!("etcdserver: {}", status.message())),
    }
}
