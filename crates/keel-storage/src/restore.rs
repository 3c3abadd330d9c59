//! Restoring ranges into a fresh store from snapshots another cluster took (`keel restore`),
//! and summarizing a snapshot file for a backup. Knows nothing of the backup file that
//! carried the snapshots, of the network or of the cluster the store will serve.
//!
//! A restored range keeps everything its snapshot holds — rows with their create and mod
//! revisions and expiries, the range's revision counter, clock and session horizon, sessions
//! and request records, locks, fences, idempotency records, span and epoch — and gets a new
//! Raft identity, the one a split child starts with (`split::initial_log_id`): applied =
//! purged = the initial log id, no log entries, no vote, and a membership of one voter, the
//! restoring node; its conf_version grows by one for that membership. openraft then starts
//! it as an initialized single-voter group that elects itself, its next write takes
//! revision + 1, and replicas added later receive it by snapshot. The source cluster's log
//! ids and memberships are not kept: they name nodes of another cluster.
//!
//! The data goes in through the install path (`install::replace_data`: bounded
//! transactions), then one durable commit writes the state and the Raft state
//! (`op::restore`). The meta range is not restored but written anew
//! (`Store::restore_meta`): the restored ranges' descriptors, the restoring node, and the
//! range-id allocator past every restored id. A restore is not
//! crash-safe on its own: the caller starts from an empty data dir and deletes it on failure.

use std::collections::{BTreeMap, BTreeSet};

use keel_types::{NodeDescriptor, RangeDescriptor, RangeId, Revision};

use crate::error::StorageError;
use crate::install;
use crate::meta::{self, MetaRow};
use crate::op::Op;
use crate::raft_types::{Membership, StoredMembership};
use crate::snapshot::{RangeFacts, SnapshotHeader, SnapshotReader};
use crate::snapshot_file::SnapshotFile;
use crate::split::initial_log_id;
use crate::store::Store;
use crate::tables::{self, KeySpan, RAFT_META, SM_META, SmState};

/// What a snapshot file holds, as a backup records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotSummary {
    /// Span, epoch, conf_version and voters of the range in the snapshot.
    pub descriptor: RangeDescriptor,
    /// The range's revision in the snapshot.
    pub revision: Revision,
    /// The log index the snapshot covers (0: none).
    pub applied_index: u64,
}

impl SnapshotFile {
    /// The range, revision and log index the snapshot of `range` in this file holds.
    pub async fn summary(&self, range: RangeId) -> Result<SnapshotSummary, StorageError> {
        let (_, header, facts) = SnapshotReader::open_with_facts(self.path()).await?;
        let facts = facts.unwrap_or_else(|| RangeFacts::unrecorded(range));
        let mut voters: Vec<_> = header.last_membership.voter_ids().collect();
        voters.sort_unstable();
        voters.dedup();
        Ok(SnapshotSummary {
            descriptor: facts
                .span
                .descriptor(range, facts.epoch, facts.conf_version, voters),
            revision: header.revision,
            applied_index: header.last_log_id.map_or(0, |id| id.index),
        })
    }
}

impl Store {
    /// Restores `range` from `snapshot` (a snapshot file of another cluster) as a new group
    /// whose one voter is `voter` (see the module doc); returns its descriptor. Refused for the
    /// meta range, for a range this store holds anything of, and for a span overlapping a
    /// range it holds. The file is read, not kept.
    pub async fn restore_range(
        &self,
        range: RangeId,
        snapshot: &SnapshotFile,
        voter: &NodeDescriptor,
    ) -> Result<RangeDescriptor, StorageError> {
        self.check()?;
        if range == RangeId::META {
            return Err(refused(
                range,
                "the meta range is written anew, not restored",
            ));
        }
        if self.holds(range).await? {
            return Err(refused(range, "this store already holds it"));
        }
        snapshot.verify().await?;
        let (mut reader, source, recorded) =
            SnapshotReader::open_with_facts(snapshot.path()).await?;
        let facts = recorded.unwrap_or_else(|| RangeFacts::unrecorded(range));
        install::refuse_overlap(self, range, &facts.span).await?;
        let header = SnapshotHeader {
            last_log_id: Some(initial_log_id()),
            last_membership: single_voter(voter),
            revision: source.revision,
        };
        let facts = RangeFacts {
            conf_version: facts.conf_version + 1,
            ..facts
        };
        let state = install::replace_data(self, range, &header, facts, &mut reader).await?;
        let descriptor = state.descriptor(range);
        self.call(Op::RestoreFinish { range, state }).await?;
        tracing::info!(%range, revision = source.revision, "range restored");
        Ok(descriptor)
    }

    /// Writes the meta range of a restored cluster: `ranges` (as `restore_range` returned
    /// them), `voter` as its one node and voter, and the range-id allocator past every id of
    /// `ranges`. Refused when this store holds anything of the meta range.
    pub async fn restore_meta(
        &self,
        ranges: &[RangeDescriptor],
        voter: &NodeDescriptor,
    ) -> Result<(), StorageError> {
        self.check()?;
        if self.holds(RangeId::META).await? {
            return Err(refused(RangeId::META, "this store already holds it"));
        }
        let next = ranges
            .iter()
            .map(|range| range.id.0 + 1)
            .max()
            .unwrap_or(0)
            .max(meta::FIRST_ALLOCATED_RANGE_ID);
        let mut rows: Vec<MetaRow> = ranges.iter().cloned().map(MetaRow::Range).collect();
        rows.push(MetaRow::Node(voter.clone()));
        rows.push(MetaRow::NextRangeId(next));
        let state = SmState {
            applied: Some(initial_log_id()),
            membership: single_voter(voter),
            span: KeySpan::none(),
            ..SmState::default()
        };
        self.call(Op::RestoreMeta { state, rows }).await?;
        tracing::info!(
            ranges = ranges.len(),
            next_range_id = next,
            "meta range written"
        );
        Ok(())
    }

    /// Whether this store has any state of `range`: state-machine state, Raft state or log.
    async fn holds(&self, range: RangeId) -> Result<bool, StorageError> {
        let logged = self.wal().ranges().contains(&range);
        self.read(move |txn| {
            let sm_meta = txn
                .open_table(SM_META)
                .map_err(|e| StorageError::redb("open sm_meta", e))?;
            let raft_meta = txn
                .open_table(RAFT_META)
                .map_err(|e| StorageError::redb("open raft_meta", e))?;
            Ok(logged
                || tables::has_sm_state(&sm_meta, range)?
                || tables::ranges_in(&raft_meta)?.contains(&range))
        })
        .await
    }
}

/// A membership of one voter, `voter`, at the initial log id.
fn single_voter(voter: &NodeDescriptor) -> StoredMembership {
    let membership = Membership::new(
        vec![BTreeSet::from([voter.id])],
        BTreeMap::from([(voter.id, voter.addr.clone())]),
    )
    .expect("one voter with its address is a valid membership");
    StoredMembership::new(Some(initial_log_id()), membership)
}

fn refused(range: RangeId, why: &str) -> StorageError {
    StorageError::Restore {
        range,
        detail: why.to_string(),
    }
}

#[cfg(test)]
mod tests;
