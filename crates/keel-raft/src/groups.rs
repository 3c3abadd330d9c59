//! The Raft groups hosted by one node, keyed by range, and the receiving side of the
//! `Transport`: decode a peer's message, hand it to the right group, encode the reply.
//! Knows nothing of tonic; the server's Raft service calls these with the raw bytes.
//!
//! A parked (quiesced) group wakes on any Raft message of a peer but one: a heartbeat without
//! entries from the leader it agreed to keep quiet with, in that leader's term.
//!
//! A group starts only through `ensure`, called by the node for the ranges it knows it hosts
//! (its store's ranges, the meta range's descriptors naming it, a split it applied); never
//! because a peer sent a message for an unknown range, so a stray message cannot make a node
//! host a range. `ensure` is serialized: one group per range, never two.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, RwLock};

use futures::future::BoxFuture;
use futures::{Stream, StreamExt};
use keel_storage::Store;
use keel_storage::raft_types::TypeConfig;
use keel_types::{KvError, RangeDescriptor, RangeId};
use openraft::raft::{AppendEntriesRequest, TransferLeaderRequest, VoteRequest};
use tracing::{debug, info, warn};

use crate::error::{GroupError, InboundError};
use crate::group::RaftGroup;
use crate::quiet_state::Parked;
use crate::read_calls::ReadIndexRequest;
use crate::snapshot::SnapshotHeader;
use crate::timings::RaftTimings;
use crate::transport::{RpcKind, Transport};
use crate::wire;

/// Starts the replica of a range on this node from whatever the store holds for it.
pub type Starter =
    Arc<dyn Fn(RangeId) -> BoxFuture<'static, Result<RaftGroup, GroupError>> + Send + Sync>;

/// The groups of one node. Clone shares the same set.
#[derive(Clone)]
pub struct Groups {
    inner: Arc<Inner>,
}

struct Inner {
    groups: RwLock<BTreeMap<RangeId, Arc<RaftGroup>>>,
    starter: Starter,
    /// Held while a group starts or retires, so a range gets one group.
    starting: tokio::sync::Mutex<Starting>,
}

/// What keeps groups from starting.
#[derive(Default)]
struct Starting {
    /// The node is shutting down: no group starts any more.
    closed: bool,
    /// Ranges whose replica is being removed from the store: none starts until released.
    retired: BTreeSet<RangeId>,
}

impl Groups {
    /// Groups started by `starter`.
    pub fn new(starter: Starter) -> Groups {
        Groups {
            inner: Arc::new(Inner {
                groups: RwLock::default(),
                starter,
                starting: tokio::sync::Mutex::default(),
            }),
        }
    }

    /// Groups of node `node_id` whose replicas keep their log and state in `store` and talk
    /// to peers through `transport`.
    pub fn on_store<T: Transport>(
        node_id: keel_types::NodeId,
        store: Store,
        timings: RaftTimings,
        transport: Arc<T>,
    ) -> Groups {
        let starter: Starter = Arc::new(move |range| {
            let (store, timings, transport) = (store.clone(), timings.clone(), transport.clone());
            Box::pin(
                async move { RaftGroup::start(node_id, range, &store, &timings, transport).await },
            )
        });
        Groups::new(starter)
    }

    /// The group of `range`, started first if this node runs none yet.
    pub async fn ensure(&self, range: RangeId) -> Result<Arc<RaftGroup>, GroupError> {
        if let Some(group) = self.get(range) {
            return Ok(group);
        }
        let starting = self.inner.starting.lock().await;
        if starting.closed {
            return Err(GroupError::ShuttingDown(range));
        }
        if starting.retired.contains(&range) {
            return Err(GroupError::Retired(range));
        }
        if let Some(group) = self.get(range) {
            return Ok(group);
        }
        let group = Arc::new((self.inner.starter)(range).await?);
        self.write().insert(range, group.clone());
        info!(range_id = range.0, "group started");
        Ok(group)
    }

    /// Stops the group of `range`, if one runs, and keeps one from starting until
    /// `release(range)`: the node is removing its replica from the store.
    pub async fn retire(&self, range: RangeId) {
        let mut starting = self.inner.starting.lock().await;
        starting.retired.insert(range);
        let group = self.write().remove(&range);
        drop(starting);
        if let Some(group) = group {
            group.shutdown().await;
            info!(range_id = range.0, "group stopped for removal");
        }
    }

    /// Lets a group of a retired range start again (its removal finished or failed).
    pub async fn release(&self, range: RangeId) {
        self.inner.starting.lock().await.retired.remove(&range);
    }

    pub fn get(&self, range: RangeId) -> Option<Arc<RaftGroup>> {
        self.inner
            .groups
            .read()
            .expect("groups lock poisoned")
            .get(&range)
            .cloned()
    }

    /// Every hosted group, in range order.
    pub fn all(&self) -> Vec<Arc<RaftGroup>> {
        self.inner
            .groups
            .read()
            .expect("groups lock poisoned")
            .values()
            .cloned()
            .collect()
    }

    /// Splits `parent`, which this node leads, at `at` into a new range `child` (see
    /// `RaftGroup::split`), starts the child's group here and makes it campaign at once: its
    /// replicas are the parent's, so the parent's leader is the one most likely to be up to
    /// date everywhere, and nobody else would campaign before an election timeout. A child
    /// that fails to start here is started later from the store's range events.
    pub async fn split(
        &self,
        parent: &RaftGroup,
        at: Vec<u8>,
        child: RangeId,
        expected_epoch: u64,
    ) -> Result<(RangeDescriptor, RangeDescriptor), KvError> {
        let halves = parent.split(at, child, expected_epoch).await?;
        match self.ensure(child).await {
            Ok(group) => {
                if let Err(error) = group.elect().await {
                    warn!(range_id = child.0, %error, "new range could not campaign");
                }
            }
            Err(error) => warn!(range_id = child.0, %error, "starting the new range's group"),
        }
        Ok(halves)
    }

    /// Stops every group; no group starts afterwards.
    pub async fn shutdown(&self) {
        let mut starting = self.inner.starting.lock().await;
        starting.closed = true;
        let groups = std::mem::take(&mut *self.write());
        drop(starting);
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
                let carries = !request.entries.is_empty();
                let (term, leader) = (request.vote.leader_id.term, request.vote.leader_id.node_id);
                let reply = wire::encode(&raft.append_entries(request).await)?;
                // A heartbeat of the leader this replica agreed to keep quiet with does not
                // wake it: that leader still ticks until every follower agreed.
                group.unpark_if(kind.name(), |parked| {
                    let quiet_with_sender = matches!(parked, Parked::Follower { leader: l, quiet }
                        if *l == leader && quiet.term == term);
                    carries || !quiet_with_sender
                });
                reply
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
            // Wakes a parked leader as its own reads do; a follower asked by mistake stays
            // parked and refuses.
            RpcKind::ReadIndex => {
                let _: ReadIndexRequest = wire::decode(payload)?;
                wire::encode(&group.serve_read_index().await)?
            }
        };
        // Someone campaigns or hands leadership over: the group must tick again.
        if !matches!(kind, RpcKind::AppendEntries | RpcKind::ReadIndex) {
            group.unpark_if(kind.name(), |_| true);
        }
        Ok(reply)
    }

    /// Receives a snapshot for `range`: the encoded header, then the file's bytes in chunks.
    /// Chunks are written to disk as they arrive, so memory stays bounded. A damaged snapshot
    /// (`StorageError::SnapshotDamaged`: the leader's file or the bytes in transit) is refused
    /// and its file deleted, as is a snapshot whose span overlaps another range with state on
    /// this node (`Overlap`); the leader sends it again later. Returns the encoded `Result<SnapshotResponse, Fatal>` to send back.
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
        group.unpark_if("install_snapshot", |_| true);
        let store = group.store();
        let mut incoming = store.incoming_snapshot(range).await?;
        let mut chunks = std::pin::pin!(chunks);
        let mut bytes = 0usize;
        while let Some(chunk) = chunks.next().await {
            let chunk = chunk.map_err(|e| InboundError::SnapshotStream(e.to_string()))?;
            bytes += chunk.len();
            incoming.write_chunk(&chunk).await?;
        }
        let file = incoming.finish().await?;
        debug!(range_id = range.0, bytes, "snapshot received");
        // A damaged file is refused here: openraft would stop the group on a failed install.
        let overlap = match file.verify().await {
            Ok(()) => store.snapshot_overlap(range, &file).await,
            Err(error) => {
                warn!(range_id = range.0, %error, "received snapshot is damaged; refused");
                Err(error)
            }
        };
        match overlap {
            Ok(None) => {}
            Ok(Some(other)) => {
                remove_snapshot(&file).await;
                info!(
                    range_id = range.0,
                    other = other.0,
                    "snapshot overlaps a local range; refused"
                );
                return Err(InboundError::Overlap { range, other });
            }
            Err(error) => {
                remove_snapshot(&file).await;
                return Err(error.into());
            }
        }
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

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<RangeId, Arc<RaftGroup>>> {
        self.inner.groups.write().expect("groups lock poisoned")
    }
}

/// Deletes a received snapshot that will not be installed.
async fn remove_snapshot(file: &keel_storage::SnapshotFile) {
    if let Err(error) = tokio::fs::remove_file(file.path()).await {
        warn!(path = %file.path().display(), %error, "removing a refused snapshot");
    }
}
