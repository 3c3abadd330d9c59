//! Errors a Keel client can act on. `keel-server` maps each to a gRPC status in one table
//! (`status.rs`) and `keel-client` maps it back.

use thiserror::Error;

use crate::command::ConditionFailed;
use crate::ids::{NodeAddr, NodeId, RangeId};

/// The errors of the key-value API. Retry-elsewhere errors (`NotLeader`, `Unavailable`) are
/// kept apart from "this node has stopped" (`Fatal`).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum KvError {
    /// The request is malformed or exceeds a limit; nothing was applied.
    #[error("invalid argument: {message}")]
    InvalidArgument { message: String },

    /// This replica is not the leader of the range. `leader` is a hint, when known.
    #[error("not leader of range {range_id}{}", leader_hint(.leader))]
    NotLeader {
        range_id: RangeId,
        leader: Option<(NodeId, NodeAddr)>,
    },

    /// A condition of a write did not hold; nothing was applied.
    #[error("condition failed on op {} (key {:?})", .0.op_index, String::from_utf8_lossy(&.0.key))]
    ConditionFailed(ConditionFailed),

    /// The range cannot serve the request now (no leader, no quorum, shutting down). The
    /// request was not applied; it may be retried.
    #[error("unavailable: {message}")]
    Unavailable { message: String },

    /// A read did not finish in time. Reads change nothing, so they may be retried.
    #[error("timed out: {message}")]
    Timeout { message: String },

    /// A write was sent but its result was lost (timeout, connection loss, leader change
    /// after proposing). It may or may not have been applied.
    #[error("outcome unknown: {message}")]
    OutcomeUnknown { message: String },

    /// The node has stopped serving (storage failure). Go to another node.
    #[error("node stopped: {message}")]
    Fatal { message: String },
}

fn leader_hint(leader: &Option<(NodeId, NodeAddr)>) -> String {
    match leader {
        Some((id, addr)) => format!("; leader is node {id} at {addr}"),
        None => "; leader unknown".to_string(),
    }
}

impl KvError {
    pub fn invalid(message: impl Into<String>) -> Self {
        KvError::InvalidArgument {
            message: message.into(),
        }
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        KvError::Unavailable {
            message: message.into(),
        }
    }

    pub fn fatal(message: impl Into<String>) -> Self {
        KvError::Fatal {
            message: message.into(),
        }
    }
}
