//! `Kv.Watch` over real gRPC: a stream from any replica sends a range's changes in revision
//! order with what the filters keep, resumes from a revision and a key without repeating an
//! event, reports progress, ends with `KeyOutOfRange` at a split (and the halves go on from
//! its complete revision with nothing lost), refuses a start below the floor with
//! `Compacted`, refuses bad requests, and never shows a tenant another tenant's keys.

use std::collections::BTreeMap;
use std::time::Duration;

use keel_client::{AcquireOptions, BeginResult, PutOptions, WatchOptions};
use keel_proto::v1;
use keel_server::{KvSettings, RaftTimings, status};
use keel_types::{BatchOp, Consistency, EventKind, KvError, ReadBound, Revision};
use tonic::Streaming;

use crate::harness::{Cluster, eventually, quick_timings};
use crate::observability::scrape;

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

/// A reader that stops reading holds up no write: the puts are acknowledged while its
/// stream waits, and once retention passed its place the stream ends with `Compacted`
/// (counted), not with a gap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_falls_out_of_retention_gets_compacted_not_a_gap() {
    let kv_settings = KvSettings {
        history_retention_ms: 60_000,
        ..KvSettings::default()
    };
    let cluster =
        Cluster::start_configured(3, RaftTimings::default(), kv_settings, Default::default()).await;
    let client = cluster.client();
    let first = client
        .put(b"slow/0", b"0", PutOptions::default())
        .await
        .unwrap();
    let leader = cluster.leader().await;
    let mut kv = cluster.kv(leader).await;
    let mut stream = kv
        .watch(span(b"slow/", b"slow0", first.revision))
        .await
        .unwrap()
        .into_inner();
    next(&mut stream).await.unwrap();
    // Far more than the stream holds ready and the connection buffers: 24 MiB of values.
    let value = vec![b'v'; 512 * 1024];
    let mut last = first.revision;
    for i in 1..=48 {
        let key = format!("slow/{i}");
        last = client
            .put(key.as_bytes(), &value, PutOptions::default())
            .await
            .unwrap()
            .revision;
    }
    cluster.advance_clocks_ms(120_000);
    eventually("every node compacted the events", || async {
        let history = client
            .history(
                b"slow/1",
                0,
                0,
                Consistency::Linearizable,
                ReadBound::default(),
            )
            .await
            .unwrap();
        (history.compact_revision >= last).then_some(())
    })
    .await;
    let mut delivered = 0;
    let ended = loop {
        match next(&mut stream).await {
            Ok(message) => delivered += message.events.len(),
            Err(error) => break error,
        }
    };
    assert!(delivered < 49, "the stream sent only what it held ready");
    assert!(matches!(ended, KvError::Compacted { .. }), "{ended:?}");
    let scrape = scrape(&cluster, leader).await;
    let compacted = [("reason", "compacted")];
    assert_eq!(
        scrape.value("keel_watches_ended_total", &compacted),
        Some(1.0)
    );
    cluster.shutdown().await;
}

/// Streams of one range standing at one cursor share their reads of its history: 20 streams
/// see 5 writes each through far fewer reads than a read per stream and write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_streams_of_a_range_share_their_reads_of_its_history() {
    let cluster = Cluster::start_with(3, quick_timings()).await;
    let client = cluster.client();
    let leader = cluster.leader().await;
    let mut kv = cluster.kv(leader).await;
    let mut streams = Vec::new();
    for _ in 0..20 {
        let mut stream = kv
            .watch(span(b"fan/", b"fan0", 0))
            .await
            .unwrap()
            .into_inner();
        next(&mut stream).await.unwrap();
        streams.push(stream);
    }
    let reads = |scrape: &crate::prometheus::Scrape| {
        scrape.value("keel_watch_history_reads_total", &[]).unwrap()
    };
    let before = reads(&scrape(&cluster, leader).await);
    let mut last = 0;
    for i in 0..5 {
        let key = format!("fan/{i}");
        let put = client.put(key.as_bytes(), b"v", PutOptions::default());
        last = put.await.unwrap().revision;
    }
    for stream in &mut streams {
        assert_eq!(events_through(stream, last).await.unwrap().len(), 5);
    }
    let made = reads(&scrape(&cluster, leader).await) - before;
    assert!(made <= 20.0, "{made} reads for 20 streams and 5 writes");
    cluster.shutdown().await;
}

/// A replica that received its range by snapshot keeps history from there on only: the
/// client's watch from before it, sent there first, goes on to a replica that keeps more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_clients_watch_goes_past_a_replica_that_keeps_less_history() {
    let (cluster, lagging, first) = Cluster::with_a_replica_that_keeps_less_history().await;
    // The lagging node's own history starts at the snapshot.
    let mut kv = cluster.kv(lagging).await;
    let mut on_lagging = kv
        .watch(span(b"snap/", b"snap0", first))
        .await
        .unwrap()
        .into_inner();
    next(&mut on_lagging).await.unwrap();
    let refused = next(&mut on_lagging).await.unwrap_err();
    assert!(matches!(refused, KvError::Compacted { .. }), "{refused:?}");

    let options = WatchOptions {
        start_revision: first,
        ..WatchOptions::default()
    };
    let mut watch = cluster
        .client_of(lagging)
        .watch(b"snap/", b"snap0", options)
        .await
        .unwrap();
    let mut keys = std::collections::BTreeSet::new();
    while keys.len() < 41 {
        let batch = tokio::time::timeout(MESSAGE_WAIT, watch.next())
            .await
            .expect("the watch delivers within the wait")
            .unwrap()
            .unwrap();
        assert_ne!(batch.served_by, lagging);
        keys.extend(batch.events.into_iter().map(|event| event.key));
    }
    cluster.shutdown().await;
}

/// A replica that hears from no other replica of its range (here: the other two nodes
/// stopped) may be cut off by a partition and fall behind silently: its streams end with
/// `Unavailable`, so a client watches on another replica, instead of waiting on progress
/// messages that never move.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_hears_from_no_other_ends_its_streams() {
    let mut cluster = Cluster::start_with(3, quick_timings()).await;
    let client = cluster.client();
    let put = client
        .put(b"cut/a", b"1", PutOptions::default())
        .await
        .unwrap();
    let leader = cluster.leader().await;
    let lonely = cluster.ids().into_iter().find(|id| *id != leader).unwrap();
    cluster.applied_on(lonely, b"cut/a").await;
    let mut kv = cluster.kv(lonely).await;
    let request = v1::WatchRequest {
        progress_interval_ms: 100,
        ..span(b"cut/", b"cut0", put.revision)
    };
    let mut stream = kv.watch(request).await.unwrap().into_inner();
    next(&mut stream).await.unwrap();
    events_through(&mut stream, put.revision).await.unwrap();
    for id in cluster.ids() {
        if id != lonely {
            cluster.stop_node(id).await;
        }
    }
    // Progress every 100 ms: a minute's worth of them bounds the wait.
    let mut ended = None;
    for _ in 0..600 {
        match next(&mut stream).await {
            Ok(message) => assert!(message.events.is_empty()),
            Err(error) => {
                ended = Some(error);
                break;
            }
        }
    }
    let ended = ended.expect("the stream ends");
    assert!(matches!(ended, KvError::Unavailable { .. }), "{ended:?}");
    cluster.shutdown().await;
}

/// The reclaims a watch of `span` delivers until it has `count` of them, with the key events
/// it passed on the way: (revision, key, kind, token) of each event.
async fn reclaims(
    watch: &mut keel_client::Watch,
    count: usize,
) -> Vec<(Revision, Vec<u8>, EventKind)> {
    let mut seen = Vec::new();
    while seen
        .iter()
        .filter(|(_, _, kind)| *kind != EventKind::Key)
        .count()
        < count
    {
        let batch = tokio::time::timeout(MESSAGE_WAIT, watch.next())
            .await
            .expect("a watch batch within the wait")
            .expect("the watch goes on")
            .unwrap();
        seen.extend(
            batch
                .events
                .into_iter()
                .map(|e| (e.revision, e.key, e.kind)),
        );
    }
    seen
}

/// A watch that asks for reclaims sees an expired lock and an expired idempotency record go
/// (one reclaim: the lock at a revision, the record at the next), named as the client named
/// them; a watch that does not ask sees only the keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_that_asks_for_reclaims_sees_locks_and_records_go() {
    const RESULT_TTL: Duration = Duration::from_secs(60);
    let cluster = Cluster::start_with(3, quick_timings()).await;
    let client = cluster.client();
    let first = client
        .put(b"w/first", b"1", PutOptions::default())
        .await
        .unwrap();
    let options = |reclaims| WatchOptions {
        start_revision: first.revision,
        reclaims,
        ..WatchOptions::default()
    };
    let mut with = client.watch(b"w/", b"w0", options(true)).await.unwrap();
    let mut without = client.watch(b"w/", b"w0", options(false)).await.unwrap();

    // A holder that never releases: the lock goes once its TTL has run out.
    let acquire = AcquireOptions {
        ttl: Duration::from_secs(30),
        lock_delay: Duration::ZERO,
        ..AcquireOptions::default()
    };
    let acquired = client.acquire(b"w/lock", acquire).await.unwrap();
    let lock_token = acquired.holder.unwrap().token;
    let BeginResult::Started {
        token: record_token,
        ..
    } = client
        .begin(b"w/jobs", b"1", None, RESULT_TTL)
        .await
        .unwrap()
    else {
        panic!("a fresh record starts");
    };
    client
        .complete(b"w/jobs", b"1", record_token, b"done", RESULT_TTL)
        .await
        .unwrap();
    cluster.advance_clocks_ms(RESULT_TTL.as_millis() as u64);

    let seen = reclaims(&mut with, 2).await;
    let last = client
        .put(b"w/last", b"1", PutOptions::default())
        .await
        .unwrap();
    let gone: Vec<_> = seen
        .iter()
        .filter(|(_, _, kind)| *kind != EventKind::Key)
        .collect();
    let record_key = keel_types::coordination::idempotency_key(b"w/jobs", b"1");
    assert_eq!(
        (&gone[0].1, gone[0].2),
        (
            &b"w/lock".to_vec(),
            EventKind::LockReclaimed { token: lock_token }
        )
    );
    assert_eq!(
        (&gone[1].1, gone[1].2),
        (
            &record_key,
            EventKind::RecordReclaimed {
                token: record_token
            }
        )
    );
    assert!(first.revision < gone[0].0 && gone[1].0 < last.revision);
    assert_eq!(
        gone[0].0 + 1,
        gone[1].0,
        "one reclaim: the lock, then the record"
    );

    // Without reclaims: the two keys alone.
    let mut keys = Vec::new();
    while keys.len() < 2 {
        let batch = tokio::time::timeout(MESSAGE_WAIT, without.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(batch.events.iter().all(|e| e.kind == EventKind::Key));
        keys.extend(batch.events.into_iter().map(|e| (e.revision, e.key)));
    }
    assert_eq!(
        keys,
        vec![
            (first.revision, b"w/first".to_vec()),
            (last.revision, b"w/last".to_vec())
        ]
    );
    cluster.shutdown().await;
}

/// Progress on request: a raw stream asked by its id sends a progress message marked
/// requested; an unknown id is refused; keel-client's watch asks each range's stream and
/// delivers their progress batches although it asked for no periodic progress.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_sends_progress_when_asked() {
    let cluster = Cluster::start_with(3, quick_timings()).await;
    let client = cluster.client();
    let written = client
        .put(b"p/a", b"1", PutOptions::default())
        .await
        .unwrap();
    let node = cluster.leader().await;
    let mut kv = cluster.kv(node).await;
    let mut stream = kv.watch(span(b"p/", b"p0", 0)).await.unwrap().into_inner();
    let started = next(&mut stream).await.unwrap().started.unwrap();
    assert_ne!(started.watch_id, 0);
    let ask = |watch_id| v1::WatchProgressRequest { watch_id };
    kv.watch_progress(ask(started.watch_id)).await.unwrap();
    let progress = next(&mut stream).await.unwrap();
    assert!(progress.requested && progress.events.is_empty());
    assert_eq!(progress.complete_revision, written.revision);
    let unknown = kv
        .watch_progress(ask(started.watch_id ^ 1))
        .await
        .unwrap_err();
    assert!(matches!(
        status::kv_error(&unknown),
        Some(KvError::InvalidArgument { .. })
    ));

    // keel-client: a span of two ranges, no periodic progress; one batch per range, asked.
    client.split(b"p/m").await.unwrap();
    let mut watch = client
        .watch(b"p/", b"p0", WatchOptions::default())
        .await
        .unwrap();
    client
        .put(b"p/z", b"1", PutOptions::default())
        .await
        .unwrap();
    let mut progress = std::collections::BTreeSet::new();
    let mut asked = 0;
    // Bounded: 150 rounds of at most 200 ms.
    for _ in 0..150 {
        if progress.len() == 2 {
            break;
        }
        if asked < 2 {
            // A part's stream may still be opening: ask until both were.
            asked = watch.request_progress().await;
        }
        let wait = Duration::from_millis(200);
        if let Ok(batch) = tokio::time::timeout(wait, watch.next()).await {
            let batch = batch.unwrap().unwrap();
            if batch.events.is_empty() {
                progress.insert(batch.range_id);
            }
        }
    }
    assert_eq!(progress.len(), 2, "a progress batch from each range");
    cluster.shutdown().await;
}

/// Enough streams of one range on one node that they linger after each apply
/// (`limits::WATCH_LINGER_PER_STREAM_US`): every stream still sends every event once, in
/// order, while the writes go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_streams_of_a_range_each_send_every_event_once() {
    const STREAMS: usize = 40;
    let cluster = Cluster::start_with(3, quick_timings()).await;
    let client = cluster.client();
    let first = client
        .put(b"m/0", b"0", PutOptions::default())
        .await
        .unwrap();
    let mut kv = cluster.kv(cluster.leader().await).await;
    let mut streams = Vec::new();
    for _ in 0..STREAMS {
        let request = span(b"m/", b"m0", first.revision);
        let mut stream = kv.watch(request).await.unwrap().into_inner();
        next(&mut stream).await.unwrap().started.unwrap();
        streams.push(stream);
    }
    let mut expected = vec![owned(first.revision, "m/0", Some("0"), None)];
    for i in 1..=30u32 {
        let (key, value) = (format!("m/{}", i % 4), i.to_string());
        let before = expected
            .iter()
            .rev()
            .find(|seen| seen.1 == key)
            .and_then(|seen| seen.2.clone());
        let put = client.put(key.as_bytes(), value.as_bytes(), PutOptions::default());
        let revision = put.await.unwrap().revision;
        expected.push((revision, key, Some(value), before));
    }
    let last = expected.last().unwrap().0;
    for stream in &mut streams {
        assert_eq!(events_through(stream, last).await.unwrap(), expected);
    }
    cluster.shutdown().await;
}
