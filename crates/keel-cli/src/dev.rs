//! `keel dev`: a local cluster of child `keel serve` processes, for trying Keel out, over
//! TLS with throwaway certificates when asked (`tls`). Knows nothing of the server's
//! internals: it starts the same binary with `serve` flags and asks the nodes for their
//! status over gRPC.

mod tls;

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use keel_client::{Client, ClientOptions, ClientTls};
use keel_types::NodeId;
use tokio::process::Command;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::args::{DevArgs, ENDPOINTS_DEFAULT};

/// How long the cluster may take to be ready: leaders elected and settled (a node waits at
/// most `LEADERS_SETTLE_WAIT_MAX_MS` for the latter).
const READY_WAIT: Duration = Duration::from_secs(60);
/// How long children get to stop after SIGTERM before they get SIGKILL.
const STOP_WAIT: Duration = Duration::from_secs(10);
/// Pause between two rounds of status requests while waiting for the cluster to be ready.
const POLL_INTERVAL: Duration = Duration::from_millis(200);
/// A node of a dev cluster is dead after 30 s without a heartbeat (a production node after
/// 5 minutes), so that killing one shows its ranges healing while you watch.
const DEV_NODE_DEAD_AFTER_MS: &str = "30000";
/// A node's metrics port (and console) lies this far above its gRPC port: 9101 for 7001.
const METRICS_PORT_OFFSET: u32 = 2_100;

/// One node of the planned cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodePlan {
    pub node_id: NodeId,
    pub listen: String,
    /// `--metrics-listen`: metrics, health and the console.
    pub metrics: String,
    pub data_dir: PathBuf,
}

/// The whole cluster, decided before anything starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub nodes: Vec<NodePlan>,
    /// `1=127.0.0.1:7001,2=...`, as `serve --initial-cluster` takes it.
    pub initial_cluster: String,
    /// Where the CA and the nodes' certificates are, when the cluster serves TLS.
    pub tls_dir: Option<PathBuf>,
}

/// Plans `nodes` nodes on consecutive loopback ports from `base_port`, data under
/// `data_dir`, serving TLS with certificates under `data_dir/tls` when `tls`.
pub fn plan(nodes: u16, base_port: u16, data_dir: &Path, tls: bool) -> anyhow::Result<Plan> {
    let last = u32::from(base_port) + u32::from(nodes) - 1 + METRICS_PORT_OFFSET;
    if nodes == 0 || last > u32::from(u16::MAX) {
        bail!(
            "{nodes} nodes from port {base_port} (metrics {METRICS_PORT_OFFSET} above) do not fit below port 65536"
        );
    }
    let nodes: Vec<NodePlan> = (1..=u64::from(nodes))
        .map(|node_id| NodePlan {
            node_id,
            listen: format!("127.0.0.1:{}", u64::from(base_port) + node_id - 1),
            metrics: format!(
                "127.0.0.1:{}",
                u64::from(base_port) + node_id - 1 + u64::from(METRICS_PORT_OFFSET)
            ),
            data_dir: data_dir.join(format!("node-{node_id}")),
        })
        .collect();
    let initial_cluster = nodes
        .iter()
        .map(|node| format!("{}={}", node.node_id, node.listen))
        .collect::<Vec<_>>()
        .join(",");
    Ok(Plan {
        nodes,
        initial_cluster,
        tls_dir: tls.then(|| tls::tls_dir(data_dir)),
    })
}

impl Plan {
    pub fn endpoints(&self) -> Vec<String> {
        self.nodes.iter().map(|node| node.listen.clone()).collect()
    }

    /// The TLS flags of `node_id`'s `keel serve`: none without TLS.
    pub fn tls_flags(&self, node_id: NodeId) -> Vec<(&'static str, PathBuf)> {
        let Some(dir) = &self.tls_dir else {
            return Vec::new();
        };
        let (cert, key) = tls::node_paths(dir, node_id);
        vec![
            ("--tls-cert", cert),
            ("--tls-key", key),
            ("--tls-ca", tls::ca_path(dir)),
        ]
    }

    /// The CA file clients trust, when the cluster serves TLS.
    pub fn ca_path(&self) -> Option<PathBuf> {
        self.tls_dir.as_deref().map(tls::ca_path)
    }
}

/// What `keel dev` prints once the cluster has a leader.
pub fn banner(plan: &Plan, leader: NodeId, pids: &[(NodeId, u32)]) -> String {
    let endpoints = plan.endpoints().join(",");
    let flag = if endpoints == ENDPOINTS_DEFAULT {
        String::new()
    } else {
        format!(" --endpoints {endpoints}")
    };
    let nodes = match plan.nodes.len() {
        1 => "1 node".to_string(),
        count => format!("{count} nodes"),
    };
    let mut text = format!("keel dev: {nodes} up, node {leader} leads\n");
    for node in &plan.nodes {
        let pid = pids.iter().find(|(id, _)| *id == node.node_id);
        let pid = pid.map(|(_, pid)| pid.to_string()).unwrap_or_default();
        text.push_str(&format!(
            "  node {}  {}  pid {pid}\n",
            node.node_id, node.listen
        ));
    }
    text.push_str(&format!("endpoints: {endpoints}\n"));
    if let Some(first) = plan.nodes.first() {
        text.push_str(&format!("console:   http://{}/\n", first.metrics));
    }
    let try_line = format!("keel{flag} put hello world && keel{flag} get hello");
    match plan.ca_path() {
        Some(ca) => text.push_str(&format!(
            "tls:       on; clients trust the CA {ca} (--tls-ca or KEEL_TLS_CA)\n\
             try:       export KEEL_TLS_CA={ca}\n           {try_line}\n",
            ca = shell_word(&ca.display().to_string()),
        )),
        None => text.push_str(&format!("try:       {try_line}\n")),
    }
    text.push_str("Ctrl-C stops the cluster.\n");
    text
}

/// `word` as one shell word: as it is when it holds only safe characters, else quoted.
fn shell_word(word: &str) -> String {
    let safe = |c: char| c.is_ascii_alphanumeric() || "/._-+:,=@%".contains(c);
    if !word.is_empty() && word.chars().all(safe) {
        return word.to_string();
    }
    format!("'{}'", word.replace('\'', r"'\''"))
}

/// The command that starts `node` again by hand, with the flags `keel dev` gave it.
pub fn serve_command(exe: &Path, plan: &Plan, node_id: NodeId) -> Option<String> {
    let node = plan.nodes.iter().find(|node| node.node_id == node_id)?;
    let tls: String = plan
        .tls_flags(node_id)
        .iter()
        .map(|(flag, path)| format!(" {flag} {}", shell_word(&path.display().to_string())))
        .collect();
    Some(format!(
        "{} serve --node-id {node_id} --listen {} --metrics-listen {} --data-dir {} \
         --initial-cluster {} --node-dead-after-ms {DEV_NODE_DEAD_AFTER_MS}{tls}",
        exe.display(),
        node.listen,
        node.metrics,
        node.data_dir.display(),
        plan.initial_cluster
    ))
}

/// Runs the cluster until SIGINT/SIGTERM (then stops it and returns Ok) or until a node
/// exits on its own (then stops the rest and returns the error).
pub async fn run(args: DevArgs) -> anyhow::Result<()> {
    let data_dir = match args.data_dir {
        Some(dir) => dir,
        None => tempfile::Builder::new()
            .prefix("keel-dev-")
            .tempdir()
            .context("creating a data directory under the system temp dir")?
            .keep(),
    };
    let plan = plan(args.nodes, args.base_port, &data_dir, args.tls)?;
    println!(
        "keel dev: data in {} (logs: node-<i>/keel.log)",
        data_dir.display()
    );
    let client_tls = make_certificates(&plan)?;
    let mut cluster = Cluster::start(&plan)?;
    let outcome = cluster.serve(&plan, client_tls).await;
    cluster.stop().await;
    if outcome.is_ok() {
        println!("keel dev: stopped; data kept in {}", data_dir.display());
    }
    outcome
}

/// Makes the CA and the nodes' certificates when the cluster serves TLS, and returns what a
/// client needs to trust them.
fn make_certificates(plan: &Plan) -> anyhow::Result<Option<ClientTls>> {
    let Some(dir) = &plan.tls_dir else {
        return Ok(None);
    };
    let nodes: Vec<(NodeId, String)> = plan
        .nodes
        .iter()
        .map(|node| (node.node_id, node.listen.clone()))
        .collect();
    let ca_pem = tls::generate(dir, &nodes).context("making the TLS certificates")?;
    println!(
        "keel dev: TLS certificates in {} (a throwaway CA; keys mode 0600)",
        dir.display()
    );
    Ok(Some(ClientTls {
        ca_pem: ca_pem.into_bytes(),
        server_name: None,
    }))
}

/// The running children, and the channel their exits arrive on.
struct Cluster {
    /// (node id, pid) of children whose exit has not been seen.
    alive: Vec<(NodeId, u32)>,
    exits: mpsc::Receiver<(NodeId, std::io::Result<ExitStatus>)>,
    logs: Vec<(NodeId, PathBuf)>,
}

impl Cluster {
    /// Spawns one child per node; if one cannot start, the ones started are stopped.
    fn start(plan: &Plan) -> anyhow::Result<Cluster> {
        let exe = std::env::current_exe().context("finding the keel binary")?;
        let (sender, exits) = mpsc::channel(plan.nodes.len());
        let mut cluster = Cluster {
            alive: Vec::new(),
            exits,
            logs: Vec::new(),
        };
        for node in &plan.nodes {
            match spawn(&exe, plan, node, sender.clone()) {
                Ok((pid, log)) => {
                    cluster.alive.push((node.node_id, pid));
                    cluster.logs.push((node.node_id, log));
                }
                Err(error) => {
                    signal_all(&cluster.alive, libc::SIGKILL);
                    return Err(error.context(format!("starting node {}", node.node_id)));
                }
            }
        }
        Ok(cluster)
    }

    /// Waits until every node is ready and prints the banner, then serves until a signal. A
    /// node that exits before that stops the whole cluster; one that exits later (say, killed to
    /// watch a failover) is reported with the command that restarts it, and the rest keep
    /// serving until no node is left.
    async fn serve(&mut self, plan: &Plan, tls: Option<ClientTls>) -> anyhow::Result<()> {
        let endpoints = plan.endpoints();
        let leader = tokio::select! {
            leader = wait_for_ready(&endpoints, tls) => leader?,
            exit = self.exits.recv() => return Err(self.died(exit)),
        };
        print!("{}", banner(plan, leader, &self.alive));
        let shutdown = shutdown_signal();
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                signal = &mut shutdown => {
                    println!("keel dev: {}, stopping the cluster", signal?);
                    return Ok(());
                }
                exit = self.exits.recv() => {
                    let node_id = exit.as_ref().map(|(id, _)| *id);
                    let error = self.died(exit);
                    if self.alive.is_empty() {
                        return Err(error.context("every node has exited"));
                    }
                    eprintln!("keel dev: {error}; the other nodes keep serving");
                    let exe = std::env::current_exe()?;
                    if let Some(command) = node_id.and_then(|id| serve_command(&exe, plan, id)) {
                        eprintln!("keel dev: to start it again: {command}");
                    }
                }
            }
        }
    }

    /// The error for a child that exited on its own.
    fn died(&mut self, exit: Option<(NodeId, std::io::Result<ExitStatus>)>) -> anyhow::Error {
        let Some((node_id, status)) = exit else {
            return anyhow::anyhow!("lost track of the child processes");
        };
        self.alive.retain(|(id, _)| *id != node_id);
        let log = self
            .logs
            .iter()
            .find(|(id, _)| *id == node_id)
            .map(|(_, log)| log.display().to_string())
            .unwrap_or_default();
        match status {
            Ok(status) => anyhow::anyhow!("node {node_id} exited early ({status}); see {log}"),
            Err(error) => {
                anyhow::anyhow!("node {node_id} could not be waited on ({error}); see {log}")
            }
        }
    }

    /// SIGTERM to every child, then SIGKILL to those still running after `STOP_WAIT`.
    async fn stop(&mut self) {
        signal_all(&self.alive, libc::SIGTERM);
        let deadline = Instant::now() + STOP_WAIT;
        self.reap_until(deadline).await;
        if !self.alive.is_empty() {
            eprintln!(
                "keel dev: nodes {:?} did not stop in time; killing them",
                self.ids()
            );
            signal_all(&self.alive, libc::SIGKILL);
            self.reap_until(Instant::now() + STOP_WAIT).await;
        }
    }

    async fn reap_until(&mut self, deadline: Instant) {
        while !self.alive.is_empty() {
            match tokio::time::timeout_at(deadline, self.exits.recv()).await {
                Ok(Some((node_id, _))) => self.alive.retain(|(id, _)| *id != node_id),
                Ok(None) | Err(_) => return,
            }
        }
    }

    fn ids(&self) -> Vec<NodeId> {
        self.alive.iter().map(|(id, _)| *id).collect()
    }
}

/// Starts `exe serve ...` for `node`, logging to `<data dir>/keel.log`; a task reports its
/// exit on `exits`. Returns the pid and the log path.
fn spawn(
    exe: &Path,
    plan: &Plan,
    node: &NodePlan,
    exits: mpsc::Sender<(NodeId, std::io::Result<ExitStatus>)>,
) -> anyhow::Result<(u32, PathBuf)> {
    std::fs::create_dir_all(&node.data_dir)
        .with_context(|| format!("creating {}", node.data_dir.display()))?;
    let log_path = node.data_dir.join("keel.log");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .with_context(|| format!("opening {}", log_path.display()))?;
    let mut command = Command::new(exe);
    command
        .arg("serve")
        .args(["--node-id", &node.node_id.to_string()])
        .args(["--listen", &node.listen])
        .args(["--metrics-listen", &node.metrics])
        .arg("--data-dir")
        .arg(&node.data_dir)
        .args(["--initial-cluster", &plan.initial_cluster])
        .args(["--node-dead-after-ms", DEV_NODE_DEAD_AFTER_MS]);
    for (flag, path) in plan.tls_flags(node.node_id) {
        command.arg(flag).arg(path);
    }
    let mut child = command
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        // Own process group: Ctrl-C reaches only `keel dev`, which stops the nodes in order.
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("spawning {}", exe.display()))?;
    let pid = child.id().context("the child exited before it got a pid")?;
    let node_id = node.node_id;
    tokio::spawn(async move {
        let status = child.wait().await;
        // The receiver is gone only when `keel dev` itself is ending.
        let _ = exits.send((node_id, status)).await;
    });
    Ok((pid, log_path))
}

fn signal_all(children: &[(NodeId, u32)], signal: libc::c_int) {
    for (_, pid) in children {
        let Ok(pid) = libc::pid_t::try_from(*pid) else {
            continue;
        };
        // SAFETY: kill(2) takes plain integers and touches no memory of ours. `pid` is a child
        // we spawned and have not yet seen exit, so it has not been reaped and reused.
        unsafe {
            libc::kill(pid, signal);
        }
    }
}

/// Polls every node's status until each reports ready (each range it hosts knows a leader
/// and the cluster's leaders settled), for at most `READY_WAIT`; returns a leader they name.
async fn wait_for_ready(endpoints: &[String], tls: Option<ClientTls>) -> anyhow::Result<NodeId> {
    let options = ClientOptions {
        request_timeout: Duration::from_millis(500),
        read_attempt_timeout: Duration::from_millis(500),
        connect_timeout: Duration::from_millis(200),
        tls,
        ..ClientOptions::default()
    };
    let client = Client::new(endpoints.to_vec(), options)?;
    let deadline = Instant::now() + READY_WAIT;
    let mut waiting_on = String::from("no node answered");
    while Instant::now() < deadline {
        let mut leader = None;
        let mut ready = true;
        for endpoint in endpoints {
            match client.status(endpoint).await {
                Ok(status) if status.ready => {
                    let named = status.ranges.iter().find_map(|range| range.leader_id);
                    leader = leader.or(named);
                }
                Ok(status) => {
                    ready = false;
                    waiting_on = format!("{endpoint}: {}", status.ready_message);
                }
                Err(error) => {
                    ready = false;
                    waiting_on = format!("{endpoint}: {error}");
                }
            }
        }
        if let Some(leader) = leader.filter(|_| ready) {
            return Ok(leader);
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    bail!(
        "the cluster was not ready within {} s (last: {waiting_on}); see the nodes' keel.log",
        READY_WAIT.as_secs()
    )
}

async fn shutdown_signal() -> anyhow::Result<&'static str> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = signal(SignalKind::terminate()).context("listening for SIGTERM")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("listening for SIGINT")?;
    tokio::select! {
        _ = terminate.recv() => Ok("SIGTERM"),
        _ = interrupt.recv() => Ok("SIGINT"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_puts_nodes_on_consecutive_ports() {
        let three = plan(3, 7001, Path::new("/d"), false).unwrap();
        assert_eq!(
            three.initial_cluster,
            "1=127.0.0.1:7001,2=127.0.0.1:7002,3=127.0.0.1:7003"
        );
        assert_eq!(three.nodes[2].data_dir, Path::new("/d/node-3"));
        assert_eq!(three.endpoints().join(","), ENDPOINTS_DEFAULT);
        assert_eq!(three.nodes[0].metrics, "127.0.0.1:9101");
        assert!(plan(2, 63435, Path::new("/d"), false).is_err());
        assert!(plan(1, 63435, Path::new("/d"), false).is_ok());
    }

    #[test]
    fn serve_command_repeats_the_flags_of_dev() {
        let plan = plan(3, 7001, Path::new("/d"), false).unwrap();
        let command = serve_command(Path::new("/bin/keel"), &plan, 2).unwrap();
        assert_eq!(
            command,
            "/bin/keel serve --node-id 2 --listen 127.0.0.1:7002 --metrics-listen 127.0.0.1:9102 \
             --data-dir /d/node-2 --initial-cluster 1=127.0.0.1:7001,2=127.0.0.1:7002,3=127.0.0.1:7003 \
             --node-dead-after-ms 30000"
        );
        assert_eq!(serve_command(Path::new("/bin/keel"), &plan, 4), None);
    }

    #[test]
    fn banner_names_endpoints_only_when_not_default() {
        let default = banner(
            &plan(3, 7001, Path::new("/d"), false).unwrap(),
            2,
            &[(1, 41)],
        );
        assert!(
            default.contains("try:       keel put hello world"),
            "{default}"
        );
        assert!(default.contains("3 nodes up, node 2 leads"), "{default}");
        assert!(
            default.contains("node 1  127.0.0.1:7001  pid 41"),
            "{default}"
        );
        assert!(
            default.contains("console:   http://127.0.0.1:9101/\n"),
            "{default}"
        );
        let other = banner(&plan(1, 9000, Path::new("/d"), false).unwrap(), 1, &[]);
        assert!(
            other.contains("keel --endpoints 127.0.0.1:9000 put hello world"),
            "{other}"
        );
    }

    #[test]
    fn tls_adds_its_flags_to_serve_and_its_ca_to_the_banner() {
        let tls = plan(3, 7001, Path::new("/d"), true).unwrap();
        let command = serve_command(Path::new("/bin/keel"), &tls, 2).unwrap();
        assert!(
            command.ends_with(
                "--node-dead-after-ms 30000 --tls-cert /d/tls/node-2.pem \
                 --tls-key /d/tls/node-2-key.pem --tls-ca /d/tls/ca.pem"
            ),
            "{command}"
        );
        let text = banner(&tls, 1, &[]);
        let expected = "try:       export KEEL_TLS_CA=/d/tls/ca.pem\n           \
                        keel put hello world && keel get hello\n";
        assert!(text.contains(expected), "{text}");
        let plain = plan(3, 7001, Path::new("/d"), false).unwrap();
        assert!(plain.tls_flags(1).is_empty());
        assert!(!banner(&plain, 1, &[]).contains("KEEL_TLS_CA"));
    }

    #[test]
    fn shell_words_are_quoted_only_when_needed() {
        assert_eq!(
            shell_word("/tmp/keel-dev-x/tls/ca.pem"),
            "/tmp/keel-dev-x/tls/ca.pem"
        );
        assert_eq!(shell_word("/my dir/ca.pem"), "'/my dir/ca.pem'");
        assert_eq!(shell_word("it's"), r"'it'\''s'");
        assert_eq!(shell_word(""), "''");
    }
}
