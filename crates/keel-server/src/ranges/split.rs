//! Splitting a range on its leader: the one path `Cluster.Split` and the automatic split
//! driver share. Allocates the new range's id from the meta range, proposes the split
//! through the parent's Raft log (every replica splits at the same log position; no data is
//! copied), starts the new range's group here and makes it campaign, and publishes both
//! halves to the meta range. Knows nothing of gRPC.

use keel_raft::RaftGroup;
use keel_types::validate::{check_split_key, show_key};
use keel_types::{KvError, MetaCommand, MetaOutcome, RangeDescriptor, RangeId};
use tracing::{info, warn};

use crate::ranges::meta;
use crate::ranges::publisher;
use crate::shared::Shared;

/// Splits `group`'s range, which this node must lead, so that `at` starts a new range.
/// Returns the parent's descriptor after the split (ending at `at`) and the new range's.
///
/// `NotLeader` when this node does not lead the range; `KeyOutOfRange` when `at` is not in
/// it; `InvalidArgument` when `at` already starts it; `EpochMismatch` when the range split
/// (or changed) between reading its descriptor and applying the split. A failure to publish
/// the halves is only logged: the split happened, and the publisher retries.
pub(crate) async fn split_range(
    shared: &Shared,
    group: &RaftGroup,
    at: Vec<u8>,
) -> Result<(RangeDescriptor, RangeDescriptor), KvError> {
    check_split_key(&at)?;
    let range = group.range();
    if range == RangeId::META {
        return Err(KvError::invalid(
            "the meta range holds no keys; it does not split",
        ));
    }
    if !group.is_leader() {
        return Err(KvError::NotLeader {
            range_id: range,
            leader: group.leader().filter(|(id, _)| *id != shared.node_id),
        });
    }
    let descriptor = group.descriptor().await?;
    if !descriptor.contains(&at) {
        return Err(KvError::KeyOutOfRange {
            key: at,
            range: Box::new(descriptor),
        });
    }
    if at == descriptor.start {
        return Err(KvError::invalid(format!(
            "key {} already starts range {descriptor}",
            show_key(&at)
        )));
    }
    let child = allocate_range_id(shared).await?;
    let (left, right) = shared
        .groups
        .split(group, at, child, descriptor.epoch)
        .await?;
    info!(%left, %right, "range split");
    if let Err(error) = publisher::publish(shared, vec![left.clone(), right.clone()]).await {
        warn!(%left, %right, %error, "publishing a split; the publisher tries again");
    }
    Ok((left, right))
}

/// A range id never used before, from the meta range's allocator.
async fn allocate_range_id(shared: &Shared) -> Result<RangeId, KvError> {
    let command = MetaCommand::AllocateRangeIds { count: 1 };
    match meta::propose_meta(shared, command).await? {
        MetaOutcome::RangeIdsAllocated { first, count: 1 } => Ok(first),
        other => {
            warn!(
                ?other,
                "the meta range answered an id allocation with another outcome"
            );
            Err(KvError::unavailable(
                "the meta range answered an id allocation with another outcome; nothing was split",
            ))
        }
    }
}
