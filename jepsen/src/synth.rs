//! Synthetic histories that are correct by construction, for testing and timing the
//! checkers: every op gets a linearization point inside its interval and a sequential model
//! applied in point order gives the outputs. Deterministic for a seed. Knows nothing about
//! servers or checkers.

use serde_json::{Map, Value, json};

use crate::history::{Op, OpKind};

/// The shape of a synthetic history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub ops: usize,
    pub keys: usize,
    pub clients: usize,
    /// true = one op at a time across all clients (trivially linearizable).
    pub sequential: bool,
    /// Chance, per thousand ops, that an op is indeterminate (ok and return null).
    pub info_per_mille: u64,
    pub seed: u64,
}

/// The workloads a history can be made for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    Register,
    Append,
    Counter,
}

/// A correct history of `workload` with `shape`, ordered by call time.
pub fn history(workload: Workload, shape: &Shape) -> Vec<Op> {
    assert!(
        shape.keys > 0 && shape.clients > 0,
        "a history needs keys and clients"
    );
    let mut rng = Rng(shape.seed);
    let slots = schedule(shape, &mut rng);
    let mut states = vec![State::default(); shape.keys];
    let mut ops: Vec<Op> = slots
        .iter()
        .map(|slot| {
            let indeterminate = rng.below(1000) < shape.info_per_mille;
            // An indeterminate write takes effect or not, by a coin.
            let applied = !indeterminate || rng.below(2) == 0;
            let state = &mut states[slot.key];
            let draft = match workload {
                Workload::Register => register_op(state, applied, &mut rng),
                Workload::Append => append_op(state, applied, &mut rng),
                Workload::Counter => counter_op(state, applied, &mut rng),
            };
            finish(draft, slot, indeterminate)
        })
        .collect();
    ops.sort_by_key(|op| (op.call_ns, op.client));
    ops
}

/// A small deterministic generator (splitmix64); the harness needs no statistical quality.
#[derive(Debug, Clone)]
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..bound`.
    pub fn below(&mut self, bound: u64) -> u64 {
        assert!(bound > 0, "an empty range has no numbers");
        self.next_u64() % bound
    }
}

/// When and where one op runs; `point_ns` is when it takes effect.
#[derive(Debug, Clone, Copy)]
struct Slot {
    client: u64,
    key: usize,
    call_ns: u64,
    return_ns: u64,
    point_ns: u64,
}

/// The model state of one key, for all workloads.
#[derive(Debug, Clone, Default)]
struct State {
    register: Option<String>,
    list: Vec<Value>,
    counter: i64,
    /// Writes made so far, for unique values.
    writes: u64,
}

/// What an op did at its point, before status and times are filled in.
struct Draft {
    op: OpKind,
    value: Value,
    expect: Value,
    output: Value,
    /// false = a confirmed failure (the model was not changed).
    ok: bool,
}

/// Intervals for every op, sorted by linearization point.
fn schedule(shape: &Shape, rng: &mut Rng) -> Vec<Slot> {
    let mut clocks = vec![0u64; shape.clients];
    let mut global = 0u64;
    let mut slots: Vec<Slot> = (0..shape.ops)
        .map(|n| {
            let client = if shape.sequential {
                rng.below(shape.clients as u64) as usize
            } else {
                n % shape.clients
            };
            let start = if shape.sequential {
                global
            } else {
                clocks[client]
            };
            let call_ns = start + 1 + rng.below(200_000);
            let return_ns = call_ns + 1 + rng.below(2_000_000);
            let point_ns = call_ns + rng.below(return_ns - call_ns + 1);
            clocks[client] = return_ns;
            global = return_ns;
            let key = rng.below(shape.keys as u64) as usize;
            Slot {
                client: client as u64,
                key,
                call_ns,
                return_ns,
                point_ns,
            }
        })
        .collect();
    slots.sort_by_key(|slot| slot.point_ns);
    slots
}

fn register_op(state: &mut State, applied: bool, rng: &mut Rng) -> Draft {
    let current = state.register.clone().map_or(Value::Null, Value::String);
    state.writes += 1;
    let fresh = json!(format!("v{}", state.writes));
    let (op, value, expect, ok) = match rng.below(20) {
        0..=5 => (OpKind::Get, Value::Null, Value::Null, true),
        6..=11 => (OpKind::Put, fresh, Value::Null, true),
        12..=13 => (OpKind::Del, Value::Null, Value::Null, true),
        14..=16 => (OpKind::Cas, fresh, current.clone(), true),
        _ => (OpKind::Cas, fresh, json!("v-never"), false),
    };
    if op == OpKind::Get {
        return read_draft(op, current);
    }
    if ok && applied {
        state.register = value.as_str().map(str::to_string);
    }
    Draft {
        op,
        value,
        expect,
        output: Value::Null,
        ok,
    }
}

fn append_op(state: &mut State, applied: bool, rng: &mut Rng) -> Draft {
    if rng.below(2) == 0 {
        return read_draft(OpKind::Read, Value::Array(state.list.clone()));
    }
    state.writes += 1;
    let value = json!(state.writes);
    if applied {
        state.list.push(value.clone());
    }
    write_draft(OpKind::Append, value)
}

fn counter_op(state: &mut State, applied: bool, rng: &mut Rng) -> Draft {
    if rng.below(2) == 0 {
        return read_draft(OpKind::Read, json!(state.counter));
    }
    let delta = 1 + rng.below(5) as i64;
    if applied {
        state.counter += delta;
    }
    write_draft(OpKind::Incr, json!(delta))
}

fn read_draft(op: OpKind, output: Value) -> Draft {
    Draft {
        op,
        value: Value::Null,
        expect: Value::Null,
        output,
        ok: true,
    }
}

fn write_draft(op: OpKind, value: Value) -> Draft {
    Draft {
        op,
        value,
        expect: Value::Null,
        output: Value::Null,
        ok: true,
    }
}

/// Fills in client, key and times; an indeterminate op loses its status, return and output.
fn finish(draft: Draft, slot: &Slot, indeterminate: bool) -> Op {
    Op {
        client: slot.client,
        op: draft.op,
        key: format!("k{}", slot.key),
        value: draft.value,
        expect: draft.expect,
        ok: (!indeterminate).then_some(draft.ok),
        output: if indeterminate {
            Value::Null
        } else {
            draft.output
        },
        call_ns: slot.call_ns,
        return_ns: (!indeterminate).then_some(slot.return_ns),
        extra: Map::new(),
    }
}
