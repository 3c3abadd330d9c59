//! etcd's own Rust client (the `etcd-client` crate) against a 3-node Keel serving etcd's API
//! on every node: puts and gets with prefixes, limits, sorts and past revisions, versions,
//! transactions on both branches, deletes with previous values, a watch resumed from a past
//! revision with previous values, the member list and each endpoint's status. Built with
//! the `etcd-client` feature only (it needs protoc); `.ci/run` runs it.

use etcd_client::{
    Client, Compare, CompareOp, DeleteOptions, EventType, GetOptions, LeaseTimeToLiveOptions,
    LockOptions, PutOptions, ResignOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse,
    WatchOptions,
};

use crate::harness::Cluster;

/// A client of every node's etcd API, as etcd's clients are given every endpoint.
async fn connect(cluster: &Cluster) -> Client {
    let endpoints: Vec<String> = cluster
        .ids()
        .iter()
        .map(|id| format!("http://{}", cluster.node(*id).etcd_addr().unwrap()))
        .collect();
    Client::connect(endpoints, None).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn etcd_client_drives_keel() {
    let cluster = Cluster::start(3).await;
    let mut client = connect(&cluster).await;

    let first = client.put("app/config", "v1", None).await.unwrap();
    let first = first.header().unwrap().revision();
    client.put("app/config", "v2", None).await.unwrap();
    client.put("app/flags/a", "1", None).await.unwrap();
    client.put("app/flags/b", "2", None).await.unwrap();

    let got = client.get("app/config", None).await.unwrap();
    let kv = &got.kvs()[0];
    assert_eq!((kv.value(), kv.version()), (&b"v2"[..], 2));
    assert_eq!(kv.create_revision(), first);
    let old = client
        .get("app/config", Some(GetOptions::new().with_revision(first)))
        .await
        .unwrap();
    assert_eq!(old.kvs()[0].value(), b"v1", "a read at a past revision");
    let newest_first = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Descend)
        .with_limit(2)
        .with_serializable();
    let page = client.get("app/", Some(newest_first)).await.unwrap();
    let keys: Vec<&[u8]> = page.kvs().iter().map(|kv| kv.key()).collect();
    assert_eq!(keys, vec![&b"app/flags/b"[..], b"app/flags/a"]);
    assert_eq!((page.count(), page.more()), (3, true));

    // A transaction on the success branch, then the same on the failure branch.
    let txn = || {
        Txn::new()
            .when([Compare::value("app/config", CompareOp::Equal, "v2")])
            .and_then([TxnOp::put("app/config", "v3", None)])
            .or_else([TxnOp::get("app/config", None)])
    };
    assert!(client.txn(txn()).await.unwrap().succeeded());
    let failed = client.txn(txn()).await.unwrap();
    assert!(!failed.succeeded());
    let answers = failed.op_responses();
    let [TxnOpResponse::Get(read)] = answers.as_slice() else {
        panic!("not one read: {answers:?}");
    };
    assert_eq!(read.kvs()[0].value(), b"v3");

    // A watch from the first revision replays the key's history, then goes on live.
    let from_first = WatchOptions::new()
        .with_start_revision(first)
        .with_prev_key();
    let mut stream = client.watch("app/config", Some(from_first)).await.unwrap();
    let mut values = Vec::new();
    while values.len() < 3 {
        let message = stream.message().await.unwrap().expect("the watch ended");
        values.extend(message.events().iter().map(|event| {
            assert_eq!(event.event_type(), EventType::Put);
            event.kv().unwrap().value().to_vec()
        }));
    }
    assert_eq!(values, vec![b"v1".to_vec(), b"v2".to_vec(), b"v3".to_vec()]);
    client.delete("app/config", None).await.unwrap();
    let message = stream.message().await.unwrap().expect("the watch ended");
    let event = &message.events()[0];
    assert_eq!(event.event_type(), EventType::Delete);
    assert_eq!(event.prev_kv().unwrap().value(), b"v3");

    let deleted = client
        .delete(
            "app/flags/",
            Some(DeleteOptions::new().with_prefix().with_prev_key()),
        )
        .await
        .unwrap();
    assert_eq!(deleted.deleted(), 2);
    assert_eq!(deleted.prev_kvs().len(), 2);
    let left = client
        .get("app/", Some(GetOptions::new().with_prefix()))
        .await;
    assert_eq!(left.unwrap().count(), 0);

    leases_locks_and_elections(&mut client).await;

    let members = client.member_list().await.unwrap();
    assert_eq!(members.members().len(), 3);
    let leader = cluster.leader().await;
    for id in cluster.ids() {
        let endpoint = format!("http://{}", cluster.node(id).etcd_addr().unwrap());
        let mut one = Client::connect([endpoint], None).await.unwrap();
        let status = one.status().await.unwrap();
        assert_eq!(status.version(), "3.5.33");
        assert_eq!(status.leader(), leader, "node {id}");
    }
    cluster.shutdown().await;
}

/// Leases (grant, attach, time to live with keys, keep-alive, revoke), the `Lock` service,
/// and an election's campaign, leader and resignation, through the crate's own calls.
async fn leases_locks_and_elections(client: &mut Client) {
    let lease = client.lease_grant(30, None).await.unwrap().id();
    let attached = PutOptions::new().with_lease(lease);
    client.put("leased", "v", Some(attached)).await.unwrap();
    let with_keys = LeaseTimeToLiveOptions::new().with_keys();
    let ttl = client
        .lease_time_to_live(lease, Some(with_keys))
        .await
        .unwrap();
    assert_eq!(ttl.keys(), &[b"leased".to_vec()]);
    let (mut keeper, mut kept) = client.lease_keep_alive(lease).await.unwrap();
    keeper.keep_alive().await.unwrap();
    assert_eq!(kept.message().await.unwrap().unwrap().ttl(), 30);

    let locked = client
        .lock("app-lock", Some(LockOptions::new().with_lease(lease)))
        .await
        .unwrap();
    assert!(locked.key().starts_with(b"app-lock/"));
    client.unlock(locked.key()).await.unwrap();

    let won = client.campaign("app-election", "a", lease).await.unwrap();
    let leader = won.leader().unwrap().clone();
    let read = client.leader("app-election").await.unwrap();
    assert_eq!(read.kv().unwrap().value(), b"a");
    let resign = ResignOptions::new().with_leader(leader);
    client.resign(Some(resign)).await.unwrap();
    assert!(
        client.leader("app-election").await.is_err(),
        "no leader now"
    );

    client.lease_revoke(lease).await.unwrap();
    assert_eq!(client.get("leased", None).await.unwrap().count(), 0);
}
