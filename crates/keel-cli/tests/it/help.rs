//! The binary starts, documents its commands, and exits 2 on bad usage.

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
        "serve", "dev", "put", "get", "del", "cas", "scan", "cluster",
    ] {
        assert!(help.contains(command), "--help lacks {command}:\n{help}");
    }
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
