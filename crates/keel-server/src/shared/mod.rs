//! What the gRPC services and background tasks of one node share (`Shared`): its id and
//! address, the initial cluster, its groups, store, settings, peer channels, and the state
//! the node keeps, one leaf module each: range tables, heartbeats, leader settling, load counters, published
//! descriptors, prepared replicas, meta leadership, split thresholds, health, recent events,
//! lock waiters (for the console) and the consistency checks it led. The leaf
//! modules never name `Shared`, and nothing here imports the rooms whose tasks and services
//! take it. Knows nothing of request semantics.

pub(crate) mod applied_cache;
pub(crate) mod checks;
pub(crate) mod events;
pub(crate) mod health;
pub(crate) mod heartbeats;
pub(crate) mod leader_settling;
pub(crate) mod load;
pub(crate) mod lock_waiters;
pub(crate) mod meta_leadership;
pub(crate) mod prepared;
pub(crate) mod published;
pub(crate) mod range_tables;
pub(crate) mod split_thresholds;
pub(crate) mod watch_pages;
pub(crate) mod watch_progress;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use keel_raft::{GroupError, Groups, RaftGroup, RaftTimings};
use keel_storage::Store;
use keel_types::{KvError, MetaMembers, NodeAddr, NodeDescriptor, NodeId, RangeId, SharedClock};

use crate::access::tls::TlsSettings;
use crate::access::{Access, Call, Caller};
use crate::config::faults::Faults;
use crate::config::{KvSettings, PlacementSettings};
use crate::metrics::Metrics;
use crate::peer::batch::Links;
use crate::peer::channels::Peers;
use crate::shared::checks::CheckRecords;
use crate::shared::events::Events;
use crate::shared::health::Health;
use crate::shared::heartbeats::Heartbeats;
use crate::shared::leader_settling::LeaderSettling;
use crate::shared::load::LoadTracker;
use crate::shared::lock_waiters::LockWaiters;
use crate::shared::meta_leadership::MetaLeadership;
use crate::shared::prepared::Prepared;
use crate::shared::published::Published;
use crate::shared::range_tables::RangeTables;
use crate::shared::split_thresholds::SplitThresholds;
use crate::shared::watch_pages::WatchPages;
use crate::shared::watch_progress::WatchIds;
use crate::status::{kv_error, to_status};

pub(crate) struct Shared {
    pub node_id: NodeId,
    /// The address peers use for this node (its address in Raft membership and the meta
    /// range's records); without a peer port also the one clients use.
    pub addr: String,
    /// The address clients use for this node: `addr`, unless the node has a peer port.
    pub client_addr: String,
    /// Whether the node serves peers on a port of their own (`--peer-listen`).
    pub peer_port: bool,
    /// The initial cluster's nodes and addresses (the meta range's first replicas are its
    /// first three ids); empty on a node that joined.
    pub cluster: BTreeMap<NodeId, String>,
    /// Addresses of running nodes this node joins the cluster through.
    pub join: Vec<String>,
    /// The first range and the meta range, for each this node waits to receive from the
    /// bootstrap's log: it is of the initial cluster and its store never held state of it.
    pub awaits_bootstrap: BTreeSet<RangeId>,
    pub groups: Groups,
    pub store: Store,
    /// The local range table (routing) and the cached meta table (forwarding).
    pub ranges: RangeTables,
    /// Requests served per range, for splits by load and `Cluster.Ranges`.
    pub load: LoadTracker,
    /// The descriptors this node last published to the meta range.
    pub published: Published,
    pub peers: Arc<Peers>,
    /// The `Raft.Forward` streams that carry requests this node sends on to leaders.
    pub forwards: Links,
    pub health: Health,
    /// The last heartbeat of every node.
    pub heartbeats: Heartbeats,
    /// Whether the cluster's leaders settled since the node started (readiness waits).
    pub settling: LeaderSettling,
    /// Empty groups prepared for replicas on their way.
    pub prepared: Prepared,
    /// Since when this node leads the meta range.
    pub meta_leadership: MetaLeadership,
    pub placement: PlacementSettings,
    pub timings: RaftTimings,
    pub kv: KvSettings,
    /// The split settings the split driver uses now: `kv.split`, unless a test changed them
    /// (`Faults.SetSplitThresholds`).
    pub split: SplitThresholds,
    pub clock: SharedClock,
    pub faults: Faults,
    /// What the node counts for `--metrics-listen`.
    pub metrics: Metrics,
    /// Splits, replica changes and leader changes this node saw lately (for the console).
    pub events: Events,
    /// Who waits for which lock on this node (for the console).
    pub lock_waiters: LockWaiters,
    /// The last page of events of each range with a watch stream open on this node.
    pub watch_pages: WatchPages,
    /// The watch streams open on this node by id, for `Kv.WatchProgress`.
    pub watch_ids: WatchIds,
    /// The consistency checks this node led: the last report per range, its alarms.
    pub checks: CheckRecords,
    /// The tokens of `--auth-tokens`; `None` while authentication is off.
    pub access: Option<Arc<Access>>,
    /// The node's certificate, key and cluster CA when TLS is on: the server accepts TLS
    /// only and `peers` dial https. Who called is `tls::is_peer`, on any request.
    pub tls: Option<TlsSettings>,
}

impl Shared {
    /// The caller of `request`, when it may make `call` now; else the status to answer.
    pub fn admit<T>(
        &self,
        request: &tonic::Request<T>,
        call: Call,
    ) -> Result<Caller, tonic::Status> {
        crate::access::admit(self.access.as_deref(), request, call)
    }

    /// The group serving `range`; `Unavailable` while this node hosts none.
    pub fn group(&self, range: RangeId) -> Result<Arc<RaftGroup>, KvError> {
        self.groups.get(range).ok_or_else(|| {
            KvError::unavailable(format!(
                "range {range} is not hosted on node {}",
                self.node_id
            ))
        })
    }

    /// The group of `range`, started first if this node runs none yet (a range its store
    /// holds: the caller found it in the local table).
    pub async fn ensure_group(&self, range: RangeId) -> Result<Arc<RaftGroup>, KvError> {
        self.groups
            .ensure(range)
            .await
            .map_err(|error| match error {
                GroupError::ShuttingDown(_) | GroupError::Retired(_) => {
                    KvError::unavailable(error.to_string())
                }
                error => KvError::fatal(error.to_string()),
            })
    }

    /// Whether this node still waits for `range`'s first state from the bootstrap's log (a
    /// range it has no state of yet).
    pub fn awaits_bootstrap(&self, range: RangeId) -> bool {
        self.awaits_bootstrap.contains(&range)
            && self
                .groups
                .get(range)
                .is_none_or(|group| group.membership().voters.is_empty())
    }

    /// How long a forwarded request may take: the leader's own deadline plus one second of
    /// network slack.
    pub fn forward_deadline(&self, write: bool) -> Duration {
        let own = if write {
            self.timings.write_timeout_ms
        } else {
            self.timings.read_timeout_ms
        };
        Duration::from_millis(own + 1_000)
    }

    /// Another node to ask about `range` when this node does not lead it: the meta range's
    /// leader or a voter of it (the meta range), else a replica the meta table names.
    pub fn replica_hint(&self, range: RangeId) -> Option<(NodeId, NodeAddr)> {
        let me = self.node_id;
        if range == RangeId::META {
            let members = self.ranges.meta_members();
            let leader = members.leader.filter(|id| *id != me);
            let preferred = leader
                .into_iter()
                .chain(members.voters.iter().map(|v| v.id));
            return preferred
                .filter(|id| *id != me)
                .find_map(|id| Some((id, self.node_addr(id)?)));
        }
        let recorded = self.ranges.meta_ranges();
        let range = recorded.into_iter().find(|recorded| recorded.id == range)?;
        range
            .replicas
            .into_iter()
            .filter(|id| *id != me)
            .find_map(|id| Some((id, self.node_addr(id)?)))
    }

    /// A node's address: as the meta range records it, as the initial cluster lists it, or as
    /// the meta range's members name it.
    pub fn node_addr(&self, node: NodeId) -> Option<NodeAddr> {
        self.ranges
            .meta_addr(node)
            .or_else(|| self.cluster.get(&node).map(NodeAddr::new))
            .or_else(|| {
                let members = self.ranges.meta_members();
                let voter = members.voters.into_iter().find(|voter| voter.id == node);
                voter.map(|voter| voter.addr)
            })
    }

    /// The address clients use for `node`: this node's own; else the one `node` gave in its
    /// last heartbeat; else, without a peer port, its peer address (the same). `None` while
    /// this node, with a peer port, has not heard it yet.
    pub fn client_addr(&self, node: NodeId) -> Option<NodeAddr> {
        if node == self.node_id {
            return Some(NodeAddr::new(self.client_addr.clone()));
        }
        if let Some(addr) = self.heartbeats.client_addr(node) {
            return Some(NodeAddr::new(addr));
        }
        match self.peer_port {
            true => None,
            false => self.node_addr(node),
        }
    }

    /// `error` as a client may see it: a `NotLeader` hint names the leader's client address,
    /// or no leader while that address is unknown (never a peer address).
    pub fn for_clients(&self, error: KvError) -> KvError {
        match error {
            KvError::NotLeader {
                range_id,
                leader: Some((leader, _)),
            } => KvError::NotLeader {
                range_id,
                leader: self.client_addr(leader).map(|addr| (leader, addr)),
            },
            error => error,
        }
    }

    /// A status for a client: one carrying a `NotLeader` (this node's or relayed from
    /// another) with its hint as `for_clients` makes it; any other as it is.
    pub fn client_status(&self, status: tonic::Status) -> tonic::Status {
        match kv_error(&status) {
            Some(
                error @ KvError::NotLeader {
                    leader: Some(_), ..
                },
            ) => to_status(&self.for_clients(error)),
            _ => status,
        }
    }

    /// The meta range's members as this node knows them: from its own replica when it has one
    /// with a membership, else what heartbeats taught it.
    pub fn meta_members(&self) -> MetaMembers {
        if let Some(group) = self.groups.get(RangeId::META) {
            let members = group.members();
            if !members.is_empty() {
                let voters = members
                    .into_iter()
                    .filter(|member| member.voter)
                    .map(|member| NodeDescriptor {
                        id: member.id,
                        addr: member.addr,
                    })
                    .collect();
                let leader = group.leader().map(|(id, _)| id);
                return MetaMembers { leader, voters };
            }
        }
        self.ranges.meta_members()
    }
}
