//! The generated gRPC clients of Keel's services, made from a channel with Keel's message
//! limits, so the request loops can send to any service. Knows nothing of retries.

use keel_proto::v1::cluster_client::ClusterClient;
use keel_proto::v1::idempotency_client::IdempotencyClient;
use keel_proto::v1::kv_client::KvClient;
use keel_proto::v1::lock_client::LockClient;
use keel_types::limits;
use tonic::transport::Channel;

/// A generated client of one `keel.v1` service.
pub(crate) trait Stub: Sized {
    /// A client on `channel` that sends and accepts messages up to the gRPC message limit.
    fn on(channel: Channel) -> Self;
}

impl Stub for KvClient<Channel> {
    fn on(channel: Channel) -> Self {
        KvClient::new(channel)
            .max_decoding_message_size(limits::GRPC_MESSAGE_BYTES_MAX)
            .max_encoding_message_size(limits::GRPC_MESSAGE_BYTES_MAX)
    }
}

impl Stub for LockClient<Channel> {
    fn on(channel: Channel) -> Self {
        LockClient::new(channel)
            .max_decoding_message_size(limits::GRPC_MESSAGE_BYTES_MAX)
            .max_encoding_message_size(limits::GRPC_MESSAGE_BYTES_MAX)
    }
}

impl Stub for IdempotencyClient<Channel> {
    fn on(channel: Channel) -> Self {
        IdempotencyClient::new(channel)
            .max_decoding_message_size(limits::GRPC_MESSAGE_BYTES_MAX)
            .max_encoding_message_size(limits::GRPC_MESSAGE_BYTES_MAX)
    }
}

impl Stub for ClusterClient<Channel> {
    fn on(channel: Channel) -> Self {
        ClusterClient::new(channel)
            .max_decoding_message_size(limits::GRPC_MESSAGE_BYTES_MAX)
            .max_encoding_message_size(limits::GRPC_MESSAGE_BYTES_MAX)
    }
}
