//! Real `keel serve` processes: acknowledged writes survive kill -9 of the leader, the
//! re-election, and the killed node's restart and catch-up; `keel cluster split` and
//! `keel cluster ranges` change and show the range table, and `keel scan` lists keys across
//! ranges in order.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use keel_client::{Client, ClientOptions, PutOptions};
use keel_types::{Consistency, KvError, NodeId, RangeId};
use tokio::sync::Mutex;

const WRITES: usize = 1_000;
const WRITERS: usize = 16;
const WAIT_LIMIT: Duration = Duration::from_secs(60);

/// `keel serve` children; killed when dropped, whatever the test did.
pub(crate) struct Processes {
    pub dir: tempfile::TempDir,
    pub endpoints: BTreeMap<NodeId, String>,
    children: BTreeMap<NodeId, Child>,
    /// Flags every node is started with besides its identity and the initial cluster.
    flags: Vec<String>,
    /// Each node's etcd API address, when the nodes serve it (`serve_etcd`).
    pub etcd: BTreeMap<NodeId, String>,
}

impl Processes {
    pub fn start(size: u64) -> Processes {
        Processes::start_with(size, &[])
    }

    /// `size` nodes of one initial cluster, each started with `flags` too.
    pub fn start_with(size: u64, flags: &[&str]) -> Processes {
        let mut processes = Processes::prepare(size, flags);
        for id in 1..=size {
            processes.spawn(id);
        }
        processes
    }

    /// The addresses and data dirs of `size` nodes, none started yet (`spawn` each).
    pub fn prepare(size: u64, flags: &[&str]) -> Processes {
        let endpoints = (1..=size)
            .map(|id| {
                let listener = TcpListener::bind("127.0.0.1:0").unwrap();
                (id, listener.local_addr().unwrap().to_string())
            })
            .collect();
        Processes {
            dir: tempfile::tempdir().unwrap(),
            endpoints,
            children: BTreeMap::new(),
            flags: flags.iter().map(|flag| flag.to_string()).collect(),
            etcd: BTreeMap::new(),
        }
    }

    /// Gives every node an etcd API address (`--etcd-listen`); call before spawning them.
    pub fn serve_etcd(&mut self) {
        self.etcd = self
            .endpoints
            .keys()
            .map(|id| {
                let listener = TcpListener::bind("127.0.0.1:0").unwrap();
                (*id, listener.local_addr().unwrap().to_string())
            })
            .collect();
    }

    /// `id=addr,...` of every node, as `--initial-cluster` takes it.
    pub fn initial_cluster(&self) -> String {
        let nodes: Vec<String> = self
            .endpoints
            .iter()
            .map(|(id, addr)| format!("{id}={addr}"))
            .collect();
        nodes.join(",")
    }

    pub fn data_dir(&self, id: NodeId) -> PathBuf {
        self.dir.path().join(format!("node-{id}"))
    }

    pub fn spawn(&mut self, id: NodeId) {
        let initial_cluster = self.initial_cluster();
        let data_dir = self.data_dir(id);
        std::fs::create_dir_all(&data_dir).unwrap();
        let log = std::fs::File::options()
            .create(true)
            .append(true)
            .open(data_dir.join("test.log"))
            .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_keel"))
            .arg("serve")
            .args(["--node-id", &id.to_string()])
            .args(["--listen", &self.endpoints[&id]])
            .arg("--data-dir")
            .arg(&data_dir)
            .args(["--initial-cluster", &initial_cluster])
            .args(&self.flags)
            .args(
                self.etcd
                    .get(&id)
                    .map(|addr| ["--etcd-listen", addr.as_str()])
                    .into_iter()
                    .flatten(),
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.children.insert(id, child);
    }

    /// Sends SIGTERM and waits for the process to exit; returns whether it exited with 0.
    async fn terminate(&mut self, id: NodeId) -> bool {
        let mut child = self.children.remove(&id).unwrap();
        let sent = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success(), "kill -TERM failed");
        let deadline = tokio::time::Instant::now() + WAIT_LIMIT;
        let mut ticks = tokio::time::interval(Duration::from_millis(20));
        loop {
            ticks.tick().await;
            if let Some(status) = child.try_wait().unwrap() {
                return status.success();
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "node {id} ignored SIGTERM"
            );
        }
    }

    pub fn kill(&mut self, id: NodeId) {
        let mut child = self.children.remove(&id).unwrap();
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
    }

    pub fn client(&self, ids: &[NodeId]) -> Client {
        let endpoints = ids.iter().map(|id| self.endpoints[id].clone()).collect();
        Client::new(endpoints, ClientOptions::default()).unwrap()
    }

    /// Waits until the running nodes agree on a running leader of the first data range.
    pub async fn leader(&self) -> NodeId {
        let client = self.client(&self.endpoints.keys().copied().collect::<Vec<_>>());
        let deadline = tokio::time::Instant::now() + WAIT_LIMIT;
        let mut ticks = tokio::time::interval(Duration::from_millis(50));
        loop {
            ticks.tick().await;
            let mut leaders = Vec::new();
            for id in self.children.keys() {
                let status = client.status(&self.endpoints[id]).await.ok();
                let first = status.and_then(|s| {
                    let mut ranges = s.ranges.into_iter();
                    ranges.find(|range| range.range_id == RangeId::FIRST.0)
                });
                leaders.push(first.and_then(|range| range.leader_id));
            }
            if let Some(Some(leader)) = leaders.first().copied()
                && leaders.iter().all(|other| *other == Some(leader))
                && self.children.contains_key(&leader)
            {
                return leader;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no leader in time; {}",
                self.logs()
            );
        }
    }

    pub fn logs(&self) -> String {
        let mut text = String::from("node logs follow\n");
        for id in self.endpoints.keys() {
            let log = std::fs::read_to_string(self.data_dir(*id).join("test.log"));
            let log = log.unwrap_or_default();
            // Its first errors (what stopped a node), then its last lines.
            let errors = log.lines().filter(|line| line.contains(" ERROR ")).take(10);
            let tail: Vec<&str> = log.lines().rev().take(20).collect();
            text.push_str(&format!("--- node {id}\n"));
            for line in errors {
                text.push_str(line);
                text.push('\n');
            }
            text.push_str("...\n");
            for line in tail.into_iter().rev() {
                text.push_str(line);
                text.push('\n');
            }
        }
        text
    }
}

impl Drop for Processes {
    fn drop(&mut self) {
        for child in self.children.values_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Writes `WRITES` distinct keys from `WRITERS` tasks; returns the acknowledged ones.
/// Writes whose outcome is unknown are left out: they may or may not exist.
async fn write_keys(
    client: Client,
    kill_at: usize,
    kill: tokio::sync::oneshot::Sender<()>,
) -> BTreeMap<String, String> {
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let kill = Arc::new(Mutex::new(Some(kill)));
    let mut tasks = Vec::new();
    for _ in 0..WRITERS {
        let (client, next, kill) = (client.clone(), next.clone(), kill.clone());
        tasks.push(tokio::spawn(async move {
            let mut acknowledged = Vec::new();
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= WRITES {
                    return acknowledged;
                }
                if i == kill_at
                    && let Some(kill) = kill.lock().await.take()
                {
                    let _ = kill.send(());
                }
                let (key, value) = (format!("key-{i:04}"), format!("value-{i}"));
                match client
                    .put(key.as_bytes(), value.as_bytes(), PutOptions::default())
                    .await
                {
                    Ok(_) => acknowledged.push((key, value)),
                    Err(KvError::OutcomeUnknown { .. } | KvError::Unavailable { .. }) => {}
                    Err(other) => panic!("write {key}: {other}"),
                }
            }
        }));
    }
    let mut acknowledged = BTreeMap::new();
    for task in tasks {
        acknowledged.extend(task.await.unwrap());
    }
    acknowledged
}

async fn read_all(
    client: &Client,
    keys: &BTreeMap<String, String>,
    consistency: Consistency,
) -> Vec<String> {
    let mut missing = Vec::new();
    for (key, value) in keys {
        match client.get(key.as_bytes(), consistency).await {
            Ok(got) if got.kv.as_ref().map(|kv| kv.value.as_slice()) == Some(value.as_bytes()) => {}
            other => missing.push(format!("{key}: {other:?}")),
        }
    }
    missing
}

fn log_dir_hint(path: &Path) -> String {
    format!("node logs are under {}", path.display())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acknowledged_writes_survive_kill_9_of_the_leader() {
    let mut processes = Processes::start(3);
    let all: Vec<NodeId> = processes.endpoints.keys().copied().collect();
    let leader = processes.leader().await;
    let (kill_tx, kill_rx) = tokio::sync::oneshot::channel();
    let writer = tokio::spawn(write_keys(processes.client(&all), WRITES / 2, kill_tx));
    kill_rx.await.unwrap();
    processes.kill(leader);
    let acknowledged = writer.await.unwrap();
    assert!(
        acknowledged.len() >= WRITES / 2,
        "only {} writes acknowledged",
        acknowledged.len()
    );

    let new_leader = processes.leader().await;
    assert_ne!(new_leader, leader);
    let survivors: Vec<NodeId> = all.iter().copied().filter(|id| *id != leader).collect();
    let missing = read_all(
        &processes.client(&survivors),
        &acknowledged,
        Consistency::Linearizable,
    )
    .await;
    assert!(
        missing.is_empty(),
        "lost after re-election: {missing:?}; {}",
        log_dir_hint(processes.dir.path())
    );

    processes.spawn(leader);
    let restarted = processes.client(&[leader]);
    let last = acknowledged.keys().next_back().unwrap().clone();
    let deadline = tokio::time::Instant::now() + WAIT_LIMIT;
    let mut ticks = tokio::time::interval(Duration::from_millis(50));
    loop {
        ticks.tick().await;
        let caught_up = read_all(&restarted, &acknowledged, Consistency::Follower)
            .await
            .is_empty();
        if caught_up {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "node {leader} did not catch up on {last}; {}",
            log_dir_hint(processes.dir.path())
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_stops_every_node_cleanly_and_keeps_its_data() {
    let mut processes = Processes::start(3);
    let all: Vec<NodeId> = processes.endpoints.keys().copied().collect();
    processes.leader().await;
    let client = processes.client(&all);
    let written = client
        .put(b"kept", b"yes", PutOptions::default())
        .await
        .unwrap();
    for id in &all {
        let clean = processes.terminate(*id).await;
        assert!(clean, "node {id} did not exit 0 on SIGTERM");
    }
    for id in &all {
        processes.spawn(*id);
    }
    processes.leader().await;
    let got = client
        .get(b"kept", Consistency::Linearizable)
        .await
        .unwrap();
    let kv = got.kv.expect("the write survived a clean restart");
    assert_eq!(
        (kv.value.as_slice(), kv.mod_revision),
        (&b"yes"[..], written.revision)
    );
}

/// Runs the `keel` binary against `endpoints`; returns its exit code and stdout.
pub(crate) fn keel(endpoints: &[&String], args: &[&str]) -> (Option<i32>, String) {
    let endpoints: Vec<&str> = endpoints.iter().map(|e| e.as_str()).collect();
    let output = Command::new(env!("CARGO_BIN_EXE_keel"))
        .args(["--endpoints", &endpoints.join(",")])
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() || !stderr.is_empty(),
        "keel {args:?} failed silently"
    );
    (
        output.status.code(),
        String::from_utf8(output.stdout).unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_split_and_ranges_change_and_show_the_table_and_scan_crosses_it() {
    let processes = Processes::start(3);
    let all: Vec<NodeId> = processes.endpoints.keys().copied().collect();
    processes.leader().await;
    let client = processes.client(&all);
    for i in 0..30 {
        let key = format!("key-{i:02}");
        client
            .put(key.as_bytes(), b"v", PutOptions::default())
            .await
            .unwrap();
    }
    let endpoints: Vec<&String> = processes.endpoints.values().collect();

    let (code, halves) = keel(&endpoints, &["cluster", "split", "--at", "key-10"]);
    assert_eq!(code, Some(0), "{halves}");
    let spans: Vec<&str> = halves
        .lines()
        .skip(1)
        .map(|line| line.split_whitespace().nth(1).unwrap())
        .collect();
    assert_eq!(spans, [r#"["","key-10")"#, r#"["key-10",+inf)"#]);
    let (code, second) = keel(&endpoints, &["cluster", "split", "--at", "key-20"]);
    assert_eq!(code, Some(0), "{second}");
    // The key starts a range already: the existing halves are printed again (a retried
    // split is safe) and nothing changes.
    let (code, again) = keel(&endpoints, &["cluster", "split", "--at", "key-20"]);
    assert_eq!(code, Some(0), "{again}");
    assert_eq!(again, second);

    let (code, json) = keel(&endpoints, &["cluster", "ranges", "--output", "json"]);
    assert_eq!(code, Some(0), "{json}");
    let ranges: serde_json::Value = serde_json::from_str(&json).unwrap();
    let ends: Vec<&serde_json::Value> = ranges
        .as_array()
        .unwrap()
        .iter()
        .map(|range| &range["end"])
        .collect();
    assert_eq!(
        ends,
        [
            &serde_json::json!("key-10"),
            &serde_json::json!("key-20"),
            &serde_json::Value::Null
        ]
    );

    let (code, rows) = keel(&endpoints, &["scan", "--limit", "100"]);
    assert_eq!(code, Some(0));
    let keys: Vec<&str> = rows
        .lines()
        .map(|line| line.split('\t').next().unwrap())
        .collect();
    let expected: Vec<String> = (0..30).map(|i| format!("key-{i:02}")).collect();
    assert_eq!(keys, expected);

    // A watch of the prefix from revision 1 reads every range's history: each put once.
    let watch = ["watch", "key-", "--prefix", "--from", "1", "--count", "30"];
    let (code, rows) = keel(&endpoints, &watch);
    assert_eq!(code, Some(0), "{rows}");
    let mut watched: Vec<&str> = rows
        .lines()
        .map(|line| {
            let fields: Vec<&str> = line.split('\t').collect();
            assert_eq!((fields[1], fields[3]), ("put", "v"), "{line}");
            fields[2]
        })
        .collect();
    watched.sort_unstable();
    assert_eq!(watched, expected);

    // A read at a revision sees a key as it was then, on a get and on a scan.
    let overwrite = client
        .put(b"key-25", b"w", PutOptions::default())
        .await
        .unwrap();
    let then = (overwrite.revision - 1).to_string();
    let (code, value) = keel(&endpoints, &["get", "key-25", "--revision", &then]);
    assert_eq!((code, value.as_str()), (Some(0), "v"));
    let (code, value) = keel(&endpoints, &["get", "key-25"]);
    assert_eq!((code, value.as_str()), (Some(0), "w"));
    let (code, rows) = keel(
        &endpoints,
        &["scan", "key-25", "key-26", "--revision", &then],
    );
    assert_eq!((code, rows.as_str()), (Some(0), "key-25\tv\n"));

    // A watch with the values before, ended by Ctrl-C: exit 0 after every line it took.
    let endpoints: Vec<&str> = endpoints.iter().map(|e| e.as_str()).collect();
    let mut watch = Command::new(env!("CARGO_BIN_EXE_keel"))
        .args(["--endpoints", &endpoints.join(",")])
        .args(["watch", "key-", "--prefix", "--rev", "1", "--prev-kv"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // Lines are read on a thread of their own, so a watch that prints too few fails the
    // test instead of hanging it.
    let stdout = BufReader::new(watch.stdout.take().unwrap());
    let (lines, printed) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        stdout
            .lines()
            .map_while(Result::ok)
            .try_for_each(|line| lines.send(line))
    });
    let mut overwritten = None;
    for _ in 0..31 {
        let line = printed
            .recv_timeout(WAIT_LIMIT)
            .expect("the watch printed 31 events");
        if line.contains("\tkey-25\tw") {
            overwritten = Some(line);
        }
    }
    let expected = format!("{}\tput\tkey-25\tw\tv", overwrite.revision);
    assert_eq!(overwritten, Some(expected));
    let sent = Command::new("kill")
        .args(["-INT", &watch.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success(), "kill -INT failed");
    let deadline = std::time::Instant::now() + WAIT_LIMIT;
    let status = loop {
        if let Some(status) = watch.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            watch.kill().unwrap();
            panic!("the watch ignored Ctrl-C");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0));
}
