//! Endpoint addresses and one lazily connected channel per address, over TLS when the
//! options say so. Knows nothing of requests, leaders or retries.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use keel_types::{KvError, limits};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Uri};

use crate::options::{ClientOptions, ClientTls};

/// An endpoint as the client names it, `host:port`: the address alone, whatever scheme it
/// was given with (`http://` and `https://` are taken), so that a configured endpoint, a
/// node's address in the range table and a leader hint compare equal. Whether it is
/// dialled over TLS is the client's setting (`ClientOptions::tls`), one for all endpoints.
pub fn normalize(endpoint: &str) -> Result<String, KvError> {
    let endpoint = endpoint.trim();
    let bad = |why: &str| KvError::invalid(format!("endpoint {endpoint:?} {why}"));
    let authority = match endpoint.split_once("://") {
        Some(("http" | "https", authority)) => authority,
        Some(_) => return Err(bad("has a scheme other than http or https")),
        None => endpoint,
    };
    let authority = authority.trim_end_matches('/');
    let parsed: Uri = format!("http://{authority}")
        .parse()
        .map_err(|_| bad("is not host:port"))?;
    let path_empty = matches!(parsed.path(), "" | "/");
    if parsed.host().is_none_or(str::is_empty) || parsed.port_u16().is_none() || !path_empty {
        return Err(bad("is not host:port"));
    }
    Ok(authority.to_string())
}

/// Normalizes the configured endpoints: at least one, at most `CLIENT_ENDPOINTS_MAX`, no
/// duplicates after normalizing, and no scheme that contradicts the TLS setting (`https://`
/// without `tls`, `http://` with it).
pub fn normalize_all(endpoints: &[String], tls: bool) -> Result<Vec<String>, KvError> {
    if endpoints.is_empty() {
        return Err(KvError::invalid(
            "no endpoints; give at least one host:port",
        ));
    }
    if endpoints.len() > limits::CLIENT_ENDPOINTS_MAX {
        return Err(KvError::invalid(format!(
            "{} endpoints; limit is {}",
            endpoints.len(),
            limits::CLIENT_ENDPOINTS_MAX
        )));
    }
    let mut uris: Vec<String> = Vec::with_capacity(endpoints.len());
    for endpoint in endpoints {
        check_scheme(endpoint.trim(), tls)?;
        let uri = normalize(endpoint)?;
        if !uris.contains(&uri) {
            uris.push(uri);
        }
    }
    Ok(uris)
}

fn check_scheme(endpoint: &str, tls: bool) -> Result<(), KvError> {
    let why = match (endpoint.split_once("://"), tls) {
        (Some(("https", _)), false) => "uses https, but the client has no TLS settings (a CA)",
        (Some(("http", _)), true) => "uses http, but the client is set to use TLS",
        _ => return Ok(()),
    };
    Err(KvError::invalid(format!("endpoint {endpoint:?} {why}")))
}

/// Channels by endpoint (`host:port`). Holds the configured endpoints and the leaders
/// replicas named, so it is bounded by `CLIENT_ENDPOINTS_MAX + CLUSTER_NODES_MAX`; past that
/// it starts over (channels are cheap to reopen).
pub struct Pool {
    connect_timeout: Duration,
    /// TLS to every endpoint, when the client has a CA.
    tls: Option<ClientTlsConfig>,
    channels: Mutex<HashMap<String, Channel>>,
}

impl Pool {
    /// A pool connecting as `options` say; refuses a CA that holds no certificate.
    pub fn new(options: &ClientOptions) -> Result<Pool, KvError> {
        let tls = options.tls.as_ref().map(tls_config).transpose()?;
        Ok(Pool {
            connect_timeout: options.connect_timeout,
            tls,
            channels: Mutex::new(HashMap::new()),
        })
    }

    /// The channel to `uri` (already normalized). Connects on first use, not here; must be
    /// called inside a tokio runtime.
    pub fn channel(&self, uri: &str) -> Result<Channel, KvError> {
        let mut channels = self.channels.lock().expect("channel pool lock poisoned");
        if let Some(channel) = channels.get(uri) {
            return Ok(channel.clone());
        }
        if channels.len() >= limits::CLIENT_ENDPOINTS_MAX + limits::CLUSTER_NODES_MAX {
            channels.clear();
        }
        let channel = self.endpoint(uri)?.connect_lazy();
        channels.insert(uri.to_string(), channel.clone());
        Ok(channel)
    }

    /// `https://uri` with the TLS settings, or `http://uri`.
    fn endpoint(&self, uri: &str) -> Result<Endpoint, KvError> {
        let invalid =
            |error: tonic::transport::Error| KvError::invalid(format!("endpoint {uri:?}: {error}"));
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let endpoint = Endpoint::from_shared(format!("{scheme}://{uri}"))
            .map_err(invalid)?
            .connect_timeout(self.connect_timeout)
            .tcp_nodelay(true);
        match &self.tls {
            Some(tls) => endpoint.tls_config(tls.clone()).map_err(invalid),
            None => Ok(endpoint),
        }
    }
}

/// The TLS of every connection: the CA as the only trust root, the server name to check
/// when it is not each address's host; handshakes bounded like connects.
fn tls_config(tls: &ClientTls) -> Result<ClientTlsConfig, KvError> {
    let invalid = |why: String| KvError::invalid(format!("TLS CA: {why}"));
    let mut count = 0;
    for certificate in CertificateDer::pem_slice_iter(&tls.ca_pem) {
        certificate.map_err(|error| invalid(error.to_string()))?;
        count += 1;
    }
    if count == 0 {
        return Err(invalid("no PEM certificate in it".to_string()));
    }
    let config = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&tls.ca_pem))
        .timeout(Duration::from_millis(limits::TLS_HANDSHAKE_TIMEOUT_MS));
    Ok(match &tls.server_name {
        Some(name) => config.domain_name(name.clone()),
        None => config,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_normalize_to_host_and_port() {
        let cases: [(&str, Result<&str, &str>); 10] = [
            ("127.0.0.1:7001", Ok("127.0.0.1:7001")),
            ("http://127.0.0.1:7001", Ok("127.0.0.1:7001")),
            ("http://localhost:7001/", Ok("localhost:7001")),
            ("https://a:1", Ok("a:1")),
            (" node-2:80 ", Ok("node-2:80")),
            ("grpc://a:1", Err("scheme other than http or https")),
            ("127.0.0.1", Err("not host:port")),
            ("a:1/path", Err("not host:port")),
            ("https://", Err("not host:port")),
            ("", Err("not host:port")),
        ];
        for (endpoint, expected) in cases {
            match (normalize(endpoint), expected) {
                (Ok(uri), Ok(want)) => assert_eq!(uri, want),
                (Err(KvError::InvalidArgument { message }), Err(want)) => {
                    assert!(message.contains(want), "{endpoint:?}: {message}")
                }
                (got, want) => panic!("{endpoint:?}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn endpoint_lists_are_bounded_and_deduplicated() {
        let same = vec!["a:1".to_string(), "http://a:1".to_string()];
        assert_eq!(normalize_all(&same, false), Ok(vec!["a:1".to_string()]));
        assert!(normalize_all(&[], false).is_err());
        let many: Vec<String> = (0..=limits::CLIENT_ENDPOINTS_MAX)
            .map(|i| format!("a:{}", i + 1))
            .collect();
        assert!(normalize_all(&many, false).is_err());
    }

    #[test]
    fn an_endpoint_scheme_must_agree_with_the_tls_setting() {
        let cases = [
            (
                "https://a:1",
                false,
                Some("uses https, but the client has no TLS settings"),
            ),
            (
                "http://a:1",
                true,
                Some("uses http, but the client is set to use TLS"),
            ),
            ("https://a:1", true, None),
            ("http://a:1", false, None),
            ("a:1", true, None),
            ("a:1", false, None),
        ];
        for (endpoint, tls, expected) in cases {
            let result = normalize_all(&[endpoint.to_string()], tls);
            match (result, expected) {
                (Ok(uris), None) => assert_eq!(uris, ["a:1"]),
                (Err(KvError::InvalidArgument { message }), Some(want)) => {
                    assert!(message.contains(want), "{endpoint:?}: {message}")
                }
                (got, want) => panic!("{endpoint:?} tls {tls}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn a_tls_ca_without_a_certificate_is_refused() {
        let options = |ca_pem: &[u8]| ClientOptions {
            tls: Some(ClientTls {
                ca_pem: ca_pem.to_vec(),
                server_name: None,
            }),
            ..ClientOptions::default()
        };
        let error = Pool::new(&options(b"not a certificate")).err();
        let Some(KvError::InvalidArgument { message }) = error else {
            panic!("{error:?}");
        };
        assert_eq!(message, "TLS CA: no PEM certificate in it");
        let garbage = b"-----BEGIN CERTIFICATE-----\n!!\n-----END CERTIFICATE-----\n";
        assert!(Pool::new(&options(garbage)).is_err());
        assert!(Pool::new(&ClientOptions::default()).is_ok());
    }
}
