//! Conversions of transactions (`keel_types::txn`) from the wire and of their results to it.
//! A compare without a target, an op without an op, an unknown enum value or a negative TTL
//! becomes `KvError::InvalidArgument`; limits are `validate::check_txn`'s.

use keel_types::KvError;
use keel_types::txn::{
    Compare, CompareResult, CompareTarget, ReadResult, RevisionFilter, Sort, SortTarget, Txn,
    TxnDelete, TxnOp, TxnOpResult, TxnPut, TxnRead, TxnResult, TxnSpan,
};

use super::{key_value, ttl_ms};
use crate::v1;

/// A wire transaction as a `Txn` (not yet checked against the limits).
pub fn txn(txn: v1::Txn) -> Result<Txn, KvError> {
    Ok(Txn {
        compares: txn
            .compares
            .into_iter()
            .map(compare)
            .collect::<Result<_, _>>()?,
        success: ops(txn.success)?,
        failure: ops(txn.failure)?,
    })
}

fn ops(ops: Vec<v1::TxnOp>) -> Result<Vec<TxnOp>, KvError> {
    ops.into_iter().map(op).collect()
}

fn span(span: Option<v1::TxnSpan>) -> Result<TxnSpan, KvError> {
    let span = span.ok_or_else(|| KvError::invalid("transaction span is unset; set its key"))?;
    Ok(match span.end {
        None => TxnSpan::key(span.key),
        Some(end) => TxnSpan::range(span.key, end),
    })
}

fn compare(compare: v1::Compare) -> Result<Compare, KvError> {
    let result = match v1::CompareResult::try_from(compare.result) {
        Ok(v1::CompareResult::CompareEqual) => CompareResult::Equal,
        Ok(v1::CompareResult::CompareNotEqual) => CompareResult::NotEqual,
        Ok(v1::CompareResult::CompareGreater) => CompareResult::Greater,
        Ok(v1::CompareResult::CompareLess) => CompareResult::Less,
        Err(_) => {
            return Err(KvError::invalid(format!(
                "compare result {} is unknown; use EQUAL, NOT_EQUAL, GREATER or LESS",
                compare.result
            )));
        }
    };
    use v1::compare::Target;
    let target = match compare.target {
        Some(Target::Value(value)) => CompareTarget::Value(value),
        Some(Target::Version(version)) => CompareTarget::Version(version),
        Some(Target::CreateRevision(revision)) => CompareTarget::CreateRevision(revision),
        Some(Target::ModRevision(revision)) => CompareTarget::ModRevision(revision),
        Some(Target::Lease(lease)) => CompareTarget::Lease(lease),
        None => {
            return Err(KvError::invalid(
                "compare has no target; set one of value, version, create_revision, mod_revision, lease",
            ));
        }
    };
    Ok(Compare {
        span: span(compare.span)?,
        result,
        target,
    })
}

fn op(op: v1::TxnOp) -> Result<TxnOp, KvError> {
    use v1::txn_op::Op;
    match op.op {
        Some(Op::Read(read)) => Ok(TxnOp::Read(txn_read(read)?)),
        Some(Op::Put(put)) => Ok(TxnOp::Put(TxnPut {
            ttl_ms: ttl_ms(&put.key, put.ttl_ms)?,
            key: put.key,
            value: put.value,
            previous: put.return_previous,
            lease: put.lease,
            ignore_value: put.ignore_value,
            ignore_lease: put.ignore_lease,
        })),
        Some(Op::Delete(delete)) => Ok(TxnOp::Delete(TxnDelete {
            span: span(delete.span)?,
            previous: delete.return_previous,
        })),
        Some(Op::Txn(nested)) => Ok(TxnOp::Txn(Box::new(txn(nested)?))),
        None => Err(KvError::invalid(
            "transaction op has no op; set one of read, put, delete, txn",
        )),
    }
}

/// A wire read as a `TxnRead`.
pub fn txn_read(read: v1::TxnRead) -> Result<TxnRead, KvError> {
    let sort = match read.sort {
        None => None,
        Some(target) => {
            let target = match v1::SortTarget::try_from(target) {
                Ok(v1::SortTarget::SortKey) => SortTarget::Key,
                Ok(v1::SortTarget::SortVersion) => SortTarget::Version,
                Ok(v1::SortTarget::SortCreateRevision) => SortTarget::CreateRevision,
                Ok(v1::SortTarget::SortModRevision) => SortTarget::ModRevision,
                Ok(v1::SortTarget::SortValue) => SortTarget::Value,
                Err(_) => {
                    return Err(KvError::invalid(format!(
                        "sort target {target} is unknown; use KEY, VERSION, CREATE_REVISION, MOD_REVISION or VALUE"
                    )));
                }
            };
            Some(Sort {
                target,
                descending: read.descending,
            })
        }
    };
    Ok(TxnRead {
        span: span(read.span)?,
        limit: read.limit,
        sort,
        filter: RevisionFilter {
            mod_revision_min: read.mod_revision_min,
            mod_revision_max: read.mod_revision_max,
            create_revision_min: read.create_revision_min,
            create_revision_max: read.create_revision_max,
        },
        keys_only: read.keys_only,
        count_only: read.count_only,
    })
}

/// A transaction's result as sent by a replica whose clock reads `now_ms`.
pub fn txn_result(result: TxnResult, now_ms: u64) -> v1::TxnResult {
    let kvs = |kvs: Vec<keel_types::KeyValue>| {
        kvs.into_iter()
            .map(|kv| key_value(kv, now_ms))
            .collect::<Vec<_>>()
    };
    use v1::txn_op_result::Result as Answer;
    let results = result.results.into_iter().map(|result| {
        let answer = match result {
            TxnOpResult::Read(ReadResult {
                kvs: rows,
                count,
                more,
            }) => Answer::Read(v1::TxnReadResult {
                kvs: kvs(rows),
                count,
                more,
            }),
            TxnOpResult::Put { previous } => Answer::Put(v1::TxnPutResult {
                previous: previous.map(|kv| key_value(kv, now_ms)),
            }),
            TxnOpResult::Delete { deleted, previous } => Answer::Delete(v1::TxnDeleteResult {
                deleted,
                previous: kvs(previous),
            }),
            TxnOpResult::Txn(nested) => Answer::Txn(txn_result(nested, now_ms)),
        };
        v1::TxnOpResult {
            result: Some(answer),
        }
    });
    v1::TxnResult {
        succeeded: result.succeeded,
        results: results.collect(),
    }
}
