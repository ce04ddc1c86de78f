//! Optional TLS (cargo feature `tls`): rustls over the node's own mio connections.
//!
//! Every connection of a node configured with [`Builder::tls`](crate::Builder::tls) runs
//! TLS 1.3 (or 1.2) with certificates on **both** sides, issued by a certificate authority
//! the user configures; the cohort handshake (`Hello` ...) then runs inside TLS. A member's
//! name is checked against its certificate:
//!
//! - the dialler verifies the acceptor's certificate for the configured peer name (the
//!   name is the TLS server name, SNI), so **member names must be valid DNS names**
//!   (`alpha`, `node-1.cluster.example`; not `node 1`, not an IP address), which
//!   [`Builder::start`](crate::Builder::start) and [`Node::add_peer`](crate::Node::add_peer)
//!   check;
//! - the acceptor verifies the client certificate's chain during the TLS handshake and,
//!   once the cohort handshake says which member is calling, that the certificate is valid
//!   for that member name.
//!
//! A TLS failure (unknown CA, expired certificate, a name that does not match, a plain TCP
//! client) closes that one connection with a logged warning and counts in
//! [`ConnStats::tls_failures`](crate::ConnStats::tls_failures).
//!
//! A member's certificate carries its member name as a DNS subject alternative name and
//! should allow both `serverAuth` and `clientAuth` extended key usages (a member both
//! accepts and dials). [`docs/tls.md`](https://docs.rs/crate/cohort-net/latest/source/docs/tls.md) shows how to make such certificates for a test
//! cluster with openssl or rcgen.
//!
//! ```no_run
//! # fn main() -> Result<(), cohort::Error> {
//! let tls = cohort::tls::TlsConfig::from_pem_files(
//!     "certs/ca.pem",      // the cluster's CA: peers must present a certificate it issued
//!     "certs/alpha.pem",   // this member's certificate (chain), naming "alpha"
//!     "certs/alpha.key",   // its private key (PKCS#8, PKCS#1 or SEC1 PEM)
//! )?;
//! let node = cohort::Node::builder("alpha")
//!     .cluster("demo")
//!     .tls(tls)
//!     .peer("beta", "127.0.0.1:7001")
//!     .start()?;
//! # let _ = node;
//! # Ok(()) }
//! ```

use std::fmt;
use std::path::{Path, PathBuf};
// `std::sync::Arc`, not `crate::sync`'s: rustls' API takes std's `Arc` for its configs and
// providers (immutable, shared read-only; nothing here for loom to model).
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::ServerName;
pub use rustls_pki_types::{CertificateDer, PrivateKeyDer};

// How a connection runs TLS: a rustls connection pumped over the IO thread's non-blocking
// socket. Crate-private: `net`'s `Transport` holds one for each TLS connection.
mod pump;

pub(crate) use pump::{is_failure, TlsPump};

/// Everything that can go wrong building a [`TlsConfig`]. Each message names the file (or
/// in-memory source) and what was wrong with it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// A file could not be read.
    #[error("cannot read the {what} file {path}")]
    File {
        /// Which input: "CA certificate", "certificate" or "private key".
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The PEM (or DER) input holds nothing usable of the expected kind.
    #[error("{origin}: {problem}")]
    Pem {
        /// The file path, or a description of the in-memory input.
        origin: String,
        /// What is wrong, e.g. "no CERTIFICATE block found".
        problem: String,
    },
    /// rustls refused the material (a key that does not match the certificate, an
    /// unsupported key type, a CA certificate that is not a valid trust anchor).
    #[error("{context}")]
    Rustls {
        /// What was being done.
        context: String,
        /// rustls' reason.
        source: rustls::Error,
    },
    /// The verifier of client certificates could not be built.
    #[error("cannot build the client certificate verifier: {0}")]
    Verifier(String),
}

/// The TLS settings of a node: the CA that peers' certificates must chain to, this member's
/// certificate chain and private key. Cheap to clone (the rustls configurations inside are
/// shared).
///
/// Build it from PEM files ([`from_pem_files`](TlsConfig::from_pem_files)), PEM bytes
/// ([`from_pem`](TlsConfig::from_pem)) or DER ([`from_der`](TlsConfig::from_der)), then
/// pass it to [`Builder::tls`](crate::Builder::tls). See the [module docs](self).
///
/// ```no_run
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // PEM text from anywhere: files, a secret store, the environment.
/// let ca = std::fs::read("certs/ca.pem")?;
/// let cert = std::fs::read("certs/alpha.pem")?;
/// let key = std::fs::read("certs/alpha.key")?;
/// let tls = cohort::tls::TlsConfig::from_pem(&ca, &cert, &key)?;
/// let node = cohort::Node::builder("alpha").tls(tls).start()?;
/// # let _ = node;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct TlsConfig {
    pub(crate) client: Arc<ClientConfig>,
    pub(crate) server: Arc<ServerConfig>,
    /// This member's end-entity certificate (checked against its own name at start).
    pub(crate) leaf: CertificateDer<'static>,
}

impl fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsConfig").finish_non_exhaustive()
    }
}

fn read_file(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::File {
        what,
        path: path.to_owned(),
        source,
    })
}

fn certs_from_pem(
    origin: &str,
    what: &str,
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            origin: origin.to_owned(),
            problem: format!("invalid PEM ({what}): {e}"),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Pem {
            origin: origin.to_owned(),
            problem: format!("no CERTIFICATE block found (expected the {what})"),
        });
    }
    Ok(certs)
}

fn key_from_pem(origin: &str, pem: &[u8]) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|e| TlsError::Pem {
        origin: origin.to_owned(),
        problem: match e {
            rustls_pki_types::pem::Error::NoItemsFound => {
                "no private key block found (expected PRIVATE KEY, RSA PRIVATE KEY or EC PRIVATE KEY)"
                    .to_owned()
            }
            e => format!("invalid PEM (private key): {e}"),
        },
    })
}

impl TlsConfig {
    /// Loads the CA certificate(s), this member's certificate chain (leaf first) and its
    /// private key from PEM files. Errors name the file and what is wrong with it.
    pub fn from_pem_files(
        ca: impl AsRef<Path>,
        cert: impl AsRef<Path>,
        key: impl AsRef<Path>,
    ) -> Result<TlsConfig, TlsError> {
        let (ca, cert, key) = (ca.as_ref(), cert.as_ref(), key.as_ref());
        let ca_certs = certs_from_pem(
            &ca.display().to_string(),
            "CA certificate",
            &read_file("CA certificate", ca)?,
        )?;
        let chain = certs_from_pem(
            &cert.display().to_string(),
            "member certificate",
            &read_file("certificate", cert)?,
        )?;
        let key = key_from_pem(&key.display().to_string(), &read_file("private key", key)?)?;
        TlsConfig::build(ca_certs, chain, key, &ca.display().to_string())
    }

    /// Like [`from_pem_files`](TlsConfig::from_pem_files), from PEM text in memory.
    pub fn from_pem(ca: &[u8], cert: &[u8], key: &[u8]) -> Result<TlsConfig, TlsError> {
        let ca_certs = certs_from_pem("the CA PEM", "CA certificate", ca)?;
        let chain = certs_from_pem("the certificate PEM", "member certificate", cert)?;
        let key = key_from_pem("the private key PEM", key)?;
        TlsConfig::build(ca_certs, chain, key, "the CA PEM")
    }

    /// From DER: the trusted CA certificate(s), this member's chain (leaf first) and key.
    pub fn from_der(
        ca: Vec<CertificateDer<'static>>,
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
    ) -> Result<TlsConfig, TlsError> {
        if ca.is_empty() || chain.is_empty() {
            return Err(TlsError::Pem {
                origin: "the DER input".to_owned(),
                problem: "both a CA certificate and a member certificate are required".into(),
            });
        }
        TlsConfig::build(ca, chain, key, "the DER CA certificates")
    }

    fn build(
        ca: Vec<CertificateDer<'static>>,
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
        ca_origin: &str,
    ) -> Result<TlsConfig, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = RootCertStore::empty();
        for (i, c) in ca.into_iter().enumerate() {
            roots.add(c).map_err(|source| TlsError::Rustls {
                context: format!(
                    "{ca_origin}: CA certificate #{} is not a valid trust anchor",
                    i + 1
                ),
                source,
            })?;
        }
        let roots = Arc::new(roots);
        let leaf = chain[0].clone();
        let server_verifier =
            WebPkiServerVerifier::builder_with_provider(roots.clone(), provider.clone())
                .build()
                .map_err(|e| TlsError::Verifier(e.to_string()))?;
        let client_verifier =
            WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
                .build()
                .map_err(|e| TlsError::Verifier(e.to_string()))?;
        let client = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|source| TlsError::Rustls {
                context: "TLS protocol versions".into(),
                source,
            })?
            .with_webpki_verifier(server_verifier)
            .with_client_auth_cert(chain.clone(), key.clone_key())
            .map_err(|source| TlsError::Rustls {
                context: "the member certificate and private key (client side)".into(),
                source,
            })?;
        let server = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|source| TlsError::Rustls {
                context: "TLS protocol versions".into(),
                source,
            })?
            .with_client_cert_verifier(client_verifier)
            .with_single_cert(chain, key)
            .map_err(|source| TlsError::Rustls {
                context: "the member certificate and private key".into(),
                source,
            })?;
        Ok(TlsConfig {
            client: Arc::new(client),
            server: Arc::new(server),
            leaf,
        })
    }

    /// Whether this member's own certificate is valid for `name` (checked at start, so a
    /// member never presents a certificate its peers would refuse).
    pub(crate) fn leaf_names(&self, name: &str) -> Result<(), String> {
        cert_valid_for(&self.leaf, name)
    }
}

/// A member name as the TLS server name, if it is a valid DNS name.
pub(crate) fn server_name(name: &str) -> Result<ServerName<'static>, String> {
    match ServerName::try_from(name.to_owned()) {
        Ok(n @ ServerName::DnsName(_)) => Ok(n),
        Ok(_) => Err(format!(
            "member name '{name}' is an IP address; with TLS member names must be DNS names"
        )),
        Err(_) => Err(format!(
            "member name '{name}' is not a valid DNS name; with TLS a member's name is the \
             DNS name in its certificate (letters, digits, '-' and '.' only)"
        )),
    }
}

/// Whether `cert` (an end-entity certificate, DER) is valid for member `name`.
pub(crate) fn cert_valid_for(cert: &CertificateDer<'_>, name: &str) -> Result<(), String> {
    let sn = server_name(name)?;
    let ee = webpki::EndEntityCert::try_from(cert)
        .map_err(|e| format!("cannot parse the certificate: {e}"))?;
    ee.verify_is_valid_for_subject_name(&sn)
        .map_err(|e| format!("the certificate is not valid for member name '{name}': {e}"))
}
