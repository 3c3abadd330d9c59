//! The TLS settings: all three files or none, each read and checked, errors naming the file.

use std::io::Write;

use super::parse_flags;
use crate::access::tls::tests::node_pems;
use crate::config::*;

/// `tls` with the settings every node needs.
fn args(tls: ServeArgs) -> ServeArgs {
    let node = super::args(1, "127.0.0.1:7001", "1=127.0.0.1:7001");
    ServeArgs {
        tls_cert: tls.tls_cert,
        tls_key: tls.tls_key,
        tls_ca: tls.tls_ca,
        config: tls.config,
        ..node
    }
}

/// A directory holding `cert.pem`, `key.pem` and `ca.pem` of one node, and `other-key.pem`
/// of another.
fn pem_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, ca) = node_pems();
    let (_, other_key, _) = node_pems();
    for (name, pem) in [
        ("cert.pem", cert),
        ("key.pem", key),
        ("ca.pem", ca),
        ("other-key.pem", other_key),
    ] {
        std::fs::write(dir.path().join(name), pem).unwrap();
    }
    dir
}

fn files(dir: &Path, cert: Option<&str>, key: Option<&str>, ca: Option<&str>) -> ServeArgs {
    let path = |name: Option<&str>| name.map(|name| dir.join(name));
    args(ServeArgs {
        tls_cert: path(cert),
        tls_key: path(key),
        tls_ca: path(ca),
        ..ServeArgs::default()
    })
}

#[test]
fn tls_is_off_without_files_and_on_with_all_three() {
    let dir = pem_dir();
    let plain = NodeConfig::from_args(&args(ServeArgs::default())).unwrap();
    assert!(plain.tls.is_none());
    let all = files(
        dir.path(),
        Some("cert.pem"),
        Some("key.pem"),
        Some("ca.pem"),
    );
    assert!(NodeConfig::from_args(&all).unwrap().tls.is_some());
}

#[test]
fn tls_needs_all_three_files_or_none() {
    let dir = pem_dir();
    let cases = [
        (Some("cert.pem"), None, None, "missing: tls_key, tls_ca"),
        (Some("cert.pem"), Some("key.pem"), None, "missing: tls_ca"),
        (None, None, Some("ca.pem"), "missing: tls_cert, tls_key"),
        (None, Some("key.pem"), Some("ca.pem"), "missing: tls_cert"),
    ];
    for (cert, key, ca, expected) in cases {
        let error = NodeConfig::from_args(&files(dir.path(), cert, key, ca))
            .expect_err(expected)
            .to_string();
        assert!(error.contains("TLS needs tls_cert, tls_key and tls_ca together"));
        assert!(error.contains(expected), "{error:?} lacks {expected:?}");
    }
}

#[test]
fn a_tls_file_that_cannot_be_used_is_named() {
    let dir = pem_dir();
    let big = dir.path().join("big.pem");
    std::fs::write(&big, vec![b'x'; limits::TLS_PEM_BYTES_MAX + 1]).unwrap();
    let shown = |name: &str| dir.path().join(name).display().to_string();
    let cases = [
        (
            files(
                dir.path(),
                Some("absent.pem"),
                Some("key.pem"),
                Some("ca.pem"),
            ),
            format!("tls_cert file {}: No such file", shown("absent.pem")),
        ),
        (
            files(
                dir.path(),
                Some("cert.pem"),
                Some("cert.pem"),
                Some("ca.pem"),
            ),
            format!(
                "tls_key file {}: TLS private key: no PEM",
                shown("cert.pem")
            ),
        ),
        (
            files(
                dir.path(),
                Some("cert.pem"),
                Some("key.pem"),
                Some("key.pem"),
            ),
            format!(
                "tls_ca file {}: TLS CA certificate: no PEM",
                shown("key.pem")
            ),
        ),
        (
            files(
                dir.path(),
                Some("cert.pem"),
                Some("key.pem"),
                Some("big.pem"),
            ),
            format!("tls_ca file {}: longer than 1 MiB", shown("big.pem")),
        ),
        (
            files(
                dir.path(),
                Some("cert.pem"),
                Some("other-key.pem"),
                Some("ca.pem"),
            ),
            "cannot serve together: keys may not be consistent".to_string(),
        ),
        (
            files(
                dir.path(),
                Some("cert.pem"),
                Some("other-key.pem"),
                Some("ca.pem"),
            ),
            format!("tls_key {}", shown("other-key.pem")),
        ),
    ];
    for (args, expected) in cases {
        let error = NodeConfig::from_args(&args)
            .expect_err(&expected)
            .to_string();
        assert!(error.contains(&expected), "{error:?} lacks {expected:?}");
    }
}

#[cfg(unix)]
#[test]
fn an_unreadable_tls_file_is_named() {
    use std::os::unix::fs::PermissionsExt;
    let dir = pem_dir();
    let key = dir.path().join("key.pem");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o000)).unwrap();
    // Root reads any file: then the check has nothing to show.
    if std::fs::read(&key).is_ok() {
        return;
    }
    let args = files(
        dir.path(),
        Some("cert.pem"),
        Some("key.pem"),
        Some("ca.pem"),
    );
    let error = NodeConfig::from_args(&args).unwrap_err().to_string();
    let expected = format!("tls_key file {}: Permission denied", key.display());
    assert!(error.contains(&expected), "{error:?} lacks {expected:?}");
}

#[test]
fn tls_files_come_from_flags_over_the_config_file() {
    let dir = pem_dir();
    let mut file = tempfile::NamedTempFile::new().unwrap();
    let path = |name: &str| dir.path().join(name).display().to_string();
    writeln!(
        file,
        "tls_cert = {:?}\ntls_key = {:?}\ntls_ca = {:?}",
        path("cert.pem"),
        path("other-key.pem"),
        path("ca.pem")
    )
    .unwrap();
    let from_file = args(ServeArgs {
        config: Some(file.path().to_path_buf()),
        ..ServeArgs::default()
    });
    let error = NodeConfig::from_args(&from_file).unwrap_err().to_string();
    assert!(error.contains("cannot serve together"), "{error}");
    let overridden = ServeArgs {
        tls_key: Some(dir.path().join("key.pem")),
        ..from_file
    };
    assert!(NodeConfig::from_args(&overridden).unwrap().tls.is_some());
}

#[test]
fn tls_flags_parse() {
    let serve = parse_flags(&[
        "--tls-cert",
        "/etc/keel/node.pem",
        "--tls-key",
        "/etc/keel/node-key.pem",
        "--tls-ca",
        "/etc/keel/ca.pem",
    ])
    .unwrap();
    assert_eq!(serve.tls_cert, Some(PathBuf::from("/etc/keel/node.pem")));
    assert_eq!(serve.tls_key, Some(PathBuf::from("/etc/keel/node-key.pem")));
    assert_eq!(serve.tls_ca, Some(PathBuf::from("/etc/keel/ca.pem")));
}

#[test]
fn auth_tokens_are_read_checked_and_need_tls() {
    let dir = pem_dir();
    let tokens = dir.path().join("tokens.toml");
    std::fs::write(
        &tokens,
        "[[tenant]]\nname = \"acme\"\ntokens = [\"acme-token-0123456789\"]\n",
    )
    .unwrap();
    let with_tls = ServeArgs {
        auth_tokens: Some(tokens.clone()),
        ..files(
            dir.path(),
            Some("cert.pem"),
            Some("key.pem"),
            Some("ca.pem"),
        )
    };
    assert!(NodeConfig::from_args(&with_tls).unwrap().access.is_some());
    let plain = ServeArgs {
        auth_tokens: Some(tokens.clone()),
        ..args(ServeArgs::default())
    };
    let error = NodeConfig::from_args(&plain).unwrap_err().to_string();
    assert!(error.contains("needs TLS"), "{error}");

    std::fs::write(&tokens, "[[tenant]]\nname = \"Acme\"\n").unwrap();
    let error = NodeConfig::from_args(&with_tls).unwrap_err().to_string();
    assert!(error.contains("tokens.toml"), "{error}");
    let absent = ServeArgs {
        auth_tokens: Some(dir.path().join("absent.toml")),
        ..with_tls
    };
    let error = NodeConfig::from_args(&absent).unwrap_err().to_string();
    assert!(error.contains("absent.toml"), "{error}");
    let flags = parse_flags(&["--auth-tokens", "/etc/keel/tokens.toml"]).unwrap();
    assert_eq!(
        flags.auth_tokens,
        Some(PathBuf::from("/etc/keel/tokens.toml"))
    );
}
