use std::sync::Arc;

use redb::{Database, TableDefinition};

use super::Readers;
use crate::error::StorageError;

const TABLE: TableDefinition<u64, u64> = TableDefinition::new("t");

fn database() -> (tempfile::TempDir, Arc<Database>) {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::create(dir.path().join("db.redb")).unwrap();
    (dir, Arc::new(db))
}

fn write(db: &Database, key: u64, value: u64) {
    let txn = db.begin_write().unwrap();
    txn.open_table(TABLE).unwrap().insert(key, value).unwrap();
    txn.commit().unwrap();
}

async fn read(readers: &Readers, key: u64) -> Option<u64> {
    let answer = readers
        .read(move |txn| {
            let table = txn
                .open_table(TABLE)
                .map_err(|e| StorageError::redb("open t", e))?;
            let value = table.get(key).map_err(|e| StorageError::redb("get", e))?;
            Ok(value.map(|v| v.value()))
        })
        .await;
    answer
        .unwrap_or_else(|_| panic!("the read panicked"))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_concurrent_reads_are_all_answered() {
    let (_dir, db) = database();
    for key in 0..100 {
        write(&db, key, key * 10);
    }
    let readers = Arc::new(Readers::start(db).unwrap());
    let reads = (0..2_000u64).map(|i| {
        let readers = readers.clone();
        tokio::spawn(async move { (i % 100, read(&readers, i % 100).await) })
    });
    for read in futures::future::join_all(reads).await {
        let (key, value) = read.unwrap();
        assert_eq!(value, Some(key * 10));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_sees_every_commit_made_before_it_was_queued() {
    let (_dir, db) = database();
    let readers = Readers::start(db.clone()).unwrap();
    for value in 0..300 {
        write(&db, 1, value);
        assert_eq!(read(&readers, 1).await, Some(value));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_read_reaches_its_caller_and_the_threads_go_on() {
    let (_dir, db) = database();
    write(&db, 1, 7);
    let readers = Readers::start(db).unwrap();
    for _ in 0..super::limits::STORAGE_READERS_MAX + 1 {
        let answer = readers
            .read(|_| -> Result<(), StorageError> { panic!("planted read panic") })
            .await;
        let payload = answer.expect_err("the panic reaches the caller");
        assert_eq!(payload.downcast_ref::<&str>(), Some(&"planted read panic"));
    }
    assert_eq!(read(&readers, 1).await, Some(7));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_readers_refuse_reads_and_their_threads_exit() {
    let (_dir, db) = database();
    let readers = Readers::start(db.clone()).unwrap();
    readers.shutdown();
    let answer = readers.read(|_| Ok(())).await;
    assert!(
        matches!(answer, Ok(Err(StorageError::Closed))),
        "{answer:?}"
    );
    // Every thread let go of the database.
    assert_eq!(Arc::strong_count(&db), 1);
}
