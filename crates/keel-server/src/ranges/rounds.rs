//! Per-range rounds that fall due: the loop the cleanup (`cleanup`) and history compaction
//! (`compaction`) tasks share. Every interval, while the node is healthy, each data range of
//! the node that the task takes gets a round, unless its last round, made at the applied
//! index it still has, said it falls due later (or only when more is applied): only an apply
//! changes what a round finds (`shared::applied_cache`). Knows nothing of what a round does.

use std::collections::BTreeSet;
use std::fmt::Display;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use keel_raft::RaftGroup;
use keel_types::RangeId;
use tracing::debug;

use crate::shared::Shared;
use crate::shared::applied_cache::ByApplied;

/// Runs until the node shuts down (the task is aborted then). `takes` picks the data ranges
/// (never the meta range) that get rounds; `round` does one at the clock reading it is given
/// and says when the range next falls due (`None`: when more is applied). A failed round
/// (logged with `what`) is tried again next interval.
pub(crate) async fn run<F, Fut, E>(
    shared: Arc<Shared>,
    interval: Duration,
    what: &'static str,
    takes: impl Fn(&RaftGroup) -> bool,
    mut round: F,
) where
    F: FnMut(Arc<RaftGroup>, u64) -> Fut,
    Fut: Future<Output = Result<Option<u64>, E>>,
    E: Display,
{
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // When each range is next due, as its last round said at its applied index.
    let mut due: ByApplied<Option<u64>> = ByApplied::default();
    loop {
        tick.tick().await;
        if shared.health.check().is_err() {
            continue;
        }
        let groups = shared.groups.all();
        let hosted: BTreeSet<RangeId> = groups.iter().map(|group| group.range()).collect();
        due.retain(|range| hosted.contains(&range));
        for group in groups {
            if group.range() == RangeId::META || !takes(&group) {
                continue;
            }
            let (range, applied) = (group.range(), group.applied_index());
            let now_ms = shared.clock.now_ms();
            let waiting = |next: &Option<u64>| next.is_none_or(|next| now_ms < next);
            if due.get(range, applied).is_some_and(waiting) {
                continue;
            }
            match round(group, now_ms).await {
                Ok(next) => due.insert(range, applied, next),
                Err(error) => {
                    debug!(%range, %error, "{what} round failed; retrying next round");
                    due.remove(range);
                }
            }
        }
    }
}
