//! The ranges of a run: splitting the keyspace before the workload starts so its keys spread
//! over `--ranges` ranges with leaders on different nodes, and `ranges.jsonl`, the range
//! table as the runner saw it (at the start, after every range fault, whenever the poller
//! sees it change, and at the end). Talks to the cluster through keel-client only; knows
//! nothing of faults or workloads beyond the split keys it is given.

use std::sync::Mutex;
use std::time::Duration;

use anyhow::Context;
use keel_client::{Client, RangeInfo};
use keel_types::KvError;

use crate::limits;
use crate::ranges::{RangeEntry, RangeSnapshot};
use crate::run::clock::RunClock;
use crate::run::recorder::Recorder;
/// How long one initial split, or leadership move, may keep failing before the run fails.
pub const PREPARE_STEP_WAIT: Duration = Duration::from_secs(30);
/// Pause between two tries of an initial split or leadership move.
pub const PREPARE_RETRY: Duration = Duration::from_millis(200);
/// How often the poller reads the range table.
pub const POLL_INTERVAL: Duration = Duration::from_secs(1);

/// `ranges.jsonl`: each record one range table, with when and why it was read. A table the
/// poller reads is recorded only when it differs from the last one recorded.
#[derive(Debug)]
pub struct RangeLog {
    recorder: Recorder,
    clock: RunClock,
    last: Mutex<Vec<RangeEntry>>,
}

impl RangeLog {
    pub fn create(path: &std::path::Path, clock: RunClock) -> std::io::Result<RangeLog> {
        Ok(RangeLog {
            recorder: Recorder::create(path, limits::RANGE_SNAPSHOTS_MAX)?,
            clock,
            last: Mutex::new(Vec::new()),
        })
    }

    /// Records `ranges` as read now for `cause` (`change`: only if it differs from the last).
    pub fn record(&self, cause: &str, ranges: &[RangeInfo]) {
        let table = entries(ranges);
        let mut last = self.last.lock().expect("range log lock poisoned");
        if cause == "change" && *last == table {
            return;
        }
        self.recorder.record(&RangeSnapshot {
            at_ns: self.clock.now_ns(),
            cause: cause.to_string(),
            ranges: table.clone(),
        });
        *last = table;
    }

    /// Reads the range table through `admin` and records it; a failed read records nothing.
    pub async fn read(&self, admin: &Client, cause: &str) -> Option<Vec<RangeInfo>> {
        let ranges = admin.ranges().await.ok()?;
        self.record(cause, &ranges);
        Some(ranges)
    }

    /// Reads the table every `POLL_INTERVAL` until `end` (time since the run began).
    pub async fn poll(&self, admin: &Client, end: Duration) {
        while tokio::time::Instant::now() < self.clock.at(end) {
            self.read(admin, "change").await;
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    pub fn finish(&self) -> Result<usize, String> {
        self.recorder.finish()
    }
}

/// One table as ranges.jsonl holds it: keys as (lossy UTF-8) text.
fn entries(ranges: &[RangeInfo]) -> Vec<RangeEntry> {
    let text = |key: &[u8]| String::from_utf8_lossy(key).into_owned();
    ranges
        .iter()
        .map(|range| {
            let descriptor = &range.descriptor;
            RangeEntry {
                id: descriptor.id.0,
                start: text(&descriptor.start),
                end: descriptor.end().map(text),
                epoch: descriptor.epoch,
                conf_version: descriptor.conf_version,
                voters: descriptor.replicas.clone(),
                leader: range.leader,
            }
        })
        .collect()
}

/// Splits the keyspace at `points` (in key order), then hands the leadership of the `i`-th
/// range to its `i`-th voter (modulo its voters), so leaders spread over the nodes. A step
/// that fails is tried again for `PREPARE_STEP_WAIT`; a split key that already starts a range
/// counts as done.
pub async fn prepare(admin: &Client, points: &[Vec<u8>]) -> anyhow::Result<Vec<RangeInfo>> {
    for point in points {
        retry(|| async {
            match admin.split(point).await {
                Ok(_) => Ok(()),
                Err(error @ KvError::EpochMismatch { .. }) => {
                    let table = admin.ranges().await?;
                    match table.iter().any(|range| range.descriptor.start == *point) {
                        true => Ok(()),
                        false => Err(error),
                    }
                }
                Err(error) => Err(error),
            }
        })
        .await
        .with_context(|| format!("splitting at {}", String::from_utf8_lossy(point)))?;
    }
    let ranges = retry(|| admin.ranges())
        .await
        .context("reading the ranges")?;
    for (index, range) in ranges.iter().enumerate() {
        let voters = &range.descriptor.replicas;
        let Some(&to) = voters.get(index % voters.len().max(1)) else {
            continue;
        };
        if range.leader == Some(to) {
            continue;
        }
        let id = range.descriptor.id;
        retry(|| admin.transfer_leader(id, to))
            .await
            .with_context(|| format!("moving the leadership of range {id} to node {to}"))?;
    }
    retry(|| admin.ranges()).await.context("reading the ranges")
}

/// `step` until it succeeds, for at most `PREPARE_STEP_WAIT`.
async fn retry<T, F, Fut>(mut step: F) -> Result<T, KvError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, KvError>>,
{
    let deadline = tokio::time::Instant::now() + PREPARE_STEP_WAIT;
    loop {
        match step().await {
            Ok(value) => return Ok(value),
            Err(error) if tokio::time::Instant::now() + PREPARE_RETRY > deadline => {
                return Err(error);
            }
            Err(_) => tokio::time::sleep(PREPARE_RETRY).await,
        }
    }
}
