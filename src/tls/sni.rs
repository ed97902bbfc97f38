//! Which certificate a connection gets, by the name the client asked for
//! (SNI): an exact name first, then a `*.` wildcard covering exactly one
//! label (`*.example.com` serves `a.example.com`, not `example.com` nor
//! `a.b.example.com`, as RFC 6125 and browsers have it), compared without
//! regard to case. With no SNI or no match the first certificate serves:
//! refusing the handshake would only turn a name warning into an outage.

use std::collections::HashMap;
use std::sync::Arc;

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use super::certs::Loaded;

/// Names to certificate indices, in config order.
#[derive(Debug, Default)]
pub struct Names {
    exact: HashMap<String, usize>,
    /// A wildcard's parent domain (`example.com` for `*.example.com`).
    wildcard: HashMap<String, usize>,
}

impl Names {
    /// From each certificate's served names (lower-cased); when two
    /// certificates serve one name, the first listed keeps it.
    pub fn new<'a>(served: impl IntoIterator<Item = &'a [String]>) -> Self {
        let mut names = Names::default();
        for (index, list) in served.into_iter().enumerate() {
            for name in list {
                let map = match name.strip_prefix("*.") {
                    Some(parent) => names.wildcard.entry(parent.to_string()),
                    None => names.exact.entry(name.clone()),
                };
                map.or_insert(index);
            }
        }
        names
    }

    /// The index of the certificate to serve for `sni`; 0, the default,
    /// when there is no SNI or no name matches.
    pub fn pick(&self, sni: Option<&str>) -> usize {
        let Some(sni) = sni else {
            return 0;
        };
        let sni = sni.trim_end_matches('.').to_ascii_lowercase();
        if let Some(&index) = self.exact.get(&sni) {
            return index;
        }
        match sni.split_once('.') {
            Some((label, parent)) if !label.is_empty() => {
                self.wildcard.get(parent).copied().unwrap_or(0)
            }
            _ => 0,
        }
    }
}

/// The listener's `ResolvesServerCert`: [`Names::pick`] over its certificates.
#[derive(Debug)]
pub struct SniResolver {
    names: Names,
    /// At least one: validation refuses a `tls` key without certificates.
    keys: Vec<Arc<CertifiedKey>>,
}

impl SniResolver {
    pub fn new(certificates: &[Loaded]) -> Self {
        SniResolver {
            names: Names::new(certificates.iter().map(|c| c.info.names.as_slice())),
            keys: certificates.iter().map(|c| c.key.clone()).collect(),
        }
    }
}

impl ResolvesServerCert for SniResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.keys.get(self.names.pick(hello.server_name())).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::Names;

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
            assert_eq!(names.pick(sni), index, "{sni:?}");
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

    #[test]
    fn the_first_certificate_listed_keeps_a_shared_name() {
        let lists = [vec!["x.org".to_string()], vec!["x.org".to_string()]];
        assert_eq!(
            Names::new(lists.iter().map(Vec::as_slice)).pick(Some("x.org")),
            0
        );
    }
}
