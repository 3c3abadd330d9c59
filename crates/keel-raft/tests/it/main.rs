//! Raft groups of several in-process nodes joined by a loopback `Transport`. One test binary
//! made of modules.

mod loopback;
mod membership;
mod replication;
mod splits;
