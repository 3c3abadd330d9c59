//! Idempotency records: begin, complete, abort and read one. The writes go through the
//! write loop, so each carries a request id and a retry is answered from the first
//! attempt's record (a retried begin gets the same token back).

use std::time::Duration;

use keel_proto::v1;
use keel_proto::v1::idempotency_client::IdempotencyClient;
use keel_types::coordination::idempotency_key;
use keel_types::validate::{self, show_key};
use keel_types::{Consistency, KvError, limits};

use super::route::RouteBy;
use super::{Client, WRITE, read};
use crate::options::millis;
use crate::results::{self, AbortResult, BeginResult, CompleteResult, IdempotencyGetResult};
use crate::stub::Transport;

impl Client {
    /// Starts the record `(scope, id)` for `owner` (`None`: `Client::owner`), takes over one
    /// whose owner's `ttl` ran out (with a higher token), or reports it: `Started{token}`
    /// (do the work, then `complete` or `abort` with the token), `InProgress{owner}` or
    /// `Completed{result}`. See `idempotent` for the whole dance.
    pub async fn begin(
        &self,
        scope: &[u8],
        id: &[u8],
        owner: Option<&[u8]>,
        ttl: Duration,
    ) -> Result<BeginResult, KvError> {
        validate::check_idempotency_key(scope, id)?;
        // Records are stored, and routed, under this key.
        let key = idempotency_key(scope, id);
        let owner = owner.unwrap_or(self.owner());
        validate::check_owner(owner)?;
        let ttl_ms = checked_ttl_ms("TTL", scope, id, ttl)?;
        let request = v1::BeginRequest {
            scope: scope.to_vec(),
            id: id.to_vec(),
            owner: owner.to_vec(),
            ttl_ms,
            request_id: None,
            no_forward: true,
        };
        let response = self
            .write(
                WRITE,
                RouteBy::Key(&key),
                |mut records: IdempotencyClient<Transport>, request_id| {
                    let request = v1::BeginRequest {
                        request_id: Some(request_id.into()),
                        ..request.clone()
                    };
                    async move { records.begin(request).await }
                },
            )
            .await?;
        results::idempotency::begin(response)
    }

    /// Stores `result` (at most 64 KiB) in the record started with `token`, kept for
    /// `result_ttl`; every later begin and read returns it. Fails with `RecordNotOwned` if
    /// the record was taken over, aborted or dropped: the result is not stored.
    pub async fn complete(
        &self,
        scope: &[u8],
        id: &[u8],
        token: u64,
        result: &[u8],
        result_ttl: Duration,
    ) -> Result<CompleteResult, KvError> {
        validate::check_idempotency_key(scope, id)?;
        // Records are stored, and routed, under this key.
        let key = idempotency_key(scope, id);
        validate::check_idempotency_result(id, result)?;
        let result_ttl_ms = checked_ttl_ms("result TTL", scope, id, result_ttl)?;
        let request = v1::CompleteRequest {
            scope: scope.to_vec(),
            id: id.to_vec(),
            token,
            result: result.to_vec(),
            result_ttl_ms,
            request_id: None,
            no_forward: true,
        };
        let response = self
            .write(
                WRITE,
                RouteBy::Key(&key),
                |mut records: IdempotencyClient<Transport>, request_id| {
                    let request = v1::CompleteRequest {
                        request_id: Some(request_id.into()),
                        ..request.clone()
                    };
                    async move { records.complete(request).await }
                },
            )
            .await?;
        results::idempotency::complete(response)
    }

    /// Drops the record started with `token`, so the next begin starts afresh. Fails with
    /// `RecordNotOwned` if the token does not own it (any more).
    pub async fn abort(&self, scope: &[u8], id: &[u8], token: u64) -> Result<AbortResult, KvError> {
        validate::check_idempotency_key(scope, id)?;
        // Records are stored, and routed, under this key.
        let key = idempotency_key(scope, id);
        let request = v1::AbortRequest {
            scope: scope.to_vec(),
            id: id.to_vec(),
            token,
            request_id: None,
            no_forward: true,
        };
        let response = self
            .write(
                WRITE,
                RouteBy::Key(&key),
                |mut records: IdempotencyClient<Transport>, request_id| {
                    let request = v1::AbortRequest {
                        request_id: Some(request_id.into()),
                        ..request.clone()
                    };
                    async move { records.abort(request).await }
                },
            )
            .await?;
        results::idempotency::abort(response)
    }

    /// The live record `(scope, id)`, if any, read with `consistency`.
    pub async fn idempotency_get(
        &self,
        scope: &[u8],
        id: &[u8],
        consistency: Consistency,
    ) -> Result<IdempotencyGetResult, KvError> {
        validate::check_idempotency_key(scope, id)?;
        // Records are stored, and routed, under this key.
        let key = idempotency_key(scope, id);
        let request = v1::IdempotencyGetRequest {
            scope: scope.to_vec(),
            id: id.to_vec(),
            consistency: v1::Consistency::from(consistency).into(),
            no_forward: true,
        };
        let timeout = self.inner.options.request_timeout;
        let response = self
            .call(
                read(consistency),
                RouteBy::Key(&key),
                timeout,
                |mut records: IdempotencyClient<Transport>| {
                    let request = request.clone();
                    async move { records.get(request).await }
                },
            )
            .await?;
        results::idempotency::get(response)
    }
}

/// A record's TTL or result TTL checked (1 ms to 1 year), as the API carries it.
pub(super) fn checked_ttl_ms(
    what: &str,
    scope: &[u8],
    id: &[u8],
    ttl: Duration,
) -> Result<i64, KvError> {
    let what = format!(
        "{what} of idempotency record {} of scope {}",
        show_key(id),
        show_key(scope)
    );
    let ttl_ms = millis(ttl);
    validate::check_duration_ms(&what, ttl_ms, 1, limits::TTL_MS_MAX)?;
    Ok(ttl_ms)
}
