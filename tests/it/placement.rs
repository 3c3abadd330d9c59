//! Growing, shrinking and healing a real in-process cluster: a node that joins takes its share
//! of replicas and leaders; a node that stays dead past the timeout has its replicas
//! re-created elsewhere; a drained node ends with nothing. After each, every range has 3
//! voters on distinct nodes and every acknowledged write reads back. A node back from a
//! restart reports ready only once the leaders settled, and a node started after the
//! rebalancer's look does not wait for its next one.

use std::collections::BTreeMap;
use std::time::Duration;

use keel_client::{Client, PutOptions};
use keel_proto::v1::{MembersResponse, StatusResponse};
use keel_server::PlacementSettings;
use keel_types::limits::LEADERS_SETTLE_WAIT_MAX_MS;
use keel_types::{Consistency, NodeId, RangeId};

use tonic_health::pb::health_check_response::ServingStatus;

use crate::harness::{Cluster, eventually_within};
use crate::observability::health_of;

/// How long a test waits for the rebalancer: each move sends a snapshot and makes two
/// membership changes, a few at a time, on two busy cores. Alone, the healing test takes
/// about 10 s; beside the rest of the suite in a fresh CI clone it once took more than 90.
const MOVES_LIMIT: Duration = Duration::from_secs(240);

/// Fast healing for tests: a node is dead after 3 s without a heartbeat.
fn placement() -> PlacementSettings {
    PlacementSettings {
        node_dead_after_ms: 3_000,
        rebalance_interval_ms: 200,
        ..PlacementSettings::default()
    }
}

fn key(i: usize) -> Vec<u8> {
    format!("k{i:03}").into_bytes()
}

/// Splits the keyspace into 8 ranges and writes 80 keys over them; returns the keys' values.
async fn fill(client: &Client) -> BTreeMap<Vec<u8>, Vec<u8>> {
    for at in [10, 20, 30, 40, 50, 60, 70] {
        client.split(&key(at)).await.unwrap();
    }
    let mut written = BTreeMap::new();
    for i in 0..80 {
        let value = format!("v{i}").into_bytes();
        client
            .put(&key(i), &value, PutOptions::default())
            .await
            .unwrap();
        written.insert(key(i), value);
    }
    written
}

/// Every key reads back its value, linearizably.
async fn check_data(client: &Client, written: &BTreeMap<Vec<u8>, Vec<u8>>) {
    for (key, value) in written {
        let got = client.get(key, Consistency::Linearizable).await.unwrap();
        assert_eq!(got.kv.map(|kv| kv.value).as_ref(), Some(value), "{key:?}");
    }
}

/// Waits until the members list satisfies `done`, and returns it.
async fn members_until(
    client: &Client,
    what: &str,
    done: impl Fn(&MembersResponse) -> bool,
) -> MembersResponse {
    eventually_within(MOVES_LIMIT, what, || async {
        let members = client.members().await.ok()?;
        done(&members).then_some(members)
    })
    .await
}

/// Whether every range (the meta range too) has exactly 3 voters, all on `nodes`, and a
/// leader among them.
async fn replicated_on(client: &Client, nodes: &[NodeId]) -> bool {
    let Ok(ranges) = client.ranges().await else {
        return false;
    };
    ranges.iter().all(|range| {
        let voters = &range.descriptor.replicas;
        voters.len() == 3
            && voters.iter().all(|voter| nodes.contains(voter))
            && range.leader.is_some_and(|leader| voters.contains(&leader))
    })
}

/// Counts per node: (replicas, leaders) of the nodes in `nodes`.
fn counts(members: &MembersResponse, nodes: &[NodeId]) -> Vec<(u64, u64)> {
    let of = |id: &NodeId| members.nodes.iter().find(|node| node.node_id == *id);
    nodes
        .iter()
        .map(|id| of(id).map_or((0, 0), |node| (node.replicas, node.leaders)))
        .collect()
}

/// Whether the largest and smallest of `values` differ by at most one.
fn even(values: impl Iterator<Item = u64> + Clone) -> bool {
    let max = values.clone().max().unwrap_or(0);
    let min = values.min().unwrap_or(0);
    max - min <= 1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_joined_node_takes_an_even_share_of_replicas_and_leaders() {
    let mut cluster = Cluster::start_placed(3, placement()).await;
    let client = cluster.client();
    let written = fill(&client).await;

    cluster.join_node(4).await;
    let nodes = [1, 2, 3, 4];
    let members = members_until(&client, "node 4 takes replicas and leaders evenly", |m| {
        let counts = counts(m, &nodes);
        let live = m.nodes.iter().all(|node| node.liveness == "live");
        // Every range (8 and the meta range) has its 3 voters and its leader counted.
        let whole = counts.iter().map(|c| c.0).sum::<u64>() == 27
            && counts.iter().map(|c| c.1).sum::<u64>() == 9;
        live && whole && even(counts.iter().map(|c| c.0)) && even(counts.iter().map(|c| c.1))
    })
    .await;
    let node4 = &members.nodes.iter().find(|n| n.node_id == 4).unwrap();
    // 9 ranges x 3 voters over 4 nodes: 6 or 7 each; 9 leaders: 2 or 3 each.
    assert!(node4.replicas >= 6, "{members:?}");
    assert!(node4.leaders >= 2, "{members:?}");
    eventually_within(MOVES_LIMIT, "every range has 3 voters", || async {
        replicated_on(&client, &nodes).await.then_some(())
    })
    .await;
    check_data(&client, &written).await;
    // A client that knows only the new node reaches every key through it.
    check_data(&cluster.client_of(4), &written).await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_dead_past_the_timeout_has_its_replicas_recreated() {
    let mut cluster = Cluster::start_placed(3, placement()).await;
    let client = cluster.client();
    let written = fill(&client).await;
    cluster.join_node(4).await;
    members_until(&client, "node 4 holds replicas", |m| {
        counts(m, &[4])[0].0 >= 6
    })
    .await;

    cluster.stop_node(2).await;
    let alive = [1, 3, 4];
    let members = members_until(&client, "node 2 is dead and holds nothing", |m| {
        let dead = m
            .nodes
            .iter()
            .any(|node| node.node_id == 2 && node.liveness == "dead");
        dead && counts(m, &[2])[0] == (0, 0)
    })
    .await;
    assert!(
        counts(&members, &alive).iter().all(|c| c.0 == 9),
        "{members:?}"
    );
    eventually_within(
        MOVES_LIMIT,
        "every range is back to 3 voters on live nodes",
        || async { replicated_on(&client, &alive).await.then_some(()) },
    )
    .await;
    check_data(&client, &written).await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_node_is_drained_of_every_replica_and_leader() {
    let mut cluster = Cluster::start_placed(3, placement()).await;
    let client = cluster.client();
    let written = fill(&client).await;
    // With 3 nodes, none may go: the ranges need 3.
    let refused = client.remove_node(3).await.unwrap_err();
    assert!(
        refused.to_string().contains("would leave 2 active nodes"),
        "{refused}"
    );
    cluster.join_node(4).await;
    members_until(&client, "node 4 holds replicas", |m| {
        counts(m, &[4])[0].0 >= 6
    })
    .await;

    client.remove_node(1).await.unwrap();
    let drained = [2, 3, 4];
    members_until(&client, "node 1 is drained and removed", |m| {
        let gone = m
            .nodes
            .iter()
            .all(|node| node.node_id != 1 || node.state == "removed");
        gone && counts(m, &drained).iter().all(|c| c.0 == 9)
    })
    .await;
    eventually_within(
        MOVES_LIMIT,
        "every range has 3 voters on the others",
        || async { replicated_on(&client, &drained).await.then_some(()) },
    )
    .await;
    check_data(&client, &written).await;
    // A removed node may not come back under its id.
    let again = client.add_node(1, &cluster.endpoint(1)).await.unwrap_err();
    assert!(again.to_string().contains("was removed"), "{again}");
    // It holds no replica any more, and stopping it changes nothing.
    eventually_within(MOVES_LIMIT, "node 1 removed its replicas", || async {
        let status = client.status(&cluster.endpoint(1)).await.ok()?;
        status.ranges.is_empty().then_some(())
    })
    .await;
    cluster.stop_node(1).await;
    check_data(
        &Client::new(
            drained.iter().map(|id| cluster.endpoint(*id)).collect(),
            Default::default(),
        )
        .unwrap(),
        &written,
    )
    .await;
    cluster.shutdown().await;
}

/// The data ranges `node` leads, as the meta range's leader reports them.
async fn data_ranges_led_by(client: &Client, node: NodeId) -> Option<usize> {
    let ranges = client.ranges().await.ok()?;
    let data = ranges.iter().filter(|r| r.descriptor.id != RangeId::META);
    Some(data.filter(|r| r.leader == Some(node)).count())
}

/// Whether node `id`'s own status names it the leader of a data range.
fn leads_a_data_range(status: &StatusResponse) -> bool {
    let data = status
        .ranges
        .iter()
        .filter(|r| r.range_id != RangeId::META.0);
    data.into_iter().any(|range| range.role == "leader")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_node_reports_ready_only_once_it_leads_its_share_again() {
    // The default dead timeout: node 3 stays a live replica holder while it is down.
    let placement = PlacementSettings {
        rebalance_interval_ms: 200,
        ..PlacementSettings::default()
    };
    let mut cluster = Cluster::start_placed(3, placement).await;
    let client = cluster.client();
    for at in [10, 20] {
        client.split(&key(at)).await.unwrap();
    }
    eventually_within(MOVES_LIMIT, "node 3 leads a data range", || async {
        (data_ranges_led_by(&client, 3).await? >= 1).then_some(())
    })
    .await;

    cluster.stop_node(3).await;
    eventually_within(MOVES_LIMIT, "node 3's leaderships moved", || async {
        (data_ranges_led_by(&client, 3).await? == 0).then_some(())
    })
    .await;
    cluster.start_node(3).await;

    // The first time node 3 reports ready (`Cluster.Status.ready`, or SERVING for the
    // `keel.raft.v1.Raft` health service that Kubernetes' probes ask), it must lead a data
    // range again: 3 ranges over 3 nodes, the rebalancer hands it one. Its status is read
    // after the health service, so it cannot predate it.
    let raft = "keel.raft.v1.Raft";
    let status = eventually_within(MOVES_LIMIT, "node 3 reports ready", || async {
        let serving = health_of(&cluster, 3, raft).await == Some(ServingStatus::Serving);
        let status = cluster.status(3).await;
        (serving || status.ready).then_some(status)
    })
    .await;
    assert!(
        leads_a_data_range(&status),
        "node 3 reported ready before the leaders settled: {status:?}"
    );
    cluster.shutdown().await;
}

/// The meta leader judges whether the leaders settled between the rebalancer's looks too: a
/// node it first hears from after a look reports ready without waiting for the next look,
/// here a minute away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_started_after_the_rebalancers_look_reports_ready_without_waiting_for_the_next() {
    let placement = PlacementSettings {
        rebalance_interval_ms: 60_000,
        ..PlacementSettings::default()
    };
    let mut cluster = Cluster::start_placed_without(3, placement, 3).await;
    eventually_within(MOVES_LIMIT, "nodes 1 and 2 report ready", || async {
        let ready = cluster.status(1).await.ready && cluster.status(2).await.ready;
        ready.then_some(())
    })
    .await;

    // Node 3 was not heard from at the look that let nodes 1 and 2 report ready. Left to
    // the wait's end, it would report ready `LEADERS_SETTLE_WAIT_MAX_MS` after its start:
    // half of that is the bound that tells a judgement heard from the wait running out.
    cluster.start_node(3).await;
    let limit = Duration::from_millis(LEADERS_SETTLE_WAIT_MAX_MS / 2);
    eventually_within(limit, "node 3 hears the leaders settled", || async {
        cluster.status(3).await.ready.then_some(())
    })
    .await;
    cluster.shutdown().await;
}
