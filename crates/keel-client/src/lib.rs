//! Keel's Rust client. Depends only on `keel-types` and `keel-proto`; knows nothing of
//! servers, storage or Raft.
//!
//! # Routing
//! The client caches the leader's endpoint: the one that last served a leader-only request
//! (writes, linearizable and lease reads), or the one a replica named in `NotLeader`. Requests
//! go there with `no_forward = true`, or to the next configured endpoint when the leader is
//! unknown. A named leader need not be in the configured list.
//!
//! # Retries: the rule
//! Every request has one deadline (`ClientOptions::request_timeout`) and at most
//! `limits::CLIENT_READ_ATTEMPTS_MAX` attempts. Whether an attempt may be repeated depends on
//! whether the request can have been applied:
//!
//! - **Definitely not applied**, retried for reads and writes: `NotLeader` (to the hinted
//!   leader at once, else the next endpoint), `Unavailable` from a server, and *could not
//!   connect* — a `tonic::ConnectError` in the transport error's chain, which tonic produces
//!   only while opening a connection, before any byte of the request is written.
//! - **Maybe applied**: any other transport failure (reset, stream error, keep-alive timeout:
//!   the request may have left), no answer before the deadline, and server answers `Timeout`,
//!   `OutcomeUnknown` or `Fatal`. Reads retry on the next endpoint; a write is **never**
//!   retried and ends with `KvError::OutcomeUnknown`. A write whose deadline passes while the
//!   connection is still being opened is also reported `OutcomeUnknown`: the client cannot
//!   see that nothing left, so it says the safe thing.
//! - **Final**: `InvalidArgument` and `ConditionFailed` are returned as they are.
//!
//! Between attempts the client pauses (`retry::backoff`): not at all to follow a hint; while
//! the range has no leader, the time left spread over the attempts left, so the attempts
//! outlast an election; after a connection failure, briefly. A hint naming an endpoint that
//! could not be reached during the request is stale (replicas name a crashed leader until they
//! elect a new one) and is ignored, and rotation passes over such endpoints while others
//! remain.
//!
//! The policy is the pure function `retry::decide`; `attempt::from_status` classifies a
//! tonic status. Input is validated here with `keel_types::validate` before anything is sent.

pub mod attempt;
mod client;
mod endpoints;
mod options;
mod results;
pub mod retry;

pub use client::Client;
pub use endpoints::normalize as normalize_endpoint;
pub use options::{ClientOptions, DeleteOptions, PutOptions};
pub use results::{BatchResult, DeleteResult, GetResult, PutResult, ScanResult};
