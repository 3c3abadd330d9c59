//! Ranges on a three-node cluster, through the raw gRPC services: `Cluster.Split` and both
//! halves serving, requests routed on a stale range table, scans paging across the split,
//! `Cluster.Ranges`, splits under concurrent writes, restarts after splits, a lagging replica
//! that gets a split-off range by snapshot, and a lock (with a waiter) moved by a split.

use std::collections::BTreeMap;
use std::time::Duration;

use keel_proto::v1::lock_client::LockClient;
use keel_proto::v1::{
    AcquireRequest, Consistency, GetRequest, GetResponse, KeyValue, PutRequest, PutResponse,
    RangeDescriptor, RangesRequest, RangesResponse, ReleaseRequest, RenewRequest, ScanRequest,
    SplitRequest,
};
use keel_server::RaftTimings;
use keel_server::status;
use keel_types::{KvError, NodeId, RangeId};
use tonic::{Code, Status};

use crate::harness::{Cluster, eventually, quick_timings};

fn key(i: usize) -> Vec<u8> {
    format!("k{i:02}").into_bytes()
}

fn put_request(key: &[u8], value: &[u8]) -> PutRequest {
    PutRequest {
        key: key.to_vec(),
        value: value.to_vec(),
        condition: None,
        return_previous: false,
        no_forward: false,
        ttl_ms: None,
        request_id: None,
        fence: None,
    }
}

fn get_request(key: &[u8], consistency: Consistency) -> GetRequest {
    GetRequest {
        key: key.to_vec(),
        consistency: consistency.into(),
        no_forward: false,
        ..GetRequest::default()
    }
}

async fn try_put(
    cluster: &Cluster,
    via: NodeId,
    key: &[u8],
    value: &[u8],
) -> Result<PutResponse, Status> {
    let put = cluster.kv(via).await.put(put_request(key, value)).await;
    let response = put?.into_inner();
    let header = response.header.unwrap();
    assert_ne!(
        header.range_id,
        RangeId::META.0,
        "the meta range served a user key"
    );
    Ok(response)
}

/// Puts `value` (the same value again after an error: the test's writes are idempotent).
async fn put(cluster: &Cluster, via: NodeId, key: &[u8], value: &[u8]) -> PutResponse {
    eventually("an acknowledged put", || async {
        try_put(cluster, via, key, value).await.ok()
    })
    .await
}

async fn get(cluster: &Cluster, via: NodeId, key: &[u8], consistency: Consistency) -> GetResponse {
    eventually("a served get", || async {
        let request = get_request(key, consistency);
        let response = cluster.kv(via).await.get(request).await.ok()?.into_inner();
        let header = response.header.unwrap();
        assert_ne!(
            header.range_id,
            RangeId::META.0,
            "the meta range served a user key"
        );
        Some(response)
    })
    .await
}

/// Splits at `at` through node `via`.
async fn split(cluster: &Cluster, via: NodeId, at: &[u8]) -> (RangeDescriptor, RangeDescriptor) {
    eventually("a split", || async {
        let request = SplitRequest {
            at: at.to_vec(),
            no_forward: false,
        };
        let answer = cluster.cluster_client(via).await.split(request).await;
        let response = answer.ok()?.into_inner();
        Some((response.left.unwrap(), response.right.unwrap()))
    })
    .await
}

async fn ranges(cluster: &Cluster, via: NodeId) -> RangesResponse {
    eventually("the range table", || async {
        let request = RangesRequest { no_forward: false };
        let answer = cluster.cluster_client(via).await.ranges(request).await;
        Some(answer.ok()?.into_inner())
    })
    .await
}

/// Every row of the keyspace, paging `limit` rows at a time through `via`, and the
/// `next_start` of every page that had one.
async fn scan_all(cluster: &Cluster, via: NodeId, limit: u32) -> (Vec<KeyValue>, Vec<Vec<u8>>) {
    let mut rows = Vec::new();
    let mut starts = Vec::new();
    let mut start = Vec::new();
    for _ in 0..1_000 {
        let page = eventually("a scan page", || async {
            let request = ScanRequest {
                start: start.clone(),
                end: Vec::new(),
                limit,
                consistency: Consistency::Linearizable.into(),
                no_forward: false,
                ..ScanRequest::default()
            };
            Some(cluster.kv(via).await.scan(request).await.ok()?.into_inner())
        })
        .await;
        assert_ne!(page.header.unwrap().range_id, RangeId::META.0);
        rows.extend(page.kvs);
        if !page.more {
            return (rows, starts);
        }
        starts.push(page.next_start.clone());
        start = page.next_start;
    }
    panic!("the scan did not end after 1,000 pages");
}

fn range_id(response: &PutResponse) -> u64 {
    response.header.as_ref().unwrap().range_id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_serves_both_halves_and_routes_stale_requests_again() {
    let cluster = Cluster::start_with(3, quick_timings()).await;
    let leader = cluster.leader().await;
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    let mut before = 0;
    for i in 0..40 {
        let written = put(&cluster, follower, &key(i), b"v1").await;
        before = before.max(written.header.unwrap().revision);
    }
    let unsplit = cluster.node(leader).local_ranges();
    assert_eq!(unsplit.len(), 1, "{unsplit:?}");

    let (left, right) = split(&cluster, follower, &key(20)).await;
    assert_eq!((left.range_id, left.start.as_slice()), (1, &b""[..]));
    assert_eq!(left.end.as_deref(), Some(key(20).as_slice()));
    assert_eq!((right.start.clone(), right.end.clone()), (key(20), None));
    assert!(right.range_id > 1);
    assert_eq!(left.epoch, right.epoch);
    let (again_left, again_right) = split(&cluster, leader, &key(20)).await;
    assert_eq!(
        (again_left.range_id, again_right.range_id),
        (left.range_id, right.range_id),
        "a repeated split names the halves the first one made"
    );

    for via in 1..=3 {
        assert_eq!(range_id(&put(&cluster, via, &key(5), b"v2").await), 1);
        let written = put(&cluster, via, &key(25), b"v2").await;
        assert_eq!(range_id(&written), right.range_id);
        assert!(
            written.header.unwrap().revision > before,
            "a child's revision is above every revision before the split"
        );
    }

    // A node whose table still says the first range holds everything: the first range
    // refuses the child's key, and the node routes the request again.
    let parent_leader = cluster.leader_of(RangeId::FIRST).await;
    cluster
        .node(parent_leader)
        .set_local_ranges(unsplit.clone());
    // One attempt each: the node's table stays stale until its watcher's next round.
    let written = try_put(&cluster, parent_leader, &key(30), b"v3").await;
    assert_eq!(range_id(&written.unwrap()), right.range_id);
    cluster.node(parent_leader).set_local_ranges(unsplit);
    let request = get_request(&key(31), Consistency::Linearizable);
    let read = cluster.kv(parent_leader).await.get(request).await;
    let read = read.unwrap().into_inner();
    assert_eq!(read.kv.unwrap().value, b"v1");
    assert_eq!(read.header.unwrap().range_id, right.range_id);

    let (rows, starts) = scan_all(&cluster, follower, 7).await;
    let keys: Vec<Vec<u8>> = rows.iter().map(|kv| kv.key.clone()).collect();
    assert_eq!(keys, (0..40).map(key).collect::<Vec<_>>());
    assert!(
        starts.contains(&key(20)),
        "a page ends at the first range's end: {starts:?}"
    );

    let table = eventually("both ranges with leaders", || async {
        let table = ranges(&cluster, follower).await;
        let led = table.ranges.iter().all(|range| range.leader_id.is_some());
        (table.ranges.len() == 2 && led).then_some(table)
    })
    .await;
    let listed: Vec<RangeDescriptor> = table
        .ranges
        .into_iter()
        .map(|range| range.descriptor.unwrap())
        .collect();
    assert_eq!(listed, vec![left, right]);
    assert!(table.meta_leader_id > 0);
    assert_eq!(table.nodes.len(), 3);
    for id in 1..=3 {
        let meta = cluster.range_status_of(id, RangeId::META).await.unwrap();
        assert_eq!(meta.keys, 0, "the meta range holds no user key");
    }
    cluster.shutdown().await;
}

/// What one writer saw of each of its keys: the last round acknowledged and the last round
/// whose write may have been applied.
type Seen = BTreeMap<Vec<u8>, (u64, u64)>;

/// Writes `keys` round after round through `via`. A write that certainly failed is retried;
/// one whose outcome is unknown may or may not count.
async fn write_rounds(cluster: &Cluster, via: NodeId, keys: Vec<Vec<u8>>, rounds: u64) -> Seen {
    let mut seen = Seen::new();
    for round in 1..=rounds {
        for key in &keys {
            let value = round.to_string().into_bytes();
            for _ in 0..200 {
                match try_put(cluster, via, key, &value).await {
                    Ok(_) => {
                        seen.insert(key.clone(), (round, round));
                        break;
                    }
                    Err(status) if applied_maybe(&status) => {
                        seen.entry(key.clone()).or_default().1 = round;
                    }
                    Err(_) => {}
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
    seen
}

/// Whether a failed write may have been applied.
fn applied_maybe(status: &Status) -> bool {
    match status::kv_error(status) {
        Some(KvError::OutcomeUnknown { .. } | KvError::Timeout { .. }) => true,
        Some(_) => false,
        None => !matches!(status.code(), Code::Unavailable),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn splits_under_concurrent_writes_lose_no_acknowledged_write() {
    const WRITERS: u64 = 3;
    const KEYS: usize = 8;
    const ROUNDS: u64 = 10;
    let cluster = std::sync::Arc::new(Cluster::start_with(3, quick_timings()).await);
    cluster.leader().await;
    let mut writers = Vec::new();
    for writer in 0..WRITERS {
        let cluster = cluster.clone();
        let keys = (0..KEYS)
            .map(|i| format!("w{writer}-{i:02}").into_bytes())
            .collect();
        writers.push(tokio::spawn(async move {
            write_rounds(&cluster, writer % 3 + 1, keys, ROUNDS).await
        }));
    }
    let split_keys = ["w0-04", "w1-00", "w2-04"];
    for (via, at) in (1..=3).zip(split_keys) {
        split(&cluster, via, at.as_bytes()).await;
    }
    let mut seen = Seen::new();
    for writer in writers {
        seen.extend(writer.await.unwrap());
    }
    assert_eq!(seen.len(), WRITERS as usize * KEYS);
    for (key, (acknowledged, attempted)) in seen {
        let read = get(&cluster, 1, &key, Consistency::Linearizable).await;
        let value = read.kv.expect("every key was written").value;
        let round: u64 = String::from_utf8(value).unwrap().parse().unwrap();
        assert!(
            (acknowledged..=attempted.max(acknowledged)).contains(&round),
            "key {key:?} reads round {round}; acknowledged {acknowledged}, attempted {attempted}"
        );
        assert_eq!(
            acknowledged, ROUNDS,
            "every round was acknowledged in the end"
        );
    }
    assert_eq!(ranges(&cluster, 2).await.ranges.len(), 4);
    std::sync::Arc::into_inner(cluster)
        .unwrap()
        .shutdown()
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restarted_after_splits_comes_back_with_all_its_ranges() {
    let mut cluster = Cluster::start_with(3, quick_timings()).await;
    cluster.leader().await;
    let (_, middle) = split(&cluster, 1, b"g").await;
    let (_, last) = split(&cluster, 2, b"p").await;
    let keys: [(&[u8], u64); 3] = [(b"a", 1), (b"h", middle.range_id), (b"q", last.range_id)];
    for (key, range) in keys {
        assert_eq!(range_id(&put(&cluster, 3, key, b"kept").await), range);
    }

    cluster.stop_node(3).await;
    cluster.start_node(3).await;
    let expected = [0, 1, middle.range_id, last.range_id];
    eventually("node 3 runs every range", || async {
        let status = cluster.status(3).await;
        let mut hosted: Vec<u64> = status.ranges.iter().map(|r| r.range_id).collect();
        hosted.sort_unstable();
        (hosted == expected).then_some(())
    })
    .await;
    for (key, range) in keys {
        eventually("node 3 serves the key from its own replica", || async {
            let read = get(&cluster, 3, key, Consistency::Follower).await;
            let header = read.header.unwrap();
            assert_eq!(header.served_by, 3);
            assert_eq!(header.range_id, range);
            read.kv.filter(|kv| kv.value == b"kept").map(|_| ())
        })
        .await;
    }

    let cluster = cluster.restart().await;
    for (key, range) in keys {
        let read = get(&cluster, 2, key, Consistency::Linearizable).await;
        assert_eq!(read.kv.unwrap().value, b"kept");
        assert_eq!(read.header.unwrap().range_id, range);
    }
    assert_eq!(ranges(&cluster, 3).await.ranges.len(), 3);
    cluster.shutdown().await;
}

/// A replica down through a split, with both halves' logs purged past it meanwhile, gets its
/// parent by snapshot (without the split entry) and the split-off range by snapshot too, once
/// its parent no longer overlaps it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lagging_replica_gets_a_split_off_range_by_snapshot() {
    const KEYS: usize = 40;
    let timings = RaftTimings {
        snapshot_logs_since_last: 20,
        logs_kept_after_snapshot: 0,
        ..quick_timings()
    };
    let mut cluster = Cluster::start_with(3, timings).await;
    let leader = cluster.leader().await;
    let lagging = (1..=3).find(|id| *id != leader).unwrap();
    let up = (1..=3).find(|id| *id != lagging).unwrap();
    cluster.stop_node(lagging).await;

    let (_, right) = split(&cluster, up, b"m").await;
    let child = RangeId(right.range_id);
    let split_index = cluster
        .range_status_of(up, RangeId::FIRST)
        .await
        .unwrap()
        .last_log_index;
    let value = vec![b'v'; 1024];
    for i in 0..KEYS {
        put(&cluster, up, format!("a{i:02}").as_bytes(), &value).await;
        put(&cluster, up, format!("n{i:02}").as_bytes(), &value).await;
    }
    eventually("both halves purge their logs past the split", || async {
        let parent = cluster.range_status_of(up, RangeId::FIRST).await?;
        let child = cluster.range_status_of(up, child).await?;
        (parent.purged_index > split_index && child.purged_index > 0).then_some(())
    })
    .await;

    cluster.start_node(lagging).await;
    let last = |prefix: char| format!("{prefix}{:02}", KEYS - 1).into_bytes();
    for (key, range) in [(last('a'), RangeId::FIRST), (last('n'), child)] {
        eventually("the lagging replica serves the key", || async {
            let read = get(&cluster, lagging, &key, Consistency::Follower).await;
            let header = read.header.unwrap();
            let local = header.served_by == lagging && header.range_id == range.0;
            (local && read.kv.is_some()).then_some(())
        })
        .await;
    }
    let status = cluster.range_status_of(lagging, child).await.unwrap();
    assert!(status.snapshot_index > 0, "{status:?}");
    cluster.shutdown().await;
}

fn acquire_request(name: &[u8], owner: &[u8], wait_ms: i64) -> AcquireRequest {
    AcquireRequest {
        name: name.to_vec(),
        owner: owner.to_vec(),
        ttl_ms: 60_000,
        wait_ms,
        lock_delay_ms: 0,
        request_id: None,
        no_forward: false,
    }
}

/// A lock moved to a new range by a split is renewed and released there, and an acquire
/// that waited for it on the old range's leader gets it from the new range.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_and_its_waiter_follow_the_lock_across_a_split() {
    let cluster = std::sync::Arc::new(Cluster::start_with(3, quick_timings()).await);
    let leader = cluster.leader().await;
    let lock = |id: NodeId| {
        let cluster = cluster.clone();
        async move {
            let addr = format!("http://{}", cluster.node(id).addr());
            LockClient::connect(addr).await.unwrap()
        }
    };
    let held = lock(leader)
        .await
        .acquire(acquire_request(b"lock-z", b"a", 0))
        .await
        .unwrap()
        .into_inner();
    assert!(held.acquired);
    let token = held.holder.unwrap().token;
    let mut waiter_client = lock(leader).await;
    // The waiter asks again after an error that says "not applied, retry" (the new range may
    // still be electing its leader when the waiter moves there).
    let waiter = tokio::spawn(async move {
        loop {
            let request = acquire_request(b"lock-z", b"b", 20_000);
            match waiter_client.acquire(request).await {
                Err(status) if status.code() == Code::Unavailable => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                answer => return answer,
            }
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;

    let (_, right) = split(&cluster, leader, b"lock-m").await;
    let renewed = eventually("a renew on the new range", || async {
        let request = RenewRequest {
            name: b"lock-z".to_vec(),
            token,
            ttl_ms: 60_000,
            request_id: None,
            no_forward: false,
        };
        Some(lock(leader).await.renew(request).await.ok()?.into_inner())
    })
    .await;
    assert_eq!(renewed.header.unwrap().range_id, right.range_id);
    let released = eventually("a release on the new range", || async {
        let request = ReleaseRequest {
            name: b"lock-z".to_vec(),
            token,
            request_id: None,
            no_forward: false,
        };
        Some(lock(leader).await.release(request).await.ok()?.into_inner())
    })
    .await;
    assert_eq!(released.header.unwrap().range_id, right.range_id);

    let granted = waiter.await.unwrap().unwrap().into_inner();
    assert!(granted.acquired, "{granted:?}");
    let holder = granted.holder.unwrap();
    assert_eq!(holder.owner, b"b");
    assert!(holder.token > token);
    assert_eq!(granted.header.unwrap().range_id, right.range_id);
    std::sync::Arc::into_inner(cluster)
        .unwrap()
        .shutdown()
        .await;
}

/// Three nodes that each hold the range: sustained load past the threshold does not split
/// it, since both halves would stay on the same three nodes as two Raft groups. The leader's
/// split driver declines and counts it (`keel_load_splits_declined_total`).
#[tokio::test]
async fn load_does_not_split_a_range_that_every_node_holds() {
    let mut kv = keel_server::KvSettings::default();
    kv.split.check_interval_ms = 50;
    kv.split.requests_per_sec_max = 1;
    kv.split.load_secs = 2;
    let faults = keel_server::Faults::default();
    let cluster = Cluster::start_configured(3, RaftTimings::default(), kv, faults).await;
    let client = cluster.client();
    let leader = cluster.leader().await;
    eventually("the leader declines a load split", || async {
        // A second of load on 20 keys, then the nodes' clocks move on by a second.
        for i in 0..20 {
            let options = keel_client::PutOptions::default();
            client.put(&key(i), b"v", options).await.ok()?;
        }
        cluster.advance_clocks_ms(1_000);
        let scrape = crate::observability::scrape(&cluster, leader).await;
        let declined = scrape.value("keel_load_splits_declined_total", &[])?;
        (declined > 0.0).then_some(())
    })
    .await;
    assert_eq!(client.ranges().await.unwrap().len(), 1);
    cluster.shutdown().await;
}
