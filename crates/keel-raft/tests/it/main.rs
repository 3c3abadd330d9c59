//! Raft groups of several in-process nodes joined by a loopback `Transport`. One test binary
//! made of modules.

mod follower_reads;
mod loopback;
mod membership;
mod replication;
mod splits;
