//! What the gRPC services of one node share: its id and address, its groups, store, peer
//! channels and health. Knows nothing of request semantics.

use std::sync::Arc;
use std::time::Duration;

use keel_raft::{Groups, RaftGroup, RaftTimings};
use keel_storage::Store;
use keel_types::{KvError, NodeId, RangeId, SharedClock};

use crate::config::KvSettings;
use crate::faults::Faults;
use crate::health::Health;
use crate::peers::Peers;

pub(crate) struct Shared {
    pub node_id: NodeId,
    /// The address peers and clients use for this node.
    pub addr: String,
    pub groups: Groups,
    pub store: Store,
    pub peers: Arc<Peers>,
    pub health: Health,
    pub timings: RaftTimings,
    pub kv: KvSettings,
    pub clock: SharedClock,
    pub faults: Faults,
}

impl Shared {
    /// The group serving `range`; `Unavailable` while this node hosts none.
    pub fn group(&self, range: RangeId) -> Result<Arc<RaftGroup>, KvError> {
        self.groups.get(range).ok_or_else(|| {
            KvError::unavailable(format!(
                "range {range} is not hosted on node {}",
                self.node_id
            ))
        })
    }

    /// The group serving `range`, on a node that serves: `Fatal` once the node stopped
    /// (storage failed), `Unavailable` while it hosts no such group.
    pub fn serving_group(&self, range: RangeId) -> Result<Arc<RaftGroup>, KvError> {
        self.health.check()?;
        self.group(range)
    }

    /// How long a forwarded request may take: the leader's own deadline plus one second of
    /// network slack.
    pub fn forward_deadline(&self, write: bool) -> Duration {
        let own = if write {
            self.timings.write_timeout_ms
        } else {
            self.timings.read_timeout_ms
        };
        Duration::from_millis(own + 1_000)
    }
}
