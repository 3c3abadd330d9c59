//! The redb tables of a store file, their key layouts and typed accessors. Knows nothing
//! about threads, async or openraft's traits; every function works inside a transaction it
//! is given.
//!
//! | table         | key                                   | value                                  |
//! |---------------|---------------------------------------|----------------------------------------|
//! | `raft_log`    | range id (u64 BE) + log index (u64 BE) | openraft entry                         |
//! | `raft_meta`   | range id (u64 BE) + kind (u8)          | vote / purged log id                    |
//! | `sm_meta`     | range id (u64 BE) + kind (u8)          | applied log id / membership / revision / installing marker / clock / session horizon / counts of sessions, request records, keys with a TTL, locks, fenced keys and idempotency records / (format 4) span, epoch, conf_version, counts of keys and bytes / (format 6) bytes of the range's locks, fences and idempotency records |
//! | `kv`          | user key                              | create and mod revision, expiry (format 2), then the raw value |
//! | `ttl`         | expiry ms (u64 BE) + user key          | empty                                  |
//! | `sessions`    | range id (u64 BE) + client id (u64 BE) | `Session` (format 6: with its owner)   |
//! | `requests`    | range id (u64 BE) + client id (u64 BE) + sequence (u64 BE) | the request's first `CommandOutcome` (format 6: a `RequestRecord`, with the request's digest) |
//! | `locks`       | lock name (format 3)                  | `LockHold`                             |
//! | `fences`      | user key (format 3)                   | `Fence`: the lock and highest token accepted |
//! | `idempotency` | `idempotency_key(scope, id)` (format 3) | `IdempotencyRecord`                  |
//! | `deadlines`   | instant ms (u64 BE) + kind (u8) + lock name or idempotency key (format 3) | empty |
//! | `meta`        | kind (u8) + range or node id (u64 BE) (format 4) | `RangeDescriptor` / `NodeDescriptor` / next range id (kind 3, id 0) |
//!
//! Ranges with state in one file have disjoint key spans, so they share the one `kv` table
//! and a split changes metadata only; `ttl` is shared the same way (filter it by span). A
//! range's span is its `sm_meta` span row; without one (`KeySpan::unrecorded`) range 1 spans
//! the whole keyspace (files of formats 1-3, a fresh first range) and any other range, the
//! meta range included, no key. `sm_meta` also counts the range's rows in `kv` and their key
//! plus value bytes, kept in step by `write_kv` (expired rows not yet cleaned up included);
//! a file of format 1-3 lacks these counts until the store opens it
//! (`count_unrecorded_kv`). Every value
//! starts with a format-version byte (`codec`), except `ttl` rows, which have no value: the
//! index holds a row `(e, key)` exactly when `kv` holds `key` with expiry `e`, and is kept in
//! step by every write of `kv`.
//!
//! `sessions` and `requests` hold the exactly-once state of each range (`session`): a
//! session's `records` counts its rows in `requests`, and the range's `sm_meta` counts its
//! sessions and request records, so limits and metrics need no table scans.
//!
//! `locks`, `fences` and `idempotency` are keyed by name or key alone, like `kv`: a lock name
//! and an idempotency key route to a range like a user key, so these tables are shared by the
//! ranges of a file and filtered by span. `deadlines` indexes when each lock becomes free
//! (`LockHold::available_at_ms`, kind 1) and when each idempotency record expires (kind 2):
//! it holds `(at, kind, key)` exactly when the table of that kind holds `key` with that
//! instant, kept in step by `write_deadlined`, so a reclaim plan reads it in time order.
//! `sm_meta` counts the range's rows of all three tables and (format 6) their bytes, kept
//! in step by `write_deadlined` and `write_fence` (`RowCounts`); a file of format 1-5 lacks
//! the bytes until the store opens it (`count_unrecorded_coordination`).
//!
//! `meta` is the meta range's (range 0's) table of the cluster: range descriptors, nodes and
//! the range id allocator (`meta`). No other range reads or writes it.

use std::ops::Bound;

use std::ops::RangeInclusive;

use keel_types::{
    CommandOutcome, Fence, IdempotencyRecord, KeyValue, LockHold, NodeId, RangeDescriptor, RangeId,
    Revision,
};
use redb::{ReadableTable, Table, TableDefinition};
use serde::{Deserialize, Serialize};

use crate::codec::{
    decode, decode_body, decode_body_with_tail, encode, encode_with_tail, split_version,
};
use crate::error::StorageError;
use crate::raft_types::{Entry, LogId, StoredMembership};
use crate::session::Digest;

pub(crate) type Bytes = &'static [u8];

pub(crate) const RAFT_LOG: TableDefinition<Bytes, Bytes> = TableDefinition::new("raft_log");
pub(crate) const RAFT_META: TableDefinition<Bytes, Bytes> = TableDefinition::new("raft_meta");
pub(crate) const SM_META: TableDefinition<Bytes, Bytes> = TableDefinition::new("sm_meta");
pub(crate) const KV: TableDefinition<Bytes, Bytes> = TableDefinition::new("kv");
pub(crate) const TTL: TableDefinition<Bytes, Bytes> = TableDefinition::new("ttl");
pub(crate) const SESSIONS: TableDefinition<Bytes, Bytes> = TableDefinition::new("sessions");
pub(crate) const REQUESTS: TableDefinition<Bytes, Bytes> = TableDefinition::new("requests");
pub(crate) const LOCKS: TableDefinition<Bytes, Bytes> = TableDefinition::new("locks");
pub(crate) const FENCES: TableDefinition<Bytes, Bytes> = TableDefinition::new("fences");
pub(crate) const IDEMPOTENCY: TableDefinition<Bytes, Bytes> = TableDefinition::new("idempotency");
pub(crate) const DEADLINES: TableDefinition<Bytes, Bytes> = TableDefinition::new("deadlines");
pub(crate) const META: TableDefinition<Bytes, Bytes> = TableDefinition::new("meta");

/// Kinds of `raft_meta` rows.
pub(crate) const RAFT_VOTE: u8 = 1;
// 2 held the committed log id, written by builds before 2026-12; it is neither written nor read.
pub(crate) const RAFT_PURGED: u8 = 3;

/// Kinds of `sm_meta` rows.
pub(crate) const SM_APPLIED: u8 = 1;
pub(crate) const SM_MEMBERSHIP: u8 = 2;
pub(crate) const SM_REVISION: u8 = 3;
pub(crate) const SM_INSTALLING: u8 = 4;
pub(crate) const SM_CLOCK: u8 = 5;
pub(crate) const SM_SESSION_HORIZON: u8 = 6;
pub(crate) const SM_SESSIONS: u8 = 7;
pub(crate) const SM_REQUESTS: u8 = 8;
pub(crate) const SM_KEYS_WITH_TTL: u8 = 9;
pub(crate) const SM_LOCKS: u8 = 10;
pub(crate) const SM_FENCED_KEYS: u8 = 11;
pub(crate) const SM_IDEMPOTENCY_RECORDS: u8 = 12;
/// Format 4: the range's `KeySpan`; absent = `KeySpan::unrecorded`.
pub(crate) const SM_SPAN: u8 = 13;
/// Format 4: splits of the range so far.
pub(crate) const SM_EPOCH: u8 = 14;
/// Format 4: membership entries the range applied so far (from format 4 on).
pub(crate) const SM_CONF_VERSION: u8 = 15;
/// Format 4: the range's rows in `kv`; absent in a file of an older format until the store
/// opens it (`count_kv_rows`).
pub(crate) const SM_KEYS: u8 = 16;
/// Format 4: key plus value bytes of the range's rows in `kv`.
pub(crate) const SM_BYTES: u8 = 17;
/// The range's replica is being removed from this file (`remove`); present = listed
/// nowhere, its rows and state are being deleted.
pub(crate) const SM_REMOVING: u8 = 18;
/// The range's replica was removed from this file (a tombstone, the only row left of it).
pub(crate) const SM_REMOVED: u8 = 19;
/// (format 6) Bytes of the range's rows in `locks`, `fences` and `idempotency`: name or key
/// plus the stored value. Missing in older files until the store counts them at open.
pub(crate) const SM_COORDINATION_BYTES: u8 = 20;

/// Kinds of `meta` rows (the first byte of their key).
pub(crate) const META_RANGE: u8 = 1;
pub(crate) const META_NODE: u8 = 2;
pub(crate) const META_NEXT_RANGE_ID: u8 = 3;
/// Format 5: where a node stands (`NodeState`), by node id.
pub(crate) const META_NODE_STATE: u8 = 4;

/// Kinds of `deadlines` rows: which table the row's key is in.
pub(crate) const DEADLINE_LOCK: u8 = 1;
pub(crate) const DEADLINE_IDEMPOTENCY: u8 = 2;

/// Key of one log entry: range id then index, both big-endian, so keys sort by range then
/// index.
pub(crate) fn log_key(range: RangeId, index: u64) -> [u8; 16] {
    let mut key = [0u8; 16];
    key[..8].copy_from_slice(&range.0.to_be_bytes());
    key[8..].copy_from_slice(&index.to_be_bytes());
    key
}

/// The log index stored in a `raft_log` key.
pub(crate) fn log_key_index(key: &[u8]) -> u64 {
    let tail: [u8; 8] = key[8..16].try_into().expect("raft_log keys are 16 bytes");
    u64::from_be_bytes(tail)
}

/// The range id every Raft-table key starts with.
pub(crate) fn key_range(key: &[u8]) -> RangeId {
    let head: [u8; 8] = key[..8].try_into().expect("raft keys start with a u64");
    RangeId(u64::from_be_bytes(head))
}

/// Key of one metadata row (`raft_meta` or `sm_meta`).
pub(crate) fn meta_key(range: RangeId, kind: u8) -> [u8; 9] {
    let mut key = [0u8; 9];
    key[..8].copy_from_slice(&range.0.to_be_bytes());
    key[8] = kind;
    key
}

/// Key of a `meta` row: its kind, then (for descriptors and nodes) the id, big-endian, so rows
/// of one kind sort by id.
pub(crate) fn meta_row_key(kind: u8, id: u64) -> [u8; 9] {
    let mut key = [0u8; 9];
    key[0] = kind;
    key[1..].copy_from_slice(&id.to_be_bytes());
    key
}

/// Key of a client session: range id then client id.
pub(crate) fn session_key(range: RangeId, client_id: u64) -> [u8; 16] {
    let mut key = [0u8; 16];
    key[..8].copy_from_slice(&range.0.to_be_bytes());
    key[8..].copy_from_slice(&client_id.to_be_bytes());
    key
}

/// Key of a request record: range id, client id, then sequence, so a session's records sort
/// together by sequence.
pub(crate) fn request_key(range: RangeId, client_id: u64, sequence: u64) -> [u8; 24] {
    let mut key = [0u8; 24];
    key[..16].copy_from_slice(&session_key(range, client_id));
    key[16..].copy_from_slice(&sequence.to_be_bytes());
    key
}

/// `(client id, sequence)` of a `requests` key.
pub(crate) fn request_key_parts(key: &[u8]) -> (u64, u64) {
    let client: [u8; 8] = key[8..16].try_into().expect("requests keys are 24 bytes");
    let sequence: [u8; 8] = key[16..24].try_into().expect("requests keys are 24 bytes");
    (u64::from_be_bytes(client), u64::from_be_bytes(sequence))
}

/// The client id of a `sessions` key.
pub(crate) fn session_key_client(key: &[u8]) -> u64 {
    let client: [u8; 8] = key[8..16].try_into().expect("sessions keys are 16 bytes");
    u64::from_be_bytes(client)
}

/// Key of a TTL-index row: the expiry, then the user key, so rows sort by expiry.
pub(crate) fn ttl_key(expires_at_ms: u64, key: &[u8]) -> Vec<u8> {
    let mut row = Vec::with_capacity(8 + key.len());
    row.extend_from_slice(&expires_at_ms.to_be_bytes());
    row.extend_from_slice(key);
    row
}

/// `(expiry, user key)` of a TTL-index row.
pub(crate) fn ttl_key_parts(row: &[u8]) -> (u64, &[u8]) {
    let (head, key) = row.split_at(8);
    let head: [u8; 8] = head.try_into().expect("ttl keys start with a u64");
    (u64::from_be_bytes(head), key)
}

/// Key of a `deadlines` row: the instant, the kind of record (`DEADLINE_*`), then its key
/// (a lock name or an idempotency key), so rows sort by instant.
pub(crate) fn deadline_key(at_ms: u64, kind: u8, key: &[u8]) -> Vec<u8> {
    let mut row = Vec::with_capacity(9 + key.len());
    row.extend_from_slice(&at_ms.to_be_bytes());
    row.push(kind);
    row.extend_from_slice(key);
    row
}

/// `(instant, kind, key)` of a `deadlines` row.
pub(crate) fn deadline_key_parts(row: &[u8]) -> (u64, u8, &[u8]) {
    let (head, rest) = row.split_at(8);
    let head: [u8; 8] = head.try_into().expect("deadlines keys start with a u64");
    let (&kind, key) = rest.split_first().expect("deadlines keys hold a kind byte");
    (u64::from_be_bytes(head), kind, key)
}

/// The half-open user-key span `[start, end)` a range owns; `end = None` is unbounded.
/// `Default` is the whole keyspace.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct KeySpan {
    #[serde(with = "serde_bytes")]
    pub start: Vec<u8>,
    #[serde(with = "serde_bytes")]
    pub end: Option<Vec<u8>>,
}

impl KeySpan {
    /// The span that owns no key: `[[], [])`, the meta range's.
    pub fn none() -> KeySpan {
        KeySpan {
            start: Vec::new(),
            end: Some(Vec::new()),
        }
    }

    /// The span of a range without a span row: the whole keyspace for `RangeId::FIRST` (files
    /// of formats 1-3, a fresh first range), no key for any other range (the meta range, a
    /// range without state).
    pub fn unrecorded(range: RangeId) -> KeySpan {
        if range == RangeId::FIRST {
            KeySpan::default()
        } else {
            KeySpan::none()
        }
    }

    pub fn contains(&self, key: &[u8]) -> bool {
        key >= self.start.as_slice() && self.end.as_deref().is_none_or(|end| key < end)
    }

    /// Whether the span owns no key at all.
    pub fn is_empty(&self) -> bool {
        self.end
            .as_deref()
            .is_some_and(|end| end <= self.start.as_slice())
    }

    /// Whether the span lies wholly inside `[start, end)`.
    pub fn lies_in(&self, start: &[u8], end: &[u8]) -> bool {
        self.start.as_slice() >= start && self.end.as_deref().is_some_and(|own| own <= end)
    }

    /// The part of `[start, end)` inside this span (`[start, start)` when none is).
    pub fn within(&self, start: Vec<u8>, end: Vec<u8>) -> KeySpan {
        let start = start.max(self.start.clone());
        let end = match &self.end {
            Some(own) => end.min(own.clone()),
            None => end,
        };
        KeySpan {
            end: Some(end.max(start.clone())),
            start,
        }
    }

    /// Whether some key lies in both spans.
    pub fn overlaps(&self, other: &KeySpan) -> bool {
        let before =
            |span: &KeySpan, start: &[u8]| span.end.as_deref().is_none_or(|end| start < end);
        !self.is_empty()
            && !other.is_empty()
            && before(self, &other.start)
            && before(other, &self.start)
    }

    /// Whether every key of `inner` lies in this span (an empty `inner` lies anywhere).
    pub fn covers(&self, inner: &KeySpan) -> bool {
        if inner.is_empty() {
            return true;
        }
        let end_within = match (self.end.as_deref(), inner.end.as_deref()) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some(own), Some(end)) => end <= own,
        };
        inner.start >= self.start && end_within
    }

    /// The part of `[start, end)` (empty `end` = unbounded) inside this span, as redb bounds
    /// (redb reads reversed bounds as empty).
    pub fn clamp<'a>(
        &'a self,
        start: &'a [u8],
        end: &'a [u8],
    ) -> (Bound<&'a [u8]>, Bound<&'a [u8]>) {
        let lower = start.max(self.start.as_slice());
        let upper = match (end.is_empty(), self.end.as_deref()) {
            (true, None) => Bound::Unbounded,
            (true, Some(own)) => Bound::Excluded(own),
            (false, None) => Bound::Excluded(end),
            (false, Some(own)) => Bound::Excluded(end.min(own)),
        };
        (Bound::Included(lower), upper)
    }

    /// The whole span as redb bounds.
    pub fn bounds(&self) -> (Bound<&[u8]>, Bound<&[u8]>) {
        let upper = match self.end.as_deref() {
            None => Bound::Unbounded,
            Some(end) => Bound::Excluded(end),
        };
        (Bound::Included(self.start.as_slice()), upper)
    }

    /// This span as a descriptor of `range` (with the rest of its facts).
    pub fn descriptor(
        &self,
        range: RangeId,
        epoch: u64,
        conf_version: u64,
        replicas: Vec<NodeId>,
    ) -> RangeDescriptor {
        RangeDescriptor {
            id: range,
            start: self.start.clone(),
            end: self.end.clone(),
            epoch,
            conf_version,
            replicas,
        }
    }
}

/// Live rows of a range in `kv` (expired ones not yet cleaned up included): how many, how
/// many bytes of key and value, and how many have an expiry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct KvCounts {
    pub keys: u64,
    /// Key plus value lengths.
    pub bytes: u64,
    /// Rows of this range in `ttl`.
    pub keys_with_ttl: u64,
}

impl KvCounts {
    /// Counts `row` in (`sign` true) or out.
    pub fn count(&mut self, key: &[u8], value_len: usize, expiring: bool, sign: bool) {
        let bytes = (key.len() + value_len) as u64;
        let change = |count: &mut u64, by: u64, what: &str| {
            *count = if sign {
                *count + by
            } else {
                count
                    .checked_sub(by)
                    .unwrap_or_else(|| panic!("the range's count of {what} covers its rows"))
            }
        };
        change(&mut self.keys, 1, "keys");
        change(&mut self.bytes, bytes, "bytes");
        if expiring {
            change(&mut self.keys_with_ttl, 1, "keys with a TTL");
        }
    }

    /// The counts of `self` without those of `part`, which it includes.
    pub fn without(self, part: KvCounts) -> KvCounts {
        let less = |all: u64, some: u64| {
            all.checked_sub(some)
                .expect("a range's kv counts cover every part of it")
        };
        KvCounts {
            keys: less(self.keys, part.keys),
            bytes: less(self.bytes, part.bytes),
            keys_with_ttl: less(self.keys_with_ttl, part.keys_with_ttl),
        }
    }
}

/// The state-machine metadata of one range.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct SmState {
    pub applied: Option<LogId>,
    pub membership: StoredMembership,
    pub revision: Revision,
    /// Set while a snapshot install is under way (see `state_machine`): the data is partial.
    pub installing: Option<InstallMarker>,
    /// The newest command time applied (`Mutation::now_ms`, `Cleanup::now_ms`); never goes
    /// back. Expiry and sessions are judged by it.
    pub clock_ms: u64,
    /// Sessions that started at or before this instant are gone or were never admitted: a
    /// request of such a session without a session record is refused (`session`).
    pub session_horizon_ms: u64,
    /// Rows of this range in `sessions`.
    pub sessions: u64,
    /// Rows of this range in `requests`.
    pub requests: u64,
    /// The key span the range owns (`KeySpan::unrecorded` without a span row).
    pub span: KeySpan,
    /// Grows by one on every split of the range.
    pub epoch: u64,
    /// Grows by one on every membership entry the range applies.
    pub conf_version: u64,
    /// The range's rows in `kv`: keys, bytes, keys with a TTL.
    pub kv: KvCounts,
    /// Rows of this range in `locks`, free ones not yet reclaimed included.
    pub locks: u64,
    /// Rows of this range in `fences`.
    pub fenced_keys: u64,
    /// Rows of this range in `idempotency`, expired ones not yet reclaimed included.
    pub idempotency_records: u64,
    /// Bytes of this range's rows in `locks`, `fences` and `idempotency` (`row_bytes`).
    pub coordination_bytes: u64,
}

impl SmState {
    /// The range's descriptor: its span, epoch, conf_version and voters.
    pub fn descriptor(&self, range: RangeId) -> RangeDescriptor {
        let mut replicas: Vec<NodeId> = self.membership.voter_ids().collect();
        replicas.sort_unstable();
        replicas.dedup();
        self.span
            .descriptor(range, self.epoch, self.conf_version, replicas)
    }

    /// The counts a write of a `locks` row keeps in step.
    pub fn lock_counts(&mut self) -> RowCounts<'_> {
        RowCounts {
            rows: &mut self.locks,
            bytes: &mut self.coordination_bytes,
        }
    }

    /// The counts a write of a `fences` row keeps in step.
    pub fn fence_counts(&mut self) -> RowCounts<'_> {
        RowCounts {
            rows: &mut self.fenced_keys,
            bytes: &mut self.coordination_bytes,
        }
    }

    /// The counts a write of an `idempotency` row keeps in step.
    pub fn record_counts(&mut self) -> RowCounts<'_> {
        RowCounts {
            rows: &mut self.idempotency_records,
            bytes: &mut self.coordination_bytes,
        }
    }

    /// Moves the clock to `now_ms` if that is later, and returns it.
    pub fn advance_clock(&mut self, now_ms: u64) -> u64 {
        self.clock_ms = self.clock_ms.max(now_ms);
        self.clock_ms
    }
}

/// One client session of a range (`session` decides with it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Session {
    /// Whose requests it answers (`session::owner_of`); `None` in a session written before
    /// format 6, which the next request's owner takes.
    pub owner: Option<Digest>,
    /// `RequestId::client_started_ms` of the client.
    pub started_ms: u64,
    /// Range clock of the newest request of this session.
    pub last_active_ms: u64,
    /// Requests below this sequence have no record and are refused.
    pub completed_below: u64,
    /// Rows of this session in `requests`.
    pub records: u64,
}

impl Session {
    /// Decodes a session of any readable format.
    pub fn decode(bytes: &[u8]) -> Result<Session, StorageError> {
        let (version, body) = split_version("session", bytes)?;
        if version >= 6 {
            return decode_body("session", body);
        }
        Ok(decode_body::<SessionV1>("session", body)?.into())
    }
}

impl From<SessionV1> for Session {
    fn from(old: SessionV1) -> Session {
        Session {
            owner: None,
            started_ms: old.started_ms,
            last_active_ms: old.last_active_ms,
            completed_below: old.completed_below,
            records: old.records,
        }
    }
}

/// A session as formats 2 to 5 stored it: without an owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SessionV1 {
    pub started_ms: u64,
    pub last_active_ms: u64,
    pub completed_below: u64,
    pub records: u64,
}

/// A request record: what the request asked and its first outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RequestRecord {
    /// `session::request_digest` of the request; `None` in a record written before format 6.
    pub digest: Option<Digest>,
    pub outcome: CommandOutcome,
}

impl RequestRecord {
    /// Decodes a record of any readable format.
    pub fn decode(bytes: &[u8]) -> Result<RequestRecord, StorageError> {
        let (version, body) = split_version("request record", bytes)?;
        if version >= 6 {
            return decode_body("request record", body);
        }
        Ok(RequestRecord {
            digest: None,
            outcome: decode_body("request record", body)?,
        })
    }
}

/// Written before a snapshot install deletes anything; cleared by the commit that finishes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct InstallMarker {
    pub snapshot_last_log_id: Option<LogId>,
}

/// Header of a `kv` value of format 2; the raw user value follows it.
#[derive(Serialize, Deserialize)]
struct KvHeader {
    create_revision: Revision,
    mod_revision: Revision,
    expires_at_ms: Option<u64>,
}

/// Header of a `kv` value of format 1: no expiry.
#[derive(Serialize, Deserialize)]
struct KvHeaderV1 {
    create_revision: Revision,
    mod_revision: Revision,
}

pub(crate) fn encode_kv(kv: &KeyValue) -> Vec<u8> {
    let header = KvHeader {
        create_revision: kv.create_revision,
        mod_revision: kv.mod_revision,
        expires_at_ms: kv.expires_at_ms,
    };
    encode_with_tail(&header, &kv.value)
}

pub(crate) fn decode_kv(key: &[u8], bytes: &[u8]) -> Result<KeyValue, StorageError> {
    let (header, value) = decode_kv_header(bytes)?;
    Ok(KeyValue {
        key: key.to_vec(),
        value: value.to_vec(),
        create_revision: header.create_revision,
        mod_revision: header.mod_revision,
        expires_at_ms: header.expires_at_ms,
    })
}

/// The length of the user value of a stored `kv` value, without copying it.
pub(crate) fn decode_kv_value_len(bytes: &[u8]) -> Result<usize, StorageError> {
    Ok(decode_kv_header(bytes)?.1.len())
}

/// The expiry of a stored `kv` value, without copying the value.
pub(crate) fn decode_kv_expiry(bytes: &[u8]) -> Result<Option<u64>, StorageError> {
    Ok(decode_kv_header(bytes)?.0.expires_at_ms)
}

fn decode_kv_header(bytes: &[u8]) -> Result<(KvHeader, &[u8]), StorageError> {
    const WHAT: &str = "kv value";
    match split_version(WHAT, bytes)? {
        (1, body) => {
            let (v1, value): (KvHeaderV1, &[u8]) = decode_body_with_tail(WHAT, body)?;
            let header = KvHeader {
                create_revision: v1.create_revision,
                mod_revision: v1.mod_revision,
                expires_at_ms: None,
            };
            Ok((header, value))
        }
        (_, body) => decode_body_with_tail(WHAT, body),
    }
}

/// Reads and decodes one metadata row.
pub(crate) fn read_meta<T, R>(
    table: &R,
    range: RangeId,
    kind: u8,
    what: &'static str,
) -> Result<Option<T>, StorageError>
where
    T: serde::de::DeserializeOwned,
    R: ReadableTable<Bytes, Bytes>,
{
    let key = meta_key(range, kind);
    let row = table
        .get(key.as_slice())
        .map_err(|e| StorageError::redb("read meta", e))?;
    row.map(|value| decode(what, value.value())).transpose()
}

/// Encodes and writes one metadata row.
pub(crate) fn write_meta<T: Serialize>(
    table: &mut Table<Bytes, Bytes>,
    range: RangeId,
    kind: u8,
    value: &T,
) -> Result<(), StorageError> {
    let key = meta_key(range, kind);
    table
        .insert(key.as_slice(), encode(value).as_slice())
        .map_err(|e| StorageError::redb("write meta", e))?;
    Ok(())
}

pub(crate) fn remove_meta(
    table: &mut Table<Bytes, Bytes>,
    range: RangeId,
    kind: u8,
) -> Result<(), StorageError> {
    let key = meta_key(range, kind);
    table
        .remove(key.as_slice())
        .map_err(|e| StorageError::redb("remove meta", e))?;
    Ok(())
}

/// Decodes one log entry and checks it sits under the key it was read from.
pub(crate) fn decode_entry(key: &[u8], bytes: &[u8]) -> Result<Entry, StorageError> {
    let entry: Entry = decode("raft log entry", bytes)?;
    assert_eq!(
        entry.log_id.index,
        log_key_index(key),
        "raft log entry stored under the wrong index"
    );
    Ok(entry)
}

/// The last entry of a range's log, if any.
pub(crate) fn last_entry<R>(log: &R, range: RangeId) -> Result<Option<Entry>, StorageError>
where
    R: ReadableTable<Bytes, Bytes>,
{
    let (start, end) = (log_key(range, 0), log_key(range, u64::MAX));
    let mut rows = log
        .range(start.as_slice()..=end.as_slice())
        .map_err(|e| StorageError::redb("read log", e))?;
    match rows.next_back() {
        None => Ok(None),
        Some(row) => {
            let (key, value) = row.map_err(|e| StorageError::redb("read log", e))?;
            decode_entry(key.value(), value.value()).map(Some)
        }
    }
}

/// `(last purged log id, last log id)` of a range; the last log id is the purged one when no
/// entry is left.
pub(crate) fn log_state<L, M>(
    log: &L,
    meta: &M,
    range: RangeId,
) -> Result<(Option<LogId>, Option<LogId>), StorageError>
where
    L: ReadableTable<Bytes, Bytes>,
    M: ReadableTable<Bytes, Bytes>,
{
    let purged: Option<LogId> = read_meta(meta, range, RAFT_PURGED, "purged log id")?;
    let last = last_entry(log, range)?.map(|entry| entry.log_id);
    let last = match (last, &purged) {
        (Some(last), Some(purged)) if purged.index >= last.index => Some(*purged),
        (Some(last), _) => Some(last),
        (None, purged) => *purged,
    };
    Ok((purged, last))
}

/// The state-machine metadata of a range.
pub(crate) fn read_sm_state<R>(sm_meta: &R, range: RangeId) -> Result<SmState, StorageError>
where
    R: ReadableTable<Bytes, Bytes>,
{
    let count = |kind, what| -> Result<u64, StorageError> {
        Ok(read_meta(sm_meta, range, kind, what)?.unwrap_or(0))
    };
    Ok(SmState {
        applied: read_meta(sm_meta, range, SM_APPLIED, "applied log id")?,
        membership: read_meta(sm_meta, range, SM_MEMBERSHIP, "membership")?.unwrap_or_default(),
        revision: count(SM_REVISION, "revision")?,
        installing: read_meta(sm_meta, range, SM_INSTALLING, "install marker")?,
        clock_ms: count(SM_CLOCK, "clock")?,
        session_horizon_ms: count(SM_SESSION_HORIZON, "session horizon")?,
        sessions: count(SM_SESSIONS, "session count")?,
        requests: count(SM_REQUESTS, "request count")?,
        span: read_meta(sm_meta, range, SM_SPAN, "key span")?
            .unwrap_or_else(|| KeySpan::unrecorded(range)),
        epoch: count(SM_EPOCH, "epoch")?,
        conf_version: count(SM_CONF_VERSION, "conf version")?,
        kv: KvCounts {
            keys: count(SM_KEYS, "key count")?,
            bytes: count(SM_BYTES, "byte count")?,
            keys_with_ttl: count(SM_KEYS_WITH_TTL, "TTL key count")?,
        },
        locks: count(SM_LOCKS, "lock count")?,
        fenced_keys: count(SM_FENCED_KEYS, "fenced key count")?,
        idempotency_records: count(SM_IDEMPOTENCY_RECORDS, "record count")?,
        coordination_bytes: count(SM_COORDINATION_BYTES, "coordination byte count")?,
    })
}

/// Writes applied log id, membership, revision, clock, session horizon, span, epoch,
/// conf_version and counts (not the install marker).
pub(crate) fn write_sm_state(
    sm_meta: &mut Table<Bytes, Bytes>,
    range: RangeId,
    state: &SmState,
) -> Result<(), StorageError> {
    match &state.applied {
        Some(applied) => write_meta(sm_meta, range, SM_APPLIED, applied)?,
        None => remove_meta(sm_meta, range, SM_APPLIED)?,
    }
    write_meta(sm_meta, range, SM_MEMBERSHIP, &state.membership)?;
    write_meta(sm_meta, range, SM_SPAN, &state.span)?;
    let numbers = [
        (SM_REVISION, state.revision),
        (SM_CLOCK, state.clock_ms),
        (SM_SESSION_HORIZON, state.session_horizon_ms),
        (SM_SESSIONS, state.sessions),
        (SM_REQUESTS, state.requests),
        (SM_EPOCH, state.epoch),
        (SM_CONF_VERSION, state.conf_version),
        (SM_KEYS, state.kv.keys),
        (SM_BYTES, state.kv.bytes),
        (SM_KEYS_WITH_TTL, state.kv.keys_with_ttl),
        (SM_LOCKS, state.locks),
        (SM_FENCED_KEYS, state.fenced_keys),
        (SM_IDEMPOTENCY_RECORDS, state.idempotency_records),
        (SM_COORDINATION_BYTES, state.coordination_bytes),
    ];
    for (kind, value) in numbers {
        write_meta(sm_meta, range, kind, &value)?;
    }
    Ok(())
}

/// Whether the range's replica is being removed from this file.
pub(crate) fn is_removing<R>(sm_meta: &R, range: RangeId) -> Result<bool, StorageError>
where
    R: ReadableTable<Bytes, Bytes>,
{
    let marker: Option<bool> = read_meta(sm_meta, range, SM_REMOVING, "removing marker")?;
    Ok(marker.is_some())
}

/// Whether the range has state-machine state in this file: an applied log id or an
/// unfinished install.
pub(crate) fn has_sm_state<R>(sm_meta: &R, range: RangeId) -> Result<bool, StorageError>
where
    R: ReadableTable<Bytes, Bytes>,
{
    for kind in [SM_APPLIED, SM_INSTALLING] {
        let key = meta_key(range, kind);
        let row = sm_meta
            .get(key.as_slice())
            .map_err(|e| StorageError::redb("read meta", e))?;
        if row.is_some() {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The span whose rows belong to the range in this file: its span row, else (an applied
/// range of format 1-3) `KeySpan::unrecorded`; `None` for a range that has never applied
/// anything here, whose unrecorded span is no claim on the rows.
pub(crate) fn owned_span<R>(sm_meta: &R, range: RangeId) -> Result<Option<KeySpan>, StorageError>
where
    R: ReadableTable<Bytes, Bytes>,
{
    if let Some(span) = read_meta(sm_meta, range, SM_SPAN, "key span")? {
        return Ok(Some(span));
    }
    let applied: Option<LogId> = read_meta(sm_meta, range, SM_APPLIED, "applied log id")?;
    Ok(applied.map(|_| KeySpan::unrecorded(range)))
}

/// Counts the rows of `kv` within `span`: keys, key plus value bytes, keys with an expiry.
pub(crate) fn count_kv_rows<R>(kv: &R, span: &KeySpan) -> Result<KvCounts, StorageError>
where
    R: ReadableTable<Bytes, Bytes>,
{
    let mut counts = KvCounts::default();
    for row in kv
        .range::<&[u8]>(span.bounds())
        .map_err(|e| StorageError::redb("count kv rows", e))?
    {
        let (key, value) = row.map_err(|e| StorageError::redb("count kv rows", e))?;
        let (header, value) = decode_kv_header(value.value())?;
        let expiring = header.expires_at_ms.is_some();
        counts.count(key.value(), value.len(), expiring, true);
    }
    Ok(counts)
}

/// Rows of `table` (keyed by user key, lock name or idempotency key) within `span`, and
/// their bytes (`row_bytes`).
pub(crate) fn count_rows<R>(table: &R, span: &KeySpan) -> Result<(u64, u64), StorageError>
where
    R: ReadableTable<Bytes, Bytes>,
{
    let (mut count, mut bytes) = (0, 0);
    for row in table
        .range::<&[u8]>(span.bounds())
        .map_err(|e| StorageError::redb("count rows", e))?
    {
        let (key, value) = row.map_err(|e| StorageError::redb("count rows", e))?;
        count += 1;
        bytes += row_bytes(key.value(), value.value().len());
    }
    Ok((count, bytes))
}

/// What a row of `locks`, `fences` or `idempotency` adds to `SmState::coordination_bytes`:
/// its name or key and its stored value.
pub(crate) fn row_bytes(key: &[u8], stored_len: usize) -> u64 {
    (key.len() + stored_len) as u64
}

/// Writes the coordination byte count of every range with applied state that has none (a
/// file of format 1-5), counted from its rows in `tables`. A range in the middle of an
/// install is left alone: finishing the install writes its counts.
pub(crate) fn count_unrecorded_coordination(
    sm_meta: &mut Table<Bytes, Bytes>,
    tables: [&Table<Bytes, Bytes>; 3],
) -> Result<(), StorageError> {
    for range in ranges_in(sm_meta)? {
        let recorded: Option<u64> = read_meta(
            sm_meta,
            range,
            SM_COORDINATION_BYTES,
            "coordination byte count",
        )?;
        let state = read_sm_state(sm_meta, range)?;
        if recorded.is_some() || state.applied.is_none() || state.installing.is_some() {
            continue;
        }
        let mut bytes = 0;
        for table in tables {
            bytes += count_rows(table, &state.span)?.1;
        }
        write_meta(sm_meta, range, SM_COORDINATION_BYTES, &bytes)?;
    }
    Ok(())
}

/// Writes the key and byte counts of every range with applied state that has none (a file
/// of format 1-3), counted from its rows. A range in the middle of an install is left alone:
/// finishing the install writes its counts. Returns the ranges it counted.
pub(crate) fn count_unrecorded_kv(
    sm_meta: &mut Table<Bytes, Bytes>,
    kv: &Table<Bytes, Bytes>,
) -> Result<Vec<RangeId>, StorageError> {
    let mut counted = Vec::new();
    for range in ranges_in(sm_meta)? {
        let recorded: Option<u64> = read_meta(sm_meta, range, SM_KEYS, "key count")?;
        let state = read_sm_state(sm_meta, range)?;
        if recorded.is_some() || state.applied.is_none() || state.installing.is_some() {
            continue;
        }
        let counts = count_kv_rows(kv, &state.span)?;
        assert_eq!(
            counts.keys_with_ttl, state.kv.keys_with_ttl,
            "range {range}: the count of keys with a TTL matches its rows"
        );
        write_meta(sm_meta, range, SM_KEYS, &counts.keys)?;
        write_meta(sm_meta, range, SM_BYTES, &counts.bytes)?;
        counted.push(range);
    }
    Ok(counted)
}

/// A range's session of `client_id`, if it has one.
pub(crate) fn read_session<R>(
    sessions: &R,
    range: RangeId,
    client_id: u64,
) -> Result<Option<Session>, StorageError>
where
    R: ReadableTable<Bytes, Bytes>,
{
    let key = session_key(range, client_id);
    let row = sessions
        .get(key.as_slice())
        .map_err(|e| StorageError::redb("read session", e))?;
    row.map(|value| Session::decode(value.value())).transpose()
}

pub(crate) fn write_session(
    sessions: &mut Table<Bytes, Bytes>,
    range: RangeId,
    client_id: u64,
    session: &Session,
) -> Result<(), StorageError> {
    let key = session_key(range, client_id);
    sessions
        .insert(key.as_slice(), encode(session).as_slice())
        .map_err(|e| StorageError::redb("write session", e))?;
    Ok(())
}

/// The record of a request, if it has one.
pub(crate) fn read_request<R>(
    requests: &R,
    range: RangeId,
    client_id: u64,
    sequence: u64,
) -> Result<Option<RequestRecord>, StorageError>
where
    R: ReadableTable<Bytes, Bytes>,
{
    let key = request_key(range, client_id, sequence);
    let row = requests
        .get(key.as_slice())
        .map_err(|e| StorageError::redb("read request record", e))?;
    row.map(|value| RequestRecord::decode(value.value()))
        .transpose()
}

pub(crate) fn write_request(
    requests: &mut Table<Bytes, Bytes>,
    range: RangeId,
    client_id: u64,
    sequence: u64,
    record: &RequestRecord,
) -> Result<(), StorageError> {
    let key = request_key(range, client_id, sequence);
    requests
        .insert(key.as_slice(), encode(record).as_slice())
        .map_err(|e| StorageError::redb("write request record", e))?;
    Ok(())
}

/// Records of one session with a sequence in `sequences`.
pub(crate) fn count_requests<R>(
    requests: &R,
    range: RangeId,
    client_id: u64,
    sequences: RangeInclusive<u64>,
) -> Result<u64, StorageError>
where
    R: ReadableTable<Bytes, Bytes>,
{
    let start = request_key(range, client_id, *sequences.start());
    let end = request_key(range, client_id, *sequences.end());
    let rows = requests
        .range(start.as_slice()..=end.as_slice())
        .map_err(|e| StorageError::redb("read request records", e))?;
    let mut count = 0;
    for row in rows {
        row.map_err(|e| StorageError::redb("read request records", e))?;
        count += 1;
    }
    Ok(count)
}

/// Deletes the records of one session with a sequence in `sequences`.
pub(crate) fn remove_requests(
    requests: &mut Table<Bytes, Bytes>,
    range: RangeId,
    client_id: u64,
    sequences: RangeInclusive<u64>,
) -> Result<(), StorageError> {
    let start = request_key(range, client_id, *sequences.start());
    let end = request_key(range, client_id, *sequences.end());
    requests
        .retain_in(start.as_slice()..=end.as_slice(), |_, _| false)
        .map_err(|e| StorageError::redb("remove request records", e))
}

/// Writes a `kv` row (or removes it, for `None`) and keeps the TTL index and the range's
/// counts of keys, bytes and keys with a TTL in step with the row it replaces.
pub(crate) fn write_kv(
    kv: &mut Table<Bytes, Bytes>,
    ttl: &mut Table<Bytes, Bytes>,
    counts: &mut KvCounts,
    key: &[u8],
    after: Option<&KeyValue>,
) -> Result<(), StorageError> {
    let before = match after {
        Some(value) => kv.insert(key, encode_kv(value).as_slice()),
        None => kv.remove(key),
    }
    .map_err(|e| StorageError::redb("write kv", e))?
    .map(|old| -> Result<_, StorageError> {
        let (header, value) = decode_kv_header(old.value())?;
        Ok((header.expires_at_ms, value.len()))
    })
    .transpose()?;
    if let Some((expires_at_ms, value_len)) = before {
        counts.count(key, value_len, expires_at_ms.is_some(), false);
    }
    if let Some(after) = after {
        counts.count(key, after.value.len(), after.expires_at_ms.is_some(), true);
    }
    let before = before.and_then(|(expires_at_ms, _)| expires_at_ms);
    let after = after.and_then(|value| value.expires_at_ms);
    if before == after {
        return Ok(());
    }
    if let Some(expires_at_ms) = before {
        let removed = ttl
            .remove(ttl_key(expires_at_ms, key).as_slice())
            .map_err(|e| StorageError::redb("write ttl index", e))?;
        assert!(
            removed.is_some(),
            "a kv row with an expiry has a ttl index row"
        );
    }
    if let Some(expires_at_ms) = after {
        ttl.insert(ttl_key(expires_at_ms, key).as_slice(), [].as_slice())
            .map_err(|e| StorageError::redb("write ttl index", e))?;
    }
    Ok(())
}

/// A record kept with a `deadlines` row: a lock (due when it becomes free) or an
/// idempotency record (due when it expires).
pub(crate) trait Deadlined: Serialize + serde::de::DeserializeOwned {
    /// The `DEADLINE_*` kind of its index rows.
    const KIND: u8;
    /// Names the record in errors.
    const WHAT: &'static str;
    /// When a `Reclaim` may delete it.
    fn deadline_ms(&self) -> u64;
}

impl Deadlined for LockHold {
    const KIND: u8 = DEADLINE_LOCK;
    const WHAT: &'static str = "lock";
    fn deadline_ms(&self) -> u64 {
        self.available_at_ms()
    }
}

impl Deadlined for IdempotencyRecord {
    const KIND: u8 = DEADLINE_IDEMPOTENCY;
    const WHAT: &'static str = "idempotency record";
    fn deadline_ms(&self) -> u64 {
        self.expires_at_ms()
    }
}

/// Reads and decodes the row of `key`, if any.
pub(crate) fn read_row<T, R>(
    table: &R,
    key: &[u8],
    what: &'static str,
) -> Result<Option<T>, StorageError>
where
    T: serde::de::DeserializeOwned,
    R: ReadableTable<Bytes, Bytes>,
{
    let row = table
        .get(key)
        .map_err(|e| StorageError::redb("read row", e))?;
    row.map(|value| decode(what, value.value())).transpose()
}

/// The counts a write of a `locks`, `fences` or `idempotency` row keeps in step: the rows of
/// its table and the bytes of all three (`SmState::coordination_bytes`).
pub(crate) struct RowCounts<'a> {
    pub rows: &'a mut u64,
    pub bytes: &'a mut u64,
}

impl RowCounts<'_> {
    /// Counts a row of `key` going from a stored value of `before` bytes (if any) to one of
    /// `after` bytes.
    fn replace(&mut self, key: &[u8], before: Option<usize>, after: Option<usize>, what: &str) {
        let bytes = |stored: Option<usize>| stored.map_or(0, |len| row_bytes(key, len));
        *self.bytes = (*self.bytes + bytes(after))
            .checked_sub(bytes(before))
            .unwrap_or_else(|| panic!("the range's byte count covers its {what} rows"));
        *self.rows = adjust_count(*self.rows, before.is_some(), after.is_some(), what);
    }
}

/// Counts that nothing reads, for writes whose counts are kept elsewhere (an install's).
#[derive(Debug, Default)]
pub(crate) struct Uncounted {
    rows: u64,
    bytes: u64,
}

impl Uncounted {
    pub fn counts(&mut self) -> RowCounts<'_> {
        RowCounts {
            rows: &mut self.rows,
            bytes: &mut self.bytes,
        }
    }
}

/// Writes a lock or idempotency row (or removes it, for `None`) and keeps its `deadlines`
/// row and the range's counts (`counts`) in step with the row it replaces.
pub(crate) fn write_deadlined<T: Deadlined>(
    table: &mut Table<Bytes, Bytes>,
    deadlines: &mut Table<Bytes, Bytes>,
    mut counts: RowCounts,
    key: &[u8],
    after: Option<&T>,
) -> Result<(), StorageError> {
    let encoded = after.map(encode);
    let old = match &encoded {
        Some(value) => table.insert(key, value.as_slice()),
        None => table.remove(key),
    }
    .map_err(|e| StorageError::redb("write deadlined row", e))?;
    let old_len = old.as_ref().map(|old| old.value().len());
    counts.replace(key, old_len, encoded.as_ref().map(Vec::len), T::WHAT);
    let before: Option<T> = old.map(|old| decode(T::WHAT, old.value())).transpose()?;
    if let Some(before) = &before {
        let removed = deadlines
            .remove(deadline_key(before.deadline_ms(), T::KIND, key).as_slice())
            .map_err(|e| StorageError::redb("write deadlines index", e))?;
        assert!(
            removed.is_some(),
            "a stored {} has a deadlines index row",
            T::WHAT
        );
    }
    if let Some(after) = after {
        deadlines
            .insert(
                deadline_key(after.deadline_ms(), T::KIND, key).as_slice(),
                [].as_slice(),
            )
            .map_err(|e| StorageError::redb("write deadlines index", e))?;
    }
    Ok(())
}

/// Writes the fence row of a user key (or removes it, for `None`) and keeps the range's
/// counts (`counts`: fenced keys and coordination bytes) in step.
pub(crate) fn write_fence(
    fences: &mut Table<Bytes, Bytes>,
    mut counts: RowCounts,
    key: &[u8],
    after: Option<&Fence>,
) -> Result<(), StorageError> {
    let encoded = after.map(encode);
    let old = match &encoded {
        Some(value) => fences.insert(key, value.as_slice()),
        None => fences.remove(key),
    }
    .map_err(|e| StorageError::redb("write fence", e))?
    .map(|old| old.value().len());
    counts.replace(key, old, encoded.as_ref().map(Vec::len), "fence");
    Ok(())
}

/// A count of rows after one row went from present (`before`) to present (`after`) or not.
fn adjust_count(count: u64, before: bool, after: bool, what: &str) -> u64 {
    match (before, after) {
        (false, true) => count + 1,
        (true, false) => count
            .checked_sub(1)
            .unwrap_or_else(|| panic!("the range's {what} count covers its {what} rows")),
        _ => count,
    }
}

/// Distinct range ids with at least one row in a Raft table, found by skipping from one
/// range's first key to the next range's.
pub(crate) fn ranges_in<R>(table: &R) -> Result<Vec<RangeId>, StorageError>
where
    R: ReadableTable<Bytes, Bytes>,
{
    let mut found = Vec::new();
    let mut next = Some(0u64);
    while let Some(from) = next {
        let start = from.to_be_bytes();
        let mut rows = table
            .range::<&[u8]>(start.as_slice()..)
            .map_err(|e| StorageError::redb("list ranges", e))?;
        let Some(row) = rows.next() else { break };
        let (key, _) = row.map_err(|e| StorageError::redb("list ranges", e))?;
        let range = key_range(key.value());
        found.push(range);
        next = range.0.checked_add(1);
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raft_keys_sort_by_range_then_index() {
        let keys = [
            log_key(RangeId(1), 0),
            log_key(RangeId(1), 255),
            log_key(RangeId(1), 256),
            log_key(RangeId(2), 0),
        ];
        assert!(keys.windows(2).all(|pair| pair[0] < pair[1]));
        assert_eq!(log_key_index(&keys[2]), 256);
        assert_eq!(key_range(&keys[3]), RangeId(2));
        assert_eq!(key_range(&meta_key(RangeId(9), RAFT_VOTE)), RangeId(9));
    }

    #[test]
    fn values_of_an_unknown_version_are_errors() {
        let kv = KeyValue {
            key: b"k".to_vec(),
            value: b"v".to_vec(),
            create_revision: 1,
            mod_revision: 2,
            expires_at_ms: Some(7),
        };
        let mut bytes = encode_kv(&kv);
        assert_eq!(decode_kv_expiry(&bytes).unwrap(), Some(7));
        assert_eq!(decode_kv(b"k", &bytes).unwrap(), kv);
        bytes[0] = 9;
        let error = decode_kv(b"k", &bytes).unwrap_err();
        assert!(
            matches!(error, StorageError::UnknownVersion { version: 9, .. }),
            "{error}"
        );
    }

    #[test]
    fn values_of_format_1_have_no_expiry() {
        let mut bytes = vec![1u8];
        bytes = postcard::to_extend(&(3u64, 5u64), bytes).unwrap();
        bytes.extend_from_slice(b"old");
        let kv = decode_kv(b"k", &bytes).unwrap();
        assert_eq!(
            (kv.value.as_slice(), kv.create_revision, kv.mod_revision),
            (&b"old"[..], 3, 5)
        );
        assert_eq!(kv.expires_at_ms, None);
        assert_eq!(decode_kv_expiry(&bytes).unwrap(), None);
    }

    #[test]
    fn exactly_once_and_ttl_keys_sort_as_scanned() {
        let ttl = [ttl_key(5, b"z"), ttl_key(6, b"a"), ttl_key(256, b"")];
        assert!(ttl.windows(2).all(|pair| pair[0] < pair[1]));
        assert_eq!(ttl_key_parts(&ttl[1]), (6, &b"a"[..]));
        let requests = [
            request_key(RangeId(1), 9, u64::MAX),
            request_key(RangeId(1), 10, 0),
            request_key(RangeId(1), 10, 256),
            request_key(RangeId(2), 0, 0),
        ];
        assert!(requests.windows(2).all(|pair| pair[0] < pair[1]));
        assert_eq!(request_key_parts(&requests[2]), (10, 256));
        assert_eq!(session_key_client(&session_key(RangeId(3), 77)), 77);
        assert_eq!(&requests[2][..16], session_key(RangeId(1), 10).as_slice());
    }

    #[test]
    fn deadline_keys_sort_by_instant_then_kind_and_split_back() {
        let rows = [
            deadline_key(5, DEADLINE_IDEMPOTENCY, b"z"),
            deadline_key(6, DEADLINE_LOCK, b"b"),
            deadline_key(6, DEADLINE_LOCK, b"c"),
            deadline_key(6, DEADLINE_IDEMPOTENCY, b"a"),
            deadline_key(256, DEADLINE_LOCK, b""),
        ];
        assert!(rows.windows(2).all(|pair| pair[0] < pair[1]));
        assert_eq!(
            deadline_key_parts(&rows[3]),
            (6, DEADLINE_IDEMPOTENCY, &b"a"[..])
        );
        assert_eq!(deadline_key_parts(&rows[4]), (256, DEADLINE_LOCK, &b""[..]));
    }

    fn span(start: &str, end: Option<&str>) -> KeySpan {
        KeySpan {
            start: start.as_bytes().to_vec(),
            end: end.map(|end| end.as_bytes().to_vec()),
        }
    }

    #[test]
    fn spans_overlap_only_when_they_share_a_key() {
        let cases = [
            (span("", None), span("m", Some("n")), true),
            (span("a", Some("m")), span("m", None), false),
            (span("a", Some("m")), span("l", Some("z")), true),
            (span("n", None), span("a", Some("n")), false),
            (span("n", None), span("a", Some("n\0")), true),
            (KeySpan::none(), span("", None), false),
            (span("c", Some("c")), span("a", Some("z")), false),
        ];
        for (one, other, expected) in cases {
            assert_eq!(one.overlaps(&other), expected, "{one:?} {other:?}");
            assert_eq!(other.overlaps(&one), expected, "{other:?} {one:?}");
        }
        assert_eq!(KeySpan::unrecorded(RangeId::FIRST), span("", None));
        assert_eq!(KeySpan::unrecorded(RangeId::META), KeySpan::none());
        assert_eq!(KeySpan::unrecorded(RangeId(7)), KeySpan::none());
        assert!(KeySpan::none().is_empty() && !KeySpan::none().contains(b""));
    }

    #[test]
    fn spans_cover_their_parts() {
        let parent = span("b", Some("p"));
        let cases = [
            (span("b", Some("p")), true),
            (span("c", Some("d")), true),
            (span("a", Some("d")), false),
            (span("c", Some("q")), false),
            (span("c", None), false),
            (KeySpan::none(), true),
        ];
        for (inner, expected) in cases {
            assert_eq!(parent.covers(&inner), expected, "{inner:?}");
        }
        assert!(span("", None).covers(&span("x", None)));
    }

    #[test]
    fn kv_counts_follow_every_write() {
        let dir = tempfile::tempdir().unwrap();
        let db = redb::Database::create(dir.path().join("t.redb")).unwrap();
        let txn = db.begin_write().unwrap();
        let (mut kv, mut ttl) = (txn.open_table(KV).unwrap(), txn.open_table(TTL).unwrap());
        let mut counts = KvCounts::default();
        let row = |value: &str, expires_at_ms| KeyValue {
            key: b"key".to_vec(),
            value: value.as_bytes().to_vec(),
            create_revision: 1,
            mod_revision: 1,
            expires_at_ms,
        };
        let steps = [
            (Some(row("v", None)), (1, 4, 0)),
            (Some(row("value", Some(9))), (1, 8, 1)),
            (Some(row("", None)), (1, 3, 0)),
            (None, (0, 0, 0)),
            (None, (0, 0, 0)),
        ];
        for (after, (keys, bytes, keys_with_ttl)) in steps {
            write_kv(&mut kv, &mut ttl, &mut counts, b"key", after.as_ref()).unwrap();
            let expected = KvCounts {
                keys,
                bytes,
                keys_with_ttl,
            };
            assert_eq!(counts, expected, "after {after:?}");
            assert_eq!(count_kv_rows(&kv, &KeySpan::default()).unwrap(), expected);
        }
    }

    #[test]
    fn span_clamps_scan_bounds() {
        use Bound::{Excluded, Included, Unbounded};
        let all = KeySpan::default();
        assert_eq!(all.clamp(b"a", b""), (Included(&b"a"[..]), Unbounded));
        let span = KeySpan {
            start: b"c".to_vec(),
            end: Some(b"m".to_vec()),
        };
        assert_eq!(
            span.clamp(b"a", b""),
            (Included(&b"c"[..]), Excluded(&b"m"[..]))
        );
        assert_eq!(
            span.clamp(b"d", b"e"),
            (Included(&b"d"[..]), Excluded(&b"e"[..]))
        );
        assert_eq!(
            span.clamp(b"d", b"z"),
            (Included(&b"d"[..]), Excluded(&b"m"[..]))
        );
        assert!(span.contains(b"c") && span.contains(b"lzz"));
        assert!(!span.contains(b"m") && !span.contains(b"b"));
    }
}
