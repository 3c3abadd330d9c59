//! openraft's network for one group: encodes each request, hands it to the node's `Transport`
//! with the range id and openraft's deadline, and decodes the reply. Knows nothing of tonic.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use keel_storage::SnapshotFile;
use keel_storage::raft_types::{Entry, TypeConfig, Vote};
use keel_types::txn::{CompareTarget, Txn, TxnMutation, TxnOp, TxnSpan};
use keel_types::{
    Acquirer, BatchOp, Command, Condition, CoordinationOp, MetaCommand, NodeAddr, NodeId,
    RangeDescriptor, RangeId, limits,
};
use openraft::error::{
    Fatal, NetworkError, RPCError, RaftError, ReplicationClosed, StreamingError, Timeout,
    Unreachable,
};
use openraft::network::{RPCOption, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, TransferLeaderRequest,
    TransferLeaderResponse, VoteRequest, VoteResponse,
};
use openraft::{EntryPayload, RPCTypes};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::snapshot::SnapshotHeader;
use crate::transport::{Peer, RaftMessage, RpcKind, Transport, TransportError};
use crate::wire;

type Snapshot = openraft::alias::SnapshotOf<TypeConfig, SnapshotFile>;

/// Makes one `GroupNetwork` per peer of a group.
pub(crate) struct NetworkFactory<T> {
    pub range: RangeId,
    pub from: NodeId,
    pub transport: Arc<T>,
}

impl<T: Transport> RaftNetworkFactory<TypeConfig> for NetworkFactory<T> {
    type Network = GroupNetwork<T>;

    async fn new_client(&mut self, target: NodeId, node: &NodeAddr) -> GroupNetwork<T> {
        GroupNetwork {
            range: self.range,
            from: self.from,
            peer: Peer {
                id: target,
                addr: node.clone(),
            },
            transport: self.transport.clone(),
        }
    }
}

/// The link from one group's replica on this node to its replica on `peer`.
pub(crate) struct GroupNetwork<T> {
    range: RangeId,
    from: NodeId,
    peer: Peer,
    transport: Arc<T>,
}

impl<T: Transport> GroupNetwork<T> {
    /// Sends one request and decodes the peer's `Result<reply, RaftError>`.
    async fn call<Req, Resp>(
        &self,
        kind: RpcKind,
        action: RPCTypes,
        request: &Req,
        deadline: Duration,
    ) -> Result<Resp, RPCError<TypeConfig>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
    {
        let payload =
            wire::encode(request).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let message = RaftMessage {
            range: self.range,
            from: self.from,
            payload,
        };
        let sent = self.transport.call(&self.peer, kind, message, deadline);
        let reply = sent
            .await
            .map_err(|e| self.rpc_error(e, action, deadline))?;
        let reply: Result<Resp, RaftError<TypeConfig>> =
            wire::decode(&reply).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        reply.map_err(|e| remote_stopped(self.peer.id, &e))
    }

    fn rpc_error(
        &self,
        error: TransportError,
        action: RPCTypes,
        deadline: Duration,
    ) -> RPCError<TypeConfig> {
        match error {
            TransportError::Unreachable { .. } => RPCError::Unreachable(Unreachable::new(&error)),
            TransportError::Timeout { .. } => RPCError::Timeout(Timeout {
                action,
                id: self.from,
                target: self.peer.id,
                timeout: deadline,
            }),
            TransportError::Remote { .. } => RPCError::Network(NetworkError::new(&error)),
        }
    }

    async fn send_snapshot(
        &self,
        vote: Vote,
        snapshot: Snapshot,
        option: &RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let header = SnapshotHeader {
            vote,
            meta: snapshot.meta,
        };
        let payload = wire::encode(&header).map_err(|e| NetworkError::new(&e))?;
        let message = RaftMessage {
            range: self.range,
            from: self.from,
            payload,
        };
        let deadline = option.hard_ttl();
        let sent = self
            .transport
            .send_snapshot(&self.peer, message, snapshot.snapshot, deadline);
        let reply = sent
            .await
            .map_err(|e| self.rpc_error(e, RPCTypes::InstallSnapshot, deadline))?;
        let reply: Result<SnapshotResponse<TypeConfig>, Fatal<TypeConfig>> =
            wire::decode(&reply).map_err(|e| NetworkError::new(&e))?;
        reply.map_err(|e| StreamingError::Unreachable(Unreachable::new(&e)))
    }
}

/// How many leading entries fit in `budget` bytes (at least one, so progress is always
/// made), and their estimated size.
fn entries_within(entries: &[Entry], budget: usize) -> (usize, usize) {
    let mut bytes = 0usize;
    for (count, entry) in entries.iter().enumerate() {
        let entry_bytes = entry_bytes(entry);
        if count > 0 && bytes + entry_bytes > budget {
            return (count, bytes);
        }
        bytes += entry_bytes;
    }
    (entries.len(), bytes)
}

/// The deadline of an append carrying `bytes` of entries. openraft gives every append the
/// heartbeat interval, which suits heartbeats but not a follower writing and syncing MiBs: an
/// append with entries gets at least `APPEND_DEADLINE_MS_MIN` plus `APPEND_DEADLINE_MS_PER_MIB`
/// per MiB, or a large catch-up would time out and be resent forever.
fn append_deadline(openraft_ttl: Duration, bytes: usize) -> Duration {
    const APPEND_DEADLINE_MS_MIN: u64 = 1_000;
    const APPEND_DEADLINE_MS_PER_MIB: u64 = 1_000;
    if bytes == 0 {
        return openraft_ttl;
    }
    let mib = (bytes as u64).div_ceil(1024 * 1024);
    let floor = APPEND_DEADLINE_MS_MIN + APPEND_DEADLINE_MS_PER_MIB * mib;
    openraft_ttl.max(Duration::from_millis(floor))
}

/// Framing allowed per part of an entry in `entry_bytes`: generous.
const FRAMING_BYTES: usize = 64;

/// Encoded size of an entry, estimated from the bytes it carries plus generous framing.
fn entry_bytes(entry: &Entry) -> usize {
    match &entry.payload {
        EntryPayload::Normal(Command::Mutate(mutation)) => {
            let carried: usize = mutation.ops.iter().map(op_bytes).sum();
            carried + FRAMING_BYTES * (mutation.ops.len() + 2)
        }
        EntryPayload::Normal(Command::Write { ops }) => {
            let carried: usize = ops
                .iter()
                .map(|op| op_bytes(&BatchOp::from(op.clone())))
                .sum();
            carried + FRAMING_BYTES * (ops.len() + 1)
        }
        EntryPayload::Normal(Command::Cleanup(cleanup)) => {
            let keys: usize = cleanup.keys.iter().map(|key| key.key.len()).sum();
            keys + FRAMING_BYTES * (cleanup.keys.len() + cleanup.sessions.len() + 1)
        }
        EntryPayload::Normal(Command::FencedMutate { fence, mutation }) => {
            let carried: usize = mutation.ops.iter().map(op_bytes).sum();
            fence.lock.len() + carried + FRAMING_BYTES * (mutation.ops.len() + 3)
        }
        EntryPayload::Normal(Command::Coordinate(coordination)) => {
            coordination_bytes(&coordination.op) + FRAMING_BYTES * 2
        }
        EntryPayload::Normal(Command::Reclaim(reclaim) | Command::ReclaimUnrecorded(reclaim)) => {
            let records = reclaim.locks.iter().chain(&reclaim.records);
            let keys: usize = records.clone().map(|record| record.key.len()).sum();
            keys + FRAMING_BYTES * (records.count() + 1)
        }
        EntryPayload::Normal(Command::Split(split)) => split.at.len() + FRAMING_BYTES * 2,
        EntryPayload::Normal(Command::Check(check)) => 2 * check.locate.len() + FRAMING_BYTES,
        EntryPayload::Normal(Command::Hold(_)) => 16 + FRAMING_BYTES,
        EntryPayload::Normal(Command::Txn(mutation)) => txn_bytes(&mutation.txn),
        EntryPayload::Normal(Command::TxnV11(mutation)) => {
            txn_bytes(&TxnMutation::from(mutation.clone()).txn)
        }
        EntryPayload::Normal(Command::Lease(lease)) => {
            lease.op.namespace().len() + 16 + FRAMING_BYTES * 2
        }
        EntryPayload::Normal(Command::ExpireLeases(expire)) => {
            let namespaces: usize = expire.leases.iter().map(|l| l.namespace.len()).sum();
            namespaces + 16 * expire.leases.len() + FRAMING_BYTES * (expire.leases.len() + 1)
        }
        EntryPayload::Normal(Command::Meta(meta)) => meta_bytes(meta) + FRAMING_BYTES * 2,
        EntryPayload::Blank => FRAMING_BYTES,
        EntryPayload::Membership(membership) => {
            let nodes: usize = membership.nodes().map(|(_, node)| node.addr.len()).sum();
            nodes + FRAMING_BYTES * (membership.nodes().count() + 1)
        }
    }
}

/// Bytes of keys, span ends and values a transaction carries, with framing per part.
fn txn_bytes(txn: &Txn) -> usize {
    let span = |span: &TxnSpan| span.key.len() + span.end.as_ref().map_or(0, |end| end.len());
    let compares: usize = txn
        .compares
        .iter()
        .map(|compare| match &compare.target {
            CompareTarget::Value(value) => span(&compare.span) + value.len(),
            _ => span(&compare.span) + 8,
        })
        .sum();
    let ops: usize = txn
        .success
        .iter()
        .chain(&txn.failure)
        .map(|op| match op {
            TxnOp::Read(read) => span(&read.span) + 40,
            TxnOp::Put(put) => put.key.len() + put.value.len() + 8,
            TxnOp::Delete(delete) => span(&delete.span),
            TxnOp::Txn(nested) => txn_bytes(nested),
        })
        .sum();
    compares
        + ops
        + FRAMING_BYTES * (txn.compares.len() + txn.success.len() + txn.failure.len() + 1)
}

/// Bytes of names, owners, keys and results a lock or idempotency op carries.
fn coordination_bytes(op: &CoordinationOp) -> usize {
    let acquirer = |acquirer: &Acquirer| acquirer.owner.len();
    match op {
        CoordinationOp::Acquire { name, acquirer: a } => name.len() + acquirer(a),
        CoordinationOp::Renew { name, .. } => name.len(),
        CoordinationOp::Release {
            name, successor, ..
        } => name.len() + successor.as_ref().map_or(0, acquirer),
        CoordinationOp::Begin { key, owner, .. } => key.len() + owner.len(),
        CoordinationOp::Complete { key, result, .. } => key.len() + result.len(),
        CoordinationOp::Abort { key, .. } => key.len(),
    }
}

/// Bytes of keys, addresses and replica ids a meta command carries.
fn meta_bytes(meta: &MetaCommand) -> usize {
    let descriptor = |range: &RangeDescriptor| {
        let end = range.end().map_or(0, <[u8]>::len);
        range.start.len() + end + 8 * range.replicas.len() + 64
    };
    match meta {
        MetaCommand::UpdateRanges { ranges } => ranges.iter().map(descriptor).sum(),
        MetaCommand::AllocateRangeIds { .. } | MetaCommand::SetNodeState { .. } => 0,
        MetaCommand::RegisterNode(node) => node.addr.addr.len(),
    }
}

fn op_bytes(op: &BatchOp) -> usize {
    let condition = match op.condition() {
        Some(Condition::Value(value)) => value.len(),
        _ => 0,
    };
    let value = match op {
        BatchOp::Put { value, .. } => value.len(),
        BatchOp::Delete { .. } | BatchOp::Increment { .. } => 0,
    };
    op.key().len() + value + condition
}

/// The peer's Raft has stopped: treat it like a node that is down, so openraft backs off.
fn remote_stopped(target: NodeId, error: &RaftError<TypeConfig>) -> RPCError<TypeConfig> {
    let error = TransportError::Remote {
        target,
        message: error.to_string(),
    };
    RPCError::Unreachable(Unreachable::new(&error))
}

impl<T: Transport> openraft::network::RaftNetworkV2<TypeConfig> for GroupNetwork<T> {
    type SnapshotData = SnapshotFile;

    /// Sends at most `limits::RAFT_APPEND_BYTES_MAX` of entries; when openraft offers more,
    /// sends a prefix and reports it as a partial success, so openraft sends the rest next.
    async fn append_entries(
        &mut self,
        mut rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        let kind = (RpcKind::AppendEntries, RPCTypes::AppendEntries);
        let (fitting, bytes) = entries_within(&rpc.entries, limits::RAFT_APPEND_BYTES_MAX);
        let deadline = append_deadline(option.hard_ttl(), bytes);
        if fitting == rpc.entries.len() {
            return self.call(kind.0, kind.1, &rpc, deadline).await;
        }
        rpc.entries.truncate(fitting);
        let last = rpc.entries.last().map(|entry| entry.log_id);
        let response = self.call(kind.0, kind.1, &rpc, deadline).await?;
        Ok(match response {
            AppendEntriesResponse::Success => AppendEntriesResponse::PartialSuccess(last),
            other => other,
        })
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call(RpcKind::Vote, RPCTypes::Vote, &rpc, option.hard_ttl())
            .await
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call(RpcKind::PreVote, RPCTypes::Vote, &rpc, option.hard_ttl())
            .await
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot,
        cancel: impl Future<Output = ReplicationClosed> + Send + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        tokio::select! {
            closed = cancel => Err(StreamingError::Closed(closed)),
            reply = self.send_snapshot(vote, snapshot, &option) => reply,
        }
    }

    async fn transfer_leader(
        &mut self,
        rpc: TransferLeaderRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<TransferLeaderResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call(
            RpcKind::TransferLeader,
            RPCTypes::TransferLeader,
            &rpc,
            option.hard_ttl(),
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use keel_storage::raft_types::LogId;
    use keel_types::Mutation;
    use openraft::entry::RaftEntry;

    use super::*;

    const MIB: usize = 1024 * 1024;

    fn log_id(index: u64) -> LogId {
        let leader = openraft::impls::leader_id_adv::LeaderId {
            term: 1,
            node_id: 1,
        };
        LogId::new(leader, index)
    }

    fn entry(index: u64, value_bytes: usize) -> Entry {
        let op = BatchOp::Put {
            key: b"k".to_vec(),
            value: vec![0; value_bytes],
            condition: Some(Condition::Value(vec![0; 10])),
            return_previous: false,
            ttl_ms: None,
        };
        let mutation = Mutation {
            request: None,
            now_ms: 0,
            ops: vec![op],
        };
        Entry::new_normal(log_id(index), Command::Mutate(mutation))
    }

    #[test]
    fn appends_are_cut_to_the_byte_budget() {
        let one_mib: Vec<Entry> = (1..=10).map(|i| entry(i, MIB)).collect();
        let per_entry = entry_bytes(&one_mib[0]);
        assert_eq!(per_entry, MIB + 1 + 10 + 3 * 64);
        let cases: Vec<(Vec<Entry>, usize, usize)> = vec![
            (Vec::new(), 8 * MIB, 0),
            (one_mib.clone(), 8 * MIB, 7),
            (one_mib.clone(), 100 * MIB, 10),
            (vec![entry(1, 5 * MIB)], MIB, 1),
            (vec![entry(1, 5 * MIB), entry(2, 1)], MIB, 1),
            (vec![Entry::new_blank(log_id(1))], 8 * MIB, 1),
        ];
        for (entries, budget, expected) in cases {
            let (count, bytes) = entries_within(&entries, budget);
            assert_eq!(
                count,
                expected,
                "{} entries, budget {budget}",
                entries.len()
            );
            let summed: usize = entries[..count].iter().map(entry_bytes).sum();
            assert_eq!(bytes, summed);
        }
    }

    #[test]
    fn split_and_meta_entries_count_the_bytes_they_carry() {
        let split = keel_types::Split {
            at: vec![b'm'; 1_000],
            child: RangeId(5),
            expected_epoch: 1,
        };
        let entry = Entry::new_normal(log_id(1), Command::Split(split));
        assert_eq!(entry_bytes(&entry), 1_000 + 2 * 64);
        let range = RangeDescriptor {
            id: RangeId(5),
            start: vec![b'a'; 100],
            end: Some(vec![b'z'; 200]),
            epoch: 2,
            conf_version: 0,
            replicas: vec![1, 2, 3],
        };
        let update = MetaCommand::UpdateRanges {
            ranges: vec![range.clone(), range],
        };
        let entry = Entry::new_normal(log_id(2), Command::Meta(update));
        assert_eq!(entry_bytes(&entry), 2 * (300 + 24 + 64) + 2 * 64);
        let register = MetaCommand::RegisterNode(keel_types::NodeDescriptor {
            id: 1,
            addr: NodeAddr::new("127.0.0.1:7001"),
        });
        let entry = Entry::new_normal(log_id(3), Command::Meta(register));
        assert_eq!(entry_bytes(&entry), 14 + 2 * 64);
    }

    #[test]
    fn appends_with_entries_get_time_to_sync() {
        let heartbeat = Duration::from_millis(150);
        assert_eq!(append_deadline(heartbeat, 0), heartbeat);
        assert_eq!(append_deadline(heartbeat, 1), Duration::from_millis(2_000));
        assert_eq!(
            append_deadline(heartbeat, 3 * MIB),
            Duration::from_millis(4_000)
        );
        let long = Duration::from_secs(60);
        assert_eq!(append_deadline(long, 3 * MIB), long);
    }
}
