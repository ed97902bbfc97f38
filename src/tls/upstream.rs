//! TLS from baton to a pool's backends (`[[pools]] tls`): the client side
//! of a handshake to a backend, with the name it checks the backend's
//! certificate against (`server_name`, else the backend's IP address) and
//! the roots it trusts (`ca`, else the system bundle). `verify = false`
//! skips the certificate check (HAProxy's `verify none`), for backends
//! with self-signed certificates on a trusted network; signatures are
//! still checked, so the session is still encrypted to whoever holds the
//! presented key.

use std::net::SocketAddr;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

/// How a pool's backends are reached over TLS.
pub struct UpstreamTls {
    config: Arc<ClientConfig>,
    /// A connector per backend address, each with its own session cache:
    /// rustls keeps sessions by the name sent, which the backends of a pool
    /// share (its `server_name`, a DNS name's members), so one backend was
    /// offered another's ticket and made a full handshake every time, health
    /// checks too (HAProxy and nginx keep sessions per server).
    by_backend: std::sync::Mutex<std::collections::HashMap<SocketAddr, TlsConnector>>,
    /// The name sent as SNI and checked; None: the backend's IP address.
    server_name: Option<ServerName<'static>>,
    /// For `baton check`.
    pub verify: bool,
}

impl std::fmt::Debug for UpstreamTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamTls")
            .field("server_name", &self.server_name)
            .field("verify", &self.verify)
            .finish_non_exhaustive()
    }
}

impl UpstreamTls {
    /// The name sent as SNI and checked, as `baton check` says it.
    pub fn names(&self) -> String {
        match &self.server_name {
            Some(name) => name.to_str().into_owned(),
            None => "each backend's host name, else its IP address".to_string(),
        }
    }

    /// The pool's `server_name`, if it set a DNS name (an IP address
    /// written there is no `Host` as it stands: IPv6 would need brackets).
    pub fn server_dns_name(&self) -> Option<String> {
        match &self.server_name {
            Some(ServerName::DnsName(name)) => Some(name.as_ref().to_owned()),
            _ => None,
        }
    }

    /// `roots` is required when `verify` (it is what is trusted).
    pub fn new(
        server_name: Option<ServerName<'static>>,
        roots: Option<Arc<RootCertStore>>,
        verify: bool,
    ) -> Result<UpstreamTls, rustls::Error> {
        let provider = super::provider();
        let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()?;
        let config = match (verify, roots) {
            (true, Some(roots)) => builder.with_root_certificates(roots).with_no_client_auth(),
            (true, None) => {
                return Err(rustls::Error::General(
                    "a verified backend needs roots to trust".into(),
                ))
            }
            (false, _) => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
                .with_no_client_auth(),
        };
        Ok(UpstreamTls {
            config: Arc::new(config),
            by_backend: std::sync::Mutex::default(),
            server_name,
            verify,
        })
    }

    /// `address`'s connector, made at its first connection. Past
    /// [`CONNECTORS`] addresses (DNS members that came and went) one is
    /// dropped for each new one: its next connection makes a full handshake.
    fn connector(&self, address: SocketAddr) -> TlsConnector {
        let mut by_backend = self
            .by_backend
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if by_backend.len() >= CONNECTORS && !by_backend.contains_key(&address) {
            let dropped = by_backend.keys().next().copied();
            if let Some(dropped) = dropped {
                by_backend.remove(&dropped);
            }
        }
        by_backend
            .entry(address)
            .or_insert_with(|| {
                let mut config = (*self.config).clone();
                config.resumption = rustls::client::Resumption::in_memory_sessions(SESSIONS);
                TlsConnector::from(Arc::new(config))
            })
            .clone()
    }

    /// Handshakes with the backend at `address` over `tcp`, which DNS may
    /// have given for `host`. The name checked (and sent by SNI) is the
    /// pool's `server_name`, else `host`, else the address.
    pub async fn connect(
        &self,
        tcp: TcpStream,
        address: SocketAddr,
        host: Option<&str>,
    ) -> std::io::Result<TlsStream<TcpStream>> {
        let named = || host.and_then(|host| ServerName::try_from(host.to_owned()).ok());
        let name = self
            .server_name
            .clone()
            .or_else(named)
            .unwrap_or_else(|| ServerName::IpAddress(address.ip().into()));
        self.connector(address).connect(name, tcp).await
    }
}

/// Backend addresses with a session cache of their own, at most (each
/// holds tickets with the certificate chain they came with: some KiB).
const CONNECTORS: usize = 512;

/// A backend's session cache: rustls keeps a name for every 8 of these,
/// with up to 8 TLS 1.3 tickets each: four names (its address, the DNS
/// names that give it, the pool's `server_name`).
const SESSIONS: usize = 32;

/// `verify = false`: any certificate is taken; the handshake's signatures
/// are still checked against it.
#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
