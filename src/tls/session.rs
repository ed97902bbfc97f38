//! What a sealed TLS session holds of the client's certificate, so that a
//! session whose certificate lapsed is not resumed: rustls verifies a
//! client's chain at a session's first handshake only and carries it
//! through every resumption (each issuing new tickets), so a client
//! reconnecting often enough proved an identity long after its
//! certificate expired. A ticket or cached session refused here costs a
//! full handshake on the same connection: the client shows its renewed
//! certificate, or hears why not (Go's server skips such a ticket too).
//!
//! The leaf is read from rustls' own encoding of a server session
//! (`ServerSessionValue` in rustls 0.23's `msgs/persist.rs`), which rustls
//! does not publish: a test holds this reader to a real session, so a
//! rustls that changes it fails the test, and the handshake's own check
//! (`handshake::lapsed_client_certificate`) still refuses such a session.

use std::sync::Arc;

use rustls::server::StoresServerSessions;

/// Whether the encoded server session `session` may be resumed now: it
/// holds no client certificate, or one within its validity.
pub fn resumable(session: &[u8]) -> bool {
    client_leaf(session).is_none_or(|leaf| {
        let now = crate::tls::unix_seconds(std::time::SystemTime::now());
        crate::tls::certs::leaf_lapsed(leaf, now).is_none()
    })
}

/// The client's leaf certificate (DER) in an encoded server session, if it
/// holds one: past the SNI, version, cipher suite, master secret and
/// extended-master-secret flag, a flag, then the chain as a 24-bit-length
/// list of 24-bit-length certificates.
fn client_leaf(session: &[u8]) -> Option<&[u8]> {
    let mut r = Reader(session);
    if r.u8()? == 1 {
        let sni = r.u8()?;
        r.take(sni.into())?;
    }
    r.take(4)?;
    let secret = r.u8()?;
    r.take(secret.into())?;
    r.take(1)?;
    if r.u8()? != 1 {
        return None;
    }
    let list = r.u24()?;
    let mut chain = Reader(r.take(list)?);
    let leaf = chain.u24()?;
    chain.take(leaf)
}

/// Reads big-endian fields off the front of a byte string.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (taken, rest) = self.0.split_at_checked(n)?;
        self.0 = rest;
        Some(taken)
    }

    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }

    fn u24(&mut self) -> Option<usize> {
        self.take(3)
            .map(|b| usize::from(b[0]) << 16 | usize::from(b[1]) << 8 | usize::from(b[2]))
    }
}

/// rustls' cache of TLS 1.2 sessions by ID, handing out only those
/// [`resumable`] now.
#[derive(Debug)]
pub struct ResumableSessions(pub Arc<dyn StoresServerSessions>);

impl StoresServerSessions for ResumableSessions {
    fn put(&self, key: Vec<u8>, value: Vec<u8>) -> bool {
        self.0.put(key, value)
    }

    fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.0.get(key).filter(|session| resumable(session))
    }

    fn take(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.0.take(key).filter(|session| resumable(session))
    }

    fn can_cache(&self) -> bool {
        self.0.can_cache()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use rustls::server::{ProducesTickets, WebPkiClientVerifier};
    use rustls::{ClientConfig, ClientConnection, RootCertStore, ServerConfig, ServerConnection};
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};

    use super::*;
    use crate::tls::testing::{Leaf, Pki};

    /// Seals nothing: keeps each session rustls hands it, and gives back
    /// its index as the ticket.
    #[derive(Debug, Default)]
    struct Kept(Mutex<Vec<Vec<u8>>>);

    impl ProducesTickets for Kept {
        fn enabled(&self) -> bool {
            true
        }
        fn lifetime(&self) -> u32 {
            3600
        }
        fn encrypt(&self, plain: &[u8]) -> Option<Vec<u8>> {
            let mut kept = self.0.lock().ok()?;
            kept.push(plain.to_vec());
            Some(vec![u8::try_from(kept.len()).ok()?])
        }
        fn decrypt(&self, _: &[u8]) -> Option<Vec<u8>> {
            None
        }
    }

    fn der(pem: &str) -> CertificateDer<'static> {
        CertificateDer::from_pem_slice(pem.as_bytes()).expect("pem")
    }

    /// A whole handshake in memory at `version`, the client showing
    /// `identity` when it has one; returns the sessions the server sealed.
    fn sealed_sessions(
        version: &'static rustls::SupportedProtocolVersion,
        server: &Leaf,
        identity: Option<&Leaf>,
    ) -> Vec<Vec<u8>> {
        let provider = crate::tls::provider();
        let mut roots = RootCertStore::empty();
        roots.add(der(&server.ca)).expect("root");
        let roots = Arc::new(roots);
        let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
            .allow_unauthenticated()
            .build()
            .expect("verifier");
        let key = PrivateKeyDer::from_pem_slice(server.key.as_bytes()).expect("key");
        let mut server_config = ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[version])
            .expect("versions")
            .with_client_cert_verifier(verifier)
            .with_single_cert(vec![der(&server.cert)], key)
            .expect("server config");
        let kept = Arc::new(Kept::default());
        server_config.ticketer = kept.clone();
        let client_config = ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[version])
            .expect("versions")
            .with_root_certificates(roots);
        let client_config = match identity {
            None => client_config.with_no_client_auth(),
            Some(me) => {
                let key = PrivateKeyDer::from_pem_slice(me.key.as_bytes()).expect("key");
                client_config
                    .with_client_auth_cert(vec![der(&me.cert)], key)
                    .expect("identity")
            }
        };
        let name = "a.test".try_into().expect("name");
        let mut client = ClientConnection::new(Arc::new(client_config), name).expect("client");
        let mut server = ServerConnection::new(Arc::new(server_config)).expect("server");
        crate::tls::testing::shake(&mut client, &mut server);
        let sessions = kept.0.lock().expect("kept").clone();
        assert!(!sessions.is_empty(), "the server sealed its sessions");
        sessions
    }

    /// Holds the reader to rustls' real encoding, TLS 1.3's and 1.2's: a
    /// session sealed after a client showed its certificate holds that
    /// certificate; one without holds none. (Fails when a rustls upgrade
    /// changes the encoding.)
    #[test]
    fn a_real_session_holds_the_leaf_the_client_showed() {
        let pki = Pki::new();
        let server = pki.leaf("a.test", &["a.test"], -1..30);
        let me = pki.leaf("client.test", &["client.test"], -1..30);
        for version in [&rustls::version::TLS13, &rustls::version::TLS12] {
            for session in sealed_sessions(version, &server, Some(&me)) {
                assert_eq!(client_leaf(&session), Some(der(&me.cert).as_ref()));
                assert!(resumable(&session));
            }
            for session in sealed_sessions(version, &server, None) {
                assert_eq!(client_leaf(&session), None);
                assert!(resumable(&session));
            }
        }
    }

    /// A session whose leaf has expired, or is not yet valid, is not
    /// resumed; bytes cut short read as no certificate.
    #[test]
    fn a_session_whose_client_certificate_lapsed_is_not_resumable() {
        let pki = Pki::new();
        let server = pki.leaf("a.test", &["a.test"], -1..30);
        let me = pki.leaf("client.test", &["client.test"], -1..30);
        let session = sealed_sessions(&rustls::version::TLS13, &server, Some(&me)).remove(0);
        let leaf = der(&me.cert);
        let at = session
            .windows(leaf.len())
            .position(|w| w == leaf.as_ref())
            .expect("the leaf is in the session");
        // The client sent its leaf alone: the chain's two lengths come just
        // before it, and the rest of the session after it.
        let u24 = |n: usize| [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        for days in [-3..-1, 1..3] {
            let other = der(&pki.leaf("client.test", &["client.test"], days).cert);
            let lapsed = [
                &session[..at - 6],
                &u24(other.len() + 3),
                &u24(other.len()),
                other.as_ref(),
                &session[at + leaf.len()..],
            ]
            .concat();
            assert_eq!(client_leaf(&lapsed), Some(other.as_ref()));
            assert!(!resumable(&lapsed));
            // Nor is it handed out by the cache of TLS 1.2 session IDs.
            let cache = ResumableSessions(rustls::server::ServerSessionMemoryCache::new(8));
            assert!(cache.put(b"lapsed".to_vec(), lapsed.clone()));
            assert!(cache.put(b"good".to_vec(), session.clone()));
            assert_eq!(cache.get(b"lapsed"), None);
            assert_eq!(cache.take(b"lapsed"), None);
            assert_eq!(cache.get(b"good"), Some(session.clone()));
        }
        assert_eq!(client_leaf(&session[..at]), None);
    }
}
