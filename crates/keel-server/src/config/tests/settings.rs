//! How settings reach `NodeConfig`: flags over the file over the defaults, unknown keys
//! refused, every setting landing in one field, and the help naming the true defaults.

use std::io::Write;

use clap::Args;
use serde::Serialize;

use crate::config::serve_args::Settings;
use crate::config::*;

/// The settings every node needs, without a data dir.
fn node() -> ServeArgs {
    ServeArgs {
        node_id: Some(1),
        listen: Some("127.0.0.1:7001".parse().unwrap()),
        initial_cluster: Some("1=127.0.0.1:7001".to_string()),
        ..ServeArgs::default()
    }
}

/// A settings file holding `text`.
fn file(text: &str) -> tempfile::NamedTempFile {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    writeln!(file, "{text}").unwrap();
    file
}

/// The layered settings of one config: a number of each of two settings structs, a path,
/// an enum and a string.
#[derive(Debug, PartialEq)]
struct Seen {
    replication_factor: u64,
    heartbeat_ms: u64,
    data_dir: PathBuf,
    log_format: LogFormat,
    log_level: String,
}

fn seen(args: &ServeArgs) -> Seen {
    let config = NodeConfig::from_args(args).unwrap();
    Seen {
        replication_factor: config.placement.replication_factor,
        heartbeat_ms: config.raft.heartbeat_ms,
        data_dir: config.data_dir,
        log_format: config.log.format,
        log_level: config.log.level,
    }
}

#[test]
fn flags_win_over_the_file_and_the_file_over_defaults() {
    let settings = file(
        "replication_factor = 5\nheartbeat_ms = 120\ndata_dir = \"/var/lib/keel-file\"\n\
         log_format = \"json\"\nlog_level = \"debug\"",
    );
    let defaults = ServeArgs {
        data_dir: Some(PathBuf::from("/var/lib/keel-flag")),
        ..node()
    };
    assert_eq!(
        seen(&defaults),
        Seen {
            replication_factor: 3,
            heartbeat_ms: 100,
            data_dir: PathBuf::from("/var/lib/keel-flag"),
            log_format: LogFormat::Text,
            log_level: "info".to_string(),
        }
    );
    let from_file = ServeArgs {
        config: Some(settings.path().to_path_buf()),
        ..node()
    };
    let file_over_defaults = Seen {
        replication_factor: 5,
        heartbeat_ms: 120,
        data_dir: PathBuf::from("/var/lib/keel-file"),
        log_format: LogFormat::Json,
        log_level: "debug".to_string(),
    };
    assert_eq!(seen(&from_file), file_over_defaults);
    let flags = ServeArgs {
        replication_factor: Some(7),
        data_dir: Some(PathBuf::from("/var/lib/keel-flag")),
        log_format: Some(LogFormat::Text),
        ..from_file
    };
    assert_eq!(
        seen(&flags),
        Seen {
            replication_factor: 7,
            data_dir: PathBuf::from("/var/lib/keel-flag"),
            log_format: LogFormat::Text,
            ..file_over_defaults
        },
        "a setting given as a flag wins; the others stay the file's"
    );
    let error = NodeConfig::from_args(&node()).unwrap_err();
    assert_eq!(
        error,
        ConfigError::Missing("data_dir", "data-dir"),
        "no default"
    );
}

/// A switch is on when thrown as a flag or set in the file; a switch not thrown leaves the
/// file's value.
#[cfg(feature = "fault-injection")]
#[test]
fn a_switch_not_thrown_leaves_the_file_on() {
    let on = file("fault_lose_unsynced_writes = true");
    let off = file("fault_lose_unsynced_writes = false");
    let args = |file: Option<&tempfile::NamedTempFile>, thrown: bool| ServeArgs {
        config: file.map(|file| file.path().to_path_buf()),
        fault_lose_unsynced_writes: thrown,
        data_dir: Some(PathBuf::from("/tmp/keel")),
        ..node()
    };
    let cases = [
        (None, false, false),
        (None, true, true),
        (Some(&on), false, true),
        (Some(&off), false, false),
        (Some(&off), true, true),
    ];
    for (file, thrown, expected) in cases {
        let config = NodeConfig::from_args(&args(file, thrown)).unwrap();
        let case = (file.is_some(), thrown);
        assert_eq!(config.faults.lose_unsynced_writes, expected, "{case:?}");
    }
}

#[test]
fn a_key_unknown_to_the_file_is_refused_with_the_known_keys() {
    let cases = [
        ("replication_factr = 5", "unknown field `replication_factr`"),
        ("config = \"other.toml\"", "unknown field `config`"),
        (
            "[placement]\nreplication_factor = 5",
            "unknown field `placement`",
        ),
        ("heartbeat_ms = \"fast\"", "invalid type: string \"fast\""),
    ];
    for (text, expected) in cases {
        let settings = file(text);
        let args = ServeArgs {
            config: Some(settings.path().to_path_buf()),
            data_dir: Some(PathBuf::from("/tmp/keel")),
            ..node()
        };
        let error = NodeConfig::from_args(&args).unwrap_err();
        let ConfigError::File { path, message } = &error else {
            panic!("{text:?}: {error:?} is no file error");
        };
        assert_eq!(path, settings.path(), "{text:?}");
        assert!(message.contains(expected), "{text:?}: {message}");
        if expected.starts_with("unknown field") {
            assert!(message.contains("expected one of `node_id`"), "{message}");
        }
    }
}

/// A path flag goes through the same table as the file, which holds text: one that is not
/// UTF-8 is refused (a config file cannot hold one either).
#[cfg(unix)]
#[test]
fn a_path_flag_that_is_not_utf8_is_refused() {
    use std::os::unix::ffi::OsStrExt;
    let args = ServeArgs {
        data_dir: Some(PathBuf::from(std::ffi::OsStr::from_bytes(
            b"/tmp/keel-\xff",
        ))),
        ..node()
    };
    let error = NodeConfig::from_args(&args).unwrap_err();
    assert_eq!(error, ConfigError::PathNotUtf8);
}

/// The fields of `value`, a settings struct, by key.
fn fields(value: impl Serialize) -> Settings {
    match serde_json::to_value(value).unwrap() {
        serde_json::Value::Object(fields) => fields,
        other => panic!("{other} is no table"),
    }
}

/// Each settings struct `from_args` fills by key, with its defaults.
fn homes() -> Vec<(&'static str, Settings)> {
    vec![
        ("PlacementSettings", fields(PlacementSettings::default())),
        ("RaftTimings", fields(RaftTimings::default())),
        ("KvSettings", fields(KvSettings::default())),
        ("LogSettings", fields(LogSettings::default())),
        ("Faults", fields(Faults::default())),
    ]
}

/// The settings `from_args` reads from the merged flags by name, to parse or check them.
const READ_BY_HAND: &[&str] = &[
    "node_id",
    "listen",
    "data_dir",
    "initial_cluster",
    "join",
    "advertise",
    "peer_listen",
    "peer_advertise",
    "metrics_listen",
    "etcd_listen",
    "auth_tokens",
    "tls_cert",
    "tls_key",
    "tls_ca",
    // Read by `node::run`, from the flags alone.
    "planted_bug",
];

/// The `keel serve` flags, as clap knows them (hidden ones too).
fn flags() -> clap::Command {
    ServeArgs::augment_args(clap::Command::new("keel"))
}

#[test]
fn every_setting_fills_one_field_or_is_read_by_hand() {
    let homes = homes();
    let mut checked = 0;
    for arg in flags().get_arguments() {
        let key = arg.get_id().as_str();
        if key == "config" {
            continue;
        }
        let found: Vec<&str> = homes
            .iter()
            .filter(|(_, fields)| fields.contains_key(key))
            .map(|(home, _)| *home)
            .collect();
        let by_hand = READ_BY_HAND.contains(&key);
        assert_eq!(
            found.len() + usize::from(by_hand),
            1,
            "setting {key} must fill exactly one field of a settings struct (named after it) \
             or be read by hand: it fills {found:?}, read by hand: {by_hand}"
        );
        checked += 1;
    }
    assert!(checked >= 25, "only {checked} settings");
}

#[test]
fn help_names_the_defaults_the_settings_structs_hold() {
    let defaults: Settings = homes().into_iter().flat_map(|(_, fields)| fields).collect();
    let mut checked = 0;
    for arg in flags().get_arguments() {
        let key = arg.get_id().as_str();
        let help = arg.get_help().map(ToString::to_string).unwrap_or_default();
        let Some((_, named)) = help.split_once("(default ") else {
            continue;
        };
        let named = named.split([',', ';', ')', ' ']).next().unwrap();
        let held = defaults.get(key).unwrap_or_else(|| {
            panic!("--help of {key} names a default, but {key} fills no settings struct")
        });
        let held = match held {
            serde_json::Value::String(text) => text.clone(),
            value => value.to_string(),
        };
        assert_eq!(named, held, "--help of {key}: {help}");
        checked += 1;
    }
    assert!(checked >= 10, "only {checked} defaults named");
}
