//! Planning a range's upkeep, read-only: the expired keys and idle sessions a cleanup
//! removes, the free locks and expired idempotency records a reclaim removes, the expired
//! etcd leases an `ExpireLeases` revokes, and when the next of them falls due. A range's
//! state changes only by applying, so a leader that has seen the same applied index since a
//! plan can leave the range alone until that time: an idle range costs no read until
//! something in it expires. Knows nothing of who proposes the commands, and reads no clock:
//! callers pass the time.
//!
//! The TTL and deadline indexes are shared by every range of a file and ordered by time, so
//! a plan examines a bounded number of rows (`limits::CLEANUP_EXAMINED_PER_KEY` per item it
//! may take) and skips other ranges' rows. When the budget runs out first, the time of the
//! next row is a lower bound on the next due time of this range's rows after it.

use keel_types::{
    Cleanup, ExpireLeases, ExpiredKey, ExpiredLease, ExpiredRecord, RangeId, Reclaim, limits,
};
use redb::{ReadTransaction, ReadableTable};

use crate::error::StorageError;
use crate::tables::{self, DEADLINES, KeySpan, SESSIONS, Session, SmState, TTL};

/// Everything a range's leader may propose to clean up and reclaim now, read at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upkeep {
    pub cleanup: Cleanup,
    pub reclaim: Reclaim,
    /// (format 12) The expired etcd leases of the range, at most `CLEANUP_LEASES_MAX`.
    pub expire_leases: ExpireLeases,
    /// The earliest time, on the clock of `now_ms`, at which another plan of the range, its
    /// state unchanged, could find more than this one; at or before `now_ms` when this plan
    /// stopped at a limit. `None`: nothing of the range falls due unless its state changes.
    pub next_due_ms: Option<u64>,
}

/// Plans the cleanup and the reclaim of `range`, whose readable state is `state`, at
/// `now_ms` in the read transaction `txn`, and when the next item falls due
/// (`StateMachine::plan_upkeep`).
pub(crate) fn plan(
    txn: &ReadTransaction,
    range: RangeId,
    state: &SmState,
    now_ms: u64,
    dedup_window_ms: u64,
) -> Result<Upkeep, StorageError> {
    let open = |what: &'static str, e| StorageError::redb(what, e);
    let ttl = txn.open_table(TTL).map_err(|e| open("open ttl", e))?;
    let sessions = txn
        .open_table(SESSIONS)
        .map_err(|e| open("open sessions", e))?;
    let deadlines = txn
        .open_table(DEADLINES)
        .map_err(|e| open("open deadlines", e))?;
    let range_now_ms = now_ms.max(state.clock_ms);
    let idle_before_ms = now_ms.saturating_sub(dedup_window_ms);
    let (keys, keys_due) = expired_keys(&ttl, &state.span, range_now_ms)?;
    let (idle, sessions_due) = idle_sessions(&sessions, range, idle_before_ms)?;
    let sessions_due = match sessions_due {
        SessionsDue::Now => Some(now_ms),
        SessionsDue::ActiveSince(last_active_ms) => Some(
            last_active_ms
                .saturating_add(dedup_window_ms)
                .saturating_add(1),
        ),
        SessionsDue::Never => None,
    };
    let (due, records_due) = due_records(&deadlines, &state.span, range_now_ms)?;
    let next_due_ms = [keys_due, sessions_due, records_due]
        .into_iter()
        .flatten()
        .min();
    Ok(Upkeep {
        cleanup: Cleanup {
            now_ms,
            keys,
            sessions: idle,
            sessions_idle_before_ms: idle_before_ms,
        },
        reclaim: Reclaim {
            now_ms: range_now_ms,
            locks: due.locks,
            records: due.records,
        },
        expire_leases: ExpireLeases {
            now_ms: range_now_ms,
            leases: due.leases,
        },
        next_due_ms,
    })
}

/// Keys of `span` in the TTL index expired at `now_ms`, earliest expiry first; at most
/// `CLEANUP_KEYS_MAX`, after examining at most `limits::CLEANUP_EXAMINED_PER_KEY` index rows
/// per key. Also the expiry of the first key of `span` not taken (or a lower bound of it).
pub(crate) fn expired_keys<R>(
    ttl: &R,
    span: &KeySpan,
    now_ms: u64,
) -> Result<(Vec<ExpiredKey>, Option<u64>), StorageError>
where
    R: ReadableTable<tables::Bytes, tables::Bytes>,
{
    let examined_max = limits::CLEANUP_KEYS_MAX * limits::CLEANUP_EXAMINED_PER_KEY;
    let mut keys = Vec::new();
    let rows = ttl
        .range::<&[u8]>(..)
        .map_err(|e| StorageError::redb("read ttl index", e))?;
    for (examined, row) in rows.enumerate() {
        let (row, _) = row.map_err(|e| StorageError::redb("read ttl index", e))?;
        let (expires_at_ms, key) = tables::ttl_key_parts(row.value());
        if examined == examined_max {
            return Ok((keys, Some(expires_at_ms)));
        }
        if !span.contains(key) {
            continue;
        }
        if expires_at_ms > now_ms || keys.len() == limits::CLEANUP_KEYS_MAX {
            return Ok((keys, Some(expires_at_ms)));
        }
        keys.push(ExpiredKey {
            key: key.to_vec(),
            expires_at_ms,
        });
    }
    Ok((keys, None))
}

/// What the `deadlines` index holds due for one range: free locks, expired idempotency
/// records and (format 12) expired etcd leases, each earliest first.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct DueRecords {
    pub locks: Vec<ExpiredRecord>,
    pub records: Vec<ExpiredRecord>,
    pub leases: Vec<ExpiredLease>,
}

impl DueRecords {
    /// Takes a due row of `kind`; false when the list of its kind is full.
    fn take(&mut self, kind: u8, key: &[u8], at_ms: u64) -> bool {
        let record = || ExpiredRecord {
            key: key.to_vec(),
            at_ms,
        };
        match kind {
            tables::DEADLINE_LOCK if self.locks.len() < limits::CLEANUP_KEYS_MAX => {
                self.locks.push(record())
            }
            tables::DEADLINE_IDEMPOTENCY if self.records.len() < limits::CLEANUP_KEYS_MAX => {
                self.records.push(record())
            }
            tables::DEADLINE_LEASE if self.leases.len() < limits::CLEANUP_LEASES_MAX => {
                let (namespace, id) = tables::lease_key_parts(key);
                self.leases.push(ExpiredLease {
                    namespace: namespace.to_vec(),
                    id,
                    expires_at_ms: at_ms,
                });
            }
            tables::DEADLINE_LOCK | tables::DEADLINE_IDEMPOTENCY | tables::DEADLINE_LEASE => {
                return false;
            }
            other => panic!("a deadlines index row of unknown kind {other}"),
        }
        true
    }

    fn full(&self) -> bool {
        self.locks.len() == limits::CLEANUP_KEYS_MAX
            && self.records.len() == limits::CLEANUP_KEYS_MAX
            && self.leases.len() == limits::CLEANUP_LEASES_MAX
    }
}

/// Locks of `span` free at `now_ms`, idempotency records of `span` expired then and etcd
/// leases of `span` expired then, from the `deadlines` index, earliest first; at most
/// `CLEANUP_KEYS_MAX` locks and as many records and `CLEANUP_LEASES_MAX` leases, after
/// examining at most `limits::CLEANUP_EXAMINED_PER_KEY` index rows per item of all three
/// lists. Also the time of the first row of `span` not taken (or a lower bound of it).
pub(crate) fn due_records<R>(
    deadlines: &R,
    span: &KeySpan,
    now_ms: u64,
) -> Result<(DueRecords, Option<u64>), StorageError>
where
    R: ReadableTable<tables::Bytes, tables::Bytes>,
{
    let items_max = 2 * limits::CLEANUP_KEYS_MAX + limits::CLEANUP_LEASES_MAX;
    let examined_max = items_max * limits::CLEANUP_EXAMINED_PER_KEY;
    let mut due = DueRecords::default();
    let mut left_due = None;
    let rows = deadlines
        .range::<&[u8]>(..)
        .map_err(|e| StorageError::redb("read deadlines index", e))?;
    for (examined, row) in rows.enumerate() {
        let (row, _) = row.map_err(|e| StorageError::redb("read deadlines index", e))?;
        let (at_ms, kind, key) = tables::deadline_key_parts(row.value());
        if examined == examined_max {
            return Ok((due, left_due.or(Some(at_ms))));
        }
        if !span.contains(key) {
            continue;
        }
        if at_ms > now_ms {
            return Ok((due, left_due.or(Some(at_ms))));
        }
        if due.take(kind, key, at_ms) {
            continue;
        }
        left_due = left_due.or(Some(at_ms));
        if due.full() {
            break;
        }
    }
    Ok((due, left_due))
}

/// When the sessions of a range not yet idle fall idle.
pub(crate) enum SessionsDue {
    /// More are idle than one cleanup drops.
    Now,
    /// The earliest last activity of a session not idle yet.
    ActiveSince(u64),
    /// No session is left.
    Never,
}

/// Client ids of the range's sessions last active before `idle_before_ms`; at most
/// `CLEANUP_SESSIONS_MAX`, in client-id order. Also when the next of the others falls idle.
pub(crate) fn idle_sessions<R>(
    sessions: &R,
    range: RangeId,
    idle_before_ms: u64,
) -> Result<(Vec<u64>, SessionsDue), StorageError>
where
    R: ReadableTable<tables::Bytes, tables::Bytes>,
{
    let (start, end) = (
        tables::session_key(range, 0),
        tables::session_key(range, u64::MAX),
    );
    let rows = sessions
        .range(start.as_slice()..=end.as_slice())
        .map_err(|e| StorageError::redb("read sessions", e))?;
    let mut idle = Vec::new();
    let mut active_since: Option<u64> = None;
    for row in rows {
        let (key, value) = row.map_err(|e| StorageError::redb("read sessions", e))?;
        let session = Session::decode(value.value())?;
        if session.last_active_ms >= idle_before_ms {
            let earliest =
                active_since.map_or(session.last_active_ms, |at| at.min(session.last_active_ms));
            active_since = Some(earliest);
            continue;
        }
        if idle.len() == limits::CLEANUP_SESSIONS_MAX {
            return Ok((idle, SessionsDue::Now));
        }
        idle.push(tables::session_key_client(key.value()));
    }
    let due = active_since.map_or(SessionsDue::Never, SessionsDue::ActiveSince);
    Ok((idle, due))
}
