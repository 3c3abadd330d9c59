//! A three-node cluster in one process: election, a write forwarded by a follower,
//! linearizable reads from every node, follower reads, and NotLeader with no_forward.

use std::time::{Duration, Instant};

use keel_proto::v1::{Consistency, GetRequest, PutRequest};
use keel_server::status;
use keel_types::KvError;

use crate::harness::{Cluster, WAIT_LIMIT, first_range, quick_timings};

fn get(key: &[u8], consistency: Consistency) -> GetRequest {
    GetRequest {
        key: key.to_vec(),
        consistency: consistency.into(),
        no_forward: false,
        ..GetRequest::default()
    }
}

fn put(key: &[u8], value: &[u8], no_forward: bool) -> PutRequest {
    PutRequest {
        key: key.to_vec(),
        value: value.to_vec(),
        condition: None,
        return_previous: false,
        no_forward,
        ttl_ms: None,
        request_id: None,
        fence: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_forward_writes_and_serve_reads() {
    let cluster = Cluster::start_with(3, quick_timings()).await;
    let leader = cluster.leader().await;
    let follower = (1..=3).find(|id| *id != leader).unwrap();

    let written = cluster
        .kv(follower)
        .await
        .put(put(b"greeting", b"hello", false))
        .await
        .unwrap()
        .into_inner();
    let header = written.header.unwrap();
    assert!(header.revision > 0);
    assert_eq!(
        header.served_by, leader,
        "a follower forwards writes to the leader"
    );

    for id in 1..=3 {
        let read = cluster
            .kv(id)
            .await
            .get(get(b"greeting", Consistency::Linearizable))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(read.kv.unwrap().value, b"hello");
        assert!(read.header.unwrap().revision >= header.revision);
    }

    let start = Instant::now();
    loop {
        let read = cluster
            .kv(follower)
            .await
            .get(get(b"greeting", Consistency::Follower))
            .await
            .unwrap()
            .into_inner();
        let read_header = read.header.unwrap();
        assert_eq!(read_header.served_by, follower, "follower reads stay local");
        if read_header.revision >= header.revision {
            assert_eq!(read.kv.unwrap().value, b"hello");
            break;
        }
        assert!(
            start.elapsed() < WAIT_LIMIT,
            "follower never applied the write"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let refused = cluster
        .kv(follower)
        .await
        .put(put(b"greeting", b"again", true))
        .await
        .unwrap_err();
    match status::kv_error(&refused) {
        Some(KvError::NotLeader {
            leader: Some((id, addr)),
            ..
        }) => {
            assert_eq!(id, leader);
            assert_eq!(addr.addr, cluster.node(leader).addr().to_string());
        }
        other => panic!("expected NotLeader with a hint, got {other:?} ({refused:?})"),
    }

    let invalid = cluster
        .kv(follower)
        .await
        .put(put(b"", b"v", false))
        .await
        .unwrap_err();
    assert_eq!(invalid.code(), tonic::Code::InvalidArgument);

    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_keeps_data_and_does_not_reinitialize() {
    let cluster = Cluster::start_with(3, quick_timings()).await;
    let leader = cluster.leader().await;
    let written = cluster
        .kv(leader)
        .await
        .put(put(b"durable", b"yes", false))
        .await
        .unwrap()
        .into_inner();
    let revision = written.header.unwrap().revision;
    let before = first_range(&cluster.status(leader).await.ranges)
        .cloned()
        .expect("the leader serves the first data range");

    let cluster = cluster.restart().await;
    let leader = cluster.leader().await;
    let read = cluster
        .kv(leader)
        .await
        .get(get(b"durable", Consistency::Linearizable))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(read.kv.unwrap().mod_revision, revision);
    let after = first_range(&cluster.status(leader).await.ranges)
        .cloned()
        .expect("the leader serves the first data range");
    // openraft may restore the old leader in its old term; nothing goes backwards.
    assert!(after.term >= before.term, "{before:?} -> {after:?}");
    assert!(
        after.last_log_index >= before.last_log_index,
        "{before:?} -> {after:?}"
    );
    assert_eq!(
        after.revision, before.revision,
        "no write happened: {after:?}"
    );
    assert_eq!(after.members.len(), 3);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storage_failure_stops_serving() {
    let cluster = Cluster::start_with(3, quick_timings()).await;
    let leader = cluster.leader().await;
    let node = cluster.node(leader);
    node.inject_storage_failure();
    let failed = cluster
        .kv(leader)
        .await
        .put(put(b"k", b"v", true))
        .await
        .unwrap_err();
    assert!(
        matches!(
            status::kv_error(&failed),
            Some(KvError::OutcomeUnknown { .. } | KvError::Fatal { .. })
        ),
        "{failed:?}"
    );
    let reason = tokio::time::timeout(WAIT_LIMIT, node.failed())
        .await
        .unwrap();
    assert!(!reason.is_empty());

    let refused = cluster
        .kv(leader)
        .await
        .get(get(b"k", Consistency::Follower))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Internal);
    assert!(matches!(
        status::kv_error(&refused),
        Some(KvError::Fatal { .. })
    ));
    assert!(!cluster.status(leader).await.healthy);
    cluster.shutdown().await;
}
