//! etcd's `Cluster` service on Keel: `MemberList` lists the Keel nodes that are not removed
//! (from `keel.v1.Cluster.Members`, made in-process with the caller's metadata). A node's
//! etcd address is known only to itself, so only the answering node lists client URLs.
//! Member changes answer `Unimplemented`, naming Keel's own commands.

use keel_proto::etcd::etcdserverpb::cluster_server::Cluster;
use keel_proto::etcd::etcdserverpb::{
    Member, MemberAddRequest, MemberAddResponse, MemberListRequest, MemberListResponse,
    MemberPromoteRequest, MemberPromoteResponse, MemberRemoveRequest, MemberRemoveResponse,
    MemberUpdateRequest, MemberUpdateResponse,
};
use keel_proto::v1::cluster_server::Cluster as KeelCluster;
use keel_proto::v1::{MembersRequest, NodeInfo};
use tonic::{Request, Response, Status};

use super::convert::{self, unsupported};
use crate::api::cluster::ClusterService;

pub(crate) struct EtcdCluster {
    cluster: ClusterService,
    node_id: u64,
    /// This node's etcd URL (`http://` or, with TLS, `https://` and `--etcd-listen`).
    url: String,
}

impl EtcdCluster {
    pub fn new(cluster: ClusterService, node_id: u64, url: String) -> EtcdCluster {
        EtcdCluster {
            cluster,
            node_id,
            url,
        }
    }

    fn member(&self, node: NodeInfo, scheme: &str) -> Member {
        let client_urls = match node.node_id == self.node_id {
            true => vec![self.url.clone()],
            false => Vec::new(),
        };
        Member {
            id: node.node_id,
            name: format!("keel-{}", node.node_id),
            peer_ur_ls: vec![format!("{scheme}://{}", node.peer_addr)],
            client_ur_ls: client_urls,
            is_learner: false,
        }
    }
}

#[tonic::async_trait]
impl Cluster for EtcdCluster {
    async fn member_list(
        &self,
        request: Request<MemberListRequest>,
    ) -> Result<Response<MemberListResponse>, Status> {
        let (metadata, _, _) = request.into_parts();
        let mut asked = Request::new(MembersRequest::default());
        *asked.metadata_mut() = metadata;
        let members = self.cluster.members(asked).await;
        let members = members.map_err(convert::status)?.into_inner();
        let scheme = match self.url.starts_with("https://") {
            true => "https",
            false => "http",
        };
        let members = members
            .nodes
            .into_iter()
            .filter(|node| node.state != "removed")
            .map(|node| self.member(node, scheme))
            .collect();
        Ok(Response::new(MemberListResponse {
            header: Some(convert::header(self.node_id, 0, 0)),
            members,
        }))
    }

    async fn member_add(
        &self,
        _: Request<MemberAddRequest>,
    ) -> Result<Response<MemberAddResponse>, Status> {
        Err(unsupported("member add", "use `keel cluster add-node`"))
    }

    async fn member_remove(
        &self,
        _: Request<MemberRemoveRequest>,
    ) -> Result<Response<MemberRemoveResponse>, Status> {
        Err(unsupported(
            "member remove",
            "use `keel cluster remove-node`",
        ))
    }

    async fn member_update(
        &self,
        _: Request<MemberUpdateRequest>,
    ) -> Result<Response<MemberUpdateResponse>, Status> {
        Err(unsupported(
            "member update",
            "use `keel serve --advertise` (a node's address)",
        ))
    }

    async fn member_promote(
        &self,
        _: Request<MemberPromoteRequest>,
    ) -> Result<Response<MemberPromoteResponse>, Status> {
        Err(unsupported(
            "member promote",
            "Keel's placement promotes replicas itself",
        ))
    }
}
