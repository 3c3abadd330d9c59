//! Argument validation: every limit and every unsupported target/op pair is refused with the
//! flag named.

use std::time::Duration;

use clap::Parser;

use super::*;

fn parse(line: &str) -> Result<Config, String> {
    let args = Args::try_parse_from(std::iter::once("keel-bench").chain(line.split_whitespace()))
        .map_err(|error| error.to_string())?;
    Config::from_args(args).map_err(|error| error.to_string())
}

/// `line` is refused with a message containing `expected`.
fn check_refused(line: &str, expected: &str) {
    let error = parse(line).expect_err(line);
    assert!(
        error.contains(expected),
        "{line}: {error:?} lacks {expected:?}"
    );
}

#[test]
fn defaults_match_the_issue_matrix() {
    let config = parse("").unwrap();
    assert_eq!(config.target, TargetKind::Keel);
    assert_eq!(config.op, Op::Put);
    assert_eq!((config.clients, config.connections), (1, 1));
    assert_eq!((config.value_bytes, config.keyspace), (256, 10_000));
    assert_eq!(config.distribution, Distribution::Uniform);
    assert_eq!(config.duration, Duration::from_secs(10));
    assert_eq!(config.warmup, Duration::from_secs(2));
    assert!(config.preload);
    assert_eq!(config.endpoints.len(), 3);
}

#[test]
fn full_line_is_parsed() {
    let config = parse(
        "--op get-follower --clients 64 --connections 8 --duration 500ms --warmup 0 \
         --value-bytes 1024 --keyspace 100 --zipf 0.99 --endpoints a:1,,b:2 --no-preload",
    )
    .unwrap();
    assert_eq!(config.op, Op::GetFollower);
    assert_eq!((config.clients, config.connections), (64, 8));
    assert_eq!(config.duration, Duration::from_millis(500));
    assert_eq!(config.warmup, Duration::ZERO);
    assert_eq!(config.distribution, Distribution::Zipf { exponent: 0.99 });
    assert_eq!(config.endpoints, vec!["a:1".to_string(), "b:2".to_string()]);
    assert!(!config.preload);
}

#[test]
fn limits_are_named() {
    check_refused("--clients 0", "--clients is 0; it must be 1 to 4096");
    check_refused("--clients 4097", "--clients is 4097");
    check_refused(
        "--clients 4 --connections 5",
        "must not exceed --clients (4)",
    );
    check_refused("--connections 0", "--connections is 0");
    check_refused(
        "--duration 0s",
        "--duration is 0ns; it must be 1ms to 3600s",
    );
    check_refused("--duration 2h", "--duration is 7200s");
    check_refused("--warmup 11m", "--warmup is 660s");
    check_refused("--value-bytes 0", "--value-bytes is 0");
    check_refused(
        "--value-bytes 1048577",
        "--value-bytes is 1048577; it must be 1 to 1048576",
    );
    check_refused("--keyspace 0", "--keyspace is 0");
    check_refused("--keyspace 1000001", "--keyspace is 1000001");
    check_refused("--zipf 0", "--zipf is 0.0; it must be above 0 to 10.0");
    check_refused("--zipf 11", "--zipf is 11.0");
    check_refused("--read-ratio 1.5", "--read-ratio is 1.5");
    check_refused("--endpoints ,", "names no endpoint");
}

#[test]
fn unsupported_pairs_are_refused() {
    assert!(parse("--op lock").is_ok());
    assert!(parse("--op lock-contended").is_ok());
    match cfg!(feature = "etcd") {
        true => {
            check_refused(
                "--target etcd --op get-lease",
                "etcd has no leader-lease reads",
            );
            assert!(parse("--target etcd --op lock").is_ok());
        }
        false => check_refused("--target etcd", "--features etcd"),
    }
}

#[test]
fn route_is_leader_unless_spread_is_asked() {
    assert_eq!(parse("").unwrap().route, Some(Route::Leader));
    assert_eq!(
        parse("--route spread --connections 1").unwrap().route,
        Some(Route::Spread)
    );
    check_refused("--route sideways", "invalid value 'sideways'");
    if cfg!(feature = "etcd") {
        assert_eq!(parse("--target etcd").unwrap().route, None);
        check_refused("--target etcd --route leader", "--route is for keel");
    }
}

#[test]
fn leader_moves_are_keels_and_not_too_frequent() {
    assert_eq!(parse("").unwrap().move_leader_every, None);
    assert_eq!(
        parse("--move-leader-every 3s").unwrap().move_leader_every,
        Some(Duration::from_secs(3))
    );
    check_refused(
        "--move-leader-every 1500ms",
        "--move-leader-every is 1.5s; it must be 2s to",
    );
    if cfg!(feature = "etcd") {
        check_refused(
            "--target etcd --move-leader-every 5s",
            "--move-leader-every is for keel",
        );
    }
}

#[test]
fn etcd_endpoint_default() {
    if cfg!(feature = "etcd") {
        assert_eq!(
            parse("--target etcd").unwrap().endpoints,
            vec!["127.0.0.1:2379"]
        );
    }
}

#[test]
fn durations() {
    let check = |text: &str, expected: Result<u64, &str>| {
        let parsed = parse_duration(text).map(|duration| duration.as_millis() as u64);
        match expected {
            Ok(millis) => assert_eq!(parsed, Ok(millis), "{text}"),
            Err(part) => assert!(parsed.unwrap_err().contains(part), "{text}"),
        }
    };
    check("10s", Ok(10_000));
    check("250ms", Ok(250));
    check("2m", Ok(120_000));
    check("1h", Ok(3_600_000));
    check("7", Ok(7_000));
    check("10x", Err("unknown unit \"x\""));
    check("s", Err("is not a duration"));
    check("-1s", Err("is not a duration"));
    check("99999999999999999999h", Err("is not a duration"));
    check("9999999999999999h", Err("too long"));
}

#[test]
fn a_staleness_bound_is_for_keels_follower_gets_within_keels_limit() {
    let config = parse("--op get-follower --max-staleness 100ms").unwrap();
    assert_eq!(config.max_staleness, Some(Duration::from_millis(100)));
    let config = parse("--op get-follower --max-staleness 0ms").unwrap();
    assert_eq!(config.max_staleness, Some(Duration::ZERO));
    assert_eq!(parse("--op get-follower").unwrap().max_staleness, None);
    let refused = "--max-staleness is for keel's follower gets";
    check_refused("--op get-linearizable --max-staleness 1s", refused);
    if cfg!(feature = "etcd") {
        check_refused(
            "--target etcd --op get-follower --max-staleness 1s",
            refused,
        );
    }
    check_refused(
        "--op get-follower --max-staleness 25h",
        "--max-staleness is 90000s",
    );
}

#[test]
fn watchers_time_puts_whose_values_carry_a_stamp() {
    let config = parse("--watchers 1000 --clients 16 --connections 8").unwrap();
    assert_eq!(config.watchers, 1000);
    assert_eq!(parse("").unwrap().watchers, 0);
    check_refused("--watchers 10001", "--watchers");
    check_refused(
        "--watchers 1 --op get-linearizable",
        "--watchers is for put runs",
    );
    check_refused("--watchers 1 --value-bytes 7", "--value-bytes is 7");
    assert!(
        parse("--value-bytes 7").is_ok(),
        "no stamp without watchers"
    );
}

#[test]
fn server_pids_are_a_bounded_list() {
    assert_eq!(
        parse("--server-pids 11,12,13").unwrap().server_pids,
        vec![11, 12, 13]
    );
    assert!(parse("").unwrap().server_pids.is_empty());
    let many: Vec<String> = (1..=limits::SERVER_PIDS_MAX + 1)
        .map(|pid| pid.to_string())
        .collect();
    check_refused(
        &format!("--server-pids {}", many.join(",")),
        "server-pids count",
    );
    check_refused("--server-pids 1,x", "server-pids");
}
