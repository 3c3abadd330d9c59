//! Keel's generated gRPC code (`keel.v1`, `keel.raft.v1`, `keel.test.v1`), that of etcd's v3
//! API (`etcd`), and conversions between Keel's wire types and `keel-types`. Knows nothing of
//! servers, storage or Raft internals.

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

/// etcd's v3 API as vendored in `proto/etcd` from an etcd release (`proto/etcd/README.md`):
/// etcd's packages, messages and services, so the wire format and the gRPC method paths
/// (`/etcdserverpb.KV/Range`, ...) are etcd's.
pub mod etcd {
    /// Keys and events (`mvccpb`).
    pub mod mvccpb {
        tonic::include_proto!("mvccpb");
    }
    /// Users, roles and permissions (`authpb`).
    pub mod authpb {
        tonic::include_proto!("authpb");
    }
    /// KV, Watch, Lease, Cluster, Maintenance and Auth (`etcdserverpb`).
    pub mod etcdserverpb {
        tonic::include_proto!("etcdserverpb");
    }
    /// The Lock service (`v3lockpb`).
    pub mod v3lockpb {
        tonic::include_proto!("v3lockpb");
    }
    /// The Election service (`v3electionpb`).
    pub mod v3electionpb {
        tonic::include_proto!("v3electionpb");
    }
    /// The encoded `FileDescriptorSet` of etcd's protos, for gRPC server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        include_bytes!(concat!(env!("OUT_DIR"), "/etcd_descriptor.bin"));
}

/// Test-only fault control (served only by builds with the `fault-injection` feature).
pub mod test {
    pub mod v1 {
        tonic::include_proto!("keel.test.v1");
    }
}

#[cfg(test)]
mod etcd_tests;
