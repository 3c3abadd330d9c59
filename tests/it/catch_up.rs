//! Lagging replicas catch up: from a snapshot streamed over the real gRPC transport in
//! several chunks, and from more log than one gRPC message may carry.

use keel_client::PutOptions;
use keel_server::RaftTimings;
use keel_types::{Consistency, limits};

use crate::harness::Cluster;

const KEYS: usize = 100;
/// 100 values of 32 KiB: the snapshot spans several `SNAPSHOT_CHUNK_BYTES` chunks.
const VALUE_BYTES: usize = 32 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_behind_the_purged_log_catches_up_from_a_streamed_snapshot() {
    let timings = RaftTimings {
        snapshot_logs_since_last: 20,
        logs_kept_after_snapshot: 0,
        ..RaftTimings::default()
    };
    let mut cluster = Cluster::start_with(3, timings).await;
    let leader = cluster.leader().await;
    let lagging = cluster.ids().into_iter().find(|id| *id != leader).unwrap();
    let lagging_last = cluster.range_status(lagging).await.last_log_index;
    cluster.stop_node(lagging).await;

    let client = cluster.client();
    let value = vec![b's'; VALUE_BYTES];
    for i in 0..KEYS {
        let key = format!("snap-{i:03}");
        client
            .put(key.as_bytes(), &value, PutOptions::default())
            .await
            .unwrap();
    }
    const { assert!(KEYS * VALUE_BYTES > 2 * limits::SNAPSHOT_CHUNK_BYTES) };
    cluster.purged_past(leader, lagging_last).await;

    cluster.start_node(lagging).await;
    let last_key = format!("snap-{:03}", KEYS - 1);
    cluster.applied_on(lagging, last_key.as_bytes()).await;
    let page = cluster
        .client_of(lagging)
        .scan(b"snap-", b"snap.", 0, Consistency::Follower)
        .await
        .unwrap();
    assert_eq!(page.kvs.len(), KEYS);
    assert!(page.kvs.iter().all(|kv| kv.value == value));
    assert!(cluster.range_status(lagging).await.snapshot_index > lagging_last);
    cluster.shutdown().await;
}

/// More log than one gRPC message may carry: the leader must cut appends to size, or the
/// lagging node never catches up.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_catches_up_on_more_log_than_one_message_holds() {
    const ENTRIES: usize = 20;
    let mut cluster = Cluster::start(3).await;
    let leader = cluster.leader().await;
    let lagging = cluster.ids().into_iter().find(|id| *id != leader).unwrap();
    cluster.stop_node(lagging).await;
    let client = cluster.client();
    let value = vec![b'b'; limits::VALUE_BYTES_MAX];
    for i in 0..ENTRIES {
        let key = format!("big-{i:02}");
        client
            .put(key.as_bytes(), &value, PutOptions::default())
            .await
            .unwrap();
    }
    const { assert!(ENTRIES * limits::VALUE_BYTES_MAX > limits::GRPC_MESSAGE_BYTES_MAX) };
    cluster.start_node(lagging).await;
    let last_key = format!("big-{:02}", ENTRIES - 1);
    cluster.applied_on(lagging, last_key.as_bytes()).await;
    let status = cluster.range_status(lagging).await;
    assert_eq!(
        status.snapshot_index, 0,
        "caught up from the log, not a snapshot"
    );
    cluster.shutdown().await;
}
