//! Reserves a tenant's keys and bytes on the leader of the range a write goes to, just
//! before the write is proposed there, whoever sent it (the tenant itself, or a node that
//! forwarded the tenant's request): the write's key names the tenant (`Access::tenant_of`).
//! The range's live counts come from its state machine on this node; `quota::judge`
//! decides; the reservation is held until the write returns (by then the leader has applied
//! it, so the live counts hold it) and given back on drop. A namespace whose bounds have not
//! split off yet shares its range with other keys: its part is counted row by row. Knows
//! nothing of gRPC.

use std::sync::Arc;

use keel_raft::RaftGroup;
use keel_storage::{QuotaCounts, StorageError};
use keel_types::KvError;

use crate::access::Tenant;
use crate::access::quota::Amount;
use crate::shared::Shared;

/// Keys and bytes reserved for one write of a tenant; given back on drop.
#[derive(Debug)]
#[must_use = "a reservation holds only while it lives"]
pub(crate) struct Reservation {
    tenant: Arc<Tenant>,
    amount: Amount,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.tenant.release(self.amount);
    }
}

/// Reserves `growth` (the most the write can add) for a write of `key` on `group`, whose
/// replica here leads, when `key` lies in a tenant's namespace and the tenant has a keys or
/// bytes quota; `QuotaExceeded` when the quota does not admit it.
pub(crate) async fn reserve(
    shared: &Shared,
    group: &RaftGroup,
    key: &[u8],
    growth: Amount,
) -> Result<Option<Reservation>, KvError> {
    let Some(tenant) = shared.access.as_ref().and_then(|a| a.tenant_of(key)) else {
        return Ok(None);
    };
    if growth.is_zero() || !tenant.counts_usage() {
        return Ok(None);
    }
    let released_before = tenant.released();
    let (start, end) = (tenant.namespace.start(), tenant.namespace.end());
    let counted = group
        .state_machine()
        .namespace_quota_counts(start.to_vec(), end.to_vec())
        .await;
    let QuotaCounts { keys, bytes } = counted.map_err(|error| storage_failed(shared, error))?;
    let live = Amount { keys, bytes };
    tenant.reserve(group.range(), live, released_before, growth)?;
    Ok(Some(Reservation {
        tenant: tenant.clone(),
        amount: growth,
    }))
}

/// A failed read of the counts: retry elsewhere during a snapshot install; else the node's
/// health says what stopped.
fn storage_failed(shared: &Shared, error: StorageError) -> KvError {
    if let StorageError::SnapshotInstalling { .. } = error {
        return KvError::unavailable(error.to_string());
    }
    let failed = shared.health.check().err();
    failed.unwrap_or_else(|| KvError::fatal(error.to_string()))
}
