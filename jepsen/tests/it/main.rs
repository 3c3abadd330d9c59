//! Integration tests of keel-jepsen: every checker on every fixture, generated histories,
//! budgets, and the `keel-jepsen check` command end to end.

mod budget;
mod cli;
mod fixtures;
mod generated;
