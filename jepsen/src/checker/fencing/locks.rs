//! Rules (a) and (b) of the fencing checker, on the acquires and releases of one lock: tokens
//! rise in real-time order across owners, and no grant returns while another owner's hold
//! has surely not expired nor been released (the search is `lease::second_owner`; near
//! clock faults it judges nothing).

use std::collections::HashMap;

use serde_json::Value;

use super::Stats;
use crate::checker::lease::{
    ClockFaults, Lease, evidence, ms_between, need_integer, need_text, second_owner,
};
use crate::checker::quote;
use crate::history::{Op, OpKind, Status};

/// An ok acquire: one owner's hold of the lock.
type Grant<'h> = Lease<'h>;

/// One lock's grants and what ends a hold early.
pub(super) struct LockView<'h> {
    history: &'h [Op],
    lock: &'h str,
    /// Ok acquires, by call time.
    grants: Vec<Grant<'h>>,
    /// Per token, the earliest call of a release of it that did not fail.
    releases: HashMap<u64, u64>,
    /// Per owner, the call times of its acquires that did not fail, sorted.
    acquires: HashMap<&'h str, Vec<u64>>,
}

impl<'h> LockView<'h> {
    /// Reads the lock's ops (`indices`: acquires and releases only); counts them in `stats`.
    pub(super) fn build(
        history: &'h [Op],
        indices: &[usize],
        stats: &mut Stats,
    ) -> Result<LockView<'h>, String> {
        let lock = history[indices[0]].key.as_str();
        let mut view = LockView {
            history,
            lock,
            grants: Vec::new(),
            releases: HashMap::new(),
            acquires: HashMap::new(),
        };
        for &index in indices {
            let op = &history[index];
            match (op.op == OpKind::Acquire, op.status()) {
                (true, Status::Fail) => stats.not_granted += 1,
                (true, status) => view.add_acquire(index, status, stats)?,
                (false, Status::Fail) => {}
                (false, _) => {
                    let token = need_integer(history, index, "token")?;
                    let earliest = view.releases.entry(token).or_insert(op.call_ns);
                    *earliest = (*earliest).min(op.call_ns);
                }
            }
        }
        view.grants
            .sort_by_key(|grant| (grant.call_ns, grant.index));
        for calls in view.acquires.values_mut() {
            calls.sort_unstable();
        }
        Ok(view)
    }

    fn add_acquire(
        &mut self,
        index: usize,
        status: Status,
        stats: &mut Stats,
    ) -> Result<(), String> {
        let op = &self.history[index];
        let owner = need_text(self.history, index, "owner")?;
        self.acquires.entry(owner).or_default().push(op.call_ns);
        let Some(return_ns) = op.return_ns.filter(|_| status == Status::Ok) else {
            return Ok(());
        };
        stats.grants += 1;
        self.grants.push(Grant {
            index,
            owner,
            token: need_integer(self.history, index, "token")?,
            ttl_ms: need_integer(self.history, index, "ttl_ms")?,
            call_ns: op.call_ns,
            return_ns,
        });
        Ok(())
    }

    /// (a): a grant that returned before another grant was called has the lower token, or
    /// the same one when both are one owner's (a re-acquire by the holder keeps its token).
    /// One sweep over grants by call time, keeping the highest tokens returned so far.
    pub(super) fn tokens_rise(&self) -> Result<(), Value> {
        let mut by_return = self.grants.clone();
        by_return.sort_by_key(|grant| grant.return_ns);
        let mut top = Highest::default();
        let mut next = 0;
        for grant in &self.grants {
            while next < by_return.len() && by_return[next].return_ns < grant.call_ns {
                top.add(by_return[next]);
                next += 1;
            }
            // A lower token is never right; the same one only for its owner's re-acquire.
            let culprit = match top.best {
                Some(best) if best.token > grant.token => Some(best),
                _ => top
                    .other_than(grant.owner)
                    .filter(|e| e.token >= grant.token),
            };
            if let Some(earlier) = culprit {
                let explanation = format!(
                    "lock {:?}: {} was granted token {} {} ms after {} had been granted token {}",
                    self.lock,
                    grant.owner,
                    grant.token,
                    ms_between(earlier.return_ns, grant.call_ns),
                    earlier.owner,
                    earlier.token
                );
                return Err(evidence(
                    self.lock,
                    explanation,
                    &[
                        ("earlier", quote(self.history, earlier.index)),
                        ("later", quote(self.history, grant.index)),
                    ],
                ));
            }
        }
        Ok(())
    }

    /// (b): no grant returns while an earlier grant to another owner surely holds the lock.
    /// Looks, for each grant, at the grants called within the longest lease before it
    /// returned.
    pub(super) fn one_holder(&self, clocks: &ClockFaults, stats: &mut Stats) -> Result<(), Value> {
        let excused = &mut stats.pairs_excused_by_clock_faults;
        match second_owner(&self.grants, clocks, excused, |earlier, later| {
            self.still_held(earlier, later)
        }) {
            Some((earlier, later)) => Err(self.two_holders(earlier, later)),
            None => Ok(()),
        }
    }

    /// Whether nothing ended or renewed `earlier`'s hold before `later` was granted to
    /// another owner.
    fn still_held(&self, earlier: &Grant, later: &Grant) -> bool {
        !self.released_before(earlier.token, later.return_ns)
            && !self.acquired_between(earlier.owner, earlier.call_ns, later.return_ns)
    }

    /// Whether a release of `token` (that did not fail) was called before `time_ns`.
    fn released_before(&self, token: u64, time_ns: u64) -> bool {
        self.releases
            .get(&token)
            .is_some_and(|&call_ns| call_ns < time_ns)
    }

    /// Whether `owner` called an acquire (that did not fail) strictly between two times.
    fn acquired_between(&self, owner: &str, after_ns: u64, before_ns: u64) -> bool {
        let calls = self.acquires.get(owner).map_or(&[][..], Vec::as_slice);
        let next = calls.partition_point(|&call_ns| call_ns <= after_ns);
        calls.get(next).is_some_and(|&call_ns| call_ns < before_ns)
    }

    fn two_holders(&self, earlier: &Grant, later: &Grant) -> Value {
        let explanation = format!(
            "lock {:?} held twice: {} was granted token {} {} ms after {} asked for it (token {}, \
             TTL {} ms), before that hold could expire, and with no release of it called",
            self.lock,
            later.owner,
            later.token,
            ms_between(earlier.call_ns, later.return_ns),
            earlier.owner,
            earlier.token,
            earlier.ttl_ms
        );
        evidence(
            self.lock,
            explanation,
            &[
                ("holder", quote(self.history, earlier.index)),
                ("second_holder", quote(self.history, later.index)),
            ],
        )
    }
}

/// The grant with the highest token so far, and the one with the highest token among those
/// of other owners than its own: together they answer "the highest token of any owner but
/// X" for every X.
#[derive(Debug, Default)]
struct Highest<'h> {
    best: Option<Grant<'h>>,
    other: Option<Grant<'h>>,
}

impl<'h> Highest<'h> {
    fn add(&mut self, grant: Grant<'h>) {
        match self.best {
            None => self.best = Some(grant),
            Some(best) if grant.token > best.token => {
                if grant.owner != best.owner {
                    self.other = Some(best);
                }
                self.best = Some(grant);
            }
            Some(best) if grant.owner != best.owner => {
                if self.other.is_none_or(|other| grant.token > other.token) {
                    self.other = Some(grant);
                }
            }
            Some(_) => {}
        }
    }

    /// The highest-token grant of an owner other than `owner`.
    fn other_than(&self, owner: &str) -> Option<Grant<'h>> {
        match self.best {
            Some(best) if best.owner != owner => Some(best),
            _ => self.other,
        }
    }
}
