//! etcd's API with authentication on: etcd's users are the tokens file's admins and tenants
//! (a token is the password); `Authenticate` gives the token etcd's clients send in their
//! `token` header. A tenant's etcd calls reach its own etcd namespace only, whatever span it
//! reads, deletes, compares or watches; wrong passwords, another entry's token and calls
//! without a token are refused.

use futures::StreamExt;
use keel_proto::etcd::etcdserverpb::auth_client::AuthClient;
use keel_proto::etcd::etcdserverpb::kv_client::KvClient;
use keel_proto::etcd::etcdserverpb::lease_client::LeaseClient;
use keel_proto::etcd::etcdserverpb::request_op::Request as Op;
use keel_proto::etcd::etcdserverpb::response_op::Response as Answer;
use keel_proto::etcd::etcdserverpb::watch_client::WatchClient;
use keel_proto::etcd::etcdserverpb::watch_request::RequestUnion;
use keel_proto::etcd::etcdserverpb::{
    AuthenticateRequest, DeleteRangeRequest, LeaseGrantRequest, LeaseLeasesRequest,
    LeaseRevokeRequest, LeaseTimeToLiveRequest, PutRequest, RangeRequest, RequestOp, TxnRequest,
    WatchCreateRequest, WatchRequest,
};
use keel_server::Access;
use keel_types::Consistency;
use keel_types::tenant::{Namespace, TenantName};
use tonic::Code;
use tonic::transport::Channel;

use crate::harness::Cluster;
use crate::tenants::{ACME, ADMIN, GLOBEX, TOKENS};

/// etcd's request for every key: from `\0` on.
fn everything() -> RangeRequest {
    RangeRequest {
        key: vec![0],
        range_end: vec![0],
        ..RangeRequest::default()
    }
}

/// `message` with etcd's `token` header, as etcd's clients send it.
fn with_token<T>(token: &str, message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request
        .metadata_mut()
        .insert("token", token.parse().unwrap());
    request
}

/// The token `Authenticate` gives user `name` with `password`, or the refusal.
async fn authenticate(
    channel: &Channel,
    name: &str,
    password: &str,
) -> Result<String, tonic::Status> {
    let request = AuthenticateRequest {
        name: name.to_string(),
        password: password.to_string(),
    };
    let answer = AuthClient::new(channel.clone())
        .authenticate(request)
        .await?;
    Ok(answer.into_inner().token)
}

/// The keys of every key `token` reads.
async fn keys(kv: &mut KvClient<Channel>, token: &str) -> Vec<Vec<u8>> {
    let answer = kv.range(with_token(token, everything())).await.unwrap();
    answer
        .into_inner()
        .kvs
        .into_iter()
        .map(|kv| kv.key)
        .collect()
}

async fn put(kv: &mut KvClient<Channel>, token: &str, key: &[u8], value: &[u8]) {
    let request = PutRequest {
        key: key.to_vec(),
        value: value.to_vec(),
        ..PutRequest::default()
    };
    kv.put(with_token(token, request)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn etcd_users_are_tenants_confined_to_their_own_etcd_namespace() {
    let cluster = Cluster::start_authenticated(3, Access::parse(TOKENS).unwrap(), ADMIN).await;
    let leader = cluster.leader().await;
    let follower = *cluster.ids().iter().find(|id| **id != leader).unwrap();
    let channel = cluster.etcd_tls_channel(follower).await;
    let mut kv = KvClient::new(channel.clone());

    let acme = authenticate(&channel, "acme", ACME).await.unwrap();
    let globex = authenticate(&channel, "globex", GLOBEX).await.unwrap();
    put(&mut kv, &acme, b"shared-name", b"acme's").await;
    put(&mut kv, &globex, b"shared-name", b"globex's").await;
    put(&mut kv, &globex, b"globex-only", b"g").await;

    // The keys are Keel's keys under each tenant's `etcd/`.
    let admin = cluster.client();
    let stored = |tenant: &str, key: &[u8]| {
        Namespace::of(&TenantName::new(tenant).unwrap()).confine(&[b"etcd/", key].concat())
    };
    let got = admin
        .get(&stored("acme", b"shared-name"), Consistency::Linearizable)
        .await
        .unwrap();
    assert_eq!(got.kv.unwrap().value, b"acme's");

    // Reads, transactions, deletes and watches of every key reach the caller's keys only.
    assert_eq!(keys(&mut kv, &acme).await, vec![b"shared-name".to_vec()]);
    assert_eq!(
        keys(&mut kv, &globex).await,
        vec![b"globex-only".to_vec(), b"shared-name".to_vec()]
    );
    let txn = TxnRequest {
        success: vec![RequestOp {
            request: Some(Op::RequestRange(everything())),
        }],
        ..TxnRequest::default()
    };
    let answer = kv.txn(with_token(&acme, txn)).await.unwrap().into_inner();
    let read = match &answer.responses[0].response {
        Some(Answer::ResponseRange(read)) => read,
        other => panic!("not a range answer: {other:?}"),
    };
    assert_eq!(read.kvs.len(), 1, "{read:?}");
    assert_eq!(read.kvs[0].value, b"acme's");
    watch_sees_only_its_own(&channel, &globex).await;
    let deleted = DeleteRangeRequest {
        key: vec![0],
        range_end: vec![0],
        ..DeleteRangeRequest::default()
    };
    let deleted = kv.delete_range(with_token(&acme, deleted)).await.unwrap();
    assert_eq!(deleted.into_inner().deleted, 1);
    assert_eq!(keys(&mut kv, &globex).await.len(), 2, "globex's keys stay");
    // The admin's etcd namespace is the raw keyspace's, where no tenant key is.
    assert_eq!(keys(&mut kv, ADMIN).await, Vec::<Vec<u8>>::new());

    leases_stay_in_their_namespace(&channel, &acme, &globex).await;

    // Wrong passwords, another entry's token, and calls without a known token are refused.
    for (name, password) in [
        ("acme", "acme-token-012345678"),
        ("globex", ACME),
        ("ops", GLOBEX),
        ("nobody", ADMIN),
        ("acme", ""),
    ] {
        let refused = authenticate(&channel, name, password).await.unwrap_err();
        assert_eq!(refused.code(), Code::InvalidArgument, "{name}: {refused:?}");
        assert!(refused.message().contains("authentication failed"));
    }
    let anonymous = kv.range(everything()).await.unwrap_err();
    assert_eq!(anonymous.code(), Code::Unauthenticated, "{anonymous:?}");
    let unknown = kv.range(with_token("forged-token-0123456789", everything()));
    assert_eq!(unknown.await.unwrap_err().code(), Code::Unauthenticated);
    cluster.shutdown().await;
}

/// A lease `owner` granted is not another tenant's to see, keep alive or revoke, even by
/// its id; the key attached to it stays.
async fn leases_stay_in_their_namespace(channel: &Channel, owner: &str, other: &str) {
    let mut leases = LeaseClient::new(channel.clone());
    let grant = LeaseGrantRequest { ttl: 60, id: 777 };
    leases.lease_grant(with_token(owner, grant)).await.unwrap();
    let attached = PutRequest {
        key: b"leased".to_vec(),
        value: b"v".to_vec(),
        lease: 777,
        ..PutRequest::default()
    };
    let mut kv = KvClient::new(channel.clone());
    kv.put(with_token(owner, attached)).await.unwrap();
    let revoke = LeaseRevokeRequest { id: 777 };
    let refused = leases.lease_revoke(with_token(other, revoke)).await;
    assert_eq!(refused.unwrap_err().code(), Code::NotFound);
    let asked = LeaseTimeToLiveRequest {
        id: 777,
        keys: true,
    };
    let seen = leases.lease_time_to_live(with_token(other, asked)).await;
    assert_eq!(seen.unwrap().into_inner().ttl, -1);
    let listed = leases
        .lease_leases(with_token(other, LeaseLeasesRequest {}))
        .await;
    assert!(listed.unwrap().into_inner().leases.is_empty());
    // The other tenant's own lease 777 is another lease, in its own namespace.
    let grant = LeaseGrantRequest { ttl: 60, id: 777 };
    leases.lease_grant(with_token(other, grant)).await.unwrap();
    let revoke = LeaseRevokeRequest { id: 777 };
    leases
        .lease_revoke(with_token(other, revoke))
        .await
        .unwrap();
    let read = RangeRequest {
        key: b"leased".to_vec(),
        ..RangeRequest::default()
    };
    let still = kv
        .range(with_token(owner, read))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(still.kvs[0].lease, 777, "the owner's key and lease stay");
    let asked = LeaseTimeToLiveRequest {
        id: 777,
        keys: true,
    };
    let info = leases.lease_time_to_live(with_token(owner, asked)).await;
    assert_eq!(info.unwrap().into_inner().keys, vec![b"leased".to_vec()]);
}

/// A watch of every key from the first revision replays `token`'s own puts only.
async fn watch_sees_only_its_own(channel: &Channel, token: &str) {
    let create = WatchRequest {
        request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
            key: vec![0],
            range_end: vec![0],
            start_revision: 1,
            ..WatchCreateRequest::default()
        })),
    };
    let requests = futures::stream::iter([create]).chain(futures::stream::pending());
    let mut watch = WatchClient::new(channel.clone());
    let mut answers = watch
        .watch(with_token(token, requests))
        .await
        .unwrap()
        .into_inner();
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let answer = answers.message().await.unwrap().expect("the watch ended");
        seen.extend(answer.events.into_iter().map(|event| event.kv.unwrap().key));
    }
    assert_eq!(seen, vec![b"shared-name".to_vec(), b"globex-only".to_vec()]);
}
