//! TLS for `rediss://` URLs (feature `redis-tls`): the private CA and the
//! client certificate given to the builder, checked when the backend is
//! built so that a bad PEM is a typed error there, not a failure of every
//! call later. rustls with the ring provider; never OpenSSL.

use super::RedisError;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::fmt;
use std::sync::Arc;

/// What the builder was given: PEM bytes, kept as given (the `redis` crate
/// parses them again for each connection).
#[derive(Clone, Default)]
pub(crate) struct TlsFiles {
    pub(crate) root: Option<Vec<u8>>,
    /// The client's certificate chain and its private key.
    pub(crate) client: Option<(Vec<u8>, Vec<u8>)>,
}

impl fmt::Debug for TlsFiles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The key is a secret and the certificates are noise: say only
        // which were given.
        f.debug_struct("Tls")
            .field("root_certificate", &self.root.is_some())
            .field("client_certificate", &self.client.is_some())
            .finish()
    }
}

fn invalid(message: impl Into<String>) -> RedisError {
    RedisError::InvalidTls {
        message: message.into(),
    }
}

/// The certificates of one PEM, at least one.
fn certificates(pem: &[u8], what: &str) -> Result<Vec<CertificateDer<'static>>, RedisError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(format!("{what} is not valid PEM: {e}")))?;
    if certs.is_empty() {
        return Err(invalid(format!(
            "{what} holds no certificate: pass PEM text with a `-----BEGIN CERTIFICATE-----` block"
        )));
    }
    Ok(certs)
}

impl TlsFiles {
    /// Whether anything was given.
    pub(crate) fn is_set(&self) -> bool {
        self.root.is_some() || self.client.is_some()
    }

    /// Checks the PEM as rustls will use it (each root a trust anchor, the
    /// key the certificate's), and gives the `redis` crate's form.
    pub(crate) fn certificates(&self) -> Result<redis::TlsCertificates, RedisError> {
        let mut roots = rustls::RootCertStore::empty();
        if let Some(pem) = &self.root {
            for cert in certificates(pem, "the root certificate (tls_root_certificate)")? {
                roots.add(cert).map_err(|e| {
                    invalid(format!(
                        "the root certificate (tls_root_certificate) is not a usable CA certificate: {e}"
                    ))
                })?;
            }
        }
        if let Some((cert, key)) = &self.client {
            let chain = certificates(cert, "the client certificate (tls_client_certificate)")?;
            let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| {
                invalid(format!(
                    "the client key (tls_client_certificate) is not a PEM private key \
                     (`-----BEGIN PRIVATE KEY-----`, PKCS#8, SEC1 or PKCS#1): {e}"
                ))
            })?;
            rustls::ClientConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .map_err(|e| invalid(e.to_string()))?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .map_err(|e| {
                invalid(format!(
                    "the client certificate and key (tls_client_certificate) do not make a TLS identity: {e}"
                ))
            })?;
        }
        Ok(redis::TlsCertificates {
            client_tls: self
                .client
                .as_ref()
                .map(|(cert, key)| redis::ClientTlsConfig {
                    client_cert: cert.clone(),
                    client_key: key.clone(),
                }),
            root_cert: self.root.clone(),
        })
    }
}

/// Makes ring rustls' process-wide crypto provider unless the application
/// installed one already (theirs is kept): the `redis` crate builds each
/// TLS connection with the process default.
pub(crate) fn install_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing a race with another installer is fine: one is installed.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

#[cfg(test)]
mod tests {
    use super::TlsFiles;
    use crate::redis::RedisError;

    fn message(files: &TlsFiles) -> String {
        match files.certificates() {
            Err(RedisError::InvalidTls { message }) => message,
            other => panic!("expected InvalidTls, got {other:?}"),
        }
    }

    #[test]
    fn bad_pem_is_a_typed_error_that_names_the_setting() {
        let text = message(&TlsFiles {
            root: Some(b"not a certificate".to_vec()),
            client: None,
        });
        assert!(text.contains("tls_root_certificate"), "{text}");
        assert!(text.contains("BEGIN CERTIFICATE"), "{text}");
        let garbled = b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        let text = message(&TlsFiles {
            root: Some(garbled.to_vec()),
            client: None,
        });
        assert!(text.contains("not a usable CA certificate"), "{text}");
    }

    #[test]
    fn debug_shows_no_key() {
        let files = TlsFiles {
            root: None,
            client: Some((b"CERT".to_vec(), b"SECRET KEY".to_vec())),
        };
        let shown = format!("{files:?}");
        assert!(!shown.contains("SECRET"), "{shown}");
        assert!(shown.contains("client_certificate: true"), "{shown}");
    }
}
