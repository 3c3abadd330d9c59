//! Reads at a revision through the real writer and redb: each key as it was stored at the
//! revision (its expiry included), pages that end at their limits or at the changed keys they
//! can track, and the revisions that cannot be read (ahead, compacted).

use keel_types::{Cleanup, Command, ExpiredKey, KeyValue, Revision};

use super::exactly_once::{Applier, at, put_ttl};
use super::{delete, kv, open, put};
use crate::state_machine::{AtRevision, HistoryRetention, ScanPage, StateMachine, Unreadable};

async fn get_at(sm: &StateMachine, key: &str, revision: Revision) -> AtRevision<Option<KeyValue>> {
    sm.read_key_at(key.as_bytes(), revision).await.unwrap()
}

/// `key=value` of each row of the page at `revision` over `[start, end)`, and its next start.
async fn scan_at(
    sm: &StateMachine,
    (start, end, limit): (&str, &str, u32),
    revision: Revision,
    keys_max: usize,
) -> (Vec<String>, Option<String>) {
    let read = sm.scan_at_tracking(
        start.as_bytes(),
        end.as_bytes(),
        (limit, revision),
        keys_max,
    );
    let page: ScanPage = read.await.unwrap().unwrap();
    assert_eq!(page.revision, revision);
    let rows = page.kvs.iter().map(|kv| {
        format!(
            "{}={}",
            String::from_utf8_lossy(&kv.key),
            String::from_utf8_lossy(&kv.value)
        )
    });
    let next = page.next_start.map(|key| String::from_utf8(key).unwrap());
    (rows.collect(), next)
}

#[tokio::test]
async fn a_read_at_a_revision_sees_each_key_as_it_was_then() {
    let (_dir, store) = open();
    let mut applier = Applier::new(&store);
    applier.apply(at(1_000, vec![put("a", "1", None)])).await; // 1
    applier.apply(at(1_000, vec![put("b", "1", None)])).await; // 2
    applier.apply(at(1_000, vec![put("a", "2", None)])).await; // 3
    applier.apply(at(1_000, vec![delete("b", None)])).await; // 4
    applier
        .apply(at(1_000, vec![put("c", "1", None), put("b", "2", None)]))
        .await; // 5
    let sm = applier.sm();

    assert_eq!(get_at(&sm, "a", 1).await, Ok(Some(kv("a", "1", 1, 1, 1))));
    assert_eq!(get_at(&sm, "a", 2).await, Ok(Some(kv("a", "1", 1, 1, 1))));
    assert_eq!(get_at(&sm, "a", 3).await, Ok(Some(kv("a", "2", 1, 3, 2))));
    assert_eq!(get_at(&sm, "b", 1).await, Ok(None));
    assert_eq!(get_at(&sm, "b", 3).await, Ok(Some(kv("b", "1", 2, 2, 1))));
    assert_eq!(get_at(&sm, "b", 4).await, Ok(None));
    assert_eq!(get_at(&sm, "b", 5).await, Ok(Some(kv("b", "2", 5, 5, 1))));
    assert_eq!(get_at(&sm, "never", 5).await, Ok(None));

    let all = |revision| scan_at(&sm, ("", "", 0), revision, usize::MAX);
    assert_eq!(all(1).await, (vec!["a=1".into()], None));
    assert_eq!(all(2).await, (vec!["a=1".into(), "b=1".into()], None));
    assert_eq!(all(3).await, (vec!["a=2".into(), "b=1".into()], None));
    assert_eq!(all(4).await, (vec!["a=2".into()], None));
    let now = vec!["a=2".to_string(), "b=2".into(), "c=1".into()];
    assert_eq!(all(5).await, (now, None));
    // A span within the range, and the state before any write.
    let part = scan_at(&sm, ("b", "c", 0), 3, usize::MAX).await;
    assert_eq!(part, (vec!["b=1".into()], None));
    assert_eq!(all(0).await, (vec![], None));

    // A revision the range has not reached.
    assert_eq!(
        get_at(&sm, "a", 6).await,
        Err(Unreadable::Future { current: 5 })
    );
}

#[tokio::test]
async fn a_page_at_a_revision_ends_at_its_limit_or_at_the_changed_keys_it_can_track() {
    let (_dir, store) = open();
    let mut applier = Applier::new(&store);
    let keys = ["a", "b", "c", "d", "e"];
    applier
        .apply(at(
            1_000,
            keys.iter().map(|key| put(key, "1", None)).collect(),
        ))
        .await; // 1
    applier
        .apply(at(
            1_000,
            vec![put("b", "2", None), delete("c", None), put("e", "2", None)],
        ))
        .await; // 2
    let sm = applier.sm();
    let at_1 = |key: &str| format!("{key}=1");

    // At its limit: the next page starts at the first key it left out.
    let (rows, next) = scan_at(&sm, ("", "", 2), 1, usize::MAX).await;
    assert_eq!(
        (rows, next.as_deref()),
        (vec![at_1("a"), at_1("b")], Some("c"))
    );
    let (rows, next) = scan_at(&sm, ("c", "", 10), 1, usize::MAX).await;
    assert_eq!((rows, next), (vec![at_1("c"), at_1("d"), at_1("e")], None));

    // Tracking one changed key: the page ends before the second (`c`).
    let (rows, next) = scan_at(&sm, ("", "", 10), 1, 1).await;
    assert_eq!(
        (rows, next.as_deref()),
        (vec![at_1("a"), at_1("b")], Some("c"))
    );
    let (rows, next) = scan_at(&sm, ("c", "", 10), 1, 1).await;
    assert_eq!(
        (rows, next.as_deref()),
        (vec![at_1("c"), at_1("d")], Some("e"))
    );
    let (rows, next) = scan_at(&sm, ("e", "", 10), 1, 1).await;
    assert_eq!((rows, next), (vec![at_1("e")], None));
}

#[tokio::test]
async fn a_key_reads_at_a_revision_as_stored_then_even_if_its_ttl_ran_out_later() {
    let (_dir, store) = open();
    let mut applier = Applier::new(&store);
    applier
        .apply(at(
            1_000,
            vec![put_ttl("t", "1", 500), put_ttl("v", "1", 500)],
        ))
        .await; // 1
    // `t` is removed on expiry; `v` is written anew before its removal.
    let cleanup = Cleanup {
        now_ms: 2_000,
        keys: vec![ExpiredKey {
            key: b"t".to_vec(),
            expires_at_ms: 1_500,
        }],
        sessions: Vec::new(),
        sessions_idle_before_ms: 0,
    };
    applier.apply(Command::Cleanup(cleanup)).await; // 2
    applier.apply(at(3_000, vec![put("v", "2", None)])).await; // 3
    let sm = applier.sm();
    let stored = |key: &str| KeyValue {
        expires_at_ms: Some(1_500),
        ..kv(key, "1", 1, 1, 1)
    };
    assert_eq!(get_at(&sm, "t", 1).await, Ok(Some(stored("t"))));
    assert_eq!(get_at(&sm, "t", 2).await, Ok(None));
    assert_eq!(get_at(&sm, "v", 1).await, Ok(Some(stored("v"))));
    assert_eq!(get_at(&sm, "v", 2).await, Ok(Some(stored("v"))));
    assert_eq!(get_at(&sm, "v", 3).await, Ok(Some(kv("v", "2", 3, 3, 1))));
}

#[tokio::test]
async fn a_revision_below_the_history_floor_is_compacted() {
    let (_dir, store) = open();
    let mut applier = Applier::new(&store);
    for (clock, value) in [(1_000, "1"), (2_000, "2"), (3_000, "3")] {
        applier.apply(at(clock, vec![put("a", value, None)])).await;
    }
    let sm = applier.sm();
    let by_age = HistoryRetention {
        max_age_ms: 1_500,
        max_bytes: u64::MAX,
    };
    sm.compact_history(3_000, by_age).await.unwrap();
    let floor = sm.history_counts().await.unwrap().floor;
    assert_eq!(floor, 1);
    let compacted = Err(Unreadable::Compacted {
        compact_revision: 1,
    });
    assert_eq!(get_at(&sm, "a", 0).await, compacted);
    // From the floor on, every change after the revision is kept.
    assert_eq!(get_at(&sm, "a", 1).await, Ok(Some(kv("a", "1", 1, 1, 1))));
    assert_eq!(get_at(&sm, "a", 2).await, Ok(Some(kv("a", "2", 1, 2, 2))));
    let scan = sm.scan_at(b"", b"", 0, 0).await.unwrap();
    assert_eq!(
        scan.map(|page| page.kvs),
        compacted.map(|_: Option<KeyValue>| Vec::new())
    );
}
