//! The last heartbeat of every node as this node received it (`Heartbeats`), with the client
//! address the node gave in it (with `--peer-listen`, the address clients are told), and its
//! last ping; how often heartbeats and pings go out, how a node stands by its heartbeats
//! (`judge`), and whether it fell silent (`LastHeard`). The heartbeat and ping tasks are
//! `cluster/heartbeat.rs`. Knows nothing of the network.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use keel_types::{NodeId, NodeReport};

/// How often a node sends its heartbeats.
pub(crate) const HEARTBEAT_INTERVAL_MS: u64 = 1_000;
/// How often a node pings its peers: the ping carries nothing, so it can come often enough
/// for the followers of quiesced ranges to notice a lost leader as soon as awake ranges do.
pub(crate) const PING_INTERVAL_MS: u64 = 200;
/// A node that pinged is silent once its pings have been missing this long. One late or
/// lost ping is no death: the bound spans several intervals.
pub(crate) const PING_SILENT_MS: u64 = 4 * PING_INTERVAL_MS;
/// A node that never pinged (a release before pings) is silent once its heartbeats have
/// been missing this long: more than two heartbeat intervals.
pub(crate) const HEARTBEAT_SILENT_MS: u64 = HEARTBEAT_INTERVAL_MS * 5 / 2;
const _: () = assert!(PING_SILENT_MS > 2 * PING_INTERVAL_MS);
const _: () = assert!(HEARTBEAT_SILENT_MS > 2 * HEARTBEAT_INTERVAL_MS);
/// A node whose last heartbeat is older than this is suspect: it takes no new replicas, but
/// its own are left alone until it is dead.
pub(crate) const SUSPECT_AFTER_MS: u64 = 3 * HEARTBEAT_INTERVAL_MS;

/// The last heartbeat of each node, as this node received it (its own included).
#[derive(Default)]
pub(crate) struct Heartbeats {
    seen: Mutex<BTreeMap<NodeId, Seen>>,
    /// When each node's last ping arrived; only nodes that sent a heartbeat are kept.
    pinged: Mutex<BTreeMap<NodeId, Instant>>,
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
    /// Records `node`'s heartbeat; an empty `client_addr` is none. A node whose heartbeats
    /// arrive while its pings stopped (it went back to a release before pings) is judged by
    /// its heartbeats again.
    pub fn record(&self, node: NodeId, report: NodeReport, client_addr: String) {
        let now = Instant::now();
        let seen = Seen {
            at: now,
            report,
            client_addr: Some(client_addr).filter(|addr| !addr.is_empty()),
        };
        self.lock().insert(node, seen);
        let stopped = Duration::from_millis(2 * HEARTBEAT_INTERVAL_MS);
        lock(&self.pinged)
            .retain(|id, at| *id != node || now.saturating_duration_since(*at) < stopped);
    }

    /// Records a ping from `node`, unless it never sent a heartbeat: a node is known by its
    /// heartbeats, and pings from unknown ids must not grow the map.
    pub fn record_ping(&self, node: NodeId) {
        if self.lock().contains_key(&node) {
            lock(&self.pinged).insert(node, Instant::now());
        }
    }

    /// When each node's last ping arrived (nodes that do not ping are absent).
    pub fn pinged(&self) -> BTreeMap<NodeId, Instant> {
        lock(&self.pinged).clone()
    }

    /// When each node last gave a sign of life, to judge silence by.
    pub fn last_heard(&self) -> LastHeard {
        LastHeard {
            beat: self.last_seen(),
            pinged: self.pinged(),
        }
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
        lock(&self.seen)
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// When each node last gave a sign of life: its last heartbeat and its last ping.
pub(crate) struct LastHeard {
    beat: BTreeMap<NodeId, Instant>,
    pinged: BTreeMap<NodeId, Instant>,
}

impl LastHeard {
    /// Whether this node has heard from `node` since it started (a heartbeat or a ping).
    pub fn heard_from(&self, node: NodeId) -> bool {
        self.beat.contains_key(&node) || self.pinged.contains_key(&node)
    }

    /// Whether `node` has been silent at `now` for `PING_SILENT_MS` plus `grace`: by its pings
    /// once it pinged, else (a release before pings) by its heartbeats and
    /// `HEARTBEAT_SILENT_MS`. A node never heard from is silent.
    pub fn silent(&self, node: NodeId, now: Instant, grace: Duration) -> bool {
        let (last, bound) = match self.pinged.get(&node) {
            Some(at) => (Some(at), PING_SILENT_MS),
            None => (self.beat.get(&node), HEARTBEAT_SILENT_MS),
        };
        last.is_none_or(|at| {
            now.saturating_duration_since(*at) >= Duration::from_millis(bound) + grace
        })
    }
}

/// How a node stands by its heartbeats, judged at `now` by a meta leader that has been
/// listening since `since`: live while its last heartbeat is recent; otherwise suspect, and
/// dead once it has been silent for `dead_after`, counted from `since` at the earliest (so a
/// new meta leader does not declare dead the nodes it has not heard from yet, nor call live
/// one whose last heartbeat it got long ago).
pub(crate) fn judge(
    last: Option<Instant>,
    since: Instant,
    now: Instant,
    dead_after: Duration,
) -> keel_meta::Liveness {
    let suspect_after = Duration::from_millis(SUSPECT_AFTER_MS);
    let heard = last.map_or(since, |last| last.max(since));
    if last.is_some_and(|last| now.saturating_duration_since(last) < suspect_after) {
        keel_meta::Liveness::Live
    } else if now.saturating_duration_since(heard) < dead_after {
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
    fn pings_are_kept_from_nodes_that_send_heartbeats_while_they_ping() {
        let heartbeats = Heartbeats::default();
        heartbeats.record_ping(2);
        assert!(heartbeats.last_heard().pinged.is_empty());
        let report = NodeReport {
            addr: keel_types::NodeAddr::new("127.0.0.1:1"),
            replicas: 0,
            leads: None,
        };
        heartbeats.record(2, report.clone(), String::new());
        heartbeats.record_ping(2);
        let heard = heartbeats.last_heard();
        assert_eq!(heard.pinged.keys().collect::<Vec<_>>(), [&2]);
        assert_eq!(heard.beat.keys().collect::<Vec<_>>(), [&2]);
        // Heartbeats go on while the pings stopped long ago: the pings are forgotten.
        let long_ago = Instant::now().checked_sub(Duration::from_millis(2 * HEARTBEAT_INTERVAL_MS));
        lock(&heartbeats.pinged).insert(2, long_ago.unwrap());
        heartbeats.record(2, report, String::new());
        assert!(heartbeats.last_heard().pinged.is_empty());
    }

    #[test]
    fn a_node_is_silent_by_its_pings_or_else_by_its_heartbeats() {
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        let (none, grace) = (Duration::ZERO, Duration::from_millis(100));
        // Node 2 pings; node 3 (a release before pings) only sends heartbeats.
        let heard = LastHeard {
            beat: BTreeMap::from([(2, at(0)), (3, at(0))]),
            pinged: BTreeMap::from([(2, at(0))]),
        };
        let cases = [
            // (node, now, grace, silent)
            (2, at(PING_SILENT_MS - 1), none, false),
            (2, at(PING_SILENT_MS), none, true),
            (2, at(PING_SILENT_MS), grace, false),
            (2, at(PING_SILENT_MS + 100), grace, true),
            (3, at(PING_SILENT_MS), none, false),
            (3, at(HEARTBEAT_SILENT_MS - 1), none, false),
            (3, at(HEARTBEAT_SILENT_MS), none, true),
            // Never heard from.
            (4, at(0), none, true),
        ];
        for (node, now, grace, silent) in cases {
            assert_eq!(
                heard.silent(node, now, grace),
                silent,
                "node {node} at {:?} with grace {grace:?}",
                now - start
            );
        }
    }

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
        // A heartbeat from before a new meta leader started listening counts from its start
        // for death, but an old one is no sign of life: suspect, not live.
        let before = since.checked_sub(Duration::from_secs(600)).unwrap_or(since);
        assert_eq!(
            judge(Some(before), since, at(59_999), dead_after),
            Liveness::Suspect
        );
        let lately = since.checked_sub(Duration::from_secs(17)).unwrap_or(since);
        assert_eq!(
            judge(Some(lately), since, at(1), dead_after),
            Liveness::Suspect
        );
    }
}
