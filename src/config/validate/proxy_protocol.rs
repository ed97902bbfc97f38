//! A listener's `proxy_protocol` and a pool's `send_proxy`. `trusted` has
//! no default: whom to believe about client addresses is the operator's
//! call, and a default that trusted everyone would let any client name
//! itself.

use std::sync::Arc;

use super::*;
use crate::proxy_protocol::{Accept, Cidr, ReceiveSettings, Version};

impl Validator {
    /// `key` is the listener's `proxy_protocol` key path.
    pub(super) fn proxy_protocol(
        &mut self,
        key: &str,
        raw: Option<&file::ProxyProtocolFile>,
    ) -> Option<Arc<ReceiveSettings>> {
        let raw = raw?;
        let accept = match raw.accept.as_deref() {
            None | Some("any") => Accept::Any,
            Some("v1") => Accept::V1,
            Some("v2") => Accept::V2,
            Some(other) => {
                self.problem(
                    &format!("{key}.accept"),
                    format!("\"{other}\" is not one of v1, v2, any"),
                );
                Accept::Any
            }
        };
        Some(Arc::new(ReceiveSettings {
            accept,
            trusted: self.trusted(&format!("{key}.trusted"), raw.trusted.as_deref()),
            required: raw.required.unwrap_or(true),
            timeout: self.timeout(
                &format!("{key}.timeout"),
                raw.timeout.as_ref(),
                Duration::from_secs(3),
            ),
        }))
    }

    fn trusted(&mut self, key: &str, raw: Option<&[String]>) -> Vec<Cidr> {
        let Some(raw) = raw.filter(|r| !r.is_empty()) else {
            self.problem(
                key,
                "is required: the addresses of the balancers whose PROXY headers are believed, e.g. [\"10.0.0.0/8\"]",
            );
            return Vec::new();
        };
        let mut blocks = Vec::new();
        for (i, text) in raw.iter().enumerate() {
            match text.parse::<Cidr>() {
                Ok(block) if block.is_everything() => {
                    // Taken: a config that ran must still reload.
                    self.warning(
                        &format!("{key}[{i}]"),
                        format!("{text} trusts every address: any client may name itself in a header; list the balancers' addresses"),
                    );
                    blocks.push(block);
                }
                Ok(block) => blocks.push(block),
                Err(why) => self.problem(&format!("{key}[{i}]"), why),
            }
        }
        blocks
    }

    pub(super) fn send_proxy(&mut self, key: &str, raw: Option<&str>) -> Option<Version> {
        match raw? {
            "v1" => Some(Version::V1),
            "v2" => Some(Version::V2),
            other => {
                self.problem(key, format!("\"{other}\" is not one of v1, v2"));
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::super::tests::problems;
    use crate::config::{parse, Overrides};
    use crate::proxy_protocol::{Accept, Version};

    const BASE: &str = "[[pools]]\nname = \"p\"\nbackends = [{ name = \"b\", address = \"127.0.0.1:9\" }]\n\n[[listeners]]\nname = \"l\"\nbind = \"127.0.0.1:0\"\npool = \"p\"\n";

    #[test]
    fn proxy_protocol_keys_are_checked_by_name() {
        let found = problems(&format!(
            "{BASE}proxy_protocol = {{ accept = \"v3\", trusted = [\"10.0.0.0/8\", \"10.0.0.0/40\", \"lb.example\"], timeout = \"soon\" }}\n"
        ));
        let expected = [
            "listeners[0].proxy_protocol.accept",
            "listeners[0].proxy_protocol.trusted[1]",
            "listeners[0].proxy_protocol.trusted[2]",
            "listeners[0].proxy_protocol.timeout",
        ];
        for key in expected {
            assert!(
                found.iter().any(|p| p.starts_with(key)),
                "{key} in {found:?}"
            );
        }
        assert_eq!(found.len(), expected.len(), "{found:?}");
    }

    #[test]
    fn trusted_has_no_default() {
        let found = problems(&format!("{BASE}proxy_protocol = {{ accept = \"v2\" }}\n"));
        assert!(
            found[0].starts_with("listeners[0].proxy_protocol.trusted: is required"),
            "{found:?}"
        );
    }

    #[test]
    fn send_proxy_names_its_versions() {
        let text = BASE.replacen("name = \"p\"\n", "name = \"p\"\nsend_proxy = \"v9\"\n", 1);
        assert_eq!(
            problems(&text),
            vec!["pools[0].send_proxy: \"v9\" is not one of v1, v2".to_string()]
        );
        let good = BASE.replacen("name = \"p\"\n", "name = \"p\"\nsend_proxy = \"v1\"\n", 1);
        let good = format!("{good}proxy_protocol = {{ trusted = [\"::1\", \"127.0.0.0/8\"] }}\n");
        let config = parse(&good, Path::new("x.toml"), &Overrides::default()).expect("valid");
        assert_eq!(config.pools[0].send_proxy, Some(Version::V1));
        let receive = config.listeners[0].proxy_protocol.as_ref().expect("set");
        assert_eq!(receive.accept, Accept::Any, "the default");
        assert!(receive.required, "the default");
        assert!(receive.trusts("127.0.0.9".parse().expect("ip")));
        assert!(!receive.trusts("10.0.0.1".parse().expect("ip")));
    }
}
