//! Keel's vocabulary: ids, keys, commands and their outcomes, errors and limits.
//!
//! This crate does no I/O and knows nothing of openraft, redb, tonic or the network. Every
//! other Keel crate speaks in these types.

pub mod check;
pub mod clock;
pub mod command;
pub mod coordination;
pub mod error;
pub mod history;
pub mod ids;
pub mod lease;
pub mod limits;
pub mod pinned;
pub mod planted;
pub mod range;
pub mod tenant;
pub mod txn;
pub mod validate;

pub use check::{
    Check, CheckReport, CheckedRow, Hold, RangeDigest, ReplicaAnswer, ReplicaCheck, Verdict,
};
pub use clock::{Clock, ManualClock, SharedClock, SystemClock};
pub use command::{
    BatchOp, Cleanup, Command, CommandOutcome, Condition, ConditionFailed, Consistency, ExpiredKey,
    KeyValue, Mutation, OpResult, ReadBound, Rejection, RequestId, parse_counter,
};
pub use coordination::{
    Acquirer, Coordination, CoordinationCounts, CoordinationOp, CoordinationResult, ExpiredRecord,
    Fence, IdempotencyRecord, LockHold, LockPhase, Reclaim,
};
pub use error::KvError;
pub use history::{Event, EventCursor, EventKind, KeyHistory};
pub use ids::{NodeAddr, NodeId, RangeId, Revision};
pub use lease::{ExpireLeases, ExpiredLease, LeaseInfo, LeaseMutation, LeaseOp, LeaseResult};
pub use range::{
    LedRange, MetaCommand, MetaMembers, MetaOutcome, NodeDescriptor, NodeReport, NodeState,
    QuietRange, RangeDescriptor, ReplicaChange, ReplicaMembership, Split,
};
