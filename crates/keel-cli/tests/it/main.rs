//! Integration tests of the `keel` binary.

mod five_nodes;
mod help;
mod process;
