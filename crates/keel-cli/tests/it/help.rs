//! The binary starts, documents its commands, exits 2 on bad usage and 5 on damaged data.

use std::process::Command;

fn keel(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_keel"))
        .args(args)
        .output()
        .expect("running keel")
}

#[test]
fn help_lists_every_command() {
    let output = keel(&["--help"]);
    assert!(output.status.success());
    let help = String::from_utf8(output.stdout).unwrap();
    for command in [
        "serve", "dev", "put", "get", "del", "cas", "incr", "scan", "history", "watch", "lock",
        "idem", "cluster", "backup", "restore",
    ] {
        assert!(help.contains(command), "--help lacks {command}:\n{help}");
    }
    assert!(
        help.contains("fenced out"),
        "exit codes lack fencing:\n{help}"
    );
}

#[test]
fn lock_acquire_help_says_how_to_fence_writes() {
    let output = keel(&["lock", "acquire", "--help"]);
    assert!(output.status.success());
    let help = String::from_utf8(output.stdout).unwrap();
    assert!(help.contains("--fence NAME:TOKEN"), "{help}");
}

#[test]
fn lock_idem_and_fence_arguments_are_checked_before_connecting() {
    let cases = [
        (
            &["lock", "acquire", "jobs", "--ttl", "0s"][..],
            "error: invalid argument: TTL of lock \"jobs\" is 0 ms",
        ),
        (
            &["lock", "acquire", "jobs", "--ttl", "10s", "--wait", "6m"],
            "wait for lock \"jobs\" is 360000 ms",
        ),
        (
            &["lock", "renew", "jobs", "5", "--ttl", "-1s"],
            "is -1000 ms",
        ),
        (&["put", "k", "v", "--fence", "jobs"], "is not NAME:TOKEN"),
        (&["del", "k", "--fence", "jobs:0"], "fence token is 0"),
        (
            &["idem", "begin", "pay", "o-1", "--ttl", "0s"],
            "TTL of idempotency record \"o-1\" of scope \"pay\" is 0 ms",
        ),
    ];
    for (args, expected) in cases {
        let mut all = vec!["--endpoints", "127.0.0.1:1"];
        all.extend_from_slice(args);
        let output = keel(&all);
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8(output.stderr).unwrap();
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
}

#[test]
fn help_says_where_values_come_from_and_how_get_writes_them() {
    let cases = [
        (&["put", "--help"][..], "`-` reads it from stdin"),
        (&["put", "--help"], "more than the limit (1 MiB"),
        (&["cas", "--help"], "`-` reads it from stdin"),
        (
            &["idem", "complete", "--help"],
            "64 KiB for an idempotency result",
        ),
        (
            &["get", "--help"],
            "When stdout is not a terminal, or with --raw",
        ),
        (&["get", "--help"], "Not with --output json"),
        (&["idem", "get", "--help"], "--raw"),
    ];
    for (args, expected) in cases {
        let output = keel(args);
        assert!(output.status.success(), "{args:?}");
        let help = String::from_utf8(output.stdout).unwrap();
        assert!(
            help.contains(expected),
            "{args:?} lacks {expected:?}:\n{help}"
        );
    }
}

#[test]
fn raw_with_json_and_an_unreadable_stdin_exit_with_two_before_connecting() {
    let output = keel(&[
        "--endpoints",
        "127.0.0.1:1",
        "get",
        "k",
        "--raw",
        "--output",
        "json",
    ]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(
        stderr.contains("cannot be used with --output json"),
        "{stderr}"
    );
    // A directory opens but cannot be read.
    let dir = tempfile::tempdir().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_keel"))
        .args(["--endpoints", "127.0.0.1:1", "put", "k"])
        .stdin(std::fs::File::open(dir.path()).unwrap())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(
        stderr.starts_with("error: invalid argument: reading the value (key \"k\") from stdin: "),
        "{stderr}"
    );
}

#[test]
fn bad_usage_exits_with_two() {
    let output = keel(&["cas", "k", "v"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(!output.stderr.is_empty());
}

#[test]
fn invalid_key_exits_with_two_before_connecting() {
    let output = keel(&["--endpoints", "127.0.0.1:1", "put", "", "v"]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(
        stderr.starts_with("error: invalid argument: key is empty"),
        "{stderr}"
    );
}

#[test]
fn ttls_without_a_unit_or_out_of_limits_exit_with_two_before_connecting() {
    let cases = [
        (&["put", "k", "v", "--ttl", "30"][..], "has no unit"),
        (
            &["put", "k", "v", "--ttl", "0s"],
            "error: invalid argument: TTL is 0 ms",
        ),
        (
            &["put", "k", "v", "--ttl", "-5s"],
            "error: invalid argument: TTL is negative",
        ),
        (
            &["cas", "k", "v", "--expect-absent", "--ttl", "400d"],
            "limit is 31536000000 ms (1 year)",
        ),
    ];
    for (args, expected) in cases {
        let mut all = vec!["--endpoints", "127.0.0.1:1"];
        all.extend_from_slice(args);
        let output = keel(&all);
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8(output.stderr).unwrap();
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
}

#[test]
fn incr_help_shows_how_to_pass_a_negative_delta() {
    let output = keel(&["incr", "--help"]);
    assert!(output.status.success());
    let help = String::from_utf8(output.stdout).unwrap();
    assert!(help.contains("keel incr n -- -5"), "{help}");
}

#[test]
fn cluster_help_lists_ranges_and_split_and_split_needs_at() {
    let output = keel(&["cluster", "--help"]);
    assert!(output.status.success());
    let help = String::from_utf8(output.stdout).unwrap();
    for command in [
        "status",
        "ranges",
        "split",
        "add-node",
        "remove-node",
        "transfer-leader",
    ] {
        assert!(
            help.contains(command),
            "cluster --help lacks {command}:\n{help}"
        );
    }
    let output = keel(&["cluster", "split", "--help"]);
    let help = String::from_utf8(output.stdout).unwrap();
    assert!(help.contains("--at <KEY>"), "{help}");
    let output = keel(&["--endpoints", "127.0.0.1:1", "cluster", "split"]);
    assert_eq!(output.status.code(), Some(2));
    // An empty key is refused before connecting.
    let output = keel(&["--endpoints", "127.0.0.1:1", "cluster", "split", "--at", ""]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(stderr.contains("key is empty"), "{stderr}");
}

#[test]
fn restore_needs_its_file_dir_and_cluster_and_says_what_backup_promises() {
    let output = keel(&["restore", "--from", "b.keelbackup"]);
    assert_eq!(output.status.code(), Some(2));
    let output = keel(&["restore", "--help"]);
    let help = String::from_utf8(output.stdout).unwrap();
    for flag in ["--from", "--data-dir", "--node-id", "--initial-cluster"] {
        assert!(help.contains(flag), "restore --help lacks {flag}:\n{help}");
    }
    let output = keel(&["backup", "--help"]);
    let help = String::from_utf8(output.stdout).unwrap();
    assert!(help.contains("--out"), "{help}");
    assert!(
        help.contains("not one cluster-wide point in time"),
        "{help}"
    );
}

#[test]
fn restore_refuses_a_missing_file_and_a_node_that_would_not_bootstrap() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("node-1");
    let target = target.to_str().unwrap();
    let cluster = "1=127.0.0.1:7001,2=127.0.0.1:7002";
    let missing = ["restore", "--from", "/nonexistent/b", "--data-dir", target];
    let output = keel(&[&missing[..], &["--initial-cluster", cluster]].concat());
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(stderr.contains("/nonexistent/b"), "{stderr}");
    let second = [
        &missing[..],
        &["--initial-cluster", cluster, "--node-id", "2"],
    ]
    .concat();
    let output = keel(&second);
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(stderr.contains("--node-id 1"), "{stderr}");
    assert!(!dir.path().join("node-1").exists());
}

/// A node whose store file fails its checks does not start: exit 5 (not 3, a failure a
/// restart may cure), with the file named and what to do.
#[test]
fn serve_refuses_a_damaged_store_with_exit_five() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("keel.redb"), [0x5a; 8192]).unwrap();
    let output = keel(&[
        "serve",
        "--node-id",
        "1",
        "--listen",
        "127.0.0.1:0",
        "--initial-cluster",
        "1=127.0.0.1:0",
        "--data-dir",
        data.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(5), "{stderr}");
    assert!(
        stderr.contains("store is damaged; refusing to open it"),
        "{stderr}"
    );
    assert!(stderr.contains("keel.redb is damaged"), "{stderr}");
    assert!(stderr.contains("new --node-id"), "{stderr}");
}
