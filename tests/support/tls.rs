//! TLS for the tests: a throwaway CA and certificates made with rcgen,
//! written as PEM files, and a rustls client that trusts that CA only,
//! with the SNI and ALPN a test asks for.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

/// A CA and the folder its certificates are written to.
pub struct Authority {
    issuer: CertifiedIssuer<'static, KeyPair>,
    pub dir: tempfile::TempDir,
}

/// A certificate and its key, as files.
pub struct Issued {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub der: CertificateDer<'static>,
}

impl Issued {
    /// The listener key that serves it (and the others after it).
    pub fn listener_tls(certs: &[&Issued], more: &str) -> String {
        let list: Vec<String> = certs
            .iter()
            .map(|c| {
                format!(
                    "{{ cert = \"{}\", key = \"{}\" }}",
                    c.cert.display(),
                    c.key.display()
                )
            })
            .collect();
        format!("tls = {{ certificates = [{}]{more} }}", list.join(", "))
    }
}

impl Authority {
    pub fn new() -> Authority {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "baton test CA");
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().expect("ca key");
        let issuer = CertifiedIssuer::self_signed(params, key).expect("ca certificate");
        let dir = tempfile::tempdir().expect("cert dir");
        std::fs::write(dir.path().join("ca.pem"), issuer.pem()).expect("write ca");
        Authority { issuer, dir }
    }

    pub fn ca_pem(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// A certificate for `names`, written as `<file>.pem` and `<file>.key`.
    pub fn issue(&self, file: &str, names: &[&str]) -> Issued {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        self.sign(file, CertificateParams::new(names).expect("leaf params"))
    }

    /// A certificate for `names` that expired in 2021.
    pub fn issue_expired(&self, file: &str, names: &[&str]) -> Issued {
        let (from, until) = (
            rcgen::date_time_ymd(2020, 1, 1),
            rcgen::date_time_ymd(2021, 1, 1),
        );
        self.issue_valid(file, names, from.into(), until.into())
    }

    /// A certificate for `names` that expires `lasting` from now.
    pub fn issue_lasting(&self, file: &str, names: &[&str], lasting: Duration) -> Issued {
        let now = SystemTime::now();
        self.issue_valid(file, names, now - Duration::from_secs(60), now + lasting)
    }

    /// A certificate for `names` with serial number `serial`, for a
    /// revocation list to name.
    pub fn issue_numbered(&self, file: &str, names: &[&str], serial: u64) -> Issued {
        let now = SystemTime::now();
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(names).expect("leaf params");
        params.not_before = (now - Duration::from_secs(60)).into();
        params.not_after = (now + Duration::from_secs(86_400)).into();
        params.serial_number = Some(serial.into());
        self.sign(file, params)
    }

    /// This CA's revocation list naming `serials`, written as `<file>.crl`.
    pub fn revoking(&self, file: &str, serials: &[u64]) -> PathBuf {
        let now = SystemTime::now();
        let params = rcgen::CertificateRevocationListParams {
            this_update: (now - Duration::from_secs(60)).into(),
            next_update: (now + Duration::from_secs(86_400)).into(),
            crl_number: 1u64.into(),
            issuing_distribution_point: None,
            revoked_certs: serials
                .iter()
                .map(|&serial| rcgen::RevokedCertParams {
                    serial_number: serial.into(),
                    revocation_time: (now - Duration::from_secs(30)).into(),
                    reason_code: Some(rcgen::RevocationReason::KeyCompromise),
                    invalidity_date: None,
                })
                .collect(),
            key_identifier_method: rcgen::KeyIdMethod::Sha256,
        };
        let crl = params.signed_by(&self.issuer).expect("revocation list");
        let path = self.path(&format!("{file}.crl"));
        std::fs::write(&path, crl.pem().expect("crl pem")).expect("write crl");
        path
    }

    fn issue_valid(
        &self,
        file: &str,
        names: &[&str],
        from: SystemTime,
        until: SystemTime,
    ) -> Issued {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(names).expect("leaf params");
        params.not_before = from.into();
        params.not_after = until.into();
        self.sign(file, params)
    }

    fn sign(&self, file: &str, params: CertificateParams) -> Issued {
        let key = KeyPair::generate().expect("leaf key");
        let cert = params
            .signed_by(&key, &self.issuer)
            .expect("leaf certificate");
        let (cert_path, key_path) = (
            self.path(&format!("{file}.pem")),
            self.path(&format!("{file}.key")),
        );
        std::fs::write(&cert_path, cert.pem()).expect("write cert");
        std::fs::write(&key_path, key.serialize_pem()).expect("write key");
        Issued {
            cert: cert_path,
            key: key_path,
            der: cert.der().clone(),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A client trusting this CA only, offering `alpn`.
    pub fn client(&self, alpn: &[&str]) -> Client {
        self.client_as(alpn, None)
    }

    /// A client trusting this CA only, offering `alpn`, and presenting
    /// `identity` (a certificate this CA issued) when the server asks.
    pub fn client_as(&self, alpn: &[&str], identity: Option<&Issued>) -> Client {
        self.client_of(alpn, identity, rustls::DEFAULT_VERSIONS)
    }

    /// A client trusting this CA only that offers TLS 1.2 alone.
    pub fn client_tls12_only(&self) -> Client {
        self.client_of(&["http/1.1"], None, &[&rustls::version::TLS12])
    }

    fn client_of(
        &self,
        alpn: &[&str],
        identity: Option<&Issued>,
        versions: &[&'static rustls::SupportedProtocolVersion],
    ) -> Client {
        let mut roots = RootCertStore::empty();
        roots
            .add(self.issuer.der().clone())
            .expect("trust the test CA");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(versions)
            .expect("protocol versions")
            .with_root_certificates(roots);
        let mut config = match identity {
            None => builder.with_no_client_auth(),
            Some(me) => {
                let key = PrivateKeyDer::from_pem_file(&me.key).expect("client key");
                builder
                    .with_client_auth_cert(vec![me.der.clone()], key)
                    .expect("client identity")
            }
        };
        config.alpn_protocols = alpn.iter().map(|p| p.as_bytes().to_vec()).collect();
        Client {
            connector: TlsConnector::from(Arc::new(config)),
        }
    }
}

/// A TLS client for the tests; it keeps rustls' in-memory session cache,
/// so a second connection to the same name offers resumption.
#[derive(Clone)]
pub struct Client {
    connector: TlsConnector,
}

impl Client {
    /// Connects to `addr` and handshakes, sending `sni` (an IP address
    /// sends no SNI, as rustls does for IP names).
    pub async fn connect(
        &self,
        addr: SocketAddr,
        sni: &str,
    ) -> std::io::Result<TlsStream<TcpStream>> {
        self.handshake(TcpStream::connect(addr).await?, sni).await
    }

    /// Handshakes over a TCP connection already open.
    pub async fn handshake(
        &self,
        tcp: TcpStream,
        sni: &str,
    ) -> std::io::Result<TlsStream<TcpStream>> {
        let name = ServerName::try_from(sni.to_string())
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        self.connector.connect(name, tcp).await
    }
}

/// The negotiated ALPN protocol and whether the session was resumed.
pub fn negotiated(stream: &TlsStream<TcpStream>) -> (Option<String>, bool) {
    let session = stream.get_ref().1;
    let alpn = session
        .alpn_protocol()
        .map(|p| String::from_utf8_lossy(p).into_owned());
    let resumed = session.handshake_kind() == Some(rustls::HandshakeKind::Resumed);
    (alpn, resumed)
}

/// The certificate the server presented.
pub fn presented(stream: &TlsStream<TcpStream>) -> Option<CertificateDer<'static>> {
    stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.clone().into_owned())
}

/// An HTTP/1.1 backend behind TLS, answering `{name} {path}\n` like
/// `HttpBackend`, with the certificate `identity` (keys from its files).
pub struct TlsBackend {
    pub addr: SocketAddr,
    /// Connections whose handshake completed.
    pub handshakes: Arc<std::sync::atomic::AtomicU64>,
    /// Of those, the ones that resumed an earlier session.
    pub resumed: Arc<std::sync::atomic::AtomicU64>,
    /// Of those, the ones that have ended, and the ones that ended with
    /// the peer's `close_notify` (without it, rustls reports a truncation).
    pub ended: Arc<std::sync::atomic::AtomicU64>,
    pub ended_cleanly: Arc<std::sync::atomic::AtomicU64>,
}

impl TlsBackend {
    pub async fn start(name: &'static str, identity: &Issued) -> TlsBackend {
        TlsBackend::serving(name, identity, false).await
    }

    /// [`TlsBackend::start`] behind a pool's `send_proxy`: each connection's
    /// PROXY header (v1 or v2) is read past before its TLS handshake.
    pub async fn start_behind_proxy(name: &'static str, identity: &Issued) -> TlsBackend {
        TlsBackend::serving(name, identity, true).await
    }

    async fn serving(name: &'static str, identity: &Issued, proxied: bool) -> TlsBackend {
        let key = PrivateKeyDer::from_pem_file(&identity.key).expect("backend key");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_no_client_auth()
            .with_single_cert(vec![identity.der.clone()], key)
            .expect("backend certificate");
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let handshakes = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let resumed = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let ended = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let ended_cleanly = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counts = (
            Arc::clone(&handshakes),
            Arc::clone(&ended),
            Arc::clone(&ended_cleanly),
            Arc::clone(&resumed),
        );
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                let (counted, ended, ended_cleanly, resumed) = (
                    Arc::clone(&counts.0),
                    Arc::clone(&counts.1),
                    Arc::clone(&counts.2),
                    Arc::clone(&counts.3),
                );
                tokio::spawn(async move {
                    let mut tcp = tcp;
                    if proxied && skip_proxy_header(&mut tcp).await.is_err() {
                        return;
                    }
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    if tls.get_ref().1.handshake_kind() == Some(rustls::HandshakeKind::Resumed) {
                        resumed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let service = hyper::service::service_fn(
                        move |req: hyper::Request<hyper::body::Incoming>| {
                            // As `HttpBackend::body_for` (not reachable
                            // here: the TLS bench includes this file alone).
                            let body = format!("{name} {}\n", req.uri().path());
                            async move {
                                Ok::<_, std::convert::Infallible>(hyper::Response::new(
                                    http_body_util::Full::new(bytes::Bytes::from(body)),
                                ))
                            }
                        },
                    );
                    let served = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                        .without_shutdown()
                        .await;
                    // tokio-rustls reads a close without close_notify as an
                    // end too: rustls' own state tells them apart.
                    let clean = served.is_ok_and(|parts| {
                        let mut tls = parts.io.into_inner();
                        let state = tls.get_mut().1.process_new_packets();
                        state.is_ok_and(|s| s.peer_has_closed())
                    });
                    if clean {
                        ended_cleanly.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    // Release: who sees it ended sees how.
                    ended.fetch_add(1, std::sync::atomic::Ordering::Release);
                });
            }
        });
        TlsBackend {
            addr,
            handshakes,
            resumed,
            ended,
            ended_cleanly,
        }
    }
}

/// Reads a PROXY header (v1: a line; v2: 16 bytes and the length they
/// give) off `tcp`, byte-exact: what follows is the TLS handshake. (A
/// reader of its own, not `proxied::read_header`: the TLS bench includes
/// this file alone, without the rest of the support.)
async fn skip_proxy_header(tcp: &mut tokio::net::TcpStream) -> std::io::Result<()> {
    use tokio::io::AsyncReadExt;
    let first = tcp.read_u8().await?;
    if first == b'P' {
        while tcp.read_u8().await? != b'\n' {}
        return Ok(());
    }
    let mut fixed = [0u8; 15];
    tcp.read_exact(&mut fixed).await?;
    let length = u16::from_be_bytes([fixed[13], fixed[14]]);
    let mut rest = vec![0u8; usize::from(length)];
    tcp.read_exact(&mut rest).await?;
    Ok(())
}
