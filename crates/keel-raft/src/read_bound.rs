//! Reads within a bound (`ReadBound`): a replica serves a follower read from its own state
//! when that state is known current with the leader recently enough (`max_staleness_ms`)
//! and includes the revision the caller asks for (`min_revision`); otherwise it catches up
//! first with one linearizable barrier (a ReadIndex call when it follows).
//!
//! A replica knows it is current as of the start of its last linearizable barrier that
//! succeeded: such a barrier waits until the replica applied the leader's commit point of a
//! moment after it started (a follower's read index call is sent after the read arrived; a
//! leader confirms its leadership with a quorum after the read arrived). So the state is at
//! most `now - start` behind the leader, for as long as no barrier runs again (`freshness`
//! keeps that start). Follower reads without a bound never touch this.

use std::time::Duration;

use crate::group::RaftGroup;
use keel_types::planted::{self, PlantedBug};
use keel_types::{Consistency, KvError, ReadBound, Revision};

impl RaftGroup {
    /// Makes a read of this replica's state meet `consistency` and `bound`: the barrier of
    /// the consistency, then, if the state may be older than `bound.max_staleness_ms`
    /// (follower reads only) or lacks `bound.min_revision`, a linearizable barrier.
    /// `FutureRevision` when the range has not reached `min_revision` even then; the
    /// barrier's error (`NotLeader`, `Unavailable`) when the replica cannot catch up.
    pub async fn read_barrier_within(
        &self,
        consistency: Consistency,
        bound: ReadBound,
    ) -> Result<(), KvError> {
        self.read_barrier(consistency).await?;
        // The planted bug serves bounded reads as if they had no bound.
        if bound.is_none() || planted::active(PlantedBug::UnboundedRead) {
            return Ok(());
        }
        let stale = consistency == Consistency::Follower
            && bound
                .max_staleness_ms
                .is_some_and(|ms| !self.freshness.within(Duration::from_millis(ms)));
        let behind = match bound.min_revision {
            Some(min) => self.applied_revision().await? < min,
            None => false,
        };
        if !stale && !behind {
            return Ok(());
        }
        self.read_barrier(Consistency::Linearizable).await?;
        if let Some(requested) = bound.min_revision {
            let current = self.applied_revision().await?;
            if current < requested {
                return Err(KvError::FutureRevision { requested, current });
            }
        }
        Ok(())
    }

    async fn applied_revision(&self) -> Result<Revision, KvError> {
        let (revision, _) = self
            .state_machine()
            .applied()
            .await
            .map_err(|e| KvError::fatal(format!("range {}: {e}", self.range())))?;
        Ok(revision)
    }
}
