//! What `keel backup` and `keel restore` print: the progress line shown on a terminal while
//! they run, and the final line (or JSON object). Pure.

use keel_types::RangeDescriptor;
use keel_types::limits::human_bytes;
use serde_json::{Value, json};

use super::{Output, Report, json_line, line};

/// The progress of a backup or restore: `ranges 3/10, 12.5 MiB` (of a known total, when
/// there is one: `12.5 MiB of 40 MiB`).
pub fn progress(done: usize, total: usize, bytes: u64, bytes_total: Option<u64>) -> String {
    let bytes_text = human_bytes(bytes as usize);
    match bytes_total {
        Some(total_bytes) => format!(
            "ranges {done}/{total}, {bytes_text} of {}",
            human_bytes(total_bytes as usize)
        ),
        None => format!("ranges {done}/{total}, {bytes_text}"),
    }
}

/// What a finished backup holds, for its report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackedUp {
    pub file: String,
    /// Each range with its revision, in file order.
    pub ranges: Vec<(RangeDescriptor, u64)>,
    pub snapshot_bytes: u64,
    pub file_bytes: u64,
}

/// `keel backup`: one line, or a JSON object with every range and its revision.
pub fn backed_up(backup: &BackedUp, output: Output) -> Report {
    Report::ok(match output {
        Output::Text => line(
            format!(
                "backed up {} ranges ({} of snapshots) to {}",
                backup.ranges.len(),
                human_bytes(backup.snapshot_bytes as usize),
                backup.file
            )
            .as_bytes(),
        ),
        Output::Json => json_line(&json!({
            "file": backup.file,
            "file_bytes": backup.file_bytes,
            "snapshot_bytes": backup.snapshot_bytes,
            "ranges": ranges_json(&backup.ranges),
        })),
    })
}

/// `keel restore`: what was restored and how to start the new cluster.
pub fn restored(
    dir: &str,
    ranges: &[(RangeDescriptor, u64)],
    snapshot_bytes: u64,
    serve: &str,
    output: Output,
) -> Report {
    Report::ok(match output {
        Output::Text => line(
            format!(
                "restored {} ranges ({}) into {dir}; start its node with `{serve}` and the other \
                 nodes, empty, with the same --initial-cluster",
                ranges.len(),
                human_bytes(snapshot_bytes as usize)
            )
            .as_bytes(),
        ),
        Output::Json => json_line(&json!({
            "data_dir": dir,
            "snapshot_bytes": snapshot_bytes,
            "ranges": ranges_json(ranges),
            "serve": serve,
        })),
    })
}

fn ranges_json(ranges: &[(RangeDescriptor, u64)]) -> Value {
    Value::Array(
        ranges
            .iter()
            .map(|(range, revision)| {
                json!({
                    "id": range.id.0,
                    "span": super::cluster::span(range),
                    "epoch": range.epoch,
                    "revision": revision,
                })
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use keel_types::RangeId;

    use super::*;

    fn range(id: u64, start: &str, end: Option<&str>) -> RangeDescriptor {
        RangeDescriptor {
            id: RangeId(id),
            start: start.as_bytes().to_vec(),
            end: end.map(|end| end.as_bytes().to_vec()),
            epoch: 1,
            conf_version: 1,
            replicas: vec![1],
        }
    }

    #[test]
    fn progress_names_ranges_and_bytes() {
        assert_eq!(progress(3, 10, 2048, None), "ranges 3/10, 2 KiB");
        assert_eq!(
            progress(1, 2, 1024 * 1024, Some(4 * 1024 * 1024)),
            "ranges 1/2, 1 MiB of 4 MiB"
        );
    }

    #[test]
    fn reports_are_one_line_or_json() {
        let backup = BackedUp {
            file: "b.keel".to_string(),
            ranges: vec![(range(1, "", Some("m")), 7), (range(2, "m", None), 9)],
            snapshot_bytes: 4096,
            file_bytes: 5000,
        };
        let text = backed_up(&backup, Output::Text);
        assert_eq!(
            String::from_utf8(text.stdout).unwrap(),
            "backed up 2 ranges (4 KiB of snapshots) to b.keel\n"
        );
        let json = backed_up(&backup, Output::Json);
        let value: Value = serde_json::from_slice(&json.stdout).unwrap();
        assert_eq!(value["ranges"][1]["revision"], 9);
        assert_eq!(value["ranges"][1]["span"], "[\"m\",+inf)");
        let restored = restored("d", &backup.ranges, 4096, "keel serve", Output::Text);
        let text = String::from_utf8(restored.stdout).unwrap();
        assert!(
            text.starts_with("restored 2 ranges (4 KiB) into d;"),
            "{text}"
        );
    }
}
