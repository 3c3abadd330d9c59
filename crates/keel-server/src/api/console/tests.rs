use keel_proto::v1::{NodeInfo, RangeDescriptor, RangeInfo};
use keel_types::tenant::{Namespace, TenantName};
use keel_types::{LockHold, RangeId};

use super::facts::HotKeyFact;
use super::*;

fn node(id: NodeId, liveness: &str) -> NodeInfo {
    NodeInfo {
        node_id: id,
        addr: format!("127.0.0.1:700{id}"),
        peer_addr: format!("127.0.0.1:710{id}"),
        state: "active".to_string(),
        liveness: liveness.to_string(),
        heartbeat_age_ms: Some(100),
        replicas: 2,
        leaders: 1,
    }
}

fn range(id: u64, start: &[u8], end: Option<&[u8]>, leader: NodeId) -> RangeInfo {
    RangeInfo {
        descriptor: Some(RangeDescriptor {
            range_id: id,
            start: start.to_vec(),
            end: end.map(<[u8]>::to_vec),
            epoch: 2,
            conf_version: 1,
            replicas: vec![1, 2, 3],
        }),
        leader_id: Some(leader),
        size_bytes: 1_000 * id,
        keys: 10 * id,
        requests_per_sec: 1.5,
        counts_age_ms: 0,
    }
}

fn split(at_ms: u64) -> Event {
    Event {
        at_ms,
        range: RangeId(1),
        what: What::Split {
            epoch: 2,
            at: b"m\xff".to_vec(),
            other: RangeId(2),
        },
    }
}

fn leader(at_ms: u64, term: u64) -> Event {
    Event {
        at_ms,
        range: RangeId(2),
        what: What::Leader { term, leader: 2 },
    }
}

fn lock(range: u64, name: &[u8], token: u64, waiters: &[&str]) -> LockFact {
    LockFact {
        range: RangeId(range),
        name: name.to_vec(),
        holder: Some(LockHold {
            owner: b"worker-1".to_vec(),
            token,
            expires_at_ms: 15_000,
            lock_delay_ms: 0,
        }),
        waiters: waiters.iter().map(|w| w.as_bytes().to_vec()).collect(),
        waiting: waiters.len() as u64,
    }
}

fn view() -> View {
    let acme = Namespace::of(&TenantName::new("acme").unwrap());
    let one = NodeFacts {
        hot_keys: vec![HotKeyFact {
            tenant: None,
            key: b"user:\x007".to_vec(),
            cut: false,
            requests: 40,
        }],
        events: vec![split(1_000), leader(2_000, 3)],
        locks: vec![lock(2, b"job", 7, &["worker-2"])],
        locks_more: false,
    };
    let two = NodeFacts {
        hot_keys: vec![
            HotKeyFact {
                tenant: None,
                key: b"user:\x007".to_vec(),
                cut: false,
                requests: 8,
            },
            HotKeyFact {
                tenant: Some("acme".to_string()),
                key: b"cart".to_vec(),
                cut: true,
                requests: 12,
            },
        ],
        // The same split, seen later; and an older lock report of a former leader.
        events: vec![split(1_500)],
        locks: vec![
            lock(2, b"job", 5, &[]),
            lock(1, &acme.confine(b"batch"), 9, &[]),
        ],
        locks_more: false,
    };
    View {
        node_id: 1,
        now_ms: 10_000,
        members: Ok(MembersResponse {
            nodes: vec![node(1, "live"), node(2, "live"), node(3, "dead")],
            meta_leader_id: 1,
            replication_factor: 3,
        }),
        ranges: Ok(RangesResponse {
            ranges: vec![
                range(1, b"", Some(b"m\xff"), 1),
                range(2, b"m\xff", None, 2),
            ],
            nodes: Vec::new(),
            meta_leader_id: 1,
        }),
        facts: BTreeMap::from([
            (1, Ok(one)),
            (2, Ok(two)),
            (
                3,
                Err(KvError::Timeout {
                    message: "node 3 did not answer within 1s".to_string(),
                }),
            ),
        ]),
    }
}

#[test]
fn the_state_names_nodes_ranges_hot_keys_events_and_locks() {
    let state = render(&view());
    assert_eq!(state["node_id"], 1);
    assert_eq!(state["meta_leader_id"], 1);
    assert_eq!(state["errors"], json!([]));
    let nodes = state["nodes"].as_array().unwrap();
    let answered: Vec<(u64, bool, &str)> = nodes
        .iter()
        .map(|n| {
            let id = n["id"].as_u64().unwrap();
            (
                id,
                n["answered"].as_bool().unwrap(),
                n["liveness"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        answered,
        vec![(1, true, "live"), (2, true, "live"), (3, false, "dead")]
    );
    assert!(
        nodes[2]["facts_error"]
            .as_str()
            .unwrap()
            .contains("did not answer")
    );

    let ranges = state["ranges"].as_array().unwrap();
    assert_eq!(ranges[0]["start"], "\"\"");
    assert_eq!(
        ranges[0]["end"], "\"m\u{fffd}\"",
        "binary keys as the CLI shows them"
    );
    assert_eq!(ranges[1]["end"], Value::Null);
    assert_eq!(ranges[1]["leader"], 2);
    assert_eq!(ranges[1]["replicas"], json!([1, 2, 3]));

    let hot = &state["hot_keys"];
    assert_eq!(hot[0]["key"], "\"user:\\07\"");
    assert_eq!(hot[0]["requests"], 48, "summed over nodes");
    assert_eq!(hot[0]["nodes"], json!([1, 2]));
    assert_eq!(
        (&hot[1]["tenant"], &hot[1]["key"]),
        (&json!("acme"), &json!("\"cart\"…"))
    );

    let events = state["events"].as_array().unwrap();
    let kinds: Vec<(&str, u64)> = events
        .iter()
        .map(|e| (e["kind"].as_str().unwrap(), e["at_ms"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        kinds,
        vec![("leader", 2_000), ("split", 1_000)],
        "newest first, once each"
    );
    assert_eq!(
        events[1]["nodes"],
        json!([1, 2]),
        "the nodes that saw the split"
    );
    assert_eq!(
        events[1]["detail"],
        "split at \"m\u{fffd}\"; range 2 took the other side"
    );

    let locks = state["locks"].as_array().unwrap();
    assert_eq!(locks.len(), 2);
    assert_eq!(
        (&locks[0]["name"], &locks[0]["tenant"]),
        (&json!("\"batch\""), &json!("acme")),
        "a tenant's lock without its prefix"
    );
    let job = &locks[1];
    assert_eq!(job["leader"], 1, "the newer holder's report");
    assert_eq!(job["holder"]["owner"], "\"worker-1\"");
    assert_eq!(job["holder"]["token"], 7);
    assert_eq!(job["holder"]["expires_in_ms"], 5_000);
    assert_eq!(job["waiters"], json!(["\"worker-2\""]));
}

#[test]
fn a_missing_meta_leader_is_an_error_on_the_page_not_a_failure() {
    let mut view = view();
    view.members = Err(KvError::unavailable("no meta leader"));
    view.ranges = Err(KvError::unavailable("no meta leader"));
    let state = render(&view);
    let errors = state["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert_eq!(state["ranges"], json!([]));
    let ids: Vec<u64> = state["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["id"].as_u64().unwrap())
        .collect();
    assert_eq!(ids, vec![1, 2, 3], "the nodes asked still show");
    assert_eq!(state["nodes"][0]["liveness"], "unknown");
}

#[test]
fn names_show_as_the_cli_shows_them() {
    let acme = Namespace::of(&TenantName::new("acme").unwrap());
    let long = format!("\"{}\"...", "a".repeat(64));
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (b"user:7".to_vec(), "\"user:7\""),
        (b"a\"b\\".to_vec(), "\"a\\\"b\\\\\""),
        (b"\x00\n".to_vec(), "\"\\0\\n\""),
        (acme.confine(b"cart:7"), "acme: \"cart:7\""),
        (vec![b'a'; 100], &long),
    ];
    for (stored, expected) in cases {
        assert_eq!(shown(&stored), expected, "{stored:?}");
    }
}

#[test]
fn lists_are_bounded() {
    let mut view = view();
    let many: Vec<Event> = (0..CONSOLE_EVENTS_MAX as u64 + 7)
        .map(|term| leader(term, term))
        .collect();
    let locks: Vec<LockFact> = (0..CONSOLE_LOCKS_MAX + 1)
        .map(|i| lock(3, format!("l{i:04}").as_bytes(), 1, &[]))
        .collect();
    if let Ok(facts) = view.facts.get_mut(&1).unwrap() {
        facts.events = many;
        facts.locks = locks;
    }
    let state = render(&view);
    assert_eq!(
        state["events"].as_array().unwrap().len(),
        CONSOLE_EVENTS_MAX
    );
    assert_eq!(state["locks"].as_array().unwrap().len(), CONSOLE_LOCKS_MAX);
    assert_eq!(state["locks_more"], true);
}

#[test]
fn the_page_is_self_contained_and_read_only() {
    for outside in [
        "http://",
        "https://",
        "//cdn",
        "@import",
        "<form",
        "method=\"post\"",
    ] {
        assert!(!PAGE.contains(outside), "the page names {outside}");
    }
    assert!(PAGE.contains("console/state.json"));
    for id in [
        "nodes",
        "keyspace",
        "ranges",
        "hot-keys",
        "locks",
        "events",
        "refreshed",
        "status",
    ] {
        assert!(PAGE.contains(&format!("id=\"{id}\"")), "no element #{id}");
    }
}
