//! Applying committed log entries to a range's state machine: the pure decision about a
//! write (`plan_write`: expiry, conditions, increments, revisions and versions, results),
//! the exactly-once bookkeeping around every client command (`session` decides, this
//! module stores), fenced writes and lock and idempotency operations (`coordination`
//! decides, this module stores), transactions (`txn` decides, this module stores), cleanups
//! of expired keys and idle sessions, reclaims of free locks and expired idempotency
//! records, and the redb step that executes all of it with the applied log id, membership,
//! revision and clock in the same transaction. Knows nothing about threads, async or
//! snapshots.
//!
//! Every command runs at the range clock `max(clock_ms, command now_ms)` (a legacy
//! `Command::Write` at `clock_ms`), so time never goes back and every replica judges expiry
//! the same way. A key whose expiry is at or before that clock is absent for every purpose.
//!
//! `Mutate`, `FencedMutate`, `Coordinate` and `Txn` with a request id go through the same
//! deduplication (`deduplicated`): the fence check and the operation run only for a request
//! not seen before, and their outcome (a refusal included) is its record. An applied fenced
//! write records its fence on every key it writes; an applied unfenced write drops the fence
//! of every key it deletes.
//!
//! Ranges: after deduplication every data command (`Mutate`, `FencedMutate`, `Coordinate`,
//! `Txn`, the legacy `Write`) checks each key it touches (op keys, the lock name, the
//! idempotency key, a transaction's keys and spans) against the range's span; one outside
//! refuses it whole with `KeyOutOfRange` and the
//! range's descriptor, and stores nothing, not even a request record or a session change.
//! Cleanups and reclaims skip items outside the span. `Split` is carried out by `split`.
//! The meta range applies `Meta` commands (`meta`, each taking a revision), cleanups and
//! reclaims, and refuses everything else with `WrongRangeKind`; data ranges refuse `Meta`
//! the same way. Every membership entry raises the range's `conf_version`.

use std::collections::BTreeMap;

use keel_types::planted::{self, PlantedBug};
use keel_types::txn::{Txn, TxnMutation, TxnSpan};
use keel_types::{
    BatchOp, Cleanup, Command, CommandOutcome, ConditionFailed, CoordinationOp, ExpiredRecord,
    Fence, IdempotencyRecord, KeyValue, LockHold, OpResult, RangeId, Reclaim, Rejection, RequestId,
    Revision, parse_counter,
};
use openraft::EntryPayload;
use openraft::StoredMembership;
use redb::{ReadableTable, WriteTransaction};

use crate::coordination::{self, Change, Plan, Subject};
use crate::error::StorageError;
use crate::raft_types::Entry;
use crate::session::{self, Asked, RangeSessions, RequestPlan, SessionLimits, Verdict};
use crate::tables::{self, KeySpan, META, RequestRecord, Session, SmState, Tables};
use crate::{meta, split};

mod lease;
mod txn;

use lease::{apply_expire_leases, apply_lease, check_attachments};
use txn::{TxnPlan, plan_txn};

/// What a mutation's ops do to the data, decided before anything is written.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum WritePlan {
    /// A condition failed: write nothing, consume no revision.
    Failed(ConditionFailed),
    /// An increment was refused: write nothing, consume no revision.
    Rejected(Rejection),
    /// Write `writes` (`None` = delete) at `revision`.
    Apply {
        revision: Revision,
        results: Vec<OpResult>,
        writes: BTreeMap<Vec<u8>, Option<KeyValue>>,
    },
}

/// Decides a write of `ops` against a range at `revision` and clock `clock_ms`. Ops are taken
/// in order and each sees the effects of the ops before it; the first failing condition or
/// refused increment decides the whole write. `lookup` reads the stored state of a key; a
/// key expired at `clock_ms` counts as absent.
pub(crate) fn plan_write(
    ops: &[BatchOp],
    revision: Revision,
    clock_ms: u64,
    mut lookup: impl FnMut(&[u8]) -> Result<Option<KeyValue>, StorageError>,
) -> Result<WritePlan, StorageError> {
    let next = revision + 1;
    let mut writes: BTreeMap<Vec<u8>, Option<KeyValue>> = BTreeMap::new();
    let mut results = Vec::with_capacity(ops.len());
    for (op_index, op) in ops.iter().enumerate() {
        let key = op.key();
        let current = match writes.get(key) {
            Some(pending) => pending.clone(),
            None => lookup(key)?,
        }
        .filter(|kv| !kv.is_expired(clock_ms));
        let op_index = u32::try_from(op_index).expect("op count fits in u32");
        if let Some(condition) = op.condition()
            && !condition.holds(current.as_ref())
        {
            return Ok(WritePlan::Failed(ConditionFailed {
                op_index,
                key: key.to_vec(),
                current,
                revision,
            }));
        }
        let (after, counter) = match op_after(op, op_index, current.as_ref(), next, clock_ms) {
            Ok(after) => after,
            Err(rejection) => return Ok(WritePlan::Rejected(rejection)),
        };
        let existed = current.is_some();
        let previous = if op.return_previous() { current } else { None };
        results.push(OpResult {
            previous,
            existed,
            counter,
        });
        writes.insert(key.to_vec(), after);
    }
    Ok(WritePlan::Apply {
        revision: next,
        results,
        writes,
    })
}

/// The create revision and version of a key written at revision `next` over `current`, its
/// live state (`None` when absent or expired, the same rule for both): a write that creates
/// the key starts it at `next` with version 1; a write to a live key keeps its create
/// revision and adds one to its version (etcd's `version`; saturating, which no key's
/// writes reach). Every write of a row goes through here (`op_after`).
fn lineage(current: Option<&KeyValue>, next: Revision) -> (Revision, u64) {
    match current {
        None => (next, 1),
        Some(kv) => (kv.create_revision, kv.version.saturating_add(1)),
    }
}

/// The key's state after `op` (`None` = absent) and, for an increment, the new counter.
fn op_after(
    op: &BatchOp,
    op_index: u32,
    current: Option<&KeyValue>,
    next: Revision,
    clock_ms: u64,
) -> Result<(Option<KeyValue>, Option<i64>), Rejection> {
    let (create_revision, version) = lineage(current, next);
    let stored = |value: Vec<u8>, expires_at_ms, lease| KeyValue {
        key: op.key().to_vec(),
        value,
        create_revision,
        mod_revision: next,
        version,
        expires_at_ms,
        lease,
    };
    match op {
        // A put detaches the key from its lease, as etcd's put without a lease does.
        BatchOp::Put { value, ttl_ms, .. } => {
            let expires_at_ms = ttl_ms.map(|ttl| clock_ms.saturating_add(ttl));
            Ok((Some(stored(value.clone(), expires_at_ms, 0)), None))
        }
        BatchOp::Delete { .. } => Ok((None, None)),
        BatchOp::Increment { key, delta } => {
            let current_value = match current {
                None => 0,
                Some(kv) => parse_counter(&kv.value).ok_or_else(|| Rejection::NotACounter {
                    op_index,
                    key: key.clone(),
                })?,
            };
            let sum = current_value
                .checked_add(*delta)
                .ok_or_else(|| Rejection::Overflow {
                    op_index,
                    key: key.clone(),
                    current: current_value,
                    delta: *delta,
                })?;
            let expires_at_ms = current.and_then(|kv| kv.expires_at_ms);
            let lease = current.map_or(0, |kv| kv.lease);
            Ok((
                Some(stored(sum.to_string().into_bytes(), expires_at_ms, lease)),
                Some(sum),
            ))
        }
    }
}

/// Applies `entries` to `range` inside `txn` and records the last applied log id, the last
/// membership, the revision, the clock, the span and the session state in the same
/// transaction. Returns one outcome per entry. Every entry sees the span the entries before
/// it left (a split shrinks it at once).
pub(crate) fn apply_entries(
    txn: &WriteTransaction,
    range: RangeId,
    entries: &[Entry],
) -> Result<Vec<CommandOutcome>, StorageError> {
    let mut tables = Tables::open(txn);
    let before = tables::read_sm_state(tables.sm_meta.table()?, range)?;
    let mut state = before.clone();
    assert!(
        state.installing.is_none(),
        "range {range}: apply while a snapshot install is unfinished"
    );
    let mut outcomes = Vec::with_capacity(entries.len());
    for entry in entries {
        let outcome = match &entry.payload {
            EntryPayload::Blank => CommandOutcome::Internal,
            EntryPayload::Membership(membership) => {
                state.membership = StoredMembership::new(Some(entry.log_id), membership.clone());
                state.conf_version += 1;
                CommandOutcome::Internal
            }
            // Changes nothing; `StateMachine::apply` hashes the state as of this entry.
            EntryPayload::Normal(Command::Check(_)) => CommandOutcome::Checked {
                index: entry.log_id.index,
            },
            EntryPayload::Normal(Command::Hold(hold)) => {
                tables::write_hold(tables.sm_meta.table()?, range, hold.as_ref())?;
                state.hold = hold.clone();
                CommandOutcome::Internal
            }
            EntryPayload::Normal(command) => {
                apply_command(&mut tables, &mut state, range, command)?
            }
        };
        state.applied = Some(entry.log_id);
        outcomes.push(outcome);
    }
    tables::write_sm_state_since(tables.sm_meta.table()?, range, Some(&before), &state)?;
    Ok(outcomes)
}

/// Applies one command. The meta range applies meta commands, cleanups and reclaims only;
/// data ranges apply everything but meta commands. A data command with a key outside the
/// span is refused (`KeyOutOfRange`) after its request id was checked (see `deduplicated`).
fn apply_command(
    tables: &mut Tables,
    state: &mut SmState,
    range: RangeId,
    command: &Command,
) -> Result<CommandOutcome, StorageError> {
    let wrong_kind = || {
        Ok(CommandOutcome::Rejected(Rejection::WrongRangeKind {
            range,
        }))
    };
    match command {
        Command::Cleanup(cleanup) => apply_cleanup(tables, state, range, cleanup),
        Command::ExpireLeases(expire) => apply_expire_leases(tables, state, expire),
        Command::Reclaim(reclaim) => apply_reclaim(tables, state, reclaim, Recorded::Yes),
        Command::ReclaimUnrecorded(reclaim) => apply_reclaim(tables, state, reclaim, Recorded::No),
        Command::Meta(command) if range == RangeId::META => {
            let mut table = tables
                .txn
                .open_table(META)
                .map_err(|e| StorageError::redb("open meta", e))?;
            let outcome = meta::apply_meta(&mut table, command)?;
            if matches!(outcome, CommandOutcome::Meta(_)) {
                state.revision += 1;
            }
            Ok(outcome)
        }
        Command::Meta(_) => wrong_kind(),
        _ if range == RangeId::META => wrong_kind(),
        Command::Split(split) => split::apply_split(tables, state, range, split),
        _ => apply_data_command(tables, state, range, command),
    }
}

/// Applies a client command of a data range at the range clock it advances to.
fn apply_data_command(
    tables: &mut Tables,
    state: &mut SmState,
    range: RangeId,
    command: &Command,
) -> Result<CommandOutcome, StorageError> {
    match command {
        Command::Write { ops } => {
            let ops: Vec<BatchOp> = ops.iter().cloned().map(BatchOp::from).collect();
            let clock_ms = state.clock_ms;
            let keys: Vec<&[u8]> = ops.iter().map(BatchOp::key).collect();
            deduplicated(
                tables,
                state,
                range,
                (None, command),
                Touched::Keys(&keys),
                |tables, state| apply_unfenced(tables, state, &ops, clock_ms),
            )
        }
        Command::Mutate(mutation) => {
            let clock_ms = state.advance_clock(mutation.now_ms);
            let keys: Vec<&[u8]> = mutation.ops.iter().map(BatchOp::key).collect();
            let request = mutation.request.as_ref();
            let asked = (request, command);
            let touched = Touched::Keys(&keys);
            deduplicated(tables, state, range, asked, touched, |tables, state| {
                apply_unfenced(tables, state, &mutation.ops, clock_ms)
            })
        }
        Command::FencedMutate { fence, mutation } => {
            let clock_ms = state.advance_clock(mutation.now_ms);
            let keys: Vec<&[u8]> = mutation.ops.iter().map(BatchOp::key).collect();
            let request = mutation.request.as_ref();
            let asked = (request, command);
            let touched = Touched::Keys(&keys);
            deduplicated(tables, state, range, asked, touched, |tables, state| {
                apply_fenced(tables, state, fence, &mutation.ops, clock_ms)
            })
        }
        Command::Coordinate(coordination) => {
            let clock_ms = state.advance_clock(coordination.now_ms);
            let request = coordination.request.as_ref();
            let key = match coordination::subject(&coordination.op) {
                Subject::Lock(name) => name,
                Subject::Record(key) => key,
            };
            let asked = (request, command);
            let keys = [key];
            let touched = Touched::Keys(&keys);
            deduplicated(tables, state, range, asked, touched, |tables, state| {
                apply_coordination(tables, state, &coordination.op, clock_ms)
            })
        }
        Command::Txn(mutation) => apply_txn_command(tables, state, range, command, mutation),
        Command::TxnV11(mutation) => {
            let mutation = TxnMutation::from(mutation.clone());
            apply_txn_command(tables, state, range, command, &mutation)
        }
        Command::Lease(lease) => {
            let clock_ms = state.advance_clock(lease.now_ms);
            let asked = (lease.request.as_ref(), command);
            let keys = [lease.op.namespace()];
            let touched = Touched::Keys(&keys);
            deduplicated(tables, state, range, asked, touched, |tables, state| {
                apply_lease(tables, state, &lease.op, clock_ms)
            })
        }
        Command::Cleanup(_)
        | Command::ExpireLeases(_)
        | Command::Reclaim(_)
        | Command::ReclaimUnrecorded(_)
        | Command::Split(_)
        | Command::Check(_)
        | Command::Hold(_)
        | Command::Meta(_) => unreachable!("{command} is not a data command"),
    }
}

/// A client's transaction (`command`, of any format, as `mutation`) at the range clock it
/// advances to.
fn apply_txn_command(
    tables: &mut Tables,
    state: &mut SmState,
    range: RangeId,
    command: &Command,
    mutation: &TxnMutation,
) -> Result<CommandOutcome, StorageError> {
    let clock_ms = state.advance_clock(mutation.now_ms);
    let spans = mutation.txn.spans();
    let asked = (mutation.request.as_ref(), command);
    let touched = Touched::Spans(&spans);
    deduplicated(tables, state, range, asked, touched, |tables, state| {
        apply_txn(tables, state, &mutation.txn, clock_ms)
    })
}

/// What a client command touches: keys (op keys, a lock name, an idempotency key), or the
/// keys and spans of a transaction. The first names the request's owner.
#[derive(Clone, Copy)]
enum Touched<'a> {
    Keys(&'a [&'a [u8]]),
    Spans(&'a [TxnSpan]),
}

impl Touched<'_> {
    fn owner_key(&self) -> &[u8] {
        match self {
            Touched::Keys(keys) => keys.first().copied().unwrap_or_default(),
            Touched::Spans(spans) => spans.first().map_or(&[], |span| span.key.as_slice()),
        }
    }

    /// The first key touched outside `span`: a key, or the start of a span not wholly
    /// inside it.
    fn outside(&self, span: &KeySpan) -> Option<Vec<u8>> {
        match self {
            Touched::Keys(keys) => keys
                .iter()
                .find(|key| !span.contains(key))
                .map(|k| k.to_vec()),
            Touched::Spans(spans) => spans
                .iter()
                .find(|touched| {
                    let inner = KeySpan {
                        start: touched.key.clone(),
                        end: touched.end(),
                    };
                    !span.covers(&inner)
                })
                .map(|touched| touched.key.clone()),
        }
    }
}

/// `RangeHeld` while the range is held, else `KeyOutOfRange` for the first key or span
/// `touched` outside the range's span.
fn refused(state: &SmState, range: RangeId, touched: Touched) -> Option<Rejection> {
    if let Some(hold) = &state.hold {
        return Some(Rejection::RangeHeld {
            range,
            hold: hold.clone(),
        });
    }
    let key = touched.outside(&state.span)?;
    Some(Rejection::KeyOutOfRange {
        key,
        range: state.descriptor(range),
    })
}

/// Runs `run` for a client command deduplicated by its request id, if it has one (see
/// `session`; `asked` is the id and the command): a request applied before is answered from
/// its record, a refused one is not run, and the outcome of one that runs is recorded with
/// the command's digest. A request that would run but touches a key outside the span
/// (`touched`, the first of which names the request's owner) is refused with `KeyOutOfRange`,
/// and any while the range is held with `RangeHeld`; a refused request leaves no trace, no
/// record and no session change: it was not applied, so a retry under the same id (at the
/// right range, or once the hold is released) is safe. The range clock is advanced already.
fn deduplicated(
    tables: &mut Tables,
    state: &mut SmState,
    range: RangeId,
    asked: (Option<&RequestId>, &Command),
    touched: Touched,
    run: impl FnOnce(&mut Tables, &mut SmState) -> Result<CommandOutcome, StorageError>,
) -> Result<CommandOutcome, StorageError> {
    let (Some(id), command) = asked else {
        if let Some(rejection) = refused(state, range, touched) {
            return Ok(CommandOutcome::Rejected(rejection));
        }
        return run(tables, state);
    };
    let asked = Asked {
        id,
        owner: session::owner_of(touched.owner_key()),
        digest: session::request_digest(command),
    };
    let stored = tables::read_session(tables.sessions.table()?, range, id.client_id)?;
    let recorded = match stored {
        Some(_) => {
            tables::read_request(tables.requests.table()?, range, id.client_id, id.sequence)?
        }
        None => None,
    };
    let facts = RangeSessions {
        session_horizon_ms: state.session_horizon_ms,
        sessions: state.sessions,
    };
    let plan = session::plan_request(
        asked,
        state.clock_ms,
        stored,
        recorded.as_ref().map(|record| record.digest),
        facts,
        SessionLimits::default(),
        |sequences| {
            tables::count_requests(tables.requests.table()?, range, id.client_id, sequences)
        },
    )?;
    let verdict = match &plan.verdict {
        // The planted bug applies a retried request again instead of replaying its record.
        Verdict::Replay if planted::active(PlantedBug::DoubleApply) => Verdict::Apply,
        verdict => verdict.clone(),
    };
    if verdict == Verdict::Apply
        && let Some(rejection) = refused(state, range, touched)
    {
        return Ok(CommandOutcome::Rejected(rejection));
    }
    store_session(tables, state, range, id.client_id, stored, &plan)?;
    match (verdict, recorded) {
        (Verdict::Reject(rejection), _) => Ok(CommandOutcome::Rejected(rejection)),
        (Verdict::Replay, Some(record)) => Ok(CommandOutcome::Replayed(Box::new(record.outcome))),
        (Verdict::Replay, None) => unreachable!("a request is replayed only from its record"),
        (Verdict::Apply, _) => {
            let outcome = run(tables, state)?;
            let record = RequestRecord {
                digest: Some(asked.digest),
                outcome,
            };
            tables::write_request(
                tables.requests.table()?,
                range,
                id.client_id,
                id.sequence,
                &record,
            )?;
            Ok(record.outcome)
        }
    }
}

/// An unfenced write: if it applies, every key a delete op names loses its fence (the way
/// to retire a fenced key); puts and increments leave fences alone.
fn apply_unfenced(
    tables: &mut Tables,
    state: &mut SmState,
    ops: &[BatchOp],
    clock_ms: u64,
) -> Result<CommandOutcome, StorageError> {
    let outcome = apply_ops(tables, state, ops, clock_ms)?;
    if matches!(outcome, CommandOutcome::Applied { .. }) {
        for op in ops {
            if let BatchOp::Delete { key, .. } = op {
                tables::write_fence(tables.fences.table()?, state.fence_counts(), key, None)?;
            }
        }
    }
    Ok(outcome)
}

/// A write fenced by `fence`: refused if a key it writes is fenced out
/// (`coordination::check_fences`), else applied like any write; if it applies, every key it
/// writes records `fence`.
fn apply_fenced(
    tables: &mut Tables,
    state: &mut SmState,
    fence: &Fence,
    ops: &[BatchOp],
    clock_ms: u64,
) -> Result<CommandOutcome, StorageError> {
    let refusal = coordination::check_fences(fence, ops, |key| {
        tables::read_row(tables.fences.table()?, key, "fence")
    })?;
    if let Some(rejection) = refusal {
        return Ok(CommandOutcome::Rejected(rejection));
    }
    let outcome = apply_ops(tables, state, ops, clock_ms)?;
    if matches!(outcome, CommandOutcome::Applied { .. }) {
        for op in ops {
            let counts = state.fence_counts();
            tables::write_fence(tables.fences.table()?, counts, op.key(), Some(fence))?;
        }
    }
    Ok(outcome)
}

/// A lock or idempotency operation: planned by `coordination`, then its change written at
/// the next revision (with the record's `deadlines` row and count).
fn apply_coordination(
    tables: &mut Tables,
    state: &mut SmState,
    op: &CoordinationOp,
    clock_ms: u64,
) -> Result<CommandOutcome, StorageError> {
    let next = state.revision + 1;
    match coordination::subject(op) {
        Subject::Lock(name) => {
            let stored: Option<LockHold> = tables::read_row(tables.locks.table()?, name, "lock")?;
            let plan = coordination::plan_lock_op(op, stored.as_ref(), clock_ms, next);
            settle(plan, state, |state, after| {
                let (locks, deadlines) = (tables.locks.table()?, tables.deadlines.table()?);
                tables::write_deadlined(locks, deadlines, state.lock_counts(), name, after)
            })
        }
        Subject::Record(key) => {
            let what = "idempotency record";
            let stored: Option<IdempotencyRecord> =
                tables::read_row(tables.idempotency.table()?, key, what)?;
            let plan = coordination::plan_idempotency_op(op, stored.as_ref(), clock_ms, next);
            settle(plan, state, |state, after| {
                let (records, deadlines) = (tables.idempotency.table()?, tables.deadlines.table()?);
                tables::write_deadlined(records, deadlines, state.record_counts(), key, after)
            })
        }
    }
}

/// Executes a coordination plan: `write` stores (`Some`) or removes (`None`) the record,
/// and a change takes the next revision.
fn settle<T>(
    plan: Plan<T>,
    state: &mut SmState,
    write: impl FnOnce(&mut SmState, Option<&T>) -> Result<(), StorageError>,
) -> Result<CommandOutcome, StorageError> {
    let result = match plan.answer {
        Ok(result) => result,
        Err(rejection) => {
            assert!(
                matches!(plan.change, Change::Nothing),
                "a refused coordination operation changes nothing"
            );
            return Ok(CommandOutcome::Rejected(rejection));
        }
    };
    match &plan.change {
        Change::Nothing => {}
        Change::Store(after) => write(state, Some(after))?,
        Change::Remove => write(state, None)?,
    }
    if !matches!(plan.change, Change::Nothing) {
        state.revision += 1;
    }
    Ok(CommandOutcome::Coordinated {
        revision: state.revision,
        result,
    })
}

/// Writes what a request plan decided about the session: dropped records, the session row
/// and the range's counts. The record an `Apply` stores is counted here already.
fn store_session(
    tables: &mut Tables,
    state: &mut SmState,
    range: RangeId,
    client_id: u64,
    stored: Option<Session>,
    plan: &RequestPlan,
) -> Result<(), StorageError> {
    let Some(session) = &plan.session else {
        return Ok(());
    };
    if let Some(below) = plan.prune_below {
        tables::remove_requests(tables.requests.table()?, range, client_id, 0..=below - 1)?;
    }
    tables::write_session(tables.sessions.table()?, range, client_id, session)?;
    let before = stored.map_or(0, |stored| stored.records);
    state.requests = (state.requests + session.records)
        .checked_sub(before)
        .expect("the range's request count covers its sessions' records");
    if stored.is_none() {
        state.sessions += 1;
    }
    Ok(())
}

/// Plans and executes `ops` at `clock_ms`.
fn apply_ops(
    tables: &mut Tables,
    state: &mut SmState,
    ops: &[BatchOp],
    clock_ms: u64,
) -> Result<CommandOutcome, StorageError> {
    let plan = plan_write(ops, state.revision, clock_ms, |key| {
        read_kv(tables.kv.table()?, key)
    })?;
    let (revision, results, writes) = match plan {
        WritePlan::Failed(failed) => return Ok(CommandOutcome::ConditionFailed(failed)),
        WritePlan::Rejected(rejection) => return Ok(CommandOutcome::Rejected(rejection)),
        WritePlan::Apply {
            revision,
            results,
            writes,
        } => (revision, results, writes),
    };
    write_changes(tables, state, revision, clock_ms, writes)?;
    Ok(CommandOutcome::Applied { revision, results })
}

/// Writes every row of `writes` (`None` = delete) at `revision`, each an event, and makes
/// `revision` the range's.
fn write_changes(
    tables: &mut Tables,
    state: &mut SmState,
    revision: Revision,
    clock_ms: u64,
    writes: BTreeMap<Vec<u8>, Option<KeyValue>>,
) -> Result<(), StorageError> {
    for (key, after) in writes {
        let (kv, ttl, lease_keys) = tables.kv_tables()?;
        // The row as stored, even expired: an expired row not yet removed was absent, and the
        // event says so to its readers (`tables::decode_event`) but keeps the row for reads
        // at a revision before the expiry.
        let before = tables::write_kv(kv, ttl, lease_keys, &mut state.kv, &key, after.as_ref())?;
        record(
            tables,
            state,
            revision,
            clock_ms,
            &key,
            before,
            after.as_ref(),
        )?;
    }
    state.revision = revision;
    Ok(())
}

/// A transaction: planned by `txn`, its leases checked (`lease::check_attachments`), then
/// its writes made at the next revision (none when its branch wrote nothing); like an
/// unfenced write, every key it deletes loses its fence.
fn apply_txn(
    tables: &mut Tables,
    state: &mut SmState,
    txn: &Txn,
    clock_ms: u64,
) -> Result<CommandOutcome, StorageError> {
    let (result, writes, leased) =
        match plan_txn(txn, tables.kv.table()?, state.revision, clock_ms)? {
            TxnPlan::Rejected(rejection) => return Ok(CommandOutcome::Rejected(rejection)),
            TxnPlan::Apply {
                result,
                writes,
                leased,
            } => (result, writes, leased),
        };
    if let Some(rejection) = check_attachments(tables, &writes, &leased, clock_ms)? {
        return Ok(CommandOutcome::Rejected(rejection));
    }
    if !writes.is_empty() {
        let deleted: Vec<Vec<u8>> = writes
            .iter()
            .filter(|(_, after)| after.is_none())
            .map(|(key, _)| key.clone())
            .collect();
        write_changes(tables, state, state.revision + 1, clock_ms, writes)?;
        for key in deleted {
            tables::write_fence(tables.fences.table()?, state.fence_counts(), &key, None)?;
        }
    }
    Ok(CommandOutcome::Transacted {
        revision: state.revision,
        result,
    })
}

/// Records the change of `key` from `before` to `after` as an event of the range at
/// `revision` (`tables::record_event`).
fn record(
    tables: &mut Tables,
    state: &mut SmState,
    revision: Revision,
    clock_ms: u64,
    key: &[u8],
    before: Option<KeyValue>,
    after: Option<&KeyValue>,
) -> Result<(), StorageError> {
    let what = tables::Changed::Key {
        before: before.as_ref(),
        after,
    };
    let change = tables::Change {
        revision,
        clock_ms,
        key,
        what,
    };
    tables::record_event(tables.history.table()?, &mut state.history_bytes, change)
}

/// Removes the listed keys that are still stored with the listed expiry and expired at the
/// clock, and the listed sessions that are still idle; raises the session horizon past every
/// dropped session. The keys it removes are events of one new revision (none if it removes
/// no key).
fn apply_cleanup(
    tables: &mut Tables,
    state: &mut SmState,
    range: RangeId,
    cleanup: &Cleanup,
) -> Result<CommandOutcome, StorageError> {
    let clock_ms = state.advance_clock(cleanup.now_ms);
    let mut removed = false;
    for expired in &cleanup.keys {
        if !state.span.contains(&expired.key) || expired.expires_at_ms > clock_ms {
            continue;
        }
        let stored = tables
            .kv
            .table()?
            .get(expired.key.as_slice())
            .map_err(|e| StorageError::redb("read kv", e))?
            .map(|value| tables::decode_kv_expiry(value.value()))
            .transpose()?
            .flatten();
        if stored == Some(expired.expires_at_ms) {
            let (kv, ttl, lease_keys) = tables.kv_tables()?;
            let before = tables::write_kv(kv, ttl, lease_keys, &mut state.kv, &expired.key, None)?;
            let revision = state.revision + 1;
            record(
                tables,
                state,
                revision,
                clock_ms,
                &expired.key,
                before,
                None,
            )?;
            removed = true;
        }
    }
    if removed {
        state.revision += 1;
    }
    for &client_id in &cleanup.sessions {
        let Some(session) = tables::read_session(tables.sessions.table()?, range, client_id)?
        else {
            continue;
        };
        if session.last_active_ms >= cleanup.sessions_idle_before_ms {
            continue;
        }
        tables::remove_requests(tables.requests.table()?, range, client_id, 0..=u64::MAX)?;
        tables
            .sessions
            .table()?
            .remove(tables::session_key(range, client_id).as_slice())
            .map_err(|e| StorageError::redb("remove session", e))?;
        state.sessions = state
            .sessions
            .checked_sub(1)
            .expect("the range's session count covers its sessions");
        state.requests = state
            .requests
            .checked_sub(session.records)
            .expect("the range's request count covers its sessions' records");
        state.session_horizon_ms = state.session_horizon_ms.max(session.last_active_ms);
    }
    Ok(CommandOutcome::Internal)
}

/// Whether a reclaim takes revisions and records events (`Command::Reclaim`) or not (the
/// format-8 `Command::ReclaimUnrecorded`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Recorded {
    Yes,
    No,
}

/// Removes the listed locks still stored with the listed free instant and the listed
/// idempotency records still stored with the listed expiry, where that instant has passed
/// at the clock. Recorded, the locks it removes are events of one new revision and the
/// records events of the next (none if it removes none of a kind).
fn apply_reclaim(
    tables: &mut Tables,
    state: &mut SmState,
    reclaim: &Reclaim,
    recorded: Recorded,
) -> Result<CommandOutcome, StorageError> {
    let clock_ms = state.advance_clock(reclaim.now_ms);
    let span = state.span.clone();
    let due = |item: &ExpiredRecord| span.contains(&item.key) && item.at_ms <= clock_ms;
    // What this reclaim records (nothing, unrecorded), of one kind at a time.
    let mut removed = Vec::new();
    let note = |removed: &mut Vec<_>, key, what| {
        if recorded == Recorded::Yes {
            removed.push((key, what));
        }
    };
    for item in reclaim.locks.iter().filter(|item| due(item)) {
        let stored: Option<LockHold> = tables::read_row(tables.locks.table()?, &item.key, "lock")?;
        if let Some(hold) = stored.filter(|hold| hold.available_at_ms() == item.at_ms) {
            let (locks, deadlines) = (tables.locks.table()?, tables.deadlines.table()?);
            let counts = state.lock_counts();
            tables::write_deadlined::<LockHold>(locks, deadlines, counts, &item.key, None)?;
            let what = tables::Changed::LockReclaimed { token: hold.token };
            note(&mut removed, item.key.as_slice(), what);
        }
    }
    record_reclaimed(tables, state, clock_ms, &mut removed)?;
    for item in reclaim.records.iter().filter(|item| due(item)) {
        let what = "idempotency record";
        let stored: Option<IdempotencyRecord> =
            tables::read_row(tables.idempotency.table()?, &item.key, what)?;
        if let Some(record) = stored.filter(|record| record.expires_at_ms() == item.at_ms) {
            let (records, deadlines) = (tables.idempotency.table()?, tables.deadlines.table()?);
            let counts = state.record_counts();
            tables::write_deadlined::<IdempotencyRecord>(
                records, deadlines, counts, &item.key, None,
            )?;
            let what = tables::Changed::RecordReclaimed {
                token: record.token(),
            };
            note(&mut removed, item.key.as_slice(), what);
        }
    }
    record_reclaimed(tables, state, clock_ms, &mut removed)?;
    Ok(CommandOutcome::Internal)
}

/// Records `removed` (drained) as the events of one new revision, if there are any.
fn record_reclaimed(
    tables: &mut Tables,
    state: &mut SmState,
    clock_ms: u64,
    removed: &mut Vec<(&[u8], tables::Changed)>,
) -> Result<(), StorageError> {
    if removed.is_empty() {
        return Ok(());
    }
    let revision = state.revision + 1;
    for (key, what) in removed.drain(..) {
        let change = tables::Change {
            revision,
            clock_ms,
            key,
            what,
        };
        tables::record_event(tables.history.table()?, &mut state.history_bytes, change)?;
    }
    state.revision = revision;
    Ok(())
}

pub(crate) fn read_kv<R>(kv: &R, key: &[u8]) -> Result<Option<KeyValue>, StorageError>
where
    R: ReadableTable<tables::Bytes, tables::Bytes>,
{
    let row = kv.get(key).map_err(|e| StorageError::redb("read kv", e))?;
    row.map(|value| tables::decode_kv(key, value.value()))
        .transpose()
}

#[cfg(test)]
mod tests {
    use keel_types::Condition;

    use super::*;

    /// The clock every plan runs at.
    const NOW: u64 = 1_000;

    fn put(key: &str, value: &str, condition: Option<Condition>) -> BatchOp {
        BatchOp::Put {
            key: key.as_bytes().to_vec(),
            value: value.as_bytes().to_vec(),
            condition,
            return_previous: true,
            ttl_ms: None,
        }
    }

    fn put_ttl(key: &str, value: &str, ttl_ms: u64) -> BatchOp {
        BatchOp::Put {
            key: key.as_bytes().to_vec(),
            value: value.as_bytes().to_vec(),
            condition: None,
            return_previous: true,
            ttl_ms: Some(ttl_ms),
        }
    }

    fn delete(key: &str, condition: Option<Condition>) -> BatchOp {
        BatchOp::Delete {
            key: key.as_bytes().to_vec(),
            condition,
            return_previous: true,
        }
    }

    fn increment(key: &str, delta: i64) -> BatchOp {
        BatchOp::Increment {
            key: key.as_bytes().to_vec(),
            delta,
        }
    }

    fn kv(
        key: &str,
        value: &str,
        create_revision: Revision,
        mod_revision: Revision,
        version: u64,
    ) -> KeyValue {
        KeyValue {
            key: key.as_bytes().to_vec(),
            value: value.as_bytes().to_vec(),
            create_revision,
            mod_revision,
            version,
            expires_at_ms: None,
            lease: 0,
        }
    }

    fn expiring(kv: KeyValue, expires_at_ms: u64) -> KeyValue {
        KeyValue {
            expires_at_ms: Some(expires_at_ms),
            ..kv
        }
    }

    /// The store every plan reads at revision 5: `a=old` (created at 2, modified at 4,
    /// version 3), `t` expired exactly at `NOW`, counter `n=41` expiring later, `max` at
    /// `i64::MAX`, `x=abc`, which is not a counter, and `worn`, at the largest version.
    fn stored(key: &[u8]) -> Option<KeyValue> {
        let max = i64::MAX.to_string();
        let rows = [
            kv("a", "old", 2, 4, 3),
            expiring(kv("t", "gone", 1, 3, 2), NOW),
            expiring(kv("n", "41", 1, 2, 2), 5_000),
            kv("max", &max, 1, 1, 1),
            kv("x", "abc", 1, 1, 1),
            kv("worn", "w", 1, 1, u64::MAX),
        ];
        rows.into_iter().find(|kv| kv.key == key)
    }

    /// Why a plan writes nothing.
    #[derive(Debug)]
    enum Refused {
        Condition(u32),
        Rejected(Rejection),
    }

    /// Either the writes a plan makes or why it writes nothing.
    type Expected = Result<Vec<(&'static str, Option<KeyValue>)>, Refused>;

    fn check(ops: Vec<BatchOp>, expected: Expected) {
        let plan = plan_write(&ops, 5, NOW, |key| Ok(stored(key))).unwrap();
        match (plan, expected) {
            (
                WritePlan::Apply {
                    revision, writes, ..
                },
                Ok(expected),
            ) => {
                assert_eq!(revision, 6, "{ops:?}");
                let expected: BTreeMap<Vec<u8>, Option<KeyValue>> = expected
                    .into_iter()
                    .map(|(key, value)| (key.as_bytes().to_vec(), value))
                    .collect();
                assert_eq!(writes, expected, "{ops:?}");
            }
            (WritePlan::Failed(failed), Err(Refused::Condition(op_index))) => {
                assert_eq!(failed.op_index, op_index, "{ops:?}");
                assert_eq!(failed.revision, 5, "{ops:?}");
            }
            (WritePlan::Rejected(rejection), Err(Refused::Rejected(expected))) => {
                assert_eq!(rejection, expected, "{ops:?}");
            }
            (plan, expected) => panic!("{ops:?}: planned {plan:?}, expected {expected:?}"),
        }
    }

    #[test]
    fn write_plans() {
        use Condition::{Absent, Revision as AtRevision, Value};
        let failed = |op_index| Err(Refused::Condition(op_index));
        let cases: Vec<(Vec<BatchOp>, Expected)> = vec![
            // A new key is created at the new revision with version 1; an existing key keeps its
            // create_revision and counts one more version.
            (
                vec![put("b", "1", None)],
                Ok(vec![("b", Some(kv("b", "1", 6, 6, 1)))]),
            ),
            (
                vec![put("a", "1", None)],
                Ok(vec![("a", Some(kv("a", "1", 2, 6, 4)))]),
            ),
            (vec![delete("a", None)], Ok(vec![("a", None)])),
            (vec![delete("zz", None)], Ok(vec![("zz", None)])),
            // Conditions on stored state.
            (vec![put("a", "1", Some(Absent))], failed(0)),
            (
                vec![put("b", "1", Some(Absent))],
                Ok(vec![("b", Some(kv("b", "1", 6, 6, 1)))]),
            ),
            (
                vec![put("a", "1", Some(AtRevision(4)))],
                Ok(vec![("a", Some(kv("a", "1", 2, 6, 4)))]),
            ),
            (vec![put("a", "1", Some(AtRevision(3)))], failed(0)),
            (
                vec![delete("a", Some(Value(b"old".to_vec())))],
                Ok(vec![("a", None)]),
            ),
            (vec![delete("a", Some(Value(b"new".to_vec())))], failed(0)),
            // Each condition sees the ops before it, and each op counts a version: a key deleted
            // and put again is created anew.
            (
                vec![delete("a", None), put("a", "2", Some(Absent))],
                Ok(vec![("a", Some(kv("a", "2", 6, 6, 1)))]),
            ),
            (
                vec![put("b", "1", None), put("b", "2", Some(AtRevision(6)))],
                Ok(vec![("b", Some(kv("b", "2", 6, 6, 2)))]),
            ),
            // A failing later op fails the whole batch.
            (
                vec![put("b", "1", None), put("a", "2", Some(Absent))],
                failed(1),
            ),
            (
                vec![delete("a", None), delete("a", Some(Value(b"old".to_vec())))],
                failed(1),
            ),
        ];
        for (ops, expected) in cases {
            check(ops, expected);
        }
    }

    #[test]
    fn expiry_plans() {
        use Condition::{Absent, Revision as AtRevision};
        let cases: Vec<(Vec<BatchOp>, Expected)> = vec![
            // Expired at exactly the clock: absent, so created anew at the new revision, version 1.
            (
                vec![put("t", "new", Some(Absent))],
                Ok(vec![("t", Some(kv("t", "new", 6, 6, 1)))]),
            ),
            (
                vec![put("t", "new", Some(AtRevision(3)))],
                Err(Refused::Condition(0)),
            ),
            // A TTL counts from the clock; a put without one clears it.
            (
                vec![put_ttl("b", "1", 250)],
                Ok(vec![("b", Some(expiring(kv("b", "1", 6, 6, 1), 1_250)))]),
            ),
            (
                vec![put("n", "1", Some(Condition::Revision(2)))],
                Ok(vec![("n", Some(kv("n", "1", 1, 6, 3)))]),
            ),
            (
                vec![put_ttl("a", "1", 10)],
                Ok(vec![("a", Some(expiring(kv("a", "1", 2, 6, 4), 1_010)))]),
            ),
            // The shortest TTL still makes a live key for the ops after it.
            (
                vec![put_ttl("b", "1", 1), put("b", "2", Some(Absent))],
                Err(Refused::Condition(1)),
            ),
        ];
        for (ops, expected) in cases {
            check(ops, expected);
        }
    }

    #[test]
    fn increment_plans() {
        let rejected = |rejection| Err(Refused::Rejected(rejection));
        let not_a_counter = |op_index, key: &str| {
            rejected(Rejection::NotACounter {
                op_index,
                key: key.as_bytes().to_vec(),
            })
        };
        let cases: Vec<(Vec<BatchOp>, Expected)> = vec![
            // Absent (or expired) counts as 0 and gets no TTL.
            (
                vec![increment("c", 5)],
                Ok(vec![("c", Some(kv("c", "5", 6, 6, 1)))]),
            ),
            (
                vec![increment("t", -2)],
                Ok(vec![("t", Some(kv("t", "-2", 6, 6, 1)))]),
            ),
            // A live counter keeps its TTL and create_revision.
            (
                vec![increment("n", 1)],
                Ok(vec![("n", Some(expiring(kv("n", "42", 1, 6, 3), 5_000)))]),
            ),
            (
                vec![increment("n", 1), increment("n", 1)],
                Ok(vec![("n", Some(expiring(kv("n", "43", 1, 6, 4), 5_000)))]),
            ),
            (vec![increment("x", 1)], not_a_counter(0, "x")),
            (
                vec![put("b", "1", None), increment("a", 1)],
                not_a_counter(1, "a"),
            ),
            (
                vec![increment("max", 1)],
                rejected(Rejection::Overflow {
                    op_index: 0,
                    key: b"max".to_vec(),
                    current: i64::MAX,
                    delta: 1,
                }),
            ),
            (
                vec![increment("max", i64::MIN)],
                Ok(vec![("max", Some(kv("max", "-1", 1, 6, 2)))]),
            ),
            // The first failure in op order wins.
            (
                vec![increment("x", 1), put("a", "1", Some(Condition::Absent))],
                not_a_counter(0, "x"),
            ),
            (
                vec![put("a", "1", Some(Condition::Absent)), increment("x", 1)],
                Err(Refused::Condition(0)),
            ),
        ];
        for (ops, expected) in cases {
            check(ops, expected);
        }
    }

    #[test]
    fn version_plans() {
        let cases: Vec<(Vec<BatchOp>, Expected)> = vec![
            // Every put or increment of a live key counts one more version, also within a batch.
            (
                vec![put("b", "1", None), put("b", "2", None), increment("b", 1)],
                Ok(vec![("b", Some(kv("b", "3", 6, 6, 3)))]),
            ),
            (
                vec![put("a", "1", None), increment("a", 1)],
                Ok(vec![("a", Some(kv("a", "2", 2, 6, 5)))]),
            ),
            // A delete ends the key: what writes it next creates it anew, at version 1.
            (
                vec![delete("a", None), increment("a", 1)],
                Ok(vec![("a", Some(kv("a", "1", 6, 6, 1)))]),
            ),
            // So does its expiry, whatever version the expired row had.
            (
                vec![put("t", "1", None)],
                Ok(vec![("t", Some(kv("t", "1", 6, 6, 1)))]),
            ),
            // The count saturates rather than overflow.
            (
                vec![put("worn", "w2", None)],
                Ok(vec![("worn", Some(kv("worn", "w2", 1, 6, u64::MAX)))]),
            ),
        ];
        for (ops, expected) in cases {
            check(ops, expected);
        }
    }

    #[test]
    fn results_report_previous_state_per_op() {
        let ops = vec![
            put("a", "1", None),
            delete("a", None),
            delete("a", None),
            delete("t", None),
            increment("n", 2),
        ];
        let plan = plan_write(&ops, 5, NOW, |key| Ok(stored(key))).unwrap();
        let WritePlan::Apply { results, .. } = plan else {
            panic!("expected an applied plan")
        };
        let result = |previous, existed, counter| OpResult {
            previous,
            existed,
            counter,
        };
        let expected = vec![
            result(stored(b"a"), true, None),
            result(Some(kv("a", "1", 2, 6, 4)), true, None),
            result(None, false, None),
            result(None, false, None),
            result(None, true, Some(43)),
        ];
        assert_eq!(results, expected);
    }
}
