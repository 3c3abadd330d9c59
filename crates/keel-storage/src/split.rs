//! Splitting a range: the pure decision (`plan_split`: checks and the two resulting
//! descriptors, table tests) and the redb step that carries it out inside an apply
//! transaction (`apply_split`). Knows nothing about threads, async, how the split key was
//! chosen or who proposed the split.
//!
//! A split of a parent `[start, end)` at `at` is applied by every replica at the same log
//! position. It is refused (`Rejection::EpochMismatch`, nothing changes) unless the parent's
//! epoch is the split's `expected_epoch` and `start < at < end`; a child id that names the
//! meta range or the parent itself is refused with `Rejection::WrongRangeKind`; a parent
//! whose membership is changing (learners or a joint configuration) refuses it with
//! `Rejection::MembershipChanging`, so a child never inherits half a replica move. Applied, the
//! parent keeps `[start, at)` and the child takes `[at, end)`, both at the parent's epoch + 1.
//! No user data moves: ranges share the file's `kv`, `locks`, `fences`, `idempotency` and
//! `history` tables, so only metadata changes. The child gets, in the same transaction:
//! - the parent's conf_version, revision counter, clock and session horizon, so the child's
//!   next write takes a higher revision than any before and time never goes back;
//! - copies of the parent's sessions and request records, so a retry of a request applied
//!   before the split is answered from its record on either half;
//! - counts recomputed for its half (keys, bytes, keys with a TTL, locks, fenced keys,
//!   idempotency records, bytes of its events); the parent keeps the rest;
//! - the parent's history floor: the events of its half stay where they are (`history`);
//! - the parent's membership and a Raft state "initialized and snapshotted at the initial log
//!   id" (`initial_log_id`, what openraft's `initialize` gives its first membership entry,
//!   with node id 0 so every replica writes the same): applied = purged = that log id. openraft
//!   then starts the child as an initialized group (it builds a snapshot from this state at
//!   start), and a replica lacking the split can only catch up by snapshot.
//!
//! A child that already has state in this file is left as it is (its span must start at `at`
//! and lie within the parent's right half); only the parent shrinks.

use keel_types::planted::{self, PlantedBug};
use std::ops::RangeInclusive;

use keel_types::{CommandOutcome, RangeDescriptor, RangeId, Rejection, Revision, Split};
use openraft::vote::RaftLeaderIdExt;
use redb::{ReadableTable, Table, WriteTransaction};

use crate::error::StorageError;
use crate::raft_types::{LogId, StoredMembership, TypeConfig};
use crate::tables::{self, Bytes, KeySpan, RAFT_META, RAFT_PURGED, Session, SmState, Tables};

/// The parent and child after a split, as decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SplitPlan {
    /// The parent: `[start, at)`, epoch + 1.
    pub left: RangeDescriptor,
    /// The child: `[at, end)`, the parent's new epoch, conf_version and replicas.
    pub right: RangeDescriptor,
}

/// Decides a split of `parent` (its descriptor now).
pub(crate) fn plan_split(parent: &RangeDescriptor, split: &Split) -> Result<SplitPlan, Rejection> {
    if split.child == RangeId::META || split.child == parent.id {
        return Err(Rejection::WrongRangeKind { range: split.child });
    }
    let inside = parent.start.as_slice() < split.at.as_slice()
        && parent.end().is_none_or(|end| split.at.as_slice() < end);
    if parent.epoch != split.expected_epoch || !inside {
        return Err(Rejection::EpochMismatch {
            expected_epoch: split.expected_epoch,
            range: parent.clone(),
        });
    }
    let epoch = parent.epoch + 1;
    let left = RangeDescriptor {
        end: Some(split.at.clone()),
        epoch,
        ..parent.clone()
    };
    let right = RangeDescriptor {
        id: split.child,
        start: split.at.clone(),
        ..left.clone()
    };
    let right = RangeDescriptor {
        end: parent.end.clone(),
        ..right
    };
    Ok(SplitPlan { left, right })
}

/// The log id openraft's `initialize` gives a group's first membership entry (term 0, index
/// 0), with node id 0: a split child's Raft state starts here on every replica.
pub(crate) fn initial_log_id() -> LogId {
    let leader = openraft::alias::LeaderIdOf::<TypeConfig>::new_committed(0, 0);
    LogId::new(leader, 0)
}

/// The span of a descriptor.
fn span_of(range: &RangeDescriptor) -> KeySpan {
    KeySpan {
        start: range.start.clone(),
        end: range.end.clone(),
    }
}

/// Applies a split of `range` (whose state is `state`): refuses it, or shrinks the parent and
/// creates the child (see the module doc). `state` is written by the caller.
pub(crate) fn apply_split(
    tables: &mut Tables,
    state: &mut SmState,
    range: RangeId,
    split: &Split,
) -> Result<CommandOutcome, StorageError> {
    if let Some(hold) = &state.hold {
        // A held range's state is in doubt: a child would inherit it without the hold.
        let hold = hold.clone();
        return Ok(CommandOutcome::Rejected(Rejection::RangeHeld {
            range,
            hold,
        }));
    }
    let plan = match plan_split(&state.descriptor(range), split) {
        Ok(plan) => plan,
        Err(rejection) => return Ok(CommandOutcome::Rejected(rejection)),
    };
    if membership_changing(state) {
        let range = state.descriptor(range);
        return Ok(CommandOutcome::Rejected(Rejection::MembershipChanging {
            range,
        }));
    }
    let (left, right) = (span_of(&plan.left), span_of(&plan.right));
    let events = state.history_floor..=state.revision;
    let kept = if tables::has_sm_state(tables.sm_meta.table()?, split.child)? {
        check_existing_child(tables, range, split, &right)?;
        // The child may have counted rows of its span as its own: count the parent's half.
        count_half(tables, &left, events)?
    } else {
        // The planted bug loses the child's rows its parent wrote just before the split.
        if planted::active(PlantedBug::SplitDropsInflight) {
            drop_recent_rows(tables, state, &right)?;
        }
        let moved = count_half(tables, &right, events)?;
        create_child(tables, state, range, &plan, right, &moved)?;
        HalfCounts::of(state).without(&moved, range)
    };
    kept.store_into(state);
    state.span = left;
    state.epoch = plan.left.epoch;
    Ok(CommandOutcome::Split {
        left: plan.left,
        right: plan.right,
    })
}

/// Planted bug `split-drops-inflight`: deletes the rows of `span` that the range (`state`)
/// wrote in its last `planted::RECENT_REVISIONS` revisions, with their TTL-index rows and
/// counts.
fn drop_recent_rows(
    tables: &mut Tables,
    state: &mut SmState,
    span: &KeySpan,
) -> Result<(), StorageError> {
    let since = state.revision.saturating_sub(planted::RECENT_REVISIONS);
    let mut recent = Vec::new();
    for row in tables
        .kv
        .table()?
        .range::<&[u8]>(span.bounds())
        .map_err(|e| StorageError::redb("read kv", e))?
    {
        let (key, value) = row.map_err(|e| StorageError::redb("read kv", e))?;
        let kv = tables::decode_kv(key.value(), value.value())?;
        if kv.mod_revision > since {
            recent.push(kv.key);
        }
    }
    for key in recent {
        let (kv, ttl, lease_keys) = tables.kv_tables()?;
        tables::write_kv(kv, ttl, lease_keys, &mut state.kv, &key, None)?;
    }
    Ok(())
}

/// Whether the range's membership is mid-change: a joint configuration or learners, which a
/// child would inherit without the change that was to finish them.
fn membership_changing(state: &SmState) -> bool {
    let membership = state.membership.membership();
    membership.get_joint_config().len() > 1 || membership.learner_ids().next().is_some()
}

/// Asserts that a split child this store already holds lies where the split puts it: its
/// span starts at the split key within the right half (it may have split since), or it has
/// no span yet (an unfinished install).
fn check_existing_child(
    tables: &mut Tables,
    range: RangeId,
    split: &Split,
    right: &KeySpan,
) -> Result<(), StorageError> {
    let child = split.child;
    let existing = tables::read_sm_state(tables.sm_meta.table()?, child)?;
    assert!(
        existing.installing.is_some()
            || existing.span.is_empty()
            || (existing.span.start == right.start && right.covers(&existing.span)),
        "range {range} splits at {:?} into range {child}, which this store holds with span {:?}",
        split.at,
        existing.span
    );
    tracing::warn!(%range, %child, "split child already has state here; left as it is");
    Ok(())
}

/// Writes the child's state: the parent's (`state`, before the split) with the right half's
/// span and counts, copies of its sessions and request records, and a Raft state at the
/// initial log id.
fn create_child(
    tables: &mut Tables,
    state: &SmState,
    range: RangeId,
    plan: &SplitPlan,
    span: KeySpan,
    moved: &HalfCounts,
) -> Result<(), StorageError> {
    let child = plan.right.id;
    let mut child_state = SmState {
        applied: Some(initial_log_id()),
        membership: StoredMembership::new(
            Some(initial_log_id()),
            state.membership.membership().clone(),
        ),
        installing: None,
        span,
        epoch: plan.right.epoch,
        ..state.clone()
    };
    moved.store_into(&mut child_state);
    copy_exactly_once(
        tables.sessions.table()?,
        tables.requests.table()?,
        range,
        child,
        state,
    )?;
    tables::write_sm_state(tables.sm_meta.table()?, child, &child_state)?;
    start_raft_state(tables.txn, child)
}

/// The counts of one half of a split parent.
#[derive(Debug, Clone, Copy)]
struct HalfCounts {
    kv: tables::KvCounts,
    locks: u64,
    fenced_keys: u64,
    idempotency_records: u64,
    coordination_bytes: u64,
    history_bytes: u64,
}

impl HalfCounts {
    fn of(state: &SmState) -> HalfCounts {
        HalfCounts {
            kv: state.kv,
            locks: state.locks,
            fenced_keys: state.fenced_keys,
            idempotency_records: state.idempotency_records,
            coordination_bytes: state.coordination_bytes,
            history_bytes: state.history_bytes,
        }
    }

    /// These counts less `part`'s, which they include.
    fn without(&self, part: &HalfCounts, range: RangeId) -> HalfCounts {
        let less = |all: u64, part: u64, what: &str| {
            all.checked_sub(part)
                .unwrap_or_else(|| panic!("range {range}: its {what} count covers its right half"))
        };
        HalfCounts {
            kv: self.kv.without(part.kv),
            locks: less(self.locks, part.locks, "lock"),
            fenced_keys: less(self.fenced_keys, part.fenced_keys, "fenced key"),
            idempotency_records: less(
                self.idempotency_records,
                part.idempotency_records,
                "idempotency record",
            ),
            coordination_bytes: less(
                self.coordination_bytes,
                part.coordination_bytes,
                "coordination byte",
            ),
            history_bytes: less(self.history_bytes, part.history_bytes, "history byte"),
        }
    }

    fn store_into(&self, state: &mut SmState) {
        state.kv = self.kv;
        state.locks = self.locks;
        state.fenced_keys = self.fenced_keys;
        state.idempotency_records = self.idempotency_records;
        state.coordination_bytes = self.coordination_bytes;
        state.history_bytes = self.history_bytes;
    }
}

/// The counts of the rows of `span`, whose events have revisions in `events` (the parent's
/// floor to its revision: the child's events are counted by reading the parent's).
fn count_half(
    tables: &mut Tables,
    span: &KeySpan,
    events: RangeInclusive<Revision>,
) -> Result<HalfCounts, StorageError> {
    let (locks, lock_bytes) = tables::count_rows(tables.locks.table()?, span)?;
    let (fenced_keys, fence_bytes) = tables::count_rows(tables.fences.table()?, span)?;
    let (idempotency_records, record_bytes) =
        tables::count_rows(tables.idempotency.table()?, span)?;
    Ok(HalfCounts {
        kv: tables::count_kv_rows(tables.kv.table()?, span)?,
        locks,
        fenced_keys,
        idempotency_records,
        coordination_bytes: lock_bytes + fence_bytes + record_bytes,
        history_bytes: tables::count_history(tables.history.table()?, span, events)?,
    })
}

/// Copies the parent's sessions and request records to the child.
fn copy_exactly_once(
    sessions: &mut Table<Bytes, Bytes>,
    requests: &mut Table<Bytes, Bytes>,
    parent: RangeId,
    child: RangeId,
    state: &SmState,
) -> Result<(), StorageError> {
    let (start, end) = (
        tables::session_key(parent, 0),
        tables::session_key(parent, u64::MAX),
    );
    let mut copied = Vec::new();
    for row in sessions
        .range(start.as_slice()..=end.as_slice())
        .map_err(|e| StorageError::redb("read sessions", e))?
    {
        let (key, value) = row.map_err(|e| StorageError::redb("read sessions", e))?;
        let session = Session::decode(value.value())?;
        copied.push((tables::session_key_client(key.value()), session));
    }
    assert_eq!(
        copied.len() as u64,
        state.sessions,
        "range {parent}: the session count matches its sessions"
    );
    for (client_id, session) in &copied {
        tables::write_session(sessions, child, *client_id, session)?;
    }
    let (start, end) = (
        tables::request_key(parent, 0, 0),
        tables::request_key(parent, u64::MAX, u64::MAX),
    );
    let mut records = Vec::new();
    for row in requests
        .range(start.as_slice()..=end.as_slice())
        .map_err(|e| StorageError::redb("read request records", e))?
    {
        let (key, value) = row.map_err(|e| StorageError::redb("read request records", e))?;
        let (client_id, sequence) = tables::request_key_parts(key.value());
        records.push((client_id, sequence, value.value().to_vec()));
    }
    assert_eq!(
        records.len() as u64,
        state.requests,
        "range {parent}: the request count matches its records"
    );
    for (client_id, sequence, outcome) in records {
        let key = tables::request_key(child, client_id, sequence);
        requests
            .insert(key.as_slice(), outcome.as_slice())
            .map_err(|e| StorageError::redb("write request record", e))?;
    }
    Ok(())
}

/// Writes the child's Raft state "snapshotted at the initial log id": purged up to it. Its
/// log (`wal`) holds no entry yet. A restored range starts from the same state (`restore`).
pub(crate) fn start_raft_state(txn: &WriteTransaction, child: RangeId) -> Result<(), StorageError> {
    let initial = initial_log_id();
    let mut raft_meta = txn
        .open_table(RAFT_META)
        .map_err(|e| StorageError::redb("open raft_meta", e))?;
    let purged: Option<LogId> = tables::read_meta(&raft_meta, child, RAFT_PURGED, "purged log id")?;
    if purged.is_none_or(|purged| purged < initial) {
        tables::write_meta(&mut raft_meta, child, RAFT_PURGED, &initial)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(id: u64, start: &str, end: Option<&str>, epoch: u64) -> RangeDescriptor {
        RangeDescriptor {
            id: RangeId(id),
            start: start.as_bytes().to_vec(),
            end: end.map(|end| end.as_bytes().to_vec()),
            epoch,
            conf_version: 4,
            replicas: vec![1, 2, 3],
        }
    }

    fn split(at: &str, child: u64, expected_epoch: u64) -> Split {
        Split {
            at: at.as_bytes().to_vec(),
            child: RangeId(child),
            expected_epoch,
        }
    }

    #[test]
    fn split_plans() {
        let mismatch = |parent: &RangeDescriptor, expected_epoch| {
            Err(Rejection::EpochMismatch {
                expected_epoch,
                range: parent.clone(),
            })
        };
        let wrong = |child| {
            Err(Rejection::WrongRangeKind {
                range: RangeId(child),
            })
        };
        let bounded = range(3, "c", Some("p"), 2);
        let unbounded = range(1, "", None, 0);
        let planned = |left, right| Ok(SplitPlan { left, right });
        let cases = vec![
            // Inside the span at the expected epoch: both halves at epoch + 1.
            (
                &bounded,
                split("h", 9, 2),
                planned(range(3, "c", Some("h"), 3), range(9, "h", Some("p"), 3)),
            ),
            (
                &unbounded,
                split("m", 2, 0),
                planned(range(1, "", Some("m"), 1), range(2, "m", None, 1)),
            ),
            (
                &unbounded,
                split("\0", 2, 0),
                planned(range(1, "", Some("\0"), 1), range(2, "\0", None, 1)),
            ),
            // Another epoch, or a key not strictly inside: nothing changes.
            (&bounded, split("h", 9, 1), mismatch(&bounded, 1)),
            (&bounded, split("h", 9, 3), mismatch(&bounded, 3)),
            (&bounded, split("c", 9, 2), mismatch(&bounded, 2)),
            (&bounded, split("b", 9, 2), mismatch(&bounded, 2)),
            (&bounded, split("p", 9, 2), mismatch(&bounded, 2)),
            (&bounded, split("q", 9, 2), mismatch(&bounded, 2)),
            (&unbounded, split("", 2, 0), mismatch(&unbounded, 0)),
            // The child must be a new data range.
            (&bounded, split("h", 0, 2), wrong(0)),
            (&bounded, split("h", 3, 2), wrong(3)),
        ];
        for (parent, split, expected) in cases {
            assert_eq!(plan_split(parent, &split), expected, "{parent} {split:?}");
        }
    }

    #[test]
    fn the_meta_range_cannot_split() {
        let meta = range(0, "", Some(""), 0);
        let refused = plan_split(&meta, &split("a", 5, 0));
        assert!(
            matches!(refused, Err(Rejection::EpochMismatch { .. })),
            "{refused:?}"
        );
    }

    #[test]
    fn the_initial_log_id_is_the_same_everywhere() {
        let initial = initial_log_id();
        assert_eq!(initial.index, 0);
        assert_eq!(initial, openraft::testing::log_id::<TypeConfig>(0, 0, 0));
    }
}
