//! What the metrics endpoint tells of tenants and certificates (issue 22): the node leading
//! the meta range, and no other, serves each tenant's keys and bytes with its quotas, only
//! for tenants with a keys or bytes quota, labelled with the tenant's name and nothing of
//! its keys or values; every node serves when its certificates expire.

use keel_client::{Client, ClientOptions, PutOptions};
use keel_server::Access;
use keel_types::NodeId;

use crate::harness::{Cluster, eventually};
use crate::observability::scrape;
use crate::prometheus::Scrape;

const ADMIN: &str = "metrics-admin-0123456789";

/// A tenant with keys and bytes quotas, one with a request rate only, one with none.
const TOKENS: &str = r#"
[[admin]]
name = "ops"
tokens = ["metrics-admin-0123456789"]

[[tenant]]
name = "metered"
tokens = ["metrics-metered-0123456789"]
max_keys = 100
max_bytes = 65536

[[tenant]]
name = "paced"
tokens = ["metrics-paced-0123456789"]
max_requests_per_sec = 1000

[[tenant]]
name = "open"
tokens = ["metrics-open-0123456789"]
"#;

/// (tenant, token) of every tenant of `TOKENS`.
const TENANTS: [(&str, &str); 3] = [
    ("metered", "metrics-metered-0123456789"),
    ("paced", "metrics-paced-0123456789"),
    ("open", "metrics-open-0123456789"),
];

const TENANT_FAMILIES: [&str; 4] = [
    "keel_tenant_keys",
    "keel_tenant_size_bytes",
    "keel_tenant_quota_keys",
    "keel_tenant_quota_size_bytes",
];

/// The key and value each tenant writes: what no tenant series may show (both hold
/// "secret").
fn secret(tenant: &str) -> (String, String) {
    (
        format!("secret-key-{tenant}"),
        format!("secret-value-{tenant}"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_meta_leader_shows_usage_and_only_of_tenants_with_quotas() {
    let cluster = Cluster::start_authenticated(3, Access::parse(TOKENS).unwrap(), ADMIN).await;
    for (tenant, token) in TENANTS {
        let options = ClientOptions {
            token: Some(token.to_string()),
            ..cluster.client_options()
        };
        let endpoints = cluster.ids().into_iter().map(|id| cluster.endpoint(id));
        let client = Client::new(endpoints.collect(), options).unwrap();
        let (key, value) = secret(tenant);
        let put = client.put(key.as_bytes(), value.as_bytes(), PutOptions::default());
        put.await.unwrap();
    }
    // Once the meta leader's table counts metered's put: one node serves tenant samples,
    // the one whose same scrape says it leads range 0.
    let scrapes = eventually("the meta leader counts metered's key", || async {
        let scrapes = scrape_all(&cluster).await;
        let serving: Vec<NodeId> = scrapes
            .iter()
            .filter(|(_, scrape)| !tenant_samples(scrape).is_empty())
            .map(|(id, _)| *id)
            .collect();
        let leading: Vec<NodeId> = scrapes
            .iter()
            .filter(|(_, scrape)| leads_meta(scrape))
            .map(|(id, _)| *id)
            .collect();
        let [leader] = serving[..] else {
            return None;
        };
        let scrape = &scrapes.iter().find(|(id, _)| *id == leader)?.1;
        let keys = scrape.value("keel_tenant_keys", &[("tenant", "metered")]);
        (leading == [leader] && keys == Some(1.0)).then_some(scrapes)
    })
    .await;
    let (key, value) = secret("metered");
    let written = (key.len() + value.len()) as f64;
    for (id, scrape) in &scrapes {
        for family in TENANT_FAMILIES {
            assert_eq!(scrape.types.get(family).map(String::as_str), Some("gauge"));
        }
        let samples = tenant_samples(scrape);
        for (name, labels) in &samples {
            let shown = labels.iter().any(|(_, value)| value.contains("secret"));
            assert!(!shown, "node {id}: {name}{labels:?} shows a key or value");
        }
        if !leads_meta(scrape) {
            assert!(samples.is_empty(), "node {id}: {samples:?}");
            continue;
        }
        let metered = |name: &str| scrape.value(name, &[("tenant", "metered")]);
        assert_eq!(metered("keel_tenant_quota_keys"), Some(100.0));
        assert_eq!(metered("keel_tenant_quota_size_bytes"), Some(65536.0));
        let bytes = metered("keel_tenant_size_bytes").expect("metered's bytes");
        assert!(bytes >= written, "{bytes} bytes for a {written}-byte put");
        // Nothing of paced or open, whose usage is not counted; no label but the tenant's
        // name, and no key or value in any label.
        assert_eq!(samples.len(), 4, "node {id}: {samples:?}");
        for (name, labels) in samples {
            let label_names: Vec<&str> = labels.iter().map(|(k, _)| k.as_str()).collect();
            assert_eq!(label_names, ["tenant"], "{name}");
            let tenant = &labels[0].1;
            assert_eq!(tenant, "metered", "{name}");
        }
    }
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_node_shows_when_its_certificates_expire() {
    let cluster = Cluster::start_authenticated(3, Access::parse(TOKENS).unwrap(), ADMIN).await;
    // The harness's certificates keep rcgen's default notAfter.
    let not_after = rcgen::date_time_ymd(4096, 1, 1).unix_timestamp() as f64;
    for (id, scrape) in scrape_all(&cluster).await {
        for cert in ["node", "ca"] {
            let expiry = scrape.value(
                "keel_tls_certificate_expiry_time_seconds",
                &[("cert", cert)],
            );
            assert_eq!(expiry, Some(not_after), "node {id}, cert {cert}");
        }
    }
    cluster.shutdown().await;
}

/// Without TLS the family is declared and has no sample.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_tls_no_certificate_expires() {
    let cluster = Cluster::start(1).await;
    let scrape = scrape(&cluster, cluster.ids()[0]).await;
    let name = "keel_tls_certificate_expiry_time_seconds";
    assert_eq!(scrape.types.get(name).map(String::as_str), Some("gauge"));
    assert!(scrape.samples.keys().all(|(sample, _)| sample != name));
    cluster.shutdown().await;
}

async fn scrape_all(cluster: &Cluster) -> Vec<(NodeId, Scrape)> {
    let mut scrapes = Vec::new();
    for id in cluster.running() {
        scrapes.push((id, scrape(cluster, id).await));
    }
    scrapes
}

fn leads_meta(scrape: &Scrape) -> bool {
    scrape.value("keel_range_is_leader", &[("range_id", "0")]) == Some(1.0)
}

/// The samples of the tenant families: (name, labels).
fn tenant_samples(scrape: &Scrape) -> Vec<(String, Vec<(String, String)>)> {
    let samples = scrape.samples.keys();
    let tenant = samples.filter(|(name, _)| TENANT_FAMILIES.contains(&name.as_str()));
    tenant.cloned().collect()
}
