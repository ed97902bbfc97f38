//! TLS termination settings for a listener: certificates loaded and checked
//! at config load ([`certs`]), picked per connection by SNI ([`sni`]), and
//! built into the `rustls::ServerConfig` the data path hands to
//! `tokio-rustls`. Everything that can be wrong with a certificate is found
//! here, when `baton check` or a new generation reads the config, never at
//! the first handshake.

pub mod certs;
pub mod handshake;
pub mod identity;
pub mod session;
pub mod sni;
#[cfg(test)]
pub(crate) mod testing;
pub mod tickets;
pub mod upstream;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustls::crypto::CryptoProvider;
use rustls::server::{VerifierBuilderError, WebPkiClientVerifier};
use rustls::{RootCertStore, ServerConfig, SupportedProtocolVersion};
use rustls_pki_types::CertificateRevocationListDer;

/// The crypto provider every TLS object in baton is built with: ring, not
/// rustls' default aws-lc-rs, because ring builds with the C compiler alone
/// (aws-lc-rs needs cmake, and Go on some targets), which keeps a cold CI
/// build short. It is passed explicitly wherever rustls needs one, so no
/// process-wide default provider is ever installed. ring has no
/// post-quantum key exchange (X25519MLKEM768), and rustls 0.23.48 marks
/// its provider deprecated for that reason; the `allow` keeps `cargo
/// update` from failing the build on it while ring stays the choice.
#[allow(deprecated)]
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The oldest TLS version a listener accepts (`min_version`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MinVersion {
    Tls12,
    Tls13,
}

impl MinVersion {
    pub fn as_str(self) -> &'static str {
        match self {
            MinVersion::Tls12 => "1.2",
            MinVersion::Tls13 => "1.3",
        }
    }

    fn versions(self) -> &'static [&'static SupportedProtocolVersion] {
        const FROM_1_2: &[&SupportedProtocolVersion] =
            &[&rustls::version::TLS13, &rustls::version::TLS12];
        const FROM_1_3: &[&SupportedProtocolVersion] = &[&rustls::version::TLS13];
        match self {
            MinVersion::Tls12 => FROM_1_2,
            MinVersion::Tls13 => FROM_1_3,
        }
    }
}

/// Whether a client must show a certificate (`client_auth`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAuth {
    /// A client without a certificate the CA issued is refused.
    Required,
    /// A client may come in unauthenticated; one that shows a certificate
    /// must still show one the CA issued.
    Optional,
}

impl ClientAuth {
    pub fn as_str(self) -> &'static str {
        match self {
            ClientAuth::Required => "required",
            ClientAuth::Optional => "optional",
        }
    }
}

/// Client certificates (`client_ca`, `client_auth`, `client_crl`).
#[derive(Debug, Clone)]
pub struct ClientCa {
    pub roots: Arc<RootCertStore>,
    pub auth: ClientAuth,
    /// Revocation lists a client's certificate is looked up in: one they
    /// list is refused, and so is one whose issuer none of them covers
    /// (unknown status fails closed, as nginx's `ssl_crl`); the chain
    /// above the client's certificate is not looked up.
    pub crls: Vec<CertificateRevocationListDer<'static>>,
}

/// One served certificate as `baton check` and the metrics name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertificateInfo {
    /// The first name it serves (or its subject, when it serves no DNS name).
    pub name: String,
    /// The DNS names it serves, lower-cased; `*.` wildcards included.
    pub names: Vec<String>,
    /// The leaf's notBefore, in seconds since the epoch.
    pub not_before_unix: i64,
    /// The leaf's notAfter, in seconds since the epoch.
    pub not_after_unix: i64,
}

/// What a listener's validated `tls` key asks for, before it is built.
pub struct Spec {
    /// In config order: the first is the default (no SNI, or no match).
    pub certificates: Vec<certs::Loaded>,
    pub alpn: Vec<String>,
    pub min_version: MinVersion,
    pub handshake_timeout: Duration,
    pub client_ca: Option<ClientCa>,
}

/// A listener's TLS settings, ready for the data path.
#[derive(Debug)]
pub struct TlsSettings {
    /// Built once at load and shared by every connection of the listener.
    pub server_config: Arc<ServerConfig>,
    /// A client must finish its handshake within this.
    pub handshake_timeout: Duration,
    pub alpn: Vec<String>,
    pub min_version: MinVersion,
    /// `None` when no client certificate is asked for.
    pub client_auth: Option<ClientAuth>,
    /// `client_auth` and the client CAs, as bytes a session ticket is bound
    /// to (see `tickets::Scope`).
    pub client_policy: Vec<u8>,
    pub certificates: Vec<CertificateInfo>,
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot build a client certificate verifier: {0}")]
    ClientCa(#[from] VerifierBuilderError),
    #[error("the crypto provider cannot serve these versions: {0}")]
    Versions(#[from] rustls::Error),
}

impl TlsSettings {
    /// Builds the settings and their `ServerConfig`.
    pub fn build(spec: Spec) -> Result<Self, TlsError> {
        let certificates = spec.certificates.iter().map(|c| c.info.clone()).collect();
        let server_config = server_config(&spec)?;
        let client_policy = client_policy(spec.client_ca.as_ref());
        Ok(TlsSettings {
            server_config: Arc::new(server_config),
            handshake_timeout: spec.handshake_timeout,
            alpn: spec.alpn,
            min_version: spec.min_version,
            client_auth: spec.client_ca.map(|ca| ca.auth),
            client_policy,
            certificates,
        })
    }

    /// Each served name's expiry, as the metric shows it: the earliest of
    /// the certificates that share it (an ECDSA and an RSA certificate for
    /// one site, renewed apart), so the alert fires for whichever lapses
    /// first, not for the last one listed.
    pub fn expiries(&self) -> std::collections::BTreeMap<&str, i64> {
        let mut earliest = std::collections::BTreeMap::new();
        for cert in &self.certificates {
            earliest
                .entry(cert.name.as_str())
                .and_modify(|at: &mut i64| *at = (*at).min(cert.not_after_unix))
                .or_insert(cert.not_after_unix);
        }
        earliest
    }
}

/// Whether and against which CAs a client certificate is checked, as
/// bytes: two listeners (or generations) that check alike give the same.
fn client_policy(ca: Option<&ClientCa>) -> Vec<u8> {
    let Some(ca) = ca else {
        return b"none".to_vec();
    };
    let mut policy = ca.auth.as_str().as_bytes().to_vec();
    // A list changed (a certificate revoked since) must not let a session
    // resumed from before it skip the lookup.
    for crl in &ca.crls {
        policy.extend_from_slice(&(crl.len() as u64).to_be_bytes());
        policy.extend_from_slice(crl);
    }
    for root in &ca.roots.roots {
        let constraints = root.name_constraints.as_deref().unwrap_or_default();
        for part in [
            &root.subject[..],
            &root.subject_public_key_info[..],
            constraints,
        ] {
            policy.extend_from_slice(&(part.len() as u64).to_be_bytes());
            policy.extend_from_slice(part);
        }
    }
    policy
}

/// The verifier of client certificates `ca` asks for, with its
/// revocation lists if any.
fn client_verifier(
    ca: &ClientCa,
    provider: Arc<CryptoProvider>,
) -> rustls::server::ClientCertVerifierBuilder {
    let verifier = WebPkiClientVerifier::builder_with_provider(ca.roots.clone(), provider);
    match ca.crls.is_empty() {
        true => verifier,
        false => verifier
            .with_crls(ca.crls.iter().cloned())
            .only_check_end_entity_revocation(),
    }
}

/// Whether rustls takes `ca`'s revocation lists, parsed as the handshake's
/// verifier parses them: the cause if not.
pub fn crls_taken(ca: &ClientCa) -> Result<(), String> {
    client_verifier(ca, provider())
        .build()
        .map(drop)
        .map_err(|err| err.to_string())
}

/// The rustls configuration for `spec`. Its session cache is rustls'
/// default (one per listener); its ticketer is set on a clone per
/// generation (`daemon::build`), sealing with keys a reload hands over.
fn server_config(spec: &Spec) -> Result<ServerConfig, TlsError> {
    let provider = provider();
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(spec.min_version.versions())?;
    let builder = match &spec.client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let verifier = client_verifier(ca, provider);
            let verifier = match ca.auth {
                ClientAuth::Required => verifier,
                ClientAuth::Optional => verifier.allow_unauthenticated(),
            };
            builder.with_client_cert_verifier(verifier.build()?)
        }
    };
    let resolver = sni::SniResolver::new(&spec.certificates);
    let mut config = builder.with_cert_resolver(Arc::new(resolver));
    config.session_storage = Arc::new(session::ResumableSessions(config.session_storage.clone()));
    config.alpn_protocols = spec.alpn.iter().map(|p| p.as_bytes().to_vec()).collect();
    Ok(config)
}

/// Seconds since the epoch as RFC 3339 (`2026-01-02T00:00:00Z`), the form
/// problems and `baton check` print dates in. A time before 1970 (which no
/// served certificate's notAfter is) prints as the epoch.
pub fn format_time(unix: i64) -> String {
    let secs = u64::try_from(unix).unwrap_or(0);
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_secs(secs)).to_string()
}

/// `now` in seconds since the epoch, the unit certificate times come in.
pub fn unix_seconds(now: SystemTime) -> i64 {
    match now.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(before) => -i64::try_from(before.duration().as_secs()).unwrap_or(i64::MAX),
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::sync::Arc;
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    use rustls::crypto::WebPkiSupportedAlgorithms;
    use rustls::{
        ClientConfig, ClientConnection, RootCertStore, ServerConnection, SignatureScheme,
    };
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::CertificateDer;

    use super::testing::Pki;
    use super::{certs, provider, MinVersion, Spec, TlsSettings};

    /// Settings serving `certificates` (each a file stem and the key's
    /// path, from `pki`), and the CA's certificate.
    fn settings(
        pki: &Pki,
        certificates: &[(&str, PathBuf)],
    ) -> (TlsSettings, CertificateDer<'static>) {
        let load = |(stem, key): &(&str, PathBuf)| {
            let cert = pki.dir.path().join(format!("{stem}.pem"));
            certs::load(&cert, key, SystemTime::now()).expect("loads")
        };
        let spec = Spec {
            certificates: certificates.iter().map(load).collect(),
            alpn: vec!["h2".into(), "http/1.1".into()],
            min_version: MinVersion::Tls12,
            handshake_timeout: Duration::from_secs(10),
            client_ca: None,
        };
        let ca = pki.leaf("unused", &[], -1..1).ca;
        let ca = CertificateDer::from_pem_slice(ca.as_bytes()).expect("CA");
        (TlsSettings::build(spec).expect("builds"), ca)
    }

    /// A whole handshake in memory with `settings`: the client trusts the
    /// CA, offers only http/1.1 and the signature schemes `offers` keeps,
    /// and asks for `sni`. Returns the leaf served.
    fn handshake(
        (settings, ca): (TlsSettings, CertificateDer<'static>),
        sni: &'static str,
        offers: fn(SignatureScheme) -> bool,
    ) -> ClientConnection {
        let mut roots = RootCertStore::empty();
        roots.add(ca).expect("root");
        let mut client_provider = (*provider()).clone();
        let algorithms = client_provider.signature_verification_algorithms;
        let mapping: Vec<_> = algorithms
            .mapping
            .iter()
            .filter(|(scheme, _)| offers(*scheme))
            .copied()
            .collect();
        client_provider.signature_verification_algorithms = WebPkiSupportedAlgorithms {
            all: algorithms.all,
            mapping: Box::leak(mapping.into_boxed_slice()),
        };
        let mut config = ClientConfig::builder_with_provider(Arc::new(client_provider))
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let name = sni.try_into().expect("name");
        let mut client = ClientConnection::new(Arc::new(config), name).expect("client");
        let mut server = ServerConnection::new(settings.server_config.clone()).expect("server");
        super::testing::shake(&mut client, &mut server);
        client
    }

    /// The leaf certificate in `pki`'s `<stem>.pem`.
    fn leaf(pki: &Pki, stem: &str) -> CertificateDer<'static> {
        let pem = std::fs::read(pki.dir.path().join(format!("{stem}.pem"))).expect("pem");
        CertificateDer::from_pem_slice(&pem).expect("certificate")
    }

    fn any(_: SignatureScheme) -> bool {
        true
    }

    /// rustls' cache of TLS 1.2 sessions by ID hands out only sessions
    /// whose client certificate still holds (see `session`).
    #[test]
    fn the_session_cache_is_one_that_checks_client_certificates() {
        let pki = Pki::new();
        let key = pki.leaf_files("a", "a.example.com", -1..90);
        let (settings, _) = settings(&pki, &[("a", key)]);
        let storage = format!("{:?}", settings.server_config.session_storage);
        assert!(storage.starts_with("ResumableSessions("), "{storage}");
    }

    #[test]
    fn a_handshake_gets_the_certificate_its_sni_names_and_the_alpn() {
        let pki = Pki::new();
        let certificates = [
            ("a", pki.leaf_files("a", "a.example.com", -1..90)),
            ("b", pki.leaf_files("b", "*.example.org", -1..90)),
        ];
        let client = handshake(settings(&pki, &certificates), "x.example.org", any);
        let served = client.peer_certificates().expect("certificates");
        assert_eq!(served[0], leaf(&pki, "b"));
        assert_eq!(client.alpn_protocol(), Some(&b"http/1.1"[..]));
    }

    /// Two certificates for one name with keys of two kinds: a client that
    /// verifies only the second kind gets the second; any other, the first.
    #[test]
    fn of_two_certificates_for_a_name_the_client_gets_one_it_can_verify() {
        let pki = Pki::new();
        let certificates = [
            ("ecdsa", pki.leaf_files("ecdsa", "x.example.com", -1..90)),
            (
                "ed25519",
                pki.ed25519_leaf_files("ed25519", "x.example.com"),
            ),
        ];
        let only_ed25519 = |scheme| scheme == SignatureScheme::ED25519;
        for (sni, offers, served) in [
            (
                "x.example.com",
                only_ed25519 as fn(SignatureScheme) -> bool,
                "ed25519",
            ),
            ("x.example.com", any, "ecdsa"),
        ] {
            let client = handshake(settings(&pki, &certificates), sni, offers);
            let got = client.peer_certificates().expect("certificates");
            assert_eq!(got[0], leaf(&pki, served), "{sni} expecting {served}");
        }
    }

    /// Two certificates for one name (renewed apart) show the earlier
    /// expiry, in either order; another name shows its own.
    #[test]
    fn a_name_served_by_two_certificates_shows_the_earlier_expiry() {
        let pki = Pki::new();
        let soon = pki.leaf_files("soon", "x.example.com", -1..10);
        let late = pki.leaf_files("late", "x.example.com", -1..90);
        let other = pki.leaf_files("other", "y.example.com", -1..50);
        let day = 86_400;
        for order in [
            [("soon", soon.clone()), ("late", late.clone())],
            [("late", late.clone()), ("soon", soon.clone())],
        ] {
            let certificates = [order[0].clone(), order[1].clone(), ("other", other.clone())];
            let (settings, _) = settings(&pki, &certificates);
            let expiries = settings.expiries();
            let left = |name| expiries[name] - super::unix_seconds(SystemTime::now());
            assert_eq!(expiries.len(), 2);
            assert!(
                (9 * day..=10 * day).contains(&left("x.example.com")),
                "{expiries:?}"
            );
            assert!(
                (49 * day..=50 * day).contains(&left("y.example.com")),
                "{expiries:?}"
            );
        }
    }

    #[test]
    fn times_print_as_rfc3339_and_before_1970_as_the_epoch() {
        assert_eq!(super::format_time(1_767_312_000), "2026-01-02T00:00:00Z");
        assert_eq!(super::format_time(-5), "1970-01-01T00:00:00Z");
        let before = UNIX_EPOCH - Duration::from_secs(5);
        assert_eq!(super::unix_seconds(before), -5);
    }
}
