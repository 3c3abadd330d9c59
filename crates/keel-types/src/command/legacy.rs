//! Encodings of earlier formats of `command`'s types, kept so that log entries and records
//! written by older releases still decode: each mirrors a type as an older format wrote it
//! and converts into today's.

use serde::{Deserialize, Serialize};

use super::{BatchOp, Condition};

/// `BatchOp` of format 1: no TTL, no increment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum BatchOpV1 {
    Put {
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
        #[serde(with = "serde_bytes")]
        value: Vec<u8>,
        condition: Option<Condition>,
        return_previous: bool,
    },
    Delete {
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
        condition: Option<Condition>,
        return_previous: bool,
    },
}

impl From<BatchOpV1> for BatchOp {
    fn from(op: BatchOpV1) -> BatchOp {
        match op {
            BatchOpV1::Put {
                key,
                value,
                condition,
                return_previous,
            } => BatchOp::Put {
                key,
                value,
                condition,
                return_previous,
                ttl_ms: None,
            },
            BatchOpV1::Delete {
                key,
                condition,
                return_previous,
            } => BatchOp::Delete {
                key,
                condition,
                return_previous,
            },
        }
    }
}
