//! Decisions about ranges, as pure functions: the table of range descriptors a node routes
//! with, when a range should split and at which key, and how to rebalance: which replicas to
//! add, replace or remove and which leaders to move so that every range keeps its voters on
//! healthy nodes and replicas and leaders spread evenly over the nodes.
//!
//! Decide here, act in the runtime: nothing in this crate does I/O, reads a clock or draws
//! from a global random number generator. Time comes in as arguments, randomness through the
//! `RandomSource` seam. It knows nothing of openraft, redb, tonic or tokio; `keel-server`
//! carries its decisions out. Clients never depend on it.

pub mod limits;
mod load_window;
mod random;
mod range_table;
mod rebalance;
mod split;

pub use load_window::LoadWindow;
pub use random::{RandomSource, SplitMix64};
pub use range_table::{CoverageError, RangeTable, check_coverage};
pub use rebalance::{Action, Liveness, NodeView, RangeView, RebalancePolicy, plan_rebalance};
pub use split::{
    RangeLoad, SplitPolicy, SplitReason, boundary_split_key, load_split_has_room, load_split_key,
    may_split, plan_split, unpinned_split_key,
};
