//! Transactions through the real writer and redb: the branch the compares choose, reads that
//! see the branch's earlier writes, span deletes, the revision a transaction takes (none when
//! it writes nothing), the bound on the rows it covers, and exactly-once replays.

use keel_types::txn::{
    Compare, CompareResult, CompareTarget, RevisionFilter, Sort, SortTarget, Txn, TxnDelete,
    TxnMutation, TxnOp, TxnOpResult, TxnPut, TxnRead, TxnResult, TxnSpan,
};
use keel_types::{BatchOp, Command, CommandOutcome, Rejection, RequestId, Revision, limits};

use super::{apply_commands, contents, mutate, open, put};

fn txn_command(request: Option<RequestId>, txn: Txn) -> Command {
    Command::Txn(TxnMutation {
        request,
        now_ms: 0,
        txn,
    })
}

fn put_op(key: &str, value: &str) -> TxnOp {
    TxnOp::Put(TxnPut {
        key: key.into(),
        value: value.into(),
        ttl_ms: None,
        previous: true,
        lease: 0,
        ignore_value: false,
        ignore_lease: false,
    })
}

fn read_op(span: TxnSpan, limit: u64, sort: Option<Sort>) -> TxnOp {
    TxnOp::Read(TxnRead {
        span,
        limit,
        sort,
        filter: RevisionFilter::default(),
        keys_only: false,
        count_only: false,
    })
}

fn range(key: &str, end: &str) -> TxnSpan {
    TxnSpan::range(key.into(), end.into())
}

/// "Create `key` unless it exists, else read it", as etcd's lock recipe does.
fn create_or_read(key: &str, value: &str) -> Txn {
    Txn {
        compares: vec![Compare {
            span: TxnSpan::key(key.into()),
            result: CompareResult::Equal,
            target: CompareTarget::CreateRevision(0),
        }],
        success: vec![put_op(key, value)],
        failure: vec![read_op(TxnSpan::key(key.into()), 0, None)],
    }
}

fn transacted(outcome: &CommandOutcome) -> (Revision, &TxnResult) {
    match outcome {
        CommandOutcome::Transacted { revision, result } => (*revision, result),
        other => panic!("expected a transaction's outcome, got {other:?}"),
    }
}

fn read_keys(result: &TxnOpResult) -> Vec<String> {
    match result {
        TxnOpResult::Read(read) => read
            .kvs
            .iter()
            .map(|kv| String::from_utf8(kv.key.clone()).unwrap())
            .collect(),
        other => panic!("expected a read, got {other:?}"),
    }
}

#[tokio::test]
async fn the_compares_choose_the_branch() {
    let (_dir, store) = open();
    let txns = vec![
        txn_command(None, create_or_read("lock", "first")),
        txn_command(None, create_or_read("lock", "second")),
    ];
    let outcomes = apply_commands(&store, 1, txns).await;
    let (revision, created) = transacted(&outcomes[0]);
    assert_eq!(revision, 1);
    assert!(created.succeeded);
    assert_eq!(created.results, vec![TxnOpResult::Put { previous: None }]);
    // The second found the key: it read it and wrote nothing, so it took no revision.
    let (revision, found) = transacted(&outcomes[1]);
    assert_eq!(revision, 1);
    assert!(!found.succeeded);
    let TxnOpResult::Read(read) = &found.results[0] else {
        panic!("the failure branch reads");
    };
    assert_eq!(
        (read.count, read.kvs[0].value.as_slice()),
        (1, b"first".as_slice())
    );
    assert_eq!(read.kvs[0].version, 1);
    let (rows, revision) = contents(&store).await;
    assert_eq!(rows.len(), 1);
    assert_eq!(revision, 1);
}

#[tokio::test]
async fn a_read_sees_the_writes_before_it_and_one_revision_covers_the_branch() {
    let (_dir, store) = open();
    let seed = mutate(vec![put("q/1", "a", None), put("q/2", "b", None)]);
    let txn = Txn {
        compares: Vec::new(),
        success: vec![
            put_op("q/3", "c"),
            put_op("q/1", "a2"),
            read_op(range("q/", "q0"), 0, None),
            // The newest creation first, limited to one.
            read_op(
                range("q/", "q0"),
                1,
                Some(Sort {
                    target: SortTarget::CreateRevision,
                    descending: true,
                }),
            ),
        ],
        failure: Vec::new(),
    };
    let outcomes = apply_commands(&store, 1, vec![seed, txn_command(None, txn)]).await;
    let (revision, result) = transacted(&outcomes[1]);
    assert_eq!(revision, 2, "every write of the branch at one revision");
    assert_eq!(read_keys(&result.results[2]), vec!["q/1", "q/2", "q/3"]);
    let TxnOpResult::Read(all) = &result.results[2] else {
        unreachable!()
    };
    assert_eq!(all.kvs[0].value, b"a2");
    assert_eq!(all.kvs[0].version, 2);
    assert_eq!(read_keys(&result.results[3]), vec!["q/3"]);
    let TxnOpResult::Put { previous } = &result.results[1] else {
        panic!("a put's result")
    };
    assert_eq!(
        previous.as_ref().map(|kv| kv.value.clone()),
        Some(b"a".to_vec())
    );
}

#[tokio::test]
async fn a_span_delete_removes_the_live_keys_of_the_span_only() {
    let (_dir, store) = open();
    let seed = mutate(vec![
        put("a", "1", None),
        put("b", "2", None),
        put("c", "3", None),
    ]);
    let delete = Txn {
        success: vec![TxnOp::Delete(TxnDelete {
            span: range("a", "c"),
            previous: true,
        })],
        ..Txn::default()
    };
    let outcomes = apply_commands(&store, 1, vec![seed, txn_command(None, delete)]).await;
    let (revision, result) = transacted(&outcomes[1]);
    assert_eq!(revision, 2);
    let TxnOpResult::Delete { deleted, previous } = &result.results[0] else {
        panic!("a delete's result")
    };
    assert_eq!(*deleted, 2);
    assert_eq!(previous.len(), 2);
    let (rows, _) = contents(&store).await;
    let keys: Vec<&str> = rows.iter().map(|row| row.0.as_str()).collect();
    assert_eq!(keys, vec!["c"]);
}

#[tokio::test]
async fn a_transaction_over_too_many_rows_is_refused_whole() {
    let (_dir, store) = open();
    let seeds: Vec<Command> = (0..limits::TXN_ROWS_MAX.div_ceil(limits::BATCH_OPS_MAX))
        .map(|batch| {
            let ops: Vec<BatchOp> = (0..limits::BATCH_OPS_MAX)
                .map(|i| put(&format!("k/{batch:03}/{i:03}"), "v", None))
                .collect();
            mutate(ops)
        })
        .collect();
    let seeded = seeds.len() as u64;
    apply_commands(&store, 1, seeds).await;
    let delete = Txn {
        success: vec![
            put_op("marker", "m"),
            TxnOp::Delete(TxnDelete {
                span: range("k/", "k0"),
                previous: false,
            }),
        ],
        ..Txn::default()
    };
    let outcomes = apply_commands(&store, seeded + 1, vec![txn_command(None, delete)]).await;
    assert_eq!(
        outcomes[0],
        CommandOutcome::Rejected(Rejection::TxnTooLarge {
            key: b"k/".to_vec()
        })
    );
    let (rows, revision) = contents(&store).await;
    assert_eq!(revision, seeded, "the refused transaction took no revision");
    assert!(
        rows.iter().all(|row| row.0 != "marker"),
        "and wrote nothing"
    );
}

#[tokio::test]
async fn a_retried_transaction_is_answered_from_its_record() {
    let (_dir, store) = open();
    let id = RequestId {
        client_id: 7,
        client_started_ms: 1,
        sequence: 1,
        completed_below: 1,
    };
    let txn = || txn_command(Some(id), create_or_read("once", "v"));
    let outcomes = apply_commands(&store, 1, vec![txn(), txn()]).await;
    let first = outcomes[0].clone();
    assert!(transacted(&first).1.succeeded);
    assert_eq!(outcomes[1], CommandOutcome::Replayed(Box::new(first)));
    let (_, revision) = contents(&store).await;
    assert_eq!(revision, 1);
}

/// A transaction as a log entry of format 11 holds it: its puts have no lease fields.
fn txn_v11(request: Option<RequestId>, key: &str, value: &str) -> Command {
    use keel_types::command::legacy::{TxnMutationV11, TxnOpV11, TxnPutV11, TxnV11};
    let put = TxnPutV11 {
        key: key.into(),
        value: value.into(),
        ttl_ms: None,
        previous: true,
    };
    Command::TxnV11(TxnMutationV11 {
        request,
        now_ms: 0,
        txn: TxnV11 {
            compares: Vec::new(),
            success: vec![TxnOpV11::Put(put)],
            failure: Vec::new(),
        },
    })
}

#[tokio::test]
async fn a_transaction_of_format_11_applies_and_replays_as_it_did() {
    let (_dir, store) = open();
    let id = RequestId {
        client_id: 8,
        client_started_ms: 1,
        sequence: 1,
        completed_below: 1,
    };
    let commands = vec![txn_v11(Some(id), "a", "1"), txn_v11(Some(id), "a", "1")];
    let outcomes = apply_commands(&store, 1, commands).await;
    let (revision, result) = transacted(&outcomes[0]);
    assert_eq!(revision, 1);
    assert_eq!(result.results, vec![TxnOpResult::Put { previous: None }]);
    // The retry's digest is the one its record holds: it is answered from the record.
    let replayed = CommandOutcome::Replayed(Box::new(outcomes[0].clone()));
    assert_eq!(outcomes[1], replayed);
    let (rows, revision) = contents(&store).await;
    assert_eq!((rows, revision), (vec![("a".into(), "1".into(), 1, 1)], 1));
}
