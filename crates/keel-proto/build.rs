//! Generates Keel's gRPC code, and that of etcd's v3 API, with the vendored protoc, so no
//! system protoc is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut config = prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    let protos = [
        "../../proto/keel/v1/kv.proto",
        "../../proto/keel/v1/cluster.proto",
        "../../proto/keel/v1/lock.proto",
        "../../proto/keel/v1/idempotency.proto",
        "../../proto/keel/raft/v1/raft.proto",
        "../../proto/keel/test/v1/faults.proto",
    ];
    // The descriptor set serves gRPC reflection and names the methods the server meters.
    let out_dir = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        .file_descriptor_set_path(out_dir.join("keel_descriptor.bin"))
        .compile_with_config(config, &protos, &["../../proto"])?;
    // etcd's v3 API, vendored from an etcd release (proto/etcd/README.md).
    let etcd = [
        "../../proto/etcd/api/mvccpb/kv.proto",
        "../../proto/etcd/api/authpb/auth.proto",
        "../../proto/etcd/api/etcdserverpb/rpc.proto",
        "../../proto/etcd/server/etcdserver/api/v3lock/v3lockpb/v3lock.proto",
        "../../proto/etcd/server/etcdserver/api/v3election/v3electionpb/v3election.proto",
    ];
    let mut config = prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    tonic_prost_build::configure()
        .file_descriptor_set_path(out_dir.join("etcd_descriptor.bin"))
        .compile_with_config(config, &etcd, &["../../proto"])?;
    for proto in protos.iter().chain(&etcd) {
        println!("cargo:rerun-if-changed={proto}");
    }
    Ok(())
}
