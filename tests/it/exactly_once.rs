//! Exactly-once mutations over real gRPC: a request id, once applied, is answered from its
//! record on every retry (across a leader change and a restart of the whole cluster); a retry
//! past its record is refused and never applied again; and a storm of retries through lost
//! responses counts exactly.

use keel_proto::v1::kv_client::KvClient;
use keel_proto::v1::{
    GetRequest, IncrementRequest, IncrementResponse, OpenSessionRequest, RequestId,
};
use keel_server::{Faults, KvSettings, RaftTimings, status};
use keel_types::{Consistency, KvError};
use tonic::transport::Channel;

use crate::harness::{Cluster, eventually};

/// A session as OpenSession hands it out: (client id, start).
type Session = (u64, u64);

async fn open_session(kv: &mut KvClient<Channel>) -> Session {
    let session = kv
        .open_session(OpenSessionRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_ne!(session.client_id, 0);
    (session.client_id, session.client_started_ms)
}

fn id(session: Session, sequence: u64, completed_below: u64) -> Option<RequestId> {
    Some(RequestId {
        client_id: session.0,
        client_started_ms: session.1,
        sequence,
        completed_below,
    })
}

/// Increments `n` through `kv` under request id `id`: (new value, replayed).
async fn increment(
    kv: &mut KvClient<Channel>,
    delta: i64,
    id: Option<RequestId>,
) -> Result<(i64, bool), KvError> {
    let request = IncrementRequest {
        key: b"n".to_vec(),
        delta,
        request_id: id,
        no_forward: false,
    };
    match kv.increment(request).await {
        Ok(response) => {
            let IncrementResponse { header, value } = response.into_inner();
            Ok((value, header.unwrap().replayed))
        }
        Err(status) => Err(status::kv_error(&status).expect("a Keel error detail")),
    }
}

async fn read_n(kv: &mut KvClient<Channel>) -> Option<String> {
    let request = GetRequest {
        key: b"n".to_vec(),
        consistency: keel_proto::v1::Consistency::from(Consistency::Linearizable).into(),
        no_forward: false,
        ..GetRequest::default()
    };
    let kv = kv.get(request).await.unwrap().into_inner().kv;
    kv.map(|kv| String::from_utf8(kv.value).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replays_survive_a_leader_change_and_a_restart() {
    let mut cluster = Cluster::start(3).await;
    let leader = cluster.leader().await;
    let mut kv = cluster.kv(leader).await;
    let session = open_session(&mut kv).await;

    assert_eq!(
        increment(&mut kv, 5, id(session, 1, 0)).await,
        Ok((5, false))
    );
    assert_eq!(
        increment(&mut kv, 5, id(session, 1, 0)).await,
        Ok((5, true))
    );
    assert_eq!(
        increment(&mut kv, 5, id(session, 2, 0)).await,
        Ok((10, false))
    );

    cluster.stop_node(leader).await;
    let mut kv = cluster.kv(cluster.leader().await).await;
    assert_eq!(
        increment(&mut kv, 5, id(session, 1, 0)).await,
        Ok((5, true))
    );
    assert_eq!(
        increment(&mut kv, 5, id(session, 2, 0)).await,
        Ok((10, true))
    );

    for node in cluster.running() {
        cluster.stop_node(node).await;
    }
    for node in cluster.ids() {
        cluster.start_node(node).await;
    }
    let mut kv = cluster.kv(cluster.leader().await).await;
    assert_eq!(
        increment(&mut kv, 5, id(session, 2, 0)).await,
        Ok((10, true))
    );
    assert_eq!(read_n(&mut kv).await.as_deref(), Some("10"));
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_past_its_record_is_refused_not_applied_again() {
    let cluster = Cluster::start(3).await;
    let leader = cluster.leader().await;
    let mut kv = cluster.kv(leader).await;
    let session = open_session(&mut kv).await;
    let expired = |sequence| {
        Err(KvError::RequestIdExpired {
            client_id: session.0,
            sequence,
        })
    };

    assert_eq!(
        increment(&mut kv, 1, id(session, 1, 0)).await,
        Ok((1, false))
    );
    // The client says everything below 2 is done: request 1's record may go.
    assert_eq!(
        increment(&mut kv, 1, id(session, 2, 2)).await,
        Ok((2, false))
    );
    assert_eq!(increment(&mut kv, 1, id(session, 1, 0)).await, expired(1));

    // Idle past the dedup window: the cleanup drops the session with its records.
    cluster.advance_clocks_ms(KvSettings::default().dedup_window_ms + 1_000);
    eventually("the idle session is dropped", || async {
        let status = cluster.range_status(leader).await;
        (status.client_sessions == 0).then_some(())
    })
    .await;
    assert_eq!(increment(&mut kv, 1, id(session, 2, 2)).await, expired(2));
    assert_eq!(increment(&mut kv, 1, id(session, 3, 2)).await, expired(3));

    // A session opened now is new to the range and is served.
    let fresh = open_session(&mut kv).await;
    assert_eq!(increment(&mut kv, 1, id(fresh, 1, 0)).await, Ok((3, false)));
    assert_eq!(read_n(&mut kv).await.as_deref(), Some("3"));
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_storm_through_lost_responses_counts_exactly() {
    const CLIENTS: usize = 8;
    const INCREMENTS_PER_CLIENT: usize = 25;
    let faults = Faults {
        response_loss_percent: 30,
        ..Faults::default()
    };
    let cluster =
        Cluster::start_configured(3, RaftTimings::default(), KvSettings::default(), faults).await;
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let client = cluster.client();
        tasks.push(tokio::spawn(async move {
            let mut replayed = 0;
            for _ in 0..INCREMENTS_PER_CLIENT {
                let result = client.increment(b"n", 1).await.expect("retried to success");
                replayed += usize::from(result.replayed);
            }
            replayed
        }));
    }
    let mut replayed = 0;
    for task in tasks {
        replayed += task.await.unwrap();
    }
    let mut kv = cluster.kv(cluster.leader().await).await;
    let expected = (CLIENTS * INCREMENTS_PER_CLIENT).to_string();
    assert_eq!(read_n(&mut kv).await, Some(expected));
    // With 30% of 200 responses lost, retries answered from records must have happened.
    assert!(replayed > 0, "no retry was answered from its record");
    cluster.shutdown().await;
}
