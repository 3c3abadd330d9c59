//! `keel dev --tls`: the cluster it starts elects and replicates over mutual TLS with the
//! certificates it made, a client trusting its CA is served, the CLI finds the CA through
//! `KEEL_TLS_CA`, and a client without it is refused.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use keel_client::{Client, ClientOptions, ClientTls, PutOptions};
use keel_types::Consistency;

const NODES: u16 = 3;
const WAIT_LIMIT: Duration = Duration::from_secs(60);

/// A running `keel dev`; stopped (SIGTERM, then SIGKILL to it and its nodes) when dropped.
struct Dev {
    child: Child,
    lines: mpsc::Receiver<String>,
    /// The nodes' pids, once the banner named them.
    pids: Vec<String>,
}

impl Dev {
    fn start(data_dir: &Path, base_port: u16) -> Dev {
        let mut child = Command::new(env!("CARGO_BIN_EXE_keel"))
            .args(["dev", "--tls", "--nodes", &NODES.to_string()])
            .args(["--base-port", &base_port.to_string()])
            .arg("--data-dir")
            .arg(data_dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let (sender, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                if sender.send(line).is_err() {
                    return;
                }
            }
        });
        Dev {
            child,
            lines,
            pids: Vec::new(),
        }
    }

    /// The lines printed up to the banner's last one; fails after `WAIT_LIMIT`.
    fn banner(&mut self) -> Vec<String> {
        let deadline = Instant::now() + WAIT_LIMIT;
        let mut printed = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self.lines.recv_timeout(left);
            let line = line.unwrap_or_else(|_| panic!("no banner in time; got {printed:?}"));
            if let Some(pid) = line.split("  pid ").nth(1) {
                self.pids.push(pid.trim().to_string());
            }
            let last = line.starts_with("Ctrl-C stops the cluster");
            printed.push(line);
            if last {
                return printed;
            }
        }
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        let _ = signal("-TERM", &self.child.id().to_string());
        let deadline = Instant::now() + WAIT_LIMIT;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        for pid in &self.pids {
            let _ = signal("-KILL", pid);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn signal(signal: &str, pid: &str) -> std::io::Result<std::process::ExitStatus> {
    Command::new("kill").args([signal, pid]).status()
}

/// Where `keel dev` puts a node's metrics port: this far above its gRPC port.
const METRICS_PORT_OFFSET: u16 = 2_100;

/// A port from which `count` consecutive loopback ports are free just now, and as many
/// from `METRICS_PORT_OFFSET` above it.
fn free_base_port(count: u16) -> u16 {
    for _ in 0..100 {
        let first = TcpListener::bind("127.0.0.1:0").unwrap();
        let base = first.local_addr().unwrap().port();
        if base.checked_add(METRICS_PORT_OFFSET + count).is_none() {
            continue;
        }
        let ports = (1..count).chain((0..count).map(|i| METRICS_PORT_OFFSET + i));
        let rest: Vec<_> = ports
            .map(|i| TcpListener::bind(("127.0.0.1", base + i)))
            .collect();
        if rest.iter().all(Result::is_ok) {
            return base;
        }
    }
    panic!("no {count} consecutive free ports");
}

/// The CA path of the banner's `export KEEL_TLS_CA=...` line.
fn exported_ca(banner: &[String]) -> PathBuf {
    let line = banner
        .iter()
        .find_map(|line| line.split("export KEEL_TLS_CA=").nth(1))
        .unwrap_or_else(|| panic!("the banner names no CA: {banner:?}"));
    PathBuf::from(line.trim())
}

fn keel_cli(endpoints: &str, ca: Option<&Path>, args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_keel"));
    command
        .args(["--endpoints", endpoints, "--timeout-ms", "3000"])
        .args(args)
        .env_remove("KEEL_TLS_CA");
    if let Some(ca) = ca {
        command.env("KEEL_TLS_CA", ca);
    }
    command.output().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keel_dev_tls_serves_only_clients_that_trust_its_ca() {
    let dir = tempfile::tempdir().unwrap();
    let base = free_base_port(NODES);
    let mut dev = Dev::start(dir.path(), base);
    let banner = dev.banner();
    let ca = exported_ca(&banner);
    assert_eq!(ca, dir.path().join("tls/ca.pem"), "{banner:?}");
    for id in 1..=NODES {
        let key = dir.path().join(format!("tls/node-{id}-key.pem"));
        let mode = std::fs::metadata(&key).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{}", key.display());
    }

    let endpoints: Vec<String> = (0..NODES)
        .map(|i| format!("127.0.0.1:{}", base + i))
        .collect();
    let tls = ClientTls {
        ca_pem: std::fs::read(&ca).unwrap(),
        server_name: None,
    };
    let options = ClientOptions {
        tls: Some(tls),
        ..ClientOptions::default()
    };
    let client = Client::new(endpoints.clone(), options).unwrap();
    client
        .put(b"hello", b"world", PutOptions::default())
        .await
        .unwrap();
    let got = client.get(b"hello", Consistency::Linearizable).await;
    assert_eq!(got.unwrap().kv.unwrap().value, b"world");

    let endpoints = endpoints.join(",");
    let trusted = keel_cli(&endpoints, Some(&ca), &["get", "hello"]);
    assert!(trusted.status.success(), "{trusted:?}");
    // To a pipe, the value's bytes alone: no newline.
    assert_eq!(trusted.stdout, b"world");
    let plaintext = keel_cli(&endpoints, None, &["get", "hello"]);
    assert_eq!(plaintext.status.code(), Some(3), "{plaintext:?}");
    let missing = keel_cli(
        &endpoints,
        Some(&dir.path().join("absent.pem")),
        &["get", "hello"],
    );
    assert_eq!(missing.status.code(), Some(2), "{missing:?}");
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert!(stderr.contains("--tls-ca"), "{stderr}");
}
