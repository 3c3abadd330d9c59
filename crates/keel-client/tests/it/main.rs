//! Integration tests of keel-client against fake in-process Kv servers.

mod fake;
mod routing;
mod writes;
