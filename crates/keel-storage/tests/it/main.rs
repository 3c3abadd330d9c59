//! Integration tests of keel-storage through its public API: openraft's storage suite,
//! restart, poisoning, group commit, snapshots, damaged data and the format fixtures.

mod damage;
mod fixture;
mod fixture_v10;
mod fixture_v11;
mod fixture_v12;
mod fixture_v13;
mod fixture_v3;
mod fixture_v4;
mod fixture_v5;
mod fixture_v6;
mod fixture_v7;
mod fixture_v8;
mod fixture_v9;
mod group_commit;
mod poison;
mod restart;
mod snapshot;
mod split_start;
mod suite;

use std::path::Path;

use keel_storage::Store;
use keel_storage::raft_types::{Entry, LogId, TypeConfig};
use keel_types::{BatchOp, Command, Mutation, NodeId};
use openraft::entry::RaftEntry;
use tempfile::TempDir;

/// A store in a fresh temporary directory.
pub fn open_temp() -> (TempDir, Store) {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = open_in(dir.path());
    (dir, store)
}

/// Opens the store file `keel.redb` with snapshots in `snapshots/` under `dir`.
pub fn open_in(dir: &Path) -> Store {
    Store::open(&dir.join("keel.redb"), &dir.join("snapshots")).expect("open store")
}

pub fn log_id(term: u64, node: NodeId, index: u64) -> LogId {
    openraft::testing::log_id::<TypeConfig>(term, node, index)
}

pub fn blank(term: u64, index: u64) -> Entry {
    openraft::testing::blank_ent::<TypeConfig>(term, 1, index)
}

/// A normal entry writing `key=value` for every pair (a mutation without request id, at
/// time 0).
pub fn puts(term: u64, index: u64, pairs: &[(&[u8], &[u8])]) -> Entry {
    let ops = pairs
        .iter()
        .map(|(key, value)| BatchOp::Put {
            key: key.to_vec(),
            value: value.to_vec(),
            condition: None,
            return_previous: false,
            ttl_ms: None,
        })
        .collect();
    let mutation = Mutation {
        request: None,
        now_ms: 0,
        ops,
    };
    Entry::new_normal(log_id(term, 1, index), Command::Mutate(mutation))
}

/// A log-flush callback and the future that resolves when it fires.
pub fn flush_signal() -> (
    keel_storage::raft_types::IoFlushed,
    impl std::future::Future<Output = std::io::Result<()>>,
) {
    use openraft::type_config::TypeConfigExt;
    let (tx, rx) = TypeConfig::oneshot();
    let done = async move { rx.await.map_err(std::io::Error::other)? };
    (openraft::storage::IOFlushed::signal(tx), done)
}

/// Appends `entries` to a log store and waits for their durable commit.
pub async fn append(log: &mut keel_storage::LogStore, entries: Vec<Entry>) -> std::io::Result<()> {
    use openraft::storage::RaftLogStorage;
    let (callback, flushed) = flush_signal();
    log.append(entries, callback).await?;
    flushed.await
}

/// Applies `entries` (no client responders) to a state machine.
pub async fn apply(
    sm: &mut keel_storage::StateMachine,
    entries: Vec<Entry>,
) -> std::io::Result<()> {
    use openraft::storage::RaftStateMachine;
    let stream = futures::stream::iter(entries.into_iter().map(|entry| Ok((entry, None))));
    sm.apply(stream).await
}
