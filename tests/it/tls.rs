//! A cluster serving TLS: clients that trust its CA are served, and writes are replicated and
//! forwarded between the nodes over mutual TLS; plaintext clients, clients that trust another
//! CA or check another name, and Raft calls without a node certificate are refused.

use std::time::Duration;

use keel_client::{Client, ClientOptions, ClientTls, PutOptions};
use keel_proto::raft::raft_client::RaftClient;
use keel_proto::raft::{BatchedRequest, HeartbeatRequest, RaftBatch};
use keel_proto::v1::kv_client::KvClient;
use keel_proto::v1::{self, GetRequest};
use keel_types::{Consistency, KvError};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::harness::Cluster;
use crate::pki::{Issued, Pki};

/// Quick give-ups for clients that are meant to fail.
fn impatient(tls: Option<ClientTls>) -> ClientOptions {
    ClientOptions {
        request_timeout: Duration::from_secs(2),
        read_attempt_timeout: Duration::from_secs(1),
        write_deadline: Duration::from_secs(2),
        write_attempt_timeout: Duration::from_secs(1),
        tls,
        ..ClientOptions::default()
    }
}

/// TLS trusting `pki`, presenting `identity` when given.
fn tls_config(pki: &Pki, identity: Option<&Issued>) -> ClientTlsConfig {
    let config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pki.ca_pem()));
    match identity {
        Some(issued) => config.identity(Identity::from_pem(&issued.cert_pem, &issued.key_pem)),
        None => config,
    }
}

async fn tls_channel(addr: &str, tls: ClientTlsConfig) -> Result<Channel, tonic::transport::Error> {
    Endpoint::from_shared(format!("https://{addr}"))?
        .tls_config(tls)?
        .connect()
        .await
}

/// A heartbeat whose payload decodes to nothing: a node that lets it through answers
/// INVALID_ARGUMENT.
fn bad_heartbeat() -> HeartbeatRequest {
    HeartbeatRequest {
        from: 99,
        payload: b"not a report".to_vec(),
        quiet: Vec::new(),
        client_addr: String::new(),
    }
}

/// The error of a put through a client of `endpoint` with `options`.
async fn put_error(endpoint: String, options: ClientOptions) -> KvError {
    let client = Client::new(vec![endpoint], options).unwrap();
    let put = client.put(b"k", b"v", PutOptions::default()).await;
    put.expect_err("the cluster refuses this client")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tls_cluster_serves_clients_that_trust_its_ca_and_replicates_over_tls() {
    let cluster = Cluster::start_tls(3).await;
    let client = cluster.client();
    client
        .put(b"secret", b"kept", PutOptions::default())
        .await
        .unwrap();
    for id in cluster.ids() {
        let got = cluster.applied_on(id, b"secret").await;
        assert_eq!(got.kv.unwrap().value, b"kept", "node {id}");
    }

    let leader = cluster.leader().await;
    let follower = cluster.ids().into_iter().find(|id| *id != leader).unwrap();
    let tls = tls_config(cluster.pki(), None);
    let channel = tls_channel(&cluster.endpoint(follower), tls).await.unwrap();
    let mut kv = KvClient::new(channel);
    let forwarded = kv
        .get(GetRequest {
            key: b"secret".to_vec(),
            consistency: v1::Consistency::Linearizable.into(),
            no_forward: false,
            ..GetRequest::default()
        })
        .await
        .expect("the follower forwards to the leader over TLS");
    assert_eq!(forwarded.into_inner().kv.unwrap().value, b"kept");

    let by_name = ClientTls {
        server_name: Some("localhost".to_string()),
        ..cluster.pki().client_tls()
    };
    let named = Client::new(vec![cluster.endpoint(follower)], impatient(Some(by_name))).unwrap();
    let got = named.get(b"secret", Consistency::Linearizable).await;
    assert_eq!(got.unwrap().kv.unwrap().value, b"kept");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_cluster_refuses_plaintext_and_clients_of_another_ca_or_name() {
    let cluster = Cluster::start_tls(1).await;
    let endpoint = cluster.endpoint(1);

    let plaintext = put_error(endpoint.clone(), impatient(None)).await;
    assert!(
        matches!(plaintext, KvError::Unavailable { .. }),
        "{plaintext:?}"
    );
    let mut raw = KvClient::new(
        Channel::from_shared(format!("http://{endpoint}"))
            .unwrap()
            .connect_lazy(),
    );
    let status = raw
        .get(GetRequest::default())
        .await
        .expect_err("a plaintext call is not served");
    assert!(status.details().is_empty(), "{status:?}");

    let stranger = Pki::new("another CA");
    let other_ca = put_error(endpoint.clone(), impatient(Some(stranger.client_tls()))).await;
    assert!(other_ca.to_string().contains("certificate"), "{other_ca}");

    let wrong_name = ClientTls {
        server_name: Some("elsewhere.test".to_string()),
        ..cluster.pki().client_tls()
    };
    let misnamed = put_error(endpoint.clone(), impatient(Some(wrong_name))).await;
    assert!(misnamed.to_string().contains("certificate"), "{misnamed}");

    let trusted = Client::new(vec![endpoint], cluster.client_options()).unwrap();
    trusted
        .put(b"k", b"v", PutOptions::default())
        .await
        .unwrap();
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raft_calls_need_a_certificate_of_the_cluster_ca() {
    let cluster = Cluster::start_tls(1).await;
    let endpoint = cluster.endpoint(1);
    let pki = cluster.pki();

    let anonymous = tls_channel(&endpoint, tls_config(pki, None)).await.unwrap();
    let refused = RaftClient::new(anonymous.clone())
        .heartbeat(bad_heartbeat())
        .await
        .expect_err("a caller without a certificate is no peer");
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    assert!(
        refused
            .message()
            .contains("no certificate signed by the cluster CA"),
        "{refused:?}"
    );
    // Nor may it pass a put off as one a peer forwards (served as the peer's, unconfined).
    let smuggled = v1::PutRequest {
        key: b"another tenant's key".to_vec(),
        value: b"v".to_vec(),
        no_forward: true,
        ..v1::PutRequest::default()
    };
    let batch = RaftBatch {
        from: 2,
        requests: vec![BatchedRequest {
            id: 1,
            payload: prost::Message::encode_to_vec(&smuggled),
            method: "/keel.v1.Kv/Put".to_string(),
            ..BatchedRequest::default()
        }],
    };
    let refused = RaftClient::new(anonymous)
        .forward(futures::stream::iter([batch]))
        .await
        .expect_err("a caller without a certificate forwards nothing");
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    let client = cluster.client();
    let read = client.get(b"another tenant's key", Consistency::Linearizable);
    assert!(
        read.await.unwrap().kv.is_none(),
        "the smuggled put was applied"
    );

    let node = pki.issue(&["127.0.0.1"]);
    let peer = tls_channel(&endpoint, tls_config(pki, Some(&node)))
        .await
        .unwrap();
    let let_through = RaftClient::new(peer)
        .heartbeat(bad_heartbeat())
        .await
        .expect_err("the heartbeat's payload is garbage");
    assert_eq!(
        let_through.code(),
        tonic::Code::InvalidArgument,
        "{let_through:?}"
    );

    let stranger = Pki::new("another CA");
    let forged = stranger.issue(&["127.0.0.1"]);
    let handshake = tls_channel(&endpoint, tls_config(pki, Some(&forged))).await;
    match handshake {
        Err(_) => {}
        Ok(channel) => {
            let status = RaftClient::new(channel)
                .heartbeat(bad_heartbeat())
                .await
                .expect_err("a certificate of another CA is refused in the handshake");
            assert!(status.details().is_empty(), "{status:?}");
            assert_ne!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        }
    }
    cluster.shutdown().await;
}
