//! Table tests of what the commands print and how they exit.

use std::time::Duration;

use super::*;
use keel_client::RangeInfo;
use keel_types::{RangeDescriptor, RangeId};

fn kv(key: &[u8], value: &[u8]) -> KeyValue {
    KeyValue {
        key: key.to_vec(),
        value: value.to_vec(),
        create_revision: 3,
        mod_revision: 7,
        version: 2,
        expires_at_ms: None,
        lease: 0,
    }
}

fn text(report: &Report) -> String {
    String::from_utf8(report.stdout.clone()).unwrap()
}

/// Parsed JSON, so tests do not depend on key order.
fn parsed(text: &str) -> Value {
    serde_json::from_str(text).unwrap()
}

#[test]
fn exit_codes_follow_the_table() {
    let failed = KvError::from(ConditionFailed {
        op_index: 0,
        key: b"k".to_vec(),
        current: None,
        revision: 1,
    });
    let cases = [
        (failed, 1),
        (KvError::invalid("key is empty"), 2),
        (KvError::unavailable("no quorum"), 3),
        (
            KvError::Timeout {
                message: "t".into(),
            },
            3,
        ),
        (
            KvError::OutcomeUnknown {
                message: "u".into(),
            },
            3,
        ),
        (KvError::fatal("disk"), 3),
        (
            KvError::NotLeader {
                range_id: RangeId(1),
                leader: None,
            },
            3,
        ),
        (KvError::NotACounter { key: b"n".to_vec() }, 1),
        (
            KvError::Overflow {
                key: b"n".to_vec(),
                current: i64::MAX,
                delta: 1,
            },
            1,
        ),
        (
            KvError::RequestIdExpired {
                client_id: 1,
                sequence: 2,
            },
            3,
        ),
        (
            KvError::Overloaded {
                message: "sessions".into(),
            },
            3,
        ),
        (
            KvError::FencedOut {
                key: b"k".to_vec(),
                lock: b"jobs".to_vec(),
                current_token: 7,
            },
            1,
        ),
        (
            KvError::LockNotHeld {
                name: b"jobs".to_vec(),
                token: 5,
                current_token: Some(7),
            },
            1,
        ),
        (
            KvError::RecordNotOwned {
                scope: b"pay".to_vec(),
                id: b"o-1".to_vec(),
                token: 5,
                current_token: None,
            },
            1,
        ),
        // A split refused because the range changed meanwhile.
        (
            KvError::EpochMismatch {
                expected_epoch: 2,
                range: Box::new(descriptor(3, b"m", None, 3)),
            },
            1,
        ),
        // Retried by the client through a refreshed table; seen only when that ran out.
        (
            KvError::KeyOutOfRange {
                key: b"q".to_vec(),
                range: Box::new(descriptor(1, b"", Some(b"m"), 3)),
            },
            3,
        ),
    ];
    for (error, expected) in cases {
        assert_eq!(exit_code(&error), expected, "{error:?}");
        assert_eq!(super::error(&error, Output::Text).code, expected);
    }
}

#[test]
fn lock_errors_read_as_the_docs_show_them() {
    let fenced = KvError::FencedOut {
        key: b"report".to_vec(),
        lock: b"jobs".to_vec(),
        current_token: 7,
    };
    let not_held = KvError::LockNotHeld {
        name: b"jobs".to_vec(),
        token: 5,
        current_token: Some(7),
    };
    let cases = [
        (
            fenced,
            "error: fenced out: key \"report\" accepts lock \"jobs\" token 7 or higher",
        ),
        (
            not_held,
            "error: lock \"jobs\" is not held with token 5 (current token is 7)",
        ),
    ];
    for (error, line) in cases {
        let report = super::error(&error, Output::Text);
        assert_eq!((report.stderr.as_str(), report.code), (line, 1));
        assert!(report.stdout.is_empty());
    }
}

#[test]
fn get_prints_the_value_alone_or_json() {
    let found = GetResult {
        kv: Some(kv(b"hello", b"world")),
        ttl_remaining: None,
        revision: 9,
        served_by: 2,
    };
    let absent = GetResult {
        kv: None,
        ttl_remaining: None,
        revision: 9,
        served_by: 2,
    };
    let (line, exact) = (ValueForm::Line, ValueForm::Exact);
    let cases = [
        (&found, Output::Text, line, "world\n", "", 0),
        (&found, Output::Text, exact, "world", "", 0),
        (
            &absent,
            Output::Text,
            line,
            "",
            "key \"hello\" not found",
            1,
        ),
        (
            &absent,
            Output::Text,
            exact,
            "",
            "key \"hello\" not found",
            1,
        ),
        (
            &found,
            Output::Json,
            line,
            r#"{"create_revision":3,"found":true,"key":"hello","mod_revision":7,"revision":9,"served_by":2,"value":"world","version":2,"ttl_remaining_ms":null}"#,
            "",
            0,
        ),
        (
            &absent,
            Output::Json,
            line,
            r#"{"found":false,"key":"hello","revision":9,"served_by":2}"#,
            "key \"hello\" not found",
            1,
        ),
    ];
    for (result, output, form, stdout, stderr, code) in cases {
        let report = get(b"hello", result, output, form);
        match output {
            Output::Text => assert_eq!(text(&report), stdout),
            Output::Json => assert_eq!(parsed(&text(&report)), parsed(stdout)),
        }
        assert_eq!((report.stderr.as_str(), report.code), (stderr, code));
    }
}

#[test]
fn get_shows_the_remaining_ttl_on_stderr_or_in_json() {
    let result = GetResult {
        kv: Some(kv(b"k", b"v")),
        ttl_remaining: Some(Duration::from_millis(90_500)),
        revision: 1,
        served_by: 1,
    };
    for (form, stdout) in [(ValueForm::Line, "v\n"), (ValueForm::Exact, "v")] {
        let report = get(b"k", &result, Output::Text, form);
        assert_eq!(text(&report), stdout, "stdout stays the value alone");
        assert_eq!(report.stderr, "key \"k\" expires in 1m30s");
        assert_eq!(report.code, 0);
    }
    let report = get(b"k", &result, Output::Json, ValueForm::Line);
    assert_eq!(parsed(&text(&report))["ttl_remaining_ms"], 90_500);
    assert!(report.stderr.is_empty());
}

#[test]
fn get_keeps_raw_bytes_in_text_and_hex_in_json() {
    let result = GetResult {
        kv: Some(kv(b"k", &[0xff, 0x00])),
        ttl_remaining: None,
        revision: 1,
        served_by: 1,
    };
    assert_eq!(
        get(b"k", &result, Output::Text, ValueForm::Line).stdout,
        vec![0xff, 0x00, b'\n']
    );
    assert_eq!(
        get(b"k", &result, Output::Text, ValueForm::Exact).stdout,
        vec![0xff, 0x00]
    );
    let json = parsed(&text(&get(b"k", &result, Output::Json, ValueForm::Exact)));
    assert_eq!(json["value"], parsed(r#"{"hex":"ff00"}"#));
}

#[test]
fn get_is_exact_with_raw_or_when_stdout_is_not_a_terminal() {
    let cases = [
        (false, true, ValueForm::Line),
        (true, true, ValueForm::Exact),
        (false, false, ValueForm::Exact),
        (true, false, ValueForm::Exact),
    ];
    for (raw, stdout_is_terminal, expected) in cases {
        let form = value_form(raw, stdout_is_terminal);
        assert_eq!(form, expected, "raw {raw}, terminal {stdout_is_terminal}");
    }
}

#[test]
fn writes_print_their_revision() {
    let put_result = PutResult {
        revision: 12,
        previous: None,
        replayed: false,
    };
    let deleted = DeleteResult {
        revision: 13,
        deleted: true,
        previous: None,
        replayed: false,
    };
    let incremented = IncrementResult {
        value: -4,
        revision: 14,
        replayed: true,
    };
    let absent = DeleteResult {
        deleted: false,
        ..deleted.clone()
    };
    let cases = [
        (put(&put_result, Output::Text), "OK (revision 12)\n"),
        (
            put(&put_result, Output::Json),
            "{\"revision\":12,\"succeeded\":true}\n",
        ),
        (
            delete(b"k", &deleted, Output::Text),
            "deleted (revision 13)\n",
        ),
        (
            delete(b"k", &absent, Output::Text),
            "key \"k\" was absent\n",
        ),
        (
            delete(b"k", &absent, Output::Json),
            "{\"deleted\":false,\"revision\":13}\n",
        ),
        (increment(b"n", &incremented, Output::Text), "-4\n"),
        (
            increment(b"n", &incremented, Output::Json),
            "{\"key\":\"n\",\"value\":-4,\"revision\":14}\n",
        ),
    ];
    for (report, expected) in cases {
        match expected.starts_with('{') {
            true => assert_eq!(parsed(&text(&report)), parsed(expected)),
            false => assert_eq!(text(&report), expected),
        }
        assert_eq!(report.code, 0);
    }
}

#[test]
fn failed_condition_names_the_current_state() {
    let present = KvError::from(ConditionFailed {
        op_index: 0,
        key: b"k".to_vec(),
        current: Some(kv(b"k", b"v1")),
        revision: 8,
    });
    let absent = KvError::from(ConditionFailed {
        op_index: 0,
        key: b"k".to_vec(),
        current: None,
        revision: 8,
    });
    let report = error(&present, Output::Text);
    assert_eq!(
        report.stderr,
        "condition failed: key \"k\" has value \"v1\" at revision 7"
    );
    assert!(report.stdout.is_empty());
    let report = error(&absent, Output::Text);
    assert_eq!(
        report.stderr,
        "condition failed: key \"k\" is absent (range revision 8)"
    );
    let report = error(&present, Output::Json);
    let json = parsed(&text(&report));
    assert_eq!(json["succeeded"], false);
    assert_eq!(json["current"]["value"], "v1");
    assert_eq!(report.code, 1);
}

#[test]
fn scan_rows_are_tab_separated_or_json_lines() {
    let kvs = [kv(b"a", b"1"), kv(b"b", b"2")];
    assert_eq!(scan_rows(&kvs, Output::Text), b"a\t1\nb\t2\n");
    let json = String::from_utf8(scan_rows(&kvs, Output::Json)).unwrap();
    assert_eq!(json.lines().count(), 2);
    let first = json.lines().next().unwrap();
    let expected = r#"{"create_revision":3,"key":"a","mod_revision":7,"value":"1","version":2}"#;
    assert_eq!(parsed(first), parsed(expected));
}

fn node_status(node_id: u64, leader: Option<u64>) -> v1::StatusResponse {
    v1::StatusResponse {
        node_id,
        addr: format!("127.0.0.1:700{node_id}"),
        healthy: true,
        message: String::new(),
        ranges: vec![v1::RangeStatus {
            range_id: 1,
            leader_id: leader,
            term: 2,
            commit_index: 10,
            applied_index: 9,
            last_log_index: 10,
            revision: 5,
            role: if leader == Some(node_id) {
                "leader"
            } else {
                "follower"
            }
            .to_string(),
            members: vec![],
            ..Default::default()
        }],
        version: "0.1.0".to_string(),
        peer_addr: format!("127.0.0.1:710{node_id}"),
        consistency_alarms: Vec::new(),
        ready: true,
        ready_message: String::new(),
    }
}

#[test]
fn cluster_status_is_a_table_with_unreachable_rows() {
    let rows: Vec<StatusRow> = vec![
        ("127.0.0.1:7001".into(), Ok(node_status(1, Some(1)))),
        (
            "127.0.0.1:7002".into(),
            Err(KvError::unavailable("refused")),
        ),
    ];
    let report = status(&rows, Output::Text);
    let table = text(&report);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 4);
    assert!(
        lines[0].starts_with("node  addr            healthy      ready"),
        "{table}"
    );
    let cells: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(
        cells,
        [
            "1",
            "127.0.0.1:7001",
            "yes",
            "yes",
            "leader",
            "1",
            "2",
            "10",
            "9",
            "5"
        ]
    );
    assert!(
        lines[2].starts_with("?     127.0.0.1:7002  unreachable  -"),
        "{table}"
    );
    assert_eq!(lines[3], "127.0.0.1:7002: unavailable: refused");
    assert_eq!(report.code, 0);

    let json = parsed(&text(&status(&rows, Output::Json)));
    assert_eq!(json[0]["endpoint"], "127.0.0.1:7001");
    assert_eq!(json[0]["ranges"][0]["leader"], 1);
    assert_eq!(
        json[1],
        parsed(r#"{"endpoint":"127.0.0.1:7002","error":"unavailable: refused"}"#)
    );
}

#[test]
fn cluster_status_says_why_a_node_is_not_ready() {
    let mut waiting = node_status(2, Some(1));
    waiting.ready = false;
    waiting.ready_message = "range r1 has no leader".to_string();
    let rows: Vec<StatusRow> = vec![("127.0.0.1:7002".into(), Ok(waiting))];
    let report = status(&rows, Output::Text);
    let table = text(&report);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines[1].split_whitespace().nth(3), Some("no"), "{table}");
    assert_eq!(
        lines[2],
        "127.0.0.1:7002: not ready: range r1 has no leader"
    );
    let json = parsed(&text(&status(&rows, Output::Json)));
    assert_eq!(json[0]["ready"], false);
    assert_eq!(json[0]["ready_message"], "range r1 has no leader");

    // A node of a release before `ready` sends neither field.
    let mut older = node_status(3, Some(1));
    older.ready = false;
    let rows: Vec<StatusRow> = vec![("127.0.0.1:7003".into(), Ok(older))];
    let table = text(&status(&rows, Output::Text));
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 2, "no reason line: {table}");
    assert_eq!(lines[1].split_whitespace().nth(3), Some("?"), "{table}");
}

#[test]
fn cluster_status_fails_when_nobody_answers() {
    let rows: Vec<StatusRow> = vec![("a:1".into(), Err(KvError::unavailable("refused")))];
    let report = status(&rows, Output::Text);
    assert_eq!(report.code, 3);
    assert_eq!(report.stderr, "error: no endpoint answered");
}

fn descriptor(id: u64, start: &[u8], end: Option<&[u8]>, epoch: u64) -> RangeDescriptor {
    RangeDescriptor {
        id: RangeId(id),
        start: start.to_vec(),
        end: end.map(<[u8]>::to_vec),
        epoch,
        conf_version: 1,
        replicas: vec![1, 2, 3],
    }
}

fn range_info(descriptor: RangeDescriptor, leader: Option<u64>, keys: u64) -> RangeInfo {
    RangeInfo {
        descriptor,
        leader,
        size_bytes: keys * 10,
        keys,
        requests_per_sec: 2.5,
        counts_age: std::time::Duration::from_millis(keys * 100),
    }
}

#[test]
fn cluster_ranges_is_a_table_whose_rows_split_on_whitespace() {
    let ranges = [
        range_info(descriptor(1, b"", Some(b"k0100"), 3), Some(1), 100),
        range_info(descriptor(7, b"k0100", Some(b"\xff\x00"), 3), None, 0),
        range_info(descriptor(4, b"\xff\x00", None, 2), Some(3), 7),
    ];
    let report = cluster::ranges(&ranges, Output::Text);
    assert_eq!(report.code, 0);
    let table = text(&report);
    let rows: Vec<Vec<&str>> = table
        .lines()
        .map(|line| line.split_whitespace().collect())
        .collect();
    // Keys that are not UTF-8 are shown lossily, quoted, as in error messages.
    let binary = keel_types::validate::show_key(b"\xff\x00");
    let (middle, last) = (format!(r#"["k0100",{binary})"#), format!("[{binary},+inf)"));
    let expected: Vec<Vec<&str>> = vec![
        vec![
            "id", "span", "epoch", "replicas", "leader", "size", "keys", "age", "req/s",
        ],
        vec![
            "1",
            r#"["","k0100")"#,
            "3",
            "1,2,3",
            "1",
            "1000",
            "100",
            "10.0s",
            "2.5",
        ],
        vec!["7", &middle, "3", "1,2,3", "-", "0", "0", "0.0s", "2.5"],
        vec!["4", &last, "2", "1,2,3", "3", "70", "7", "0.7s", "2.5"],
    ];
    assert_eq!(rows, expected, "{table}");
    // Columns are aligned: every row's span starts where the header's does.
    let at = table.lines().next().unwrap().find("span").unwrap();
    assert!(
        table
            .lines()
            .skip(1)
            .all(|line| line[at..].starts_with('[')),
        "{table}"
    );
}

#[test]
fn cluster_ranges_in_json_has_raw_bytes_and_numbers() {
    let ranges = [
        range_info(descriptor(1, b"", Some(b"m"), 3), Some(1), 4),
        range_info(descriptor(2, b"m", None, 3), None, 0),
    ];
    let json = parsed(&text(&cluster::ranges(&ranges, Output::Json)));
    let expected = parsed(
        r#"[{"range_id":1,"start":"","end":"m","epoch":3,"conf_version":1,"replicas":[1,2,3],
            "leader":1,"size_bytes":40,"keys":4,"counts_age_ms":400,"requests_per_sec":2.5},
           {"range_id":2,"start":"m","end":null,"epoch":3,"conf_version":1,"replicas":[1,2,3],
            "leader":null,"size_bytes":0,"keys":0,"counts_age_ms":0,"requests_per_sec":2.5}]"#,
    );
    assert_eq!(json, expected);
}

#[test]
fn cluster_split_prints_both_halves() {
    let left = descriptor(1, b"", Some(b"m"), 4);
    let right = descriptor(9, b"m", None, 4);
    let report = cluster::split(&left, &right, Output::Text);
    assert_eq!(
        text(&report),
        concat!(
            "id  span        epoch  replicas\n",
            "1   [\"\",\"m\")    4      1,2,3\n",
            "9   [\"m\",+inf)  4      1,2,3\n",
        )
    );
    let json = parsed(&text(&cluster::split(&left, &right, Output::Json)));
    assert_eq!(json["left"]["end"], "m");
    assert_eq!(json["right"]["range_id"], 9);
    assert_eq!(json["right"]["end"], Value::Null);
}

#[test]
fn history_prints_one_line_per_event() {
    let put = Event {
        revision: 7,
        key: b"k".to_vec(),
        after: Some(KeyValue {
            version: 3,
            expires_at_ms: Some(9_000),
            ..kv(b"k", b"v2")
        }),
        before: Some(kv(b"k", b"v1")),
        clock_ms: 5_000,
        kind: EventKind::Key,
    };
    let removed = Event {
        revision: 9,
        after: None,
        before: put.after.clone(),
        clock_ms: 9_000,
        ..put.clone()
    };
    let events = [put, removed];
    let lines = String::from_utf8(history_rows(&events, Output::Text)).unwrap();
    assert_eq!(lines, "7\tput\tv2\n9\tdelete\n");
    let watched = String::from_utf8(watch_rows(&events, Output::Text, false)).unwrap();
    assert_eq!(watched, "7\tput\tk\tv2\n9\tdelete\tk\n");
    // With the values before: one more field where the key had one.
    let watched = String::from_utf8(watch_rows(&events, Output::Text, true)).unwrap();
    assert_eq!(watched, "7\tput\tk\tv2\tv1\n9\tdelete\tk\tv2\n");
    assert_eq!(
        watch_rows(&events, Output::Json, true),
        history_rows(&events, Output::Json)
    );
    let json = String::from_utf8(history_rows(&events, Output::Json)).unwrap();
    let rows: Vec<Value> = json.lines().map(parsed).collect();
    assert_eq!(
        rows[0],
        json!({
            "revision": 7, "key": "k", "kind": "put", "clock_ms": 5_000,
            "kv": {"key": "k", "value": "v2", "create_revision": 3, "mod_revision": 7,
                   "version": 3, "expires_at_ms": 9_000},
            "prev": {"key": "k", "value": "v1", "create_revision": 3, "mod_revision": 7,
                     "version": 2, "expires_at_ms": null},
        })
    );
    assert_eq!(
        (&rows[1]["kind"], &rows[1]["kv"]),
        (&json!("delete"), &Value::Null)
    );
    assert_eq!(rows[1]["prev"]["expires_at_ms"], json!(9_000));
}

#[test]
fn watch_prints_reclaims_with_their_token() {
    let reclaimed = |key: &[u8], kind| Event {
        revision: 12,
        key: key.to_vec(),
        after: None,
        before: None,
        clock_ms: 8_000,
        kind,
    };
    let events = [
        reclaimed(b"leader", EventKind::LockReclaimed { token: 4 }),
        reclaimed(b"pay\0order-1", EventKind::RecordReclaimed { token: 9 }),
    ];
    let lines = String::from_utf8(watch_rows(&events, Output::Text, true)).unwrap();
    assert_eq!(
        lines,
        "12\tlock-reclaimed\tleader\t4\n12\trecord-reclaimed\tpay\torder-1\t9\n"
    );
    let json = String::from_utf8(watch_rows(&events, Output::Json, false)).unwrap();
    let rows: Vec<Value> = json.lines().map(parsed).collect();
    assert_eq!(
        rows[0],
        json!({"revision": 12, "key": "leader", "kind": "lock-reclaimed", "token": 4,
               "clock_ms": 8_000})
    );
    assert_eq!(
        (
            &rows[1]["kind"],
            &rows[1]["scope"],
            &rows[1]["id"],
            &rows[1]["token"]
        ),
        (
            &json!("record-reclaimed"),
            &json!("pay"),
            &json!("order-1"),
            &json!(9)
        )
    );
}

fn range_check(range_id: u64, verdict: &str, divergent: Vec<u64>) -> v1::RangeCheck {
    let replica = |node_id: u64| v1::ReplicaCheck {
        node_id,
        hash: if divergent.contains(&node_id) {
            vec![0xee; 32]
        } else {
            vec![0xab; 32]
        },
        rows: if divergent.contains(&node_id) {
            vec![r#"key "k017""#.to_string()]
        } else {
            vec![]
        },
        buckets_differing: u32::from(divergent.contains(&node_id)),
        ..Default::default()
    };
    v1::RangeCheck {
        range_id,
        index: 62,
        verdict: verdict.to_string(),
        replicas: (1..=3).map(replica).collect(),
        divergent,
        leader: 1,
        rows: 60,
        ..Default::default()
    }
}

#[test]
fn a_check_shows_hashes_verdicts_and_differing_rows() {
    let mut divergent = range_check(1, "divergent", vec![3]);
    divergent.repaired = vec![3];
    divergent.repair = "checked again at index 64: consistent".to_string();
    let ranges = [range_check(0, "consistent", vec![]), divergent];
    let report = cluster::checked(&ranges, Output::Text);
    let text = String::from_utf8(report.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[1].split_whitespace().collect::<Vec<_>>(),
        [
            "0",
            "62",
            "consistent",
            "1",
            "60",
            "1=abababab,2=abababab,3=abababab"
        ]
    );
    assert_eq!(lines[2].split_whitespace().nth(2), Some("divergent"));
    assert_eq!(
        lines[3],
        r#"range 1: node 3 differs from the majority in 1 bucket(s): key "k017""#
    );
    assert_eq!(
        lines[4],
        "range 1: node 3's replica re-created from the majority"
    );
    assert_eq!(
        lines[5],
        "range 1: repair: checked again at index 64: consistent"
    );
    assert_eq!(report.code, 1);
    assert_eq!(report.stderr, "replicas disagree on range(s) 1");
    let json = String::from_utf8(cluster::checked(&ranges, Output::Json).stdout).unwrap();
    let parsed: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(parsed[1]["divergent"], serde_json::json!([3]));
    assert_eq!(parsed[1]["replicas"][2]["hash"], "ee".repeat(32));
    assert_eq!(parsed[1]["repaired"], serde_json::json!([3]));
}

#[test]
fn a_range_not_checked_exits_3_and_says_why() {
    let failed = v1::RangeCheck {
        range_id: 4,
        error: "no leader".to_string(),
        ..Default::default()
    };
    let ranges = [range_check(1, "consistent", vec![]), failed];
    let report = cluster::checked(&ranges, Output::Text);
    let text = String::from_utf8(report.stdout).unwrap();
    assert!(text.contains("range 4: not checked: no leader"), "{text}");
    assert_eq!(
        (report.code, report.stderr.as_str()),
        (3, "could not check range(s) 4")
    );
    let clean = cluster::checked(&ranges[..1], Output::Text);
    assert_eq!((clean.code, clean.stderr.as_str()), (0, ""));
}
