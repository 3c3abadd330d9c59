//! Integration tests of keel-client against fake in-process Keel servers.

mod coordination;
mod fake;
mod leader_probe;
mod ranges;
mod routing;
mod spans;
mod writes;
