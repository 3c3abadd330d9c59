//! Throwaway certificates for the TLS tests, made in memory with rcgen: a CA, and the node
//! and client certificates it signs. No key is ever written to disk.

use keel_client::ClientTls;
use keel_server::TlsSettings;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair,
};

/// A certificate authority.
pub struct Pki {
    ca: CertifiedIssuer<'static, KeyPair>,
}

/// A certificate and its private key, PEM.
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
}

impl Pki {
    /// A fresh CA named `name`.
    pub fn new(name: &str) -> Pki {
        let mut params = CertificateParams::new(Vec::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        Pki { ca }
    }

    pub fn ca_pem(&self) -> String {
        self.ca.pem()
    }

    /// A certificate for `names` (IP addresses or DNS names), for servers and clients alike.
    pub fn issue(&self, names: &[&str]) -> Issued {
        let names: Vec<String> = names.iter().map(|name| name.to_string()).collect();
        let mut params = CertificateParams::new(names).unwrap();
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.ca).unwrap();
        Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }

    /// The TLS settings of a node on loopback: a certificate for 127.0.0.1 and localhost.
    pub fn node_settings(&self) -> TlsSettings {
        let issued = self.issue(&["127.0.0.1", "localhost"]);
        let (cert, key) = (issued.cert_pem.into_bytes(), issued.key_pem.into_bytes());
        TlsSettings::from_pem(cert, key, self.ca_pem().into_bytes()).unwrap()
    }

    /// What a client needs to trust this CA's nodes.
    pub fn client_tls(&self) -> ClientTls {
        ClientTls {
            ca_pem: self.ca_pem().into_bytes(),
            server_name: None,
        }
    }
}
