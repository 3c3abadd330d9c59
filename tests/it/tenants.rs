//! A cluster with authentication on (TLS, tokens of two tenants and an admin): requests
//! without a token or with an unknown one are refused; each tenant sees only its own keys,
//! locks, idempotency records and ranges, whatever bytes its keys hold; tenants may not
//! administer; quotas refuse with a typed error.

use std::time::{Duration, Instant};

use keel_client::{AcquireOptions, BeginResult, Client, ClientOptions, PutOptions};
use keel_proto::v1::cluster_client::ClusterClient;
use keel_proto::v1::kv_client::KvClient;
use keel_proto::v1::{self, GetRequest, PutRequest};
use keel_server::Access;
use keel_types::tenant::{Namespace, TenantName};
use keel_types::{Consistency, KvError, RangeDescriptor, ReadBound};

use crate::harness::{Cluster, WAIT_LIMIT, eventually, with_bearer};

pub(crate) const ADMIN: &str = "admin-token-0123456789";
pub(crate) const ACME: &str = "acme-token-0123456789";
pub(crate) const GLOBEX: &str = "globex-token-0123456789";
const SLOW: &str = "slow-token-0123456789";
const SMALL: &str = "small-token-0123456789";

pub(crate) const TOKENS: &str = r#"
[[admin]]
name = "ops"
tokens = ["admin-token-0123456789"]

[[tenant]]
name = "acme"
tokens = ["acme-token-0123456789"]

[[tenant]]
name = "globex"
tokens = ["globex-token-0123456789"]

[[tenant]]
name = "slow"
tokens = ["slow-token-0123456789"]
max_requests_per_sec = 1

[[tenant]]
name = "small"
tokens = ["small-token-0123456789"]
max_keys = 5
"#;

async fn start() -> Cluster {
    Cluster::start_authenticated(3, Access::parse(TOKENS).unwrap(), ADMIN).await
}

/// Waits until the namespace of each tenant named is a range of its own, in the meta range
/// and in every running node's own table: a raw watch served by a replica that has not
/// applied the split yet would start on the parent range and end at the split.
async fn ranges_of_their_own(cluster: &Cluster, tenants: &[&str]) {
    let admin = cluster.client();
    let namespaces: Vec<Namespace> = tenants
        .iter()
        .map(|name| Namespace::of(&TenantName::new(name).unwrap()))
        .collect();
    let whole = |namespace: &Namespace, ranges: &[RangeDescriptor]| {
        ranges
            .iter()
            .any(|range| range.start == namespace.start() && range.end() == Some(namespace.end()))
    };
    eventually("the namespaces split off", || {
        let (admin, namespaces) = (admin.clone(), namespaces.clone());
        async move {
            let ranges = admin.ranges().await.ok()?;
            let mut tables = vec![ranges.into_iter().map(|info| info.descriptor).collect()];
            for id in cluster.running() {
                tables.push(cluster.node(id).local_ranges());
            }
            let split = |namespace: &Namespace| tables.iter().all(|table| whole(namespace, table));
            namespaces.iter().all(split).then_some(())
        }
    })
    .await;
}

fn client_as(cluster: &Cluster, token: Option<&str>) -> Client {
    let options = ClientOptions {
        token: token.map(str::to_string),
        write_deadline: Duration::from_secs(5),
        ..cluster.client_options()
    };
    let endpoints = cluster
        .ids()
        .iter()
        .map(|id| cluster.endpoint(*id))
        .collect();
    Client::new(endpoints, options).unwrap()
}

async fn value(client: &Client, key: &[u8]) -> Option<Vec<u8>> {
    let got = client.get(key, Consistency::Linearizable).await.unwrap();
    got.kv.map(|kv| kv.value)
}

async fn put(client: &Client, key: &[u8], value: &[u8]) -> Result<(), KvError> {
    client
        .put(key, value, PutOptions::default())
        .await
        .map(|_| ())
}

fn stored(tenant: &str, key: &[u8]) -> Vec<u8> {
    Namespace::of(&TenantName::new(tenant).unwrap()).confine(key)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn requests_without_a_known_token_are_refused_and_change_nothing() {
    let cluster = start().await;
    let admin = client_as(&cluster, Some(ADMIN));
    for token in [None, Some("wrong-token-0123456789")] {
        let anonymous = client_as(&cluster, token);
        let refused = put(&anonymous, b"k", b"v").await.unwrap_err();
        assert!(
            matches!(refused, KvError::Unauthenticated { .. }),
            "{token:?}: {refused:?}"
        );
        let read = anonymous.get(b"k", Consistency::Linearizable).await;
        assert!(
            matches!(read, Err(KvError::Unauthenticated { .. })),
            "{read:?}"
        );
    }
    assert_eq!(value(&admin, b"k").await, None, "nothing was written");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tenants_see_only_their_own_keys_locks_records_and_ranges() {
    let cluster = start().await;
    let (acme, globex) = (
        client_as(&cluster, Some(ACME)),
        client_as(&cluster, Some(GLOBEX)),
    );
    let admin = client_as(&cluster, Some(ADMIN));
    put(&acme, b"k", b"acme's").await.unwrap();
    put(&globex, b"k", b"globex's").await.unwrap();
    assert_eq!(value(&acme, b"k").await.unwrap(), b"acme's");
    assert_eq!(value(&globex, b"k").await.unwrap(), b"globex's");

    // A key crafted to be globex's stored key stays in acme's namespace.
    let crafted = stored("globex", b"k");
    assert_eq!(value(&acme, &crafted).await, None);
    put(&acme, &crafted, b"forged").await.unwrap();
    assert_eq!(value(&globex, b"k").await.unwrap(), b"globex's");
    assert_eq!(
        value(&admin, &stored("acme", &crafted)).await.unwrap(),
        b"forged"
    );

    let everything = acme.scan(b"", b"", 0, Consistency::Linearizable).await;
    let keys: Vec<Vec<u8>> = everything
        .unwrap()
        .kvs
        .into_iter()
        .map(|kv| kv.key)
        .collect();
    assert_eq!(
        keys,
        vec![b"k".to_vec(), crafted.clone()],
        "acme lists its own names only"
    );
    let theirs = globex.scan(b"", b"", 0, Consistency::Linearizable).await;
    assert_eq!(theirs.unwrap().kvs.len(), 1);

    let lock = |ttl| AcquireOptions {
        ttl,
        ..AcquireOptions::default()
    };
    let held = acme
        .acquire(b"jobs", lock(Duration::from_secs(30)))
        .await
        .unwrap();
    let other = globex
        .acquire(b"jobs", lock(Duration::from_secs(30)))
        .await
        .unwrap();
    assert!(
        held.acquired && other.acquired,
        "two locks named alike, one per tenant"
    );
    let inspected = globex
        .inspect(b"jobs", Consistency::Linearizable)
        .await
        .unwrap();
    assert_eq!(inspected.holder.unwrap().token, other.holder.unwrap().token);

    let ttl = Duration::from_secs(30);
    let first = acme.begin(b"orders", b"1", None, ttl).await.unwrap();
    let second = globex.begin(b"orders", b"1", None, ttl).await.unwrap();
    assert!(
        matches!(first, BeginResult::Started { .. })
            && matches!(second, BeginResult::Started { .. }),
        "{first:?} {second:?}"
    );

    let ranges = acme.ranges().await.unwrap();
    assert!(!ranges.is_empty());
    for range in &ranges {
        assert!(
            !range
                .descriptor
                .start
                .starts_with(&keel_types::tenant::TENANT_MARK),
            "{}",
            range.descriptor
        );
    }
    cluster.shutdown().await;
}

/// Every name in `tenant`'s history of `key`: the events' keys and their states' keys.
async fn history_names(client: &Client, key: &[u8]) -> Vec<Vec<u8>> {
    let page = client
        .history(key, 0, 0, Consistency::Linearizable, ReadBound::default())
        .await
        .unwrap();
    let mut names = Vec::new();
    for event in page.events {
        names.push(event.key);
        names.extend(event.before.into_iter().chain(event.after).map(|kv| kv.key));
    }
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenant_reads_the_history_of_its_own_keys_only() {
    let cluster = start().await;
    let (acme, globex) = (
        client_as(&cluster, Some(ACME)),
        client_as(&cluster, Some(GLOBEX)),
    );
    put(&globex, b"secret", b"globex's").await.unwrap();
    put(&globex, b"secret", b"globex's too").await.unwrap();
    put(&acme, b"secret", b"acme's").await.unwrap();
    // Acme sees its own change, named as it named it.
    assert_eq!(
        history_names(&acme, b"secret").await,
        vec![b"secret".to_vec(); 2]
    );
    // Globex's key by its stored name stays in acme's namespace: nothing there.
    let crafted = stored("globex", b"secret");
    assert!(history_names(&acme, &crafted).await.is_empty());
    // Globex sees its two changes, and none of acme's.
    let theirs = globex
        .history(
            b"secret",
            0,
            0,
            Consistency::Linearizable,
            ReadBound::default(),
        )
        .await
        .unwrap();
    let values: Vec<Vec<u8>> = theirs
        .events
        .into_iter()
        .filter_map(|event| event.after.map(|kv| kv.value))
        .collect();
    assert_eq!(values, vec![b"globex's".to_vec(), b"globex's too".to_vec()]);
    cluster.shutdown().await;
}

/// A tenant reading the whole keyspace at a past revision (and another tenant's stored key
/// by name) sees its own keys only, as they were.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenants_reads_at_a_revision_see_its_own_keys_only() {
    let cluster = start().await;
    let (acme, globex) = (
        client_as(&cluster, Some(ACME)),
        client_as(&cluster, Some(GLOBEX)),
    );
    put(&acme, b"secret", b"acme's").await.unwrap();
    let then = globex
        .put(b"secret", b"globex's", PutOptions::default())
        .await
        .unwrap()
        .revision;
    put(&globex, b"secret", b"globex's later").await.unwrap();
    put(&acme, b"secret", b"acme's later").await.unwrap();
    let linearizable = Consistency::Linearizable;
    let page = acme.scan_at(b"", b"", 0, then, linearizable).await.unwrap();
    let rows: Vec<(Vec<u8>, Vec<u8>)> = page.kvs.into_iter().map(|kv| (kv.key, kv.value)).collect();
    assert_eq!(rows, vec![(b"secret".to_vec(), b"acme's".to_vec())]);
    let crafted = stored("globex", b"secret");
    let read = acme.get_at(&crafted, then, linearizable).await.unwrap();
    assert_eq!(read.kv, None);
    let theirs = globex.get_at(b"secret", then, linearizable).await.unwrap();
    assert_eq!(theirs.kv.unwrap().value, b"globex's");
    cluster.shutdown().await;
}

/// A tenant watching the whole keyspace (and a span named by another tenant's stored keys),
/// reclaims included, sees its own changes only, named as it named them: not another
/// tenant's keys, nor the reclaim of its lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenants_watch_of_everything_streams_its_own_keys_only() {
    let cluster = start().await;
    // A raw stream ends at a split: let the split driver cut both namespaces off first.
    ranges_of_their_own(&cluster, &["acme", "globex"]).await;
    let (acme, globex) = (
        client_as(&cluster, Some(ACME)),
        client_as(&cluster, Some(GLOBEX)),
    );
    let mut kv = KvClient::new(cluster.tls_channel(cluster.leader().await).await);
    let everything = v1::WatchRequest {
        prev_kv: true,
        reclaims: true,
        progress_interval_ms: 100,
        ..v1::WatchRequest::default()
    };
    let crafted = v1::WatchRequest {
        start: stored("globex", b""),
        end: stored("globex", b"\xff"),
        reclaims: true,
        progress_interval_ms: 100,
        ..v1::WatchRequest::default()
    };
    let mut streams = Vec::new();
    for request in [everything.clone(), crafted] {
        let mut stream = kv.watch(with_token(request)).await.unwrap().into_inner();
        stream.message().await.unwrap().unwrap().started.unwrap();
        streams.push(stream);
    }
    put(&globex, b"secret", b"globex's").await.unwrap();
    put(&acme, b"mine", b"acme's").await.unwrap();
    put(&globex, b"secret", b"globex's too").await.unwrap();
    // Globex's lock runs out and is reclaimed; globex's own watch sees it go first.
    let mut own = KvClient::new(cluster.tls_channel(cluster.leader().await).await);
    let request = with_bearer(GLOBEX, everything);
    let mut own = own.watch(request).await.unwrap().into_inner();
    own.message().await.unwrap().unwrap().started.unwrap();
    let lock = AcquireOptions {
        ttl: Duration::from_secs(1),
        lock_delay: Duration::ZERO,
        ..AcquireOptions::default()
    };
    assert!(globex.acquire(b"held", lock).await.unwrap().acquired);
    cluster.advance_clocks_ms(2_000);
    let reclaimed = loop {
        let message = own.message().await.unwrap().unwrap();
        let found = message.events.into_iter().find(|event| event.kind != 0);
        if let Some(event) = found {
            break event;
        }
    };
    assert_eq!(reclaimed.key, b"held", "named as globex named it");
    let last = acme
        .put(b"\xffmine", b"acme's", PutOptions::default())
        .await
        .unwrap();
    let expected: [Vec<&[u8]>; 2] = [vec![b"mine", b"\xffmine"], vec![]];
    for (stream, expected) in streams.iter_mut().zip(expected) {
        let mut keys = Vec::new();
        loop {
            let message = stream.message().await.unwrap().unwrap();
            for event in message.events {
                assert_eq!(event.kv.unwrap().value, b"acme's");
                keys.push(event.key);
            }
            if message.complete_revision >= last.revision {
                break;
            }
        }
        assert_eq!(keys, expected);
    }
    cluster.shutdown().await;
}

/// A tenant that learns another tenant's watch id cannot ask that stream for anything: it
/// gets the answer an unknown id gets, and the owner's stream sends only what its owner asks.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenant_may_not_ask_another_tenants_watch_for_progress() {
    let cluster = start().await;
    ranges_of_their_own(&cluster, &["acme"]).await;
    let mut kv = KvClient::new(cluster.tls_channel(cluster.leader().await).await);
    let request = with_token(v1::WatchRequest::default());
    let mut stream = kv.watch(request).await.unwrap().into_inner();
    let started = stream.message().await.unwrap().unwrap().started.unwrap();
    let ask = |token| {
        let request = v1::WatchProgressRequest {
            watch_id: started.watch_id,
        };
        with_bearer(token, request)
    };
    for intruder in [GLOBEX, ADMIN] {
        let refused = kv.watch_progress(ask(intruder)).await.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{intruder}");
    }
    kv.watch_progress(ask(ACME)).await.unwrap();
    let progress = stream.message().await.unwrap().unwrap();
    assert!(progress.requested && progress.events.is_empty());
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tenants_may_not_administer_the_cluster() {
    let cluster = start().await;
    let acme = client_as(&cluster, Some(ACME));
    let denied = acme.split(b"m").await.unwrap_err();
    assert!(
        matches!(denied, KvError::PermissionDenied { .. }),
        "{denied:?}"
    );
    let status = acme.status(&cluster.endpoint(1)).await.unwrap_err();
    assert!(
        matches!(status, KvError::PermissionDenied { .. }),
        "{status:?}"
    );
    let admin = client_as(&cluster, Some(ADMIN));
    admin.split(b"m").await.unwrap();
    cluster.shutdown().await;
}

/// `message` with acme's token.
fn with_token<T>(message: T) -> tonic::Request<T> {
    with_bearer(ACME, message)
}

/// A raw call to a follower, which forwards it to the leader as the tenant's request.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_request_a_follower_forwards_stays_in_its_tenants_namespace() {
    let cluster = start().await;
    let leader = cluster.leader().await;
    let follower = cluster.ids().into_iter().find(|id| *id != leader).unwrap();
    let mut kv = KvClient::new(cluster.tls_channel(follower).await);
    let put = PutRequest {
        key: b"via-follower".to_vec(),
        value: b"v".to_vec(),
        ..PutRequest::default()
    };
    kv.put(with_token(put)).await.unwrap();
    let get = GetRequest {
        key: b"via-follower".to_vec(),
        consistency: v1::Consistency::Linearizable.into(),
        no_forward: false,
        ..GetRequest::default()
    };
    let got = kv.get(with_token(get)).await.unwrap().into_inner();
    assert_eq!(
        got.kv.unwrap().key,
        b"via-follower",
        "the answer names the tenant's key"
    );
    let acme = client_as(&cluster, Some(ACME));
    assert_eq!(value(&acme, b"via-follower").await.unwrap(), b"v");
    let admin = client_as(&cluster, Some(ADMIN));
    assert_eq!(
        value(&admin, b"via-follower").await,
        None,
        "not in the raw keyspace"
    );
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn quotas_refuse_with_a_typed_error() {
    let cluster = start().await;
    let slow = client_as(&cluster, Some(SLOW));
    let mut refused = None;
    for _ in 0..50 {
        if let Err(error) = slow.get(b"k", Consistency::Linearizable).await {
            refused = Some(error);
            break;
        }
    }
    match refused {
        Some(KvError::QuotaExceeded {
            tenant,
            quota,
            limit,
        }) => {
            assert_eq!(
                (tenant.as_str(), quota.as_str(), limit),
                ("slow", "requests_per_sec", 1)
            );
        }
        other => panic!("50 reads at once passed a quota of 1 per second: {other:?}"),
    }

    // Keys: reserved on the range's leader against its live counts, so writes stop at the
    // quota (tenant_quotas.rs bounds the overshoot).
    let small = client_as(&cluster, Some(SMALL));
    let started = Instant::now();
    let mut written = 0u32;
    let refusal = loop {
        assert!(
            started.elapsed() < WAIT_LIMIT,
            "{written} keys written, never refused"
        );
        match put(&small, format!("key-{written}").as_bytes(), b"v").await {
            Ok(()) => written += 1,
            Err(error) => break error,
        }
    };
    assert!(
        matches!(&refusal, KvError::QuotaExceeded { quota, limit: 5, .. } if quota == "keys"),
        "{refusal:?}"
    );
    assert!(written >= 5, "refused after {written} keys");
    small.delete(b"key-0", Default::default()).await.unwrap();
    cluster.shutdown().await;
}

/// `Cluster.Leader` answers a tenant for its own names only: a key crafted as another
/// tenant's stored key is looked up inside the caller's namespace, and a call without a
/// known token is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenant_asking_who_leads_learns_only_of_its_own_ranges() {
    let cluster = start().await;
    let admin = client_as(&cluster, Some(ADMIN));
    // acme's names sort before globex's: split between them.
    admin.split(&stored("globex", b"")).await.unwrap();
    let mut service = ClusterClient::new(cluster.tls_channel(1).await);
    let ask = |token: &str, key: Vec<u8>| with_bearer(token, v1::LeaderRequest { key });
    let crafted = stored("globex", b"k");

    let theirs = service.leader(ask(ADMIN, crafted.clone())).await.unwrap();
    let own = service
        .leader(ask(ADMIN, stored("acme", &crafted)))
        .await
        .unwrap();
    let seen = service.leader(ask(ACME, crafted.clone())).await.unwrap();
    let (theirs, own, seen) = (theirs.into_inner(), own.into_inner(), seen.into_inner());
    assert_ne!(theirs.range_id, own.range_id, "the split put them apart");
    assert_eq!(
        seen.range_id, own.range_id,
        "acme's crafted key is looked up in acme's namespace"
    );

    let anonymous = service
        .leader(v1::LeaderRequest { key: b"k".to_vec() })
        .await
        .unwrap_err();
    assert_eq!(
        anonymous.code(),
        tonic::Code::Unauthenticated,
        "{anonymous:?}"
    );
    cluster.shutdown().await;
}
