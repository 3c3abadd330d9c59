//! A 3-node in-process cluster: the key-value API case by case, revisions, leader failover,
//! follower reads and restart from disk.

use std::collections::BTreeMap;

use keel_client::{Client, DeleteOptions, PutOptions};
use keel_proto::v1::LeaderRequest;
use keel_types::{BatchOp, Condition, Consistency, KvError, RangeId, Revision, limits};

use crate::harness::{Cluster, eventually};

/// One step of the API table and what it must answer.
enum Step {
    Get(&'static str, Option<&'static str>),
    Put(&'static str, String, Option<Condition>, Expect),
    Delete(&'static str, Option<Condition>, Expect),
    Batch(Vec<BatchOp>, Expect),
}

#[derive(Debug, PartialEq)]
enum Expect {
    /// Applied; for a delete, whether the key existed.
    Applied(bool),
    /// Rejected with ConditionFailed showing this current value.
    ConditionFailed(Option<String>),
    Invalid,
}

fn put(key: &str, value: &str, condition: Option<Condition>) -> BatchOp {
    BatchOp::Put {
        key: key.into(),
        value: value.into(),
        condition,
        return_previous: false,
        ttl_ms: None,
    }
}

fn outcome<T>(result: Result<T, KvError>, existed: impl Fn(&T) -> bool) -> Expect {
    match result {
        Ok(ok) => Expect::Applied(existed(&ok)),
        Err(KvError::ConditionFailed(failed)) => Expect::ConditionFailed(
            failed
                .current
                .map(|kv| String::from_utf8(kv.value).unwrap()),
        ),
        Err(KvError::InvalidArgument { .. }) => Expect::Invalid,
        Err(other) => panic!("unexpected error {other}"),
    }
}

async fn run(client: &Client, step: Step) {
    match step {
        Step::Get(key, expected) => {
            let got = client.get(key.as_bytes(), Consistency::Linearizable).await;
            let value = got
                .unwrap()
                .kv
                .map(|kv| String::from_utf8(kv.value).unwrap());
            assert_eq!(value.as_deref(), expected, "get {key}");
        }
        Step::Put(key, value, condition, expected) => {
            let options = PutOptions {
                condition,
                return_previous: false,
                ..PutOptions::default()
            };
            let result = client.put(key.as_bytes(), value.as_bytes(), options).await;
            assert_eq!(outcome(result, |_| true), expected, "put {key}");
        }
        Step::Delete(key, condition, expected) => {
            let options = DeleteOptions {
                condition,
                ..DeleteOptions::default()
            };
            let result = client.delete(key.as_bytes(), options).await;
            assert_eq!(outcome(result, |ok| ok.deleted), expected, "delete {key}");
        }
        Step::Batch(ops, expected) => {
            let result = client.batch(ops).await;
            assert_eq!(outcome(result, |_| true), expected, "batch");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kv_api_table() {
    use Expect::*;
    use Step::*;
    let cluster = Cluster::start(3).await;
    let client = cluster.client();
    let absent = || Some(Condition::Absent);
    let value = |v: &str| Some(Condition::Value(v.into()));
    let failed = |v: Option<&str>| ConditionFailed(v.map(str::to_string));
    let v = |v: &str| v.to_string();
    let big = "x".repeat(limits::VALUE_BYTES_MAX + 1);
    let steps = vec![
        Get("a", None),
        Put("a", v("1"), None, Applied(true)),
        Get("a", Some("1")),
        Put("a", v("2"), value("1"), Applied(true)),
        Put("a", v("3"), value("1"), failed(Some("2"))),
        Put("a", v("3"), absent(), failed(Some("2"))),
        Put("b", v("1"), absent(), Applied(true)),
        Put("c", v("1"), Some(Condition::Revision(999)), failed(None)),
        Delete("a", value("9"), failed(Some("2"))),
        Get("a", Some("2")),
        Delete("a", None, Applied(true)),
        Delete("a", None, Applied(false)),
        Get("a", None),
        // A batch is all or nothing: the failing second op keeps the first from applying.
        Batch(
            vec![put("c", "1", None), put("b", "2", value("nope"))],
            failed(Some("1")),
        ),
        Get("c", None),
        Get("b", Some("1")),
        // Later ops see the effects of earlier ones.
        Batch(
            vec![put("c", "1", absent()), put("c", "2", value("1"))],
            Applied(true),
        ),
        Get("c", Some("2")),
        // Bad input is rejected and changes nothing.
        Put("", v("1"), None, Invalid),
        Put("d", big, None, Invalid),
        Put("d", v("1"), Some(Condition::Revision(0)), Invalid),
        Batch((0..129).map(|_| put("d", "1", None)).collect(), Invalid),
        Get("d", None),
    ];
    for step in steps {
        run(&client, step).await;
    }
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn revision_cas_follows_the_current_revision() {
    let cluster = Cluster::start(3).await;
    let client = cluster.client();
    let first = client.put(b"k", b"1", PutOptions::default()).await.unwrap();
    let stale = Some(Condition::Revision(first.revision));
    let second = client.put(b"k", b"2", PutOptions::default()).await.unwrap();
    assert!(second.revision > first.revision);
    let options = PutOptions {
        condition: stale,
        return_previous: false,
        ..PutOptions::default()
    };
    let rejected = client.put(b"k", b"3", options).await.unwrap_err();
    let KvError::ConditionFailed(failed) = rejected else {
        panic!("expected ConditionFailed, got {rejected}");
    };
    let current = failed.current.unwrap();
    assert_eq!(
        (
            current.value.as_slice(),
            current.mod_revision,
            current.version
        ),
        (&b"2"[..], second.revision, 2)
    );
    let options = PutOptions {
        condition: Some(Condition::Revision(second.revision)),
        return_previous: true,
        ..PutOptions::default()
    };
    let third = client.put(b"k", b"3", options).await.unwrap();
    let previous = third.previous.unwrap();
    assert_eq!(
        (previous.value.as_slice(), previous.version),
        (&b"2"[..], 2)
    );
    // The key's third write: etcd's version 3.
    let got = client.get(b"k", Consistency::Linearizable).await.unwrap();
    let kv = got.kv.unwrap();
    assert_eq!(
        (kv.create_revision, kv.mod_revision, kv.version),
        (first.revision, third.revision, 3)
    );
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn revisions_never_go_backwards() {
    let cluster = Cluster::start(3).await;
    let mut writers = Vec::new();
    for (writer, id) in cluster.ids().into_iter().enumerate() {
        let client = cluster.client_of(id);
        writers.push(tokio::spawn(async move {
            let mut acknowledged: Vec<(String, Revision)> = Vec::new();
            for round in 0..30 {
                let key = format!("key-{}", round % 5);
                let value = format!("w{writer}-{round}");
                let put = client.put(key.as_bytes(), value.as_bytes(), PutOptions::default());
                let revision = put.await.unwrap().revision;
                acknowledged.push((key, revision));
            }
            acknowledged
        }));
    }
    let mut last_by_key: BTreeMap<String, Revision> = BTreeMap::new();
    let mut all = Vec::new();
    for writer in writers {
        let acknowledged = writer.await.unwrap();
        for pair in acknowledged.windows(2) {
            assert!(
                pair[1].1 > pair[0].1,
                "one client's revisions went back: {pair:?}"
            );
        }
        for (key, revision) in acknowledged {
            let last = last_by_key.entry(key).or_default();
            *last = (*last).max(revision);
            all.push(revision);
        }
    }
    let count = all.len();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), count, "two writes shared a revision");
    let client = cluster.client();
    for (key, revision) in last_by_key {
        let got = client
            .get(key.as_bytes(), Consistency::Linearizable)
            .await
            .unwrap();
        assert_eq!(got.kv.unwrap().mod_revision, revision, "{key}");
        assert!(got.revision >= revision);
    }
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scan_pages_through_a_span() {
    let cluster = Cluster::start(3).await;
    let client = cluster.client();
    for i in 0..25 {
        let key = format!("s/{i:02}");
        client
            .put(key.as_bytes(), b"v", PutOptions::default())
            .await
            .unwrap();
    }
    client
        .put(b"t", b"outside", PutOptions::default())
        .await
        .unwrap();
    let mut start = b"s/".to_vec();
    let mut pages = Vec::new();
    loop {
        let page = client
            .scan(&start, b"s0", 10, Consistency::Linearizable)
            .await
            .unwrap();
        pages.push(page.kvs.len());
        let keys: Vec<_> = page.kvs.iter().map(|kv| kv.key.clone()).collect();
        assert!(
            keys.windows(2).all(|pair| pair[0] < pair[1]),
            "keys in order"
        );
        match page.next_start {
            Some(next) => start = next,
            None => break,
        }
    }
    assert_eq!(pages.iter().sum::<usize>(), 25);
    assert_eq!(pages[..3], [10, 10, 5]);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leader_failover_loses_no_acknowledged_write() {
    let mut cluster = Cluster::start(3).await;
    let client = cluster.client();
    let mut acknowledged = BTreeMap::new();
    for i in 0..100 {
        let (key, value) = (format!("f{i}"), format!("v{i}"));
        client
            .put(key.as_bytes(), value.as_bytes(), PutOptions::default())
            .await
            .unwrap();
        acknowledged.insert(key, value);
    }
    let old_leader = cluster.leader().await;
    cluster.stop_node(old_leader).await;
    let new_leader = cluster.leader().await;
    assert_ne!(new_leader, old_leader);
    for i in 100..150 {
        let (key, value) = (format!("f{i}"), format!("v{i}"));
        match client
            .put(key.as_bytes(), value.as_bytes(), PutOptions::default())
            .await
        {
            Ok(_) => {
                acknowledged.insert(key, value);
            }
            Err(KvError::OutcomeUnknown { .. }) => {}
            Err(other) => panic!("write {key} failed: {other}"),
        }
    }
    for (key, value) in &acknowledged {
        let got = client
            .get(key.as_bytes(), Consistency::Linearizable)
            .await
            .unwrap();
        assert_eq!(got.kv.unwrap().value, value.as_bytes(), "{key}");
    }
    cluster.start_node(old_leader).await;
    let newest = acknowledged
        .keys()
        .max_by_key(|key| key[1..].parse::<u32>().unwrap());
    cluster
        .applied_on(old_leader, newest.unwrap().as_bytes())
        .await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lease_reads_are_served_by_the_leader() {
    let cluster = Cluster::start(3).await;
    let leader = cluster.leader().await;
    let follower = cluster.ids().into_iter().find(|id| *id != leader).unwrap();
    let written = cluster
        .client()
        .put(b"l", b"1", PutOptions::default())
        .await
        .unwrap();
    // Asked through a follower, the client follows the leader hint.
    let got = cluster
        .client_of(follower)
        .get(b"l", Consistency::Lease)
        .await
        .unwrap();
    assert_eq!(got.served_by, leader);
    assert_eq!(got.kv.unwrap().value, b"1");
    assert!(got.revision >= written.revision);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn follower_reads_serve_local_state() {
    let mut cluster = Cluster::start(3).await;
    let written = cluster
        .client()
        .put(b"f", b"1", PutOptions::default())
        .await
        .unwrap();
    for id in cluster.ids() {
        let got = cluster.applied_on(id, b"f").await;
        assert_eq!(
            got.served_by, id,
            "a follower read is served where it lands"
        );
        assert!(got.revision >= written.revision);
    }
    // Without a quorum, follower reads still answer from local state; linearizable ones
    // must not.
    let leader = cluster.leader().await;
    let survivor = cluster.ids().into_iter().find(|id| *id != leader).unwrap();
    for id in cluster.ids() {
        if id != survivor {
            cluster.stop_node(id).await;
        }
    }
    let client = cluster.client_of(survivor);
    let stale = client.get(b"f", Consistency::Follower).await.unwrap();
    assert_eq!(stale.kv.unwrap().value, b"1");
    let linearizable = client.get(b"f", Consistency::Linearizable).await;
    assert!(
        matches!(
            linearizable,
            Err(KvError::Unavailable { .. } | KvError::Timeout { .. } | KvError::NotLeader { .. })
        ),
        "a minority served a linearizable read: {linearizable:?}"
    );
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn restart_recovers_from_disk() {
    let mut cluster = Cluster::start(3).await;
    let client = cluster.client();
    let mut last = 0;
    for i in 0..20 {
        let key = format!("r{i}");
        last = client
            .put(key.as_bytes(), b"kept", PutOptions::default())
            .await
            .unwrap()
            .revision;
    }
    for id in cluster.ids() {
        cluster.stop_node(id).await;
    }
    for id in cluster.ids() {
        cluster.start_node(id).await;
    }
    cluster.leader().await;
    for i in 0..20 {
        let key = format!("r{i}");
        let got = client
            .get(key.as_bytes(), Consistency::Linearizable)
            .await
            .unwrap();
        assert_eq!(got.kv.unwrap().value, b"kept", "{key}");
    }
    let after = client
        .put(b"r-after", b"1", PutOptions::default())
        .await
        .unwrap();
    assert!(after.revision > last, "revision went back after restart");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leadership_moves_to_the_named_voter_through_any_node() {
    let cluster = Cluster::start(3).await;
    let leader = cluster.leader().await;
    let target = cluster.ids().into_iter().find(|id| *id != leader).unwrap();
    let other = cluster
        .ids()
        .into_iter()
        .find(|id| *id != leader && *id != target)
        .unwrap();
    // Asked through a follower that is not the target: it forwards to the leader.
    let client = cluster.client_of(other);
    client
        .transfer_leader(RangeId::FIRST, target)
        .await
        .unwrap();
    eventually("the named voter leads", || async {
        (cluster.leader().await == target).then_some(())
    })
    .await;
    let refused = client.transfer_leader(RangeId::FIRST, 99).await;
    assert!(
        matches!(refused, Err(KvError::InvalidArgument { .. })),
        "{refused:?}"
    );
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_replica_names_the_leader_of_a_keys_range() {
    let cluster = Cluster::start(3).await;
    let leader = cluster.leader_of(RangeId::FIRST).await;
    for id in cluster.ids() {
        let mut service = cluster.cluster_client(id).await;
        let request = LeaderRequest { key: b"k".to_vec() };
        let answer = service.leader(request).await.unwrap().into_inner();
        assert_eq!(answer.range_id, RangeId::FIRST.0, "asked node {id}");
        assert_eq!(answer.leader_id, Some(leader), "asked node {id}");
        assert_eq!(answer.leader_addr, cluster.endpoint(leader));
        assert!(answer.term > 0);
    }
    let mut service = cluster.cluster_client(leader).await;
    let too_long = LeaderRequest {
        key: vec![b'k'; limits::KEY_BYTES_MAX + 1],
    };
    let refused = service.leader(too_long).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    cluster.shutdown().await;
}
