//! Keel's Jepsen-style harness as a library: the history and fault-log formats, the checkers,
//! the check of a run directory and its report. Knows nothing about Keel's servers, storage or
//! Raft: a history is all it sees (the runner, added later, will talk to a cluster only
//! through keel-client).

pub mod check;
pub mod checker;
pub mod fault;
pub mod history;
pub mod limits;
pub mod report;
pub mod spec;
pub mod synth;
