//! Certificates made on the spot for the TLS tests: a CA and the leaves it
//! signs, written as PEM files into a temporary folder.

use std::ops::Range;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType, IsCa, KeyPair,
};

const DAY: i64 = 24 * 60 * 60;

pub(crate) struct Pki {
    pub dir: tempfile::TempDir,
    ca: CertifiedIssuer<'static, KeyPair>,
}

/// A leaf certificate, its key, and the CA that signed it, as PEM.
pub(crate) struct Leaf {
    pub cert: String,
    pub key: String,
    pub ca: String,
}

impl Leaf {
    /// Leaf first, then its issuer: the order a chain file must have.
    pub fn chain(&self) -> String {
        format!("{}{}", self.cert, self.ca)
    }
}

impl Pki {
    pub fn new() -> Self {
        Pki::with_ca_valid(-1..3650)
    }

    /// A CA valid over `days` (counted from now).
    pub fn with_ca_valid(days: Range<i64>) -> Self {
        let mut params = params("baton test CA", &[], days);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let key = KeyPair::generate().expect("CA key");
        let ca = CertifiedIssuer::self_signed(params, key).expect("CA");
        Pki {
            dir: tempfile::tempdir().expect("tempdir"),
            ca,
        }
    }

    /// A leaf with subject `cn` and DNS names `sans`, valid over `days`
    /// (counted from now), signed by the CA.
    pub fn leaf(&self, cn: &str, sans: &[&str], days: Range<i64>) -> Leaf {
        self.leaf_keyed(cn, sans, days, KeyPair::generate().expect("leaf key"))
    }

    fn leaf_keyed(&self, cn: &str, sans: &[&str], days: Range<i64>, key: KeyPair) -> Leaf {
        let cert = params(cn, sans, days)
            .signed_by(&key, &self.ca)
            .expect("leaf");
        Leaf {
            cert: cert.pem(),
            key: key.serialize_pem(),
            ca: self.ca.as_ref().pem(),
        }
    }

    /// The CA's certificate as an older root once cross-signed it, expired
    /// yesterday: same subject and key as the CA, so it issues the CA's
    /// own certificate in a chain.
    pub fn expired_cross_sign(&self) -> String {
        let mut old = params("baton old root", &[], -3650..3650);
        old.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let old_root =
            CertifiedIssuer::self_signed(old, KeyPair::generate().expect("old root key"))
                .expect("old root");
        let mut cross = params("baton test CA", &[], -365..-1);
        cross.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        cross
            .signed_by(self.ca.key(), &old_root)
            .expect("cross-sign")
            .pem()
    }

    /// A leaf serving `name` alone, valid over `days`, written to
    /// `<stem>.pem` and `<stem>.key`; returns the key's path.
    pub fn leaf_files(&self, stem: &str, name: &str, days: Range<i64>) -> PathBuf {
        let leaf = self.leaf(name, &[name], days);
        self.write(&format!("{stem}.pem"), &leaf.cert);
        self.write(&format!("{stem}.key"), &leaf.key)
    }

    /// As [`Pki::leaf_files`], with an Ed25519 key (the others are ECDSA
    /// P-256): a second kind of key for one name.
    pub fn ed25519_leaf_files(&self, stem: &str, name: &str) -> PathBuf {
        let key = KeyPair::generate_for(&rcgen::PKCS_ED25519).expect("ed25519 key");
        let leaf = self.leaf_keyed(name, &[name], -1..90, key);
        self.write(&format!("{stem}.pem"), &leaf.cert);
        self.write(&format!("{stem}.key"), &leaf.key)
    }

    /// Writes `text` to the file `name` in the folder; returns its path.
    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::write(&path, text).expect("write");
        path
    }
}

fn params(cn: &str, sans: &[&str], days: Range<i64>) -> CertificateParams {
    let sans: Vec<String> = sans.iter().map(|s| s.to_string()).collect();
    let mut params = CertificateParams::new(sans).expect("names");
    params.distinguished_name = DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, cn);
    // rcgen takes `time`'s dates; from the epoch, so no `time` dependency here.
    let epoch = rcgen::date_time_ymd(1970, 1, 1);
    params.not_before = epoch + Duration::from_secs(from_now(days.start));
    params.not_after = epoch + Duration::from_secs(from_now(days.end));
    params
}

/// Seconds since the epoch, `days` from now.
fn from_now(days: i64) -> u64 {
    let now = super::unix_seconds(SystemTime::now());
    u64::try_from(now + days * DAY).expect("after 1970")
}

/// A TLS session over `server_io` and `client_io`, handshaken: baton's
/// server side (a certificate for `a.test` from a fresh CA, as a listener
/// builds it) and a client trusting that CA.
pub(crate) async fn session_pair<S, C>(
    server_io: S,
    client_io: C,
) -> (
    tokio_rustls::server::TlsStream<S>,
    tokio_rustls::client::TlsStream<C>,
)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    C: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use std::sync::Arc;

    use rustls_pki_types::pem::PemObject;

    let pki = Pki::new();
    let key = pki.leaf_files("a", "a.test", -1..90);
    let cert = pki.dir.path().join("a.pem");
    let loaded = super::certs::load(&cert, &key, SystemTime::now()).expect("loads");
    let settings = super::TlsSettings::build(super::Spec {
        certificates: vec![loaded],
        alpn: vec!["http/1.1".into()],
        min_version: super::MinVersion::Tls12,
        handshake_timeout: Duration::from_secs(10),
        client_ca: None,
    })
    .expect("builds");
    let mut roots = rustls::RootCertStore::empty();
    let ca = rustls_pki_types::CertificateDer::from_pem_slice(pki.ca.as_ref().pem().as_bytes())
        .expect("CA");
    roots.add(ca).expect("root");
    let client = rustls::ClientConfig::builder_with_provider(super::provider())
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    let acceptor = tokio_rustls::TlsAcceptor::from(settings.server_config);
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
    let name = rustls_pki_types::ServerName::try_from("a.test").expect("name");
    let (server, client) = tokio::join!(
        acceptor.accept(server_io),
        connector.connect(name, client_io)
    );
    (server.expect("server side"), client.expect("client side"))
}

/// How many bytes `reader` gives, up to `want`, within ten seconds (it
/// stops early at EOF or an error).
pub(crate) async fn bytes_arriving<R: tokio::io::AsyncRead + Unpin>(
    reader: &mut R,
    want: usize,
) -> usize {
    use tokio::io::AsyncReadExt;
    let mut got = 0;
    let mut piece = vec![0u8; 16 * 1024];
    let _ = tokio::time::timeout(Duration::from_secs(10), async {
        while got < want {
            match reader.read(&mut piece).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got += n,
            }
        }
    })
    .await;
    got
}

/// Passes a client's and a server's bytes to and fro in memory until both
/// have finished their handshake (a server's session tickets are sealed
/// by then).
pub(crate) fn shake(client: &mut rustls::ClientConnection, server: &mut rustls::ServerConnection) {
    for _ in 0..10 {
        if !client.is_handshaking() && !server.is_handshaking() {
            break;
        }
        let mut bytes = Vec::new();
        client.write_tls(&mut bytes).expect("client writes");
        server
            .read_tls(&mut bytes.as_slice())
            .expect("server reads");
        server.process_new_packets().expect("server handshake");
        bytes.clear();
        server.write_tls(&mut bytes).expect("server writes");
        client
            .read_tls(&mut bytes.as_slice())
            .expect("client reads");
        client.process_new_packets().expect("client handshake");
    }
    assert!(!client.is_handshaking() && !server.is_handshaking());
}
