//! TLS settings accept a matching certificate, key and CA, and name the part that is wrong.

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};

use super::*;

/// (certificate, key, CA) PEMs: a node certificate for 127.0.0.1 signed by a fresh CA.
pub(crate) fn node_pems() -> (Vec<u8>, Vec<u8>, Vec<u8>) {
    let mut ca_params = CertificateParams::new(Vec::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let params = CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
    let cert = params.signed_by(&key, &ca).unwrap();
    let pems = (cert.pem(), key.serialize_pem(), ca.pem());
    (
        pems.0.into_bytes(),
        pems.1.into_bytes(),
        pems.2.into_bytes(),
    )
}

/// Certificate, key and CA PEMs, and a fragment of the error they give.
type Case<'a> = (&'a [u8], &'a [u8], &'a [u8], &'a str);

/// The error of `from_pem`, or `None` when it accepts.
fn check(cert: &[u8], key: &[u8], ca: &[u8]) -> Option<TlsError> {
    TlsSettings::from_pem(cert.to_vec(), key.to_vec(), ca.to_vec()).err()
}

#[test]
fn settings_name_the_part_that_does_not_parse() {
    let (cert, key, ca) = node_pems();
    let (_, other_key, _) = node_pems();
    let garbage = b"-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n".as_slice();
    assert_eq!(check(&cert, &key, &ca), None);
    let cases: [Case; 6] = [
        (
            b"",
            &key,
            &ca,
            "TLS certificate chain: no PEM certificate in it",
        ),
        (
            garbage,
            &key,
            &ca,
            "TLS certificate chain: base64 decode error",
        ),
        (&cert, &cert, &ca, "TLS private key: no PEM private key"),
        (
            &cert,
            &key,
            &key,
            "TLS CA certificate: no PEM certificate in it",
        ),
        (&cert, &other_key, &ca, "cannot serve together"),
        (
            &key,
            &key,
            &ca,
            "TLS certificate chain: no PEM certificate in it",
        ),
    ];
    for (cert, key, ca, expected) in cases {
        let error = check(cert, key, ca).expect(expected).to_string();
        assert!(error.contains(expected), "{error:?} lacks {expected:?}");
    }
    let missing_key = check(&cert, b"", &ca);
    assert!(
        matches!(
            missing_key,
            Some(TlsError::Pem {
                part: TlsPart::Key,
                ..
            })
        ),
        "{missing_key:?}"
    );
}

#[test]
fn debug_output_never_shows_the_key() {
    let (cert, key, ca) = node_pems();
    let settings = TlsSettings::from_pem(cert, key.clone(), ca).unwrap();
    let shown = format!("{settings:?}");
    let key_text = String::from_utf8(key).unwrap();
    let key_line = key_text.lines().nth(1).unwrap();
    assert!(!shown.contains(key_line), "{shown}");
    assert!(shown.contains("<redacted>"), "{shown}");
}
