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

/// A CA valid until the end of `ca_year` and a node certificate it signed, valid until the
/// end of `node_year`: (certificate, key, CA) PEMs.
pub(crate) fn dated_pems(node_year: i32, ca_year: i32) -> (Vec<u8>, Vec<u8>, Vec<u8>) {
    let mut ca_params = CertificateParams::new(Vec::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.not_after = rcgen::date_time_ymd(ca_year, 12, 31);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
    params.not_after = rcgen::date_time_ymd(node_year, 12, 31);
    let cert = params.signed_by(&key, &ca).unwrap();
    let pems = (cert.pem(), key.serialize_pem(), ca.pem());
    (
        pems.0.into_bytes(),
        pems.1.into_bytes(),
        pems.2.into_bytes(),
    )
}

/// 2030-12-31 and 2035-12-31, 00:00:00 UTC, in seconds since the Unix epoch.
pub(crate) const END_OF_2030: i64 = 1_924_905_600;
pub(crate) const END_OF_2035: i64 = 2_082_672_000;

#[test]
fn expiry_is_each_files_first_certificate_to_expire() {
    let (cert, key, ca) = dated_pems(2030, 2035);
    let settings = TlsSettings::from_pem(cert.clone(), key.clone(), ca.clone()).unwrap();
    let expected = Expiry {
        chain_secs: END_OF_2030,
        ca_secs: END_OF_2035,
    };
    assert_eq!(settings.expiry(), expected);
    // A chain or CA file of two certificates: the earlier date counts, in either order.
    let (later_cert, _, later_ca) = dated_pems(2035, 2040);
    let chain = [cert.as_slice(), &later_cert].concat();
    let bundle = [later_ca.as_slice(), &ca].concat();
    let settings = TlsSettings::from_pem(chain, key, bundle).unwrap();
    assert_eq!(settings.expiry(), expected);
}

#[test]
fn a_pem_section_that_is_no_certificate_is_refused() {
    let (cert, key, ca) = node_pems();
    // Valid base64 of bytes that are no DER certificate.
    let not_der = b"-----BEGIN CERTIFICATE-----\nAAECAwQF\n-----END CERTIFICATE-----\n";
    let error = check(not_der, &key, &ca).expect("refused").to_string();
    assert!(
        error.contains("TLS certificate chain: not an X.509 certificate"),
        "{error}"
    );
    let error = check(&cert, &key, not_der).expect("refused").to_string();
    assert!(
        error.contains("TLS CA certificate: not an X.509 certificate"),
        "{error}"
    );
}
