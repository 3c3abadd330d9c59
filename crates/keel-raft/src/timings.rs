//! Raft timing settings of a node and the openraft `Config` derived from them. Knows nothing
//! of the network or storage.

use std::sync::Arc;

use keel_types::limits;
use openraft::{Config, SnapshotPolicy};
use serde::{Deserialize, Serialize};

use crate::error::GroupError;

/// Longest `quiesce_after_ms`: one day.
pub const QUIESCE_AFTER_MS_MAX: u64 = 24 * 60 * 60 * 1000;

/// How fast Raft groups tick. The defaults suit loopback clusters and LANs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RaftTimings {
    /// Interval between leader heartbeats.
    pub heartbeat_ms: u64,
    /// A follower that hears no leader for `election_timeout_ms_max` (the leader's lease: it
    /// refuses other candidates meanwhile) plus a random time in `[min, max)` starts an
    /// election; with the defaults 0.9-1.2 s after the leader's last heartbeat.
    pub election_timeout_ms_min: u64,
    pub election_timeout_ms_max: u64,
    /// Deadline for sending one whole snapshot to a follower.
    pub snapshot_timeout_ms: u64,
    /// A snapshot is built after this many log entries since the last one.
    pub snapshot_logs_since_last: u64,
    /// Log entries kept behind the last snapshot, so a follower that lags by fewer entries
    /// catches up from the log rather than from a whole snapshot.
    pub logs_kept_after_snapshot: u64,
    /// How long a client write may wait to be committed and applied.
    pub write_timeout_ms: u64,
    /// How long a read may wait to confirm leadership and catch up.
    pub read_timeout_ms: u64,
    /// A group its leader has not used for this long (no proposal, no read needing the
    /// leader, no split, replica change or leader transfer), with every entry committed,
    /// applied and matched on every member, is proposed for quiescence: once its followers
    /// agree, every replica parks its ticker. 0 = never.
    pub quiesce_after_ms: u64,
}

impl Default for RaftTimings {
    fn default() -> Self {
        RaftTimings {
            heartbeat_ms: 100,
            election_timeout_ms_min: 300,
            election_timeout_ms_max: 600,
            snapshot_timeout_ms: 60_000,
            snapshot_logs_since_last: 10_000,
            logs_kept_after_snapshot: 1_000,
            write_timeout_ms: 5_000,
            read_timeout_ms: 5_000,
            quiesce_after_ms: 3_000,
        }
    }
}

impl RaftTimings {
    /// The openraft configuration of one group; rejects inconsistent timings.
    pub fn openraft_config(&self) -> Result<Arc<Config>, GroupError> {
        if self.heartbeat_ms == 0 || self.heartbeat_ms >= self.election_timeout_ms_min {
            return Err(GroupError::Config(format!(
                "heartbeat_ms is {}; it must be above 0 and below election_timeout_ms_min ({})",
                self.heartbeat_ms, self.election_timeout_ms_min
            )));
        }
        if self.quiesce_after_ms > QUIESCE_AFTER_MS_MAX {
            return Err(GroupError::Config(format!(
                "quiesce_after_ms is {}; limit is {QUIESCE_AFTER_MS_MAX} (0 = never)",
                self.quiesce_after_ms
            )));
        }
        if self.write_timeout_ms == 0 || self.read_timeout_ms == 0 {
            return Err(GroupError::Config(
                "write_timeout_ms and read_timeout_ms must be above 0".to_string(),
            ));
        }
        let config = Config {
            cluster_name: "keel".to_string(),
            heartbeat_interval: self.heartbeat_ms,
            election_timeout_min: self.election_timeout_ms_min,
            election_timeout_max: self.election_timeout_ms_max,
            install_snapshot_timeout: self.snapshot_timeout_ms,
            max_payload_entries: limits::RAFT_APPEND_ENTRIES_MAX,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(self.snapshot_logs_since_last),
            max_in_snapshot_log_to_keep: self.logs_kept_after_snapshot,
            snapshot_max_chunk_size: limits::SNAPSHOT_CHUNK_BYTES as u64,
            enable_pre_vote: Some(true),
            // The state machine applies without fsync and the committed log id is not saved,
            // so a leader restarted after a crash may hold a stale state machine. If
            // it took its leadership back without an election it would serve linearizable
            // reads from that stale state (found by the Jepsen-style matrix: counter under
            // kill-all read 207 after 211 was acknowledged). Without restore it learns the
            // commit index from a new election first.
            enable_leader_restore: Some(false),
            ..Config::default()
        };
        let config = config
            .validate()
            .map_err(|e| GroupError::Config(e.to_string()))?;
        Ok(Arc::new(config))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_bad_timings_are_rejected() {
        let config = RaftTimings::default().openraft_config().unwrap();
        assert_eq!(config.heartbeat_interval, 100);
        assert_eq!(
            config.enable_leader_restore,
            Some(false),
            "a restarted leader with a stale state machine must not lead without an election"
        );
        assert_eq!(config.max_payload_entries, limits::RAFT_APPEND_ENTRIES_MAX);
        let slow_heartbeat = RaftTimings {
            heartbeat_ms: 1_000,
            ..RaftTimings::default()
        };
        assert!(slow_heartbeat.openraft_config().is_err());
        let inverted = RaftTimings {
            election_timeout_ms_min: 3_000,
            election_timeout_ms_max: 2_000,
            ..RaftTimings::default()
        };
        assert!(inverted.openraft_config().is_err());
        let never = RaftTimings {
            quiesce_after_ms: 0,
            ..RaftTimings::default()
        };
        assert!(never.openraft_config().is_ok(), "0 turns quiescence off");
        let too_late = RaftTimings {
            quiesce_after_ms: QUIESCE_AFTER_MS_MAX + 1,
            ..RaftTimings::default()
        };
        assert!(too_late.openraft_config().is_err());
    }
}
