//! Range partitioning on a real 3-node cluster, through `keel-client`: splits under concurrent
//! writes and reads lose, duplicate and reorder nothing acknowledged; a scan over many ranges
//! equals the scan of one range; a client whose range table went stale still gets correct
//! answers; the range table covers the keyspace with no gap.

use std::collections::BTreeMap;

use keel_client::{Client, PutOptions};
use keel_types::{Consistency, KeyValue, KvError};

use crate::harness::Cluster;

/// Every row of `[start, end)`, paging `limit` rows at a time.
async fn scan_all(client: &Client, start: &[u8], end: &[u8], limit: u32) -> Vec<KeyValue> {
    let mut rows = Vec::new();
    let mut next = start.to_vec();
    for _ in 0..10_000 {
        let page = client
            .scan(&next, end, limit, Consistency::Linearizable)
            .await
            .unwrap();
        rows.extend(page.kvs);
        match page.next_start {
            Some(start) => next = start,
            None => return rows,
        }
    }
    panic!("the scan of {start:?}..{end:?} did not end after 10,000 pages");
}

fn key(i: usize) -> Vec<u8> {
    format!("k{i:04}").into_bytes()
}

async fn put(client: &Client, key: &[u8], value: &[u8]) -> Result<(), KvError> {
    client
        .put(key, value, PutOptions::default())
        .await
        .map(|_| ())
}

/// Splits at each of `keys` in turn and returns how many ranges the table then lists.
async fn split_at(client: &Client, keys: &[Vec<u8>]) -> usize {
    for at in keys {
        let (left, right) = client.split(at).await.unwrap();
        assert_eq!(left.end.as_deref(), Some(at.as_slice()), "{left}");
        assert_eq!(right.start, *at, "{right}");
        assert!(right.epoch > 0 && left.epoch == right.epoch);
    }
    client.ranges().await.unwrap().len()
}

/// Checks that the table's spans follow each other from the empty key to the unbounded end.
fn assert_covers_keyspace(client_ranges: &[keel_client::RangeInfo]) {
    let mut expected_start: Vec<u8> = Vec::new();
    for (index, range) in client_ranges.iter().enumerate() {
        let descriptor = &range.descriptor;
        assert_eq!(
            descriptor.start, expected_start,
            "gap or overlap before {descriptor}"
        );
        match &descriptor.end {
            Some(end) => expected_start = end.clone(),
            None => assert_eq!(index + 1, client_ranges.len(), "{descriptor} ends early"),
        }
    }
    assert!(client_ranges.last().unwrap().descriptor.end.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn splits_under_concurrent_writes_lose_nothing_acknowledged() {
    let cluster = Cluster::start(3).await;
    const WRITERS: usize = 3;
    const KEYS_PER_WRITER: usize = 40;
    const ROUNDS: usize = 4;
    // Each writer owns its keys and writes them round after round, so the last acknowledged
    // value of a key is the one every later read must return (or a newer one whose answer was
    // lost).
    let mut writers = Vec::new();
    for writer in 0..WRITERS {
        let client = cluster.client();
        writers.push(tokio::spawn(async move {
            let mut last: BTreeMap<Vec<u8>, (usize, bool)> = BTreeMap::new();
            for round in 0..ROUNDS {
                for i in 0..KEYS_PER_WRITER {
                    let key = key(writer * KEYS_PER_WRITER + i);
                    let value = format!("{round}").into_bytes();
                    let acked = put(&client, &key, &value).await.is_ok();
                    last.insert(key, (round, acked));
                }
            }
            last
        }));
    }
    // A reader reads keys at the split points while the splits happen: a key's value never
    // goes back.
    let reader = {
        let client = cluster.client();
        tokio::spawn(async move {
            let mut seen: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
            for _ in 0..60 {
                for i in [20, 40, 60, 80, 100] {
                    let key = key(i);
                    let Ok(got) = client.get(&key, Consistency::Linearizable).await else {
                        continue;
                    };
                    let value = got.kv.map(|kv| kv.value).unwrap_or_default();
                    if let Some(before) = seen.get(&key) {
                        assert!(
                            value >= *before,
                            "{key:?} went back from {before:?} to {value:?}"
                        );
                    }
                    seen.insert(key, value);
                }
            }
        })
    };
    let splitter = cluster.client();
    let points: Vec<Vec<u8>> = [20, 40, 60, 80, 100].into_iter().map(key).collect();
    assert_eq!(split_at(&splitter, &points).await, 6);
    reader.await.unwrap();
    let check = cluster.client();
    for writer in writers {
        for (key, (round, acked)) in writer.await.unwrap() {
            let got = check.get(&key, Consistency::Linearizable).await.unwrap();
            let value = got.kv.expect("every key was written").value;
            let value: usize = String::from_utf8(value).unwrap().parse().unwrap();
            if acked {
                assert_eq!(
                    value, round,
                    "{key:?}: last acknowledged write was round {round}"
                );
            } else {
                assert!(
                    value + 1 >= round,
                    "{key:?}: {value} is older than round {round} - 1"
                );
            }
        }
    }
    let ranges = check.ranges().await.unwrap();
    assert_covers_keyspace(&ranges);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scan_over_many_ranges_equals_the_single_range_scan() {
    let cluster = Cluster::start(3).await;
    let client = cluster.client();
    for i in 0..240 {
        put(&client, &key(i), format!("v{i}").as_bytes())
            .await
            .unwrap();
    }
    let reference = scan_all(&client, b"", b"", 1_000).await;
    assert_eq!(reference.len(), 240);
    let points: Vec<Vec<u8>> = (1..12).map(|i| key(i * 20 + 3)).collect();
    assert_eq!(split_at(&client, &points).await, 12);
    for limit in [1_000, 7, 1] {
        let rows = scan_all(&client, b"", b"", limit).await;
        assert_eq!(rows, reference, "page limit {limit}");
    }
    // A span that starts and ends inside ranges, across several boundaries.
    let inner = scan_all(&client, &key(17), &key(131), 9).await;
    assert_eq!(inner, reference[17..131].to_vec());
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_with_a_stale_range_table_gets_correct_answers() {
    let cluster = Cluster::start(3).await;
    let stale = cluster.client();
    for i in 0..50 {
        put(&stale, &key(i), b"before").await.unwrap();
    }
    // The stale client has loaded the one-range table; another client splits twice.
    let splitter = cluster.client();
    assert_eq!(split_at(&splitter, &[key(10), key(30)]).await, 3);
    for i in [5, 10, 29, 30, 49] {
        let got = stale.get(&key(i), Consistency::Linearizable).await.unwrap();
        assert_eq!(got.kv.unwrap().value, b"before", "key {i}");
        put(&stale, &key(i), b"after").await.unwrap();
        let got = splitter
            .get(&key(i), Consistency::Linearizable)
            .await
            .unwrap();
        assert_eq!(got.kv.unwrap().value, b"after", "key {i}");
    }
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_at_a_range_start_answers_the_existing_halves_and_changes_nothing() {
    let cluster = Cluster::start(3).await;
    let client = cluster.client();
    assert_eq!(split_at(&client, &[key(10)]).await, 2);
    let before = client.ranges().await.unwrap();
    // A retried split (its answer was lost) finds the split done and answers it again.
    let (left, right) = client.split(&key(10)).await.unwrap();
    assert_eq!(left.end.as_deref(), Some(key(10).as_slice()));
    assert_eq!(right.start, key(10));
    let after = client.ranges().await.unwrap();
    let descriptors = |ranges: &[keel_client::RangeInfo]| -> Vec<_> {
        ranges
            .iter()
            .map(|range| range.descriptor.clone())
            .collect()
    };
    assert_eq!(descriptors(&after), descriptors(&before));
    cluster.shutdown().await;
}

/// Splits at one key sent at once (a client's retry while its first attempt still runs)
/// make one split, and every one of them is answered with its two halves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_splits_at_one_key_all_answer_the_one_split() {
    let cluster = Cluster::start(3).await;
    let client = cluster.client();
    let at = key(10);
    let splits = (0..8).map(|_| client.split(&at));
    let answers = futures::future::join_all(splits).await;
    let mut halves = Vec::new();
    for answer in answers {
        let (left, right) = answer.unwrap();
        assert_eq!(left.end.as_deref(), Some(key(10).as_slice()));
        assert_eq!(right.start, key(10));
        halves.push((left.id, right.id));
    }
    halves.dedup();
    assert_eq!(halves.len(), 1, "one split made: {halves:?}");
    assert_eq!(client.ranges().await.unwrap().len(), 2);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_range_table_counts_keys_from_a_replica_of_the_answering_node() {
    let cluster = Cluster::start(3).await;
    let client = cluster.client();
    split_at(&client, &[key(50)]).await;
    for i in 0..80 {
        put(&client, &key(i), b"twelve bytes").await.unwrap();
    }
    // Every node hosts both ranges, so the counts are read from a replica, never from a
    // leader's report (age zero), and they reach the writes as soon as it applied them.
    let counted = crate::harness::eventually("the table counts every key written", || async {
        let ranges = client.ranges().await.ok()?;
        let keys: Vec<u64> = ranges.iter().map(|range| range.keys).collect();
        (keys == [50, 30]).then_some(ranges)
    })
    .await;
    for range in &counted {
        assert!(range.counts_age.is_zero(), "{range:?}");
        assert_eq!(range.size_bytes, range.keys * (5 + 12), "{range:?}");
    }
    cluster.shutdown().await;
}
