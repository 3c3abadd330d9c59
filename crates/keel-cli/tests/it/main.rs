//! Integration tests of the `keel` binary.

mod backup;
mod consistency;
mod deploy;
mod dev_tls;
mod etcd;
mod five_nodes;
mod help;
mod process;
mod values;
