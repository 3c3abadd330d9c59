//! In-process clusters of keel-server nodes on loopback. One test binary made of modules.

mod cluster;
mod harness;
mod splits;
