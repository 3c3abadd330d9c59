//! Who is calling, and what they may do. With `--auth-tokens FILE`, every request to the
//! public services carries `authorization: Bearer TOKEN`; the file maps each token to an
//! admin or to a tenant. A tenant's keys, locks and idempotency records live in its own
//! namespace (`keel_types::tenant`; `tenancy.rs` rewrites its requests and answers), it may
//! list the ranges of its namespace but not administer the cluster, and it is held to its
//! quotas. An admin sees the raw keyspace and may call everything. A call from a peer node
//! (a node certificate, `tls::is_peer`) without a token is the system's own: a request a node
//! forwards for a client was rewritten on the first node, so it goes on as the system's.
//! Without the file (`keel dev`), every caller is the system: one namespace, no quotas.
//!
//! Quotas: requests per second are counted on the node that first receives the request (a
//! token bucket per tenant per node). Keys and bytes are checked against the tenant's usage
//! as the range table reports it, refreshed every `TENANT_USAGE_REFRESH_MS`
//! (`tenant_usage.rs`): a tenant at or over a limit has its writes that may add data refused
//! (deletes go through), and one can pass a limit by what it writes before the next refresh.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use keel_types::tenant::{Namespace, TenantName};
use keel_types::{KvError, limits};
use serde::Deserialize;
use tonic::metadata::MetadataMap;
use tonic::{Request, Status};

use crate::status::to_status;
use crate::tls::is_peer;

/// The caller of `request`, when it may make `call` now; else the status to answer. With
/// authentication off (`access` is `None`) every caller is the system.
pub(crate) fn admit<T>(
    access: Option<&Access>,
    request: &Request<T>,
    call: Call,
) -> Result<Caller, Status> {
    let Some(access) = access else {
        return Ok(Caller::System);
    };
    let admitted = access
        .caller(request.metadata(), is_peer(request))
        .and_then(|caller| caller.admit(call).map(|()| caller));
    admitted.map_err(|error| to_status(&error))
}

/// The tokens file, as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokensFile {
    #[serde(default)]
    admin: Vec<AdminEntry>,
    #[serde(default)]
    tenant: Vec<TenantEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AdminEntry {
    name: String,
    tokens: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantEntry {
    name: String,
    tokens: Vec<String>,
    max_keys: Option<u64>,
    max_bytes: Option<u64>,
    max_requests_per_sec: Option<u32>,
}

/// A tenant's limits; `None` = unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Quotas {
    pub keys: Option<u64>,
    pub bytes: Option<u64>,
    pub requests_per_sec: Option<u32>,
}

/// Keys and bytes (keys + values) a tenant stores, as last counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Usage {
    pub keys: u64,
    pub bytes: u64,
}

/// One tenant: its namespace, quotas, and what this node counts of it.
#[derive(Debug)]
pub(crate) struct Tenant {
    pub name: TenantName,
    pub namespace: Namespace,
    pub quotas: Quotas,
    usage: Mutex<Usage>,
    requests: Mutex<TokenBucket>,
}

/// Who a request is from.
#[derive(Debug, Clone)]
pub(crate) enum Caller {
    /// A peer node, or anyone while authentication is off: the raw keyspace, every call.
    System,
    /// An admin token: the raw keyspace, every call.
    Admin,
    /// A tenant token: its namespace, the calls of applications.
    Tenant(Arc<Tenant>),
}

/// What a call needs from its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Call {
    /// Reads keys, locks or records.
    Read,
    /// Changes them; `grows` when it may add keys or bytes (a put, an increment).
    Write { grows: bool },
    /// Lists the cluster as the caller may see it (members, its ranges, a session).
    Listing,
    /// Administers the cluster (splits, moves, nodes, backups, status).
    Admin,
}

/// The tokens of a cluster with authentication on.
#[derive(Debug)]
pub struct Access {
    tokens: HashMap<String, Caller>,
    tenants: Vec<Arc<Tenant>>,
}

impl Access {
    /// Reads and checks the tokens file at `path`.
    pub fn load(path: &Path) -> Result<Access, String> {
        let size = std::fs::metadata(path)
            .map_err(|e| format!("reading tokens file {}: {e}", path.display()))?
            .len();
        if size > limits::AUTH_FILE_BYTES_MAX as u64 {
            return Err(format!(
                "tokens file {} is {size} bytes; limit is {}",
                path.display(),
                limits::AUTH_FILE_BYTES_MAX
            ));
        }
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("reading tokens file {}: {e}", path.display()))?;
        Access::parse(&text).map_err(|e| format!("tokens file {}: {e}", path.display()))
    }

    /// Parses and checks a tokens file: valid and distinct names, tokens of 16 to 256
    /// visible ASCII characters, each token given once, at least one token.
    pub fn parse(text: &str) -> Result<Access, String> {
        let file: TokensFile = toml::from_str(text).map_err(|e| e.to_string())?;
        let mut access = Access {
            tokens: HashMap::new(),
            tenants: Vec::new(),
        };
        let mut names = BTreeSet::new();
        for admin in file.admin {
            if !names.insert(format!("admin {}", admin.name)) {
                return Err(format!("admin {:?} is listed twice", admin.name));
            }
            access.add_tokens(
                &format!("admin {:?}", admin.name),
                admin.tokens,
                Caller::Admin,
            )?;
        }
        for entry in file.tenant {
            let name = TenantName::new(&entry.name)?;
            if !names.insert(format!("tenant {name}")) {
                return Err(format!("tenant {name} is listed twice"));
            }
            let tenant = Arc::new(Tenant::new(name, quotas(&entry)?));
            let owner = format!("tenant {}", tenant.name);
            access.add_tokens(&owner, entry.tokens, Caller::Tenant(tenant.clone()))?;
            access.tenants.push(tenant);
        }
        if access.tokens.is_empty() {
            return Err("it lists no tokens; add an [[admin]] or a [[tenant]] with tokens".into());
        }
        Ok(access)
    }

    fn add_tokens(
        &mut self,
        owner: &str,
        tokens: Vec<String>,
        caller: Caller,
    ) -> Result<(), String> {
        if tokens.is_empty() {
            return Err(format!("{owner} has no tokens"));
        }
        for token in tokens {
            check_token(owner, &token)?;
            if self.tokens.insert(token, caller.clone()).is_some() {
                return Err(format!("a token of {owner} is given more than once"));
            }
        }
        Ok(())
    }

    /// The tenants, in the file's order.
    pub(crate) fn tenants(&self) -> &[Arc<Tenant>] {
        &self.tenants
    }

    /// The caller of a request with `metadata`, which came from a peer node or not.
    pub(crate) fn caller(&self, metadata: &MetadataMap, peer: bool) -> Result<Caller, KvError> {
        let Some(header) = metadata.get("authorization") else {
            return match peer {
                true => Ok(Caller::System),
                false => Err(unauthenticated(
                    "no bearer token; this cluster requires `authorization: Bearer TOKEN`",
                )),
            };
        };
        let token = header
            .to_str()
            .ok()
            .and_then(|value| value.strip_prefix("Bearer "))
            .ok_or_else(|| unauthenticated("the authorization header is not `Bearer TOKEN`"))?;
        self.tokens
            .get(token.trim())
            .cloned()
            .ok_or_else(|| unauthenticated("unknown token"))
    }
}

fn quotas(entry: &TenantEntry) -> Result<Quotas, String> {
    if entry.max_requests_per_sec == Some(0) {
        return Err(format!(
            "tenant {} has max_requests_per_sec 0; leave it out for no limit",
            entry.name
        ));
    }
    Ok(Quotas {
        keys: entry.max_keys,
        bytes: entry.max_bytes,
        requests_per_sec: entry.max_requests_per_sec,
    })
}

fn check_token(owner: &str, token: &str) -> Result<(), String> {
    let length = token.len();
    if !(limits::TOKEN_BYTES_MIN..=limits::TOKEN_BYTES_MAX).contains(&length) {
        return Err(format!(
            "a token of {owner} has {length} characters; tokens must have {} to {}",
            limits::TOKEN_BYTES_MIN,
            limits::TOKEN_BYTES_MAX
        ));
    }
    if !token.bytes().all(|byte| byte.is_ascii_graphic()) {
        return Err(format!(
            "a token of {owner} holds a space or a non-ASCII character; tokens are visible ASCII"
        ));
    }
    Ok(())
}

fn unauthenticated(message: &str) -> KvError {
    KvError::Unauthenticated {
        message: message.to_string(),
    }
}

impl Tenant {
    fn new(name: TenantName, quotas: Quotas) -> Tenant {
        Tenant {
            namespace: Namespace::of(&name),
            requests: Mutex::new(TokenBucket::new(quotas.requests_per_sec)),
            usage: Mutex::default(),
            name,
            quotas,
        }
    }

    /// Records the tenant's usage as counted now.
    pub fn set_usage(&self, usage: Usage) {
        *self.usage.lock().expect("tenant usage lock poisoned") = usage;
    }

    pub fn usage(&self) -> Usage {
        *self.usage.lock().expect("tenant usage lock poisoned")
    }

    /// Admits one request of the tenant for `call`, or says which quota refuses it.
    fn admit(&self, call: Call, now: Instant) -> Result<(), KvError> {
        if let Call::Write { grows: true } = call {
            let usage = self.usage();
            self.within("keys", usage.keys, self.quotas.keys)?;
            self.within("bytes", usage.bytes, self.quotas.bytes)?;
        }
        if matches!(call, Call::Read | Call::Write { .. }) {
            let mut bucket = self.requests.lock().expect("tenant bucket lock poisoned");
            if !bucket.take(now) {
                return Err(self.exceeded(
                    "requests_per_sec",
                    self.quotas.requests_per_sec.map_or(0, u64::from),
                ));
            }
        }
        Ok(())
    }

    fn within(&self, quota: &str, used: u64, limit: Option<u64>) -> Result<(), KvError> {
        match limit {
            Some(limit) if used >= limit => Err(self.exceeded(quota, limit)),
            _ => Ok(()),
        }
    }

    fn exceeded(&self, quota: &str, limit: u64) -> KvError {
        KvError::QuotaExceeded {
            tenant: self.name.to_string(),
            quota: quota.to_string(),
            limit,
        }
    }

    /// Whether any quota needs the tenant's usage counted.
    pub fn counts_usage(&self) -> bool {
        self.quotas.keys.is_some() || self.quotas.bytes.is_some()
    }
}

impl Caller {
    /// Whether the caller may make `call`, and (for a tenant) its quotas admit it now.
    pub fn admit(&self, call: Call) -> Result<(), KvError> {
        match (self, call) {
            (Caller::System | Caller::Admin, _) => Ok(()),
            (Caller::Tenant(tenant), Call::Admin) => Err(KvError::PermissionDenied {
                message: format!(
                    "tenant {} may not administer the cluster; use an admin token",
                    tenant.name
                ),
            }),
            (Caller::Tenant(tenant), call) => tenant.admit(call, Instant::now()),
        }
    }

    /// The caller's namespace; `None` for the raw keyspace.
    pub fn namespace(&self) -> Option<&Namespace> {
        match self {
            Caller::Tenant(tenant) => Some(&tenant.namespace),
            Caller::System | Caller::Admin => None,
        }
    }
}

/// Requests a tenant may make on one node: up to its rate per second, bursts of up to one
/// second's worth.
#[derive(Debug)]
struct TokenBucket {
    rate: Option<f64>,
    available: f64,
    filled_at: Option<Instant>,
}

impl TokenBucket {
    fn new(per_sec: Option<u32>) -> TokenBucket {
        let rate = per_sec.map(f64::from);
        TokenBucket {
            rate,
            available: rate.unwrap_or(0.0),
            filled_at: None,
        }
    }

    /// Takes one request's token if there is one at `now`.
    fn take(&mut self, now: Instant) -> bool {
        let Some(rate) = self.rate else { return true };
        if let Some(filled_at) = self.filled_at {
            let elapsed = now.saturating_duration_since(filled_at).as_secs_f64();
            self.available = (self.available + elapsed * rate).min(rate);
        }
        self.filled_at = Some(now);
        if self.available >= 1.0 {
            self.available -= 1.0;
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests;
