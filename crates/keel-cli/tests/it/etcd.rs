//! etcd's own command-line client, Debian's `etcdctl` (package `etcd-client`), drives three
//! `keel serve --etcd-listen` processes: puts and gets with prefixes and past revisions,
//! versions, deletes of a prefix, transactions on both branches and through every node,
//! watches resumed from a past revision and of a prefix with previous values, leases
//! (grant, attach, time to live, keep-alive, list, revoke), a lock and an election handed
//! from one process to the next, a revision in the future, the member list, and the
//! endpoints' status and health. Ignored by the README's test command,
//! which needs nothing but Rust; `.ci/run` installs `etcd-client` and runs it.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::process::Processes;

/// How long a watch may take to print what a test waits for.
const WATCH_WAIT: Duration = Duration::from_secs(20);

/// Runs `etcdctl` (API v3) against `endpoints` with `stdin`; returns whether it succeeded,
/// its stdout and its stderr.
fn etcdctl(endpoints: &[String], args: &[&str], stdin: &str) -> (bool, String, String) {
    let mut child = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", endpoints.join(",")))
        .args(["--command-timeout=10s", "--dial-timeout=5s"])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("etcdctl is missing: install Debian's etcd-client (.ci/run does)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// `etcdctl ARGS` in the background (a watch, a lock holder, a candidate): its stdout lines
/// arrive on the receiver.
struct Background {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Background {
    fn start(endpoints: &[String], args: &[&str]) -> Background {
        let mut child = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", endpoints.join(",")))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("etcdctl is missing: install Debian's etcd-client (.ci/run does)");
        let stdout = child.stdout.take().unwrap();
        let (sender, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if sender.send(line).is_err() {
                    return;
                }
            }
        });
        Background { child, lines }
    }

    /// The next `count` lines, waiting at most `WATCH_WAIT` for all of them.
    fn lines(&self, count: usize) -> Vec<String> {
        let deadline = Instant::now() + WATCH_WAIT;
        let mut lines = Vec::new();
        while lines.len() < count {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => lines.push(line),
                Err(_) => panic!("etcdctl printed {lines:?}, not {count} lines"),
            }
        }
        lines
    }

    /// The lines printed so far, without waiting.
    fn printed(&self) -> Vec<String> {
        self.lines.try_iter().collect()
    }

    /// Sends SIGINT, on which etcdctl's lock and elect close their session (revoking its
    /// lease, which deletes their key), and waits for it to exit.
    fn interrupt(mut self) {
        let pid = self.child.id().to_string();
        let sent = Command::new("kill").args(["-INT", &pid]).status().unwrap();
        assert!(sent.success(), "kill -INT failed");
        let _ = self.child.wait();
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `etcdctl` and asserts it succeeded; returns its stdout.
fn ok(endpoints: &[String], args: &[&str]) -> String {
    let (success, stdout, stderr) = etcdctl(endpoints, args, "");
    assert!(success, "etcdctl {args:?} failed: {stderr}");
    stdout
}

/// The number after `"Name" : ` in `etcdctl -w fields` output.
fn field(output: &str, name: &str) -> i64 {
    let marker = format!("\"{name}\" : ");
    let line = output
        .lines()
        .find_map(|line| line.strip_prefix(&marker))
        .unwrap_or_else(|| panic!("no {name} in {output}"));
    line.trim().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs etcdctl (Debian's etcd-client); .ci/run runs it"]
async fn etcdctl_drives_a_three_node_keel() {
    let mut processes = Processes::prepare(3, &[]);
    processes.serve_etcd();
    for id in 1..=3 {
        processes.spawn(id);
    }
    processes.leader().await;
    let all: Vec<String> = processes.etcd.values().cloned().collect();
    let one = |id: u64| vec![processes.etcd[&id].clone()];

    assert_eq!(ok(&all, &["put", "app/config", "v1"]), "OK\n");
    let first = field(
        &ok(&all, &["get", "app/config", "-w", "fields"]),
        "ModRevision",
    );
    assert_eq!(ok(&one(3), &["put", "app/config", "v2"]), "OK\n");
    ok(&all, &["put", "app/flags/a", "1"]);
    ok(&all, &["put", "app/flags/b", "2"]);
    ok(&all, &["put", "apps", "not under app/"]);

    let fields = ok(&one(2), &["get", "app/config", "-w", "fields"]);
    assert_eq!(field(&fields, "Version"), 2, "{fields}");
    assert_eq!(field(&fields, "CreateRevision"), first, "{fields}");
    assert!(field(&fields, "ModRevision") > first, "{fields}");
    assert_eq!(
        ok(&one(2), &["get", "app/config", "--print-value-only"]),
        "v2\n"
    );
    let old = format!("--rev={first}");
    assert_eq!(
        ok(&all, &["get", "app/config", &old, "--print-value-only"]),
        "v1\n",
        "a read at a past revision sees the value then"
    );
    assert_eq!(
        ok(&all, &["get", "app/", "--prefix", "--keys-only"]),
        "app/config\n\napp/flags/a\n\napp/flags/b\n\n"
    );
    let limited = ok(
        &all,
        &["get", "app/", "--prefix", "--limit=1", "-w", "fields"],
    );
    assert_eq!(field(&limited, "Count"), 3, "{limited}");
    assert!(limited.contains("\"More\" : true"), "{limited}");
    assert_eq!(
        ok(
            &one(1),
            &[
                "get",
                "app/",
                "--prefix",
                "--consistency=s",
                "--print-value-only",
                "--sort-by=CREATE",
                "--order=DESCEND"
            ]
        ),
        "2\n1\nv2\n"
    );

    // A transaction on the success branch, then the same one on the failure branch.
    let txn = "value(\"app/config\") = \"v2\"\n\nput app/config v3\n\nget app/config\n\n";
    let (success, stdout, stderr) = etcdctl(&all, &["txn"], txn);
    assert!(success, "{stderr}");
    assert_eq!(stdout, "SUCCESS\n\nOK\n");
    let (success, stdout, stderr) = etcdctl(&all, &["txn"], txn);
    assert!(success, "{stderr}");
    assert_eq!(stdout, "FAILURE\n\napp/config\nv3\n");
    // On every node: the followers send the transaction on to the leader.
    for id in 1..=3 {
        let created = format!("create(\"app/lock/{id}\") = \"0\"\n\nput app/lock/{id} me\n\n\n");
        let (_, stdout, stderr) = etcdctl(&one(id), &["txn"], &created);
        assert_eq!(stdout, "SUCCESS\n\nOK\n", "node {id}: {stderr}");
    }

    // A watch resumed from the first revision replays the key's history, then goes on live.
    let watcher = Background::start(&one(2), &["watch", "app/config", &old]);
    let replayed = watcher.lines(9);
    let values: Vec<&str> = replayed
        .iter()
        .skip(2)
        .step_by(3)
        .map(String::as_str)
        .collect();
    assert_eq!(values, vec!["v1", "v2", "v3"], "{replayed:?}");
    assert_eq!(replayed[0], "PUT");
    ok(&one(1), &["put", "app/config", "v4"]);
    assert_eq!(watcher.lines(3), vec!["PUT", "app/config", "v4"]);
    ok(&one(3), &["del", "app/config"]);
    assert_eq!(watcher.lines(2), vec!["DELETE", "app/config"]);
    drop(watcher);
    // From the next revision, so that the put below is seen however late the watch starts.
    let now = field(
        &ok(&all, &["get", "app/flags/a", "-w", "fields"]),
        "Revision",
    );
    let next = format!("--rev={}", now + 1);
    let prefix = Background::start(
        &all,
        &["watch", "app/flags/", "--prefix", "--prev-kv", &next],
    );
    ok(&all, &["put", "app/flags/a", "1b"]);
    // With --prev-kv, etcdctl prints the state before the event, then the event.
    assert_eq!(
        prefix.lines(5),
        vec!["PUT", "app/flags/a", "1", "app/flags/a", "1b"]
    );
    drop(prefix);

    assert_eq!(ok(&all, &["del", "app/flags/", "--prefix"]), "2\n");
    assert_eq!(ok(&all, &["get", "app/flags/", "--prefix"]), "");
    assert_eq!(
        ok(&all, &["get", "apps", "--print-value-only"]),
        "not under app/\n"
    );

    leases_locks_and_elections(&all);

    let (success, _, stderr) = etcdctl(&all, &["get", "app/config", "--rev=1000000"], "");
    assert!(!success, "a read at a future revision fails");
    assert!(stderr.contains("future revision"), "{stderr}");

    let members = ok(&one(2), &["member", "list"]);
    assert_eq!(members.lines().count(), 3, "{members}");
    let own = format!("keel-2, http://{}", processes.endpoints[&2]);
    assert!(members.contains(&own), "{members}");
    assert!(
        members.contains(&format!("http://{}, false", processes.etcd[&2])),
        "{members}"
    );

    let status = ok(&all, &["endpoint", "status"]);
    assert_eq!(status.lines().count(), 3, "{status}");
    assert!(status.contains("3.5.33"), "{status}");
    assert_eq!(
        status.matches(", true, false,").count(),
        1,
        "exactly one endpoint leads: {status}"
    );
    // etcdctl 3.4 writes the health of each endpoint to stderr.
    let (success, stdout, stderr) = etcdctl(&all, &["endpoint", "health"], "");
    assert!(success, "{stdout}{stderr}");
    let health = format!("{stdout}{stderr}");
    assert_eq!(health.matches("is healthy").count(), 3, "{health}");
}

/// `etcdctl lease` grants, attaches, reads, keeps alive, lists and revokes; `etcdctl lock`
/// and `etcdctl elect` (etcd's client-side recipes of a lease, transactions, reads sorted by
/// create revision and watches) hand a lock and a leadership from one process to the next.
fn leases_locks_and_elections(all: &[String]) {
    let granted = ok(all, &["lease", "grant", "60"]);
    let id = granted.split_whitespace().nth(1).unwrap().to_string();
    assert!(granted.ends_with("granted with TTL(60s)\n"), "{granted}");
    ok(all, &["put", "--lease", &id, "leased/a", "1"]);
    ok(all, &["put", "--lease", &id, "leased/b", "2"]);
    let ttl = ok(all, &["lease", "timetolive", &id, "--keys"]);
    assert!(ttl.contains("attached keys([leased/a leased/b])"), "{ttl}");
    let kept = ok(all, &["lease", "keep-alive", "--once", &id]);
    assert!(kept.contains("keepalived with TTL(60)"), "{kept}");
    assert!(ok(all, &["lease", "list"]).contains(&id));
    ok(all, &["lease", "revoke", &id]);
    assert_eq!(ok(all, &["get", "leased/", "--prefix"]), "");
    let (success, _, stderr) = etcdctl(all, &["put", "--lease", &id, "leased/c", "3"], "");
    assert!(
        !success && stderr.contains("requested lease not found"),
        "{stderr}"
    );

    // A lock held by one process; another waits until the first lets go.
    let holder = Background::start(all, &["lock", "app-lock"]);
    let held = holder.lines(1);
    assert!(held[0].starts_with("app-lock/"), "{held:?}");
    let waiter = Background::start(all, &["lock", "app-lock", "echo", "second holds it"]);
    let deadline = Instant::now() + WATCH_WAIT;
    while ok(all, &["get", "app-lock", "--prefix", "--keys-only"])
        .lines()
        .filter(|line| !line.is_empty())
        .count()
        < 2
    {
        assert!(Instant::now() < deadline, "the waiter never queued");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(waiter.printed(), Vec::<String>::new(), "both hold the lock");
    holder.interrupt();
    assert_eq!(waiter.lines(1), vec!["second holds it"]);
    drop(waiter);

    // An election: the first candidate leads, a listener sees it, then the second leads.
    let first = Background::start(all, &["elect", "app-election", "proposal-a"]);
    assert_eq!(first.lines(2)[1], "proposal-a");
    let listener = Background::start(all, &["elect", "--listen", "app-election"]);
    assert_eq!(listener.lines(2)[1], "proposal-a");
    let second = Background::start(all, &["elect", "app-election", "proposal-b"]);
    first.interrupt();
    assert_eq!(second.lines(2)[1], "proposal-b");
    assert_eq!(listener.lines(2)[1], "proposal-b");
}
