//! gRPC server reflection (`grpc.reflection.v1` and `v1alpha`, for tools such as grpcurl),
//! from the descriptor sets built with the protos; it lists exactly the services the node
//! serves. Knows nothing of what they do.

use keel_proto::raft::raft_server;
use keel_proto::v1::{cluster_server, idempotency_server, kv_server, lock_server};
use tonic_reflection::pb::{v1, v1alpha};
use tonic_reflection::server::v1::{ServerReflection, ServerReflectionServer};
use tonic_reflection::server::v1alpha::{
    ServerReflection as AlphaReflection, ServerReflectionServer as AlphaServer,
};
use tonic_reflection::server::{Builder, Error};

/// Every service the node's gRPC server answers (also the services the metrics meter).
pub(crate) fn served() -> Vec<&'static str> {
    let mut services = vec![
        kv_server::SERVICE_NAME,
        lock_server::SERVICE_NAME,
        idempotency_server::SERVICE_NAME,
        cluster_server::SERVICE_NAME,
        raft_server::SERVICE_NAME,
        tonic_health::pb::health_server::SERVICE_NAME,
        v1::server_reflection_server::SERVICE_NAME,
        v1alpha::server_reflection_server::SERVICE_NAME,
    ];
    if cfg!(feature = "fault-injection") {
        services.push(keel_proto::test::v1::faults_server::SERVICE_NAME);
    }
    services
}

fn builder() -> Builder<'static> {
    let builder = Builder::configure()
        .include_reflection_service(false)
        .register_encoded_file_descriptor_set(keel_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(v1::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(v1alpha::FILE_DESCRIPTOR_SET);
    served()
        .into_iter()
        .fold(builder, |builder, name| builder.with_service_name(name))
}

/// The `grpc.reflection.v1` service.
pub(crate) fn v1_service() -> Result<ServerReflectionServer<impl ServerReflection>, Error> {
    builder().build_v1()
}

/// The `grpc.reflection.v1alpha` service, for older tools.
pub(crate) fn v1alpha_service() -> Result<AlphaServer<impl AlphaReflection>, Error> {
    builder().build_v1alpha()
}
