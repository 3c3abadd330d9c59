//! Locks, lock guards, idempotency records and fences end to end against the fake: waits
//! covered by the attempt budget, retries under one request id, final answers, background
//! renewals and how a guard learns it lost its lock, and `idempotent`'s dance.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use keel_client::{
    AcquireOptions, BatchOptions, BeginResult, ClientOptions, DeleteOptions, IdempotentError,
    IdempotentOptions, LockError, LockLost, PutOptions,
};
use keel_types::{BatchOp, Consistency, Fence, KvError};

use crate::fake::{Fake, Reply};
use crate::routing::{client, short};

async fn serve() -> (Arc<Fake>, String) {
    let fake = Fake::new(1, vec![]);
    let addr = fake.serve().await.to_string();
    (fake, addr)
}

fn acquire(owner: Option<&[u8]>, ttl_ms: u64, wait_ms: u64) -> AcquireOptions {
    AcquireOptions {
        owner: owner.map(<[u8]>::to_vec),
        ttl: Duration::from_millis(ttl_ms),
        wait: Duration::from_millis(wait_ms),
        ..AcquireOptions::default()
    }
}

/// Waits for `lost` at most `seconds`.
async fn lost_within(lost: impl Future<Output = LockLost>, seconds: u64) -> LockLost {
    tokio::time::timeout(Duration::from_secs(seconds), lost)
        .await
        .expect("the guard noticed in time")
}

#[tokio::test]
async fn an_acquire_waits_past_its_attempt_budget_in_one_attempt() {
    let (fake, addr) = serve().await;
    let holder = client(std::slice::from_ref(&addr), ClientOptions::default());
    let first = holder
        .acquire(b"jobs", acquire(None, 700, 0))
        .await
        .unwrap();
    assert!(first.acquired);
    // Attempts of 200 ms within 500 ms: only the wait makes room for the hand-over.
    let waiter = client(&[addr], short());

    let second = waiter
        .acquire(b"jobs", acquire(None, 5_000, 5_000))
        .await
        .unwrap();
    assert!(second.acquired, "{second:?}");
    let (first, second) = (first.holder.unwrap(), second.holder.unwrap());
    assert!(second.token > first.token);
    assert_eq!(second.owner, waiter.owner());
    assert_eq!(fake.writes_of("acquire").len(), 2, "one attempt each");
}

#[tokio::test]
async fn a_lost_acquire_answer_is_retried_with_the_same_id_and_token() {
    let (fake, addr) = serve().await;
    fake.replies_push(Reply::Lose);
    let client = client(&[addr], ClientOptions::default());

    let acquired = client
        .acquire(b"jobs", acquire(None, 5_000, 0))
        .await
        .unwrap();
    assert!(acquired.acquired && acquired.replayed, "{acquired:?}");
    assert_eq!(acquired.holder.unwrap().token, 1);
    let ids: Vec<_> = fake
        .writes_of("acquire")
        .iter()
        .map(|w| w.request_id)
        .collect();
    assert_eq!(ids.len(), 2);
    assert_eq!(ids[0], ids[1], "the same id twice");
}

#[tokio::test]
async fn stale_tokens_get_final_answers_sent_once() {
    let (fake, addr) = serve().await;
    let client = client(&[addr], ClientOptions::default());
    let token = client.acquire(b"l", acquire(None, 5_000, 0)).await.unwrap();
    let token = token.holder.unwrap().token;
    let ttl = Duration::from_secs(5);

    let renew = client.renew(b"l", token + 1, ttl).await.unwrap_err();
    assert_eq!(
        renew,
        KvError::LockNotHeld {
            name: b"l".to_vec(),
            token: token + 1,
            current_token: Some(token),
        }
    );
    let release = client.release(b"l", token + 1).await.unwrap_err();
    assert!(matches!(release, KvError::LockNotHeld { .. }), "{release}");
    let complete = client.complete(b"s", b"i", 7, b"r", ttl).await.unwrap_err();
    assert!(
        matches!(complete, KvError::RecordNotOwned { .. }),
        "{complete}"
    );
    let abort = client.abort(b"s", b"i", 7).await.unwrap_err();
    assert!(matches!(abort, KvError::RecordNotOwned { .. }), "{abort}");
    for method in ["renew", "release", "complete", "abort"] {
        assert_eq!(fake.writes_of(method).len(), 1, "{method} was sent once");
    }
}

#[tokio::test]
async fn a_guard_renews_until_released_and_its_release_frees_the_lock() {
    let (fake, addr) = serve().await;
    let client = client(&[addr], ClientOptions::default());
    let guard = client.lock(b"jobs", acquire(None, 300, 0)).await.unwrap();
    let lost = guard.lost();

    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(guard.lost_now(), None, "renewed past its TTL");
    assert!(fake.writes_of("renew").len() >= 2);
    let held = client
        .inspect(b"jobs", Consistency::Linearizable)
        .await
        .unwrap();
    assert_eq!(held.holder.unwrap().token, guard.token());

    guard.release().await.unwrap();
    let free = client
        .inspect(b"jobs", Consistency::Linearizable)
        .await
        .unwrap();
    assert_eq!(free.holder, None);
    assert_eq!(lost_within(lost, 1).await, LockLost::Released);
}

#[tokio::test]
async fn a_guard_whose_renew_is_refused_reports_the_loss() {
    let (fake, addr) = serve().await;
    let client = client(&[addr], ClientOptions::default());
    let guard = client.lock(b"jobs", acquire(None, 300, 0)).await.unwrap();

    fake.steal_lock(b"jobs");
    let lost = lost_within(guard.lost(), 2).await;
    let LockLost::Refused(KvError::LockNotHeld { token, .. }) = lost else {
        panic!("expected a refused renew, got {lost:?}");
    };
    assert_eq!(token, guard.token());
}

#[tokio::test]
async fn a_paused_guard_expires_and_another_owner_takes_the_lock() {
    let (fake, addr) = serve().await;
    let client = client(&[addr], ClientOptions::default());
    let guard = client.lock(b"jobs", acquire(None, 300, 0)).await.unwrap();
    guard.pause_renewals();

    assert_eq!(lost_within(guard.lost(), 2).await, LockLost::Expired);
    assert!(fake.writes_of("renew").is_empty(), "paused: no renew sent");
    // The guard counts its TTL from when the acquire was sent, so it gives the lock up a
    // little before the server's hold ends: the other owner waits for that moment.
    let other = client
        .acquire(b"jobs", acquire(Some(b"other"), 5_000, 2_000))
        .await;
    let other = other.unwrap();
    assert!(other.acquired);
    assert!(other.holder.unwrap().token > guard.token());
}

#[tokio::test]
async fn lock_is_busy_when_the_wait_runs_out() {
    let (_fake, addr) = serve().await;
    let client = client(&[addr], ClientOptions::default());
    client
        .acquire(b"jobs", acquire(Some(b"other"), 5_000, 0))
        .await
        .unwrap();

    let busy = client
        .lock(b"jobs", acquire(None, 5_000, 200))
        .await
        .unwrap_err();
    let LockError::Busy { holder, .. } = busy else {
        panic!("expected busy, got {busy:?}");
    };
    assert_eq!(holder.unwrap().owner, b"other");
}

#[tokio::test]
async fn idempotent_work_runs_once_and_its_result_is_handed_back() {
    let (fake, addr) = serve().await;
    let client = client(&[addr], ClientOptions::default());
    let runs = AtomicU32::new(0);
    let work = || async {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok::<_, String>(b"receipt".to_vec())
    };
    let ttl = Duration::from_secs(5);

    let first = client.idempotent(b"pay", b"o-1", ttl, work).await.unwrap();
    let second = client.idempotent(b"pay", b"o-1", ttl, work).await.unwrap();
    assert_eq!(
        (first.as_slice(), second.as_slice()),
        (&b"receipt"[..], &b"receipt"[..])
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(fake.writes_of("complete").len(), 1);
}

#[tokio::test]
async fn failed_work_aborts_the_record_so_the_next_caller_runs_it() {
    let (fake, addr) = serve().await;
    let client = client(&[addr], ClientOptions::default());
    let ttl = Duration::from_secs(5);

    let failed = client
        .idempotent(b"pay", b"o-1", ttl, || async {
            Err::<Vec<u8>, _>("boom".to_string())
        })
        .await
        .unwrap_err();
    assert_eq!(failed, IdempotentError::Work("boom".to_string()));
    assert_eq!(fake.writes_of("abort").len(), 1);
    let done = client
        .idempotent(b"pay", b"o-1", ttl, || async {
            Ok::<_, String>(b"ok".to_vec())
        })
        .await
        .unwrap();
    assert_eq!(done, b"ok");
}

#[tokio::test]
async fn idempotent_waits_for_another_owner_and_takes_over_when_its_ttl_runs_out() {
    let (_fake, addr) = serve().await;
    let client = client(&[addr], ClientOptions::default());
    let short_ttl = Duration::from_millis(300);
    let other = client
        .begin(b"pay", b"o-1", Some(b"other"), short_ttl)
        .await
        .unwrap();
    let BeginResult::Started { token: stale, .. } = other else {
        panic!("expected started, got {other:?}");
    };

    let ttl = Duration::from_secs(5);
    let result = client
        .idempotent(b"pay", b"o-1", ttl, || async {
            Ok::<_, String>(b"mine".to_vec())
        })
        .await
        .unwrap();
    assert_eq!(result, b"mine");
    let late = client.complete(b"pay", b"o-1", stale, b"theirs", ttl).await;
    assert!(
        matches!(late, Err(KvError::RecordNotOwned { .. })),
        "{late:?}"
    );
}

#[tokio::test]
async fn idempotent_gives_up_waiting_for_another_owner_without_running_the_work() {
    let (_fake, addr) = serve().await;
    let client = client(&[addr], ClientOptions::default());
    let long = Duration::from_secs(10);
    client
        .begin(b"pay", b"o-1", Some(b"other"), long)
        .await
        .unwrap();
    let options = IdempotentOptions {
        wait: Duration::from_millis(300),
        ..IdempotentOptions::new(long)
    };

    let ran = AtomicU32::new(0);
    let work = || async {
        ran.fetch_add(1, Ordering::SeqCst);
        Ok::<_, String>(Vec::new())
    };
    let error = client
        .idempotent_with(b"pay", b"o-1", options, work)
        .await
        .unwrap_err();
    let IdempotentError::InProgress { owner, .. } = error else {
        panic!("expected in progress, got {error:?}");
    };
    assert_eq!(owner, b"other");
    assert_eq!(ran.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn fences_are_checked_and_sent_with_puts_deletes_and_batches() {
    let (fake, addr) = serve().await;
    let client = client(&[addr], ClientOptions::default());
    let fence = |token| {
        Some(Fence {
            lock: b"jobs".to_vec(),
            token,
        })
    };
    let zero = PutOptions {
        fence: fence(0),
        ..PutOptions::default()
    };
    let error = client.put(b"k", b"v", zero).await.unwrap_err();
    assert!(matches!(error, KvError::InvalidArgument { .. }), "{error}");
    assert!(fake.writes().is_empty(), "an invalid fence is not sent");

    let put = PutOptions {
        fence: fence(5),
        ..PutOptions::default()
    };
    client.put(b"k", b"v", put).await.unwrap();
    let delete = DeleteOptions {
        fence: fence(6),
        ..DeleteOptions::default()
    };
    client.delete(b"k", delete).await.unwrap();
    let ops = vec![BatchOp::Increment {
        key: b"n".to_vec(),
        delta: 1,
    }];
    let batch = BatchOptions { fence: fence(7) };
    client.batch_with(ops, batch).await.unwrap();
    let tokens: Vec<Option<u64>> = fake
        .writes()
        .iter()
        .map(|w| w.fence.as_ref().map(|f| f.token))
        .collect();
    assert_eq!(tokens, [Some(5), Some(6), Some(7)]);
}
