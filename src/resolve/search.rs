//! The forms a name is asked in, under the system's search list, in the
//! order hickory's own lookups try them (its `build_names`). baton walks
//! them itself, one fully qualified query each, because hickory's walk
//! goes on after a failure and reports the last form's result: a form
//! that failed (SERVFAIL) before an empty last one read as an empty
//! answer, and the name's AAAA addresses, or none, took its members'
//! place.

use std::sync::Arc;

use hickory_resolver::proto::rr::Name;

/// `/etc/resolv.conf`'s `ndots`, `domain` and `search`: none with the
/// config's own `nameservers`, which search nothing.
#[derive(Debug, Clone, Default)]
pub struct SearchList {
    ndots: usize,
    /// The domain, then the search list, without repeats.
    domains: Arc<[Name]>,
}

impl SearchList {
    /// The system's, read now.
    pub fn system() -> SearchList {
        let Ok((servers, options)) = hickory_resolver::system_conf::read_system_conf() else {
            return SearchList::default();
        };
        let mut domains: Vec<Name> = Vec::new();
        for domain in servers.domain().into_iter().chain(servers.search()) {
            if !domains.contains(domain) {
                domains.push(domain.clone());
            }
        }
        SearchList {
            ndots: options.ndots,
            domains: domains.into(),
        }
    }

    /// The fully qualified names `host` is asked as, first first: a name
    /// given with a final dot, as it is; one with more labels than
    /// `ndots` (or `localhost`), as written and then in each domain; any
    /// other in each domain and then as written.
    pub fn forms(&self, host: &str) -> Result<Vec<Name>, String> {
        let name = Name::from_utf8(host).map_err(|e| format!("{host}: {e}"))?;
        if name.is_fqdn() {
            return Ok(vec![name]);
        }
        let mut as_written = name.clone();
        as_written.set_fqdn(true);
        let mut forms = Vec::with_capacity(self.domains.len() + 1);
        let written_first = usize::from(name.num_labels()) > self.ndots || name.is_localhost();
        if written_first {
            forms.push(as_written.clone());
        }
        for domain in self.domains.iter() {
            if let Ok(form) = name.clone().append_domain(domain) {
                if !forms.contains(&form) {
                    forms.push(form);
                }
            }
        }
        if !forms.contains(&as_written) {
            forms.push(as_written);
        }
        Ok(forms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(ndots: usize, domains: &[&str]) -> SearchList {
        SearchList {
            ndots,
            domains: domains
                .iter()
                .map(|d| Name::from_utf8(d).expect("domain"))
                .collect(),
        }
    }

    fn forms(list: &SearchList, host: &str) -> Vec<String> {
        list.forms(host)
            .expect("forms")
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn a_name_short_of_ndots_is_asked_in_each_domain_first() {
        let kubernetes = list(5, &["ns.svc.cluster.local", "svc.cluster.local"]);
        assert_eq!(
            forms(&kubernetes, "my-svc.ns"),
            [
                "my-svc.ns.ns.svc.cluster.local.",
                "my-svc.ns.svc.cluster.local.",
                "my-svc.ns."
            ]
        );
    }

    #[test]
    fn a_name_past_ndots_is_asked_as_written_first() {
        let vm = list(1, &["example.test"]);
        assert_eq!(
            forms(&vm, "app.baton.test"),
            ["app.baton.test.", "app.baton.test.example.test."]
        );
    }

    #[test]
    fn a_fully_qualified_name_or_no_search_list_is_asked_once() {
        let vm = list(1, &["example.test"]);
        assert_eq!(forms(&vm, "app.baton.test."), ["app.baton.test."]);
        assert_eq!(forms(&SearchList::default(), "app"), ["app."]);
    }
}
