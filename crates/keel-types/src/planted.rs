//! Planted bugs: test-only switches that each break one guarantee on purpose, so the
//! Jepsen-style harness can show that its checkers catch them. They exist only in builds with
//! the `planted-bugs` feature; without it `active` is a constant `false` and every planted
//! branch compiles away. One process plants at most one bug, for its whole life; a test of a
//! planted bug therefore runs in a child process of its test binary (`check_planted`, test
//! support and the one place this crate starts a process, only in `planted-bugs` builds).

use std::sync::OnceLock;

/// A guarantee to break.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlantedBug {
    /// Linearizable and lease reads are served from the replica's local state without
    /// confirming leadership (no ReadIndex), on any replica: stale reads.
    StaleRead,
    /// Log appends are acknowledged to Raft before they are durable: a crash loses writes
    /// the cluster acknowledged.
    AckBeforeFsync,
    /// A retried request id is applied again instead of answered from its record.
    DoubleApply,
    /// A lock is granted without checking its holder's expiry: an acquire of a lock someone
    /// else holds takes it as if it were free (with a new, higher token), so two owners hold
    /// it at once.
    LockNoExpiry,
    /// An idempotency record accepts a `Complete` from any token while it is live, in
    /// progress or completed, and stores that result over the one it had: a stale owner's
    /// late result replaces the result others were given.
    IdemStaleComplete,
    /// A split loses, from the new right-hand range, the rows its parent wrote in its last
    /// `RECENT_REVISIONS` revisions before the split (as a split copying the child's rows as
    /// of its proposal would miss the writes in flight): acknowledged writes vanish, only
    /// where a range splits.
    SplitDropsInflight,
    /// After a split, a node routes a key no local range holds to the local range just below
    /// it (as if that range had kept its span from before the split), and a read does not
    /// check the range's span: a replica whose right-hand half went elsewhere answers reads of
    /// those keys from what its own file holds of them (nothing, once that half's replica was
    /// moved away).
    StaleSpan,
    /// A replica that installs a snapshot leaves out the rows the snapshot's last writes made
    /// (those at its last `RECENT_REVISIONS` revisions) while taking its whole applied log
    /// id: a replica made by a move, or caught up by a snapshot, misses recent writes.
    SnapshotSkipTail,
    /// Reads ignore their bounds (`max_staleness_ms`, `min_revision`): a follower read within
    /// a staleness bound or at a revision is served from whatever the replica has applied.
    UnboundedRead,
    /// A watch stream leaves out the events of every revision divisible by 7 while it
    /// reports its span complete past them: a watcher misses changes without a gap showing.
    WatchSkipsEvent,
    /// A read of a key at a revision answers with the key's row now, ignoring the changes
    /// made since: a read at an earlier revision sees a later write.
    ReadAtIgnoresHistory,
    /// A consistency check that finds a replica differing from the majority reports it but
    /// leaves it as it is (no re-creation, no hand-over): the replica keeps serving its
    /// wrong rows.
    SkipRepair,
}

/// How many of a range's latest revisions `SplitDropsInflight` and `SnapshotSkipTail` lose.
pub const RECENT_REVISIONS: u64 = 8;

impl PlantedBug {
    pub const ALL: [PlantedBug; 12] = [
        PlantedBug::StaleRead,
        PlantedBug::AckBeforeFsync,
        PlantedBug::DoubleApply,
        PlantedBug::LockNoExpiry,
        PlantedBug::IdemStaleComplete,
        PlantedBug::SplitDropsInflight,
        PlantedBug::StaleSpan,
        PlantedBug::SnapshotSkipTail,
        PlantedBug::UnboundedRead,
        PlantedBug::WatchSkipsEvent,
        PlantedBug::ReadAtIgnoresHistory,
        PlantedBug::SkipRepair,
    ];

    pub fn name(self) -> &'static str {
        match self {
            PlantedBug::StaleRead => "stale-read",
            PlantedBug::AckBeforeFsync => "ack-before-fsync",
            PlantedBug::DoubleApply => "double-apply",
            PlantedBug::LockNoExpiry => "lock-no-expiry",
            PlantedBug::IdemStaleComplete => "idem-stale-complete",
            PlantedBug::SplitDropsInflight => "split-drops-inflight",
            PlantedBug::StaleSpan => "stale-span",
            PlantedBug::SnapshotSkipTail => "snapshot-skip-tail",
            PlantedBug::UnboundedRead => "unbounded-read",
            PlantedBug::WatchSkipsEvent => "watch-skips-event",
            PlantedBug::ReadAtIgnoresHistory => "read-at-ignores-history",
            PlantedBug::SkipRepair => "skip-repair",
        }
    }

    pub fn from_name(name: &str) -> Option<PlantedBug> {
        PlantedBug::ALL.into_iter().find(|bug| bug.name() == name)
    }
}

static PLANTED: OnceLock<PlantedBug> = OnceLock::new();

/// Plants `bug` in this process. Fails if another bug is planted already, or if this build
/// has no `planted-bugs` feature.
pub fn plant(bug: PlantedBug) -> Result<(), String> {
    if !cfg!(feature = "planted-bugs") {
        return Err(format!(
            "cannot plant {}: this build has no `planted-bugs` feature",
            bug.name()
        ));
    }
    PLANTED
        .set(bug)
        .map_err(|_| format!("cannot plant {}: a bug is planted already", bug.name()))
}

/// Whether `bug` is planted in this process.
#[inline]
pub fn active(bug: PlantedBug) -> bool {
    cfg!(feature = "planted-bugs") && PLANTED.get() == Some(&bug)
}

/// Test support: runs `check` with `bug` planted, in a child process of the running test
/// binary (planting lasts for a process's whole life, and the binary's other tests must not
/// see it). Call it as the whole body of a `#[test]`: the child runs that test alone (libtest
/// names a test's thread after it) and plants `bug` first; the parent fails when the child
/// fails or did not run the test.
#[cfg(feature = "planted-bugs")]
pub fn check_planted(bug: PlantedBug, check: impl FnOnce()) {
    const CHILD: &str = "KEEL_PLANTED_BUG_CHECK";
    if let Ok(name) = std::env::var(CHILD) {
        assert_eq!(
            name,
            bug.name(),
            "the child process checks the bug it was started for"
        );
        plant(bug).expect("a child process plants its bug first");
        check();
        return;
    }
    let thread = std::thread::current();
    let test = thread
        .name()
        .filter(|name| *name != "main")
        .expect("libtest runs each test on a thread named after it");
    let binary = std::env::current_exe().expect("the path of the running test binary");
    let output = std::process::Command::new(binary)
        .args([test, "--exact", "--test-threads=1", "--nocapture"])
        .env(CHILD, bug.name())
        .output()
        .expect("running the test binary again");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("1 passed"),
        "{test} with {} planted, in a child process:\n{stdout}\n{}",
        bug.name(),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for bug in PlantedBug::ALL {
            assert_eq!(PlantedBug::from_name(bug.name()), Some(bug));
        }
        assert_eq!(PlantedBug::from_name("no-such-bug"), None);
    }

    #[cfg(not(feature = "planted-bugs"))]
    #[test]
    fn without_the_feature_nothing_can_be_planted() {
        assert!(plant(PlantedBug::StaleRead).is_err());
        assert!(!active(PlantedBug::StaleRead));
    }

    #[cfg(feature = "planted-bugs")]
    #[test]
    fn a_planted_check_runs_in_a_process_of_its_own() {
        check_planted(PlantedBug::DoubleApply, || {
            assert!(active(PlantedBug::DoubleApply));
            assert!(!active(PlantedBug::StaleRead));
            assert!(plant(PlantedBug::StaleRead).is_err(), "one bug per process");
        });
    }
}
