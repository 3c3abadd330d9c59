//! Integration tests of the `keel` binary.

mod backup;
mod five_nodes;
mod help;
mod process;
