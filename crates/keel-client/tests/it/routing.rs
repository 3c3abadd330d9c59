//! Routing and retries end to end: leader hints, refused connections, timeouts. How writes
//! are retried with their request ids is in `writes`.

use std::time::Duration;

use keel_client::{Client, ClientOptions, PutOptions};
use keel_types::{Consistency, KvError, NodeAddr, RangeId};

use crate::fake::{Fake, Reply};

pub fn client(endpoints: &[String], options: ClientOptions) -> Client {
    Client::new(endpoints.to_vec(), options).unwrap()
}

fn not_leader(hint: &str) -> Reply {
    Reply::Error(KvError::NotLeader {
        range_id: RangeId(1),
        leader: Some((2, NodeAddr::new(hint))),
    })
}

/// A loopback address nothing listens on.
pub async fn dead_addr() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap().to_string()
}

/// Budgets short enough for a test to run into them.
pub fn short() -> ClientOptions {
    ClientOptions {
        request_timeout: Duration::from_millis(500),
        read_attempt_timeout: Duration::from_millis(200),
        write_deadline: Duration::from_millis(500),
        write_attempt_timeout: Duration::from_millis(200),
        connect_timeout: Duration::from_millis(200),
        ..ClientOptions::default()
    }
}

#[tokio::test]
async fn not_leader_hint_is_followed_to_an_unlisted_endpoint() {
    let fake = Fake::new(2, vec![]);
    let first = fake.serve().await;
    let second = fake.serve().await;
    fake.replies_push(not_leader(&second.to_string()));
    let client = client(&[first.to_string()], ClientOptions::default());

    let put = client.put(b"k", b"v", PutOptions::default()).await.unwrap();
    assert_eq!(put.revision, 1);
    // The hinted leader is cached: the next request goes straight there.
    client.put(b"k", b"w", PutOptions::default()).await.unwrap();
    let ports = [first.port(), second.port(), second.port()];
    assert_eq!(
        fake.calls(),
        vec![("put", ports[0]), ("put", ports[1]), ("put", ports[2])]
    );
}

#[tokio::test]
async fn write_is_retried_after_connection_refused_and_unavailable() {
    let fake = Fake::new(1, vec![Reply::Error(KvError::unavailable("no leader yet"))]);
    let live = fake.serve().await;
    let client = client(
        &[dead_addr().await, live.to_string()],
        ClientOptions::default(),
    );

    let put = client.put(b"k", b"v", PutOptions::default()).await.unwrap();
    assert_eq!(put.revision, 1);
    // Unavailable, then the retry: rotation passes the dead endpoint again in between.
    assert_eq!(
        fake.calls(),
        vec![("put", live.port()), ("put", live.port())]
    );
}

#[tokio::test]
async fn read_that_times_out_goes_to_the_next_endpoint() {
    let slow = Fake::new(1, vec![Reply::Hang]);
    let quick = Fake::new(2, vec![]);
    let endpoints = [
        slow.serve().await.to_string(),
        quick.serve().await.to_string(),
    ];
    let client = client(&endpoints, short());

    let get = client.get(b"k", Consistency::Linearizable).await.unwrap();
    assert_eq!(get.served_by, 2);
    assert_eq!(get.kv.unwrap().value, b"value");
    assert_eq!((slow.calls().len(), quick.calls().len()), (1, 1));
}

#[tokio::test]
async fn invalid_input_fails_before_anything_is_sent() {
    let fake = Fake::new(1, vec![]);
    let client = client(&[fake.serve().await.to_string()], short());

    let error = client
        .put(b"", b"v", PutOptions::default())
        .await
        .unwrap_err();
    assert!(
        matches!(error, KvError::InvalidArgument { .. }),
        "{error:?}"
    );
    let error = client
        .scan(b"b", b"a", 0, Consistency::Linearizable)
        .await
        .unwrap_err();
    assert!(
        matches!(error, KvError::InvalidArgument { .. }),
        "{error:?}"
    );
    assert!(fake.calls().is_empty());
    assert_eq!(fake.sessions_opened(), 0);
}

#[tokio::test]
async fn unreachable_cluster_is_unavailable_within_the_deadline() {
    let client = client(&[dead_addr().await, dead_addr().await], short());
    let error = client
        .get(b"k", Consistency::Linearizable)
        .await
        .unwrap_err();
    assert!(matches!(error, KvError::Unavailable { .. }), "{error:?}");
    // No session could be opened, so the write was never sent: not applied.
    let error = client
        .put(b"k", b"v", PutOptions::default())
        .await
        .unwrap_err();
    assert!(matches!(error, KvError::Unavailable { .. }), "{error:?}");
}

#[tokio::test]
async fn hint_naming_a_dead_leader_is_skipped() {
    let dead = dead_addr().await;
    // A follower still names the crashed leader, then (the election over) serves.
    let fake = Fake::new(2, vec![not_leader(&dead)]);
    let live = fake.serve().await;
    let client = client(&[dead.clone(), live.to_string()], ClientOptions::default());

    let put = client.put(b"k", b"v", PutOptions::default()).await.unwrap();
    assert_eq!(put.revision, 1);
    assert_eq!(
        fake.calls(),
        vec![("put", live.port()), ("put", live.port())]
    );
}
