//! Lists each tenant's ranges for its quotas: every `TENANT_USAGE_REFRESH_MS`, the range
//! table (from the meta range's leader, with each range's keys and size as its leader last
//! reported them) is read and the ranges wholly inside each namespace kept with the tenant.
//! A range's leader judges a write by its own live counts; the table tells it how many
//! ranges share the quota and how full the others are (`quota::judge`). The split driver
//! keeps every namespace a whole number of ranges; until its bounds have split, a
//! namespace lists no range. Runs only while some tenant has a keys or bytes quota. Knows
//! nothing of requests.

use std::sync::Arc;
use std::time::Duration;

use keel_proto::v1::{RangeInfo, RangesRequest};
use keel_types::tenant::Namespace;
use keel_types::{RangeDescriptor, RangeId, limits};
use tracing::debug;

use crate::access::Access;
use crate::access::quota::Amount;
use crate::api::cluster::ClusterService;
use crate::requests::router::Audience;
use crate::shared::Shared;

/// Runs until the node shuts down (the task is aborted then).
pub(crate) async fn run(shared: Arc<Shared>, access: Arc<Access>) {
    let counted: Vec<_> = access
        .tenants()
        .iter()
        .filter(|tenant| tenant.counts_usage())
        .cloned()
        .collect();
    if counted.is_empty() {
        return;
    }
    let cluster = ClusterService::new(shared.clone(), Audience::Peers);
    let mut tick = tokio::time::interval(Duration::from_millis(limits::TENANT_USAGE_REFRESH_MS));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let request = RangesRequest { no_forward: false };
        match cluster.serve_ranges(&request).await {
            Ok(table) => {
                for tenant in &counted {
                    tenant.set_table(ranges_inside(&table.ranges, &tenant.namespace));
                }
            }
            Err(error) => debug!(%error, "tenant usage not refreshed; trying again next round"),
        }
    }
}

/// The ranges wholly inside `namespace`, with their keys and bytes.
fn ranges_inside(ranges: &[RangeInfo], namespace: &Namespace) -> Vec<(RangeId, Amount)> {
    ranges
        .iter()
        .filter_map(|info| {
            let descriptor = RangeDescriptor::from(info.descriptor.clone()?);
            let counts = Amount {
                keys: info.keys,
                bytes: info.size_bytes,
            };
            namespace
                .holds(&descriptor)
                .then_some((descriptor.id, counts))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use keel_types::RangeId;
    use keel_types::tenant::TenantName;

    use super::*;

    #[test]
    fn only_ranges_inside_the_namespace_count() {
        let acme = Namespace::of(&TenantName::new("acme").unwrap());
        let info = |start: &[u8], end: Option<&[u8]>, keys, size_bytes| RangeInfo {
            descriptor: Some(
                RangeDescriptor {
                    id: RangeId(2),
                    start: start.to_vec(),
                    end: end.map(<[u8]>::to_vec),
                    epoch: 1,
                    conf_version: 1,
                    replicas: vec![1],
                }
                .into(),
            ),
            keys,
            size_bytes,
            ..RangeInfo::default()
        };
        let inside = acme.confine(b"m");
        let ranges = [
            info(b"", Some(acme.start()), 100, 1000),
            info(acme.start(), Some(&inside), 3, 30),
            info(&inside, Some(acme.end()), 4, 40),
            info(acme.end(), None, 100, 1000),
        ];
        let amount = |keys, bytes| Amount { keys, bytes };
        assert_eq!(
            ranges_inside(&ranges, &acme),
            vec![(RangeId(2), amount(3, 30)), (RangeId(2), amount(4, 40))]
        );
        let unsplit = [info(b"", None, 100, 1000)];
        assert_eq!(ranges_inside(&unsplit, &acme), vec![]);
    }
}
