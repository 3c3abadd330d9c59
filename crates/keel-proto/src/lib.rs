//! Keel's generated gRPC code (`keel.v1`, `keel.raft.v1`, `keel.test.v1`) and conversions between the wire
//! types and `keel-types`. Knows nothing of servers, storage or Raft internals.

pub mod convert;

/// The encoded `FileDescriptorSet` of every Keel proto (`keel.v1`, `keel.raft.v1`,
/// `keel.test.v1`), for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/keel_descriptor.bin"));

/// The public API: `Kv`, `Lock`, `Idempotency` and `Cluster`.
pub mod v1 {
    tonic::include_proto!("keel.v1");
}

/// Raft traffic between nodes.
pub mod raft {
    tonic::include_proto!("keel.raft.v1");
}

/// Test-only fault control (served only by builds with the `fault-injection` feature).
pub mod test {
    pub mod v1 {
        tonic::include_proto!("keel.test.v1");
    }
}
