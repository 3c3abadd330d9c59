use super::*;
use crate::validate::check_txn;

fn kv(key: &str, value: &str, create: Revision, modified: Revision, version: u64) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: value.into(),
        create_revision: create,
        mod_revision: modified,
        version,
        expires_at_ms: None,
        lease: 0,
    }
}

fn compare(result: CompareResult, target: CompareTarget) -> Compare {
    Compare {
        span: TxnSpan::key(b"k".to_vec()),
        result,
        target,
    }
}

#[test]
fn compares_follow_etcds_rules() {
    use CompareResult::*;
    use CompareTarget::*;
    let row = [kv("k", "b", 3, 7, 2)];
    let leased = [KeyValue {
        lease: 5,
        ..kv("k", "b", 3, 7, 2)
    }];
    let cases: Vec<(Compare, &[KeyValue], bool)> = vec![
        (compare(Equal, Version(0)), &[], true),
        (compare(Equal, Version(0)), &row, false),
        (compare(Equal, CreateRevision(0)), &[], true),
        (compare(Equal, ModRevision(7)), &row, true),
        (compare(Greater, ModRevision(6)), &row, true),
        (compare(Less, CreateRevision(3)), &row, false),
        (compare(NotEqual, Version(1)), &row, true),
        (compare(Equal, Value(b"b".to_vec())), &row, true),
        (compare(Greater, Value(b"a".to_vec())), &row, true),
        (compare(Less, Value(b"ba".to_vec())), &row, true),
        // A value compare never holds for an absent key, not even "not equal".
        (compare(NotEqual, Value(b"x".to_vec())), &[], false),
        (compare(Equal, Value(Vec::new())), &[], false),
        // An absent key, and a key attached to none, have lease 0.
        (compare(Equal, Lease(0)), &[], true),
        (compare(Equal, Lease(0)), &row, true),
        (compare(Equal, Lease(5)), &leased, true),
        (compare(Greater, Lease(4)), &leased, true),
        (compare(NotEqual, Lease(5)), &row, true),
    ];
    for (compare, rows, holds) in cases {
        assert_eq!(compare.holds(rows), holds, "{compare:?} on {rows:?}");
    }
}

#[test]
fn a_span_compare_holds_for_every_row() {
    let span = Compare {
        span: TxnSpan::range(b"a".to_vec(), b"z".to_vec()),
        result: CompareResult::Greater,
        target: CompareTarget::ModRevision(4),
    };
    assert!(span.holds(&[kv("a", "", 5, 5, 1), kv("b", "", 6, 9, 2)]));
    assert!(!span.holds(&[kv("a", "", 5, 5, 1), kv("b", "", 2, 4, 1)]));
}

#[test]
fn spans_contain_and_overlap() {
    let one = TxnSpan::key(b"b".to_vec());
    let range = TxnSpan::range(b"b".to_vec(), b"d".to_vec());
    let rest = TxnSpan::range(b"c".to_vec(), Vec::new());
    assert!(one.contains(b"b") && !one.contains(b"b\0"));
    assert!(range.contains(b"c") && !range.contains(b"d") && !range.contains(b"a"));
    assert!(rest.contains(b"zzz") && !rest.contains(b"b"));
    assert!(one.overlaps(&range) && range.overlaps(&rest));
    assert!(!one.overlaps(&rest));
    assert!(!TxnSpan::key(b"d".to_vec()).overlaps(&range));
    assert_eq!(one.end(), Some(b"b\0".to_vec()));
    assert_eq!(rest.end(), None);
}

fn read(limit: u64, sort: Option<Sort>) -> TxnRead {
    TxnRead {
        span: TxnSpan::range(b"a".to_vec(), Vec::new()),
        limit,
        sort,
        filter: RevisionFilter::default(),
        keys_only: false,
        count_only: false,
    }
}

fn keys(result: &ReadResult) -> Vec<String> {
    result
        .kvs
        .iter()
        .map(|kv| String::from_utf8_lossy(&kv.key).into_owned())
        .collect()
}

#[test]
fn a_read_sorts_then_limits() {
    let rows = || {
        vec![
            kv("a", "3", 9, 9, 1),
            kv("b", "1", 4, 12, 3),
            kv("c", "2", 6, 6, 1),
        ]
    };
    let by = |target, descending| Some(Sort { target, descending });
    let cases = [
        (read(0, None), vec!["a", "b", "c"], false),
        (read(2, None), vec!["a", "b"], true),
        (read(3, None), vec!["a", "b", "c"], false),
        (
            read(1, by(SortTarget::CreateRevision, false)),
            vec!["b"],
            true,
        ),
        (
            read(0, by(SortTarget::ModRevision, true)),
            vec!["b", "a", "c"],
            false,
        ),
        (
            read(0, by(SortTarget::Value, false)),
            vec!["b", "c", "a"],
            false,
        ),
        (read(2, by(SortTarget::Key, true)), vec!["c", "b"], true),
        // Equal versions keep key order.
        (
            read(0, by(SortTarget::Version, false)),
            vec!["a", "c", "b"],
            false,
        ),
    ];
    for (read, expected, more) in cases {
        let result = read.select(rows());
        assert_eq!(keys(&result), expected, "{read:?}");
        assert_eq!((result.count, result.more), (3, more), "{read:?}");
    }
}

#[test]
fn a_read_filters_by_revision_and_trims() {
    let rows = vec![
        kv("a", "x", 2, 2, 1),
        kv("b", "y", 3, 8, 2),
        kv("c", "z", 5, 5, 1),
    ];
    let mut filtered = read(0, None);
    filtered.filter = RevisionFilter {
        mod_revision_min: 3,
        create_revision_max: 4,
        ..RevisionFilter::default()
    };
    let result = filtered.select(rows.clone());
    assert_eq!((keys(&result), result.count), (vec!["b".to_string()], 3));

    let mut keys_only = read(0, None);
    keys_only.keys_only = true;
    assert!(
        keys_only
            .select(rows.clone())
            .kvs
            .iter()
            .all(|kv| kv.value.is_empty())
    );

    let mut count_only = read(1, None);
    count_only.count_only = true;
    let result = count_only.select(rows);
    assert_eq!((result.kvs.len(), result.count), (0, 3));
}

fn put(key: &str) -> TxnOp {
    TxnOp::Put(TxnPut {
        key: key.into(),
        value: b"v".to_vec(),
        ttl_ms: None,
        previous: false,
        lease: 0,
        ignore_value: false,
        ignore_lease: false,
    })
}

fn delete(key: &str, end: Option<&str>) -> TxnOp {
    let span = match end {
        None => TxnSpan::key(key.into()),
        Some(end) => TxnSpan::range(key.into(), end.into()),
    };
    TxnOp::Delete(TxnDelete {
        span,
        previous: false,
    })
}

fn txn(success: Vec<TxnOp>, failure: Vec<TxnOp>) -> Txn {
    Txn {
        compares: Vec::new(),
        success,
        failure,
    }
}

#[test]
fn a_branch_writes_each_key_once() {
    let nested = |success, failure| TxnOp::Txn(Box::new(txn(success, failure)));
    let cases = vec![
        (txn(vec![put("a"), put("b")], vec![put("a")]), true),
        (txn(vec![put("a"), put("a")], vec![]), false),
        (txn(vec![put("b"), delete("a", Some("c"))], vec![]), false),
        (
            txn(vec![delete("a", Some("c")), delete("b", Some("d"))], vec![]),
            true,
        ),
        (
            txn(
                vec![put("a"), nested(vec![put("b")], vec![put("b")])],
                vec![],
            ),
            true,
        ),
        (
            txn(vec![put("a"), nested(vec![], vec![put("a")])], vec![]),
            false,
        ),
        (
            txn(
                vec![nested(vec![put("c")], vec![]), delete("b", Some("d"))],
                vec![],
            ),
            false,
        ),
    ];
    for (txn, valid) in cases {
        assert_eq!(check_txn(&txn).is_ok(), valid, "{txn:?}");
    }
}

#[test]
fn a_transaction_is_checked_against_the_limits() {
    let too_many = txn((0..129).map(|i| put(&format!("k{i}"))).collect(), vec![]);
    let message = check_txn(&too_many).unwrap_err().to_string();
    assert!(
        message.contains("129 ops") && message.contains("limit is 128"),
        "{message}"
    );

    let mut deep = txn(vec![put("a")], vec![]);
    for _ in 0..8 {
        deep = txn(vec![TxnOp::Txn(Box::new(deep))], vec![]);
    }
    let message = check_txn(&deep).unwrap_err().to_string();
    assert!(message.contains("nests 9 deep"), "{message}");

    let backwards = txn(vec![delete("b", Some("a"))], vec![]);
    let message = check_txn(&backwards).unwrap_err().to_string();
    assert!(message.contains("not after its key"), "{message}");

    let empty_key = txn(vec![put("")], vec![]);
    assert!(check_txn(&empty_key).is_err());

    let rest = txn(vec![delete("a", Some(""))], vec![put("z")]);
    assert!(check_txn(&rest).is_ok());
}

#[test]
fn a_put_is_checked_against_etcds_lease_rules() {
    let put_with = |key: &str, value: &str, ttl_ms, lease, ignore: (bool, bool)| {
        let op = TxnOp::Put(TxnPut {
            key: key.into(),
            value: value.into(),
            ttl_ms,
            previous: false,
            lease,
            ignore_value: ignore.0,
            ignore_lease: ignore.1,
        });
        txn(vec![op], vec![])
    };
    let none = (false, false);
    let cases = [
        (put_with("etcd/a", "v", None, 7, none), None),
        (put_with("etcd/a", "", None, 0, (true, true)), None),
        (
            put_with("plain", "v", None, 7, none),
            Some("pinned namespace"),
        ),
        (
            put_with("etcd/a", "v", Some(10), 7, none),
            Some("takes no TTL"),
        ),
        (put_with("etcd/a", "v", None, -1, none), Some("below 0")),
        (
            put_with("etcd/a", "v", None, 7, (false, true)),
            Some("ignore_lease"),
        ),
        (
            put_with("etcd/a", "v", None, 0, (true, false)),
            Some("ignore_value"),
        ),
    ];
    for (txn, refusal) in cases {
        match (check_txn(&txn), refusal) {
            (Ok(()), None) => {}
            (Err(error), Some(part)) => {
                let message = error.to_string();
                assert!(message.contains(part), "{message}");
            }
            (got, expected) => panic!("{txn:?}: got {got:?}, expected {expected:?}"),
        }
    }
}
