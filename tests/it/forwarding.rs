//! Requests sent to any node, as generic gRPC clients and load balancers send them (no
//! keel-client routing, no retries, `no_forward` unset): the node that gets one answers with
//! its outcome while leadership moves and while a dead leader is replaced, never with a
//! `NotLeader` or `Unavailable` that only says where the leader went.

use keel_client::Client;
use keel_proto::v1::kv_client::KvClient;
use keel_proto::v1::{self, GetRequest, PutRequest};
use keel_types::{NodeId, RangeId};
use tonic::transport::Channel;

use crate::harness::{Cluster, eventually};

/// Puts and linearizable gets sent round robin over the nodes.
const ROUNDS: usize = 60;

async fn put(kv: &mut KvClient<Channel>, key: &[u8], value: &[u8]) -> Result<(), tonic::Status> {
    let request = PutRequest {
        key: key.to_vec(),
        value: value.to_vec(),
        ..PutRequest::default()
    };
    kv.put(request).await.map(|_| ())
}

async fn get(kv: &mut KvClient<Channel>, key: &[u8]) -> Result<Option<Vec<u8>>, tonic::Status> {
    let request = GetRequest {
        key: key.to_vec(),
        consistency: v1::Consistency::Linearizable.into(),
        no_forward: false,
    };
    let answer = kv.get(request).await?.into_inner();
    Ok(answer.kv.map(|kv| kv.value))
}

/// Moves the first range's leadership to `to` and waits until every node names it.
async fn move_leader(cluster: &Cluster, client: &Client, to: NodeId) {
    client.transfer_leader(RangeId::FIRST, to).await.unwrap();
    eventually("the named node leads", || async {
        (cluster.leader().await == to).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_spread_over_the_nodes_succeed_while_leadership_moves() {
    let cluster = Cluster::start(3).await;
    let client = cluster.client();
    let ids = cluster.ids();
    let mut kvs = Vec::new();
    for id in &ids {
        kvs.push(cluster.kv(*id).await);
    }
    let moves = async {
        for round in 0..6 {
            move_leader(&cluster, &client, ids[round % ids.len()]).await;
        }
    };
    let load = async {
        let mut errors = Vec::new();
        for round in 0..ROUNDS {
            let key = format!("spread-{round}").into_bytes();
            let value = format!("v{round}").into_bytes();
            let kv = &mut kvs[round % ids.len()];
            if let Err(status) = put(kv, &key, &value).await {
                errors.push(format!("put {round}: {status:?}"));
                continue;
            }
            let kv = &mut kvs[(round + 1) % ids.len()];
            match get(kv, &key).await {
                Ok(got) => assert_eq!(got, Some(value), "round {round}"),
                Err(status) => errors.push(format!("get {round}: {status:?}")),
            }
        }
        errors
    };
    let ((), errors) = tokio::join!(moves, load);
    assert!(errors.is_empty(), "{} errors: {errors:#?}", errors.len());
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_waits_out_the_election_after_its_leader_dies() {
    let mut cluster = Cluster::start(3).await;
    let leader = cluster.leader().await;
    let follower = cluster.ids().into_iter().find(|id| *id != leader).unwrap();
    let mut kv = cluster.kv(follower).await;
    put(&mut kv, b"before", b"1").await.unwrap();
    cluster.stop_node(leader).await;
    // Sent at once: the follower still names the dead leader, then knows none while the
    // others elect; it answers when the new leader has served the request.
    put(&mut kv, b"after", b"2").await.unwrap();
    assert_eq!(get(&mut kv, b"after").await.unwrap(), Some(b"2".to_vec()));
    assert_eq!(get(&mut kv, b"before").await.unwrap(), Some(b"1".to_vec()));
    cluster.shutdown().await;
}
