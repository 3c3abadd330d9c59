//! Request ids across tenants and commands, as an attacker would try them: a tenant that
//! knows another's client id gets none of its results, before or after a split copied the
//! other's session into its range; a request id reused for another command is refused with
//! `InvalidArgument` (never a panic); and no refusal shows a tenant prefix, another
//! tenant's bytes or the server's debug output.

use keel_proto::v1::idempotency_client::IdempotencyClient;
use keel_proto::v1::kv_client::KvClient;
use keel_proto::v1::lock_client::LockClient;
use keel_proto::v1::{
    self, AcquireRequest, BatchRequest, BeginRequest, DeleteRequest, GetRequest, IncrementRequest,
    OpenSessionRequest, PutRequest, batch_op,
};
use keel_server::{Access, KvSettings};
use keel_types::KvError;
use keel_types::tenant::{Namespace, TenantName};
use prost::Message;
use tonic::transport::Channel;
use tonic::{Code, Status};

use crate::harness::{Cluster, eventually, with_bearer};

const ADMIN: &str = "admin-token-0123456789";
const ALICE: &str = "alice-token-0123456789";
const BOB: &str = "bobby-token-0123456789";

const TOKENS: &str = r#"
[[admin]]
name = "ops"
tokens = ["admin-token-0123456789"]

[[tenant]]
name = "alice"
tokens = ["alice-token-0123456789"]

[[tenant]]
name = "bob"
tokens = ["bobby-token-0123456789"]
"#;

/// Alice's value that no answer to bob may hold.
const SECRET: &[u8] = b"ALICE-SECRET-31d7";

/// A cluster whose split driver does not split the namespaces apart by itself for a minute
/// (its first check runs before any range has a leader), so the test splits them when it
/// chooses.
async fn start() -> Cluster {
    let mut kv = KvSettings::default();
    kv.split.check_interval_ms = 60_000;
    let access = Access::parse(TOKENS).unwrap();
    Cluster::start_authenticated_with(3, access, ADMIN, kv).await
}

/// Raw gRPC clients of node 1 speaking for one tenant.
struct Tenant {
    token: &'static str,
    kv: KvClient<Channel>,
    lock: LockClient<Channel>,
    idempotency: IdempotencyClient<Channel>,
}

impl Tenant {
    async fn connect(cluster: &Cluster, token: &'static str) -> Tenant {
        let channel = cluster.tls_channel(1).await;
        Tenant {
            token,
            kv: KvClient::new(channel.clone()),
            lock: LockClient::new(channel.clone()),
            idempotency: IdempotencyClient::new(channel),
        }
    }

    /// Waits until node 1 serves this tenant's `keys` (their ranges known and led): a
    /// split or a cluster just started answers `Unavailable` for a moment, and raw calls
    /// are not retried.
    async fn ready(&self, keys: &[&[u8]]) {
        for key in keys {
            eventually("node 1 serves the tenant's key", || {
                let mut kv = self.kv.clone();
                let request = self.request(GetRequest {
                    key: key.to_vec(),
                    consistency: v1::Consistency::Linearizable.into(),
                    no_forward: false,
                    ..GetRequest::default()
                });
                async move { kv.get(request).await.ok().map(|_| ()) }
            })
            .await;
        }
    }

    fn request<T>(&self, message: T) -> tonic::Request<T> {
        with_bearer(self.token, message)
    }

    async fn session(&mut self) -> (u64, u64) {
        let opened = self.kv.open_session(self.request(OpenSessionRequest {}));
        let opened = opened.await.unwrap().into_inner();
        (opened.client_id, opened.client_started_ms)
    }

    /// Sends `call` as this tenant; the answer's encoding (or the refusal's code, message
    /// and details) for inspection.
    async fn send(&mut self, call: &Call) -> Answer {
        let encoded = match call.clone() {
            Call::Put(put) => self.kv.put(self.request(put)).await.map(encode),
            Call::Delete(delete) => self.kv.delete(self.request(delete)).await.map(encode),
            Call::Increment(increment) => {
                self.kv.increment(self.request(increment)).await.map(encode)
            }
            Call::Batch(batch) => self.kv.batch(self.request(batch)).await.map(encode),
            Call::Acquire(acquire) => self.lock.acquire(self.request(acquire)).await.map(encode),
            Call::Begin(begin) => self
                .idempotency
                .begin(self.request(begin))
                .await
                .map(encode),
        };
        match encoded {
            Ok(bytes) => Answer::Ok(bytes),
            Err(status) => Answer::Refused(status),
        }
    }
}

fn encode<T: Message>(response: tonic::Response<T>) -> Vec<u8> {
    response.into_inner().encode_to_vec()
}

#[derive(Debug)]
enum Answer {
    Ok(Vec<u8>),
    Refused(Status),
}

impl Answer {
    /// Everything the caller receives, as bytes.
    fn bytes(&self) -> Vec<u8> {
        match self {
            Answer::Ok(bytes) => bytes.clone(),
            Answer::Refused(status) => {
                let mut bytes = status.message().as_bytes().to_vec();
                bytes.extend_from_slice(status.details());
                bytes
            }
        }
    }

    fn code(&self) -> Code {
        match self {
            Answer::Ok(_) => Code::Ok,
            Answer::Refused(status) => status.code(),
        }
    }
}

/// A mutating call of any service, carrying a request id.
#[derive(Debug, Clone)]
enum Call {
    Put(PutRequest),
    Delete(DeleteRequest),
    Increment(IncrementRequest),
    Batch(BatchRequest),
    Acquire(AcquireRequest),
    Begin(BeginRequest),
}

fn id(client: (u64, u64), sequence: u64) -> Option<v1::RequestId> {
    Some(v1::RequestId {
        client_id: client.0,
        client_started_ms: client.1,
        sequence,
        completed_below: 0,
    })
}

fn put(key: &[u8], value: &[u8], request_id: Option<v1::RequestId>) -> Call {
    Call::Put(PutRequest {
        key: key.to_vec(),
        value: value.to_vec(),
        return_previous: true,
        request_id,
        ..PutRequest::default()
    })
}

/// Every kind of call on `key`, under `request_id`.
fn calls(key: &[u8], request_id: Option<v1::RequestId>) -> Vec<Call> {
    let batch_put = |key: &[u8]| v1::BatchOp {
        op: Some(batch_op::Op::Put(v1::BatchPut {
            key: key.to_vec(),
            value: b"b".to_vec(),
            ..v1::BatchPut::default()
        })),
    };
    vec![
        put(key, b"p", request_id),
        Call::Delete(DeleteRequest {
            key: key.to_vec(),
            return_previous: true,
            request_id,
            ..DeleteRequest::default()
        }),
        Call::Increment(IncrementRequest {
            key: [key, b"-counter"].concat(),
            delta: 1,
            request_id,
            no_forward: false,
        }),
        Call::Batch(BatchRequest {
            ops: vec![batch_put(key), batch_put(&[key, b"-2"].concat())],
            request_id,
            ..BatchRequest::default()
        }),
        Call::Acquire(AcquireRequest {
            name: key.to_vec(),
            owner: b"o".to_vec(),
            ttl_ms: 10_000,
            request_id,
            ..AcquireRequest::default()
        }),
        Call::Begin(BeginRequest {
            scope: key.to_vec(),
            id: b"i".to_vec(),
            owner: b"o".to_vec(),
            ttl_ms: 10_000,
            request_id,
            no_forward: false,
        }),
    ]
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle)
}

/// The answer is an `InvalidArgument` refusal that shows none of `hidden`, no tenant
/// prefix and no debug output of the server's structs.
fn assert_refused_cleanly(answer: &Answer, hidden: &[&[u8]], what: &str) {
    assert_eq!(answer.code(), Code::InvalidArgument, "{what}: {answer:?}");
    assert_clean(answer, hidden, what);
}

fn assert_clean(answer: &Answer, hidden: &[&[u8]], what: &str) {
    let bytes = answer.bytes();
    for needle in hidden.iter().copied().chain([b"\xffT".as_slice()]) {
        assert!(
            !contains(&bytes, needle),
            "{what}: the answer shows {:?}: {answer:?}",
            String::from_utf8_lossy(needle)
        );
    }
    let text = String::from_utf8_lossy(&bytes);
    for debug in ["Applied {", "Coordinated {", "[255, 84"] {
        assert!(!text.contains(debug), "{what}: debug output: {text}");
    }
}

/// Splits at `key`, unless the split driver did already (which copies the sessions the same
/// way).
async fn split(admin: &keel_client::Client, key: &[u8]) {
    match admin.split(key).await {
        Ok(_) | Err(KvError::EpochMismatch { .. }) => {}
        Err(error) => panic!("split at {key:?}: {error:?}"),
    }
}

fn stored(tenant: &str, key: &[u8]) -> Vec<u8> {
    Namespace::of(&TenantName::new(tenant).unwrap()).confine(key)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replayed_request_id_shows_nothing_of_another_tenant_across_a_split() {
    let cluster = start().await;
    let mut alice = Tenant::connect(&cluster, ALICE).await;
    let mut bob = Tenant::connect(&cluster, BOB).await;
    alice.ready(&[b"k"]).await;
    // Alice writes her secret and overwrites it, so request 2's record holds it as the
    // previous value; both namespaces still share one range.
    let client = alice.session().await;
    let first = alice.send(&put(b"k", SECRET, id(client, 1))).await;
    assert_eq!(first.code(), Code::Ok, "{first:?}");
    let overwrite = put(b"k", b"later", id(client, 2));
    let second = alice.send(&overwrite).await;
    assert!(contains(&second.bytes(), SECRET), "{second:?}");

    // Bob's namespace splits off: its range gets a copy of alice's session and records.
    let admin = cluster.client();
    let bob_start = Namespace::of(&TenantName::new("bob").unwrap())
        .start()
        .to_vec();
    split(&admin, &bob_start).await;
    bob.ready(&[b"bob-race", b"bob-race-2", b"bob-race-counter"])
        .await;
    alice.ready(&[b"k"]).await;

    // Every kind of call of bob's under alice's ids, recorded or not: refused, showing
    // nothing, and nothing written.
    let hidden: [&[u8]; 3] = [SECRET, b"alice", b"later"];
    for sequence in [1, 2, 3] {
        for call in calls(b"bob-race", id(client, sequence)) {
            let answer = bob.send(&call).await;
            let what = format!("bob's {call:?}");
            assert_refused_cleanly(&answer, &hidden, &what);
        }
    }
    let read = cluster.client();
    for key in [b"bob-race".as_slice(), b"bob-race-2", b"bob-race-counter"] {
        let got = read
            .get(&stored("bob", key), Default::default())
            .await
            .unwrap();
        assert_eq!(got.kv, None, "{key:?} was written");
    }

    // Alice's own retry still gets her first answer (marked as a replay).
    let retried = alice.send(&overwrite).await;
    let replayed = v1::PutResponse::decode(retried.bytes().as_slice()).unwrap();
    assert!(replayed.header.unwrap().replayed, "{retried:?}");
    assert_eq!(replayed.previous.unwrap().value, SECRET);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_request_id_reused_for_another_command_is_refused_not_a_panic() {
    let cluster = start().await;
    let mut alice = Tenant::connect(&cluster, ALICE).await;
    alice.ready(&[b"x", b"x-2", b"x-counter"]).await;
    let client = alice.session().await;
    // Each kind of call applied under its own id, then every other kind sent under it.
    let kinds = calls(b"x", None).len();
    for applied in 0..kinds {
        let sequence = applied as u64 + 1;
        let first = calls(b"x", id(client, sequence)).swap_remove(applied);
        let answer = alice.send(&first).await;
        assert_eq!(answer.code(), Code::Ok, "{first:?}: {answer:?}");
        for (index, call) in calls(b"x", id(client, sequence)).into_iter().enumerate() {
            if index == applied {
                continue;
            }
            let answer = alice.send(&call).await;
            let what = format!("{call:?} under the id of {first:?}");
            assert_refused_cleanly(&answer, &[], &what);
        }
    }
    // The node still serves.
    let last = alice.send(&put(b"after", b"v", id(client, 100))).await;
    assert_eq!(last.code(), Code::Ok, "{last:?}");
    cluster.shutdown().await;
}

/// A small deterministic generator (xorshift64*), so a failure can be replayed.
struct Random(u64);

impl Random {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n as u64) as usize
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn random_request_id_reuse_across_commands_and_tenants_never_panics_or_leaks() {
    let cluster = start().await;
    let mut tenants = [
        Tenant::connect(&cluster, ALICE).await,
        Tenant::connect(&cluster, BOB).await,
    ];
    let secrets: [&[u8]; 2] = [b"ALICE-SECRET-5e0a", b"BOB-SECRET-77c2"];
    let names: [&[u8]; 2] = [b"alice", b"bob"];
    let keys: [&[u8]; 6] = [b"s", b"t", b"u", b"s-counter", b"t-counter", b"u-counter"];
    let mut clients = Vec::new();
    for (index, tenant) in tenants.iter_mut().enumerate() {
        tenant.ready(&keys).await;
        let client = tenant.session().await;
        let written = tenant.send(&put(b"s", secrets[index], id(client, 1))).await;
        assert_eq!(written.code(), Code::Ok, "{written:?}");
        clients.push(client);
    }
    // Bob's namespace splits off halfway, copying alice's sessions into his range.
    let bob_start = Namespace::of(&TenantName::new("bob").unwrap())
        .start()
        .to_vec();
    let mut random = Random(0x9e37_79b9_7f4a_7c15);
    let steps = 240;
    for step in 0..steps {
        if step == steps / 2 {
            split(&cluster.client(), &bob_start).await;
            for tenant in &tenants {
                tenant.ready(&keys).await;
            }
        }
        let sender = random.below(2);
        let client = clients[random.below(2)];
        let sequence = 1 + random.below(6) as u64;
        let key: &[u8] = [b"s".as_slice(), b"t", b"u"][random.below(3)];
        let mut calls = calls(key, id(client, sequence));
        let call = calls.swap_remove(random.below(calls.len()));
        let answer = tenants[sender].send(&call).await;
        let what = format!("step {step}: tenant {sender} sent {call:?}");
        // A panic in a handler reaches the caller as CANCELLED or an h2 error (UNKNOWN or
        // INTERNAL); a write applied with an outcome it cannot have, as UNKNOWN.
        assert!(
            !matches!(
                answer.code(),
                Code::Cancelled | Code::Unknown | Code::Internal
            ),
            "{what}: {answer:?}"
        );
        let other = 1 - sender;
        assert_clean(&answer, &[secrets[other], names[other]], &what);
    }
    cluster.shutdown().await;
}
