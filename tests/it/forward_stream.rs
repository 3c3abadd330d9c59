//! Client requests a follower sends on to the leader ride one long-lived stream per node
//! pair (`Raft.Forward`), not a gRPC call each, and come back as a call's would: responses,
//! typed errors and all.

use std::time::Duration;

use keel_proto::v1::condition::Kind;
use keel_proto::v1::lock_client::LockClient;
use keel_proto::v1::{AcquireRequest, Condition, IncrementRequest, PutRequest, ReleaseRequest};
use keel_server::status;
use keel_types::{KvError, NodeId};

use crate::harness::Cluster;
use crate::observability::scrape;

fn put(key: &[u8], value: &[u8], condition: Option<Condition>) -> PutRequest {
    PutRequest {
        key: key.to_vec(),
        value: value.to_vec(),
        condition,
        ..PutRequest::default()
    }
}

/// Writes sent to a follower are served by the leader, a refused one comes back with its
/// typed error, and the follower sent every one on the stream: the leader served no
/// `Kv.Put` or `Kv.Increment` call, and the follower counts no forwarded call of its own.
#[tokio::test]
async fn requests_a_follower_forwards_ride_one_stream_to_the_leader() {
    let cluster = Cluster::start(3).await;
    let leader = cluster.leader().await;
    let follower = cluster.ids().into_iter().find(|id| *id != leader).unwrap();
    let mut kv = cluster.kv(follower).await;
    for key in ["a", "b", "c"] {
        let written = kv.put(put(key.as_bytes(), b"v", None)).await.unwrap();
        let header = written.into_inner().header.unwrap();
        assert_eq!(
            header.served_by, leader,
            "the leader serves a forwarded write"
        );
    }
    let absent = Condition {
        kind: Some(Kind::ExpectAbsent(true)),
    };
    let refused = kv.put(put(b"a", b"w", Some(absent))).await.unwrap_err();
    let Some(KvError::ConditionFailed(failed)) = status::kv_error(&refused) else {
        panic!("a failed condition must come back typed: {refused:?}");
    };
    assert_eq!(failed.key, b"a");
    let counted = kv
        .increment(IncrementRequest {
            key: b"n".to_vec(),
            delta: 5,
            request_id: None,
            no_forward: false,
        })
        .await
        .unwrap();
    assert_eq!(counted.into_inner().value, 5);
    assert_eq!(
        cluster.applied_on(leader, b"a").await.kv.map(|kv| kv.value),
        Some(b"v".to_vec()),
        "the refused write changed nothing"
    );

    let on_leader = scrape(&cluster, leader).await;
    for method in ["Put", "Increment"] {
        let labels = [("service", "keel.v1.Kv"), ("method", method)];
        let calls = on_leader.value("keel_grpc_requests_total", &labels);
        assert_eq!(
            calls.unwrap_or(0.0),
            0.0,
            "the leader served {method} calls"
        );
    }
    let streams = [("service", "keel.raft.v1.Raft"), ("method", "Forward")];
    let streams = on_leader.value("keel_grpc_requests_total", &streams);
    assert_eq!(streams, Some(1.0), "the follower opened one Forward stream");
    let on_follower = scrape(&cluster, follower).await;
    let forwarded = |via| on_follower.value("keel_forwarded_requests_total", &[("via", via)]);
    assert_eq!(forwarded("stream"), Some(5.0));
    assert_eq!(forwarded("call"), Some(0.0));
    cluster.shutdown().await;
}

fn acquire(owner: &[u8], wait_ms: i64) -> AcquireRequest {
    AcquireRequest {
        name: b"l".to_vec(),
        owner: owner.to_vec(),
        ttl_ms: 60_000,
        wait_ms,
        ..AcquireRequest::default()
    }
}

/// A release one follower forwards on its stream hands the lock to an acquire another
/// follower forwarded as a call of its own and that waits on the leader: both reach the
/// node's one set of lock queues.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_on_the_stream_hands_the_lock_to_an_acquire_waiting_from_a_call() {
    let cluster = Cluster::start(3).await;
    let leader = cluster.leader().await;
    let followers: Vec<_> = cluster
        .ids()
        .into_iter()
        .filter(|id| *id != leader)
        .collect();
    release_hands_the_lock_to_a_waiter(&cluster, followers[0], followers[1]).await;
    let on_follower = scrape(&cluster, followers[1]).await;
    let streamed = on_follower.value("keel_forwarded_requests_total", &[("via", "stream")]);
    assert_eq!(streamed, Some(1.0), "the release rode the stream");
    cluster.shutdown().await;
}

/// With peer ports, an acquire a follower forwards waits in the leader's queue through its
/// peer port, and a release a client sends to the leader's client port hands it the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_on_the_client_port_hands_the_lock_to_an_acquire_waiting_from_a_peer() {
    let cluster = Cluster::start_peer_ports(3, false).await;
    let leader = cluster.leader().await;
    let follower = cluster.ids().into_iter().find(|id| *id != leader).unwrap();
    release_hands_the_lock_to_a_waiter(&cluster, follower, leader).await;
    cluster.shutdown().await;
}

/// Takes lock `l` on the leader, has an acquire sent to `waiter` wait for it, releases it
/// through `releaser`, and checks the waiter got it.
async fn release_hands_the_lock_to_a_waiter(cluster: &Cluster, waiter: NodeId, releaser: NodeId) {
    let leader = cluster.leader().await;
    let lock = |id| LockClient::connect(format!("http://{}", cluster.endpoint(id)));
    let held = lock(leader).await.unwrap().acquire(acquire(b"a", 0)).await;
    let held = held.unwrap().into_inner();
    assert!(held.acquired, "{held:?}");
    let token = held.holder.unwrap().token;
    let mut waiting = lock(waiter).await.unwrap();
    let waiter = tokio::spawn(async move { waiting.acquire(acquire(b"b", 20_000)).await });
    // Time for the waiter to queue. Not a timing assertion: had it not queued yet, it takes
    // the freed lock itself, and every assertion below holds either way.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let release = ReleaseRequest {
        name: b"l".to_vec(),
        token,
        ..ReleaseRequest::default()
    };
    let released = lock(releaser).await.unwrap().release(release).await;
    let header = released.unwrap().into_inner().header.unwrap();
    assert_eq!(header.served_by, leader);
    let granted = waiter.await.unwrap().unwrap().into_inner();
    assert!(
        granted.acquired,
        "the waiter gets the released lock: {granted:?}"
    );
    let holder = granted.holder.unwrap();
    assert_eq!(holder.owner, b"b");
    assert!(holder.token > token);
}
