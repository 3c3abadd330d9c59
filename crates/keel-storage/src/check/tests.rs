//! Digests through the real apply path: every replica hashes the state as of the check's
//! index, equal states hash equal, and a changed (a key's version or lease included) or
//! unreadable row is found.

use std::time::Duration;

use futures::stream;
use keel_types::check::{divergent_buckets, divergent_rows, judge};
use keel_types::{
    Check, CheckedRow, Command, CommandOutcome, Hold, RangeId, Rejection, ReplicaAnswer, Verdict,
};
use openraft::entry::RaftEntry;
use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine};

use crate::raft_types::{Entry, TypeConfig};
use crate::state_machine::tests::{apply_commands, mutate, open, put};
use crate::store::Store;

const WAIT: Duration = Duration::from_secs(30);

/// Applies one command per item at consecutive indexes from `first`, through
/// `StateMachine::apply` (as openraft does), in one call.
async fn apply(store: &Store, first: u64, commands: Vec<Command>) {
    let items: Vec<_> = commands
        .into_iter()
        .enumerate()
        .map(|(offset, command)| {
            let log_id = openraft::testing::log_id::<TypeConfig>(1, 1, first + offset as u64);
            Ok((Entry::new_normal(log_id, command), None))
        })
        .collect();
    let mut machine = store.state_machine(RangeId(1));
    machine.apply(stream::iter(items)).await.unwrap();
}

fn check(locate: Vec<u16>) -> Command {
    Command::Check(Check { locate })
}

fn write(key: &str, value: &str) -> Command {
    mutate(vec![put(key, value, None)])
}

async fn digest(store: &Store, index: u64) -> keel_types::RangeDigest {
    match store.state_machine(RangeId(1)).digest(index, WAIT).await {
        ReplicaAnswer::Digest(digest) => digest,
        other => panic!("no digest at {index}: {other:?}"),
    }
}

#[tokio::test]
async fn a_check_hashes_the_state_as_of_its_index() {
    let (_a, ahead) = open();
    let (_b, behind) = open();
    // One apply call holds the check and writes after it: they must not be in its digest.
    let writes = vec![write("a", "1"), write("b", "2"), check(vec![])];
    let mut more = writes.clone();
    more.extend([write("a", "changed"), write("c", "3")]);
    apply(&ahead, 1, more).await;
    apply(&behind, 1, writes).await;
    let (x, y) = (digest(&ahead, 3).await, digest(&behind, 3).await);
    assert_eq!(x.hash, y.hash);
    assert_eq!(x.rows, 2, "two rows at index 3");
    // A later check on the store that went on sees the later writes.
    apply(&ahead, 6, vec![check(vec![])]).await;
    assert_ne!(digest(&ahead, 6).await.hash, x.hash);
    for store in [ahead, behind] {
        store.shutdown();
    }
}

#[tokio::test]
async fn a_key_that_differs_only_in_its_version_differs() {
    let (_a, twice) = open();
    let (_b, once) = open();
    // One revision each: `a` = "1" created and modified at 1, written twice or once.
    let batch = mutate(vec![put("a", "0", None), put("a", "1", None)]);
    apply(&twice, 1, vec![batch, check(vec![])]).await;
    apply(&once, 1, vec![write("a", "1"), check(vec![])]).await;
    for store in [&twice, &once] {
        let kv = store
            .state_machine(RangeId(1))
            .get(b"a", 0)
            .await
            .unwrap()
            .0;
        let kv = kv.expect("a is stored");
        assert_eq!((kv.value.as_slice(), kv.mod_revision), (&b"1"[..], 1));
    }
    let (x, y) = (digest(&twice, 2).await, digest(&once, 2).await);
    assert_ne!(x.hash, y.hash);
    assert_eq!(
        divergent_buckets(&x, &y),
        vec![CheckedRow::Key(b"a".to_vec()).bucket()]
    );
    for store in [twice, once] {
        store.shutdown();
    }
}

#[tokio::test]
async fn a_key_that_differs_only_in_its_lease_differs() {
    use keel_types::txn::{Txn, TxnMutation, TxnOp, TxnPut};
    use keel_types::{LeaseMutation, LeaseOp};
    let grant = Command::Lease(LeaseMutation {
        request: None,
        now_ms: 0,
        op: LeaseOp::Grant {
            namespace: b"etcd/".to_vec(),
            id: 3,
            ttl_ms: 60_000,
        },
    });
    let put_leased = |lease| {
        let put = TxnPut {
            key: b"etcd/k".to_vec(),
            value: b"v".to_vec(),
            ttl_ms: None,
            previous: false,
            lease,
            ignore_value: false,
            ignore_lease: false,
        };
        Command::Txn(TxnMutation {
            request: None,
            now_ms: 0,
            txn: Txn {
                compares: Vec::new(),
                success: vec![TxnOp::Put(put)],
                failure: Vec::new(),
            },
        })
    };
    let (_a, leased) = open();
    let (_b, plain) = open();
    apply(
        &leased,
        1,
        vec![grant.clone(), put_leased(3), check(vec![])],
    )
    .await;
    apply(&plain, 1, vec![grant, put_leased(0), check(vec![])]).await;
    let (x, y) = (digest(&leased, 3).await, digest(&plain, 3).await);
    assert_ne!(x.hash, y.hash);
    let key = CheckedRow::Key(b"etcd/k".to_vec());
    assert_eq!(divergent_buckets(&x, &y), vec![key.bucket()]);
    for store in [leased, plain] {
        store.shutdown();
    }
}

#[tokio::test]
async fn a_corrupted_row_is_found_and_named() {
    let (_dirs, stores): (Vec<_>, Vec<_>) = (0..3).map(|_| open()).unzip();
    let writes: Vec<Command> = (0..200)
        .map(|i| write(&format!("key/{i:03}"), "v"))
        .collect();
    for store in &stores {
        apply(store, 1, writes.clone()).await;
    }
    stores[1]
        .state_machine(RangeId(1))
        .corrupt_row(b"key/117")
        .await
        .unwrap();
    for store in &stores {
        apply(store, 201, vec![check(vec![])]).await;
    }
    let mut answers = std::collections::BTreeMap::new();
    for (node, store) in (1..).zip(&stores) {
        answers.insert(node, ReplicaAnswer::Digest(digest(store, 201).await));
    }
    let (verdict, divergent, majority) = judge(&answers);
    assert_eq!(verdict, Verdict::Divergent);
    assert_eq!(divergent, vec![2]);
    let ReplicaAnswer::Digest(odd) = &answers[&2] else {
        unreachable!()
    };
    let buckets = divergent_buckets(majority.unwrap(), odd);
    assert_eq!(buckets, vec![CheckedRow::Key(b"key/117".to_vec()).bucket()]);
    // A locating check of that bucket names the key.
    for store in &stores {
        apply(store, 202, vec![check(buckets.clone())]).await;
    }
    let (good, odd) = (digest(&stores[0], 202).await, digest(&stores[1], 202).await);
    assert!(!good.located.is_empty() && !good.located_cut);
    assert_eq!(
        divergent_rows(&good, &odd),
        vec![CheckedRow::Key(b"key/117".to_vec())]
    );
    for store in stores {
        store.shutdown();
    }
}

#[tokio::test]
async fn a_row_that_does_not_decode_is_unreadable() {
    let (_dir, store) = open();
    apply(&store, 1, vec![write("k", "")]).await;
    // The row of an empty value ends in its header: flipping its last byte breaks it.
    store
        .state_machine(RangeId(1))
        .corrupt_row(b"k")
        .await
        .unwrap();
    apply(&store, 2, vec![check(vec![])]).await;
    let answer = store.state_machine(RangeId(1)).digest(2, WAIT).await;
    assert!(matches!(answer, ReplicaAnswer::Unreadable(_)), "{answer:?}");
    store.shutdown();
}

#[tokio::test]
async fn a_check_passed_without_a_digest_says_so() {
    let (_dir, store) = open();
    apply(&store, 1, vec![write("a", "1"), write("b", "2")]).await;
    let answer = store.state_machine(RangeId(1)).digest(1, WAIT).await;
    assert!(matches!(answer, ReplicaAnswer::NoDigest(_)), "{answer:?}");
    store.shutdown();
}

#[tokio::test]
async fn a_held_range_refuses_commands_and_keeps_its_hold_in_snapshots_and_across_restarts() {
    let (_dir, store) = open();
    let hold = Hold { index: 2 };
    apply(
        &store,
        1,
        vec![write("a", "1"), Command::Hold(Some(hold.clone()))],
    )
    .await;
    assert_eq!(store.hold(RangeId(1)), Some(hold.clone()));
    // A write is refused without a trace; the value stays.
    let refused = apply_commands(&store, 3, vec![write("a", "2")]).await;
    let expected = Rejection::RangeHeld {
        range: RangeId(1),
        hold: hold.clone(),
    };
    assert_eq!(refused, vec![CommandOutcome::Rejected(expected)]);
    let mut machine = store.state_machine(RangeId(1));
    let page = machine.scan(b"", b"", 0, 0).await.unwrap();
    assert_eq!(page.kvs[0].value, b"1");

    // A replica that installs a snapshot of the range holds it too, and so after a restart.
    let snapshot = machine
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();
    let (dir, other) = open();
    let mut target = other.state_machine(RangeId(1));
    target
        .install_snapshot(&snapshot.meta, snapshot.snapshot)
        .await
        .unwrap();
    assert_eq!(other.hold(RangeId(1)), Some(hold.clone()));
    other.shutdown();
    let reopened = Store::open(&dir.path().join("keel.redb"), &dir.path().join("snapshots"));
    let reopened = reopened.unwrap();
    assert_eq!(reopened.hold(RangeId(1)), Some(hold));
    reopened.shutdown();

    // Released, the range applies writes again.
    apply(&store, 4, vec![Command::Hold(None)]).await;
    assert_eq!(store.hold(RangeId(1)), None);
    let applied = apply_commands(&store, 5, vec![write("a", "3")]).await;
    assert!(
        matches!(applied[0], CommandOutcome::Applied { .. }),
        "{applied:?}"
    );
    store.shutdown();
}
