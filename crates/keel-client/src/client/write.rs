//! The write loop: every write carries a request id from the client's session, and is sent
//! again with that same id until it is answered, the answer is final, or `write_deadline`
//! passes. Knows nothing of which write it sends, nor to which service: the caller's closure
//! builds the request on the service's client.

use std::future::Future;
use std::time::Duration;

use keel_proto::v1;
use keel_proto::v1::kv_client::KvClient;
use keel_types::{KvError, RequestId};
use tokio::time::Instant;
use tonic::transport::Channel;

use super::{Client, Kind};
use crate::results;
use crate::retry::{self, WriteDecision, WriteProgress};
use crate::session::Pending;
use crate::stub::Stub;

/// Opening a session: any node answers, and nothing is written.
const SESSION: Kind = Kind {
    is_write: false,
    needs_leader: false,
    held: Duration::ZERO,
};

impl Client {
    /// Runs `send` with a request id until it succeeds or the retry policy gives up, within
    /// `write_deadline` (plus `kind.held`). Every attempt carries the same id, except after
    /// `Renew`. `kind` must be a write.
    pub(super) async fn write<S, T, F, Fut>(&self, kind: Kind, mut send: F) -> Result<T, KvError>
    where
        S: Stub,
        F: FnMut(S, RequestId) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        assert!(
            kind.is_write && kind.needs_leader,
            "write of a read {kind:?}"
        );
        let budget = self.inner.options.write_deadline.saturating_add(kind.held);
        let deadline = Instant::now() + budget;
        let mut pending = self.begin_write(deadline).await?;
        let mut progress = WriteProgress::default();
        let mut uri = self.first_target();
        // Endpoints that failed to connect or answer during this write.
        let mut unreachable: Vec<String> = Vec::new();
        loop {
            progress.attempts += 1;
            let id = pending.id();
            let outcome = self
                .attempt(&uri, kind, deadline, &mut |stub| send(stub, id))
                .await;
            let error = match outcome {
                Ok(response) => {
                    self.set_leader(Some(uri));
                    return Ok(response);
                }
                Err(error) => error,
            };
            let (attempt, sequence) = (progress.attempts, id.sequence);
            tracing::debug!(%uri, attempt, sequence, %error, "keel write attempt failed");
            let target = match retry::decide_write(&error, &mut progress) {
                WriteDecision::GiveUp(error) => return Err(error),
                WriteDecision::Renew => {
                    self.inner.sessions.retire(&id);
                    pending = self.begin_write(deadline).await?;
                    continue;
                }
                WriteDecision::Retry { target } => target,
            };
            self.note_failure(&uri, &error, &target, &mut unreachable);
            let target = retry::skip_stale_hint(target, &unreachable);
            let pause = retry::write_backoff(&target, progress.attempts, crate::random::unit());
            if pause >= deadline.saturating_duration_since(Instant::now()) {
                let spent = format!("{} ms", budget.as_millis());
                return Err(retry::write_gave_up(&error, &progress, &spent));
            }
            tokio::time::sleep(pause).await;
            uri = self.retarget(target, uri, &unreachable);
        }
    }

    /// A request id for a new write, opening a client session first when needed.
    async fn begin_write(&self, deadline: Instant) -> Result<Pending, KvError> {
        self.inner
            .sessions
            .begin(|| self.open_session(deadline))
            .await
    }

    /// Asks any node for a new session, within `request_timeout` and the write's deadline.
    /// Failing here, the write was not sent.
    async fn open_session(&self, deadline: Instant) -> Result<(u64, u64), KvError> {
        let remaining = deadline.saturating_duration_since(Instant::now());
        let timeout = self.inner.options.request_timeout.min(remaining);
        let opened = self
            .call(SESSION, timeout, |mut kv: KvClient<Channel>| async move {
                kv.open_session(v1::OpenSessionRequest {}).await
            })
            .await
            .and_then(results::session);
        opened.map_err(|error| KvError::Unavailable {
            message: format!("could not open a client session, so the write was not sent: {error}"),
        })
    }
}
