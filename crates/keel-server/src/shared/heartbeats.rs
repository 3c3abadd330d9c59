//! The last heartbeat of every node as this node received it (`Heartbeats`), with the client
//! address the node gave in it (with `--peer-listen`, the address clients are told), how often
//! heartbeats go out, and how a node stands by them (`judge`). The heartbeat task itself is
//! `cluster/heartbeat.rs`. Knows nothing of the network.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use keel_types::{NodeId, NodeReport};

/// How often a node sends its heartbeats.
pub(crate) const HEARTBEAT_INTERVAL_MS: u64 = 1_000;
/// A node whose last heartbeat is older than this is suspect: it takes no new replicas, but
/// its own are left alone until it is dead.
pub(crate) const SUSPECT_AFTER_MS: u64 = 3 * HEARTBEAT_INTERVAL_MS;

/// The last heartbeat of each node, as this node received it (its own included).
#[derive(Default)]
pub(crate) struct Heartbeats {
    seen: Mutex<BTreeMap<NodeId, Seen>>,
}

/// One node's last heartbeat.
#[derive(Debug, Clone)]
pub(crate) struct Seen {
    pub at: Instant,
    pub report: NodeReport,
    /// The address clients use for the node, as it said; `None` from a node that does not
    /// say (a release before the peer port).
    pub client_addr: Option<String>,
}

impl Heartbeats {
    /// Records `node`'s heartbeat; an empty `client_addr` is none.
    pub fn record(&self, node: NodeId, report: NodeReport, client_addr: String) {
        let seen = Seen {
            at: Instant::now(),
            report,
            client_addr: Some(client_addr).filter(|addr| !addr.is_empty()),
        };
        self.lock().insert(node, seen);
    }

    /// The client address `node` gave in its last heartbeat.
    pub fn client_addr(&self, node: NodeId) -> Option<String> {
        self.lock().get(&node)?.client_addr.clone()
    }

    /// Every node's last heartbeat.
    pub fn all(&self) -> BTreeMap<NodeId, Seen> {
        self.lock().clone()
    }

    /// When each node's last heartbeat arrived (without copying the reports).
    pub fn last_seen(&self) -> BTreeMap<NodeId, Instant> {
        self.lock()
            .iter()
            .map(|(node, seen)| (*node, seen.at))
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<NodeId, Seen>> {
        self.seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// How a node stands by its heartbeats, judged at `now` by a meta leader that has been
/// listening since `since` (a node is never dead sooner than `dead_after` after that, so a new
/// meta leader does not declare dead the nodes it has not heard from yet).
pub(crate) fn judge(
    last: Option<Instant>,
    since: Instant,
    now: Instant,
    dead_after: Duration,
) -> keel_meta::Liveness {
    let heard = last.map_or(since, |last| last.max(since));
    let silent = now.saturating_duration_since(heard);
    if last.is_some() && silent < Duration::from_millis(SUSPECT_AFTER_MS) {
        keel_meta::Liveness::Live
    } else if silent < dead_after {
        keel_meta::Liveness::Suspect
    } else {
        keel_meta::Liveness::Dead
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_meta::Liveness;

    #[test]
    fn nodes_are_live_then_suspect_then_dead() {
        let since = Instant::now();
        let dead_after = Duration::from_secs(60);
        let at = |ms: u64| since + Duration::from_millis(ms);
        let cases = [
            // (last heartbeat, now, judged)
            (Some(at(0)), at(1_000), Liveness::Live),
            (Some(at(0)), at(SUSPECT_AFTER_MS - 1), Liveness::Live),
            (Some(at(0)), at(SUSPECT_AFTER_MS), Liveness::Suspect),
            (Some(at(0)), at(59_999), Liveness::Suspect),
            (Some(at(0)), at(60_000), Liveness::Dead),
            (Some(at(58_000)), at(60_000), Liveness::Live),
            // Never heard from: suspect until dead_after past the start of listening.
            (None, at(1), Liveness::Suspect),
            (None, at(59_999), Liveness::Suspect),
            (None, at(60_000), Liveness::Dead),
        ];
        for (last, now, expected) in cases {
            assert_eq!(
                judge(last, since, now, dead_after),
                expected,
                "{last:?} {now:?}"
            );
        }
        // A heartbeat from before a new meta leader started listening counts from its start.
        let before = since.checked_sub(Duration::from_secs(600)).unwrap_or(since);
        assert_eq!(
            judge(Some(before), since, at(59_999), dead_after),
            Liveness::Suspect
        );
    }
}
