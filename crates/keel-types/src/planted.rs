//! Planted bugs: test-only switches that each break one guarantee on purpose, so the
//! Jepsen-style harness can show that its checkers catch them. They exist only in builds with
//! the `planted-bugs` feature; without it `active` is a constant `false` and every planted
//! branch compiles away. One process plants at most one bug, for its whole life.

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
}

impl PlantedBug {
    pub const ALL: [PlantedBug; 5] = [
        PlantedBug::StaleRead,
        PlantedBug::AckBeforeFsync,
        PlantedBug::DoubleApply,
        PlantedBug::LockNoExpiry,
        PlantedBug::IdemStaleComplete,
    ];

    pub fn name(self) -> &'static str {
        match self {
            PlantedBug::StaleRead => "stale-read",
            PlantedBug::AckBeforeFsync => "ack-before-fsync",
            PlantedBug::DoubleApply => "double-apply",
            PlantedBug::LockNoExpiry => "lock-no-expiry",
            PlantedBug::IdemStaleComplete => "idem-stale-complete",
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
}
