//! The forms a name is asked in, under the system's search list, in the
//! order hickory's own lookups try them (its `build_names`). baton walks
//! them itself, one fully qualified query each, because hickory's walk
//! goes on after a failure and reports the last form's result: a form
//! that failed (SERVFAIL) before an empty last one read as an empty
//! answer, and the name's AAAA addresses, or none, took its members'
//! place.

use std::sync::Arc;

use hickory_resolver::proto::rr::Name;

/// `/etc/resolv.conf`'s `ndots`, `domain` and `search` as hickory reads
/// them (the domain falls back to the host name's): none with the
/// config's own `nameservers`, which search nothing.
#[derive(Debug, Clone, Default)]
pub struct SearchList {
    ndots: usize,
    domain: Option<Name>,
    search: Arc<[Name]>,
}

impl SearchList {
    /// The system's, read now.
    pub fn system() -> SearchList {
        let Ok((servers, options)) = hickory_resolver::system_conf::read_system_conf() else {
            return SearchList::default();
        };
        SearchList {
            ndots: options.ndots,
            domain: servers.domain().cloned(),
            search: servers.search().into(),
        }
    }

    /// The fully qualified names `host` is asked as, first first: a name
    /// given with a final dot, as it is; one of more labels than `ndots`
    /// (at least `ndots` dots) or `localhost`, as written and then in each
    /// domain; any other in each domain and then as written. The domains:
    /// the domain when the search list does not hold it, then the list,
    /// each once, in the order hickory's `build_names` gives.
    pub fn forms(&self, host: &str) -> Result<Forms, String> {
        let name =
            Name::from_ascii(host.to_ascii_lowercase()).map_err(|e| format!("{host}: {e}"))?;
        let mut as_written = name.clone();
        as_written.set_fqdn(true);
        if name.is_fqdn() {
            return Ok(Forms {
                names: vec![name],
                as_written,
            });
        }
        let written_first = usize::from(name.num_labels()) > self.ndots || name.is_localhost();
        // Built last first, as hickory builds it: a repeated domain keeps
        // the place of its last mention in the list, the domain its own
        // only when the list does not name it.
        let mut last_first = Vec::with_capacity(self.search.len() + 2);
        if !written_first {
            last_first.push(as_written.clone());
        }
        for domain in self.search.iter().rev().chain(self.domain.as_ref()) {
            if let Ok(form) = name.clone().append_domain(domain) {
                if !last_first.contains(&form) {
                    last_first.push(form);
                }
            }
        }
        if written_first {
            last_first.push(as_written.clone());
        }
        last_first.reverse();
        Ok(Forms {
            names: last_first,
            as_written,
        })
    }
}

/// The forms a name is asked in, first first, and which of them is the
/// name as written (fully qualified).
#[derive(Debug)]
pub struct Forms {
    pub names: Vec<Name>,
    pub as_written: Name,
}

impl Forms {
    /// `names`, some of these forms in their order, of the same name.
    pub fn within(&self, names: Vec<Name>) -> Forms {
        Forms {
            names,
            as_written: self.as_written.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(domain: &str) -> Name {
        Name::from_utf8(domain).expect("domain")
    }

    fn list(ndots: usize, search: &[&str]) -> SearchList {
        SearchList {
            ndots,
            domain: None,
            search: search.iter().map(|d| name(d)).collect(),
        }
    }

    fn forms(list: &SearchList, host: &str) -> Vec<String> {
        list.forms(host)
            .expect("forms")
            .names
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
        assert_eq!(
            forms(&vm, "app.internal"),
            ["app.internal.", "app.internal.example.test."],
            "as many dots as ndots is past it"
        );
    }

    #[test]
    fn the_domain_comes_first_unless_the_search_list_names_it() {
        let mut vm = list(1, &["corp.example.com", "example.com"]);
        vm.domain = Some(name("example.com"));
        assert_eq!(
            forms(&vm, "api"),
            ["api.corp.example.com.", "api.example.com.", "api."]
        );
        vm.domain = Some(name("lab.example.com"));
        assert_eq!(
            forms(&vm, "api"),
            [
                "api.lab.example.com.",
                "api.corp.example.com.",
                "api.example.com.",
                "api."
            ]
        );
    }

    #[test]
    fn a_fully_qualified_name_or_no_search_list_is_asked_once() {
        let vm = list(1, &["example.test"]);
        assert_eq!(forms(&vm, "app.baton.test."), ["app.baton.test."]);
        assert_eq!(forms(&SearchList::default(), "app"), ["app."]);
    }
}
