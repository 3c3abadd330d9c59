//! `keel dev --tls`: a throwaway CA and one certificate per node, made with rcgen and
//! written under the dev data dir: `tls/ca.pem`, `tls/node-N.pem` and `tls/node-N-key.pem`
//! (keys mode 0600). Each start makes them anew and drops the CA's key, so nothing else is
//! ever signed by that CA. For local use only. Knows nothing of the server: it writes the
//! files `keel serve --tls-cert/--tls-key/--tls-ca` read.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::Context;
use keel_types::NodeId;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// Where the TLS files of a dev cluster whose data is in `data_dir` go.
pub fn tls_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("tls")
}

/// The CA certificate clients trust.
pub fn ca_path(tls_dir: &Path) -> PathBuf {
    tls_dir.join("ca.pem")
}

/// The certificate and key files of node `node_id`.
pub fn node_paths(tls_dir: &Path, node_id: NodeId) -> (PathBuf, PathBuf) {
    (
        tls_dir.join(format!("node-{node_id}.pem")),
        tls_dir.join(format!("node-{node_id}-key.pem")),
    )
}

/// The names a node's certificate carries: 127.0.0.1, localhost and the host of its
/// address, once each.
pub fn node_names(listen: &str) -> Vec<String> {
    let mut names = vec!["127.0.0.1".to_string(), "localhost".to_string()];
    let host = listen.rsplit_once(':').map_or(listen, |(host, _)| host);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if !names.iter().any(|name| name == host) {
        names.push(host.to_string());
    }
    names
}

/// Makes a CA and a certificate for each `(node id, listen address)`, and writes them under
/// `tls_dir` (created if needed). Returns the CA's PEM.
pub fn generate(tls_dir: &Path, nodes: &[(NodeId, String)]) -> anyhow::Result<String> {
    std::fs::create_dir_all(tls_dir).with_context(|| format!("creating {}", tls_dir.display()))?;
    let ca = certificate_authority()?;
    write_file(&ca_path(tls_dir), &ca.pem(), 0o644)?;
    for (node_id, listen) in nodes {
        let (cert_pem, key_pem) = node_certificate(&ca, *node_id, listen)?;
        let (cert_path, key_path) = node_paths(tls_dir, *node_id);
        write_file(&cert_path, &cert_pem, 0o644)?;
        write_file(&key_path, &key_pem, 0o600)?;
    }
    Ok(ca.pem())
}

fn certificate_authority() -> anyhow::Result<CertifiedIssuer<'static, KeyPair>> {
    let mut params = CertificateParams::new(Vec::new())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params
        .distinguished_name
        .push(DnType::CommonName, "keel dev throwaway CA");
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    Ok(CertifiedIssuer::self_signed(params, KeyPair::generate()?)?)
}

/// A node's certificate (for serving and for calling peers) and its key, PEM.
fn node_certificate(
    ca: &CertifiedIssuer<'static, KeyPair>,
    node_id: NodeId,
    listen: &str,
) -> anyhow::Result<(String, String)> {
    let mut params = CertificateParams::new(node_names(listen))?;
    params
        .distinguished_name
        .push(DnType::CommonName, format!("keel dev node {node_id}"));
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, ca)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// Writes `text` to `path` with permissions `mode`, replacing what was there.
fn write_file(path: &Path, text: &str, mode: u32) -> anyhow::Result<()> {
    let context = || format!("writing {}", path.display());
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(mode)
        .open(path)
        .with_context(context)?;
    // `mode` applies to a new file only; an old one may have had looser permissions.
    file.set_permissions(std::fs::Permissions::from_mode(mode))
        .with_context(context)?;
    file.write_all(text.as_bytes()).with_context(context)
}

#[cfg(test)]
mod tests {
    use keel_server::TlsSettings;

    use super::*;

    #[test]
    fn node_names_cover_loopback_and_the_listen_host() {
        assert_eq!(node_names("127.0.0.1:7001"), ["127.0.0.1", "localhost"]);
        assert_eq!(
            node_names("10.0.0.5:7001"),
            ["127.0.0.1", "localhost", "10.0.0.5"]
        );
        assert_eq!(node_names("[::1]:7001"), ["127.0.0.1", "localhost", "::1"]);
    }

    /// What `keel serve --tls-*` checks of its files holds for every node's: each chain
    /// parses, its key belongs to it, and the CA is a usable root. Keys are 0600.
    #[test]
    fn generated_files_are_what_a_server_accepts() {
        let dir = tempfile::tempdir().unwrap();
        let tls = tls_dir(dir.path());
        let nodes = [
            (1, "127.0.0.1:7001".to_string()),
            (2, "127.0.0.1:7002".to_string()),
        ];
        let ca_pem = generate(&tls, &nodes).unwrap();
        assert_eq!(std::fs::read_to_string(ca_path(&tls)).unwrap(), ca_pem);
        for (node_id, _) in nodes {
            let (cert, key) = node_paths(&tls, node_id);
            let mode = std::fs::metadata(&key).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "node {node_id}'s key");
            let read = |path: &Path| std::fs::read(path).unwrap();
            let settings = TlsSettings::from_pem(read(&cert), read(&key), ca_pem.clone().into());
            assert!(settings.is_ok(), "node {node_id}: {settings:?}");
        }
        let (_, other_key) = node_paths(&tls, 2);
        let (cert, _) = node_paths(&tls, 1);
        let mixed = TlsSettings::from_pem(
            std::fs::read(cert).unwrap(),
            std::fs::read(other_key).unwrap(),
            ca_pem.into(),
        );
        assert!(mixed.is_err(), "node 1's certificate with node 2's key");
    }
}
