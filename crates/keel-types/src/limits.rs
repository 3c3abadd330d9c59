//! Every limit Keel enforces, in one place.
//!
//! Client input is checked against these where it enters (see `validate`); queues and
//! channels take their capacity from here. Change a limit here and in `docs/ARCHITECTURE.md`.

/// Largest key, in bytes. Keys must also be non-empty.
pub const KEY_BYTES_MAX: usize = 4 * 1024;
/// Largest value, in bytes. Empty values are allowed.
pub const VALUE_BYTES_MAX: usize = 1024 * 1024;
/// Most operations in one batch.
pub const BATCH_OPS_MAX: usize = 128;
/// Most bytes (keys + values + condition values) in one batch.
pub const BATCH_BYTES_MAX: usize = 4 * 1024 * 1024;
/// Most ops in one transaction, those of both branches and of nested transactions included
/// (etcd's default `--max-txn-ops`).
pub const TXN_OPS_MAX: usize = 128;
/// Most compares in one transaction, nested ones included.
pub const TXN_COMPARES_MAX: usize = 128;
/// Deepest nesting of transactions (1 = no nested transaction).
pub const TXN_DEPTH_MAX: usize = 8;
/// Most live rows a transaction's compares, reads and deletes may cover in all: applying it
/// holds up every range of the node's store file, so a larger span is refused
/// (`Rejection::TxnTooLarge`) rather than read.
pub const TXN_ROWS_MAX: usize = 10_000;
/// Most bytes (keys and values) of the rows a transaction's reads and deletes return.
pub const TXN_RESULT_BYTES_MAX: usize = 8 * 1024 * 1024;
/// Most scan pages (of `SCAN_LIMIT_MAX` rows) one etcd range read takes: etcd's `Range`
/// counts every key of its span, so it reads all of them.
pub const ETCD_RANGE_PAGES_MAX: usize = 1_000;
/// Most watches on one etcd watch stream (each is a Keel watch, counted against
/// `WATCHES_PER_NODE_MAX` too).
pub const ETCD_WATCHES_PER_STREAM_MAX: usize = 1_000;
/// Responses of one etcd watch stream waiting to be sent: a slow reader holds its watches'
/// tasks, never events beyond these.
pub const ETCD_WATCH_RESPONSES_BUFFERED: usize = 16;
/// Answers of one etcd keep-alive stream waiting to be sent: a slow reader holds the stream's
/// task, which keeps no lease alive until they are read.
pub const ETCD_KEEPALIVE_RESPONSES_BUFFERED: usize = 16;
/// Shortest lease TTL the etcd API grants, in seconds: a shorter one is raised to it (etcd
/// raises short TTLs too), so that a lease kept alive outlives a leader election (a few
/// seconds in Keel) whose keep-alives cannot get through.
pub const ETCD_LEASE_TTL_MIN_S: u64 = 5;

/// Longest TTL a key may be given: one year. TTLs must be at least 1 ms.
pub const TTL_MS_MAX: u64 = 365 * 24 * 60 * 60 * 1000;

/// Longest dedup window a node may be configured with (how long an idle client session and
/// its request records are kept): one day.
pub const DEDUP_WINDOW_MS_MAX: u64 = 24 * 60 * 60 * 1000;
/// Client sessions one range keeps. A request that would open one more is refused with
/// `Overloaded` until idle sessions are dropped. A session costs about 40 bytes of disk.
pub const SESSIONS_PER_RANGE_MAX: u64 = 100_000;
/// Request records one client session keeps: the requests it has in flight that are not yet
/// below its `completed_below`. More are refused with `Overloaded`.
pub const REQUESTS_PER_SESSION_MAX: u64 = 1_024;
/// Expired keys one cleanup command removes; also free locks and expired idempotency
/// records one reclaim command removes (each).
pub const CLEANUP_KEYS_MAX: usize = 256;
/// Expired etcd leases one `ExpireLeases` command revokes. Each may delete up to
/// `LEASE_KEYS_MAX` keys, so this stays small: one apply deletes at most 80,000 keys.
pub const CLEANUP_LEASES_MAX: usize = 8;
/// Keys one etcd lease may hold; a put that would attach more is refused (`LeaseFull`).
/// Revoking a lease deletes all its keys in one apply.
pub const LEASE_KEYS_MAX: usize = 10_000;
/// Lease ids one `leases` read returns (etcd's `LeaseLeases`): the smallest ids of the
/// namespace, in order; the others are left out.
pub const LEASES_LIST_MAX: usize = 10_000;
/// Idle client sessions one cleanup command drops (with their records).
pub const CLEANUP_SESSIONS_MAX: usize = 256;
/// TTL-index rows a leader examines per key it may put in one cleanup: the index is shared
/// by the ranges of a file, and other ranges' expired keys are skipped.
pub const CLEANUP_EXAMINED_PER_KEY: usize = 4;

/// Longest lock owner or idempotency owner, in bytes (at least 1).
pub const OWNER_BYTES_MAX: usize = 256;
/// Longest a lock acquire may wait for the lock: 5 minutes.
pub const LOCK_WAIT_MS_MAX: u64 = 5 * 60 * 1000;
/// Longest lock-delay after an expiry: 1 minute.
pub const LOCK_DELAY_MS_MAX: u64 = 60 * 1000;
/// Acquires one node's leader queues for one lock; more are refused with `Overloaded`.
pub const LOCK_WAITERS_MAX: usize = 1_024;
/// Locks one node's leader queues acquires for at once; an acquire that would open another
/// queue is refused with `Overloaded`.
pub const LOCK_QUEUES_MAX: usize = 4_096;
/// Longest idempotency scope, in bytes (at least 1; no zero byte).
pub const IDEMPOTENCY_SCOPE_BYTES_MAX: usize = 256;
/// Longest idempotency id, in bytes (at least 1). Scope + 1 + id stays within a key.
pub const IDEMPOTENCY_ID_BYTES_MAX: usize = 1024;
/// Largest result an idempotency record stores.
pub const IDEMPOTENCY_RESULT_BYTES_MAX: usize = 64 * 1024;

/// Rows a scan returns when the request names no limit.
pub const SCAN_LIMIT_DEFAULT: u32 = 1_000;
/// Most rows one scan page may return.
pub const SCAN_LIMIT_MAX: u32 = 10_000;
/// Rows a scan page may examine per row of its limit: expired rows are skipped without being
/// counted, and this bounds the work of skipping them (a page may then come back short, even
/// empty, with a `next_start`).
pub const SCAN_EXAMINED_PER_LIMIT_ROW: usize = 4;
/// Most bytes (keys + values) one scan page may return; a page stops early at this size.
pub const SCAN_PAGE_BYTES_MAX: usize = 8 * 1024 * 1024;

/// Events a history page returns when the request names no limit.
pub const HISTORY_LIMIT_DEFAULT: u32 = 100;
/// Most events one history page may return.
pub const HISTORY_LIMIT_MAX: u32 = 1_000;
/// Most bytes (keys and the values before and after) one history page may return; a page
/// stops early at this size (it holds at least one event).
pub const HISTORY_PAGE_BYTES_MAX: usize = 8 * 1024 * 1024;
/// Shortest and longest time a node may keep a range's events (`--history-retention-ms`).
pub const HISTORY_RETENTION_MS_MIN: u64 = 1_000;
pub const HISTORY_RETENTION_MS_MAX: u64 = 30 * 24 * 60 * 60 * 1000;
/// Least and most bytes of events a node may keep per range (`--history-retention-bytes`).
pub const HISTORY_RETENTION_BYTES_MIN: u64 = 1024;
pub const HISTORY_RETENTION_BYTES_MAX: u64 = 64 * 1024 * 1024 * 1024;
/// Events of a range (of any key) one history page reads to find the key's: a page may come
/// back short, even empty, with where the next starts.
pub const HISTORY_EXAMINED_PER_PAGE: usize = 16_384;
/// Events of a range (of any key) a read at a revision may pass over to undo the changes
/// made after that revision; a read at a revision further back is refused.
pub const REVISION_READ_EXAMINED_MAX: usize = 1_000_000;
/// Keys changed after its revision whose earlier state a scan page at a revision tracks at
/// once: past them the page ends early (with a `next_start`), so its memory stays bounded.
pub const REVISION_READ_CHANGED_KEYS_MAX: usize = 16_384;
/// Rows a history compaction step reads (of any range of the file) in one transaction.
pub const HISTORY_COMPACT_ROWS_PER_TXN: usize = 4_096;

/// Watch streams one node serves at once; one more is refused `Overloaded`.
pub const WATCHES_PER_NODE_MAX: usize = 10_000;
/// Bytes of events (keys and values) in one watch message: a message stops at this size
/// (it holds at least one event), and a revision that does not fit is sent in fragments.
/// Below gRPC's common 4 MiB default limit, with room for a largest event.
pub const WATCH_MESSAGE_BYTES_MAX: usize = 1024 * 1024;
/// Events in one watch message.
pub const WATCH_MESSAGE_EVENTS_MAX: usize = 1_000;
/// Messages a watch stream holds ready for a slow reader; past them the stream reads no
/// more history until the reader takes one (it never holds events in memory beyond these).
pub const WATCH_STREAM_MESSAGES_BUFFERED: usize = 2;
/// How long a range's watch streams on one node that are caught up wait after an apply before
/// they read the next page, per stream (`shared::watch_pages`), at most
/// `WATCH_LINGER_MAX_MS`; none when it comes to less than a millisecond (fewer than 34
/// streams). The wait lets more applies into one message for each stream: at 1,000 watchers
/// a message per apply per stream is the servers' main cost (docs/BENCHMARKS.md).
pub const WATCH_LINGER_PER_STREAM_US: u64 = 30;
pub const WATCH_LINGER_MAX_MS: u64 = 10;
/// Shortest and longest pause between a watch's progress messages.
pub const WATCH_PROGRESS_MS_MIN: u64 = 100;
pub const WATCH_PROGRESS_MS_MAX: u64 = 60 * 60 * 1000;

/// Largest gRPC message Keel accepts or sends (a full batch plus framing).
pub const GRPC_MESSAGE_BYTES_MAX: usize = 16 * 1024 * 1024;
/// Size of one chunk of a streamed snapshot.
pub const SNAPSHOT_CHUNK_BYTES: usize = 1024 * 1024;
/// Requests queued for one storage writer thread before callers wait.
pub const STORAGE_WRITER_QUEUE_MAX: usize = 4_096;
/// Requests one storage writer thread folds into one durable commit.
pub const STORAGE_COMMIT_BATCH_MAX: usize = 1_024;
/// Bytes of one segment file of a node's Raft log before the next one starts; a segment is
/// deleted once every range has purged the entries it holds.
pub const RAFT_LOG_SEGMENT_BYTES: u64 = 64 * 1024 * 1024;
/// Bytes a Raft log segment is extended by, written as zeros, when an append needs room: an
/// append then overwrites allocated blocks, and its `fdatasync` has no file size to commit
/// (on ext4 a size change costs a journal commit per sync).
pub const RAFT_LOG_PREALLOCATE_BYTES: u64 = 4 * 1024 * 1024;
/// Longest a store's state machine goes without a durable commit while it applies: applies
/// commit without an fsync (the Raft log replays them after a crash). A durable commit after
/// many that were not holds up the writer thread in proportion to them: at 1 s, a lone
/// put's p99 rose from 7 to 18 ms and puts at 64 clients to 65 ms; at 100 ms both are back
/// where they were before the log moved (docs/BENCHMARKS.md, *The node-wide Raft log*).
pub const STORAGE_DURABLE_COMMIT_INTERVAL_MS: u64 = 100;
/// Reader threads of one store file (one per core, within these bounds).
pub const STORAGE_READERS_MIN: usize = 2;
pub const STORAGE_READERS_MAX: usize = 8;
/// Small reads one storage reader thread runs in one read transaction.
pub const STORAGE_READ_BATCH_MAX: usize = 64;
/// Queued reads per awake reader thread beyond which a submitter wakes another.
pub const STORAGE_READ_QUEUE_PER_READER: usize = 16;
/// Rows written per transaction while a snapshot is installed.
pub const SNAPSHOT_INSTALL_ROWS_PER_TXN: usize = 10_000;
/// Bytes (keys + values) written per transaction while a snapshot is installed; a
/// transaction stops early at this size even below `SNAPSHOT_INSTALL_ROWS_PER_TXN` rows.
pub const SNAPSHOT_INSTALL_BYTES_PER_TXN: usize = 16 * 1024 * 1024;
/// Log entries openraft sends in one append request.
pub const RAFT_APPEND_ENTRIES_MAX: u64 = 512;
/// Most bytes of log entries (keys, values, conditions) in one append request: half the gRPC
/// message limit, leaving room for framing. A request with more is sent in parts; one entry
/// (at most one batch, `BATCH_BYTES_MAX`) always fits.
pub const RAFT_APPEND_BYTES_MAX: usize = GRPC_MESSAGE_BYTES_MAX / 2;
/// Largest encoded Raft message that travels on the node pair's batch stream
/// (`Raft.Batch`); a larger one (a catch-up append) takes a call of its own, so that it
/// never holds up the heartbeats and votes of other ranges behind it on the stream.
pub const RAFT_BATCHED_MESSAGE_BYTES_MAX: usize = 256 * 1024;
/// Most bytes of messages the sender gathers into one batch on the stream.
pub const RAFT_BATCH_BYTES_MAX: usize = 4 * RAFT_BATCHED_MESSAGE_BYTES_MAX;
/// Messages queued for one peer's stream, not yet sent; a sender waits (within its
/// deadline) while the queue is full, so a slow peer holds up only its own messages.
pub const RAFT_BATCH_QUEUE_MAX: usize = 4_096;
/// Batched requests from one peer a node serves at once; it reads no more of that peer's
/// stream until some have been answered.
pub const RAFT_BATCH_IN_FLIGHT_MAX: usize = 4_096;
/// Times a leader whose lease lapsed (just elected, or out of touch with a quorum) renews it
/// with a heartbeat round and proposes a write again before answering `Unavailable`.
pub const WRITE_LEASE_RENEWALS_MAX: u32 = 2;
/// Linearizable reads one follower's replica of a range holds waiting for a read index from
/// its leader; a read beyond these answers `NotLeader` at once (the node forwards it to the
/// leader).
pub const READ_INDEX_READS_WAITING_MAX: u64 = 4_096;
/// Tries a node makes at one client request it does not lead (serving it again here or
/// sending it on to the range's leader, following the leader as leadership moves) before it
/// answers the last error; the request's deadline bounds them first. A forwarded request is
/// never forwarded again by the node it reaches.
pub const FORWARD_TRIES_MAX: u32 = 32;
/// Pause before a forwarding node's second try at a request (the first follows the refusal
/// at once); it doubles for each later try up to `FORWARD_BACKOFF_MAX_MS`.
pub const FORWARD_BACKOFF_MIN_MS: u64 = 10;
/// Longest pause between a forwarding node's tries of one request.
pub const FORWARD_BACKOFF_MAX_MS: u64 = 200;
/// Longest a node holds a request it may not send on (the caller routes it, or another node
/// forwarded it) when the range is electing a leader, so that the answer names the new
/// leader (or is served, when that is this node) instead of a bare `Unavailable`. Elections
/// after a leader transfer take milliseconds; one after a leader is lost takes an election
/// timeout, and the caller's own retry covers that. Well below the client's per-attempt
/// timeout.
pub const ELECTION_WAIT_MAX_MS: u64 = 300;
/// Longest a starting node waits, before it reports ready, for the meta range's leader to
/// say the cluster's leaders settled (its rebalancer planned nothing and knew every range's
/// leader, with this node healthy). It reports ready at this bound without that word: a
/// rebalancer that keeps failing an action must not keep a node out of service.
pub const LEADERS_SETTLE_WAIT_MAX_MS: u64 = 30_000;
/// How long a node that forwarded a write to a leader still waits for its answer once it
/// knows another leader was elected since: a deposed leader that is up answers its pending
/// writes at once (a leader transfer), one that is paused or cut off never does, and the
/// write is then answered `OutcomeUnknown` rather than at the forwarding deadline.
pub const FORWARDED_WRITE_GRACE_MS: u64 = 300;
/// Largest staleness bound a follower read may ask for (`max_staleness_ms`).
pub const MAX_STALENESS_MS_MAX: u64 = 24 * 60 * 60 * 1000;
/// Attempts the client makes for one read before it gives up.
pub const CLIENT_READ_ATTEMPTS_MAX: u32 = 8;
/// Attempts the client makes for one write before it gives up, whatever its deadline: at the
/// client's write backoff a 30 s deadline allows about 35 attempts; a chain of leader hints
/// can use more, quickly.
pub const CLIENT_WRITE_ATTEMPTS_MAX: u32 = 64;
/// Endpoints a client may be given.
pub const CLIENT_ENDPOINTS_MAX: usize = 64;
/// Nodes in the initial cluster.
pub const CLUSTER_NODES_MAX: usize = 64;

/// Metrics endpoint (`--metrics-listen`): scrapes served at once; a connection beyond them
/// is closed unanswered.
pub const METRICS_CONNECTIONS_MAX: usize = 16;
/// Metrics endpoint: bytes of one HTTP request head (request line and headers).
pub const METRICS_REQUEST_BYTES_MAX: usize = 8 * 1024;
/// Metrics endpoint: time to read a request and send its answer, whole.
pub const METRICS_REQUEST_TIMEOUT_MS: u64 = 10_000;
/// Hot keys reported (`keel_hot_key_requests`): the top k.
pub const HOT_KEYS_REPORTED_MAX: usize = 10;
/// Hot keys: keys counted per window (space-saving counters), a few times the k reported.
pub const HOT_KEYS_COUNTED_MAX: usize = 4 * HOT_KEYS_REPORTED_MAX;
/// Hot keys: bytes of a key kept and shown; a longer key is counted under its prefix.
pub const HOT_KEY_BYTES_MAX: usize = 64;
/// Hot keys: each request is sampled with probability one in this many.
pub const HOT_KEYS_SAMPLE_EVERY: u64 = 4;
/// Hot keys: length of one counting window; the report covers the last one or two.
pub const HOT_KEYS_WINDOW_SECS: u64 = 60;

/// Console (`GET /` on the metrics port): events a node keeps (splits, replica changes,
/// leader changes; the oldest go first), and events the page shows, merged from all nodes.
pub const CONSOLE_EVENTS_MAX: usize = 100;
/// Console: locks a node reports (of the ranges it leads), and locks the page shows.
pub const CONSOLE_LOCKS_MAX: usize = 100;
/// Console: waiters shown per lock; more are counted, not named.
pub const CONSOLE_WAITERS_SHOWN_MAX: usize = 16;
/// Console: ranges the page shows; more are counted, not listed.
pub const CONSOLE_RANGES_MAX: usize = 1_000;
/// Console: time a node has to answer for its own facts (hot keys, events, locks); a node
/// that does not is marked so on the page.
pub const CONSOLE_PEER_TIMEOUT_MS: u64 = 1_000;

/// Bytes of a tenant's name (`--auth-tokens`); see `tenant`.
pub const TENANT_NAME_BYTES_MAX: usize = 64;
/// Tenants in the tokens file (`--auth-tokens`). Also bounds the per-tenant metrics
/// (`keel_tenant_*`: a few series per tenant with a keys or bytes quota).
pub const TENANTS_MAX: usize = 1_000;
/// Bytes of the tokens file (`--auth-tokens`).
pub const AUTH_FILE_BYTES_MAX: usize = 1024 * 1024;
/// Bytes of one bearer token: at least 16 (a guessable token is refused), at most 256.
pub const TOKEN_BYTES_MIN: usize = 16;
pub const TOKEN_BYTES_MAX: usize = 256;
/// How often a node refreshes its table of the tenants' ranges and their key and byte
/// counts. A range's leader checks keys and bytes quotas against its live counts; the table
/// only says how many ranges a namespace has and how full the others are.
pub const TENANT_USAGE_REFRESH_MS: u64 = 2_000;
/// Bytes a quota reserves for an increment's stored value: a decimal i64 with its sign.
pub const COUNTER_VALUE_BYTES_MAX: usize = 20;
/// Bytes a quota reserves for the fixed fields of a lock, fence or idempotency row (tokens,
/// instants, its encoding), on top of its name, owner and result. At least what such a row
/// stores beyond those (`keel-storage` counts a row as its key plus its encoded value).
pub const QUOTA_ROW_OVERHEAD_BYTES: usize = 64;

/// A human size: `1 MiB`, `4 KiB`, `17 bytes`.
pub fn human_bytes(bytes: usize) -> String {
    const KIB: usize = 1024;
    const MIB: usize = 1024 * 1024;
    if bytes >= MIB && bytes.is_multiple_of(MIB) {
        format!("{} MiB", bytes / MIB)
    } else if bytes >= MIB {
        format!("{:.1} MiB", bytes as f64 / MIB as f64)
    } else if bytes >= KIB && bytes.is_multiple_of(KIB) {
        format!("{} KiB", bytes / KIB)
    } else if bytes >= KIB {
        format!("{:.1} KiB", bytes as f64 / KIB as f64)
    } else {
        format!("{bytes} bytes")
    }
}

/// Ranges one node heartbeat lists as quiet to one peer (and the peer's answer agrees to):
/// a leader with more idle ranges followed by that peer lists these and keeps the others
/// ticking.
pub const HEARTBEAT_QUIET_RANGES_MAX: usize = 16_384;
/// Ranges one backup file may hold (`keel backup`); a cluster with more is refused.
pub const BACKUP_RANGES_MAX: usize = 65_536;
/// Times `keel backup` lists the ranges again to back up the parts of the keyspace that split
/// away from a range before its snapshot was taken; then it gives up with an error.
pub const BACKUP_ROUNDS_MAX: u32 = 8;
/// Records of a backup file `keel restore` reads ahead of installing them (a bounded queue
/// between the reading thread and the installs).
pub const RESTORE_RECORDS_IN_FLIGHT: usize = 4;
/// Largest record of a backup file: a snapshot chunk or a range descriptor (two keys), plus
/// framing. A reader refuses a longer one as corrupt.
pub const BACKUP_RECORD_BYTES_MAX: usize = SNAPSHOT_CHUNK_BYTES + 64 * 1024;

/// TLS: bytes of one PEM file (a node's certificate chain, its key, the cluster CA, a
/// client's CA); real ones are a few KiB. A longer file is refused, naming it.
pub const TLS_PEM_BYTES_MAX: usize = 1024 * 1024;
/// TLS: time one connection has to finish its handshake, on either side.
pub const TLS_HANDSHAKE_TIMEOUT_MS: u64 = 5_000;

/// Range descriptors one meta command records.
pub const META_UPDATE_RANGES_MAX: usize = 64;
/// Range ids one meta command hands out.
pub const RANGE_IDS_ALLOCATE_MAX: u64 = 1_024;

/// Consistency checks: hash buckets a range's state is divided into (by a hash of each
/// row's key), so a divergence is located to a bucket before it is located to a key.
pub const CHECK_BUCKETS: usize = 1_024;
/// Consistency checks: bytes of a range's state one store file's checker hashes per second at
/// most, so a check never competes with the serving path for long.
pub const CHECK_BYTES_PER_SEC: u64 = 32 * 1024 * 1024;
/// Consistency checks: digests a store file keeps for its replicas' checks, newest first
/// (the leader collects them within `CHECK_WAIT_MS`).
pub const CHECK_DIGESTS_KEPT: usize = 64;
/// Consistency checks: checks queued for a store file's checker; a replica whose checker is
/// this far behind skips the check and says so.
pub const CHECK_QUEUE_MAX: usize = 8;
/// Consistency checks: longest a leader waits for one replica's digest.
pub const CHECK_WAIT_MS: u64 = 60_000;
/// Consistency checks: buckets one locating check lists the rows of.
pub const CHECK_LOCATE_BUCKETS_MAX: usize = 4;
/// Consistency checks: rows a replica lists in a locating check (more are cut off and the
/// digest says so). With every row's key at `KEY_BYTES_MAX`, a digest still fits in half of
/// `GRPC_MESSAGE_BYTES_MAX` (asserted below).
pub const CHECK_LOCATE_ROWS_MAX: usize = 1_024;
const _: () = assert!(
    CHECK_LOCATE_ROWS_MAX * (KEY_BYTES_MAX + 64) + CHECK_BUCKETS * 64 < GRPC_MESSAGE_BYTES_MAX / 2
);
/// Consistency checks: divergent rows a check report names per replica.
pub const CHECK_REPORTED_ROWS_MAX: usize = 16;
/// Consistency checks: ranges one `Cluster.Check` call checks.
pub const CHECK_RANGES_MAX: usize = 1_000;
/// Consistency checks: shortest interval a node may be configured to check each range in.
pub const CHECK_INTERVAL_MS_MIN: u64 = 1_000;
/// Consistency checks: longest a node waits between two looks for the ranges it leads that
/// fall due (it looks once per interval when the interval is shorter); a range falls due at
/// most this late, and idle ranges cost no look every second.
pub const CHECK_SCAN_MS_MAX: u64 = 60_000;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_bytes_names_units() {
        for (bytes, text) in [
            (17, "17 bytes"),
            (4096, "4 KiB"),
            (1536, "1.5 KiB"),
            (1024 * 1024, "1 MiB"),
            (1_258_291, "1.2 MiB"),
        ] {
            assert_eq!(human_bytes(bytes), text, "{bytes}");
        }
    }
}
