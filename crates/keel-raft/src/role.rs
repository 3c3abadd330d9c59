//! A replica's role in its group (`Role`), read from openraft's server state. A leaf: names
//! no other module of this crate, so the pure quiescence decisions and `RaftGroup` can both
//! use it.

use openraft::ServerState;

/// A replica's role in its group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Leader,
    Follower,
    Candidate,
    Learner,
    Stopped,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Leader => "leader",
            Role::Follower => "follower",
            Role::Candidate => "candidate",
            Role::Learner => "learner",
            Role::Stopped => "stopped",
        }
    }

    /// The role of a replica in openraft's `state`; `Stopped` unless its Raft is `running`.
    pub(crate) fn of(state: ServerState, running: bool) -> Role {
        if !running {
            return Role::Stopped;
        }
        match state {
            ServerState::Leader => Role::Leader,
            ServerState::Candidate => Role::Candidate,
            ServerState::Learner => Role::Learner,
            ServerState::Follower => Role::Follower,
            ServerState::Shutdown => Role::Stopped,
        }
    }
}
