//! Options of the client and of its requests. Plain data; knows nothing of the network.

use std::time::Duration;

use keel_types::Condition;

/// How the client talks to the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientOptions {
    /// Budget of one read (and of opening a client session), all attempts and pauses
    /// included.
    pub request_timeout: Duration,
    /// Budget of one read attempt: a read with no answer by then goes to the next endpoint
    /// (within `request_timeout`).
    pub read_attempt_timeout: Duration,
    /// Budget of one write, all attempts and pauses included. A write that is still unanswered
    /// then ends with `OutcomeUnknown` if any attempt may have been applied, else with the
    /// last error.
    pub write_deadline: Duration,
    /// Budget of one write attempt: a write with no answer by then is sent again with the same
    /// request id (within `write_deadline`).
    pub write_attempt_timeout: Duration,
    /// A client session older than this is replaced by a new one before the next write. Keep
    /// it well below the servers' dedup window (10 minutes by default).
    pub session_max_age: Duration,
    /// Budget for opening one connection.
    pub connect_timeout: Duration,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            request_timeout: Duration::from_secs(5),
            read_attempt_timeout: Duration::from_secs(2),
            write_deadline: Duration::from_secs(30),
            write_attempt_timeout: Duration::from_secs(5),
            session_max_age: Duration::from_secs(5 * 60),
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
    /// Time to live, 1 ms to 1 year, in whole milliseconds (a sub-millisecond part is
    /// dropped), counted from when the leader proposes the write. `None`: no TTL, and the
    /// put clears a TTL the key had.
    pub ttl: Option<Duration>,
}

/// Options of a delete.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeleteOptions {
    /// Apply only if this holds (compare-and-delete).
    pub condition: Option<Condition>,
    /// Return the key's state before the delete.
    pub return_previous: bool,
}

/// A TTL in milliseconds as the API carries it (signed), for `validate::check_ttl_ms`.
pub(crate) fn ttl_ms(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX)
}
