//! Consistency checks on real `keel serve` processes: a row changed behind Raft's back on one
//! replica is found by the periodic check alone (no one asks for a check), named by its key
//! in the leader's log, and repaired (the replica re-created from the majority) without
//! operator action; `keel cluster check` then finds the range consistent.

use keel_client::PutOptions;
use keel_proto::test::v1::CorruptRowRequest;
use keel_proto::test::v1::faults_client::FaultsClient;
use keel_types::{Consistency, NodeId, RangeId};

use crate::five_nodes::eventually;
use crate::process::{Processes, keel};

const KEY: &[u8] = b"checked/answer";
const WRITTEN: &[u8] = b"written once";

/// The value node `id`'s replica serves for `KEY` (a follower read), or why it serves none.
async fn served_by(processes: &Processes, id: NodeId) -> Result<Vec<u8>, String> {
    let got = processes
        .client(&[id])
        .get(KEY, Consistency::Follower)
        .await;
    let got = got.map_err(|error| format!("node {id}: {error}"))?;
    got.kv
        .map(|kv| kv.value)
        .ok_or_else(|| format!("node {id} has no {KEY:?}"))
}

/// The log lines in which a node reported a check whose replicas disagree, naming `KEY` and
/// blaming node `odd`.
fn reports_naming_the_key(processes: &Processes, odd: NodeId) -> Vec<String> {
    let named = String::from_utf8_lossy(KEY).into_owned();
    let blamed = format!("node={odd} differs=true");
    let logs = processes.endpoints.keys().map(|id| {
        std::fs::read_to_string(processes.data_dir(*id).join("test.log")).unwrap_or_default()
    });
    let lines: Vec<String> = logs
        .flat_map(|log| log.lines().map(String::from).collect::<Vec<_>>())
        .collect();
    lines
        .into_iter()
        .filter(|line| line.contains("replicas disagree"))
        .filter(|line| line.contains(&blamed) && line.contains(&named))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_corrupted_replica_is_found_by_the_periodic_check_named_and_repaired() {
    let processes = Processes::start_with(3, &["--consistency-check-interval-ms", "1000"]);
    let all: Vec<NodeId> = processes.endpoints.keys().copied().collect();
    let client = processes.client(&all);
    eventually(&processes, "the first write", || async {
        let put = client.put(KEY, WRITTEN, PutOptions::default()).await;
        put.map_err(|error| error.to_string())
    })
    .await;
    let leader = processes.leader().await;
    let odd = *all.iter().find(|id| **id != leader).unwrap();
    eventually(&processes, "the write applied on the odd node", || async {
        match served_by(&processes, odd).await? {
            value if value == WRITTEN => Ok(()),
            value => Err(format!("node {odd} serves {value:?}")),
        }
    })
    .await;

    let endpoint = format!("http://{}", processes.endpoints[&odd]);
    let mut faults = FaultsClient::connect(endpoint).await.unwrap();
    let request = CorruptRowRequest { key: KEY.to_vec() };
    let range = faults
        .corrupt_row(request)
        .await
        .unwrap()
        .into_inner()
        .range_id;
    assert_eq!(range, RangeId::FIRST.0);

    // Found and named by the periodic check, then repaired: every replica serves the
    // written value again.
    let found = eventually(&processes, "a check naming the corrupted key", || async {
        let lines = reports_naming_the_key(&processes, odd);
        match lines.is_empty() {
            true => Err("no report names it yet".to_string()),
            false => Ok(lines),
        }
    })
    .await;
    assert!(found[0].contains("verdict=\"divergent\""), "{found:?}");
    for id in &all {
        eventually(
            &processes,
            "every replica serving the written value",
            || async {
                match served_by(&processes, *id).await? {
                    value if value == WRITTEN => Ok(()),
                    value => Err(format!("node {id} serves {value:?}")),
                }
            },
        )
        .await;
    }
    let endpoints: Vec<&String> = processes.endpoints.values().collect();
    let range = range.to_string();
    eventually(
        &processes,
        "keel cluster check finding the range consistent",
        || async {
            let (code, checked) = keel(&endpoints, &["cluster", "check", "--range", &range]);
            match code == Some(0) && checked.contains(" consistent") {
                true => Ok(()),
                false => Err(checked),
            }
        },
    )
    .await;
}
