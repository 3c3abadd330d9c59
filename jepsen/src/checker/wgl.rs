//! The Wing–Gong linearizability search with Lowe's memoization: a depth-first search over
//! the order in which pending operations take effect, pruning every (linearized set, state)
//! configuration already explored. Generic over a sequential model; knows nothing about
//! keys, values or the history format.
//!
//! Operations are intervals. A *required* operation (confirmed) takes effect once, between
//! its call and its return. An *optional* operation (indeterminate) has no return: it may
//! take effect at any time after its call, or never. The history is linearizable when every
//! required operation can be placed.

use std::collections::HashSet;
use std::hash::Hash;
use std::time::Instant;

use crate::limits;

/// A sequential specification: the state after `op`, or None when `op` cannot happen in
/// `state` (a read of another value, a cas whose expectation does not hold).
pub trait Model {
    type State: Clone + Eq + Hash;
    fn step(&self, state: &Self::State, op: usize) -> Option<Self::State>;
}

/// When an operation may take effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interval {
    pub call_ns: u64,
    /// None = optional: any time after the call, or never.
    pub return_ns: Option<u64>,
}

/// How long the search may run and how much it may remember.
#[derive(Debug, Clone, Copy)]
pub struct SearchBudget {
    pub deadline: Instant,
    pub memo_entries_max: usize,
}

/// The answer of one search.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Search<S> {
    Linearizable,
    /// No order works. The dead end is the furthest point in time the search reached.
    NotLinearizable(DeadEnd<S>),
    /// The budget ran out first; says which budget.
    OutOfBudget(String),
}

/// The furthest return the search could not get past: the operation whose return it is
/// (never linearized in time on any path that got there) and the states the model could be in
/// just before that return.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadEnd<S> {
    pub op: usize,
    pub states: Vec<S>,
}

/// Searches for a linearization of `intervals` (indexed like the model's ops) from `initial`.
pub fn search<M: Model>(
    model: &M,
    initial: M::State,
    intervals: &[Interval],
    budget: &SearchBudget,
) -> Search<M::State> {
    Searcher::new(model, initial, intervals).run(budget)
}

const HEAD: usize = 0;
const NIL: usize = usize::MAX;

/// A call or a return, as an element of the doubly linked event list. Entry 0 is the head.
#[derive(Debug, Clone, Copy)]
struct Entry {
    op: usize,
    call: bool,
    /// For a call: its return entry, or NIL for an optional op.
    pair: usize,
}

struct Searcher<'m, M: Model> {
    model: &'m M,
    entries: Vec<Entry>,
    next: Vec<usize>,
    prev: Vec<usize>,
    required: Vec<bool>,
    required_left: usize,
    linearized: Vec<u64>,
    state: M::State,
    stack: Vec<(usize, M::State)>,
    memo: HashSet<(Vec<u64>, M::State)>,
    dead_end: Option<(usize, DeadEnd<M::State>)>,
}

impl<'m, M: Model> Searcher<'m, M> {
    fn new(model: &'m M, initial: M::State, intervals: &[Interval]) -> Self {
        let entries = event_list(intervals);
        let count = entries.len();
        let next = (0..count)
            .map(|i| if i + 1 < count { i + 1 } else { NIL })
            .collect();
        let prev = (0..count).map(|i| i.saturating_sub(1)).collect();
        let required: Vec<bool> = intervals.iter().map(|i| i.return_ns.is_some()).collect();
        let required_left = required.iter().filter(|r| **r).count();
        Searcher {
            model,
            entries,
            next,
            prev,
            required,
            required_left,
            linearized: vec![0; intervals.len().div_ceil(64)],
            state: initial,
            stack: Vec::new(),
            memo: HashSet::new(),
            dead_end: None,
        }
    }

    fn run(mut self, budget: &SearchBudget) -> Search<M::State> {
        let mut cursor = self.next[HEAD];
        let mut steps: u64 = 0;
        loop {
            if self.required_left == 0 {
                return Search::Linearizable;
            }
            if steps.is_multiple_of(limits::SEARCH_CLOCK_STEPS) && Instant::now() >= budget.deadline
            {
                return Search::OutOfBudget(format!("time budget spent after {steps} steps"));
            }
            steps += 1;
            assert_ne!(
                cursor, NIL,
                "a required op's return lies ahead of the cursor"
            );
            let entry = self.entries[cursor];
            if entry.call {
                cursor = if self.try_linearize(cursor) {
                    self.next[HEAD]
                } else {
                    self.next[cursor]
                };
                if self.memo.len() > budget.memo_entries_max {
                    let limit = budget.memo_entries_max;
                    return Search::OutOfBudget(format!(
                        "memo holds more than {limit} configurations; limit is {limit}"
                    ));
                }
            } else {
                self.note_dead_end(cursor);
                let Some((call, state)) = self.stack.pop() else {
                    let (_, dead_end) = self.dead_end.expect("a dead end was just noted");
                    return Search::NotLinearizable(dead_end);
                };
                self.undo(call, state);
                cursor = self.next[call];
            }
        }
    }

    /// Lets the op of call entry `call` take effect now, unless the model refuses or the
    /// resulting configuration was explored before.
    fn try_linearize(&mut self, call: usize) -> bool {
        let op = self.entries[call].op;
        let Some(state) = self.model.step(&self.state, op) else {
            return false;
        };
        set_bit(&mut self.linearized, op, true);
        if !self.memo.insert((self.linearized.clone(), state.clone())) {
            set_bit(&mut self.linearized, op, false);
            return false;
        }
        let before = std::mem::replace(&mut self.state, state);
        self.stack.push((call, before));
        self.lift(call);
        if self.required[op] {
            self.required_left -= 1;
        }
        true
    }

    fn undo(&mut self, call: usize, state: M::State) {
        let op = self.entries[call].op;
        self.state = state;
        set_bit(&mut self.linearized, op, false);
        self.unlift(call);
        if self.required[op] {
            self.required_left += 1;
        }
    }

    /// Removes a call entry and its return entry from the list (dancing links).
    fn lift(&mut self, call: usize) {
        self.unlink(call);
        let pair = self.entries[call].pair;
        if pair != NIL {
            self.unlink(pair);
        }
    }

    /// Puts back what `lift` removed, in the reverse order.
    fn unlift(&mut self, call: usize) {
        let pair = self.entries[call].pair;
        if pair != NIL {
            self.relink(pair);
        }
        self.relink(call);
    }

    fn unlink(&mut self, entry: usize) {
        let (prev, next) = (self.prev[entry], self.next[entry]);
        self.next[prev] = next;
        if next != NIL {
            self.prev[next] = prev;
        }
    }

    fn relink(&mut self, entry: usize) {
        let (prev, next) = (self.prev[entry], self.next[entry]);
        self.next[prev] = entry;
        if next != NIL {
            self.prev[next] = entry;
        }
    }

    /// Remembers the furthest return entry reached and the states seen there.
    fn note_dead_end(&mut self, entry: usize) {
        let op = self.entries[entry].op;
        match &mut self.dead_end {
            Some((furthest, dead_end)) if *furthest == entry => {
                if dead_end.states.len() < limits::EVIDENCE_STATES_MAX
                    && !dead_end.states.contains(&self.state)
                {
                    dead_end.states.push(self.state.clone());
                }
            }
            Some((furthest, _)) if *furthest > entry => {}
            _ => {
                let states = vec![self.state.clone()];
                self.dead_end = Some((entry, DeadEnd { op, states }));
            }
        }
    }
}

/// The list of calls and returns in time order, after the head entry. At equal times calls
/// come first, so ops that touch are concurrent (the permissive reading).
fn event_list(intervals: &[Interval]) -> Vec<Entry> {
    let mut events: Vec<(u64, bool, usize)> = Vec::with_capacity(intervals.len() * 2);
    for (op, interval) in intervals.iter().enumerate() {
        events.push((interval.call_ns, false, op));
        if let Some(return_ns) = interval.return_ns {
            assert!(
                return_ns >= interval.call_ns,
                "op {op} returns before its call"
            );
            events.push((return_ns, true, op));
        }
    }
    events.sort_unstable();
    let head = Entry {
        op: usize::MAX,
        call: false,
        pair: NIL,
    };
    let mut entries = vec![head];
    let mut call_entry = vec![NIL; intervals.len()];
    for (_, is_return, op) in events {
        let index = entries.len();
        if is_return {
            entries[call_entry[op]].pair = index;
        } else {
            call_entry[op] = index;
        }
        entries.push(Entry {
            op,
            call: !is_return,
            pair: NIL,
        });
    }
    entries
}

fn set_bit(bits: &mut [u64], index: usize, value: bool) {
    let (word, bit) = (index / 64, index % 64);
    if value {
        bits[word] |= 1 << bit;
    } else {
        bits[word] &= !(1 << bit);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A register of small integers; ops are (kind, argument): 'w' writes, 'r' reads.
    struct Register(Vec<(char, u32)>);

    impl Model for Register {
        type State = u32;
        fn step(&self, state: &u32, op: usize) -> Option<u32> {
            match self.0[op] {
                ('w', value) => Some(value),
                (_, value) => (value == *state).then_some(*state),
            }
        }
    }

    fn check(ops: &[(char, u32, u64, Option<u64>)], linearizable: bool) {
        let model = Register(ops.iter().map(|o| (o.0, o.1)).collect());
        let intervals: Vec<Interval> = ops
            .iter()
            .map(|o| Interval {
                call_ns: o.2,
                return_ns: o.3,
            })
            .collect();
        let budget = SearchBudget {
            deadline: Instant::now() + Duration::from_secs(10),
            memo_entries_max: 1_000,
        };
        let result = search(&model, 0, &intervals, &budget);
        assert_eq!(
            result == Search::Linearizable,
            linearizable,
            "{ops:?}: {result:?}"
        );
    }

    #[test]
    fn search_cases() {
        check(&[('w', 1, 0, Some(1)), ('r', 1, 2, Some(3))], true);
        check(&[('w', 1, 0, Some(1)), ('r', 0, 2, Some(3))], false);
        check(&[('w', 1, 0, Some(5)), ('r', 0, 1, Some(2))], true);
        check(&[('w', 1, 0, None), ('r', 1, 5, Some(6))], true);
        check(&[('w', 1, 0, None), ('r', 0, 5, Some(6))], true);
        check(&[('w', 1, 9, None), ('r', 1, 5, Some(6))], false);
        check(
            &[
                ('w', 1, 0, Some(1)),
                ('w', 2, 0, Some(1)),
                ('r', 1, 2, Some(3)),
            ],
            true,
        );
        check(
            &[
                ('w', 1, 0, Some(1)),
                ('w', 2, 0, Some(1)),
                ('r', 1, 2, Some(3)),
                ('r', 2, 4, Some(5)),
            ],
            false,
        );
    }

    #[test]
    fn dead_end_names_the_stale_read() {
        let model = Register(vec![('w', 1), ('r', 0)]);
        let intervals = [
            Interval {
                call_ns: 0,
                return_ns: Some(1),
            },
            Interval {
                call_ns: 2,
                return_ns: Some(3),
            },
        ];
        let budget = SearchBudget {
            deadline: Instant::now() + Duration::from_secs(10),
            memo_entries_max: 1_000,
        };
        let expected = DeadEnd {
            op: 1,
            states: vec![1],
        };
        assert_eq!(
            search(&model, 0, &intervals, &budget),
            Search::NotLinearizable(expected)
        );
    }
}
