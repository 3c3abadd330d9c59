//! The network namespace of a run (root only): made with `ip netns add`, loopback up with
//! one alias per node, entered by the runner with setns(2), deleted when dropped; and
//! partitions as iptables DROP rules by alias inside it. Installs nothing: `ip` and
//! `iptables` must be there (`.ci/run` installs iproute2 and iptables). Knows nothing of Keel.

use std::fs::File;
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::process::{Command, Stdio};

use anyhow::{Context, bail};

/// Prefix of the namespaces this harness makes; the runner's pid follows.
pub const NAME_PREFIX: &str = "keel-jepsen-";

/// Why a namespace cannot be used here, or `None` when it can (root, `ip` and `iptables`).
pub fn unavailable() -> Option<String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root".to_string());
    }
    for tool in [["ip", "-V"], ["iptables", "-V"]] {
        let found = Command::new(tool[0])
            .arg(tool[1])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success());
        if !found {
            return Some(format!("`{}` is not installed", tool[0]));
        }
    }
    None
}

/// A network namespace this process made; deleted on drop.
#[derive(Debug)]
pub struct Namespace {
    name: String,
}

impl Namespace {
    /// Makes namespace `NAME_PREFIX<pid>`, brings `lo` up and gives it `aliases` (/32 each).
    /// Namespaces left by runs whose process is gone are deleted first.
    pub fn create(aliases: &[Ipv4Addr]) -> anyhow::Result<Namespace> {
        delete_stale();
        let name = format!("{NAME_PREFIX}{}", std::process::id());
        run(&["netns", "add", &name])?;
        let namespace = Namespace { name };
        let name = namespace.name.as_str();
        run(&["-n", name, "link", "set", "lo", "up"])?;
        for alias in aliases {
            run(&[
                "-n",
                name,
                "addr",
                "add",
                &format!("{alias}/32"),
                "dev",
                "lo",
            ])?;
        }
        Ok(namespace)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Moves the calling thread into the namespace. Call it before starting any other
    /// thread: threads (and child processes) started afterwards from this one are inside.
    pub fn enter(&self) -> anyhow::Result<()> {
        let path = format!("/run/netns/{}", self.name);
        let file = File::open(&path).with_context(|| format!("opening {path}"))?;
        // SAFETY: `file` is an open namespace file for the whole call.
        let status = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
        if status != 0 {
            let error = std::io::Error::last_os_error();
            bail!("entering network namespace {}: {error}", self.name);
        }
        Ok(())
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        if let Err(error) = run(&["netns", "delete", &self.name]) {
            eprintln!("keel-jepsen: {error:#}");
        }
    }
}

/// Deletes `keel-jepsen-<pid>` namespaces whose process no longer exists (a run killed by
/// SIGKILL cannot clean up after itself).
fn delete_stale() {
    let Ok(output) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        let Some(pid) = name.strip_prefix(NAME_PREFIX) else {
            continue;
        };
        if pid.parse::<u32>().is_ok() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = run(&["netns", "delete", name]);
        }
    }
}

/// Runs `ip ARGS`, failing with its stderr.
fn run(args: &[&str]) -> anyhow::Result<()> {
    let output = Command::new("ip")
        .args(args)
        .output()
        .with_context(|| format!("running ip {}", args.join(" ")))?;
    if !output.status.success() {
        bail!(
            "ip {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(())
}

/// Partitions by iptables DROP rules between node aliases, inside the namespace the calling
/// process is in. Traffic from the clients (127.0.0.1) is never dropped.
#[derive(Debug, Clone)]
pub struct Iptables {
    aliases: Vec<Ipv4Addr>,
}

impl Iptables {
    pub fn new(aliases: Vec<Ipv4Addr>) -> Iptables {
        Iptables { aliases }
    }

    /// Drops every packet between the nodes of each pair (by index), both ways.
    pub async fn cut(&self, pairs: &[(usize, usize)]) -> anyhow::Result<()> {
        for &(a, b) in pairs {
            for (source, target) in [(a, b), (b, a)] {
                let (source, target) = (self.aliases[source], self.aliases[target]);
                iptables(&[
                    "-A",
                    "INPUT",
                    "-s",
                    &source.to_string(),
                    "-d",
                    &target.to_string(),
                    "-j",
                    "DROP",
                ])
                .await?;
            }
        }
        Ok(())
    }

    /// Removes every rule.
    pub async fn heal(&self) -> anyhow::Result<()> {
        iptables(&["-F", "INPUT"]).await
    }
}

async fn iptables(args: &[&str]) -> anyhow::Result<()> {
    let output = tokio::process::Command::new("iptables")
        .arg("-w")
        .args(args)
        .output()
        .await
        .with_context(|| format!("running iptables {}", args.join(" ")))?;
    if !output.status.success() {
        bail!(
            "iptables {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(())
}
