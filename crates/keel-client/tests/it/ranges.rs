//! Routing by range against a fake cluster of ranges: each request goes to the leader of its
//! key's range; hints move one range's leader; a stale table is refreshed after
//! `KeyOutOfRange`, after `NotLeader` naming another range, and after an answer from another
//! range; concurrent refusals share one refresh; a cluster without `Cluster.Ranges` is served
//! as before; `ranges` and `split`.

use std::sync::Arc;
use std::time::Duration;

use keel_client::{AcquireOptions, Client, ClientOptions, PutOptions};
use keel_types::{Consistency, KvError, RangeId};

use crate::fake::Fake;
use crate::routing::client;

/// Default options, but the range table may be fetched again at once: tests that count
/// fetches after a suspicion do not depend on how much time passed.
pub fn eager() -> ClientOptions {
    ClientOptions {
        range_refresh_interval: Duration::ZERO,
        ..ClientOptions::default()
    }
}

async fn put(client: &Client, key: &[u8]) {
    client.put(key, b"v", PutOptions::default()).await.unwrap();
}

fn puts_at(nodes: &[u64]) -> Vec<(&'static str, u64)> {
    nodes.iter().map(|&node| ("put", node)).collect()
}

#[tokio::test]
async fn requests_go_to_the_leader_of_their_keys_range() {
    // ["", "g") led by node 1, ["g", "p") by node 2, ["p", +inf) by node 3.
    let (fake, addrs) = Fake::cluster(3, &[b"g", b"p"]).await;
    let client = client(&addrs[..1], ClientOptions::default());

    for key in [b"a", b"h", b"q", b"g"] {
        put(&client, key).await;
    }
    let got = client.get(b"q", Consistency::Linearizable).await.unwrap();
    assert_eq!((got.served_by, got.kv.unwrap().value), (3, b"v".to_vec()));
    let mut expected = puts_at(&[1, 2, 3, 2]);
    expected.push(("get", 3));
    assert_eq!(fake.node_calls(), expected, "no request went astray");
    assert_eq!(fake.ranges_calls(), 1, "the table is fetched once, lazily");
}

#[tokio::test]
async fn a_not_leader_hint_moves_only_its_ranges_leader() {
    let (fake, addrs) = Fake::cluster(3, &[b"g", b"p"]).await;
    let client = client(&addrs, ClientOptions::default());
    put(&client, b"h").await;
    fake.set_leader(2, 3);

    put(&client, b"h").await;
    put(&client, b"i").await;
    put(&client, b"a").await;
    // Node 2 names node 3; the next write of range 2 goes there at once; range 1 keeps node 1.
    assert_eq!(fake.node_calls(), puts_at(&[2, 2, 3, 3, 1]));
    assert_eq!(
        fake.ranges_calls(),
        1,
        "a hint for the same range needs no refresh"
    );
}

#[tokio::test]
async fn key_out_of_range_refreshes_the_table_and_retries_with_the_same_id() {
    // ["", "m") led by node 1, ["m", +inf) by node 2.
    let (fake, addrs) = Fake::cluster(2, &[b"m"]).await;
    let client = client(&addrs, ClientOptions::default());
    client.increment(b"a", 1).await.unwrap();
    // Range 1 splits at "f"; node 1 still routes "g" to range 1, which refuses it.
    fake.split_lagging(b"f", 1);

    let result = client.increment(b"g", 5).await.unwrap();
    assert_eq!((result.value, result.replayed), (6, false), "applied once");
    assert_eq!(fake.ranges_calls(), 2);
    let ids = fake.request_ids();
    assert_eq!(ids.len(), 3);
    assert_eq!(ids[1], ids[2], "the refused attempt's id is sent again");
    assert_eq!(fake.node_calls().len(), 3);
}

#[tokio::test]
async fn not_leader_for_another_range_refreshes_the_table() {
    let (fake, addrs) = Fake::cluster(2, &[b"m"]).await;
    let client = client(&addrs, ClientOptions::default());
    put(&client, b"a").await;
    // ["f", "m") splits off range 1 and is led by node 2.
    let (left, right) = fake.split(b"f", 2);
    assert_eq!((left.id, right.id), (RangeId(1), RangeId(3)));

    put(&client, b"g").await;
    // Node 1 says range 3 is led by node 2: another range than the table picked.
    assert_eq!(fake.node_calls(), puts_at(&[1, 1, 2]));
    assert_eq!(fake.ranges_calls(), 2);
    put(&client, b"h").await;
    assert_eq!(fake.node_calls().last(), Some(&("put", 2)));
    assert_eq!(fake.ranges_calls(), 2);
}

#[tokio::test]
async fn an_answer_from_another_range_refreshes_before_the_next_request() {
    let (fake, addrs) = Fake::cluster(2, &[b"m"]).await;
    let client = client(&addrs, eager());
    put(&client, b"a").await;
    // Node 1 leads both halves: it serves "g" from range 3 without a refusal.
    fake.split(b"f", 1);

    put(&client, b"g").await;
    assert_eq!(
        fake.ranges_calls(),
        1,
        "the answer was right; nothing to wait for"
    );
    client.get(b"a", Consistency::Linearizable).await.unwrap();
    assert_eq!(fake.ranges_calls(), 2, "refreshed before the next request");
    client.get(b"b", Consistency::Linearizable).await.unwrap();
    assert_eq!(fake.ranges_calls(), 2);
}

#[tokio::test]
async fn concurrent_requests_refused_by_one_split_share_one_refresh() {
    let (fake, addrs) = Fake::cluster(2, &[b"m"]).await;
    let client = client(&addrs, ClientOptions::default());
    put(&client, b"a").await;
    fake.split(b"f", 2);

    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..16 {
        let client = client.clone();
        tasks.spawn(async move { put(&client, format!("g{i:02}").as_bytes()).await });
    }
    tasks.join_all().await;
    assert_eq!(fake.ranges_calls(), 2, "one refresh for all sixteen");
    assert_eq!(fake.data().len(), 17);
}

#[tokio::test]
async fn a_cluster_without_ranges_is_served_as_one_range() {
    let fake = Fake::new(1, vec![]);
    let client = client(&[fake.serve().await.to_string()], ClientOptions::default());

    put(&client, b"a").await;
    put(&client, b"z").await;
    let batch = keel_types::BatchOp::Put {
        key: b"k".to_vec(),
        value: b"v".to_vec(),
        condition: None,
        return_previous: false,
        ttl_ms: None,
    };
    client.batch(vec![batch]).await.unwrap();
    let methods: Vec<&str> = fake.calls().iter().map(|(method, _)| *method).collect();
    assert_eq!(methods, ["put", "put", "batch"]);
    let error = client.ranges().await.unwrap_err();
    assert!(
        matches!(&error, KvError::Fatal { message } if message.contains("does not serve Cluster.Ranges")),
        "{error:?}"
    );
}

#[tokio::test]
async fn ranges_lists_the_table_and_split_returns_both_halves() {
    let (fake, addrs) = Fake::cluster(3, &[b"g"]).await;
    let client = client(&addrs, eager());
    for key in [b"a", b"b", b"h"] {
        put(&client, key).await;
    }

    let ranges = client.ranges().await.unwrap();
    let descriptors: Vec<_> = ranges.iter().map(|r| r.descriptor.clone()).collect();
    assert_eq!(descriptors, fake.descriptors());
    let load: Vec<_> = ranges
        .iter()
        .map(|r| (r.leader, r.keys, r.size_bytes))
        .collect();
    assert_eq!(load, [(Some(1), 2, 4), (Some(2), 1, 2)]);

    let (left, right) = client.split(b"c").await.unwrap();
    assert_eq!(
        (left.span_text(), left.epoch),
        (r#"["", "c")"#.to_string(), 2)
    );
    assert_eq!(
        (right.span_text(), right.id),
        (r#"["c", "g")"#.to_string(), RangeId(3))
    );
    // The split made the table stale: the next request refreshes it first.
    let calls = fake.ranges_calls();
    put(&client, b"d").await;
    assert_eq!(fake.ranges_calls(), calls + 1);

    let error = client.split(b"c").await.unwrap_err();
    assert!(matches!(error, KvError::EpochMismatch { .. }), "{error:?}");
    assert_eq!(client.ranges().await.unwrap().len(), 3);
    let error = client.split(b"").await.unwrap_err();
    assert!(
        matches!(error, KvError::InvalidArgument { .. }),
        "{error:?}"
    );
}

#[tokio::test]
async fn locks_and_idempotency_records_are_routed_by_their_keys() {
    let (fake, addrs) = Fake::cluster(2, &[b"m"]).await;
    let client = client(&addrs, ClientOptions::default());
    let options = AcquireOptions {
        ttl: Duration::from_secs(10),
        ..AcquireOptions::default()
    };

    let held = client.acquire(b"z-lock", options).await.unwrap();
    assert!(held.acquired);
    client
        .inspect(b"z-lock", Consistency::Linearizable)
        .await
        .unwrap();
    // Scope "a": the record's key, "a\0o-1", lies in range 1.
    let ttl = Duration::from_secs(10);
    client.begin(b"a", b"o-1", None, ttl).await.unwrap();
    let expected = [("acquire", 2), ("inspect", 2), ("begin", 1)];
    assert_eq!(fake.node_calls(), expected);
}

/// A client shared by tasks keeps one table.
#[tokio::test]
async fn clones_share_the_range_table() {
    let (fake, addrs) = Fake::cluster(2, &[b"m"]).await;
    let client = Arc::new(client(&addrs, ClientOptions::default()));
    put(&client, b"a").await;
    put(&client.as_ref().clone(), b"z").await;
    assert_eq!(fake.ranges_calls(), 1);
    assert_eq!(fake.node_calls(), puts_at(&[1, 2]));
}
