//! etcd's authentication on Keel's tokens file (`--auth-tokens`). etcd's user name is the
//! name of an admin or tenant entry of the file and its password one of that entry's tokens;
//! `Authenticate` answers the token itself, which etcd's clients then send in the `token`
//! header of every call. `TokenLayer` turns that header into Keel's
//! `authorization: Bearer TOKEN`, so a call through the etcd port is admitted, confined to
//! its tenant's namespace and held to its quotas exactly as the same call on Keel's own port.
//! Users, roles and permissions are the tokens file's: etcd's calls that manage them answer
//! `Unimplemented`.

use std::sync::Arc;
use std::task::{Context, Poll};

use http::HeaderValue;
use http::header::AUTHORIZATION;
use keel_proto::etcd::etcdserverpb::auth_server::Auth;
use keel_proto::etcd::etcdserverpb::{
    AuthDisableRequest, AuthDisableResponse, AuthEnableRequest, AuthEnableResponse,
    AuthRoleAddRequest, AuthRoleAddResponse, AuthRoleDeleteRequest, AuthRoleDeleteResponse,
    AuthRoleGetRequest, AuthRoleGetResponse, AuthRoleGrantPermissionRequest,
    AuthRoleGrantPermissionResponse, AuthRoleListRequest, AuthRoleListResponse,
    AuthRoleRevokePermissionRequest, AuthRoleRevokePermissionResponse, AuthStatusRequest,
    AuthStatusResponse, AuthUserAddRequest, AuthUserAddResponse, AuthUserChangePasswordRequest,
    AuthUserChangePasswordResponse, AuthUserDeleteRequest, AuthUserDeleteResponse,
    AuthUserGetRequest, AuthUserGetResponse, AuthUserGrantRoleRequest, AuthUserGrantRoleResponse,
    AuthUserListRequest, AuthUserListResponse, AuthUserRevokeRoleRequest,
    AuthUserRevokeRoleResponse, AuthenticateRequest, AuthenticateResponse,
};
use tonic::{Code, Request, Response, Status};
use tower_layer::Layer;
use tower_service::Service;

use super::convert::{self, unsupported};
use crate::access::Access;

/// The header etcd's clients send their token in.
const TOKEN_HEADER: &str = "token";

pub(crate) struct EtcdAuth {
    access: Option<Arc<Access>>,
    node_id: u64,
}

impl EtcdAuth {
    pub fn new(access: Option<Arc<Access>>, node_id: u64) -> EtcdAuth {
        EtcdAuth { access, node_id }
    }
}

/// What etcd's calls that manage users and roles answer: Keel's are the tokens file.
fn managed_by_file(what: &str) -> Status {
    unsupported(
        what,
        "users are the admins and tenants of the tokens file (`keel serve --auth-tokens`); edit it and restart the nodes",
    )
}

#[tonic::async_trait]
impl Auth for EtcdAuth {
    /// etcd's user is an entry of the tokens file and its password a token of the entry.
    async fn authenticate(
        &self,
        request: Request<AuthenticateRequest>,
    ) -> Result<Response<AuthenticateResponse>, Status> {
        let Some(access) = &self.access else {
            return Err(Status::new(
                Code::FailedPrecondition,
                "etcdserver: authentication is not enabled",
            ));
        };
        let request = request.into_inner();
        if !access.authenticate(&request.name, &request.password) {
            return Err(Status::new(
                Code::InvalidArgument,
                "etcdserver: authentication failed, invalid user ID or password",
            ));
        }
        Ok(Response::new(AuthenticateResponse {
            header: Some(convert::header(self.node_id, 0, 0)),
            token: request.password,
        }))
    }

    async fn auth_status(
        &self,
        _: Request<AuthStatusRequest>,
    ) -> Result<Response<AuthStatusResponse>, Status> {
        Ok(Response::new(AuthStatusResponse {
            header: Some(convert::header(self.node_id, 0, 0)),
            enabled: self.access.is_some(),
            auth_revision: 0,
        }))
    }

    async fn auth_enable(
        &self,
        _: Request<AuthEnableRequest>,
    ) -> Result<Response<AuthEnableResponse>, Status> {
        Err(unsupported(
            "auth enable",
            "start the nodes with `--auth-tokens FILE`",
        ))
    }

    async fn auth_disable(
        &self,
        _: Request<AuthDisableRequest>,
    ) -> Result<Response<AuthDisableResponse>, Status> {
        Err(unsupported(
            "auth disable",
            "start the nodes without `--auth-tokens`",
        ))
    }

    async fn user_add(
        &self,
        _: Request<AuthUserAddRequest>,
    ) -> Result<Response<AuthUserAddResponse>, Status> {
        Err(managed_by_file("user add"))
    }

    async fn user_get(
        &self,
        _: Request<AuthUserGetRequest>,
    ) -> Result<Response<AuthUserGetResponse>, Status> {
        Err(managed_by_file("user get"))
    }

    async fn user_list(
        &self,
        _: Request<AuthUserListRequest>,
    ) -> Result<Response<AuthUserListResponse>, Status> {
        Err(managed_by_file("user list"))
    }

    async fn user_delete(
        &self,
        _: Request<AuthUserDeleteRequest>,
    ) -> Result<Response<AuthUserDeleteResponse>, Status> {
        Err(managed_by_file("user delete"))
    }

    async fn user_change_password(
        &self,
        _: Request<AuthUserChangePasswordRequest>,
    ) -> Result<Response<AuthUserChangePasswordResponse>, Status> {
        Err(managed_by_file("user passwd"))
    }

    async fn user_grant_role(
        &self,
        _: Request<AuthUserGrantRoleRequest>,
    ) -> Result<Response<AuthUserGrantRoleResponse>, Status> {
        Err(managed_by_file("user grant-role"))
    }

    async fn user_revoke_role(
        &self,
        _: Request<AuthUserRevokeRoleRequest>,
    ) -> Result<Response<AuthUserRevokeRoleResponse>, Status> {
        Err(managed_by_file("user revoke-role"))
    }

    async fn role_add(
        &self,
        _: Request<AuthRoleAddRequest>,
    ) -> Result<Response<AuthRoleAddResponse>, Status> {
        Err(managed_by_file("role add"))
    }

    async fn role_get(
        &self,
        _: Request<AuthRoleGetRequest>,
    ) -> Result<Response<AuthRoleGetResponse>, Status> {
        Err(managed_by_file("role get"))
    }

    async fn role_list(
        &self,
        _: Request<AuthRoleListRequest>,
    ) -> Result<Response<AuthRoleListResponse>, Status> {
        Err(managed_by_file("role list"))
    }

    async fn role_delete(
        &self,
        _: Request<AuthRoleDeleteRequest>,
    ) -> Result<Response<AuthRoleDeleteResponse>, Status> {
        Err(managed_by_file("role delete"))
    }

    async fn role_grant_permission(
        &self,
        _: Request<AuthRoleGrantPermissionRequest>,
    ) -> Result<Response<AuthRoleGrantPermissionResponse>, Status> {
        Err(managed_by_file("role grant-permission"))
    }

    async fn role_revoke_permission(
        &self,
        _: Request<AuthRoleRevokePermissionRequest>,
    ) -> Result<Response<AuthRoleRevokePermissionResponse>, Status> {
        Err(managed_by_file("role revoke-permission"))
    }
}

/// Around the etcd port's services: a call with etcd's `token` header and no
/// `authorization` header gets `authorization: Bearer TOKEN`.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct TokenLayer;

impl<S> Layer<S> for TokenLayer {
    type Service = TokenService<S>;

    fn layer(&self, inner: S) -> TokenService<S> {
        TokenService { inner }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct TokenService<S> {
    inner: S,
}

impl<S, B> Service<http::Request<B>> for TokenService<S>
where
    S: Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> S::Future {
        bear_token(request.headers_mut());
        self.inner.call(request)
    }
}

/// Adds `authorization: Bearer TOKEN` for etcd's `token` header, unless the call carries an
/// `authorization` header already (Keel's own credentials win). A token that is not
/// visible ASCII is left alone: the call then has no credentials and is refused.
fn bear_token(headers: &mut http::HeaderMap) {
    if headers.contains_key(AUTHORIZATION) {
        return;
    }
    let bearer = headers
        .get(TOKEN_HEADER)
        .and_then(|token| token.to_str().ok())
        .and_then(|token| HeaderValue::from_str(&format!("Bearer {token}")).ok());
    if let Some(bearer) = bearer {
        headers.insert(AUTHORIZATION, bearer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcds_token_header_becomes_a_bearer_token_unless_one_is_given() {
        let mut headers = http::HeaderMap::new();
        headers.insert(
            TOKEN_HEADER,
            HeaderValue::from_static("acme-token-0123456789"),
        );
        bear_token(&mut headers);
        assert_eq!(
            headers[AUTHORIZATION],
            HeaderValue::from_static("Bearer acme-token-0123456789")
        );

        let mut both = http::HeaderMap::new();
        both.insert(
            TOKEN_HEADER,
            HeaderValue::from_static("acme-token-0123456789"),
        );
        both.insert(
            AUTHORIZATION,
            HeaderValue::from_static("Bearer admin-token-0123456789"),
        );
        bear_token(&mut both);
        assert_eq!(
            both[AUTHORIZATION],
            HeaderValue::from_static("Bearer admin-token-0123456789"),
            "Keel's own credentials win"
        );

        let mut none = http::HeaderMap::new();
        bear_token(&mut none);
        assert!(!none.contains_key(AUTHORIZATION));
    }
}
