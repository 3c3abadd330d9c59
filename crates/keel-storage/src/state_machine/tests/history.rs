//! History through the real writer and redb: every write of a key is an event with the
//! key's states before and after, expiry removals take a revision, compaction removes whole
//! revisions from the oldest up, splits leave each half its events, and a snapshot install
//! starts the replica's history at the snapshot.

use keel_types::{
    Cleanup, Command, CommandOutcome, Condition, Event, EventCursor, EventKind, ExpiredKey,
    KeyHistory, KeyValue, RangeId, Revision, Split,
};
use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine};

use super::exactly_once::{Applier, at, put_ttl};
use super::{delete, kv, open, put};
use crate::state_machine::{
    HistoryRead, HistoryRetention, RangeEventsPage, RangeRead, StateMachine,
};

fn event(
    revision: Revision,
    before: Option<KeyValue>,
    after: Option<KeyValue>,
    clock_ms: u64,
) -> Event {
    let key = before.as_ref().or(after.as_ref()).unwrap().key.clone();
    Event {
        revision,
        key,
        after,
        before,
        clock_ms,
        kind: EventKind::Key,
    }
}

pub(super) async fn history(
    sm: &StateMachine,
    key: &str,
    from: Revision,
    limit: u32,
) -> KeyHistory {
    match sm.key_history(key.as_bytes(), from, limit).await.unwrap() {
        HistoryRead::Events(history) => history,
        other => panic!("expected events of {key}, got {other:?}"),
    }
}

/// The revisions of `key`'s events from the oldest kept.
pub(super) async fn revisions(sm: &StateMachine, key: &str) -> Vec<Revision> {
    let page = history(sm, key, 0, 0).await;
    page.events.iter().map(|event| event.revision).collect()
}

#[tokio::test]
async fn every_write_of_a_key_is_an_event_with_its_states_before_and_after() {
    let (_dir, store) = open();
    let mut applier = Applier::new(&store);
    applier.apply(at(1_000, vec![put("a", "1", None)])).await;
    applier.apply(at(2_000, vec![put("a", "2", None)])).await;
    // A failed condition writes nothing and is no event.
    let refused = vec![put("a", "x", Some(Condition::Absent))];
    let outcome = applier.apply(at(2_500, refused)).await;
    assert!(matches!(outcome, CommandOutcome::ConditionFailed(_)));
    applier
        .apply(at(3_000, vec![delete("a", None), put("b", "1", None)]))
        .await;

    let sm = applier.sm();
    let page = history(&sm, "a", 0, 0).await;
    let expected = vec![
        event(1, None, Some(kv("a", "1", 1, 1, 1)), 1_000),
        event(
            2,
            Some(kv("a", "1", 1, 1, 1)),
            Some(kv("a", "2", 1, 2, 2)),
            2_000,
        ),
        event(3, Some(kv("a", "2", 1, 2, 2)), None, 3_000),
    ];
    assert_eq!(page.events, expected);
    assert_eq!(
        (page.compact_revision, page.revision, page.next_revision),
        (0, 3, None)
    );
    // A batch is one revision: its keys' events share it.
    assert_eq!(revisions(&sm, "b").await, vec![3]);

    // Pages: from a revision on, at most `limit`, saying where the next starts.
    let page = history(&sm, "a", 2, 0).await;
    assert_eq!(page.events, expected[1..]);
    let page = history(&sm, "a", 0, 2).await;
    assert_eq!(
        (page.events.as_slice(), page.next_revision),
        (&expected[..2], Some(3))
    );
    assert!(history(&sm, "never", 0, 0).await.events.is_empty());
    // From past the range's revision: nothing yet, and nothing to go on to.
    let ahead = history(&sm, "a", 10, 0).await;
    assert_eq!((ahead.events.len(), ahead.next_revision), (0, None));
    let counts = sm.history_counts().await.unwrap();
    assert!(counts.bytes > 0, "{counts:?}");
}

#[tokio::test]
async fn an_expired_key_is_removed_by_an_event_at_a_revision_of_its_own() {
    let (_dir, store) = open();
    let mut applier = Applier::new(&store);
    applier
        .apply(at(
            1_000,
            vec![put_ttl("t", "1", 500), put_ttl("u", "1", 500)],
        ))
        .await;
    let cleanup = Cleanup {
        now_ms: 2_000,
        keys: ["t", "u"]
            .map(|key| ExpiredKey {
                key: key.as_bytes().to_vec(),
                expires_at_ms: 1_500,
            })
            .to_vec(),
        sessions: Vec::new(),
        sessions_idle_before_ms: 0,
    };
    applier.apply(Command::Cleanup(cleanup.clone())).await;
    assert_eq!(
        applier.revision().await,
        2,
        "one revision removes both keys"
    );
    let sm = applier.sm();
    let page = history(&sm, "t", 0, 0).await;
    let stored = KeyValue {
        expires_at_ms: Some(1_500),
        ..kv("t", "1", 1, 1, 1)
    };
    assert_eq!(page.events[1], event(2, Some(stored), None, 2_000));
    assert_eq!(revisions(&sm, "u").await, vec![1, 2]);
    // A cleanup that removes nothing takes no revision.
    applier.apply(Command::Cleanup(cleanup)).await;
    assert_eq!(applier.revision().await, 2);

    // A write over an expired row not yet cleaned up creates the key anew.
    applier.apply(at(3_000, vec![put_ttl("v", "1", 100)])).await;
    applier.apply(at(4_000, vec![put("v", "2", None)])).await;
    let page = history(&applier.sm(), "v", 0, 0).await;
    assert_eq!(
        page.events[1],
        event(4, None, Some(kv("v", "2", 4, 4, 1)), 4_000)
    );
}

#[tokio::test]
async fn compaction_removes_whole_revisions_from_the_oldest_and_raises_the_floor() {
    let (_dir, store) = open();
    let mut applier = Applier::new(&store);
    for (clock, value) in [(1_000, "1"), (2_000, "2"), (3_000, "3"), (4_000, "4")] {
        let ops = vec![put("a", value, None), put("b", value, None)];
        applier.apply(at(clock, ops)).await;
    }
    let sm = applier.sm();
    // Each event counts its key and its values: 2 bytes for a first put, 3 after.
    assert_eq!(
        sm.history_counts().await.unwrap().bytes,
        2 * (2 + 3 + 3 + 3)
    );
    let keep_all = HistoryRetention {
        max_age_ms: u64::MAX,
        max_bytes: u64::MAX,
    };
    sm.compact_history(4_000, keep_all).await.unwrap();
    assert_eq!(revisions(&sm, "a").await, vec![1, 2, 3, 4]);

    // By age: events written before 4_000 - 1_500 go, revisions 1 and 2.
    let by_age = HistoryRetention {
        max_age_ms: 1_500,
        ..keep_all
    };
    // The oldest kept event, written at 3_000, passes the bound at 4_500.
    let next_due = sm.compact_history(4_000, by_age).await.unwrap();
    assert_eq!(next_due, Some(4_500));
    assert_eq!(revisions(&sm, "a").await, vec![3, 4]);
    assert_eq!(revisions(&sm, "b").await, vec![3, 4]);
    let counts = sm.history_counts().await.unwrap();
    assert_eq!((counts.floor, counts.bytes), (2, 2 * (3 + 3)));
    // Asking from a compacted revision is refused, never answered with a gap.
    let compacted = sm.key_history(b"a", 2, 0).await.unwrap();
    assert_eq!(
        compacted,
        HistoryRead::Compacted {
            compact_revision: 2
        }
    );
    assert_eq!(history(&sm, "a", 3, 0).await.events.len(), 2);

    // By bytes: the oldest whole revisions go until the rest fit.
    let by_bytes = HistoryRetention {
        max_bytes: counts.bytes - 1,
        ..keep_all
    };
    sm.compact_history(4_000, by_bytes).await.unwrap();
    assert_eq!(revisions(&sm, "a").await, vec![4]);
    assert_eq!(revisions(&sm, "b").await, vec![4]);
    let counts = sm.history_counts().await.unwrap();
    assert_eq!((counts.floor, counts.bytes), (3, 2 * 3));
}

#[tokio::test]
async fn compaction_reads_past_other_ranges_and_leaves_their_events() {
    let (_dir, store) = open();
    let mut applier = Applier::new(&store);
    for value in ["1", "2", "3"] {
        let ops = vec![put("a", value, None), put("m", value, None)];
        applier.apply(at(1_000, ops)).await;
    }
    let split = Command::Split(Split {
        at: b"k".to_vec(),
        child: RangeId(2),
        expected_epoch: 0,
    });
    assert!(matches!(
        applier.apply(split).await,
        CommandOutcome::Split { .. }
    ));
    let (parent, child) = (applier.sm(), store.state_machine(RangeId(2)));
    // Each half keeps the events of its span, and their bytes.
    assert_eq!(revisions(&parent, "a").await, vec![1, 2, 3]);
    assert_eq!(revisions(&child, "m").await, vec![1, 2, 3]);
    let left = parent.history_counts().await.unwrap();
    let right = child.history_counts().await.unwrap();
    assert_eq!((left.bytes, right.floor), (right.bytes, 0));

    // Compacting the child everything leaves the parent's events alone.
    let none = HistoryRetention {
        max_age_ms: 0,
        max_bytes: 0,
    };
    let next_due = child.compact_history(2_000, none).await.unwrap();
    assert_eq!(next_due, None, "the child keeps no event");
    assert!(revisions(&child, "m").await.is_empty());
    let right = child.history_counts().await.unwrap();
    assert_eq!((right.floor, right.bytes), (3, 0));
    assert_eq!(revisions(&parent, "a").await, vec![1, 2, 3]);
    assert_eq!(parent.history_counts().await.unwrap(), left);
}

#[tokio::test]
async fn a_snapshot_install_starts_the_replicas_history_at_the_snapshot() {
    let (_dir_a, store_a) = open();
    let mut source = Applier::new(&store_a);
    source.apply(at(1_000, vec![put("a", "1", None)])).await;
    source.apply(at(1_000, vec![put("a", "2", None)])).await;
    let mut sm = source.sm();
    let snapshot = sm
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();

    let (_dir_b, store_b) = open();
    let mut target = Applier::new(&store_b);
    for _ in 0..3 {
        target.apply(at(1_000, vec![put("old", "1", None)])).await;
    }
    let mut installed = target.sm();
    installed
        .install_snapshot(&snapshot.meta, snapshot.snapshot)
        .await
        .unwrap();
    // The events of the replaced state are gone, and those before the snapshot were never here.
    let page = history(&installed, "a", 0, 0).await;
    assert!(page.events.is_empty());
    assert_eq!((page.compact_revision, page.revision), (2, 2));
    assert!(history(&installed, "old", 0, 0).await.events.is_empty());
    let counts = installed.history_counts().await.unwrap();
    assert_eq!((counts.floor, counts.bytes), (2, 0));
}

#[tokio::test]
async fn a_page_reads_a_bounded_number_of_events_and_says_where_to_go_on() {
    let (_dir, store) = open();
    let mut applier = Applier::new(&store);
    for revision in 1..=6 {
        let key = if revision % 3 == 0 { "needle" } else { "hay" };
        applier.apply(at(1_000, vec![put(key, "v", None)])).await;
    }
    // Pages of at most 2 events read through at most 4 rows: the events of "needle" are at
    // revisions 3 and 6.
    let page = |from: Revision, limit: usize, examined: usize| {
        let store = store.clone();
        async move {
            store
                .read(move |txn| {
                    let history = txn
                        .open_table(crate::tables::HISTORY)
                        .map_err(|e| crate::StorageError::redb("open history", e))?;
                    let bounds = crate::tables::EventBounds {
                        limit,
                        max_bytes: u64::MAX,
                        examined,
                    };
                    crate::tables::key_events(&history, b"needle", from..=6, bounds)
                })
                .await
                .unwrap()
        }
    };
    let revisions = |events: &[Event]| events.iter().map(|e| e.revision).collect::<Vec<_>>();
    let first = page(1, 2, 4).await;
    assert_eq!((revisions(&first.events), first.next), (vec![3], Some(5)));
    let second = page(5, 2, 4).await;
    assert_eq!((revisions(&second.events), second.next), (vec![6], None));
    // A full page goes on after its last event; a page that examined nothing of the key is
    // empty and still moves on.
    let full = page(1, 1, 100).await;
    assert_eq!((revisions(&full.events), full.next), (vec![3], Some(4)));
    let empty = page(1, 2, 1).await;
    assert_eq!((revisions(&empty.events), empty.next), (vec![], Some(2)));
}

#[tokio::test]
async fn a_key_page_that_stops_inside_a_revision_after_the_keys_event_goes_on_past_it() {
    let (_dir, store) = open();
    let mut applier = Applier::new(&store);
    // Revision 1 holds "a" then "b"; a page examining one row takes "a" and stops at "b".
    let ops = vec![put("a", "1", None), put("b", "1", None)];
    applier.apply(at(1_000, ops)).await;
    applier.apply(at(1_000, vec![put("a", "2", None)])).await;
    let sm = applier.sm();
    let first = store
        .read(|txn| {
            let history = txn
                .open_table(crate::tables::HISTORY)
                .map_err(|e| crate::StorageError::redb("open history", e))?;
            let bounds = crate::tables::EventBounds {
                limit: 10,
                max_bytes: u64::MAX,
                examined: 1,
            };
            crate::tables::key_events(&history, b"a", 1..=2, bounds)
        })
        .await
        .unwrap();
    assert_eq!(first.events.len(), 1);
    assert_eq!(first.next, Some(2), "revision 1 is not read twice");
    assert_eq!(revisions(&sm, "a").await, vec![1, 2]);
}

async fn range_read(sm: &StateMachine, from: EventCursor, limit: usize) -> RangeRead {
    sm.range_events(from, (limit, u64::MAX)).await.unwrap()
}

pub(super) async fn page_from(
    sm: &StateMachine,
    from: EventCursor,
    limit: usize,
) -> RangeEventsPage {
    match range_read(sm, from, limit).await {
        RangeRead::Events(page) => page,
        other => panic!("expected events, got {other:?}"),
    }
}

fn keys_at(events: &[Event]) -> Vec<(Revision, String)> {
    let key = |e: &Event| String::from_utf8(e.key.clone()).unwrap();
    events.iter().map(|e| (e.revision, key(e))).collect()
}

#[tokio::test]
async fn a_range_read_resumes_inside_a_revision_without_repeating_an_event() {
    let (_dir, store) = open();
    let mut applier = Applier::new(&store);
    let ops = vec![
        put("a", "1", None),
        put("b", "1", None),
        put("z", "1", None),
    ];
    applier.apply(at(1_000, ops)).await;
    applier
        .apply(at(1_000, vec![put("c", "1", None), put("b", "2", None)]))
        .await;
    let sm = applier.sm();
    // At most one event at a time.
    let mut cursor = EventCursor::at(1);
    let mut seen = Vec::new();
    loop {
        let page = page_from(&sm, cursor.clone(), 1).await;
        assert_eq!(page.page.revision, 2);
        seen.extend(keys_at(&page.page.events));
        match page.page.next {
            Some(next) => cursor = next,
            None => break,
        }
    }
    let expected = [(1, "a"), (1, "b"), (1, "z"), (2, "b"), (2, "c")];
    let expected: Vec<_> = expected.iter().map(|(r, k)| (*r, k.to_string())).collect();
    assert_eq!(seen, expected);
    // A cursor just after an event starts at the next one.
    let b = EventCursor {
        revision: 1,
        key: b"b".to_vec(),
    };
    let after_b = EventCursor::after(&page_from(&sm, b, 1).await.page.events[0]);
    let rest = page_from(&sm, after_b, 10).await;
    assert_eq!(keys_at(&rest.page.events)[0], (1, "z".to_string()));
    // From past the range's revision: nothing yet, and nothing to go on to.
    let ahead = page_from(&sm, EventCursor::at(3), 10).await;
    assert!(ahead.page.events.is_empty() && ahead.page.next.is_none());
}

#[tokio::test]
async fn a_range_read_below_the_floor_is_compacted_and_one_after_a_split_reads_its_half() {
    let (_dir, store) = open();
    let mut applier = Applier::new(&store);
    for value in ["1", "2", "3"] {
        let ops = vec![put("a", value, None), put("m", value, None)];
        applier.apply(at(1_000, ops)).await;
    }
    let sm = applier.sm();
    let everything = HistoryRetention {
        max_age_ms: 0,
        max_bytes: 0,
    };
    sm.compact_history(2_000, everything).await.unwrap();
    assert_eq!(
        range_read(&sm, EventCursor::at(3), 10).await,
        RangeRead::Compacted {
            compact_revision: 3
        }
    );
    applier
        .apply(at(3_000, vec![put("a", "4", None), put("m", "4", None)]))
        .await;
    let page = page_from(&sm, EventCursor::at(4), 10).await;
    let both = vec![(4, "a".to_string()), (4, "m".to_string())];
    assert_eq!(keys_at(&page.page.events), both);

    let split = Command::Split(Split {
        at: b"k".to_vec(),
        child: RangeId(2),
        expected_epoch: 0,
    });
    applier.apply(split).await;
    // The part that stayed, and the range as it is now.
    let left = page_from(&sm, EventCursor::at(4), 10).await;
    assert_eq!(keys_at(&left.page.events), vec![(4, "a".to_string())]);
    assert_eq!(left.descriptor.end, Some(b"k".to_vec()));
    assert!(left.applied_index > page.applied_index);
}
