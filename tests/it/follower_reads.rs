//! Linearizable reads served by followers (ReadIndex) in a three-node cluster: a follower
//! asked with `no_forward` serves the read itself, sees every write the leader acknowledged
//! before it, shares read index calls between concurrent reads, and refuses (never answers
//! from its own state) when it cannot reach a leader.

use futures::future::join_all;
use keel_client::PutOptions;
use keel_proto::v1::kv_client::KvClient;
use keel_proto::v1::{Consistency, GetRequest, GetResponse, ScanRequest};
use keel_server::status;
use keel_types::{KvError, NodeId, RangeId, ReadBound};
use tonic::transport::Channel;

use crate::harness::{Cluster, eventually, quick_timings};
use crate::observability::scrape;

/// Put-then-follower-get pairs the ordering test makes.
const PAIRS: u32 = 300;
/// Reads the batching test sends to one follower at once.
const CONCURRENT_READS: usize = 64;

fn linearizable_get(key: &[u8]) -> GetRequest {
    GetRequest {
        key: key.to_vec(),
        consistency: Consistency::Linearizable.into(),
        no_forward: true,
        ..GetRequest::default()
    }
}

/// A linearizable get of `key` on node `id` alone (`no_forward`).
async fn get_on(kv: &mut KvClient<Channel>, key: &[u8]) -> Result<GetResponse, tonic::Status> {
    kv.get(linearizable_get(key))
        .await
        .map(tonic::Response::into_inner)
}

/// Two nodes that follow the leader of the first range.
async fn followers(cluster: &Cluster) -> (NodeId, Vec<NodeId>) {
    let leader = cluster.leader().await;
    let followers = cluster.ids().into_iter().filter(|id| *id != leader);
    (leader, followers.collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_serve_linearizable_gets_and_scans_themselves() {
    let cluster = Cluster::start_with(3, quick_timings()).await;
    let (_, followers) = followers(&cluster).await;
    let written = cluster
        .client()
        .put(b"fr", b"1", PutOptions::default())
        .await
        .unwrap();
    for follower in followers {
        let mut kv = cluster.kv(follower).await;
        let got = get_on(&mut kv, b"fr").await.unwrap();
        let header = got.header.unwrap();
        assert_eq!(header.served_by, follower, "the follower served the read");
        assert!(header.revision >= written.revision);
        assert_eq!(got.kv.unwrap().value, b"1");

        let scan = ScanRequest {
            start: b"fr".to_vec(),
            end: b"fs".to_vec(),
            limit: 10,
            consistency: Consistency::Linearizable.into(),
            no_forward: true,
            ..ScanRequest::default()
        };
        let page = kv.scan(scan).await.unwrap().into_inner();
        assert_eq!(page.header.unwrap().served_by, follower);
        let keys: Vec<&[u8]> = page.kvs.iter().map(|kv| kv.key.as_slice()).collect();
        assert_eq!(keys, vec![&b"fr"[..]]);
    }
    cluster.shutdown().await;
}

/// A write the leader acknowledged is visible at once to a linearizable read on either
/// follower. A follower that read without waiting to apply the leader's read index fails
/// this within a few pairs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_see_every_acknowledged_write() {
    let cluster = Cluster::start_with(3, quick_timings()).await;
    let (_, followers) = followers(&cluster).await;
    let client = cluster.client();
    let mut kvs = Vec::new();
    for follower in &followers {
        kvs.push((*follower, cluster.kv(*follower).await));
    }
    for i in 0..PAIRS {
        let value = i.to_string().into_bytes();
        let written = client.put(b"seq", &value, PutOptions::default()).await;
        let written = written.unwrap();
        let (follower, kv) = &mut kvs[i as usize % 2];
        let got = get_on(kv, b"seq").await.unwrap();
        let header = got.header.unwrap();
        assert_eq!(header.served_by, *follower);
        let seen = got.kv.map(|kv| kv.value);
        assert_eq!(
            seen.as_deref(),
            Some(value.as_slice()),
            "pair {i}: node {follower} answered an older value (revision {} < {})",
            header.revision,
            written.revision
        );
    }
    cluster.shutdown().await;
}

/// Reads arriving together on one follower share read index calls to the leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_follower_reads_share_read_index_calls() {
    let cluster = Cluster::start_with(3, quick_timings()).await;
    let (leader, followers) = followers(&cluster).await;
    let follower = followers[0];
    cluster
        .client()
        .put(b"batch", b"1", PutOptions::default())
        .await
        .unwrap();
    let kv = cluster.kv(follower).await;
    let reads = (0..CONCURRENT_READS).map(|_| {
        let mut kv = kv.clone();
        async move { get_on(&mut kv, b"batch").await }
    });
    for read in join_all(reads).await {
        assert_eq!(read.unwrap().header.unwrap().served_by, follower);
    }
    let range = RangeId::FIRST.0.to_string();
    let labels = [("range_id", range.as_str())];
    let metrics = scrape(&cluster, follower).await;
    let count = |name: &str| metrics.value(name, &labels).unwrap_or(0.0);
    let calls = count("keel_range_read_index_calls_total");
    let reads = count("keel_range_read_index_reads_total");
    assert!(reads >= CONCURRENT_READS as f64, "{reads} reads counted");
    assert!(
        calls >= 1.0 && calls < reads,
        "{calls} read index calls for {reads} reads: none shared"
    );
    let served = scrape(&cluster, leader).await;
    let served = served.value("keel_range_read_index_served_total", &labels);
    assert!(
        served.unwrap_or(0.0) >= calls,
        "the leader answered the calls"
    );
    cluster.shutdown().await;
}

/// With the leader stopped, a follower answers the last acknowledged value (once a new
/// leader gives it a read index) or refuses, never an older one; alone, it refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_without_a_leader_refuses_linearizable_reads() {
    let mut cluster = Cluster::start_with(3, quick_timings()).await;
    let (leader, followers) = followers(&cluster).await;
    let client = cluster.client();
    for value in [b"old", b"new"] {
        client
            .put(b"cut", value, PutOptions::default())
            .await
            .unwrap();
    }
    let mut kv = cluster.kv(followers[0]).await;
    cluster.stop_node(leader).await;
    eventually("a follower serves after the new election", || async {
        let mut kv = kv.clone();
        match get_on(&mut kv, b"cut").await {
            Ok(got) => {
                assert_eq!(got.kv.unwrap().value, b"new", "an older value was served");
                Some(())
            }
            Err(refused) => {
                assert_refused(&refused);
                None
            }
        }
    })
    .await;

    cluster.stop_node(followers[1]).await;
    let refused = get_on(&mut kv, b"cut").await.unwrap_err();
    assert_refused(&refused);
    cluster.shutdown().await;
}

/// A read refused as it should be: `NotLeader`, `Unavailable` or `Timeout`.
fn assert_refused(refused: &tonic::Status) {
    assert!(
        matches!(
            status::kv_error(refused),
            Some(KvError::NotLeader { .. } | KvError::Unavailable { .. } | KvError::Timeout { .. })
        ),
        "expected a refusal, got {refused:?}"
    );
}

/// A follower get of `key` within `max_staleness_ms` and at `min_revision`, on its node
/// alone (`no_forward`).
fn bounded_get(key: &[u8], max_staleness_ms: Option<i64>, min_revision: Option<u64>) -> GetRequest {
    GetRequest {
        key: key.to_vec(),
        consistency: Consistency::Follower.into(),
        no_forward: true,
        max_staleness_ms,
        min_revision,
        revision: None,
    }
}

/// Bounded follower reads over gRPC: every node serves a read at the revision a write
/// answered with its value; a revision ahead of the range comes back as a typed
/// `FutureRevision` (OUT_OF_RANGE), and a staleness bound out of its limits as
/// `InvalidArgument`; keel-client's `get_within` and `scan_within` carry both bounds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follower_reads_within_bounds_see_the_revision_asked_for() {
    let cluster = Cluster::start_with(3, quick_timings()).await;
    let client = cluster.client();
    let written = client
        .put(b"rw", b"1", PutOptions::default())
        .await
        .unwrap();
    for id in cluster.ids() {
        let mut kv = cluster.kv(id).await;
        let request = bounded_get(b"rw", Some(0), Some(written.revision));
        let got = kv.get(request).await.unwrap().into_inner();
        assert_eq!(got.header.unwrap().served_by, id);
        assert_eq!(got.kv.unwrap().value, b"1", "node {id}");

        let ahead = written.revision + 1_000;
        let refused = kv.get(bounded_get(b"rw", None, Some(ahead))).await;
        let refused = refused.expect_err("no write made that revision");
        assert_eq!(refused.code(), tonic::Code::OutOfRange, "{refused:?}");
        match status::kv_error(&refused) {
            Some(KvError::FutureRevision { requested, current }) => {
                assert_eq!(requested, ahead);
                assert!(current >= written.revision && current < ahead);
            }
            other => panic!("expected FutureRevision, got {other:?}"),
        }
        for bad in [-1, 86_400_001] {
            let refused = kv.get(bounded_get(b"rw", Some(bad), None)).await;
            let refused = refused.expect_err("a bound out of its limits");
            assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
            assert!(
                refused.message().contains("max_staleness_ms"),
                "{refused:?}"
            );
        }
    }

    let bound = ReadBound {
        max_staleness_ms: Some(1_000),
        min_revision: Some(written.revision),
    };
    let got = client
        .get_within(b"rw", keel_types::Consistency::Follower, bound)
        .await
        .unwrap();
    assert_eq!(got.kv.unwrap().value, b"1");
    let page = client
        .scan_within(b"r", b"s", 0, keel_types::Consistency::Follower, bound)
        .await
        .unwrap();
    assert_eq!(page.kvs.len(), 1);
    let ahead = ReadBound {
        min_revision: Some(written.revision + 1_000),
        ..bound
    };
    let refused = client
        .get_within(b"rw", keel_types::Consistency::Follower, ahead)
        .await;
    assert!(
        matches!(refused, Err(KvError::FutureRevision { .. })),
        "{refused:?}"
    );
    cluster.shutdown().await;
}
