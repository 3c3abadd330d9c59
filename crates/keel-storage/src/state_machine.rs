//! `StateMachine`: one range's key-value data, locks, fences and idempotency records as
//! openraft's `RaftStateMachine` (with its `SnapshotBuilder`, which `snapshot::build` does
//! the work of), plus the reads the server serves from it and the read-only planning of
//! cleanups and reclaims (`upkeep`). Knows nothing about gRPC, routing, lock queues or the
//! network, and reads no clock: callers pass the time.
//!
//! Applies run on the writer thread, in the same transaction as the applied log id,
//! membership, revision and clock (`Durability::None`: log and data share the file, so a
//! crash rolls both back together). Reads run redb read transactions on blocking threads and
//! hide keys expired, locks free and idempotency records expired at `max(now_ms, the range
//! clock)`.
//!
//! The state machine holds no span of its own: every read takes the range's span (and
//! epoch) from the state it reads in the same read transaction, so a read after a split sees
//! the smaller span, and a key outside it is absent. The range's descriptor, its key and
//! byte counts and the key to split it at for size (`split_key`) come from the same state;
//! the meta range's state machine also reads the `meta` table (`meta_ranges`,
//! `meta_nodes`).

use std::collections::BTreeMap;
use std::io;

use futures::{Stream, StreamExt};
use keel_types::planted::{self, PlantedBug};
use keel_types::{
    Cleanup, CoordinationCounts, Event, EventCursor, IdempotencyRecord, KeyHistory, KeyValue,
    LeaseInfo, LockHold, LockPhase, NodeDescriptor, NodeId, NodeState, RangeDescriptor, RangeId,
    Reclaim, ReplicaAnswer, ReplicaMembership, Revision, limits,
};
use openraft::OptionalSend;
use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine};
use redb::{ReadTransaction, ReadableDatabase, ReadableTable, TableDefinition};
use tokio::sync::oneshot;
use tracing::Instrument;

use crate::error::StorageError;
use crate::meta::{self, MetaRow};
use crate::op::{Op, Outcome};
use crate::raft_types::{
    EntryResponder, LogId, Snapshot, SnapshotMeta, StoredMembership, TypeConfig,
};
use crate::snapshot;
use crate::snapshot_file::SnapshotFile;
use crate::store::Store;
use crate::tables::{
    self, CompactStep, DEADLINES, FENCES, IDEMPOTENCY, KV, KeySpan, LEASE_KEYS, LEASES, LOCKS,
    LeaseRecord, META, SESSIONS, SM_META, SmState, TTL,
};
use crate::upkeep::{self, Upkeep, due_records, expired_keys, idle_sessions};
use crate::writer::Done;
use crate::{apply, install};

pub use at_revision::{AtRevision, Unreadable};

/// One page of a scan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanPage {
    pub kvs: Vec<KeyValue>,
    /// The range's applied revision the page was read at.
    pub revision: Revision,
    /// `Some(key)`: more rows remain; the next page starts at `key`. A page that skipped
    /// many expired rows may end early, even with no rows, and still have a next page.
    pub next_start: Option<Vec<u8>>,
}

/// How much data, exactly-once and TTL state a range keeps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RangeCounts {
    /// Client sessions.
    pub sessions: u64,
    /// Request records of those sessions.
    pub requests: u64,
    /// Keys with an expiry, expired ones not yet cleaned up included.
    pub keys_with_ttl: u64,
    /// Keys, expired ones not yet cleaned up included.
    pub keys: u64,
    /// Key plus value bytes of those keys.
    pub size_bytes: u64,
}

/// What a replica holds of a range's history.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HistoryCounts {
    /// Events at or below this revision may be gone; every event above it is here.
    pub floor: Revision,
    /// Bytes of the range's events (what `HistoryRetention::max_bytes` bounds).
    pub bytes: u64,
}

/// Keys and bytes a tenant's keys and bytes quotas count: rows of `kv` (bytes: key plus
/// value) and rows of `locks`, `fences` and `idempotency` (keys only: their bytes are not
/// counted per range yet).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QuotaCounts {
    pub keys: u64,
    pub bytes: u64,
}

impl Store {
    /// The state machine of one range. Its key span is read from the range's state with
    /// every read and apply (`KeySpan::unrecorded` for a range without one).
    pub fn state_machine(&self, range: RangeId) -> StateMachine {
        StateMachine::new(self.clone(), range)
    }
}

/// The state machine of one range. Cheap to clone. Every read takes the range's key span
/// from its state in the same read transaction, so a split is seen at once.
#[derive(Clone)]
pub struct StateMachine {
    store: Store,
    range: RangeId,
    /// The span each apply's span is a child of (the caller's node and range), so the logs
    /// of an apply name the node although storage knows nothing of nodes.
    trace_parent: tracing::Span,
}

/// How much of a range's history a replica keeps (`StateMachine::compact_history`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistoryRetention {
    /// Events written longer ago than this (by the range clock) go.
    pub max_age_ms: u64,
    /// The oldest events go while the range's events hold more bytes than this (keys and
    /// the values before and after each change).
    pub max_bytes: u64,
}

/// A page of one key's history as a range's replica holds it (`StateMachine::key_history`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HistoryRead {
    Events(KeyHistory),
    /// Events from the asked revision on may be gone: the range's history floor.
    Compacted {
        compact_revision: Revision,
    },
    /// The key is outside the range's span (it split off since the read was routed).
    Outside {
        descriptor: RangeDescriptor,
    },
}

/// The events of a range's whole span (`StateMachine::range_events`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RangeRead {
    Events(RangeEventsPage),
    /// Events from the asked cursor on may be gone: the range's history floor.
    Compacted {
        compact_revision: Revision,
    },
}

/// A read of a range's events from a cursor on, with the range as the read found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeEventsPage {
    /// The events of the range's whole span.
    pub page: SpanEventsPage,
    pub descriptor: RangeDescriptor,
    /// The index of the last log entry the state read reflects.
    pub applied_index: u64,
}

/// Events from a cursor on (`RangeEventsPage`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpanEventsPage {
    /// In revision order, key order within a revision.
    pub events: Vec<Event>,
    /// Where the next read starts; `None` when this one reached `revision`.
    pub next: Option<EventCursor>,
    /// The range's applied revision when the events were read.
    pub revision: Revision,
}

/// One key as a range's replica holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyRead {
    /// In the range's span: the live row, if any, and the range's applied revision.
    Inside {
        kv: Option<KeyValue>,
        revision: Revision,
    },
    /// Outside the range's span (it split off since the read was routed).
    Outside {
        descriptor: RangeDescriptor,
        revision: Revision,
    },
}

impl StateMachine {
    fn new(store: Store, range: RangeId) -> StateMachine {
        StateMachine {
            store,
            range,
            trace_parent: tracing::Span::none(),
        }
    }

    /// This state machine with its applies traced as children of `parent`.
    pub fn traced_under(self, parent: tracing::Span) -> StateMachine {
        StateMachine {
            trace_parent: parent,
            ..self
        }
    }

    /// The range this state machine belongs to.
    pub fn range(&self) -> RangeId {
        self.range
    }

    /// The key (absent if expired at `max(now_ms, range clock)`) and the range's applied
    /// revision, or the range's descriptor when the key is outside its span, read in one
    /// consistent read transaction.
    pub async fn read_key(&self, key: &[u8], now_ms: u64) -> Result<KeyRead, StorageError> {
        let (range, key) = (self.range, key.to_vec());
        self.store
            .read_small(move |txn| {
                let state = readable_state(txn, range)?;
                // The planted bug reads a key outside the span from the file's rows anyway.
                if !state.span.contains(&key) && !planted::active(PlantedBug::StaleSpan) {
                    return Ok(KeyRead::Outside {
                        descriptor: state.descriptor(range),
                        revision: state.revision,
                    });
                }
                let kv = txn
                    .open_table(KV)
                    .map_err(|e| StorageError::redb("open kv", e))?;
                let now_ms = now_ms.max(state.clock_ms);
                let kv = apply::read_kv(&kv, &key)?.filter(|kv| !kv.is_expired(now_ms));
                Ok(KeyRead::Inside {
                    kv,
                    revision: state.revision,
                })
            })
            .await
    }

    /// `read_key`, with a key outside the span read as absent.
    pub async fn get(
        &self,
        key: &[u8],
        now_ms: u64,
    ) -> Result<(Option<KeyValue>, Revision), StorageError> {
        Ok(match self.read_key(key, now_ms).await? {
            KeyRead::Inside { kv, revision } => (kv, revision),
            KeyRead::Outside { revision, .. } => (None, revision),
        })
    }

    /// Keys of `[start, end)` (empty `end` = unbounded) inside the range that are not
    /// expired at `max(now_ms, range clock)`, in key order: at most `limit` rows (0 means
    /// `SCAN_LIMIT_DEFAULT`; capped at `SCAN_LIMIT_MAX`) and about `SCAN_PAGE_BYTES_MAX`
    /// bytes (a page holds at least one row unless it skipped expired rows only). A page
    /// examines at most `limits::SCAN_EXAMINED_PER_LIMIT_ROW` rows per row of its limit.
    pub async fn scan(
        &self,
        start: &[u8],
        end: &[u8],
        limit: u32,
        now_ms: u64,
    ) -> Result<ScanPage, StorageError> {
        let limit = page_rows(limit);
        let range = self.range;
        let (start, end) = (start.to_vec(), end.to_vec());
        self.store
            .read_small(move |txn| {
                let state = readable_state(txn, range)?;
                let kv = txn
                    .open_table(KV)
                    .map_err(|e| StorageError::redb("open kv", e))?;
                let page = PageLimits {
                    rows: limit,
                    now_ms: now_ms.max(state.clock_ms),
                };
                let bounds = state.span.clamp(&start, &end);
                scan_page(&kv, bounds, page, state.revision)
            })
            .await
    }

    /// The events of `key` from revision `from` on (0 = from the oldest kept), oldest first:
    /// at most `limit` (0 means `HISTORY_LIMIT_DEFAULT`; capped at `HISTORY_LIMIT_MAX`) and
    /// about `HISTORY_PAGE_BYTES_MAX` bytes, read in revision order through at most
    /// `HISTORY_EXAMINED_PER_PAGE` events of the range (`tables::key_events`), so a page may
    /// be short, even empty, and say where the next starts. `Compacted` when events from
    /// `from` on may be gone (`from` at or below the range's history floor), never a page
    /// with a gap.
    pub async fn key_history(
        &self,
        key: &[u8],
        from: Revision,
        limit: u32,
    ) -> Result<HistoryRead, StorageError> {
        let limit = match limit {
            0 => limits::HISTORY_LIMIT_DEFAULT,
            limit => limit.min(limits::HISTORY_LIMIT_MAX),
        } as usize;
        let (range, key) = (self.range, key.to_vec());
        self.store
            .read_small(move |txn| {
                let state = readable_state(txn, range)?;
                if !state.span.contains(&key) {
                    let descriptor = state.descriptor(range);
                    return Ok(HistoryRead::Outside { descriptor });
                }
                let floor = state.history_floor;
                if from != 0 && from <= floor {
                    return Ok(HistoryRead::Compacted {
                        compact_revision: floor,
                    });
                }
                let history = txn
                    .open_table(tables::HISTORY)
                    .map_err(|e| StorageError::redb("open history", e))?;
                let bounds = tables::EventBounds {
                    limit,
                    max_bytes: limits::HISTORY_PAGE_BYTES_MAX as u64,
                    examined: limits::HISTORY_EXAMINED_PER_PAGE,
                };
                let revisions = from.max(floor + 1)..=state.revision;
                let page = tables::key_events(&history, &key, revisions, bounds)?;
                Ok(HistoryRead::Events(KeyHistory {
                    events: page.events,
                    compact_revision: floor,
                    revision: state.revision,
                    next_revision: page.next,
                }))
            })
            .await
    }

    /// The events of the range's whole span as the read finds it from `from` on, up to the
    /// range's revision: at most `limit` events and about `max_bytes` of them (at least
    /// one), read through at most `HISTORY_EXAMINED_PER_PAGE` events of the file, so a read
    /// may stop inside a revision and come back short, even empty, with the cursor to go on
    /// from; with the range's descriptor and the log index its state reflects (a read every
    /// watch of the range on this node can take its own part of). `Compacted` when events
    /// from `from` on may be gone (`from` at or below the history floor).
    pub async fn range_events(
        &self,
        from: EventCursor,
        (limit, max_bytes): (usize, u64),
    ) -> Result<RangeRead, StorageError> {
        let range = self.range;
        self.store
            .read_small(move |txn| {
                let state = readable_state(txn, range)?;
                let bounds = (limit, max_bytes);
                Ok(
                    match events_page(txn, &state, &state.span, &from, bounds)? {
                        Some(page) => RangeRead::Events(RangeEventsPage {
                            page,
                            descriptor: state.descriptor(range),
                            applied_index: state.applied.map_or(0, |id| id.index),
                        }),
                        None => RangeRead::Compacted {
                            compact_revision: state.history_floor,
                        },
                    },
                )
            })
            .await
    }

    /// Compacts the range's history on this replica: removes, oldest first and whole
    /// revisions at a time, the events written more than `retention.max_age_ms` before
    /// `now_ms` (by the range clock) and the oldest while the range's events hold more than
    /// `retention.max_bytes`, raising its history floor. Runs in bounded transactions of the
    /// writer thread; a range being installed or removed is left alone. Returns when its
    /// oldest kept event passes the age bound (`None`: it keeps no event); until then, only
    /// new applies can give it more to remove.
    pub async fn compact_history(
        &self,
        now_ms: u64,
        retention: HistoryRetention,
    ) -> Result<Option<u64>, StorageError> {
        let bound = tables::Retention {
            before_ms: now_ms.saturating_sub(retention.max_age_ms),
            max_bytes: retention.max_bytes,
        };
        let op = || Op::CompactHistory {
            range: self.range,
            retention: bound,
        };
        loop {
            match self.store.call(op()).await? {
                Outcome::Compacted(CompactStep::Budget) => continue,
                Outcome::Compacted(CompactStep::Kept { clock_ms }) => {
                    return Ok(Some(clock_ms.saturating_add(retention.max_age_ms)));
                }
                Outcome::Compacted(CompactStep::Empty) => return Ok(None),
                _ => unreachable!("a compaction step answers where it stopped"),
            }
        }
    }

    /// What a leader should propose to clean up now (read-only): up to `CLEANUP_KEYS_MAX`
    /// keys of the range expired at `max(now_ms, range clock)`, earliest expiry first, and up
    /// to `CLEANUP_SESSIONS_MAX` sessions idle since before `sessions_idle_before_ms`. The
    /// result carries `now_ms` as given. Applying it checks every item again.
    pub async fn plan_cleanup(
        &self,
        now_ms: u64,
        sessions_idle_before_ms: u64,
    ) -> Result<Cleanup, StorageError> {
        let range = self.range;
        self.store
            .read(move |txn| {
                let state = readable_state(txn, range)?;
                let ttl = txn
                    .open_table(TTL)
                    .map_err(|e| StorageError::redb("open ttl", e))?;
                let (keys, _) = expired_keys(&ttl, &state.span, now_ms.max(state.clock_ms))?;
                let sessions = txn
                    .open_table(SESSIONS)
                    .map_err(|e| StorageError::redb("open sessions", e))?;
                let (sessions, _) = idle_sessions(&sessions, range, sessions_idle_before_ms)?;
                Ok(Cleanup {
                    now_ms,
                    keys,
                    sessions,
                    sessions_idle_before_ms,
                })
            })
            .await
    }

    /// How many sessions, request records, keys with a TTL, keys and bytes the range keeps.
    pub async fn counts(&self) -> Result<RangeCounts, StorageError> {
        let state = self.state().await?;
        Ok(RangeCounts {
            sessions: state.sessions,
            requests: state.requests,
            keys_with_ttl: state.kv.keys_with_ttl,
            keys: state.kv.keys,
            size_bytes: state.kv.bytes,
        })
    }

    /// The range's history floor and the bytes of its events on this replica.
    pub async fn history_counts(&self) -> Result<HistoryCounts, StorageError> {
        let state = self.state().await?;
        Ok(HistoryCounts {
            floor: state.history_floor,
            bytes: state.history_bytes,
        })
    }

    /// The range as it is now: span, epoch, conf_version and voters (`replicas`, in node-id
    /// order). The meta range owns no key: its span is `[[], [])`.
    pub async fn descriptor(&self) -> Result<RangeDescriptor, StorageError> {
        let range = self.range;
        Ok(self.state().await?.descriptor(range))
    }

    /// The range's applied membership: its descriptor and its learners.
    pub async fn replica_membership(&self) -> Result<ReplicaMembership, StorageError> {
        let range = self.range;
        let state = self.state().await?;
        let mut learners: Vec<NodeId> = state.membership.membership().learner_ids().collect();
        learners.sort_unstable();
        Ok(ReplicaMembership {
            range: state.descriptor(range),
            learners,
        })
    }

    /// Where to split the range for size: the first key at which the key plus value bytes of
    /// the rows before it reach half of the range's bytes (rows expired but not cleaned up
    /// included), so both halves keep at least one key; `None` for a range of fewer than two
    /// keys. The key lies strictly inside the span.
    pub async fn split_key(&self) -> Result<Option<Vec<u8>>, StorageError> {
        let range = self.range;
        self.store
            .read(move |txn| {
                let state = readable_state(txn, range)?;
                if state.kv.keys < 2 {
                    return Ok(None);
                }
                let kv = txn
                    .open_table(KV)
                    .map_err(|e| StorageError::redb("open kv", e))?;
                middle_key(&kv, &state.span, state.kv.bytes)
            })
            .await
    }

    /// The range descriptors the meta range records, by start key; empty on any other range.
    pub async fn meta_ranges(&self) -> Result<Vec<RangeDescriptor>, StorageError> {
        let rows = self.meta_rows().await?;
        Ok(meta::ranges_by_start(&rows))
    }

    /// The nodes the meta range records, by id; empty on any other range.
    pub async fn meta_nodes(&self) -> Result<Vec<NodeDescriptor>, StorageError> {
        let rows = self.meta_rows().await?;
        Ok(meta::nodes_by_id(&rows))
    }

    /// Where each node the meta range records a state for stands (others are `Active`);
    /// empty on any other range.
    pub async fn meta_node_states(&self) -> Result<BTreeMap<NodeId, NodeState>, StorageError> {
        let rows = self.meta_rows().await?;
        Ok(meta::node_states(&rows))
    }

    /// The lock's hold unless it is free at `max(now_ms, range clock)` (or the name lies
    /// outside the range), with the range's applied revision, read in one read transaction.
    pub async fn lock(
        &self,
        name: &[u8],
        now_ms: u64,
    ) -> Result<(Option<LockHold>, Revision), StorageError> {
        let found = self.read_row::<LockHold>(LOCKS, name.to_vec(), now_ms, "lock");
        let (hold, revision, now_ms) = found.await?;
        let hold = hold.filter(|hold| hold.phase(now_ms) != LockPhase::Free);
        Ok((hold, revision))
    }

    /// etcd's `LeaseTimeToLive`: lease `id` of `namespace` as stored (expired ones too, until
    /// they are revoked: etcd reports them so), with the full user keys attached to it when
    /// `with_keys`, and the range's applied revision; `None` when there is no such lease in
    /// the range.
    pub async fn lease(
        &self,
        namespace: &[u8],
        id: i64,
        with_keys: bool,
    ) -> Result<(Option<LeaseInfo>, Revision), StorageError> {
        let (range, namespace) = (self.range, namespace.to_vec());
        self.store
            .read_small(move |txn| {
                let state = readable_state(txn, range)?;
                let key = tables::lease_key(&namespace, id);
                let open = |table, what| {
                    txn.open_table(table)
                        .map_err(|e| StorageError::redb(what, e))
                };
                let leases = open(LEASES, "open leases")?;
                let stored: Option<LeaseRecord> = match state.span.contains(&key) {
                    true => tables::read_row(&leases, &key, "lease")?,
                    false => None,
                };
                let Some(stored) = stored else {
                    return Ok((None, state.revision));
                };
                let keys = match with_keys {
                    true => {
                        let lease_keys = open(LEASE_KEYS, "open lease_keys")?;
                        tables::attached_keys(&lease_keys, &namespace, id, usize::MAX)?
                    }
                    false => Vec::new(),
                };
                let info = LeaseInfo {
                    id,
                    ttl_ms: stored.ttl_ms,
                    expires_at_ms: stored.expires_at_ms,
                    keys,
                };
                Ok((Some(info), state.revision))
            })
            .await
    }

    /// etcd's `LeaseLeases`: the ids of `namespace`'s leases (expired ones too, until they
    /// are revoked) in id order, at most `limits::LEASES_LIST_MAX` (the smallest; the others
    /// are left out), with the range's applied revision.
    pub async fn leases(&self, namespace: &[u8]) -> Result<(Vec<i64>, Revision), StorageError> {
        let (range, namespace) = (self.range, namespace.to_vec());
        self.store
            .read_small(move |txn| {
                let state = readable_state(txn, range)?;
                if !state.span.contains(&namespace) {
                    return Ok((Vec::new(), state.revision));
                }
                let leases = txn
                    .open_table(LEASES)
                    .map_err(|e| StorageError::redb("open leases", e))?;
                let max = limits::LEASES_LIST_MAX;
                let ids = tables::lease_ids(&leases, &namespace, max)?;
                Ok((ids, state.revision))
            })
            .await
    }

    /// Up to `max` locks of the range held at `max(now_ms, range clock)`, by name, and
    /// whether more rows were left unread (read-only, for display: it examines at most
    /// `max` rows, free ones included).
    pub async fn held_locks(
        &self,
        now_ms: u64,
        max: usize,
    ) -> Result<(Vec<(Vec<u8>, LockHold)>, bool), StorageError> {
        let range = self.range;
        self.store
            .read(move |txn| {
                let state = readable_state(txn, range)?;
                let now_ms = now_ms.max(state.clock_ms);
                let locks = txn
                    .open_table(LOCKS)
                    .map_err(|e| StorageError::redb("open locks", e))?;
                let rows = locks
                    .range::<&[u8]>(state.span.bounds())
                    .map_err(|e| StorageError::redb("read locks", e))?;
                let mut held = Vec::new();
                for (examined, row) in rows.enumerate() {
                    if examined == max {
                        return Ok((held, true));
                    }
                    let (name, value) = row.map_err(|e| StorageError::redb("read locks", e))?;
                    let hold: LockHold = crate::codec::decode("lock", value.value())?;
                    if hold.phase(now_ms) != LockPhase::Free {
                        held.push((name.value().to_vec(), hold));
                    }
                }
                Ok((held, false))
            })
            .await
    }

    /// The idempotency record (`idempotency_key(scope, id)`) unless it is expired at
    /// `max(now_ms, range clock)` (or the key lies outside the range), with the range's
    /// applied revision, read in one read transaction.
    pub async fn idempotency_record(
        &self,
        key: &[u8],
        now_ms: u64,
    ) -> Result<(Option<IdempotencyRecord>, Revision), StorageError> {
        let what = "idempotency record";
        let found = self.read_row::<IdempotencyRecord>(IDEMPOTENCY, key.to_vec(), now_ms, what);
        let (record, revision, now_ms) = found.await?;
        let record = record.filter(|record| !record.is_expired(now_ms));
        Ok((record, revision))
    }

    /// What a leader should propose to reclaim now (read-only): up to `CLEANUP_KEYS_MAX`
    /// locks of the range free at `max(now_ms, range clock)` and as many idempotency records
    /// expired then, earliest first. The result carries `now_ms` as given. Applying it checks
    /// every item again.
    pub async fn plan_reclaim(&self, now_ms: u64) -> Result<Reclaim, StorageError> {
        let range = self.range;
        self.store
            .read(move |txn| {
                let state = readable_state(txn, range)?;
                let deadlines = txn
                    .open_table(DEADLINES)
                    .map_err(|e| StorageError::redb("open deadlines", e))?;
                let now_ms = now_ms.max(state.clock_ms);
                let (due, _) = due_records(&deadlines, &state.span, now_ms)?;
                Ok(Reclaim {
                    now_ms,
                    locks: due.locks,
                    records: due.records,
                })
            })
            .await
    }

    /// Plans the cleanup and the reclaim of the range at `now_ms` in one read (the same
    /// commands `plan_cleanup(now_ms, now_ms - dedup_window_ms)` and `plan_reclaim(now_ms)`
    /// plan), and when the next item falls due.
    pub async fn plan_upkeep(
        &self,
        now_ms: u64,
        dedup_window_ms: u64,
    ) -> Result<Upkeep, StorageError> {
        let range = self.range;
        self.store
            .read(move |txn| {
                let state = readable_state(txn, range)?;
                upkeep::plan(txn, range, &state, now_ms, dedup_window_ms)
            })
            .await
    }

    /// How many locks, fenced keys and idempotency records the range keeps (free locks and
    /// expired records not yet reclaimed included).
    pub async fn coordination_counts(&self) -> Result<CoordinationCounts, StorageError> {
        let state = self.state().await?;
        Ok(CoordinationCounts {
            locks: state.locks,
            fenced_keys: state.fenced_keys,
            idempotency_records: state.idempotency_records,
        })
    }

    /// What a tenant's keys and bytes quotas count in the whole range, from its recorded
    /// counts (no scan).
    pub async fn quota_counts(&self) -> Result<QuotaCounts, StorageError> {
        Ok(recorded_quota_counts(&self.state().await?))
    }

    /// What a tenant's quotas count in the range's part of `[start, end)`, counted row by
    /// row.
    pub async fn quota_counts_within(
        &self,
        start: Vec<u8>,
        end: Vec<u8>,
    ) -> Result<QuotaCounts, StorageError> {
        let range = self.range;
        self.store
            .read(move |txn| {
                let state = readable_state(txn, range)?;
                quota_counts_in_rows(txn, &state.span.within(start, end))
            })
            .await
    }

    /// What a tenant's quotas count of its namespace `[start, end)` in this range, in one
    /// read: the recorded counts when the range lies inside the namespace, else the
    /// namespace's rows counted one by one (a namespace that shares a range with other keys
    /// before its bounds split).
    pub async fn namespace_quota_counts(
        &self,
        start: Vec<u8>,
        end: Vec<u8>,
    ) -> Result<QuotaCounts, StorageError> {
        let range = self.range;
        self.store
            .read(move |txn| {
                let state = readable_state(txn, range)?;
                match state.span.lies_in(&start, &end) {
                    true => Ok(recorded_quota_counts(&state)),
                    false => quota_counts_in_rows(txn, &state.span.within(start, end)),
                }
            })
            .await
    }

    /// Why the range is held, while it is (`Command::Hold`): no read of it may be served.
    pub fn hold(&self) -> Option<keel_types::Hold> {
        self.store.hold(self.range)
    }

    /// The applied revision and applied log id; `(0, None)` while a snapshot install is
    /// unfinished.
    pub async fn applied(&self) -> Result<(Revision, Option<LogId>), StorageError> {
        let range = self.range;
        let state = self
            .store
            .read_small(move |txn| read_state(txn, range))
            .await?;
        match state.installing {
            Some(_) => Ok((0, None)),
            None => Ok((state.revision, state.applied)),
        }
    }
}

impl StateMachine {
    /// The span of one apply: the range, and the term and log index of its last entry.
    /// This replica's answer for the consistency check at log index `index`, waiting up to
    /// `wait` for it to be applied and hashed (`check`).
    pub async fn digest(&self, index: u64, wait: std::time::Duration) -> ReplicaAnswer {
        let applied = || async {
            let (_, applied) = self.applied().await.ok()?;
            applied.map(|log_id| log_id.index)
        };
        let checker = self.store.checker();
        checker.answer(self.range, index, wait, applied).await
    }

    /// Test fault: flips the last byte of `key`'s stored row on this replica only, bypassing
    /// the log (`Op::CorruptRow`), so that its state silently differs from the others'.
    #[cfg(any(test, feature = "fault-injection"))]
    pub async fn corrupt_row(&self, key: &[u8]) -> Result<(), StorageError> {
        let key = key.to_vec();
        let shown = keel_types::validate::show_key(&key);
        tracing::warn!(range = %self.range, key = %shown, "fault injection: corrupting a stored row");
        self.store.call(Op::CorruptRow { key }).await.map(|_| ())
    }

    /// Begins the read transaction the check at `index` hashes and queues it on the file's
    /// checker; called after the check entry's apply committed and before anything after it
    /// is applied.
    async fn snapshot_for_check(&self, index: u64, locate: Vec<u16>) {
        let checker = self.store.checker();
        let begun: Result<ReadTransaction, String> = match self.store.db() {
            Ok(db) => tokio::task::spawn_blocking(move || db.begin_read())
                .await
                .map_err(|e| e.to_string())
                .and_then(|txn| txn.map_err(|e| e.to_string())),
            Err(error) => Err(error.to_string()),
        };
        match begun {
            Ok(txn) => checker.queue(self.range, index, locate, txn),
            Err(error) => checker.refuse(self.range, index, &error),
        }
    }

    /// Applies `items` in one op of the writer and waits until it committed.
    async fn apply_batch(&self, items: Vec<EntryResponder>) -> Result<(), io::Error> {
        let (entries, responders): (Vec<_>, Vec<_>) = items.into_iter().unzip();
        let span = self.apply_span(&entries);
        let (reply, applied) = oneshot::channel();
        let op = Op::Apply {
            range: self.range,
            entries,
        };
        let submitted = self.store.submit(op, Done::Applied { reply, responders });
        submitted.instrument(span.clone()).await?;
        self.store.wait(applied).instrument(span.clone()).await?;
        span.in_scope(|| tracing::debug!("applied"));
        Ok(())
    }

    fn apply_span(&self, entries: &[crate::raft_types::Entry]) -> tracing::Span {
        let last = entries.last().map(|entry| &entry.log_id);
        tracing::info_span!(
            parent: &self.trace_parent,
            "apply_entries",
            range_id = self.range.0,
            term = last.map(|id| id.committed_leader_id().term),
            log_index = last.map(|id| id.index),
            entries = entries.len(),
        )
    }

    /// The range's readable state (not in the middle of an install).
    async fn state(&self) -> Result<SmState, StorageError> {
        let range = self.range;
        self.store
            .read_small(move |txn| readable_state(txn, range))
            .await
    }

    /// Every row of the `meta` table if this is the meta range; none otherwise.
    async fn meta_rows(&self) -> Result<Vec<MetaRow>, StorageError> {
        let range = self.range;
        if range != RangeId::META {
            return Ok(Vec::new());
        }
        self.store
            .read(move |txn| {
                readable_state(txn, range)?;
                let table = txn
                    .open_table(META)
                    .map_err(|e| StorageError::redb("open meta", e))?;
                meta::read_rows(&table)
            })
            .await
    }

    /// The decoded row of `key` in `table` (none outside the range), the range's applied
    /// revision, and `max(now_ms, range clock)` to judge it at.
    async fn read_row<T>(
        &self,
        table: TableDefinition<'static, tables::Bytes, tables::Bytes>,
        key: Vec<u8>,
        now_ms: u64,
        what: &'static str,
    ) -> Result<(Option<T>, Revision, u64), StorageError>
    where
        T: serde::de::DeserializeOwned + Send + 'static,
    {
        let range = self.range;
        self.store
            .read_small(move |txn| {
                let state = readable_state(txn, range)?;
                let now_ms = now_ms.max(state.clock_ms);
                if !state.span.contains(&key) {
                    return Ok((None, state.revision, now_ms));
                }
                let rows = txn
                    .open_table(table)
                    .map_err(|e| StorageError::redb("open table", e))?;
                let row = tables::read_row(&rows, &key, what)?;
                Ok((row, state.revision, now_ms))
            })
            .await
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotData = SnapshotFile;
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), io::Error> {
        let range = self.range;
        let state = self.store.read(move |txn| read_state(txn, range)).await?;
        match state.installing {
            Some(_) => Ok((None, StoredMembership::default())),
            None => Ok((state.applied, state.membership)),
        }
    }

    async fn apply<Strm>(&mut self, entries: Strm) -> Result<(), io::Error>
    where
        Strm: Stream<Item = Result<EntryResponder, io::Error>> + Unpin + OptionalSend,
    {
        let items: Vec<EntryResponder> = entries
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect::<Result<_, _>>()?;
        if items.is_empty() {
            return Ok(());
        }
        // A check entry ends a batch: its read transaction begins after the entries up to it
        // committed and before anything after it is applied.
        let mut items = items;
        while !items.is_empty() {
            let check_at = items
                .iter()
                .position(|(entry, _)| check_of(entry).is_some());
            let rest = items.split_off(check_at.map_or(items.len(), |at| at + 1));
            let batch = std::mem::replace(&mut items, rest);
            let check = batch.last().and_then(|(entry, _)| {
                check_of(entry).map(|locate| (entry.log_id.index, locate.to_vec()))
            });
            if let Some((index, _)) = &check {
                self.store.checker().expect(self.range, *index);
            }
            let hold = batch
                .iter()
                .rev()
                .find_map(|(entry, _)| hold_of(entry).cloned());
            let applied = self.apply_batch(batch).await;
            if let (Some(hold), Ok(())) = (hold, &applied) {
                self.store.set_hold(self.range, hold);
            }
            if let Some((index, locate)) = check {
                match &applied {
                    Ok(()) => self.snapshot_for_check(index, locate).await,
                    Err(_) => self
                        .store
                        .checker()
                        .refuse(self.range, index, "its apply failed"),
                }
            }
            applied?;
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> SnapshotBuilder {
        SnapshotBuilder {
            store: self.store.clone(),
            range: self.range,
        }
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: SnapshotFile,
    ) -> Result<(), io::Error> {
        install::install(&self.store, self.range, meta, snapshot).await?;
        let hold = self.state().await?.hold;
        self.store.set_hold(self.range, hold);
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, io::Error> {
        self.store.check()?;
        Ok(snapshot::current(self.store.snapshot_dir(), self.range).await?)
    }
}

/// Builds a snapshot of one range from a consistent read transaction.
pub struct SnapshotBuilder {
    store: Store,
    range: RangeId,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    type SnapshotData = SnapshotFile;

    async fn build_snapshot(&mut self) -> Result<Snapshot, io::Error> {
        let db = self.store.db()?;
        let dir = self.store.snapshot_dir().to_path_buf();
        let range = self.range;
        let task = tokio::task::spawn_blocking(move || snapshot::build(&db, &dir, range));
        let (meta, snapshot) = task.await.map_err(io::Error::other)??;
        tracing::info!(%range, last_log_id = ?meta.last_log_id, bytes = snapshot.len_bytes(), "snapshot built");
        Ok(Snapshot { meta, snapshot })
    }
}

/// The buckets to locate of a check entry; `None` for any other entry.
fn check_of(entry: &crate::raft_types::Entry) -> Option<&[u16]> {
    match &entry.payload {
        openraft::EntryPayload::Normal(keel_types::Command::Check(check)) => Some(&check.locate),
        _ => None,
    }
}

/// What a hold entry sets (`Some(None)`: a release); `None` for any other entry.
fn hold_of(entry: &crate::raft_types::Entry) -> Option<&Option<keel_types::Hold>> {
    match &entry.payload {
        openraft::EntryPayload::Normal(keel_types::Command::Hold(hold)) => Some(hold),
        _ => None,
    }
}

fn read_state(txn: &ReadTransaction, range: RangeId) -> Result<SmState, StorageError> {
    let sm_meta = txn
        .open_table(SM_META)
        .map_err(|e| StorageError::redb("open sm_meta", e))?;
    tables::read_sm_state(&sm_meta, range)
}

/// The state of a range whose data may be read: not in the middle of a snapshot install.
pub(crate) fn readable_state(
    txn: &ReadTransaction,
    range: RangeId,
) -> Result<SmState, StorageError> {
    let state = read_state(txn, range)?;
    match state.installing {
        Some(_) => Err(StorageError::SnapshotInstalling { range }),
        None => Ok(state),
    }
}

/// The events of `span` from `from` on up to the range's revision, within `(limit,
/// max_bytes)` and `HISTORY_EXAMINED_PER_PAGE` rows; `None` when events from `from` on may
/// be gone (`from` at or below the history floor).
fn events_page(
    txn: &ReadTransaction,
    state: &SmState,
    span: &KeySpan,
    from: &EventCursor,
    (limit, max_bytes): (usize, u64),
) -> Result<Option<SpanEventsPage>, StorageError> {
    if from.revision <= state.history_floor {
        return Ok(None);
    }
    let history = txn
        .open_table(tables::HISTORY)
        .map_err(|e| StorageError::redb("open history", e))?;
    let bounds = tables::EventBounds {
        limit,
        max_bytes,
        examined: limits::HISTORY_EXAMINED_PER_PAGE,
    };
    let read = tables::span_events(&history, span, from, state.revision, bounds)?;
    Ok(Some(SpanEventsPage {
        events: read.events,
        next: read.next,
        revision: state.revision,
    }))
}

/// The rows of a scan page with `limit`: 0 means `SCAN_LIMIT_DEFAULT`, capped at
/// `SCAN_LIMIT_MAX`.
pub(crate) fn page_rows(limit: u32) -> usize {
    let rows = match limit {
        0 => limits::SCAN_LIMIT_DEFAULT,
        limit => limit.min(limits::SCAN_LIMIT_MAX),
    };
    rows as usize
}

/// What ends a scan page besides its bounds.
struct PageLimits {
    rows: usize,
    /// Rows expired at this instant are skipped.
    now_ms: u64,
}

fn scan_page<R>(
    kv: &R,
    bounds: (std::ops::Bound<&[u8]>, std::ops::Bound<&[u8]>),
    page: PageLimits,
    revision: Revision,
) -> Result<ScanPage, StorageError>
where
    R: ReadableTable<tables::Bytes, tables::Bytes>,
{
    let mut rows = kv
        .range::<&[u8]>(bounds)
        .map_err(|e| StorageError::redb("scan kv", e))?;
    let examined_max = page
        .rows
        .saturating_mul(limits::SCAN_EXAMINED_PER_LIMIT_ROW);
    let mut kvs: Vec<KeyValue> = Vec::new();
    let mut bytes = 0usize;
    let mut examined = 0usize;
    // The last key this page has taken or skipped: the next page starts after it.
    let mut last_key: Option<Vec<u8>> = None;
    let more = loop {
        let Some(row) = rows.next() else { break false };
        if kvs.len() == page.rows || examined == examined_max {
            break true;
        }
        let (key, value) = row.map_err(|e| StorageError::redb("scan kv", e))?;
        if tables::decode_kv_expiry(value.value())?.is_some_and(|at| at <= page.now_ms) {
            examined += 1;
            last_key = Some(key.value().to_vec());
            continue;
        }
        let row_bytes = key.value().len() + value.value().len();
        if !kvs.is_empty() && bytes + row_bytes > limits::SCAN_PAGE_BYTES_MAX {
            break true;
        }
        examined += 1;
        bytes += row_bytes;
        kvs.push(tables::decode_kv(key.value(), value.value())?);
        last_key = None;
    };
    let next_start = match last_key.or_else(|| kvs.last().map(|kv| kv.key.clone())) {
        Some(mut next) if more => {
            next.push(0);
            Some(next)
        }
        _ => None,
    };
    Ok(ScanPage {
        kvs,
        revision,
        next_start,
    })
}

/// The first key of `span` at which the key plus value bytes of the rows before it reach half
/// of `bytes`, never the span's first row; the last row's key if the rows hold less than
/// `bytes` (counts and rows disagree only if a count is wrong); `None` under two rows.
fn middle_key<R>(kv: &R, span: &KeySpan, bytes: u64) -> Result<Option<Vec<u8>>, StorageError>
where
    R: ReadableTable<tables::Bytes, tables::Bytes>,
{
    let rows = kv
        .range::<&[u8]>(span.bounds())
        .map_err(|e| StorageError::redb("read kv", e))?;
    let mut before = 0u64;
    let mut last: Option<Vec<u8>> = None;
    for (index, row) in rows.enumerate() {
        let (key, value) = row.map_err(|e| StorageError::redb("read kv", e))?;
        if index > 0 && before.saturating_mul(2) >= bytes {
            return Ok(Some(key.value().to_vec()));
        }
        let value_len = tables::decode_kv_value_len(value.value())?;
        before += (key.value().len() + value_len) as u64;
        if index > 0 {
            last = Some(key.value().to_vec());
        }
    }
    Ok(last)
}

/// What the quotas count of a range, from its recorded counts: keys, locks, fenced keys and
/// idempotency records, and their bytes.
fn recorded_quota_counts(state: &SmState) -> QuotaCounts {
    QuotaCounts {
        keys: state.kv.keys + state.locks + state.fenced_keys + state.idempotency_records,
        bytes: state.kv.bytes + state.coordination_bytes,
    }
}

/// What the quotas count of the rows within `span`, counted one by one.
fn quota_counts_in_rows(
    txn: &ReadTransaction,
    span: &KeySpan,
) -> Result<QuotaCounts, StorageError> {
    let open = |table| {
        txn.open_table(table)
            .map_err(|e| StorageError::redb("open table", e))
    };
    let kv = tables::count_kv_rows(&open(KV)?, span)?;
    let locks = tables::count_rows(&open(LOCKS)?, span)?;
    let fences = tables::count_rows(&open(FENCES)?, span)?;
    let records = tables::count_rows(&open(IDEMPOTENCY)?, span)?;
    Ok(QuotaCounts {
        keys: kv.keys + locks.0 + fences.0 + records.0,
        bytes: kv.bytes + locks.1 + fences.1 + records.1,
    })
}

mod at_revision;
#[cfg(test)]
pub(crate) mod tests;
