//! Upkeep plans through the real writer and redb: the same commands as `plan_cleanup` and
//! `plan_reclaim`, and when the next item of the range falls due.

use keel_types::{
    Acquirer, BatchOp, Command, Coordination, CoordinationOp, Mutation, RequestId, limits,
};

use super::exactly_once::Applier;
use super::{open, put};
use crate::upkeep::Upkeep;

const WINDOW_MS: u64 = 2_000;

fn put_ttl(key: &str, ttl_ms: u64) -> BatchOp {
    BatchOp::Put {
        key: key.as_bytes().to_vec(),
        value: b"v".to_vec(),
        condition: None,
        return_previous: false,
        ttl_ms: Some(ttl_ms),
    }
}

/// A mutation at `now_ms`, with a request id (a session) of client `client` when given.
fn write(now_ms: u64, client: Option<u64>, ops: Vec<BatchOp>) -> Command {
    let request = client.map(|client_id| RequestId {
        client_id,
        client_started_ms: now_ms,
        sequence: 1,
        completed_below: 1,
    });
    Command::Mutate(Mutation {
        request,
        now_ms,
        ops,
    })
}

fn coordinate(now_ms: u64, op: CoordinationOp) -> Command {
    Command::Coordinate(Coordination {
        request: None,
        now_ms,
        op,
    })
}

fn acquire(name: &str, ttl_ms: u64) -> CoordinationOp {
    CoordinationOp::Acquire {
        name: name.as_bytes().to_vec(),
        acquirer: Acquirer {
            owner: b"o".to_vec(),
            ttl_ms,
            lock_delay_ms: 0,
        },
    }
}

/// The upkeep plan at `now_ms`, checked to hold the same commands as the separate plans
/// and to fall due next at `next_due_ms`.
async fn check(applier: &Applier, now_ms: u64, next_due_ms: Option<u64>) -> Upkeep {
    let sm = applier.sm();
    let upkeep = sm.plan_upkeep(now_ms, WINDOW_MS).await.unwrap();
    let cleanup = sm.plan_cleanup(now_ms, now_ms.saturating_sub(WINDOW_MS));
    assert_eq!(
        upkeep.cleanup,
        cleanup.await.unwrap(),
        "cleanup at {now_ms}"
    );
    let reclaim = sm.plan_reclaim(now_ms).await.unwrap();
    assert_eq!(upkeep.reclaim, reclaim, "reclaim at {now_ms}");
    assert_eq!(upkeep.next_due_ms, next_due_ms, "next due at {now_ms}");
    upkeep
}

#[tokio::test]
async fn nothing_falls_due_in_a_range_without_timed_state() {
    let (_dir, store) = open();
    let mut applier = Applier::new(&store);
    check(&applier, 1_000, None).await;
    applier
        .apply(write(1_000, None, vec![put("plain", "p", None)]))
        .await;
    let upkeep = check(&applier, 1_000_000, None).await;
    assert!(upkeep.cleanup.is_empty() && upkeep.reclaim.is_empty());
}

#[tokio::test]
async fn the_next_expiry_session_idle_and_deadline_fall_due_in_turn() {
    let (_dir, store) = open();
    let mut applier = Applier::new(&store);
    // A key expiring at 1_500, a session active at 1_000 (idle past 3_000), a lock free at
    // 5_000 and an idempotency record expiring at 7_000.
    applier
        .apply(write(1_000, Some(7), vec![put_ttl("t", 500)]))
        .await;
    applier.apply(coordinate(1_000, acquire("l", 4_000))).await;
    let begin = CoordinationOp::Begin {
        key: b"r".to_vec(),
        owner: b"o".to_vec(),
        ttl_ms: 6_000,
    };
    applier.apply(coordinate(1_000, begin)).await;

    check(&applier, 1_200, Some(1_500)).await;
    let upkeep = check(&applier, 1_500, Some(3_001)).await;
    assert_eq!(upkeep.cleanup.keys.len(), 1, "the key expired");
    applier.apply(Command::Cleanup(upkeep.cleanup)).await;

    check(&applier, 3_000, Some(3_001)).await;
    let upkeep = check(&applier, 3_001, Some(5_000)).await;
    assert_eq!(upkeep.cleanup.sessions, vec![7], "the session idled out");
    applier.apply(Command::Cleanup(upkeep.cleanup)).await;

    let upkeep = check(&applier, 5_000, Some(7_000)).await;
    assert_eq!(upkeep.reclaim.locks.len(), 1, "the lock is free");
    applier.apply(Command::Reclaim(upkeep.reclaim)).await;
    let upkeep = check(&applier, 7_000, None).await;
    assert_eq!(upkeep.reclaim.records.len(), 1, "the record expired");
    applier.apply(Command::Reclaim(upkeep.reclaim)).await;
    check(&applier, 10_000, None).await;
}

#[tokio::test]
async fn a_plan_stopped_at_its_limit_is_due_again_at_once() {
    let (_dir, store) = open();
    let mut applier = Applier::new(&store);
    let keys = limits::CLEANUP_KEYS_MAX + 1;
    for batch in (0..keys).collect::<Vec<_>>().chunks(limits::BATCH_OPS_MAX) {
        let ops = batch
            .iter()
            .map(|i| put_ttl(&format!("k{i:04}"), 100 + *i as u64))
            .collect();
        applier.apply(write(1_000, None, ops)).await;
    }
    // The 257th key expired at 1_356 too; the first plan takes 256 of them.
    let upkeep = check(&applier, 2_000, Some(1_000 + 100 + 256)).await;
    assert_eq!(upkeep.cleanup.keys.len(), limits::CLEANUP_KEYS_MAX);
    applier.apply(Command::Cleanup(upkeep.cleanup)).await;
    let upkeep = check(&applier, 2_000, None).await;
    assert_eq!(upkeep.cleanup.keys.len(), 1);
}
