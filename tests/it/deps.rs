//! The dependency direction of DESIGN §6, checked against `cargo metadata`.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

/// Which workspace crates each crate may depend on (normal dependencies). An arrow missing
/// here is a design change: update DESIGN/ARCHITECTURE first.
const ALLOWED: &[(&str, &[&str])] = &[
    ("keel-types", &[]),
    ("keel-proto", &["keel-types"]),
    ("keel-storage", &["keel-types"]),
    ("keel-raft", &["keel-types", "keel-storage"]),
    ("keel-meta", &["keel-types"]),
    // The backup file's format: written client side (keel-cli), read server side (restore).
    ("keel-backup", &["keel-types"]),
    (
        "keel-server",
        &[
            "keel-types",
            "keel-proto",
            "keel-storage",
            "keel-raft",
            "keel-meta",
            "keel-backup",
        ],
    ),
    ("keel-client", &["keel-types", "keel-proto"]),
    // The `keel` binary hosts `keel serve` and the offline `keel restore`, its only uses of
    // keel-server; `keel backup` writes its file with keel-backup.
    (
        "keel-cli",
        &[
            "keel-types",
            "keel-proto",
            "keel-client",
            "keel-server",
            "keel-backup",
        ],
    ),
    // The harness treats the cluster as a black box: it reaches it through keel-client, or as
    // raw keel-proto calls a generic client would send (`--clients spread`).
    ("keel-jepsen", &["keel-types", "keel-proto", "keel-client"]),
    // The load generator drives Keel as a client would (and etcd, behind a feature).
    ("keel-bench", &["keel-types", "keel-proto", "keel-client"]),
];

/// External crates that only some of ours may name.
const CONFINED: &[(&str, &[&str])] = &[
    ("redb", &["keel-storage"]),
    ("openraft", &["keel-storage", "keel-raft", "keel-server"]),
    // Certificates are made only by `keel dev --tls` (tests make theirs as dev-dependencies).
    ("rcgen", &["keel-cli"]),
];

fn workspace_dependencies() -> BTreeMap<String, BTreeSet<String>> {
    let output = Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo metadata runs");
    assert!(output.status.success(), "cargo metadata failed");
    let metadata: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let mut graph = BTreeMap::new();
    for package in metadata["packages"].as_array().unwrap() {
        let name = package["name"].as_str().unwrap().to_string();
        let dependencies = package["dependencies"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|dependency| dependency["kind"].is_null())
            .map(|dependency| dependency["name"].as_str().unwrap().to_string())
            .collect();
        graph.insert(name, dependencies);
    }
    graph
}

#[test]
fn dependencies_point_down_the_layers() {
    let graph = workspace_dependencies();
    let ours: BTreeSet<&str> = ALLOWED.iter().map(|(name, _)| *name).collect();
    for (name, allowed) in ALLOWED {
        let Some(dependencies) = graph.get(*name) else {
            panic!("crate {name} is missing from the workspace");
        };
        for dependency in dependencies {
            if ours.contains(dependency.as_str()) || dependency.starts_with("keel-") {
                assert!(
                    allowed.contains(&dependency.as_str()),
                    "{name} must not depend on {dependency}"
                );
            }
        }
    }
}

#[test]
fn confined_crates_stay_confined() {
    let graph = workspace_dependencies();
    for (external, owners) in CONFINED {
        for (name, dependencies) in &graph {
            if dependencies.contains(*external) {
                assert!(
                    owners.contains(&name.as_str()),
                    "{name} must not depend on {external}; only {owners:?} may"
                );
            }
        }
    }
}
