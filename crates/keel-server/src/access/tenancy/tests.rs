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
