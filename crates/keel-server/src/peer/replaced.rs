//! A call that waits on a range's leader while this node's replica of the range learns that
//! another leader was elected (the one asked was paused or cut off, and the others elected
//! another): a read is answered `NotLeader` naming the new leader at once, so its caller asks
//! there; a write, which may have reached the old leader, is answered `OutcomeUnknown` if the
//! old leader has not answered `limits::FORWARDED_WRITE_GRACE_MS` later (a transfer's old
//! leader answers in time), instead of at the call's deadline. Used for requests forwarded
//! to a range's leader (`requests::router`) and calls to the meta range's leader
//! (`ranges::meta`). Knows nothing of what the calls do.

use std::future::{Future, pending};
use std::time::Duration;

use keel_raft::RaftGroup;
use keel_types::{KvError, NodeId, limits};
use tracing::debug;

/// How long a call waits on its leader before the local replica is watched for a new one:
/// watching the replica's metrics wakes on every apply, and an election takes most of a
/// second, so calls answered at once pay nothing.
const WATCH_AFTER_MS: u64 = 100;

/// `call`'s answer, unless `group` (this node's replica of the range, if it has one) learns
/// within `left` that a node other than `leader` was elected in a later term than now:
/// then the answer above, for a read or a `write`.
pub(crate) async fn unless_replaced<T>(
    group: Option<&RaftGroup>,
    leader: NodeId,
    write: bool,
    left: Duration,
    call: impl Future<Output = Result<T, KvError>>,
) -> Result<T, KvError> {
    let term = group.map(RaftGroup::term);
    let replaced = async {
        tokio::time::sleep(Duration::from_millis(WATCH_AFTER_MS)).await;
        if let (Some(group), Some(term)) = (group, term)
            && let Some(new) = group.await_new_leader(term, leader, left).await
        {
            if write {
                let grace = limits::FORWARDED_WRITE_GRACE_MS;
                tokio::time::sleep(Duration::from_millis(grace)).await;
            }
            return (group.range(), new);
        }
        pending().await
    };
    tokio::select! {
        biased;
        answer = call => answer,
        (range_id, new) = replaced => {
            debug!(%range_id, leader, new_leader = new.0, "leader replaced while a call waited on it");
            match write {
                false => Err(KvError::NotLeader {
                    range_id,
                    leader: Some(new),
                }),
                true => Err(KvError::OutcomeUnknown {
                    message: format!(
                        "range {range_id} elected node {} while the call waited on node \
                         {leader}; it may or may not have been carried out",
                        new.0
                    ),
                }),
            }
        }
    }
}
