//! `keel idem begin|complete|abort|get`: durations checked against the limits before
//! anything is sent (and a result from stdin read, bounded), then one keel-client call each.

use std::ffi::OsStr;
use std::time::Duration;

use keel_client::Client;
use keel_types::validate::{self, show_key};
use keel_types::{KvError, limits};

use crate::args::{IdemCommand, bytes};
use crate::input;
use crate::output::{self, Output, Report, ValueForm};

pub async fn run(client: &Client, command: IdemCommand, out: Output) -> Result<Report, KvError> {
    match command {
        IdemCommand::Begin {
            scope,
            id,
            ttl,
            owner,
        } => {
            let (scope, id) = (bytes(&scope), bytes(&id));
            let ttl = record_ttl("TTL", &scope, &id, ttl)?;
            let owner = owner.as_ref().map(bytes);
            let result = client.begin(&scope, &id, owner.as_deref(), ttl).await?;
            Ok(output::idem::begin(&result, out))
        }
        IdemCommand::Complete {
            scope,
            id,
            token,
            result,
            result_ttl,
        } => {
            let (scope, id) = (bytes(&scope), bytes(&id));
            let result_ttl = record_ttl("result TTL", &scope, &id, result_ttl)?;
            let result = record_result(result.as_deref(), &scope, &id)?;
            let completed = client
                .complete(&scope, &id, token, &result, result_ttl)
                .await?;
            Ok(output::idem::complete(&completed, out))
        }
        IdemCommand::Abort { scope, id, token } => {
            let result = client.abort(&bytes(&scope), &bytes(&id), token).await?;
            Ok(output::idem::abort(&result, out))
        }
        IdemCommand::Get {
            scope,
            id,
            consistency,
            raw,
        } => {
            let (scope, id) = (bytes(&scope), bytes(&id));
            let result = client
                .idempotency_get(&scope, &id, consistency.into())
                .await?;
            // Not `get`'s rule: the state word is the text form's contract with scripts,
            // so only --raw drops it.
            let form = if raw {
                ValueForm::Exact
            } else {
                ValueForm::Line
            };
            Ok(output::idem::get(&scope, &id, &result, out, form))
        }
    }
}

/// The result to complete a record with: its argument, or stdin up to the result limit. The
/// scope and id are checked first, so that a bad one leaves stdin unread.
fn record_result(arg: Option<&OsStr>, scope: &[u8], id: &[u8]) -> Result<Vec<u8>, KvError> {
    validate::check_idempotency_key(scope, id)?;
    let subject = input::Subject {
        what: "result",
        of: format!(
            "idempotency record {} of scope {}",
            show_key(id),
            show_key(scope)
        ),
    };
    input::read(arg, limits::IDEMPOTENCY_RESULT_BYTES_MAX, &subject)
}

/// A record's TTL or result TTL: 1 ms to 1 year, checked with the client's message.
fn record_ttl(what: &str, scope: &[u8], id: &[u8], ttl_ms: i64) -> Result<Duration, KvError> {
    let what = format!(
        "{what} of idempotency record {} of scope {}",
        show_key(id),
        show_key(scope)
    );
    let ttl_ms = validate::check_duration_ms(&what, ttl_ms, 1, limits::TTL_MS_MAX)?;
    Ok(Duration::from_millis(ttl_ms))
}
