//! A key's history over real gRPC (`Kv.History`): its changes with the states before and
//! after, read on every node and across a split; the removal of an expired key as an event of
//! its own revision; compaction by the retention, answered with `Compacted` instead of a
//! gap; reads at a revision (`Get`/`Scan` with `revision`) on every node, across a split,
//! below the floor and past a replica that keeps less history; and a tenant that sees only its own keys' history. Every node's wall clock is a
//! manual clock that moves only when the test moves it.

use keel_client::{Client, PutOptions};
use keel_proto::v1;
use keel_server::{KvSettings, RaftTimings, status};
use keel_types::{Consistency, Event, KvError, ReadBound, Revision};

use crate::harness::{Cluster, eventually, quick_timings};

/// One page of `key`'s history from `from` (linearizable).
async fn history(client: &Client, key: &[u8], from: Revision) -> Result<Vec<Event>, KvError> {
    let page = client
        .history(
            key,
            from,
            0,
            Consistency::Linearizable,
            ReadBound::default(),
        )
        .await?;
    assert!(!page.more, "one page holds the test's events");
    Ok(page.events)
}

/// An event as (revision, value before, value after).
type Change<'a> = (Revision, Option<&'a [u8]>, Option<&'a [u8]>);

fn changes(events: &[Event]) -> Vec<Change<'_>> {
    fn value(kv: &Option<keel_types::KeyValue>) -> Option<&[u8]> {
        kv.as_ref().map(|kv| kv.value.as_slice())
    }
    events
        .iter()
        .map(|event| (event.revision, value(&event.before), value(&event.after)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keys_history_lists_its_changes_on_every_node_and_across_a_split() {
    let cluster = Cluster::start_with(3, quick_timings()).await;
    let client = cluster.client();
    let first = client
        .put(b"h/a", b"1", PutOptions::default())
        .await
        .unwrap();
    let second = client
        .put(b"h/a", b"2", PutOptions::default())
        .await
        .unwrap();
    let deleted = client.delete(b"h/a", Default::default()).await.unwrap();
    let expected = vec![
        (first.revision, None, Some(&b"1"[..])),
        (second.revision, Some(&b"1"[..]), Some(&b"2"[..])),
        (deleted.revision, Some(&b"2"[..]), None),
    ];
    let events = history(&client, b"h/a", 0).await.unwrap();
    assert_eq!(changes(&events), expected);
    let recreated = &events[1].after.as_ref().unwrap();
    assert_eq!(
        (recreated.create_revision, recreated.mod_revision),
        (first.revision, second.revision)
    );
    // From a revision on, and on each node's own replica (a follower read).
    let from_second = history(&client, b"h/a", second.revision).await.unwrap();
    assert_eq!(changes(&from_second), expected[1..]);
    for id in cluster.ids() {
        let mut kv = cluster.kv(id).await;
        let request = v1::HistoryRequest {
            key: b"h/a".to_vec(),
            consistency: v1::Consistency::Follower.into(),
            no_forward: true,
            min_revision: Some(deleted.revision),
            ..v1::HistoryRequest::default()
        };
        let page = kv.history(request).await.unwrap().into_inner();
        assert_eq!(page.header.unwrap().served_by, id);
        assert_eq!(page.events.len(), 3, "node {id}");
    }

    // A split keeps each half's events where they are.
    client
        .put(b"h/z", b"1", PutOptions::default())
        .await
        .unwrap();
    let (_, right) = client.split(b"h/m").await.unwrap();
    let right_events = history(&client, b"h/z", 0).await.unwrap();
    assert_eq!(right_events.len(), 1);
    let after_split = client
        .put(b"h/z", b"2", PutOptions::default())
        .await
        .unwrap();
    let right_events = history(&client, b"h/z", 0).await.unwrap();
    assert_eq!(right_events[1].revision, after_split.revision);
    assert!(after_split.revision > right_events[0].revision);
    assert_eq!(
        changes(&history(&client, b"h/a", 0).await.unwrap()),
        expected
    );
    assert_ne!(right.id, keel_types::RangeId::FIRST);
    cluster.shutdown().await;
}

/// The value of `key` at `revision` (linearizable), checking the answer names the revision.
async fn value_at(
    client: &Client,
    key: &[u8],
    revision: Revision,
) -> Result<Option<Vec<u8>>, KvError> {
    let read = client
        .get_at(key, revision, Consistency::Linearizable)
        .await?;
    assert_eq!(read.revision, revision);
    Ok(read.kv.map(|kv| kv.value))
}

/// `key=value` of each row of `[start, end)` at `revision`.
async fn rows_at(client: &Client, (start, end): (&[u8], &[u8]), revision: Revision) -> Vec<String> {
    let page = client
        .scan_at(start, end, 0, revision, Consistency::Linearizable)
        .await
        .unwrap();
    assert_eq!((page.revision, page.next_start), (revision, None));
    let row = |kv: &keel_types::KeyValue| {
        let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
        format!("{}={}", text(&kv.key), text(&kv.value))
    };
    page.kvs.iter().map(row).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_at_a_revision_see_the_range_as_it_was_on_every_node_and_across_a_split() {
    let cluster = Cluster::start_with(3, quick_timings()).await;
    let client = cluster.client();
    let put = |key: &'static [u8], value: &'static [u8]| {
        let client = client.clone();
        async move {
            client
                .put(key, value, PutOptions::default())
                .await
                .unwrap()
                .revision
        }
    };
    let first = put(b"r/a", b"1").await;
    let second = put(b"r/b", b"1").await;
    put(b"r/a", b"2").await;
    let deleted = client
        .delete(b"r/b", Default::default())
        .await
        .unwrap()
        .revision;
    let last = put(b"r/c", b"1").await;

    assert_eq!(
        value_at(&client, b"r/a", first).await.unwrap(),
        Some(b"1".to_vec())
    );
    assert_eq!(
        value_at(&client, b"r/a", deleted).await.unwrap(),
        Some(b"2".to_vec())
    );
    assert_eq!(value_at(&client, b"r/b", first).await.unwrap(), None);
    assert_eq!(value_at(&client, b"r/b", deleted).await.unwrap(), None);
    let span: (&[u8], &[u8]) = (b"r/", b"r0");
    assert_eq!(rows_at(&client, span, second).await, ["r/a=1", "r/b=1"]);
    assert_eq!(rows_at(&client, span, last).await, ["r/a=2", "r/c=1"]);
    // Every node's own replica answers the same (a follower read at the revision).
    for id in cluster.ids() {
        let mut kv = cluster.kv(id).await;
        let request = v1::GetRequest {
            key: b"r/b".to_vec(),
            consistency: v1::Consistency::Follower.into(),
            no_forward: true,
            revision: Some(second),
            ..v1::GetRequest::default()
        };
        let read = kv.get(request).await.unwrap().into_inner();
        assert_eq!(read.header.unwrap().served_by, id);
        assert_eq!(read.kv.unwrap().value, b"1");
    }

    // A split child reads its span at revisions its parent made.
    client.split(b"r/b").await.unwrap();
    put(b"r/c", b"2").await;
    assert_eq!(rows_at(&client, (b"r/b", b"r0"), second).await, ["r/b=1"]);
    assert_eq!(
        value_at(&client, b"r/c", last).await.unwrap(),
        Some(b"1".to_vec())
    );

    // A revision no write has made, and no revision at all.
    let ahead = value_at(&client, b"r/a", last + 1_000).await;
    assert!(
        matches!(ahead, Err(KvError::FutureRevision { .. })),
        "{ahead:?}"
    );
    let zero = client.get_at(b"r/a", 0, Consistency::Linearizable).await;
    assert!(
        matches!(zero, Err(KvError::InvalidArgument { .. })),
        "{zero:?}"
    );
    let mut raw = cluster.kv(cluster.leader().await).await;
    for revision in [Some(0), Some(last + 1_000)] {
        let request = v1::ScanRequest {
            start: b"r/".to_vec(),
            revision,
            ..v1::ScanRequest::default()
        };
        let refused = raw.scan(request).await.unwrap_err();
        let code = refused.code();
        assert!(
            matches!(code, tonic::Code::InvalidArgument | tonic::Code::OutOfRange),
            "{refused:?}"
        );
    }
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_and_compaction_are_events_and_floors_never_gaps() {
    let kv = KvSettings {
        history_retention_ms: 60_000,
        ..KvSettings::default()
    };
    let faults = Default::default();
    let cluster = Cluster::start_configured(3, RaftTimings::default(), kv, faults).await;
    let client = cluster.client();
    let ttl = PutOptions {
        ttl: Some(std::time::Duration::from_millis(5_000)),
        ..PutOptions::default()
    };
    let put = client.put(b"x/t", b"1", ttl).await.unwrap();
    // The key expires; the leader's cleanup removes it at a revision of its own.
    cluster.advance_clocks_ms(10_000);
    let events = eventually("the expired key's removal is an event", || async {
        let events = history(&client, b"x/t", 0).await.unwrap();
        (events.len() == 2).then_some(events)
    })
    .await;
    assert!(events[1].revision > put.revision);
    assert!(events[1].is_removal());
    // At its revision the key reads as it was stored, and at its removal's as absent.
    let stored = value_at(&client, b"x/t", put.revision).await.unwrap();
    assert_eq!(stored, Some(b"1".to_vec()));
    assert_eq!(
        value_at(&client, b"x/t", events[1].revision).await.unwrap(),
        None
    );
    let before = events[1].before.as_ref().unwrap();
    assert_eq!(
        before.expires_at_ms,
        events[0].after.as_ref().unwrap().expires_at_ms
    );

    // Past the retention, every node compacts the events away: a read from them is refused
    // with the floor, and a read from the oldest kept says where history starts.
    cluster.advance_clocks_ms(120_000);
    let compacted = eventually("the events are compacted", || async {
        match history(&client, b"x/t", put.revision).await {
            Err(KvError::Compacted {
                requested,
                compact_revision,
            }) => Some((requested, compact_revision)),
            _ => None,
        }
    })
    .await;
    assert_eq!(compacted.0, put.revision);
    assert!(compacted.1 >= events[1].revision, "{compacted:?}");
    // A read at a revision whose later changes are gone is refused the same way, once no
    // replica keeps them (keel-client asks each replica before it answers `Compacted`).
    eventually("no replica keeps the changes after the put", || async {
        let gone = value_at(&client, b"x/t", put.revision).await;
        matches!(gone, Err(KvError::Compacted { .. })).then_some(())
    })
    .await;
    let page = client
        .history(
            b"x/t",
            0,
            0,
            Consistency::Linearizable,
            ReadBound::default(),
        )
        .await
        .unwrap();
    assert!(page.events.is_empty());
    assert_eq!(page.compact_revision, compacted.1);
    // The same error reaches a generic gRPC client as OUT_OF_RANGE with the detail.
    let mut raw = cluster.kv(cluster.leader().await).await;
    let request = v1::HistoryRequest {
        key: b"x/t".to_vec(),
        start_revision: put.revision,
        ..v1::HistoryRequest::default()
    };
    let refused = raw.history(request).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::OutOfRange);
    assert!(matches!(
        status::kv_error(&refused),
        Some(KvError::Compacted { .. })
    ));
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_history_request_is_refused_and_changes_nothing() {
    let cluster = Cluster::start_with(3, quick_timings()).await;
    let mut kv = cluster.kv(cluster.leader().await).await;
    let cases = [
        v1::HistoryRequest::default(),
        v1::HistoryRequest {
            key: b"k".to_vec(),
            limit: 1_001,
            ..v1::HistoryRequest::default()
        },
        v1::HistoryRequest {
            key: vec![b'k'; keel_types::limits::KEY_BYTES_MAX + 1],
            ..v1::HistoryRequest::default()
        },
        v1::HistoryRequest {
            key: b"k".to_vec(),
            max_staleness_ms: Some(-1),
            ..v1::HistoryRequest::default()
        },
    ];
    for request in cases {
        let refused = kv.history(request.clone()).await.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{request:?}");
    }
    cluster.shutdown().await;
}

/// A read at a revision that the replica it reaches no longer keeps (that replica received
/// the range by snapshot, so its history starts there) is served by another replica that
/// does: keel-client goes round the range's replicas on `Compacted`, as its watch does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_at_a_revision_goes_past_a_replica_that_keeps_less_history() {
    let (cluster, lagging, first) = Cluster::with_a_replica_that_keeps_less_history().await;
    // The lagging node itself refuses the read: its history starts at the snapshot.
    let mut kv = cluster.kv(lagging).await;
    let raw = v1::GetRequest {
        key: b"snap/0".to_vec(),
        consistency: v1::Consistency::Follower.into(),
        revision: Some(first),
        no_forward: true,
        ..v1::GetRequest::default()
    };
    let refused = kv.get(raw).await.unwrap_err();
    let refused = status::kv_error(&refused).unwrap();
    assert!(matches!(refused, KvError::Compacted { .. }), "{refused:?}");

    let on_lagging = cluster.client_of(lagging);
    for consistency in [Consistency::Follower, Consistency::Linearizable] {
        let got = on_lagging
            .get_at(b"snap/0", first, consistency)
            .await
            .unwrap();
        assert_eq!(got.kv.unwrap().value, b"0", "{consistency:?}");
        let page = on_lagging
            .scan_at(b"snap/", b"snap0", 0, first, consistency)
            .await
            .unwrap();
        let keys: Vec<&[u8]> = page.kvs.iter().map(|kv| kv.key.as_slice()).collect();
        assert_eq!(keys, vec![&b"snap/0"[..]], "{consistency:?}");
    }
    cluster.shutdown().await;
}
