//! TTL keys over real gRPC: expiry hides a key from every read mode on every node at the
//! same instant of the replicas' clocks, a leader change neither extends nor shortens it,
//! the leader's cleanup removes expired keys, and bad TTLs are refused without a write.
//! Every node's wall clock is a manual clock that moves only when the test moves it.

use keel_proto::test::v1::SetClockOffsetRequest;
use keel_proto::test::v1::faults_client::FaultsClient;
use keel_proto::v1::kv_client::KvClient;
use keel_proto::v1::{self, GetRequest, PutRequest, ScanRequest};
use keel_server::status;
use keel_types::{Consistency, KvError, NodeId, limits};
use tonic::transport::Channel;

use crate::harness::{Cluster, eventually};

const TTL_MS: u64 = 10_000;

fn put(key: &str, ttl_ms: Option<i64>, expect_absent: bool) -> PutRequest {
    PutRequest {
        key: key.as_bytes().to_vec(),
        value: b"v".to_vec(),
        condition: expect_absent.then_some(v1::Condition {
            kind: Some(v1::condition::Kind::ExpectAbsent(true)),
        }),
        return_previous: false,
        no_forward: false,
        ttl_ms,
        request_id: None,
        fence: None,
    }
}

async fn write(kv: &mut KvClient<Channel>, request: PutRequest) -> Result<(), KvError> {
    match kv.put(request).await {
        Ok(_) => Ok(()),
        Err(status) => Err(status::kv_error(&status).expect("a Keel error detail")),
    }
}

/// Node `id`'s answer to a read of `key` served by itself: the remaining TTL, or `None` when
/// the key is absent.
async fn read(cluster: &Cluster, id: NodeId, key: &str, consistency: Consistency) -> Option<u64> {
    let request = GetRequest {
        key: key.as_bytes().to_vec(),
        consistency: v1::Consistency::from(consistency).into(),
        no_forward: true,
        ..GetRequest::default()
    };
    let response = cluster
        .kv(id)
        .await
        .get(request)
        .await
        .unwrap()
        .into_inner();
    response
        .kv
        .map(|kv| kv.ttl_remaining_ms.expect("the key has a TTL"))
}

/// Every read mode every node can serve: linearizable and lease reads on the leader,
/// follower reads everywhere. One answer per (node, mode).
async fn read_everywhere(cluster: &Cluster, leader: NodeId, key: &str) -> Vec<Option<u64>> {
    let mut answers = vec![
        read(cluster, leader, key, Consistency::Linearizable).await,
        read(cluster, leader, key, Consistency::Lease).await,
    ];
    for id in cluster.running() {
        answers.push(read(cluster, id, key, Consistency::Follower).await);
    }
    answers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_hides_a_key_from_every_read_mode_at_once() {
    let cluster = Cluster::start(3).await;
    let leader = cluster.leader().await;
    let mut kv = cluster.kv(leader).await;
    write(&mut kv, put("k", Some(TTL_MS as i64), false))
        .await
        .unwrap();
    for id in cluster.running() {
        eventually("every replica applies the put", || async {
            read(&cluster, id, "k", Consistency::Follower).await
        })
        .await;
    }
    assert_eq!(
        read(&cluster, leader, "k", Consistency::Linearizable).await,
        Some(TTL_MS)
    );

    cluster.advance_clocks_ms(TTL_MS - 1);
    let answers = read_everywhere(&cluster, leader, "k").await;
    assert!(
        answers.iter().all(|answer| *answer == Some(1)),
        "{answers:?}"
    );

    cluster.advance_clocks_ms(1);
    let answers = read_everywhere(&cluster, leader, "k").await;
    assert!(answers.iter().all(Option::is_none), "{answers:?}");
    let scan = ScanRequest {
        start: Vec::new(),
        end: Vec::new(),
        limit: 0,
        consistency: v1::Consistency::Linearizable.into(),
        no_forward: false,
        ..ScanRequest::default()
    };
    let page = kv.scan(scan).await.unwrap().into_inner();
    assert!(page.kvs.is_empty(), "a scan still shows {:?}", page.kvs);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_change_neither_extends_nor_shortens_a_ttl() {
    let mut cluster = Cluster::start(3).await;
    let leader = cluster.leader().await;
    write(
        &mut cluster.kv(leader).await,
        put("k", Some(TTL_MS as i64), false),
    )
    .await
    .unwrap();
    cluster.advance_clocks_ms(6_000);
    cluster.stop_node(leader).await;
    let leader = cluster.leader().await;
    let mut kv = cluster.kv(leader).await;

    cluster.advance_clocks_ms(TTL_MS - 6_000 - 1);
    assert_eq!(
        read(&cluster, leader, "k", Consistency::Linearizable).await,
        Some(1)
    );
    let taken = write(&mut kv, put("k", None, true)).await;
    assert!(
        matches!(taken, Err(KvError::ConditionFailed(_))),
        "{taken:?}"
    );

    cluster.advance_clocks_ms(1);
    assert_eq!(
        read(&cluster, leader, "k", Consistency::Linearizable).await,
        None
    );
    // The new leader's writes see the key as absent from the same instant.
    write(&mut kv, put("k", None, true)).await.unwrap();
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_removes_expired_keys_and_bad_ttls_change_nothing() {
    let cluster = Cluster::start(3).await;
    let leader = cluster.leader().await;
    let mut kv = cluster.kv(leader).await;

    let too_long = limits::TTL_MS_MAX as i64 + 1;
    for (ttl_ms, text) in [(0, "TTL is 0 ms"), (-1, "negative"), (too_long, "1 year")] {
        let refused = write(&mut kv, put("bad", Some(ttl_ms), false)).await;
        match refused {
            Err(KvError::InvalidArgument { message }) => {
                assert!(message.contains(text), "{message}")
            }
            other => panic!("a TTL of {ttl_ms} ms was not refused: {other:?}"),
        }
    }
    assert_eq!(
        cluster.range_status(leader).await.revision,
        0,
        "nothing was written"
    );

    for i in 0..10 {
        write(&mut kv, put(&format!("t{i}"), Some(1_000), false))
            .await
            .unwrap();
    }
    write(&mut kv, put("kept", None, false)).await.unwrap();
    assert_eq!(cluster.range_status(leader).await.keys_with_ttl, 10);

    cluster.advance_clocks_ms(1_000);
    for id in cluster.running() {
        eventually("the cleanup removes every expired key", || async {
            (cluster.range_status(id).await.keys_with_ttl == 0).then_some(())
        })
        .await;
    }
    let request = GetRequest {
        key: b"kept".to_vec(),
        consistency: v1::Consistency::Linearizable.into(),
        no_forward: false,
        ..GetRequest::default()
    };
    assert!(kv.get(request).await.unwrap().into_inner().kv.is_some());
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clock_offset_fault_moves_one_nodes_view_of_expiry() {
    let cluster = Cluster::start(3).await;
    let leader = cluster.leader().await;
    write(
        &mut cluster.kv(leader).await,
        put("k", Some(TTL_MS as i64), false),
    )
    .await
    .unwrap();
    let follower = cluster.ids().into_iter().find(|id| *id != leader).unwrap();
    eventually("the follower applies the put", || async {
        read(&cluster, follower, "k", Consistency::Follower).await
    })
    .await;

    let endpoint = format!("http://{}", cluster.endpoint(follower));
    let mut faults = FaultsClient::connect(endpoint).await.unwrap();
    let ahead = SetClockOffsetRequest {
        offset_ms: TTL_MS as i64,
    };
    faults.set_clock_offset(ahead).await.unwrap();
    assert_eq!(
        read(&cluster, follower, "k", Consistency::Follower).await,
        None
    );
    assert_eq!(
        read(&cluster, leader, "k", Consistency::Linearizable).await,
        Some(TTL_MS)
    );

    faults
        .set_clock_offset(SetClockOffsetRequest { offset_ms: 0 })
        .await
        .unwrap();
    assert_eq!(
        read(&cluster, follower, "k", Consistency::Follower).await,
        Some(TTL_MS)
    );
    cluster.shutdown().await;
}
