//! The planted bugs of keel-storage, each shown to change what it should, through the real
//! writer and redb: a split that loses the rows written just before it
//! (`split-drops-inflight`), a read that does not check the range's span (the storage half of
//! `stale-span`), an install that leaves out the snapshot's last writes
//! (`snapshot-skip-tail`). Each scenario runs unplanted in every build, and planted, in a
//! child process of this test binary (`keel_types::planted::check_planted`), in builds with
//! the `planted-bugs` feature.

use keel_types::{Command, RangeId, Revision, Split};
use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine};

use super::{apply_commands_to, mutate, open, put};
use crate::state_machine::{KeyRead, StateMachine};
use crate::store::Store;

/// Keys written on each side of the split at `r`.
const KEYS_PER_HALF: u64 = 10;

/// Writes `l00`, `r00`, `l01`, `r01`, ... to range 1, one write each (so `l{i}` has revision
/// 2i + 1 and `r{i}` 2i + 2), then splits it at `r` into range 2.
async fn written_then_split(store: &Store) {
    let mut commands = Vec::new();
    for i in 0..KEYS_PER_HALF {
        commands.push(mutate(vec![put(&format!("l{i:02}"), "v", None)]));
        commands.push(mutate(vec![put(&format!("r{i:02}"), "v", None)]));
    }
    commands.push(Command::Split(Split {
        at: b"r".to_vec(),
        child: RangeId(2),
        expected_epoch: 0,
    }));
    apply_commands_to(store, RangeId::FIRST, 1, commands).await;
}

/// The keys `prefix{i}`, `i` below `KEYS_PER_HALF`, whose revision (`revision(i)`) is at most
/// `max`.
fn keys_up_to(prefix: &str, max: Revision, revision: impl Fn(u64) -> Revision) -> Vec<String> {
    (0..KEYS_PER_HALF)
        .filter(|i| revision(*i) <= max)
        .map(|i| format!("{prefix}{i:02}"))
        .collect()
}

async fn keys(sm: &StateMachine) -> Vec<String> {
    let page = sm.scan(b"", b"", 0, 0).await.unwrap();
    let keys = page.kvs.into_iter().map(|kv| kv.key);
    keys.map(|key| String::from_utf8(key).unwrap()).collect()
}

/// The keys of each half after `written_then_split`, and the child's key count.
async fn halves_after_split() -> (Vec<String>, Vec<String>, u64) {
    let (_dir, store) = open();
    written_then_split(&store).await;
    let (parent, child) = (
        store.state_machine(RangeId(1)),
        store.state_machine(RangeId(2)),
    );
    let counted = child.counts().await.unwrap().keys;
    (keys(&parent).await, keys(&child).await, counted)
}

#[tokio::test]
async fn a_split_child_has_the_rows_written_just_before_the_split() {
    let (left, right, counted) = halves_after_split().await;
    assert_eq!(left, keys_up_to("l", Revision::MAX, |i| 2 * i + 1));
    assert_eq!(right, keys_up_to("r", Revision::MAX, |i| 2 * i + 2));
    assert_eq!(counted, KEYS_PER_HALF);
}

/// A read of `r03` (a key of the child) on the parent after the split.
async fn parent_read_of_a_child_key() -> KeyRead {
    let (_dir, store) = open();
    written_then_split(&store).await;
    let parent = store.state_machine(RangeId(1));
    parent.read_key(b"r03", 0).await.unwrap()
}

#[tokio::test]
async fn the_parent_refuses_a_read_of_a_key_that_split_off() {
    let read = parent_read_of_a_child_key().await;
    assert!(matches!(read, KeyRead::Outside { .. }), "{read:?}");
}

/// Writes `k00`..`k09` to range 1 of one store (revisions 1 to 10), snapshots it and installs
/// the snapshot into range 1 of another; returns the keys installed, their count as the
/// installed range keeps it, and whether both ranges name the same applied log id.
async fn installed_snapshot() -> (Vec<String>, u64, bool) {
    let (_source_dir, source) = open();
    let writes = (0..KEYS_PER_HALF)
        .map(|i| mutate(vec![put(&format!("k{i:02}"), "v", None)]))
        .collect();
    apply_commands_to(&source, RangeId::FIRST, 1, writes).await;
    let mut source = source.state_machine(RangeId::FIRST);
    let mut builder = source.get_snapshot_builder().await;
    let snapshot = builder.build_snapshot().await.unwrap();
    let (_target_dir, target) = open();
    let mut target = target.state_machine(RangeId::FIRST);
    target
        .install_snapshot(&snapshot.meta, snapshot.snapshot)
        .await
        .unwrap();
    let applied = |sm: &StateMachine| {
        let sm = sm.clone();
        async move { sm.applied().await.unwrap() }
    };
    let same = applied(&source).await == applied(&target).await;
    let counted = target.counts().await.unwrap().keys;
    (keys(&target).await, counted, same)
}

#[tokio::test]
async fn an_installed_snapshot_holds_every_row() {
    let (installed, counted, same_applied) = installed_snapshot().await;
    assert_eq!(installed, keys_up_to("k", Revision::MAX, |i| i + 1));
    assert_eq!(counted, KEYS_PER_HALF);
    assert!(same_applied);
}

#[cfg(feature = "planted-bugs")]
mod planted {
    use keel_types::planted::{PlantedBug, RECENT_REVISIONS, check_planted};

    use super::*;

    fn block_on<F: std::future::Future>(future: F) -> F::Output {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(future)
    }

    #[test]
    fn split_drops_inflight_loses_the_childs_latest_rows() {
        check_planted(PlantedBug::SplitDropsInflight, || {
            let (left, right, counted) = block_on(halves_after_split());
            let last = 2 * KEYS_PER_HALF;
            assert_eq!(left, keys_up_to("l", Revision::MAX, |i| 2 * i + 1));
            let kept = keys_up_to("r", last - RECENT_REVISIONS, |i| 2 * i + 2);
            assert!(kept.len() < KEYS_PER_HALF as usize, "{kept:?}");
            assert_eq!(right, kept);
            assert_eq!(counted, kept.len() as u64, "the child counts what it kept");
        });
    }

    #[test]
    fn stale_span_reads_a_key_that_split_off_on_the_parent() {
        check_planted(PlantedBug::StaleSpan, || {
            let read = block_on(parent_read_of_a_child_key());
            let KeyRead::Inside { kv: Some(kv), .. } = read else {
                panic!("the parent reads the key anyway: {read:?}");
            };
            assert_eq!(kv.key, b"r03");
        });
    }

    #[test]
    fn snapshot_skip_tail_installs_without_the_latest_rows() {
        check_planted(PlantedBug::SnapshotSkipTail, || {
            let (installed, counted, same_applied) = block_on(installed_snapshot());
            let kept = keys_up_to("k", KEYS_PER_HALF - RECENT_REVISIONS, |i| i + 1);
            assert!(kept.len() < KEYS_PER_HALF as usize, "{kept:?}");
            assert_eq!(installed, kept);
            assert_eq!(
                counted,
                kept.len() as u64,
                "the install counts what it wrote"
            );
            assert!(same_applied, "it still claims the snapshot's whole log");
        });
    }
}
