//! Raft log store and state machine on redb. Knows nothing about gRPC, placement or the
//! network.

pub mod raft_types;
