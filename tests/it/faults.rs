//! The range faults of the test-only Faults service: split thresholds lowered at run time make
//! a range split by itself; a replica moved through any node changes the range's voters; bad
//! requests are refused with the status that says why.

use std::collections::BTreeSet;
use std::time::Duration;

use keel_client::{Client, PutOptions};
use keel_proto::test::v1::faults_client::FaultsClient;
use keel_proto::test::v1::{MoveReplicaRequest, SetSplitThresholdsRequest};
use keel_server::{Faults, KvSettings, PlacementSettings, RaftTimings};
use keel_types::{Consistency, NodeId, RangeId};
use tonic::Code;
use tonic::transport::Channel;

use crate::harness::{Cluster, eventually, eventually_within};

/// How long a test waits for a replica move: a snapshot and two membership changes on two
/// busy cores (see `placement.rs`).
const MOVE_LIMIT: Duration = Duration::from_secs(120);

async fn faults(cluster: &Cluster, id: NodeId) -> FaultsClient<Channel> {
    FaultsClient::connect(format!("http://{}", cluster.endpoint(id)))
        .await
        .unwrap()
}

fn key(i: usize) -> Vec<u8> {
    format!("k{i:03}").into_bytes()
}

/// Writes keys `0..count` with 100-byte values.
async fn fill(client: &Client, count: usize) {
    for i in 0..count {
        let value = [b'v'; 100];
        client
            .put(&key(i), &value, PutOptions::default())
            .await
            .unwrap();
    }
}

/// The status of a call that must fail.
fn refused<T: std::fmt::Debug>(answer: Result<T, tonic::Status>) -> tonic::Status {
    answer.expect_err("the call is refused")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lowered_split_thresholds_make_a_range_split_by_itself() {
    let mut kv = KvSettings::default();
    kv.split.check_interval_ms = 50;
    let cluster = Cluster::start_configured(3, RaftTimings::default(), kv, Faults::default()).await;
    let client = cluster.client();
    fill(&client, 40).await;
    // About 4 KiB is far below the configured 64 MiB: nothing splits yet.
    assert_eq!(client.ranges().await.unwrap().len(), 1);

    let mut node = faults(&cluster, 1).await;
    let tiny = SetSplitThresholdsRequest {
        range_split_bytes: 10,
        ..SetSplitThresholdsRequest::default()
    };
    let status = refused(node.set_split_thresholds(tiny).await);
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("1024 bytes"), "{status:?}");
    let long = SetSplitThresholdsRequest {
        range_split_load_secs: 61,
        ..SetSplitThresholdsRequest::default()
    };
    let status = refused(node.set_split_thresholds(long).await);
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("60 s"), "{status:?}");

    for id in cluster.ids() {
        let small = SetSplitThresholdsRequest {
            range_split_bytes: 1024,
            ..SetSplitThresholdsRequest::default()
        };
        let before = faults(&cluster, id)
            .await
            .set_split_thresholds(small)
            .await
            .unwrap()
            .into_inner();
        // The answer holds the settings from before, so a test can put them back.
        assert_eq!(before.range_split_bytes, 64 << 20, "{before:?}");
        assert_eq!(before.range_split_load_secs, 10, "{before:?}");
    }
    let ranges = eventually("the range splits by itself", || async {
        let ranges = client.ranges().await.ok()?;
        (ranges.len() > 1).then_some(ranges)
    })
    .await;
    assert!(ranges.iter().all(|range| range.descriptor.epoch > 0));
    for i in 0..40 {
        let got = client
            .get(&key(i), Consistency::Linearizable)
            .await
            .unwrap();
        assert_eq!(got.kv.map(|kv| kv.value), Some(vec![b'v'; 100]));
    }
    cluster.shutdown().await;
}

/// The voters of the first range as node `id` sees them.
async fn voters(cluster: &Cluster, id: NodeId) -> BTreeSet<NodeId> {
    let range = cluster.range_status(id).await;
    let voters = range.members.iter().filter(|member| member.voter);
    voters.map(|member| member.node_id).collect()
}

fn move_request(from: NodeId, to: NodeId) -> MoveReplicaRequest {
    MoveReplicaRequest {
        range_id: RangeId::FIRST.0,
        from_node: from,
        to_node: to,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_moved_replica_changes_the_ranges_voters() {
    // The rebalancer looks once a minute: it moves nothing by itself while the test runs.
    let placement = PlacementSettings {
        rebalance_interval_ms: 60_000,
        ..PlacementSettings::default()
    };
    let mut cluster = Cluster::start_placed(3, placement).await;
    let client = cluster.client();
    client
        .put(b"moved", b"along", PutOptions::default())
        .await
        .unwrap();
    let leader = cluster.leader().await;
    assert_eq!(voters(&cluster, leader).await, BTreeSet::from([1, 2, 3]));
    cluster.join_node(4).await;
    eventually("node 4 joins", || async {
        let members = client.members().await.ok()?;
        let live = |node: &keel_proto::v1::NodeInfo| node.node_id == 4 && node.liveness == "live";
        members.nodes.iter().any(live).then_some(())
    })
    .await;
    let from = if leader == 1 { 2 } else { 1 };

    // Node 4 holds no replica of the range: it sends the move on to one that does.
    let mut node = faults(&cluster, 4).await;
    eventually_within(MOVE_LIMIT, "the move is carried out", || async {
        match faults(&cluster, 4)
            .await
            .move_replica(move_request(from, 4))
            .await
        {
            Ok(_) => Some(()),
            Err(status) if status.code() == Code::Unavailable => None,
            Err(status) => panic!("the move failed: {status:?}"),
        }
    })
    .await;
    let expected: BTreeSet<NodeId> = [1, 2, 3, 4].into_iter().filter(|id| *id != from).collect();
    for id in [leader, 4] {
        eventually("the new voters reach the node", || async {
            (voters(&cluster, id).await == expected).then_some(())
        })
        .await;
    }
    eventually("the old replica is removed", || async {
        let status = client.status(&cluster.endpoint(from)).await.ok()?;
        let hosted = status.ranges.iter().any(|r| r.range_id == RangeId::FIRST.0);
        (!hosted).then_some(())
    })
    .await;
    let got = cluster.applied_on(4, b"moved").await;
    assert_eq!(got.kv.map(|kv| kv.value), Some(b"along".to_vec()));

    let status = refused(node.move_replica(move_request(from, 4)).await);
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert!(status.message().contains("is not a voter"), "{status:?}");
    let status = refused(node.move_replica(move_request(4, 4)).await);
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    let status = refused(node.move_replica(move_request(4, 9)).await);
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("node 9 is unknown"), "{status:?}");
    cluster.shutdown().await;
}
