//! Writes end to end against the fake: request ids, sessions, retries with the same id,
//! replayed answers, the write deadline, increments and TTLs, and a history page.

use std::sync::Arc;
use std::time::Duration;

use keel_client::{Client, ClientOptions, PutOptions};
use keel_types::{
    BatchOp, Consistency, KvError, ManualClock, NodeAddr, RangeId, ReadBound, SharedClock,
};
use tokio::sync::Notify;

use crate::fake::{Fake, HISTORY_CLOCK_MS, Reply, TTL_KEY, TTL_REMAINING_MS};
use crate::routing::{client, short};

/// (client_id, sequence, completed_below) of each write the fake received.
fn ids(fake: &Fake) -> Vec<(u64, u64, u64)> {
    let ids = fake.request_ids();
    ids.iter()
        .map(|id| (id.client_id, id.sequence, id.completed_below))
        .collect()
}

fn expired() -> Reply {
    Reply::Error(KvError::RequestIdExpired {
        client_id: 1,
        sequence: 1,
    })
}

/// Short attempts within a deadline long enough that a retry surely fits on a busy machine.
fn quick_attempts() -> ClientOptions {
    ClientOptions {
        write_deadline: Duration::from_secs(10),
        ..short()
    }
}

async fn one_fake(replies: Vec<Reply>, options: ClientOptions) -> (Arc<Fake>, Client) {
    let fake = Fake::new(1, replies);
    let client = client(&[fake.serve().await.to_string()], options);
    (fake, client)
}

#[tokio::test]
async fn lost_response_is_resent_with_the_same_id_and_the_first_answer_returned() {
    let (fake, client) = one_fake(vec![Reply::Lose], ClientOptions::default()).await;

    let result = client.increment(b"n", 5).await.unwrap();
    assert_eq!(
        (result.value, result.revision, result.replayed),
        (5, 1, true)
    );
    assert_eq!(fake.counter(), 5, "applied once");
    assert_eq!(ids(&fake), [(1, 1, 1), (1, 1, 1)], "the same id twice");

    fake.replies_push(Reply::Lose);
    let put = client.put(b"k", b"v", PutOptions::default()).await.unwrap();
    assert_eq!((put.revision, put.replayed), (2, true));
    assert_eq!(&ids(&fake)[2..], [(1, 2, 2), (1, 2, 2)]);
}

/// Regression: a lost answer marked the leader unreachable for the rest of the write, so every
/// follower's hint back to it was skipped until the deadline passed.
#[tokio::test]
async fn a_lost_answer_at_the_leader_is_retried_there_through_a_followers_hint() {
    let leader = Fake::new(1, vec![Reply::Lose]);
    let leader_addr = leader.serve().await.to_string();
    let follower = Fake::new(2, vec![]);
    follower.set_fallback(Reply::Error(KvError::NotLeader {
        range_id: RangeId::FIRST,
        leader: Some((1, NodeAddr::new(leader_addr.clone()))),
    }));
    let follower_addr = follower.serve().await.to_string();
    let client = client(&[leader_addr, follower_addr], quick_attempts());

    let result = client.increment(b"n", 5).await.unwrap();
    assert_eq!((result.value, result.replayed), (5, true));
    assert_eq!(leader.counter(), 5, "applied once");
}

#[tokio::test]
async fn write_that_times_out_is_resent_with_the_same_id() {
    let (fake, client) = one_fake(vec![Reply::Hang], quick_attempts()).await;

    let deleted = client.delete(b"k", Default::default()).await.unwrap();
    assert!(!deleted.replayed, "the hung attempt applied nothing");
    assert_eq!(ids(&fake), [(1, 1, 1), (1, 1, 1)]);
}

#[tokio::test]
async fn retries_stop_at_the_deadline_with_outcome_unknown() {
    let server_says_unknown = Reply::Error(KvError::OutcomeUnknown {
        message: "leader changed after proposing".into(),
    });
    let options = ClientOptions {
        write_deadline: Duration::from_secs(1),
        ..short()
    };
    for fallback in [Reply::Unknown, server_says_unknown] {
        let (fake, client) = one_fake(vec![], options.clone()).await;
        fake.set_fallback(fallback);

        let error = client
            .put(b"k", b"v", PutOptions::default())
            .await
            .unwrap_err();
        assert!(matches!(error, KvError::OutcomeUnknown { .. }), "{error:?}");
        let ids = ids(&fake);
        assert!(ids.len() >= 2, "retried: {ids:?}");
        assert!(ids.iter().all(|id| *id == (1, 1, 1)), "one id: {ids:?}");
    }
}

#[tokio::test]
async fn completed_below_is_the_lowest_write_in_flight() {
    let gate = Arc::new(Notify::new());
    let (fake, client) = one_fake(vec![Reply::Gate(gate.clone())], ClientOptions::default()).await;

    let first = tokio::spawn({
        let client = client.clone();
        async move { client.put(b"a", b"1", PutOptions::default()).await }
    });
    fake.writes_arrived(1).await;
    // The first write is held at the server: the second may not pass it.
    client.put(b"b", b"2", PutOptions::default()).await.unwrap();
    gate.notify_one();
    first.await.unwrap().unwrap();
    client.put(b"c", b"3", PutOptions::default()).await.unwrap();
    assert_eq!(ids(&fake), [(1, 1, 1), (1, 2, 1), (1, 3, 3)]);
}

#[tokio::test]
async fn request_id_expired_on_a_first_attempt_moves_the_write_to_a_new_session() {
    let (fake, client) = one_fake(vec![expired()], ClientOptions::default()).await;

    let put = client.put(b"k", b"v", PutOptions::default()).await.unwrap();
    assert!(!put.replayed);
    assert_eq!(fake.sessions_opened(), 2);
    assert_eq!(ids(&fake), [(1, 1, 1), (2, 1, 1)]);
    let started: Vec<u64> = fake
        .request_ids()
        .iter()
        .map(|id| id.client_started_ms)
        .collect();
    assert_eq!(started, [1_000, 2_000]);
}

#[tokio::test]
async fn request_id_expired_on_a_retry_is_returned() {
    let (fake, client) = one_fake(vec![Reply::Unknown, expired()], ClientOptions::default()).await;

    let error = client.increment(b"n", 1).await.unwrap_err();
    assert!(
        matches!(error, KvError::RequestIdExpired { .. }),
        "{error:?}"
    );
    assert_eq!(fake.sessions_opened(), 1);
    assert_eq!(ids(&fake), [(1, 1, 1), (1, 1, 1)]);
}

#[tokio::test]
async fn final_answers_are_not_retried() {
    let finals = [
        KvError::NotACounter { key: b"n".to_vec() },
        KvError::Overflow {
            key: b"n".to_vec(),
            current: i64::MAX,
            delta: 1,
        },
        KvError::invalid("delta"),
    ];
    for error in finals {
        let (fake, client) = one_fake(vec![Reply::Error(error.clone())], short()).await;
        assert_eq!(client.increment(b"n", 1).await.unwrap_err(), error);
        assert_eq!(fake.writes().len(), 1, "{error:?} was sent once");
    }
}

#[tokio::test]
async fn overloaded_is_retried_with_the_same_id() {
    let overloaded = Reply::Error(KvError::Overloaded {
        message: "too many sessions".into(),
    });
    let (fake, client) = one_fake(vec![overloaded.clone()], ClientOptions::default()).await;
    client.put(b"k", b"v", PutOptions::default()).await.unwrap();
    assert_eq!(ids(&fake), [(1, 1, 1), (1, 1, 1)]);

    // Still overloaded at the deadline: nothing was applied, and the error says so.
    let (fake, client) = one_fake(vec![], short()).await;
    fake.set_fallback(overloaded);
    let error = client
        .put(b"k", b"v", PutOptions::default())
        .await
        .unwrap_err();
    assert!(matches!(error, KvError::Overloaded { .. }), "{error:?}");
}

#[tokio::test]
async fn sessions_rotate_after_their_max_age() {
    let fake = Fake::new(1, vec![]);
    let endpoints = vec![fake.serve().await.to_string()];
    let clock = ManualClock::new(0);
    let shared: SharedClock = clock.clone();
    let options = ClientOptions {
        session_max_age: Duration::from_secs(60),
        ..ClientOptions::default()
    };
    let client = Client::with_clock(endpoints, options, shared).unwrap();

    client.put(b"k", b"1", PutOptions::default()).await.unwrap();
    clock.advance_ms(60_000);
    client.put(b"k", b"2", PutOptions::default()).await.unwrap();
    clock.advance_ms(1);
    client.put(b"k", b"3", PutOptions::default()).await.unwrap();
    assert_eq!(fake.sessions_opened(), 2);
    assert_eq!(ids(&fake), [(1, 1, 1), (1, 2, 2), (2, 1, 1)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_writes_get_distinct_sequences_in_one_session() {
    let (fake, client) = one_fake(vec![], ClientOptions::default()).await;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..32 {
        let client = client.clone();
        tasks.spawn(async move {
            let key = format!("k{i}");
            client
                .put(key.as_bytes(), b"v", PutOptions::default())
                .await
        });
    }
    for result in tasks.join_all().await {
        result.unwrap();
    }
    assert_eq!(fake.sessions_opened(), 1);
    let ids = ids(&fake);
    assert!(ids.iter().all(|(client_id, ..)| *client_id == 1));
    assert!(ids.iter().all(|(_, sequence, below)| below <= sequence));
    let mut sequences: Vec<u64> = ids.iter().map(|(_, sequence, _)| *sequence).collect();
    sequences.sort_unstable();
    assert_eq!(sequences, (1..=32).collect::<Vec<u64>>());
}

#[tokio::test]
async fn ttls_are_checked_sent_and_reported() {
    let (fake, client) = one_fake(vec![], ClientOptions::default()).await;
    let with_ttl = |ttl| PutOptions {
        ttl: Some(ttl),
        ..PutOptions::default()
    };
    let year_and_a_day = Duration::from_secs(366 * 24 * 60 * 60);
    for bad in [Duration::ZERO, Duration::from_micros(500), year_and_a_day] {
        let error = client.put(b"k", b"v", with_ttl(bad)).await.unwrap_err();
        assert!(matches!(error, KvError::InvalidArgument { .. }), "{bad:?}");
    }
    assert!(fake.writes().is_empty(), "invalid TTLs are not sent");

    let ttl = Duration::from_secs(30);
    client.put(b"k", b"v", with_ttl(ttl)).await.unwrap();
    client.put(b"k", b"v", PutOptions::default()).await.unwrap();
    let sent: Vec<Option<i64>> = fake.writes().iter().map(|w| w.ttl_ms).collect();
    assert_eq!(sent, [Some(30_000), None]);

    let read = client
        .get(TTL_KEY, Consistency::Linearizable)
        .await
        .unwrap();
    let remaining = Duration::from_millis(TTL_REMAINING_MS);
    assert_eq!(read.ttl_remaining, Some(remaining));
    let read = client.get(b"k", Consistency::Linearizable).await.unwrap();
    assert_eq!(read.ttl_remaining, None);
    // The key's revisions and version come through as the server sent them.
    let kv = read.kv.expect("the fake stores every key");
    assert_eq!((kv.create_revision, kv.mod_revision, kv.version), (3, 4, 2));
}

#[tokio::test]
async fn a_history_page_carries_its_events_and_a_bad_limit_is_not_sent() {
    let (fake, client) = one_fake(vec![], ClientOptions::default()).await;
    let refused = client
        .history(
            b"k",
            0,
            1_001,
            Consistency::Linearizable,
            ReadBound::default(),
        )
        .await;
    assert!(
        matches!(refused, Err(KvError::InvalidArgument { .. })),
        "{refused:?}"
    );
    assert!(fake.calls().is_empty(), "a bad limit is not sent");
    let page = client
        .history(b"k", 0, 0, Consistency::Linearizable, ReadBound::default())
        .await
        .unwrap();
    assert_eq!((page.compact_revision, page.revision), (2, 9));
    let after = page.events[0].after.as_ref().unwrap();
    assert_eq!(
        after.expires_at_ms,
        Some(HISTORY_CLOCK_MS + TTL_REMAINING_MS)
    );
    assert_eq!(page.events[0].before, None);
}

#[tokio::test]
async fn batches_carry_increments_ttls_and_an_id() {
    let (fake, client) = one_fake(vec![], ClientOptions::default()).await;
    let ops = vec![
        BatchOp::Put {
            key: b"a".to_vec(),
            value: b"1".to_vec(),
            condition: None,
            return_previous: false,
            ttl_ms: Some(5_000),
        },
        BatchOp::Increment {
            key: b"n".to_vec(),
            delta: -3,
        },
    ];
    let result = client.batch(ops).await.unwrap();
    let counters: Vec<Option<i64>> = result.results.iter().map(|r| r.counter).collect();
    assert_eq!(counters, [None, Some(-3)]);
    assert!(!result.replayed);
    let writes = fake.writes();
    assert_eq!(writes[0].ttl_ms, Some(5_000));
    assert_eq!(ids(&fake), [(1, 1, 1)]);
}
