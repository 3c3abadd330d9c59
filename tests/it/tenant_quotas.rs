//! Tenants' quotas under load (issue 23): keys reserved at admission from the leader's live
//! counts hold a tenant to about its quota whatever it batches and whichever node it calls;
//! locks and idempotency records count toward keys and bytes; every call, listings
//! included, draws from the requests/s bucket, a batch one token per op. Every load loop is
//! bounded in count and in time.

use std::time::{Duration, Instant};

use keel_client::{AcquireOptions, BeginResult, Client, ClientOptions, PutOptions};
use keel_proto::v1::cluster_client::ClusterClient;
use keel_proto::v1::kv_client::KvClient;
use keel_proto::v1::{MembersRequest, OpenSessionRequest, RangesRequest};
use keel_server::Access;
use keel_types::tenant::{Namespace, TenantName};
use keel_types::{BatchOp, Consistency, KvError, limits};

use crate::harness::{Cluster, WAIT_LIMIT, eventually, with_bearer};

const ADMIN: &str = "admin-token-0123456789";
const FIFTY: &str = "fifty-token-0123456789";
const COORD: &str = "coord-token-0123456789";
const PACED: &str = "paced-token-0123456789";
const RESULTS: &str = "results-token-0123456789";

const TOKENS: &str = r#"
[[admin]]
name = "ops"
tokens = ["admin-token-0123456789"]

[[tenant]]
name = "fifty"
tokens = ["fifty-token-0123456789"]
max_keys = 50

[[tenant]]
name = "coord"
tokens = ["coord-token-0123456789"]
max_keys = 4
max_bytes = 32768

[[tenant]]
name = "paced"
tokens = ["paced-token-0123456789"]
max_requests_per_sec = 5

[[tenant]]
name = "results"
tokens = ["results-token-0123456789"]
max_bytes = 32768
"#;

const QUOTA: usize = 50;

async fn start() -> Cluster {
    Cluster::start_authenticated(3, Access::parse(TOKENS).unwrap(), ADMIN).await
}

/// A client of `token` that calls only `endpoints`.
fn client_of(cluster: &Cluster, token: &str, endpoints: Vec<String>) -> Client {
    let options = ClientOptions {
        token: Some(token.to_string()),
        write_deadline: Duration::from_secs(5),
        ..cluster.client_options()
    };
    Client::new(endpoints, options).unwrap()
}

/// One client of `token` per node, each calling its node only.
fn one_client_per_node(cluster: &Cluster, token: &str) -> Vec<Client> {
    let ids = cluster.ids();
    let per_node = ids.iter().map(|id| vec![cluster.endpoint(*id)]);
    per_node
        .map(|endpoint| client_of(cluster, token, endpoint))
        .collect()
}

fn put(key: String) -> BatchOp {
    BatchOp::Put {
        key: key.into_bytes(),
        value: b"v".to_vec(),
        condition: None,
        return_previous: false,
        ttl_ms: None,
    }
}

/// The keys the tenant of `client` holds.
async fn keys_held(client: &Client) -> usize {
    let limit = limits::SCAN_LIMIT_MAX;
    let held = client.scan(b"", b"", limit, Consistency::Linearizable);
    held.await.unwrap().kvs.len()
}

/// Sends batches of `ops` new keys from `client` until `rounds` were sent or time is up;
/// returns how many were refused by the keys quota. Other failures are retried next round.
async fn fill_with_batches(client: Client, name: String, ops: usize, rounds: usize) -> usize {
    let started = Instant::now();
    let mut refused = 0;
    for round in 0..rounds {
        if started.elapsed() > WAIT_LIMIT {
            break;
        }
        let batch = (0..ops).map(|op| put(format!("{name}-{round}-{op}")));
        // Other failures (a deadline, a leader change) are tried again next round.
        if let Err(KvError::QuotaExceeded { quota, limit, .. }) =
            client.batch(batch.collect()).await
        {
            assert_eq!((quota.as_str(), limit), ("keys", QUOTA as u64));
            refused += 1;
        }
    }
    refused
}

/// Before issue 23 a batch counted as one request and the keys were judged against a table
/// refreshed every 2 s: a tenant with `max_keys = 50` reached thousands of keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn batches_from_every_node_cannot_carry_a_tenant_past_its_keys_quota() {
    let cluster = start().await;
    const BATCH: usize = 8;
    let mut writers = Vec::new();
    for (n, client) in one_client_per_node(&cluster, FIFTY).into_iter().enumerate() {
        for lane in 0..2 {
            let name = format!("node{n}-lane{lane}");
            writers.push(tokio::spawn(fill_with_batches(
                client.clone(),
                name,
                BATCH,
                40,
            )));
        }
    }
    let in_flight = writers.len();
    let big = one_client_per_node(&cluster, FIFTY).remove(0);
    let whole = (0..limits::BATCH_OPS_MAX).map(|op| put(format!("big-{op}")));
    let refused_big = big.batch(whole.collect()).await;
    assert!(
        matches!(&refused_big, Err(KvError::QuotaExceeded { quota, .. }) if quota == "keys"),
        "a batch of {} new keys passes a quota of {QUOTA}: {refused_big:?}",
        limits::BATCH_OPS_MAX
    );
    let mut refused = 0;
    for writer in writers {
        refused += writer.await.unwrap();
    }
    let held = keys_held(&big).await;
    // One range, so the bound is the quota; a leader change may add what was in flight.
    let bound = QUOTA + in_flight * BATCH;
    assert!(
        held <= bound,
        "{held} keys held; quota {QUOTA}, bound {bound}"
    );
    assert!(refused > 0, "the writers were never refused");
    assert!(
        held >= QUOTA - BATCH,
        "the quota was reachable: {held} keys held"
    );
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn single_puts_over_three_nodes_stay_within_the_keys_quota() {
    let cluster = start().await;
    let mut writers = Vec::new();
    for (n, client) in one_client_per_node(&cluster, FIFTY).into_iter().enumerate() {
        writers.push(tokio::spawn(async move {
            let started = Instant::now();
            let mut written = 0;
            for i in 0..2 * QUOTA {
                if started.elapsed() > WAIT_LIMIT {
                    break;
                }
                let key = format!("node{n}-{i}");
                if client
                    .put(key.as_bytes(), b"v", PutOptions::default())
                    .await
                    .is_ok()
                {
                    written += 1;
                }
            }
            (client, written)
        }));
    }
    let in_flight = writers.len();
    let mut written = 0;
    let mut any = None;
    for writer in writers {
        let (client, count) = writer.await.unwrap();
        written += count;
        any = Some(client);
    }
    let held = keys_held(&any.unwrap()).await;
    assert!(
        held >= written,
        "{written} puts acknowledged, {held} keys held"
    );
    assert!(
        held <= QUOTA + in_flight,
        "{held} keys held with a quota of {QUOTA}"
    );
    cluster.shutdown().await;
}

/// Before issue 23 locks and idempotency records were not counted at all, and a result was
/// not counted toward bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn locks_and_idempotency_records_count_toward_keys_and_bytes() {
    let cluster = start().await;
    let coord = client_of(&cluster, COORD, vec![cluster.endpoint(cluster.ids()[0])]);
    let ttl = Duration::from_secs(60);
    let lock = AcquireOptions {
        ttl,
        ..AcquireOptions::default()
    };
    for name in [b"lock-a".as_slice(), b"lock-b"] {
        assert!(coord.acquire(name, lock.clone()).await.unwrap().acquired);
    }
    let mut token = None;
    for id in [b"1".as_slice(), b"2"] {
        match coord.begin(b"orders", id, None, ttl).await.unwrap() {
            BeginResult::Started { token: started, .. } => token = Some(started),
            other => panic!("record {id:?} not started: {other:?}"),
        }
    }
    let is_keys = |error: &KvError| matches!(error, KvError::QuotaExceeded { quota, limit: 4, .. } if quota == "keys");
    let put = coord.put(b"k", b"v", PutOptions::default()).await;
    assert!(
        put.as_ref().is_err_and(is_keys),
        "2 locks + 2 records fill 4 keys: {put:?}"
    );
    let third = coord.acquire(b"lock-c", lock.clone()).await;
    assert!(third.as_ref().is_err_and(is_keys), "{third:?}");
    let begun = coord.begin(b"orders", b"3", None, ttl).await;
    assert!(begun.as_ref().is_err_and(is_keys), "{begun:?}");

    let result = vec![7u8; limits::IDEMPOTENCY_RESULT_BYTES_MAX];
    let token = token.unwrap();
    let completed = coord.complete(b"orders", b"2", token, &result, ttl).await;
    assert!(
        matches!(&completed, Err(KvError::QuotaExceeded { quota, limit: 32768, .. }) if quota == "bytes"),
        "a 64 KiB result passes a 32 KiB bytes quota: {completed:?}"
    );
    coord
        .complete(b"orders", b"2", token, b"ok", ttl)
        .await
        .unwrap();
    cluster.shutdown().await;
}

/// Idempotency results are kept after their write: each stored one counts toward
/// `max_bytes`, so results one after another stop at the quota, not only one larger than it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stored_idempotency_results_count_toward_the_bytes_quota() {
    let cluster = start().await;
    // Once the namespace is a range of its own, its counts are the range's recorded ones
    // (before, its rows are counted one by one).
    let namespace = Namespace::of(&TenantName::new("results").unwrap());
    let admin = cluster.client();
    eventually("the namespace splits off", || {
        let admin = admin.clone();
        let (start, end) = (namespace.start().to_vec(), namespace.end().to_vec());
        async move {
            let ranges = admin.ranges().await.ok()?;
            let whole = |info: &keel_client::RangeInfo| {
                info.descriptor.start == start && info.descriptor.end() == Some(end.as_slice())
            };
            ranges.iter().any(whole).then_some(())
        }
    })
    .await;
    let results = client_of(&cluster, RESULTS, vec![cluster.endpoint(cluster.ids()[0])]);
    let ttl = Duration::from_secs(60);
    let result = vec![7u8; 8 * 1024];
    let mut stored = 0usize;
    let refusal = loop {
        assert!(
            stored < 20,
            "{stored} results of 8 KiB stored under a 32 KiB quota"
        );
        let id = format!("job-{stored}");
        let token = match results.begin(b"jobs", id.as_bytes(), None, ttl).await {
            Ok(BeginResult::Started { token, .. }) => token,
            Ok(other) => panic!("record {id} not started: {other:?}"),
            Err(error) => break error,
        };
        match results
            .complete(b"jobs", id.as_bytes(), token, &result, ttl)
            .await
        {
            Ok(_) => stored += 1,
            Err(error) => break error,
        }
    };
    assert!(
        matches!(&refusal, KvError::QuotaExceeded { quota, limit: 32768, .. } if quota == "bytes"),
        "{refusal:?}"
    );
    // Sent one at a time, no write is in flight beside the one judged: 3 results and their
    // records fit in 32 KiB, a 4th does not.
    assert_eq!(stored, 3, "results stored before the refusal");
    cluster.shutdown().await;
}

/// `message` with the paced tenant's token.
fn paced<T>(message: T) -> tonic::Request<T> {
    with_bearer(PACED, message)
}

/// Calls `call` up to 50 times (10 times the rate) and returns the first refusal.
async fn first_refusal<F, Fut, T>(mut call: F) -> Option<tonic::Status>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, tonic::Status>>,
{
    for _ in 0..50 {
        if let Err(status) = call().await {
            return Some(status);
        }
    }
    None
}

/// Before issue 23 only reads and writes drew from the bucket: `Ranges`, `Members` and
/// `OpenSession` ran unbounded.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn listing_calls_are_refused_past_the_request_rate() {
    let cluster = start().await;
    // A batch drawing more tokens than the bucket holds can never pass: refused as invalid.
    let client = client_of(&cluster, PACED, vec![cluster.endpoint(cluster.ids()[0])]);
    let batch = (0..6).map(|op| put(format!("k{op}"))).collect();
    let too_large = client.batch(batch).await;
    assert!(
        matches!(&too_large, Err(KvError::InvalidArgument { message }) if message.contains("at most 5 ops")),
        "{too_large:?}"
    );

    // Past the rate, every call is refused, listings included.
    let channel = cluster.tls_channel(cluster.ids()[0]).await;
    let cluster_client = ClusterClient::new(channel.clone());
    let kv = KvClient::new(channel);
    let refused = [
        first_refusal(|| {
            let mut client = cluster_client.clone();
            async move { client.ranges(paced(RangesRequest::default())).await }
        })
        .await,
        first_refusal(|| {
            let mut client = cluster_client.clone();
            async move { client.members(paced(MembersRequest::default())).await }
        })
        .await,
        first_refusal(|| {
            let mut kv = kv.clone();
            async move { kv.open_session(paced(OpenSessionRequest::default())).await }
        })
        .await,
    ];
    for (call, status) in ["Ranges", "Members", "OpenSession"].iter().zip(refused) {
        let status = status.unwrap_or_else(|| panic!("50 {call} calls passed 5 per second"));
        assert_eq!(
            status.code(),
            tonic::Code::ResourceExhausted,
            "{call}: {status:?}"
        );
        assert!(
            status.message().contains("requests_per_sec"),
            "{call}: {status:?}"
        );
    }

    cluster.shutdown().await;
}
