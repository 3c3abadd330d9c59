//! Integration tests of the `keel` binary.

mod backup;
mod dev_tls;
mod five_nodes;
mod help;
mod process;
