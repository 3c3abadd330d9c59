//! Whether the cluster's leaders have settled since this node started (`LeaderSettling`), so
//! that the node reports ready only once the rebalancer has nothing left to move: a fresh
//! cluster, or a node back from a restart, is not handed callers while leaderships still
//! travel. The meta range's leader judges after each look of its rebalancer, and every second
//! between looks (`judge`): settled when the look planned nothing, nothing was in flight, and
//! it knew every range's leader on a healthy node, for the nodes that look counted as healthy.
//! Every node hears that judgement in its heartbeat answers (`hear`). The wait holds only
//! until the node first reports ready (`pass`), and never longer than
//! `LEADERS_SETTLE_WAIT_MAX_MS` after the start: later moves are ordinary moves, which
//! forwarding rides out. Knows nothing of the network or of the rebalancer's rules.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use keel_types::NodeId;
use keel_types::limits::LEADERS_SETTLE_WAIT_MAX_MS;

pub(crate) struct LeaderSettling {
    /// This node.
    node: NodeId,
    /// When the node started.
    since: Instant,
    /// On the meta range's leader: the healthy nodes of its rebalancer's last look, when that
    /// look planned nothing with nothing in flight; `None` otherwise and on other nodes.
    judged: Mutex<Option<BTreeSet<NodeId>>>,
    /// The meta range's leader said the leaders settled with this node healthy.
    heard: AtomicBool,
    /// The node reported ready once: settling no longer holds it back.
    passed: AtomicBool,
}

impl LeaderSettling {
    pub fn new(node: NodeId, since: Instant) -> Self {
        LeaderSettling {
            node,
            since,
            judged: Mutex::new(None),
            heard: AtomicBool::new(false),
            passed: AtomicBool::new(false),
        }
    }

    /// The rebalancer's judgement after one look on the meta range's leader: `Some(healthy
    /// nodes)` when it planned nothing and had nothing in flight, `None` when it did, or
    /// when this node does not lead the meta range (any more).
    pub fn judge(&self, settled: Option<BTreeSet<NodeId>>) {
        if settled
            .as_ref()
            .is_some_and(|nodes| nodes.contains(&self.node))
        {
            self.hear();
        }
        *self.lock() = settled;
    }

    /// Whether the last judgement here found the leaders settled with `node` healthy: what
    /// this node tells `node` in its heartbeat answer.
    pub fn settled_for(&self, node: NodeId) -> bool {
        self.lock()
            .as_ref()
            .is_some_and(|nodes| nodes.contains(&node))
    }

    /// The meta range's leader said the leaders settled with this node healthy.
    pub fn hear(&self) {
        self.heard.store(true, Ordering::Relaxed);
    }

    /// Whether settling still holds the node back at `now`, and why.
    pub fn gate(&self, now: Instant) -> Result<(), String> {
        let waited = now.saturating_duration_since(self.since);
        let open = self.passed.load(Ordering::Relaxed)
            || self.heard.load(Ordering::Relaxed)
            || waited >= Duration::from_millis(LEADERS_SETTLE_WAIT_MAX_MS);
        match open {
            true => Ok(()),
            false => Err(format!(
                "the cluster's leaders have not settled since this node started {} ms ago \
                 (it waits at most {LEADERS_SETTLE_WAIT_MAX_MS} ms)",
                waited.as_millis()
            )),
        }
    }

    /// The node reports ready: from now on settling holds nothing back.
    pub fn pass(&self) {
        self.passed.store(true, Ordering::Relaxed);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<BTreeSet<NodeId>>> {
        self.judged
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(settling: &LeaderSettling, ms: u64) -> Result<(), String> {
        settling.gate(settling.since + Duration::from_millis(ms))
    }

    #[test]
    fn a_fresh_node_waits_until_it_hears_the_leaders_settled() {
        let settling = LeaderSettling::new(1, Instant::now());
        assert!(at(&settling, 0).is_err());
        assert!(at(&settling, LEADERS_SETTLE_WAIT_MAX_MS - 1).is_err());
        settling.hear();
        assert_eq!(at(&settling, 1), Ok(()));
    }

    #[test]
    fn the_wait_ends_at_its_bound_without_word() {
        let settling = LeaderSettling::new(1, Instant::now());
        assert_eq!(at(&settling, LEADERS_SETTLE_WAIT_MAX_MS), Ok(()));
    }

    #[test]
    fn once_passed_the_gate_stays_open() {
        let settling = LeaderSettling::new(1, Instant::now());
        settling.pass();
        assert_eq!(at(&settling, 0), Ok(()));
    }

    #[test]
    fn a_judgement_counts_only_for_the_nodes_it_found_healthy() {
        let settling = LeaderSettling::new(1, Instant::now());
        settling.judge(Some(BTreeSet::from([1, 2])));
        assert!(settling.settled_for(2));
        assert!(
            !settling.settled_for(3),
            "node 3 was not healthy in that look"
        );
        assert_eq!(at(&settling, 0), Ok(()), "the meta leader hears itself");
        settling.judge(None);
        assert!(!settling.settled_for(2), "a later look with work to do");
    }

    #[test]
    fn a_judgement_without_this_node_does_not_open_its_gate() {
        let settling = LeaderSettling::new(1, Instant::now());
        settling.judge(Some(BTreeSet::from([2, 3])));
        assert!(at(&settling, 0).is_err());
    }
}
