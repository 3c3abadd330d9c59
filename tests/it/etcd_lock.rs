//! etcd's `v3lock` and `v3election` services on Keel, through etcd's wire API: a lock held by
//! one lease is handed to a waiting one on unlock and on the holder's lease revoked, a waiter
//! that gives up leaves the line, and an election's leader is read, observed, proclaims a
//! new value, and hands leadership over when it resigns.

use std::time::Duration;

use keel_proto::etcd::etcdserverpb::kv_client::KvClient;
use keel_proto::etcd::etcdserverpb::lease_client::LeaseClient;
use keel_proto::etcd::etcdserverpb::{LeaseGrantRequest, LeaseRevokeRequest, RangeRequest};
use keel_proto::etcd::v3electionpb::election_client::ElectionClient;
use keel_proto::etcd::v3electionpb::{
    CampaignRequest, LeaderKey, LeaderRequest, ProclaimRequest, ResignRequest,
};
use keel_proto::etcd::v3lockpb::lock_client::LockClient;
use keel_proto::etcd::v3lockpb::{LockRequest, UnlockRequest};
use tonic::Code;
use tonic::transport::Channel;

use crate::harness::{Cluster, eventually};

async fn channel(cluster: &Cluster, id: u64) -> Channel {
    let addr = cluster.node(id).etcd_addr().unwrap();
    Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .timeout(Duration::from_secs(30))
        .connect()
        .await
        .unwrap()
}

async fn grant(channel: &Channel) -> i64 {
    let request = LeaseGrantRequest { ttl: 60, id: 0 };
    let mut leases = LeaseClient::new(channel.clone());
    leases.lease_grant(request).await.unwrap().into_inner().id
}

/// How many contenders wait or hold under `name`.
async fn contenders(channel: &Channel, name: &str) -> usize {
    let request = RangeRequest {
        key: format!("{name}/").into_bytes(),
        range_end: format!("{name}0").into_bytes(),
        count_only: true,
        ..RangeRequest::default()
    };
    let mut kv = KvClient::new(channel.clone());
    kv.range(request).await.unwrap().into_inner().count as usize
}

async fn until_contenders(channel: &Channel, name: &str, count: usize) {
    eventually("the contenders are in line", || async move {
        (contenders(channel, name).await == count).then_some(())
    })
    .await;
}

fn lock(channel: &Channel, lease: i64) -> tokio::task::JoinHandle<Vec<u8>> {
    let mut locks = LockClient::new(channel.clone());
    tokio::spawn(async move {
        let request = LockRequest {
            name: b"app".to_vec(),
            lease,
        };
        locks.lock(request).await.unwrap().into_inner().key
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn locks_pass_in_line_and_waiters_that_give_up_leave_it() {
    let cluster = Cluster::start(3).await;
    let leader = cluster.leader().await;
    let follower = *cluster.ids().iter().find(|id| **id != leader).unwrap();
    let channel = channel(&cluster, follower).await;
    let (first, second, third, fourth) = (
        grant(&channel).await,
        grant(&channel).await,
        grant(&channel).await,
        grant(&channel).await,
    );

    let held = lock(&channel, first).await.unwrap();
    assert_eq!(held, format!("app/{first:x}").into_bytes());
    let waiting = lock(&channel, second);
    until_contenders(&channel, "app", 2).await;
    assert!(!waiting.is_finished(), "two hold the lock");
    let mut locks = LockClient::new(channel.clone());
    locks.unlock(UnlockRequest { key: held }).await.unwrap();
    assert_eq!(
        waiting.await.unwrap(),
        format!("app/{second:x}").into_bytes()
    );

    // A waiter that gives up leaves the line.
    let given_up = lock(&channel, third);
    until_contenders(&channel, "app", 2).await;
    given_up.abort();
    until_contenders(&channel, "app", 1).await;

    // The holder's lease revoked hands the lock on.
    let waiting = lock(&channel, fourth);
    until_contenders(&channel, "app", 2).await;
    let mut leases = LeaseClient::new(channel.clone());
    let revoke = LeaseRevokeRequest { id: second };
    leases.lease_revoke(revoke).await.unwrap();
    assert_eq!(
        waiting.await.unwrap(),
        format!("app/{fourth:x}").into_bytes()
    );

    let refused = locks
        .lock(LockRequest {
            name: b"app".to_vec(),
            lease: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_election_leader_is_observed_proclaims_and_resigns_to_the_next() {
    let cluster = Cluster::start(3).await;
    let leader = cluster.leader().await;
    let channel = channel(&cluster, leader).await;
    let mut election = ElectionClient::new(channel.clone());
    let (a, b) = (grant(&channel).await, grant(&channel).await);

    let none = election
        .leader(LeaderRequest {
            name: b"e".to_vec(),
        })
        .await
        .unwrap_err();
    assert_eq!(none.message(), "etcdserver: election: no leader");
    let campaign = |lease: i64, value: &str| CampaignRequest {
        name: b"e".to_vec(),
        lease,
        value: value.as_bytes().to_vec(),
    };
    let won = election
        .campaign(campaign(a, "a"))
        .await
        .unwrap()
        .into_inner();
    let leader_a: LeaderKey = won.leader.unwrap();
    let mut observed = election
        .observe(LeaderRequest {
            name: b"e".to_vec(),
        })
        .await
        .unwrap()
        .into_inner();
    let seen = observed.message().await.unwrap().unwrap().kv.unwrap();
    assert_eq!(seen.value, b"a");

    let proclaim = ProclaimRequest {
        leader: Some(leader_a.clone()),
        value: b"a2".to_vec(),
    };
    election.proclaim(proclaim).await.unwrap();
    let seen = observed.message().await.unwrap().unwrap().kv.unwrap();
    assert_eq!(seen.value, b"a2");
    let read = election.leader(LeaderRequest {
        name: b"e".to_vec(),
    });
    assert_eq!(read.await.unwrap().into_inner().kv.unwrap().value, b"a2");

    let mut second = election.clone();
    let waiting = tokio::spawn(async move {
        let request = campaign(b, "b");
        second.campaign(request).await.unwrap().into_inner()
    });
    until_contenders(&channel, "e", 2).await;
    assert!(!waiting.is_finished(), "two lead");
    let resign = ResignRequest {
        leader: Some(leader_a.clone()),
    };
    election.resign(resign).await.unwrap();
    let leader_b = waiting.await.unwrap().leader.unwrap();
    assert_eq!(leader_b.key, format!("e/{b:x}").into_bytes());
    let seen = observed.message().await.unwrap().unwrap().kv.unwrap();
    assert_eq!(seen.value, b"b");
    // The old leader's key is gone: it can no longer proclaim.
    let stale = ProclaimRequest {
        leader: Some(leader_a),
        value: b"late".to_vec(),
    };
    let refused = election.proclaim(stale).await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    cluster.shutdown().await;
}
