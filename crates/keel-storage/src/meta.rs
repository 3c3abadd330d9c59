//! The meta range's table (`meta`): range descriptors by range id, nodes by id and the range
//! id allocator, and applying `MetaCommand`s to it. The decision about a command is pure
//! (`plan_meta`, table tests); `apply_meta` reads and writes around it. Knows nothing about
//! threads, async, openraft or how descriptors are used for routing.
//!
//! Rules:
//! - `UpdateRanges` records each descriptor unless the table (or an earlier descriptor of the
//!   same command) holds one of the same range that it does not supersede
//!   (`RangeDescriptor::supersedes`), and moves the allocator past every id it names.
//! - `AllocateRangeIds` hands out `next .. next + count` and moves `next` (it starts at 2:
//!   ids 0 and 1 are the meta range and the first range).
//! - `RegisterNode` records (or replaces) a node's address.
//! - `SetNodeState` records where a node stands; a `Removed` node stays removed (refused).
//! - More than `META_UPDATE_RANGES_MAX` descriptors, or a count outside
//!   `1..=RANGE_IDS_ALLOCATE_MAX`, is refused whole (`invalid_meta_command`).

use std::collections::BTreeMap;

use keel_types::{
    CommandOutcome, MetaCommand, MetaOutcome, NodeDescriptor, NodeId, NodeState, RangeDescriptor,
    RangeId, Rejection, limits,
};
use redb::{ReadableTable, Table};

use crate::codec::{decode, encode};
use crate::error::StorageError;
use crate::tables::{self, Bytes, META_NEXT_RANGE_ID, META_NODE, META_NODE_STATE, META_RANGE};

/// The first range id the allocator hands out.
pub(crate) const FIRST_ALLOCATED_RANGE_ID: u64 = 2;

/// A row of the `meta` table to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum MetaRow {
    Range(RangeDescriptor),
    Node(NodeDescriptor),
    NextRangeId(u64),
    /// Format 5: where a node stands (no row: `Active`).
    NodeState(NodeId, NodeState),
}

/// What a meta command answers and writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MetaPlan {
    pub outcome: MetaOutcome,
    pub rows: Vec<MetaRow>,
}

/// The refusal of a meta command with more items than its limit allows.
///
/// The refusal of a meta command outside its limits. The server checks these limits before
/// proposing, so only a buggy proposer sees it.
fn invalid_meta_command(message: String) -> Rejection {
    Rejection::InvalidMetaCommand { message }
}

/// Decides a meta command against the allocator's `next_range_id`, the stored descriptor of
/// a range (`stored`) and the stored state of a node (`node_state`).
pub(crate) fn plan_meta(
    command: &MetaCommand,
    next_range_id: u64,
    mut stored: impl FnMut(RangeId) -> Result<Option<RangeDescriptor>, StorageError>,
    mut node_state: impl FnMut(NodeId) -> Result<Option<NodeState>, StorageError>,
) -> Result<Result<MetaPlan, Rejection>, StorageError> {
    match command {
        MetaCommand::UpdateRanges { ranges } => {
            if ranges.len() > limits::META_UPDATE_RANGES_MAX {
                return Ok(Err(invalid_meta_command(format!(
                    "{} range descriptors in one meta command; limit is {}",
                    ranges.len(),
                    limits::META_UPDATE_RANGES_MAX
                ))));
            }
            let mut kept: BTreeMap<RangeId, RangeDescriptor> = BTreeMap::new();
            let mut next = next_range_id;
            let mut recorded = 0u32;
            for range in ranges {
                next = next.max(range.id.0.saturating_add(1));
                let current = match kept.get(&range.id) {
                    Some(pending) => Some(pending.clone()),
                    None => stored(range.id)?,
                };
                if current.is_none_or(|current| range.supersedes(&current)) {
                    kept.insert(range.id, range.clone());
                    recorded += 1;
                }
            }
            let mut rows: Vec<MetaRow> = kept.into_values().map(MetaRow::Range).collect();
            if next != next_range_id {
                rows.push(MetaRow::NextRangeId(next));
            }
            let outcome = MetaOutcome::RangesUpdated { recorded };
            Ok(Ok(MetaPlan { outcome, rows }))
        }
        MetaCommand::AllocateRangeIds { count } => {
            let next = next_range_id.checked_add(*count);
            match next {
                Some(next) if (1..=limits::RANGE_IDS_ALLOCATE_MAX).contains(count) => {
                    Ok(Ok(MetaPlan {
                        outcome: MetaOutcome::RangeIdsAllocated {
                            first: RangeId(next_range_id),
                            count: *count,
                        },
                        rows: vec![MetaRow::NextRangeId(next)],
                    }))
                }
                _ => Ok(Err(invalid_meta_command(format!(
                    "cannot allocate {count} range ids after {next_range_id}; 1 to {} at a time",
                    limits::RANGE_IDS_ALLOCATE_MAX
                )))),
            }
        }
        MetaCommand::RegisterNode(node) => Ok(Ok(MetaPlan {
            outcome: MetaOutcome::NodeRegistered,
            rows: vec![MetaRow::Node(node.clone())],
        })),
        MetaCommand::SetNodeState { node, state } => {
            let removed = node_state(*node)? == Some(NodeState::Removed);
            if removed && *state != NodeState::Removed {
                return Ok(Err(invalid_meta_command(format!(
                    "node {node} was removed from the cluster; it cannot become {} again",
                    state.name()
                ))));
            }
            Ok(Ok(MetaPlan {
                outcome: MetaOutcome::NodeStateSet,
                rows: vec![MetaRow::NodeState(*node, *state)],
            }))
        }
    }
}

/// Applies a meta command to the `meta` table: the outcome, or the rejection (nothing
/// written).
pub(crate) fn apply_meta(
    meta: &mut Table<Bytes, Bytes>,
    command: &MetaCommand,
) -> Result<CommandOutcome, StorageError> {
    let next = next_range_id(meta)?;
    let plan = plan_meta(
        command,
        next,
        |range| read_range(meta, range),
        |node| read_node_state(meta, node),
    )?;
    match plan {
        Err(rejection) => Ok(CommandOutcome::Rejected(rejection)),
        Ok(plan) => {
            for row in &plan.rows {
                write_row(meta, row)?;
            }
            Ok(CommandOutcome::Meta(plan.outcome))
        }
    }
}

/// The next range id the allocator hands out.
pub(crate) fn next_range_id<R>(meta: &R) -> Result<u64, StorageError>
where
    R: ReadableTable<Bytes, Bytes>,
{
    let key = tables::meta_row_key(META_NEXT_RANGE_ID, 0);
    let next: Option<u64> = tables::read_row(meta, &key, "next range id")?;
    Ok(next.unwrap_or(FIRST_ALLOCATED_RANGE_ID))
}

fn read_range<R>(meta: &R, range: RangeId) -> Result<Option<RangeDescriptor>, StorageError>
where
    R: ReadableTable<Bytes, Bytes>,
{
    let key = tables::meta_row_key(META_RANGE, range.0);
    tables::read_row(meta, &key, "range descriptor")
}

fn read_node_state<R>(meta: &R, node: NodeId) -> Result<Option<NodeState>, StorageError>
where
    R: ReadableTable<Bytes, Bytes>,
{
    let key = tables::meta_row_key(META_NODE_STATE, node);
    tables::read_row(meta, &key, "node state")
}

/// Writes one row of the `meta` table (replacing the row of the same range or node).
pub(crate) fn write_row(meta: &mut Table<Bytes, Bytes>, row: &MetaRow) -> Result<(), StorageError> {
    let (key, value) = match row {
        MetaRow::Range(range) => (tables::meta_row_key(META_RANGE, range.id.0), encode(range)),
        MetaRow::Node(node) => (tables::meta_row_key(META_NODE, node.id), encode(node)),
        MetaRow::NextRangeId(next) => (tables::meta_row_key(META_NEXT_RANGE_ID, 0), encode(next)),
        MetaRow::NodeState(node, state) => {
            (tables::meta_row_key(META_NODE_STATE, *node), encode(state))
        }
    };
    meta.insert(key.as_slice(), value.as_slice())
        .map_err(|e| StorageError::redb("write meta row", e))?;
    Ok(())
}

/// Every row of the `meta` table, descriptors by range id, then nodes by id, then the
/// allocator.
pub(crate) fn read_rows<R>(meta: &R) -> Result<Vec<MetaRow>, StorageError>
where
    R: ReadableTable<Bytes, Bytes>,
{
    let mut rows = Vec::new();
    for row in meta
        .range::<&[u8]>(..)
        .map_err(|e| StorageError::redb("read meta rows", e))?
    {
        let (key, value) = row.map_err(|e| StorageError::redb("read meta rows", e))?;
        let row = match key.value().first() {
            Some(&META_RANGE) => MetaRow::Range(decode("range descriptor", value.value())?),
            Some(&META_NODE) => MetaRow::Node(decode("node descriptor", value.value())?),
            Some(&META_NEXT_RANGE_ID) => {
                MetaRow::NextRangeId(decode("next range id", value.value())?)
            }
            Some(&META_NODE_STATE) => {
                let node = u64::from_be_bytes(key.value()[1..9].try_into().map_err(|_| {
                    StorageError::corrupt("meta row", "a node state key of the wrong length")
                })?);
                MetaRow::NodeState(node, decode("node state", value.value())?)
            }
            _ => return Err(StorageError::corrupt("meta row", "a key of unknown kind")),
        };
        rows.push(row);
    }
    Ok(rows)
}

/// The recorded descriptors, by start key (then range id).
pub(crate) fn ranges_by_start(rows: &[MetaRow]) -> Vec<RangeDescriptor> {
    let mut ranges: Vec<RangeDescriptor> = rows
        .iter()
        .filter_map(|row| match row {
            MetaRow::Range(range) => Some(range.clone()),
            _ => None,
        })
        .collect();
    ranges.sort_by(|a, b| (&a.start, a.id).cmp(&(&b.start, b.id)));
    ranges
}

/// Where each node with a recorded state stands, by id.
pub(crate) fn node_states(rows: &[MetaRow]) -> BTreeMap<NodeId, NodeState> {
    rows.iter()
        .filter_map(|row| match row {
            MetaRow::NodeState(node, state) => Some((*node, *state)),
            _ => None,
        })
        .collect()
}

/// The recorded nodes, by id.
pub(crate) fn nodes_by_id(rows: &[MetaRow]) -> Vec<NodeDescriptor> {
    rows.iter()
        .filter_map(|row| match row {
            MetaRow::Node(node) => Some(node.clone()),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use keel_types::NodeAddr;

    use super::*;

    fn range(id: u64, start: &str, epoch: u64, conf_version: u64) -> RangeDescriptor {
        RangeDescriptor {
            id: RangeId(id),
            start: start.as_bytes().to_vec(),
            end: None,
            epoch,
            conf_version,
            replicas: vec![1, 2, 3],
        }
    }

    /// The table every plan reads: range 1 at epoch 2, conf_version 3; next id 5.
    fn stored(id: RangeId) -> Result<Option<RangeDescriptor>, StorageError> {
        Ok((id == RangeId(1)).then(|| range(1, "", 2, 3)))
    }

    /// Node 9 was removed; every other node has no recorded state.
    fn node_state(node: NodeId) -> Result<Option<NodeState>, StorageError> {
        Ok((node == 9).then_some(NodeState::Removed))
    }

    fn check(command: MetaCommand, expected: Result<MetaPlan, Rejection>) {
        let plan = plan_meta(&command, 5, stored, node_state).unwrap();
        assert_eq!(plan, expected, "{command:?}");
    }

    fn updated(recorded: u32, rows: Vec<MetaRow>) -> Result<MetaPlan, Rejection> {
        Ok(MetaPlan {
            outcome: MetaOutcome::RangesUpdated { recorded },
            rows,
        })
    }

    #[test]
    fn update_plans_keep_only_newer_descriptors() {
        let update = |ranges| MetaCommand::UpdateRanges { ranges };
        let cases = vec![
            // Older or equal: not recorded; newer epoch or conf_version: recorded.
            (update(vec![range(1, "", 2, 3)]), updated(0, vec![])),
            (update(vec![range(1, "", 1, 9)]), updated(0, vec![])),
            (
                update(vec![range(1, "", 2, 4)]),
                updated(1, vec![MetaRow::Range(range(1, "", 2, 4))]),
            ),
            (
                update(vec![range(1, "", 3, 0)]),
                updated(1, vec![MetaRow::Range(range(1, "", 3, 0))]),
            ),
            // An absent range is recorded; an id at or past `next` moves it.
            (
                update(vec![range(4, "m", 0, 0)]),
                updated(1, vec![MetaRow::Range(range(4, "m", 0, 0))]),
            ),
            (
                update(vec![range(9, "m", 0, 0)]),
                updated(
                    1,
                    vec![
                        MetaRow::Range(range(9, "m", 0, 0)),
                        MetaRow::NextRangeId(10),
                    ],
                ),
            ),
            // Within one command the newest of a range wins, in any order.
            (
                update(vec![range(7, "a", 2, 0), range(7, "b", 1, 0)]),
                updated(
                    1,
                    vec![MetaRow::Range(range(7, "a", 2, 0)), MetaRow::NextRangeId(8)],
                ),
            ),
            (
                update(vec![range(7, "b", 1, 0), range(7, "a", 2, 0)]),
                updated(
                    2,
                    vec![MetaRow::Range(range(7, "a", 2, 0)), MetaRow::NextRangeId(8)],
                ),
            ),
            (
                update(vec![range(1, "", 9, 9); limits::META_UPDATE_RANGES_MAX + 1]),
                Err(invalid_meta_command(
                    "65 range descriptors in one meta command; limit is 64".to_string(),
                )),
            ),
        ];
        for (command, expected) in cases {
            check(command, expected);
        }
    }

    #[test]
    fn allocation_plans_hand_out_fresh_ids() {
        let allocate = |count| MetaCommand::AllocateRangeIds { count };
        let allocated = |first, count, next| {
            Ok(MetaPlan {
                outcome: MetaOutcome::RangeIdsAllocated {
                    first: RangeId(first),
                    count,
                },
                rows: vec![MetaRow::NextRangeId(next)],
            })
        };
        let max = limits::RANGE_IDS_ALLOCATE_MAX;
        let refused = |count, next| {
            invalid_meta_command(format!(
                "cannot allocate {count} range ids after {next}; 1 to {max} at a time"
            ))
        };
        let cases = vec![
            (allocate(1), allocated(5, 1, 6)),
            (allocate(max), allocated(5, max, 5 + max)),
            (allocate(0), Err(refused(0, 5))),
            (allocate(max + 1), Err(refused(max + 1, 5))),
        ];
        for (command, expected) in cases {
            check(command, expected);
        }
        let overflow = plan_meta(&allocate(1), u64::MAX, stored, node_state).unwrap();
        assert_eq!(overflow, Err(refused(1, u64::MAX)));
    }

    #[test]
    fn node_registration_replaces_the_address() {
        let node = NodeDescriptor {
            id: 3,
            addr: NodeAddr::new("10.0.0.3:7000"),
        };
        check(
            MetaCommand::RegisterNode(node.clone()),
            Ok(MetaPlan {
                outcome: MetaOutcome::NodeRegistered,
                rows: vec![MetaRow::Node(node)],
            }),
        );
    }

    #[test]
    fn node_states_are_recorded_and_a_removed_node_stays_removed() {
        let set = |node, state| MetaCommand::SetNodeState { node, state };
        let recorded = |node, state| {
            Ok(MetaPlan {
                outcome: MetaOutcome::NodeStateSet,
                rows: vec![MetaRow::NodeState(node, state)],
            })
        };
        let refused = |state: NodeState| {
            Err(invalid_meta_command(format!(
                "node 9 was removed from the cluster; it cannot become {} again",
                state.name()
            )))
        };
        let cases = vec![
            (
                set(4, NodeState::Draining),
                recorded(4, NodeState::Draining),
            ),
            (set(4, NodeState::Active), recorded(4, NodeState::Active)),
            (set(4, NodeState::Removed), recorded(4, NodeState::Removed)),
            (set(9, NodeState::Removed), recorded(9, NodeState::Removed)),
            (set(9, NodeState::Active), refused(NodeState::Active)),
            (set(9, NodeState::Draining), refused(NodeState::Draining)),
        ];
        for (command, expected) in cases {
            check(command, expected);
        }
    }
}
