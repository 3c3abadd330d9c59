//! The redb tables of a store file: one module per table with its definition, key layout,
//! value encoding and typed accessors, and the modules of what several tables share. Knows
//! nothing about threads, async or openraft's traits; every function works inside a
//! transaction it is given.
//!
//! | table         | key                                   | value                                  |
//! |---------------|---------------------------------------|----------------------------------------|
//! | `raft_log`    | range id (u64 BE) + log index (u64 BE) | openraft entry                         |
//! | `raft_meta`   | range id (u64 BE) + kind (u8)          | vote / purged log id                    |
//! | `sm_meta`     | range id (u64 BE) + kind (u8)          | applied log id / membership / revision / installing marker / clock / session horizon / counts of sessions, request records, keys with a TTL, locks, fenced keys and idempotency records / (format 4) span, epoch, conf_version, counts of keys and bytes / (format 6) bytes of the range's locks, fences and idempotency records |
//! | `kv`          | user key                              | create and mod revision, expiry (format 2), version (format 11), then the raw value |
//! | `ttl`         | expiry ms (u64 BE) + user key          | empty                                  |
//! | `sessions`    | range id (u64 BE) + client id (u64 BE) | `Session` (format 6: with its owner)   |
//! | `requests`    | range id (u64 BE) + client id (u64 BE) + sequence (u64 BE) | the request's first `CommandOutcome` (format 6: a `RequestRecord`, with the request's digest; format 11: its key states with versions) |
//! | `locks`       | lock name (format 3)                  | `LockHold`                             |
//! | `fences`      | user key (format 3)                   | `Fence`: the lock and highest token accepted |
//! | `idempotency` | `idempotency_key(scope, id)` (format 3) | `IdempotencyRecord`                  |
//! | `deadlines`   | instant ms (u64 BE) + kind (u8) + lock name or idempotency key (format 3), or lease key (format 12) | empty |
//! | `history`     | revision (u64) + user key (format 8), or a lock name or idempotency key (format 9) | the event: range clock, the key's state before and after (format 11: with versions); or (format 9) the reclaim of that lock or record, with its token |
//! | `leases`      | namespace + lease id (i64 BE) (format 12) | `LeaseRecord`: granted TTL, expiry |
//! | `lease_keys`  | namespace + lease id (i64 BE) + attached user key without the namespace (format 12) | empty |
//! | `meta`        | kind (u8) + range or node id (u64 BE) (format 4) | `RangeDescriptor` / `NodeDescriptor` / next range id (kind 3, id 0) |
//!
//! Each table's module bears its name. What several share: `span` (`KeySpan`, the key span
//! a range owns), `range_rows` (keys that start with a range id, and the kind-keyed rows of
//! `raft_meta` and `sm_meta`) and `keyed_rows` (rows keyed by name or key alone, and the
//! counts their writes keep); `open` has `Tables`, the tables an apply writes, each opened on
//! first use.
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
//! `leases` and `lease_keys` (format 12) hold etcd's leases and the keys attached to each,
//! keyed inside the pinned span of their namespace, so they are shared and filtered by span
//! like `kv` (`leases`). `lease_keys` is an index of `kv` kept in step by `write_kv`; a
//! lease's expiry is a `deadlines` row of kind 3. Leases are not counted in `sm_meta`.
//!
//! `history` holds every range's events in revision order (`history`), shared and filtered
//! by span like `kv`; `sm_meta` keeps each range's history floor and the bytes of its events.
//!
//! `meta` is the meta range's (range 0's) table of the cluster: range descriptors, nodes and
//! the range id allocator (`meta`). No other range reads or writes it.

mod deadlines;
mod fences;
mod history;
mod idempotency;
mod keyed_rows;
mod kv;
mod leases;
mod locks;
mod meta;
mod open;
mod raft_log;
mod raft_meta;
mod range_rows;
mod requests;
mod sessions;
mod sm_meta;
mod span;
mod ttl;

pub(crate) use deadlines::{
    DEADLINE_IDEMPOTENCY, DEADLINE_LEASE, DEADLINE_LOCK, DEADLINES, Deadlined, deadline_key,
    deadline_key_parts, write_deadlined, write_indexed,
};
pub(crate) use fences::{FENCES, write_fence};
pub(crate) use history::{
    Change, Changed, ChangedSince, CompactStep, EventBounds, HISTORY, HistoryFacts, Retention,
    changed_since, clear_history, compact, count_history, key_events, record_event, span_events,
    state_before,
};
pub(crate) use idempotency::IDEMPOTENCY;
pub(crate) use keyed_rows::{Uncounted, count_rows, read_row, row_bytes};
pub(crate) use kv::{
    KV, KvCounts, count_kv_rows, decode_kv, decode_kv_expiry, decode_kv_value_len, write_kv,
};
pub(crate) use leases::{
    LEASE_KEYS, LEASES, LeaseRecord, attached_keys, count_attached, first_free_id, lease_ids,
    lease_key, lease_key_parts, lease_namespace,
};
pub(crate) use locks::LOCKS;
pub(crate) use meta::{
    META, META_NEXT_RANGE_ID, META_NODE, META_NODE_STATE, META_RANGE, meta_row_key,
};
pub(crate) use open::Tables;
#[cfg(test)]
pub(crate) use raft_log::log_key;
pub(crate) use raft_log::{RAFT_LOG, read_all_entries};
pub(crate) use raft_meta::{RAFT_META, RAFT_PURGED, RAFT_VOTE};
pub(crate) use range_rows::{meta_key, ranges_in, read_meta, remove_meta, write_meta};
pub(crate) use requests::{
    REQUESTS, RequestRecord, RequestRecordV6, RequestRecordV11, count_requests, read_request,
    remove_requests, request_key, request_key_parts, write_request,
};
pub(crate) use sessions::{
    SESSIONS, Session, SessionV1, read_session, session_key, session_key_client, write_session,
};
pub(crate) use sm_meta::{
    InstallMarker, SM_HISTORY_BYTES, SM_HISTORY_FLOOR, SM_INSTALLING, SM_META, SM_REMOVED,
    SM_REMOVING, SmState, count_unrecorded_coordination, count_unrecorded_kv, has_sm_state,
    is_removing, owned_span, read_sm_state, start_unrecorded_history, write_hold, write_sm_state,
    write_sm_state_since,
};
pub(crate) use span::KeySpan;
pub(crate) use ttl::{TTL, ttl_key, ttl_key_parts};

pub(crate) type Bytes = &'static [u8];

#[cfg(test)]
mod tests;
