//! The descriptor publisher: every node tells the meta range about the ranges it leads. Each
//! range's own state machine is the truth about its span, epoch and replicas; the meta range
//! keeps a copy for routing, which each range's leader refreshes when it changes (a split, a
//! membership change, a snapshot that moved it on). Runs every `PUBLISH_INTERVAL_MS` and on
//! every range event of the store; publishes a descriptor when it differs from the one this
//! node last published successfully, in batches of `limits::META_UPDATE_RANGES_MAX`; a range
//! found unchanged is read again only once something is applied to it (`shared::applied_cache`).
//! Also registers the node (its id and address) with the meta range once per start. Knows
//! nothing of gRPC.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use keel_types::{
    KvError, MetaCommand, NodeAddr, NodeDescriptor, RangeDescriptor, RangeId, limits,
};
use tokio::time::MissedTickBehavior;
use tracing::debug;

use crate::ranges::meta;
use crate::shared::Shared;
use crate::shared::applied_cache::ByApplied;

/// How often the publisher looks at the ranges this node leads.
const PUBLISH_INTERVAL_MS: u64 = 2_000;

/// Runs until the node shuts down (the task is aborted then, or the store closes).
pub(crate) async fn run(shared: Arc<Shared>) {
    let mut events = shared.store.range_events();
    let mut tick = tokio::time::interval(Duration::from_millis(PUBLISH_INTERVAL_MS));
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut registered = false;
    let mut unchanged: ByApplied<()> = ByApplied::default();
    loop {
        tokio::select! {
            changed = events.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            _ = tick.tick() => {}
        }
        if shared.health.check().is_err() {
            continue;
        }
        if !registered {
            match register(&shared).await {
                Ok(()) => registered = true,
                Err(error) => debug!(%error, "registering with the meta range; trying again"),
            }
        }
        if let Err(error) = publish_changed(&shared, &mut unchanged).await {
            debug!(%error, "publishing range descriptors; trying again");
        }
    }
}

/// Publishes `ranges` to the meta range now (a split publishes both halves at once).
pub(crate) async fn publish(shared: &Shared, ranges: Vec<RangeDescriptor>) -> Result<(), KvError> {
    for batch in ranges.chunks(limits::META_UPDATE_RANGES_MAX) {
        let command = MetaCommand::UpdateRanges {
            ranges: batch.to_vec(),
        };
        meta::propose_meta(shared, command).await?;
        shared.published.record(batch);
    }
    Ok(())
}

/// Publishes the descriptor of every range this node leads (the meta range aside) that
/// differs from the last one it published. A range found `unchanged` at its applied index
/// is not read again until something is applied to it.
async fn publish_changed(shared: &Shared, unchanged: &mut ByApplied<()>) -> Result<(), KvError> {
    let groups = shared.groups.all();
    let hosted: BTreeSet<RangeId> = groups.iter().map(|group| group.range()).collect();
    unchanged.retain(|range| hosted.contains(&range));
    let mut changed = Vec::new();
    for group in groups {
        if group.range() == RangeId::META || !group.is_leader() {
            continue;
        }
        let (range, applied) = (group.range(), group.applied_index());
        if unchanged.get(range, applied).is_some() {
            continue;
        }
        let descriptor = group.descriptor().await?;
        if shared.published.changed(&descriptor) {
            changed.push((applied, descriptor));
        } else {
            unchanged.insert(range, applied, ());
        }
    }
    if changed.is_empty() {
        return Ok(());
    }
    debug!(ranges = changed.len(), "publishing range descriptors");
    let descriptors = changed.iter().map(|(_, d)| d.clone()).collect();
    publish(shared, descriptors).await?;
    for (applied, descriptor) in changed {
        unchanged.insert(descriptor.id, applied, ());
    }
    Ok(())
}

async fn register(shared: &Shared) -> Result<(), KvError> {
    let node = NodeDescriptor {
        id: shared.node_id,
        addr: NodeAddr::new(shared.addr.clone()),
    };
    meta::propose_meta(shared, MetaCommand::RegisterNode(node)).await?;
    Ok(())
}
