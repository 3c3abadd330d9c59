//! Storage micro benchmarks (criterion): durable log appends, state-machine applies, snapshot
//! build and install, a bare redb commit next to a one-entry append, and opening a store (with
//! its checks of the data). Run with `cargo bench -p keel-storage --bench storage`;
//! `cargo test` never runs them.
//!
//! Drives the store only through its public API and openraft's storage traits, as the
//! integration tests do. Entries carry one 256-byte put each, with the request id of one
//! sequential client, like the client writes of `docs/BENCHMARKS.md`. Every measurement
//! times only the storage call (`iter_custom`); building entries, fresh stores and keeping the
//! log short happen outside the timed part. Data lives in temporary directories under Cargo's
//! `CARGO_TARGET_TMPDIR`, on the disk of the target dir.
//!
//! fsync latency on shared machines swings by about 10× over minutes, so the groups run in an
//! order that puts `redb-commit/immediate` right before `append/1`: compare those two from
//! the same run only.

use std::time::{Duration, Instant};

use criterion::{Criterion, SamplingMode, Throughput, criterion_group, criterion_main};
use keel_storage::raft_types::{Entry, LogId, Snapshot, TypeConfig};
use keel_storage::{LogStore, SnapshotFile, StateMachine, Store};
use keel_types::{BatchOp, Command, Mutation, RangeId, RequestId};
use openraft::entry::RaftEntry;
use openraft::storage::{IOFlushed, RaftLogStorage, RaftSnapshotBuilder, RaftStateMachine};
use openraft::type_config::TypeConfigExt;
use redb::{Database, Durability, TableDefinition};
use tempfile::TempDir;
use tokio::io::AsyncReadExt;
use tokio::runtime::Runtime;

/// Bytes of every put's value, as in the client load.
const VALUE_BYTES: usize = 256;
/// Distinct keys the puts write, as in the client load; also the keys of the snapshot range.
const KEYSPACE: u64 = 10_000;
/// Puts per entry when filling a range with every key of the keyspace (`limits::BATCH_OPS_MAX`
/// is 128).
const FILL_PUTS_PER_ENTRY: u64 = 100;
/// Entries per apply when filling a range, so one transaction stays tens of MB at most.
const FILL_ENTRIES_PER_APPLY: usize = 100;
const APPEND_BATCHES: [usize; 3] = [1, 16, 256];
/// Keys of the stores the `open` groups open, with `OPEN_VALUE_BYTES` each: about 5 MB and
/// 100 MB of rows.
const OPEN_KEYS: [u64; 2] = [5_000, 100_000];
const OPEN_VALUE_BYTES: usize = 1_000;
const APPLY_BATCHES: [usize; 2] = [1, 64];
const RANGE: RangeId = RangeId(1);
/// The leader's clock stamped into the first command (Unix milliseconds).
const NOW_MS_START: u64 = 1_800_000_000_000;
/// The bare redb probe's table: one small row per commit.
const PROBE: TableDefinition<u64, &[u8]> = TableDefinition::new("probe");
const PROBE_ROW_BYTES: usize = 32;

criterion_group! {
    name = storage;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .nresamples(20_000)
        .without_plots();
    // `redb_commit` ends with `immediate` and `append` starts with one entry: adjacent in time.
    targets = redb_commit, append, apply, snapshot, open
}
criterion_main!(storage);

/// A bare redb write transaction that inserts one small row into one table, with
/// `Durability::None` (no fsync) and `Durability::Immediate` (what a Keel append commits with).
fn redb_commit(c: &mut Criterion) {
    let dir = temp_dir();
    let db = Database::create(dir.path().join("probe.redb")).expect("create probe database");
    let mut group = c.benchmark_group("redb-commit");
    group
        .sampling_mode(SamplingMode::Flat)
        .sample_size(20)
        .measurement_time(Duration::from_secs(5));
    let mut key = 0u64;
    for (name, durability) in [
        ("none", Durability::None),
        ("immediate", Durability::Immediate),
    ] {
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let mut elapsed = Duration::ZERO;
                for _ in 0..iters {
                    key += 1;
                    let start = Instant::now();
                    commit_probe_row(&db, key, durability);
                    elapsed += start.elapsed();
                }
                // Untimed: lets redb reuse the pages of non-durable commits.
                commit_probe_row(&db, key, Durability::Immediate);
                elapsed
            })
        });
    }
    group.finish();
}

/// One durable append of a batch of entries through `LogStore::append`, timed until its flush
/// callback fires: one request, one redb `Immediate` commit (the group-commit unit).
fn append(c: &mut Criterion) {
    let runtime = runtime();
    let mut group = c.benchmark_group("append");
    group
        .sampling_mode(SamplingMode::Flat)
        .sample_size(20)
        .measurement_time(Duration::from_secs(5));
    for batch in APPEND_BATCHES {
        let (_dir, store) = open_temp();
        let mut log = store.log_store(RANGE);
        let mut puts = Puts::starting_at(1);
        group.throughput(Throughput::ElementsAndBytes {
            elements: batch as u64,
            bytes: encoded_bytes(&Puts::starting_at(1).batch(batch)),
        });
        group.bench_function(batch.to_string(), |b| {
            b.iter_custom(|iters| runtime.block_on(append_timed(&mut log, &mut puts, batch, iters)))
        });
        store.shutdown();
    }
    group.finish();
}

/// Applying a batch of committed entries through `RaftStateMachine::apply` (one writer
/// transaction with `Durability::None`) to a range that already holds every key.
fn apply(c: &mut Criterion) {
    let runtime = runtime();
    let mut group = c.benchmark_group("apply");
    group
        .sampling_mode(SamplingMode::Flat)
        .sample_size(20)
        .measurement_time(Duration::from_secs(3));
    for batch in APPLY_BATCHES {
        let (_dir, store) = open_temp();
        let mut sm = store.state_machine(RANGE);
        let mut log = store.log_store(RANGE);
        let filled = runtime.block_on(fill(&mut sm));
        let mut puts = Puts::starting_at(filled + 1);
        group.throughput(Throughput::Elements(batch as u64));
        group.bench_function(batch.to_string(), |b| {
            b.iter_custom(|iters| {
                runtime.block_on(apply_timed(&mut sm, &mut log, &mut puts, batch, iters))
            })
        });
        store.shutdown();
    }
    group.finish();
}

/// Building a snapshot of a range holding `KEYSPACE` keys, and installing that snapshot into
/// a fresh store (the file is received first, untimed, as from a leader).
fn snapshot(c: &mut Criterion) {
    let runtime = runtime();
    let (_dir, store) = open_temp();
    let mut sm = store.state_machine(RANGE);
    runtime.block_on(fill(&mut sm));
    let built = runtime.block_on(build(&mut sm));
    let mut group = c.benchmark_group("snapshot");
    group
        .sampling_mode(SamplingMode::Flat)
        .sample_size(10)
        .measurement_time(Duration::from_secs(5));
    group.throughput(Throughput::ElementsAndBytes {
        elements: KEYSPACE,
        bytes: built.snapshot.len_bytes(),
    });
    group.bench_function("build", |b| {
        b.iter_custom(|iters| {
            runtime.block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    build(&mut sm).await;
                }
                start.elapsed()
            })
        })
    });
    // Built after the last `build` iteration, so no newer snapshot deletes its file.
    let source = runtime.block_on(build(&mut sm));
    group.bench_function("install", |b| {
        b.iter_custom(|iters| runtime.block_on(install_timed(&source, iters)))
    });
    group.finish();
    store.shutdown();
}

/// Opening a store of `OPEN_KEYS` keys with one snapshot of them: `Store::open` (redb's check
/// of every page of the committed trees, then a check of every snapshot file), next to redb
/// opening the same file without its check and with it. The files stay in the page cache:
/// this is the check's CPU cost; from a cold disk, add the time to read the store file and the
/// snapshots once.
fn open(c: &mut Criterion) {
    let runtime = runtime();
    for keys in OPEN_KEYS {
        let dir = temp_dir();
        let bytes = runtime.block_on(store_for_open(dir.path(), keys));
        let mut group = c.benchmark_group(format!("open-{keys}-keys"));
        group
            .sampling_mode(SamplingMode::Flat)
            .sample_size(10)
            .measurement_time(Duration::from_secs(5))
            .throughput(Throughput::Bytes(bytes));
        let path = dir.path().join("keel.redb");
        for (name, check) in [("redb", false), ("redb-checked", true)] {
            group.bench_function(name, |b| {
                b.iter_custom(|iters| {
                    let mut elapsed = Duration::ZERO;
                    for _ in 0..iters {
                        let start = Instant::now();
                        let db = Database::builder()
                            .set_check_integrity_on_open(check)
                            .create(&path)
                            .expect("open with redb");
                        elapsed += start.elapsed();
                        drop(db);
                    }
                    elapsed
                })
            });
        }
        group.bench_function("store", |b| {
            b.iter_custom(|iters| {
                let mut elapsed = Duration::ZERO;
                for _ in 0..iters {
                    let start = Instant::now();
                    let store = Store::open(&path, &dir.path().join("snapshots")).expect("open");
                    elapsed += start.elapsed();
                    store.shutdown();
                }
                elapsed
            })
        });
        group.finish();
    }
}

/// Fills a store in `dir` with `keys` keys of `OPEN_VALUE_BYTES`, builds a snapshot and closes
/// it; returns the bytes of the store file and the snapshot.
async fn store_for_open(dir: &std::path::Path, keys: u64) -> u64 {
    let store = Store::open(&dir.join("keel.redb"), &dir.join("snapshots")).expect("open store");
    let mut sm = store.state_machine(RANGE);
    fill_keys(&mut sm, keys, OPEN_VALUE_BYTES).await;
    let snapshot = build(&mut sm).await;
    let bytes = store.file_bytes().expect("file bytes") + snapshot.snapshot.len_bytes();
    store.shutdown();
    bytes
}

async fn append_timed(log: &mut LogStore, puts: &mut Puts, batch: usize, iters: u64) -> Duration {
    let mut elapsed = Duration::ZERO;
    for _ in 0..iters {
        let entries = puts.batch(batch);
        let start = Instant::now();
        append_durably(log, entries).await;
        elapsed += start.elapsed();
    }
    // Untimed: keeps the log short, as openraft purges it behind snapshots.
    log.purge(puts.last()).await.expect("purge");
    elapsed
}

async fn apply_timed(
    sm: &mut StateMachine,
    log: &mut LogStore,
    puts: &mut Puts,
    batch: usize,
    iters: u64,
) -> Duration {
    let mut elapsed = Duration::ZERO;
    for _ in 0..iters {
        let entries = puts.batch(batch);
        let start = Instant::now();
        apply_entries(sm, entries).await;
        elapsed += start.elapsed();
    }
    // Untimed: one durable commit, as the appends between applies make in a running node.
    let vote = keel_storage::raft_types::Vote::new(1, 1);
    log.save_vote(&vote).await.expect("save vote");
    elapsed
}

async fn install_timed(source: &Snapshot, iters: u64) -> Duration {
    let mut elapsed = Duration::ZERO;
    for _ in 0..iters {
        let (_dir, store) = open_temp();
        let received = receive(&source.snapshot, &store).await;
        let mut sm = store.state_machine(RANGE);
        let start = Instant::now();
        sm.install_snapshot(&source.meta, received)
            .await
            .expect("install snapshot");
        elapsed += start.elapsed();
        store.shutdown();
    }
    elapsed
}

/// Log entries as a leader proposes client puts, at consecutive indexes: one put of
/// `VALUE_BYTES` each, keys scattered over `KEYSPACE`, with the request id of one client whose
/// earlier requests are all answered.
struct Puts {
    next_index: u64,
    value: Vec<u8>,
}

impl Puts {
    fn starting_at(index: u64) -> Puts {
        Puts {
            next_index: index,
            value: vec![b'v'; VALUE_BYTES],
        }
    }

    fn batch(&mut self, entries: usize) -> Vec<Entry> {
        (0..entries).map(|_| self.next()).collect()
    }

    /// The log id of the last entry returned.
    fn last(&self) -> LogId {
        log_id(self.next_index - 1)
    }

    fn next(&mut self) -> Entry {
        let index = self.next_index;
        self.next_index += 1;
        let request = RequestId {
            client_id: 1,
            client_started_ms: 1,
            sequence: index,
            completed_below: index,
        };
        let mutation = Mutation {
            request: Some(request),
            now_ms: NOW_MS_START + index,
            ops: vec![put(scattered_key(index), self.value.clone())],
        };
        Entry::new_normal(log_id(index), Command::Mutate(mutation))
    }
}

/// Applies puts of every key of the keyspace at indexes 1..; returns the last index.
async fn fill(sm: &mut StateMachine) -> u64 {
    fill_keys(sm, KEYSPACE, VALUE_BYTES).await
}

/// Applies puts of `keys` keys with values of `value_bytes` at indexes 1..; returns the last
/// index.
async fn fill_keys(sm: &mut StateMachine, keys: u64, value_bytes: usize) -> u64 {
    let value = vec![b'v'; value_bytes];
    let entries: Vec<Entry> = (0..keys / FILL_PUTS_PER_ENTRY)
        .map(|entry| {
            let first = entry * FILL_PUTS_PER_ENTRY;
            let ops = (first..first + FILL_PUTS_PER_ENTRY)
                .map(|key| put(key_bytes(key), value.clone()))
                .collect();
            let mutation = Mutation {
                request: None,
                now_ms: NOW_MS_START,
                ops,
            };
            Entry::new_normal(log_id(entry + 1), Command::Mutate(mutation))
        })
        .collect();
    let last = entries.len() as u64;
    for chunk in entries.chunks(FILL_ENTRIES_PER_APPLY) {
        apply_entries(sm, chunk.to_vec()).await;
    }
    last
}

async fn append_durably(log: &mut LogStore, entries: Vec<Entry>) {
    let (tx, flushed) = TypeConfig::oneshot();
    log.append(entries, IOFlushed::signal(tx))
        .await
        .expect("append");
    flushed
        .await
        .expect("flush callback fired")
        .expect("append durable");
}

async fn apply_entries(sm: &mut StateMachine, entries: Vec<Entry>) {
    let stream = futures::stream::iter(entries.into_iter().map(|entry| Ok((entry, None))));
    sm.apply(stream).await.expect("apply");
}

async fn build(sm: &mut StateMachine) -> Snapshot {
    let mut builder = sm.get_snapshot_builder().await;
    builder.build_snapshot().await.expect("build snapshot")
}

/// Copies a snapshot file into `target`'s incoming snapshot, as the network would.
async fn receive(file: &SnapshotFile, target: &Store) -> SnapshotFile {
    let mut reader = file.open_reader().await.expect("open snapshot");
    let mut incoming = target.incoming_snapshot(RANGE).await.expect("incoming");
    let mut chunk = vec![0u8; keel_types::limits::SNAPSHOT_CHUNK_BYTES];
    loop {
        let read = reader.read(&mut chunk).await.expect("read snapshot");
        if read == 0 {
            return incoming.finish().await.expect("finish incoming");
        }
        incoming
            .write_chunk(&chunk[..read])
            .await
            .expect("write chunk");
    }
}

fn commit_probe_row(db: &Database, key: u64, durability: Durability) {
    let mut txn = db.begin_write().expect("begin write");
    txn.set_durability(durability).expect("set durability");
    {
        let mut table = txn.open_table(PROBE).expect("open probe table");
        let row = [0u8; PROBE_ROW_BYTES];
        table.insert(key, row.as_slice()).expect("insert");
    }
    txn.commit().expect("commit");
}

fn put(key: Vec<u8>, value: Vec<u8>) -> BatchOp {
    BatchOp::Put {
        key,
        value,
        condition: None,
        return_previous: false,
        ttl_ms: None,
    }
}

/// The key of the `index`-th put: spread over the keyspace by a multiplicative hash, so
/// consecutive puts touch distant keys, as uniform client keys do.
fn scattered_key(index: u64) -> Vec<u8> {
    key_bytes((index.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) % KEYSPACE)
}

fn key_bytes(key: u64) -> Vec<u8> {
    format!("key-{key:08}").into_bytes()
}

fn log_id(index: u64) -> LogId {
    openraft::testing::log_id::<TypeConfig>(1, 1, index)
}

/// Bytes of the entries as the log stores them: a format byte and the postcard body each.
fn encoded_bytes(entries: &[Entry]) -> u64 {
    let body = |entry: &Entry| postcard::to_allocvec(entry).expect("encode entry").len();
    entries.iter().map(|entry| 1 + body(entry) as u64).sum()
}

fn open_temp() -> (TempDir, Store) {
    let dir = temp_dir();
    let store = Store::open(&dir.path().join("keel.redb"), &dir.path().join("snapshots"))
        .expect("open store");
    (dir, store)
}

/// A temporary directory on the disk of Cargo's target dir.
fn temp_dir() -> TempDir {
    tempfile::Builder::new()
        .prefix("keel-storage-bench-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("temp dir")
}

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}
