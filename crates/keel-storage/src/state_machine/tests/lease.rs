//! etcd's leases through the real writer and redb: grants (chosen and applier-chosen ids),
//! keep-alives, revokes and the leader's `ExpireLeases`, the revisions they take, the
//! upkeep plan that finds due leases, reads, and exactly-once replays.

use keel_types::{
    Command, CommandOutcome, ExpireLeases, ExpiredLease, LeaseMutation, LeaseOp, LeaseResult,
    Rejection, RequestId,
};

use super::exactly_once::{Applier, at};
use super::{open, put};

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
