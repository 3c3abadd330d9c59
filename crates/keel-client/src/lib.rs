//! Keel's Rust client. Depends only on `keel-types` and `keel-proto`; knows nothing of
//! servers, storage or Raft.
//!
//! # Routing
//! The client caches the leader's endpoint: the one that last served a leader-only request
//! (writes, linearizable and lease reads), or the one a replica named in `NotLeader`. Requests
//! go there with `no_forward = true`, or to the next configured endpoint when the leader is
//! unknown. A named leader need not be in the configured list.
//!
//! # Request ids
//! Every write (put, delete, batch, increment) carries a request id: the client's session
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
//!   without a Keel `ErrorDetail` that do not say "not applied".
//!
//! Between attempts it pauses, exponentially with jitter (none to follow a hint). When the
//! deadline or the attempt limit is reached it returns `OutcomeUnknown` if any attempt may
//! have been applied, else the last error (it was not applied). `ConditionFailed`,
//! `InvalidArgument`, `NotACounter` and `Overflow` are final and returned at once.
//! `RequestIdExpired` while no attempt of the write can have been applied (on the first
//! attempt, or after attempts that were certainly not applied) moves the write to a new
//! session and a new id, once; otherwise it is returned: the write may have been applied
//! under the expired id, and sending it under a new one could apply it twice.
//!
//! A hint naming an endpoint that could not be reached during the request is stale (replicas
//! name a crashed leader until they elect a new one) and is ignored, and rotation passes over
//! such endpoints while others remain.
//!
//! The policy is the pure functions of `retry`; `attempt::from_status` classifies a tonic
//! status. Input is validated here with `keel_types::validate` before anything is sent.

pub mod attempt;
mod client;
mod endpoints;
mod options;
mod results;
pub mod retry;
mod session;

pub use client::Client;
pub use endpoints::normalize as normalize_endpoint;
pub use options::{ClientOptions, DeleteOptions, PutOptions};
pub use results::{BatchResult, DeleteResult, GetResult, IncrementResult, PutResult, ScanResult};
