//! `keel backup` → `keel restore` → `keel serve` round trip with real processes: keys over
//! three ranges (some with TTLs, some overwritten), a lock and an idempotency record are
//! backed up from one cluster and restored as a new cluster of three nodes, two of them
//! started empty. Every key reads back with its value, create and mod revision; the lock
//! and the record are there; the range table has the same spans, each range on 3 nodes;
//! a new write in each range takes a higher revision than any restored one. Damaged backup
//! files and a non-empty data dir are refused, leaving nothing behind.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use keel_client::{AcquireOptions, Client, PutOptions, RecordState};
use keel_types::{Consistency, KeyValue, NodeId, RangeDescriptor};

use crate::five_nodes::{eventually, healed_on};
use crate::process::{Processes, keel};

/// Fast rebalancing, so the empty nodes get their replicas within seconds.
const FLAGS: &[&str] = &["--rebalance-interval-ms", "200"];
const SPLITS: [&str; 2] = ["k-10", "k-20"];
const KEYS: usize = 30;

/// What the source cluster holds, read back after the writes.
struct Source {
    keys: BTreeMap<String, KeyValue>,
    /// Keys written with a TTL.
    ttl: Vec<String>,
    spans: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    lock_token: u64,
}

/// Splits the keyspace at `SPLITS`, writes `KEYS` keys (every third with a 1 h TTL, every
/// fifth written twice), takes a lock and completes an idempotency record.
async fn fill(client: &Client) -> Source {
    for at in SPLITS {
        client.split(at.as_bytes()).await.unwrap();
    }
    let mut ttl = Vec::new();
    for i in 0..KEYS {
        let key = format!("k-{i:02}");
        let mut options = PutOptions::default();
        if i % 3 == 0 {
            options.ttl = Some(Duration::from_secs(3600));
            ttl.push(key.clone());
        }
        let value = format!("value-{i}");
        client
            .put(key.as_bytes(), value.as_bytes(), options.clone())
            .await
            .unwrap();
        if i % 5 == 0 {
            let again = format!("value-{i}-again");
            client
                .put(key.as_bytes(), again.as_bytes(), options)
                .await
                .unwrap();
        }
    }
    let acquire = AcquireOptions {
        ttl: Duration::from_secs(3600),
        ..AcquireOptions::default()
    };
    let held = client.acquire(b"k-05-lock", acquire).await.unwrap();
    assert!(held.acquired);
    let hour = Duration::from_secs(3600);
    let begun = client
        .begin(b"k-25-pay", b"order-1", None, hour)
        .await
        .unwrap();
    let keel_client::BeginResult::Started { token, .. } = begun else {
        panic!("{begun:?}");
    };
    client
        .complete(b"k-25-pay", b"order-1", token, b"paid", hour)
        .await
        .unwrap();
    Source {
        keys: read_keys(client).await,
        ttl,
        spans: spans(client).await,
        lock_token: held.holder.unwrap().token,
    }
}

async fn read_keys(client: &Client) -> BTreeMap<String, KeyValue> {
    let mut keys = BTreeMap::new();
    for i in 0..KEYS {
        let key = format!("k-{i:02}");
        let got = client
            .get(key.as_bytes(), Consistency::Linearizable)
            .await
            .unwrap();
        keys.insert(key, got.kv.expect("written"));
    }
    keys
}

async fn spans(client: &Client) -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
    let ranges = client.ranges().await.unwrap();
    ranges
        .into_iter()
        .map(|info| (info.descriptor.start, info.descriptor.end))
        .collect()
}

/// Runs `keel restore`; returns its exit code and stdout.
fn restore(from: &Path, dir: &Path, cluster: &str) -> (Option<i32>, String) {
    let (from, dir) = (from.to_str().unwrap(), dir.to_str().unwrap());
    let args = [
        "restore",
        "--from",
        from,
        "--data-dir",
        dir,
        "--node-id",
        "1",
        "--initial-cluster",
        cluster,
    ];
    keel(&[], &args)
}

/// Cut and bit-flipped copies of `backup`, and a non-empty dir, are refused with exit 2 and
/// leave no data dir behind.
fn damaged_backups_are_refused(backup: &Path, scratch: &Path, cluster: &str) {
    let good = std::fs::read(backup).unwrap();
    let mut flipped = good.clone();
    let middle = flipped.len() / 2;
    flipped[middle] ^= 0x10;
    let cases = [
        ("cut", good[..good.len() - 40].to_vec()),
        ("flipped", flipped),
    ];
    for (name, bytes) in cases {
        let file = scratch.join(name);
        std::fs::write(&file, bytes).unwrap();
        let dir = scratch.join(format!("{name}-dir"));
        let (code, _) = restore(&file, &dir, cluster);
        assert_eq!(code, Some(2), "a {name} backup must be refused");
        assert!(
            !dir.exists(),
            "a refused restore leaves no {name}-dir behind"
        );
    }
    let used = scratch.join("used");
    std::fs::create_dir_all(&used).unwrap();
    std::fs::write(used.join("keel.redb"), b"data").unwrap();
    let (code, _) = restore(backup, &used, cluster);
    assert_eq!(code, Some(2), "a non-empty data dir must be refused");
    assert_eq!(std::fs::read(used.join("keel.redb")).unwrap(), b"data");
}

/// Checks the restored cluster against `source`.
async fn check_restored(client: &Client, source: &Source) {
    let restored = read_keys(client).await;
    for (key, before) in &source.keys {
        let after = &restored[key];
        assert_eq!(
            (&after.value, after.create_revision, after.mod_revision),
            (&before.value, before.create_revision, before.mod_revision),
            "{key}"
        );
    }
    for key in &source.ttl {
        let got = client
            .get(key.as_bytes(), Consistency::Linearizable)
            .await
            .unwrap();
        assert!(
            got.ttl_remaining
                .is_some_and(|left| left > Duration::from_secs(3000)),
            "{key}"
        );
    }
    let lock = client
        .inspect(b"k-05-lock", Consistency::Linearizable)
        .await
        .unwrap();
    assert_eq!(
        lock.holder.map(|holder| holder.token),
        Some(source.lock_token)
    );
    let record = client
        .idempotency_get(b"k-25-pay", b"order-1", Consistency::Linearizable)
        .await
        .unwrap();
    assert!(
        matches!(record.state, Some(RecordState::Completed { ref result, .. }) if result == b"paid"),
        "{record:?}"
    );
    assert_eq!(spans(client).await, source.spans);
    let ranges: Vec<RangeDescriptor> = client
        .ranges()
        .await
        .unwrap()
        .into_iter()
        .map(|info| info.descriptor)
        .collect();
    for range in ranges {
        let highest = source
            .keys
            .iter()
            .filter(|(key, _)| range.contains(key.as_bytes()))
            .map(|(_, kv)| kv.mod_revision)
            .max()
            .unwrap();
        let key = [range.start.as_slice(), b"-new"].concat();
        let written = client
            .put(&key, b"after", PutOptions::default())
            .await
            .unwrap();
        assert!(
            written.revision > highest,
            "range {range}: {} after {highest}",
            written.revision
        );
    }
}

/// `Cluster.Backup` of the first range asked of every node: followers forward it once, and
/// every stream comes from the leader, as long as its start announced.
async fn every_node_serves_a_backup_from_the_leader(processes: &Processes, client: &Client) {
    use keel_proto::v1::backup_chunk::Part;
    use keel_proto::v1::cluster_client::ClusterClient;
    let first = client.ranges().await.unwrap().remove(0);
    for addr in processes.endpoints.values() {
        let mut cluster = ClusterClient::connect(format!("http://{addr}"))
            .await
            .unwrap();
        let request = keel_proto::v1::BackupRequest {
            range_id: first.descriptor.id.0,
            no_forward: false,
        };
        let mut stream = cluster.backup(request).await.unwrap().into_inner();
        let Some(Part::Start(start)) = stream.message().await.unwrap().and_then(|c| c.part) else {
            panic!("the stream from {addr} does not begin with its start");
        };
        assert_eq!(Some(start.served_by), first.leader, "asked {addr}");
        let mut bytes = 0;
        while let Some(chunk) = stream.message().await.unwrap() {
            let Some(Part::Data(data)) = chunk.part else {
                panic!("a second start from {addr}");
            };
            bytes += data.len() as u64;
        }
        assert_eq!(bytes, start.snapshot_bytes, "asked {addr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn backup_and_restore_round_trip_keeps_data_and_revisions() {
    let mut old = Processes::start_with(3, FLAGS);
    let all: Vec<NodeId> = old.endpoints.keys().copied().collect();
    old.leader().await;
    let source = fill(&old.client(&all)).await;
    let scratch = tempfile::tempdir().unwrap();
    let backup = scratch.path().join("cluster.keelbackup");
    let endpoints: Vec<&String> = old.endpoints.values().collect();
    let out = backup.to_str().unwrap();
    let (code, report) = keel(&endpoints, &["backup", "--out", out]);
    assert_eq!(code, Some(0), "{report}");
    assert!(report.starts_with("backed up 3 ranges"), "{report}");
    for id in &all {
        old.kill(*id);
    }

    let mut new = Processes::prepare(3, FLAGS);
    let cluster = new.initial_cluster();
    damaged_backups_are_refused(&backup, scratch.path(), &cluster);
    let (code, report) = restore(&backup, &new.data_dir(1), &cluster);
    assert_eq!(code, Some(0), "{report}");
    for id in &all {
        new.spawn(*id);
    }
    let client = new.client(&all);
    eventually(&new, "every range on 3 nodes", || async {
        healed_on(&client, &all).await
    })
    .await;
    check_restored(&client, &source).await;
    every_node_serves_a_backup_from_the_leader(&new, &client).await;
}
