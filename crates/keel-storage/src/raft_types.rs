//! The one place that declares how Keel instantiates openraft: node ids, node addresses,
//! log payloads and responses. Other crates name openraft types through these aliases.

use keel_types::{Command, CommandOutcome, NodeAddr, NodeId};

use crate::snapshot_file::SnapshotFile;

openraft::declare_raft_types!(
    /// Keel's openraft type configuration.
    pub TypeConfig:
        D = Command,
        R = CommandOutcome,
        NodeId = NodeId,
        Node = NodeAddr,
);

pub type LogId = openraft::alias::LogIdOf<TypeConfig>;
pub type Vote = openraft::alias::VoteOf<TypeConfig>;
pub type Entry = openraft::alias::EntryOf<TypeConfig>;
pub type Membership = openraft::Membership<NodeId, NodeAddr>;
pub type StoredMembership = openraft::alias::StoredMembershipOf<TypeConfig>;
pub type SnapshotMeta = openraft::alias::SnapshotMetaOf<TypeConfig>;
pub type LogState = openraft::storage::LogState<TypeConfig>;
pub type IoFlushed = openraft::storage::IOFlushed<TypeConfig>;
pub type EntryResponder = openraft::storage::EntryResponder<TypeConfig>;
pub type ApplyResponder = openraft::storage::ApplyResponder<TypeConfig>;
/// A snapshot of one range: its meta and the file holding it.
pub type Snapshot = openraft::alias::SnapshotOf<TypeConfig, SnapshotFile>;
