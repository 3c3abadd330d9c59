//! etcd's v3 API on Keel (`keel serve --etcd-listen ADDR`): etcd's `KV`, `Watch`, `Lease`,
//! `Cluster`, `Maintenance` and `Auth` services and the `v3lock` and `v3election` ones, served on a port of their own from the keys under
//! `etcd/` (`keel_types::pinned::ETCD_PREFIX`; a tenant's under its own namespace, `auth`
//! says how etcd's users are Keel's tokens), which Keel keeps
//! in one range so that the range's revision is etcd's revision. Each call is translated
//! (`convert`) and made on this node's `keel.v1.Kv` service in-process: the etcd room adds no
//! path of its own to the store. Knows nothing of Raft, storage or placement.

use std::sync::Arc;

use keel_proto::etcd::etcdserverpb::auth_server::AuthServer;
use keel_proto::etcd::etcdserverpb::cluster_server::ClusterServer;
use keel_proto::etcd::etcdserverpb::kv_server::KvServer;
use keel_proto::etcd::etcdserverpb::lease_server::LeaseServer;
use keel_proto::etcd::etcdserverpb::maintenance_server::MaintenanceServer;
use keel_proto::etcd::etcdserverpb::watch_server::WatchServer;
use keel_proto::etcd::v3electionpb::election_server::ElectionServer;
use keel_proto::etcd::v3lockpb::lock_server::LockServer;
use keel_types::limits;
use tokio::net::TcpListener;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;

use crate::access::tls::CallerLayer;
use crate::api::cluster::ClusterService;
use crate::api::kv::KvService;
use crate::requests::router::Audience;
use crate::shared::Shared;

mod auth;
mod cluster;
mod convert;
mod kv;
mod lease;
mod lock;
mod maintenance;
mod queue;
mod watch;

/// The etcd version `Maintenance.Status` reports: the release whose API protos Keel vendors
/// (proto/etcd), which current clients and Kubernetes accept.
pub(crate) const ETCD_VERSION: &str = "3.5.33";

/// Serves etcd's API on `listener` until `stop` resolves.
pub(crate) async fn serve(
    shared: Arc<Shared>,
    listener: TcpListener,
    stop: impl Future<Output = ()> + Send + 'static,
) -> Result<(), tonic::transport::Error> {
    let keel = || KvService::new(shared.clone(), Audience::Clients);
    let kv = KvServer::new(kv::EtcdKv::new(keel(), shared.node_id))
        .max_decoding_message_size(limits::GRPC_MESSAGE_BYTES_MAX)
        .max_encoding_message_size(limits::GRPC_MESSAGE_BYTES_MAX);
    let maintenance =
        MaintenanceServer::new(maintenance::EtcdMaintenance::new(shared.clone(), keel()));
    let watch = WatchServer::new(watch::EtcdWatch::new(keel(), shared.node_id))
        .max_decoding_message_size(limits::GRPC_MESSAGE_BYTES_MAX)
        .max_encoding_message_size(limits::GRPC_MESSAGE_BYTES_MAX);
    let scheme = if shared.tls.is_some() {
        "https"
    } else {
        "http"
    };
    let url = match listener.local_addr() {
        Ok(addr) => format!("{scheme}://{addr}"),
        Err(_) => String::new(),
    };
    let cluster = ClusterServer::new(cluster::EtcdCluster::new(
        ClusterService::new(shared.clone(), Audience::Clients),
        shared.node_id,
        url,
    ));
    let lease = LeaseServer::new(lease::EtcdLease::new(keel(), shared.node_id));
    let lock = lock::EtcdLock::new(
        kv::EtcdKv::new(keel(), shared.node_id),
        keel(),
        shared.node_id,
    );
    let election = ElectionServer::new(lock.clone());
    let lock = LockServer::new(lock);
    let auth = AuthServer::new(auth::EtcdAuth::new(shared.access.clone(), shared.node_id));
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    let mut server = Server::builder();
    if let Some(tls) = &shared.tls {
        server = server.tls_config(tls.server_config())?;
    }
    server
        .layer(CallerLayer::new(shared.tls.is_some()))
        .layer(auth::TokenLayer)
        .add_service(kv)
        .add_service(maintenance)
        .add_service(watch)
        .add_service(cluster)
        .add_service(lease)
        .add_service(lock)
        .add_service(election)
        .add_service(auth)
        .serve_with_incoming_shutdown(incoming, stop)
        .await
}
