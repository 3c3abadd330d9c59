//! Keel's Rust client. Depends only on `keel-types` and `keel-proto`; knows nothing of
//! servers, storage, Raft or placement: its range table is a cache the cluster corrects.
//!
//! # Routing
//! The client keeps the cluster's range table (`Cluster.Ranges`: each range's span, replicas
//! and leader, and the nodes' addresses), fetched on first use by one request for all.
//! A request goes to the leader of the range holding its key (a scan's start, a batch's
//! first key, a lock's name, an idempotency record's key), or to a replica of it in turn
//! while the leader is unknown, with `no_forward = true`; a `NotLeader` hint sets that
//! range's leader. The table is refreshed when an answer shows it is stale: `KeyOutOfRange`,
//! `EpochMismatch`, a `NotLeader` naming another range than the table picked (the request is
//! then sent again through the new table, same request id), or a success from another range
//! (the next request refreshes first). One refresh runs at a time and concurrent requests
//! share it; fetches are at least `ClientOptions::range_refresh_interval` apart.
//!
//! A cluster that answers `Cluster.Ranges` with UNIMPLEMENTED (a server from before ranges)
//! is one range: requests go to the leader that last served a leader-only request, or that
//! a replica named; else to the next configured endpoint. A named leader need not be in the
//! configured list.
//!
//! # Batches and scans across ranges
//! A range applies a batch atomically; `Client::batch` refuses, before sending, a batch whose
//! keys the table places in more than one range (`InvalidArgument`, naming two of them).
//! `Client::batch_non_atomic` sends such ops in parts, one per range, each an atomic batch
//! with its own request id; the parts are not atomic together. `Client::scan` gathers a page
//! across range ends (each range's part routed by the key it starts at), so following
//! `next_start` lists each key once, in order, however the keyspace is split.
//!
//! # Request ids
//! Every write (put, delete, batch, increment, and the lock and idempotency writes: acquire,
//! renew, release, begin, complete, abort) carries a request id: the client's session
//! (`client_id`, `client_started_ms`, from an `OpenSession` call to any node, made lazily
//! before the first write), a sequence numbered from 1, and `completed_below`, the lowest
//! sequence of the session still in flight. The servers apply a request id at most once and
//! answer a repeat with the first answer (`replayed: true` in the results). A session is
//! replaced before the next write once it is older than `ClientOptions::session_max_age`
//! (keep it below the servers' dedup window) or when `limits::REQUESTS_PER_SESSION_MAX`
//! sequences are open in it; writes in flight keep their ids.
//!
//! # Retries: the rule
//! **Reads** have one deadline (`ClientOptions::request_timeout`), at most
//! `limits::CLIENT_READ_ATTEMPTS_MAX` attempts of at most `read_attempt_timeout` each, and are
//! retried after any failure but a final answer (`InvalidArgument`).
//!
//! **Writes** have one deadline (`ClientOptions::write_deadline`), attempts of at most
//! `write_attempt_timeout`, and a bounded number of attempts. Because of the request id, a
//! write is sent again *with the same id* after:
//!
//! - answers that say it was not applied: `NotLeader` (to the hinted leader at once, else the
//!   next endpoint), `Unavailable`, `Overloaded` (to the same node), and *could not connect*
//!   (a `tonic::ConnectError` in the transport error's chain, which tonic produces only while
//!   opening a connection, before any byte of the request is written);
//! - failures that leave the outcome unknown: any other transport failure, no answer within
//!   the attempt's budget, server answers `Timeout`, `OutcomeUnknown` or `Fatal`, and statuses
//!   without a Keel `ErrorDetail` that do not say "not applied";
//! - an attempt given up because, while it waited, another replica of its range named
//!   another node as the leader (asked every 250 ms of waiting, `Cluster.Leader`): to that
//!   leader at once, as an unknown outcome.
//!
//! Between attempts it pauses, exponentially with jitter (none to follow a hint). When the
//! deadline or the attempt limit is reached it returns `OutcomeUnknown` if any attempt may
//! have been applied, else the last error (it was not applied). `ConditionFailed`,
//! `InvalidArgument`, `NotACounter`, `Overflow`, `FencedOut`, `LockNotHeld`,
//! `RecordNotOwned`, `FutureRevision` (a read's `min_revision` the range has not reached)
//! and `Compacted` (history asked from a revision the replica no longer keeps) are final and returned at once: sending again cannot change them.
//! `RequestIdExpired` while no attempt of the write can have been applied (on the first
//! attempt, or after attempts that were certainly not applied) moves the write to a new
//! session and a new id, once; otherwise it is returned: the write may have been applied
//! under the expired id, and sending it under a new one could apply it twice.
//!
//! `KeyOutOfRange` (and `EpochMismatch` on a data request) also means not applied: the server
//! refuses before it stores a request record, so the write is sent again, same id, through
//! the refreshed table. `Client::split` has no request id, but a split already made at its
//! key is answered with its halves, so it is sent again after any answer but `EpochMismatch`
//! (final) and ends `OutcomeUnknown` only if given up after an attempt that may have been
//! applied.
//!
//! A hint naming an endpoint that could not be reached during the request is stale (replicas
//! name a crashed leader until they elect a new one) and is ignored, and rotation passes over
//! such endpoints while others remain.
//!
//! The policy is the pure functions of `retry`; `attempt::from_status` classifies a tonic
//! status. Input is validated here with `keel_types::validate` before anything is sent.
//!
//! # Endpoints and TLS
//! An endpoint is `host:port` (`http://` or `https://` before it is taken and dropped:
//! configured endpoints, the range table's node addresses and leader hints then compare
//! equal). With `ClientOptions::tls` every connection is TLS, trusting only the given CA
//! and checking each node's certificate against the host of its address (an IP against
//! the certificate's IP SANs) or against `ClientTls::server_name`; without it, plaintext.
//! A cluster serving TLS refuses plaintext. The client presents no certificate.
//!
//! # Locks and fencing tokens
//! `Client::acquire(name, AcquireOptions{owner, ttl, wait, lock_delay})` grants a free lock
//! with a *token* strictly greater than every token issued before for it, or waits up to
//! `wait` in the leader's queue (the attempt budget and the write deadline grow by the
//! wait; a retry waits only for what is left), or answers with the holder. A retry is safe:
//! the same owner acquiring a lock it holds gets its token back. The owner defaults to
//! `Client::owner()`, `host/pid/random hex`, unique per client. `renew`, `release` and
//! `inspect` complete the set; a token that no longer holds the lock gets `LockNotHeld`.
//!
//! `Client::lock` returns a `LockGuard`, renewed in the background every third of its TTL.
//! Its expiry is counted from when the last successful acquire or renew was *sent* (never
//! later than the server's); `LockGuard::lost` resolves when a renew is refused or that
//! expiry passes without a successful renew. A lock cannot keep a paused holder from
//! acting after its TTL ran out: put the token in the writes it protects
//! (`PutOptions::fence`, `DeleteOptions::fence`, `BatchOptions::fence` with
//! `Client::batch_with`), and the store refuses a stale holder's write with `FencedOut`.
//!
//! # Idempotency records
//! `begin` / `complete` / `abort` / `idempotency_get` are the record calls;
//! `Client::idempotent(scope, id, ttl, work)` runs `work` only if this caller started the
//! record, stores its result (or aborts on error), returns a stored result without running
//! `work`, and waits with jittered backoff while another owner is in progress (see its
//! docs for what happens when `work` outlives its TTL).
//!
//! # Backups
//! `Client::backup_range` streams one range's snapshot from its leader, taken after the
//! leader confirmed its leadership with a quorum: consistent in itself, at the range's
//! revision. The bytes are opaque here; `keel backup` writes them into a keel-backup file.

pub mod attempt;
mod client;
mod endpoints;
mod errors;
mod options;
mod random;
mod range_cache;
mod range_table;
mod results;
pub mod retry;
mod scan_page;
mod session;
mod stub;

pub use client::{Client, LockGuard, RangeBackup, RangeSnapshot, Watch, WatchBatch, WatchOptions};
pub use endpoints::normalize as normalize_endpoint;
pub use errors::{IdempotentError, LockError, LockLost};
pub use options::{
    AcquireOptions, BatchOptions, ClientOptions, ClientTls, DeleteOptions, IdempotentOptions,
    PutOptions,
};
pub use results::{
    AbortResult, AcquireResult, BatchPart, BatchResult, BeginResult, CompleteResult, DeleteResult,
    GetResult, HistoryResult, IdempotencyGetResult, IncrementResult, InspectResult, LockHolder,
    NonAtomicBatchResult, PutResult, RangeInfo, RecordState, ReleaseResult, RenewResult,
    ScanResult,
};
