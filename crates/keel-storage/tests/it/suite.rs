//! openraft's own storage test suite against `LogStore` + `StateMachine`.

use keel_storage::raft_types::TypeConfig;
use keel_storage::{LogStore, StateMachine, Store};
use keel_types::RangeId;
use openraft::StorageError;
use openraft::testing::log::{StoreBuilder, Suite};
use tempfile::TempDir;

struct Builder;

/// Keeps the directory (and the store) alive for one suite case.
struct Guard {
    _store: Store,
    _dir: TempDir,
}

impl StoreBuilder<TypeConfig, LogStore, StateMachine, Guard> for Builder {
    async fn build(&self) -> Result<(Guard, LogStore, StateMachine), StorageError<TypeConfig>> {
        let (dir, store) = super::open_temp();
        // A range id other than 1, so nothing relies on the first range.
        let range = RangeId(7);
        let log = store.log_store(range);
        let sm = store.state_machine(range);
        Ok((
            Guard {
                _store: store,
                _dir: dir,
            },
            log,
            sm,
        ))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openraft_storage_suite() {
    Suite::test_all(Builder)
        .await
        .expect("openraft storage suite");
}
