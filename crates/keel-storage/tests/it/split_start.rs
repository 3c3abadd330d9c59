//! A split child's Raft state as openraft sees it: a real `openraft::Raft` started on the
//! child of a split (one voter, no network) is an initialized group that elects itself,
//! builds its first snapshot and applies writes above the parent's revisions.

use std::sync::Arc;
use std::time::Duration;

use keel_storage::raft_types::{Entry, Membership, TypeConfig};
use keel_storage::{SnapshotFile, StateMachine};
use keel_types::{BatchOp, Command, CommandOutcome, Mutation, NodeAddr, NodeId, RangeId, Split};
use openraft::entry::RaftEntry;
use openraft::error::{RPCError, ReplicationClosed, StreamingError, Unreachable};
use openraft::network::{RPCOption, RaftNetworkFactory, RaftNetworkV2};
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse};
use openraft::raft::{VoteRequest, VoteResponse};
use openraft::storage::RaftStateMachine;
use openraft::{Config, ServerState};

use super::{append, apply, blank, log_id, open_temp, puts};

/// A network that reaches nobody: a one-voter group needs none.
struct Nowhere;

fn unreachable() -> Unreachable<TypeConfig> {
    Unreachable::new(&std::io::Error::other("no network in this test"))
}

impl RaftNetworkFactory<TypeConfig> for Nowhere {
    type Network = Nowhere;

    async fn new_client(&mut self, _target: NodeId, _node: &NodeAddr) -> Nowhere {
        Nowhere
    }
}

impl RaftNetworkV2<TypeConfig> for Nowhere {
    type SnapshotData = SnapshotFile;

    async fn append_entries(
        &mut self,
        _rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        Err(RPCError::Unreachable(unreachable()))
    }

    async fn vote(
        &mut self,
        _rpc: VoteRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        Err(RPCError::Unreachable(unreachable()))
    }

    async fn full_snapshot(
        &mut self,
        _vote: keel_storage::raft_types::Vote,
        _snapshot: keel_storage::raft_types::Snapshot,
        _cancel: impl Future<Output = ReplicationClosed> + Send + 'static,
        _option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        Err(StreamingError::Unreachable(unreachable()))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_child_starts_as_an_initialized_group() {
    let (_dir, store) = open_temp();
    let split = Split {
        at: b"m".to_vec(),
        child: RangeId(2),
        expected_epoch: 0,
    };
    let voters = Membership::new_with_defaults(vec![[1].into()], []);
    let entries: Vec<Entry> = vec![
        blank(1, 0),
        Entry::new_membership(log_id(1, 1, 1), voters),
        puts(1, 2, &[(b"a", b"1"), (b"x", b"2")]),
        Entry::new_normal(log_id(1, 1, 3), Command::Split(split)),
    ];
    append(&mut store.log_store(RangeId(1)), entries.clone())
        .await
        .unwrap();
    apply(&mut store.state_machine(RangeId(1)), entries)
        .await
        .unwrap();

    let config = Config {
        heartbeat_interval: 50,
        election_timeout_min: 150,
        election_timeout_max: 300,
        ..Config::default()
    };
    let child: StateMachine = store.state_machine(RangeId(2));
    let raft = openraft::Raft::<TypeConfig, StateMachine>::new(
        1,
        Arc::new(config.validate().unwrap()),
        Nowhere,
        store.log_store(RangeId(2)),
        child.clone(),
    )
    .await
    .unwrap();
    assert!(
        raft.is_initialized().await.unwrap(),
        "the split made the child's first membership"
    );
    raft.wait(Some(Duration::from_secs(10)))
        .state(ServerState::Leader, "the child's one voter elects itself")
        .await
        .unwrap();

    let put = BatchOp::Put {
        key: b"y".to_vec(),
        value: b"3".to_vec(),
        condition: None,
        return_previous: false,
        ttl_ms: None,
    };
    let write = Command::Mutate(Mutation {
        request: None,
        now_ms: 0,
        ops: vec![put],
    });
    let response = raft.client_write(write).await.unwrap();
    assert!(
        matches!(response.data, CommandOutcome::Applied { revision: 2, .. }),
        "the child's first write follows the parent's revision 1: {:?}",
        response.data
    );
    let rows: Vec<Vec<u8>> = child
        .scan(b"", b"", 0, 0)
        .await
        .unwrap()
        .kvs
        .into_iter()
        .map(|kv| kv.key)
        .collect();
    assert_eq!(rows, vec![b"x".to_vec(), b"y".to_vec()]);
    let mut sm = child.clone();
    let snapshot = sm.get_current_snapshot().await.unwrap();
    assert!(
        snapshot.is_some(),
        "openraft built the child's first snapshot"
    );
    raft.shutdown().await.unwrap();
}
