//! `Kv.Watch` over real gRPC: a stream from any replica sends a range's changes in revision
//! order with what the filters keep, resumes from a revision and a key without repeating an
//! event, reports progress, ends with `KeyOutOfRange` at a split (and the halves go on from
//! its complete revision with nothing lost), refuses a start below the floor with
//! `Compacted`, refuses bad requests, and never shows a tenant another tenant's keys.

use std::collections::BTreeMap;
use std::time::Duration;

use keel_client::{PutOptions, WatchOptions};
use keel_proto::v1;
use keel_server::status;
use keel_types::{BatchOp, KvError, Revision};
use tonic::Streaming;

use crate::harness::{Cluster, quick_timings};

/// How long a test waits for a message before it fails (a bound, not a measurement).
const MESSAGE_WAIT: Duration = Duration::from_secs(30);

fn span(start: &[u8], end: &[u8], from: Revision) -> v1::WatchRequest {
    v1::WatchRequest {
        start: start.to_vec(),
        end: end.to_vec(),
        start_revision: from,
        prev_kv: true,
        ..v1::WatchRequest::default()
    }
}

async fn next(stream: &mut Streaming<v1::WatchResponse>) -> Result<v1::WatchResponse, KvError> {
    let message = tokio::time::timeout(MESSAGE_WAIT, stream.message())
        .await
        .expect("a watch message within the wait");
    match message {
        Ok(Some(message)) => Ok(message),
        Ok(None) => panic!("the stream ended without an error"),
        Err(status) => Err(status::kv_error(&status).expect("a typed error")),
    }
}

/// (revision, key, value after or None for a removal, value before) of each event.
type Seen = (Revision, String, Option<String>, Option<String>);

fn seen(events: &[v1::Event]) -> Vec<Seen> {
    let text = |bytes: &[u8]| String::from_utf8(bytes.to_vec()).unwrap();
    let value = |kv: &Option<v1::KeyValue>| kv.as_ref().map(|kv| text(&kv.value));
    events
        .iter()
        .map(|e| (e.revision, text(&e.key), value(&e.kv), value(&e.prev_kv)))
        .collect()
}

/// The events of the stream's messages until one says it is complete up to `revision`.
async fn events_through(
    stream: &mut Streaming<v1::WatchResponse>,
    revision: Revision,
) -> Result<Vec<Seen>, KvError> {
    let mut events = Vec::new();
    loop {
        let message = next(stream).await?;
        events.extend(seen(&message.events));
        if message.complete_revision >= revision {
            return Ok(events);
        }
    }
}

fn owned(revision: Revision, key: &str, after: Option<&str>, before: Option<&str>) -> Seen {
    let text = |s: Option<&str>| s.map(str::to_string);
    (revision, key.to_string(), text(after), text(before))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_on_any_replica_streams_the_spans_changes_in_revision_order() {
    let cluster = Cluster::start_with(3, quick_timings()).await;
    let client = cluster.client();
    let put = |key: &'static [u8], value: &'static [u8]| {
        let client = client.clone();
        async move {
            let put = client.put(key, value, PutOptions::default()).await;
            put.unwrap().revision
        }
    };
    let first = put(b"w/a", b"1").await;
    put(b"other", b"x").await;
    let second = put(b"w/b", b"1").await;
    let third = put(b"w/a", b"2").await;
    let deleted = client.delete(b"w/b", Default::default()).await.unwrap();

    for id in cluster.ids() {
        let mut kv = cluster.kv(id).await;
        let mut stream = kv
            .watch(span(b"w/", b"w0", first))
            .await
            .unwrap()
            .into_inner();
        let started = next(&mut stream).await.unwrap().started.unwrap();
        assert_eq!(started.served_by, id);
        assert_eq!(
            (started.start_revision, started.start.as_slice()),
            (first, &b"w/"[..])
        );
        let events = events_through(&mut stream, deleted.revision).await.unwrap();
        let expected = vec![
            owned(first, "w/a", Some("1"), None),
            owned(second, "w/b", Some("1"), None),
            owned(third, "w/a", Some("2"), Some("1")),
            owned(deleted.revision, "w/b", None, Some("1")),
        ];
        assert_eq!(events, expected, "node {id}");
    }

    // From now on (start 0), with the filters: only the removals, without the state before.
    let mut kv = cluster.kv(cluster.leader().await).await;
    let request = v1::WatchRequest {
        no_put: true,
        prev_kv: false,
        ..span(b"w/", b"w0", 0)
    };
    let mut stream = kv.watch(request).await.unwrap().into_inner();
    let started = next(&mut stream).await.unwrap().started.unwrap();
    assert_eq!(started.start_revision, deleted.revision + 1);
    put(b"w/c", b"1").await;
    let removed = client.delete(b"w/c", Default::default()).await.unwrap();
    let events = events_through(&mut stream, removed.revision).await.unwrap();
    assert_eq!(events, vec![owned(removed.revision, "w/c", None, None)]);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_resumes_inside_a_revision_and_reports_progress_without_events() {
    let cluster = Cluster::start_with(3, quick_timings()).await;
    let client = cluster.client();
    let put = |key: &str| BatchOp::Put {
        key: key.into(),
        value: b"1".to_vec(),
        condition: None,
        return_previous: false,
        ttl_ms: None,
    };
    let batch = client
        .batch(vec![put("r/a"), put("r/b"), put("r/c")])
        .await
        .unwrap();
    let mut kv = cluster.kv(cluster.leader().await).await;
    // Resuming after "r/a" (its key and a 0 byte) inside the batch's revision.
    let request = v1::WatchRequest {
        resume_key: b"r/a\0".to_vec(),
        progress_interval_ms: 100,
        ..span(b"r/", b"r0", batch.revision)
    };
    let mut stream = kv.watch(request).await.unwrap().into_inner();
    next(&mut stream).await.unwrap();
    let events = events_through(&mut stream, batch.revision).await.unwrap();
    let keys: Vec<_> = events.iter().map(|e| e.1.as_str()).collect();
    assert_eq!(keys, vec!["r/b", "r/c"]);
    // With nothing written, progress messages keep coming, complete up to the revision.
    for _ in 0..3 {
        let progress = next(&mut stream).await.unwrap();
        assert!(progress.events.is_empty());
        assert!(progress.complete_revision >= batch.revision);
    }
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_ends_the_stream_and_the_halves_go_on_from_its_complete_revision() {
    let cluster = Cluster::start_with(3, quick_timings()).await;
    let client = cluster.client();
    let before = client
        .put(b"s/a", b"1", PutOptions::default())
        .await
        .unwrap();
    let leader = cluster.leader().await;
    let mut kv = cluster.kv(leader).await;
    let mut stream = kv
        .watch(span(b"s/", b"s0", before.revision))
        .await
        .unwrap()
        .into_inner();
    next(&mut stream).await.unwrap();
    let mut seen_events = events_through(&mut stream, before.revision).await.unwrap();
    let mut complete = before.revision;
    client.split(b"s/m").await.unwrap();
    let after_left = client
        .put(b"s/b", b"1", PutOptions::default())
        .await
        .unwrap();
    let after_right = client
        .put(b"s/z", b"1", PutOptions::default())
        .await
        .unwrap();
    let ended = loop {
        match next(&mut stream).await {
            Ok(message) => {
                seen_events.extend(seen(&message.events));
                complete = complete.max(message.complete_revision);
            }
            Err(error) => break error,
        }
    };
    let KvError::KeyOutOfRange { range, .. } = ended else {
        panic!("expected KeyOutOfRange, got {ended:?}");
    };
    assert_eq!(range.end, Some(b"s/m".to_vec()));
    // Each half from the complete revision on: every event once.
    for (start, end, through) in [
        (&b"s/"[..], &b"s/m"[..], after_left.revision),
        (&b"s/m"[..], &b"s0"[..], after_right.revision),
    ] {
        let mut kv = cluster.kv(leader).await;
        let mut half = kv
            .watch(span(start, end, complete + 1))
            .await
            .unwrap()
            .into_inner();
        next(&mut half).await.unwrap();
        seen_events.extend(events_through(&mut half, through).await.unwrap());
    }
    let mut keys: Vec<_> = seen_events.iter().map(|e| e.1.clone()).collect();
    keys.sort();
    assert_eq!(keys, vec!["s/a", "s/b", "s/z"]);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_and_compacted_watches_are_refused() {
    let cluster = Cluster::start_with(3, quick_timings()).await;
    let mut kv = cluster.kv(cluster.leader().await).await;
    let cases = [
        span(b"b", b"a", 0),
        span(&vec![b'k'; keel_types::limits::KEY_BYTES_MAX + 1], b"", 0),
        v1::WatchRequest {
            progress_interval_ms: 1,
            ..span(b"a", b"b", 0)
        },
        v1::WatchRequest {
            resume_key: vec![b'k'; keel_types::limits::KEY_BYTES_MAX + 2],
            ..span(b"a", b"b", 1)
        },
    ];
    for request in cases {
        let refused = kv.watch(request.clone()).await.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{request:?}");
    }
    cluster.shutdown().await;
}

/// keel-client's watch over a span that splits while it runs, whose leader moves and whose
/// serving node stops and comes back: every put arrives once, each key's in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_clients_watch_rides_out_a_split_a_leader_move_and_a_restart() {
    let mut cluster = Cluster::start_with(3, quick_timings()).await;
    let client = cluster.client();
    let keys: [&[u8]; 4] = [b"c/a", b"c/f", b"c/p", b"c/x"];
    let first = client
        .put(keys[0], b"0", PutOptions::default())
        .await
        .unwrap();
    let options = WatchOptions {
        start_revision: first.revision,
        ..WatchOptions::default()
    };
    let mut watch = client.watch(b"c/", b"c0", options).await.unwrap();
    let mut expected: BTreeMap<Vec<u8>, Vec<Vec<u8>>> = BTreeMap::new();
    expected
        .entry(keys[0].to_vec())
        .or_default()
        .push(b"0".to_vec());
    let mut seen: BTreeMap<Vec<u8>, Vec<Vec<u8>>> = BTreeMap::new();
    let mut ranges = std::collections::BTreeSet::new();
    for i in 1..=40u32 {
        let key = keys[i as usize % keys.len()];
        let value = i.to_string().into_bytes();
        client
            .put(key, &value, PutOptions::default())
            .await
            .unwrap();
        expected.entry(key.to_vec()).or_default().push(value);
        match i {
            10 => {
                client.split(b"c/m").await.unwrap();
            }
            20 => {
                let (range, leader) = (keel_types::RangeId::FIRST, cluster.leader().await);
                let other = cluster.ids().into_iter().find(|id| *id != leader).unwrap();
                client.transfer_leader(range, other).await.unwrap();
            }
            25 => cluster.stop_node(1).await,
            32 => cluster.start_node(1).await,
            _ => {}
        }
        // Take what has come so far, so the watch's buffers never fill.
        while let Ok(Some(batch)) =
            tokio::time::timeout(Duration::from_millis(1), watch.next()).await
        {
            let batch = batch.unwrap();
            ranges.insert(batch.range_id);
            for event in batch.events {
                let value = event.after.map(|kv| kv.value).unwrap_or_default();
                seen.entry(event.key).or_default().push(value);
            }
        }
    }
    let total: usize = expected.values().map(Vec::len).sum();
    while seen.values().map(Vec::len).sum::<usize>() < total {
        let batch = tokio::time::timeout(MESSAGE_WAIT, watch.next())
            .await
            .expect("the watch delivers within the wait")
            .unwrap()
            .unwrap();
        ranges.insert(batch.range_id);
        for event in batch.events {
            let value = event.after.map(|kv| kv.value).unwrap_or_default();
            seen.entry(event.key).or_default().push(value);
        }
    }
    assert_eq!(seen, expected);
    assert!(
        ranges.len() >= 2,
        "events came from both halves: {ranges:?}"
    );
    cluster.shutdown().await;
}
