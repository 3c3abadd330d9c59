//! The recent entries a log keeps in memory: every entry until it is durable, then the latest
//! durable ones within the budget, with their bytes counted through truncations and purges.

use std::sync::Arc;

use super::{DURABLE_KEPT_BYTES, Recent};
use crate::raft_types::{Entry, LogId};
use crate::test_entries::entries;

fn ids(entries: &[Arc<Entry>]) -> Vec<LogId> {
    entries.iter().map(|entry| entry.log_id).collect()
}

/// A log that appended `appended` and has them all durable.
fn durable(appended: Vec<Arc<Entry>>) -> Recent {
    let mut recent = Recent::default();
    recent.append(&appended);
    recent.settle(&ids(&appended));
    recent
}

/// The kept indexes, after checking what every change must keep true: contiguous indexes,
/// the durable entries first, and their bytes counted exactly.
fn kept(recent: &Recent) -> Vec<u64> {
    let indexes: Vec<u64> = recent.entries.keys().copied().collect();
    for pair in indexes.windows(2) {
        assert_eq!(pair[1], pair[0] + 1, "not contiguous: {indexes:?}");
    }
    let durable: Vec<bool> = recent.entries.values().map(|kept| kept.durable).collect();
    assert!(
        durable.windows(2).all(|pair| pair[0] || !pair[1]),
        "a durable entry after one that is not: {durable:?}"
    );
    let counted: usize = (recent.entries.values())
        .filter(|kept| kept.durable)
        .map(|kept| kept.bytes)
        .sum();
    assert_eq!(recent.durable_bytes, counted);
    indexes
}

#[test]
fn entries_stay_until_durable_then_while_they_fit_the_budget() {
    let mut recent = Recent::default();
    let appended = entries(1, 1, 40, 4_000);
    recent.append(&appended);
    assert_eq!(
        kept(&recent),
        (1..=40).collect::<Vec<_>>(),
        "none durable yet"
    );

    recent.settle(&ids(&appended[..30]));
    let after = kept(&recent);
    assert!(recent.durable_bytes <= DURABLE_KEPT_BYTES);
    assert_eq!(
        *after.last().unwrap(),
        40,
        "entries not durable are all kept"
    );
    let first = after[0];
    assert!(
        first > 1,
        "the oldest durable entries are forgotten: {after:?}"
    );
    let one = recent.entries[&first].bytes;
    assert!(
        recent.durable_bytes + one > DURABLE_KEPT_BYTES,
        "no more were forgotten than the budget asks"
    );

    recent.settle(&ids(&appended[30..]));
    let settled = kept(&recent);
    assert_eq!(*settled.last().unwrap(), 40);
    assert!(recent.durable_bytes <= DURABLE_KEPT_BYTES);
}

#[test]
fn a_replaced_entry_is_not_made_durable_by_the_commit_of_the_old_one() {
    let mut recent = Recent::default();
    let old = entries(1, 1, 10, 100);
    recent.append(&old);
    recent.settle(&ids(&old[..5]));
    recent.truncate(8);
    assert_eq!(kept(&recent), (1..=7).collect::<Vec<_>>());
    let new = entries(2, 8, 12, 100);
    recent.append(&new);
    recent.settle(&ids(&old[5..]));
    assert_eq!(kept(&recent), (1..=12).collect::<Vec<_>>());
    assert!(recent.entries[&7].durable);
    assert!(
        !recent.entries[&8].durable,
        "index 8 now holds term 2's entry"
    );
    recent.settle(&ids(&new));
    assert!(recent.entries.values().all(|kept| kept.durable));
    kept(&recent);
}

#[test]
fn appending_over_a_durable_entry_and_purging_keep_the_count() {
    let mut recent = durable(entries(1, 1, 6, 100));
    recent.append(&entries(2, 5, 6, 300));
    assert_eq!(kept(&recent), (1..=6).collect::<Vec<_>>());
    assert!(!recent.entries[&5].durable);
    recent.purge(3);
    assert_eq!(kept(&recent), vec![4, 5, 6]);
    recent.purge(6);
    assert_eq!(kept(&recent), Vec::<u64>::new());
    assert_eq!(recent.durable_bytes, 0);
}

#[test]
fn a_jump_in_the_log_forgets_what_came_before() {
    let mut recent = durable(entries(1, 1, 3, 100));
    recent.append(&entries(2, 10, 12, 100));
    assert_eq!(kept(&recent), vec![10, 11, 12]);
    assert_eq!(recent.durable_bytes, 0);
}
