//! Linearizable reads on a follower, by ReadIndex: the follower asks its group's leader for a
//! read index (the leader confirms with a quorum that it still leads and answers its commit
//! point), waits until it has applied that index itself, then reads its own state machine.
//! Every write acknowledged before the read arrived is then visible. Reads arriving together
//! share calls (`read_calls.rs`). The leader's side is `serve_read_index`.
//!
//! Any failure (no leader known, the leader refuses or is unreachable, this replica does not
//! apply the index in time) leaves the read unserved: the caller answers `NotLeader`, never a
//! stale value. Knows nothing of tonic, routing or what is read.

use keel_storage::raft_types::{LogId, TypeConfig};
use keel_types::KvError;
use openraft::ReadPolicy;
use openraft::async_runtime::WatchReceiver;
use openraft::error::{LinearizableReadError, RaftError};
use openraft::raft::linearizable_read::{Linearizer, ReadLogId};
use tokio::time::Instant;
use tracing::debug;

use crate::group::RaftGroup;
use crate::quiet_state::Wake;
use crate::read_calls::{ReadIndexCounts, ReadIndexError, ReadIndexRefusal, ReadIndexReply};

impl RaftGroup {
    /// Makes a linearizable read on this replica, which does not lead, wait until it is as
    /// fresh as the leader's commit point at its arrival (see the module doc). `NotLeader`,
    /// naming the leader this replica knows of, when it cannot.
    pub(crate) async fn follower_read_barrier(&self) -> Result<(), KvError> {
        let deadline = Instant::now() + self.read_timeout();
        let ready = match self.read_index.index(self.raft(), deadline).await {
            Ok(index) => self.await_applied(index, deadline).await,
            Err(error) => Err(error),
        };
        ready.map_err(|error| {
            debug!(range_id = self.range().0, %error, "follower read not served here");
            self.not_leader_now()
        })
    }

    /// Answers a follower's read index call: the read log id once a quorum confirmed this
    /// replica leads. Wakes a quiesced leader, as its own reads do.
    pub(crate) async fn serve_read_index(&self) -> ReadIndexReply {
        let _use = self.begin_use(Wake::Leader).await;
        let policy = ReadPolicy::ReadIndex;
        let asked =
            tokio::time::timeout(self.read_timeout(), self.raft().get_read_linearizer(policy));
        let linearizer = match asked.await {
            Err(_) => {
                let message = format!("no quorum answered within {:?}", self.read_timeout());
                return Err(ReadIndexRefusal::Unconfirmed { message });
            }
            Ok(Err(error)) => return Err(refusal(error)),
            Ok(Ok(linearizer)) => linearizer,
        };
        self.read_index.count_served();
        Ok(*linearizer.read_log_id().log_id())
    }

    /// How many read index calls this replica sent and answered, and reads that waited.
    pub fn read_index_counts(&self) -> ReadIndexCounts {
        self.read_index.counts()
    }

    /// Waits until this replica applied `index`, by `deadline`.
    async fn await_applied(&self, index: LogId, deadline: Instant) -> Result<(), ReadIndexError> {
        let applied = self.raft().metrics().borrow_watched().last_applied;
        let linearizer = Linearizer::new(self.node_id(), ReadLogId::from_log_id(index), applied);
        let timeout = deadline.saturating_duration_since(Instant::now());
        match linearizer.try_await_ready(self.raft(), Some(timeout)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(state)) => Err(ReadIndexError::Behind {
                applied: state.applied().map_or(0, |id| id.index),
                index: index.index,
                timeout,
            }),
            Err(fatal) => Err(ReadIndexError::Stopped(fatal.to_string())),
        }
    }
}

/// Why openraft gave no read linearizer, as the follower is told.
fn refusal(error: RaftError<TypeConfig, LinearizableReadError<TypeConfig>>) -> ReadIndexRefusal {
    match error {
        RaftError::APIError(LinearizableReadError::ForwardToLeader(forward)) => {
            ReadIndexRefusal::NotLeader {
                leader: forward.leader_id,
            }
        }
        RaftError::APIError(LinearizableReadError::QuorumNotEnough(error)) => {
            ReadIndexRefusal::Unconfirmed {
                message: error.to_string(),
            }
        }
        RaftError::Fatal(error) => ReadIndexRefusal::Stopped {
            message: error.to_string(),
        },
    }
}
