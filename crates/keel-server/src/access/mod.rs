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
//! token bucket per tenant per node): every call of a tenant draws one token, a batch one
//! per op, and a call that needs more tokens than the bucket holds is refused as invalid.
//! Keys and bytes are reserved on the leader of the range a write goes to, against that
//! range's live counts (`requests/admission.rs`, deciding with `quota.rs`); the tenant keeps its
//! reservations in flight and the node's table of its ranges (`api/tenant_usage.rs`) here.

pub(crate) mod port;
pub(crate) mod quota;
pub(crate) mod tenancy;
pub(crate) mod tls;

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use keel_types::tenant::{Namespace, TenantName, namespace_prefix_len};
use keel_types::{KvError, RangeId, limits};
use serde::Deserialize;
use tonic::metadata::MetadataMap;
use tonic::{Request, Status};

use self::quota::{Amount, Draw, Limits, Refusal, Standing, TokenBucket};
use crate::access::tls::is_peer;
use crate::status::to_status;

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

/// One tenant: its namespace, quotas, and what this node counts of it.
#[derive(Debug)]
pub(crate) struct Tenant {
    pub name: TenantName,
    pub namespace: Namespace,
    pub quotas: Quotas,
    /// The ranges of the namespace and their counts, as this node's table last listed them.
    table: Mutex<Vec<(RangeId, Amount)>>,
    /// Keys and bytes of the tenant's writes admitted on this node and not yet applied.
    ledger: Mutex<Ledger>,
    requests: Mutex<TokenBucket>,
}

/// What a tenant has reserved on this node: in flight now, and released so far (only
/// grows, so an admission can tell what was released while it read the live counts).
#[derive(Debug, Default)]
struct Ledger {
    reserved: Amount,
    released: Amount,
}

/// Whose a token is: the name of its admin or tenant entry (the user name etcd's
/// `Authenticate` takes), and the caller it makes a request.
#[derive(Debug)]
struct Holder {
    name: String,
    caller: Caller,
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

/// What a call needs from its caller. Every call of a tenant but `Admin` (refused) draws
/// one request token, a batch one per op.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Call {
    /// Reads keys, locks or records.
    Read,
    /// Changes one key, lock or record.
    Write,
    /// Changes keys in a batch of `ops` operations.
    Batch { ops: usize },
    /// Lists the cluster as the caller may see it (members, its ranges, a session).
    Listing,
    /// Administers the cluster (splits, moves, nodes, backups, status).
    Admin,
}

impl Call {
    /// The request tokens the call draws.
    fn tokens(self) -> u32 {
        match self {
            Call::Read | Call::Write | Call::Listing => 1,
            Call::Batch { ops } => u32::try_from(ops.max(1)).unwrap_or(u32::MAX),
            Call::Admin => 0,
        }
    }
}

/// The tokens of a cluster with authentication on.
#[derive(Debug)]
pub struct Access {
    tokens: HashMap<String, Holder>,
    tenants: Vec<Arc<Tenant>>,
    /// The tenants by the prefix of their namespace.
    prefixes: HashMap<Vec<u8>, Arc<Tenant>>,
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
            prefixes: HashMap::new(),
        };
        let mut names = BTreeSet::new();
        for admin in file.admin {
            if !names.insert(format!("admin {}", admin.name)) {
                return Err(format!("admin {:?} is listed twice", admin.name));
            }
            let owner = format!("admin {:?}", admin.name);
            access.add_tokens(&owner, &admin.name, admin.tokens, Caller::Admin)?;
        }
        if file.tenant.len() > limits::TENANTS_MAX {
            return Err(format!(
                "it lists {} tenants; limit is {}",
                file.tenant.len(),
                limits::TENANTS_MAX
            ));
        }
        for entry in file.tenant {
            let name = TenantName::new(&entry.name)?;
            if !names.insert(format!("tenant {name}")) {
                return Err(format!("tenant {name} is listed twice"));
            }
            let tenant = Arc::new(Tenant::new(name, quotas(&entry)?));
            let owner = format!("tenant {}", tenant.name);
            let caller = Caller::Tenant(tenant.clone());
            access.add_tokens(&owner, &entry.name, entry.tokens, caller)?;
            let prefix = tenant.namespace.start().to_vec();
            access.prefixes.insert(prefix, tenant.clone());
            access.tenants.push(tenant);
        }
        if access.tokens.is_empty() {
            return Err("it lists no tokens; add an [[admin]] or a [[tenant]] with tokens".into());
        }
        Ok(access)
    }

    /// Adds the tokens of the entry `name` (described as `owner` in errors).
    fn add_tokens(
        &mut self,
        owner: &str,
        name: &str,
        tokens: Vec<String>,
        caller: Caller,
    ) -> Result<(), String> {
        if tokens.is_empty() {
            return Err(format!("{owner} has no tokens"));
        }
        for token in tokens {
            check_token(owner, &token)?;
            let holder = Holder {
                name: name.to_string(),
                caller: caller.clone(),
            };
            if self.tokens.insert(token, holder).is_some() {
                return Err(format!("a token of {owner} is given more than once"));
            }
        }
        Ok(())
    }

    /// The tenants, in the file's order.
    pub(crate) fn tenants(&self) -> &[Arc<Tenant>] {
        &self.tenants
    }

    /// The tenant whose namespace holds `stored` (a key, lock name or idempotency key as
    /// stored), if any.
    pub(crate) fn tenant_of(&self, stored: &[u8]) -> Option<&Arc<Tenant>> {
        let prefix = &stored[..namespace_prefix_len(stored)];
        self.prefixes.get(prefix)
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
            .map(|holder| holder.caller.clone())
            .ok_or_else(|| unauthenticated("unknown token"))
    }

    /// Whether `password` is a token of the admin or tenant entry called `name`: etcd's
    /// user name and password (`etcd::auth`), whose token is then the password itself.
    pub(crate) fn authenticate(&self, name: &str, password: &str) -> bool {
        self.tokens
            .get(password)
            .is_some_and(|holder| holder.name == name)
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
            table: Mutex::default(),
            ledger: Mutex::default(),
            name,
            quotas,
        }
    }

    /// Records the namespace's ranges and their counts as the range table lists them now.
    pub fn set_table(&self, ranges: Vec<(RangeId, Amount)>) {
        *self.table.lock().expect("tenant table lock poisoned") = ranges;
    }

    /// The tenant's keys and bytes as the node's range table last listed them (the counts
    /// its ranges' leaders reported, summed); `None` while the table lists no range of the
    /// namespace: before the first refresh, and while the namespace is still part of a
    /// range that holds others' keys too.
    pub fn usage(&self) -> Option<Amount> {
        let table = self.table.lock().expect("tenant table lock poisoned");
        let mut ranges = table.iter().map(|(_, counts)| *counts).peekable();
        ranges.peek()?;
        Some(ranges.fold(Amount::default(), Amount::plus))
    }

    /// The keys and bytes quotas.
    pub fn limits(&self) -> Limits {
        Limits {
            keys: self.quotas.keys,
            bytes: self.quotas.bytes,
        }
    }

    /// All the tenant has released on this node so far; an admission reads it before the
    /// live counts.
    pub fn released(&self) -> Amount {
        self.ledger
            .lock()
            .expect("tenant ledger lock poisoned")
            .released
    }

    /// Reserves `growth` for a write to `range` if the quotas admit it, judged by the range's
    /// `live` counts, read after the ledger had released `released_before`. What was
    /// released since may be in `live` or not, so it counts as still reserved.
    pub fn reserve(
        &self,
        range: RangeId,
        live: Amount,
        released_before: Amount,
        growth: Amount,
    ) -> Result<(), KvError> {
        let mut standing = self.standing(range);
        let mut ledger = self.ledger.lock().expect("tenant ledger lock poisoned");
        standing.live = live;
        standing.reserved = ledger.reserved.plus(ledger.released.since(released_before));
        quota::judge(&standing, growth, self.limits())
            .map_err(|Refusal { quota, limit }| self.exceeded(quota, limit))?;
        ledger.reserved = ledger.reserved.plus(growth);
        Ok(())
    }

    /// Gives back a reservation: its write was applied, refused or lost.
    pub fn release(&self, amount: Amount) {
        let mut ledger = self.ledger.lock().expect("tenant ledger lock poisoned");
        ledger.reserved = ledger.reserved.less(amount);
        let released = ledger.released;
        ledger.released = Amount {
            keys: released.keys.wrapping_add(amount.keys),
            bytes: released.bytes.wrapping_add(amount.bytes),
        };
    }

    /// What the table says of `range` and of the namespace's other ranges.
    fn standing(&self, range: RangeId) -> Standing {
        let table = self.table.lock().expect("tenant table lock poisoned");
        let mut standing = Standing::default();
        for (id, counts) in table.iter() {
            if *id == range {
                standing.reported = Some(*counts);
            } else {
                standing.others = standing.others.plus(*counts);
                standing.other_ranges += 1;
            }
        }
        standing
    }

    /// Admits one request of the tenant for `call`, or says which quota refuses it.
    fn admit(&self, call: Call, now: Instant) -> Result<(), KvError> {
        let tokens = call.tokens();
        let drawn = self
            .requests
            .lock()
            .expect("tenant bucket lock poisoned")
            .take(tokens, now);
        let rate = self.quotas.requests_per_sec.unwrap_or(0);
        match drawn {
            Draw::Taken => Ok(()),
            Draw::Empty => Err(self.exceeded("requests_per_sec", u64::from(rate))),
            Draw::TooLarge => Err(KvError::invalid(format!(
                "a batch of {tokens} ops counts as {tokens} requests; tenant {} may make \
                 {rate} requests per second: send batches of at most {rate} ops",
                self.name
            ))),
        }
    }

    fn exceeded(&self, quota: &str, limit: u64) -> KvError {
        KvError::QuotaExceeded {
            tenant: self.name.to_string(),
            quota: quota.to_string(),
            limit,
        }
    }

    /// Whether any quota needs the tenant's keys and bytes counted.
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

#[cfg(test)]
mod tests;
