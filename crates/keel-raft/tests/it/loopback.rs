//! A `Transport` that hands messages straight to another in-process node's `Groups`, with
//! switchable "down" nodes, a held-back membership entry and the gRPC message size limit.
//! Exercises the real encoding and dispatch, without sockets.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use keel_raft::{
    Groups, Peer, RaftGroup, RaftMessage, RaftTimings, RpcKind, SnapshotReader, Transport,
    TransportError, wire,
};
use keel_storage::raft_types::TypeConfig;
use keel_storage::{SnapshotFile, Store};
use keel_types::{NodeAddr, NodeId, RangeId, limits};
use openraft::EntryPayload;
use openraft::raft::AppendEntriesRequest;

#[derive(Default)]
pub struct Loopback {
    nodes: Mutex<BTreeMap<NodeId, (Groups, Store)>>,
    down: Mutex<BTreeSet<NodeId>>,
    /// Appends carrying a uniform membership with exactly these voters fail to reach anyone.
    held: Mutex<Option<BTreeSet<NodeId>>>,
}

impl Loopback {
    fn node(&self, target: &Peer) -> Result<(Groups, Store), TransportError> {
        let unreachable = || TransportError::Unreachable {
            target: target.id,
            message: "connection refused".to_string(),
        };
        if self.down.lock().unwrap().contains(&target.id) {
            return Err(unreachable());
        }
        self.nodes
            .lock()
            .unwrap()
            .get(&target.id)
            .cloned()
            .ok_or_else(unreachable)
    }

    pub fn set_down(&self, node: NodeId, down: bool) {
        let mut set = self.down.lock().unwrap();
        if down {
            set.insert(node);
        } else {
            set.remove(&node);
        }
    }

    /// Holds back (`Some`) or lets through (`None`) every append that carries a uniform
    /// membership of exactly `voters`: the second step of a joint change to them.
    pub fn hold_membership(&self, voters: Option<BTreeSet<NodeId>>) {
        *self.held.lock().unwrap() = voters;
    }

    fn is_held(&self, kind: RpcKind, message: &RaftMessage) -> bool {
        let held = self.held.lock().unwrap();
        let Some(voters) = held.as_ref() else {
            return false;
        };
        if kind != RpcKind::AppendEntries {
            return false;
        }
        let request: AppendEntriesRequest<TypeConfig> = wire::decode(&message.payload).unwrap();
        request.entries.iter().any(|entry| match &entry.payload {
            EntryPayload::Membership(membership) => {
                let configs = membership.get_joint_config();
                configs.len() == 1 && &configs[0] == voters
            }
            _ => false,
        })
    }
}

fn remote(target: NodeId, error: impl std::fmt::Display) -> TransportError {
    TransportError::Remote {
        target,
        message: error.to_string(),
    }
}

impl Transport for Loopback {
    async fn call(
        &self,
        target: &Peer,
        kind: RpcKind,
        message: RaftMessage,
        deadline: Duration,
    ) -> Result<Vec<u8>, TransportError> {
        let (groups, _) = self.node(target)?;
        if self.is_held(kind, &message) {
            return Err(TransportError::Unreachable {
                target: target.id,
                message: "membership entry held back".to_string(),
            });
        }
        if message.payload.len() > limits::GRPC_MESSAGE_BYTES_MAX {
            let size = message.payload.len();
            return Err(remote(
                target.id,
                format!("message of {size} bytes is too large"),
            ));
        }
        let handled = groups.handle(message.range, kind, &message.payload);
        match tokio::time::timeout(deadline, handled).await {
            Err(_) => Err(TransportError::Timeout {
                target: target.id,
                deadline,
            }),
            Ok(reply) => reply.map_err(|e| remote(target.id, e)),
        }
    }

    async fn send_snapshot(
        &self,
        target: &Peer,
        message: RaftMessage,
        snapshot: SnapshotFile,
        _deadline: Duration,
    ) -> Result<Vec<u8>, TransportError> {
        let (groups, _) = self.node(target)?;
        let mut reader = SnapshotReader::open(&snapshot)
            .await
            .map_err(|e| remote(target.id, e))?;
        let mut chunks = Vec::new();
        while let Some(chunk) = reader
            .next_chunk()
            .await
            .map_err(|e| remote(target.id, e))?
        {
            chunks.push(Ok::<_, String>(chunk));
        }
        groups
            .install_snapshot(
                message.range,
                &message.payload,
                futures::stream::iter(chunks),
            )
            .await
            .map_err(|e| remote(target.id, e))
    }
}

/// One in-process node: its store (in a temp dir) and its groups.
pub struct TestNode {
    pub id: NodeId,
    pub store: Store,
    pub groups: Groups,
    _dir: tempfile::TempDir,
}

impl TestNode {
    pub async fn start(id: NodeId, network: &Arc<Loopback>) -> TestNode {
        let dir = tempfile::tempdir().unwrap();
        let store =
            Store::open(&dir.path().join("keel.redb"), &dir.path().join("snapshots")).unwrap();
        let timings = RaftTimings {
            heartbeat_ms: 50,
            election_timeout_ms_min: 300,
            election_timeout_ms_max: 600,
            snapshot_logs_since_last: 20,
            ..RaftTimings::default()
        };
        let groups = Groups::on_store(id, store.clone(), timings, network.clone());
        groups.ensure(RangeId::FIRST).await.unwrap();
        network
            .nodes
            .lock()
            .unwrap()
            .insert(id, (groups.clone(), store.clone()));
        TestNode {
            id,
            store,
            groups,
            _dir: dir,
        }
    }

    pub fn group(&self) -> Arc<RaftGroup> {
        self.groups.get(RangeId::FIRST).unwrap()
    }

    /// The group of `range`, which this node must run.
    pub fn group_of(&self, range: RangeId) -> Arc<RaftGroup> {
        self.groups.get(range).unwrap()
    }

    pub fn addr(id: NodeId) -> NodeAddr {
        NodeAddr::new(format!("node-{id}"))
    }

    pub async fn stop(self) {
        self.groups.shutdown().await;
        self.store.shutdown();
    }
}
