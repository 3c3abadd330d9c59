//! The format-12 fixture, `tests/fixtures/v12/`: etcd leases. Range 1 grants lease 7 (TTL
//! 60 s at 1 s) under a request id, attaches `etcd/a` to it in a transaction that also puts
//! `etcd/b` without a lease (revision 1), grants lease 8 (TTL 100 ms at 1 s) and keeps lease
//! 7 alive at 2 s (it then expires at 62 s). `write_v12` made the files; set
//! `KEEL_WRITE_FIXTURES=1` to rewrite them (only ever needed if they are lost). Every later
//! build must read them.

use std::path::Path;

use keel_storage::raft_types::{Entry, Vote};
use keel_storage::{StateMachine, Store};
use keel_types::txn::{Txn, TxnMutation, TxnOp, TxnPut};
use keel_types::{Command, LeaseMutation, LeaseOp, RangeId, RequestId};
use openraft::entry::RaftEntry;

use super::fixture::{
    FIXTURE_STORE_FILE, copy_dir, current_snapshot, fixture_dir, installed_fresh, membership,
    open_fixture, persist_range_1,
};
use super::{apply, blank, log_id, open_in};

const NS: &[u8] = b"etcd/";

fn lease(index: u64, request: Option<RequestId>, now_ms: u64, op: LeaseOp) -> Entry {
    let mutation = LeaseMutation {
        request,
        now_ms,
        op,
    };
    Entry::new_normal(log_id(1, 1, index), Command::Lease(mutation))
}

/// The grant of lease 7 under request 1 of client 0xb12.
fn grant_7(index: u64) -> Entry {
    let request = RequestId {
        client_id: 0xb12,
        client_started_ms: 1_000,
        sequence: 1,
        completed_below: 1,
    };
    let op = LeaseOp::Grant {
        namespace: NS.to_vec(),
        id: 7,
        ttl_ms: 60_000,
    };
    lease(index, Some(request), 1_000, op)
}

fn put(key: &[u8], lease: i64) -> TxnOp {
    TxnOp::Put(TxnPut {
        key: key.to_vec(),
        value: b"v".to_vec(),
        ttl_ms: None,
        previous: false,
        lease,
        ignore_value: false,
        ignore_lease: false,
    })
}

pub(super) fn v12_entries() -> Vec<Entry> {
    let txn = TxnMutation {
        request: None,
        now_ms: 1_000,
        txn: Txn {
            compares: Vec::new(),
            success: vec![put(b"etcd/a", 7), put(b"etcd/b", 0)],
            failure: Vec::new(),
        },
    };
    let grant_8 = LeaseOp::Grant {
        namespace: NS.to_vec(),
        id: 8,
        ttl_ms: 100,
    };
    let keep_alive = LeaseOp::KeepAlive {
        namespace: NS.to_vec(),
        id: 7,
    };
    vec![
        blank(1, 0),
        Entry::new_membership(log_id(1, 1, 1), membership()),
        grant_7(2),
        Entry::new_normal(log_id(1, 1, 3), Command::Txn(txn)),
        lease(4, None, 1_000, grant_8),
        lease(5, None, 2_000, keep_alive),
    ]
}

pub(super) async fn write_v12(dir: &Path) {
    let store = open_in(dir);
    let mut log = store.log_store(RangeId(1));
    let (vote, committed) = (Vote::new_committed(1, 1), log_id(1, 1, 5));
    persist_range_1(&store, &mut log, v12_entries(), vote, committed).await;
    store.shutdown();
}

/// The leases of the v12 state: 7 holding `etcd/a` until 62 s, 8 (due at 1.1 s) holding
/// nothing; `etcd/b` attached to none.
async fn check_v12_leases(sm: &StateMachine) {
    assert_eq!(sm.leases(NS).await.unwrap().0, vec![7, 8]);
    let (seven, _) = sm.lease(NS, 7, true).await.unwrap();
    let seven = seven.expect("lease 7 is stored");
    assert_eq!((seven.ttl_ms, seven.expires_at_ms), (60_000, 62_000));
    assert_eq!(seven.keys, vec![b"etcd/a".to_vec()]);
    let lease_of =
        |key: &'static [u8]| async move { sm.get(key, 0).await.unwrap().0.map(|kv| kv.lease) };
    assert_eq!(lease_of(b"etcd/a").await, Some(7));
    assert_eq!(lease_of(b"etcd/b").await, Some(0));
    let plan = sm.plan_upkeep(10_000, 1_000_000).await.unwrap();
    let due: Vec<i64> = plan.expire_leases.leases.iter().map(|l| l.id).collect();
    assert_eq!(due, vec![8]);
}

/// What every build must read from the v12 fixture.
pub(super) async fn check_v12(store: &Store) {
    let mut sm = store.state_machine(RangeId(1));
    assert_eq!(sm.applied().await.unwrap(), (1, Some(log_id(1, 1, 5))));
    check_v12_leases(&sm).await;
    // The snapshot installs into a fresh store with the same leases.
    let snapshot = current_snapshot(&mut sm, log_id(1, 1, 5)).await;
    let (_fresh_dir, fresh_sm) = installed_fresh(snapshot).await;
    check_v12_leases(&fresh_sm).await;
    // A retry of the grant is answered from its record: nothing changes.
    apply(&mut sm, vec![grant_7(6)]).await.unwrap();
    check_v12_leases(&sm).await;
    // Revoking lease 7 deletes its key at the next revision.
    let revoke = LeaseOp::Revoke {
        namespace: NS.to_vec(),
        id: 7,
    };
    apply(&mut sm, vec![lease(7, None, 3_000, revoke)])
        .await
        .unwrap();
    assert_eq!(sm.applied().await.unwrap(), (2, Some(log_id(1, 1, 7))));
    assert!(sm.get(b"etcd/a", 0).await.unwrap().0.is_none());
}

#[tokio::test]
async fn v12_fixture_reads_back() {
    let (_dir, store) = open_fixture(12);
    check_v12(&store).await;
}

#[tokio::test]
async fn v12_fixture_writer_matches_expectations() {
    let dir = tempfile::tempdir().unwrap();
    write_v12(dir.path()).await;
    if std::env::var_os("KEEL_WRITE_FIXTURES").is_some() {
        let target = fixture_dir(12);
        let _ = std::fs::remove_dir_all(&target);
        copy_dir(dir.path(), &target);
        std::fs::rename(target.join("keel.redb"), target.join(FIXTURE_STORE_FILE)).unwrap();
    }
    let store = open_in(dir.path());
    check_v12(&store).await;
}
