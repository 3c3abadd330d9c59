//! Routing: which node an attempt goes to, and what an answer teaches about that.
//!
//! With a range table, a request goes to the leader of the range holding its key, else to a
//! reachable replica of it in turn; a `NotLeader` hint sets that range's leader. Without one
//! (none fetched yet, or a cluster that does not serve `Cluster.Ranges`), it goes to the
//! cached leader, else to the next endpoint, as before ranges. An answer from another range
//! than the one picked, `KeyOutOfRange` or `EpochMismatch` refreshes the table (rate-limited,
//! shared by concurrent requests: `range_cache`). The rules are the pure functions of
//! `range_table`; this module fetches the table and keeps the leader caches.

use std::sync::atomic::Ordering;
use std::time::Duration;

use keel_proto::v1;
use keel_proto::v1::cluster_client::ClusterClient;
use keel_types::KvError;
use tokio::time::Instant;
use tonic::Code;

use super::{Client, hedge, locate, timed_out};
use crate::attempt::{self, AttemptError};
use crate::endpoints;
use crate::range_cache::{Fetched, Urgency};
use crate::range_table::{self, Picked, RangeTable, Spans, Stale};
use crate::retry::{self, Target};
use crate::stub::{Stub, Transport};

/// What routes a request.
#[derive(Debug, Clone, Copy)]
pub(crate) enum RouteBy<'a> {
    /// Any node serves it (opening a session).
    AnyNode,
    /// The range holding this key, on its leader.
    Key(&'a [u8]),
    /// The range holding this key, on any replica (a follower read): the first of the
    /// client's own endpoints that replicates it, else as `Key`.
    AnyReplica(&'a [u8]),
    /// An atomic batch: the range holding its first key, which must hold all of them.
    Keys(&'a [Vec<u8>]),
}

impl RouteBy<'_> {
    /// The key that routes it.
    pub(super) fn key(&self) -> Option<&[u8]> {
        match self {
            RouteBy::AnyNode => None,
            RouteBy::Key(key) | RouteBy::AnyReplica(key) => Some(key),
            RouteBy::Keys(keys) => keys.first().map(Vec::as_slice),
        }
    }
}

/// Where one attempt goes, and why.
#[derive(Debug, Clone)]
pub(super) struct Route {
    pub uri: String,
    pub picked: Picked,
    /// The range table's generation when the route was chosen.
    generation: u64,
}

/// A `Cluster.Ranges` answer, or why there is none.
pub(super) enum RangesAnswer {
    Table(v1::RangesResponse),
    /// Every node that answered said UNIMPLEMENTED: an older cluster.
    Unimplemented(KvError),
    Failed(KvError),
}

impl Client {
    /// Before the first attempt of a keyed request: fetches the range table if there is none
    /// yet (concurrent first requests share one fetch), or refreshes one suspected stale if
    /// a fetch is allowed now.
    pub(super) async fn prepare_routing(&self, by: &RouteBy<'_>, deadline: Instant) {
        if let RouteBy::AnyNode = by {
            return;
        }
        if let Some(urgency) = self.inner.ranges.wanted() {
            let seen = self.inner.ranges.generation();
            self.refresh_ranges(seen, urgency, deadline, &[]).await;
        }
    }

    /// The route of the next attempt, passing over `unreachable` endpoints while others
    /// remain.
    pub(super) fn route(&self, by: &RouteBy<'_>, unreachable: &[String]) -> Route {
        let rotation = self.inner.cursor.load(Ordering::Relaxed);
        let preferred: &[String] = match by {
            RouteBy::AnyReplica(_) => &self.inner.endpoints,
            _ => &[],
        };
        let (picked, uri, generation) =
            self.inner
                .ranges
                .pick(by.key(), preferred, unreachable, rotation);
        let uri = uri.unwrap_or_else(|| self.fallback_uri(unreachable));
        Route {
            uri,
            picked,
            generation,
        }
    }

    /// The two first ranges the keys of `by` fall in, if the table places them in more than
    /// one.
    pub(super) fn spans(&self, by: &RouteBy<'_>) -> Option<Spans> {
        let RouteBy::Keys(keys) = by else {
            return None;
        };
        let keys: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
        self.inner.ranges.spans(&keys)
    }

    /// After a success: a leader-only request found the leader; an answer from another range
    /// than the one picked shows the table is stale.
    pub(super) fn served(&self, route: &Route, range_id: u64, needs_leader: bool) {
        if needs_leader {
            self.note_leader(route.picked, route.uri.clone());
        }
        if range_table::served_as_stale(route.picked, range_id) {
            self.inner.ranges.mark_stale();
        }
    }

    /// After a failed attempt that will be retried: where the next attempt goes, given
    /// `target` from the retry policy and what the refusal shows of the table. Stops sending
    /// to the failed node first unless it is to be asked again, and remembers it if it could
    /// not be reached or did not answer. A lost answer does not make a node unreachable: it
    /// may be the leader, and a follower's hint must lead back to it (a crashed node shows
    /// as unreachable at the next connection attempt). A node given up on for a leader
    /// another replica named is passed over too: a hint naming it is older news.
    pub(super) fn note_failure(
        &self,
        route: &Route,
        error: &AttemptError,
        target: Target,
        unreachable: &mut Vec<String>,
    ) -> Target {
        let target = match range_table::refused_as_stale(route.picked, error) {
            Stale::Shown => Target::Refresh,
            Stale::Suspected => {
                self.inner.ranges.mark_stale();
                target
            }
            Stale::No => target,
        };
        if target != Target::Same {
            self.forget_leader(route);
        }
        if matches!(
            error,
            AttemptError::NotSent(_) | AttemptError::TimedOut(_) | AttemptError::Superseded { .. }
        ) {
            unreachable.push(route.uri.clone());
        }
        retry::skip_stale_hint(target, unreachable)
    }

    /// The route after `route` failed and the policy chose `target`: the same node, the
    /// hinted leader (now cached for the range), the next replica or endpoint, or the route
    /// through a refreshed table.
    pub(super) async fn reroute(
        &self,
        route: Route,
        target: Target,
        by: &RouteBy<'_>,
        deadline: Instant,
        unreachable: &[String],
    ) -> Route {
        match target {
            Target::Same => return route,
            Target::Hinted(addr) => {
                // `skip_stale_hint` turned unparsable hints into `Next`; this is a second guard.
                if let Ok(uri) = endpoints::normalize(&addr.addr) {
                    self.note_leader(route.picked, uri.clone());
                    return Route { uri, ..route };
                }
                self.inner.cursor.fetch_add(1, Ordering::Relaxed);
            }
            Target::Next => {
                self.inner.cursor.fetch_add(1, Ordering::Relaxed);
            }
            Target::Refresh => {
                self.refresh_ranges(route.generation, Urgency::Wait, deadline, unreachable)
                    .await;
            }
        }
        self.route(by, unreachable)
    }

    /// Refreshes the range table unless another refresh since generation `seen` did, as the
    /// rate limit and `urgency` allow. Nodes in `unreachable` are asked last.
    pub(super) async fn refresh_ranges(
        &self,
        seen: u64,
        urgency: Urgency,
        deadline: Instant,
        unreachable: &[String],
    ) {
        let fetch = || self.fetch_ranges(deadline, unreachable);
        self.inner
            .ranges
            .refresh(seen, urgency, deadline, fetch)
            .await;
    }

    async fn fetch_ranges(&self, deadline: Instant, unreachable: &[String]) -> Fetched {
        match self.ranges_answer(deadline, unreachable).await {
            RangesAnswer::Table(response) => match RangeTable::from_wire(response) {
                Ok(table) => Fetched::Table(table),
                Err(error) => {
                    tracing::warn!(%error, "keel range table refused");
                    Fetched::Failed
                }
            },
            RangesAnswer::Unimplemented(_) => Fetched::Unsupported,
            RangesAnswer::Failed(error) => {
                tracing::debug!(%error, "keel range table not fetched");
                Fetched::Failed
            }
        }
    }

    /// Asks the nodes for the range table (the cached leader first, then the endpoints from
    /// the rotation, those in `unreachable` last), hedged (`hedge`): the next node is asked
    /// too when one fails or has not answered within `HEDGE_AFTER`, each within the read
    /// attempt timeout and `deadline`. Any node answers: it forwards to the meta range's
    /// leader.
    pub(super) async fn ranges_answer(
        &self,
        deadline: Instant,
        unreachable: &[String],
    ) -> RangesAnswer {
        let mut candidates = self.candidates_in_turn();
        // Stable: the order stays otherwise.
        candidates.sort_by_key(|uri| unreachable.contains(uri));
        let ask = |uri: String| async move {
            let remaining = deadline.saturating_duration_since(Instant::now());
            let budget = remaining.min(self.inner.options.read_attempt_timeout);
            let answer = self.ask_ranges(&uri, budget).await;
            if let Err(Some(error)) = &answer {
                tracing::debug!(%uri, %error, "keel range table: node did not answer");
            }
            answer.map_err(|error| (uri, error))
        };
        let failures = match hedge::first_answer(candidates, hedge::HEDGE_AFTER, ask).await {
            Ok(response) => return RangesAnswer::Table(response),
            Err(failures) => failures,
        };
        let unimplemented = failures.iter().any(|(_, error)| error.is_none());
        let last = failures.into_iter().last().map(|(uri, error)| {
            error.unwrap_or_else(|| {
                KvError::fatal(format!(
                    "{uri} does not serve Cluster.Ranges (a server from before ranges)"
                ))
            })
        });
        let last = last
            .unwrap_or_else(|| KvError::unavailable("no endpoint was asked for the range table"));
        match unimplemented {
            true => RangesAnswer::Unimplemented(last),
            false => RangesAnswer::Failed(last),
        }
    }

    /// One `Cluster.Ranges` call; `Err(None)`: UNIMPLEMENTED.
    async fn ask_ranges(
        &self,
        uri: &str,
        budget: Duration,
    ) -> Result<v1::RangesResponse, Option<KvError>> {
        let channel = self.inner.pool.channel(uri).map_err(Some)?;
        let mut cluster: ClusterClient<Transport> =
            Stub::on(channel, self.inner.credentials.clone());
        let request = v1::RangesRequest { no_forward: false };
        match tokio::time::timeout(budget, cluster.ranges(request)).await {
            Ok(Ok(response)) => Ok(response.into_inner()),
            Ok(Err(status)) if status.code() == Code::Unimplemented => Err(None),
            Ok(Err(status)) => {
                let error = locate(uri, attempt::from_status(&status));
                Err(Some(retry::final_error(&error)))
            }
            Err(_) => Err(Some(retry::final_error(&timed_out(uri, budget)))),
        }
    }

    /// The cached leader, then every endpoint from the rotation on: the nodes to ask in turn
    /// for what any node answers.
    pub(super) fn candidates_in_turn(&self) -> Vec<String> {
        let endpoints = &self.inner.endpoints;
        let start = self.inner.cursor.load(Ordering::Relaxed);
        let mut candidates: Vec<String> = self.leader().into_iter().collect();
        for offset in 0..endpoints.len() {
            let uri = &endpoints[(start + offset) % endpoints.len()];
            if !candidates.contains(uri) {
                candidates.push(uri.clone());
            }
        }
        candidates
    }

    /// Without a usable node from the table: the cached leader, else the endpoint at the
    /// rotation, passing over unreachable ones while others remain.
    fn fallback_uri(&self, unreachable: &[String]) -> String {
        if let Some(leader) = self.leader().filter(|leader| !unreachable.contains(leader)) {
            return leader;
        }
        let endpoints = &self.inner.endpoints;
        let start = self.inner.cursor.load(Ordering::Relaxed);
        (0..endpoints.len())
            .map(|offset| &endpoints[(start + offset) % endpoints.len()])
            .find(|uri| !unreachable.contains(uri))
            .unwrap_or(&endpoints[start % endpoints.len()])
            .clone()
    }

    fn note_leader(&self, picked: Picked, uri: String) {
        match picked {
            Picked::Range(range) => self
                .inner
                .ranges
                .update(|table| table.set_leader(range, uri)),
            Picked::Whole | Picked::Unrouted => self.set_leader(Some(uri)),
        }
    }

    /// After a failure at `route`, stop sending there first if it was the cached leader.
    fn forget_leader(&self, route: &Route) {
        match route.picked {
            Picked::Range(range) => self
                .inner
                .ranges
                .update(|table| table.forget_leader(range, &route.uri)),
            Picked::Whole | Picked::Unrouted => {
                let mut leader = self.inner.leader.lock().expect("leader lock poisoned");
                if leader.as_deref() == Some(route.uri.as_str()) {
                    *leader = None;
                }
            }
        }
    }

    fn leader(&self) -> Option<String> {
        self.inner
            .leader
            .lock()
            .expect("leader lock poisoned")
            .clone()
    }

    fn set_leader(&self, uri: Option<String>) {
        *self.inner.leader.lock().expect("leader lock poisoned") = uri;
    }
}
