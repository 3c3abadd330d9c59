//! The quiescence state of one group on this node (`Quiet`) and its vocabulary: why the
//! ticker is parked (`Parked`), a leader's proposal with the use count it was made at
//! (`Proposed`), which parking an operation wakes (`Wake`). Plain state: `RaftGroup` holds
//! it and `quiet.rs` reads and changes it under its lock. Knows nothing of `RaftGroup` or
//! openraft.

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use keel_types::{NodeId, QuietRange};

use crate::quiescence::Proposal;

/// Why a group's ticker is parked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parked {
    /// This replica leads the group and every follower agreed to `quiet`.
    Leader { quiet: QuietRange },
    /// This replica follows `leader`, which listed `quiet` in its heartbeat, and agreed.
    Follower { leader: NodeId, quiet: QuietRange },
    /// The node has just started: the ticker waits, until `until` at most (`None`: the node
    /// is not serving yet), to learn whether the group's leader lists it as quiet, so that a
    /// restarted follower does not campaign in a quiesced group. `listed`: a leader listed it
    /// and this replica did not agree (yet): it has a quiet leader, so only agreeing or the
    /// end of the hold ends it.
    Held {
        until: Option<Instant>,
        listed: bool,
    },
}

/// A leader's proposal, with the count of uses of the group when it was made: the leader
/// parks only if no use began since.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proposed {
    pub proposal: Proposal,
    pub(crate) uses: u64,
}

/// Which parking an operation wakes: a follower must not start ticking because a client
/// asked it for something only the leader serves (it would campaign with a stale lease).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wake {
    Leader,
    Any,
}

/// The quiescence state of one group on this node.
pub(crate) struct Quiet {
    state: Mutex<QuietState>,
}

pub(crate) struct QuietState {
    /// Operations running on the group now.
    pub(crate) in_flight: u32,
    /// Operations begun since the group started.
    pub(crate) uses: u64,
    /// When the last operation ended (or began, while one runs; or the group started).
    pub(crate) last_used: Instant,
    pub(crate) parked: Option<Parked>,
}

impl Quiet {
    pub(crate) fn new() -> Quiet {
        Quiet {
            state: Mutex::new(QuietState {
                in_flight: 0,
                uses: 0,
                last_used: Instant::now(),
                parked: None,
            }),
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, QuietState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
