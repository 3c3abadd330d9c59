//! An attempt at a leader that went quiet is given up for the leader another replica names
//! (`Cluster.Leader`), reads and writes alike, long before the attempt's own timeout; an
//! attempt at a leader that is slow but still leads is waited for. What any node can answer
//! (the range table, a new client session) is asked of the next node too when the first one
//! asked is quiet.

use std::sync::Arc;
use std::time::Duration;

use keel_client::{Client, ClientOptions, PutOptions};
use keel_types::Consistency;
use tokio::sync::Notify;

use crate::fake::{Fake, Reply};
use crate::routing::client;

/// Attempts that would wait for the whole request: without the probe, a hung attempt fails
/// the request.
fn patient() -> ClientOptions {
    ClientOptions {
        request_timeout: Duration::from_secs(30),
        read_attempt_timeout: Duration::from_secs(30),
        write_deadline: Duration::from_secs(30),
        write_attempt_timeout: Duration::from_secs(30),
        ..ClientOptions::default()
    }
}

/// Waits until `fake` has taken `count` calls of `method`; fails after 30 s.
async fn called(fake: &Fake, method: &str, count: usize) {
    let taken = async {
        loop {
            if nodes_called(fake, method).len() >= count {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(30), taken)
        .await
        .unwrap_or_else(|_| panic!("no {count} {method} calls within 30 s"));
}

/// The nodes that took the calls of `method`, in order.
fn nodes_called(fake: &Fake, method: &str) -> Vec<u64> {
    fake.node_calls()
        .into_iter()
        .filter(|(m, _)| *m == method)
        .map(|(_, node)| node)
        .collect()
}

/// A one-range cluster of 3 fake nodes led by node 1, and a client that has its table.
async fn led_by_node_1() -> (Arc<Fake>, Client) {
    let (fake, addrs) = Fake::cluster(3, &[]).await;
    let client = client(&addrs, patient());
    client
        .put(b"k", b"v0", PutOptions::default())
        .await
        .unwrap();
    (fake, client)
}

#[tokio::test]
async fn a_write_hung_at_a_deposed_leader_goes_to_the_new_one_with_the_same_id() {
    let (fake, client) = led_by_node_1().await;
    fake.replies_push(Reply::Hang);
    let put = tokio::spawn({
        let client = client.clone();
        async move { client.put(b"k", b"v1", PutOptions::default()).await }
    });
    fake.writes_arrived(2).await;
    fake.set_leader(1, 2);

    let put = put
        .await
        .unwrap()
        .expect("the write goes to the new leader");
    assert!(!put.replayed, "the hung attempt applied nothing");
    let puts = nodes_called(&fake, "put");
    assert_eq!(puts, [1, 1, 2], "the hung attempt, then the new leader");
    let ids = fake.request_ids();
    assert_eq!(ids[1], ids[2], "sent again under the same request id");
    assert!(
        fake.node_calls()
            .iter()
            .any(|(method, node)| *method == "leader" && *node != 1),
        "another replica was asked"
    );
    assert_eq!(fake.data()[b"k".as_slice()], b"v1");
}

#[tokio::test]
async fn a_read_hung_at_a_deposed_leader_goes_to_the_new_one() {
    let (fake, client) = led_by_node_1().await;
    fake.replies_push(Reply::Hang);
    let get = tokio::spawn({
        let client = client.clone();
        async move { client.get(b"k", Consistency::Linearizable).await }
    });
    called(&fake, "get", 1).await;
    fake.set_leader(1, 3);

    let get = get.await.unwrap().expect("the read goes to the new leader");
    assert_eq!(get.served_by, 3);
    assert_eq!(nodes_called(&fake, "get"), [1, 3]);
}

#[tokio::test]
async fn an_attempt_at_a_slow_leader_that_still_leads_is_waited_for() {
    let (fake, client) = led_by_node_1().await;
    let gate = Arc::new(Notify::new());
    fake.replies_push(Reply::Gate(gate.clone()));
    let put = tokio::spawn({
        let client = client.clone();
        async move { client.put(b"k", b"v1", PutOptions::default()).await }
    });
    // Two probes, each answered: node 1 leads.
    called(&fake, "leader", 2).await;
    gate.notify_one();

    put.await.unwrap().unwrap();
    let puts = nodes_called(&fake, "put").len();
    assert_eq!(puts, 2, "the slow attempt was not given up");
}

/// A client whose first endpoint is paused: without asking the next node, its range table
/// and its session would wait for the whole request on node 1, and the write would fail.
#[tokio::test]
async fn a_quiet_first_endpoint_holds_up_neither_the_range_table_nor_the_session() {
    // Range 1 ([.., m)) led by node 1, range 2 ([m, ..)) led by node 2.
    let (fake, addrs) = Fake::cluster(3, &[b"m"]).await;
    fake.pause(1);
    let client = client(&addrs, patient());
    client.put(b"n", b"v", PutOptions::default()).await.unwrap();
    // Node 1 was asked first for both, and held them.
    assert_eq!(fake.held(), [("ranges", 1), ("open_session", 1)]);
    assert_eq!(nodes_called(&fake, "put"), [2]);
}
