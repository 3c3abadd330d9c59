//! Requests over many ranges against a fake cluster of ranges: scans page across range ends
//! and list exactly what one range would; an atomic batch whose keys lie in two ranges is
//! refused, before sending or once a refusal showed it applied nowhere; a non-atomic batch is
//! sent per range, re-split when a range splits under it, and answered in the caller's order.

use keel_client::{BatchOptions, Client, ClientOptions, PutOptions};
use keel_types::{BatchOp, Consistency, KeyValue, KvError};

use crate::fake::Fake;
use crate::routing::client;

fn key(i: usize) -> Vec<u8> {
    format!("k{i:04}").into_bytes()
}

/// Every row of `[start, end)`, following `next_start` `limit` rows at a time; also the
/// number of pages.
async fn scan_all(client: &Client, start: &[u8], end: &[u8], limit: u32) -> (Vec<KeyValue>, usize) {
    let mut rows = Vec::new();
    let mut next = start.to_vec();
    for pages in 1..=10_000 {
        let page = client
            .scan(&next, end, limit, Consistency::Linearizable)
            .await
            .unwrap();
        assert!(page.kvs.len() <= limit as usize);
        rows.extend(page.kvs);
        match page.next_start {
            Some(start) => next = start,
            None => return (rows, pages),
        }
    }
    panic!("the scan did not end after 10,000 pages");
}

/// (key, value) pairs of rows.
fn pairs(rows: &[KeyValue]) -> Vec<(Vec<u8>, Vec<u8>)> {
    rows.iter()
        .map(|kv| (kv.key.clone(), kv.value.clone()))
        .collect()
}

fn put(key: &[u8], value: &[u8]) -> BatchOp {
    BatchOp::Put {
        key: key.to_vec(),
        value: value.to_vec(),
        condition: None,
        return_previous: false,
        ttl_ms: None,
    }
}

fn increment(key: &[u8], delta: i64) -> BatchOp {
    BatchOp::Increment {
        key: key.to_vec(),
        delta,
    }
}

/// A cluster of 3 nodes with 12 ranges over 240 keys `k0000`..`k0239`, written through the
/// client.
async fn twelve_ranges() -> (std::sync::Arc<Fake>, Client) {
    let splits: Vec<Vec<u8>> = (1..12).map(|i| key(i * 20 + 3)).collect();
    let splits: Vec<&[u8]> = splits.iter().map(Vec::as_slice).collect();
    let (fake, addrs) = Fake::cluster(3, &splits).await;
    let client = client(&addrs, ClientOptions::default());
    for i in 0..240 {
        let value = format!("v{i}").into_bytes();
        client
            .put(&key(i), &value, PutOptions::default())
            .await
            .unwrap();
    }
    assert_eq!(fake.descriptors().len(), 12);
    (fake, client)
}

#[tokio::test]
async fn a_scan_over_twelve_ranges_equals_the_reference() {
    let (fake, client) = twelve_ranges().await;
    let reference: Vec<(Vec<u8>, Vec<u8>)> = fake.data().into_iter().collect();
    assert_eq!(reference.len(), 240);

    for (limit, pages) in [(1_000, 1), (7, 35), (1, 240)] {
        let (rows, got_pages) = scan_all(&client, b"", b"", limit).await;
        assert_eq!(pairs(&rows), reference, "page limit {limit}");
        // Pages are as full as one range would make them: range ends do not cut them short.
        assert_eq!(got_pages, pages, "page limit {limit}");
    }
    // A span that starts and ends inside ranges, across several boundaries.
    let (inner, _) = scan_all(&client, &key(17), &key(131), 9).await;
    assert_eq!(pairs(&inner), reference[17..131].to_vec());
    // A span inside one range, and an empty one between keys.
    let (within, _) = scan_all(&client, &key(24), &key(30), 4).await;
    assert_eq!(pairs(&within), reference[24..30].to_vec());
    let (empty, _) = scan_all(&client, b"k0239x", b"k0239y", 4).await;
    assert!(empty.is_empty());
}

#[tokio::test]
async fn a_scan_goes_on_correctly_when_ranges_split_between_its_pages() {
    let (fake, client) = twelve_ranges().await;
    let reference: Vec<(Vec<u8>, Vec<u8>)> = fake.data().into_iter().collect();

    let first = client
        .scan(b"", b"", 50, Consistency::Linearizable)
        .await
        .unwrap();
    let mut rows = first.kvs;
    // Ranges ahead split, and the nodes learn of it only by refusing a request.
    fake.split_lagging(&key(70), 1);
    fake.split(&key(150), 2);
    let next = first.next_start.unwrap();
    let (rest, _) = scan_all(&client, &next, b"", 50).await;
    rows.extend(rest);
    assert_eq!(pairs(&rows), reference);
}

#[tokio::test]
async fn an_atomic_batch_across_cached_ranges_is_refused_before_sending() {
    // ["", "m") and ["m", +inf).
    let (fake, addrs) = Fake::cluster(2, &[b"m"]).await;
    let client = client(&addrs, ClientOptions::default());
    client.ranges().await.unwrap();

    let ops = vec![put(b"a", b"1"), put(b"b", b"2"), put(b"z", b"3")];
    let error = client.batch(ops).await.unwrap_err();
    let KvError::InvalidArgument { message } = &error else {
        panic!("{error:?}");
    };
    for part in [
        r#"key "a" in range r1"#,
        r#"key "z" in range r2"#,
        "batch_non_atomic",
    ] {
        assert!(message.contains(part), "{message}");
    }
    assert!(fake.calls().is_empty(), "nothing was sent");
    assert_eq!(fake.sessions_opened(), 0);
}

#[tokio::test]
async fn an_atomic_batch_split_apart_meanwhile_is_refused_once_applied_nowhere() {
    let (fake, addrs) = Fake::cluster(2, &[b"m"]).await;
    let client = client(&addrs, ClientOptions::default());
    client.ranges().await.unwrap();
    // The table still holds "a" and "g" in one range; range 1 splits at "f".
    fake.split(b"f", 1);

    let ops = vec![put(b"a", b"1"), put(b"g", b"2")];
    let error = client.batch(ops).await.unwrap_err();
    assert!(
        matches!(&error, KvError::InvalidArgument { message } if message.contains("range r3")),
        "{error:?}"
    );
    assert_eq!(
        fake.writes_of("batch").len(),
        1,
        "refused once with KeyOutOfRange"
    );
    assert!(fake.data().is_empty());
    assert_eq!(fake.ranges_calls(), 2);
}

#[tokio::test]
async fn a_non_atomic_batch_answers_in_the_callers_order() {
    // ["", "g") led by node 1, ["g", "p") by node 2, ["p", +inf) by node 3.
    let (fake, addrs) = Fake::cluster(3, &[b"g", b"p"]).await;
    let client = client(&addrs, ClientOptions::default());
    let ops = vec![
        increment(b"z", 1),
        put(b"a", b"A"),
        increment(b"b", 10),
        put(b"h", b"H"),
        increment(b"q", 100),
    ];

    let result = client
        .batch_non_atomic(ops, BatchOptions::default())
        .await
        .unwrap();
    assert!(result.applied());
    let parts: Vec<Vec<usize>> = result.parts.iter().map(|part| part.ops.clone()).collect();
    assert_eq!(
        parts,
        [vec![1, 2], vec![3], vec![0, 4]],
        "one part per range, in key order"
    );
    let results = result.into_results().unwrap();
    let counters: Vec<Option<i64>> = results.iter().map(|op| op.counter).collect();
    // The fake has one counter for all keys; the parts ran in some order, each once, and
    // within a part in the caller's order: "q" right after "z".
    assert_eq!((counters[1], counters[3]), (None, None), "{counters:?}");
    let (z, b, q) = (
        counters[0].unwrap(),
        counters[2].unwrap(),
        counters[4].unwrap(),
    );
    assert_eq!(q, z + 100, "{counters:?}");
    assert!(b == 10 || b == 111, "{counters:?}");
    assert_eq!(fake.counter(), 111);
    let mut nodes: Vec<u64> = fake.node_calls().iter().map(|(_, node)| *node).collect();
    nodes.sort();
    assert_eq!(nodes, [1, 2, 3]);
    assert_eq!(fake.data().get(b"h".as_slice()), Some(&b"H".to_vec()));
}

#[tokio::test]
async fn a_non_atomic_batch_splits_a_part_again_when_its_range_splits_under_it() {
    // ["", "m") led by node 1, ["m", +inf) by node 2.
    let (fake, addrs) = Fake::cluster(2, &[b"m"]).await;
    let client = client(&addrs, ClientOptions::default());
    client.ranges().await.unwrap();
    // Range 2 splits at "t" as soon as the first part arrives, whichever it is.
    fake.split_at_write(1, b"t", 2);
    let ops = vec![
        put(b"x", b"X"),
        put(b"a", b"A"),
        put(b"n", b"N"),
        put(b"b", b"B"),
    ];

    let result = client
        .batch_non_atomic(ops, BatchOptions::default())
        .await
        .unwrap();
    assert!(result.applied(), "{result:?}");
    let parts: Vec<Vec<usize>> = result.parts.iter().map(|part| part.ops.clone()).collect();
    assert_eq!(parts, [vec![1, 3], vec![2], vec![0]]);
    assert_eq!(result.results.len(), 4);
    let expected: Vec<(&[u8], &[u8])> =
        vec![(b"a", b"A"), (b"b", b"B"), (b"n", b"N"), (b"x", b"X")];
    let data: Vec<(Vec<u8>, Vec<u8>)> = fake.data().into_iter().collect();
    let expected: Vec<(Vec<u8>, Vec<u8>)> = expected
        .iter()
        .map(|(k, v)| (k.to_vec(), v.to_vec()))
        .collect();
    assert_eq!(data, expected);
    // The refused part's id is not reused: its halves went with ids of their own.
    let batches = fake.writes_of("batch");
    assert_eq!(batches.len(), 4);
    let mut ids: Vec<u64> = batches
        .iter()
        .map(|w| w.request_id.unwrap().sequence)
        .collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 4);
}
