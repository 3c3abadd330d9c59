//! The Cluster service: a node's status, the range table, splits, leader transfers and
//! consistency checks.
//! Administrative calls; the range table they read also refreshes the client's own.

use std::future::Future;
use std::time::Duration;

use keel_proto::v1;
use keel_proto::v1::cluster_client::ClusterClient;
use keel_types::{KvError, NodeId, RangeDescriptor, RangeId, validate};
use tokio::time::Instant;

use super::route::{RangesAnswer, RouteBy};
use super::{Client, Kind, locate, timed_out};
use crate::attempt;
use crate::endpoints;
use crate::range_table::RangeTable;
use crate::results::{self, RangeInfo};
use crate::retry;
use crate::stub::{Stub, Transport};

/// A split: any node takes it and forwards it to the range's leader, so no leader is
/// learned from the answer; its attempts have a write's budget.
const SPLIT: Kind = Kind {
    is_write: true,
    needs_leader: false,
    held: Duration::ZERO,
};

impl Client {
    /// The cluster as the node at `endpoint` sees it. One attempt, to that node only: the
    /// answer is about the node asked.
    pub async fn status(&self, endpoint: &str) -> Result<v1::StatusResponse, KvError> {
        self.cluster_call(endpoint, |mut cluster| async move {
            cluster.status(v1::StatusRequest {}).await
        })
        .await
    }

    /// The data ranges of the cluster in key order: descriptors from the meta range, with
    /// the leader and load the answering node knows of. Any node answers (it forwards to the
    /// meta range's leader); the nodes are asked in turn within `request_timeout`. Also
    /// refreshes the client's own range table. A cluster from before ranges answers
    /// `Fatal` ("does not serve Cluster.Ranges").
    pub async fn ranges(&self) -> Result<Vec<RangeInfo>, KvError> {
        let deadline = Instant::now() + self.inner.options.request_timeout;
        let response = match self.ranges_answer(deadline, &[]).await {
            RangesAnswer::Table(response) => response,
            RangesAnswer::Unimplemented(error) | RangesAnswer::Failed(error) => return Err(error),
        };
        let ranges = results::ranges::ranges(&response)?;
        match RangeTable::from_wire(response) {
            Ok(table) => self.inner.ranges.install(table),
            Err(error) => tracing::warn!(%error, "keel range table refused"),
        }
        Ok(ranges)
    }

    /// Splits the range holding `at` so that `at` starts a new range, and returns both
    /// halves: the parent, now ending at `at`, and the new range. Sent to the range's leader
    /// when known, else to any node (which forwards it), within `write_deadline`.
    ///
    /// A split at a key where a split was already made answers the two halves it made and
    /// changes nothing, so an attempt whose answer was lost (a leader moved, a node did not
    /// answer) is sent again. `EpochMismatch` is final: the range changed meanwhile. A call
    /// given up after an attempt that may have been applied ends with `OutcomeUnknown`
    /// (`ranges` shows whether it happened).
    pub async fn split(&self, at: &[u8]) -> Result<(RangeDescriptor, RangeDescriptor), KvError> {
        validate::check_split_key(at)?;
        let request = v1::SplitRequest {
            at: at.to_vec(),
            no_forward: false,
        };
        let timeout = self.inner.options.write_deadline;
        let answer = self
            .call_with(
                SPLIT,
                RouteBy::Key(at),
                timeout,
                retry::decide_split,
                |mut cluster: ClusterClient<Transport>| {
                    let request = request.clone();
                    async move { cluster.split(request).await }
                },
            )
            .await;
        // A split, made or refused for a changed range, changes the table: refresh it before
        // the next request.
        if let Ok(_) | Err(KvError::EpochMismatch { .. } | KvError::OutcomeUnknown { .. }) = answer
        {
            self.inner.ranges.mark_stale();
        }
        results::ranges::split(answer?)
    }

    /// Asks the leader of `range` to hand leadership to its voter `node`. Any node accepts
    /// the request and forwards it to the leader; the endpoints are tried in turn, one
    /// attempt each. Returns once the hand-over has started.
    pub async fn transfer_leader(&self, range: RangeId, node: NodeId) -> Result<(), KvError> {
        let request = v1::TransferLeaderRequest {
            range_id: range.0,
            node_id: node,
            no_forward: false,
        };
        self.on_any_endpoint(|mut cluster| async move { cluster.transfer_leader(request).await })
            .await
            .map(|_| ())
    }

    /// Registers node `node` at `addr` with the cluster as active, so that it gets replicas
    /// (`keel serve --join` does this for its own node). Returns the registered nodes.
    /// Answered by the meta range's leader; the endpoints are tried in turn, one attempt
    /// each. `InvalidArgument` when the cluster refuses the node (removed before, or an
    /// address or id another node holds).
    pub async fn add_node(&self, node: NodeId, addr: &str) -> Result<Vec<v1::Member>, KvError> {
        let request = v1::AddNodeRequest {
            node_id: node,
            addr: addr.to_string(),
            no_forward: false,
        };
        let answer = self
            .on_any_endpoint(|mut cluster| {
                let request = request.clone();
                async move { cluster.add_node(request).await }
            })
            .await?;
        Ok(answer.nodes)
    }

    /// Starts draining node `node`: its replicas and leaderships move to other nodes, then
    /// it is marked removed (`members` shows the progress). `InvalidArgument` when the node
    /// is unknown or too few active nodes would remain.
    pub async fn remove_node(&self, node: NodeId) -> Result<(), KvError> {
        let request = v1::RemoveNodeRequest {
            node_id: node,
            no_forward: false,
        };
        self.on_any_endpoint(|mut cluster| async move { cluster.remove_node(request).await })
            .await
            .map(|_| ())
    }

    /// The registered nodes with their state, liveness and replica and leader counts, as the
    /// meta range's leader knows them.
    pub async fn members(&self) -> Result<v1::MembersResponse, KvError> {
        let request = v1::MembersRequest { no_forward: false };
        self.on_any_endpoint(|mut cluster| async move { cluster.members(request).await })
            .await
    }

    /// Runs a consistency check now on `range`, or on every range (at most 1,000), each
    /// through its leader, and returns each range's verdict (`Cluster.Check`). A check hashes
    /// every replica of a range, so it is given `timeout` rather than the request timeout;
    /// the endpoints are tried in turn, one attempt each.
    pub async fn check(
        &self,
        range: Option<RangeId>,
        timeout: Duration,
    ) -> Result<Vec<v1::RangeCheck>, KvError> {
        let request = v1::CheckRequest {
            range_id: range.map(|range| range.0),
        };
        let answer = self
            .on_any_endpoint_within(timeout, |mut cluster| async move {
                cluster.check(request).await
            })
            .await?;
        Ok(answer.ranges)
    }

    /// One call of the Cluster service on each endpoint in turn until one answers; a final
    /// `InvalidArgument` is returned at once.
    async fn on_any_endpoint<T, F, Fut>(&self, call: F) -> Result<T, KvError>
    where
        F: Fn(ClusterClient<Transport>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let timeout = self.inner.options.request_timeout;
        self.on_any_endpoint_within(timeout, call).await
    }

    /// `on_any_endpoint`, each call within `timeout`.
    async fn on_any_endpoint_within<T, F, Fut>(
        &self,
        timeout: Duration,
        call: F,
    ) -> Result<T, KvError>
    where
        F: Fn(ClusterClient<Transport>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let mut last = KvError::unavailable("the client has no endpoints");
        for endpoint in &self.inner.endpoints {
            match self.cluster_call_within(endpoint, timeout, &call).await {
                Ok(answer) => return Ok(answer),
                Err(error @ KvError::InvalidArgument { .. }) => return Err(error),
                Err(error) => last = error,
            }
        }
        Err(last)
    }

    /// One call of the Cluster service at `endpoint`, within the request timeout.
    async fn cluster_call<T, F, Fut>(&self, endpoint: &str, call: F) -> Result<T, KvError>
    where
        F: FnOnce(ClusterClient<Transport>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let timeout = self.inner.options.request_timeout;
        self.cluster_call_within(endpoint, timeout, call).await
    }

    /// One call of the Cluster service at `endpoint`, within `timeout`.
    async fn cluster_call_within<T, F, Fut>(
        &self,
        endpoint: &str,
        timeout: Duration,
        call: F,
    ) -> Result<T, KvError>
    where
        F: FnOnce(ClusterClient<Transport>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let uri = endpoints::normalize(endpoint)?;
        let channel = self.inner.pool.channel(&uri)?;
        let cluster = ClusterClient::on(channel, self.inner.credentials.clone());
        match tokio::time::timeout(timeout, call(cluster)).await {
            Ok(Ok(response)) => Ok(response.into_inner()),
            Ok(Err(status)) => Err(retry::final_error(&locate(
                &uri,
                attempt::from_status(&status),
            ))),
            Err(_) => Err(retry::final_error(&timed_out(&uri, timeout))),
        }
    }
}
