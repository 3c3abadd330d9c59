//! Test-only: log ids and entries of puts, for the unit tests of the log (`log_store`,
//! `wal`).

use std::sync::Arc;

use keel_types::{BatchOp, Command, Mutation};
use openraft::entry::RaftEntry;

use crate::raft_types::{Entry, LogId, TypeConfig};

pub(crate) fn log_id(term: u64, index: u64) -> LogId {
    openraft::testing::log_id::<TypeConfig>(term, 1, index)
}

/// Entries `first..=last` of `term`, each a put of `value_bytes`.
pub(crate) fn entries(term: u64, first: u64, last: u64, value_bytes: usize) -> Vec<Arc<Entry>> {
    (first..=last)
        .map(|index| {
            let command = Command::Mutate(Mutation {
                request: None,
                now_ms: 0,
                ops: vec![BatchOp::Put {
                    key: format!("k{index}").into_bytes(),
                    value: vec![b'v'; value_bytes],
                    condition: None,
                    return_previous: false,
                    ttl_ms: None,
                }],
            });
            Arc::new(Entry::new_normal(log_id(term, index), command))
        })
        .collect()
}
