//! What `cluster ranges`, `cluster split`, `cluster status`, `cluster check` and the node
//! commands print: an
//! aligned table whose cells hold no spaces (spans are written `["a","m")`), a line, or
//! JSON. Pure.

use keel_client::RangeInfo;
use keel_proto::v1;
use keel_types::validate::show_key;
use keel_types::{NodeId, RangeDescriptor};
use serde_json::{Value, json};

use super::{Output, Report, align, bytes, json_line, line};

/// `cluster ranges`: one row per range in key order, or a JSON array.
pub fn ranges(ranges: &[RangeInfo], output: Output) -> Report {
    Report::ok(match output {
        Output::Text => {
            let header = [
                "id", "span", "epoch", "replicas", "leader", "size", "keys", "age", "req/s",
            ];
            let mut table: Vec<Vec<String>> = vec![header.map(String::from).to_vec()];
            table.extend(ranges.iter().map(range_cells));
            align(&table).into_bytes()
        }
        Output::Json => json_line(&Value::Array(ranges.iter().map(range_json).collect())),
    })
}

/// `cluster split`: the two halves, as rows of the `ranges` table (without load), or a
/// JSON object `{"left": ..., "right": ...}`.
pub fn split(left: &RangeDescriptor, right: &RangeDescriptor, output: Output) -> Report {
    Report::ok(match output {
        Output::Text => {
            let header = ["id", "span", "epoch", "replicas"];
            let mut table: Vec<Vec<String>> = vec![header.map(String::from).to_vec()];
            table.push(descriptor_cells(left));
            table.push(descriptor_cells(right));
            align(&table).into_bytes()
        }
        Output::Json => json_line(&json!({
            "left": descriptor_json(left),
            "right": descriptor_json(right),
        })),
    })
}

/// The span without spaces, so that a table row splits on whitespace: `["a","m")`,
/// `["m",+inf)`.
pub fn span(descriptor: &RangeDescriptor) -> String {
    let end = descriptor.end().map_or("+inf".to_string(), show_key);
    format!("[{},{end})", show_key(&descriptor.start))
}

fn descriptor_cells(descriptor: &RangeDescriptor) -> Vec<String> {
    let replicas: Vec<String> = descriptor.replicas.iter().map(u64::to_string).collect();
    vec![
        descriptor.id.0.to_string(),
        span(descriptor),
        descriptor.epoch.to_string(),
        if replicas.is_empty() {
            "-".to_string()
        } else {
            replicas.join(",")
        },
    ]
}

fn range_cells(range: &RangeInfo) -> Vec<String> {
    let mut cells = descriptor_cells(&range.descriptor);
    cells.extend([
        range.leader.map_or("-".to_string(), |id| id.to_string()),
        range.size_bytes.to_string(),
        range.keys.to_string(),
        format!("{:.1}s", range.counts_age.as_secs_f64()),
        format!("{:.1}", range.requests_per_sec),
    ]);
    cells
}

fn descriptor_json(descriptor: &RangeDescriptor) -> Value {
    json!({
        "range_id": descriptor.id.0,
        "start": bytes(&descriptor.start),
        "end": descriptor.end().map(bytes),
        "epoch": descriptor.epoch,
        "conf_version": descriptor.conf_version,
        "replicas": descriptor.replicas,
    })
}

fn range_json(range: &RangeInfo) -> Value {
    let mut value = descriptor_json(&range.descriptor);
    value["leader"] = json!(range.leader);
    value["size_bytes"] = json!(range.size_bytes);
    value["keys"] = json!(range.keys);
    value["counts_age_ms"] = json!(range.counts_age.as_millis() as u64);
    value["requests_per_sec"] = json!(range.requests_per_sec);
    value
}

/// `cluster status`: one row per node (state, liveness, replicas, leaders, last heartbeat),
/// a line naming the meta range's leader and the replication factor; or a JSON object.
pub fn members(members: &v1::MembersResponse, output: Output) -> Report {
    Report::ok(match output {
        Output::Text => {
            let header = [
                "node",
                "addr",
                "state",
                "liveness",
                "replicas",
                "leaders",
                "heartbeat",
            ];
            let mut table: Vec<Vec<String>> = vec![header.map(String::from).to_vec()];
            table.extend(members.nodes.iter().map(node_cells));
            let footer = format!(
                "meta leader: node {}; replication factor {}\n",
                members.meta_leader_id, members.replication_factor
            );
            (align(&table) + &footer).into_bytes()
        }
        Output::Json => json_line(&json!({
            "nodes": members.nodes.iter().map(node_json).collect::<Vec<_>>(),
            "meta_leader": members.meta_leader_id,
            "replication_factor": members.replication_factor,
        })),
    })
}

fn node_cells(node: &v1::NodeInfo) -> Vec<String> {
    let heartbeat = node
        .heartbeat_age_ms
        .map_or("-".to_string(), |ms| format!("{:.1}s", ms as f64 / 1000.0));
    vec![
        node.node_id.to_string(),
        if node.addr.is_empty() {
            "-".to_string()
        } else {
            node.addr.clone()
        },
        node.state.clone(),
        node.liveness.clone(),
        node.replicas.to_string(),
        node.leaders.to_string(),
        heartbeat,
    ]
}

fn node_json(node: &v1::NodeInfo) -> Value {
    json!({
        "node_id": node.node_id,
        "addr": node.addr,
        "state": node.state,
        "liveness": node.liveness,
        "replicas": node.replicas,
        "leaders": node.leaders,
        "heartbeat_age_ms": node.heartbeat_age_ms,
    })
}

/// `cluster add-node`: the node added, and the registered nodes (JSON).
pub fn added(node: NodeId, nodes: &[v1::Member], output: Output) -> Report {
    Report::ok(match output {
        Output::Text => {
            line(format!("node {node} added; {} nodes registered", nodes.len()).as_bytes())
        }
        Output::Json => json_line(&json!({
            "added": node,
            "nodes": nodes
                .iter()
                .map(|member| json!({"node_id": member.node_id, "addr": member.addr}))
                .collect::<Vec<_>>(),
        })),
    })
}

/// `cluster remove-node --no-wait`.
pub fn draining(node: NodeId, output: Output) -> Report {
    Report::ok(match output {
        Output::Text => line(format!("node {node} draining").as_bytes()),
        Output::Json => json_line(&json!({ "node_id": node, "state": "draining" })),
    })
}

/// `cluster remove-node` once the node is drained.
pub fn removed(node: NodeId, output: Output) -> Report {
    Report::ok(match output {
        Output::Text => {
            line(format!("node {node} removed; it holds no replica and may be stopped").as_bytes())
        }
        Output::Json => json_line(&json!({ "node_id": node, "state": "removed" })),
    })
}

/// `cluster transfer-leader`.
pub fn transferred(range: u64, node: NodeId, output: Output) -> Report {
    Report::ok(match output {
        Output::Text => line(format!("range {range}: leadership handed to node {node}").as_bytes()),
        Output::Json => json_line(&json!({ "range_id": range, "leader": node })),
    })
}

/// `cluster check`: one row per range (index, verdict, leader, rows hashed, each replica's
/// hash by its first 8 hex digits), then a line per replica that differs or gave no hash;
/// or a JSON array. Exits 1 when a range's replicas disagree, else 3 when a range could not
/// be checked.
pub fn checked(ranges: &[v1::RangeCheck], output: Output) -> Report {
    let stdout = match output {
        Output::Text => {
            let header = ["range", "index", "verdict", "leader", "rows", "replicas"];
            let mut table: Vec<Vec<String>> = vec![header.map(String::from).to_vec()];
            table.extend(ranges.iter().map(check_cells));
            let mut text = align(&table);
            for range in ranges {
                text.push_str(&check_notes(range));
            }
            text.into_bytes()
        }
        Output::Json => json_line(&Value::Array(ranges.iter().map(check_json).collect())),
    };
    let alarms: Vec<String> = ranges
        .iter()
        .filter(|r| r.verdict == "divergent" || r.verdict == "no-majority")
        .map(|r| r.range_id.to_string())
        .collect();
    let failed: Vec<String> = ranges
        .iter()
        .filter(|r| !r.error.is_empty())
        .map(|r| r.range_id.to_string())
        .collect();
    let (code, stderr) = match (alarms.is_empty(), failed.is_empty()) {
        (false, _) => (
            1,
            format!("replicas disagree on range(s) {}", alarms.join(", ")),
        ),
        (true, false) => (3, format!("could not check range(s) {}", failed.join(", "))),
        (true, true) => (0, String::new()),
    };
    Report {
        stdout,
        stderr,
        code,
    }
}

fn short_hash(hash: &[u8]) -> String {
    match hash.is_empty() {
        true => "-".to_string(),
        false => hash.iter().take(4).map(|b| format!("{b:02x}")).collect(),
    }
}

fn check_cells(range: &v1::RangeCheck) -> Vec<String> {
    if !range.error.is_empty() {
        let dash = || "-".to_string();
        return vec![
            range.range_id.to_string(),
            dash(),
            "error".into(),
            dash(),
            dash(),
            dash(),
        ];
    }
    let replicas: Vec<String> = range
        .replicas
        .iter()
        .map(|r| format!("{}={}", r.node_id, short_hash(&r.hash)))
        .collect();
    vec![
        range.range_id.to_string(),
        range.index.to_string(),
        range.verdict.clone(),
        range.leader.to_string(),
        range.rows.to_string(),
        replicas.join(","),
    ]
}

/// The lines under the table for one range: why it could not be checked, and each replica
/// that differs (with its rows) or gave no hash.
fn check_notes(range: &v1::RangeCheck) -> String {
    let id = range.range_id;
    if !range.error.is_empty() {
        return format!("range {id}: not checked: {}\n", range.error);
    }
    let mut notes = String::new();
    for replica in &range.replicas {
        let node = replica.node_id;
        if range.divergent.contains(&node) {
            let rows = match replica.rows.is_empty() {
                true => "rows not located".to_string(),
                false => replica.rows.join(", "),
            };
            let buckets = replica.buckets_differing;
            notes.push_str(&format!(
                "range {id}: node {node} differs from the majority in {buckets} bucket(s): {rows}\n"
            ));
        }
        if !replica.problem.is_empty() {
            notes.push_str(&format!("range {id}: node {node}: {}\n", replica.problem));
        }
    }
    for node in &range.repaired {
        notes.push_str(&format!(
            "range {id}: node {node}'s replica re-created from the majority\n"
        ));
    }
    if !range.repair.is_empty() {
        notes.push_str(&format!("range {id}: repair: {}\n", range.repair));
    }
    notes
}

pub(super) fn check_json(range: &v1::RangeCheck) -> Value {
    let hex = |hash: &[u8]| hash.iter().map(|b| format!("{b:02x}")).collect::<String>();
    let replicas: Vec<Value> = range
        .replicas
        .iter()
        .map(|r| {
            json!({
                "node": r.node_id,
                "hash": hex(&r.hash),
                "problem": r.problem,
                "rows": r.rows,
                "buckets_differing": r.buckets_differing,
            })
        })
        .collect();
    json!({
        "range": range.range_id,
        "index": range.index,
        "verdict": range.verdict,
        "leader": range.leader,
        "rows": range.rows,
        "divergent": range.divergent,
        "replicas": replicas,
        "repaired": range.repaired,
        "repair": range.repair,
        "error": range.error,
    })
}
