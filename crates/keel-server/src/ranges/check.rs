//! Consistency checks on the leader's side (`keel_types::check` judges, keel-storage
//! hashes). A check of a range proposes `Command::Check` through its log, collects every
//! voter's digest at the check's log index (its own from storage, the others' through
//! `Raft/RangeDigest`), and judges them. When a majority agrees and some replicas differ, it
//! proposes a locating check of the buckets they differ in (at most
//! `CHECK_LOCATE_BUCKETS_MAX`) and names the rows. The report goes to the node's records
//! (`shared::checks`: alarms, counts) and the log. A replica that differs in both checks is
//! re-created from the majority (`replicas::recreate`), and the range checked again; a
//! leader that differs hands its leadership to the majority, whose check repairs it. With
//! no majority a data range is held (`Command::Hold`: it serves nothing) until a check finds
//! a majority again.
//!
//! `run` checks each range this node leads once per `--consistency-check-interval-ms`, one
//! range at a time; a range first falls due at an offset within the interval drawn from the
//! node and range ids, so checks spread over the interval. It looks for due ranges once per
//! interval, at most `CHECK_SCAN_MS_MAX` apart. Knows nothing of gRPC services.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use futures::future::join_all;
use keel_raft::RaftGroup;
use keel_types::check::{divergent_buckets, divergent_rows, judge};
use keel_types::planted::{self, PlantedBug};
use keel_types::{
    Check, CheckReport, Command, CommandOutcome, Hold, KvError, NodeAddr, NodeId, RangeId,
    ReplicaAnswer, ReplicaCheck, Verdict, limits,
};
use serde::{Deserialize, Serialize};
use tracing::{debug, error, info, warn};

use crate::peer::call::{PeerCall, pause_before};
use crate::ranges::replicas::{self, leading_group};
use crate::shared::Shared;

/// What `Raft/CheckRange` asks (nothing yet: the range is the message's).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub(crate) struct CheckQuery {}

/// How long one peer call of a check may take: the digest wait and a margin.
pub(crate) fn digest_deadline() -> Duration {
    Duration::from_millis(limits::CHECK_WAIT_MS + 5_000)
}

/// How long a whole check may take on its leader: two rounds of digests and margins.
pub(crate) fn check_deadline() -> Duration {
    2 * digest_deadline() + Duration::from_secs(10)
}

/// Checks `range` now, on this node if it leads the range (`NotLeader` naming the leader
/// otherwise), records the report, repairs what a divergent verdict found (`repair`), holds
/// a range whose replicas have no majority (`hold`), and releases a held range once a check
/// finds a majority again.
pub(crate) async fn check_range(shared: &Shared, range: RangeId) -> Result<CheckReport, KvError> {
    let group = leading_group(shared, range)?;
    let checked = check_led(shared, &group).await;
    let (mut report, confirmed) = match checked {
        Ok(checked) => checked,
        Err(error) => {
            if !matches!(error, KvError::NotLeader { .. }) {
                shared.checks.failed();
                warn!(%range, %error, "consistency check could not finish");
            }
            return Err(error);
        }
    };
    shared.checks.record(&report);
    log_report(&report);
    match report.verdict {
        Verdict::NoMajority => report.repair_note = hold(&group, report.index).await,
        Verdict::Divergent => repair(shared, &group, &mut report, &confirmed).await,
        Verdict::Consistent | Verdict::Unconfirmed => {}
    }
    // A majority agrees again (the operator replaced replicas): a held range serves again.
    let majority = matches!(report.verdict, Verdict::Consistent | Verdict::Divergent);
    if majority && group.state_machine().hold().is_some() {
        let released = propose_hold(&group, None).await;
        let note = match released {
            Ok(()) => "a majority agrees again: the range serves again".to_string(),
            Err(error) => format!("releasing the range's hold: {error}"),
        };
        report.repair_note = match report.repair_note.is_empty() {
            true => note,
            false => format!("{}; {note}", report.repair_note),
        };
    }
    Ok(report)
}

/// No majority of the range's replicas agree, so none can be trusted to answer: the range
/// stops serving (a held range refuses client commands and reads on every replica) until a
/// check finds a majority again. The meta range is never held: the cluster's operations
/// (and the repair) need it. Returns what happened.
async fn hold(group: &RaftGroup, index: u64) -> String {
    let range = group.range();
    if range == RangeId::META {
        return "the meta range is never held; it goes on serving".to_string();
    }
    if group.state_machine().hold().is_some() {
        return "the range is held".to_string();
    }
    match propose_hold(group, Some(Hold { index })).await {
        Ok(()) => {
            error!(%range, index, "no majority of the replicas agree: the range is held");
            "no majority agrees: the range is held (serves nothing) until a check finds one"
                .to_string()
        }
        Err(error) => format!("holding the range: {error}"),
    }
}

/// Proposes `Command::Hold(hold)` and waits until it applied here.
async fn propose_hold(group: &RaftGroup, hold: Option<Hold>) -> Result<(), KvError> {
    match group.write(Command::Hold(hold)).await? {
        CommandOutcome::Internal => Ok(()),
        CommandOutcome::Rejected(rejection) => Err(rejection.into()),
        other => Err(KvError::Fatal {
            message: format!("a hold was answered {}", other.kind()),
        }),
    }
}

/// Repairs the replicas `confirmed` (divergent in a check and again in the check after it)
/// and checks the range again. A minority never overwrites a majority: only replicas that
/// differ from a majority of the voters are touched. When this leader is one of them it
/// hands its leadership to a voter of the majority, which checks again and repairs it.
async fn repair(
    shared: &Shared,
    group: &RaftGroup,
    report: &mut CheckReport,
    confirmed: &[NodeId],
) {
    let range = group.range();
    if confirmed.is_empty() {
        report.repair_note = "the replicas that differed agreed at the next check".to_string();
        return;
    }
    if planted::active(PlantedBug::SkipRepair) {
        report.repair_note = "planted bug skip-repair: left as it is".to_string();
        return;
    }
    if confirmed.contains(&shared.node_id) {
        report.repair_note = hand_over(shared, group, report).await;
        return;
    }
    let members = group.members();
    for node in confirmed {
        let Some(member) = members.iter().find(|member| member.id == *node) else {
            continue;
        };
        error!(%range, node, "re-creating a replica that differs from the majority");
        match replicas::recreate(shared, range, *node, &member.addr).await {
            Ok(after) => {
                info!(%range, node, %after, "replica re-created from the majority");
                report.repaired.push(*node);
            }
            Err(error) => {
                warn!(%range, node, %error, "re-creating a divergent replica failed");
                report.repair_note = format!("re-creating node {node}'s replica: {error}");
                return;
            }
        }
    }
    // Check again, so that the alarm clears once the replicas agree.
    match check_led(shared, group).await {
        Ok((after, _)) => {
            shared.checks.record(&after);
            log_report(&after);
            report.repair_note = format!(
                "checked again at index {}: {}",
                after.index,
                after.verdict.name()
            );
        }
        Err(error) => {
            shared.checks.failed();
            report.repair_note = format!("checking again after the repair: {error}");
        }
    }
}

/// This leader's replica differs from the majority: hands the leadership to a voter of the
/// majority and has it check the range again. Returns what happened.
async fn hand_over(shared: &Shared, group: &RaftGroup, report: &CheckReport) -> String {
    let range = group.range();
    let majority = report
        .replicas
        .iter()
        .find(|replica| !report.divergent.contains(&replica.node) && replica.hash.is_some());
    let Some(to) = majority.map(|replica| replica.node) else {
        return "this leader differs and no voter of the majority is known".to_string();
    };
    error!(%range, to, "this leader's replica differs from the majority; handing leadership over");
    let term = group.term();
    if let Err(error) = group.transfer_leader(to).await {
        return format!("this leader differs; handing leadership to node {to}: {error}");
    }
    let wait = Duration::from_millis(shared.timings.write_timeout_ms);
    let Some((leader, addr)) = group.await_new_leader(term, shared.node_id, wait).await else {
        return format!("this leader differs; node {to} did not take the leadership in time");
    };
    let call = PeerCall {
        node: leader,
        addr: &addr,
        range,
        payload: &CheckQuery {},
        forward: false,
        write: false,
        deadline: check_deadline(),
    };
    let checked: Result<CheckReport, KvError> = call
        .send(
            &shared.peers,
            shared.node_id,
            |mut client, message| async move { client.check_range(message).await },
        )
        .await;
    match checked {
        Ok(after) => format!(
            "this leader differs: node {leader} took over and checked: {}, re-created {:?}",
            after.verdict.name(),
            after.repaired
        ),
        Err(error) => format!("this leader differs: node {leader} took over; its check: {error}"),
    }
}

/// Checks `range` through its leader: here if this node leads it, else on the leader this
/// node knows of (a replica there sends it on once). It rides out leadership moves, as a
/// forwarded client request does: a try refused because the leader moved, is being elected
/// or is out of reach (`NotLeader`, `Unavailable`) goes again, to the leader the refusal
/// names or else here, after a pause from the second retry on; until the forwarding
/// deadline of a read passes, when the last refusal is the answer.
pub(crate) async fn check_through_leader(
    shared: &Shared,
    range: RangeId,
) -> Result<CheckReport, KvError> {
    let deadline = Instant::now() + shared.forward_deadline(false);
    let mut pause = Duration::from_millis(limits::FORWARD_BACKOFF_MIN_MS);
    let mut checked = check_range(shared, range).await;
    let mut retries = 0;
    while let Err(KvError::NotLeader { .. } | KvError::Unavailable { .. }) = &checked {
        if retries > 0 && !pause_before(&mut pause, deadline).await {
            break;
        }
        retries += 1;
        checked = match &checked {
            Err(KvError::NotLeader {
                leader: Some((node, addr)),
                ..
            }) if *node != shared.node_id => check_on(shared, range, *node, addr).await,
            _ => check_range(shared, range).await,
        };
    }
    checked
}

/// One try of a check of `range` on `node`, which this node takes for its leader.
async fn check_on(
    shared: &Shared,
    range: RangeId,
    node: NodeId,
    addr: &NodeAddr,
) -> Result<CheckReport, KvError> {
    let call = PeerCall {
        node,
        addr,
        range,
        payload: &CheckQuery {},
        forward: true,
        write: false,
        deadline: check_deadline(),
    };
    call.send(
        &shared.peers,
        shared.node_id,
        |mut client, message| async move { client.check_range(message).await },
    )
    .await
}

/// One check of the range this node leads, and the replicas that differed in it and again
/// in the locating check after it (the ones a repair may touch).
async fn check_led(
    shared: &Shared,
    group: &RaftGroup,
) -> Result<(CheckReport, Vec<NodeId>), KvError> {
    let voters = group.voter_ids();
    let index = propose(group, Vec::new()).await?;
    let answers = collect(shared, group, &voters, index).await;
    let (verdict, divergent, majority) = judge(&answers);
    let mut replicas = replica_checks(&answers);
    let mut confirmed = Vec::new();
    if let (Verdict::Divergent, Some(majority)) = (verdict, majority) {
        let mut locate = BTreeSet::new();
        for (node, answer) in &answers {
            if let (true, ReplicaAnswer::Digest(digest)) = (divergent.contains(node), answer) {
                let buckets = divergent_buckets(majority, digest);
                if let Some(replica) = replicas.iter_mut().find(|r| r.node == *node) {
                    replica.buckets_differing = buckets.len() as u32;
                }
                locate.extend(buckets);
            }
        }
        let locate: Vec<u16> = locate
            .into_iter()
            .take(limits::CHECK_LOCATE_BUCKETS_MAX)
            .collect();
        confirmed = name_rows(shared, group, &voters, &divergent, locate, &mut replicas).await?;
    }
    let rows = match answers.get(&shared.node_id) {
        Some(ReplicaAnswer::Digest(digest)) => digest.rows,
        _ => 0,
    };
    let report = CheckReport {
        range: group.range(),
        index,
        verdict,
        replicas,
        divergent,
        checked_at_ms: shared.clock.now_ms(),
        rows,
        leader: shared.node_id,
        repaired: Vec::new(),
        repair_note: String::new(),
    };
    Ok((report, confirmed))
}

/// Runs a locating check of `locate` and puts the rows each divergent replica differs in
/// into its part of the report. The state may have moved on since the first check: the rows
/// are those that differ at the locating check's index. Returns the replicas of `divergent`
/// that differ from the majority again.
async fn name_rows(
    shared: &Shared,
    group: &RaftGroup,
    voters: &[NodeId],
    divergent: &[NodeId],
    locate: Vec<u16>,
    replicas: &mut [ReplicaCheck],
) -> Result<Vec<NodeId>, KvError> {
    let index = propose(group, locate).await?;
    let answers = collect(shared, group, voters, index).await;
    let (Verdict::Divergent, again, Some(majority)) = judge(&answers) else {
        return Ok(Vec::new());
    };
    for replica in replicas.iter_mut() {
        if let (true, Some(ReplicaAnswer::Digest(digest))) = (
            divergent.contains(&replica.node),
            answers.get(&replica.node),
        ) {
            replica.rows = divergent_rows(majority, digest);
        }
    }
    Ok(divergent
        .iter()
        .copied()
        .filter(|node| again.contains(node))
        .collect())
}

/// Proposes a check (locating `locate`) and returns its log index once applied here.
async fn propose(group: &RaftGroup, locate: Vec<u16>) -> Result<u64, KvError> {
    match group.write(Command::Check(Check { locate })).await? {
        CommandOutcome::Checked { index } => Ok(index),
        CommandOutcome::Rejected(rejection) => Err(rejection.into()),
        other => Err(KvError::Fatal {
            message: format!("a consistency check was answered {}", other.kind()),
        }),
    }
}

/// Every voter's answer for the check at `index`, asked at once.
async fn collect(
    shared: &Shared,
    group: &RaftGroup,
    voters: &[NodeId],
    index: u64,
) -> BTreeMap<NodeId, ReplicaAnswer> {
    let wait = Duration::from_millis(limits::CHECK_WAIT_MS);
    let range = group.range();
    let asks = voters.iter().map(|node| async move {
        let answer = match *node == shared.node_id {
            true => group.state_machine().digest(index, wait).await,
            false => ask_digest(shared, *node, range, index).await,
        };
        (*node, answer)
    });
    join_all(asks).await.into_iter().collect()
}

async fn ask_digest(shared: &Shared, node: NodeId, range: RangeId, index: u64) -> ReplicaAnswer {
    let Some(addr) = shared.node_addr(node) else {
        return ReplicaAnswer::NoDigest(format!("node {node} has no known address"));
    };
    let call = PeerCall {
        node,
        addr: &addr,
        range,
        payload: &index,
        forward: false,
        write: false,
        deadline: digest_deadline(),
    };
    let asked = call
        .send(
            &shared.peers,
            shared.node_id,
            |mut client, message| async move { client.range_digest(message).await },
        )
        .await;
    asked.unwrap_or_else(|error| ReplicaAnswer::NoDigest(format!("asking node {node}: {error}")))
}

/// This replica's answer for the check of `range` at `index` (`Raft/RangeDigest`).
pub(crate) async fn local_digest(shared: &Shared, range: RangeId, index: u64) -> ReplicaAnswer {
    match shared.groups.get(range) {
        Some(group) => {
            let wait = Duration::from_millis(limits::CHECK_WAIT_MS);
            group.state_machine().digest(index, wait).await
        }
        None => ReplicaAnswer::NoDigest(format!(
            "node {} holds no replica of range {range}",
            shared.node_id
        )),
    }
}

fn replica_checks(answers: &BTreeMap<NodeId, ReplicaAnswer>) -> Vec<ReplicaCheck> {
    let check = |(node, answer): (&NodeId, &ReplicaAnswer)| {
        let (hash, problem) = match answer {
            ReplicaAnswer::Digest(digest) => (Some(digest.hash), None),
            ReplicaAnswer::Unreadable(why) => (None, Some(format!("unreadable: {why}"))),
            ReplicaAnswer::NoDigest(why) => (None, Some(format!("no digest: {why}"))),
        };
        ReplicaCheck {
            node: *node,
            hash,
            problem,
            rows: Vec::new(),
            buckets_differing: 0,
        }
    };
    answers.iter().map(check).collect()
}

fn log_report(report: &CheckReport) {
    let (range, index, verdict) = (report.range, report.index, report.verdict.name());
    if !report.verdict.is_alarm() {
        debug!(%range, index, verdict, rows = report.rows, "consistency check");
        return;
    }
    for replica in &report.replicas {
        let rows: Vec<String> = replica.rows.iter().map(ToString::to_string).collect();
        error!(
            %range, index, verdict, node = replica.node,
            differs = report.divergent.contains(&replica.node),
            buckets_differing = replica.buckets_differing,
            rows = ?rows, problem = ?replica.problem,
            "consistency check: replicas disagree"
        );
    }
}

/// Runs until the node shuts down (the task is aborted then): checks each range this node
/// leads once per interval (none with an interval of 0).
pub(crate) async fn run(shared: Arc<Shared>) {
    let interval_ms = shared.kv.consistency_check_interval_ms;
    if interval_ms == 0 {
        info!("periodic consistency checks are off");
        return;
    }
    let interval = Duration::from_millis(interval_ms);
    // When each led range falls due, on the monotonic clock (the node's wall clock may be
    // offset or, in tests, stand still).
    let mut due: BTreeMap<RangeId, Instant> = BTreeMap::new();
    let scan = interval.min(Duration::from_millis(limits::CHECK_SCAN_MS_MAX));
    let mut tick = tokio::time::interval(scan);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if shared.health.check().is_err() {
            continue;
        }
        let led: Vec<Arc<RaftGroup>> = shared
            .groups
            .all()
            .into_iter()
            .filter(|group| group.is_leader())
            .collect();
        let led_ids: BTreeSet<RangeId> = led.iter().map(|group| group.range()).collect();
        due.retain(|range, _| led_ids.contains(range));
        for group in led {
            let range = group.range();
            let offset = first_offset(shared.node_id, range, interval);
            let next = *due.entry(range).or_insert_with(|| Instant::now() + offset);
            if Instant::now() < next {
                continue;
            }
            if let Err(KvError::NotLeader { .. }) = check_range(&shared, range).await {
                info!(%range, "leadership moved before the range's consistency check");
            }
            due.insert(range, Instant::now() + interval);
        }
    }
}

/// When within the interval a range first falls due on a node: spread by node and range.
fn first_offset(node: NodeId, range: RangeId, interval: Duration) -> Duration {
    let mixed = (node ^ range.0.rotate_left(32)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let interval_ms = interval.as_millis().max(1) as u64;
    Duration::from_millis(mixed % interval_ms)
}
