//! Integration tests of keel-jepsen: every checker on every fixture, generated histories,
//! budgets, the `keel-jepsen check` command end to end, the report of a run with ranges, and
//! the runner's pure parts (fault plan, proxy, records, error contract).

mod budget;
mod cli;
mod fixtures;
mod generated;
mod report_ranges;
mod runner_plan;
mod runner_proxy;
mod runner_records;
