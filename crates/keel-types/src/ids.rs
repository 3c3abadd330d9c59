//! Identifiers of nodes, ranges and revisions.

use serde::{Deserialize, Serialize};

/// A node (one `keel serve` process). Assigned by the operator, never reused.
pub type NodeId = u64;

/// A revision: the range's write counter after a write was applied. Every applied write
/// command takes the next revision; a key's revision never goes backwards.
pub type Revision = u64;

/// A range: a half-open key span `[start, end)` served by one Raft group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RangeId(pub u64);

impl RangeId {
    /// The meta range: range descriptors, the node registry and the range id allocator. It
    /// holds no user keys.
    pub const META: RangeId = RangeId(0);
    /// The first data range: the whole keyspace when the cluster starts, split from then on.
    pub const FIRST: RangeId = RangeId(1);
}

impl std::fmt::Display for RangeId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "r{}", self.0)
    }
}

/// Where a node is reached: its gRPC address (`host:port`). `Default` exists because
/// openraft's storage test suite builds nodes with it.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct NodeAddr {
    pub addr: String,
}

impl NodeAddr {
    pub fn new(addr: impl Into<String>) -> Self {
        NodeAddr { addr: addr.into() }
    }
}

impl std::fmt::Display for NodeAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.addr)
    }
}
