//! Quiescence of idle ranges on a real 3-node cluster: once idle, every replica of every
//! data range parks its ticker (`Cluster.Status` says `quiesced`); reads and writes to a
//! quiesced range are served and wake it; when the node leading quiesced ranges dies, the
//! followers notice its pings are missing, elect a new leader and serve writes
//! again; a restarted node's replicas quiesce again; a quiesced range splits, and keys that
//! expire in a quiesced range are still cleaned up. No timing assertions: every wait is on a
//! condition, with `harness::eventually`'s deadline.

use std::collections::BTreeMap;
use std::time::Duration;

use keel_client::{Client, PutOptions};
use keel_proto::v1::RangeStatus;
use keel_server::{PlacementSettings, RaftTimings};
use keel_types::{Consistency, NodeId, RangeId};

use crate::harness::{Cluster, eventually};
use crate::observability::{health_of, scrape};
use tonic_health::pb::health_check_response::ServingStatus;

/// Short, so that the tests do not wait long for ranges to go idle.
const QUIESCE_AFTER_MS: u64 = 500;

fn timings() -> RaftTimings {
    RaftTimings {
        quiesce_after_ms: QUIESCE_AFTER_MS,
        ..RaftTimings::default()
    }
}

/// Node `id`'s view of each data range (the meta range aside), by range id.
async fn data_ranges(cluster: &Cluster, id: NodeId) -> Option<BTreeMap<u64, RangeStatus>> {
    let status = cluster.client().status(&cluster.endpoint(id)).await.ok()?;
    let ranges = status
        .ranges
        .into_iter()
        .filter(|range| range.range_id != RangeId::META.0)
        .map(|range| (range.range_id, range))
        .collect();
    Some(ranges)
}

/// Waits until every running node reports `count` data ranges, each quiesced, led by the
/// same running node everywhere and at the same last log index everywhere, and returns the
/// ranges as the leader reports them.
async fn all_quiesced(cluster: &Cluster, count: usize) -> BTreeMap<u64, RangeStatus> {
    eventually("every replica of every data range quiesces", || async {
        let mut views = Vec::new();
        for id in cluster.running() {
            let ranges = data_ranges(cluster, id).await?;
            let quiet = ranges.len() == count && ranges.values().all(|range| range.quiesced);
            quiet.then_some(())?;
            views.push((id, ranges));
        }
        let (_, first) = views.first()?;
        let mut led = BTreeMap::new();
        for (range_id, range) in first {
            let leader = range.leader_id?;
            let agreed = views.iter().all(|(_, ranges)| {
                ranges.get(range_id).is_some_and(|other| {
                    other.leader_id == Some(leader) && other.last_log_index == range.last_log_index
                })
            });
            let (_, on_leader) = views.iter().find(|(id, _)| *id == leader)?;
            (agreed && on_leader[range_id].role == "leader").then_some(())?;
            led.insert(*range_id, on_leader[range_id].clone());
        }
        Some(led)
    })
    .await
}

async fn put(client: &Client, key: &str, value: &str) -> u64 {
    client
        .put(key.as_bytes(), value.as_bytes(), PutOptions::default())
        .await
        .unwrap()
        .revision
}

async fn get(client: &Client, key: &str, consistency: Consistency) -> Vec<u8> {
    let got = client.get(key.as_bytes(), consistency).await.unwrap();
    got.kv.expect("the key exists").value
}

/// Two data ranges, `[, m)` holding `a` and `[m, )` holding `n`; returns the right one's id.
async fn two_ranges(client: &Client) -> u64 {
    put(client, "a", "1").await;
    let (_, right) = client.split(b"m").await.unwrap();
    put(client, "n", "1").await;
    right.id.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn idle_ranges_quiesce_and_a_write_wakes_one() {
    let cluster = Cluster::start_with(3, timings()).await;
    let client = cluster.client();
    let right = two_ranges(&client).await;
    let before = all_quiesced(&cluster, 2).await;

    // A quiesced leader's lease has lapsed: the lease read falls back to ReadIndex.
    assert_eq!(get(&client, "a", Consistency::Lease).await, b"1");
    assert_eq!(get(&client, "n", Consistency::Linearizable).await, b"1");
    let revision = put(&client, "n", "2").await;
    assert_eq!(get(&client, "n", Consistency::Linearizable).await, b"2");

    // The write went through Raft: the range woke, committed it everywhere and went quiet
    // again at the new end of its log.
    let after = eventually("the written range quiesces past the write", || async {
        let after = all_quiesced(&cluster, 2).await;
        (after[&right].last_log_index > before[&right].last_log_index).then_some(after)
    })
    .await;
    assert_eq!(after[&right].revision, revision);
    // Reads take no revision (a leader moved by the rebalancer may add a blank entry).
    let left = RangeId::FIRST.0;
    assert_eq!(after[&left].revision, before[&left].revision);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dead_leaders_quiesced_ranges_elect_a_new_leader() {
    let mut cluster = Cluster::start_with(3, timings()).await;
    let client = cluster.client();
    let right = two_ranges(&client).await;
    let before = all_quiesced(&cluster, 2).await;
    let old_leader = before[&RangeId::FIRST.0].leader_id.unwrap();

    // Nothing but the missing pings tells the followers: the dead leader sends no
    // Raft message, and the other followers are parked too.
    cluster.stop_node(old_leader).await;
    let new_leaders = eventually("the quiesced ranges elect new leaders", || async {
        let mut leaders = BTreeMap::new();
        for id in cluster.running() {
            for (range_id, range) in data_ranges(&cluster, id).await? {
                if range.role == "leader" {
                    leaders.insert(range_id, id);
                }
            }
        }
        (leaders.len() == 2).then_some(leaders)
    })
    .await;
    for (range_id, leader) in &new_leaders {
        assert_ne!(*leader, old_leader, "range {range_id}");
    }
    put(&client, "a", "2").await;
    put(&client, "n", "2").await;
    assert_eq!(get(&client, "a", Consistency::Linearizable).await, b"2");
    assert_eq!(get(&client, "n", Consistency::Linearizable).await, b"2");

    // Back, the old leader catches up as a follower and every range goes quiet again.
    cluster.start_node(old_leader).await;
    let again = all_quiesced(&cluster, 2).await;
    for range_id in [RangeId::FIRST.0, right] {
        assert!(again[&range_id].last_log_index > before[&range_id].last_log_index);
    }
    cluster.shutdown().await;
}

/// A restarted follower holds its groups until it learns their leader lists them as quiet,
/// and does not campaign: the ranges led by other nodes keep their leader and term. (The
/// rebalancer, which would hand the restarted node a leadership, waits a minute between
/// looks here.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restarted_follower_of_quiesced_ranges_starts_no_election() {
    let placement = PlacementSettings {
        rebalance_interval_ms: 60_000,
        ..PlacementSettings::default()
    };
    let mut cluster = Cluster::start_placed_with(3, timings(), placement).await;
    two_ranges(&cluster.client()).await;
    let before = all_quiesced(&cluster, 2).await;
    let leaders: Vec<NodeId> = before
        .values()
        .filter_map(|range| range.leader_id)
        .collect();
    let restarted = cluster
        .ids()
        .into_iter()
        .min_by_key(|id| leaders.iter().filter(|leader| *leader == id).count())
        .unwrap();

    cluster.stop_node(restarted).await;
    cluster.start_node(restarted).await;
    let after = all_quiesced(&cluster, 2).await;
    for (range_id, range) in &before {
        if range.leader_id == Some(restarted) {
            continue;
        }
        let again = &after[range_id];
        assert_eq!(
            (again.leader_id, again.term),
            (range.leader_id, range.term),
            "range {range_id}: node {restarted} restarted"
        );
    }
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_quiesced_range_splits_and_its_halves_quiesce() {
    let cluster = Cluster::start_with(3, timings()).await;
    let client = cluster.client();
    let right = two_ranges(&client).await;
    all_quiesced(&cluster, 2).await;
    let (left, child) = client.split(b"t").await.unwrap();
    assert_eq!(left.id.0, right);
    put(&client, "u", "1").await;
    let after = all_quiesced(&cluster, 3).await;
    assert!(after.contains_key(&child.id.0));
    assert_eq!(get(&client, "n", Consistency::Linearizable).await, b"1");
    assert_eq!(get(&client, "u", Consistency::Linearizable).await, b"1");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn keys_that_expire_in_a_quiesced_range_are_cleaned_up() {
    let cluster = Cluster::start_with(3, timings()).await;
    let client = cluster.client();
    let ttl = PutOptions {
        ttl: Some(Duration::from_secs(60)),
        ..PutOptions::default()
    };
    client.put(b"t", b"1", ttl).await.unwrap();
    put(&client, "kept", "1").await;
    let before = all_quiesced(&cluster, 1).await;
    let first = RangeId::FIRST.0;
    assert_eq!(before[&first].keys_with_ttl, 1);

    // Nothing happens in the range; only the nodes' clocks move past the expiry.
    cluster.advance_clocks_ms(60_000);
    eventually("the expired key is removed on every replica", || async {
        for id in cluster.running() {
            let ranges = data_ranges(&cluster, id).await?;
            (ranges.get(&first)?.keys_with_ttl == 0).then_some(())?;
        }
        Some(())
    })
    .await;
    let after = all_quiesced(&cluster, 1).await;
    assert_eq!(after[&first].keys, 1, "only the key without a TTL is left");
    assert!(after[&first].last_log_index > before[&first].last_log_index);
    cluster.shutdown().await;
}

/// A quiet leader gets no Raft acknowledgements; it still counts as the leader while its
/// followers' pings arrive, so an idle cluster stays SERVING; and the pings keep every
/// follower from waking: no range changes leader or term while the cluster sits idle for
/// longer than the silence a follower waits out, by pings or by heartbeats.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_of_quiesced_ranges_stays_serving() {
    // The rebalancer, which may move a leadership once, waits a minute between looks here.
    let placement = PlacementSettings {
        rebalance_interval_ms: 60_000,
        ..PlacementSettings::default()
    };
    let cluster = Cluster::start_placed_with(3, timings(), placement).await;
    two_ranges(&cluster.client()).await;
    let before = all_quiesced(&cluster, 2).await;
    // Past the window in which a leader's last quorum acknowledgement counts, and past the
    // 2.5 s a node that never pinged may stay silent.
    let window = Duration::from_millis(3_000.max(2 * timings().election_timeout_ms_max));
    tokio::time::sleep(window).await;
    let after = all_quiesced(&cluster, 2).await;
    for (range_id, range) in &before {
        let again = &after[range_id];
        assert_eq!(
            (again.leader_id, again.term),
            (range.leader_id, range.term),
            "range {range_id} changed leader or term while idle"
        );
    }
    for id in cluster.ids() {
        let status = health_of(&cluster, id, "").await;
        assert_eq!(status, Some(ServingStatus::Serving), "node {id}");
        let metrics = scrape(&cluster, id).await;
        for peer in cluster.ids().into_iter().filter(|peer| *peer != id) {
            let peer_label = peer.to_string();
            let age = metrics.value("keel_peer_ping_age_seconds", &[("node_id", &peer_label)]);
            assert!(age.is_some(), "node {id} has no ping from node {peer}");
        }
    }
    cluster.shutdown().await;
}
