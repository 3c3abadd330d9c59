//! The Raft groups hosted by one node, keyed by range, and the receiving side of the
//! `Transport`: decode a peer's message, hand it to the right group, encode the reply.
//! Knows nothing of tonic; the server's Raft service calls these with the raw bytes.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use futures::{Stream, StreamExt};
use keel_storage::raft_types::TypeConfig;
use keel_types::RangeId;
use openraft::raft::{AppendEntriesRequest, TransferLeaderRequest, VoteRequest};
use tracing::debug;

use crate::error::{GroupError, InboundError};
use crate::group::RaftGroup;
use crate::snapshot::SnapshotHeader;
use crate::transport::RpcKind;
use crate::wire;

/// The groups of one node. Clone shares the same set.
#[derive(Clone, Default)]
pub struct Groups {
    groups: Arc<RwLock<BTreeMap<RangeId, Arc<RaftGroup>>>>,
}

impl Groups {
    pub fn new() -> Groups {
        Groups::default()
    }

    /// Adds a started group; a node hosts at most one replica of a range.
    pub fn insert(&self, group: RaftGroup) -> Result<Arc<RaftGroup>, GroupError> {
        let mut groups = self.groups.write().expect("groups lock poisoned");
        let range = group.range();
        if groups.contains_key(&range) {
            return Err(GroupError::AlreadyHosted(range));
        }
        let group = Arc::new(group);
        groups.insert(range, group.clone());
        Ok(group)
    }

    /// Removes a group from the set; the caller shuts it down.
    pub fn remove(&self, range: RangeId) -> Option<Arc<RaftGroup>> {
        self.groups
            .write()
            .expect("groups lock poisoned")
            .remove(&range)
    }

    pub fn get(&self, range: RangeId) -> Option<Arc<RaftGroup>> {
        self.groups
            .read()
            .expect("groups lock poisoned")
            .get(&range)
            .cloned()
    }

    /// Every hosted group, in range order.
    pub fn all(&self) -> Vec<Arc<RaftGroup>> {
        self.groups
            .read()
            .expect("groups lock poisoned")
            .values()
            .cloned()
            .collect()
    }

    /// Removes and shuts down every group.
    pub async fn shutdown(&self) {
        let groups = std::mem::take(&mut *self.groups.write().expect("groups lock poisoned"));
        for group in groups.into_values() {
            group.shutdown().await;
        }
    }

    /// Handles a peer's Raft request for `range` and returns the encoded
    /// `Result<reply, RaftError>` to send back.
    pub async fn handle(
        &self,
        range: RangeId,
        kind: RpcKind,
        payload: &[u8],
    ) -> Result<Vec<u8>, InboundError> {
        let group = self.get(range).ok_or(InboundError::UnknownRange(range))?;
        let raft = group.raft();
        let reply = match kind {
            RpcKind::AppendEntries => {
                let request: AppendEntriesRequest<TypeConfig> = wire::decode(payload)?;
                wire::encode(&raft.append_entries(request).await)?
            }
            RpcKind::Vote => {
                let request: VoteRequest<TypeConfig> = wire::decode(payload)?;
                wire::encode(&raft.vote(request).await)?
            }
            RpcKind::PreVote => {
                let request: VoteRequest<TypeConfig> = wire::decode(payload)?;
                wire::encode(&raft.pre_vote(request).await)?
            }
            RpcKind::TransferLeader => {
                let request: TransferLeaderRequest<TypeConfig> = wire::decode(payload)?;
                wire::encode(&raft.handle_transfer_leader(request).await)?
            }
        };
        Ok(reply)
    }

    /// Receives a snapshot for `range`: the encoded header, then the file's bytes in chunks.
    /// Chunks are written to disk as they arrive, so memory stays bounded. Returns the
    /// encoded `Result<SnapshotResponse, Fatal>` to send back.
    pub async fn install_snapshot<S, E>(
        &self,
        range: RangeId,
        header: &[u8],
        chunks: S,
    ) -> Result<Vec<u8>, InboundError>
    where
        S: Stream<Item = Result<Vec<u8>, E>> + Send,
        E: std::fmt::Display,
    {
        let group = self.get(range).ok_or(InboundError::UnknownRange(range))?;
        let header: SnapshotHeader = wire::decode(header)?;
        let mut incoming = group.store().incoming_snapshot(range).await?;
        let mut chunks = std::pin::pin!(chunks);
        let mut bytes = 0usize;
        while let Some(chunk) = chunks.next().await {
            let chunk = chunk.map_err(|e| InboundError::SnapshotStream(e.to_string()))?;
            bytes += chunk.len();
            incoming.write_chunk(&chunk).await?;
        }
        let file = incoming.finish().await?;
        debug!(range_id = range.0, bytes, "snapshot received");
        let snapshot = openraft::alias::SnapshotOf::<TypeConfig, _> {
            meta: header.meta,
            snapshot: file,
        };
        let reply = group
            .raft()
            .install_full_snapshot(header.vote, snapshot)
            .await;
        Ok(wire::encode(&reply)?)
    }
}
