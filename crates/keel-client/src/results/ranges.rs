//! What the cluster calls about ranges return: the range table as `Client::ranges` lists it.

use keel_proto::v1;
use keel_types::{KvError, NodeId, RangeDescriptor, RangeId};

/// One range of the cluster, as `Client::ranges` lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct RangeInfo {
    /// Span, epoch, conf_version and voting replicas, from the meta range.
    pub descriptor: RangeDescriptor,
    /// The leader, when the answering node hosts a replica of the range and knows it.
    pub leader: Option<NodeId>,
    /// Bytes of keys and values: from the answering node's replica when it hosts one, else
    /// as the leader last reported them (0 when neither is known).
    pub size_bytes: u64,
    /// Live keys, from the same source as `size_bytes`.
    pub keys: u64,
    /// Requests per second the range's leader served lately, as it last reported them.
    pub requests_per_sec: f64,
    /// How old `size_bytes` and `keys` are: zero when read from the answering node's
    /// replica, else the age of the leader's report.
    pub counts_age: std::time::Duration,
}

/// The data ranges of a `Cluster.Ranges` answer, in key order. The meta range holds no
/// keys and is left out (`Client::status` shows it).
pub(crate) fn ranges(response: &v1::RangesResponse) -> Result<Vec<RangeInfo>, KvError> {
    let mut ranges = Vec::with_capacity(response.ranges.len());
    for info in &response.ranges {
        let Some(descriptor) = info.descriptor.clone() else {
            return Err(KvError::fatal(
                "the range table lists a range without a descriptor",
            ));
        };
        if descriptor.range_id == RangeId::META.0 {
            continue;
        }
        ranges.push(RangeInfo {
            descriptor: descriptor.into(),
            leader: info.leader_id,
            size_bytes: info.size_bytes,
            keys: info.keys,
            requests_per_sec: info.requests_per_sec,
            counts_age: std::time::Duration::from_millis(info.counts_age_ms),
        });
    }
    ranges.sort_by(|a, b| a.descriptor.start.cmp(&b.descriptor.start));
    Ok(ranges)
}

/// The two halves a `Cluster.Split` answer names.
pub(crate) fn split(
    response: v1::SplitResponse,
) -> Result<(RangeDescriptor, RangeDescriptor), KvError> {
    match (response.left, response.right) {
        (Some(left), Some(right)) => Ok((left.into(), right.into())),
        _ => Err(KvError::OutcomeUnknown {
            message:
                "the server's split answer lacks a half; `keel cluster ranges` shows the table"
                    .to_string(),
        }),
    }
}
