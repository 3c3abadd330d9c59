//! Integration tests of keel-jepsen: every checker on every fixture, generated histories,
//! budgets, the `keel-jepsen check` command end to end, and the runner's pure parts (fault
//! plan, proxy, records, error contract).

mod budget;
mod cli;
mod fixtures;
mod generated;
mod runner_plan;
mod runner_proxy;
mod runner_records;
