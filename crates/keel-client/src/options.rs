//! Options of the client and of its requests. Plain data; knows nothing of the network.

use std::time::Duration;

use keel_proto::v1;
use keel_types::{Condition, Fence};

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
    /// Least time between two fetches of the range table (`Cluster.Ranges`). A request
    /// refused for reaching the wrong range waits for the next fetch at most this long;
    /// concurrent ones share it.
    pub range_refresh_interval: Duration,
    /// Budget for opening one range's backup stream (`Client::backup_range`: the leader
    /// confirms its leadership and may build a snapshot first), and the longest wait for each
    /// of its chunks.
    pub snapshot_timeout: Duration,
    /// The bearer token sent with every request, for a cluster with authentication on
    /// (`keel serve --auth-tokens`): it names the tenant (or admin) the client acts as.
    pub token: Option<String>,
    /// TLS to every node; `None`: plaintext. A cluster serving TLS refuses plaintext.
    pub tls: Option<ClientTls>,
}

/// How the client checks the nodes over TLS.
#[derive(Clone, PartialEq, Eq)]
pub struct ClientTls {
    /// The CA that signed the nodes' certificates (PEM, one or more certificates): the only
    /// root the client trusts.
    pub ca_pem: Vec<u8>,
    /// The name every node's certificate must carry; `None`: the host of the address dialled
    /// (an IP address is matched against the certificate's IP SANs).
    pub server_name: Option<String>,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field("ca_pem_bytes", &self.ca_pem.len())
            .field("server_name", &self.server_name)
            .finish()
    }
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
            range_refresh_interval: Duration::from_millis(100),
            snapshot_timeout: Duration::from_secs(60),
            token: None,
            tls: None,
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
    /// Apply only if the key accepts this lock's token (`FencedOut` otherwise), and make it
    /// refuse lower tokens from now on. See `Client::acquire`.
    pub fence: Option<Fence>,
}

/// Options of a delete.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeleteOptions {
    /// Apply only if this holds (compare-and-delete).
    pub condition: Option<Condition>,
    /// Return the key's state before the delete.
    pub return_previous: bool,
    /// Apply only if the key accepts this lock's token (`FencedOut` otherwise). A delete
    /// without a fence also drops the key's fence: the way to retire a fenced key.
    pub fence: Option<Fence>,
}

/// Options of a batch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatchOptions {
    /// Guards every key the batch writes: the whole batch is refused with `FencedOut` if
    /// any of them accepts only a higher token (or another lock).
    pub fence: Option<Fence>,
}

/// Options of `Client::acquire` and `Client::lock`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcquireOptions {
    /// Who asks, 1 to 256 bytes; `None`: the client's own owner (`Client::owner`). The same
    /// owner acquiring a lock it holds gets its token back with a new TTL, so owners must
    /// be unique per holder.
    pub owner: Option<Vec<u8>>,
    /// How long the lock is held without a renew: 1 ms to 1 year, in whole milliseconds.
    pub ttl: Duration,
    /// How long to wait for a held lock (first come, first served): zero tries once; at
    /// most 5 minutes.
    pub wait: Duration,
    /// After this holder's TTL runs out (not after a release) nobody may take the lock for
    /// this long: zero to 1 minute.
    pub lock_delay: Duration,
}

impl Default for AcquireOptions {
    /// A 10 s TTL, no wait, no lock-delay, the client's owner.
    fn default() -> Self {
        AcquireOptions {
            owner: None,
            ttl: Duration::from_secs(10),
            wait: Duration::ZERO,
            lock_delay: Duration::ZERO,
        }
    }
}

/// Options of `Client::idempotent_with`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotentOptions {
    /// How long the work may run before another caller may take the record over and run it
    /// again: 1 ms to 1 year. Give it well above the work's worst case.
    pub ttl: Duration,
    /// How long the result is kept and handed to later callers: 1 ms to 1 year.
    pub result_ttl: Duration,
    /// How long to wait, in all, while another owner has the work in progress, before
    /// giving up with `IdempotentError::InProgress`. Zero: do not wait.
    pub wait: Duration,
    /// Who does the work; `None`: the client's own owner (`Client::owner`).
    pub owner: Option<Vec<u8>>,
}

impl IdempotentOptions {
    /// `ttl` for the work; the result kept 24 hours; waits up to 1 minute for another owner.
    pub fn new(ttl: Duration) -> IdempotentOptions {
        IdempotentOptions {
            ttl,
            result_ttl: Duration::from_secs(24 * 60 * 60),
            wait: Duration::from_secs(60),
            owner: None,
        }
    }
}

/// A fence as the API carries it.
pub(crate) fn wire_fence(fence: Fence) -> v1::Fence {
    v1::Fence {
        lock: fence.lock,
        token: fence.token,
    }
}

/// A TTL (or any duration) in milliseconds as the API carries it (signed), for the checks
/// of `validate`; saturates, so an absurd duration is refused with the limit's message.
pub(crate) fn millis(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX)
}
