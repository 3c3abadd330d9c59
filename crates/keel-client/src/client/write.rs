//! The write loop: every write carries a request id from the client's session, and is sent
//! again with that same id until it is answered, the answer is final, or `write_deadline`
//! passes. Knows nothing of which write it sends, nor to which service: the caller's closure
//! builds the request on the service's client. An atomic batch whose keys the range table
//! places in more than one range ends with `WriteError::Spans`, before it is sent or once
//! no attempt of it can have been applied; as a `KvError` that is `InvalidArgument`.

use std::future::Future;
use std::time::Duration;

use keel_proto::v1;
use keel_proto::v1::kv_client::KvClient;
use keel_types::validate::show_key;
use keel_types::{KvError, RequestId};
use tokio::time::Instant;

use super::route::{Route, RouteBy};
use super::{Client, Kind, hedge, locate, timed_out};
use crate::attempt::{self, AttemptError};
use crate::range_table::Spans;
use crate::results::{self, Served};
use crate::retry::{self, Target, WriteDecision, WriteProgress};
use crate::session::Pending;
use crate::stub::{Stub, Transport};

/// Opening a session: any node answers, and nothing is written.
const SESSION: Kind = Kind {
    is_write: false,
    needs_leader: false,
    held: Duration::ZERO,
};

/// Why a write returned no answer.
#[derive(Debug)]
pub(crate) enum WriteError {
    Kv(KvError),
    /// The range table places the write's keys in more than one range, and it was applied
    /// nowhere.
    Spans(Spans),
}

impl From<KvError> for WriteError {
    fn from(error: KvError) -> Self {
        WriteError::Kv(error)
    }
}

/// What the caller sees: keys spanning ranges are an invalid argument.
impl From<WriteError> for KvError {
    fn from(error: WriteError) -> Self {
        match error {
            WriteError::Kv(error) => error,
            WriteError::Spans(spans) => spanning_error(&spans),
        }
    }
}

/// What the attempts of one write have learned.
struct Attempts {
    progress: WriteProgress,
    /// Endpoints that failed to connect or answer during this write.
    unreachable: Vec<String>,
    deadline: Instant,
    budget: Duration,
}

impl Client {
    /// Runs `send` with a request id until it succeeds or the retry policy gives up, within
    /// `write_deadline` (plus `kind.held`). Every attempt carries the same id, except after
    /// `Renew`. `kind` must be a write; `by` routes it (a key).
    pub(super) async fn write<S, T, F, Fut>(
        &self,
        kind: Kind,
        by: RouteBy<'_>,
        send: F,
    ) -> Result<T, KvError>
    where
        S: Stub,
        T: Served,
        F: FnMut(S, RequestId) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        self.write_routed(kind, by, send)
            .await
            .map_err(KvError::from)
    }

    /// `write` for keys that may span ranges (`RouteBy::Keys`).
    pub(super) async fn write_routed<S, T, F, Fut>(
        &self,
        kind: Kind,
        by: RouteBy<'_>,
        mut send: F,
    ) -> Result<T, WriteError>
    where
        S: Stub,
        T: Served,
        F: FnMut(S, RequestId) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        assert!(
            kind.is_write && kind.needs_leader,
            "write of a read {kind:?}"
        );
        let budget = self.inner.options.write_deadline.saturating_add(kind.held);
        let deadline = Instant::now() + budget;
        self.prepare_routing(&by, deadline).await;
        if let Some(spans) = self.spans(&by) {
            return Err(WriteError::Spans(spans));
        }
        let mut pending = self.begin_write(deadline).await?;
        let mut attempts = Attempts {
            progress: WriteProgress::default(),
            unreachable: Vec::new(),
            deadline,
            budget,
        };
        let mut route = self.route(&by, &attempts.unreachable);
        loop {
            attempts.progress.attempts += 1;
            let id = pending.id();
            let outcome = self
                .attempt(&route, &by, kind, deadline, &mut |stub| send(stub, id))
                .await;
            let error = match outcome {
                Ok(response) => {
                    self.served(&route, response.range_id(), true);
                    return Ok(response);
                }
                Err(error) => error,
            };
            let (attempt, sequence) = (attempts.progress.attempts, id.sequence);
            tracing::debug!(uri = %route.uri, attempt, sequence, %error, "keel write attempt failed");
            let target = match retry::decide_write(&error, &mut attempts.progress) {
                WriteDecision::GiveUp(error) => return Err(error.into()),
                WriteDecision::Renew => {
                    self.inner.sessions.retire(&id);
                    pending = self.begin_write(deadline).await?;
                    continue;
                }
                WriteDecision::Retry { target } => target,
            };
            route = self
                .next_write_route(route, target, &error, &by, &mut attempts)
                .await?;
        }
    }

    /// After a failed attempt the policy retries: pauses, and routes the next attempt; or
    /// gives up when the pause would pass the deadline, or when the keys now span ranges
    /// and the write was applied nowhere.
    async fn next_write_route(
        &self,
        route: Route,
        target: Target,
        error: &AttemptError,
        by: &RouteBy<'_>,
        attempts: &mut Attempts,
    ) -> Result<Route, WriteError> {
        let target = self.note_failure(&route, error, target, &mut attempts.unreachable);
        let progress = &attempts.progress;
        let pause = retry::write_backoff(&target, progress.attempts, crate::random::unit());
        if pause >= attempts.deadline.saturating_duration_since(Instant::now()) {
            let spent = format!("{} ms", attempts.budget.as_millis());
            return Err(retry::write_gave_up(error, progress, &spent).into());
        }
        tokio::time::sleep(pause).await;
        let route = self
            .reroute(route, target, by, attempts.deadline, &attempts.unreachable)
            .await;
        let first_key = by.key().unwrap_or_default();
        match self.spans(by) {
            Some(spans) if retry::spanning_write_not_applied(progress, error, first_key) => {
                Err(WriteError::Spans(spans))
            }
            _ => Ok(route),
        }
    }

    /// A request id for a new write, opening a client session first when needed.
    async fn begin_write(&self, deadline: Instant) -> Result<Pending, KvError> {
        self.inner
            .sessions
            .begin(|| self.open_session(deadline))
            .await
    }

    /// Asks any node for a new session, within `request_timeout` and the write's deadline:
    /// first the nodes in turn, hedged (`hedge`: a paused node does not hold the write up),
    /// then, if none answered, with the read retry policy for the time left. Failing here,
    /// the write was not sent.
    async fn open_session(&self, deadline: Instant) -> Result<(u64, u64), KvError> {
        let remaining = deadline.saturating_duration_since(Instant::now());
        let timeout = self.inner.options.request_timeout.min(remaining);
        let session_deadline = Instant::now() + timeout;
        let ask = |uri: String| async move {
            let budget = session_deadline.saturating_duration_since(Instant::now());
            let channel = self.inner.pool.channel(&uri)?;
            let mut kv: KvClient<Transport> = Stub::on(channel, self.inner.credentials.clone());
            let answer = tokio::time::timeout(budget, kv.open_session(v1::OpenSessionRequest {}));
            match answer.await {
                Ok(Ok(response)) => results::session(response.into_inner()),
                Ok(Err(status)) => Err(retry::final_error(&locate(
                    &uri,
                    attempt::from_status(&status),
                ))),
                Err(_) => Err(retry::final_error(&timed_out(&uri, budget))),
            }
        };
        let hedged = hedge::first_answer(self.candidates_in_turn(), hedge::HEDGE_AFTER, ask).await;
        let refused = |error: &KvError| {
            matches!(
                error,
                KvError::Unauthenticated { .. }
                    | KvError::PermissionDenied { .. }
                    | KvError::QuotaExceeded { .. }
            )
        };
        let opened = match hedged.map_err(|failures| failures.into_iter().find(refused)) {
            Ok(session) => Ok(session),
            Err(Some(refusal)) => Err(refusal),
            Err(None) => {
                let left = session_deadline.saturating_duration_since(Instant::now());
                self.call(
                    SESSION,
                    RouteBy::AnyNode,
                    left,
                    |mut kv: KvClient<Transport>| async move {
                        kv.open_session(v1::OpenSessionRequest {}).await
                    },
                )
                .await
                .and_then(results::session)
            }
        };
        opened.map_err(|error| match refused(&error) {
            // Refused at the door: the write would be refused alike.
            true => error,
            false => KvError::Unavailable {
                message: format!(
                    "could not open a client session, so the write was not sent: {error}"
                ),
            },
        })
    }
}

/// The refusal of an atomic batch whose keys lie in more than one range.
fn spanning_error(spans: &Spans) -> KvError {
    let (first_key, first) = &spans.first;
    let (second_key, second) = &spans.second;
    KvError::invalid(format!(
        "the batch's keys lie in more than one range (key {} in range {first}, key {} in \
         range {second}); an atomic batch must stay within one range: send it with \
         Client::batch_non_atomic (atomic per range, not as a whole) or split it yourself",
        show_key(first_key),
        show_key(second_key)
    ))
}
