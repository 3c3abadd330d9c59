//! The consistency checks this node led: the alarms (the last report of each range whose last
//! check here said its replicas disagree) and counts of checks by verdict, for `Cluster.Status`
//! and the metrics. An alarm stays until this node's next check of the range says otherwise,
//! or until the node no longer holds a replica of the range.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use keel_types::{CheckReport, RangeId, Verdict};

/// Verdicts in the order `CheckRecords::counts` reports them.
pub(crate) const VERDICTS: [Verdict; 4] = [
    Verdict::Consistent,
    Verdict::Unconfirmed,
    Verdict::Divergent,
    Verdict::NoMajority,
];

#[derive(Default)]
pub(crate) struct CheckRecords {
    /// The last report of each range whose last check here raised an alarm.
    alarms: Mutex<BTreeMap<RangeId, CheckReport>>,
    /// Checks by verdict (`VERDICTS` order), then checks that could not run.
    counts: [AtomicU64; 5],
}

impl CheckRecords {
    pub fn record(&self, report: &CheckReport) {
        let at = VERDICTS.iter().position(|v| *v == report.verdict);
        self.counts[at.unwrap_or(VERDICTS.len())].fetch_add(1, Ordering::Relaxed);
        let mut alarms = self.alarms.lock().unwrap_or_else(|e| e.into_inner());
        if report.verdict.is_alarm() {
            alarms.insert(report.range, report.clone());
        } else {
            alarms.remove(&report.range);
        }
    }

    /// Counts a check that could not run.
    pub fn failed(&self) {
        self.counts[VERDICTS.len()].fetch_add(1, Ordering::Relaxed);
    }

    /// Checks by verdict (`VERDICTS` order) and checks that could not run.
    pub fn counts(&self) -> ([u64; 4], u64) {
        let load = |at: usize| self.counts[at].load(Ordering::Relaxed);
        ([load(0), load(1), load(2), load(3)], load(4))
    }

    /// The last report of each range whose last check here raised an alarm, among the ranges
    /// in `hosted` (the others are forgotten).
    pub fn alarms(&self, hosted: &BTreeSet<RangeId>) -> Vec<CheckReport> {
        let mut alarms = self.alarms.lock().unwrap_or_else(|e| e.into_inner());
        alarms.retain(|range, _| hosted.contains(range));
        alarms.values().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(range: u64, verdict: Verdict) -> CheckReport {
        CheckReport {
            range: RangeId(range),
            index: 1,
            verdict,
            replicas: Vec::new(),
            divergent: Vec::new(),
            checked_at_ms: 0,
            rows: 0,
            leader: 1,
            repaired: Vec::new(),
            repair_note: String::new(),
        }
    }

    #[test]
    fn an_alarm_lasts_until_the_next_check_clears_it() {
        let records = CheckRecords::default();
        let hosted: BTreeSet<RangeId> = [RangeId(1), RangeId(2)].into();
        records.record(&report(1, Verdict::Divergent));
        records.record(&report(2, Verdict::Consistent));
        records.failed();
        let alarms = records.alarms(&hosted);
        assert_eq!(alarms.len(), 1);
        assert_eq!(alarms[0].range, RangeId(1));
        records.record(&report(1, Verdict::Consistent));
        assert!(records.alarms(&hosted).is_empty());
        assert_eq!(records.counts(), ([2, 0, 1, 0], 1));
        // A range this node no longer holds is forgotten.
        records.record(&report(3, Verdict::NoMajority));
        assert!(records.alarms(&hosted).is_empty());
    }
}
