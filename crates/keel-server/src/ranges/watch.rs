//! The range watcher: keeps the node's groups in step with its store and with the meta
//! range. After every range event of the store it refreshes the local table; every
//! `META_REFRESH_MS` it reads the meta range, starts the replicas it names for this node
//! (`lookup::adopt_from_meta`) and collects the replicas this node should no longer have
//! (`replicas::collect_garbage`). Knows nothing of gRPC messages.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::MissedTickBehavior;
use tracing::{debug, warn};

use crate::ranges::lookup::{adopt_from_meta, refresh_local};
use crate::ranges::replicas;
use crate::shared::Shared;

/// How often the watcher reads the meta range.
const META_REFRESH_MS: u64 = 2_000;

/// Runs until the node shuts down (the task is aborted then, or the store closes).
pub(crate) async fn watch(shared: Arc<Shared>) {
    let mut events = shared.store.range_events();
    let mut tick = tokio::time::interval(Duration::from_millis(META_REFRESH_MS));
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        let from_meta = tokio::select! {
            changed = events.changed() => {
                if changed.is_err() {
                    return;
                }
                false
            }
            _ = tick.tick() => true,
        };
        if shared.health.check().is_err() {
            continue;
        }
        if let Err(error) = refresh_local(&shared).await {
            warn!(%error, "reading the store's ranges");
            continue;
        }
        if !from_meta {
            continue;
        }
        if let Err(error) = adopt_from_meta(&shared).await {
            debug!(%error, "reading the meta range; trying again later");
            continue;
        }
        replicas::collect_garbage(&shared).await;
    }
}
