//! Options of the client and of its requests. Plain data; knows nothing of the network.

use std::time::Duration;

use keel_types::Condition;

/// How the client talks to the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientOptions {
    /// Budget of one request, all attempts and pauses included. A write that gets no answer
    /// within it ends with `OutcomeUnknown`.
    pub request_timeout: Duration,
    /// Budget of one read attempt: a read with no answer by then goes to the next endpoint
    /// (within `request_timeout`). Writes are never cut short this way.
    pub read_attempt_timeout: Duration,
    /// Budget for opening one connection.
    pub connect_timeout: Duration,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            request_timeout: Duration::from_secs(5),
            read_attempt_timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(1),
        }
    }
}

/// Options of a put.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PutOptions {
    /// Apply only if this holds (compare-and-set).
    pub condition: Option<Condition>,
    /// Return the key's state before the put.
    pub return_previous: bool,
}

/// Options of a delete.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeleteOptions {
    /// Apply only if this holds (compare-and-delete).
    pub condition: Option<Condition>,
    /// Return the key's state before the delete.
    pub return_previous: bool,
}
