//! A group's quiescence on this node: whether its openraft ticker is parked (no heartbeats,
//! no election timeouts) and why, and the operations on the group that keep it awake. Every
//! operation on a group (`write`, `read_barrier` for linearizable and lease reads, `split`,
//! `change_replicas`, `transfer_leader`, `elect`) starts with `begin_use`, which wakes a
//! parked leader first, so no caller can forget to. Followers park and wake on the node's word
//! (`agree`, `unpark_if`): a leader's heartbeat listing or no longer listing the group, a
//! peer's Raft message, the leader's silence. The decisions are pure (`quiescence.rs`); the
//! state they read and change is `quiet_state.rs`. Knows nothing of heartbeats or the network.

use std::time::{Duration, Instant};

use keel_storage::raft_types::TypeConfig;
use keel_types::{NodeId, QuietRange};
use openraft::RaftMetrics;
use openraft::async_runtime::WatchReceiver;
use tracing::debug;

use crate::group::RaftGroup;
use crate::quiescence::{self, FollowerView, LeaderView};
use crate::quiet_state::{Parked, Proposed, QuietState, Wake};
use crate::replicas::membership_view;
use crate::role::Role;

/// One operation on a group; the group counts as used until it is dropped.
pub(crate) struct Use<'a> {
    group: &'a RaftGroup,
    /// The operation woke a parked leader: its lease lapsed while it was quiet.
    pub woke_leader: bool,
}

impl Drop for Use<'_> {
    fn drop(&mut self) {
        let mut state = self.group.quiet.lock();
        state.in_flight -= 1;
        state.last_used = Instant::now();
    }
}

impl RaftGroup {
    /// Why this group's ticker is parked, if it is.
    pub fn parked(&self) -> Option<Parked> {
        self.quiet.lock().parked
    }

    /// Whether the group is quiesced here: parked as its leader or as a follower that agreed.
    pub fn is_quiesced(&self) -> bool {
        matches!(
            self.parked(),
            Some(Parked::Leader { .. } | Parked::Follower { .. })
        )
    }

    /// The last log index applied here, as openraft reports it (no storage read): the
    /// state machine changes only when it grows (an apply, a snapshot installed).
    pub fn applied_index(&self) -> u64 {
        let metrics = self.raft().metrics();
        let metrics = metrics.borrow_watched();
        metrics.last_applied.as_ref().map_or(0, |id| id.index)
    }

    /// The proposal this replica makes for its group if it leads it and the group may go
    /// quiet (`quiescence::proposal`), or stays quiet: a parked leader proposes the same
    /// range again as long as nothing changed. `quiesce_after` of zero: never.
    pub fn quiet_proposal(&self, quiesce_after: Duration) -> Option<Proposed> {
        let state = self.quiet.lock();
        let metrics = self.raft().metrics();
        let view = self.leader_view(&metrics.borrow_watched(), &state);
        let proposal = quiescence::proposal(&view, quiesce_after)?;
        Some(Proposed {
            proposal,
            uses: state.uses,
        })
    }

    /// Parks the ticker of this replica, the leader, once every follower agreed to
    /// `proposed`: only if no operation began since it was proposed and the group still
    /// stands as proposed. Returns whether the group is parked as that leader now.
    pub fn park_as_leader(&self, proposed: &Proposed) -> bool {
        let quiet = proposed.proposal.quiet;
        let mut state = self.quiet.lock();
        if state.parked == Some(Parked::Leader { quiet }) {
            return true;
        }
        let metrics = self.raft().metrics();
        let view = self.leader_view(&metrics.borrow_watched(), &state);
        let unchanged = quiescence::settled(&view).is_some_and(|now| now == proposed.proposal);
        if state.uses != proposed.uses || state.parked.is_some() || !unchanged {
            return false;
        }
        state.parked = Some(Parked::Leader { quiet });
        self.raft().runtime_config().tick(false);
        debug!(range_id = self.range().0, ?quiet, "quiesced as leader");
        true
    }

    /// A leader's heartbeat lists this group as quiet: parks the ticker if this replica
    /// agrees (`quiescence::agrees`) and returns whether it does. A follower parked before
    /// that no longer agrees wakes; a group held at start stays held (the leader, told of the
    /// disagreement, wakes and catches it up); a parked leader is left alone.
    pub fn agree(&self, from: NodeId, listed: &QuietRange) -> bool {
        let mut state = self.quiet.lock();
        let view = follower_view(&self.raft().metrics().borrow_watched());
        if quiescence::agrees(listed, from, &view) {
            let parked = Parked::Follower {
                leader: from,
                quiet: *listed,
            };
            if state.parked != Some(parked) {
                state.parked = Some(parked);
                self.raft().runtime_config().tick(false);
                debug!(range_id = self.range().0, leader = from, quiet = ?listed, "quiesced as follower");
            }
            return true;
        }
        match state.parked {
            Some(Parked::Follower { .. }) => {
                state.parked = None;
                self.raft().runtime_config().tick(true);
                debug!(range_id = self.range().0, leader = from, quiet = ?listed, "woke: no longer agrees");
            }
            Some(Parked::Held { until, .. }) => {
                state.parked = Some(Parked::Held {
                    until,
                    listed: true,
                });
            }
            _ => {}
        }
        false
    }

    /// Parks the ticker until `start_hold_clock` and the hold's end, unless it is parked
    /// already: for a group the node starts from its store, whose leader may list it as
    /// quiet.
    pub fn hold(&self) {
        let mut state = self.quiet.lock();
        if state.parked.is_none() {
            state.parked = Some(Parked::Held {
                until: None,
                listed: false,
            });
            self.raft().runtime_config().tick(false);
        }
    }

    /// A held group's hold ends at `until` (the node serves now, so leaders can reach it).
    pub fn start_hold_clock(&self, until: Instant) {
        let mut state = self.quiet.lock();
        if let Some(Parked::Held {
            until: None,
            listed,
        }) = state.parked
        {
            state.parked = Some(Parked::Held {
                until: Some(until),
                listed,
            });
        }
    }

    /// Unparks the ticker if its parking satisfies `wakes`; returns whether it did.
    pub fn unpark_if(&self, why: &str, wakes: impl FnOnce(&Parked) -> bool) -> bool {
        let mut state = self.quiet.lock();
        match state.parked {
            Some(parked) if wakes(&parked) => {
                state.parked = None;
                self.raft().runtime_config().tick(true);
                debug!(range_id = self.range().0, ?parked, why, "woke");
                true
            }
            _ => false,
        }
    }

    /// Begins an operation on the group. A parked leader (or, with `Wake::Any`, any parked
    /// replica) starts ticking again first, and a woken leader sends a heartbeat round at
    /// once, so its followers hear from it before its heartbeats stop listing the group.
    pub(crate) async fn begin_use(&self, wake: Wake) -> Use<'_> {
        let woke = {
            let mut state = self.quiet.lock();
            state.in_flight += 1;
            state.uses += 1;
            state.last_used = Instant::now();
            let woke = match (state.parked, wake) {
                (Some(parked @ Parked::Leader { .. }), _) | (Some(parked), Wake::Any) => {
                    Some(parked)
                }
                _ => None,
            };
            if woke.is_some() {
                state.parked = None;
                self.raft().runtime_config().tick(true);
            }
            woke
        };
        let woke_leader = matches!(woke, Some(Parked::Leader { .. }));
        if let Some(parked) = woke {
            debug!(range_id = self.range().0, ?parked, "woke for an operation");
        }
        if woke_leader && let Err(error) = self.raft().trigger().heartbeat().await {
            debug!(range_id = self.range().0, %error, "heartbeat after waking");
        }
        Use {
            group: self,
            woke_leader,
        }
    }

    fn leader_view(&self, metrics: &RaftMetrics<TypeConfig>, state: &QuietState) -> LeaderView {
        let membership = membership_view(metrics);
        let matched = metrics.replication.as_ref().map(|replication| {
            replication
                .iter()
                .map(|(node, matched)| (*node, matched.as_ref().map(|id| id.index)))
                .collect()
        });
        LeaderView {
            range: self.range(),
            node: self.node_id(),
            role: Role::of(metrics.state, metrics.running_state.is_ok()),
            leader: metrics.current_leader,
            term: metrics.current_term,
            last_log_index: metrics.last_log_index.unwrap_or(0),
            committed_index: metrics.cluster_committed.as_ref().map_or(0, |id| id.index),
            applied_index: metrics.last_applied.as_ref().map_or(0, |id| id.index),
            voters: membership.voters,
            learners: membership.learners,
            joint: membership.joint,
            matched: matched.unwrap_or_default(),
            uses_in_flight: state.in_flight,
            idle: state.last_used.elapsed(),
        }
    }
}

fn follower_view(metrics: &RaftMetrics<TypeConfig>) -> FollowerView {
    FollowerView {
        role: Role::of(metrics.state, metrics.running_state.is_ok()),
        leader: metrics.current_leader,
        term: metrics.current_term,
        last_log_index: metrics.last_log_index.unwrap_or(0),
        committed_index: metrics.local_committed.as_ref().map_or(0, |id| id.index),
        applied_index: metrics.last_applied.as_ref().map_or(0, |id| id.index),
    }
}
