//! Following a leader that moved while an attempt at it waits. A leader that is paused or cut
//! off answers nothing, and its followers elect another within about a second, long before
//! the attempt's timeout. So while an attempt routed by key waits, the client asks another
//! replica of the range every `PROBE_INTERVAL` which leader it knows (`Cluster.Leader`,
//! answered from that replica's own view, without asking anyone); once one names a node other
//! than the one the attempt waits on, the attempt is given up (`AttemptError::Superseded`: it
//! may still be applied, exactly as after a timeout) and the next goes to the named leader. A
//! leader that is slow but still leads is waited for as before: slowness alone gives up
//! nothing, so the probe needs no deadline derived from observed latency, and costs one small
//! call per interval of waiting, only while an attempt is slow.

use std::future::pending;
use std::sync::atomic::Ordering;
use std::time::Duration;

use keel_proto::v1;
use keel_proto::v1::cluster_client::ClusterClient;
use keel_types::NodeAddr;

use super::Client;
use super::route::{Route, RouteBy};
use crate::endpoints;
use crate::range_table::Picked;
use crate::stub::{Stub, Transport};

/// How long an attempt waits before the first probe, and between probes.
const PROBE_INTERVAL: Duration = Duration::from_millis(250);

impl Client {
    /// Resolves with the leader another replica names once one names a node other than
    /// `route`'s; never resolves for a request not routed by key (any node or any replica
    /// serves it) or when there is no other node to ask.
    pub(super) async fn leader_moved(&self, route: &Route, by: &RouteBy<'_>) -> NodeAddr {
        let key = match by {
            RouteBy::Key(_) | RouteBy::Keys(_) => by.key(),
            RouteBy::AnyNode | RouteBy::AnyReplica(_) => None,
        };
        let Some(key) = key else {
            return pending().await;
        };
        // Nothing more before the first interval: most attempts are answered by then.
        tokio::time::sleep(PROBE_INTERVAL).await;
        let others = self.probe_candidates(route);
        if others.is_empty() {
            return pending().await;
        }
        let mut asked = self.inner.cursor.load(Ordering::Relaxed);
        loop {
            let uri = &others[asked % others.len()];
            asked = asked.wrapping_add(1);
            if let Some(leader) = self.ask_leader(uri, key).await
                && endpoints::normalize(&leader.addr).is_ok_and(|leader| leader != route.uri)
            {
                tracing::debug!(waiting_on = %route.uri, asked = %uri, leader = %leader.addr,
                    "keel attempt given up: another replica names a new leader");
                return leader;
            }
            tokio::time::sleep(PROBE_INTERVAL).await;
        }
    }

    /// The nodes to ask: the other replicas of the range the table names, else the other
    /// endpoints.
    fn probe_candidates(&self, route: &Route) -> Vec<String> {
        let replicas = match route.picked {
            Picked::Range(range) => self.inner.ranges.replica_uris(range),
            Picked::Whole | Picked::Unrouted => Vec::new(),
        };
        let candidates = match replicas.is_empty() {
            true => self.inner.endpoints.clone(),
            false => replicas,
        };
        candidates
            .into_iter()
            .filter(|uri| *uri != route.uri)
            .collect()
    }

    /// The leader `uri` knows for the range holding `key`, if it answers within a probe
    /// interval and knows one with an address.
    async fn ask_leader(&self, uri: &str, key: &[u8]) -> Option<NodeAddr> {
        let channel = self.inner.pool.channel(uri).ok()?;
        let mut cluster: ClusterClient<Transport> =
            Stub::on(channel, self.inner.credentials.clone());
        let request = v1::LeaderRequest { key: key.to_vec() };
        let answer = tokio::time::timeout(PROBE_INTERVAL, cluster.leader(request)).await;
        let response = answer.ok()?.ok()?.into_inner();
        response.leader_id?;
        (!response.leader_addr.is_empty()).then(|| NodeAddr::new(response.leader_addr))
    }
}
