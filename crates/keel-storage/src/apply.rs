//! Applying committed log entries to a range's state machine: the pure decision
//! (`plan_write`: conditions, revisions, results) and the redb step that executes it with the
//! applied log id, membership and revision in the same transaction. Knows nothing about
//! threads, async or snapshots.

use std::collections::BTreeMap;

use keel_types::{
    BatchOp, Command, CommandOutcome, ConditionFailed, KeyValue, OpResult, RangeId, Revision,
};
use openraft::EntryPayload;
use openraft::StoredMembership;
use redb::{ReadableTable, WriteTransaction};

use crate::error::StorageError;
use crate::raft_types::Entry;
use crate::tables::{self, KV, SM_META};

/// What a `Command::Write` does to the data, decided before anything is written.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum WritePlan {
    /// A condition failed: write nothing, consume no revision.
    Failed(ConditionFailed),
    /// Write `writes` (`None` = delete) at `revision`.
    Apply {
        revision: Revision,
        results: Vec<OpResult>,
        writes: BTreeMap<Vec<u8>, Option<KeyValue>>,
    },
}

/// Decides a write of `ops` against a range at `revision`. Ops are taken in order and each
/// condition sees the effects of the ops before it; `lookup` reads the stored state of a key.
pub(crate) fn plan_write(
    ops: &[BatchOp],
    revision: Revision,
    mut lookup: impl FnMut(&[u8]) -> Result<Option<KeyValue>, StorageError>,
) -> Result<WritePlan, StorageError> {
    let next = revision + 1;
    let mut writes: BTreeMap<Vec<u8>, Option<KeyValue>> = BTreeMap::new();
    let mut results = Vec::with_capacity(ops.len());
    for (op_index, op) in ops.iter().enumerate() {
        let key = op.key();
        let current = match writes.get(key) {
            Some(pending) => pending.clone(),
            None => lookup(key)?,
        };
        if let Some(condition) = op.condition()
            && !condition.holds(current.as_ref())
        {
            return Ok(WritePlan::Failed(ConditionFailed {
                op_index: u32::try_from(op_index).expect("op count fits in u32"),
                key: key.to_vec(),
                current,
                revision,
            }));
        }
        let after = match op {
            BatchOp::Put { value, .. } => Some(KeyValue {
                key: key.to_vec(),
                value: value.clone(),
                create_revision: current.as_ref().map_or(next, |kv| kv.create_revision),
                mod_revision: next,
            }),
            BatchOp::Delete { .. } => None,
        };
        let existed = current.is_some();
        let previous = if op.return_previous() { current } else { None };
        results.push(OpResult { previous, existed });
        writes.insert(key.to_vec(), after);
    }
    Ok(WritePlan::Apply {
        revision: next,
        results,
        writes,
    })
}

/// Applies `entries` to `range` inside `txn` and records the last applied log id, the last
/// membership and the revision in the same transaction. Returns one outcome per entry.
pub(crate) fn apply_entries(
    txn: &WriteTransaction,
    range: RangeId,
    entries: &[Entry],
) -> Result<Vec<CommandOutcome>, StorageError> {
    let mut sm_meta = txn
        .open_table(SM_META)
        .map_err(|e| StorageError::redb("open sm_meta", e))?;
    let mut kv = txn
        .open_table(KV)
        .map_err(|e| StorageError::redb("open kv", e))?;
    let mut state = tables::read_sm_state(&sm_meta, range)?;
    assert!(
        state.installing.is_none(),
        "range {range}: apply while a snapshot install is unfinished"
    );
    let mut outcomes = Vec::with_capacity(entries.len());
    for entry in entries {
        let outcome = match &entry.payload {
            EntryPayload::Blank => CommandOutcome::Internal,
            EntryPayload::Membership(membership) => {
                state.membership = StoredMembership::new(Some(entry.log_id), membership.clone());
                CommandOutcome::Internal
            }
            EntryPayload::Normal(Command::Write { ops }) => {
                let plan = plan_write(ops, state.revision, |key| read_kv(&kv, key))?;
                execute_plan(&mut kv, &mut state.revision, plan)?
            }
        };
        state.applied = Some(entry.log_id);
        outcomes.push(outcome);
    }
    tables::write_sm_state(&mut sm_meta, range, &state)?;
    Ok(outcomes)
}

fn execute_plan(
    kv: &mut redb::Table<tables::Bytes, tables::Bytes>,
    revision: &mut Revision,
    plan: WritePlan,
) -> Result<CommandOutcome, StorageError> {
    let (new_revision, results, writes) = match plan {
        WritePlan::Failed(failed) => return Ok(CommandOutcome::ConditionFailed(failed)),
        WritePlan::Apply {
            revision,
            results,
            writes,
        } => (revision, results, writes),
    };
    for (key, after) in writes {
        let written = match after {
            Some(value) => kv.insert(key.as_slice(), tables::encode_kv(&value).as_slice()),
            None => kv.remove(key.as_slice()),
        };
        written.map_err(|e| StorageError::redb("write kv", e))?;
    }
    *revision = new_revision;
    Ok(CommandOutcome::Applied {
        revision: new_revision,
        results,
    })
}

pub(crate) fn read_kv<R>(kv: &R, key: &[u8]) -> Result<Option<KeyValue>, StorageError>
where
    R: ReadableTable<tables::Bytes, tables::Bytes>,
{
    let row = kv.get(key).map_err(|e| StorageError::redb("read kv", e))?;
    row.map(|value| tables::decode_kv(key, value.value()))
        .transpose()
}

#[cfg(test)]
mod tests {
    use keel_types::Condition;

    use super::*;

    fn put(key: &str, value: &str, condition: Option<Condition>) -> BatchOp {
        BatchOp::Put {
            key: key.as_bytes().to_vec(),
            value: value.as_bytes().to_vec(),
            condition,
            return_previous: true,
        }
    }

    fn delete(key: &str, condition: Option<Condition>) -> BatchOp {
        BatchOp::Delete {
            key: key.as_bytes().to_vec(),
            condition,
            return_previous: true,
        }
    }

    fn kv(key: &str, value: &str, create_revision: Revision, mod_revision: Revision) -> KeyValue {
        KeyValue {
            key: key.as_bytes().to_vec(),
            value: value.as_bytes().to_vec(),
            create_revision,
            mod_revision,
        }
    }

    /// Plans `ops` against a store holding `a=old` (created at 2, modified at 4) at revision 5.
    /// Either the writes a plan makes or the index of the op whose condition fails.
    type Expected = Result<Vec<(&'static str, Option<KeyValue>)>, u32>;

    fn check(ops: Vec<BatchOp>, expected: Expected) {
        let stored = kv("a", "old", 2, 4);
        let plan = plan_write(&ops, 5, |key| Ok((key == b"a").then(|| stored.clone()))).unwrap();
        match (plan, expected) {
            (
                WritePlan::Apply {
                    revision, writes, ..
                },
                Ok(expected),
            ) => {
                assert_eq!(revision, 6, "{ops:?}");
                let expected: BTreeMap<Vec<u8>, Option<KeyValue>> = expected
                    .into_iter()
                    .map(|(key, value)| (key.as_bytes().to_vec(), value))
                    .collect();
                assert_eq!(writes, expected, "{ops:?}");
            }
            (WritePlan::Failed(failed), Err(op_index)) => {
                assert_eq!(failed.op_index, op_index, "{ops:?}");
                assert_eq!(failed.revision, 5, "{ops:?}");
            }
            (plan, expected) => panic!("{ops:?}: planned {plan:?}, expected {expected:?}"),
        }
    }

    #[test]
    fn write_plans() {
        use Condition::{Absent, Revision as AtRevision, Value};
        let cases: Vec<(Vec<BatchOp>, Expected)> = vec![
            // A new key is created at the new revision; an existing key keeps its create_revision.
            (
                vec![put("b", "1", None)],
                Ok(vec![("b", Some(kv("b", "1", 6, 6)))]),
            ),
            (
                vec![put("a", "1", None)],
                Ok(vec![("a", Some(kv("a", "1", 2, 6)))]),
            ),
            (vec![delete("a", None)], Ok(vec![("a", None)])),
            (vec![delete("zz", None)], Ok(vec![("zz", None)])),
            // Conditions on stored state.
            (vec![put("a", "1", Some(Absent))], Err(0)),
            (
                vec![put("b", "1", Some(Absent))],
                Ok(vec![("b", Some(kv("b", "1", 6, 6)))]),
            ),
            (
                vec![put("a", "1", Some(AtRevision(4)))],
                Ok(vec![("a", Some(kv("a", "1", 2, 6)))]),
            ),
            (vec![put("a", "1", Some(AtRevision(3)))], Err(0)),
            (
                vec![delete("a", Some(Value(b"old".to_vec())))],
                Ok(vec![("a", None)]),
            ),
            (vec![delete("a", Some(Value(b"new".to_vec())))], Err(0)),
            // Each condition sees the ops before it.
            (
                vec![delete("a", None), put("a", "2", Some(Absent))],
                Ok(vec![("a", Some(kv("a", "2", 6, 6)))]),
            ),
            (
                vec![put("b", "1", None), put("b", "2", Some(AtRevision(6)))],
                Ok(vec![("b", Some(kv("b", "2", 6, 6)))]),
            ),
            // A failing later op fails the whole batch.
            (
                vec![put("b", "1", None), put("a", "2", Some(Absent))],
                Err(1),
            ),
            (
                vec![delete("a", None), delete("a", Some(Value(b"old".to_vec())))],
                Err(1),
            ),
        ];
        for (ops, expected) in cases {
            check(ops, expected);
        }
    }

    #[test]
    fn results_report_previous_state_per_op() {
        let stored = kv("a", "old", 2, 4);
        let ops = vec![put("a", "1", None), delete("a", None), delete("a", None)];
        let plan = plan_write(&ops, 5, |key| Ok((key == b"a").then(|| stored.clone()))).unwrap();
        let WritePlan::Apply { results, .. } = plan else {
            panic!("expected an applied plan")
        };
        assert_eq!(
            results[0],
            OpResult {
                previous: Some(stored.clone()),
                existed: true
            }
        );
        assert_eq!(results[1].previous, Some(kv("a", "1", 2, 6)));
        assert_eq!(
            results[2],
            OpResult {
                previous: None,
                existed: false
            }
        );
    }
}
