//! Consistency checks across real replicas: every replica hashes a range at one log index,
//! a row changed behind Raft's back on one replica is found, named, raised as an alarm and
//! repaired (the replica re-created from the majority), on demand (`Cluster.Check`) and by
//! the periodic check; a leader that differs hands over to the majority, which repairs it;
//! with no majority the range is held (serves nothing) until a check finds one again.

use keel_client::{Client, PutOptions};
use keel_proto::test::v1::faults_client::FaultsClient;
use keel_proto::test::v1::{CorruptRowRequest, MoveReplicaRequest};
use keel_proto::v1::{
    CheckRequest, Consistency as ProtoConsistency, GetRequest, PutRequest, RangeCheck,
};
use keel_server::{Faults, KvSettings, PlacementSettings, RaftTimings};
use keel_types::Consistency;
use keel_types::{NodeId, RangeId};

use crate::harness::{Cluster, eventually};
use crate::observability::scrape;

const KEYS: usize = 60;

fn key(i: usize) -> Vec<u8> {
    format!("k{i:03}").into_bytes()
}

async fn fill(client: &Client) {
    for i in 0..KEYS {
        client
            .put(&key(i), &value(i), PutOptions::default())
            .await
            .unwrap();
    }
}

async fn check(cluster: &Cluster, via: NodeId, range: Option<RangeId>) -> Vec<RangeCheck> {
    let request = CheckRequest {
        range_id: range.map(|range| range.0),
    };
    let mut client = cluster.cluster_client(via).await;
    client.check(request).await.unwrap().into_inner().ranges
}

/// Changes `key`'s row on node `id`'s replica only, once that replica has applied it.
async fn corrupt(cluster: &Cluster, id: NodeId, key: &[u8]) {
    cluster.applied_on(id, key).await;
    let endpoint = format!("http://{}", cluster.endpoint(id));
    let mut faults = FaultsClient::connect(endpoint).await.unwrap();
    let request = CorruptRowRequest { key: key.to_vec() };
    faults.corrupt_row(request).await.unwrap();
}

/// The value of `key(i)` that every replica must hold.
fn value(i: usize) -> Vec<u8> {
    format!("value {i}").into_bytes()
}

/// Waits until node `id`'s replica serves `key(i)` with its written value (a follower read).
async fn serves_the_written_value(cluster: &Cluster, id: NodeId, i: usize) {
    let client = cluster.client_of(id);
    eventually("the replica serves the written value", || async {
        let got = client.get(&key(i), Consistency::Follower).await.ok()?;
        (got.kv?.value == value(i)).then_some(())
    })
    .await;
}

/// Divergent checks node `id` led, from its metrics.
async fn divergent_checks(cluster: &Cluster, id: NodeId) -> f64 {
    let scrape = scrape(cluster, id).await;
    let labels = [("verdict", "divergent")];
    scrape
        .value("keel_consistency_checks_total", &labels)
        .unwrap_or(0.0)
}

/// A node other than `leader`.
fn follower(cluster: &Cluster, leader: NodeId) -> NodeId {
    cluster.ids().into_iter().find(|id| *id != leader).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupted_replica_is_found_named_and_repaired() {
    let cluster = Cluster::start(3).await;
    let client = cluster.client();
    fill(&client).await;
    let leader = cluster.leader().await;
    let odd = follower(&cluster, leader);
    let via = follower(&cluster, odd).max(leader);

    // Every range agrees before the fault; any node runs the check through the leaders.
    let before = check(&cluster, odd, None).await;
    assert!(
        before.len() >= 2,
        "the meta range and the first range: {before:?}"
    );
    for range in &before {
        assert_eq!(range.error, "", "{range:?}");
        assert_eq!(range.verdict, "consistent", "{range:?}");
        assert_eq!(range.replicas.len(), 3, "{range:?}");
        let hashes: Vec<&Vec<u8>> = range.replicas.iter().map(|r| &r.hash).collect();
        assert!(
            hashes
                .iter()
                .all(|hash| hash.len() == 32 && *hash == hashes[0])
        );
    }
    let first = before
        .iter()
        .find(|r| r.range_id == RangeId::FIRST.0)
        .unwrap();
    assert!(first.rows >= KEYS as u64, "{first:?}");

    corrupt(&cluster, odd, &key(17)).await;
    let after = check(&cluster, via, Some(RangeId::FIRST)).await;
    let [report] = after.as_slice() else {
        panic!("one range asked, one answered: {after:?}");
    };
    assert_eq!(report.verdict, "divergent", "{report:?}");
    assert_eq!(report.divergent, vec![odd], "{report:?}");
    assert_eq!(report.leader, leader, "{report:?}");
    let odd_part = report.replicas.iter().find(|r| r.node_id == odd).unwrap();
    assert_eq!(
        odd_part.rows,
        vec![r#"key "k017""#.to_string()],
        "{report:?}"
    );
    assert_eq!(odd_part.buckets_differing, 1, "{report:?}");
    for good in report.replicas.iter().filter(|r| r.node_id != odd) {
        assert!(good.rows.is_empty(), "{report:?}");
        assert_ne!(good.hash, odd_part.hash, "{report:?}");
    }

    // The odd replica was re-created from the majority and the range checked again.
    assert_eq!(report.repaired, vec![odd], "{report:?}");
    assert!(report.repair.ends_with(": consistent"), "{report:?}");
    serves_the_written_value(&cluster, odd, 17).await;
    let again = check(&cluster, odd, Some(RangeId::FIRST)).await;
    assert_eq!(again[0].verdict, "consistent", "{again:?}");
    // The alarm was raised (a divergent check is counted) and cleared by the check after
    // the repair.
    assert_eq!(divergent_checks(&cluster, leader).await, 1.0);
    let status = cluster.status(leader).await;
    assert!(status.consistency_alarms.is_empty(), "{status:?}");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_differs_hands_over_and_is_repaired() {
    let cluster = Cluster::start(3).await;
    let client = cluster.client();
    fill(&client).await;
    let leader = cluster.leader().await;
    corrupt(&cluster, leader, &key(5)).await;
    let after = check(&cluster, leader, Some(RangeId::FIRST)).await;
    let report = &after[0];
    assert_eq!(report.verdict, "divergent", "{report:?}");
    assert_eq!(report.divergent, vec![leader], "{report:?}");
    assert!(report.repaired.is_empty(), "{report:?}");
    assert!(
        report.repair.contains("took over and checked: divergent"),
        "{report:?}"
    );
    assert!(report.repair.contains(&format!("[{leader}]")), "{report:?}");
    let new_leader = cluster.leader_of(RangeId::FIRST).await;
    assert_ne!(new_leader, leader);
    serves_the_written_value(&cluster, leader, 5).await;
    let again = check(&cluster, new_leader, Some(RangeId::FIRST)).await;
    assert_eq!(again[0].verdict, "consistent", "{again:?}");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_periodic_check_finds_and_repairs_by_itself() {
    let kv = KvSettings {
        consistency_check_interval_ms: 1_000,
        ..KvSettings::default()
    };
    let cluster = Cluster::start_configured(3, RaftTimings::default(), kv, Faults::default()).await;
    let client = cluster.client();
    fill(&client).await;
    let leader = cluster.leader().await;
    let odd = follower(&cluster, leader);
    corrupt(&cluster, odd, &key(42)).await;
    // The periodic check finds it, repairs it, and checks again.
    eventually(
        "the leader's periodic check finds the divergent replica",
        || async { (divergent_checks(&cluster, leader).await >= 1.0).then_some(()) },
    )
    .await;
    serves_the_written_value(&cluster, odd, 42).await;
    let again = check(&cluster, leader, Some(RangeId::FIRST)).await;
    assert_eq!(again[0].verdict, "consistent", "{again:?}");
    cluster.shutdown().await;
}

/// Whether `status` says the range is held.
fn held(status: &tonic::Status) -> bool {
    status.code() == tonic::Code::Unavailable && status.message().contains("is held")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_majority_the_range_is_held_until_a_replaced_replica_makes_one() {
    // The rebalancer looks once a minute: it moves nothing by itself while the test runs.
    let placement = PlacementSettings {
        rebalance_interval_ms: 60_000,
        ..PlacementSettings::default()
    };
    let mut cluster = Cluster::start_placed(3, placement).await;
    let client = cluster.client();
    fill(&client).await;
    let leader = cluster.leader().await;
    let followers: Vec<NodeId> = cluster
        .ids()
        .into_iter()
        .filter(|id| *id != leader)
        .collect();
    // Each follower differs from the leader, and from the other, in a row of its own.
    corrupt(&cluster, followers[0], &key(3)).await;
    corrupt(&cluster, followers[1], &key(9)).await;
    let report = check(&cluster, leader, Some(RangeId::FIRST)).await;
    assert_eq!(report[0].verdict, "no-majority", "{report:?}");
    assert!(report[0].repair.contains("the range is held"), "{report:?}");

    // No replica serves it: a write, and a read of any consistency on any node, is refused.
    let put = PutRequest {
        key: key(1),
        value: b"new".to_vec(),
        ..PutRequest::default()
    };
    let refused = cluster.kv(leader).await.put(put).await.unwrap_err();
    assert!(held(&refused), "{refused:?}");
    for id in cluster.ids() {
        for consistency in [ProtoConsistency::Linearizable, ProtoConsistency::Follower] {
            let get = GetRequest {
                key: key(1),
                consistency: consistency as i32,
                ..GetRequest::default()
            };
            let refused = cluster.kv(id).await.get(get).await.unwrap_err();
            assert!(held(&refused), "node {id}, {consistency:?}: {refused:?}");
        }
    }
    let still = check(&cluster, leader, Some(RangeId::FIRST)).await;
    assert_eq!(still[0].verdict, "no-majority", "{still:?}");

    // The operator replaces one differing replica with a new one, made from the leader's
    // state: leader and new replica are a majority. The next check repairs the other
    // differing replica and the range serves again.
    cluster.join_node(4).await;
    let faults = FaultsClient::connect(format!("http://{}", cluster.endpoint(leader)))
        .await
        .unwrap();
    let moved = MoveReplicaRequest {
        range_id: RangeId::FIRST.0,
        from_node: followers[0],
        to_node: 4,
    };
    eventually("the replica is moved to node 4", || async {
        faults.clone().move_replica(moved).await.ok()
    })
    .await;
    let report = check(&cluster, leader, Some(RangeId::FIRST)).await;
    assert_eq!(report[0].verdict, "divergent", "{report:?}");
    assert_eq!(report[0].divergent, vec![followers[1]], "{report:?}");
    assert_eq!(report[0].repaired, vec![followers[1]], "{report:?}");
    assert!(report[0].repair.contains("serves again"), "{report:?}");
    client
        .put(&key(1), &value(1), PutOptions::default())
        .await
        .unwrap();
    for id in [4, followers[1]] {
        serves_the_written_value(&cluster, id, 9).await;
        serves_the_written_value(&cluster, id, 3).await;
    }
    let again = check(&cluster, leader, Some(RangeId::FIRST)).await;
    assert_eq!(again[0].verdict, "consistent", "{again:?}");
    cluster.shutdown().await;
}

/// A check asked of a node that still takes a lost leader for the range's leader rides the
/// election out, as a forwarded request does, instead of reporting the lost leader's
/// silence as the range's error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_follows_the_leadership_to_the_range_s_next_leader() {
    let mut cluster = Cluster::start(3).await;
    fill(&cluster.client()).await;
    let leader = cluster.leader().await;
    let via = follower(&cluster, leader);
    cluster.stop_node(leader).await;
    let checked = check(&cluster, via, Some(RangeId::FIRST)).await;
    let report = &checked[0];
    assert!(report.error.is_empty(), "{report:?}");
    assert_ne!(report.leader, leader, "{report:?}");
    cluster.shutdown().await;
}
