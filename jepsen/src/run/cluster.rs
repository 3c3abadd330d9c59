//! The `keel serve` processes of a run: start, kill -9, restart with the same data, pause
//! and resume, and kill everything when dropped. Each node's output goes to `nK/keel.log`
//! in the run directory, its data to `nK/data`. The first nodes start the cluster
//! (`--initial-cluster`); spare nodes are started later and join it (`--join`); a retired
//! node (one whose data was damaged) is never started again. Knows nothing of faults'
//! schedule, networks or workloads; it sees the cluster only as processes and command-line
//! flags.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::process::{Child, Command};

use crate::run::net::NodeAddress;

/// Lines of a node's log shown when it fails to start.
pub const LOG_TAIL_LINES: usize = 20;

/// Whether a node is part of the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// Started by `start_all` and restarted after faults.
    Active,
    /// A spare not started yet.
    Spare,
    /// Never started again.
    Retired,
}

/// One node: how to start it and its process when running.
#[derive(Debug)]
struct Node {
    id: u64,
    args: Vec<String>,
    log: PathBuf,
    data: PathBuf,
    role: Role,
    child: Option<Child>,
}

#[derive(Debug)]
pub struct Cluster {
    binary: PathBuf,
    nodes: Vec<Node>,
}

impl Cluster {
    /// Plans the nodes (`extra` flags go to every `keel serve`) without starting them: the
    /// first `members` start the cluster, the other addresses are spares that join it.
    pub fn new(
        binary: &Path,
        addresses: &[NodeAddress],
        members: usize,
        dir: &Path,
        extra: &[String],
    ) -> Cluster {
        let first = &addresses[..members.min(addresses.len())];
        let initial_cluster = first
            .iter()
            .enumerate()
            .map(|(index, address)| format!("{}={}", index + 1, address.cluster))
            .collect::<Vec<_>>()
            .join(",");
        let join = first
            .iter()
            .map(|address| address.cluster.to_string())
            .collect::<Vec<_>>()
            .join(",");
        let nodes = addresses
            .iter()
            .enumerate()
            .map(|(index, address)| {
                let node_dir = dir.join(node_name(index));
                let data = node_dir.join("data");
                let mut args: Vec<String> = vec![
                    "serve".into(),
                    "--node-id".into(),
                    (index + 1).to_string(),
                    "--listen".into(),
                    address.listen.to_string(),
                    "--data-dir".into(),
                    data.display().to_string(),
                ];
                let role = match index < members {
                    true => {
                        args.extend(["--initial-cluster".into(), initial_cluster.clone()]);
                        Role::Active
                    }
                    false => {
                        args.extend([
                            "--join".into(),
                            join.clone(),
                            "--advertise".into(),
                            address.cluster.to_string(),
                        ]);
                        Role::Spare
                    }
                };
                if let Some(etcd) = address.etcd {
                    args.extend(["--etcd-listen".into(), etcd.to_string()]);
                }
                args.extend(extra.iter().cloned());
                Node {
                    id: index as u64 + 1,
                    args,
                    log: node_dir.join("keel.log"),
                    data,
                    role,
                    child: None,
                }
            })
            .collect();
        Cluster {
            binary: binary.to_path_buf(),
            nodes,
        }
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Starts every active node that is not running.
    pub fn start_all(&mut self) -> anyhow::Result<()> {
        for index in 0..self.nodes.len() {
            if self.nodes[index].role == Role::Active && self.nodes[index].child.is_none() {
                self.start(index)?;
            }
        }
        Ok(())
    }

    /// Starts spare node `index`, which joins the cluster; from now on it is active.
    pub fn activate(&mut self, index: usize) -> anyhow::Result<()> {
        let node = &mut self.nodes[index];
        if node.role != Role::Spare {
            bail!("node {} is not a spare", node.id);
        }
        node.role = Role::Active;
        self.start(index)
    }

    /// Kills node `index` for good: it is never started again.
    pub async fn retire(&mut self, index: usize) -> anyhow::Result<()> {
        self.nodes[index].role = Role::Retired;
        self.kill(index).await
    }

    /// Spare nodes not started yet, in order.
    pub fn spares(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|index| self.nodes[*index].role == Role::Spare)
            .collect()
    }

    /// Whether node `index` runs.
    pub fn is_running(&self, index: usize) -> bool {
        self.nodes[index].child.is_some()
    }

    /// Node `index`'s data directory.
    pub fn data_dir(&self, index: usize) -> &Path {
        &self.nodes[index].data
    }

    /// Starts node `index` (again) with its flags and data.
    pub fn start(&mut self, index: usize) -> anyhow::Result<()> {
        let node = &mut self.nodes[index];
        assert!(node.child.is_none(), "node {} is already running", node.id);
        let log_dir = node.log.parent().expect("a log path has a parent");
        std::fs::create_dir_all(log_dir)
            .with_context(|| format!("creating {}", log_dir.display()))?;
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&node.log)
            .with_context(|| format!("opening {}", node.log.display()))?;
        let mut command = Command::new(&self.binary);
        command
            .args(&node.args)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true);
        // SAFETY: the closure only calls prctl, which is async-signal-safe. It makes the
        // kernel kill the node if the runner dies, even by SIGKILL, so no node outlives a run.
        unsafe {
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = command
            .spawn()
            .with_context(|| format!("starting {} for node {}", self.binary.display(), node.id))?;
        node.child = Some(child);
        Ok(())
    }

    /// kill -9 of node `index`; waits until it is gone.
    pub async fn kill(&mut self, index: usize) -> anyhow::Result<()> {
        let node = &mut self.nodes[index];
        let Some(mut child) = node.child.take() else {
            return Ok(());
        };
        child.start_kill().ok();
        child
            .wait()
            .await
            .with_context(|| format!("waiting for node {} to die", node.id))?;
        Ok(())
    }

    /// Waits up to `timeout` for node `index` to exit on its own; its status if it did (the
    /// node is then stopped, and started again only by `start`).
    pub async fn wait_exit(&mut self, index: usize, timeout: Duration) -> Option<ExitStatus> {
        let child = self.nodes[index].child.as_mut()?;
        let status = tokio::time::timeout(timeout, child.wait())
            .await
            .ok()?
            .ok()?;
        self.nodes[index].child = None;
        Some(status)
    }

    /// SIGSTOP (`pause`) or SIGCONT (`!pause`) to node `index`, if it runs.
    pub fn pause(&mut self, index: usize, pause: bool) -> anyhow::Result<()> {
        let signal = if pause { libc::SIGSTOP } else { libc::SIGCONT };
        let Some(pid) = self.nodes[index].child.as_ref().and_then(Child::id) else {
            return Ok(());
        };
        // SAFETY: kill(2) with a pid of our own child and a valid signal number.
        if unsafe { libc::kill(pid as libc::pid_t, signal) } != 0 {
            bail!(
                "signal {signal} to node {}: {}",
                self.nodes[index].id,
                std::io::Error::last_os_error()
            );
        }
        Ok(())
    }

    /// Nodes (index, status) that exited on their own since the last look; they are marked
    /// stopped so `start_all` starts them again.
    pub fn exited(&mut self) -> Vec<(usize, ExitStatus)> {
        let mut exited = Vec::new();
        for (index, node) in self.nodes.iter_mut().enumerate() {
            let status = node
                .child
                .as_mut()
                .and_then(|child| child.try_wait().ok().flatten());
            if let Some(status) = status {
                node.child = None;
                exited.push((index, status));
            }
        }
        exited
    }

    /// The last lines of node `index`'s log, for error messages.
    pub fn log_tail(&self, index: usize) -> String {
        let path = &self.nodes[index].log;
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n");
        format!("{} (last lines):\n{tail}", path.display())
    }

    /// kill -9 of every node, waiting for each.
    pub async fn kill_all(&mut self) -> anyhow::Result<()> {
        for index in 0..self.nodes.len() {
            self.kill(index).await?;
        }
        Ok(())
    }
}

/// `n1`, `n2`, ...: how nodes are named in faults.jsonl and in the run directory.
pub fn node_name(index: usize) -> String {
    format!("n{}", index + 1)
}
