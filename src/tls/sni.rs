//! Which certificate a connection gets, by the name the client asked for
//! (SNI): an exact name first, then a `*.` wildcard covering exactly one
//! label (`*.example.com` serves `a.example.com`, not `example.com` nor
//! `a.b.example.com`, as RFC 6125 and browsers have it), compared without
//! regard to case. With no SNI or no match the first certificate serves:
//! refusing the handshake would only turn a name warning into an outage.
//! (A name rustls cannot read as a DNS name, with a space or a byte past
//! ASCII, ends the handshake with an `illegal_parameter` alert before any
//! resolver is asked; an IP address as SNI reads as none.)
//!
//! Several certificates may serve one name with keys of different kinds
//! (ECDSA for today's clients, RSA for old ones, as nginx and HAProxy
//! allow), or a renewed one beside the one it replaces: the first listed
//! that is valid now and whose key can sign with a scheme the client
//! offers serves, else the first whose key can, else the first listed (an
//! expired certificate loads, with a warning, and is served only where
//! nothing valid serves its name).

use std::collections::HashMap;
use std::sync::Arc;

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use super::certs::Loaded;

/// Names to certificate indices, each list in config order.
#[derive(Debug, Default)]
pub struct Names {
    exact: HashMap<String, Vec<usize>>,
    /// A wildcard's parent domain (`example.com` for `*.example.com`).
    wildcard: HashMap<String, Vec<usize>>,
    /// For no SNI or no match: the first certificate, with every other
    /// one serving its first name.
    fallback: Vec<usize>,
}

impl Names {
    /// From each certificate's served names (lower-cased).
    pub fn new<'a>(served: impl IntoIterator<Item = &'a [String]>) -> Self {
        let mut names = Names::default();
        let mut first_name = None;
        for (index, list) in served.into_iter().enumerate() {
            for name in list {
                first_name.get_or_insert_with(|| name.clone());
                let entry = match name.strip_prefix("*.") {
                    Some(parent) => names.wildcard.entry(parent.to_string()),
                    None => names.exact.entry(name.clone()),
                };
                let indices = entry.or_default();
                if indices.last() != Some(&index) {
                    indices.push(index);
                }
            }
        }
        names.fallback = first_name
            .and_then(|name| names.lookup(&name).map(<[usize]>::to_vec))
            .filter(|list| list.first() == Some(&0))
            .unwrap_or_else(|| vec![0]);
        names
    }

    fn lookup(&self, name: &str) -> Option<&[usize]> {
        match name.strip_prefix("*.") {
            Some(parent) => self.wildcard.get(parent),
            None => self.exact.get(name),
        }
        .map(Vec::as_slice)
    }

    /// The certificates that may serve `sni`, in config order: those naming
    /// it exactly, else the wildcard's, else the fallback.
    pub fn pick(&self, sni: Option<&str>) -> &[usize] {
        let Some(sni) = sni else {
            return &self.fallback;
        };
        let sni = sni.trim_end_matches('.').to_ascii_lowercase();
        if let Some(indices) = self.exact.get(&sni) {
            return indices;
        }
        match sni.split_once('.') {
            Some((label, parent)) if !label.is_empty() => self
                .wildcard
                .get(parent)
                .map_or(&self.fallback[..], Vec::as_slice),
            _ => &self.fallback,
        }
    }
}

/// The listener's `ResolvesServerCert`: [`Names::pick`] over its
/// certificates, then the first whose key suits the client.
#[derive(Debug)]
pub struct SniResolver {
    names: Names,
    /// At least one: validation refuses a `tls` key without certificates.
    keys: Vec<Arc<CertifiedKey>>,
    /// Each certificate's leaf's validity, as (notBefore, notAfter) in
    /// seconds since the epoch.
    valid: Vec<(i64, i64)>,
}

impl SniResolver {
    pub fn new(certificates: &[Loaded]) -> Self {
        SniResolver {
            names: Names::new(certificates.iter().map(|c| c.info.names.as_slice())),
            keys: certificates.iter().map(|c| c.key.clone()).collect(),
            valid: certificates
                .iter()
                .map(|c| (c.info.not_before_unix, c.info.not_after_unix))
                .collect(),
        }
    }
}

/// Of `candidates` (config order), the first valid now that signs for
/// the client, else the first that signs, else the first.
fn choose(
    candidates: &[usize],
    valid_now: impl Fn(usize) -> bool,
    signs: impl Fn(usize) -> bool,
) -> Option<usize> {
    match candidates {
        [only] => Some(*only),
        _ => candidates
            .iter()
            .find(|&&i| valid_now(i) && signs(i))
            .or_else(|| candidates.iter().find(|&&i| signs(i)))
            .or(candidates.first())
            .copied(),
    }
}

impl ResolvesServerCert for SniResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let candidates = self.names.pick(hello.server_name());
        let signs = |index: usize| {
            self.keys
                .get(index)
                .is_some_and(|k| k.key.choose_scheme(hello.signature_schemes()).is_some())
        };
        // Read only when a name has several certificates to choose from.
        let valid_now = |index: usize| {
            let now = super::unix_seconds(std::time::SystemTime::now());
            self.valid
                .get(index)
                .is_some_and(|&(from, until)| (from..=until).contains(&now))
        };
        choose(candidates, valid_now, signs).and_then(|index| self.keys.get(index).cloned())
    }
}

#[cfg(test)]
mod tests {
    use super::{choose, Names};

    /// A valid certificate wins over an expired one listed before it, if
    /// it signs for the client; an expired one serves only where nothing
    /// valid can.
    #[test]
    fn a_valid_certificate_serves_before_an_expired_one() {
        let valid = |i: usize| i != 0;
        assert_eq!(choose(&[0, 1], valid, |_| true), Some(1));
        assert_eq!(choose(&[0, 1], valid, |i| i == 0), Some(0));
        assert_eq!(choose(&[0, 1], |_| false, |_| true), Some(0));
        assert_eq!(choose(&[0, 1], |_| false, |_| false), Some(0));
        assert_eq!(choose(&[0], |_| false, |_| false), Some(0));
        assert_eq!(choose(&[], |_| true, |_| true), None);
    }

    fn names() -> Names {
        let lists = [
            vec!["default.example".to_string()],
            vec!["*.example.com".to_string()],
            vec!["a.example.com".to_string()],
        ];
        Names::new(lists.iter().map(Vec::as_slice))
    }

    /// Asserts which certificate each SNI gets.
    fn assert_picks(cases: &[(Option<&str>, usize)]) {
        let names = names();
        for &(sni, index) in cases {
            assert_eq!(names.pick(sni), [index], "{sni:?}");
        }
    }

    #[test]
    fn an_exact_name_beats_a_wildcard() {
        assert_picks(&[(Some("a.example.com"), 2), (Some("default.example"), 0)]);
    }

    #[test]
    fn a_wildcard_covers_exactly_one_label() {
        assert_picks(&[
            (Some("b.example.com"), 1),
            (Some("example.com"), 0),
            (Some("x.b.example.com"), 0),
            (Some(".example.com"), 0),
        ]);
    }

    #[test]
    fn no_match_and_no_sni_get_the_first_certificate() {
        assert_picks(&[(Some("other.org"), 0), (None, 0)]);
    }

    #[test]
    fn names_match_without_regard_to_case() {
        assert_picks(&[(Some("A.Example.COM"), 2), (Some("B.EXAMPLE.com"), 1)]);
    }

    /// Both certificates of a shared name are candidates, in config order,
    /// and with the first listed they are the fallback too.
    #[test]
    fn certificates_sharing_a_name_are_all_candidates_in_order() {
        let lists = [
            vec!["x.org".to_string(), "*.x.org".to_string()],
            vec!["y.org".to_string()],
            vec!["x.org".to_string(), "*.x.org".to_string()],
        ];
        let names = Names::new(lists.iter().map(Vec::as_slice));
        assert_eq!(names.pick(Some("x.org")), [0, 2]);
        assert_eq!(names.pick(Some("a.x.org")), [0, 2]);
        assert_eq!(names.pick(None), [0, 2]);
        assert_eq!(names.pick(Some("other.net")), [0, 2]);
        assert_eq!(names.pick(Some("y.org")), [1]);
    }
}
