//! TLS of a node: its certificate chain, private key and the cluster CA as PEM, checked
//! when they are read, with the date each file's first certificate to expire does (for the
//! metrics); the server side (TLS only; client certificates verified against the CA but not
//! required), the peer side (https to every peer, the CA as the only trust root, the node's
//! certificate as its client identity), and who a caller is (`is_peer`, from `caller`).
//! Knows nothing of what the services do.
//!
//! One CA signs every node's certificate. A certificate it signed is a node's, whoever
//! presents it: do not sign application certificates with the cluster CA.

mod caller;

pub(crate) use caller::{Caller, CallerLayer, is_peer, peer_connection};

use std::time::Duration;

use keel_types::limits;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use thiserror::Error;
use tonic::transport::{Certificate, ClientTlsConfig, Identity, Server, ServerTlsConfig};

/// A node's TLS material, checked: a certificate chain (the node's certificate first), its
/// private key, and the CA that signed every node's certificate. The node's certificate
/// must name the addresses peers and clients dial it by (an IP SAN for an IP, a DNS SAN
/// for a host name).
#[derive(Clone, PartialEq, Eq)]
pub struct TlsSettings {
    cert_pem: Vec<u8>,
    key_pem: Vec<u8>,
    ca_pem: Vec<u8>,
    expiry: Expiry,
}

/// When the certificates a node serves with stop being valid: the earliest notAfter of each
/// file's certificates, in seconds since the Unix epoch. Read with the files, at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Expiry {
    /// The certificate chain's (the node's certificate and any intermediates).
    pub chain_secs: i64,
    /// The CA file's.
    pub ca_secs: i64,
}

/// One of the three PEM files of a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsPart {
    Cert,
    Key,
    Ca,
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum TlsError {
    #[error("TLS {}: {message}", part.what())]
    Pem { part: TlsPart, message: String },
    #[error("TLS certificate, key and CA cannot serve together: {0}")]
    Unusable(String),
}

impl TlsPart {
    /// The setting naming the file, as in the config file (`tls_cert`).
    pub fn setting(self) -> &'static str {
        match self {
            TlsPart::Cert => "tls_cert",
            TlsPart::Key => "tls_key",
            TlsPart::Ca => "tls_ca",
        }
    }

    fn what(self) -> &'static str {
        match self {
            TlsPart::Cert => "certificate chain",
            TlsPart::Key => "private key",
            TlsPart::Ca => "CA certificate",
        }
    }
}

impl TlsSettings {
    /// The settings of three PEM texts, once each parses and the server configuration they
    /// make is accepted (the key belongs to the certificate, the CA is a usable root).
    pub fn from_pem(
        cert_pem: Vec<u8>,
        key_pem: Vec<u8>,
        ca_pem: Vec<u8>,
    ) -> Result<TlsSettings, TlsError> {
        let chain_secs = check_certificates(TlsPart::Cert, &cert_pem)?;
        check_key(&key_pem)?;
        let ca_secs = check_certificates(TlsPart::Ca, &ca_pem)?;
        let settings = TlsSettings {
            cert_pem,
            key_pem,
            ca_pem,
            expiry: Expiry {
                chain_secs,
                ca_secs,
            },
        };
        Server::builder()
            .tls_config(settings.server_config())
            .map_err(|error| TlsError::Unusable(error_chain(&error)))?;
        Ok(settings)
    }

    /// The gRPC server's side: TLS only, with the node's certificate; a client certificate
    /// is verified against the CA when one is presented, and not required.
    pub(crate) fn server_config(&self) -> ServerTlsConfig {
        ServerTlsConfig::new()
            .identity(Identity::from_pem(&self.cert_pem, &self.key_pem))
            .client_ca_root(Certificate::from_pem(&self.ca_pem))
            .client_auth_optional(true)
            .timeout(Duration::from_millis(limits::TLS_HANDSHAKE_TIMEOUT_MS))
    }

    /// When the certificate chain and the CA expire.
    pub(crate) fn expiry(&self) -> Expiry {
        self.expiry
    }

    /// The side of calls to peers: the CA as the only trust root, the node's certificate as
    /// its identity. The server name checked is the host of the address dialled.
    pub(crate) fn peer_config(&self) -> ClientTlsConfig {
        ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&self.ca_pem))
            .identity(Identity::from_pem(&self.cert_pem, &self.key_pem))
            .timeout(Duration::from_millis(limits::TLS_HANDSHAKE_TIMEOUT_MS))
    }
}

/// Never prints the key.
impl std::fmt::Debug for TlsSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsSettings")
            .field("cert_pem_bytes", &self.cert_pem.len())
            .field("key_pem", &"<redacted>")
            .field("ca_pem_bytes", &self.ca_pem.len())
            .field("expiry", &self.expiry)
            .finish()
    }
}

/// At least one certificate, every PEM section of them a well-formed X.509 certificate;
/// the earliest of their notAfter dates, in seconds since the Unix epoch.
fn check_certificates(part: TlsPart, pem: &[u8]) -> Result<i64, TlsError> {
    let invalid = |message: String| TlsError::Pem { part, message };
    let mut earliest: Option<i64> = None;
    for certificate in CertificateDer::pem_slice_iter(pem) {
        let der = certificate.map_err(|error| invalid(error.to_string()))?;
        let (_, parsed) = x509_parser::parse_x509_certificate(&der)
            .map_err(|error| invalid(format!("not an X.509 certificate: {error}")))?;
        let not_after = parsed.validity().not_after.timestamp();
        earliest = Some(earliest.map_or(not_after, |secs| secs.min(not_after)));
    }
    earliest.ok_or_else(|| invalid("no PEM certificate in it".to_string()))
}

fn check_key(pem: &[u8]) -> Result<(), TlsError> {
    PrivateKeyDer::from_pem_slice(pem)
        .map(drop)
        .map_err(|error| TlsError::Pem {
            part: TlsPart::Key,
            message: match error {
                rustls_pki_types::pem::Error::NoItemsFound => {
                    "no PEM private key (PKCS#8, PKCS#1 or SEC1) in it".to_string()
                }
                error => error.to_string(),
            },
        })
}

/// The sources of an error, outermost first (tonic's own message, "transport error", says
/// nothing), or the error itself when it has none.
fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut causes = Vec::new();
    let mut next = error.source();
    while let Some(source) = next {
        causes.push(source.to_string());
        next = source.source();
    }
    if causes.is_empty() {
        return error.to_string();
    }
    causes.join(": ")
}

#[cfg(test)]
pub(crate) mod tests;
