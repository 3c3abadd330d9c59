//! Locks and fenced writes on a real 3-node cluster: a paused holder whose lock expired is
//! fenced out by the store; tokens only grow, across leader failover and a restart of every
//! node; stale tokens are refused on renew and release and change nothing; a waiter is
//! handed the lock on release and on expiry. Node clocks are manual: TTLs pass only when a
//! test moves them.

use std::time::Duration;

use keel_client::{AcquireOptions, Client, DeleteOptions, PutOptions};
use keel_types::{Consistency, Fence, KvError};

use crate::harness::{Cluster, eventually};

const TTL: Duration = Duration::from_secs(10);

fn acquire_options(owner: &str, wait: Duration) -> AcquireOptions {
    AcquireOptions {
        owner: Some(owner.as_bytes().to_vec()),
        ttl: TTL,
        wait,
        lock_delay: Duration::ZERO,
    }
}

fn fenced(lock: &str, token: u64) -> PutOptions {
    PutOptions {
        fence: Some(Fence {
            lock: lock.as_bytes().to_vec(),
            token,
        }),
        ..PutOptions::default()
    }
}

/// Acquires `name` for `owner` without waiting and returns the token.
async fn token_of(client: &Client, name: &str, owner: &str) -> u64 {
    let answer = client
        .acquire(name.as_bytes(), acquire_options(owner, Duration::ZERO))
        .await
        .unwrap();
    assert!(answer.acquired, "{owner} should get the free lock {name}");
    answer
        .holder
        .expect("an acquired lock names its holder")
        .token
}

async fn value_of(client: &Client, key: &str) -> Vec<u8> {
    let got = client
        .get(key.as_bytes(), Consistency::Linearizable)
        .await
        .unwrap();
    got.kv.expect("the key exists").value
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_holder_is_fenced_out_after_its_lock_expires() {
    let cluster = Cluster::start(3).await;
    let (client_a, client_b) = (cluster.client(), cluster.client());
    let guard = client_a
        .lock(b"jobs", acquire_options("a", Duration::ZERO))
        .await
        .unwrap();
    client_a
        .put(b"report", b"draft by a", fenced("jobs", guard.token()))
        .await
        .unwrap();

    // A is paused: it sends no more renews, and its TTL runs out on the cluster's clocks.
    guard.pause_renewals();
    let busy = client_b
        .acquire(b"jobs", acquire_options("b", Duration::ZERO))
        .await
        .unwrap();
    assert!(!busy.acquired, "the lock is held until its TTL runs out");
    cluster.advance_clocks_ms(TTL.as_millis() as u64);
    let token_b = token_of(&client_b, "jobs", "b").await;
    assert!(token_b > guard.token(), "{token_b} > {}", guard.token());
    client_b
        .put(b"report", b"final by b", fenced("jobs", token_b))
        .await
        .unwrap();

    // A wakes up and writes with its old token: the store refuses it.
    let late = client_a
        .put(b"report", b"late write by a", fenced("jobs", guard.token()))
        .await;
    assert_eq!(
        late.unwrap_err(),
        KvError::FencedOut {
            key: b"report".to_vec(),
            lock: b"jobs".to_vec(),
            current_token: token_b,
        }
    );
    let renew = client_a.renew(b"jobs", guard.token(), TTL).await;
    assert!(
        matches!(renew, Err(KvError::LockNotHeld { current_token: Some(t), .. }) if t == token_b),
        "{renew:?}"
    );
    assert_eq!(value_of(&client_a, "report").await, b"final by b");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_grow_across_failover_and_a_restart_of_every_node() {
    let mut cluster = Cluster::start(3).await;
    let mut tokens = Vec::new();
    let client = cluster.client();
    for round in 0..3 {
        let token = token_of(&client, "l", &format!("owner-{round}")).await;
        client.release(b"l", token).await.unwrap();
        tokens.push(token);
    }

    let leader = cluster.leader().await;
    cluster.stop_node(leader).await;
    cluster.leader().await;
    let client = cluster.client();
    tokens.push(token_of(&client, "l", "after-failover").await);
    // Expired, not released: the next holder takes over after the TTL.
    cluster.advance_clocks_ms(TTL.as_millis() as u64);
    tokens.push(token_of(&client, "l", "after-expiry").await);

    cluster.start_node(leader).await;
    for id in cluster.running() {
        cluster.stop_node(id).await;
    }
    for id in cluster.ids() {
        cluster.start_node(id).await;
    }
    cluster.leader().await;
    cluster.advance_clocks_ms(TTL.as_millis() as u64);
    tokens.push(token_of(&cluster.client(), "l", "after-restart").await);

    // A split moves the lock to a new range, which starts from its parent's revision: the
    // next grant there still outgrows every token before.
    let client = cluster.client();
    let (_, right) = client.split(b"l").await.unwrap();
    assert_eq!(right.start, b"l");
    cluster.advance_clocks_ms(TTL.as_millis() as u64);
    tokens.push(token_of(&client, "l", "after-split").await);

    assert!(
        tokens.windows(2).all(|pair| pair[0] < pair[1]),
        "tokens strictly increase: {tokens:?}"
    );
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_tokens_are_refused_and_change_nothing() {
    let cluster = Cluster::start(3).await;
    let client = cluster.client();
    let old = token_of(&client, "l", "a").await;
    client.release(b"l", old).await.unwrap();
    let current = token_of(&client, "l", "b").await;

    let refusals = [
        client.renew(b"l", old, TTL).await.map(drop),
        client.release(b"l", old).await.map(drop),
        client.renew(b"l", current + 1, TTL).await.map(drop),
    ];
    for refusal in refusals {
        assert!(
            matches!(
                refusal,
                Err(KvError::LockNotHeld { current_token: Some(t), .. }) if t == current
            ),
            "{refusal:?}"
        );
    }
    let seen = client
        .inspect(b"l", Consistency::Linearizable)
        .await
        .unwrap();
    let holder = seen.holder.expect("b still holds the lock");
    assert_eq!((holder.owner, holder.token), (b"b".to_vec(), current));

    // The same owner acquiring again keeps its token (a retried acquire is safe).
    assert_eq!(token_of(&client, "l", "b").await, current);

    // A fenced key refuses another lock's fence, and a delete without a fence retires it.
    client.put(b"k", b"v", fenced("l", current)).await.unwrap();
    let other = client.put(b"k", b"w", fenced("other", current + 100)).await;
    assert!(matches!(other, Err(KvError::FencedOut { .. })), "{other:?}");
    client.delete(b"k", DeleteOptions::default()).await.unwrap();
    client.put(b"k", b"w", fenced("other", 1)).await.unwrap();
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_handed_the_lock_on_release_and_on_expiry() {
    let cluster = Cluster::start(3).await;
    let client = cluster.client();
    let first = token_of(&client, "l", "a").await;

    // Released: the waiter gets the lock in the release's own command.
    let waiter = tokio::spawn({
        let client = cluster.client();
        async move {
            client
                .acquire(b"l", acquire_options("b", Duration::from_secs(20)))
                .await
        }
    });
    // Time for the waiter to queue. Not a timing assertion: had it not queued yet, it takes
    // the freed lock itself, and every assertion below holds either way.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = client.release(b"l", first).await.unwrap();
    let granted = waiter.await.unwrap().unwrap();
    assert!(granted.acquired, "{granted:?}");
    let second = granted.holder.unwrap().token;
    assert!(second > first);
    if let Some(successor) = released.successor {
        assert_eq!((successor.owner, successor.token), (b"b".to_vec(), second));
    }

    // Expired: the leader grants it to the waiter once the TTL has run out.
    let waiter = tokio::spawn({
        let client = cluster.client();
        async move {
            client
                .acquire(b"l", acquire_options("c", Duration::from_secs(20)))
                .await
        }
    });
    // A wrong grant would have this long to show; a correct server never finishes the call
    // before the clocks move, however slow the machine.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "c waits while b holds the lock");
    cluster.advance_clocks_ms(TTL.as_millis() as u64);
    let granted = waiter.await.unwrap().unwrap();
    let third = granted.holder.as_ref().expect("c holds the lock").token;
    assert!(granted.acquired && third > second, "{granted:?}");
    eventually("the lock shows c as holder", || async {
        let seen = client.inspect(b"l", Consistency::Linearizable).await.ok()?;
        (seen.holder?.token == third).then_some(())
    })
    .await;
    cluster.shutdown().await;
}
