//! Quiescence of idle groups, the node's part. openraft does not coalesce heartbeats: every
//! group's leader would send each follower one every `heartbeat_ms`, and every replica ticks
//! (about every 30 ms) for elections. So groups nobody uses go quiet: every replica parks its
//! ticker, and the node-level heartbeat (`heartbeat.rs`, one per peer per second) stands in
//! for all of them as the failure detector. Decisions are pure (`keel_raft::quiescence`); the
//! parked state lives in each `RaftGroup` (`keel_raft::Parked`). Knows nothing of gRPC.
//!
//! - **Proposal.** Each heartbeat round, the groups this node leads that its leader replica
//!   has not used for `RaftTimings::quiesce_after_ms` (3 s), whose log is committed, applied
//!   and matched on every member, with no learner and no joint configuration, are listed
//!   (range, term, last log index) in the heartbeat to each node holding a follower of them
//!   (`Round`). The leader parks its own ticker only once every follower agreed in the same
//!   round, and only if the group was not used meanwhile. While quiesced it keeps listing the
//!   range to those followers, so that a follower that restarted parks again, and a follower
//!   notices the leader woke when the range disappears from the list.
//! - **Agreement.** A follower node agrees to a listed range when its replica follows that
//!   leader in that term and holds, committed and applied, the same last log index; it parks
//!   the group's ticker and says so in its heartbeat answer (`answer`). A parked follower
//!   that no longer agrees wakes; the leader, told a follower answered without agreeing,
//!   wakes too (not counted as a use), and proposes again once the follower caught up.
//! - **Waking.** Any use of a group on its leader wakes it first (`RaftGroup::begin_use`),
//!   and a woken leader sends a heartbeat round at once. A follower wakes on any Raft message
//!   for the group from a peer but the quiet leader's empty heartbeats (`keel_raft::Groups`),
//!   when the leader's heartbeat stops listing the group, and when the leader node fell
//!   silent: its pings (`heartbeat::ping`, every 200 ms) have been missing for
//!   `PING_SILENT_MS` (800 ms), or, from a release before pings, its heartbeats for 2.5 s.
//!   Then every group quiet under that leader wakes and elects as usual (`watch`), each
//!   after its own extra wait (`wake_delay`: up to one shortest election timeout, different
//!   on each follower) so that two followers of a range do not campaign together and split
//!   the vote. A node that was itself stalled (a pause, a long scheduling delay) judges no
//!   silence until pings had time to arrive again: what went missing was its own hearing.
//! - **Failover cost.** A quiesced range whose leader dies starts an election 0.8–1.1 s after
//!   the leader's last ping with the default timings, about when an awake range's follower
//!   would (0.9–1.2 s after the last Raft heartbeat): the followers' leader leases ran out
//!   long ago, so a woken follower campaigns at its first tick.
//! - **Safety.** Quiescence only parks timers. Writes still go through Raft. A quiesced
//!   leader's lease has lapsed, so a lease read falls back to ReadIndex (a quorum round) and a
//!   write renews the lease with one first; a stale leader therefore cannot serve.
//! - **Restart.** A node starts the groups of its store held (`Parked::Held`): their tickers
//!   wait, for at most `RESTART_HOLD_MS` (2 heartbeat intervals) after the node serves, to
//!   learn whether the leader lists them as quiet. A group its leader lists and the replica
//!   agrees to stays parked, so a restarted follower does not campaign in an idle group; a
//!   group that gets a Raft message (an awake leader's heartbeat among them) ticks at once;
//!   the others tick when every other voter's node heartbeat has arrived since the hold
//!   began without listing them (so no voter leads them quietly), or when the hold ends. A
//!   full-cluster restart therefore elects within about a heartbeat interval of its last node
//!   serving, plus an election. Measured with 1,000 quiesced ranges: a restarted node started
//!   no election (the ranges it led failed over while it was down, as above).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use keel_raft::{Parked, Proposed, RaftGroup, quiescence, wire};
use keel_types::{NodeId, QuietRange, RangeId, limits};
use tokio::time::MissedTickBehavior;
use tracing::{debug, info};

use crate::shared::Shared;
use crate::shared::heartbeats::{HEARTBEAT_INTERVAL_MS, PING_INTERVAL_MS, PING_SILENT_MS};

/// Longest a group started from the store stays held after the node serves.
pub(crate) const RESTART_HOLD_MS: u64 = 2 * HEARTBEAT_INTERVAL_MS;
/// How often the watcher looks for silent leaders and ended holds.
const WATCH_INTERVAL_MS: u64 = PING_INTERVAL_MS / 2;
/// The watcher records who leads the local groups every this many rounds (300 ms).
const OBSERVE_EVERY_ROUNDS: u64 = 3;
/// A watcher round this late behind the previous one means the node itself was stalled.
const STALLED_AFTER_MS: u64 = 2 * PING_INTERVAL_MS;
/// After a stall, silence is judged again only once this much time passed: a ping from
/// each live peer has arrived by then.
const HEAR_AGAIN_MS: u64 = 2 * PING_INTERVAL_MS;

/// One heartbeat round's quiescence: the proposals of the groups this node leads, and what
/// each peer's heartbeat lists.
#[derive(Default)]
pub(crate) struct Round {
    proposals: Vec<(Arc<RaftGroup>, Proposed)>,
    listed: BTreeMap<NodeId, Vec<QuietRange>>,
}

impl Round {
    /// Proposes every group this node leads that may go (or stay) quiet. A parked leader
    /// that may no longer (it lost leadership, its membership changed) wakes.
    pub fn plan(shared: &Shared) -> Round {
        let mut round = Round::default();
        let quiesce_after = Duration::from_millis(shared.timings.quiesce_after_ms);
        for group in shared.groups.all() {
            let Some(proposed) = group.quiet_proposal(quiesce_after) else {
                group.unpark_if("no longer settled", |parked| {
                    matches!(parked, Parked::Leader { .. })
                });
                continue;
            };
            let followers = &proposed.proposal.followers;
            let room = followers.iter().all(|node| {
                round.listed.get(node).map_or(0, Vec::len) < limits::HEARTBEAT_QUIET_RANGES_MAX
            });
            if !room {
                continue;
            }
            for node in followers {
                let listed = round.listed.entry(*node).or_default();
                listed.push(proposed.proposal.quiet);
            }
            round.proposals.push((group, proposed));
        }
        round
    }

    /// What the heartbeat to `node` lists.
    pub fn listed_for(&self, node: NodeId) -> &[QuietRange] {
        self.listed.get(&node).map_or(&[], Vec::as_slice)
    }

    /// Parks the leader of every proposal all of whose followers agreed in `answers` (by
    /// node: the ranges it agreed to; a node that did not answer is absent). A parked leader
    /// some follower answered without agreeing to wakes.
    pub fn settle(&self, answers: &BTreeMap<NodeId, BTreeSet<QuietRange>>) {
        let mut parked = 0usize;
        for (group, proposed) in &self.proposals {
            let quiet = proposed.proposal.quiet;
            let agreed_by: BTreeSet<NodeId> = answers
                .iter()
                .filter(|(_, agreed)| agreed.contains(&quiet))
                .map(|(node, _)| *node)
                .collect();
            if quiescence::all_agreed(&proposed.proposal, &agreed_by) {
                if group.park_as_leader(proposed) {
                    parked += 1;
                }
                continue;
            }
            let refused = proposed
                .proposal
                .followers
                .iter()
                .any(|node| answers.contains_key(node) && !agreed_by.contains(node));
            if refused {
                group.unpark_if("a follower did not agree", |parked| {
                    *parked == Parked::Leader { quiet }
                });
            }
        }
        debug!(
            proposed = self.proposals.len(),
            parked, "quiescence round settled"
        );
    }
}

/// A leader's heartbeat from `from` listed `listed`: parks every listed group whose replica
/// here agrees, and returns those. A group kept quiet under `from` that it no longer lists
/// wakes: the leader woke it. A held group no leader has listed wakes once every other voter
/// of it has been heard since the hold began: none of them leads it quietly (a quiet leader
/// lists it in every heartbeat), so there is nothing to wait for. The caller records a
/// heartbeat as heard only after this answered it, so a voter counts as heard only once its
/// list has been looked at.
pub(crate) fn answer(shared: &Shared, from: NodeId, listed: &[QuietRange]) -> Vec<QuietRange> {
    let mut agreed = Vec::new();
    let mut named = BTreeSet::new();
    for quiet in listed.iter().take(limits::HEARTBEAT_QUIET_RANGES_MAX) {
        named.insert(quiet.range);
        let Some(group) = shared.groups.get(quiet.range) else {
            continue;
        };
        if group.agree(from, quiet) {
            agreed.push(*quiet);
        }
    }
    let seen = shared.heartbeats.last_seen();
    let hold = Duration::from_millis(RESTART_HOLD_MS);
    for group in shared.groups.all() {
        if named.contains(&group.range()) {
            continue;
        }
        let heard_since = |start: Instant| {
            group
                .members()
                .iter()
                .filter(|member| member.voter && member.id != shared.node_id && member.id != from)
                .all(|voter| seen.get(&voter.id).is_some_and(|at| *at >= start))
        };
        group.unpark_if(
            "its leader no longer lists it, or every voter was heard without listing it",
            |parked| match parked {
                Parked::Follower { leader, .. } => *leader == from,
                Parked::Held {
                    until: Some(until),
                    listed: false,
                } => heard_since(*until - hold),
                _ => false,
            },
        );
    }
    agreed
}

/// Holds `group`, started from the node's store, until the hold clock starts (unless
/// quiescence is off).
pub(crate) fn hold(shared: &Shared, group: &RaftGroup) {
    if shared.timings.quiesce_after_ms > 0 {
        group.hold();
    }
}

/// Starts the hold clock of the held groups: the node serves now.
pub(crate) fn start_hold_clock(shared: &Shared) {
    let until = Instant::now() + Duration::from_millis(RESTART_HOLD_MS);
    for group in shared.groups.all() {
        group.start_hold_clock(until);
    }
}

/// Runs until the node shuts down (the task is aborted then): wakes the groups quiet under a
/// leader whose node fell silent, and the held groups whose hold ended. Every few rounds it
/// also tells the node's recent events who leads its groups now (reading every group's
/// leader costs more than the wake check, and the console needs it less often).
pub(crate) async fn watch(shared: Arc<Shared>) {
    let mut tick = tokio::time::interval(Duration::from_millis(WATCH_INTERVAL_MS));
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut hearing = Hearing::new(Instant::now());
    for round in 0u64.. {
        tick.tick().await;
        let now = Instant::now();
        wake_overdue(&shared, now, hearing.judges(now));
        if round % OBSERVE_EVERY_ROUNDS == 0 {
            observe_leaders(&shared);
        }
    }
}

/// Whether this node may judge its peers silent: not right after it was stalled itself.
struct Hearing {
    last_round: Instant,
    judge_from: Instant,
}

impl Hearing {
    fn new(now: Instant) -> Hearing {
        Hearing {
            last_round: now,
            judge_from: now,
        }
    }

    /// Called each watcher round: whether silence may be judged at `now`.
    fn judges(&mut self, now: Instant) -> bool {
        if now.saturating_duration_since(self.last_round) >= Duration::from_millis(STALLED_AFTER_MS)
        {
            self.judge_from = now + Duration::from_millis(HEAR_AGAIN_MS);
        }
        self.last_round = now;
        now >= self.judge_from
    }
}

/// How much longer than `PING_SILENT_MS` this node's replica of `range` waits before it wakes
/// under a silent leader: spread over `[0, spread)` by node and range, so that the followers
/// of a range wake apart (each range's order differs, so no node always campaigns first).
fn wake_delay(node: NodeId, range: RangeId, spread: Duration) -> Duration {
    let spread_ms = spread.as_millis().max(1) as u64;
    // splitmix64's finalizer: nearby ids land far apart.
    let mut mixed = node.rotate_left(32) ^ range.0;
    mixed = (mixed ^ (mixed >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    mixed = (mixed ^ (mixed >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    mixed ^= mixed >> 31;
    Duration::from_millis(mixed % spread_ms)
}

/// Records the leaders of the local groups that know one in the node's recent events.
fn observe_leaders(shared: &Shared) {
    let leaders: Vec<(RangeId, u64, NodeId)> = shared
        .groups
        .all()
        .iter()
        .filter_map(|group| Some((group.range(), group.term(), group.leader()?.0)))
        .collect();
    shared
        .events
        .observe_leaders(shared.clock.now_ms(), &leaders);
}

/// Wakes the held groups whose hold ended and, when `judge_silence`, the groups quiet under
/// a leader whose node fell silent.
fn wake_overdue(shared: &Shared, now: Instant, judge_silence: bool) {
    let heard = shared.heartbeats.last_heard();
    let spread = Duration::from_millis(shared.timings.election_timeout_ms_min);
    let mut woken: BTreeMap<NodeId, usize> = BTreeMap::new();
    for group in shared.groups.all() {
        let delay = wake_delay(shared.node_id, group.range(), spread);
        let mut under = None;
        group.unpark_if(
            "its leader's node fell silent or its hold ended",
            |parked| match parked {
                Parked::Follower { leader, .. }
                    if judge_silence && heard.silent(*leader, now, delay) =>
                {
                    under = Some(*leader);
                    true
                }
                Parked::Held {
                    until: Some(until), ..
                } => now >= *until,
                _ => false,
            },
        );
        if let Some(leader) = under {
            *woken.entry(leader).or_default() += 1;
        }
    }
    for (leader, groups) in woken {
        info!(
            leader,
            groups,
            silent_ms = PING_SILENT_MS,
            "leader node silent; waking the groups quiesced under it"
        );
    }
}

/// Encodes a list of quiet ranges for a heartbeat: no bytes for none (what a release
/// without quiescence sends), else the format-versioned list.
pub(crate) fn encode(quiet: &[QuietRange]) -> Result<Vec<u8>, wire::WireError> {
    if quiet.is_empty() {
        return Ok(Vec::new());
    }
    wire::encode(&quiet)
}

/// Decodes what `encode` made; more than `limits::HEARTBEAT_QUIET_RANGES_MAX` ranges is
/// malformed.
pub(crate) fn decode(bytes: &[u8]) -> Result<Vec<QuietRange>, wire::WireError> {
    if bytes.is_empty() {
        return Ok(Vec::new());
    }
    let quiet: Vec<QuietRange> = wire::decode(bytes)?;
    if quiet.len() > limits::HEARTBEAT_QUIET_RANGES_MAX {
        return Err(wire::WireError::Decode(format!(
            "{} quiet ranges; limit is {}",
            quiet.len(),
            limits::HEARTBEAT_QUIET_RANGES_MAX
        )));
    }
    Ok(quiet)
}

#[cfg(test)]
mod tests {
    use keel_types::RangeId;

    use super::*;

    #[test]
    fn a_node_judges_no_silence_right_after_its_own_stall() {
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        let mut hearing = Hearing::new(start);
        assert!(hearing.judges(at(WATCH_INTERVAL_MS)));
        assert!(hearing.judges(at(2 * WATCH_INTERVAL_MS)));
        // A round late by a stall: nothing is judged until pings had time to arrive.
        let resumed = 2 * WATCH_INTERVAL_MS + 5_000;
        assert!(!hearing.judges(at(resumed)));
        assert!(!hearing.judges(at(resumed + HEAR_AGAIN_MS - 1)));
        assert!(hearing.judges(at(resumed + HEAR_AGAIN_MS)));
        // A round somewhat late is no stall.
        let late = resumed + HEAR_AGAIN_MS + STALLED_AFTER_MS - 1;
        assert!(hearing.judges(at(late)));
    }

    #[test]
    fn followers_of_a_range_wake_apart_within_the_spread() {
        let spread = Duration::from_millis(300);
        let mut apart = 0;
        for range in 0..200 {
            let delays: Vec<Duration> = (1..=3)
                .map(|node| wake_delay(node, RangeId(range), spread))
                .collect();
            assert!(delays.iter().all(|delay| *delay < spread), "{delays:?}");
            let min_gap = (0..3)
                .flat_map(|i| (i + 1..3).map(move |j| (i, j)))
                .map(|(i, j)| delays[i].abs_diff(delays[j]))
                .min()
                .unwrap();
            if min_gap >= Duration::from_millis(10) {
                apart += 1;
            }
        }
        // Uniform draws: three followers are 10 ms apart about 81% of the time.
        assert!(
            apart > 140,
            "{apart} of 200 ranges had followers 10 ms apart"
        );
        // The same node and range always wait the same.
        assert_eq!(
            wake_delay(2, RangeId(7), spread),
            wake_delay(2, RangeId(7), spread)
        );
    }

    #[test]
    fn quiet_lists_round_trip_and_none_is_no_bytes() {
        assert_eq!(encode(&[]).unwrap(), Vec::<u8>::new());
        assert_eq!(decode(&[]).unwrap(), Vec::new());
        let quiet = vec![
            QuietRange {
                range: RangeId(7),
                term: 3,
                last_log_index: 41,
            },
            QuietRange {
                range: RangeId(9),
                term: 1,
                last_log_index: 2,
            },
        ];
        let bytes = encode(&quiet).unwrap();
        assert_eq!(bytes[0], wire::FORMAT_VERSION);
        assert_eq!(decode(&bytes).unwrap(), quiet);
        let too_many = vec![quiet[0]; limits::HEARTBEAT_QUIET_RANGES_MAX + 1];
        assert!(decode(&wire::encode(&too_many).unwrap()).is_err());
    }
}
