//! What `cluster ranges` and `cluster split` print: an aligned table whose cells hold no
//! spaces (spans are written `["a","m")`), or JSON. Pure.

use keel_client::RangeInfo;
use keel_types::RangeDescriptor;
use keel_types::validate::show_key;
use serde_json::{Value, json};

use super::{Output, Report, align, bytes, json_line};

/// `cluster ranges`: one row per range in key order, or a JSON array.
pub fn ranges(ranges: &[RangeInfo], output: Output) -> Report {
    Report::ok(match output {
        Output::Text => {
            let header = [
                "id", "span", "epoch", "replicas", "leader", "size", "keys", "req/s",
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
    value["requests_per_sec"] = json!(range.requests_per_sec);
    value
}
