//! Client requests a follower sends on to the leader ride one long-lived stream per node
//! pair (`Raft.Forward`), not a gRPC call each, and come back as a call's would: responses,
//! typed errors and all.

use keel_proto::v1::condition::Kind;
use keel_proto::v1::{Condition, IncrementRequest, PutRequest};
use keel_server::status;
use keel_types::KvError;

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
