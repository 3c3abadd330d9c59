//! The generated gRPC clients of Keel's services, made from a channel with Keel's message
//! limits and the client's credentials, so the request loops can send to any service. Knows
//! nothing of retries.

use keel_proto::v1::cluster_client::ClusterClient;
use keel_proto::v1::idempotency_client::IdempotencyClient;
use keel_proto::v1::kv_client::KvClient;
use keel_proto::v1::lock_client::LockClient;
use keel_types::{KvError, limits};
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

/// A channel whose every request carries the client's credentials.
pub(crate) type Transport = InterceptedService<Channel, Credentials>;

/// The bearer token every request carries, if the client has one.
#[derive(Debug, Clone, Default)]
pub(crate) struct Credentials {
    authorization: Option<MetadataValue<Ascii>>,
}

impl Credentials {
    /// Credentials of `token` (none: requests carry none). A token is visible ASCII.
    pub fn new(token: Option<&str>) -> Result<Credentials, KvError> {
        let Some(token) = token else {
            return Ok(Credentials::default());
        };
        if token.is_empty() || !token.bytes().all(|byte| byte.is_ascii_graphic()) {
            return Err(KvError::invalid(
                "token is empty or holds a space or a non-ASCII character",
            ));
        }
        let authorization = format!("Bearer {token}")
            .parse()
            .map_err(|_| KvError::invalid("token is not a valid header value"))?;
        Ok(Credentials {
            authorization: Some(authorization),
        })
    }
}

impl Interceptor for Credentials {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(authorization) = &self.authorization {
            request
                .metadata_mut()
                .insert("authorization", authorization.clone());
        }
        Ok(request)
    }
}

/// A generated client of one `keel.v1` service.
pub(crate) trait Stub: Sized {
    /// A client on `channel`, sending `credentials`, that sends and accepts messages up to
    /// the gRPC message limit.
    fn on(channel: Channel, credentials: Credentials) -> Self;
}

macro_rules! stub {
    ($($client:ident),*) => {$(
        impl Stub for $client<Transport> {
            fn on(channel: Channel, credentials: Credentials) -> Self {
                $client::with_interceptor(channel, credentials)
                    .max_decoding_message_size(limits::GRPC_MESSAGE_BYTES_MAX)
                    .max_encoding_message_size(limits::GRPC_MESSAGE_BYTES_MAX)
            }
        }
    )*};
}

stub!(KvClient, LockClient, IdempotencyClient, ClusterClient);
