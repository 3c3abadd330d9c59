//! Consistency checks across real replicas: every replica hashes a range at one log index,
//! a row changed behind Raft's back on one replica is found, named and raised as an alarm,
//! on demand (`Cluster.Check`) and by the periodic check.

use keel_client::{Client, PutOptions};
use keel_proto::test::v1::CorruptRowRequest;
use keel_proto::test::v1::faults_client::FaultsClient;
use keel_proto::v1::{CheckRequest, RangeCheck};
use keel_server::{Faults, KvSettings, RaftTimings};
use keel_types::{NodeId, RangeId};

use crate::harness::{Cluster, eventually};

const KEYS: usize = 60;

fn key(i: usize) -> Vec<u8> {
    format!("k{i:03}").into_bytes()
}

async fn fill(client: &Client) {
    for i in 0..KEYS {
        let value = format!("value {i}");
        client
            .put(&key(i), value.as_bytes(), PutOptions::default())
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

/// A node other than `leader`.
fn follower(cluster: &Cluster, leader: NodeId) -> NodeId {
    cluster.ids().into_iter().find(|id| *id != leader).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupted_replica_is_found_and_its_row_named() {
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

    // The leader raises the alarm in its status; the other ranges stay quiet.
    let status = cluster.status(leader).await;
    let alarms: Vec<u64> = status
        .consistency_alarms
        .iter()
        .map(|a| a.range_id)
        .collect();
    assert_eq!(alarms, vec![RangeId::FIRST.0], "{status:?}");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_periodic_check_raises_the_alarm_by_itself() {
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
    let alarm = eventually("the leader's periodic check raises an alarm", || async {
        let status = cluster.status(leader).await;
        status.consistency_alarms.into_iter().next()
    })
    .await;
    assert_eq!(alarm.range_id, RangeId::FIRST.0, "{alarm:?}");
    assert_eq!(alarm.divergent, vec![odd], "{alarm:?}");
    let odd_part = alarm.replicas.iter().find(|r| r.node_id == odd).unwrap();
    assert_eq!(
        odd_part.rows,
        vec![r#"key "k042""#.to_string()],
        "{alarm:?}"
    );
    cluster.shutdown().await;
}
