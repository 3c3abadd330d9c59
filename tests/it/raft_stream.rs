//! Raft traffic between nodes: the messages of every range ride one long-lived stream per
//! node pair (`Raft.Batch`), not a gRPC call each.

use keel_client::PutOptions;

use crate::harness::Cluster;
use crate::observability::scrape;

const RAFT: &str = "keel.raft.v1.Raft";

/// Writes to two ranges replicate, and on every node the per-message calls (appends, votes,
/// read indexes) were never used: the leaders' messages went on streams, one per follower.
#[tokio::test]
async fn raft_messages_of_every_range_ride_one_stream_per_peer() {
    let cluster = Cluster::start(3).await;
    let client = cluster.client();
    client.split(b"m").await.unwrap();
    for key in ["a", "b", "x", "y"] {
        client
            .put(key.as_bytes(), b"v", PutOptions::default())
            .await
            .unwrap();
    }
    for key in ["a", "x"] {
        for id in cluster.ids() {
            let applied = cluster.applied_on(id, key.as_bytes()).await;
            assert_eq!(applied.kv.map(|kv| kv.value), Some(b"v".to_vec()));
        }
    }
    let mut streams = 0.0;
    for id in cluster.ids() {
        let scrape = scrape(&cluster, id).await;
        let calls = |method: &str, metric: &str| {
            let labels = [("service", RAFT), ("method", method)];
            scrape.value(metric, &labels).unwrap_or(0.0)
        };
        for method in [
            "AppendEntries",
            "Vote",
            "PreVote",
            "TransferLeader",
            "ReadIndex",
        ] {
            let sent = calls(method, "keel_grpc_requests_total");
            assert_eq!(sent, 0.0, "node {id} served {sent} {method} calls");
        }
        streams += calls("Batch", "keel_grpc_requests_total");
    }
    assert!(
        streams >= 2.0,
        "the followers serve {streams} batch streams"
    );
    cluster.shutdown().await;
}
