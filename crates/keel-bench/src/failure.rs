//! An operation that did not complete, and the class it is counted under in the report.
//! Pure: names statuses and errors, sends nothing.
//!
//! Classes (the keys of `errors_by_code`):
//! - `--route spread` and etcd: the gRPC code of the answer in upper case (`UNAVAILABLE`),
//!   followed for Keel by what the status says: `/not_leader` (the kind of its Keel error
//!   detail), `/not_sent` (could not connect) or `/lost` (the connection failed after sending),
//!   as `keel_client::attempt::from_status` classifies it;
//! - `--route leader`: keel-client's final error after its retries, by kind in lower case
//!   (`not_leader`, `outcome_unknown`);
//! - `bench_timeout`: no answer within `limits::OP_TIMEOUT`, whatever the target;
//! - `bench`: the bench refused the outcome (a lock not granted, a counter overflow).

use keel_client::attempt::{self, AttemptError};
use keel_types::KvError;
use tonic::{Code, Status};

/// Why one operation failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The class it is counted under (see the module doc).
    pub code: String,
    pub message: String,
}

impl Failure {
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Failure {
        Failure {
            code: code.into(),
            message: message.into(),
        }
    }

    /// A failure the bench itself decided (not an answer of the target).
    pub fn bench(message: impl Into<String>) -> Failure {
        Failure::new("bench", message)
    }

    /// keel-client's final error.
    pub fn from_kv(error: &KvError) -> Failure {
        Failure::new(error.kind(), error.to_string())
    }

    /// A non-OK answer to a raw gRPC call to Keel.
    pub fn from_status(status: &Status) -> Failure {
        let code = code_name(status.code());
        let (class, message) = match attempt::from_status(status) {
            AttemptError::Server(error) if status.details().is_empty() => {
                (code.to_string(), error.to_string())
            }
            AttemptError::Server(error) => (format!("{code}/{}", error.kind()), error.to_string()),
            AttemptError::NotSent(message) => (format!("{code}/not_sent"), message),
            AttemptError::Lost(message) => (format!("{code}/lost"), message),
            AttemptError::TimedOut(message) | AttemptError::Superseded { message, .. } => {
                (format!("{code}/timed_out"), message)
            }
        };
        Failure::new(class, message)
    }

    /// No answer within `budget_ms`.
    pub fn timed_out(budget_ms: u128) -> Failure {
        Failure::new("bench_timeout", format!("no answer within {budget_ms} ms"))
    }
}

/// The bench's own refusals (`Failure::bench`), for `?` on its checks.
impl From<String> for Failure {
    fn from(message: String) -> Failure {
        Failure::bench(message)
    }
}

impl From<&str> for Failure {
    fn from(message: &str) -> Failure {
        Failure::bench(message)
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

/// The canonical name of a gRPC code, as the gRPC specification spells it.
pub fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

#[cfg(test)]
mod tests;
