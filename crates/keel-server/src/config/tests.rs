//! Config parsing and validation, as tables.

mod settings;
mod tls;

use std::io::Write;

use super::*;

pub(super) fn args(node_id: u64, listen: &str, cluster: &str) -> ServeArgs {
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

#[test]
fn a_node_starts_a_cluster_or_joins_one_with_an_address_peers_can_dial() {
    let joining = |listen: &str, join: &str, advertise: Option<&str>| ServeArgs {
        node_id: Some(4),
        listen: Some(listen.parse().unwrap()),
        data_dir: Some(PathBuf::from("/tmp/keel")),
        join: Some(join.to_string()),
        advertise: advertise.map(str::to_string),
        ..ServeArgs::default()
    };
    let joined = NodeConfig::from_args(&joining("127.0.0.1:7004", "h1:7001, h2:7002", None));
    let joined = joined.unwrap();
    assert_eq!(joined.join, ["h1:7001", "h2:7002"]);
    assert!(joined.initial_cluster.is_empty());
    assert_eq!(joined.addr().unwrap(), "127.0.0.1:7004");
    assert_eq!(joined.bootstrap_node(), None);
    let advertised = joining("0.0.0.0:7004", "h1:7001", Some("node4:7004"));
    assert_eq!(
        NodeConfig::from_args(&advertised).unwrap().addr().unwrap(),
        "node4:7004"
    );
    let cases: Vec<(ServeArgs, &str)> = vec![
        (
            joining("0.0.0.0:7004", "h1:7001", None),
            "cannot be dialled",
        ),
        (joining("127.0.0.1:7004", "h1", None), "join address \"h1\""),
        (joining("127.0.0.1:7004", " , ", None), "is not host:port"),
        (
            joining("127.0.0.1:7004", "h1:7001", Some("nowhere")),
            "advertised address \"nowhere\"",
        ),
        (
            ServeArgs {
                initial_cluster: Some("1=h1:7001".to_string()),
                ..joining("127.0.0.1:7004", "h1:7001", None)
            },
            "both set",
        ),
        (
            ServeArgs {
                join: None,
                ..joining("127.0.0.1:7004", "h1:7001", None)
            },
            "pass --initial-cluster to start a cluster or --join to join one",
        ),
    ];
    for (args, message) in cases {
        let error = NodeConfig::from_args(&args).expect_err(message).to_string();
        assert!(error.contains(message), "{error:?} lacks {message:?}");
    }
}

#[test]
fn placement_settings_default_and_are_bounded() {
    let three = "1=127.0.0.1:7001,2=127.0.0.1:7002,3=127.0.0.1:7003";
    let base = args(1, "127.0.0.1:7001", three);
    let default = NodeConfig::from_args(&base).unwrap().placement;
    assert_eq!(default, PlacementSettings::default());
    assert_eq!(
        (default.replication_factor, default.node_dead_after_ms),
        (3, 300_000)
    );
    let set = NodeConfig::from_args(&ServeArgs {
        replication_factor: Some(5),
        node_dead_after_ms: Some(1_000),
        rebalance_interval_ms: Some(10),
        ..base.clone()
    })
    .unwrap()
    .placement;
    assert_eq!(
        (
            set.replication_factor,
            set.node_dead_after_ms,
            set.rebalance_interval_ms
        ),
        (5, 1_000, 10)
    );
    let cases = [
        (
            ServeArgs {
                replication_factor: Some(0),
                ..base.clone()
            },
            "replication factor is 0; it must be 1 to 7",
        ),
        (
            ServeArgs {
                replication_factor: Some(8),
                ..base.clone()
            },
            "replication factor is 8",
        ),
        (
            ServeArgs {
                node_dead_after_ms: Some(999),
                ..base.clone()
            },
            "node dead timeout is 999 ms",
        ),
        (
            ServeArgs {
                rebalance_interval_ms: Some(60_001),
                ..base.clone()
            },
            "rebalance interval is 60001 ms",
        ),
    ];
    for (args, message) in cases {
        let error = NodeConfig::from_args(&args).expect_err(message).to_string();
        assert!(error.contains(message), "{error:?} lacks {message:?}");
    }
}

#[test]
fn observability_settings_come_from_flags_over_the_file_and_are_checked() {
    let default = NodeConfig::from_args(&args(1, "127.0.0.1:7001", "1=127.0.0.1:7001")).unwrap();
    assert_eq!(default.metrics_listen, None, "metrics are off by default");
    assert_eq!(default.log, LogSettings::default());
    assert_eq!(default.log.level, "info");

    let mut file = tempfile::NamedTempFile::new().unwrap();
    writeln!(
        file,
        "metrics_listen = \"127.0.0.1:9101\"\nlog_format = \"json\"\nlog_level = \"debug\""
    )
    .unwrap();
    let from_file = ServeArgs {
        config: Some(file.path().to_path_buf()),
        ..args(1, "127.0.0.1:7001", "1=127.0.0.1:7001")
    };
    let config = NodeConfig::from_args(&from_file).unwrap();
    assert_eq!(
        config.metrics_listen,
        Some("127.0.0.1:9101".parse().unwrap())
    );
    assert_eq!(config.log.format, LogFormat::Json);
    assert_eq!(config.log.level, "debug");
    let overridden = NodeConfig::from_args(&ServeArgs {
        log_format: Some(LogFormat::Text),
        log_level: Some("keel_server=debug,warn".to_string()),
        ..from_file
    })
    .unwrap();
    assert_eq!(overridden.log.format, LogFormat::Text);
    assert_eq!(overridden.log.level, "keel_server=debug,warn");

    let cases: Vec<(ServeArgs, &str)> = vec![
        (
            ServeArgs {
                log_level: Some("keel=loud".to_string()),
                ..args(1, "127.0.0.1:7001", "1=127.0.0.1:7001")
            },
            "log level \"keel=loud\" is not a filter",
        ),
        (
            ServeArgs {
                metrics_listen: Some("127.0.0.1:7001".parse().unwrap()),
                ..args(1, "127.0.0.1:7001", "1=127.0.0.1:7001")
            },
            "metrics address 127.0.0.1:7001 is the gRPC listen address",
        ),
        (
            ServeArgs {
                etcd_listen: Some("127.0.0.1:7001".parse().unwrap()),
                ..args(1, "127.0.0.1:7001", "1=127.0.0.1:7001")
            },
            "etcd address 127.0.0.1:7001 is another listen address",
        ),
    ];
    for (args, message) in cases {
        let error = NodeConfig::from_args(&args).unwrap_err().to_string();
        assert!(error.contains(message), "{error:?} lacks {message:?}");
    }
}

/// The `keel serve` flags of a command line (without the program name).
pub(super) fn parse_flags(flags: &[&str]) -> Result<ServeArgs, clap::Error> {
    use clap::Parser;
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        serve: ServeArgs,
    }
    let line = std::iter::once("keel").chain(flags.iter().copied());
    Cli::try_parse_from(line).map(|cli| cli.serve)
}

#[test]
fn observability_flags_parse() {
    let serve = parse_flags(&[
        "--metrics-listen",
        "0.0.0.0:9101",
        "--log-format",
        "json",
        "--log-level",
        "warn",
    ])
    .unwrap();
    assert_eq!(serve.metrics_listen, Some("0.0.0.0:9101".parse().unwrap()));
    assert_eq!(serve.log_format, Some(LogFormat::Json));
    assert_eq!(serve.log_level.as_deref(), Some("warn"));
    assert!(parse_flags(&["--log-format", "xml"]).is_err());
}

#[test]
fn a_peer_port_names_the_peer_address_and_is_checked() {
    let peered = |listen: &str, peer_listen: &str, cluster: &str| ServeArgs {
        peer_listen: Some(peer_listen.parse().unwrap()),
        ..args(1, listen, cluster)
    };
    let config = NodeConfig::from_args(&peered(
        "127.0.0.1:7001",
        "127.0.0.1:7101",
        "1=127.0.0.1:7101,2=127.0.0.1:7102",
    ))
    .unwrap();
    assert_eq!(config.addr().unwrap(), "127.0.0.1:7101");
    assert_eq!(config.client_addr().unwrap(), "127.0.0.1:7001");
    let single = NodeConfig::from_args(&args(1, "127.0.0.1:7001", "1=127.0.0.1:7001")).unwrap();
    assert_eq!(single.addr().unwrap(), single.client_addr().unwrap());
    let joining = ServeArgs {
        node_id: Some(4),
        listen: Some("0.0.0.0:7004".parse().unwrap()),
        peer_listen: Some("0.0.0.0:7104".parse().unwrap()),
        advertise: Some("node4:7004".to_string()),
        peer_advertise: Some("node4-peers:7104".to_string()),
        data_dir: Some(PathBuf::from("/tmp/keel")),
        join: Some("h1:7101".to_string()),
        ..ServeArgs::default()
    };
    let joined = NodeConfig::from_args(&joining).unwrap();
    assert_eq!(joined.addr().unwrap(), "node4-peers:7104");
    assert_eq!(joined.client_addr().unwrap(), "node4:7004");
    let cases: Vec<(ServeArgs, &str)> = vec![
        (
            peered("127.0.0.1:7001", "127.0.0.1:7001", "1=127.0.0.1:7001"),
            "peer listen address 127.0.0.1:7001 is the client listen address",
        ),
        (
            peered("127.0.0.1:7001", "127.0.0.1:7101", "1=127.0.0.1:7001"),
            "peer listen address 127.0.0.1:7101 does not match this node's cluster address 127.0.0.1:7001",
        ),
        (
            peered("0.0.0.0:7001", "127.0.0.1:7101", "1=127.0.0.1:7101"),
            "advertised address \"0.0.0.0:7001\" cannot be dialled",
        ),
        (
            ServeArgs {
                peer_advertise: Some("nowhere".to_string()),
                ..joining.clone()
            },
            "advertised peer address \"nowhere\"",
        ),
        (
            ServeArgs {
                peer_listen: None,
                ..joining.clone()
            },
            "peer_advertise (--peer-advertise) needs peer_listen",
        ),
    ];
    for (args, expected) in cases {
        let error = NodeConfig::from_args(&args)
            .expect_err(expected)
            .to_string();
        assert!(error.contains(expected), "{error:?} lacks {expected:?}");
    }
}

#[test]
fn the_peer_port_comes_from_the_file_or_the_flags() {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    writeln!(
        file,
        "node_id = 1\nlisten = \"127.0.0.1:7001\"\npeer_listen = \"127.0.0.1:7101\"\n\
         data_dir = \"/tmp/keel\"\ninitial_cluster = \"1=127.0.0.1:7101\""
    )
    .unwrap();
    let from_file = ServeArgs {
        config: Some(file.path().to_path_buf()),
        ..ServeArgs::default()
    };
    let config = NodeConfig::from_args(&from_file).unwrap();
    assert_eq!(config.peer_listen, Some("127.0.0.1:7101".parse().unwrap()));
    assert_eq!(config.addr().unwrap(), "127.0.0.1:7101");

    use clap::Parser;
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        serve: ServeArgs,
    }
    let cli = Cli::try_parse_from(["keel", "--peer-listen", "127.0.0.1:7102"]).unwrap();
    assert_eq!(
        cli.serve.peer_listen,
        Some("127.0.0.1:7102".parse().unwrap())
    );
    let orphan = Cli::try_parse_from(["keel", "--peer-advertise", "h:7102"]);
    assert!(orphan.is_err(), "--peer-advertise needs --peer-listen");
}
