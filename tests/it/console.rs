//! The console on a real 3-node cluster with keys, a split and a lock with a waiter:
//! `/console/state.json` names the nodes, ranges, leaders, the lock's holder and waiter and
//! the split, whichever node answers; and the page at `/` shows them in headless Chromium
//! (Debian's `chromium`; ignored here, `.ci/run` runs it), which also takes a screenshot.
//! With `KEEL_CONSOLE_SCREENSHOT=PATH` the screenshot is kept there (docs/images/console.png).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use keel_client::{AcquireOptions, PutOptions};
use keel_proto::v1::{SplitRequest, TransferLeaderRequest};
use keel_types::NodeId;
use serde_json::Value;
use tokio::task::JoinHandle;

use crate::harness::{Cluster, eventually};
use crate::observability::get_path;

/// A cluster showing something on each part of the page.
struct Scene {
    cluster: Cluster,
    /// An acquire waiting for the held lock; aborted at the end.
    waiter: JoinHandle<()>,
}

const LOCK: &str = "deploy-lock";
const SPLIT_AT: &str = "user:50";

fn acquire_options(owner: &str, wait: Duration) -> AcquireOptions {
    AcquireOptions {
        owner: Some(owner.as_bytes().to_vec()),
        ttl: Duration::from_secs(600),
        wait,
        lock_delay: Duration::ZERO,
    }
}

/// Starts 3 nodes, writes keys, splits the keyspace and leaves a lock held with a waiter.
async fn scene() -> Scene {
    let cluster = Cluster::start(3).await;
    let client = cluster.client();
    for i in 0..100 {
        let key = format!("user:{i:02}");
        let value = vec![b'v'; 64 + i];
        client
            .put(key.as_bytes(), &value, PutOptions::default())
            .await
            .unwrap();
    }
    for _ in 0..20 {
        let options = PutOptions::default();
        client.put(b"user:07", b"hot", options).await.unwrap();
    }
    // Three ranges, led by three nodes (the first stays where it is).
    for (at, leader) in [(SPLIT_AT, 2), ("user:80", 3)] {
        let right = split(&cluster, at).await;
        transfer(&cluster, right, leader).await;
    }
    let held = client
        .acquire(LOCK.as_bytes(), acquire_options("worker-a", Duration::ZERO))
        .await
        .unwrap();
    assert!(held.acquired, "{held:?}");
    let waiter = tokio::spawn({
        let client = cluster.client();
        async move {
            // The lock outlives the test (node clocks are manual): it waits until aborted.
            let options = acquire_options("worker-b", Duration::from_secs(240));
            let answer = client.acquire(LOCK.as_bytes(), options).await;
            panic!("the waiter should still wait; it got {answer:?}");
        }
    });
    Scene { cluster, waiter }
}

/// Splits at `at`; the id of the range starting there.
async fn split(cluster: &Cluster, at: &str) -> u64 {
    eventually("a split", || async {
        let request = SplitRequest {
            at: at.as_bytes().to_vec(),
            no_forward: false,
        };
        let answer = cluster.cluster_client(1).await.split(request).await;
        Some(answer.ok()?.into_inner().right?.range_id)
    })
    .await
}

/// Hands `range`'s leadership to node `to`.
async fn transfer(cluster: &Cluster, range: u64, to: NodeId) {
    eventually("a leader transfer", || async {
        let request = TransferLeaderRequest {
            range_id: range,
            node_id: to,
            no_forward: false,
        };
        let answer = cluster
            .cluster_client(1)
            .await
            .transfer_leader(request)
            .await;
        answer.ok().map(drop)
    })
    .await;
}

/// `/console/state.json` from node `id`.
async fn state(cluster: &Cluster, id: NodeId) -> Value {
    let (status, content_type, body) = get_path(cluster, id, "/console/state.json").await;
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert_eq!(content_type, "application/json");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

/// What the state must show once the scene has settled; `None` until it does.
fn settled(state: &Value) -> Option<()> {
    let nodes = state["nodes"].as_array()?;
    let live = nodes
        .iter()
        .filter(|n| n["liveness"] == "live" && n["answered"] == true)
        .count();
    let ranges = state["ranges"].as_array()?;
    let led = ranges.iter().all(|r| r["leader"].is_u64());
    let split_at = format!("\"{SPLIT_AT}\"");
    let split = ranges.iter().any(|r| r["start"] == split_at.as_str());
    let lock = state["locks"]
        .as_array()?
        .iter()
        .find(|l| l["name"] == format!("\"{LOCK}\"").as_str())?;
    let waited = lock["holder"]["owner"] == "\"worker-a\""
        && lock["waiters"] == serde_json::json!(["\"worker-b\""]);
    let events = state["events"].as_array()?;
    let split_seen = events.iter().any(|e| e["kind"] == "split");
    let elected = events.iter().any(|e| e["kind"] == "leader");
    let all = nodes.len() == 3 && live == 3 && ranges.len() == 3 && led && split;
    (all && waited && split_seen && elected).then_some(())
}

/// Polls node `id`'s state until the scene shows on it.
async fn settled_state(cluster: &Cluster, id: NodeId) -> Value {
    let what = format!("node {id}'s console shows the scene");
    eventually(&what, || async {
        let state = state(cluster, id).await;
        settled(&state).map(|()| state)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_state_names_nodes_ranges_leaders_locks_and_splits() {
    let scene = scene().await;
    let cluster = &scene.cluster;
    for id in cluster.ids() {
        let state = settled_state(cluster, id).await;
        assert_eq!(state["node_id"], id);
        let ids: Vec<u64> = state["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["id"].as_u64().unwrap())
            .collect();
        assert_eq!(ids, vec![1, 2, 3]);
        let ranges = state["ranges"].as_array().unwrap();
        for range in ranges {
            assert_eq!(range["replicas"], serde_json::json!([1, 2, 3]), "{range}");
        }
        let lock = state["locks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["name"] == format!("\"{LOCK}\"").as_str())
            .unwrap();
        assert!(lock["holder"]["token"].as_u64().unwrap() > 0);
        let lock_range = lock["range"].as_u64().unwrap();
        let range = ranges.iter().find(|r| r["id"] == lock_range).unwrap();
        assert_eq!(
            lock["leader"], range["leader"],
            "the range's leader tells its locks"
        );
    }
    scene.waiter.abort();
    scene.cluster.shutdown().await;
}

/// Chromium's binary: Debian's `chromium`, or `KEEL_CHROMIUM`.
fn chromium() -> String {
    let binary = std::env::var("KEEL_CHROMIUM").unwrap_or_else(|_| "chromium".to_string());
    let found = Command::new(&binary).arg("--version").output();
    match found {
        Ok(output) if output.status.success() => binary,
        _ => panic!(
            "this test needs headless Chromium: `{binary} --version` failed. Install Debian's \
             chromium (apt-get install --no-install-recommends chromium) or set KEEL_CHROMIUM"
        ),
    }
}

/// Runs headless Chromium on `url` with `extra` arguments, in a profile under `dir`, and
/// returns what it printed.
async fn headless(binary: &str, dir: &Path, url: &str, extra: &[String]) -> String {
    let mut command = Command::new(binary);
    command
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
        ])
        .args(["--hide-scrollbars", "--window-size=1280,900"])
        // Virtual time waits for the page's fetches: one budget covers a few refreshes.
        .arg("--virtual-time-budget=5000")
        .arg(format!("--user-data-dir={}", dir.join("profile").display()))
        .args(extra)
        .arg(url);
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .unwrap()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "chromium failed: {stderr}");
    String::from_utf8(output.stdout).unwrap()
}

/// `text` as the DOM serializes it in an attribute.
fn attribute(text: &str) -> String {
    text.replace('&', "&amp;").replace('"', "&quot;")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs chromium; .ci/run runs it"]
async fn the_console_page_renders_in_headless_chromium() {
    let binary = chromium();
    let scene = scene().await;
    let cluster = &scene.cluster;
    let state = settled_state(cluster, 1).await;
    let url = format!("http://{}/", cluster.metrics_addr(1));
    let dir = tempfile::tempdir().unwrap();

    let dom = headless(&binary, dir.path(), &url, &["--dump-dom".to_string()]).await;
    assert!(
        dom.contains("data-loaded=\"yes\""),
        "the page never loaded its data:\n{dom}"
    );
    assert!(
        !dom.contains("class=\"error\""),
        "the page shows an error:\n{dom}"
    );
    for id in 1..=3 {
        let node = format!("data-node-id=\"{id}\" data-liveness=\"live\" data-answered=\"yes\"");
        assert!(dom.contains(&node), "node {id} is not shown live:\n{dom}");
    }
    assert!(
        dom.contains("<div id=\"keyspace\"><div class=\"range\""),
        "no keyspace bar:\n{dom}"
    );
    for range in state["ranges"].as_array().unwrap() {
        let id = &range["id"];
        let leader = &range["leader"];
        let bar = format!("data-range-id=\"{id}\" data-leader=\"{leader}\" title=\"range {id}");
        assert!(dom.contains(&bar), "range {id} is not on the bar:\n{dom}");
    }
    let lock = format!(
        "data-lock=\"{}\" data-holder=\"{}\" data-waiters=\"{}\"",
        attribute(&format!("\"{LOCK}\"")),
        attribute("\"worker-a\""),
        attribute("\"worker-b\"")
    );
    assert!(
        dom.contains(&lock),
        "the lock's holder and waiter are not shown:\n{dom}"
    );
    assert!(
        dom.contains("data-kind=\"split\""),
        "no split event:\n{dom}"
    );

    let png = dir.path().join("console.png");
    let screenshot = format!("--screenshot={}", png.display());
    headless(&binary, dir.path(), &url, &[screenshot]).await;
    let bytes = std::fs::read(&png).expect("chromium wrote no screenshot");
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
    if let Ok(keep) = std::env::var("KEEL_CONSOLE_SCREENSHOT") {
        std::fs::write(&keep, &bytes).unwrap();
    }
    scene.waiter.abort();
    scene.cluster.shutdown().await;
}
