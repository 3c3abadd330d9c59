//! Keel's Jepsen-style harness as a library: the runner (`run`: real `keel serve` processes,
//! faults, workloads), the history, fault-log and range-table formats, the checkers, the check
//! of a run directory and its report. Knows nothing about Keel's servers, storage or Raft:
//! the runner talks to a cluster only through keel-client and process command lines, and the
//! checkers see nothing but a history.

pub mod check;
pub mod checker;
pub mod fault;
pub mod history;
pub mod limits;
pub mod ranges;
pub mod replicas;
pub mod report;
pub mod run;
pub mod spec;
pub mod synth;
