//! `-Z`: TLS on the memcached port with memcached's settings (`-o ssl_chain_cert=…,
//! ssl_key=…,ssl_ca_cert=…,ssl_verify_mode=…`), as a rustls server configuration for the
//! network drivers (`kvlab_net::tls`).
//!
//! `ssl_verify_mode` is memcached's: 0 asks no client certificate (the default), 1 asks for
//! one and checks it if given, 2 and 3 require one (3, "once", is 2 here: a connection
//! is verified at its handshake). A client certificate is checked against `ssl_ca_cert`.

use std::path::PathBuf;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// memcached's TLS options.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsSettings {
    /// `ssl_chain_cert`: the server's certificate chain (PEM).
    pub chain_cert: Option<PathBuf>,
    /// `ssl_key`: its private key (PEM).
    pub key: Option<PathBuf>,
    /// `ssl_ca_cert`: CAs that sign client certificates (PEM).
    pub ca_cert: Option<PathBuf>,
    /// `ssl_verify_mode`: 0 none, 1 optional, 2 required, 3 required once.
    pub verify_mode: u8,
}

/// Why the TLS settings could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A setting is missing (memcached needs `ssl_chain_cert` and `ssl_key` with `-Z`).
    #[error("{0}")]
    Missing(&'static str),
    /// A file could not be read or holds no usable PEM item.
    #[error("{0}: {1}")]
    Pem(String, String),
    /// rustls refused the combination.
    #[error("TLS configuration: {0}")]
    Config(String),
}

fn certs(path: &PathBuf) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let name = path.display().to_string();
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| TlsError::Pem(name.clone(), e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem(name.clone(), e.to_string()))?;
    if certs.is_empty() {
        return Err(TlsError::Pem(name, "no certificate in it".into()));
    }
    Ok(certs)
}

impl TlsSettings {
    /// The rustls configuration these settings describe.
    pub fn server_config(&self) -> Result<Arc<rustls::ServerConfig>, TlsError> {
        let chain = self
            .chain_cert
            .as_ref()
            .ok_or(TlsError::Missing("-Z needs -o ssl_chain_cert=FILE"))?;
        let key_path = self
            .key
            .as_ref()
            .ok_or(TlsError::Missing("-Z needs -o ssl_key=FILE"))?;
        let chain = certs(chain)?;
        let key = PrivateKeyDer::from_pem_file(key_path)
            .map_err(|e| TlsError::Pem(key_path.display().to_string(), e.to_string()))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?;
        let builder = match self.verify_mode {
            0 => builder.with_no_client_auth(),
            mode => {
                let ca = self.ca_cert.as_ref().ok_or(TlsError::Missing(
                    "ssl_verify_mode 1..3 needs -o ssl_ca_cert=FILE",
                ))?;
                let mut roots = rustls::RootCertStore::empty();
                for c in certs(ca)? {
                    roots.add(c).map_err(|e| TlsError::Config(e.to_string()))?;
                }
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots),
                    provider,
                );
                let verifier = if mode == 1 {
                    verifier.allow_unauthenticated()
                } else {
                    verifier
                };
                let verifier = verifier
                    .build()
                    .map_err(|e| TlsError::Config(e.to_string()))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let config = builder
            .with_single_cert(chain, key)
            .map_err(|e| TlsError::Config(e.to_string()))?;
        Ok(Arc::new(config))
    }
}
