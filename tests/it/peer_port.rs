//! Nodes that serve peers on a port of their own (`--peer-listen`): clients are served on
//! every client port and forwarded between nodes over the peer ports; a client call to a peer
//! port and a Raft call to a client port are refused; with TLS, the peer port refuses callers
//! without a node certificate; answers name nodes to clients by their client addresses.

use std::collections::BTreeMap;

use keel_client::PutOptions;
use keel_proto::raft::HeartbeatRequest;
use keel_proto::raft::raft_client::RaftClient;
use keel_proto::v1::cluster_client::ClusterClient;
use keel_proto::v1::kv_client::KvClient;
use keel_proto::v1::{self, GetRequest, MembersRequest, PutRequest, RangesRequest};
use keel_server::status::kv_error;
use keel_types::{Consistency, KvError, NodeId, RangeId};
use tonic::Code;
use tonic::transport::Channel;

use crate::harness::{Cluster, eventually};

fn plain_channel(addr: &str) -> Channel {
    Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_lazy()
}

/// Every node's address as `Cluster.Ranges` answered on `id`'s client port, when each names
/// a node.
async fn named_nodes(cluster: &Cluster, id: NodeId) -> Option<BTreeMap<NodeId, (String, String)>> {
    let mut client = ClusterClient::new(plain_channel(&cluster.endpoint(id)));
    let ranges = client.ranges(RangesRequest::default()).await.ok()?;
    let nodes = ranges.into_inner().nodes.into_iter();
    let named: BTreeMap<_, _> = nodes
        .map(|node| (node.node_id, (node.addr, node.peer_addr)))
        .collect();
    named
        .values()
        .all(|(addr, _)| !addr.is_empty())
        .then_some(named)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_on_peer_ports_serves_clients_and_refuses_them_on_peer_ports() {
    let mut cluster = Cluster::start_peer_ports(3, false).await;
    for id in cluster.ids() {
        let client = cluster.client_of(id);
        let key = format!("k{id}");
        client
            .put(key.as_bytes(), b"v", PutOptions::default())
            .await
            .unwrap();
        let got = client.get(key.as_bytes(), Consistency::Linearizable).await;
        assert_eq!(got.unwrap().kv.unwrap().value, b"v", "through node {id}");
    }

    // A client that dialled a peer port is refused there, and its write is not applied.
    let mut wrong_port = KvClient::new(plain_channel(&cluster.peer_addr(1).to_string()));
    let put = PutRequest {
        key: b"stray".to_vec(),
        value: b"v".to_vec(),
        ..PutRequest::default()
    };
    let refused = wrong_port
        .put(put)
        .await
        .expect_err("a peer port refuses clients");
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    let expected = format!(
        "{} is the peer port of node 1; clients connect to {}",
        cluster.peer_addr(1),
        cluster.endpoint(1)
    );
    assert_eq!(refused.message(), expected);
    let read = cluster
        .client()
        .get(b"stray", Consistency::Linearizable)
        .await;
    assert!(read.unwrap().kv.is_none(), "the refused write was applied");

    // Raft is not served on a client port.
    let mut raft = RaftClient::new(plain_channel(&cluster.endpoint(2)));
    let beat = HeartbeatRequest {
        from: 99,
        ..HeartbeatRequest::default()
    };
    let refused = raft
        .heartbeat(beat)
        .await
        .expect_err("a client port refuses Raft");
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    assert!(
        refused.message().contains("only on its peer port"),
        "{refused:?}"
    );

    // Answers name nodes to clients by their client addresses, never their peer ports.
    for id in cluster.ids() {
        let what = format!("node {id} names every node's client address");
        let named = eventually(&what, || named_nodes(&cluster, id)).await;
        for (node, (addr, peer_addr)) in named {
            assert_eq!(addr, cluster.endpoint(node), "node {id} names node {node}");
            assert_eq!(peer_addr, cluster.peer_addr(node).to_string());
        }
    }
    let leader = cluster.leader_of(RangeId::FIRST).await;
    let follower = cluster.ids().into_iter().find(|id| *id != leader).unwrap();
    let mut kv = KvClient::new(plain_channel(&cluster.endpoint(follower)));
    // Lease reads stay the leader's (a follower serves linearizable ones itself).
    let get = GetRequest {
        key: b"k1".to_vec(),
        consistency: v1::Consistency::Lease.into(),
        no_forward: true,
        ..GetRequest::default()
    };
    let hinted = kv.get(get).await.expect_err("a follower does not serve it");
    match kv_error(&hinted) {
        Some(KvError::NotLeader {
            leader: Some((id, addr)),
            ..
        }) => {
            assert_eq!(id, leader);
            assert_eq!(
                addr.addr,
                cluster.endpoint(leader),
                "the hint names a client port"
            );
        }
        Some(KvError::NotLeader { leader: None, .. }) => {}
        other => panic!("expected NotLeader, got {other:?} ({hinted:?})"),
    }

    // A node joins through a peer port and is named by its client address.
    cluster.join_node(4).await;
    let endpoint = cluster.endpoint(1);
    let joined = eventually("node 4 is a member", || {
        let mut members = ClusterClient::new(plain_channel(&endpoint));
        async move {
            let answer = members.members(MembersRequest::default()).await.ok()?;
            let nodes = answer.into_inner().nodes;
            nodes
                .into_iter()
                .find(|node| node.node_id == 4 && !node.addr.is_empty())
        }
    })
    .await;
    assert_eq!(joined.addr, cluster.endpoint(4));
    assert_eq!(joined.peer_addr, cluster.peer_addr(4).to_string());
    let client = cluster.client_of(4);
    client
        .put(b"via-4", b"v", PutOptions::default())
        .await
        .unwrap();
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_tls_a_peer_port_refuses_callers_without_a_node_certificate() {
    let cluster = Cluster::start_peer_ports(3, true).await;
    let client = cluster.client();
    client
        .put(b"secret", b"kept", PutOptions::default())
        .await
        .unwrap();
    for id in cluster.ids() {
        let got = cluster.applied_on(id, b"secret").await;
        assert_eq!(
            got.kv.unwrap().value,
            b"kept",
            "replicated over mutual TLS to node {id}"
        );
    }

    // The peer marker alone does not get a caller without a node certificate in.
    let ca = tonic::transport::Certificate::from_pem(cluster.pki().ca_pem());
    let tls = tonic::transport::ClientTlsConfig::new().ca_certificate(ca);
    let channel =
        tonic::transport::Endpoint::from_shared(format!("https://{}", cluster.peer_addr(1)))
            .unwrap()
            .tls_config(tls)
            .unwrap()
            .connect()
            .await
            .unwrap();
    let mut kv = KvClient::new(channel);
    let mut get = tonic::Request::new(GetRequest {
        key: b"secret".to_vec(),
        ..GetRequest::default()
    });
    get.metadata_mut()
        .insert("keel-peer-node", "2".parse().unwrap());
    let refused = kv.get(get).await.expect_err("no node certificate");
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    assert!(refused.message().contains("no certificate"), "{refused:?}");
    cluster.shutdown().await;
}
