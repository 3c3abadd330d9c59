//! Endpoint addresses and one lazily connected channel per address. Knows nothing of
//! requests, leaders or retries.

use std::collections::HashMap;
use std::sync::Mutex;

use keel_types::{KvError, limits};
use tonic::transport::{Channel, Endpoint, Uri};

use crate::options::ClientOptions;

/// An endpoint as a URI: `host:port` becomes `http://host:port`; `http://host:port` stays.
/// TLS is not supported yet, so `https://` is refused.
pub fn normalize(endpoint: &str) -> Result<String, KvError> {
    let endpoint = endpoint.trim();
    let bad = |why: &str| KvError::invalid(format!("endpoint {endpoint:?} {why}"));
    if endpoint.starts_with("https://") {
        return Err(bad("uses https; TLS is not supported, use host:port"));
    }
    let uri = match endpoint.strip_prefix("http://") {
        Some(_) => endpoint.to_string(),
        None if endpoint.contains("://") => return Err(bad("has a scheme other than http")),
        None => format!("http://{endpoint}"),
    };
    let parsed: Uri = uri.parse().map_err(|_| bad("is not host:port"))?;
    let path_empty = matches!(parsed.path(), "" | "/");
    if parsed.host().is_none_or(str::is_empty) || parsed.port_u16().is_none() || !path_empty {
        return Err(bad("is not host:port"));
    }
    Ok(uri.trim_end_matches('/').to_string())
}

/// Normalizes the configured endpoints: at least one, at most `CLIENT_ENDPOINTS_MAX`, no
/// duplicates after normalizing.
pub fn normalize_all(endpoints: &[String]) -> Result<Vec<String>, KvError> {
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
        let uri = normalize(endpoint)?;
        if !uris.contains(&uri) {
            uris.push(uri);
        }
    }
    Ok(uris)
}

/// Channels by URI. Holds the configured endpoints and the leaders replicas named, so it is
/// bounded by `CLIENT_ENDPOINTS_MAX + CLUSTER_NODES_MAX`; past that it starts over (channels
/// are cheap to reopen).
pub struct Pool {
    options: ClientOptions,
    channels: Mutex<HashMap<String, Channel>>,
}

impl Pool {
    pub fn new(options: ClientOptions) -> Pool {
        Pool {
            options,
            channels: Mutex::new(HashMap::new()),
        }
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
        let endpoint = Endpoint::from_shared(uri.to_string())
            .map_err(|error| KvError::invalid(format!("endpoint {uri:?}: {error}")))?
            .connect_timeout(self.options.connect_timeout)
            .tcp_nodelay(true);
        let channel = endpoint.connect_lazy();
        channels.insert(uri.to_string(), channel.clone());
        Ok(channel)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_normalize_to_http_uris() {
        let cases: [(&str, Result<&str, &str>); 9] = [
            ("127.0.0.1:7001", Ok("http://127.0.0.1:7001")),
            ("http://127.0.0.1:7001", Ok("http://127.0.0.1:7001")),
            ("http://localhost:7001/", Ok("http://localhost:7001")),
            (" node-2:80 ", Ok("http://node-2:80")),
            ("https://a:1", Err("TLS is not supported")),
            ("grpc://a:1", Err("scheme other than http")),
            ("127.0.0.1", Err("not host:port")),
            ("a:1/path", Err("not host:port")),
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
        assert_eq!(normalize_all(&same), Ok(vec!["http://a:1".to_string()]));
        assert!(normalize_all(&[]).is_err());
        let many: Vec<String> = (0..=limits::CLIENT_ENDPOINTS_MAX)
            .map(|i| format!("a:{}", i + 1))
            .collect();
        assert!(normalize_all(&many).is_err());
    }
}
