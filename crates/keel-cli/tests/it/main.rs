//! Integration tests of the `keel` binary.

mod help;
mod process;
