//! etcd's leases through the real writer and redb: grants (chosen and applier-chosen ids),
//! keep-alives, revokes and the leader's `ExpireLeases`, the revisions they take, the
//! upkeep plan that finds due leases, reads, exactly-once replays; keys attached and
//! detached by every kind of write, transactions' lease rules and refusals, lease
//! compares, and leases across a snapshot install.

use keel_types::txn::{
    Compare, CompareResult, CompareTarget, Txn, TxnMutation, TxnOp, TxnPut, TxnSpan,
};
use keel_types::{
    Command, CommandOutcome, ExpireLeases, ExpiredLease, LeaseMutation, LeaseOp, LeaseResult,
    Rejection, RequestId, Revision, limits,
};
use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine};

use super::exactly_once::{Applier, at, increment};
use super::{delete, open, put};
use crate::state_machine::HistoryRead;

pub(super) const NS: &[u8] = b"etcd/";

/// A lease operation at `now_ms`, without a request id.
pub(super) fn lease(now_ms: u64, op: LeaseOp) -> Command {
    Command::Lease(LeaseMutation {
        request: None,
        now_ms,
        op,
    })
}

pub(super) fn grant(id: i64, ttl_ms: u64) -> LeaseOp {
    LeaseOp::Grant {
        namespace: NS.to_vec(),
        id,
        ttl_ms,
    }
}

fn keep_alive(id: i64) -> LeaseOp {
    LeaseOp::KeepAlive {
        namespace: NS.to_vec(),
        id,
    }
}

pub(super) fn revoke(id: i64) -> LeaseOp {
    LeaseOp::Revoke {
        namespace: NS.to_vec(),
        id,
    }
}

pub(super) fn leased(result: LeaseResult) -> CommandOutcome {
    CommandOutcome::Leased(result)
}

fn rejected(rejection: Rejection) -> CommandOutcome {
    CommandOutcome::Rejected(rejection)
}

/// The stored expiry of lease `id`, if it exists.
async fn expiry(applier: &Applier, id: i64) -> Option<u64> {
    let (info, _) = applier.sm().lease(NS, id, false).await.unwrap();
    info.map(|info| info.expires_at_ms)
}

#[tokio::test]
async fn a_grant_takes_the_smallest_free_id_from_the_next_revision_and_no_revision() {
    let (_dir, store) = open();
    let mut applier = Applier::new(&store);
    applier.apply(at(0, vec![put("etcd/a", "1", None)])).await;
    let cases = [
        (
            grant(0, 100),
            leased(LeaseResult::Granted { id: 2, ttl_ms: 100 }),
        ),
        (
            grant(3, 50),
            leased(LeaseResult::Granted { id: 3, ttl_ms: 50 }),
        ),
        (
            grant(0, 100),
            leased(LeaseResult::Granted { id: 4, ttl_ms: 100 }),
        ),
        (grant(3, 100), rejected(Rejection::LeaseExists { id: 3 })),
    ];
    for (op, expected) in cases {
        let outcome = applier.apply(lease(1_000, op.clone())).await;
        assert_eq!(outcome, expected, "{op:?}");
    }
    assert_eq!(applier.revision().await, 1, "grants take no revision");
    let (ids, revision) = applier.sm().leases(NS).await.unwrap();
    assert_eq!((ids, revision), (vec![2, 3, 4], 1));
    assert_eq!(
        expiry(&applier, 3).await,
        Some(1_050),
        "granted at the range clock"
    );
    let (other, _) = applier.sm().leases(b"tenant/etcd/").await.unwrap();
    assert!(other.is_empty(), "{other:?}");
}

#[tokio::test]
async fn a_keep_alive_extends_an_unexpired_lease_and_refuses_an_expired_one() {
    let (_dir, store) = open();
    let mut applier = Applier::new(&store);
    applier.apply(lease(1_000, grant(7, 100))).await;
    let kept = applier.apply(lease(1_050, keep_alive(7))).await;
    assert_eq!(kept, leased(LeaseResult::KeptAlive { ttl_ms: 100 }));
    assert_eq!(expiry(&applier, 7).await, Some(1_150));
    let late = applier.apply(lease(1_150, keep_alive(7))).await;
    assert_eq!(late, rejected(Rejection::LeaseNotFound { id: 7 }));
    assert_eq!(expiry(&applier, 7).await, Some(1_150), "refused: unchanged");
    let missing = applier.apply(lease(1_150, keep_alive(8))).await;
    assert_eq!(missing, rejected(Rejection::LeaseNotFound { id: 8 }));
    // An expired lease is kept (and read) until it is revoked; revoking one without keys
    // takes no revision.
    let revoked = applier.apply(lease(1_200, revoke(7))).await;
    let nothing = LeaseResult::Revoked {
        revision: 0,
        deleted: 0,
    };
    assert_eq!(revoked, leased(nothing));
    assert_eq!(expiry(&applier, 7).await, None);
    let again = applier.apply(lease(1_200, revoke(7))).await;
    assert_eq!(again, rejected(Rejection::LeaseNotFound { id: 7 }));
    assert_eq!(applier.revision().await, 0);
    let upkeep = applier.sm().plan_upkeep(10_000, 1_000).await.unwrap();
    assert!(
        upkeep.expire_leases.leases.is_empty(),
        "the deadline went with the lease"
    );
}

#[tokio::test]
async fn expiry_revokes_only_a_lease_still_expired_as_planned() {
    let (_dir, store) = open();
    let mut applier = Applier::new(&store);
    applier.apply(lease(1_000, grant(5, 100))).await;
    applier.apply(lease(1_000, grant(6, 100))).await;
    let plan = applier.sm().plan_upkeep(1_090, 1_000_000).await.unwrap();
    assert!(plan.expire_leases.leases.is_empty());
    assert_eq!(plan.next_due_ms, Some(1_100));
    applier.apply(lease(1_090, keep_alive(6))).await;
    let plan = applier.sm().plan_upkeep(1_150, 1_000_000).await.unwrap();
    let due = |id, expires_at_ms| ExpiredLease {
        namespace: NS.to_vec(),
        id,
        expires_at_ms,
    };
    assert_eq!(plan.expire_leases.leases, vec![due(5, 1_100)]);
    assert_eq!(plan.next_due_ms, Some(1_190));
    // A plan made before the keep-alive names lease 6 with its old expiry: it is saved.
    let stale = Command::ExpireLeases(ExpireLeases {
        now_ms: 1_150,
        leases: vec![due(5, 1_100), due(6, 1_100)],
    });
    assert_eq!(applier.apply(stale).await, CommandOutcome::Internal);
    assert_eq!(expiry(&applier, 5).await, None);
    assert_eq!(expiry(&applier, 6).await, Some(1_190));
    assert_eq!(applier.sm().leases(NS).await.unwrap().0, vec![6]);
    // Not yet expired at the range clock: kept, whatever the plan says.
    let early = Command::ExpireLeases(ExpireLeases {
        now_ms: 1_150,
        leases: vec![due(6, 1_190)],
    });
    applier.apply(early).await;
    assert_eq!(expiry(&applier, 6).await, Some(1_190));
}

#[tokio::test]
async fn a_retried_grant_is_answered_from_its_record() {
    let (_dir, store) = open();
    let mut applier = Applier::new(&store);
    let request = RequestId {
        client_id: 9,
        client_started_ms: 1,
        sequence: 1,
        completed_below: 1,
    };
    let command = Command::Lease(LeaseMutation {
        request: Some(request),
        now_ms: 1_000,
        op: grant(0, 100),
    });
    let first = applier.apply(command.clone()).await;
    assert_eq!(first, leased(LeaseResult::Granted { id: 1, ttl_ms: 100 }));
    let retried = applier.apply(command).await;
    assert_eq!(retried, CommandOutcome::Replayed(Box::new(first)));
    assert_eq!(applier.sm().leases(NS).await.unwrap().0, vec![1]);
}

/// A transaction at `now_ms` that runs `ops` (no compares).
pub(super) fn txn(now_ms: u64, ops: Vec<TxnOp>) -> Command {
    txn_if(now_ms, Vec::new(), ops)
}

/// A transaction at `now_ms` that runs `ops` if `compares` hold, else nothing.
fn txn_if(now_ms: u64, compares: Vec<Compare>, ops: Vec<TxnOp>) -> Command {
    Command::Txn(TxnMutation {
        request: None,
        now_ms,
        txn: Txn {
            compares,
            success: ops,
            failure: Vec::new(),
        },
    })
}

/// etcd's put of `key` attached to `lease` (0: detached).
pub(super) fn put_leased(key: &str, value: &str, lease: i64) -> TxnOp {
    TxnOp::Put(TxnPut {
        key: key.into(),
        value: value.into(),
        ttl_ms: None,
        previous: false,
        lease,
        ignore_value: false,
        ignore_lease: false,
    })
}

/// etcd's put of `key` keeping its value (`ignore_value`) or its lease (`ignore_lease`).
fn put_keeping(key: &str, value: &str, ignore_value: bool, ignore_lease: bool) -> TxnOp {
    TxnOp::Put(TxnPut {
        key: key.into(),
        value: value.into(),
        ttl_ms: None,
        previous: false,
        lease: 0,
        ignore_value,
        ignore_lease,
    })
}

/// The attached keys of lease `id`, or `None` when it does not exist.
async fn attached(applier: &Applier, id: i64) -> Option<Vec<String>> {
    let (info, _) = applier.sm().lease(NS, id, true).await.unwrap();
    let text = |key: Vec<u8>| String::from_utf8(key).unwrap();
    info.map(|info| info.keys.into_iter().map(text).collect())
}

/// `(value, lease)` of `key`, if it is live at `now_ms`.
async fn stored(applier: &Applier, key: &str, now_ms: u64) -> Option<(String, i64)> {
    let kv = applier.value(key, now_ms).await?;
    Some((String::from_utf8(kv.value).unwrap(), kv.lease))
}

fn transacted_at(outcome: &CommandOutcome) -> Revision {
    match outcome {
        CommandOutcome::Transacted { revision, .. } => *revision,
        other => panic!("expected a transaction's outcome, got {other:?}"),
    }
}

#[tokio::test]
async fn a_put_with_a_lease_attaches_and_a_plain_write_or_delete_detaches() {
    let (_dir, store) = open();
    let mut applier = Applier::new(&store);
    applier.apply(lease(1_000, grant(1, 60_000))).await;
    applier.apply(lease(1_000, grant(2, 60_000))).await;
    let both = vec![put_leased("etcd/a", "1", 1), put_leased("etcd/b", "2", 1)];
    applier.apply(txn(1_000, both)).await;
    assert_eq!(attached(&applier, 1).await.unwrap(), ["etcd/a", "etcd/b"]);
    assert_eq!(
        stored(&applier, "etcd/a", 1_000).await,
        Some(("1".into(), 1))
    );
    // Moving a key to another lease detaches it from the first.
    applier
        .apply(txn(1_000, vec![put_leased("etcd/a", "3", 2)]))
        .await;
    assert_eq!(attached(&applier, 1).await.unwrap(), ["etcd/b"]);
    assert_eq!(attached(&applier, 2).await.unwrap(), ["etcd/a"]);
    // A plain put detaches (etcd's put without a lease); an increment keeps the lease.
    applier
        .apply(at(1_000, vec![put("etcd/b", "4", None)]))
        .await;
    assert_eq!(
        stored(&applier, "etcd/b", 1_000).await,
        Some(("4".into(), 0))
    );
    assert_eq!(attached(&applier, 1).await.unwrap(), Vec::<String>::new());
    applier.apply(at(1_000, vec![increment("etcd/a", 2)])).await;
    assert_eq!(
        stored(&applier, "etcd/a", 1_000).await,
        Some(("5".into(), 2))
    );
    assert_eq!(attached(&applier, 2).await.unwrap(), ["etcd/a"]);
    // A delete detaches.
    applier.apply(at(1_000, vec![delete("etcd/a", None)])).await;
    assert_eq!(attached(&applier, 2).await.unwrap(), Vec::<String>::new());
}

#[tokio::test]
async fn a_revoke_deletes_exactly_the_attached_keys_at_one_revision() {
    let (_dir, store) = open();
    let mut applier = Applier::new(&store);
    applier.apply(lease(1_000, grant(1, 60_000))).await;
    let ops = vec![
        put_leased("etcd/a", "1", 1),
        put_leased("etcd/b", "2", 1),
        put_leased("etcd/c", "3", 0),
    ];
    assert_eq!(transacted_at(&applier.apply(txn(1_000, ops)).await), 1);
    let revoked = applier.apply(lease(1_000, revoke(1))).await;
    let expected = LeaseResult::Revoked {
        revision: 2,
        deleted: 2,
    };
    assert_eq!(revoked, leased(expected));
    assert_eq!(applier.revision().await, 2);
    assert_eq!(stored(&applier, "etcd/a", 1_000).await, None);
    assert_eq!(stored(&applier, "etcd/b", 1_000).await, None);
    assert_eq!(
        stored(&applier, "etcd/c", 1_000).await,
        Some(("3".into(), 0))
    );
    assert_eq!(attached(&applier, 1).await, None);
    // Each deletion is an event of revision 2 with the key's state before it.
    for key in ["etcd/a", "etcd/b"] {
        let read = applier
            .sm()
            .key_history(key.as_bytes(), 0, 10)
            .await
            .unwrap();
        let HistoryRead::Events(history) = read else {
            panic!("{key}: {read:?}")
        };
        let last = history.events.last().expect("the key has events");
        assert_eq!((last.revision, last.after.is_none()), (2, true), "{key}");
        assert_eq!(last.before.as_ref().map(|kv| kv.lease), Some(1), "{key}");
    }
}

#[tokio::test]
async fn an_expired_lease_is_revoked_with_its_keys_at_one_revision() {
    let (_dir, store) = open();
    let mut applier = Applier::new(&store);
    applier.apply(lease(1_000, grant(1, 100))).await;
    let ops = vec![put_leased("etcd/a", "1", 1), put_leased("etcd/b", "2", 1)];
    applier.apply(txn(1_000, ops)).await;
    // Expired but not yet revoked: its keys stay readable, as in etcd.
    assert_eq!(
        stored(&applier, "etcd/a", 1_500).await,
        Some(("1".into(), 1))
    );
    let plan = applier.sm().plan_upkeep(1_500, 1_000_000).await.unwrap();
    assert_eq!(plan.expire_leases.leases.len(), 1);
    applier
        .apply(Command::ExpireLeases(plan.expire_leases))
        .await;
    assert_eq!(applier.revision().await, 2);
    assert_eq!(stored(&applier, "etcd/a", 1_500).await, None);
    assert_eq!(stored(&applier, "etcd/b", 1_500).await, None);
    assert_eq!(attached(&applier, 1).await, None);
}

#[tokio::test]
async fn refused_lease_puts_change_nothing_and_take_no_revision() {
    let (_dir, store) = open();
    let mut applier = Applier::new(&store);
    applier.apply(lease(1_000, grant(1, 60_000))).await;
    applier.apply(lease(1_000, grant(2, 100))).await;
    applier
        .apply(txn(1_000, vec![put_leased("etcd/k", "v", 1)]))
        .await;
    let not_found = |id| CommandOutcome::Rejected(Rejection::LeaseNotFound { id });
    let absent = || {
        CommandOutcome::Rejected(Rejection::KeyNotFound {
            key: b"etcd/new".to_vec(),
        })
    };
    let cases = [
        // Each also writes etcd/k, which must stay as it is.
        (
            vec![put_leased("etcd/k", "x", 0), put_leased("etcd/n", "x", 9)],
            not_found(9),
        ),
        (
            vec![put_leased("etcd/k", "x", 0), put_leased("etcd/n", "x", 2)],
            not_found(2),
        ),
        (
            vec![
                put_leased("etcd/k", "x", 0),
                put_keeping("etcd/new", "", true, false),
            ],
            absent(),
        ),
        (
            vec![
                put_leased("etcd/k", "x", 0),
                put_keeping("etcd/new", "x", false, true),
            ],
            absent(),
        ),
    ];
    for (ops, expected) in cases {
        let outcome = applier.apply(txn(2_000, ops.clone())).await;
        assert_eq!(outcome, expected, "{ops:?}");
        assert_eq!(applier.revision().await, 1, "{ops:?}");
        assert_eq!(
            stored(&applier, "etcd/k", 2_000).await,
            Some(("v".into(), 1))
        );
        assert_eq!(attached(&applier, 1).await.unwrap(), ["etcd/k"]);
    }
}

#[tokio::test]
async fn a_lease_holds_at_most_lease_keys_max_keys() {
    let (_dir, store) = open();
    let mut applier = Applier::new(&store);
    applier.apply(lease(1_000, grant(1, 60_000))).await;
    let keys: Vec<String> = (0..limits::LEASE_KEYS_MAX)
        .map(|i| format!("etcd/k{i:05}"))
        .collect();
    for chunk in keys.chunks(limits::TXN_OPS_MAX) {
        let ops = chunk.iter().map(|key| put_leased(key, "v", 1)).collect();
        applier.apply(txn(1_000, ops)).await;
    }
    let full = applier.revision().await;
    // Rewriting an attached key adds none; a new one is refused, and nothing changes.
    let rewrite = vec![put_leased("etcd/k00000", "w", 1)];
    assert_eq!(
        transacted_at(&applier.apply(txn(1_000, rewrite)).await),
        full + 1
    );
    let one_more = vec![
        put_leased("etcd/k00001", "w", 1),
        put_leased("etcd/z", "v", 1),
    ];
    let refused = applier.apply(txn(1_000, one_more)).await;
    let max = limits::LEASE_KEYS_MAX as u64;
    assert_eq!(
        refused,
        CommandOutcome::Rejected(Rejection::LeaseFull { id: 1, max })
    );
    assert_eq!(applier.revision().await, full + 1);
    assert_eq!(
        stored(&applier, "etcd/k00001", 1_000).await,
        Some(("v".into(), 1))
    );
    // Detaching one key in the same transaction makes room.
    let swap = vec![
        put_leased("etcd/k00001", "w", 0),
        put_leased("etcd/z", "v", 1),
    ];
    assert_eq!(
        transacted_at(&applier.apply(txn(1_000, swap)).await),
        full + 2
    );
}

#[tokio::test]
async fn ignore_value_and_ignore_lease_keep_what_the_key_has() {
    let (_dir, store) = open();
    let mut applier = Applier::new(&store);
    applier.apply(lease(1_000, grant(1, 60_000))).await;
    applier
        .apply(txn(1_000, vec![put_leased("etcd/k", "v", 1)]))
        .await;
    applier
        .apply(txn(1_000, vec![put_keeping("etcd/k", "w", false, true)]))
        .await;
    assert_eq!(
        stored(&applier, "etcd/k", 1_000).await,
        Some(("w".into(), 1))
    );
    applier
        .apply(txn(1_000, vec![put_keeping("etcd/k", "", true, false)]))
        .await;
    assert_eq!(
        stored(&applier, "etcd/k", 1_000).await,
        Some(("w".into(), 0))
    );
    assert_eq!(attached(&applier, 1).await.unwrap(), Vec::<String>::new());
}

#[tokio::test]
async fn a_lease_compare_reads_the_keys_lease() {
    let (_dir, store) = open();
    let mut applier = Applier::new(&store);
    applier.apply(lease(1_000, grant(4, 60_000))).await;
    applier
        .apply(txn(1_000, vec![put_leased("etcd/k", "v", 4)]))
        .await;
    let lease_is = |key: &str, id| Compare {
        span: TxnSpan::key(key.into()),
        result: CompareResult::Equal,
        target: CompareTarget::Lease(id),
    };
    let cases = [
        (lease_is("etcd/k", 4), true),
        (lease_is("etcd/k", 0), false),
        (lease_is("etcd/absent", 0), true),
    ];
    for (compare, holds) in cases {
        let outcome = applier
            .apply(txn_if(1_000, vec![compare.clone()], vec![]))
            .await;
        let CommandOutcome::Transacted { result, .. } = outcome else {
            panic!("{outcome:?}")
        };
        assert_eq!(result.succeeded, holds, "{compare:?}");
    }
}

#[tokio::test]
async fn leases_survive_a_snapshot_install() {
    let (_dir, store) = open();
    let mut source = Applier::new(&store);
    source.apply(lease(1_000, grant(1, 60_000))).await;
    source.apply(lease(1_000, grant(2, 100))).await;
    source
        .apply(txn(1_000, vec![put_leased("etcd/a", "1", 1)]))
        .await;
    let snapshot = source
        .sm()
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();
    let (_dir_b, store_b) = open();
    let mut target = Applier::new(&store_b);
    target.apply(lease(1_000, grant(3, 100))).await;
    target
        .sm()
        .install_snapshot(&snapshot.meta, snapshot.snapshot)
        .await
        .unwrap();
    assert_eq!(target.sm().leases(NS).await.unwrap().0, vec![1, 2]);
    assert_eq!(attached(&target, 1).await.unwrap(), ["etcd/a"]);
    assert_eq!(
        stored(&target, "etcd/a", 1_000).await,
        Some(("1".into(), 1))
    );
    // The deadlines came along: lease 2 falls due, the replaced lease 3 is gone.
    let plan = target.sm().plan_upkeep(2_000, 1_000_000).await.unwrap();
    let ids: Vec<i64> = plan.expire_leases.leases.iter().map(|l| l.id).collect();
    assert_eq!(ids, vec![2]);
    target.next = source.next;
    target.apply(lease(1_000, revoke(1))).await;
    assert_eq!(stored(&target, "etcd/a", 1_000).await, None);
}

#[tokio::test]
async fn an_upkeep_plan_takes_at_most_cleanup_leases_max_leases() {
    let (_dir, store) = open();
    let mut applier = Applier::new(&store);
    let count = limits::CLEANUP_LEASES_MAX as i64 + 2;
    for id in 1..=count {
        applier.apply(lease(1_000, grant(id, id as u64))).await;
    }
    let plan = applier.sm().plan_upkeep(5_000, 1_000_000).await.unwrap();
    let ids: Vec<i64> = plan.expire_leases.leases.iter().map(|l| l.id).collect();
    let first: Vec<i64> = (1..=limits::CLEANUP_LEASES_MAX as i64).collect();
    assert_eq!(ids, first, "earliest first");
    assert!(plan.next_due_ms.is_some_and(|due| due <= 5_000), "{plan:?}");
    applier
        .apply(Command::ExpireLeases(plan.expire_leases))
        .await;
    let plan = applier.sm().plan_upkeep(5_000, 1_000_000).await.unwrap();
    assert_eq!(plan.expire_leases.leases.len(), 2);
}
