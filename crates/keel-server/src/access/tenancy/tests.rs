use keel_proto::v1::{BatchDelete, BatchOp, BatchPut, RangeInfo};
use keel_types::RangeId;
use keel_types::tenant::TenantName;

use super::*;
use crate::access::Access;

fn acme() -> Namespace {
    Namespace::of(&TenantName::new("acme").unwrap())
}

fn range(start: &[u8], end: Option<&[u8]>) -> RangeDescriptor {
    RangeDescriptor {
        id: RangeId(4),
        start: start.to_vec(),
        end: end.map(<[u8]>::to_vec),
        epoch: 2,
        conf_version: 1,
        replicas: vec![1, 2, 3],
    }
}

#[test]
fn every_name_of_a_write_moves_into_the_namespace() {
    let ns = acme();
    let mut put = PutRequest {
        key: b"k".to_vec(),
        fence: Some(Fence {
            lock: b"l".to_vec(),
            token: 3,
        }),
        ..PutRequest::default()
    };
    put.confine(&ns);
    assert_eq!(put.key, ns.confine(b"k"));
    assert_eq!(put.fence.unwrap().lock, ns.confine(b"l"));
    let op = |op| BatchOp { op: Some(op) };
    let mut batch = BatchRequest {
        ops: vec![
            op(batch_op::Op::Put(BatchPut {
                key: b"a".to_vec(),
                ..BatchPut::default()
            })),
            op(batch_op::Op::Delete(BatchDelete {
                key: b"b".to_vec(),
                ..BatchDelete::default()
            })),
        ],
        ..BatchRequest::default()
    };
    batch.confine(&ns);
    let keys: Vec<Vec<u8>> = batch
        .ops
        .iter()
        .map(|op| match &op.op {
            Some(batch_op::Op::Put(put)) => put.key.clone(),
            Some(batch_op::Op::Delete(delete)) => delete.key.clone(),
            _ => unreachable!(),
        })
        .collect();
    assert_eq!(keys, vec![ns.confine(b"a"), ns.confine(b"b")]);
}

#[test]
fn a_scan_covers_the_namespace_only() {
    let ns = acme();
    let mut all = ScanRequest::default();
    all.confine(&ns);
    assert_eq!(
        (all.start.as_slice(), all.end.as_slice()),
        (ns.start(), ns.end())
    );
    let mut some = ScanRequest {
        start: b"b".to_vec(),
        end: b"d".to_vec(),
        ..ScanRequest::default()
    };
    some.confine(&ns);
    assert_eq!((some.start, some.end), (ns.confine(b"b"), ns.confine(b"d")));

    let mut page = ScanResponse {
        kvs: vec![KeyValue {
            key: ns.confine(b"b1"),
            ..KeyValue::default()
        }],
        more: true,
        next_start: ns.confine(b"c"),
        ..ScanResponse::default()
    };
    page.reveal(&ns);
    assert_eq!(page.kvs[0].key, b"b1");
    assert_eq!(page.next_start, b"c");
}

#[test]
fn the_range_table_shows_the_namespace_only() {
    let ns = acme();
    let info = |range: RangeDescriptor| RangeInfo {
        descriptor: Some(range.into()),
        keys: 5,
        ..RangeInfo::default()
    };
    let mut table = RangesResponse {
        ranges: vec![
            info(range(b"", Some(ns.start()))),
            info(range(ns.start(), Some(&ns.confine(b"m")))),
            info(range(&ns.confine(b"m"), None)),
        ],
        ..RangesResponse::default()
    };
    table.reveal(&ns);
    let seen: Vec<(RangeDescriptor, u64)> = table
        .ranges
        .into_iter()
        .map(|info| (info.descriptor.unwrap().into(), info.keys))
        .collect();
    assert_eq!(
        seen,
        vec![(range(b"", Some(b"m")), 5), (range(b"m", None), 0)],
        "the range before the namespace is gone; one spilling past it shows no counts"
    );
}

#[test]
fn errors_name_what_the_tenant_named() {
    let ns = acme();
    let access =
        Access::parse("[[tenant]]\nname = \"acme\"\ntokens = [\"acme-token-0123456789\"]").unwrap();
    let caller = Caller::Tenant(access.tenants()[0].clone());
    let caller_sees = |error: KvError| {
        let answer: Result<Response<GetResponse>, Status> = Err(to_status(&error));
        kv_error(&caller.reveal(answer).unwrap_err()).unwrap()
    };
    let failed = caller_sees(KvError::from(ConditionFailed {
        op_index: 0,
        key: ns.confine(b"k"),
        current: None,
        revision: 3,
    }));
    assert!(
        matches!(&failed, KvError::ConditionFailed(f) if f.key == b"k"),
        "{failed:?}"
    );
    match caller_sees(KvError::KeyOutOfRange {
        key: ns.confine(b"k"),
        range: Box::new(range(b"x", Some(ns.start()))),
    }) {
        KvError::KeyOutOfRange { key, range } => {
            assert_eq!(key, b"k");
            assert!(!range.contains(b"k") && !range.contains(b""), "{range}");
        }
        other => panic!("{other:?}"),
    }
    let fenced = caller_sees(KvError::FencedOut {
        key: ns.confine(b"k"),
        lock: ns.confine(b"l"),
        current_token: 9,
    });
    let message = fenced.to_string();
    assert!(
        message.contains("\"l\"") && !message.contains("acme"),
        "{message}"
    );
}

/// An attacker's transaction: spans reaching for the whole keyspace, a span end past any
/// name, a nested transaction. Every key and end lands inside the tenant's namespace.
#[test]
fn a_transaction_cannot_reach_outside_the_namespace() {
    use keel_proto::v1::{Compare, TxnDelete, TxnOp, TxnPut, TxnRead};
    let ns = acme();
    let span = |key: &[u8], end: Option<&[u8]>| {
        Some(TxnSpan {
            key: key.to_vec(),
            end: end.map(<[u8]>::to_vec),
        })
    };
    let op = |op| TxnOp { op: Some(op) };
    let nested = Txn {
        compares: vec![Compare {
            span: span(b"c", Some(b"")),
            ..Compare::default()
        }],
        success: vec![op(txn_op::Op::Delete(TxnDelete {
            span: span(b"\0", Some(b"")),
            return_previous: true,
        }))],
        failure: vec![op(txn_op::Op::Put(TxnPut {
            key: b"p".to_vec(),
            ..TxnPut::default()
        }))],
    };
    let mut request = TxnRequest {
        txn: Some(Txn {
            compares: Vec::new(),
            success: vec![
                op(txn_op::Op::Read(TxnRead {
                    span: span(b"a", Some(&[0xff; 8])),
                    ..TxnRead::default()
                })),
                op(txn_op::Op::Txn(nested)),
            ],
            failure: Vec::new(),
        }),
        ..TxnRequest::default()
    };
    request.confine(&ns);
    let txn = request.txn.unwrap();
    let Some(txn_op::Op::Read(read)) = &txn.success[0].op else {
        panic!("a read")
    };
    let read = read.span.clone().unwrap();
    assert_eq!(read.key, ns.confine(b"a"));
    assert!(read.end.unwrap().as_slice() <= ns.end());
    let Some(txn_op::Op::Txn(nested)) = &txn.success[1].op else {
        panic!("a nested transaction")
    };
    let compare = nested.compares[0].span.clone().unwrap();
    assert_eq!(
        (compare.key, compare.end),
        (ns.confine(b"c"), Some(ns.end().to_vec()))
    );
    let Some(txn_op::Op::Delete(delete)) = &nested.success[0].op else {
        panic!("a delete")
    };
    let delete = delete.span.clone().unwrap();
    assert_eq!(delete.key, ns.confine(b"\0"));
    assert_eq!(delete.end, Some(ns.end().to_vec()));
    let Some(txn_op::Op::Put(put)) = &nested.failure[0].op else {
        panic!("a put")
    };
    assert_eq!(put.key, ns.confine(b"p"));
}

#[test]
fn a_transactions_answer_names_keys_as_the_tenant_did() {
    use keel_proto::v1::{TxnDeleteResult, TxnOpResult, TxnReadResult};
    let ns = acme();
    let kv = |name: &[u8]| KeyValue {
        key: ns.confine(name),
        ..KeyValue::default()
    };
    let answer = |result| TxnOpResult {
        result: Some(result),
    };
    let mut response = TxnResponse {
        result: Some(TxnResult {
            succeeded: true,
            results: vec![
                answer(txn_op_result::Result::Read(TxnReadResult {
                    kvs: vec![kv(b"r")],
                    ..TxnReadResult::default()
                })),
                answer(txn_op_result::Result::Txn(TxnResult {
                    succeeded: false,
                    results: vec![answer(txn_op_result::Result::Delete(TxnDeleteResult {
                        deleted: 1,
                        previous: vec![kv(b"d")],
                    }))],
                })),
            ],
        }),
        ..TxnResponse::default()
    };
    response.reveal(&ns);
    let result = response.result.unwrap();
    let Some(txn_op_result::Result::Read(read)) = &result.results[0].result else {
        panic!("a read")
    };
    assert_eq!(read.kvs[0].key, b"r");
    let Some(txn_op_result::Result::Txn(nested)) = &result.results[1].result else {
        panic!("a nested result")
    };
    let Some(txn_op_result::Result::Delete(delete)) = &nested.results[0].result else {
        panic!("a delete")
    };
    assert_eq!(delete.previous[0].key, b"d");
}
