//! Certificates made at run time for the TLS tests and benches (rcgen, ring): a test CA and
//! member certificates naming a member (DNS subject alternative name, server and client
//! authentication), as `docs/tls.md` describes for a real test cluster.
#![allow(dead_code)]

use cohort::tls::TlsConfig;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// A certificate authority for one test.
pub(crate) struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A member's certificate and key, PEM.
pub(crate) struct MemberCert {
    pub(crate) cert_pem: String,
    pub(crate) key_pem: String,
}

impl TestCa {
    /// A fresh CA (ECDSA P-256) whose common name is `name`.
    pub(crate) fn new(name: &str) -> TestCa {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().expect("CA key");
        TestCa {
            issuer: CertifiedIssuer::self_signed(params, key).expect("self-signed CA"),
        }
    }

    /// The CA certificate, PEM.
    pub(crate) fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A member certificate naming `name`, issued by this CA.
    pub(crate) fn member(&self, name: &str) -> MemberCert {
        let mut params = CertificateParams::new(vec![name.to_owned()]).expect("member params");
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let key = KeyPair::generate().expect("member key");
        let cert = params.signed_by(&key, &self.issuer).expect("sign member");
        MemberCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }

    /// A node's TLS settings: a certificate naming `name` issued by this CA, trusting
    /// this CA.
    pub(crate) fn tls(&self, name: &str) -> TlsConfig {
        self.tls_trusting(name, self)
    }

    /// A certificate naming `name` issued by this CA, trusting `trusted`.
    pub(crate) fn tls_trusting(&self, name: &str, trusted: &TestCa) -> TlsConfig {
        let m = self.member(name);
        TlsConfig::from_pem(
            trusted.pem().as_bytes(),
            m.cert_pem.as_bytes(),
            m.key_pem.as_bytes(),
        )
        .expect("TLS config from PEM")
    }
}
