//! etcd's `Lease` service on Keel, through etcd's wire API (keel-proto's generated etcd
//! client): a grant, keys attached by puts, time to live with the keys, keep-alives on a
//! stream, the list, a revoke that deletes exactly its keys at one revision, a put naming a
//! lease that does not exist, expiry by the leader's clock (the keys are deleted by the
//! leader's upkeep), and a keep-alive answering TTL 0 once the lease is gone.

use std::time::Duration;

use keel_proto::etcd::etcdserverpb::kv_client::KvClient;
use keel_proto::etcd::etcdserverpb::lease_client::LeaseClient;
use keel_proto::etcd::etcdserverpb::{
    LeaseGrantRequest, LeaseKeepAliveRequest, LeaseLeasesRequest, LeaseRevokeRequest,
    LeaseTimeToLiveRequest, PutRequest, RangeRequest,
};
use keel_types::limits;
use tonic::Code;
use tonic::transport::Channel;

use crate::harness::{Cluster, eventually};

async fn etcd_channel(cluster: &Cluster, id: u64) -> Channel {
    let addr = cluster.node(id).etcd_addr().unwrap();
    Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .timeout(Duration::from_secs(10))
        .connect()
        .await
        .unwrap()
}

async fn put(kv: &mut KvClient<Channel>, key: &str, lease: i64) -> Result<i64, tonic::Status> {
    let request = PutRequest {
        key: key.as_bytes().to_vec(),
        value: b"v".to_vec(),
        lease,
        ..PutRequest::default()
    };
    let answer = kv.put(request).await?.into_inner();
    Ok(answer.header.unwrap().revision)
}

/// The keys under `prefix`, each with its lease.
async fn keys(kv: &mut KvClient<Channel>, prefix: &str) -> Vec<(String, i64)> {
    let mut end = prefix.as_bytes().to_vec();
    *end.last_mut().unwrap() += 1;
    let request = RangeRequest {
        key: prefix.as_bytes().to_vec(),
        range_end: end,
        ..RangeRequest::default()
    };
    let answer = kv.range(request).await.unwrap().into_inner();
    answer
        .kvs
        .into_iter()
        .map(|kv| (String::from_utf8(kv.key).unwrap(), kv.lease))
        .collect()
}

async fn grant(leases: &mut LeaseClient<Channel>, ttl: i64) -> i64 {
    let request = LeaseGrantRequest { ttl, id: 0 };
    let granted = leases.lease_grant(request).await.unwrap().into_inner();
    assert!(granted.id > 0);
    granted.id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leases_attach_keep_alive_revoke_and_expire_by_the_leaders_clock() {
    let cluster = Cluster::start(3).await;
    let leader = cluster.leader().await;
    let follower = *cluster.ids().iter().find(|id| **id != leader).unwrap();
    let channel = etcd_channel(&cluster, follower).await;
    let (mut kv, mut leases) = (KvClient::new(channel.clone()), LeaseClient::new(channel));

    // A short TTL is raised to the minimum; one past a year is refused.
    let request = LeaseGrantRequest { ttl: 1, id: 0 };
    let short = leases.lease_grant(request).await.unwrap().into_inner();
    assert_eq!(short.ttl, limits::ETCD_LEASE_TTL_MIN_S as i64);
    let request = LeaseGrantRequest {
        ttl: 400 * 24 * 3600,
        id: 0,
    };
    let refused = leases.lease_grant(request).await.unwrap_err();
    assert_eq!(refused.code(), Code::OutOfRange, "{refused:?}");

    let session = grant(&mut leases, 30).await;
    let other = grant(&mut leases, 30).await;
    assert_ne!(session, other);
    let chosen = LeaseGrantRequest { ttl: 30, id: 4242 };
    let chosen = leases.lease_grant(chosen).await.unwrap().into_inner();
    assert_eq!(chosen.id, 4242);
    let again = LeaseGrantRequest { ttl: 30, id: 4242 };
    assert!(leases.lease_grant(again).await.is_err(), "an id in use");

    put(&mut kv, "s/a", session).await.unwrap();
    put(&mut kv, "s/b", session).await.unwrap();
    put(&mut kv, "o/a", other).await.unwrap();
    put(&mut kv, "plain", 0).await.unwrap();
    let missing = put(&mut kv, "s/c", 999_999).await.unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);
    assert_eq!(missing.message(), "etcdserver: requested lease not found");
    assert_eq!(
        keys(&mut kv, "s/").await,
        vec![("s/a".to_string(), session), ("s/b".to_string(), session)]
    );

    let asked = LeaseTimeToLiveRequest {
        id: session,
        keys: true,
    };
    let ttl = leases.lease_time_to_live(asked).await.unwrap().into_inner();
    assert_eq!(ttl.granted_ttl, 30);
    assert!((29..=30).contains(&ttl.ttl), "{ttl:?}");
    assert_eq!(ttl.keys, vec![b"s/a".to_vec(), b"s/b".to_vec()]);
    let listed = leases.lease_leases(LeaseLeasesRequest {}).await.unwrap();
    let mut ids: Vec<i64> = listed.into_inner().leases.iter().map(|l| l.id).collect();
    ids.sort_unstable();
    let mut expected = vec![short.id, session, other, 4242];
    expected.sort_unstable();
    assert_eq!(ids, expected);

    // Revoking one lease deletes its keys at one revision and nothing else.
    let before = put(&mut kv, "marker", 0).await.unwrap();
    let revoked = LeaseRevokeRequest { id: other };
    let revoked = leases.lease_revoke(revoked).await.unwrap().into_inner();
    assert_eq!(revoked.header.unwrap().revision, before + 1);
    assert!(keys(&mut kv, "o/").await.is_empty());
    assert_eq!(keys(&mut kv, "s/").await.len(), 2);
    let gone = LeaseRevokeRequest { id: other };
    let gone = leases.lease_revoke(gone).await.unwrap_err();
    assert_eq!(gone.code(), Code::NotFound);

    // Keep-alives restart the TTL, by the leader's clock: 20 s on, then kept alive, the
    // lease outlives its first 30 s.
    cluster.advance_clocks_ms(20_000);
    let (sender, receiver) = tokio::sync::mpsc::channel(4);
    let mut answers = leases
        .lease_keep_alive(tokio_stream::wrappers::ReceiverStream::new(receiver))
        .await
        .unwrap()
        .into_inner();
    sender
        .send(LeaseKeepAliveRequest { id: session })
        .await
        .unwrap();
    let kept = answers.message().await.unwrap().unwrap();
    assert_eq!((kept.id, kept.ttl), (session, 30));
    cluster.advance_clocks_ms(20_000);
    assert_eq!(keys(&mut kv, "s/").await.len(), 2, "kept alive");

    // Past its TTL, the leader's upkeep revokes it: its keys go, the plain key stays.
    cluster.advance_clocks_ms(11_000);
    eventually("the expired lease's keys are deleted", || {
        let mut kv = kv.clone();
        async move { keys(&mut kv, "s/").await.is_empty().then_some(()) }
    })
    .await;
    assert_eq!(keys(&mut kv, "plain").await.len(), 1);
    sender
        .send(LeaseKeepAliveRequest { id: session })
        .await
        .unwrap();
    let expired = answers.message().await.unwrap().unwrap();
    assert_eq!((expired.id, expired.ttl), (session, 0), "a lease gone");
    let asked = LeaseTimeToLiveRequest {
        id: session,
        keys: false,
    };
    let ttl = leases.lease_time_to_live(asked).await.unwrap().into_inner();
    assert_eq!(ttl.ttl, -1);
    cluster.shutdown().await;
}
