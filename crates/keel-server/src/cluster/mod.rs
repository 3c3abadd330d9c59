//! The cluster of nodes: heartbeats between them (which also settle quiescence), the view of
//! every node and range the meta range's leader gathers (`placement`), the rebalancer that
//! spreads replicas and leaderships, joining a running cluster, and the node operations of
//! `Cluster` (`nodes`). Uses `ranges` to reach the meta range and change replicas; never
//! imports `api`, `locks` or `requests`.

pub(crate) mod heartbeat;
pub(crate) mod join;
pub(crate) mod nodes;
pub(crate) mod placement;
pub(crate) mod quiescence;
pub(crate) mod rebalancer;
