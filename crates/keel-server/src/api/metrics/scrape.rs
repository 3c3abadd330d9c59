//! One scrape: reads what the node knows now (its groups' Raft state, each led range's
//! counts, the store's counters, the request, storage and hot-key metrics, the tenants'
//! usage and the certificates' expiry, `access.rs`) and writes it in the text format. Per-range series are one set per range this node hosts (at most
//! `keel_meta::limits::LOAD_RANGES_MAX`); what a range holds (keys, bytes, load, locks,
//! idempotency records) is reported by its leader only, so a sum over the cluster counts each
//! range once. Knows nothing of HTTP.

use std::sync::atomic::Ordering;

use keel_raft::{GroupStatus, ReadIndexCounts, Role};
use keel_storage::RangeCounts;
use keel_types::limits::WATCHES_PER_NODE_MAX;
use keel_types::{CoordinationCounts, RangeId};

use super::access;
use crate::access::Access;
use crate::api::health;
use crate::metrics::text::{Kind, Text};
use crate::metrics::{WatchEnd, WatchMetrics};
use crate::shared::Shared;
use crate::shared::checks::VERDICTS;

/// What one hosted range looks like from this node.
struct RangeView {
    status: GroupStatus,
    /// The replica knows a leader it can count on (the health service's rule).
    leader_known: bool,
    /// On the leader: what the range holds and serves.
    content: Option<Content>,
}

struct Content {
    counts: RangeCounts,
    coordination: CoordinationCounts,
    requests_per_sec: f64,
}

/// The node's metrics in the Prometheus text format.
pub(crate) async fn render(shared: &Shared) -> String {
    let ranges = range_views(shared).await;
    let mut text = Text::new();
    write_node(&mut text, shared, ranges.len());
    write_requests(&mut text, shared);
    write_ranges(&mut text, &ranges);
    write_storage(&mut text, shared);
    write_hot_keys(&mut text, shared);
    let tenants = shared.access.as_deref().map_or(&[][..], Access::tenants);
    access::write_tenants(&mut text, tenants, leads_meta(&ranges));
    access::write_certificates(&mut text, shared.tls.as_ref());
    text.finish()
}

/// Whether this node leads the meta range.
fn leads_meta(ranges: &[RangeView]) -> bool {
    ranges
        .iter()
        .any(|range| range.status.range == RangeId::META && range.status.role == Role::Leader)
}

async fn range_views(shared: &Shared) -> Vec<RangeView> {
    let quorum_ack_max = health::quorum_ack_max(shared);
    let mut groups = shared.groups.all();
    groups.sort_by_key(|group| group.range());
    let mut views = Vec::with_capacity(groups.len());
    for group in groups {
        // A range in the middle of a snapshot install, or stopping, is left out this time.
        let Ok(status) = group.status().await else {
            continue;
        };
        let content = match status.role {
            Role::Leader => content(shared, &group).await,
            _ => None,
        };
        views.push(RangeView {
            leader_known: health::leader_known(shared, &group, quorum_ack_max),
            status,
            content,
        });
    }
    views
}

async fn content(shared: &Shared, group: &keel_raft::RaftGroup) -> Option<Content> {
    let state_machine = group.state_machine();
    let counts = state_machine.counts().await.ok()?;
    let coordination = state_machine.coordination_counts().await.ok()?;
    Some(Content {
        counts,
        coordination,
        requests_per_sec: shared.load.requests_per_sec(group.range()),
    })
}

fn write_node(text: &mut Text, shared: &Shared, ranges: usize) {
    let gauges: [(&str, &str, f64); 4] = [
        ("keel_node_id", "This node's id.", shared.node_id as f64),
        (
            "keel_node_start_time_seconds",
            "When this node started, in seconds since the Unix epoch (the node's clock).",
            shared.metrics.started_at_ms as f64 / 1_000.0,
        ),
        (
            "keel_node_serving",
            "1 while the health service reports SERVING: the node is healthy and every range it hosts has a leader it can count on.",
            f64::from(u8::from(health::verdict(shared).is_ok())),
        ),
        (
            "keel_node_ranges",
            "Raft groups this node runs.",
            ranges as f64,
        ),
    ];
    for (name, help, value) in gauges {
        text.family(name, Kind::Gauge, help);
        text.sample(&[], value);
    }
    text.family(
        "keel_load_splits_declined_total",
        Kind::Counter,
        "Splits for load this node's split driver declined because every live node already held the range.",
    );
    let declined = shared.metrics.load_splits_declined.load(Ordering::Relaxed);
    text.sample(&[], declined as f64);
    text.family(
        "keel_forwarded_requests_total",
        Kind::Counter,
        "Client requests this node sent on to a range's leader, by how: on the node pair's Raft.Forward stream, or as a call of their own (large requests, lock acquires that may wait, leaders without the stream).",
    );
    let forwarded = [
        ("stream", &shared.metrics.forwarded_on_stream),
        ("call", &shared.metrics.forwarded_as_calls),
    ];
    for (via, count) in forwarded {
        text.sample(&[("via", via)], count.load(Ordering::Relaxed) as f64);
    }
    write_watches(text, &shared.metrics.watches);
    write_checks(text, shared);
    text.family(
        "keel_peer_heartbeat_age_seconds",
        Kind::Gauge,
        "Time since this node last received a heartbeat from the node (itself included).",
    );
    for (node, seen) in shared.heartbeats.all() {
        let node = node.to_string();
        text.sample(&[("node_id", &node)], seen.at.elapsed().as_secs_f64());
    }
    text.family(
        "keel_peer_ping_age_seconds",
        Kind::Gauge,
        "Time since this node last received a ping from the node (sent five times a second); \
         absent for a node that does not ping (a release before pings).",
    );
    for (node, at) in shared.heartbeats.pinged() {
        let node = node.to_string();
        text.sample(&[("node_id", &node)], at.elapsed().as_secs_f64());
    }
}

fn write_watches(text: &mut Text, watches: &WatchMetrics) {
    text.family(
        "keel_watches",
        Kind::Gauge,
        &format!("Watch streams this node serves now (at most {WATCHES_PER_NODE_MAX})."),
    );
    text.sample(&[], watches.open_now() as f64);
    text.family(
        "keel_watch_events_sent_total",
        Kind::Counter,
        "Events this node's watch streams sent.",
    );
    text.sample(&[], watches.events_sent() as f64);
    text.family(
        "keel_watch_history_reads_total",
        Kind::Counter,
        "Reads of a range's history for its watch streams; the streams of a range that stand at one cursor share one.",
    );
    text.sample(&[], watches.history_reads() as f64);
    text.family(
        "keel_watches_ended_total",
        Kind::Counter,
        "Watch streams that ended, by why: the client closed it, the range split, its events were compacted before it could send them (a reader too slow for the retention), or the replica stopped.",
    );
    for end in WatchEnd::ALL {
        text.sample(&[("reason", end.label())], watches.ended_by(end) as f64);
    }
    text.family(
        "keel_watches_refused_total",
        Kind::Counter,
        &format!("Watch streams refused because this node served {WATCHES_PER_NODE_MAX} already."),
    );
    text.sample(&[], watches.refused() as f64);
}

fn write_requests(text: &mut Text, shared: &Shared) {
    let methods = shared.metrics.requests.snapshot();
    text.family(
        "keel_grpc_requests_total",
        Kind::Counter,
        "gRPC requests answered, per method (counted when they end).",
    );
    for m in &methods {
        text.sample(
            &[("service", m.service), ("method", m.method)],
            m.requests as f64,
        );
    }
    text.family(
        "keel_grpc_errors_total",
        Kind::Counter,
        "gRPC requests answered with an error, per method, gRPC code and KvError kind (none: the status carried no Keel error).",
    );
    for m in &methods {
        for ((code, kind), count) in &m.errors {
            let labels = [
                ("service", m.service),
                ("method", m.method),
                ("code", *code),
                ("kind", *kind),
            ];
            text.sample(&labels, *count as f64);
        }
    }
    text.family(
        "keel_grpc_requests_in_flight",
        Kind::Gauge,
        "gRPC requests being served, per method.",
    );
    for m in &methods {
        text.sample(
            &[("service", m.service), ("method", m.method)],
            m.in_flight as f64,
        );
    }
    text.family(
        "keel_grpc_request_duration_seconds",
        Kind::Histogram,
        "Time from a gRPC request's arrival to its response (the whole call for unary RPCs), per method.",
    );
    for m in &methods {
        text.histogram(&[("service", m.service), ("method", m.method)], &m.duration);
    }
}

/// A gauge family read from a `T`: name, help, value.
type Gauge<T> = (&'static str, &'static str, fn(&T) -> f64);

/// A counter family read from a `T`: name, help, count.
type Counter<T> = (&'static str, &'static str, fn(&T) -> u64);

/// A family of one gauge per range, for the ranges `value` gives one for.
fn range_gauge(
    text: &mut Text,
    ranges: &[RangeView],
    name: &str,
    help: &str,
    value: impl Fn(&RangeView) -> Option<f64>,
) {
    text.family(name, Kind::Gauge, help);
    for range in ranges {
        if let Some(value) = value(range) {
            let id = range.status.range.0.to_string();
            text.sample(&[("range_id", &id)], value);
        }
    }
}

fn write_ranges(text: &mut Text, ranges: &[RangeView]) {
    let raft: [Gauge<GroupStatus>; 8] = [
        ("keel_range_term", "The replica's current Raft term.", |s| {
            s.term as f64
        }),
        (
            "keel_range_is_leader",
            "1 if this replica leads the range.",
            |s| f64::from(u8::from(s.role == Role::Leader)),
        ),
        (
            "keel_range_leader_id",
            "The leader this replica knows of (0: none).",
            |s| s.leader.unwrap_or(0) as f64,
        ),
        (
            "keel_range_last_log_index",
            "Index of the replica's last log entry.",
            |s| s.last_log_index as f64,
        ),
        (
            "keel_range_commit_index",
            "The commit index the replica knows of.",
            |s| s.commit_index as f64,
        ),
        (
            "keel_range_applied_index",
            "Index of the last entry the replica applied.",
            |s| s.applied_index as f64,
        ),
        (
            "keel_range_apply_lag_entries",
            "Committed entries the replica has not applied yet (commit index - applied index).",
            |s| s.commit_index.saturating_sub(s.applied_index) as f64,
        ),
        (
            "keel_range_quiesced",
            "1 if the range is idle and its Raft timers are parked here (quiescence).",
            |s| f64::from(u8::from(s.quiesced)),
        ),
    ];
    for (name, help, value) in raft {
        range_gauge(text, ranges, name, help, |range| Some(value(&range.status)));
    }
    range_gauge(
        text,
        ranges,
        "keel_range_leader_known",
        "1 if the replica knows a leader it can count on (a leader: acknowledged by a quorum within an election timeout).",
        |range| Some(f64::from(u8::from(range.leader_known))),
    );
    range_gauge(
        text,
        ranges,
        "keel_range_quorum_ack_age_seconds",
        "On the leader: time since a quorum last acknowledged it.",
        |range| range.status.quorum_acked_ago.map(|ago| ago.as_secs_f64()),
    );
    write_replication(text, ranges);
    write_read_index(text, ranges);
    write_content(text, ranges);
}

fn write_read_index(text: &mut Text, ranges: &[RangeView]) {
    let counters: [Counter<ReadIndexCounts>; 3] = [
        (
            "keel_range_read_index_calls_total",
            "Read index calls this replica sent to the range's leader for linearizable reads it served as a follower.",
            |c| c.calls,
        ),
        (
            "keel_range_read_index_reads_total",
            "Linearizable reads on this replica, as a follower, that waited for a read index (reads share calls).",
            |c| c.reads,
        ),
        (
            "keel_range_read_index_served_total",
            "Read index calls of followers this replica answered as the range's leader.",
            |c| c.served,
        ),
    ];
    for (name, help, value) in counters {
        text.family(name, Kind::Counter, help);
        for range in ranges {
            let id = range.status.range.0.to_string();
            let count = value(&range.status.read_index);
            text.sample(&[("range_id", &id)], count as f64);
        }
    }
}

fn write_replication(text: &mut Text, ranges: &[RangeView]) {
    text.family(
        "keel_range_replication_lag_entries",
        Kind::Gauge,
        "On the leader: log entries a replica lacks (leader's last log index - the replica's matched index).",
    );
    for range in ranges {
        let id = range.status.range.0.to_string();
        for (node, matched) in &range.status.matched {
            let node = node.to_string();
            let lag = range.status.last_log_index.saturating_sub(*matched);
            text.sample(&[("range_id", &id), ("node_id", &node)], lag as f64);
        }
    }
}

fn write_content(text: &mut Text, ranges: &[RangeView]) {
    let gauges: [Gauge<Content>; 6] = [
        (
            "keel_range_keys",
            "On the leader: keys in the range (expired ones not yet cleaned up included).",
            |c| c.counts.keys as f64,
        ),
        (
            "keel_range_size_bytes",
            "On the leader: key plus value bytes in the range.",
            |c| c.counts.size_bytes as f64,
        ),
        (
            "keel_range_requests_per_second",
            "On the leader: mean requests per second the range served over the last seconds.",
            |c| c.requests_per_sec,
        ),
        (
            "keel_range_locks",
            "On the leader: lock records in the range (free ones not yet reclaimed included).",
            |c| c.coordination.locks as f64,
        ),
        (
            "keel_range_fenced_keys",
            "On the leader: keys carrying a fence.",
            |c| c.coordination.fenced_keys as f64,
        ),
        (
            "keel_range_idempotency_records",
            "On the leader: idempotency records in the range (expired ones not yet reclaimed included).",
            |c| c.coordination.idempotency_records as f64,
        ),
    ];
    for (name, help, value) in gauges {
        range_gauge(text, ranges, name, help, |range| {
            range.content.as_ref().map(value)
        });
    }
}

fn write_storage(text: &mut Text, shared: &Shared) {
    let histograms = shared.metrics.storage.snapshot();
    text.family(
        "keel_storage_commit_duration_seconds",
        Kind::Histogram,
        "Time of one storage write transaction, from its start to the end of its commit, by durability (immediate: one fsync).",
    );
    text.histogram(&[("durability", "immediate")], &histograms.durable);
    text.histogram(&[("durability", "none")], &histograms.lazy);
    text.family(
        "keel_storage_commit_batch_requests",
        Kind::Histogram,
        "Write requests (appends, applies, votes...) in one storage transaction.",
    );
    text.histogram(&[], &histograms.batch);
    let stats = shared.store.stats();
    let counters = [
        (
            "keel_storage_commits_total",
            "Storage write transactions committed.",
            stats.commits,
        ),
        (
            "keel_storage_durable_commits_total",
            "Storage write transactions committed with an fsync.",
            stats.durable_commits,
        ),
        (
            "keel_storage_requests_total",
            "Write requests the storage writer received.",
            stats.requests,
        ),
    ];
    for (name, help, value) in counters {
        text.family(name, Kind::Counter, help);
        text.sample(&[], value as f64);
    }
    text.family(
        "keel_storage_file_bytes",
        Kind::Gauge,
        "Size of the node's storage file.",
    );
    if let Ok(bytes) = shared.store.file_bytes() {
        text.sample(&[], bytes as f64);
    }
    text.family(
        "keel_storage_log_bytes",
        Kind::Gauge,
        "Size of the node's Raft log segments (keel.raft-log/).",
    );
    text.sample(&[], shared.store.log_bytes() as f64);
    text.family(
        "keel_storage_healthy",
        Kind::Gauge,
        "0 once the store is poisoned by an I/O failure (or closed).",
    );
    text.sample(&[], f64::from(u8::from(shared.store.health().is_ok())));
}

fn write_hot_keys(text: &mut Text, shared: &Shared) {
    text.family(
        "keel_hot_key_requests",
        Kind::Gauge,
        "The most requested keys this node served over the last one to two minutes, estimated from a sample; keys are cut to 64 bytes (… marks a cut), bytes outside printable ASCII as \\xNN; a tenant's key is labelled with its tenant and the key within its namespace.",
    );
    for (key, requests) in shared.metrics.hot_keys.report() {
        let label = key.label();
        match &key.tenant {
            Some(tenant) => text.sample(&[("tenant", tenant), ("key", &label)], requests as f64),
            None => text.sample(&[("key", &label)], requests as f64),
        }
    }
}

/// The consistency checks this node led, and what its store's checker hashed.
fn write_checks(text: &mut Text, shared: &Shared) {
    text.family(
        "keel_consistency_checks_total",
        Kind::Counter,
        "Consistency checks this node led as a range's leader, by verdict: consistent, unconfirmed (not every replica answered), divergent, no-majority, or failed (the check could not finish).",
    );
    let (by_verdict, failed) = shared.checks.counts();
    for (verdict, count) in VERDICTS.iter().zip(by_verdict) {
        text.sample(&[("verdict", verdict.name())], count as f64);
    }
    text.sample(&[("verdict", "failed")], failed as f64);
    text.family(
        "keel_consistency_alarms",
        Kind::Gauge,
        "Ranges whose last consistency check on this node found replicas that disagree (divergent or no-majority).",
    );
    let hosted = shared.groups.all().iter().map(|g| g.range()).collect();
    text.sample(&[], shared.checks.alarms(&hosted).len() as f64);
    text.family(
        "keel_consistency_check_hashed_bytes_total",
        Kind::Counter,
        "Bytes of range state this node's replicas hashed for consistency checks (paced to 32 MiB/s).",
    );
    text.sample(&[], shared.store.check_hashed_bytes() as f64);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `RangeId` is what the series are keyed by; one set per hosted range.
    #[test]
    fn range_labels_are_range_ids() {
        let status = GroupStatus {
            range: RangeId(7),
            leader: Some(2),
            term: 3,
            commit_index: 10,
            applied_index: 8,
            last_log_index: 12,
            snapshot_index: 0,
            purged_index: 0,
            revision: 5,
            role: Role::Leader,
            members: Vec::new(),
            matched: [(2, 12), (3, 9)].into_iter().collect(),
            quorum_acked_ago: None,
            quiesced: false,
            read_index: ReadIndexCounts {
                calls: 2,
                reads: 9,
                served: 0,
            },
        };
        let ranges = [RangeView {
            status,
            leader_known: true,
            content: None,
        }];
        let mut text = Text::new();
        write_ranges(&mut text, &ranges);
        let body = text.finish();
        for line in [
            "keel_range_apply_lag_entries{range_id=\"7\"} 2",
            "keel_range_is_leader{range_id=\"7\"} 1",
            "keel_range_leader_id{range_id=\"7\"} 2",
            "keel_range_replication_lag_entries{range_id=\"7\",node_id=\"2\"} 0",
            "keel_range_replication_lag_entries{range_id=\"7\",node_id=\"3\"} 3",
            "keel_range_read_index_calls_total{range_id=\"7\"} 2",
            "keel_range_read_index_reads_total{range_id=\"7\"} 9",
        ] {
            assert!(
                body.lines().any(|l| l == line),
                "{line} missing from\n{body}"
            );
        }
        assert!(
            !body.contains("keel_range_keys{"),
            "no content on this view"
        );
        assert!(!body.contains("keel_range_quorum_ack_age_seconds{"));
    }
}
