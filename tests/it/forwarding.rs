//! Requests sent to any node, as generic gRPC clients and load balancers send them (no
//! keel-client routing, no retries, `no_forward` unset): the node that gets one answers with
//! its outcome while leadership moves and while a dead leader is replaced, never with a
//! `NotLeader` or `Unavailable` that only says where the leader went.

use keel_client::Client;
use keel_client::attempt::{self, AttemptError};
use keel_proto::v1::kv_client::KvClient;
use keel_proto::v1::{self, GetRequest, PutRequest};
use keel_types::{KvError, NodeId, RangeId};
use tonic::transport::Channel;

use crate::harness::{Cluster, eventually};

/// Puts and linearizable gets sent round robin over the nodes.
const ROUNDS: usize = 60;
/// Requests sent to a follower, one after the other, while its range replaces a dead leader.
const ELECTION_POLLS_MAX: usize = 50_000;

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
        ..GetRequest::default()
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

/// A request its caller routes itself (`no_forward`, as keel-client sends them), sent to a
/// follower again and again while its leader is replaced: the follower names the dead leader
/// until it notices, then waits out the election and serves the request (it won) or names the
/// winner. It never answers `Unavailable` for the election, which would leave the caller
/// backing off without knowing where to go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_may_not_go_on_waits_out_an_election_for_its_answer() {
    let mut cluster = Cluster::start(3).await;
    let dead = cluster.leader().await;
    let follower = cluster.ids().into_iter().find(|id| *id != dead).unwrap();
    let mut kv = cluster.kv(follower).await;
    put(&mut kv, b"before", b"1").await.unwrap();
    cluster.stop_node(dead).await;
    let request = PutRequest {
        key: b"after".to_vec(),
        value: b"2".to_vec(),
        no_forward: true,
        ..PutRequest::default()
    };
    let mut winner = None;
    for _ in 0..ELECTION_POLLS_MAX {
        let status = match kv.put(request.clone()).await {
            Ok(_) => {
                winner = Some(follower);
                break;
            }
            Err(status) => status,
        };
        match attempt::from_status(&status) {
            AttemptError::Server(KvError::NotLeader {
                leader: Some((id, _)),
                ..
            }) if id == dead => continue,
            AttemptError::Server(KvError::NotLeader {
                leader: Some((id, _)),
                ..
            }) => {
                winner = Some(id);
                break;
            }
            other => panic!("the follower answered {other:?} while its range elected a leader"),
        }
    }
    let winner = winner.expect("the follower kept naming the dead leader");
    assert_ne!(winner, dead);
    let mut kv = cluster.kv(winner).await;
    kv.put(request).await.unwrap();
    assert_eq!(get(&mut kv, b"after").await.unwrap(), Some(b"2".to_vec()));
    cluster.shutdown().await;
}
