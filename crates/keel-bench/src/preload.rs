//! Writing the keyspace before a run, in bounded chunks with a bounded number in flight, and
//! small helpers both targets share. Knows nothing of either target's API.

use std::future::Future;
use std::ops::Range;

use anyhow::{Context, anyhow};
use tokio::task::JoinSet;

use crate::keys;
use crate::limits;

/// The value every write carries.
pub fn value(value_bytes: usize) -> Vec<u8> {
    vec![b'v'; value_bytes]
}

/// `endpoints` starting at position `first` (modulo their number).
pub fn rotate(endpoints: &[String], first: usize) -> Vec<String> {
    let mut rotated = endpoints.to_vec();
    rotated.rotate_left(first % endpoints.len().max(1));
    rotated
}

/// The key ranges of the preload requests: each at most `PRELOAD_OPS_MAX` keys and
/// `PRELOAD_BYTES_MAX` bytes of keys and values (at least one key).
pub fn chunks(keyspace: usize, value_bytes: usize) -> Vec<Range<usize>> {
    let entry_bytes = keys::data_key(keyspace).len() + value_bytes;
    let size = (limits::PRELOAD_BYTES_MAX / entry_bytes).clamp(1, limits::PRELOAD_OPS_MAX);
    (0..keyspace)
        .step_by(size)
        .map(|start| start..(start + size).min(keyspace))
        .collect()
}

/// Runs `write` on every chunk, at most `PRELOAD_TASKS` at once, within `SETUP_TIMEOUT`.
pub async fn run<F, Fut>(chunks: Vec<Range<usize>>, write: F) -> anyhow::Result<()>
where
    F: Fn(Range<usize>) -> Fut,
    Fut: Future<Output = Result<(), String>> + Send + 'static,
{
    let all = async {
        let mut in_flight = JoinSet::new();
        for chunk in chunks {
            if in_flight.len() >= limits::PRELOAD_TASKS {
                finish_one(&mut in_flight).await?;
            }
            let keys = format!("keys {}..{}", chunk.start, chunk.end);
            let write = write(chunk);
            in_flight.spawn(async move {
                write
                    .await
                    .map_err(|error| anyhow!("preloading {keys}: {error}"))
            });
        }
        while !in_flight.is_empty() {
            finish_one(&mut in_flight).await?;
        }
        Ok(())
    };
    tokio::time::timeout(limits::SETUP_TIMEOUT, all)
        .await
        .with_context(|| {
            format!(
                "preload took longer than {} s",
                limits::SETUP_TIMEOUT.as_secs()
            )
        })?
}

async fn finish_one(in_flight: &mut JoinSet<anyhow::Result<()>>) -> anyhow::Result<()> {
    match in_flight.join_next().await {
        Some(joined) => joined.context("a preload task failed")?,
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests;
