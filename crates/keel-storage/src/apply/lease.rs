//! Applying etcd's leases: a client's grant, keep-alive and revoke (`Command::Lease`, after
//! the deduplication every client command goes through) and the leader's `ExpireLeases`. A
//! lease's record and its `deadlines` row change together (`write_deadlined`); revoking a
//! lease deletes its attached keys at one new revision, each deletion an event, through
//! `write_changes` like any delete, which also drops their `lease_keys` rows. Grants and
//! keep-alives take no revision (etcd's do not). A transaction's puts that attach keys are
//! checked here against the lease tables before anything is written (`check_attachments`).
//! Knows nothing about who proposes.

use std::collections::{BTreeMap, BTreeSet};

use keel_types::{
    CommandOutcome, ExpireLeases, KeyValue, LeaseOp, LeaseResult, Rejection, Revision, limits,
};

use super::{read_kv, write_changes};
use crate::error::StorageError;
use crate::tables::{self, LeaseRecord, SmState, Tables};

/// Rows to write (`None`: delete), by key, as `write_changes` takes them.
type Writes = BTreeMap<Vec<u8>, Option<KeyValue>>;

/// A lease operation at the range clock `clock_ms`: its answer, or the rejection that left
/// everything as it was.
pub(super) fn apply_lease(
    tables: &mut Tables,
    state: &mut SmState,
    op: &LeaseOp,
    clock_ms: u64,
) -> Result<CommandOutcome, StorageError> {
    let answer = match op {
        LeaseOp::Grant {
            namespace,
            id,
            ttl_ms,
        } => grant(tables, state, namespace, *id, *ttl_ms, clock_ms)?,
        LeaseOp::KeepAlive { namespace, id } => keep_alive(tables, namespace, *id, clock_ms)?,
        LeaseOp::Revoke { namespace, id } => revoke(tables, state, namespace, *id, clock_ms)?,
    };
    Ok(match answer {
        Ok(result) => CommandOutcome::Leased(result),
        Err(rejection) => CommandOutcome::Rejected(rejection),
    })
}

/// Revokes every listed lease that still has the listed expiry, passed at the range clock
/// (a keep-alive since the plan saved it); the keys they held are deleted at one new
/// revision (none if there are none). Leases outside the span are skipped.
pub(super) fn apply_expire_leases(
    tables: &mut Tables,
    state: &mut SmState,
    expire: &ExpireLeases,
) -> Result<CommandOutcome, StorageError> {
    let clock_ms = state.advance_clock(expire.now_ms);
    let mut deletions = Writes::new();
    for lease in &expire.leases {
        let key = tables::lease_key(&lease.namespace, lease.id);
        if !state.span.contains(&key) || lease.expires_at_ms > clock_ms {
            continue;
        }
        let stored = read_lease(tables, &lease.namespace, lease.id)?;
        if stored.is_some_and(|stored| stored.expires_at_ms == lease.expires_at_ms) {
            remove_lease(tables, &lease.namespace, lease.id, &mut deletions)?;
        }
    }
    delete_keys(tables, state, clock_ms, deletions)?;
    Ok(CommandOutcome::Internal)
}

/// Whether a transaction's `writes` may change the keys' leases: every lease a put named
/// (the keys in `leased`; its namespace is the start of the key's pinned span) exists and
/// is unexpired at `clock_ms`, else `LeaseNotFound`; and no lease would hold more than
/// `limits::LEASE_KEYS_MAX` keys after the writes (counting keys they attach and detach),
/// else `LeaseFull`. `None`: the writes may be made.
pub(super) fn check_attachments(
    tables: &mut Tables,
    writes: &Writes,
    leased: &BTreeSet<Vec<u8>>,
    clock_ms: u64,
) -> Result<Option<Rejection>, StorageError> {
    // The change of each lease's key count, by (namespace, id).
    let mut added: BTreeMap<(Vec<u8>, i64), i64> = BTreeMap::new();
    for (key, after) in writes {
        let after = after.as_ref().map_or(0, |kv| kv.lease);
        let before = read_kv(tables.kv.table()?, key)?.map_or(0, |kv| kv.lease);
        let namespace = tables::lease_namespace(key);
        if leased.contains(key) {
            let live = match &namespace {
                Some(namespace) => read_lease(tables, namespace, after)?
                    .is_some_and(|stored| !stored.is_expired(clock_ms)),
                None => false,
            };
            if !live {
                return Ok(Some(Rejection::LeaseNotFound { id: after }));
            }
        }
        if before == after {
            continue;
        }
        // Only keys of a pinned span are ever attached; a row outside one that says
        // otherwise (a damaged file) changes no lease's count.
        let Some(namespace) = namespace else {
            continue;
        };
        for (id, change) in [(after, 1), (before, -1)] {
            if id != 0 {
                *added.entry((namespace.clone(), id)).or_default() += change;
            }
        }
    }
    for ((namespace, id), change) in added {
        if change <= 0 {
            continue;
        }
        let held = tables::count_attached(tables.lease_keys.table()?, &namespace, id)?;
        if held as i64 + change > limits::LEASE_KEYS_MAX as i64 {
            let max = limits::LEASE_KEYS_MAX as u64;
            return Ok(Some(Rejection::LeaseFull { id, max }));
        }
    }
    Ok(None)
}

/// The stored lease `id` of `namespace`, expired or not.
pub(super) fn read_lease(
    tables: &mut Tables,
    namespace: &[u8],
    id: i64,
) -> Result<Option<LeaseRecord>, StorageError> {
    tables::read_row(
        tables.leases.table()?,
        &tables::lease_key(namespace, id),
        "lease",
    )
}

/// Grants lease `id` (0: the smallest id at or above the range's next revision that no
/// lease of the namespace holds, the same on every replica).
fn grant(
    tables: &mut Tables,
    state: &SmState,
    namespace: &[u8],
    id: i64,
    ttl_ms: u64,
    clock_ms: u64,
) -> Result<Result<LeaseResult, Rejection>, StorageError> {
    let id = match id {
        0 => {
            let from = i64::try_from(state.revision + 1).unwrap_or(i64::MAX);
            match tables::first_free_id(tables.leases.table()?, namespace, from)? {
                Some(id) => id,
                None => return Ok(Err(Rejection::LeaseExists { id: i64::MAX })),
            }
        }
        id if read_lease(tables, namespace, id)?.is_some() => {
            return Ok(Err(Rejection::LeaseExists { id }));
        }
        id => id,
    };
    let record = LeaseRecord {
        ttl_ms,
        expires_at_ms: clock_ms.saturating_add(ttl_ms),
    };
    write_lease(tables, namespace, id, Some(&record))?;
    Ok(Ok(LeaseResult::Granted { id, ttl_ms }))
}

/// Pushes an unexpired lease's expiry to the clock plus its granted TTL.
fn keep_alive(
    tables: &mut Tables,
    namespace: &[u8],
    id: i64,
    clock_ms: u64,
) -> Result<Result<LeaseResult, Rejection>, StorageError> {
    let stored = read_lease(tables, namespace, id)?;
    let Some(stored) = stored.filter(|stored| !stored.is_expired(clock_ms)) else {
        return Ok(Err(Rejection::LeaseNotFound { id }));
    };
    let record = LeaseRecord {
        expires_at_ms: clock_ms.saturating_add(stored.ttl_ms),
        ..stored
    };
    write_lease(tables, namespace, id, Some(&record))?;
    Ok(Ok(LeaseResult::KeptAlive {
        ttl_ms: stored.ttl_ms,
    }))
}

/// Revokes a lease, expired or not, and deletes its keys.
fn revoke(
    tables: &mut Tables,
    state: &mut SmState,
    namespace: &[u8],
    id: i64,
    clock_ms: u64,
) -> Result<Result<LeaseResult, Rejection>, StorageError> {
    if read_lease(tables, namespace, id)?.is_none() {
        return Ok(Err(Rejection::LeaseNotFound { id }));
    }
    let mut deletions = Writes::new();
    let deleted = remove_lease(tables, namespace, id, &mut deletions)?;
    let revision = delete_keys(tables, state, clock_ms, deletions)?;
    Ok(Ok(LeaseResult::Revoked { revision, deleted }))
}

/// Removes a lease (with its `deadlines` row) and adds its keys to `deletions`; returns how
/// many keys it held.
fn remove_lease(
    tables: &mut Tables,
    namespace: &[u8],
    id: i64,
    deletions: &mut Writes,
) -> Result<u64, StorageError> {
    let keys = tables::attached_keys(tables.lease_keys.table()?, namespace, id, usize::MAX)?;
    let held = keys.len() as u64;
    deletions.extend(keys.into_iter().map(|key| (key, None)));
    write_lease(tables, namespace, id, None)?;
    Ok(held)
}

/// Deletes `deletions` at one new revision, each an event; returns it (0: nothing to delete,
/// no revision taken).
fn delete_keys(
    tables: &mut Tables,
    state: &mut SmState,
    clock_ms: u64,
    deletions: Writes,
) -> Result<Revision, StorageError> {
    if deletions.is_empty() {
        return Ok(0);
    }
    let revision = state.revision + 1;
    write_changes(tables, state, revision, clock_ms, deletions)?;
    Ok(revision)
}

/// Writes (or removes, for `None`) lease `id` of `namespace` with its `deadlines` row.
/// Leases are not counted in `sm_meta`: no quota or limit reads a count of them.
fn write_lease(
    tables: &mut Tables,
    namespace: &[u8],
    id: i64,
    record: Option<&LeaseRecord>,
) -> Result<(), StorageError> {
    let key = tables::lease_key(namespace, id);
    let (leases, deadlines) = (tables.leases.table()?, tables.deadlines.table()?);
    tables::write_indexed(leases, deadlines, &key, record).map(|_| ())
}
