//! Idempotency records on a real 3-node cluster: concurrent begins of one id start exactly
//! one owner; an owner whose TTL ran out is taken over with a higher token and its complete
//! is refused; a completed result is returned to every later caller until its TTL, and
//! `Client::idempotent` runs the work once for many concurrent callers. Node clocks are
//! manual: TTLs pass only when a test moves them.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use keel_client::{BeginResult, IdempotentError};
use keel_types::KvError;

use crate::harness::Cluster;

const TTL: Duration = Duration::from_secs(30);
const RESULT_TTL: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_begins_start_exactly_one_owner() {
    let cluster = Cluster::start(3).await;
    let begins = (0..8).map(|i| {
        let client = cluster.client();
        tokio::spawn(async move {
            let owner = format!("worker-{i}");
            client
                .begin(b"pay", b"order-1", Some(owner.as_bytes()), TTL)
                .await
        })
    });
    let mut started = Vec::new();
    let mut in_progress = Vec::new();
    for begin in begins {
        match begin.await.unwrap().unwrap() {
            BeginResult::Started { token, .. } => started.push(token),
            BeginResult::InProgress { owner, .. } => in_progress.push(owner),
            other => panic!("nothing completed yet: {other:?}"),
        }
    }
    assert_eq!(started.len(), 1, "exactly one Started: {started:?}");
    assert_eq!(in_progress.len(), 7);
    assert!(
        in_progress.windows(2).all(|pair| pair[0] == pair[1]),
        "every other caller sees the one owner: {in_progress:?}"
    );
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_owner_is_taken_over_and_its_complete_refused() {
    let cluster = Cluster::start(3).await;
    let client = cluster.client();
    let begin = |owner: &'static str| {
        let client = client.clone();
        async move {
            client
                .begin(b"pay", b"order-2", Some(owner.as_bytes()), TTL)
                .await
                .unwrap()
        }
    };
    let BeginResult::Started { token: old, .. } = begin("a").await else {
        panic!("a starts the record")
    };
    cluster.advance_clocks_ms(TTL.as_millis() as u64);
    let BeginResult::Started { token: new, .. } = begin("b").await else {
        panic!("b takes the expired record over")
    };
    assert!(new > old, "{new} > {old}");

    let stale = client
        .complete(b"pay", b"order-2", old, b"charged by a", RESULT_TTL)
        .await;
    assert!(
        matches!(stale, Err(KvError::RecordNotOwned { current_token: Some(t), .. }) if t == new),
        "{stale:?}"
    );
    let stale = client.abort(b"pay", b"order-2", old).await;
    assert!(
        matches!(stale, Err(KvError::RecordNotOwned { .. })),
        "{stale:?}"
    );

    client
        .complete(b"pay", b"order-2", new, b"charged by b", RESULT_TTL)
        .await
        .unwrap();
    for owner in ["c", "a"] {
        assert!(
            matches!(begin(owner).await, BeginResult::Completed { result, .. } if result == b"charged by b"),
            "{owner} gets the stored result"
        );
    }

    // After the result's TTL the record is gone and the next begin starts afresh.
    cluster.advance_clocks_ms(RESULT_TTL.as_millis() as u64);
    let BeginResult::Started { token: fresh, .. } = begin("d").await else {
        panic!("d starts a new record")
    };
    assert!(fresh > new);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotent_work_runs_once_for_concurrent_callers() {
    let cluster = Cluster::start(3).await;
    let runs = Arc::new(AtomicU32::new(0));
    let callers = (0..6).map(|_| {
        let (client, runs) = (cluster.client(), runs.clone());
        tokio::spawn(async move {
            client
                .idempotent(b"mail", b"welcome-7", TTL, || async move {
                    let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    Ok::<_, std::io::Error>(format!("sent, run {run}").into_bytes())
                })
                .await
        })
    });
    let mut results = Vec::new();
    for caller in callers {
        results.push(caller.await.unwrap().unwrap());
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the work ran once");
    assert!(
        results.iter().all(|result| result == b"sent, run 1"),
        "{results:?}"
    );

    // A failed run aborts the record: the next caller runs the work afresh.
    let client = cluster.client();
    let failed = client
        .idempotent(b"mail", b"welcome-8", TTL, || async {
            Err::<Vec<u8>, _>(std::io::Error::other("smtp down"))
        })
        .await;
    assert!(
        matches!(failed, Err(IdempotentError::Work(_))),
        "{failed:?}"
    );
    let retried = client
        .idempotent(b"mail", b"welcome-8", TTL, || async {
            Ok::<_, std::io::Error>(b"sent".to_vec())
        })
        .await
        .unwrap();
    assert_eq!(retried, b"sent");
    cluster.shutdown().await;
}
