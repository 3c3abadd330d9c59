//! Config parsing and validation, as tables.

use std::io::Write;

use super::*;

fn args(node_id: u64, listen: &str, cluster: &str) -> ServeArgs {
    ServeArgs {
        node_id: Some(node_id),
        listen: Some(listen.parse().unwrap()),
        data_dir: Some(PathBuf::from("/tmp/keel")),
        initial_cluster: Some(cluster.to_string()),
        ..ServeArgs::default()
    }
}

/// Parsed nodes, or a fragment of the error message.
type Expected = Result<Vec<(u64, &'static str)>, &'static str>;

#[test]
fn initial_cluster_parses_or_names_the_problem() {
    let cases: Vec<(&str, Expected)> = vec![
        ("1=127.0.0.1:7001", Ok(vec![(1, "127.0.0.1:7001")])),
        (
            " 2=localhost:7002 , 1=127.0.0.1:7001,",
            Ok(vec![(1, "127.0.0.1:7001"), (2, "localhost:7002")]),
        ),
        ("", Err("initial cluster is empty")),
        ("1:127.0.0.1:7001", Err("expected id=host:port")),
        ("x=127.0.0.1:7001", Err("node id is not a number")),
        ("1=127.0.0.1", Err("address is not host:port")),
        ("1=127.0.0.1:99999", Err("address is not host:port")),
        ("1=a:1,1=b:2", Err("node 1 appears twice")),
    ];
    for (text, expected) in cases {
        let parsed = parse_initial_cluster(text);
        match expected {
            Ok(nodes) => {
                let nodes: BTreeMap<u64, String> = nodes
                    .into_iter()
                    .map(|(id, a)| (id, a.to_string()))
                    .collect();
                assert_eq!(parsed, Ok(nodes), "{text:?}");
            }
            Err(message) => {
                let error = parsed.expect_err(text).to_string();
                assert!(error.contains(message), "{text:?}: {error}");
            }
        }
    }
}

#[test]
fn configs_are_validated() {
    let three = "1=127.0.0.1:7001,2=127.0.0.1:7002,3=127.0.0.1:7003";
    let too_many: Vec<String> = (1..=limits::CLUSTER_NODES_MAX as u64 + 1)
        .map(|id| format!("{id}=127.0.0.1:{}", 7000 + id))
        .collect();
    let too_many = too_many.join(",");
    let cases: Vec<(ServeArgs, Option<&str>)> = vec![
        (args(1, "127.0.0.1:7001", three), None),
        (args(2, "0.0.0.0:7002", three), None),
        (args(3, "127.0.0.1:0", three), None),
        (
            args(4, "127.0.0.1:7004", three),
            Some("node id 4 is not in the initial cluster"),
        ),
        (
            args(1, "127.0.0.1:7001", "1=127.0.0.1:7001,2=127.0.0.1:7001"),
            Some("address 127.0.0.1:7001 is given to nodes 1 and 2"),
        ),
        (
            args(1, "127.0.0.1:7001", &too_many),
            Some("limit is 64 nodes"),
        ),
        (args(1, "127.0.0.1:7009", three), Some("does not match")),
        (args(1, "127.0.0.2:7001", three), Some("does not match")),
        (
            ServeArgs {
                heartbeat_ms: Some(5_000),
                ..args(1, "127.0.0.1:7001", three)
            },
            Some("heartbeat_ms"),
        ),
        (
            ServeArgs {
                node_id: None,
                ..args(1, "127.0.0.1:7001", three)
            },
            Some("missing setting node_id"),
        ),
    ];
    for (args, expected) in cases {
        let result = NodeConfig::from_args(&args);
        match expected {
            None => assert!(result.is_ok(), "{args:?}: {result:?}"),
            Some(message) => {
                let error = result.expect_err(message).to_string();
                assert!(error.contains(message), "{error:?} lacks {message:?}");
            }
        }
    }
}

#[test]
fn flags_override_the_config_file() {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    writeln!(
        file,
        "node_id = 2\nlisten = \"127.0.0.1:7002\"\ndata_dir = \"/var/lib/keel\"\n\
         initial_cluster = \"1=127.0.0.1:7001,2=127.0.0.1:7002\"\nheartbeat_ms = 100\n\
         quiesce_after_ms = 0"
    )
    .unwrap();
    let from_file = ServeArgs {
        config: Some(file.path().to_path_buf()),
        ..ServeArgs::default()
    };
    let config = NodeConfig::from_args(&from_file).unwrap();
    assert_eq!(config.node_id, 2);
    assert_eq!(config.raft.heartbeat_ms, 100);
    assert_eq!(config.raft.quiesce_after_ms, 0, "quiescence turned off");
    assert_eq!(
        config.store_path(),
        PathBuf::from("/var/lib/keel/keel.redb")
    );
    assert_eq!(
        config.snapshot_dir(),
        PathBuf::from("/var/lib/keel/snapshots")
    );
    assert_eq!(config.bootstrap_node(), Some(1));

    let overridden = ServeArgs {
        node_id: Some(1),
        listen: Some("127.0.0.1:7001".parse().unwrap()),
        ..from_file
    };
    let config = NodeConfig::from_args(&overridden).unwrap();
    assert_eq!(config.node_id, 1);
    assert_eq!(config.data_dir, PathBuf::from("/var/lib/keel"));

    let mut unknown = tempfile::NamedTempFile::new().unwrap();
    writeln!(unknown, "nodeid = 1").unwrap();
    let error = NodeConfig::from_args(&ServeArgs {
        config: Some(unknown.path().to_path_buf()),
        ..ServeArgs::default()
    })
    .unwrap_err();
    assert!(error.to_string().contains("unknown field"), "{error}");
}
